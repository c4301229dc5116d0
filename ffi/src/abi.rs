//! The `ddheap_*` functions `c/heap_recorder_shim.c` calls; cbindgen turns them into
//! `include/datadog_heap_cabi.h`. All take the GVL unless said otherwise.
//!
//! Pointer arguments come from C: each function states what it expects of them, and the shim is
//! the only caller. Marking them `unsafe extern "C"` would change nothing for a C caller.
#![allow(clippy::not_unsafe_ptr_arg_deref)]

use std::ffi::{c_char, c_void};
use std::panic::{catch_unwind, AssertUnwindSafe};

use crate::ddog::DdogStrings;
use crate::heap_recorder_port::{Failure, HeapRecorder, LastUpdate, Lifetime};
use crate::types::{
    CharSlice, DdheapHost, IterationData, LiveObjectData, ManagedStringStorage, SliceLocation,
};

/// The recorder behind heap_recorder.h's opaque `heap_recorder`.
pub struct DdheapRecorder(HeapRecorder<DdogStrings>);

pub const DDHEAP_OK: i32 = 0;
pub const DDHEAP_RUNTIME_ERROR: i32 = 1;
pub const DDHEAP_ARGUMENT_ERROR: i32 = 2;
/// A Ruby exception from a VM callback: re-raise `tag` with rb_jump_tag.
pub const DDHEAP_RUBY_TAG: i32 = 3;

/// What went wrong, for the shim to raise: `kind` is a `DDHEAP_*` code.
#[repr(C)]
pub struct DdheapError {
    pub kind: i32,
    pub tag: i32,
    /// NUL-terminated, truncated to fit.
    pub message: [c_char; 256],
}

/// `heap_recorder_state_snapshot`'s numbers.
#[repr(C)]
pub struct DdheapState {
    pub num_object_records: usize,
    pub num_heap_records: usize,
    pub pending_recordings_count: usize,
    pub last_update_objects_alive: usize,
    pub last_update_objects_dead: usize,
    pub last_update_objects_skipped: usize,
    pub last_update_objects_frozen: usize,
    pub lifetime_updates_successful: u64,
    pub lifetime_updates_skipped_concurrent: u64,
    pub lifetime_updates_skipped_gcgen: u64,
    pub lifetime_updates_skipped_time: u64,
    pub lifetime_ewma_young_objects_alive: f64,
    pub lifetime_ewma_young_objects_dead: f64,
    pub lifetime_ewma_young_objects_skipped: f64,
    pub lifetime_ewma_objects_alive: f64,
    pub lifetime_ewma_objects_dead: f64,
    pub lifetime_ewma_objects_skipped: f64,
    pub lifetime_deferred_recordings_skipped_buffer_full: u64,
    pub lifetime_deferred_recordings_finalized: u64,
    pub lifetime_recordings_dropped: u64,
}

/// One object record for the debug dump.
#[repr(C)]
pub struct DdheapDebugRecord {
    pub obj_id: i64,
    pub top_filename: crate::types::ManagedStringId,
    pub top_line: i32,
    pub data: LiveObjectData,
}

fn report(err: *mut DdheapError, failure: Failure) -> i32 {
    let (kind, tag, text) = match failure {
        Failure::Runtime(m) => (DDHEAP_RUNTIME_ERROR, 0, m),
        Failure::Argument(m) => (DDHEAP_ARGUMENT_ERROR, 0, m),
        Failure::RubyTag(t) => (DDHEAP_RUBY_TAG, t, String::new()),
    };
    if !err.is_null() {
        // SAFETY: the shim passes a pointer to its own DdheapError on the stack (or null).
        let e = unsafe { &mut *err };
        e.kind = kind;
        e.tag = tag;
        let n = text.len().min(e.message.len() - 1);
        for (dst, src) in e.message.iter_mut().zip(text.as_bytes()[..n].iter()) {
            *dst = *src as c_char;
        }
        e.message[n] = 0;
    }
    kind
}

/// Runs `f` with panics caught; a panic is reported as a RuntimeError.
fn guarded(err: *mut DdheapError, f: impl FnOnce() -> Result<(), Failure>) -> i32 {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(())) => DDHEAP_OK,
        Ok(Err(failure)) => report(err, failure),
        Err(_) => report(
            err,
            Failure::Runtime("datadog_heap: internal error (panic caught)".into()),
        ),
    }
}

fn rec<'a>(r: *const DdheapRecorder) -> Option<&'a HeapRecorder<DdogStrings>> {
    // SAFETY: the shim only passes pointers ddheap_new returned and ddheap_free has not freed.
    unsafe { r.as_ref() }.map(|r| &r.0)
}

