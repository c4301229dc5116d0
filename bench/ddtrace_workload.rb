# frozen_string_literal: true

# A workload for Datadog's profiling extension of an installed `datadog` gem (as shipped, or built
# elsewhere with heap_recorder.c replaced by datadog_heap's C ABI: docs/c-abi.md). It allocates like a service (strings, arrays,
# hashes, a retained set that churns) and samples one allocation in SAMPLE_EVERY through the
# extension's own sampling path (StackRecorder::Testing._native_track_object + Collectors::Stack
# sampling + the pending-recordings flush), serializing the profile every SERIALIZE_EVERY
# allocations. Prints process CPU seconds with heap profiling off and on, their ratio, and the
# difference per sampled object: the recorder's cost (track + commit + its share of serializing).

require "datadog/profiling/spec_helper" if ENV["DDTRACE_CHECK_SPEC_HELPER"]
require "datadog/profiling"
require "datadog/profiling/stack_recorder"

N = Integer(ENV.fetch("ALLOCATIONS", "4000000"))
SAMPLE_EVERY = Integer(ENV.fetch("SAMPLE_EVERY", "100"))
SERIALIZE_EVERY = Integer(ENV.fetch("SERIALIZE_EVERY", "500000"))

def recorder(heap)
  Datadog::Profiling::StackRecorder.new(
    cpu_time_enabled: false, alloc_samples_enabled: true,
    heap_samples_enabled: heap, heap_size_enabled: heap, heap_sample_every: 1,
    timeline_enabled: false, heap_clean_after_gc_enabled: true,
  )
rescue ArgumentError
  Datadog::Profiling::StackRecorder.new(
    alloc_samples_enabled: true, heap_samples_enabled: heap, heap_size_enabled: heap,
    heap_sample_every: 1, heap_clean_after_gc_enabled: true,
  )
end

# The pending-recordings flush: renamed from finalize to commit in dd-trace-rb master (2.42).
COMMIT = %i[_native_commit_pending_heap_recordings _native_finalize_pending_heap_recordings]
  .find { |m| Datadog::Profiling::StackRecorder::Testing.respond_to?(m) }
METRICS = {"alloc-samples" => SAMPLE_EVERY, "heap_sample" => true}.freeze
LABELS = [["state", "unknown"]].freeze

def run(heap)
  rec = recorder(heap)
  retained = []
  t0 = Process.clock_gettime(Process::CLOCK_PROCESS_CPUTIME_ID)
  N.times do |i|
    obj = case i % 3 when 0 then "s#{i}" when 1 then [i, i] else {i => i} end
    retained[i % 10_000] = obj if i % 7 == 0
    if i % SAMPLE_EVERY == 0
      if heap
        Datadog::Profiling::StackRecorder::Testing._native_track_object(rec, obj, SAMPLE_EVERY, obj.class.name)
      end
      Datadog::Profiling::Collectors::Stack::Testing._native_sample(Thread.current, rec, METRICS, LABELS, [])
      Datadog::Profiling::StackRecorder::Testing.public_send(COMMIT, rec) if heap
    end
    rec.serialize if (i + 1) % SERIALIZE_EVERY == 0
  end
  Process.clock_gettime(Process::CLOCK_PROCESS_CPUTIME_ID) - t0
end

run(true) # warm-up
off = run(false)
on = run(true)
printf("heap off %.3fs  heap on %.3fs  ratio %.4f  %.2f us per sampled object\n", off, on, on / off,
  (on - off) * 1e6 / (N / SAMPLE_EVERY))
