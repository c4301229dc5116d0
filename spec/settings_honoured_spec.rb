# frozen_string_literal: true

require "spec_helper"
require_relative "stress/stress_helper"
require "datadog_heap/cli"
require "stringio"
require "tmpdir"

# What the user asks for is what the gem does, and where the gem overrides a setting it says so:
# an explicit sample_every is not raised by the overhead budget unless max_overhead is given too;
# a budget that raised the interval warns once per process, says it in stats and in every profile.
# The :leak_hunt preset, a full GC before a profile on request, and the gem's own allocations left
# out of every profile.
RSpec.describe "settings the gem honours" do
  include StressHelpers

  # Allocations under load: under GC_STRESS every one runs a GC (200,000 took 100 s there), and a
  # few thousand already give the budget the samples it judges by.
  many = RecorderHelpers::GC_STRESSED ? 5_000 : 200_000

  it "applies the overhead budget to the default interval only, unless max_overhead is given" do
    expect(DatadogHeap::Recorder.new.max_overhead).to eq(0.01)
    expect(DatadogHeap::Recorder.new(sampler: :countdown).max_overhead).to eq(0.01)
    expect(DatadogHeap::Recorder.new(sample_every: 1024).max_overhead).to be_nil
    expect(DatadogHeap::Recorder.new(sample_every: 64, sampler: :countdown).max_overhead).to be_nil
    expect(DatadogHeap::Recorder.new(sample_every: 64, max_overhead: 0.02).max_overhead).to eq(0.02)
    expect(DatadogHeap::Recorder.new(sample_every: 64, max_overhead: nil).max_overhead).to be_nil
  end

  it "honours an explicit sample_every under load the budget would have raised it for" do
    result = in_child(60) do
      rec = DatadogHeap::Recorder.new(sample_every: 64)
      # Each sample charged as 2 ms of a 5 us allocation: far over any budget.
      DatadogHeap::Testing._native_set_cost_model(rec, 5_000.0, 2_000_000)
      rec.start
      keep = Array.new(many / 2) { +"" }
      rec.stop
      [rec.stats.slice(:sampler_effective_sample_every, :sampler_budget_raises, :sampler_budget_note), keep.size]
    end
    stats, = result
    expect(stats).to eq(sampler_effective_sample_every: 64, sampler_budget_raises: 0, sampler_budget_note: nil)
  end

  it "says when the budget raised the interval: one warning per process, stats, every profile" do
    result = in_child(60) do
      warnings = []
      Warning.singleton_class.prepend(Module.new { define_method(:warn) { |msg, **| warnings << msg } })
      profiles = Array.new(2) do
        rec = DatadogHeap::Recorder.new(sampler: :countdown, sample_every: 64, max_overhead: 0.01)
        DatadogHeap::Testing._native_set_cost_model(rec, 5_000.0, 2_000_000)
        rec.start
        keep = Array.new(many) { +"" }
        rec.commit
        rec.stop
        GC.start
        [DatadogHeap::Profile.parse(rec.profile).comments, rec.stats[:sampler_budget_note], rec.stats[:sampler_effective_sample_every], keep.size]
      end
      [profiles, warnings.grep(/asked 1 in/)]
    end
    profiles, warnings = result
    expect(warnings.size).to eq(1), warnings.inspect
    expect(warnings.first).to match(/asked 1 in 64 allocations, sampled 1 in \d+ .*max_overhead: 0\.01.*max_overhead: nil/)
    profiles.each do |comments, note, effective, _|
      expect(effective).to be > 64
      expect(note).to match(/asked 1 in 64 allocations, sampled 1 in #{effective}/)
      expect(comments).to include(note)
    end
  end

  it "prints the budget's note under the report header" do
    path = in_child(60) do
      rec = DatadogHeap::Recorder.new(sampler: :countdown, sample_every: 64, max_overhead: 0.01)
      DatadogHeap::Testing._native_set_cost_model(rec, 5_000.0, 2_000_000)
      rec.start
      keep = Array.new(many) { +"" }
      rec.stop
      file = File.join(Dir.tmpdir, "budget-#{Process.pid}.pb.gz")
      rec.write_profile(file)
      keep.size && file
    end
    out = StringIO.new
    DatadogHeap::CLI.new(out: out, err: StringIO.new).run(["report", path])
    expect(out.string.lines.first(6).join).to match(/Note: datadog_heap: asked 1 in 64 allocations, sampled 1 in \d+/)
  ensure
    File.unlink(path) if path && File.exist?(path)
  end

  describe "preset: :leak_hunt" do
    it "samples densely with no budget, and options beside it win" do
      rec = DatadogHeap::Recorder.new(preset: :leak_hunt)
      expect([rec.preset, rec.sampler, rec.sample_every, rec.max_overhead]).to eq([:leak_hunt, :countdown, 128, nil])
      expect(rec.gc_before_profile?).to be(true)
      expect(rec.retainers_by_default?).to be(true)
      rec = DatadogHeap::Recorder.new(preset: :leak_hunt, sample_every: 512, max_overhead: 0.05)
      expect([rec.sample_every, rec.max_overhead]).to eq([512, 0.05])
      expect(rec.inspect).to include("preset=:leak_hunt")
    end

    it "refuses an unknown preset, a preset of the wrong type, and options that clash with it, naming both" do
      expect { DatadogHeap::Recorder.new(preset: :fast) }.to raise_error(ArgumentError, /preset must be one of :leak_hunt, got :fast/)
      expect { DatadogHeap::Recorder.new(preset: "leak_hunt") }.to raise_error(TypeError, /preset must be a Symbol, got "leak_hunt"/)
      expect { DatadogHeap::Recorder.new(preset: :leak_hunt, windows_per_second: 50) }
        .to raise_error(ArgumentError, /windows_per_second.*preset: :leak_hunt.*sampler: :countdown/)
      expect { DatadogHeap::Recorder.new(preset: :leak_hunt, sample_every: 0) }
        .to raise_error(ArgumentError, /sample_every.*got 0.*preset: :leak_hunt/)
      expect { DatadogHeap.start(preset: :nope) }.to raise_error(ArgumentError, /preset must be one of/)
    end

    it "says what it costs once per process when it starts" do
      out = in_child(30) do
        warnings = []
        Warning.singleton_class.prepend(Module.new { define_method(:warn) { |msg, **| warnings << msg } })
        2.times do
          rec = DatadogHeap::Recorder.new(preset: :leak_hunt)
          rec.start
          rec.stop
        end
        warnings.grep(/leak_hunt/)
      end
      expect(out.size).to eq(1)
      expect(out.first).to match(/preset :leak_hunt: countdown sampler at 1 in 128, no overhead budget.*costs about \+\d+% CPU/)
    end

    it "is read from DATADOG_HEAP_PRESET in auto mode" do
      require "datadog_heap/auto_mode"
      expect(DatadogHeap::Auto.config("DATADOG_HEAP_PRESET" => "leak_hunt")[:preset]).to eq(:leak_hunt)
      expect { expect(DatadogHeap::Auto.config("DATADOG_HEAP_PRESET" => "fast")[:preset]).to be_nil }
        .to output(/ignoring DATADOG_HEAP_PRESET="fast"/).to_stderr
    end
  end

  it "runs a full GC before a profile when asked (or by the preset), and the profile says whether one ran" do
    rec = DatadogHeap::Recorder.new(sampler: :countdown, sample_every: 1)
    rec.start
    keep = Array.new(100) { Object.new }
    rec.stop
    gcs = GC.count
    with_gc = DatadogHeap::Profile.parse(rec.profile(gc: true)).comments
    expect(GC.count).to be > gcs
    expect(with_gc).to include(a_string_matching(/a full GC ran just before this profile/))
    without = DatadogHeap::Profile.parse(rec.profile(gc: false)).comments
    expect(without).to include(a_string_matching(/no full GC ran just before this profile/))
    expect { rec.profile(gc: 1) }.to raise_error(TypeError, /gc must be true or false/)
    hunt = DatadogHeap::Recorder.new(preset: :leak_hunt)
    expect(DatadogHeap::Profile.parse(hunt.profile).comments).to include(a_string_matching(/a full GC ran/))
    expect(keep.size).to eq(100)
  end

  it "never samples the gem's own work: profiles written, the block of DatadogHeap.own_work" do
    rec = DatadogHeap::Recorder.new(sampler: :countdown, sample_every: 1)
    rec.start
    ours = DatadogHeap.own_work { Array.new(500) { Object.new } }
    theirs = Array.new(500) { Object.new }
    Dir.mktmpdir { |dir| 5.times { |i| rec.write_profile(File.join(dir, "p#{i}.pb.gz")) } }
    rec.stop
    GC.start
    files = rec.each_live_object.map { |o| o.locations.first[1] }
    expect(files.grep(%r{lib/datadog_heap/})).to be_empty
    lines = rec.each_live_object.map { |o| o.locations.first[2] }
    expect(lines.count(__LINE__ - 8)).to eq(0) # DatadogHeap.own_work's block
    expect(lines.count(__LINE__ - 8)).to be >= 400 # the program's Array.new block
    expect([ours.size, theirs.size]).to eq([500, 500])
  end
end