/// Creates a recorder interning into the profiler's `string_storage`. Null on failure.
#[no_mangle]
pub extern "C" fn ddheap_new(
    string_storage: ManagedStringStorage,
    host: DdheapHost,
) -> *mut DdheapRecorder {
    catch_unwind(|| {
        Box::into_raw(Box::new(DdheapRecorder(HeapRecorder::new(
            host,
            DdogStrings(string_storage),
        ))))
    })
    .unwrap_or(std::ptr::null_mut())
}

/// Frees a recorder without uninterning (the profiler drops its whole storage right after).
/// Safe in a dfree: never raises.
#[no_mangle]
pub extern "C" fn ddheap_free(recorder: *mut DdheapRecorder) {
    if recorder.is_null() {
        return;
    }
    let _ = catch_unwind(AssertUnwindSafe(|| {
        // SAFETY: ddheap_new made it with Box::into_raw; the shim frees it once.
        drop(unsafe { Box::from_raw(recorder) });
    }));
}

#[no_mangle]
pub extern "C" fn ddheap_set_size_enabled(recorder: *const DdheapRecorder, enabled: bool) {
    let _ = catch_unwind(AssertUnwindSafe(|| {
        rec(recorder).map(|r| r.set_size_enabled(enabled))
    }));
}

#[no_mangle]
pub extern "C" fn ddheap_set_sample_rate(
    recorder: *const DdheapRecorder,
    rate: i32,
    err: *mut DdheapError,
) -> i32 {
    guarded(err, || {
        rec(recorder).map_or(Ok(()), |r| r.set_sample_rate(rate))
    })
}

#[no_mangle]
pub extern "C" fn ddheap_after_fork(recorder: *const DdheapRecorder) {
    let _ = catch_unwind(AssertUnwindSafe(|| rec(recorder).map(|r| r.after_fork())));
}

/// From the allocation sampler: no Ruby allocation, no raise, no GVL release. Returns
/// needs_after_allocation.
#[no_mangle]
pub extern "C" fn ddheap_start_recording(
    recorder: *const DdheapRecorder,
    new_obj: usize,
    weight: u32,
    alloc_class: CharSlice,
) -> bool {
    catch_unwind(AssertUnwindSafe(|| {
        rec(recorder).is_some_and(|r| r.start_recording(new_obj, weight, alloc_class))
    }))
    .unwrap_or(false)
}

/// From the allocation sampler, after start: no Ruby allocation, no GVL release; failures come
/// back in `err` for the shim to turn into an rb_protect state.
#[no_mangle]
pub extern "C" fn ddheap_end_recording(
    recorder: *const DdheapRecorder,
    locations: SliceLocation,
    err: *mut DdheapError,
) -> i32 {
    guarded(err, || {
        let Some(r) = rec(recorder) else {
            return Ok(());
        };
        let locs = if locations.ptr.is_null() || locations.len == 0 {
            &[][..]
        } else {
            // SAFETY: the profiler hands `len` valid locations for the duration of the call.
            unsafe { std::slice::from_raw_parts(locations.ptr, locations.len) }
        };
        r.end_recording(locs)
    })
}

#[no_mangle]
pub extern "C" fn ddheap_update_young_objects(
    recorder: *const DdheapRecorder,
    err: *mut DdheapError,
) -> i32 {
    guarded(err, || {
        rec(recorder).map_or(Ok(()), |r| r.update_young_objects())
    })
}

#[no_mangle]
pub extern "C" fn ddheap_finalize_pending_recordings(
    recorder: *const DdheapRecorder,
    err: *mut DdheapError,
) -> i32 {
    guarded(err, || {
        rec(recorder).map_or(Ok(()), |r| r.finalize_pending_recordings())
    })
}

/// From the profiler's GC mark function: calls `mark(obj)` for each object waiting for its id.
/// Never allocates, never raises.
#[no_mangle]
pub extern "C" fn ddheap_mark_pending_recordings(
    recorder: *const DdheapRecorder,
    mark: extern "C" fn(usize),
) {
    let _ = catch_unwind(AssertUnwindSafe(|| {
        rec(recorder).map(|r| r.for_each_pending_object(|o| mark(o)))
    }));
}

#[no_mangle]
pub extern "C" fn ddheap_prepare_iteration(
    recorder: *const DdheapRecorder,
    err: *mut DdheapError,
) -> i32 {
    guarded(err, || {
        rec(recorder).map_or(Ok(()), |r| r.prepare_iteration())
    })
}

#[no_mangle]
pub extern "C" fn ddheap_finish_iteration(
    recorder: *const DdheapRecorder,
    err: *mut DdheapError,
) -> i32 {
    guarded(err, || {
        rec(recorder).map_or(Ok(()), |r| r.finish_iteration())
    })
}

