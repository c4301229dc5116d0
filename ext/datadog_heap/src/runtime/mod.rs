//! The runtime: the one owner of what the VM calls back into. It holds the list of sessions the
//! VM may reach (running, or with work for a postponed job), marks them as a GC root, installs
//! and removes the event hooks, runs the postponed jobs, keeps the busy set, and handles fork and
//! Ractors. Hooks and jobs reach sessions only through this list, so none can reach a session
//! whose Ruby object was collected.
//!
//! A listed session is an `Arc` here; the root marks what it holds (its WeakMap, its pending
//! objects) but not its owner, the `DatadogHeap::Recorder` object. So a started recorder the
//! program no longer references is collected like any object: its Drop marks the session
//! dropped, everything here skips it from then on, the hook asks for a commit job, and that job
//! unlists it (removing the hooks if nothing else wants them). A session leaves the list when it
//! has no work left (`prune`), and only under the GVL, never from the hook.
//!
//! Everything here needs the GVL of the main Ractor.

mod busy;
mod hooks;
mod jobs;
mod session;
mod windows;

use std::sync::Arc;

use magnus::{prelude::*, typed_data::Obj, DataTypeFunctions, Error, RModule, Ruby, TypedData};

use crate::sampler::Mode;
use crate::shims::GvlCell;
pub use busy::own_work;
pub use busy::{guarded, not_busy, own_allocations, program_allocations};
pub use jobs::request_commit;
pub use session::Session;
pub use windows::native::{wait_for_call as window_timer_wait, wakes as window_timer_wakes};
pub use windows::{
    native_timer as native_window_timer, problem as window_timer_problem,
    signal_counts as window_signal_counts, signal_number as window_signal_number,
    tick_from_ruby_timer as window_tick, use_ruby_thread as use_ruby_timer,
};

struct Listed {
    session: Arc<Session>,
}

struct Runtime {
    sessions: Vec<Listed>,
    /// The NEWOBJ hook is installed: a listed session wants it (see `SamplerState::wants_hook`).
    newobj_installed: bool,
    /// The GC-end hook is installed: a countdown session runs.
    gc_end_installed: bool,
    /// The window timer's rate; `None` when it is stopped (no windowed session runs).
    timer_rate: Option<f64>,
    /// The process is exiting (`shutdown`): the timer is not started again.
    shut_down: bool,
    /// A Ractor was started: sampling stays off for good in this process.
    ractors_started: bool,
    /// Threads inside `exec` (see `before_exec`): the timer stays stopped while any is.
    execs_pending: u32,
    /// Test switch: a NEWOBJ hook that does nothing, to measure what any hook costs.
    empty_hook: bool,
    /// The process the list was last used in (see `after_fork`).
    pid: u32,
}

static RUNTIME: GvlCell<Runtime> = GvlCell::new(Runtime {
    sessions: Vec::new(),
    newobj_installed: false,
    gc_end_installed: false,
    timer_rate: None,
    shut_down: false,
    ractors_started: false,
    execs_pending: 0,
    empty_hook: false,
    pid: 0,
});

// Runs `f` on the runtime. GVL held; `f`, always a closure of this module, makes no VM call.
crate::gvl_guarded!(fn with over RUNTIME: Runtime);

/// The GC root: an object made once at load, registered with the VM, whose mark function marks
/// what every listed session holds (not its owner: see the module docs). Not write-barrier protected, so the VM calls `mark` at
/// every GC, minor ones included (the sessions it marks change without the VM knowing).
#[derive(TypedData)]
#[magnus(class = "DatadogHeap::Runtime", mark)]
struct Roots;

impl DataTypeFunctions for Roots {
    /// Never allocates, raises or panics.
    fn mark(&self, _marker: &magnus::gc::Marker) {
        with(|r| {
            for listed in r.sessions.iter().filter(|l| !l.session.is_dropped()) {
                listed.session.mark();
            }
        });
    }
}

