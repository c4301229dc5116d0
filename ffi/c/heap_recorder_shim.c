// heap_recorder.h implemented over datadog_heap's Rust recorder, for two generations of it:
//
// - datadog 2.41 (and 2.42 before "bye-bye-id2ref"): objects tracked by object id (rb_obj_id),
//   liveness through ObjectSpace._id2ref, heap_recorder_finalize_pending_recordings;
// - dd-trace-rb master from cf0d441e25 (2.42.0.dev): objects tracked by record ids from a
//   per-recorder counter, liveness through an ObjectSpace::WeakMap[record id => object], every
//   recording committed by heap_recorder_commit_pending_recordings, heap_recorder_mark, internal
//   objects never tracked. Built with -DDDHEAP_DDTRACE_WEAKMAP=1; no rb_obj_id or _id2ref then.
//
// The build chooses from the header it compiles against (the second one declares
// heap_recorder_commit_pending_recordings); a static assertion below fails the build when the
// choice does not match the header.
//
// Dropped into the `datadog` gem's ext/datadog_profiling_native_extension in place of its
// heap_recorder.c (by a build outside this repository: see docs/c-abi.md), it keeps the header's names, arguments and
// semantics and forwards each call to a ddheap_* function (include/datadog_heap_cabi.h). It is the
// only part that touches Ruby: every VM call the recorder needs is a callback here wrapped in
// rb_protect, so an exception never unwinds through Rust frames; errors come back as a
// DdheapError this file raises, in the places heap_recorder.c raises.

#include <ruby.h>
#include <ruby/debug.h>

#include "heap_recorder.h"
#include "ruby_helpers.h"
#include "time_helpers.h"
#include "collectors_stack.h"
#include "datadog_heap_cabi.h"

#ifdef DDHEAP_DDTRACE_WEAKMAP
_Static_assert(__builtin_types_compatible_p(__typeof__(&heap_recorder_testonly_is_object_recorded), VALUE (*)(heap_recorder *, long)),
  "DDHEAP_DDTRACE_WEAKMAP is set but heap_recorder.h is the object-id one (datadog 2.41): build without it");
#else
_Static_assert(__builtin_types_compatible_p(__typeof__(&heap_recorder_testonly_is_object_recorded), VALUE (*)(heap_recorder *, VALUE)),
  "heap_recorder.h is the record-id one (dd-trace-rb master, 2.42): build with -DDDHEAP_DDTRACE_WEAKMAP=1");
#endif

// The header's structs cross the boundary by value: check our Rust mirrors against them.
_Static_assert(sizeof(live_object_data) == 48, "live_object_data layout changed");
_Static_assert(sizeof(heap_recorder_iteration_data) == 16 + 48, "heap_recorder_iteration_data layout changed");
_Static_assert(sizeof(ddog_prof_Location) == 160, "ddog_prof_Location layout changed");

struct heap_recorder {
  DdheapRecorder *inner;
#ifdef DDHEAP_DDTRACE_WEAKMAP
  VALUE weak_objects; // ObjectSpace::WeakMap[record id (Fixnum) => object]: marked, its values are not
  long next_record_id; // never reused
#endif
};

// ---- VM callbacks (under the GVL; never raise into Rust) ----

static size_t cb_gc_count(void) { return rb_gc_count(); }

static int64_t cb_now_ns(void) { return monotonic_wall_time_now_ns(DO_NOT_RAISE_ON_FAILURE); }

#ifdef DDHEAP_DDTRACE_WEAKMAP
// ---- record ids and the weak map (master) ----

static VALUE weak_map_class = Qnil;
static ID aref_id, aset_id;

// Called from the extension's Init (profiling.c), as heap_recorder.c's.
void collectors_heap_recorder_init(void) {
  rb_global_variable(&weak_map_class);
  weak_map_class = rb_const_get(rb_const_get(rb_cObject, rb_intern("ObjectSpace")), rb_intern("WeakMap"));
  aref_id = rb_intern("[]");
  aset_id = rb_intern("[]=");
}

