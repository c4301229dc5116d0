# frozen_string_literal: true

# What one sample costs, stage by stage, on any Ruby (no gem beyond this one): a workload shaped
# like a request handler (about 50 frames deep through a dozen methods and blocks, a few hundred
# allocations a "request" at varied sites, one object in twenty kept for a while, and every fourth
# request a pass over 2 MB, as a service's other work evicts the recorder's data from the CPU
# caches between two samples), sampled by a
# recorder at sample_every 1024 with no budget, the stage counters on
# (DatadogHeap::Testing._native_set_stage_costs: the monotonic clock around each stage, medians
# from a histogram). For the Rubies that cannot run the example services here (the 3.3 and 3.4
# chroots): `bash ../shared/tools/ruby-chroot -q trixie -- ruby -Ilib bench/stage_costs.rb`.
#
# Run: ruby -Ilib bench/stage_costs.rb (BENCH_SMOKE=1 for a quick run); SAMPLER=countdown.
require_relative "support"

SECONDS_PER_RUN = Bench.pick(4.0, 0.5)
ROUNDS = Bench.pick(3, 1)

# A request: layers of calls, each layer a method of its own at its own lines, then work that
# allocates at a few sites whose choice depends on the request.
module FakeApp
  KEPT = []
  # Read once a request: what a service's other work does to the CPU caches.
  CACHE_SWEEP = "x" * (2 << 20)

  module_function

  def layer(depth, id, &work)
    return work.call(id) if depth.zero?

    case depth % 4
    when 0 then [1].each { layer(depth - 1, id, &work) }
    when 1 then middleware(depth, id, &work)
    when 2 then controller(depth, id, &work)
    else 1.times { layer(depth - 1, id, &work) }
    end
  end

  def middleware(depth, id, &work)
    layer(depth - 1, id, &work)
  end

  def controller(depth, id, &work)
    layer(depth - 1, id, &work)
  end

  def render(id)
    rows = Array.new(8) { |i| {id: id, n: i, label: "row #{i} of #{id}"} }
    html = rows.map { |r| "<td>#{r[:label]}</td>" }.join
    json = {id: id, rows: rows.size, body: html[0, 40]}
    KEPT << json if id % 20 == 0
    KEPT.shift if KEPT.size > 5_000
    html.size
  end

  def request(id)
    CACHE_SWEEP.count("y") if id % 4 == 0
    layer(18 + id % 8, id) { |i| render(i) }
  end
end

def run_once(sampler)
  DatadogHeap::Testing._native_set_stage_costs(true)
  rec = DatadogHeap::Recorder.new(sampler: sampler, sample_every: 1024, max_overhead: nil)
  rec.start
  deadline = Process.clock_gettime(Process::CLOCK_MONOTONIC) + SECONDS_PER_RUN
  id = 0
  id += 1 while FakeApp.request(id) && Process.clock_gettime(Process::CLOCK_MONOTONIC) < deadline
  rec.stop
  stages = DatadogHeap::Testing._native_stage_costs.to_h { |name, ns, count, median| [name, [ns, count, median]] }
  DatadogHeap::Testing._native_set_stage_costs(false)
  [stages, rec.stats.slice(:sampler_samples_recorded, :lifetime_stack_cache_hits, :lifetime_stack_cache_misses)]
end

sampler = ENV.fetch("SAMPLER", "windowed").to_sym
Bench.header("bench/stage_costs.rb: per-sample cost by stage on a request-shaped workload",
  ["#{sampler} sampler, sample_every 1024, no budget, #{ROUNDS} runs of #{SECONDS_PER_RUN} s; medians (means) in µs"])
runs = Array.new(ROUNDS) { run_once(sampler) }
names = %w[capture naming record sample commit weak_map_set young_update window mark]
rows = names.map do |name|
  cells = runs.map do |stages, _|
    ns, count, median = stages.fetch(name, [0, 0, 0])
    count.zero? ? "–" : format("%.2f (%.2f) ×%d", median / 1e3, ns.fdiv(count) / 1e3, count)
  end
  [name, *cells]
end
# Per sample: every stage's total (windows and young updates included) over the samples; and a
# typical sample from medians, the sampled path and its WeakMap write.
all_in = runs.map do |stages, stats|
  samples = [stats[:sampler_samples_recorded], 1].max
  total = %w[sample commit young_update window].sum { |name| stages.fetch(name, [0])[0] }
  format("%.2f", total / 1e3 / samples)
end
typical = runs.map do |stages, _|
  format("%.2f", (stages.fetch("sample", [0, 0, 0])[2] + stages.fetch("weak_map_set", [0, 0, 0])[2]) / 1e3)
end
rows << ["all in per sample: every stage's total over the samples (mean)", *all_in]
rows << ["typical sample: sampled path + WeakMap write (medians)", *typical]
rows << ["stack cache hits", *runs.map { |_, s| format("%.0f%%", 100.0 * s[:lifetime_stack_cache_hits] / [s[:lifetime_stack_cache_hits] + s[:lifetime_stack_cache_misses], 1].max) }]
Bench.table(["stage", *Array.new(ROUNDS) { |i| "run #{i + 1}" }], rows)
