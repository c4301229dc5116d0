# frozen_string_literal: true

# What the windowed sampler makes the VM do that no counter of ours times (the stage counters and
# the overhead budget see our own code only), per Ruby:
# 1. an allocation inside a window: our NEWOBJ hook installed and never sampling, against no hook
#    (BasicObject.new, [i, i], small Strings; CPU ns per allocation);
# 2. an entry in an ObjectSpace::WeakMap whose object dies young, all in: `map[i] = o` once per
#    4096 allocations against the same call on a plain object (before Ruby 3.3 the entry defines
#    a finalizer, which runs when the object dies);
# 3. a tick of the window timer: the windowed sampler at sample_every 2**20 (windows far apart, so
#    nearly nothing but the ticks themselves) at 10 and 1000 ticks a second, no budget: the
#    extra CPU over the extra ticks, and the part of it the gem's own threads ran (the timer;
#    from /proc), beside the floor any timer thread pays here: a bare native thread sleeping
#    1 ms on a condition variable and waking, a thousand times.
# Variants alternate round by round; process CPU time; medians.
#
# Run: rake bench:window_cost (or ruby -Ilib bench/window_cost.rb; BENCH_SMOKE=1 for a quick run)
require_relative "support"
require_relative "lib/thread_cpu"

ROUNDS = Bench.pick(7, 2)
N = Bench.pick(3_000_000, 100_000)
N_MAP = Bench.pick(20_000_000, 400_000)
N_WINDOWS = Bench.pick(10_000_000, 200_000)
NEVER = 2**32 - 1

LOOPS = Bench::LOOPS.slice("BasicObject.new", "[i, i]", "small String").freeze

def cpu_ns_per(n)
  t = Bench.cpu
  yield
  (Bench.cpu - t) * 1e9 / n
end

Bench.header("bench/window_cost.rb: what an allocation inside a window, a WeakMap entry and a window cost",
  ["#{ROUNDS} rounds, medians of alternating runs; process CPU time"])

rows = LOOPS.map do |name, work|
  work.call(N / 10)
  res = Bench.alternate(%i[none hook], ROUNDS) do |v|
    rec = DatadogHeap::Recorder.new(sampler: :countdown, sample_every: NEVER) if v == :hook
    rec&.start
    cpu_ns_per(N) { work.call(N) }
  ensure
    rec&.stop
  end
  none, hook = res.values_at(:none, :hook).map { |r| Bench.median(r) }
  [name, Bench.ns(none), Bench.ns(hook), Bench.ns(hook - none)]
end
Bench.table(["allocation", "no hook", "our hook, never sampling", "an allocation inside a window"], rows)

# A plain object with the same []= call, so the loops differ only in the map.
class Sink
  def []=(_key, _value)
  end
end

def map_loop(n, map)
  i = 0
  while i < n
    o = BasicObject.new
    map[i] = o if (i & 4095) == 0
    i += 1
  end
end

res = Bench.alternate(%i[sink map], ROUNDS) do |v|
  map = (v == :map) ? ObjectSpace::WeakMap.new : Sink.new
  t = Bench.cpu
  map_loop(N_MAP, map)
  Bench.cpu - t
end
entries = N_MAP / 4096
extra = Bench.median(res[:map].zip(res[:sink]).map { |m, s| m - s })
Bench.table(["WeakMap entries (objects dying young)", "CPU per entry, all in"],
  [["#{entries} in #{N_MAP} BasicObject.new", Bench.ns(extra * 1e9 / entries)]])


windows = {}
timer_ns = {}
res = Bench.alternate(%i[none w10 w1000], ROUNDS) do |v|
  rec = DatadogHeap::Recorder.new(sample_every: 2**20, max_overhead: nil, windows_per_second: (v == :w10) ? 10 : 1000) unless v == :none
  rec&.start
  before = ThreadCpu.gem_threads_ns
  t = Bench.cpu
  LOOPS["BasicObject.new"].call(N_WINDOWS)
  seconds = Bench.cpu - t
  after = ThreadCpu.gem_threads_ns
  if rec
    (windows[v] ||= []) << rec.stats[:sampler_window_ticks]
    (timer_ns[v] ||= []) << after - before
  end
  seconds
ensure
  rec&.stop
end
extra = Bench.median(res[:w1000].zip(res[:w10]).map { |a, b| a - b })
more = Bench.median(windows[:w1000]) - Bench.median(windows[:w10])
in_timer = Bench.median(timer_ns[:w1000].zip(timer_ns[:w10]).map { |a, b| a - b })
floor = Bench.median(Array.new(3) { DatadogHeap::Testing._native_sleep_wake_floor(Bench.pick(1000, 50), 1000) })
timer = DatadogHeap._native_native_window_timer ? "native" : "Ruby thread"
Bench.table(["timer ticks (#{timer} timer)", "ticks per run", "CPU per tick",
  "of which the gem's own threads", "a bare native thread's sleep and wake"],
  [["1000/s against 10/s, #{N_WINDOWS} BasicObject.new", "#{Bench.median(windows[:w1000]).round} vs #{Bench.median(windows[:w10]).round}",
    Bench.ns(extra * 1e9 / [more, 1].max), Bench.ns(in_timer.to_f / [more, 1].max), Bench.ns(floor)]])
