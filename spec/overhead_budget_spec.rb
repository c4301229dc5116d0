# frozen_string_literal: true

require "spec_helper"
require_relative "stress/stress_helper"

# The overhead budget (max_overhead:): the sampler keeps its own time under a share of
# the process's CPU time by raising its mean interval, lowers it again when there is room, and
# weights each sample by the interval in force, so estimates stay unbiased. The process's CPU time
# and the cost of a sample come from the Testing cost model (a fixed CPU cost per program
# allocation and per sample), so what is asserted is the budget's behaviour, not the speed of
# the machine running the spec.
RSpec.describe "overhead budget" do
  include StressHelpers

  SAMPLE_EVERY = 64
  NS_PER_SAMPLE = 2_000

  # Live objects by innermost line, estimated from the recorder.
  def live_by_line(rec)
    rec.each_live_object.each_with_object(Hash.new(0)) { |o, h| h[o.locations.first[2]] += o.weight }
  end

  # Four standard deviations of an estimate of `truth` objects sampled one in `mean` at weight
  # `mean` (variance about truth * mean), or 10%, whichever is wider.
  def bound(truth, mean)
    [0.10 * truth, 4.0 * Math.sqrt(truth * mean)].max
  end

  it "validates max_overhead, names it in errors, and reads it back" do
    expect(DatadogHeap::Recorder.new.max_overhead).to eq(0.01)
    expect(DatadogHeap::Recorder.new(max_overhead: 0.05).max_overhead).to eq(0.05)
    expect(DatadogHeap::Recorder.new(max_overhead: 1).max_overhead).to eq(1.0)
    expect(DatadogHeap::Recorder.new(max_overhead: nil).max_overhead).to be_nil
    expect { DatadogHeap::Recorder.new(max_overhead: 0) }.to raise_error(ArgumentError, /max_overhead.*got 0/)
    expect { DatadogHeap::Recorder.new(max_overhead: 1.5) }.to raise_error(ArgumentError, /max_overhead.*got 1\.5/)
    expect { DatadogHeap::Recorder.new(max_overhead: -0.01) }.to raise_error(ArgumentError, /max_overhead/)
    expect { DatadogHeap::Recorder.new(max_overhead: "1%") }.to raise_error(TypeError, /max_overhead/)
    stats = DatadogHeap::Recorder.new(sample_every: 100).stats
    expect(stats).to include(sampler_effective_sample_every: 100, sampler_overhead_ns_total: 0, sampler_budget_raises: 0)
  end

  # What our samples make the VM do, which no clock of ours times, is charged as estimates: each
  # allocation the hook sees for a window, watched or counted while armed (the slow path and the
  # hook, 32 ns) and, before Ruby 3.3, each object entered in the WeakMap (its finalizer, 2.5 µs).
  # Without a budget nothing is charged.
  it "charges estimates of the VM's share per allocation inside a window and per WeakMap entry" do
    least = RecorderHelpers::GC_STRESSED ? 1 : 10 # commits; under full GC stress a few a second
    result = in_child(60) do
      run = lambda do |**options|
        rec = DatadogHeap::Recorder.new(sampler: :windowed, sample_every: 128, **options)
        rec.start
        deadline = Process.clock_gettime(Process::CLOCK_MONOTONIC) + 10
        keep = []
        while rec.stats[:lifetime_deferred_recordings_committed] < least && Process.clock_gettime(Process::CLOCK_MONOTONIC) < deadline
          keep = Array.new(1_000) { +"" }
        end
        rec.stop
        rec.commit
        keep.clear
        rec.stats.slice(:sampler_overhead_estimated_ns, :sampler_overhead_ns_total, :sampler_window_allocations,
          :sampler_window_armed_allocations, :lifetime_deferred_recordings_committed)
      end
      {budget: run.call(max_overhead: 0.5), none: run.call}
    end
    per_entry = (RUBY_VERSION < "3.3") ? 2_500 : 0
    stats = result[:budget]
    expect(stats[:lifetime_deferred_recordings_committed]).to be >= least
    expect(stats[:sampler_window_allocations]).to be > 0
    hooked = stats[:sampler_window_allocations] + stats[:sampler_window_armed_allocations]
    expect(stats[:sampler_overhead_estimated_ns]).to eq(hooked * 32 + stats[:lifetime_deferred_recordings_committed] * per_entry)
    expect(stats[:sampler_overhead_ns_total]).to be >= stats[:sampler_overhead_estimated_ns]
    expect(result[:none]).to include(sampler_overhead_estimated_ns: 0, sampler_overhead_ns_total: 0)
    expect(result[:none][:lifetime_deferred_recordings_committed]).to be >= least
  end

  it "stays within budget when the program allocates 10x faster mid-run, and keeps estimates unbiased" do
    result = in_child(120) do
      # Under GC stress a tenth of the allocations, each charged ten times the CPU time, and
      # samples ten times dearer: the same budget periods (the model's 20 ms of process CPU each)
      # and the same overheads, with fewer allocations.
      shrink = RecorderHelpers::GC_STRESSED ? 10 : 1
      slow_ns = 5_000.0 * shrink # a sample costs 2000 / (64 * 5000) = 0.6% of the CPU: in budget
      fast_ns = slow_ns / 10 # 10x the allocations per CPU second: 6.25% at the base interval
      rec = DatadogHeap::Recorder.new(sample_every: SAMPLE_EVERY, max_overhead: 0.01)
      DatadogHeap::Testing._native_set_seed(rec, 42)
      sample_ns = NS_PER_SAMPLE * shrink
      DatadogHeap::Testing._native_set_cost_model(rec, slow_ns, sample_ns)
      rec.start
      site = nil
      phase = lambda do |count|
        before = rec.stats
        site = __LINE__ + 1
        keep = Array.new(count) { +"" } # the site whose live objects are estimated
        after = rec.stats
        spent = after[:sampler_overhead_ns_total] - before[:sampler_overhead_ns_total]
        cpu = after[:sampler_overhead_cpu_ns] - before[:sampler_overhead_cpu_ns]
        [keep, {overhead: spent.to_f / [cpu, 1].max, last: after[:sampler_last_overhead], interval: after[:sampler_effective_sample_every],
                raises: after[:sampler_budget_raises], lowers: after[:sampler_budget_lowers]}]
      end
      slow_keep, slow = phase.call(40_000 / shrink)
      DatadogHeap::Testing._native_set_cost_model(rec, fast_ns, sample_ns)
      fast_keep, fast = phase.call(400_000 / shrink)
      DatadogHeap::Testing._native_set_cost_model(rec, slow_ns, sample_ns)
      _, back = phase.call(40_000 / shrink)
      rec.stop
      GC.start
      live = live_by_line(rec)
      {slow: slow, fast: fast, back: back, live: live[site], truth: slow_keep.size + fast_keep.size,
       max_interval: fast[:interval]}
    end
    slow, fast, back = result.values_at(:slow, :fast, :back)
    # In budget at the base interval: untouched.
    expect(slow[:interval]).to eq(SAMPLE_EVERY)
    expect(slow[:raises]).to eq(0)
    # 10x faster: the interval rose (6.25% / 0.8% asks for about 8x) after the first period (of
    # ten in the phase) went over; the periods since are within the 1% budget, and the whole phase
    # near it: (6.25% + 9 x 0.8%) / 10 = 1.35%, give or take the noise in how many samples a
    # period holds (few under GC stress).
    expect(fast[:raises]).to be >= 1
    expect(fast[:interval]).to be_between(SAMPLE_EVERY * 4, SAMPLE_EVERY * 16)
    # The last period alone: within the budget give or take its sample count's noise (about 80
    # samples a period here, 8 under GC stress).
    expect(fast[:last]).to be <= 0.015
    expect(fast[:overhead]).to be <= 0.02
    # Slow again: back down to what was asked for.
    expect(back[:lowers]).to be >= 1
    expect(back[:interval]).to eq(SAMPLE_EVERY)
    # Unbiased: both phases' kept objects (one site), estimated within sampling error.
    truth = result[:truth]
    expect(result[:live]).to be_within(bound(truth, result[:max_interval])).of(truth)
  end

  it "ends its first period after a fifth of the others, so a fresh recorder is held to its budget early" do
    # Under GC.stress the process's CPU time is nearly all GC, which the budget does not count as
    # the recorder's (a stretch with a GC inside is charged once): then even 0.01% fits sampling.
    skip "GC.stress makes the process's CPU time GC's, and the budget's premise false" if RecorderHelpers::GC_STRESSED
    # The real clocks, not the model: a budget no sampling fits in (0.01% of the CPU time) must
    # raise the interval once the first period ends, 50 ms of wall time (and 20 ms of the
    # process's CPU) after start, where the periods after it take 250 ms.
    result = in_child(60) do
      rec = DatadogHeap::Recorder.new(sample_every: SAMPLE_EVERY, max_overhead: 0.0001)
      clock = -> { Process.clock_gettime(Process::CLOCK_MONOTONIC) }
      started = clock.call
      rec.start
      raised_at = nil
      until raised_at || clock.call - started > 2.0
        2_000.times { Object.new }
        raised_at = clock.call - started if rec.stats[:sampler_budget_raises] > 0
      end
      rec.stop
      {raised_at: raised_at}
    end
    expect(result[:raised_at]).to be_between(0.05, 0.2)
  end
end
