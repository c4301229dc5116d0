//! A real-time signal that a native thread sends to one Ruby thread, so that thread asks the VM
//! for a postponed job (Ruby < 3.3, where asking needs the caller's execution context; see
//! runtime/windows.rs). Linux only, like the rest of the extension.

use std::ffi::c_int;

/// A signal handler as sigaction takes it without SA_SIGINFO.
pub type Handler = extern "C" fn(c_int);

/// Installs `handler` for the highest real-time signal whose disposition is still the default
/// (nobody else uses it), and returns that signal; `None` when every one is taken or sigaction
/// refuses. SA_RESTART: a system call the signal lands in restarts where the kernel can, and the
/// ones it cannot restart (select, poll, sleeps) return EINTR, which Ruby retries anyway (its own
/// timer interrupts threads with SIGVTALRM). The handler stays installed for the life of the
/// process: a signal still on its way must never meet the default action, which ends the process.
pub fn install_rt_handler(handler: Handler) -> Option<c_int> {
    let (low, high) = (libc::SIGRTMIN(), libc::SIGRTMAX());
    // Leave the lowest few to the C library and the programs that take SIGRTMIN + n.
    (low + 4..=high).rev().find(|&sig| {
        if handler_of(sig) != Some(libc::SIG_DFL) {
            return false;
        }
        // SAFETY: as above.
        let mut action: libc::sigaction = unsafe { std::mem::zeroed() };
        action.sa_sigaction = handler as usize;
        action.sa_flags = libc::SA_RESTART;
        // SAFETY: sigemptyset initialises a sigset we own.
        unsafe { libc::sigemptyset(&mut action.sa_mask) };
        // SAFETY: `action` is fully initialised; its handler is a function of this extension,
        // which is never unloaded, and async-signal-safe (see its caller's contract).
        unsafe { libc::sigaction(sig, &action, std::ptr::null_mut()) == 0 }
    })
}

/// Whether some real-time signal that `install_rt_handler` would take is still free. Installs
/// nothing.
pub fn free_rt_signal_exists() -> bool {
    (libc::SIGRTMIN() + 4..=libc::SIGRTMAX()).any(|sig| handler_of(sig) == Some(libc::SIG_DFL))
}

/// The handler installed for `sig` now (`SIG_DFL`, `SIG_IGN` or a function's address), `None`
/// when sigaction refuses. Async-signal-safe (sigaction is), so the timer thread may ask it
/// before each signal it sends.
pub fn handler_of(sig: c_int) -> Option<libc::sighandler_t> {
    // SAFETY: all-zero bytes are a valid sigaction (plain integers and a sigset).
    let mut current: libc::sigaction = unsafe { std::mem::zeroed() };
    // SAFETY: with a null new action sigaction only writes the current one into `current`, a
    // struct we own.
    match unsafe { libc::sigaction(sig, std::ptr::null(), &mut current) } {
        0 => Some(current.sa_sigaction),
        _ => None,
    }
}

/// This thread's kernel id. Async-signal-safe.
pub fn current_tid() -> c_int {
    // SAFETY: gettid takes no arguments and cannot fail.
    unsafe { libc::syscall(libc::SYS_gettid) as c_int }
}

/// Sends `sig` to thread `tid` of this process; false if there is no such thread. A thread id
/// that was reused after its thread ended names another thread of this process or none, never a
/// thread of another process (tgkill checks the process), so a stale id is harmless to send to.
pub fn send_to_thread(tid: c_int, sig: c_int) -> bool {
    if tid <= 0 {
        return false;
    }
    // SAFETY: tgkill takes plain integers; the worst a wrong `tid` does is ESRCH.
    unsafe { libc::syscall(libc::SYS_tgkill, libc::getpid(), tid, sig) == 0 }
}

/// Whether the calling thread is a Ruby thread. Async-signal-safe: the VM reads a thread-local.
pub fn on_ruby_thread() -> bool {
    // SAFETY: ruby_native_thread_p only reads the calling thread's VM thread pointer.
    unsafe { rb_sys::ruby_native_thread_p() != 0 }
}

/// Runs `f` with `errno` kept as it was: a signal handler must not change it under the code it
/// interrupted.
pub fn keeping_errno(f: impl FnOnce()) {
    // SAFETY: __errno_location returns this thread's errno slot, valid for the thread's life.
    let slot = unsafe { libc::__errno_location() };
    // SAFETY: `slot` is valid (above) and only this thread uses it.
    let saved = unsafe { *slot };
    f();
    // SAFETY: as above.
    unsafe { *slot = saved };
}
