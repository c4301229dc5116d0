// Stand-in for the part of libdatadog v40's datadog/common.h and datadog/profiling.h that the shim
// and the smoke driver use, written from our own mirrors of those types (ffi/src/types.rs and
// ffi/src/ddog.rs), so that the driver builds from this repository alone. The shim checks the
// sizes against the library at run time (ddheap_layouts_match).
#ifndef DDHEAP_STANDIN_DATADOG_PROFILING_H
#define DDHEAP_STANDIN_DATADOG_PROFILING_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct ddog_CharSlice { const char *ptr; uintptr_t len; } ddog_CharSlice;
typedef struct ddog_prof_Slice_CharSlice { const ddog_CharSlice *ptr; uintptr_t len; } ddog_prof_Slice_CharSlice;

typedef struct ddog_prof_ManagedStringId { uint32_t value; } ddog_prof_ManagedStringId;
typedef struct ddog_prof_Slice_ManagedStringId { const ddog_prof_ManagedStringId *ptr; uintptr_t len; } ddog_prof_Slice_ManagedStringId;
typedef struct ddog_prof_ManagedStringStorage { const void *inner; } ddog_prof_ManagedStringStorage;

typedef struct ddog_prof_Mapping {
  uint64_t memory_start;
  uint64_t memory_limit;
  uint64_t file_offset;
  ddog_CharSlice filename;
  ddog_prof_ManagedStringId filename_id;
  ddog_CharSlice build_id;
  ddog_prof_ManagedStringId build_id_id;
} ddog_prof_Mapping;

typedef struct ddog_prof_Function {
  ddog_CharSlice name;
  ddog_prof_ManagedStringId name_id;
  ddog_CharSlice system_name;
  ddog_prof_ManagedStringId system_name_id;
  ddog_CharSlice filename;
  ddog_prof_ManagedStringId filename_id;
} ddog_prof_Function;

typedef struct ddog_prof_Location {
  ddog_prof_Mapping mapping;
  ddog_prof_Function function;
  uint64_t address;
  int64_t line;
} ddog_prof_Location;

typedef struct ddog_prof_Slice_Location { const ddog_prof_Location *ptr; uintptr_t len; } ddog_prof_Slice_Location;

typedef struct ddog_Vec_U8 { const uint8_t *ptr; uintptr_t len; uintptr_t capacity; } ddog_Vec_U8;
typedef struct ddog_Error { ddog_Vec_U8 message; } ddog_Error;

typedef enum ddog_prof_Option_Error_Tag {
  DDOG_PROF_OPTION_ERROR_SOME_ERROR,
  DDOG_PROF_OPTION_ERROR_NONE_ERROR,
} ddog_prof_Option_Error_Tag;

typedef struct ddog_prof_Option_Error {
  ddog_prof_Option_Error_Tag tag;
  union { struct { ddog_Error some; }; };
} ddog_prof_Option_Error;

typedef ddog_prof_Option_Error ddog_prof_MaybeError;

typedef enum ddog_prof_ManagedStringStorageInternResult_Tag {
  DDOG_PROF_MANAGED_STRING_STORAGE_INTERN_RESULT_OK,
  DDOG_PROF_MANAGED_STRING_STORAGE_INTERN_RESULT_ERR,
} ddog_prof_ManagedStringStorageInternResult_Tag;

typedef struct ddog_prof_ManagedStringStorageInternResult {
  ddog_prof_ManagedStringStorageInternResult_Tag tag;
  union {
    struct { ddog_prof_ManagedStringId ok; };
    struct { ddog_Error err; };
  };
} ddog_prof_ManagedStringStorageInternResult;

ddog_prof_ManagedStringStorageInternResult ddog_prof_ManagedStringStorage_intern(ddog_prof_ManagedStringStorage storage, ddog_CharSlice string);
ddog_prof_MaybeError ddog_prof_ManagedStringStorage_intern_all(ddog_prof_ManagedStringStorage storage, ddog_prof_Slice_CharSlice strings, ddog_prof_ManagedStringId *output_ids, uintptr_t output_ids_size);
ddog_prof_MaybeError ddog_prof_ManagedStringStorage_unintern_all(ddog_prof_ManagedStringStorage storage, ddog_prof_Slice_ManagedStringId ids);
ddog_prof_MaybeError ddog_prof_ManagedStringStorage_unintern(ddog_prof_ManagedStringStorage storage, ddog_prof_ManagedStringId id);
void ddog_Error_drop(ddog_Error *error);

#endif