// A public symbol Ruby's headers do not declare (Datadog's private_vm_api_access.c declares it too).
int rb_objspace_internal_object_p(VALUE obj);

// From the allocation sampler: a flag check, no allocation, no raise.
static bool cb_is_internal(uintptr_t obj) {
  VALUE v = (VALUE) obj;
  return RB_SPECIAL_CONST_P(v) ? v == Qundef : rb_objspace_internal_object_p(v);
}

typedef struct { VALUE map; VALUE key; VALUE value; bool measure; size_t size; bool frozen; } weak_args;

static VALUE protected_weak_set(VALUE p) {
  weak_args *a = (weak_args *) p;
  return rb_funcall(a->map, aset_id, 2, a->key, a->value); // may allocate, GC or switch threads
}

// Reads the object a record id refers to (nil once it was collected) and, when asked, measures it.
static VALUE protected_weak_get(VALUE p) {
  weak_args *a = (weak_args *) p;
  a->value = rb_funcall(a->map, aref_id, 1, a->key); // may allocate, GC or switch threads
  if (a->measure && !NIL_P(a->value)) {
    a->size = ruby_obj_memsize_of(a->value);
    a->frozen = RB_OBJ_FROZEN(a->value);
  }
  return a->value;
}

// Commits `obj` under a fresh record id. The object stays on the pending queue (marked) until
// this returns, so a GC inside the weak map call cannot free it first.
static int32_t cb_obj_id(void *ctx, uintptr_t obj, int64_t *out) {
  heap_recorder *recorder = ctx;
  if (recorder->next_record_id >= RUBY_FIXNUM_MAX) return -1;
  long id = ++recorder->next_record_id;
  weak_args a = {.map = recorder->weak_objects, .key = LONG2FIX(id), .value = (VALUE) obj};
  int state = 0;
  rb_protect(protected_weak_set, (VALUE) &a, &state);
  if (state) return state;
  *out = id;
  return 0;
}

// The object a record id refers to while it is alive, else nil; *state set if the lookup raised.
static VALUE weak_get(heap_recorder *recorder, long id, int *state) {
  weak_args a = {.map = recorder->weak_objects, .key = LONG2FIX(id)};
  return rb_protect(protected_weak_get, (VALUE) &a, state);
}

static int32_t cb_lookup(void *ctx, int64_t id, bool measure, size_t *size, bool *frozen) {
  heap_recorder *recorder = ctx;
  weak_args a = {.map = recorder->weak_objects, .key = LONG2FIX(id), .measure = measure};
  int state = 0;
  rb_protect(protected_weak_get, (VALUE) &a, &state);
  if (state) return -state;
  if (NIL_P(a.value)) return LOOKUP_DEAD;
  if (measure) { *size = a.size; *frozen = a.frozen; }
  RB_GC_GUARD(a.value);
  return LOOKUP_ALIVE;
}
#define TRACKED_ID_NAME "record_id"
#define COMMITTED_STAT "lifetime_deferred_recordings_committed"

#else
// ---- object ids (2.41) ----

static VALUE protected_obj_id(VALUE obj) { return rb_obj_id(obj); }

static int32_t cb_obj_id(DDTRACE_UNUSED void *ctx, uintptr_t obj, int64_t *out) {
  int state = 0;
  VALUE id = rb_protect(protected_obj_id, (VALUE) obj, &state);
  if (state) return state;
  if (!FIXNUM_P(id)) return -1;
  *out = FIX2LONG(id);
  return 0;
}

typedef struct { long obj_id; bool measure; size_t size; bool frozen; bool alive; } lookup_args;

