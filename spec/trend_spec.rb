# frozen_string_literal: true

require "tmpdir"
require "datadog_heap/trend"
require_relative "fixtures/profiles"

# Synthetic series of one site, sampled the way the recorder samples: each live object of the site
# is in the profile with probability 1/period, standing for `period` objects. Profiles are
# independent draws (the site's objects are replaced between profiles: the worst case for noise).
module TrendSimulation
  module_function

  # Poisson(lambda) by inversion (lambda is at most a few thousand here, in steps to stay exact).
  def poisson(rng, lambda)
    k = 0
    left = lambda
    while left > 0
      step = [left, 30.0].min
      left -= step
      p = Math.exp(-step)
      s = p
      u = rng.rand
      n = 0
      while u > s
        n += 1
        p *= step / n
        s += p
      end
      k += n
    end
    k
  end

  # The verdicts of `series` series of `points` profiles one minute apart, whose site holds
  # `objects` live objects of `size` bytes at the first and grows by `growth` (a fraction of the
  # first) over the whole series.
  def verdicts(rng, series:, points:, objects:, growth:, period: 1024, size: 80)
    times = Array.new(points) { |i| i * 60.0 }
    Array.new(series) do
      bytes = times.each_index.map do |i|
        live = objects * (1 + growth * i / (points - 1).to_f)
        poisson(rng, live / period) * period * size
      end
      DatadogHeap::Trend.fit(times, bytes, period: period, mean_size: size).verdict
    end
  end

  def rate(verdicts, verdict)
    verdicts.count(verdict).fdiv(verdicts.size)
  end
end

RSpec.describe DatadogHeap::Trend do
  # 1000 series per case keeps the spec near a second; `TREND_SERIES=20000 rspec
  # spec/trend_spec.rb -e noise -e slopes` measures the rates the README quotes. Seeded: the same
  # series every run.
  let(:series) { Integer(ENV.fetch("TREND_SERIES", "1000")) }

  # The simulations are plain arithmetic on Ruby numbers (no native code, no recorder): nothing
  # for GC.stress to shake out, and a GC per allocation would make them take minutes.
  around do |example|
    stress = GC.stress
    GC.stress = false unless example.metadata[:stressed]
    example.run
  ensure
    GC.stress = stress
  end

  describe "on pure sampling noise (a steady site)" do
    [[2, 50_000], [3, 20_000], [5, 50_000], [10, 100_000], [30, 200_000]].each do |points, objects|
      it "reads steady in at least 98% of #{points}-profile series (#{objects / 1024} samples a profile)" do
        rng = Random.new(points)
        verdicts = TrendSimulation.verdicts(rng, series: series, points: points, objects: objects, growth: 0.0)
        growing = TrendSimulation.rate(verdicts, :growing)
        steady = TrendSimulation.rate(verdicts, :steady)
        puts format("\n  trend noise: %2d profiles, %3d samples each: %.2f%% growing, %.2f%% not steady (%d series)",
          points, objects / 1024, growing * 100, (1 - steady) * 100, series)
        expect(growing).to be <= 0.01
        expect(steady).to be >= 0.98
      end
    end
  end

  describe "on known slopes" do
    # [profiles, live objects at the first, growth over the series, least power asserted]
    [[3, 200_000, 1.0, 0.97], [3, 50_000, 2.0, 0.95], [5, 100_000, 1.0, 0.97], [10, 100_000, 0.5, 0.9],
      [5, 100_000, -0.5, 0.9], [10, 20_000, 1.0, 0.75]].each do |points, objects, growth, power|
      it "finds #{growth > 0 ? "growth" : "shrinkage"} of #{(growth * 100).round}% over #{points} profiles in at least #{(power * 100).round}% of series" do
        rng = Random.new(points * 7 + 1)
        verdicts = TrendSimulation.verdicts(rng, series: series, points: points, objects: objects, growth: growth)
        expected = growth > 0 ? :growing : :shrinking
        found = TrendSimulation.rate(verdicts, expected)
        puts format("\n  trend power: %2d profiles, %3d samples at the first, %+4d%% over the series: %.2f%% %s (%d series)",
          points, objects / 1024, (growth * 100).round, found * 100, expected, series)
        expect(found).to be >= power
        expect(verdicts).not_to include(growth > 0 ? :shrinking : :growing)
      end
    end
  end

  it "without sampling (period 1) follows the points exactly" do
    fit = described_class.fit([0, 60, 120], [1000, 2000, 3000], period: 1, mean_size: 10)
    expect(fit.slope).to be_within(1e-9).of(1000 / 60.0)
    expect(fit.verdict).to eq(:growing)
    expect(fit.confidence).to eq(1.0)
    flat = described_class.fit([0, 60, 120], [1000, 1000, 1000], period: 1, mean_size: 10)
    expect(flat.verdict).to eq(:steady)
  end

  it "computes the normal distribution (against tabulated quantiles)" do
    expect(described_class.normal_cdf(2.326)).to be_within(1e-4).of(0.99)
    expect(described_class.normal_cdf(2.576)).to be_within(1e-4).of(0.995)
    expect(described_class.normal_cdf(0)).to eq(0.5)
  end

  it "rejects a series of fewer than 2 points" do
    expect { described_class.fit([0], [1], period: 1, mean_size: 1) }.to raise_error(ArgumentError, /at least 2 points, got 1/)
  end
