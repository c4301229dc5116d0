# frozen_string_literal: true

# Recorder#retainers on a heap of about 1M objects (BENCH_SMOKE=1: 50k).
#
# The heap: a global Array of Arrays of 9 Strings each, plus what Ruby and the benchmark load.
# Five sites of three sampled objects each, recorded through record_allocation; then:
# - found: the objects sit in a constant's Hash, so the search stops as soon as it has reached
#   them all (how far it walks depends on where the roots lead first);
# - full walk: one object is garbage (a cycle no root reaches, not yet collected), so the search
#   visits every object the roots reach before it can say so: the worst case for a heap this size;
# - profile vs profile(retainers: true): what writing the paths into the pprof adds.
# Seconds are medians over the rounds; ns/visited is the full walk's time per object visited;
# "RSS +" is the growth of peak RSS over the run (the visited set is about 40 bytes an object).
#
# Run: rake bench:retainers (or ruby -Ilib bench/retainers.rb; BENCH_SMOKE=1 for a quick run)
require_relative "support"

HEAP = Bench.pick(1_000_000, 50_000)
ROUNDS = Bench.pick(3, 1)

module BenchRetained
  CACHE = {}
end

def build_heap
  $bench_heap = Array.new(HEAP / 10) { |i| Array.new(9) { |j| "#{i}-#{j}" } }
  nil
end

def record_targets(rec, garbage:)
  5.times do |site|
    3.times do |k|
      value = "site#{site}-#{k}" * (10 + site)
      BenchRetained::CACHE[[site, k]] = value
      rec.record_allocation(value, class_name: "String", locations: [["make", "/bench/site#{site}.rb", 1]])
    end
  end
  return unless garbage

  a = []
  a << [a]
  $bench_cycle = a
  rec.record_allocation(a, class_name: "Array", locations: [["leak", "/bench/site9.rb", 1]], weight: 10_000)
  nil
end

Bench.header("bench/retainers.rb: Recorder#retainers on a heap of #{HEAP} objects",
  ["global Array of #{HEAP / 10} Arrays of 9 Strings; 5 sites x 3 sampled objects (+ 1 unreachable for the full walk)"])

rss_before = Bench.peak_rss
build_heap
GC.start
live = ObjectSpace.count_objects.then { |c| c[:TOTAL] - c[:FREE] }
found = []
full = []
visited_full = 0
plain = []
labelled = []
ROUNDS.times do
  rec = DatadogHeap::Recorder.new
  record_targets(rec, garbage: true)
  rec.commit
  GC.start
  $bench_cycle = nil # garbage from here on; no GC until the searches below are done
  t = Bench.now
  result = rec.retainers(top: 6, per_site: 3, max_depth: 100)
  full << Bench.now - t
  visited_full = result.visited
  unreachable = result.objects.count { |o| o.status == :unreachable }
  raise "the full walk did not see every root: #{result.inspect} #{result.limit_note}" unless unreachable == 1

  BenchRetained::CACHE.clear
  rec = DatadogHeap::Recorder.new
  record_targets(rec, garbage: false)
  rec.commit
  GC.start
  t = Bench.now
  result = rec.retainers(top: 5, per_site: 3)
  found << Bench.now - t
  raise "not all found: #{result}" unless result.objects.all?(&:alive?)

  plain << Bench.time { rec.profile }
  labelled << Bench.time { rec.profile(retainers: true) }
  BenchRetained::CACHE.clear
end
rows = [
  ["found (stops early)", Bench.ms(Bench.median(found)), "-"],
  ["full walk", Bench.ms(Bench.median(full)), Bench.ns(Bench.median(full) * 1e9 / visited_full)],
  ["profile", Bench.ms(Bench.median(plain)), "-"],
  ["profile(retainers: true)", Bench.ms(Bench.median(labelled)), "-"],
]
Bench.table(["what", "time", "ns/visited"], rows)
puts
puts "live objects after building the heap: #{live}; the full walk visited #{visited_full}; " \
  "peak RSS + #{Bench.bytes(Bench.peak_rss - rss_before)} over the run (heap included)"
