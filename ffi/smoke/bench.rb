# frozen_string_literal: true

# Side by side: the same driver (ddheap_smoke.c) over Datadog's heap_recorder.c or over our
# library, the same string-storage stand-in (ours as ffi/smoke/build.rb builds it; the C one only
# by a build outside this repository, which has Datadog's sources). Tracks N objects on 3 stacks (one kept in 10), flushes
# the pending queue every 64 recordings as the postponed job would, then prepares/iterates/finishes
# 3 times with GCs in between. Prints microseconds per tracked object and per iterated object.
require "ddheap_smoke"

M = DdheapSmoke
N = Integer(ENV.fetch("N", "200000"))
STACKS = [
  [["Foo#bar", "/app/foo.rb", 12], ["main", "/app/main.rb", 3]],
  [["Baz#qux", "/app/baz.rb", 7], ["Foo#bar", "/app/foo.rb", 14], ["main", "/app/main.rb", 3]],
  [["Array#map", "<internal:array>", 1], ["main", "/app/main.rb", 9]],
].freeze

M.new_recorder(1, true)
keep = []
t0 = Process.clock_gettime(Process::CLOCK_MONOTONIC)
N.times do |i|
  obj = "o#{i}"
  M.track(obj, 1, "String", STACKS[i % 3])
  M.finalize if i % 64 == 63
  keep << obj if i % 10 == 0
end
M.finalize
t1 = Process.clock_gettime(Process::CLOCK_MONOTONIC)
GC.start
live_total = 0
3.times do
  GC.start
  live_total += M.live[:count]
end
t2 = Process.clock_gettime(Process::CLOCK_MONOTONIC)
printf("%s: track %.3f us/object, iterate %.3f us/live object (%d live)\n",
  ENV.fetch("FLAVOR", "?"), (t1 - t0) * 1e6 / N, (t2 - t1) * 1e6 / [live_total, 1].max, live_total / 3)
