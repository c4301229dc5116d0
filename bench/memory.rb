# frozen_string_literal: true

# Memory per tracked object and per distinct stack.
#
# Each measurement runs in a fresh child process (RSS only grows within a process): the objects
# to track are allocated first and a GC run, then RSS (VmRSS) and the recorder's
# ObjectSpace.memsize_of are read, the objects recorded (record_allocation + commit), a GC run,
# and both read again. The RSS delta is everything tracking costs: our records, stacks and
# strings, and the liveness table (the ObjectSpace::WeakMap, which on Ruby < 3.3 also keeps a
# finalizer entry per object). memsize_of(recorder) is our part only; memsize_of(weak map) the
# WeakMap's own tables.
# - objects: N objects over 100 stacks of 5 frames (stack cost spread thin): bytes per object;
# - stacks: N objects, each with its own stack (20 or 50 frames, the innermost 2 distinct, the
#   rest shared as in real programs): bytes per object-with-its-own-stack, minus the per-object
#   cost measured beside it = bytes per distinct stack.
# Children alternate kind by kind, round by round; medians.
#
# Run: rake bench:memory (or ruby -Ilib bench/memory.rb; BENCH_SMOKE=1 for a quick run)
require_relative "support"

def child_main(kind, n, depth)
  objects = Array.new(n) { |i| "tracked object #{i}" }
  stacks = kind == "objects" ? 100 : n
  # Build the stacks before measuring too: they are the program's, not the recorder's.
  stack_list = Array.new(stacks) { |s| Bench.synthetic_stack(depth, s) }
  rec = DatadogHeap::Recorder.new(sample_every: 1, max_tracked_objects: Bench::NO_CAP, max_overhead: nil)
  DatadogHeap::Testing._native_set_postponed_commits(rec, false)
  wm = ObjectSpace.reachable_objects_from(rec).find { |o| o.is_a?(ObjectSpace::WeakMap) }
  3.times { GC.start }
  rss0 = Bench.rss
  mem0 = ObjectSpace.memsize_of(rec)
  wm0 = wm ? ObjectSpace.memsize_of(wm) : 0
  slots0 = GC.stat(:heap_live_slots)
  objects.each_with_index do |obj, i|
    rec.record_allocation(obj, weight: 1, class_name: "String", locations: stack_list[i % stacks])
    rec.commit if (i & 255) == 255
  end
  rec.commit
  3.times { GC.start }
  raise "tracked #{rec.stats[:num_object_records]} of #{n}" unless rec.stats[:num_object_records] == n

  puts JSON.generate(rss: Bench.rss - rss0, memsize: ObjectSpace.memsize_of(rec) - mem0,
    weak_map: wm ? ObjectSpace.memsize_of(wm) - wm0 : nil, slots: GC.stat(:heap_live_slots) - slots0,
    strings_refs: rec.stats[:interned_string_refs])
end

if ARGV[0] == "--child"
  child_main(ARGV[1], Integer(ARGV[2]), Integer(ARGV[3]))
  exit
end

N_OBJECTS = Bench.pick(1_000_000, 20_000)
N_STACKS = Bench.pick(100_000, 5_000)
ROUNDS = Bench.pick(3, 1)
KINDS = {
  objects: ["objects", N_OBJECTS, 5],
  stacks20: ["stacks", N_STACKS, 20],
  stacks50: ["stacks", N_STACKS, 50],
  objects_small: ["objects", N_STACKS, 5], # the per-object cost at the stacks runs' scale
}.freeze

Bench.header("bench/memory.rb: bytes per tracked object and per distinct stack",
  ["one child process per measurement, #{ROUNDS} rounds, medians; RSS = VmRSS delta"])

res = Bench.alternate(KINDS.keys, ROUNDS, gc: false) do |k|
  kind, n, depth = KINDS.fetch(k)
  Bench.child(__FILE__, "--child", kind, n, depth)
end
med = ->(k, key) { Bench.median(res[k].map { |r| r[key] || 0 }) }
per_obj = ->(k) { KINDS.fetch(k)[1] }
rows = []
rows << ["per tracked object (#{N_OBJECTS} objects, 100 stacks of 5 frames)",
  Bench.bytes(med.call(:objects, :rss).to_f / N_OBJECTS), Bench.bytes(med.call(:objects, :memsize).to_f / N_OBJECTS),
  Bench.bytes(med.call(:objects, :weak_map).to_f / N_OBJECTS), format("%.2f", med.call(:objects, :slots).to_f / N_OBJECTS)]
rows << ["per tracked object (#{N_STACKS} objects, 100 stacks of 5 frames)",
  Bench.bytes(med.call(:objects_small, :rss).to_f / N_STACKS), Bench.bytes(med.call(:objects_small, :memsize).to_f / N_STACKS),
  Bench.bytes(med.call(:objects_small, :weak_map).to_f / N_STACKS), format("%.2f", med.call(:objects_small, :slots).to_f / N_STACKS)]
%i[stacks20 stacks50].each do |k|
  depth = KINDS.fetch(k)[2]
  n = per_obj.call(k)
  rss = (med.call(k, :rss) - med.call(:objects_small, :rss)).to_f / n
  mem = (med.call(k, :memsize) - med.call(:objects_small, :memsize)).to_f / n
  rows << ["per distinct stack of #{depth} frames (#{n} stacks), beyond its object", Bench.bytes(rss), Bench.bytes(mem), "", ""]
end
Bench.table(["what", "RSS", "memsize_of(recorder)", "memsize_of(WeakMap)", "Ruby heap slots"], rows)
