# frozen_string_literal: true

# Loaded through RUBYOPT by bench/service_toggle.rb into the example service: each forked puma
# worker runs a thread that switches a recorder at its defaults on (Recorder#start) and off
# (#stop, which keeps what it tracks) every TOGGLE_PHASE seconds, and, at each switch, adds the
# phase's process CPU time and requests served to that state's totals, written to
# TOGGLE_OUT/<pid>.json. Alternating within one process every few seconds pairs each "on" phase
# with the "off" phases beside it, so a change of load on the machine hits both states alike.
# TOGGLE_MODE=off keeps the recorder off in both states (the method's own A/A noise);
# TOGGLE_MODE=hook switches an empty NEWOBJ hook instead of the recorder (the VM's floor);
# TOGGLE_MODE=windowed / countdown switches a recorder with that sampler (its other options
# default); TOGGLE_MODE=fixed a countdown recorder at exactly TOGGLE_SAMPLE_EVERY (default 1024),
# no budget, so that two builds of the gem take the same samples; TOGGLE_MODE=dense the windowed
# sampler at TOGGLE_SAMPLE_EVERY under the default budget (a denser default, tried);
# TOGGLE_MODE=timer the defaults but a window timer of TOGGLE_WINDOWS_PER_SECOND (default 25)
# ticks a second (what the timer's ticks cost); TOGGLE_MODE=ticks / slow_ticks the window timer
# alone (windows that never come), at its default rate / at TOGGLE_WINDOWS_PER_SECOND.
require "datadog_heap"
require "json"
require_relative "../lib/thread_cpu"

module ServiceToggle
  PHASE = Float(ENV.fetch("TOGGLE_PHASE", "2"))
  OUT = ENV.fetch("TOGGLE_OUT")
  MODE = ENV.fetch("TOGGLE_MODE", "on")
  # The interval of the "fixed" and "dense" modes.
  SAMPLE_EVERY = Integer(ENV.fetch("TOGGLE_SAMPLE_EVERY", "1024"))
  # The window timer's rate of the "timer" and "slow_ticks" modes.
  WINDOWS_PER_SECOND = Float(ENV.fetch("TOGGLE_WINDOWS_PER_SECOND", "25"))

  @requests = 0
  @lock = Mutex.new

  class << self
    def count
      @lock.synchronize { @requests += 1 }
    end

    def requests
      @lock.synchronize { @requests }
    end

    def cpu
      Process.clock_gettime(Process::CLOCK_PROCESS_CPUTIME_ID)
    end

    # CPU time (s) of the gem's own threads (bench/lib/thread_cpu.rb; 0 without /proc): lets the
    # bench split an "on" phase's extra CPU between the gem's threads and the program's.
    def own_threads_cpu
      ThreadCpu.gem_threads_ns / 1e9
    end

    # The VM's time in GC so far (s; 0 where Ruby does not measure it, before 3.1): the part of a
    # phase's CPU that marking and sweeping took, the recorder's WeakMap and records included.
    def gc_time
      GC.respond_to?(:total_time) ? GC.total_time / 1e9 : 0.0
    end

    # The window timer thread's wake-ups so far (nil from a build that does not count them, as one
    # compared through TOGGLE_COMPARE_LIB may be).
    def timer_wakes
      DatadogHeap::Testing._native_window_timer_wakes if DatadogHeap::Testing.respond_to?(:_native_window_timer_wakes)
    end

    def switch(rec, on)
      case MODE
      when "off" then nil
      when "hook" then DatadogHeap::Testing._native_empty_hook(on)
      else on ? rec.start : rec.stop
      end
    end

    # In each worker: alternate, and write the totals so far at each switch (a worker may be
    # killed at any time).
    def run
      rec = case MODE
      when "windowed", "countdown" then DatadogHeap::Recorder.new(sampler: MODE.to_sym)
      when "fixed" then DatadogHeap::Recorder.new(sampler: :countdown, sample_every: SAMPLE_EVERY, max_overhead: nil)
      when "dense"
        DatadogHeap::Recorder.new(sample_every: SAMPLE_EVERY, max_overhead: DatadogHeap::Recorder::DEFAULTS.fetch(:max_overhead))
      when "timer" then DatadogHeap::Recorder.new(windows_per_second: WINDOWS_PER_SECOND)
      # The window timer and its wake-ups with (almost) no window: one window in 2**32 * 32
      # allocations, no budget; "slow_ticks" at WINDOWS_PER_SECOND.
      when "ticks", "slow_ticks"
        rate = (MODE == "slow_ticks") ? {windows_per_second: WINDOWS_PER_SECOND} : {}
        DatadogHeap::Recorder.new(sampler: :windowed, sample_every: 2**32 - 1, max_overhead: nil, **rate)
      else DatadogHeap::Recorder.new
      end
      phases = []
      state = :off
      loop do
        started = Process.clock_gettime(Process::CLOCK_MONOTONIC)
        cpu0 = cpu
        own0 = own_threads_cpu
        gc0 = gc_time
        gcs0 = GC.count
        req0 = requests
        sleep PHASE
        phases << {state: state, cpu: cpu - cpu0, own: own_threads_cpu - own0, gc: gc_time - gc0, gcs: GC.count - gcs0,
                   requests: requests - req0, started: started, ended: Process.clock_gettime(Process::CLOCK_MONOTONIC)}
        state = (state == :on) ? :off : :on
        switch(rec, state == :on)
        File.write(File.join(OUT, "#{Process.pid}.json.tmp"), JSON.generate(phases: phases, stats: rec.stats.slice(
          :sampler_samples_recorded, :sampler_effective_sample_every, :num_object_records, :sampler_last_overhead,
          :sampler_allocations_seen, :sampler_window_allocations, :sampler_window_armed_allocations, :sampler_window_ticks
        ).merge(signals: DatadogHeap::Testing._native_window_signals, wakes: timer_wakes).transform_values { |v| v.is_a?(Float) ? v.round(5) : v }))
        File.rename(File.join(OUT, "#{Process.pid}.json.tmp"), File.join(OUT, "#{Process.pid}.json"))
      end
    end
  end

  # Counts the requests the app serves (puma calls the Rack app's class method `call`).
  module Counting
    def call(env)
      ServiceToggle.count
      super
    end
  end

  # Starts the switching thread in each forked worker.
  module AfterFork
    def _fork
      pid = super
      Thread.new { ServiceToggle.run } if pid.zero?
      pid
    end
  end
end

Process.singleton_class.prepend(ServiceToggle::AfterFork)
# The app is loaded after this file (preload_app!): count once it exists.
# The sinatra service is called through its class; the Rails app through its instance.
TracePoint.new(:end) do |tp|
  case tp.self.name
  when "ServiceApp"
    ServiceApp.singleton_class.prepend(ServiceToggle::Counting)
    tp.disable
  when "LeakyApp"
    tp.self.prepend(ServiceToggle::Counting)
    tp.disable
  end
end.enable
