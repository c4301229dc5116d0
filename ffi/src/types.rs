//! `#[repr(C)]` mirrors of the libdatadog FFI types that cross heap_recorder.h (libdatadog v40's
//! `datadog/common.h` and `datadog/profiling.h`), plus the two structs heap_recorder.h defines.
//! The layouts are libdatadog's own; the shim's `_Static_assert`s check them against its header.

use std::ffi::{c_char, c_void};

/// `ddog_CharSlice`: borrowed bytes, not NUL-terminated.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct CharSlice {
    pub ptr: *const c_char,
    pub len: usize,
}

impl CharSlice {
    pub const EMPTY: CharSlice = CharSlice {
        ptr: c"".as_ptr(),
        len: 0,
    };

    /// The bytes, empty for a null pointer.
    ///
    /// # Safety
    /// `ptr` must point at `len` readable bytes that outlive the returned slice.
    pub unsafe fn bytes<'a>(self) -> &'a [u8] {
        if self.ptr.is_null() || self.len == 0 {
            return &[];
        }
        // SAFETY: the caller vouches for ptr/len (see above); null and empty were handled.
        unsafe { std::slice::from_raw_parts(self.ptr.cast(), self.len) }
    }
}

/// `ddog_prof_ManagedStringId`: 0 is the empty string.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct ManagedStringId {
    pub value: u32,
}

/// `ddog_prof_ManagedStringStorage`: the profiler's handle, used as it is.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ManagedStringStorage {
    pub inner: *const c_void,
}

/// `ddog_prof_Mapping`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct Mapping {
    pub memory_start: u64,
    pub memory_limit: u64,
    pub file_offset: u64,
    pub filename: CharSlice,
    pub filename_id: ManagedStringId,
    pub build_id: CharSlice,
    pub build_id_id: ManagedStringId,
}

/// `ddog_prof_Function`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct Function {
    pub name: CharSlice,
    pub name_id: ManagedStringId,
    pub system_name: CharSlice,
    pub system_name_id: ManagedStringId,
    pub filename: CharSlice,
    pub filename_id: ManagedStringId,
}

/// `ddog_prof_Location`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct Location {
    pub mapping: Mapping,
    pub function: Function,
    pub address: u64,
    pub line: i64,
}

impl Location {
    /// A location naming its function and file by ids, as heap_recorder.c hands them out.
    pub fn by_ids(name: ManagedStringId, filename: ManagedStringId, line: i32) -> Self {
        let e = CharSlice::EMPTY;
        let none = ManagedStringId::default();
        Location {
            mapping: Mapping {
                memory_start: 0,
                memory_limit: 0,
                file_offset: 0,
                filename: e,
                filename_id: none,
                build_id: e,
                build_id_id: none,
            },
            function: Function {
                name: e,
                name_id: name,
                system_name: e,
                system_name_id: none,
                filename: e,
                filename_id: filename,
            },
            address: 0,
            line: i64::from(line),
        }
    }
}

/// `ddog_prof_Slice_Location`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct SliceLocation {
    pub ptr: *const Location,
    pub len: usize,
}

/// heap_recorder.h's `live_object_data`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LiveObjectData {
    pub weight: u32,
    pub size: usize,
    pub class: ManagedStringId,
    pub alloc_gen: usize,
    pub gen_age: usize,
    pub is_frozen: bool,
}

/// heap_recorder.h's `heap_recorder_iteration_data`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct IterationData {
    pub locations: SliceLocation,
    pub object_data: LiveObjectData,
}

/// What a VM liveness lookup answers (`DdheapHost::lookup`).
pub const LOOKUP_DEAD: i32 = 0;
pub const LOOKUP_ALIVE: i32 = 1;

/// The Ruby VM as the shim exposes it. Every callback runs under the GVL, never raises or
/// longjmps through Rust (the shim wraps raising calls in `rb_protect` and returns the state),
/// and `obj_id`/`lookup`/`thread_schedule` may let other Ruby threads run.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct DdheapHost {
    /// `rb_gc_count()`.
    pub gc_count: extern "C" fn() -> usize,
    /// Monotonic wall clock in ns, 0 or less when unavailable.
    pub now_ns: extern "C" fn() -> i64,
    /// Writes to `out` the id `obj` is tracked by from now on, when its recording is committed:
    /// `rb_obj_id(obj)` for datadog 2.41, a fresh record id (a weak map entry now refers to `obj`)
    /// from 2.42. Returns 0, -1 when no Fixnum id can be had (a bignum object id, or record ids
    /// exhausted), or a positive rb_protect state.
    pub obj_id: extern "C" fn(ctx: *mut c_void, obj: usize, out: *mut i64) -> i32,
    /// Looks up an id that `obj_id` handed out: `LOOKUP_DEAD`, `LOOKUP_ALIVE` (writing size when
    /// `measure`, and frozenness), or a negated rb_protect state.
    pub lookup: extern "C" fn(
        ctx: *mut c_void,
        obj_id: i64,
        measure: bool,
        size: *mut usize,
        frozen: *mut bool,
    ) -> i32,
    /// `rb_thread_schedule()`; returns 0 or an rb_protect state.
    pub thread_schedule: extern "C" fn() -> i32,
    /// Whether `obj` is a VM-internal object, never to be tracked (`rb_objspace_internal_object_p`,
    /// datadog 2.42 and later); null to track every sampled object (2.41). Called from the
    /// allocation sampler: must not allocate, raise or release the GVL.
    pub is_internal: Option<extern "C" fn(obj: usize) -> bool>,
    /// Passed as is to `obj_id` and `lookup`: the shim's own state for this recorder (its weak
    /// map, from 2.42).
    pub ctx: *mut c_void,
}
