# frozen_string_literal: true

# Drives heap_recorder.h's C ABI in a live Ruby VM (see ddheap_smoke.c): `ruby ffi/smoke/build.rb
# OUT`, then `ruby -I OUT/object_id ffi/smoke/smoke.rb` (or OUT/record_id). Exits non-zero on the
# first failed check.
require "objspace"
require "ddheap_smoke"

def check(what, ok)
  puts "#{ok ? "ok  " : "FAIL"} #{what}"
  exit 1 unless ok
end

M = DdheapSmoke
M.new_recorder(1, true)
LOCS = [["Foo#bar", "/app/foo.rb", 12], ["main", "/app/main.rb", 3]].freeze

keep = []
needs = nil
100.times do |i|
  obj = "string #{i}"
  n = M.track(obj, 10, "String", LOCS)
  needs = n if i == 0
  keep << obj if i.even?
end
check "first start asks for an after-allocation callback", needs == true
check "recordings wait in the pending queue", M.state[:pending_recordings_count] == 100
GC.start # pending objects are marked: none is lost before it has an id
M.finalize
st = M.state
check "finalize commits them (100 object records, 1 heap record)", st[:num_object_records] == 100 && st[:num_heap_records] == 1
id = M.record_id_for(keep.first) # its object id (datadog 2.41) or record id (master)
check "recorded? by the id it is tracked by", !id.nil? && M.recorded?(id) == true
other = M.record_id_for(Object.new)
check "an object never sampled is not recorded", other.nil? || !M.recorded?(other)

GC.start
GC.start
live = M.live
check "iteration ran and sees only survivors (50)", live[:ran] && live[:count] == 50
check "weights carried (50 x 10)", live[:weight] == 500
check "sizes measured (rb_obj_memsize_of)", live[:size] == keep.sum { |o| ObjectSpace.memsize_of(o) }
check "locations handed as ids, innermost first (2 frames each, top line 12)", live[:frames] == 100 && live[:top_line] == 12
check "dead objects dropped from records", M.state[:num_object_records] == 50

keep.clear
GC.start
GC.start
M.live
check "all dead: no records, no heap records", M.state[:num_object_records] == 0 && M.state[:num_heap_records] == 0
check "every interned string released", M.live_strings == 0

raised = begin
  M.finish_unprepared
  false
rescue RuntimeError => e
  e.message.include?("without having been prepared")
end
check "finish without prepare raises RuntimeError like heap_recorder.c", raised

raised = begin
  M.new_recorder(0, true)
  false
rescue ArgumentError
  true
end
check "sample rate 0 raises ArgumentError", raised

M.new_recorder(2, false)
objs = Array.new(10) { |i| M.track(+"x#{i}", 1, "String", LOCS); nil }
M.finalize
check "sample rate 2 keeps half", M.state[:num_object_records] == 5
check "debug dump lists records", M.debug[0][1].size == 5
M.free
puts "smoke: all checks passed"
