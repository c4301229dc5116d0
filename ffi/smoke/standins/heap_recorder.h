// Stand-in for the heap_recorder.h of Datadog's profiling extension, both generations the shim
// implements (see ffi/c/heap_recorder_shim.c): the record-id one of dd-trace-rb master when
// DDHEAP_DDTRACE_WEAKMAP is defined, else datadog 2.41's object-id one. Written from the shim's own
// definitions, so that the smoke driver builds from this repository alone; the shim's static
// assertions check that the generation matches.
#ifndef DDHEAP_STANDIN_HEAP_RECORDER_H
#define DDHEAP_STANDIN_HEAP_RECORDER_H

#include <ruby.h>
#include <stdbool.h>
#include <datadog/profiling.h>

typedef struct heap_recorder heap_recorder;

typedef struct live_object_data {
  unsigned int weight;
  size_t size;
  ddog_prof_ManagedStringId class;
  size_t alloc_gen;
  size_t gen_age;
  bool is_frozen;
} live_object_data;

typedef struct heap_recorder_iteration_data {
  ddog_prof_Slice_Location locations;
  live_object_data object_data;
} heap_recorder_iteration_data;

heap_recorder* heap_recorder_new(ddog_prof_ManagedStringStorage string_storage);
void heap_recorder_free(heap_recorder *heap_recorder);
void heap_recorder_set_size_enabled(heap_recorder *heap_recorder, bool size_enabled);
void heap_recorder_set_sample_rate(heap_recorder *heap_recorder, int sample_rate);
void heap_recorder_after_fork(heap_recorder *heap_recorder);
bool start_heap_allocation_recording(heap_recorder *heap_recorder, VALUE new_obj, unsigned int weight, ddog_CharSlice alloc_class);
__attribute__((warn_unused_result))
int end_heap_allocation_recording_with_rb_protect(heap_recorder *heap_recorder, ddog_prof_Slice_Location locations);
void heap_recorder_update_young_objects(heap_recorder *heap_recorder);
void heap_recorder_prepare_iteration(heap_recorder *heap_recorder);
void heap_recorder_finish_iteration(heap_recorder *heap_recorder);
bool heap_recorder_for_each_live_object(
  heap_recorder *heap_recorder,
  bool (*for_each_callback)(heap_recorder_iteration_data data, void* extra_arg),
  void *for_each_callback_extra_arg);
VALUE heap_recorder_state_snapshot(heap_recorder *heap_recorder);
VALUE heap_recorder_testonly_debug(heap_recorder *heap_recorder);
void heap_recorder_testonly_reset_last_update(heap_recorder *heap_recorder);
void heap_recorder_testonly_benchmark_intern(heap_recorder *heap_recorder, ddog_CharSlice string, int times, bool use_all);

#ifdef DDHEAP_DDTRACE_WEAKMAP
void collectors_heap_recorder_init(void);
void heap_recorder_commit_pending_recordings(heap_recorder *heap_recorder);
void heap_recorder_mark(heap_recorder *heap_recorder);
VALUE heap_recorder_testonly_is_object_recorded(heap_recorder *heap_recorder, long record_id);
VALUE heap_recorder_testonly_record_id_for(heap_recorder *heap_recorder, VALUE obj);
#else
void heap_recorder_finalize_pending_recordings(heap_recorder *heap_recorder);
void heap_recorder_mark_pending_recordings(heap_recorder *heap_recorder);
VALUE heap_recorder_testonly_is_object_recorded(heap_recorder *heap_recorder, VALUE obj_id);
#endif

#endif
