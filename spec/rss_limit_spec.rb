# frozen_string_literal: true

require "timeout"
require "tmpdir"
require "open3"
require "rbconfig"

# A profile before the OOM kill: RssWatch, the Recorder's rss_limit: and DATADOG_HEAP_RSS_LIMIT.
RSS_SPEC_LIB = File.expand_path("../lib", __dir__)
MIB = 1 << 20 unless defined?(MIB)

RSpec.describe DatadogHeap::RssWatch do

  it "reads the RSS on Linux" do
    skip "no /proc/self/statm here" unless File.readable?("/proc/self/statm")

    expect(described_class.rss).to be_between(1 * MIB, 64 << 30)
    expect(described_class).to be_supported
  end

  it "parses sizes in binary units, and refuses anything else" do
    expect(described_class.parse_size("512mb")).to eq(512 * MIB)
    expect(described_class.parse_size("2G")).to eq(2 << 30)
    expect(described_class.parse_size(" 64 k ")).to eq(64 << 10)
    expect(described_class.parse_size("1048576")).to eq(MIB)
    ["", "0", "-5mb", "1.5gb", "lots", "5tb"].each { |text| expect(described_class.parse_size(text)).to be_nil, text }
  end

  it "calls its block at the limit, then once per further step (one call for several steps at once)" do
    calls = []
    watch = described_class.new(limit: 100 * MIB, step: 25 * MIB) { |rss, threshold| calls << [rss / MIB, threshold / MIB] }
    readings = [50, 99, 100, 105, 124, 130, 260, 270].map { |m| m * MIB }
    allow(described_class).to receive(:rss) { readings.shift }
    crossed = Array.new(8) { watch.check }
    expect(crossed.map { |t| t && t / MIB }).to eq([nil, nil, 100, nil, nil, 125, 150, nil])
    expect(calls).to eq([[100, 100], [130, 125], [260, 150]])
    expect(watch.next_threshold).to eq(275 * MIB)
  end

  it "moves past a huge jump in one step: the next threshold is the first step above RSS, found at once" do
    watch = described_class.new(limit: 100 * MIB, step: 3 * MIB)
    rss = (1 << 56) + 12_345 # 64 PiB: about 2**34 steps of 3 MiB past the limit
    allow(described_class).to receive(:rss).and_return(rss)
    started = Process.clock_gettime(Process::CLOCK_MONOTONIC)
    crossed = Timeout.timeout(5) { watch.check }
    expect(Process.clock_gettime(Process::CLOCK_MONOTONIC) - started).to be < 1
    expect(crossed).to eq(100 * MIB)
    following = watch.next_threshold
    expect((following - 100 * MIB) % (3 * MIB)).to eq(0)
    expect(following).to be > rss
    expect(following - 3 * MIB).to be <= rss
    # Exactly at a threshold counts as reaching it.
    allow(described_class).to receive(:rss).and_return(following)
    expect(watch.check).to eq(following)
    expect(watch.next_threshold).to eq(following + 3 * MIB)
  end

  it "refuses a step under 1 MiB, naming it and the value" do
    [1, 4096, MIB - 1, 0, -1].each do |step|
      expect { described_class.new(limit: 100 * MIB, step: step) }.to raise_error(ArgumentError, /step must be at least 1 MiB .*got #{step}\z/)
    end
    expect(described_class.new(limit: 100 * MIB, step: MIB).step).to eq(MIB)
  end

  it "defaults the step to a tenth of the limit, at least 1 MiB" do
    expect(described_class.new(limit: 500 * MIB).step).to eq(50 * MIB)
    expect(described_class.new(limit: 5 * MIB).step).to eq(MIB)
  end
end

RSpec.describe "Recorder rss_limit:" do

  it "has readers, defaults and checks naming the option and the value" do
    rec = DatadogHeap::Recorder.new
    expect([rec.rss_limit, rec.rss_step, rec.rss_output]).to eq([nil, nil, nil])
    rec = DatadogHeap::Recorder.new(rss_limit: 300 * MIB)
    expect([rec.rss_limit, rec.rss_step, rec.rss_output]).to eq([300 * MIB, 30 * MIB, Dir.pwd])
    expect { DatadogHeap::Recorder.new(rss_limit: 0) }.to raise_error(ArgumentError, /rss_limit must be between 1 and \d+, got 0/)
    expect { DatadogHeap::Recorder.new(rss_limit: "5mb") }.to raise_error(TypeError, /rss_limit must be an Integer, got "5mb" \(String\)/)
    expect { DatadogHeap::Recorder.new(rss_limit: MIB, rss_step: -1) }.to raise_error(ArgumentError, /rss_step must be at least 1 MiB .*, got -1\z/)
    expect { DatadogHeap::Recorder.new(rss_limit: 100 * MIB, rss_step: 1) }
      .to raise_error(ArgumentError, /\Arss_step must be at least 1 MiB \(1048576 bytes.*, got 1\z/)
    expect { DatadogHeap::Recorder.new(rss_limit: 100 * MIB, rss_step: MIB - 1) }.to raise_error(ArgumentError, /rss_step .*got 1048575\z/)
    expect { DatadogHeap::Recorder.new(rss_limit: 100 * MIB, rss_step: 1.5) }.to raise_error(TypeError, /rss_step must be an Integer/)
    expect(DatadogHeap::Recorder.new(rss_limit: 100 * MIB, rss_step: MIB).rss_step).to eq(MIB)
    expect { DatadogHeap::Recorder.new(rss_step: MIB) }.to raise_error(ArgumentError, /rss_step applies with rss_limit only, got rss_step: 1048576/)
    expect { DatadogHeap::Recorder.new(rss_limit: MIB, rss_output: "") }.to raise_error(ArgumentError, /rss_output must not be empty/)
  end

  # RSS read through a stub: in the suite's process freed memory stays resident, so real growth
  # is not reliable here (the auto example below grows a fresh child for real).
  it "writes a profile from its watch thread when RSS crosses the limit, then at the next step" do
    rss = 100 * MIB
    allow(DatadogHeap::RssWatch).to receive(:rss) { rss }
    wait_for = lambda do |count|
      deadline = Process.clock_gettime(Process::CLOCK_MONOTONIC) + 30
      sleep 0.05 until rec_profiles(count) || Process.clock_gettime(Process::CLOCK_MONOTONIC) > deadline
    end
    Dir.mktmpdir do |dir|
      @rec = DatadogHeap::Recorder.new(rss_limit: 120 * MIB, rss_step: 16 * MIB, rss_output: File.join(dir, "rss"))
      allow(@rec).to receive(:warn)
      @rec.start
      begin
        sleep 2 * DatadogHeap::RssWatch::INTERVAL
        expect(@rec.rss_profiles).to eq([])
        rss = 121 * MIB
        wait_for.call(1)
        expect(@rec.rss_profiles).to eq([File.join(dir, "rss", "heap-rss-#{Process.pid}-1.pb.gz")])
        rss = 170 * MIB # past the steps at 136 and 152 at once: one profile
        wait_for.call(2)
        sleep 2 * DatadogHeap::RssWatch::INTERVAL
      ensure
        @rec.stop
      end
      expect(@rec.rss_profiles.size).to eq(2)
      expect(@rec).to have_received(:warn).with(/RSS 121 MiB reached 120 MiB \(rss_limit 120 MiB, step 16 MiB\): wrote #{Regexp.escape(@rec.rss_profiles[0])}/)
      expect(@rec).to have_received(:warn).with(/RSS 170 MiB reached 136 MiB/)
      expect(@rec.rss_profiles.map { |path| DatadogHeap::Profile.load(path) }).to all(be_a(DatadogHeap::Profile))
    end
  end

  def rec_profiles(count)
    @rec.rss_profiles.size >= count
  end

  it "stops its watch with the recorder" do
    rss = 10 * MIB
    allow(DatadogHeap::RssWatch).to receive(:rss) { rss }
    rec = DatadogHeap::Recorder.new(rss_limit: 20 * MIB)
    rec.start
    rec.stop
    rss = 30 * MIB
    sleep 2 * DatadogHeap::RssWatch::INTERVAL
    expect(rec.rss_profiles).to eq([])
  end
end

RSpec.describe "DATADOG_HEAP_RSS_LIMIT (datadog_heap/auto)" do
  # A child that reports whether any profile exists before it grows, then grows by 8 MiB every
  # 50 ms to 100 MiB past its start, then exits.
  RSS_SPEC_CHILD = <<~RUBY
    dir = ENV.fetch("DATADOG_HEAP_OUTPUT")
    sleep 0.4
    $stdout.puts "before: \#{Dir.children(dir).size} profiles"
    keep = []
    13.times { keep << ("x" * (8 << 20)); sleep 0.05 }
    sleep 0.6
    $stdout.puts "grew to \#{DatadogHeap::RssWatch.rss >> 20} MiB"
  RUBY

  it "writes a profile when a child grows past the limit, then at each step, and one at exit" do
    skip "no /proc/self/statm here" unless DatadogHeap::RssWatch.supported?

    Dir.mktmpdir do |dir|
      # Where a fresh child starts, so the limit sits above it.
      base, = Open3.capture2(RbConfig.ruby, "-I", RSS_SPEC_LIB, "-rdatadog_heap", "-e", "print DatadogHeap::RssWatch.rss >> 20")
      limit = Integer(base) + 40
      env = {"DATADOG_HEAP_OUTPUT" => "#{dir}/", "DATADOG_HEAP_RSS_LIMIT" => "#{limit}mb", "DATADOG_HEAP_RSS_STEP" => "30mb",
             "RUBYOPT" => "-I#{RSS_SPEC_LIB} -rdatadog_heap/auto"}
      out, err, status = Open3.capture3(env, RbConfig.ruby, "-e", RSS_SPEC_CHILD)
      expect(status.success?).to be(true), err
      expect(out).to start_with("before: 0 profiles")
      crossings = err.scan(/RSS \d+ MiB reached (\d+) MiB \(DATADOG_HEAP_RSS_LIMIT=#{limit}mb\): wrote (\S+)/)
      expect(crossings.map(&:first).map(&:to_i).first(2)).to eq([limit, limit + 30]), err
      files = Dir.children(dir).sort_by { |f| f[/-(\d+)\.pb\.gz/, 1].to_i }
      # One per crossing, then the exit profile.
      expect(files.size).to eq(crossings.size + 1)
      expect(crossings.map { |_, path| File.basename(path) }).to eq(files.first(crossings.size))
      files.each { |f| expect(DatadogHeap::Profile.load(File.join(dir, f)).sample_types).not_to be_empty }
    end
  end

  it "warns about a step under 1 MiB, and uses a tenth of the limit" do
    skip "no /proc/self/statm here" unless DatadogHeap::RssWatch.supported?

    Dir.mktmpdir do |dir|
      env = {"DATADOG_HEAP_OUTPUT" => "#{dir}/", "DATADOG_HEAP_RSS_LIMIT" => "4g", "DATADOG_HEAP_RSS_STEP" => "1",
             "RUBYOPT" => "-I#{RSS_SPEC_LIB} -rdatadog_heap/auto"}
      out, err, status = Open3.capture3(env, RbConfig.ruby, "-e", "print DatadogHeap::Auto.rss_watch.step")
      expect(status.success?).to be(true), err
      expect(err).to include('ignoring DATADOG_HEAP_RSS_STEP="1": expected a size of at least 1mb')
      expect(Integer(out)).to eq((4 << 30) / 10)
    end
  end

  it "warns about a limit that is not a size, and runs without it" do
    Dir.mktmpdir do |dir|
      env = {"DATADOG_HEAP_OUTPUT" => "#{dir}/", "DATADOG_HEAP_RSS_LIMIT" => "lots", "RUBYOPT" => "-I#{RSS_SPEC_LIB} -rdatadog_heap/auto"}
      _, err, status = Open3.capture3(env, RbConfig.ruby, "-e", "p DatadogHeap::Auto.rss_watch")
      expect(status.success?).to be(true)
      expect(err).to include('ignoring DATADOG_HEAP_RSS_LIMIT="lots": expected a size such as 512mb')
    end
  end
end
