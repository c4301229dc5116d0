# frozen_string_literal: true

# Profile build + encode time and pprof size for 10k/100k/1M tracked objects
# over 1k/10k distinct stacks (20 frames each, the innermost 2 distinct per stack), and how long
# other threads are kept from running meanwhile.
#
# `profile` runs the full update and takes the snapshot holding the GVL, then builds and gzips
# the pprof without it. Two measurements alternate, round by round:
# - `profile` alone: the wall time a caller waits;
# - `profile` beside a ticker thread that notes the time in a loop with Thread.pass. While the
#   main thread holds the GVL the ticker stands still, except for a tick when the VM hands the
#   GVL over every 100 ms (the update's WeakMap calls check for interrupts); once `profile` lets
#   the GVL go, the ticker runs freely. GVL held = from the call to the ticker's first free run,
#   plus from its last free run to the return (the end of the iteration, the Ruby String);
#   "longest wait" = the longest gap between two ticks, the worst pause another thread sees.
#   (On a loaded machine the OS also preempts the ticker, ~4 ms at a time: the first free run
#   may be seen that much late.)
#
# Run: rake bench:serialize (or ruby -Ilib bench/serialize.rb; BENCH_SMOKE=1 for a quick run)
require_relative "support"

COUNTS = Bench.pick([10_000, 100_000, 1_000_000], [2_000, 20_000])
STACK_COUNTS = Bench.pick([1_000, 10_000], [100, 1_000])
ROUNDS = Bench.pick(5, 2)
GAP = 0.001
# Three ticks within FREE: the ticker runs freely. Long enough to ride over the OS preempting the
# ticker (Thread.pass ends in sched_yield, which on a busy machine hands the core to another
# process for a ~4 ms slice); far shorter than the 100 ms between the VM's GVL hand-overs.
FREE = 0.010

# A thread that notes when it runs; `window` reads the GVL hold of a call out of its ticks.
class Ticker
  def initialize
    @ticks = []
    @stop = false
    @thread = Thread.new do
      until @stop
        @ticks << Bench.now
        Thread.pass
      end
    end
    Thread.pass until @ticks.size > 2
  end

  # [GVL held, longest gap] for a call that ran from t0 to t1 (see the header).
  def window(t0, t1)
    ticks = @ticks.dup.select { |t| t >= t0 - GAP && t <= t1 + GAP }
    gaps = ticks.each_cons(2).map { |a, b| b - a }
    longest = gaps.max || (t1 - t0)
    free = (0...[ticks.size - 2, 0].max).select { |i| ticks[i + 2] - ticks[i] < FREE && ticks[i] >= t0 && ticks[i + 2] <= t1 }
    return [t1 - t0, longest] if free.empty?

    [(ticks[free.first] - t0) + (t1 - ticks[free.last + 2]), longest]
  end

  def stop
    @stop = true
    @thread.join
  end
end

Bench.header("bench/serialize.rb: profile build + encode time, pprof size, GVL held",
  ["#{ROUNDS} rounds, medians; stacks of 20 frames; all objects alive (Strings, age >= 1)"])

rows = []
COUNTS.each do |n|
  STACK_COUNTS.each do |stacks|
    setup = Bench.time { @rec, @objects = Bench.tracked_recorder(n, stacks: stacks) }
    rec = @rec
    GC.start # age >= 1: profiles leave out objects that have not been through a GC yet
    size = rec.profile.bytesize
    res = Bench.alternate(%i[profile ticked], ROUNDS, gc: false) do |v|
      case v
      when :profile
        Bench.time { rec.profile }
      when :ticked
        ticker = Ticker.new
        t0 = Bench.now
        rec.profile
        t1 = Bench.now
        sleep 0.002 # let the ticker note the end
        ticker.stop
        held, longest = ticker.window(t0, t1)
        {seconds: t1 - t0, held: held, longest: longest}
      end
    end
    med = ->(list) { Bench.median(list) }
    total = med.call(res[:profile])
    ticked = res[:ticked]
    rows << [n, stacks, Bench.ms(total), Bench.ns(total * 1e9 / n), Bench.bytes(size),
      Bench.ms(med.call(ticked.map { |r| r[:held] })), Bench.ms(med.call(ticked.map { |r| r[:longest] })),
      Bench.ms(med.call(ticked.map { |r| r[:seconds] })), format("%.1f s", setup)]
    @rec = @objects = rec = nil
    GC.start
  end
end
Bench.table(["tracked", "stacks", "profile", "per object", "pprof size", "GVL held",
  "another thread's longest wait", "profile beside the ticker", "setup"], rows)
