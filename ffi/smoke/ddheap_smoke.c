// A Ruby extension that drives the heap_recorder.h C ABI (ffi/c/heap_recorder_shim.c over
// libdatadog_heap_cabi.a) in a live VM, the way stack_recorder.c does, without all of Datadog's
// profiler. `ruby ffi/smoke/build.rb OUT` builds it from this repository alone (against the
// stand-ins in standins/ for the parts of Datadog's headers it and the shim use), and
// spec/cabi_smoke_spec.rb runs smoke.rb over it. The profiler's string storage is stood in for by
// the few ddog_prof_ManagedStringStorage_* functions at the bottom (test-only; the real ones come
// from libdatadog when linked into datadog's extension).
#include <ruby.h>
#include <string.h>
#include "heap_recorder.h"
#include "ruby_helpers.h"

static heap_recorder *recorder = NULL;
static VALUE holder = Qnil;

// DDHEAP_DDTRACE_WEAKMAP: dd-trace-rb master's heap_recorder.h (record ids, a weak map), as the
// shim; without it, datadog 2.41's (object ids).
#ifdef DDHEAP_DDTRACE_WEAKMAP
static void mark_holder(void *_) { heap_recorder_mark(recorder); }
#define COMMIT heap_recorder_commit_pending_recordings
void collectors_heap_recorder_init(void);
// private_vm_api_access.c's, which heap_recorder.c calls (that file needs all of the VM's headers).
int rb_objspace_internal_object_p(VALUE obj);
bool ddtrace_is_internal_object_p(VALUE obj) {
  return RB_SPECIAL_CONST_P(obj) ? obj == Qundef : rb_objspace_internal_object_p(obj);
}
#else
static void mark_holder(void *_) { heap_recorder_mark_pending_recordings(recorder); }
#define COMMIT heap_recorder_finalize_pending_recordings
#endif
static const rb_data_type_t holder_type = {.wrap_struct_name = "ddheap_smoke", .function = {.dmark = mark_holder}};

static VALUE s_new(VALUE _self, VALUE sample_rate, VALUE size_enabled) {
  ddog_prof_ManagedStringStorage storage = {.inner = (void *) 1};
  recorder = heap_recorder_new(storage);
  heap_recorder_set_sample_rate(recorder, NUM2INT(sample_rate));
  heap_recorder_set_size_enabled(recorder, RTEST(size_enabled));
  return Qtrue;
}

static ddog_CharSlice slice(VALUE s) { return (ddog_CharSlice) {.ptr = RSTRING_PTR(s), .len = RSTRING_LEN(s)}; }

// locs: [[name, file, line], ...]
static VALUE s_track(VALUE _self, VALUE obj, VALUE weight, VALUE klass, VALUE locs) {
  long n = RARRAY_LEN(locs);
  ddog_prof_Location l[64] = {0};
  if (n > 64) n = 64;
  for (long i = 0; i < n; i++) {
    VALUE e = rb_ary_entry(locs, i);
    l[i].function.name = slice(rb_ary_entry(e, 0));
    l[i].function.filename = slice(rb_ary_entry(e, 1));
    l[i].line = NUM2LONG(rb_ary_entry(e, 2));
  }
  bool needs_after = start_heap_allocation_recording(recorder, obj, NUM2UINT(weight), slice(klass));
  int state = end_heap_allocation_recording_with_rb_protect(recorder, (ddog_prof_Slice_Location) {.ptr = l, .len = n});
  if (state) rb_jump_tag(state);
  return needs_after ? Qtrue : Qfalse;
}

static VALUE s_finalize(VALUE _self) { COMMIT(recorder); return Qnil; }
static VALUE s_update_young(VALUE _self) { heap_recorder_update_young_objects(recorder); return Qnil; }
static VALUE s_reset_last_update(VALUE _self) { heap_recorder_testonly_reset_last_update(recorder); return Qnil; }
static VALUE s_state(VALUE _self) { return heap_recorder_state_snapshot(recorder); }
static VALUE s_debug(VALUE _self) { return heap_recorder_testonly_debug(recorder); }
#ifdef DDHEAP_DDTRACE_WEAKMAP
static VALUE s_recorded(VALUE _self, VALUE id) { return heap_recorder_testonly_is_object_recorded(recorder, NUM2LONG(id)); }
static VALUE s_record_id_for(VALUE _self, VALUE obj) { return heap_recorder_testonly_record_id_for(recorder, obj); }
#else
static VALUE s_recorded(VALUE _self, VALUE id) { return heap_recorder_testonly_is_object_recorded(recorder, id); }
// 2.41 tracks objects by their object id.
static VALUE s_record_id_for(VALUE _self, VALUE obj) { return rb_obj_id(obj); }
#endif

typedef struct { long count; long weight; long size; long frames; uint32_t last_class; long top_line; } live_acc;
static bool visit(heap_recorder_iteration_data d, void *arg) {
  live_acc *a = arg;
  a->count++; a->weight += d.object_data.weight; a->size += d.object_data.size; a->frames += d.locations.len;
  a->last_class = d.object_data.class.value;
  if (d.locations.len > 0) a->top_line = d.locations.ptr[0].line;
  return true;
}

