# frozen_string_literal: true

# Accuracy of both samplers at their default settings: how close the live
# objects a profile estimates come to what the program really retains, on workloads that trip
# samplers up:
# - three sites retained in known numbers (20:5:1), interleaved with garbage;
# - a periodic pattern, keep 1 allocation in K for K from 2 to 2048 (a systematic sampler whose
#   period shares a factor with K sees all or none of the kept ones);
# - two phases, one allocating in a tight loop and one the same count in bursts between pauses
#   (a timer-driven sampler sees the slow phase far more often per allocation).
# Each row is estimate / truth (1.000 is exact) for each sampler, the median of ROUNDS runs, with
# the spread (min..max). Counts are large enough that the smallest site rests on ~1000 samples.
#
# Run: rake bench:accuracy (or ruby -Ilib bench/accuracy.rb; BENCH_SMOKE=1 for a quick run;
# ACCURACY_ONLY=sample_every for the table by sample_every alone)
require_relative "support"

ROUNDS = Bench.pick(3, 1)
SCALE = Bench.pick(1_000_000, 20_000) # the smallest site's retained count
SAMPLERS = {countdown: {sampler: :countdown}, windowed: {sampler: :windowed}}.freeze

SCENARIOS = {
  "three sites 20:5:1 (Array/Hash/String)" => lambda do |opts|
    counts, kept = Bench.live_estimate(opts) do
      keep = []
      (20 * SCALE).times do |i|
        keep << Array.new(1)
        keep << {} if i % 4 == 0
        keep << String.new if i % 20 == 0
        o = Object.new
      end
      keep
    end
    truth = {"Array" => 20 * SCALE, "Hash" => 5 * SCALE, "String" => SCALE}
    truth.map { |k, t| ["#{k} (#{t})", counts[k].to_f / t] }
  end,
  "keep 1 in K" => lambda do |opts|
    [2, 10, 128, 2048].map do |k|
      n = 10 * SCALE * [k, 10].min
      counts, kept = Bench.live_estimate(opts) do
        keep = []
        i = 0
        while i < n
          o = Object.new
          keep << o if i % k == 0
          i += 1
        end
        keep
      end
      ["K=#{k} (#{kept.size} kept of #{n})", counts["Object"].to_f / kept.size]
    end
  end,
  "fast phase then slow phase" => lambda do |opts|
    counts, kept = Bench.live_estimate(opts) do
      fast = Array.new(2 * SCALE) { Array.new(1) }
      slow = []
      200.times do
        (2 * SCALE / 200).times { slow << String.new }
        sleep 0.002
      end
      [fast, slow]
    end
    [["fast: Array (#{2 * SCALE})", counts["Array"].to_f / (2 * SCALE)],
      ["slow: String (#{2 * SCALE / 200 * 200})", counts["String"].to_f / (2 * SCALE / 200 * 200)]]
  end,
}.freeze

ONLY = ENV["ACCURACY_ONLY"] # sample_every or windows: that table alone (below)

if ONLY.nil?
Bench.header("bench/accuracy.rb: estimated / retained live objects at default settings",
  ["#{ROUNDS} rounds per cell, median (min..max); each sampler's default sample_every (countdown " \
   "#{DatadogHeap::Recorder::SAMPLE_EVERY[:countdown]}, windowed #{DatadogHeap::Recorder::SAMPLE_EVERY[:windowed]}) and overhead budget"])
rows = []
SCENARIOS.each do |name, scenario|
  per_sampler = SAMPLERS.transform_values { |opts| Array.new(ROUNDS) { scenario.call(opts) } }
  labels = per_sampler.values.first.first.map(&:first)
  labels.each_with_index do |label, i|
    cells = per_sampler.map do |_, runs|
      ratios = runs.map { |r| r[i][1] }
      format("%.3f (%.3f..%.3f)", Bench.median(ratios), ratios.min, ratios.max)
    end
    rows << [rows.none? { |r| r[0] == name } ? name : "", label, *cells]
  end
end
Bench.table(["scenario", "site", "countdown", "windowed"], rows)
end

