# frozen_string_literal: true

require "spec_helper"
require_relative "stress_helper"

# Before Ruby 3.3 the window timer reaches a Ruby thread by signal, and that thread's handler asks
# the VM for the window job. Asked from a thread without the GVL (blocked in a system call, or
# waiting for the GVL), the request races with the GVL holder's flush of the VM's job queue: a job
# lost, or one run with another job's data (Ruby's own deferred-finalizer job with a NULL pointer,
# say). The handler asks only when its thread holds the GVL. The race itself is a window of a few
# instructions that no spec can hit on demand; this one builds the conditions it needs (threads
# blocked in IO.select that were seen running, finalizer jobs, a thousand windows a second) and
# checks that windows still open at the asked rate, that no signal found the owner unknown, and
# that the process lives.
RSpec.describe "window timer signals", :stress do
  include StressHelpers

  it "asks for windows from the GVL owner only, with threads blocked in IO.select and finalizers" do
    result = in_child(120) do
      pipes = Array.new(4) { IO.pipe }
      # Each thread allocates first (so sampled commits run on it and the timer has seen it
      # running), then blocks in select on a pipe nobody writes to until the end.
      blocked = pipes.map do |reader, _|
        Thread.new do
          20_000.times { Object.new }
          IO.select([reader])
        end
      end
      finalized = 0
      rec = DatadogHeap::Recorder.new(sampler: :windowed, sample_every: 256, windows_per_second: 1000, max_overhead: nil)
      rec.start
      started = Process.clock_gettime(Process::CLOCK_MONOTONIC)
      keep = []
      while Process.clock_gettime(Process::CLOCK_MONOTONIC) - started < 2.0
        o = Object.new
        ObjectSpace.define_finalizer(o, proc { finalized += 1 })
        keep << o << "x" * 10
        keep.clear if keep.size > 2_000
      end
      elapsed = Process.clock_gettime(Process::CLOCK_MONOTONIC) - started
      stats = rec.stats
      rec.stop
      pipes.each { |_, writer| writer.write("x") }
      blocked.each(&:join)
      GC.start
      [stats[:sampler_window_ticks] / elapsed, DatadogHeap::Testing._native_window_signals, finalized,
        DatadogHeap._native_native_window_timer]
    end
    rate, signals, finalized, native = result
    expect(finalized).to be > 0
    # 1000 asked a second; the busy thread gets a tick at most about every 1 ms. The Ruby timer
    # thread (3.3.0 with M:N threads, no free signal) reaches about 10 a second.
    expect(rate).to be > (native ? 300 : 5), "#{rate.round} ticks a second, signals #{signals.inspect}"
    if signals && native
      registered, _not_owner = signals
      expect(registered).to be > 0
    end
  end
end
