# frozen_string_literal: true

# Overhead on a realistic mix: JSON generate and parse, an ERB render, string
# building, hashes of arrays, one result in 50 retained for the rest of the run. The iteration
# count is calibrated to ~0.5 s of CPU per run without a recorder (0.15 s under BENCH_SMOKE):
# many short rounds rather than a few long ones, so the median drops the rounds a neighbour's
# burst of load disturbed. Variants: no recorder, an empty NEWOBJ hook (the VM floor), and
# recorders of each sampler at sample_every 64 to 16384 (MIXED_EVERY): the overhead-vs-interval
# curve; last, a Recorder.new with nothing given (the default interval, with the budget). Times
# are process CPU time; overhead is the median over rounds of (variant / no recorder) within the
# round, the order rotating round by round.
#
# Run: rake bench:mixed (or ruby -Ilib bench/mixed.rb; BENCH_SMOKE=1 for a quick run)
require_relative "support"
require "erb"

RUN_SECONDS = Bench.pick(0.5, 0.15)
ROUNDS = Bench.pick(21, 2)
# MIXED_EVERY=128,256 measures those intervals only (and no windowed rows with MIXED_COUNTDOWN_ONLY=1).
EVERY = ENV.fetch("MIXED_EVERY", "64,256,1024,4096,16384").split(",").map { |e| Integer(e, 10) }.freeze

TEMPLATE = ERB.new(<<~ERB, trim_mode: "-")
  <h1><%= title %></h1>
  <ul>
  <%- items.each do |item| -%>
    <li class="<%= item[:kind] %>"><%= item[:name] %>: <%= item[:tags].join(", ") %></li>
  <%- end -%>
  </ul>
ERB

Page = Struct.new(:title, :items) do
  def render = TEMPLATE.result(binding)
end

# One unit of work; returns something worth retaining now and then.
def unit(i, retained)
  items = Array.new(8) { |j| {name: "item #{i}-#{j}", kind: j.even? ? "even" : "odd", tags: %W[t#{j} u#{i % 7} v]} }
  json = JSON.generate({id: i, items: items, meta: {at: i * 0.5, ok: true}})
  parsed = JSON.parse(json, symbolize_names: true)
  html = Page.new("page #{i}", parsed[:items]).render
  buf = +""
  parsed[:items].each { |it| buf << it[:name] << ":" << it[:tags].join("|") << ";" }
  index = parsed[:items].group_by { |it| it[:kind] }.transform_values { |v| v.map { |it| it[:name] } }
  retained << [html, buf, index] if i % 50 == 0
  html.bytesize + buf.bytesize
end

def workload(n)
  retained = []
  i = 0
  while i < n
    unit(i, retained)
    i += 1
  end
  retained.size
end

# Calibrate the iteration count to RUN_SECONDS without a recorder.
workload(50)
probe = 200
probe *= 2 while (t = Bench.cpu_time { workload(probe) }) < 0.2
N = (probe * RUN_SECONDS / t).ceil

# The last: the default windowed sample_every with ten times the default windows per second (what
# the windows themselves cost; bench/accuracy.rb ACCURACY_ONLY=windows shows what they buy).
VARIANTS = if ENV["MIXED_COUNTDOWN_ONLY"] == "1"
  [:base, :empty_hook, *EVERY].freeze
else
  [:base, :empty_hook, *EVERY, *EVERY.map { |e| [:windowed, e] }, [:windowed, 4096, 1000], :defaults].freeze
end

def run(variant)
  rec = nil
  case variant
  when :base then nil
  when :empty_hook then DatadogHeap::Testing._native_empty_hook(true)
  when :defaults then rec = DatadogHeap::Recorder.new
  when Array
    rec = DatadogHeap::Recorder.new(sampler: :windowed, sample_every: variant[1], windows_per_second: variant[2] || 100)
  else rec = DatadogHeap::Recorder.new(sampler: :countdown, sample_every: variant)
  end
  rec&.start
  seconds = Bench.cpu_time { workload(N) }
  rec&.stop
  {seconds: seconds, stats: rec&.stats}
ensure
  DatadogHeap::Testing._native_empty_hook(false) if variant == :empty_hook
end

allocs_per_unit = begin
  a = GC.stat(:total_allocated_objects)
  workload(200)
  (GC.stat(:total_allocated_objects) - a) / 200.0
end

Bench.header("bench/mixed.rb: overhead on a JSON/ERB/string/hash mix",
  ["#{N} units per run (~#{RUN_SECONDS} s of CPU without a recorder, #{allocs_per_unit.round} allocations each), " \
   "#{ROUNDS} rounds, overhead = median of per-round ratios"])

res = Bench.alternate(VARIANTS, ROUNDS) { |v| run(v) }
base = Bench.median(res[:base].map { |r| r[:seconds] })
rows = VARIANTS.map do |v|
  ratio = Bench.paired_ratio(res, v, :base, :seconds)
  stats = res[v].map { |r| r[:stats] }.compact
  samples = stats.empty? ? nil : stats.sum { |s| s[:sampler_samples_recorded] } / stats.size
  in_hook = stats.empty? ? nil : stats.sum { |s| s[:sampler_time_ns_total] } / 1e9 / stats.size
  hits = stats.sum { |s| s[:lifetime_stack_cache_hits] }
  lookups = hits + stats.sum { |s| s[:lifetime_stack_cache_misses] }
  label = case v
          when :base then "no recorder"
          when :empty_hook then "empty NEWOBJ hook (VM floor)"
          when :defaults then "Recorder.new (the defaults: #{DatadogHeap::Recorder::SAMPLE_EVERY[:windowed]}, budget)"
          when Array then "windowed, sample_every #{v[1]}#{", #{v[2]} windows/s" if v[2]}"
          else "countdown, sample_every #{v}"
          end
  [label, format("%.3f s", Bench.median(res[v].map { |r| r[:seconds] })), v == :base ? "" : Bench.percent(ratio - 1),
    samples || "", in_hook ? Bench.percent(in_hook / base) : "",
    lookups.zero? ? "" : format("%.0f%%", 100.0 * hits / lookups)]
end
Bench.table(["variant", "median run (CPU)", "overhead", "samples/run", "in-hook time / run", "stack cache hits"], rows)
