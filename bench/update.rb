# frozen_string_literal: true

# Update cost per tracked object (issue 7, item 4) at 10k, 100k and 1M tracked objects.
#
# Objects are set up through record_allocation and explicit commits (so the counts are exact),
# 1000 distinct stacks of 5 frames, all objects alive (Strings, sizes measured). Then, GC by GC:
# - young update while every object is young (age 1 and 2): each one is looked up in the WeakMap
#   and measured, the same work a full update does per object;
# - young update once every object is old (age >= 3): each record is visited and skipped;
# - full update: `each_live_object`, stopped at the first object, which runs the full update and
#   copies the records into the iteration snapshot (so it includes that copy);
# - full update with half of the objects dead (last): finding, dropping and releasing them.
# Young and full updates alternate GC by GC (young first: it only runs on a GC no update has
# seen); medians.
#
# Run: rake bench:update (or ruby -Ilib bench/update.rb; BENCH_SMOKE=1 for a quick run)
require_relative "support"

SIZES = Bench.pick([10_000, 100_000, 1_000_000], [2_000, 20_000])
FULL_ROUNDS = Bench.pick(5, 2)
STACKS = 1000

def full_update(rec)
  t = Bench.now
  rec.each_live_object { break }
  Bench.now - t
end

def young_update(rec)
  rec.reset_last_update!
  t = Bench.now
  ran = rec.update_young_objects
  seconds = Bench.now - t
  raise "young update skipped: #{rec.stats.inspect}" unless ran

  seconds
end

Bench.header("bench/update.rb: update time per tracked object",
  ["#{STACKS} distinct stacks of 5 frames (depth does not change update work), all objects alive Strings, size_enabled: true"])

rows = []
SIZES.each do |n|
  setup = Bench.time { @rec, @objects = Bench.tracked_recorder(n, stacks: [STACKS, n].min, depth: 5) }
  rec = @rec
  young = []
  full = []
  # Ages 1 and 2: young updates see every object.
  2.times do
    GC.start
    young << young_update(rec)
    full << full_update(rec)
  end
  GC.start # age 3: from now on young updates skip everything
  old = []
  FULL_ROUNDS.times do
    GC.start
    old << young_update(rec) # first: a young update needs a GC no update has seen yet
    full << full_update(rec)
  end
  st = rec.stats
  alive = st[:last_update_objects_alive]
  raise "full update saw #{alive} alive, expected #{n}" unless alive == n

  # Half of the objects die.
  @objects.each_index { |i| @objects[i] = nil if i.even? }
  GC.start
  dead = full_update(rec)
  dead_count = rec.stats[:last_update_objects_dead]
  per = ->(s) { Bench.ns(s * 1e9 / n) }
  rows << [n, per.call(Bench.median(young)), per.call(Bench.median(old)), per.call(Bench.median(full)),
    per.call(dead), Bench.ms(Bench.median(full)), format("%.1f s", setup), dead_count]
  @rec = @objects = rec = nil
  GC.start
end
Bench.table(["tracked", "young update (all young)", "young update (all old)", "full update + snapshot",
  "full, 50% dead", "full update total", "setup", "dead found"], rows)