// Prepares, iterates (as without the GVL: the callback touches no Ruby), finishes.
static VALUE s_live(VALUE _self) {
  heap_recorder_prepare_iteration(recorder);
  live_acc a = {0};
  bool ran = heap_recorder_for_each_live_object(recorder, visit, &a);
  heap_recorder_finish_iteration(recorder);
  VALUE h = rb_hash_new();
  rb_hash_aset(h, ID2SYM(rb_intern("ran")), ran ? Qtrue : Qfalse);
  rb_hash_aset(h, ID2SYM(rb_intern("count")), LONG2NUM(a.count));
  rb_hash_aset(h, ID2SYM(rb_intern("weight")), LONG2NUM(a.weight));
  rb_hash_aset(h, ID2SYM(rb_intern("size")), LONG2NUM(a.size));
  rb_hash_aset(h, ID2SYM(rb_intern("frames")), LONG2NUM(a.frames));
  rb_hash_aset(h, ID2SYM(rb_intern("top_line")), LONG2NUM(a.top_line));
  return h;
}

static VALUE s_finish_unprepared(VALUE _self) { heap_recorder_finish_iteration(recorder); return Qnil; }
static VALUE s_free(VALUE _self) { heap_recorder_free(recorder); recorder = NULL; return Qnil; }

// ---- test stand-in for the profiler's ManagedStringStorage (refcounted, by content) ----
#define MAX_STRINGS 4096
static char *strings[MAX_STRINGS];
static long refs[MAX_STRINGS];
static uint32_t nstrings = 0;

static uint32_t stub_intern(ddog_CharSlice s) {
  if (s.len == 0) return 0;
  for (uint32_t i = 1; i <= nstrings; i++) {
    if (strings[i] && strlen(strings[i]) == s.len && memcmp(strings[i], s.ptr, s.len) == 0) { refs[i]++; return i; }
  }
  if (nstrings + 1 >= MAX_STRINGS) return 0;
  uint32_t id = ++nstrings;
  strings[id] = strndup(s.ptr, s.len);
  refs[id] = 1;
  return id;
}

ddog_prof_ManagedStringStorageInternResult ddog_prof_ManagedStringStorage_intern(ddog_prof_ManagedStringStorage _s, ddog_CharSlice string) {
  return (ddog_prof_ManagedStringStorageInternResult) {.tag = DDOG_PROF_MANAGED_STRING_STORAGE_INTERN_RESULT_OK, .ok = {.value = stub_intern(string)}};
}

ddog_prof_MaybeError ddog_prof_ManagedStringStorage_intern_all(ddog_prof_ManagedStringStorage _s, ddog_prof_Slice_CharSlice strs, ddog_prof_ManagedStringId *out, uintptr_t n) {
  for (uintptr_t i = 0; i < n; i++) out[i].value = stub_intern(strs.ptr[i]);
  return (ddog_prof_MaybeError) {.tag = DDOG_PROF_OPTION_ERROR_NONE_ERROR};
}

ddog_prof_MaybeError ddog_prof_ManagedStringStorage_unintern_all(ddog_prof_ManagedStringStorage _s, ddog_prof_Slice_ManagedStringId ids) {
  for (uintptr_t i = 0; i < ids.len; i++) {
    uint32_t id = ids.ptr[i].value;
    if (id == 0) continue;
    if (id > nstrings || refs[id] <= 0) rb_bug("ddheap_smoke: unintern of unknown id %u", id);
    refs[id]--;
  }
  return (ddog_prof_MaybeError) {.tag = DDOG_PROF_OPTION_ERROR_NONE_ERROR};
}

void ddog_Error_drop(ddog_Error *_e) {}

static VALUE s_live_strings(VALUE _self) {
  long n = 0;
  for (uint32_t i = 1; i <= nstrings; i++) if (refs[i] > 0) n++;
  return LONG2NUM(n);
}

void Init_ddheap_smoke(void) {
  ruby_helpers_init(); // as the profiler's Init does: the ids ruby_ref_from_id uses
#ifdef DDHEAP_DDTRACE_WEAKMAP
  collectors_heap_recorder_init();
#endif
  VALUE m = rb_define_module("DdheapSmoke");
  // Non-NULL data: the GC calls no dmark for a T_DATA whose pointer is NULL.
  holder = TypedData_Wrap_Struct(rb_cObject, &holder_type, &recorder);
  rb_global_variable(&holder);
  rb_define_singleton_method(m, "new_recorder", s_new, 2);
  rb_define_singleton_method(m, "track", s_track, 4);
  rb_define_singleton_method(m, "finalize", s_finalize, 0);
  rb_define_singleton_method(m, "update_young", s_update_young, 0);
  rb_define_singleton_method(m, "reset_last_update", s_reset_last_update, 0);
  rb_define_singleton_method(m, "state", s_state, 0);
  rb_define_singleton_method(m, "debug", s_debug, 0);
  rb_define_singleton_method(m, "recorded?", s_recorded, 1);
  rb_define_singleton_method(m, "record_id_for", s_record_id_for, 1);
  rb_define_singleton_method(m, "live", s_live, 0);
  rb_define_singleton_method(m, "finish_unprepared", s_finish_unprepared, 0);
  rb_define_singleton_method(m, "free", s_free, 0);
  rb_define_singleton_method(m, "live_strings", s_live_strings, 0);
}

// heap_recorder.c (the C recorder, built into the same driver for the side-by-side bench) also
// uninterns one id at a time.
ddog_prof_MaybeError ddog_prof_ManagedStringStorage_unintern(ddog_prof_ManagedStringStorage s, ddog_prof_ManagedStringId id) {
  return ddog_prof_ManagedStringStorage_unintern_all(s, (ddog_prof_Slice_ManagedStringId) {.ptr = &id, .len = 1});
}