static VALUE protected_lookup(VALUE p) {
  lookup_args *a = (lookup_args *) p;
  VALUE ref;
  a->alive = ruby_ref_from_id(LONG2NUM(a->obj_id), &ref); // may release the GVL
  if (a->alive && a->measure) {
    a->size = ruby_obj_memsize_of(ref);
    a->frozen = RB_OBJ_FROZEN(ref);
  }
  if (a->alive) RB_GC_GUARD(ref);
  return Qnil;
}

static int32_t cb_lookup(DDTRACE_UNUSED void *ctx, int64_t obj_id, bool measure, size_t *size, bool *frozen) {
  lookup_args a = {.obj_id = obj_id, .measure = measure};
  int state = 0;
  rb_protect(protected_lookup, (VALUE) &a, &state);
  if (state) return -state;
  if (!a.alive) return LOOKUP_DEAD;
  if (measure) { *size = a.size; *frozen = a.frozen; }
  return LOOKUP_ALIVE;
}
#define TRACKED_ID_NAME "obj_id"
#define COMMITTED_STAT "lifetime_deferred_recordings_finalized"
#endif

static VALUE protected_schedule(DDTRACE_UNUSED VALUE _) { rb_thread_schedule(); return Qnil; }

static int32_t cb_thread_schedule(void) {
  int state = 0;
  rb_protect(protected_schedule, Qnil, &state);
  return state;
}

static void cb_mark(uintptr_t obj) { rb_gc_mark((VALUE) obj); }

// ---- errors ----

static void raise_failure(int code, DdheapError *err) {
  switch (code) {
    case DDHEAP_OK: return;
    case DDHEAP_RUBY_TAG: rb_jump_tag(err->tag);
    case DDHEAP_ARGUMENT_ERROR: raise_error(rb_eArgError, "%s", err->message);
    default: raise_error(rb_eRuntimeError, "%s", err->message);
  }
}

#define CALL_OR_RAISE(call) do { DdheapError err_ = {0}; raise_failure(call, &err_); } while (0)
#define ERR (&err_)

// ---- heap_recorder.h ----

heap_recorder* heap_recorder_new(ddog_prof_ManagedStringStorage string_storage) {
  if (!ddheap_layouts_match(sizeof(ddog_prof_Location), sizeof(live_object_data), sizeof(heap_recorder_iteration_data))) {
    raise_error(rb_eRuntimeError, "datadog_heap: libdatadog/heap_recorder.h struct layouts differ from the ones it was built for");
  }
  heap_recorder *recorder = ruby_xcalloc(1, sizeof(heap_recorder));
  DdheapHost host = {
    .gc_count = cb_gc_count, .now_ns = cb_now_ns, .obj_id = cb_obj_id,
    .lookup = cb_lookup, .thread_schedule = cb_thread_schedule, .ctx = recorder,
#ifdef DDHEAP_DDTRACE_WEAKMAP
    .is_internal = cb_is_internal,
#endif
  };
  recorder->inner = ddheap_new(string_storage, host);
  if (recorder->inner == NULL) {
    ruby_xfree(recorder);
    raise_error(rb_eRuntimeError, "Failed to create heap recorder");
  }
#ifdef DDHEAP_DDTRACE_WEAKMAP
  // Last, as heap_recorder.c: this allocates (a GC may run), and the caller publishes the recorder
  // (where heap_recorder_mark reaches the map) right after we return, allocating nothing between.
  recorder->weak_objects = rb_class_new_instance(0, NULL, weak_map_class);
#endif
  return recorder;
}

void heap_recorder_free(heap_recorder *recorder) {
  if (recorder == NULL) return;
  ddheap_free(recorder->inner);
  ruby_xfree(recorder);
}

void heap_recorder_set_size_enabled(heap_recorder *recorder, bool size_enabled) {
  if (recorder == NULL) return;
  ddheap_set_size_enabled(recorder->inner, size_enabled);
}

