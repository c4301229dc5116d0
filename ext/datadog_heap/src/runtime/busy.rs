//! The busy set: threads inside our own native work (a method of ours, a job), with their
//! nesting depth. Allocations they make then are ours, not the program's, and the sampler skips
//! them (counted as `sampler_skipped_reentrant`). Per thread, so other threads' allocations are
//! still sampled while one thread encodes a profile without the GVL. Needs the GVL throughout.

use std::panic::{catch_unwind, AssertUnwindSafe};

use magnus::{Error, Ruby};
use rb_sys::VALUE;

use crate::errors::{heap_error, panic_message};
use crate::gvl_cell::GvlCell;
use crate::shims::current_thread;

static BUSY: GvlCell<Vec<(VALUE, u32)>> = GvlCell::new(Vec::new());

fn with<R>(f: impl FnOnce(&mut Vec<(VALUE, u32)>) -> R) -> R {
    // SAFETY: every caller holds the GVL (module contract) and the closures below make no VM call.
    unsafe { BUSY.with(f) }
}

/// Marks this thread busy until dropped.
pub struct BusyGuard(VALUE);

impl BusyGuard {
    pub fn enter() -> BusyGuard {
        let thread = current_thread();
        with(|busy| match busy.iter_mut().find(|(t, _)| *t == thread) {
            Some((_, depth)) => *depth += 1,
            None => busy.push((thread, 1)),
        });
        BusyGuard(thread)
    }
}

impl Drop for BusyGuard {
    fn drop(&mut self) {
        let thread = self.0;
        with(|busy| {
            if let Some(i) = busy.iter().position(|(t, _)| *t == thread) {
                busy[i].1 -= 1;
                if busy[i].1 == 0 {
                    busy.swap_remove(i);
                }
            }
        });
    }
}

/// Is the current thread inside our own native work? Allocation-free (used by the hook).
pub fn current_thread_busy() -> bool {
    if with(|busy| busy.is_empty()) {
        return false;
    }
    let thread = current_thread();
    with(|busy| busy.iter().any(|(t, _)| *t == thread))
}

/// Runs `f` (which calls back into user Ruby code) with this thread's busy mark lifted, so its
/// allocations are sampled like any other.
pub fn not_busy<T>(f: impl FnOnce() -> T) -> T {
    let thread = current_thread();
    let depth = with(|busy| {
        let i = busy.iter().position(|(t, _)| *t == thread)?;
        Some(busy.swap_remove(i).1)
    });
    let out = f();
    if let Some(depth) = depth {
        with(|busy| busy.push((thread, depth)));
    }
    out
}

/// In a forked child only the forking thread survives: the others' marks go, its own stays.
pub fn after_fork() {
    let thread = current_thread();
    with(|busy| busy.retain(|(t, _)| *t == thread));
}

/// Runs a native method body: marks the thread busy, and turns a panic into `DatadogHeap::Error`
/// so it never unwinds into the VM (magnus alone would raise `fatal`, which ends the process).
/// Every method this crate defines goes through it.
pub fn guarded<T>(ruby: &Ruby, f: impl FnOnce() -> Result<T, Error>) -> Result<T, Error> {
    let _busy = BusyGuard::enter();
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(result) => result,
        Err(panic) => Err(heap_error(
            ruby,
            format!("internal error (Rust panic): {}", panic_message(&*panic)),
        )),
    }
}
