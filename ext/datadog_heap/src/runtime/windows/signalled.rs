use std::ffi::c_int;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::OnceLock;

use crate::shims::{gvl_owner, signal};

/// The signal the handler is installed for (0: none was free, or the GVL owner cannot be told).
static SIGNAL: OnceLock<c_int> = OnceLock::new();
/// Signals whose handler asked for the job (it held the GVL), and signals that landed in a
/// thread without the GVL (it gave the GVL up between the timer's look and the signal),
/// which asked for nothing.
static REGISTERED: AtomicU64 = AtomicU64::new(0);
static NOT_GVL_OWNER: AtomicU64 = AtomicU64::new(0);

/// Set once the timer found another handler than ours on its signal (the program or a gem
/// replaced it): no signal is sent after that (see `request`).
static HANDLER_REPLACED: AtomicBool = AtomicBool::new(false);

/// Asks for the window job only from the GVL owner: before 3.3, registering from any other
/// thread races with the owner's flush of the job queue (see `shims::gvl_owner`).
extern "C" fn on_signal(_sig: c_int) {
    signal::keeping_errno(|| {
        if !signal::on_ruby_thread() {
            return;
        }
        if gvl_owner::holds_gvl() {
            REGISTERED.fetch_add(1, Ordering::Relaxed);
            super::super::jobs::request_window();
        } else {
            NOT_GVL_OWNER.fetch_add(1, Ordering::Relaxed);
        }
    });
}

/// Finds where the VM keeps the GVL owner (`shims::gvl_owner`). At load, GVL held.
pub fn probe(ruby: &magnus::Ruby) {
    let _ = gvl_owner::probe(ruby);
}

/// Whether the handler is installed (installing it on the first call). GVL held. Never
/// without the GVL owner known: a handler that cannot tell would register from any thread.
pub fn ready() -> bool {
    *SIGNAL.get_or_init(|| match gvl_owner::gvl_owner_known() {
        true => signal::install_rt_handler(on_signal).unwrap_or(0),
        false => 0,
    }) != 0
}

/// The signal the handler was installed for (0: none).
pub fn number() -> c_int {
    SIGNAL.get().copied().unwrap_or(0)
}

/// Whether the handler was installed (never installs it).
pub fn installed() -> bool {
    SIGNAL.get().is_some_and(|&s| s != 0)
}

/// (signals that asked for the job, signals that found no GVL and asked for nothing).
pub fn counts() -> (u64, u64) {
    (
        REGISTERED.load(Ordering::Relaxed),
        NOT_GVL_OWNER.load(Ordering::Relaxed),
    )
}

/// From the timer thread: signals the thread that holds the GVL, if one does; whether it did.
/// When none does (every Ruby thread blocked or asleep) the tick goes to the Ruby timer thread,
/// which waits beside this one before 3.3 and gets the GVL at once (see `native::run`).
///
/// Before each signal it checks that the handler is still ours: a program that later set
/// the signal back to its default action would be ended by the next one, and one that took
/// it for itself would receive ours. Once it is not, no signal is sent again; the Ruby timer
/// thread opens the windows from then on, and `problem` says so (a warning, the stats, the
/// profiles). A handler changed between this check and the signal (microseconds) is not seen.
pub fn request() -> bool {
    let Some(&sig) = SIGNAL.get().filter(|&&s| s != 0) else {
        return false;
    };
    if HANDLER_REPLACED.load(Ordering::Relaxed) {
        return false;
    }
    if signal::handler_of(sig) != Some(on_signal as signal::Handler as libc::sighandler_t) {
        HANDLER_REPLACED.store(true, Ordering::Relaxed);
        return false;
    }
    let owner = gvl_owner::gvl_owner_tid();
    owner > 0 && signal::send_to_thread(owner, sig)
}

/// In a forked child, on the thread that forked: the owner's id must come from this thread
/// (see `gvl_owner::after_fork`).
pub fn after_fork() {
    gvl_owner::after_fork();
}

/// Why the native timer cannot reach the VM here (see `super::problem`). Installs nothing.
pub fn problem() -> Option<&'static str> {
    if !gvl_owner::gvl_owner_known() {
        return Some(
            "this Ruby keeps the GVL owner where the gem could not find it, so the native \
             timer cannot signal the thread that holds it",
        );
    }
    if HANDLER_REPLACED.load(Ordering::Relaxed) {
        return Some(
            "the program replaced the handler of the timer's signal, so the native timer \
             stopped signalling",
        );
    }
    let free = match SIGNAL.get() {
        Some(&sig) => sig != 0,
        None => signal::free_rt_signal_exists(),
    };
    match free {
        true => None,
        false => Some("no real-time signal is free for the native timer"),
    }
}
