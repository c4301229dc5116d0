//! The profiler's own string storage, through libdatadog's FFI (`datadog/profiling.h`, v40).
//! The symbols resolve when the profiling extension links libdatadog.

use crate::heap_recorder_port::{Failure, Outcome, StringTable};
use crate::types::{CharSlice, ManagedStringId, ManagedStringStorage};

#[repr(C)]
struct FfiVecU8 {
    ptr: *const u8,
    len: usize,
    capacity: usize,
}

#[repr(C)]
struct FfiError {
    message: FfiVecU8,
}

#[repr(C)]
#[allow(dead_code)]
enum MaybeError {
    Some(FfiError),
    None,
}

#[repr(C)]
#[allow(dead_code)]
enum InternResult {
    Ok(ManagedStringId),
    Err(FfiError),
}

#[repr(C)]
struct SliceCharSlice {
    ptr: *const CharSlice,
    len: usize,
}

#[repr(C)]
struct SliceId {
    ptr: *const ManagedStringId,
    len: usize,
}

extern "C" {
    fn ddog_prof_ManagedStringStorage_intern(
        s: ManagedStringStorage,
        string: CharSlice,
    ) -> InternResult;
    fn ddog_prof_ManagedStringStorage_intern_all(
        s: ManagedStringStorage,
        strings: SliceCharSlice,
        output_ids: *mut ManagedStringId,
        output_ids_size: usize,
    ) -> MaybeError;
    fn ddog_prof_ManagedStringStorage_unintern_all(
        s: ManagedStringStorage,
        ids: SliceId,
    ) -> MaybeError;
    fn ddog_Error_drop(error: *mut FfiError);
}

fn failure(what: &str, mut e: FfiError) -> Failure {
    // SAFETY: libdatadog's Error holds a UTF-8 String in `message` (ptr/len valid until dropped).
    let text = unsafe {
        if e.message.ptr.is_null() {
            String::new()
        } else {
            String::from_utf8_lossy(std::slice::from_raw_parts(e.message.ptr, e.message.len))
                .into_owned()
        }
    };
    // SAFETY: `e` came from libdatadog and is dropped once, here.
    unsafe { ddog_Error_drop(&mut e) };
    Failure::Runtime(format!("{what}: {text}"))
}

/// The profiler's storage handle, used as it is (never dropped by us: the profiler owns it).
pub struct DdogStrings(pub ManagedStringStorage);

impl StringTable for DdogStrings {
    fn intern(&self, s: CharSlice) -> Outcome<ManagedStringId> {
        // SAFETY: the handle is the profiler's live storage; `s` is valid for the call.
        match unsafe { ddog_prof_ManagedStringStorage_intern(self.0, s) } {
            InternResult::Ok(id) => Ok(id),
            InternResult::Err(e) => Err(failure("Failed to intern string", e)),
        }
    }

    fn intern_all(&self, s: &[CharSlice], out: &mut [ManagedStringId]) -> Outcome<()> {
        let slice = SliceCharSlice {
            ptr: s.as_ptr(),
            len: s.len(),
        };
        // SAFETY: `out` has room for `out.len()` ids and libdatadog checks it equals `s.len()`.
        match unsafe {
            ddog_prof_ManagedStringStorage_intern_all(self.0, slice, out.as_mut_ptr(), out.len())
        } {
            MaybeError::None => Ok(()),
            MaybeError::Some(e) => Err(failure("Failed to intern_all", e)),
        }
    }

    fn unintern_all(&self, ids: &[ManagedStringId]) -> Outcome<()> {
        if ids.is_empty() {
            return Ok(());
        }
        let slice = SliceId {
            ptr: ids.as_ptr(),
            len: ids.len(),
        };
        // SAFETY: the slice is valid for the call; the handle is the profiler's live storage.
        match unsafe { ddog_prof_ManagedStringStorage_unintern_all(self.0, slice) } {
            MaybeError::None => Ok(()),
            MaybeError::Some(e) => Err(failure("Failed to unintern_all", e)),
        }
    }
}