void heap_recorder_set_sample_rate(heap_recorder *recorder, int sample_rate) {
  if (recorder == NULL) return;
  CALL_OR_RAISE(ddheap_set_sample_rate(recorder->inner, sample_rate, ERR));
}

void heap_recorder_after_fork(heap_recorder *recorder) {
  if (recorder == NULL) return;
  ddheap_after_fork(recorder->inner);
}

// From the allocation sampler: no Ruby allocation, no raise, no GVL release.
bool start_heap_allocation_recording(heap_recorder *recorder, VALUE new_obj, unsigned int weight, ddog_CharSlice alloc_class) {
  if (recorder == NULL) return false;
  return ddheap_start_recording(recorder->inner, (uintptr_t) new_obj, weight, alloc_class);
}

typedef struct { DdheapError err; } end_failure;

static VALUE raise_end_failure(VALUE p) {
  end_failure *f = (end_failure *) p;
  raise_failure(f->err.kind, &f->err);
  return Qnil;
}

__attribute__((warn_unused_result))
int end_heap_allocation_recording_with_rb_protect(heap_recorder *recorder, ddog_prof_Slice_Location locations) {
  if (recorder == NULL) return 0;
  if (locations.len > MAX_FRAMES_LIMIT) {
    // heap_recorder.c raises here; turned into an exception state like its other failures
    end_failure f = {.err = {.kind = DDHEAP_RUNTIME_ERROR}};
    snprintf(f.err.message, sizeof(f.err.message), "Found stack with more than %d frames (%zu)", MAX_FRAMES_LIMIT, locations.len);
    DdheapError discard = {0};
    (void) ddheap_end_recording(recorder->inner, (ddog_prof_Slice_Location) {.ptr = NULL, .len = 0}, &discard);
    int state = 0;
    rb_protect(raise_end_failure, (VALUE) &f, &state);
    return state;
  }
  end_failure f = {0};
  int code = ddheap_end_recording(recorder->inner, locations, &f.err);
#if !defined(USE_DEFERRED_HEAP_ALLOCATION_RECORDING) && !defined(DDHEAP_DDTRACE_WEAKMAP)
  // (2.41 only: master defers every recording on every Ruby.) Datadog's extconf defines USE_DEFERRED_HEAP_ALLOCATION_RECORDING on Ruby 4+ only; below that
  // heap_recorder.c takes the object id within the sampler call, and below Ruby 3.3 (no
  // rb_postponed_job_trigger) the profiler never schedules heap_recorder_finalize_pending_recordings
  // at all. Our core always queues the recording first, so commit it here on those Rubies, in the
  // same sampler call as heap_recorder.c: otherwise nothing would leave the pending queue.
  if (code == DDHEAP_OK) code = ddheap_finalize_pending_recordings(recorder->inner, &f.err);
#endif
  if (code == DDHEAP_OK) return 0;
  int state = 0;
  rb_protect(raise_end_failure, (VALUE) &f, &state);
  return state;
}

void heap_recorder_update_young_objects(heap_recorder *recorder) {
  if (recorder == NULL) return;
  CALL_OR_RAISE(ddheap_update_young_objects(recorder->inner, ERR));
}

#ifdef DDHEAP_DDTRACE_WEAKMAP
void heap_recorder_commit_pending_recordings(heap_recorder *recorder) {
  if (recorder == NULL) return;
  CALL_OR_RAISE(ddheap_finalize_pending_recordings(recorder->inner, ERR));
}

// The objects waiting to be committed and the weak map; not the tracked objects (weakly held).
void heap_recorder_mark(heap_recorder *recorder) {
  if (recorder == NULL) return;
  ddheap_mark_pending_recordings(recorder->inner, cb_mark);
  rb_gc_mark(recorder->weak_objects);
}
#else
void heap_recorder_finalize_pending_recordings(heap_recorder *recorder) {
  if (recorder == NULL) return;
  CALL_OR_RAISE(ddheap_finalize_pending_recordings(recorder->inner, ERR));
}