/// Without the GVL: walks the snapshot prepare took. Returns false when none was prepared.
#[no_mangle]
pub extern "C" fn ddheap_for_each_live_object(
    recorder: *const DdheapRecorder,
    callback: extern "C" fn(IterationData, *mut c_void) -> bool,
    extra_arg: *mut c_void,
) -> bool {
    catch_unwind(AssertUnwindSafe(|| match rec(recorder) {
        None => true,
        // SAFETY: heap_recorder.h's contract: called between prepare and finish, by one thread.
        Some(r) => unsafe { r.for_each_live_object(|d| callback(d, extra_arg)) },
    }))
    .unwrap_or(false)
}

#[no_mangle]
pub extern "C" fn ddheap_state(recorder: *const DdheapRecorder, out: *mut DdheapState) {
    let _ = catch_unwind(AssertUnwindSafe(|| {
        let (Some(r), false) = (rec(recorder), out.is_null()) else {
            return;
        };
        let s = r.state_snapshot();
        let (lu, l): (LastUpdate, Lifetime) = (s.last_update, s.lifetime);
        // SAFETY: the shim passes its own DdheapState.
        unsafe {
            *out = DdheapState {
                num_object_records: s.num_object_records,
                num_heap_records: s.num_heap_records,
                pending_recordings_count: s.pending_recordings_count,
                last_update_objects_alive: lu.objects_alive,
                last_update_objects_dead: lu.objects_dead,
                last_update_objects_skipped: lu.objects_skipped,
                last_update_objects_frozen: lu.objects_frozen,
                lifetime_updates_successful: l.updates_successful,
                lifetime_updates_skipped_concurrent: l.updates_skipped_concurrent,
                lifetime_updates_skipped_gcgen: l.updates_skipped_gcgen,
                lifetime_updates_skipped_time: l.updates_skipped_time,
                lifetime_ewma_young_objects_alive: l.ewma_young_objects_alive,
                lifetime_ewma_young_objects_dead: l.ewma_young_objects_dead,
                lifetime_ewma_young_objects_skipped: l.ewma_young_objects_skipped,
                lifetime_ewma_objects_alive: l.ewma_objects_alive,
                lifetime_ewma_objects_dead: l.ewma_objects_dead,
                lifetime_ewma_objects_skipped: l.ewma_objects_skipped,
                lifetime_deferred_recordings_skipped_buffer_full: l
                    .deferred_recordings_skipped_buffer_full,
                lifetime_deferred_recordings_finalized: l.deferred_recordings_finalized,
                lifetime_recordings_dropped: l.recordings_dropped,
            }
        }
    }));
}

/// Calls `visit(record, arg)` for each object record (the debug dump). `visit` may allocate Ruby
/// objects but must not raise.
#[no_mangle]
pub extern "C" fn ddheap_debug_records(
    recorder: *const DdheapRecorder,
    visit: extern "C" fn(*const DdheapDebugRecord, *mut c_void),
    arg: *mut c_void,
) {
    let _ = catch_unwind(AssertUnwindSafe(|| {
        let Some(r) = rec(recorder) else { return };
        for (obj_id, top, data) in r.debug_records() {
            let d = DdheapDebugRecord {
                obj_id,
                top_filename: top.map(|f| f.filename).unwrap_or_default(),
                top_line: top.map_or(0, |f| f.line),
                data,
            };
            visit(&d, arg);
        }
    }));
}

#[no_mangle]
pub extern "C" fn ddheap_is_object_recorded(recorder: *const DdheapRecorder, obj_id: i64) -> bool {
    catch_unwind(AssertUnwindSafe(|| {
        rec(recorder).is_some_and(|r| r.is_object_recorded(obj_id))
    }))
    .unwrap_or(false)
}

#[no_mangle]
pub extern "C" fn ddheap_reset_last_update(recorder: *const DdheapRecorder) {
    let _ = catch_unwind(AssertUnwindSafe(|| {
        rec(recorder).map(|r| r.reset_last_update())
    }));
}

#[no_mangle]
pub extern "C" fn ddheap_benchmark_intern(
    recorder: *const DdheapRecorder,
    string: CharSlice,
    times: i32,
    use_all: bool,
    err: *mut DdheapError,
) -> i32 {
    guarded(err, || {
        rec(recorder).map_or(Ok(()), |r| {
            r.benchmark_intern(string, times.max(0) as usize, use_all)
        })
    })
}

/// Whether the C side's struct sizes are the ones this library was built for (the shim checks
/// before creating a recorder, so a libdatadog with another layout fails loudly, not silently).
#[no_mangle]
pub extern "C" fn ddheap_layouts_match(
    location: usize,
    live_object_data: usize,
    iteration_data: usize,
) -> bool {
    use std::mem::size_of;
    location == size_of::<crate::types::Location>()
        && live_object_data == size_of::<LiveObjectData>()
        && iteration_data == size_of::<IterationData>()
}
