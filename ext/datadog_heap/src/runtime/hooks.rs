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

use rb_sys::{rb_trace_arg_t, VALUE};

use super::{busy, jobs, with, Session};
use crate::sampler::{self, Mode};
use crate::shims;

/// Most sessions one hook call samples; others due at the same allocation take the next one.
const MAX_DUE: usize = 4;

pub fn set_newobj(installed: bool) {
    match installed {
        true => shims::add_event_hook(on_newobj, rb_sys::RUBY_INTERNAL_EVENT_NEWOBJ),
        false => shims::remove_event_hook(on_newobj),
    }
}

pub fn set_gc_end(installed: bool) {
    match installed {
        true => shims::add_event_hook(on_gc_end, rb_sys::RUBY_INTERNAL_EVENT_GC_END_SWEEP),
        false => shims::remove_event_hook(on_gc_end),
    }
}

pub fn set_empty(enabled: bool) {
    if enabled {
        shims::add_event_hook(on_newobj_empty, rb_sys::RUBY_INTERNAL_EVENT_NEWOBJ);
    } else {
        shims::remove_event_hook(on_newobj_empty);
    }
}

unsafe extern "C" fn on_newobj_empty(_data: VALUE, _arg: *mut rb_trace_arg_t) {}

/// The NEWOBJ hook. See the module docs for what it must never do.
unsafe extern "C" fn on_newobj(_data: VALUE, arg: *mut rb_trace_arg_t) {
    // A panic must not unwind into the VM; the per-session one below disables its session, this
    // one (which nothing here can raise) is dropped.
    let _ = catch_unwind(AssertUnwindSafe(|| {
        // Whether this thread is inside our own work, read once and only when needed: windowed
        // sessions leave our own allocations out of their windows (see `busy`).
        let mut busy = None;
        let (due, n) = with(|r| {
            let mut due = [std::ptr::null::<Session>(); MAX_DUE];
            let mut n = 0;
            for listed in &r.sessions {
                let session = &*listed.session;
                let mode = session.config.mode;
                if !session.is_running()
                    || session.is_dropped()
                    || !session.sampler.wants_hook(mode)
                {
                    continue;
                }
                if mode != Mode::Countdown && *busy.get_or_insert_with(busy::current_thread_busy) {
                    continue;
                }
                let tick = session.sampler.tick(mode);
                if tick.closed {
                    // The commit job removes the hook if nothing else wants it (never removed
                    // from inside the hook itself).
                    jobs::request_commit();
                }
                if !tick.due {
                    continue;
                }
                if n < MAX_DUE {
                    due[n] = session;
                    n += 1;
                } else {
                    session.sampler.postpone();
                }
            }
            (due, n)
        });
        if n == 0 {
            return;
        }
        // SAFETY: `arg` is the trace arg of the NEWOBJ event the VM is calling us for.
        let object = unsafe { rb_sys::rb_tracearg_object(arg) };
        let busy = busy.unwrap_or_else(busy::current_thread_busy);
        for &session in &due[..n] {
            // SAFETY: the pointers were read from the list just now, where an `Arc` keeps each
            // session alive; only `prune` removes entries, and nothing in this hook runs it.
            let session = unsafe { &*session };
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
unsafe extern "C" fn on_gc_end(_data: VALUE, _arg: *mut rb_trace_arg_t) {
    jobs::request_young_update();
}
