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
      samples = times.each_index.map do |i|
        live = objects * (1 + growth * i / (points - 1).to_f)
        poisson(rng, live / period)
      end
      bytes = samples.map { |k| k * period * size }
      DatadogHeap::Trend.fit(times, bytes, period: period, mean_size: size, samples: samples).verdict
    end
  end

  # The verdicts of `series` series of `points` profiles one minute apart where one heavy sample
  # (weight drawn around `period`, up to 16 times it, as thinning makes them) appears at a random
  # profile and stays: a step from 0 that then stays flat. Sample counts are given to the fit.
  def step_verdicts(rng, series:, points:, period: 4096, size: 3400)
    times = Array.new(points) { |i| i * 60.0 }
    Array.new(series) do
      weight = (period * (0.5 + 15.5 * rng.rand)).round
      from = 1 + rng.rand(points - 1)
      samples = times.each_index.map { |i| i >= from ? 1 : 0 }
      bytes = samples.map { |k| k * weight * size }
      DatadogHeap::Trend.fit(times, bytes, period: period, mean_size: size, samples: samples).verdict
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

  describe "on one heavy sample that steps in from 0 and stays" do
    [3, 5, 10, 30].each do |points|
      it "never reads growing over #{points} profiles" do
        rng = Random.new(points * 13)
        verdicts = TrendSimulation.step_verdicts(rng, series: series, points: points)
        expect(verdicts.uniq).to eq([:steady])
      end
    end

    it "is steady even when the sample weighs more than the period says and no counts are given" do
      times = Array.new(10) { |i| i * 60.0 }
      bytes = [0] * 3 + [14_824 * 3400] * 7
      fit = described_class.fit(times, bytes, period: 4096, mean_size: 3400)
      expect(fit.verdict).to eq(:steady)
      expect(fit.note).to match(/samples/)
    end
  end

  it "never calls growing a site at 0 at both ends, or one that rose in a single step" do
    # Freed at the last profile after rising through the others: a fit alone reads it growing.
    rise = [0, 0, 1, 2, 3, 4, 5, 6, 7, 8, 0]
    hump = described_class.fit(Array.new(11) { |i| i * 60.0 }, rise.map { |k| k * 400_000 }, period: 4, mean_size: 100,
      samples: rise.map { |k| k * 1000 })
    expect(hump.verdict).to eq(:steady)
    expect(hump.note).to match(/0 at both ends/)
    times = Array.new(6) { |i| i * 60.0 }
    step = described_class.fit(times, [0, 0, 0, 1_000_000, 1_000_000, 1_000_000], period: 4, mean_size: 100,
      samples: [0, 0, 0, 2500, 2500, 2500])
    expect(step.verdict).to eq(:steady)
    expect(step.note).to match(/rose in 1 step/)
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

  # `idle` empty profiles (an app that has not allocated yet), then 5 profiles in which the cache
  # site grows by 40 samples each time while one Hash sample weighing 14824 appears in the second
  # and stays.
  def series_with_step(dir, idle: 0)
    keep = []
    heavy = [{}, [["Client#read", "/gems/puma-6.4.0/lib/puma/client.rb", 152]], 14_824, "Hash"]
    profiles = (1..idle).map do |i|
      sleep 0.01
      DatadogHeap::Profile.load(recorder_with([], sample_every: 4).write_profile(File.join(dir, "idle-#{i}.pb.gz")))
    end
    profiles + (1..5).map do |i|
      keep.concat(strings_at(ProfileFixtures::CACHE_SITE, 40, weight: 4))
      objects = keep + (i >= 2 ? [heavy] : [])
      sleep 0.01
      DatadogHeap::Profile.load(recorder_with(objects, sample_every: 4096).write_profile(File.join(dir, "heap-#{i}.pb.gz")))
    end
  end

  it "does not call one heavy sample that stepped in growing, and skips empty profiles at the start" do
    Dir.mktmpdir do |dir|
      plain = DatadogHeap::Profile.trend(series_with_step(dir), app_root: "/app")
      Dir.mktmpdir do |dir2|
        idle = DatadogHeap::Profile.trend(series_with_step(dir2, idle: 3), app_root: "/app")
        expect(idle.map { |t| [t.label, t.verdict, t.samples] }).to eq(plain.map { |t| [t.label, t.verdict, t.samples] })
        expect(idle.first.times.size).to eq(5)
      end
      grow, step = plain
      expect(grow).to have_attributes(verdict: :growing, samples: [40, 80, 120, 160, 200])
      expect(grow.label).to include("LeakyCache#remember")
      expect(step).to have_attributes(verdict: :steady, class_name: "Hash", samples: [0, 1, 1, 1, 1])
      expect(step.note).to match(/1 sample/)
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
