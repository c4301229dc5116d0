//! Every live recorder, so the one postponed job and the fork hook can reach them all.
//!
//! A recorder adds itself when created and removes itself when freed (its Drop runs during GC
//! sweep, with the GVL). Pointers in the list are therefore always to live recorders.

use crate::gvl_cell::GvlCell;
use crate::recorder::Recorder;

struct Registry {
    recorders: Vec<*const Recorder>,
}

static REGISTRY: GvlCell<Registry> = GvlCell::new(Registry {
    recorders: Vec::new(),
});

/// # Safety
/// GVL held; `recorder` stays at this address until `remove` (it lives in a TypedData box).
pub unsafe fn add(recorder: *const Recorder) {
    // SAFETY: GVL held per the contract; the closure makes no VM call.
    unsafe { REGISTRY.with(|r| r.recorders.push(recorder)) }
}

/// # Safety
/// GVL held (true in a TypedData free function, which runs during GC).
pub unsafe fn remove(recorder: *const Recorder) {
    // SAFETY: GVL held per the contract; the closure makes no VM call.
    unsafe { REGISTRY.with(|r| r.recorders.retain(|&p| p != recorder)) }
}

/// The first live recorder with work for the commit job (see `Recorder::needs_job`) not in `done`.
///
/// # Safety
/// GVL held.
pub unsafe fn next_needing_commit(done: &[usize]) -> Option<*const Recorder> {
    // SAFETY: GVL held; the registry's pointers are to live recorders (see module docs), and
    // `has_pending` makes no VM call.
    unsafe {
        REGISTRY.with(|r| {
            r.recorders
                .iter()
                .copied()
                .find(|&p| !done.contains(&(p as usize)) && (*p).needs_job())
        })
    }
}

/// Snapshot of all live recorders. The pointers are valid until the next GC may run.
///
/// # Safety
/// GVL held.
pub unsafe fn all() -> Vec<*const Recorder> {
    // SAFETY: GVL held; no VM call in the closure.
    unsafe { REGISTRY.with(|r| r.recorders.clone()) }
}

/// The first live, sampling recorder not in `done`.
///
/// # Safety
/// GVL held.
pub unsafe fn next_running(done: &[usize]) -> Option<*const Recorder> {
    // SAFETY: as in `next_needing_commit`.
    unsafe {
        REGISTRY.with(|r| {
            r.recorders
                .iter()
                .copied()
                .find(|&p| !done.contains(&(p as usize)) && (*p).sampler().running.get())
        })
    }
}
