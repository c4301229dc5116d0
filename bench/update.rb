# frozen_string_literal: true

# Update cost per tracked object at 10k, 100k and 1M tracked objects.
#
# Objects are set up through record_allocation and explicit commits (so the counts are exact),
# 1000 distinct stacks of 5 frames, all objects alive Strings (sizes measured), all recorded
# between the same two GCs. Then, GC by GC, young updates (`update_young_objects`, its 2 s
# minimum interval reset before each):
# - age 1, every object alive: each one is looked up in the WeakMap and measured, which is the
#   work a full update does per object (a full update only differs in also visiting objects of
#   age >= 3);
# - age 2, half of the objects dead: finding, dropping and releasing them;
# - age >= 3, every object old: each record is visited and skipped.
# The first two happen once per recorder, so 10k and 100k are set up 3 times (1M once, its setup
# takes seconds); medians. The full update's own time is in bench/serialize.rb's
# "GVL held" column (profile = full update + snapshot + encode).
#
# Run: rake bench:update (or ruby -Ilib bench/update.rb; BENCH_SMOKE=1 for a quick run)
require_relative "support"

SIZES = Bench.pick([1_000, 10_000, 100_000, 1_000_000], [2_000, 20_000])
OLD_ROUNDS = Bench.pick(5, 2)
STACKS = 1000

# Times a young update; checks it visited `visited` objects (skipping the rest).
def young_update(rec, visited)
  DatadogHeap::Testing.reset_last_update!(rec)
  t = Bench.now
  ran = rec.update_young_objects
  seconds = Bench.now - t
  raise "young update skipped: #{rec.stats.inspect}" unless ran

  st = rec.stats
  seen = st[:last_update_objects_alive] + st[:last_update_objects_dead]
  raise "young update visited #{seen} objects, expected #{visited}" unless seen == visited

  [seconds, st]
end

Bench.header("bench/update.rb: update time per tracked object",
  ["#{STACKS} distinct stacks of 5 frames (depth does not change update work), all objects alive Strings, size_enabled: true"])

rows = []
SIZES.each do |n|
  alive = []
  dead = []
  old = []
  setups = []
  dead_found = 0
  (n >= 1_000_000 ? 1 : Bench.pick(3, 1)).times do
    setups << Bench.time { @rec, @objects, @gen = Bench.tracked_recorder(n, stacks: [STACKS, n].min, depth: 5) }
    rec = @rec
    GC.start if GC.count == @gen # age 1 (the GC that re-enabling GC set off may have run already)
    raise "#{GC.count - @gen} GCs since the objects were recorded: no longer young" unless GC.count == @gen + 1

    alive << young_update(rec, n)[0]
    @objects.each_index { |i| @objects[i] = nil if i.even? } # half of them die
    GC.start # age 2
    seconds, st = young_update(rec, n)
    dead << seconds
    dead_found = st[:last_update_objects_dead]
    GC.start # age 3: from now on young updates skip everything
    OLD_ROUNDS.times do
      GC.start
      old << young_update(rec, 0)[0]
    end
    @rec = @objects = rec = nil
    GC.start
  end
  per = ->(list, count = n) { Bench.ns(Bench.median(list) * 1e9 / count) }
  rows << [n, per.call(alive), per.call(dead), per.call(old, n / 2), Bench.ms(Bench.median(alive)),
    format("%.1f s", Bench.median(setups)), dead_found]
end
Bench.table(["tracked", "update, all alive", "update, 50% dead", "young update, all old (skipped)",
  "update total, all alive", "setup", "dead found"], rows)

# Full update: every record of age >= 1 is looked at, and every one not measured while
# frozen is measured again, so a profile reports sizes as of the profile. The cost of that
# measuring: full updates with size_enabled true and false on the same records, alternated
# round by round; and on frozen objects, which are measured once and then never again. Timed:
# `each_live_object { break }`, which is the full update plus the snapshot copy (no yielding), in
# process CPU time.
FULL_SIZES = Bench.pick([10_000, 100_000], [2_000])
FULL_ROUNDS = Bench.pick(7, 2)

def full_update_seconds(rec)
  Bench.cpu_time { rec.each_live_object { break } }
end

full_rows = []
FULL_SIZES.each do |n|
  objects = Array.new(n) { |i| "tracked object #{i} " * (1 + i % 4) }
  rec, objects, = Bench.tracked_recorder(n, stacks: [STACKS, n].min, depth: 5, objects: objects)
  frozen = Array.new(n) { |i| ("frozen object #{i} " * (1 + i % 4)).freeze }
  frozen_rec, frozen, = Bench.tracked_recorder(n, stacks: [STACKS, n].min, depth: 5, objects: frozen)
  GC.start
  full_update_seconds(frozen_rec) # measures them all, once
  results = Bench.alternate(%i[measured unmeasured frozen], FULL_ROUNDS) do |variant|
    case variant
    when :frozen then full_update_seconds(frozen_rec)
    else
      rec.size_enabled = (variant == :measured)
      full_update_seconds(rec)
    end
  end
  per = ->(v) { Bench.ns(Bench.median(results[v]) * 1e9 / n) }
  full_rows << [n, per.call(:measured), per.call(:unmeasured), per.call(:frozen),
    Bench.ms(Bench.median(results[:measured])), Bench.ratio(Bench.paired_ratio(results, :measured, :unmeasured))]
  raise "lost objects" unless objects.size == n && frozen.size == n
end
puts
puts "Full update (+ snapshot copy) per record, Strings of 20 to 80 bytes, all alive, #{FULL_ROUNDS} rounds, medians:"
Bench.table(["tracked", "re-measuring every record", "no measuring (size_enabled: false)",
  "frozen, measured once before", "total, re-measuring", "re-measuring / none"], full_rows)