end

RSpec.describe "DatadogHeap::Profile.trend", :stressed do
  include ProfileFixtures

  # Three profiles a few milliseconds apart: the cache site grows, the buffer site stays.
  def series(dir)
    keep = []
    (1..3).map do |i|
      keep.concat(strings_at(ProfileFixtures::CACHE_SITE, 40, weight: 4))
      objects = keep + strings_at(ProfileFixtures::BUFFER_SITE, 50, weight: 4)
      rec = recorder_with(objects, sample_every: 4)
      sleep 0.01
      path = File.join(dir, "heap-#{i}.pb.gz")
      rec.write_profile(path)
      DatadogHeap::Profile.load(path)
    end
  end

  it "names the growing site first, the steady one after" do
    Dir.mktmpdir do |dir|
      trends = DatadogHeap::Profile.trend(series(dir).reverse, app_root: "/app")
      expect(trends.map(&:verdict)).to eq(%i[growing steady])
      grow, steady = trends
      expect(grow.label).to include("LeakyCache#remember")
      expect(grow.objects).to eq([160, 320, 480])
      expect(grow.times.first).to eq(0.0)
      expect(grow.times).to eq(grow.times.sort)
      expect(grow.slope).to be > 0
      expect(steady.label).to include("Buffer#push")
      expect(steady.objects).to eq([200, 200, 200])
      expect(steady.slope).to be_within(1e-6).of(0)
    end
  end

  it "groups like #top: one row per file with group: :file" do
    Dir.mktmpdir do |dir|
      trends = DatadogHeap::Profile.trend(series(dir), group: :file, app_root: "/app")
      expect(trends.map { |t| [t.label, t.verdict] }).to eq([["/app/leaky_cache.rb", :growing], ["/app/buffer.rb", :steady]])
      expect(trends[0].bytes).to eq(trends[0].bytes.sort)
    end
  end

  it "rejects what is not a series of profiles, naming the argument" do
    Dir.mktmpdir do |dir|
      profiles = series(dir)
      expect { DatadogHeap::Profile.trend(profiles.first(1)) }.to raise_error(ArgumentError, /profiles must hold at least 2 profiles, got 1/)
      expect { DatadogHeap::Profile.trend("x") }.to raise_error(TypeError, /profiles must be an Array.*"x"/)
      expect { DatadogHeap::Profile.trend([profiles[0], 1]) }.to raise_error(TypeError, /profiles\[1\] must be a DatadogHeap::Profile, got 1/)
      expect { DatadogHeap::Profile.trend(profiles, by: :size) }.to raise_error(ArgumentError, /unknown keyword :by/)
      same = DatadogHeap::Profile.load(profiles[0].path)
      expect { DatadogHeap::Profile.trend([profiles[0], same]) }.to raise_error(DatadogHeap::Error, /heap-1.pb.gz and .*heap-1.pb.gz have the same time/)
    end
  end
end
