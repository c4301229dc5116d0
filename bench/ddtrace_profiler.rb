# frozen_string_literal: true

# Datadog's whole profiler (Datadog.configure: allocation + heap profiling on) over a service-like
# workload, against an installed `datadog` gem (docs/c-abi.md). It runs under one build of
# datadog_profiling_native_extension: as shipped (C heap recorder) or with datadog_heap's C ABI in
# place of heap_recorder.c; PROFILER=off runs the same workload with no profiler, the baseline;
# HEAP=off runs the profiler with allocation profiling but no heap profiling (no heap recorder).
#
# Prints one JSON line: the workload's wall and CPU seconds and, with the profiler on, the
# profiler's own counters (allocations it sampled, the mean time it spent per sampled allocation,
# which includes the heap recorder's start/end, serialization time) and what the profile holds
# after one final serialization (heap-live samples: the recorder really tracked objects).
require "json"

PROFILER = ENV.fetch("PROFILER", "on") != "off"
HEAP = ENV.fetch("HEAP", "on") != "off"
N = Integer(ENV.fetch("ALLOCATIONS", "10000000"))

if PROFILER
  require "datadog"
  require "datadog/profiling/pprof/pprof_pb"
  require "zstd-ruby"

  # dd-trace-rb master (2.42) refuses heap profiling before Ruby 3.1.4 (its ObjectSpace::WeakMap
  # could be corrupted by compaction, Ruby bug 19529). This workload never compacts, so on such a
  # Ruby the gate is lifted here, for both recorders alike, and the output says so.
  HEAP_GATE_LIFTED = HEAP && Gem::Version.new(RUBY_VERSION) < Gem::Version.new("3.1.4") &&
    Datadog::Profiling::Component.respond_to?(:enable_heap_profiling?, true)
  if HEAP_GATE_LIFTED
    Datadog::Profiling::Component.singleton_class.prepend(Module.new do
      def enable_heap_profiling?(settings, allocation_profiling_enabled, _heap_sample_rate, _logger)
        settings.profiling.advanced.experimental_heap_enabled && allocation_profiling_enabled
      end
    end)
  end

  Datadog.configure do |c|
    c.profiling.enabled = true
    c.profiling.allocation_enabled = true
    c.profiling.advanced.experimental_heap_enabled = HEAP
    c.profiling.advanced.experimental_heap_size_enabled = HEAP
    if ENV["OVERHEAD_TARGET"]
      c.profiling.advanced.overhead_target_percentage = Float(ENV["OVERHEAD_TARGET"])
    end
    # No agent runs here: uploads (every 60 s, so at most the final one) go to a closed local port.
    c.agent.host = "127.0.0.1"
    c.agent.port = Integer(ENV.fetch("DD_AGENT_PORT", "9"))
    c.telemetry.enabled = false
    c.remote.enabled = false
    c.crashtracking.enabled = false
    c.diagnostics.startup_logs.enabled = false
    c.logger.level = ::Logger::FATAL
  end
  raise "profiler did not start: #{Datadog::Profiling.unsupported_reason}" unless Datadog::Profiling.supported?
end

# Service-like churn: short-lived strings/arrays/hashes, one in 7 kept in a ring of 20 000 (so a
# steady live set that keeps being replaced), a few larger objects.
def workload(n)
  ring = Array.new(20_000)
  n.times do |i|
    obj =
      case i % 5
      when 0 then "request-#{i}"
      when 1 then [i, i + 1, i + 2]
      when 2 then {id: i, name: "n"}
      when 3 then i.to_s * 3
      else Struct.new(:a).new(i) if i % 10_000 == 4
      end
    ring[i % 20_000] = obj if i % 7 == 0
  end
  ring.compact.size
end

def clock(id) = Process.clock_gettime(id)

workload(N / 10) # warm-up
wall0 = clock(Process::CLOCK_MONOTONIC)
cpu0 = clock(Process::CLOCK_PROCESS_CPUTIME_ID)
workload(N)
result = {
  profiler: PROFILER,
  heap: PROFILER && HEAP,
  wall_s: (clock(Process::CLOCK_MONOTONIC) - wall0).round(4),
  cpu_s: (clock(Process::CLOCK_PROCESS_CPUTIME_ID) - cpu0).round(4),
}

if PROFILER
  profiler = Datadog.send(:components).profiler
  worker = profiler.instance_variable_get(:@worker)
  recorder = profiler.instance_variable_get(:@scheduler).instance_variable_get(:@exporter)
    .instance_variable_get(:@pprof_recorder)
  stats = worker.stats
  result[:allocation_sampled] = stats[:allocation_sampled]
  result[:allocation_sampling_time_ns_avg] = stats[:allocation_sampling_time_ns_avg]&.round
  result[:allocation_sampling_time_ns_total] = stats[:allocation_sampling_time_ns_total]
  _start, _finish, encoded = recorder.serialize
  profile = Perftools::Profiles::Profile.decode(Zstd.decompress(encoded._native_bytes))
  types = profile.sample_type.map { |t| profile.string_table[t.type] }
  heap_index = types.index("heap-live-samples")
  result[:heap_live_samples] = heap_index && profile.sample.sum { |s| s.value[heap_index] }
  rstats = recorder.stats
  result[:serialization_time_ns_avg] = rstats[:serialization_time_ns_avg]
  result[:heap_gate_lifted] = HEAP_GATE_LIFTED
  result[:heap_recorder] = rstats[:heap_recorder_snapshot]&.slice(:num_object_records, :num_heap_records)
end

puts JSON.generate(result)