void heap_recorder_mark_pending_recordings(heap_recorder *recorder) {
  if (recorder == NULL) return;
  ddheap_mark_pending_recordings(recorder->inner, cb_mark);
}
#endif

void heap_recorder_prepare_iteration(heap_recorder *recorder) {
  if (recorder == NULL) return;
  CALL_OR_RAISE(ddheap_prepare_iteration(recorder->inner, ERR));
}

void heap_recorder_finish_iteration(heap_recorder *recorder) {
  if (recorder == NULL) return;
  CALL_OR_RAISE(ddheap_finish_iteration(recorder->inner, ERR));
}

bool heap_recorder_for_each_live_object(
    heap_recorder *recorder,
    bool (*for_each_callback)(heap_recorder_iteration_data data, void* extra_arg),
    void *for_each_callback_extra_arg) {
  if (recorder == NULL) return true;
  return ddheap_for_each_live_object(recorder->inner, for_each_callback, for_each_callback_extra_arg);
}

VALUE heap_recorder_state_snapshot(heap_recorder *recorder) {
  DdheapState s = {0};
  ddheap_state(recorder->inner, &s);
  VALUE arguments[] = {
    ID2SYM(rb_intern("num_object_records")), ULONG2NUM(s.num_object_records),
    ID2SYM(rb_intern("num_heap_records")), ULONG2NUM(s.num_heap_records),
    ID2SYM(rb_intern("pending_recordings_count")), ULONG2NUM(s.pending_recordings_count),
    ID2SYM(rb_intern("last_update_objects_alive")), ULONG2NUM(s.last_update_objects_alive),
    ID2SYM(rb_intern("last_update_objects_dead")), ULONG2NUM(s.last_update_objects_dead),
    ID2SYM(rb_intern("last_update_objects_skipped")), ULONG2NUM(s.last_update_objects_skipped),
    ID2SYM(rb_intern("last_update_objects_frozen")), ULONG2NUM(s.last_update_objects_frozen),
    ID2SYM(rb_intern("lifetime_updates_successful")), ULONG2NUM(s.lifetime_updates_successful),
    ID2SYM(rb_intern("lifetime_updates_skipped_concurrent")), ULONG2NUM(s.lifetime_updates_skipped_concurrent),
    ID2SYM(rb_intern("lifetime_updates_skipped_gcgen")), ULONG2NUM(s.lifetime_updates_skipped_gcgen),
    ID2SYM(rb_intern("lifetime_updates_skipped_time")), ULONG2NUM(s.lifetime_updates_skipped_time),
    ID2SYM(rb_intern("lifetime_ewma_young_objects_alive")), DBL2NUM(s.lifetime_ewma_young_objects_alive),
    ID2SYM(rb_intern("lifetime_ewma_young_objects_dead")), DBL2NUM(s.lifetime_ewma_young_objects_dead),
    ID2SYM(rb_intern("lifetime_ewma_young_objects_skipped")), DBL2NUM(s.lifetime_ewma_young_objects_skipped),
    ID2SYM(rb_intern("lifetime_ewma_objects_alive")), DBL2NUM(s.lifetime_ewma_objects_alive),
    ID2SYM(rb_intern("lifetime_ewma_objects_dead")), DBL2NUM(s.lifetime_ewma_objects_dead),
    ID2SYM(rb_intern("lifetime_ewma_objects_skipped")), DBL2NUM(s.lifetime_ewma_objects_skipped),
    ID2SYM(rb_intern("lifetime_deferred_recordings_skipped_buffer_full")), ULONG2NUM(s.lifetime_deferred_recordings_skipped_buffer_full),
    ID2SYM(rb_intern(COMMITTED_STAT)), ULONG2NUM(s.lifetime_deferred_recordings_finalized),
  };
  VALUE hash = rb_hash_new();
  for (long unsigned int i = 0; i < VALUE_COUNT(arguments); i += 2) rb_hash_aset(hash, arguments[i], arguments[i+1]);
  return hash;
}