/// Sets up the root and the postponed jobs. Called once at load, with the GVL.
pub fn init(ruby: &Ruby, module: RModule) -> Result<(), Error> {
    let class = module.define_class("Runtime", ruby.class_object())?;
    class.undef_default_alloc_func();
    let roots: Obj<Roots> = ruby.obj_wrap_as(Roots, class);
    ruby.gc_register_mark_object(roots);
    with(|r| r.pid = std::process::id());
    jobs::init(|ruby| {
        windows::tick(ruby);
    });
    hooks::init();
    windows::init(ruby);
    crate::shims::init_gc_stat();
    // The VM is going away: no timer may trigger a job past this point.
    crate::shims::at_vm_exit(shutdown);
    Ok(())
}

/// Stops the window timer for good (process exit; lib/datadog_heap.rb calls it from its last
/// `at_exit` handler, and VM teardown calls it again). Sessions keep what they track.
pub fn shutdown() {
    with(|r| {
        r.timer_rate = None;
        r.shut_down = true;
    });
    windows::shutdown();
}

/// Lists `session` if it is not listed yet.
pub fn list(session: &Arc<Session>) {
    with(|r| {
        if !r.sessions.iter().any(|l| Arc::ptr_eq(&l.session, session)) {
            r.sessions.push(Listed {
                session: session.clone(),
            });
        }
    });
}

/// Why `start` refused.
pub enum StartRefused {
    Ractors,
    Disabled(String),
}

/// Starts the built-in sampler for `session`; idempotent.
pub fn start(session: &Arc<Session>) -> Result<(), StartRefused> {
    if with(|r| r.ractors_started) {
        return Err(StartRefused::Ractors);
    }
    if let Some(reason) = session.disabled_reason() {
        return Err(StartRefused::Disabled(reason));
    }
    if !session.is_running() {
        session
            .sampler
            .prepare(session.config, busy::program_allocations());
        // Sized here, not in the hook. Fails only while the state is borrowed, which no caller of
        // `start` does; the cache would then stay off (never wrong).
        let _ = session.core.reserve_stack_cache();
        session.set_running(true);
    }
    list(session);
    sync_hooks();
    Ok(())
}

/// Stops the built-in sampler for `session`; what it tracks stays. Idempotent; true if it ran.
pub fn stop(session: &Session) -> bool {
    let was = session.is_running();
    if was {
        session.sampler.close_out(busy::program_allocations());
    }
    session.set_running(false);
    // Nothing is sampled until the next start, by when the frames it names may be gone.
    session.core.clear_stack_cache();
    prune();
    was
}

/// Unlists the sessions with no work left, then installs or removes the hooks to match.
pub fn prune() {
    // In place, and allocation-free when nothing leaves (the usual commit job).
    let mut removed: Vec<Listed> = Vec::new();
    with(|r| {
        let mut i = 0;
        while i < r.sessions.len() {
            if r.sessions[i].session.has_work() {
                i += 1;
            } else {
                removed.push(r.sessions.swap_remove(i));
            }
        }
    });
    // Dropped outside the runtime's cell: a last reference frees a whole recorder.
    drop(removed);
    sync_hooks();
}

/// Installs or removes the hooks, and starts, retunes or stops the window timer, to match what
/// the listed sessions want now.
fn sync_hooks() {
    let (newobj, gc_end, timer) = with(|r| {
        let ractors = r.ractors_started;
        let live = || {
            (r.sessions.iter())
                .map(|l| &*l.session)
                .filter(move |s| s.is_running() && !s.is_dropped() && !ractors)
        };
        let newobj = live().any(|s| s.sampler.wants_hook(s.config.mode));
        let gc_end = live().any(|s| s.config.mode == Mode::Countdown);
        let timer_off = r.shut_down || r.execs_pending > 0;
        let timer = windows::timer_rate(live()).filter(|_| !timer_off);
        let timer_change = (r.timer_rate != timer).then_some(timer);
        (
            changed(&mut r.newobj_installed, newobj),
            changed(&mut r.gc_end_installed, gc_end),
            timer_change,
        )
    });
    if let Some(installed) = newobj {
        hooks::set_newobj(installed);
    }
    if let Some(installed) = gc_end {
        hooks::set_gc_end(installed);
    }
    if let Some(rate) = timer {
        with(|r| r.timer_rate = rate);
        windows::set_rate(rate);
    }
}

