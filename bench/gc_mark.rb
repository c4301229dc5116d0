# frozen_string_literal: true

# What a recorder adds to every GC: its mark function marks the WeakMap, the pending objects and
# the frame handles its caches keep alive, at every GC, minor ones included, and no budget or
# stage of the sampling path sees that time. Here a child process runs a program with many
# distinct deep stacks (DEPTH-frame call chains through METHODS methods, one allocation sampled in
# 64) under a recorder, so its caches fill as a real program's do, then times minor GCs
# (GC.start(full_mark: false)) with the recorder still running, against a child that ran the
# same program with no recorder. Each child prints one JSON line. The same program is the
# sampling path's worst case, so the table also gives what its samples cost: the core's record
# (stack cache, naming, interning, dedup, a new heap record on most samples) and the whole sampled
# path of the hook, from the stage counters.
#
# GC_MARK_COMPARE_LIB=DIR (another build's lib/ directory, its extension built) alternates that
# build's children with this one's, so two builds are compared in one run.
#
# Run: rake bench:gc_mark (or ruby -Ilib bench/gc_mark.rb; BENCH_SMOKE=1 for a quick run)
require_relative "support"

METHODS = Bench.pick(400, 40)
DEPTH = Bench.pick(100, 20)
CHAINS = Bench.pick(4000, 100)
GCS = Bench.pick(200, 10) # minor GCs timed per round
ROUNDS = Bench.pick(5, 1)
REPEATS = Bench.pick(3, 1) # child processes per build and variant, alternating
LIBS = {"this build" => BENCH_LIB}
LIBS[ENV["GC_MARK_COMPARE_LIB"]] = File.expand_path(ENV["GC_MARK_COMPARE_LIB"]) if ENV["GC_MARK_COMPARE_LIB"]

# The child (`--child on|none`).
if ARGV[0] == "--child"
  # METHODS methods, each calling the next one its chain names, and the last one allocating:
  # CHAINS stacks of DEPTH frames, drawn with a fixed seed.
  host = Class.new
  METHODS.times do |i|
    host.class_eval(<<~RUBY, "chain_#{i}.rb", 1)
      def m#{i}(chain, d)
        d.zero? ? Object.new : public_send(chain[d - 1], chain, d - 1)
      end
    RUBY
  end
  rng = Random.new(7)
  chains = Array.new(CHAINS) { Array.new(DEPTH) { :"m#{rng.rand(METHODS)}" } }
  rec = DatadogHeap::Recorder.new(sampler: :countdown, sample_every: 64, max_overhead: nil) if ARGV[1] == "on"
  stages = defined?(DatadogHeap::Testing._native_set_stage_costs) && rec
  DatadogHeap::Testing._native_set_stage_costs(true) if stages
  rec&.start
  obj = host.new
  kept = []
  3.times { chains.each { |c| 20.times { kept << obj.public_send(c.last, c, DEPTH - 1) } } }
  sampling = stages ? DatadogHeap::Testing._native_stage_costs : []
  per_sample = %w[record sample].to_h do |stage|
    _, ns, count, median = sampling.find { |name, *| name == stage }
    [stage, count.to_i.zero? ? nil : [median, ns.fdiv(count)]]
  end
  kept = nil
  GC.start
  DatadogHeap::Testing._native_set_stage_costs(true) if stages # zeroes the counters
  minor_us = Array.new(ROUNDS) do
    t = Bench.cpu_time { GCS.times { GC.start(full_mark: false, immediate_sweep: false) } }
    t / GCS * 1e6
  end
  costs = stages ? DatadogHeap::Testing._native_stage_costs : []
  mark = costs.find { |name, *| name == "mark" }
  DatadogHeap::Testing._native_set_stage_costs(false) if stages
  s = rec&.stats || {}
  puts JSON.generate(minor_us: Bench.median(minor_us), mark_median_ns: mark&.last,
    hits: s[:lifetime_stack_cache_hits], misses: s[:lifetime_stack_cache_misses],
    record_ns: per_sample["record"], sample_ns: per_sample["sample"])
  exit
end

Bench.header("bench/gc_mark.rb: a minor GC's time with a recorder whose caches are full, against none",
  ["#{CHAINS} call chains of #{DEPTH} frames through #{METHODS} methods, countdown sampler 1 in 64, then " \
    "#{ROUNDS} rounds of #{GCS} minor GCs (median of rounds; CPU µs a GC), #{REPEATS} processes per build and variant"])

results = Hash.new { |h, k| h[k] = [] }
REPEATS.times do
  LIBS.each do |name, lib|
    %w[none on].each { |variant| results[[name, variant]] << Bench.child(__FILE__, "--child", variant, lib: lib) }
  end
end
rows = LIBS.keys.map do |name|
  none = Bench.median(results[[name, "none"]].map { |r| r[:minor_us] })
  on = results[[name, "on"]]
  with = Bench.median(on.map { |r| r[:minor_us] })
  marks = on.map { |r| r[:mark_median_ns] }.compact
  hits = on.sum { |r| r[:hits].to_i }
  looked = hits + on.sum { |r| r[:misses].to_i }
  # Per sample, µs: the median of the processes' medians (their means' range in brackets).
  per_sample = lambda do |key|
    got = on.map { |r| r[key] }.compact
    next "–" if got.empty?

    means = got.map { |_, mean| mean / 1e3 }
    format("%.2f (%.1f–%.1f)", Bench.median(got.map(&:first)) / 1e3, means.min, means.max)
  end
  [name, format("%.0f", none), format("%.0f", with), format("%+.0f", with - none),
    marks.empty? ? "–" : format("%.1f", Bench.median(marks) / 1e3), format("%.0f%%", 100.0 * hits / [looked, 1].max),
    per_sample.call(:record_ns), per_sample.call(:sample_ns)]
end
Bench.table(["build", "minor GC, no recorder (µs)", "with a recorder (µs)", "added (µs)",
  "its mark function (µs, median)", "stack cache hits", "record per sample (µs)", "sampled path per sample (µs)"], rows)
