# frozen_string_literal: true

# Allocation throughput at the defaults once the overhead budget has settled. bench/allocation.rb
# starts a recorder for each 3M-allocation run (about 0.2 s), shorter than one budget period
# (250 ms), so it measures the default interval as asked; a long-running process samples at the
# interval the budget chooses. Here one default recorder per process is started and stopped
# around alternate runs of the loop (stop keeps its budget's interval), for ROUNDS rounds, and
# each "on" run is compared with the "off" run beside it (before it in even rounds, after it in
# odd). The first PRIMING rounds are left out (the budget's first periods).
#
# Each measurement runs in a child process (Bench.child), so two builds can be compared in one
# run: STEADY_COMPARE_LIB=DIR (another build's lib/ directory, its extension built) alternates
# that build's children with this one's. STEADY_CASES="BasicObject.new" picks the loops.
#
# Run: rake bench:steady_allocation (or ruby -Ilib bench/steady_allocation.rb; BENCH_SMOKE=1 for
# a quick run)
require_relative "support"

ROUNDS = Bench.pick(9, 2)
PRIMING = Bench.pick(2, 0)
N = Bench.pick(10_000_000, 200_000)
REPEATS = Bench.pick(3, 1) # child processes per build and case, alternating builds
LIBS = {"this build" => BENCH_LIB}
LIBS[ENV["STEADY_COMPARE_LIB"]] = File.expand_path(ENV["STEADY_COMPARE_LIB"]) if ENV["STEADY_COMPARE_LIB"]

CASES = Bench::LOOPS.slice("BasicObject.new", "mix: [i, i], String, Hash").freeze
SELECTED = ENV["STEADY_CASES"] ? CASES.slice(*ENV["STEADY_CASES"].split(",")) : CASES
abort "STEADY_CASES names none of: #{CASES.keys.join(", ")}" if SELECTED.empty?

# The child (`--child CASE`): prints one JSON line with the per-round ratios and the budget's
# state at the end.
if ARGV[0] == "--child"
  work = CASES.fetch(ARGV[1])
  timed = ->(&blk) { GC.start; Bench.cpu_time(&blk) }
  work.call(N / 10)
  rec = DatadogHeap::Recorder.new
  on_run = -> { rec.start; t = timed.call { work.call(N) }; rec.stop; t }
  ratios = Array.new(ROUNDS) do |round|
    on = on_run.call if round.odd?
    off = timed.call { work.call(N) }
    on ||= on_run.call
    off / on
  end
  s = rec.stats
  puts JSON.generate(ratios: ratios.drop(PRIMING), interval: s[:sampler_effective_sample_every],
    last_share: s[:sampler_last_overhead], estimated: s[:sampler_overhead_estimated_ns].to_f / [s[:sampler_overhead_ns_total], 1].max)
  exit
end

Bench.header("bench/steady_allocation.rb: throughput at the defaults once the budget settled",
  ["#{N} allocations a run, #{ROUNDS} rounds a process (the first #{PRIMING} left out), #{REPEATS} processes per build, builds alternating",
   "throughput: median over rounds of (CPU of the off run / CPU of the on run beside it)"])

rows = []
SELECTED.each_key do |name|
  results = Hash.new { |h, k| h[k] = [] }
  REPEATS.times { LIBS.each { |label, lib| results[label] << Bench.child(__FILE__, "--child", name, lib: lib) } }
  results.each do |label, runs|
    rows << [name, label, format("%.3f×", Bench.median(runs.flat_map { |r| r[:ratios] })),
      runs.map { |r| format("%.3f", Bench.median(r[:ratios])) }.join(" / "),
      runs.map { |r| r[:interval] }.join(" / "),
      runs.map { |r| format("%.2f%%", 100 * r[:last_share]) }.join(" / "),
      runs.map { |r| format("%.0f%%", 100 * r[:estimated]) }.join(" / ")]
  end
end
Bench.table(["loop", "build", "throughput", "per process", "interval at exit", "budget's last share", "of it estimated"], rows)