# The countdown sampler by sample_every: keep one String in four (`("v#{i}" * 2)`),
# estimate = the weights of the live Strings of that line. sigma is the sampling error expected
# of an unbiased estimate (sqrt(kept * (sample_every - 1)) objects). The last row caps the
# recorder at max_tracked_objects well below what is alive: records are thinned and reweighted.
KEEP_LINE = __LINE__ + 4
def keep_one_in_four(iterations)
  keep = []
  iterations.times do |i|
    value = ("v#{i}" * 2)
    keep << value if i % 4 == 0
  end
  keep
end

if ONLY.nil? || ONLY == "sample_every"
SETTINGS = Bench.pick(
  [[1, 400_000], [2, 400_000], [8, 400_000], [64, 1_600_000], [1024, 4_000_000], [4096, 8_000_000], [1, 400_000, 20_000]],
  [[1, 40_000], [64, 100_000], [1, 40_000, 4_000]]
)
rows = SETTINGS.map do |every, iterations, cap|
  runs = Array.new(ROUNDS) do
    # Without the overhead budget, which would raise the interval above sample_every.
    opts = {sampler: :countdown, sample_every: every, max_overhead: nil}
    opts[:max_tracked_objects] = cap if cap
    rec = DatadogHeap::Recorder.new(**opts)
    rec.start
    kept = keep_one_in_four(iterations)
    rec.stop
    GC.start
    estimate = rec.each_live_object.sum do |o|
      _, path, line = o.locations.first
      (o.class_name == "String" && path == __FILE__ && line == KEEP_LINE) ? o.weight : 0
    end
    [estimate.to_f / kept.size, kept.size, rec.stats]
  end
  ratios = runs.map(&:first)
  kept = runs.first[1]
  stats = runs.last[2]
  # A thinned recorder keeps an object with chance 1 / thinning at that weight (the same error
  # as sampling at that interval).
  spread = cap ? stats[:thinning] * every : every
  sigma = Math.sqrt(kept * [spread - 1, 1].max) / kept
  label = cap ? "#{every}, max_tracked_objects #{cap}" : every.to_s
  notes = cap ? "thinning #{stats[:thinning]}, #{stats[:lifetime_thinnings]} thinnings, #{stats[:lifetime_recordings_skipped_max_tracked]} skipped at the cap" : ""
  [label, kept.to_s, format("%.4f", Bench.median(ratios)), format("%.4f..%.4f", ratios.min, ratios.max),
    format("%.4f", sigma), notes]
end
Bench.header("bench/accuracy.rb: countdown estimate / kept by sample_every", ["#{ROUNDS} rounds per row, median (min..max)"])
Bench.table(["sample_every", "kept", "ratio", "range", "sigma (relative)", "notes"], rows)
end

# The windowed sampler by windows_per_second (the default sampler): a window's samples
# stand for the gap before it, so when what the program allocates changes between two windows
# (here: a tight loop of Arrays, then Strings in bursts between pauses) the gap's allocations are
# credited to the next window's sites. More windows, shorter gaps, less of that. Countdown at the
# same sample_every beside it; no budget, so every column samples at 4096.
if ONLY.nil? || ONLY == "windows"
  WINDOW_ROUNDS = Bench.pick(5, 1)
  columns = {"countdown" => {sampler: :countdown}}
  Bench.pick([100, 300, 1000], [100]).each { |r| columns["windowed #{r}/s"] = {sampler: :windowed, windows_per_second: r} }
  phase = SCENARIOS.fetch("fast phase then slow phase")
  runs = columns.transform_values do |opts|
    Array.new(WINDOW_ROUNDS) { phase.call(opts.merge(sample_every: 4096, max_overhead: nil)) }
  end
  labels = runs.values.first.first.map(&:first)
  rows = labels.each_with_index.map do |label, i|
    [label, *runs.values.map do |r|
      ratios = r.map { |row| row[i][1] }
      format("%.3f (%.3f..%.3f)", Bench.median(ratios), ratios.min, ratios.max)
    end]
  end
  Bench.header("bench/accuracy.rb: fast phase then slow phase, estimate / truth by windows_per_second",
    ["#{WINDOW_ROUNDS} rounds per cell, median (min..max); sample_every 4096, no overhead budget"])
  Bench.table(["site", *columns.keys], rows)
end
