# frozen_string_literal: true

# Profile build + encode time and pprof size (issue 7, item 5) for 10k/100k/1M tracked objects
# over 1k/10k distinct stacks (20 frames each, the innermost 2 distinct per stack), and how long
# other threads are kept from running meanwhile.
#
# `profile` runs the full update and takes the snapshot holding the GVL, then builds and gzips
# the pprof without it. Three measurements alternate, round by round:
# - `profile` alone: the wall time a caller waits;
# - the update + snapshot part alone (`each_live_object`, stopped at the first object), which is
#   what `profile` does before it lets the GVL go: the time the GVL is held;
# - `profile` beside a ticker thread that notes the time in a loop with Thread.pass: its longest
#   gap during the call is the longest another thread waited for the GVL (the VM lets a waiting
#   thread in every 100 ms: the update's WeakMap calls check for interrupts), and the sum of its
#   gaps over 1 ms is an upper bound of the time it could not run (it also counts the OS
#   preempting the ticker, ~4 ms at a time, on a loaded machine).
#
# Run: rake bench:serialize (or ruby -Ilib bench/serialize.rb; BENCH_SMOKE=1 for a quick run)
require_relative "support"

COUNTS = Bench.pick([10_000, 100_000, 1_000_000], [2_000, 20_000])
STACK_COUNTS = Bench.pick([1_000, 10_000], [100, 1_000])
ROUNDS = Bench.pick(5, 2)
GAP = 0.001

# A thread that notes when it runs. `window(t0, t1)` sums its gaps over GAP within [t0, t1].
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

  # [blocked seconds, longest gap] within [t0, t1]: the parts of gaps over GAP that overlap it.
  def window(t0, t1)
    ticks = @ticks.dup
    gaps = ticks.each_cons(2).select { |a, b| b - a > GAP && b > t0 && a < t1 }
      .map { |a, b| [b, t1].min - [a, t0].max }
    [gaps.sum, gaps.max || 0.0]
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
    res = Bench.alternate(%i[profile ticked prepare], ROUNDS, gc: false) do |v|
      case v
      when :profile
        Bench.time { rec.profile }
      when :prepare
        Bench.time { rec.each_live_object { break } }
      when :ticked
        ticker = Ticker.new
        t0 = Bench.now
        rec.profile
        t1 = Bench.now
        sleep 0.002 # let the ticker note the end
        ticker.stop
        blocked, longest = ticker.window(t0, t1)
        {seconds: t1 - t0, blocked: blocked, longest: longest}
      end
    end
    med = ->(list) { Bench.median(list) }
    total = med.call(res[:profile])
    ticked = res[:ticked]
    prepare = med.call(res[:prepare])
    rows << [n, stacks, Bench.ms(total), Bench.ns(total * 1e9 / n), Bench.bytes(size),
      Bench.ms(prepare), Bench.ms(total - prepare), Bench.ms(med.call(ticked.map { |r| r[:longest] })),
      Bench.ms(med.call(ticked.map { |r| r[:blocked] })), Bench.ms(med.call(ticked.map { |r| r[:seconds] })),
      format("%.1f s", setup)]
    @rec = @objects = rec = nil
    GC.start
  end
end
Bench.table(["tracked", "stacks", "profile", "per object", "pprof size", "GVL held: update + snapshot",
  "encode, no GVL", "ticker: longest wait", "ticker: gaps > 1 ms", "profile w/ ticker", "setup"], rows)
