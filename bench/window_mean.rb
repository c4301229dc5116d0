# frozen_string_literal: true

# The windowed sampler's in-window mean: how many allocations go by per sample inside a window
# (64 until 2026-12-05). Every allocation inside a window pays the VM's slow path (about 30 ns),
# so a sample costs its own work plus `mean` slow paths; a smaller mean makes windows shorter
# (they cover `mean / sample_every` of the allocations) with the same samples in them. What it
# costs and what it does to the estimates, side by side in one run:
# 1. cost: BasicObject.new and a request-like mix ([i, i], small Strings, Hashes) in a loop, no
#    recorder against the default recorder at each mean; throughput ratio (paired per round) and
#    the extra CPU per sample;
# 2. estimates: three sites retained 20:5:1 among garbage (bench/accuracy.rb's first case),
#    estimate over truth per site, median and spread over ROUNDS runs, at each mean.
# Variants alternate round by round; process CPU time.
#
# Run: rake bench:window_mean (or ruby -Ilib bench/window_mean.rb; BENCH_SMOKE=1 for a quick
# run; WINDOW_MEANS=64,16 to choose the means, `countdown` among them for the countdown sampler at
# the same interval; WINDOW_MEAN_EVERY=1024 for that sample_every with no budget instead of the
# default recorder)
require_relative "support"

ROUNDS = Bench.pick(7, 2)
N = Bench.pick(10_000_000, 200_000)
SCALE = Bench.pick(200_000, 5_000) # the smallest site's retained count
MEANS = (ENV["WINDOW_MEANS"] || "64,32,16,8").split(",").map { |m| (m == "countdown") ? :countdown : Integer(m, 10) }
EVERY = ENV["WINDOW_MEAN_EVERY"]&.then { |e| Integer(e, 10) }
OPTIONS = EVERY ? {sample_every: EVERY, max_overhead: nil} : {}

LOOPS = Bench::LOOPS.slice("BasicObject.new", "mix: [i, i], String, Hash").freeze

# The block's recorders take the in-window mean `mean` (`:countdown`: the countdown sampler).
def with_mean(mean)
  return yield(OPTIONS.merge(sampler: :countdown)) if mean == :countdown

  before = DatadogHeap::Testing._native_set_window_sample_every(mean)
  begin
    yield OPTIONS
  ensure
    DatadogHeap::Testing._native_set_window_sample_every(before)
  end
end

# A recorder as `with_mean` sets it up.
def recorder(mean)
  with_mean(mean) { |options| DatadogHeap::Recorder.new(**options) }
end

Bench.header("bench/window_mean.rb: the windowed sampler's in-window mean, cost and estimates",
  ["means #{MEANS.join(", ")}; #{ROUNDS} rounds, alternating; " \
   "process CPU time; " + (EVERY ? "sample_every #{EVERY}, no budget" : "default recorder (windowed, sample_every 4096, budget 1%)")])

variants = [:none] + MEANS
rows = LOOPS.flat_map do |name, work|
  work.call(N / 10)
  res = Bench.alternate(variants, ROUNDS) do |v|
    rec = recorder(v) unless v == :none
    rec&.start
    t = Bench.cpu
    work.call(N)
    cpu = Bench.cpu - t
    samples = rec ? rec.stats[:sampler_samples_taken] : 0
    rec&.stop
    {cpu: cpu, samples: samples}
  end
  none = Bench.median(res[:none].map { |r| r[:cpu] })
  MEANS.map do |m|
    ratio = Bench.paired_ratio(res, :none, m, :cpu)
    samples = Bench.median(res[m].map { |r| r[:samples] })
    extra = Bench.median(res[m].zip(res[:none]).map { |r, b| (r[:cpu] - b[:cpu]) / [r[:samples], 1].max })
    [name, m, format("%.3f×", ratio), Bench.ms(none), samples.round, Bench.ns(extra * 1e9)]
  end
end
Bench.table(["loop", "in-window mean", "throughput vs none", "none", "samples", "extra CPU per sample"], rows)

# Estimates: three sites retained in known numbers among garbage, at the default settings.
def three_sites(options)
  counts, = Bench.live_estimate(options) do
    keep = []
    (20 * SCALE).times do |i|
      keep << Array.new(1)
      keep << {} if i % 4 == 0
      keep << String.new if i % 20 == 0
      Object.new
    end
    keep
  end
  truth = {"Array" => 20 * SCALE, "Hash" => 5 * SCALE, "String" => SCALE}
  truth.to_h { |k, t| [k, counts[k].to_f / t] }
end

est = Bench.alternate(MEANS, ROUNDS) { |m| with_mean(m) { |options| three_sites(options) } }
rows = %w[Array Hash String].flat_map do |site|
  MEANS.map do |m|
    r = est[m].map { |e| e[site] }
    [site, m, format("%.3f", Bench.median(r)), format("%.3f..%.3f", r.min, r.max)]
  end
end
Bench.table(["site (20:5:1, smallest #{SCALE})", "in-window mean", "estimate / truth, median", "spread"], rows)
