# frozen_string_literal: true

# Allocation overhead of the built-in sampler (docs/performance.md).
#
# Each case is a loop of allocations, run with no recorder (base), with an empty NEWOBJ hook (the
# floor any allocation hook costs on this VM), with a recorder at the default settings
# (sample_every: 1024) and with sample_every: 1 (every allocation sampled, with no
# max_tracked_objects cap, so every sample takes the whole path). Variants alternate
# round by round, timed in process CPU time (a shared machine's other processes do not count);
# the table shows medians, the time ratio to base and the throughput ratio
# (base time / variant time; the target for BasicObject.new at default settings is >= 0.9).
#
# The "breakdown" table then splits the default-settings cost on BasicObject.new into the VM
# floor, our hook's non-sampling path, and sampling/commit/WeakMap/finalizer work.
#
# Run: rake bench:allocation (or ruby -Ilib bench/allocation.rb; BENCH_SMOKE=1 for a quick run)
require_relative "support"

SMOKE = Bench.smoke?
ROUNDS = Bench.pick(5, 2)
N = Bench.pick(3_000_000, 150_000)
# The reference recorder's workload: 10M small Array/String/Hash allocations keeping 1% alive.
REF_N = Bench.pick(10_000_000, 300_000)
REF_ROUNDS = Bench.pick(3, 1)
BREAKDOWN_ROUNDS = Bench.pick(9, 2)
NEVER = 2**32 - 1 # sample_every so large that the hook never samples
# ALLOCATION_CASES="BasicObject.new" (comma-separated case names): those cases only, and no
# breakdown (a quick check on another Ruby).
ONLY = ENV["ALLOCATION_CASES"]&.split(",")

# Every loop assigns what it allocates to a local: the compiler drops an unused `[i, i]` or `{a: i}`.
CASES = {
  "BasicObject.new" => Bench::LOOPS.fetch("BasicObject.new"),
  "Object.new" => ->(n) { i = 0; while i < n; o = Object.new; i += 1; end; o && nil },
  "String (small)" => ->(n) { i = 0; while i < n; o = "small".dup; i += 1; end; o && nil },
  "Array [i, i]" => Bench::LOOPS.fetch("[i, i]"),
  "Hash {a: i}" => ->(n) { i = 0; while i < n; o = {a: i}; i += 1; end; o && nil },
  "10M Array/String/Hash, 1% kept" => lambda do |n|
    kept = []
    i = 0
    while i < n
      o = case i % 3
          when 0 then [i, i]
          when 1 then "str".dup
          else {k: i}
          end
      kept << o if i % 100 == 0
      i += 1
    end
    kept
  end,
}.freeze

# One timed run of `work` under `variant`; returns {seconds:, stats:, gc_count:, gc_ms:}.
def run(variant, n, work)
  rec = nil
  case variant
  when :empty_hook then DatadogHeap::Testing._native_empty_hook(true)
  when :default then rec = DatadogHeap::Recorder.new
  when :countdown then rec = DatadogHeap::Recorder.new(sampler: :countdown)
  when :windowed then rec = DatadogHeap::Recorder.new(sampler: :windowed)
  when :every_1 then rec = DatadogHeap::Recorder.new(sample_every: 1, max_tracked_objects: Bench::NO_CAP, max_overhead: nil)
  when :hooks_only then rec = DatadogHeap::Recorder.new(sample_every: NEVER)
  end
  rec&.start
  gc0 = GC.stat
  t = Bench.cpu
  work.call(n) # the 10M case's kept objects stay alive while it runs, and no longer
  seconds = Bench.cpu - t
  gc1 = GC.stat
  rec&.stop
  {seconds: seconds, stats: rec&.stats, gc_count: gc1[:count] - gc0[:count], gc_ms: gc1[:time] - gc0[:time]}
ensure
  DatadogHeap::Testing._native_empty_hook(false) if variant == :empty_hook
end

LABELS = {
  base: "no recorder",
  empty_hook: "empty NEWOBJ hook (VM floor)",
  hooks_only: "our hooks, never sampling",
  default: "default settings",
  countdown: "countdown sampler (sample_every #{DatadogHeap::Recorder::SAMPLE_EVERY[:countdown]})",
  windowed: "windowed sampler (sample_every #{DatadogHeap::Recorder::SAMPLE_EVERY[:windowed]})",
  every_1: "sample_every 1",
}.freeze

# sample_every: 1 costs microseconds per allocation: it runs over a tenth of the allocations
# (the per-allocation rate is what the table compares; the 10M case keeps 1% of 1M then).
EVERY_1_SHARE = 10

Bench.header("bench/allocation.rb: CPU ns per allocation, medians of alternating runs",
  ["#{N} allocations per run (#{REF_N} for the 10M case; a tenth of that with sample_every 1), " \
   "#{ROUNDS} rounds (#{REF_ROUNDS} for the 10M case); ratios: median of per-round ratios to no recorder"])

CASES.each_value { |w| w.call(N / 10) } # warm up

