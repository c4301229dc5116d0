//! The postponed jobs: the commit job (pending recordings reach their WeakMaps), the young
//! update job (after GCs) and the window job (the window timer's tick, which `windows` hands to
//! `init`, so this module does not depend on the timer that depends on it). The VM runs them at
//! its next safe point, never inside the allocation hook, where WeakMap writes are forbidden.
//!
//! Ruby >= 3.3 preregisters each job once and triggers it by handle; older Rubies register it by
//! function each time (the VM dedups). Either way the request functions are safe inside NEWOBJ
//! and from a signal handler: no allocation, no raise, no GVL release. Which API is used follows
//! what the Ruby headers declare (build.rs: `dh_postponed_job_preregister`, the same Rubies as
//! `ruby_gte_3_3`), so a Ruby that removed `rb_postponed_job_register_one` (4.1) never links it.
//!
//! A job may run with nothing to do: the VM coalesces triggers and flushes the job table highest
//! handle first, so a job triggered again while another runs (a GC inside the commit job asks for
//! a young update) can run twice in one flush, the second time after the first did the work.
//! Each job only acts on what is still pending (the commit job on sessions with pending
//! recordings, the young update after a GC it has not seen), so a repeat is a no-op.

use std::ffi::c_void;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{Arc, OnceLock};

use magnus::Ruby;

use super::{busy::BusyGuard, prune, sessions, Session};
use crate::shims;
use crate::stage_costs::{self, Stage};

#[cfg(dh_postponed_job_preregister)]
mod handles {
    use std::sync::atomic::AtomicU32;
    pub static COMMIT: AtomicU32 = AtomicU32::new(u32::MAX);
    pub static YOUNG_UPDATE: AtomicU32 = AtomicU32::new(u32::MAX);
    pub static WINDOW: AtomicU32 = AtomicU32::new(u32::MAX);
}

/// What the window job runs: the window timer's tick (set once by `init`).
static WINDOW_TICK: OnceLock<fn(&Ruby)> = OnceLock::new();

/// Registers the jobs with the VM (Ruby >= 3.3) and keeps `window_tick`, what the window job
/// runs. Needs the GVL; call once at load.
pub fn init(window_tick: fn(&Ruby)) {
    let _ = WINDOW_TICK.set(window_tick);
    #[cfg(dh_postponed_job_preregister)]
    {
        use std::sync::atomic::Ordering::Relaxed;
        for (slot, job) in [
            (&handles::COMMIT, commit_job as shims::Job),
            (&handles::YOUNG_UPDATE, young_update_job),
            (&handles::WINDOW, window_job),
        ] {
            slot.store(shims::postponed_job_preregister(job), Relaxed);
        }
    }
}

/// Asks the VM to run the commit job soon. Async-signal-safe; fine inside the NEWOBJ hook.
pub fn request_commit() {
    #[cfg(dh_postponed_job_preregister)]
    trigger(&handles::COMMIT);
    #[cfg(not(dh_postponed_job_preregister))]
    register(commit_job);
}

/// Asks the VM to run the young-update job soon. Async-signal-safe.
pub fn request_young_update() {
    #[cfg(dh_postponed_job_preregister)]
    trigger(&handles::YOUNG_UPDATE);
    #[cfg(not(dh_postponed_job_preregister))]
    register(young_update_job);
}

/// Asks the VM to run the window job soon. Ruby >= 3.3: safe from any thread, a non-Ruby one
/// included. Ruby < 3.3: from a Ruby thread only (the timer's signal handler runs on one; see
/// `windows`), and the job runs when that thread next holds the GVL.
pub fn request_window() {
    #[cfg(dh_postponed_job_preregister)]
    trigger(&handles::WINDOW);
    #[cfg(not(dh_postponed_job_preregister))]
    register(window_job);
}

/// The window job: one tick of the window timer (see `init`). Never raises.
extern "C" fn window_job(_data: *mut c_void) {
    let _ = catch_unwind(AssertUnwindSafe(|| {
        if let (Ok(ruby), Some(tick)) = (Ruby::get(), WINDOW_TICK.get()) {
            let probe = stage_costs::start(Stage::Window);
            tick(&ruby);
            probe.end();
        }
    }));
}

#[cfg(dh_postponed_job_preregister)]
fn trigger(handle: &std::sync::atomic::AtomicU32) {
    shims::postponed_job_trigger(handle.load(std::sync::atomic::Ordering::Relaxed));
}

#[cfg(not(dh_postponed_job_preregister))]
fn register(job: shims::Job) {
    shims::postponed_job_register_one(job);
}

/// Runs `work` on each listed session that `pick` selects, keeping its WeakMap on this stack for
/// the duration: a job may let other threads run (WeakMap calls can), one of which may unlist the
/// session (or drop its owner), and the WeakMap found on the stack by the GC's conservative scan
/// stays marked until the job is done with it.
fn for_each(ruby: &Ruby, pick: impl Fn(&Session) -> bool, work: impl Fn(&Ruby, &Arc<Session>)) {
    for session in sessions(pick) {
        let map = std::hint::black_box(session.weak_map_raw());
        if !session.is_dropped() {
            work(ruby, &session);
        }
        std::hint::black_box(&map);
    }
}

/// The commit job: commits every listed session with something pending, then unlists what has
/// no work left (which removes the hooks of a disabled session). Runs with the GVL at a safe
/// point; never raises (Ruby discards what a job raises), so errors are kept on the session, and
/// never warns (the next call into the recorder does: `Session::take_notices`).
extern "C" fn commit_job(_data: *mut c_void) {
    let _ = catch_unwind(AssertUnwindSafe(|| {
        let Ok(ruby) = Ruby::get() else { return };
        let _busy = BusyGuard::enter();
        let probe = stage_costs::start(Stage::Commit);
        for_each(&ruby, Session::needs_job, |ruby, session| {
            session.commit_from_job(ruby);
        });
        prune();
        probe.end();
    }));
}

/// The young-update job: runs the gated young update on every running session. Never raises.
extern "C" fn young_update_job(_data: *mut c_void) {
    let _ = catch_unwind(AssertUnwindSafe(|| {
        let Ok(ruby) = Ruby::get() else { return };
        let _busy = BusyGuard::enter();
        let probe = stage_costs::start(Stage::YoungUpdate);
        for_each(&ruby, Session::is_running, |ruby, session| {
            session.young_update_from_job(ruby);
        });
        probe.end();
    }));
}
