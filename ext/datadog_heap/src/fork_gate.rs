//! Keeps `fork` and the GVL-free profile encoder apart.
//!
//! The encoder runs without the GVL and holds a recorder's string-storage mutex while it works.
//! `fork` copies only the calling thread: a child forked at that moment would inherit the mutex
//! locked by a thread it does not have, and its first `profile` (or anything else that needs the
//! storage) would wait forever. So the fork hook closes this gate and waits until no encoder is
//! inside before the fork proceeds; encoders that arrive meanwhile wait outside until the fork is
//! over. Encoders waiting here do not hold the GVL, and one that runs with the GVL held (when Ruby
//! refused to release it) does not wait, so neither side can wait on the other in a cycle.
//!
//! The two counters form a small Dekker-style handshake: an encoder announces itself, then looks
//! at the gate; the forker closes the gate, then looks at the count. With sequentially consistent
//! operations at least one of them sees the other, so a fork never starts while an encoder that
//! saw the gate open is still inside.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::SeqCst};
use std::time::{Duration, Instant};

static FORKING: AtomicBool = AtomicBool::new(false);
static ENCODERS: AtomicUsize = AtomicUsize::new(0);

/// Longest a fork waits for encoders. An encode of a million objects takes about a second on a
/// small machine; past this something is badly wrong, and forking anyway (risking a child that
/// cannot profile) beats blocking the parent's fork forever.
const MAX_FORK_WAIT: Duration = Duration::from_secs(30);

/// Held by an encoder while it works; leaving (drop) lets a waiting fork go on.
pub struct EncoderPass(());

impl Drop for EncoderPass {
    fn drop(&mut self) {
        ENCODERS.fetch_sub(1, SeqCst);
    }
}

/// Enters as an encoder running with the GVL held: no waiting. A fork needs the GVL, so none can
/// happen until this encoder is done; and waiting here could deadlock with a forker that closed
/// the gate, then let the GVL go (flushing IO before the fork) and needs it back.
pub fn enter_encoder_with_gvl() -> EncoderPass {
    ENCODERS.fetch_add(1, SeqCst);
    EncoderPass(())
}

/// Enters as an encoder running without the GVL, waiting while a fork is being prepared.
pub fn enter_encoder() -> EncoderPass {
    loop {
        ENCODERS.fetch_add(1, SeqCst);
        if !FORKING.load(SeqCst) {
            return EncoderPass(());
        }
        ENCODERS.fetch_sub(1, SeqCst);
        while FORKING.load(SeqCst) {
            std::thread::sleep(Duration::from_micros(200));
        }
    }
}

/// Closes the gate and waits (up to `MAX_FORK_WAIT`) for encoders inside to leave. Called by
/// the fork hook with the GVL held, right before the fork.
pub fn before_fork() {
    FORKING.store(true, SeqCst);
    let started = Instant::now();
    while ENCODERS.load(SeqCst) != 0 && started.elapsed() < MAX_FORK_WAIT {
        std::thread::sleep(Duration::from_micros(100));
    }
}

/// Opens the gate again: in the parent after the fork (or after a failed fork), and in the child,
/// where no encoder thread exists, so the count starts from zero.
pub fn after_fork(child: bool) {
    if child {
        ENCODERS.store(0, SeqCst);
    }
    FORKING.store(false, SeqCst);
}
