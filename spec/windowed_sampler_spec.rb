# frozen_string_literal: true

require "spec_helper"
require_relative "stress/stress_helper"

# The windowed sampler: no allocation hook between windows, estimates that hold when allocation
# patterns and rates change, and a timer that never outlives its recorders.
RSpec.describe "windowed sampler" do
  include StressHelpers

  def hooks
    newobj, gc_end, timer = DatadogHeap::Testing._native_hooks
    {newobj: newobj, gc_end: gc_end, timer: timer}
  end

  # The window timer's thread, whichever kind this Ruby uses: a Ruby thread before 3.3, a native
  # one (named in /proc) from 3.3 on.
  def timer_threads
    ruby = Thread.list.count { |t| t.name == "datadog_heap window timer" }
    native = Dir.glob("/proc/self/task/*/comm").count { |f| File.read(f).start_with?("datadog_heap ti") rescue false } # rubocop:disable Style/RescueModifier
    ruby + native
  end

  def live_by_site(rec)
    rec.each_live_object.each_with_object(Hash.new(0)) { |o, h| h[o.locations.first[0]] += o.weight }
  end

  # Relative error allowed for an estimate of `truth` objects sampled at `sample_every`: 10%, or
  # four standard deviations when that is wider. Windows are clusters: their samples rise and
  # fall together, so the deviation counts half as many samples as `truth / sample_every`.
  def tolerance(truth, sample_every)
    samples = truth / (2.0 * sample_every)
    [0.10, 4.0 / Math.sqrt(samples)].max
  end

  def expect_estimate(estimate, truth, sample_every, what)
    bound = tolerance(truth, sample_every) * truth
    expect(estimate).to be_within(bound).of(truth), "#{what}: estimated #{estimate} for #{truth} (allowed +-#{bound.round})"
  end

  it "installs no object-space hook between windows, and none at all for GCs" do
    result = in_child(60) do
      before = hooks
      rec = DatadogHeap::Recorder.new(sampler: :windowed, sample_every: 1024, windows_per_second: 200)
      rec.start
      running = hooks
      keep = []
      seen = Hash.new(0)
      # Allocate in bursts and look at the hooks in between: windows open and close. Under
      # GC_STRESS (a GC per allocation) bursts of 200, so the example stays under a minute.
      burst = RecorderHelpers::GC_STRESSED ? 200 : 2_000
      400.times do
        burst.times { keep << Object.new }
        keep.clear if keep.size > 100_000
        seen[hooks[:newobj]] += 1
        sleep 0.001
      end
      stats = rec.stats
      rec.stop
      [before, running, seen, hooks, stats[:sampler_windows_opened], stats[:sampler_samples_recorded], timer_threads]
    end
    before, running, seen, after, windows, samples, timers = result
    expect(before).to eq(newobj: false, gc_end: false, timer: nil)
    expect(running[:gc_end]).to be(false)
    expect(running[:timer]).to eq(200.0)
    # Windows opened and closed: most of the time, no NEWOBJ hook at all. (A window is at least
    # 2 ms of allocations at the pace the bursts run at, about 20,000, in a stratum of 16 times
    # that at 1 in 1024: 800,000 allocations hold two or three; a GC-stressed run at least one.)
    expect(windows).to be >= (RecorderHelpers::GC_STRESSED ? 1 : 2)
    expect(samples).to be > 0
    # Under GC_STRESS the bursts crawl (a GC per allocation) and the program looks quiet to the
    # timer, which keeps the hook armed to wake the sampler (about 500 allocations a tick).
    expect(seen[false]).to be > seen[true] unless RecorderHelpers::GC_STRESSED
    expect(after).to eq(newobj: false, gc_end: false, timer: nil)
    expect(timers).to eq(0)
  end

  it "keeps the hook armed through a quiet stretch, so the next burst is counted from its first allocation" do
    # A quiet tick (the program allocates nothing) arms the hook to ask for the window job after
    # 512 allocations (unless a window's start is near enough to arm for, or a window is open),
    # and that job for 512 more, where the program's pace is measured: a burst after the quiet
    # stretch cannot pass windows' starts before the timer has seen it. `start` does the same.
    # The stretch runs Ruby code, so ticks come in it on every Ruby: from 3.3 a sleeping thread
    # runs the tick only when it wakes, and that tick's stretch holds the burst before the sleep
    # too, which can read as busy (2 runs in 60 here); a tick that finds the program busy hurries
    # its successor by the program's pace instead of arming the hook.
    quiet = ->(seconds) do
      t = Process.clock_gettime(Process::CLOCK_MONOTONIC)
      nil while Process.clock_gettime(Process::CLOCK_MONOTONIC) - t < seconds
    end
    result = in_child(60) do
      rec = DatadogHeap::Recorder.new(sampler: :windowed, sample_every: 1024, max_overhead: nil)
      rec.start
      keep = []
      after_quiet = 3.times.map do
        quiet.(0.05)
        installed = hooks[:newobj]
        2_000.times { keep << Object.new }
        installed
      end
      stats = rec.stats
      rec.stop
      [after_quiet, stats[:sampler_window_ticks], stats[:sampler_window_wakeups]]
    end
    after_quiet, ticks, wakeups = result
    expect(ticks).to be >= 3
    expect(after_quiet).to all(be(true))
    expect(wakeups).to be >= 1 # at least the one `start` armed
  end

  # The workloads below pause now and then, as a server's threads do at every IO: `pause_every`
  # allocations, a 0.2 ms pause.
  def windowed(**opts)
    # No overhead budget: these examples check the estimator at a fixed interval.
    DatadogHeap::Recorder.new(sampler: :windowed, **{sample_every: 64, windows_per_second: 1000, max_overhead: nil}.merge(opts))
  end

  def allocating(n, pause_every)
    i = 0
    while i < n
      yield i
      i += 1
      sleep 0.0002 if i % pause_every == 0
    end
  end

  # Flush objects, of a class that no example counts: the array below may stay reachable after
  # GC.start (Ruby 3.3 keeps it, from a stale stack slot), and any counted class here would then be
  # overestimated by what a window sampled of it.
  Flush = Class.new

  def finish(rec)
    sleep 0.01 # a last window after the last allocation of interest
    Array.new(10_000) { Flush.new }
    rec.stop
    rec.commit
    GC.start
    rec.each_live_object.each_with_object(Hash.new(0)) { |o, h| h[o.class_name] += o.weight }
  end

  it "estimates three retained sites from their weights", :heavy do
    result = in_child(120) do
      rec = windowed
      rec.start
      keep = []
      allocating(200_000, 2_000) do |i|
        keep << Array.new(1)
        keep << {} if i % 4 == 0
        keep << String.new if i % 20 == 0
        3.times { Object.new }
      end
      finish(rec).values_at("Array", "Hash", "String")
    end
    %w[Array Hash String].zip([200_000, 50_000, 10_000], result).each do |what, truth, estimate|
      expect_estimate(estimate, truth, 64, what)
    end
  end

  it "keeps its estimates with a smaller in-window mean, over windows that cover less", :heavy do
    result = in_child(120) do
      expect(DatadogHeap::Testing._native_set_window_sample_every(16)).to eq(64)
      rec = windowed(sample_every: 256)
      allocated = GC.stat(:total_allocated_objects)
      rec.start
      keep = []
      allocating(200_000, 2_000) do |i|
        keep << Array.new(1)
        keep << {} if i % 4 == 0
        3.times { Object.new }
      end
      window_allocations = rec.stats[:sampler_window_allocations]
      allocated = GC.stat(:total_allocated_objects) - allocated
      [finish(rec).values_at("Array", "Hash"), window_allocations.to_f / allocated]
    end
    (array, hash), covered = result
    expect_estimate(array, 200_000, 256, "Array")
    expect_estimate(hash, 50_000, 256, "Hash")
    # Windows cover 16 / (256 - 16) of the gaps (6.7% of the allocations), not the 64 / 192 (33%)
    # of the default mean.
    expect(covered).to be_between(0.03, 0.12)
  end

  it "refuses an in-window mean outside 1..65536, naming it" do
    expect { DatadogHeap::Testing._native_set_window_sample_every(0) }
      .to raise_error(ArgumentError, /window sample_every must be between 1 and 65536, got 0/)
    expect(DatadogHeap::Testing._native_set_window_sample_every(64)).to eq(64)
  end

  it "does not alias with a periodic pattern (keep 1 allocation in K)", :heavy do
    # sample_every: 16 (8 inside windows) and 2M allocations give a large K a hundred samples or
    # more: a sampler that aliases with K estimates 0 or a multiple of the truth, far outside.
    result = in_child(120) do
      [2, 16, 128, 1024].to_h do |k|
        rec = windowed(sample_every: 16)
        rec.start
        keep = []
        allocating(2_000_000, 5_000) do |i|
          o = Object.new
          keep << o if i % k == 0
        end
        [k, [finish(rec)["Object"], keep.size]]
      end
    end
    result.each { |k, (estimate, truth)| expect_estimate(estimate, truth, 16, "K=#{k}") }
  end

  it "leaves the allocations of its own work out of the gaps it weighs", :heavy do
    # On Ruby 3.1 the commit job allocates about two objects per sample (WeakMap entries), most of
    # them after a window closed: counted as the program's, they made every estimate here 7% high.
    result = in_child(120) do
      rec = windowed(sample_every: 16)
      rec.start
      keep = []
      allocating(1_000_000, 5_000) do |i|
        o = Object.new
        keep << o if i.even?
      end
      own = DatadogHeap::Testing._native_own_allocations
      [finish(rec)["Object"], keep.size, own]
    end
    estimate, truth, own = result
    expect(own).to be > 0
    # About 30k samples: four standard deviations are under 3%.
    expect(estimate).to be_within(0.04 * truth).of(truth)
  end

  it "weighs phases of very different allocation rates right", :heavy do
    result = in_child(120) do
      rec = windowed
      rec.start
      fast = []
      slow = []
      # The slow phase pauses a hundred times as often, so windows
      # (opened per unit of time) see it far more often per allocation.
      allocating(200_000, 2_000) { fast << Array.new(1) }
      allocating(100_000, 20) { slow << String.new }
      counts = finish(rec)
      [counts["Array"], fast.size, counts["String"], slow.size]
    end
    fast_estimate, fast, slow_estimate, slow = result
    expect_estimate(fast_estimate, fast, 64, "fast phase")
    expect_estimate(slow_estimate, slow, 64, "slow phase")
  end

  it "watches one long C call all together or not at all, and says so in the row's ±", :heavy do
    # At 1 in 128 half of the allocations are in windows. One Marshal.load building 20,001
    # objects has no interrupt check inside, so it is in a window or not: its estimate is about
    # twice the truth or nothing, right on average, and the ± of its row (each window's samples
    # summed before squaring) is as wide as the error. Inside the window each object is sampled
    # with chance 1/64 at weight 128: a spread of sqrt(truth * 128**2 / 64) about twice the
    # truth. The seeds fix where the windows go.
    blob = Marshal.dump(Array.new(20_000) { |i| "m#{i}" })
    runs = in_child(120) do
      (1..8).map do |seed|
        rec = windowed(sample_every: 128, windows_per_second: 100)
        DatadogHeap::Testing._native_set_seed(rec, seed)
        rec.start
        kept = Marshal.load(blob) # rubocop:disable Security/MarshalLoad -- our own blob
        rec.stop
        GC.start
        estimate = rec.each_live_object.sum { |o| o.class_name == "String" ? o.weight : 0 }
        sd = DatadogHeap::Profile.parse(rec.profile).top(10, group: :class, by: :count)
          .find { |s| s.class_name == "String" }&.objects_stddev
        [estimate, sd, kept.size]
      end
    end
    runs.each do |estimate, sd, truth|
      in_window_sd = Math.sqrt(truth * 128**2 / 64)
      expect(estimate == 0 || (estimate - 2 * truth).abs < 4 * in_window_sd).to be(true), "#{estimate} for #{truth}"
      expect((estimate - truth).abs).to be <= 3 * sd if sd
    end
    expect(runs.map(&:first).count(0)).to be_between(1, 7)
  end

  it "stops its timer with the last recorder, and a forked child starts its own" do
    result = in_child(60) do
      rec = DatadogHeap::Recorder.new(sampler: :windowed, windows_per_second: 200)
      rec.start
      sleep 0.05
      with_timer = timer_threads
      reader, writer = IO.pipe
      pid = fork do
        reader.close
        many = RecorderHelpers::GC_STRESSED ? 2_000 : 200_000 # a GC per allocation under GC_STRESS
        keep = Array.new(many) { Object.new }
        sleep 0.1
        keep.concat(Array.new(many) { Object.new })
        writer.write(Marshal.dump([timer_threads, rec.stats[:sampler_window_ticks], rec.running?, keep.size]))
        writer.close
        exit!(0)
      end
      writer.close
      child = Marshal.load(reader.read) # rubocop:disable Security/MarshalLoad -- our own child
      Process.wait(pid)
      rec.stop
      stopped = timer_threads
      # A child forked while nothing runs has no timer.
      idle_child = IO.popen("-") { |io| io ? io.read : (print(timer_threads); exit!(0)) }
      [with_timer, child, stopped, idle_child.to_i]
    end
    with_timer, (child_timers, child_ticks, child_running, _), stopped, idle_child = result
    # Before 3.3 a Ruby timer thread ticks beside the native one (windows.rs, set_rate).
    timers = (RUBY_VERSION < "3.3") ? 2 : 1
    expect(with_timer).to eq(timers)
    expect([child_timers, child_running]).to eq([timers, true])
    expect(child_ticks).to be > 0 # the child's own timer ticked
    expect(stopped).to eq(0)
    expect(idle_child).to eq(0)
  end

  it "checks its options" do
    expect { DatadogHeap::Recorder.new(sampler: :sometimes) }.to raise_error(ArgumentError, /sampler must be one of :countdown, :windowed, got :sometimes/)
    expect { DatadogHeap::Recorder.new(sampler: "windowed") }.to raise_error(TypeError, /sampler must be a Symbol/)
    expect { DatadogHeap::Recorder.new(sampler: :windowed, windows_per_second: 0) }.to raise_error(ArgumentError, /windows_per_second must be above 0/)
    expect { DatadogHeap::Recorder.new(sampler: :windowed, windows_per_second: "5") }.to raise_error(TypeError, /windows_per_second must be a number/)
    expect { DatadogHeap::Recorder.new(sampler: :countdown, windows_per_second: 5) }.to raise_error(ArgumentError, /only/)
    rec = DatadogHeap::Recorder.new(sampler: :windowed, windows_per_second: 50)
    expect([rec.sampler, rec.windows_per_second]).to eq([:windowed, 50.0])
    expect(DatadogHeap::Recorder.new(sampler: :countdown).sampler).to eq(:countdown)
  end
end