// ---- test-only ----

typedef struct { heap_recorder *recorder; ddog_prof_ManagedStringStorage storage; VALUE ary; } debug_ctx;

static void debug_visit(const DdheapDebugRecord *r, void *arg) {
  debug_ctx *ctx = (debug_ctx *) arg;
  VALUE line = rb_sprintf(TRACKED_ID_NAME "=%ld weight=%u size=%zu line=%d alloc_gen=%zu gen_age=%zu frozen=%d",
    (long) r->obj_id, r->data.weight, r->data.size, (int) r->top_line, r->data.alloc_gen, r->data.gen_age, r->data.is_frozen);
  rb_ary_push(ctx->ary, line);
}

VALUE heap_recorder_testonly_debug(heap_recorder *recorder) {
  if (recorder == NULL) raise_error(rb_eArgError, "heap_recorder is NULL");
  debug_ctx ctx = {.recorder = recorder, .ary = rb_ary_new()};
  ddheap_debug_records(recorder->inner, debug_visit, &ctx);
  return rb_ary_new_from_args(2,
    rb_ary_new_from_args(2, ID2SYM(rb_intern("records")), ctx.ary),
    rb_ary_new_from_args(2, ID2SYM(rb_intern("state")), heap_recorder_state_snapshot(recorder)));
}

#ifdef DDHEAP_DDTRACE_WEAKMAP
VALUE heap_recorder_testonly_is_object_recorded(heap_recorder *recorder, long record_id) {
  if (recorder == NULL) raise_error(rb_eArgError, "heap_recorder is NULL");
  return ddheap_is_object_recorded(recorder->inner, record_id) ? Qtrue : Qfalse;
}

static void collect_id(const DdheapDebugRecord *r, void *ary) { rb_ary_push((VALUE) ary, LONG2FIX(r->obj_id)); }

// A linear scan, as heap_recorder.c's: fine for the few objects tests track.
VALUE heap_recorder_testonly_record_id_for(heap_recorder *recorder, VALUE obj) {
  if (recorder == NULL) return Qnil; // heap profiling disabled: nothing tracked
  VALUE ids = rb_ary_new();
  ddheap_debug_records(recorder->inner, collect_id, (void *) ids);
  for (long i = 0; i < RARRAY_LEN(ids); i++) {
    int state = 0;
    VALUE ref = weak_get(recorder, FIX2LONG(rb_ary_entry(ids, i)), &state);
    if (state) rb_jump_tag(state);
    if (!NIL_P(ref) && ref == obj) return rb_ary_entry(ids, i);
  }
  RB_GC_GUARD(ids);
  return Qnil;
}
#else
VALUE heap_recorder_testonly_is_object_recorded(heap_recorder *recorder, VALUE obj_id) {
  if (recorder == NULL) raise_error(rb_eArgError, "heap_recorder is NULL");
  return ddheap_is_object_recorded(recorder->inner, FIX2LONG(obj_id)) ? Qtrue : Qfalse;
}
#endif

void heap_recorder_testonly_reset_last_update(heap_recorder *recorder) {
  if (recorder == NULL) raise_error(rb_eArgError, "heap_recorder is NULL");
  ddheap_reset_last_update(recorder->inner);
}

void heap_recorder_testonly_benchmark_intern(heap_recorder *recorder, ddog_CharSlice string, int times, bool use_all) {
  if (recorder == NULL) raise_error(rb_eArgError, "heap profiling must be enabled");
  if (times > 2 * MAX_FRAMES_LIMIT) raise_error(rb_eArgError, "times cannot be > than REUSABLE_FRAME_DETAILS_SIZE");
  CALL_OR_RAISE(ddheap_benchmark_intern(recorder->inner, string, times, use_all, ERR));
}
