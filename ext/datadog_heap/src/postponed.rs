//! The commit job: pending recordings reach the WeakMap from a postponed job, which the VM runs
//! at its next safe point (never inside the allocation hook, where WeakMap writes are forbidden).
//!
//! One job serves every recorder: it commits each live recorder that has something pending.
//! Ruby >= 3.3 preregisters the job once and triggers it by handle; older Rubies register it
//! by function each time (the VM dedups). Either way `request_commit` is safe inside NEWOBJ:
//! no allocation, no raise, no GVL release.

use std::ffi::c_void;
use std::panic::{catch_unwind, AssertUnwindSafe};

use crate::recorder::Recorder;
use crate::registry;

#[cfg(ruby_gte_3_3)]
static JOB_HANDLE: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(u32::MAX);
#[cfg(ruby_gte_3_3)]
static UPDATE_JOB_HANDLE: std::sync::atomic::AtomicU32 =
    std::sync::atomic::AtomicU32::new(u32::MAX);

/// Registers the job with the VM (Ruby >= 3.3). Needs the GVL; call once at load.
pub fn init() {
    #[cfg(ruby_gte_3_3)]
    {
        // SAFETY: called at extension load with the GVL; `commit_job` is a valid callback for the
        // life of the process (the extension is never unloaded).
        let handle = unsafe {
            rb_sys::rb_postponed_job_preregister(0, Some(commit_job), std::ptr::null_mut())
        };
        JOB_HANDLE.store(handle, std::sync::atomic::Ordering::Relaxed);
        // SAFETY: as above.
        let handle = unsafe {
            rb_sys::rb_postponed_job_preregister(0, Some(young_update_job), std::ptr::null_mut())
        };
        UPDATE_JOB_HANDLE.store(handle, std::sync::atomic::Ordering::Relaxed);
    }
}

/// Asks the VM to run the commit job soon. Async-signal-safe; fine inside the NEWOBJ hook.
pub fn request_commit() {
    #[cfg(ruby_gte_3_3)]
    trigger(&JOB_HANDLE);
    #[cfg(not(ruby_gte_3_3))]
    register(commit_job);
}

/// Asks the VM to run the young-update job soon (after a GC). Async-signal-safe.
pub fn request_young_update() {
    #[cfg(ruby_gte_3_3)]
    trigger(&UPDATE_JOB_HANDLE);
    #[cfg(not(ruby_gte_3_3))]
    register(young_update_job);
}

#[cfg(ruby_gte_3_3)]
fn trigger(handle: &std::sync::atomic::AtomicU32) {
    let handle = handle.load(std::sync::atomic::Ordering::Relaxed);
    if handle != u32::MAX {
        // SAFETY: `handle` came from rb_postponed_job_preregister; triggering is documented as
        // safe from any context.
        unsafe { rb_sys::rb_postponed_job_trigger(handle) };
    }
}

#[cfg(not(ruby_gte_3_3))]
fn register(job: extern "C" fn(*mut c_void)) {
    // SAFETY: rb_postponed_job_register_one only appends to a preallocated buffer (or reports it
    // full); it is meant for signal handlers and hooks. A full buffer drops this request; the next
    // sample or GC asks again.
    unsafe {
        rb_sys::rb_postponed_job_register_one(0, Some(job), std::ptr::null_mut());
    }
}

/// The job: runs with the GVL at a safe point. Must not raise (it would surface in whatever
/// Ruby code was interrupted), so errors are kept on the recorder and reported later.
extern "C" fn commit_job(_data: *mut c_void) {
    // A panic here must not unwind into the VM; there is nowhere to report it but the recorder,
    // which `commit_pending_from_job` does itself, so a panic escaping it is just dropped.
    let _ = catch_unwind(AssertUnwindSafe(|| {
        let mut done: Vec<usize> = Vec::new();
        // Look each recorder up afresh: a commit may let the VM run a GC that frees another one.
        // SAFETY: we are in a postponed job, so we hold the GVL.
        while let Some(recorder) = unsafe { registry::next_needing_commit(&done) } {
            done.push(recorder as usize);
            // SAFETY: the pointer came from the registry just now, so its recorder is alive;
            // `keep_alive_while` pins its Ruby object on our stack for the duration.
            let recorder: &Recorder = unsafe { &*recorder };
            recorder.commit_pending_from_job();
        }
    }));
}

/// The young-update job: runs the gated young update on every running recorder. Never raises.
extern "C" fn young_update_job(_data: *mut c_void) {
    let _ = catch_unwind(AssertUnwindSafe(|| {
        let mut done: Vec<usize> = Vec::new();
        // SAFETY: we are in a postponed job, so we hold the GVL; see `commit_job`.
        while let Some(recorder) = unsafe { registry::next_running(&done) } {
            done.push(recorder as usize);
            // SAFETY: fresh from the registry; the recorder pins itself during the update.
            let recorder: &Recorder = unsafe { &*recorder };
            recorder.young_update_from_job();
        }
    }));
}
