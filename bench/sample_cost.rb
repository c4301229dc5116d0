# frozen_string_literal: true

# Cost of one sample: frame capture, interning, stack dedup and the pending-queue
# push, at stack depths 4 (shallow), 10, 50, 100 and 200, and the cost of committing a recording.
#
# Per depth, an allocation loop runs at that exact stack depth with sample_every: 1 (every
# allocation sampled) and, alternating with it, with an empty NEWOBJ hook (the VM floor every
# hook pays), timed in process CPU time. (on - floor) / allocations is the whole cost of a sample: the hook's work, the
# commit job (WeakMap#[]=, which on Ruby < 3.3 also defines a finalizer), and the finalizer and
# record clean-up when the object dies. "in the hook" is the part the hook itself times
# (capture + intern + dedup + push). All samples at one depth share one stack, so interning and
# dedup find what they look for: the steady state of a program whose sites repeat.
#
# Commit cost: record_allocation with postponed commits off, then `commit` of 256 recordings
# (the pending queue's size) at a time, timed.
#
# Run: rake bench:sample_cost (or ruby -Ilib bench/sample_cost.rb; BENCH_SMOKE=1 for a quick run)
require_relative "support"

ROUNDS = Bench.pick(5, 2)
DEPTHS = [4, 10, 50, 100, 200].freeze # 4: the shallow case (< 5 frames)
# Allocations per run at each depth (deep stacks cost more per sample, so fewer of them).
ALLOCS = DEPTHS.to_h { |d| [d, Bench.pick(d >= 200 ? 40_000 : 150_000, 3_000)] }
COMMIT_BATCHES = Bench.pick(400, 20)

# The loop runs in `measure` itself at depth 0, or at the bottom of `descend` recursions. Every
# loop around it below is a `while` at the top level: blocks (each, times) would add frames.
# Depths are counted as the recorder records them (rb_profile_frames, C frames included), from a
# calibration run.
def alloc_loop(n)
  t = Bench.cpu
  i = 0
  while i < n
    o = BasicObject.new
    i += 1
  end
  o && nil
  Bench.cpu - t
end

# k >= 2 frames: k - 1 of descend, then alloc_loop.
def descend(k, n)
  return alloc_loop(n) if k == 2

  descend(k - 1, n)
end

# One timed run with `k` extra frames; returns [seconds, stats or nil, frames recorded or nil].
def measure(k, variant, n)
  rec = nil
  if variant == :floor
    DatadogHeap::Testing._native_empty_hook(true)
  else
    rec = DatadogHeap::Recorder.new(sample_every: 1, max_tracked_objects: Bench::NO_CAP, max_overhead: nil)
    rec.start
  end
  if k.zero?
    t = Bench.cpu
    i = 0
    while i < n
      o = BasicObject.new
      i += 1
    end
    o && nil
    seconds = Bench.cpu - t
  else
    seconds = k == 1 ? alloc_loop(n) : descend(k, n)
  end
  rec&.stop
  frames = nil
  if rec
    rec.commit
    frames = rec.debug[0][1].map { |l| l[/ frames=(\d+)/, 1].to_i }.max
  end
  [seconds, rec&.stats, frames]
ensure
  DatadogHeap::Testing._native_empty_hook(false) if variant == :floor
end

Bench.header("bench/sample_cost.rb: cost per sample by stack depth, and commit cost",
  ["sample_every: 1 vs an empty NEWOBJ hook, #{ROUNDS} rounds, medians; allocations per run: #{ALLOCS.values.uniq.join("/")}"])

base_frames = measure(0, :on, 1000)[2]
raise "the shallowest stack here is #{base_frames} frames, deeper than #{DEPTHS.min}" if base_frames > DEPTHS.min

rows = []
di = 0
while di < DEPTHS.size
  depth = DEPTHS[di]
  di += 1
  k = depth - base_frames
  n = ALLOCS.fetch(depth)
  results = {floor: [], on: []}
  r = 0
  while r < ROUNDS
    GC.start
    results[r.even? ? :floor : :on] << measure(k, r.even? ? :floor : :on, n)
    GC.start
    results[r.even? ? :on : :floor] << measure(k, r.even? ? :on : :floor, n)
    r += 1
  end
  floor = Bench.median(results[:floor].map(&:first))
  on = Bench.median(results[:on].map(&:first))
  stats = results[:on].map { |x| x[1] }
  sum = ->(key) { stats.sum { |st| st[key] } }
  recorded = sum.call(:sampler_samples_recorded)
  # Samples the recorder did not record, other than allocations made by our own commit jobs.
  lost = sum.call(:sampler_samples_taken) - recorded - sum.call(:sampler_skipped_reentrant)
  in_hook = sum.call(:sampler_time_ns_total).to_f / [recorded, 1].max
  seen = results[:on].map { |x| x[2] }.compact.max
  per_sample = (on - floor) * 1e9 / n
  hits = sum.call(:lifetime_stack_cache_hits)
  lookups = hits + sum.call(:lifetime_stack_cache_misses)
  rows << [depth, seen || "?", Bench.ns(floor * 1e9 / n), Bench.ns(on * 1e9 / n), Bench.ns(per_sample),
    Bench.ns(in_hook), Bench.ns(per_sample - in_hook), format("%.2f%%", 100.0 * lost / [recorded + lost, 1].max),
    format("%.1f%%", 100.0 * hits / [lookups, 1].max)]
end
Bench.table(["depth", "frames recorded", "floor per alloc", "sampled per alloc", "per sample (all in)",
  "in the hook", "commit + WeakMap + GC", "samples not recorded", "stack cache hits"], rows)

# Commit cost per recording: batches of 256 recordings committed by an explicit `commit`.
rec = DatadogHeap::Recorder.new(sample_every: 1, max_overhead: nil)
DatadogHeap::Testing._native_set_postponed_commits(rec, false)
locations = Bench.synthetic_stack(10, 0)
commit_ns = []
record_ns = []
keep = []
COMMIT_BATCHES.times do |b|
  objects = Array.new(256) { |i| "object #{b} #{i}" }
  t = Bench.now_ns
  objects.each { |o| rec.record_allocation(o, weight: 1, class_name: "String", locations: locations) }
  t1 = Bench.now_ns
  committed = rec.commit
  t2 = Bench.now_ns
  raise "committed #{committed} of 256" unless committed == 256

  record_ns << (t1 - t).to_f / 256
  commit_ns << (t2 - t1).to_f / 256
  keep << objects
  keep.shift if keep.size > 40 # some die, some live: updates do not run here either way
end
puts "Commit and record_allocation, #{COMMIT_BATCHES} batches of 256 (medians per recording):"
puts
Bench.table(["operation", "per recording"], [
  ["commit (WeakMap#[]= + move to the records)", Bench.ns(Bench.median(commit_ns))],
  ["record_allocation from Ruby (10 frames, converted from Ruby Arrays)", Bench.ns(Bench.median(record_ns))],
])
