//! The busy set: threads inside our own native work (a method of ours, a job), with their
//! nesting depth. Allocations they make then are ours, not the program's, and the sampler skips
//! them (counted as `sampler_skipped_reentrant`). Per thread, so other threads' allocations are
//! still sampled while one thread encodes a profile without the GVL. Needs the GVL throughout.
//!
//! The busy set also counts those allocations (`own_allocations`): the windowed sampler places
//! its windows along the program's allocations (the VM's counter less ours), which the hook
//! counts without ours too, so our own work (commit jobs, on Ruby 3.1 about two objects per
//! sample for the WeakMap) moves no window.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicU64, Ordering};

use magnus::{Error, Ruby};
use rb_sys::VALUE;

use crate::errors::{heap_error, panic_message};
use crate::shims::GvlCell;
use crate::shims::{current_thread, total_allocated_objects};

/// A busy thread, its nesting depth, and the VM's allocation counter when its current stretch of
/// our own work began.
struct Busy {
    thread: VALUE,
    depth: u32,
    since: u64,
}

static BUSY: GvlCell<Vec<Busy>> = GvlCell::new(Vec::new());

/// Objects allocated inside our own work since the process started (a forked child inherits the
/// parent's count, as it inherits the VM's counter).
static OWN_ALLOCATIONS: AtomicU64 = AtomicU64::new(0);

crate::gvl_guarded!(fn with over BUSY: Vec<Busy>);

/// Yields to the block with this thread busy: its allocations there are the gem's own work (a
/// profile written, an endpoint's answer), never samples of the program. GVL held; runs Ruby
/// code; what the block raises comes back as the error, the thread no longer busy.
pub fn own_work(ruby: &Ruby) -> Result<magnus::Value, Error> {
    let _busy = BusyGuard::enter();
    ruby.yield_value::<(), magnus::Value>(())
}

/// Marks this thread busy until dropped.
pub struct BusyGuard(VALUE);

impl BusyGuard {
    pub fn enter() -> BusyGuard {
        let thread = current_thread();
        let entered = with(|busy| match busy.iter_mut().find(|b| b.thread == thread) {
            Some(b) => {
                b.depth += 1;
                false
            }
            None => {
                busy.push(Busy {
                    thread,
                    depth: 1,
                    since: 0,
                });
                true
            }
        });
        if entered {
            // Read outside `with`: rb_gc_stat is a VM call.
            let now = total_allocated_objects();
            with(|busy| {
                if let Some(b) = busy.iter_mut().find(|b| b.thread == thread) {
                    b.since = now;
                }
            });
        }
        BusyGuard(thread)
    }
}

impl Drop for BusyGuard {
    fn drop(&mut self) {
        let thread = self.0;
        let left = with(|busy| {
            let i = busy.iter().position(|b| b.thread == thread)?;
            busy[i].depth -= 1;
            match busy[i].depth {
                0 => Some(busy.swap_remove(i).since),
                _ => None,
            }
        });
        if let Some(since) = left {
            count_own(since);
        }
    }
}

/// Adds the allocations since `since` to our own.
fn count_own(since: u64) {
    let made = total_allocated_objects().saturating_sub(since);
    OWN_ALLOCATIONS.fetch_add(made, Ordering::Relaxed);
}

/// Objects allocated inside our own work so far (see the module docs).
pub fn own_allocations() -> u64 {
    OWN_ALLOCATIONS.load(Ordering::Relaxed)
}

/// The program's allocations so far: the VM's counter less our own. Needs the GVL.
pub fn program_allocations() -> u64 {
    let total = total_allocated_objects();
    // A busy thread's current stretch is ours too.
    let current: u64 = with(|busy| busy.iter().map(|b| total.saturating_sub(b.since)).sum());
    total.saturating_sub(own_allocations().saturating_add(current))
}

/// Is the current thread inside our own native work? Allocation-free (used by the hook).
pub fn current_thread_busy() -> bool {
    if with(|busy| busy.is_empty()) {
        return false;
    }
    let thread = current_thread();
    with(|busy| busy.iter().any(|b| b.thread == thread))
}

/// Runs `f` with this thread's busy mark lifted: code that calls back into user Ruby code, whose
/// allocations are sampled like any other, or that releases the GVL, so that other threads'
/// allocations meanwhile are not counted as ours.
pub fn not_busy<T>(f: impl FnOnce() -> T) -> T {
    let thread = current_thread();
    let lifted = with(|busy| {
        let i = busy.iter().position(|b| b.thread == thread)?;
        Some(busy.swap_remove(i))
    });
    if let Some(b) = &lifted {
        count_own(b.since);
    }
    let out = f();
    if let Some(mut b) = lifted {
        b.since = total_allocated_objects();
        with(|busy| busy.push(b));
    }
    out
}

/// In a forked child only the forking thread survives: the others' marks go, its own stays.
pub fn after_fork() {
    let thread = current_thread();
    with(|busy| busy.retain(|b| b.thread == thread));
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