/// Sets `*installed` to `want`; `Some(want)` when that is a change.
fn changed(installed: &mut bool, want: bool) -> Option<bool> {
    (std::mem::replace(installed, want) != want).then_some(want)
}

/// In a forked child (called by the fork hook, and by `Recorder#after_fork`): the busy marks of
/// threads the child does not have go, and every listed session is brought into this process.
/// Sessions that are not listed catch up at their next use (`Session::after_fork`).
pub fn after_fork() {
    let pid = std::process::id();
    let forked = with(|r| std::mem::replace(&mut r.pid, pid) != pid);
    if forked {
        busy::after_fork();
        session::after_fork_warnings();
        // No timer thread came along: `sync_hooks` below starts one again if a windowed
        // session still runs.
        windows::after_fork();
        // Threads inside `exec` in the parent did not come along.
        with(|r| {
            r.timer_rate = None;
            r.execs_pending = 0;
        });
    }
    for session in sessions(|_| true) {
        let _ = session.after_fork();
    }
    sync_hooks();
}

/// Called by `exec` (lib/datadog_heap.rb's ExecGuard) before it replaces the program: stops the
/// window timer and waits for its thread to end. Before Ruby 3.3 that thread signals Ruby
/// threads, and a signal sent to the thread about to exec can still be pending when the new
/// program starts, whose handlers are back to the defaults: for a real-time signal that ends the
/// process. Once the timer thread is joined, every signal it sent has reached this thread (the
/// join's wait returns through the handler). The timer stays stopped until `after_failed_exec`.
pub fn before_exec() {
    with(|r| r.execs_pending += 1);
    sync_hooks();
}

/// `exec` raised (no such program, say): the process goes on, and so does the timer.
pub fn after_failed_exec() {
    with(|r| r.execs_pending = r.execs_pending.saturating_sub(1));
    sync_hooks();
}

/// Called just before the first `Ractor.new`: stops every session's sampling for good and
/// removes the hooks. Internal allocation hooks are not Ractor-safe: Ruby 3.1 itself crashes
/// when a NEWOBJ hook is installed while another Ractor allocates (even Ruby's own
/// `ObjectSpace.trace_object_allocations_start`), and this runtime assumes one Ractor.
pub fn stop_for_ractors() {
    with(|r| r.ractors_started = true);
    for session in sessions(|s| s.is_running()) {
        session.core.clear_stack_cache();
        session.disable(
            "a Ractor was started; allocation sampling is not Ractor-safe and stays off".into(),
        );
    }
    set_empty_hook(false);
    sync_hooks();
    jobs::request_commit();
}

/// Test switch: installs (or removes) a NEWOBJ hook that does nothing, to measure the floor any
/// allocation hook costs.
pub fn set_empty_hook(enabled: bool) {
    if with(|r| std::mem::replace(&mut r.empty_hook, enabled) != enabled) {
        hooks::set_empty(enabled);
    }
}

/// Clones of the listed, not dropped, sessions that `pick` selects.
fn sessions(pick: impl Fn(&Session) -> bool) -> Vec<Arc<Session>> {
    with(|r| {
        (r.sessions.iter())
            .filter(|l| !l.session.is_dropped() && pick(&l.session))
            .map(|l| l.session.clone())
            .collect()
    })
}

/// Test aid: how many sessions are listed.
pub fn listed_count() -> usize {
    with(|r| r.sessions.len())
}

/// Test aid: whether the NEWOBJ and GC-end hooks are installed, and the window timer's rate.
pub fn hook_state() -> (bool, bool, Option<f64>) {
    with(|r| (r.newobj_installed, r.gc_end_installed, r.timer_rate))
}