rows = []
CASES.each do |name, work|
  next if ONLY && !ONLY.include?(name)

  ref = name.start_with?("10M")
  variants = %i[base empty_hook countdown windowed every_1]
  res = Bench.alternate(variants, ref ? REF_ROUNDS : ROUNDS) do |v|
    n = ref ? REF_N : N
    n /= EVERY_1_SHARE if v == :every_1
    r = run(v, n, work)
    r.merge(ns: r[:seconds] * 1e9 / n)
  end
  variants.each do |v|
    per_alloc = Bench.median(res[v].map { |r| r[:ns] })
    ratio = Bench.paired_ratio(res, v, :base, :ns)
    stats = res[v].map { |r| r[:stats] }.compact
    samples = stats.sum { |st| st[:sampler_samples_recorded] }
    sample_ns = stats.sum { |st| st[:sampler_time_ns_total] }
    rows << [v == :base ? name : "", LABELS[v], Bench.ns(per_alloc), Bench.ratio(ratio), Bench.ratio(1 / ratio),
      Bench.median(res[v].map { |r| r[:gc_count] }).round,
      samples.zero? ? "-" : Bench.ns(sample_ns.to_f / samples)]
  end
end
Bench.table(["case", "variant", "per alloc", "time ratio", "throughput", "GCs/run", "in-hook ns/sample"], rows)
exit if ONLY

# --- Breakdown of the default-settings cost on BasicObject.new -------------------------------
#
# - empty hook: the VM floor. On Ruby 3.1 any object-space event hook (NEWOBJ, GC_END_SWEEP...)
#   sends every allocation down newobj_slowpath, and a NEWOBJ hook adds the hook dispatch.
# - our hooks, never sampling: our NEWOBJ hook's non-sampling path (a decrement and a branch)
#   plus the GC-end hook and the young-update job it schedules.
# - default: sampling (frames, interning, dedup, queue push: timed inside the hook, see
#   "in-hook"), commits (WeakMap#[]= from the postponed job; on Ruby < 3.3 it defines a finalizer
#   on the object), the finalizer and zombie work when a tracked object dies, young updates.
# - the WeakMap emulation runs, in plain Ruby with no hook, the WeakMap part alone: one
#   `map[id] = obj` per 1024 BasicObject.new, the objects dying right away.
def weakmap_emulation(n, with_map)
  map = ObjectSpace::WeakMap.new
  outer = n / 1024
  k = 0
  while k < outer
    j = 0
    while j < 1023
      o = BasicObject.new
      j += 1
    end
    o = BasicObject.new
    map[k] = o if with_map
    k += 1
  end
  nil
end

work = CASES.fetch("BasicObject.new")
variants = %i[base empty_hook hooks_only default wm_off wm_on]
res = Bench.alternate(variants, BREAKDOWN_ROUNDS) do |v|
  case v
  when :wm_off, :wm_on
    gc0 = GC.stat
    t = Bench.cpu_time { weakmap_emulation(N, v == :wm_on) }
    gc1 = GC.stat
    {seconds: t, gc_count: gc1[:count] - gc0[:count], gc_ms: gc1[:time] - gc0[:time]}
  else
    run(v, N, work)
  end
end
med = res.transform_values { |rs| Bench.median(rs.map { |r| r[:seconds] }) * 1e9 / N }
gc_ms = res.transform_values { |rs| Bench.median(rs.map { |r| r[:gc_ms] }) }
def_stats = res[:default].map { |r| r[:stats] }
samples = def_stats.sum { |s| s[:sampler_samples_recorded] }
in_hook = def_stats.sum { |s| s[:sampler_time_ns_total] }.to_f / (N * def_stats.size)
per = lambda do |ns, label, note|
  [label, Bench.ns(ns), Bench.percent(ns / med[:base]), note]
end
wm = med[:wm_on] - med[:wm_off]
rest = med[:default] - med[:hooks_only] - in_hook - wm
rows = [
  ["no recorder", Bench.ns(med[:base]), "", "baseline; #{gc_ms[:base]} ms GC per run"],
  per.call(med[:empty_hook] - med[:base], "+ VM floor (empty NEWOBJ hook)", "newobj slow path + hook dispatch"),
  per.call(med[:hooks_only] - med[:empty_hook], "+ our hook body and GC-end hook", "sample_every #{NEVER}: never samples"),
  per.call(in_hook, "+ sampling, in the hook", "#{samples / def_stats.size} samples/run, #{Bench.ns(in_hook * N / [samples / def_stats.size, 1].max)} each"),
  per.call(wm, RUBY_VERSION < "3.3" ? "+ WeakMap#[]= + finalizer (Ruby emulation)" : "+ WeakMap#[]= (Ruby emulation)", "1 in 1024 objects; GC #{gc_ms[:wm_off]} → #{gc_ms[:wm_on]} ms/run"),
  per.call(rest, "+ rest (commit job, young updates, noise)", "default − the rows above"),
  ["= default settings", Bench.ns(med[:default]), Bench.percent(med[:default] / med[:base] - 1),
    "throughput #{Bench.ratio(med[:base] / med[:default])}; #{gc_ms[:default]} ms GC per run"],
]
puts "Breakdown of the default-settings cost, BasicObject.new (#{BREAKDOWN_ROUNDS} rounds, medians):"
puts
Bench.table(["component", "ns/alloc", "% of base", "note"], rows)
