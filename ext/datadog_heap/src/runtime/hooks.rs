//! The event hooks: one NEWOBJ hook for the process, serving every session that wants it (a
//! countdown session that runs, a windowed one whose window is open), and a GC-end hook that asks
//! for young updates while a countdown session runs. Windowed sessions get their young updates
//! from the window timer instead, so between windows no object-space hook is installed at all (on
//! Ruby 3.1 any such hook, GC-end included, sends every allocation down the slow path).
//!
//! The NEWOBJ hook runs inside object allocation. It never allocates a Ruby object, never raises,
//! never calls a Ruby method, never releases the GVL and never reaches `xmalloc`. Its path for
//! an allocation that is not sampled is one decrement and one branch per session it serves.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;

use rb_sys::VALUE;

use super::{busy, jobs, with, Session};
use crate::sampler;
use crate::shims::{self, Hook, NewObj};

/// Most sessions one hook call samples; others due at the same allocation take the next one.
const MAX_DUE: usize = 4;

/// Sets what the hooks run. Called once at load.
pub fn init() {
    shims::init_hooks(on_newobj, on_gc_end);
}

pub fn set_newobj(installed: bool) {
    shims::set_hook(Hook::NewObj, installed);
}

pub fn set_gc_end(installed: bool) {
    shims::set_hook(Hook::GcEnd, installed);
}

pub fn set_empty(enabled: bool) {
    shims::set_hook(Hook::NewObjEmpty, enabled);
}

/// The NEWOBJ hook. See the module docs for what it must never do.
fn on_newobj(event: &NewObj) {
    // A panic must not unwind into the VM; the per-session one below disables its session, this
    // one (which nothing here can raise) is dropped.
    let _ = catch_unwind(AssertUnwindSafe(|| {
        // Whether this thread is inside our own work, read once and only when needed: windowed
        // sessions leave our own allocations out of their windows (see `busy`).
        let mut busy = None;
        let (due, n) = with(|r| {
            let mut due: [Option<Arc<Session>>; MAX_DUE] = Default::default();
            let mut n = 0;
            for listed in &r.sessions {
                let session = &*listed.session;
                let mode = session.config.mode;
                if session.is_dropped() {
                    // Its recorder was collected: the commit job unlists it (and removes this
                    // hook if nothing else wants it).
                    jobs::request_commit();
                    continue;
                }
                if !session.is_running() || !session.sampler.wants_hook(mode) {
                    continue;
                }
                // Our own work's allocations are not the program's: they neither tick a countdown
                // nor count in a window, so every sample's weight is an interval of the
                // program's allocations only (a countdown ticked by them put their share of the
                // weight on the program's objects).
                if *busy.get_or_insert_with(busy::current_thread_busy) {
                    continue;
                }
                let tick = session.sampler.tick(mode);
                if tick.boundary {
                    // The window opens or closes at the next interrupt check, in the window job
                    // (which also removes the hook when nothing wants it: never from inside the
                    // hook itself).
                    jobs::request_window();
                }
                if !tick.due {
                    continue;
                }
                if n < MAX_DUE {
                    // A clone, not a borrow: the list's own `Arc` outlives this call (only
                    // `prune` removes entries, and nothing in this hook runs it), so dropping
                    // it below never frees a session here.
                    due[n] = Some(listed.session.clone());
                    n += 1;
                } else {
                    session.sampler.postpone();
                }
            }
            (due, n)
        });
        if n == 0 {
            // Nothing to drop (every slot is empty); forgetting the array spares the call that
            // would check each slot, on the path every allocation of a countdown session (and
            // every one inside a window) takes: a fifth of this hook's instructions.
            std::mem::forget(due);
            return;
        }
        let object = event.object();
        let busy = busy.unwrap_or_else(busy::current_thread_busy);
        for session in due.iter().flatten() {
            sample(session, object, busy);
        }
    }));
}

fn sample(session: &Session, object: VALUE, busy: bool) {
    let outcome = catch_unwind(AssertUnwindSafe(|| {
        sampler::sample(
            &session.sampler,
            &session.core,
            session.config,
            object,
            busy,
        )
    }));
    let reason = match outcome {
        Ok(Ok(needs_commit)) => {
            if needs_commit && session.has_pending() {
                jobs::request_commit();
            }
            return;
        }
        Ok(Err(e)) => e.to_string(),
        Err(panic) => format!(
            "panic in the allocation hook: {}",
            crate::errors::panic_message(&*panic)
        ),
    };
    // The commit job removes the hooks if no session runs any more; the next call into the
    // recorder warns.
    session.disable(reason);
    jobs::request_commit();
}

/// The GC-end hook: asks for a young update soon. Never allocates.
fn on_gc_end() {
    jobs::request_young_update();
}
