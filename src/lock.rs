//! The soft lock that serialises commits and updates.
//!
//! Commits and updates call into the VM (WeakMap reads and writes) and the VM may switch threads
//! while they do. Every access happens with the GVL held, and nothing loses the GVL between reading
//! the lock and setting it, so plain cells are enough: no atomics, no OS mutex. The `WANTED` bit
//! keeps optional work (`try_lock`) away while a mandatory full update (`lock`) is waiting, so the
//! wait is bounded by the current holder finishing.
//!
//! The lock knows which thread holds it. The VM runs signal traps and finalizers inside our own
//! VM calls, on the thread that holds the lock; such code asking for the lock again would wait for
//! itself forever, so `lock` refuses it with [`HeapError::Reentrant`] instead. Waits for another
//! thread are bounded by [`wait_limit_ns`].

use std::cell::Cell;
use std::sync::atomic::{AtomicI64, Ordering};

use crate::error::{HeapError, Result};

const HELD: u8 = 0b01;
const WANTED: u8 = 0b10;

/// Identifies a VM thread (the binding uses the thread object's VALUE); 0 is nobody.
pub type ThreadId = u64;

/// Longest a `lock` call waits for another thread, in nanoseconds (see [`set_wait_limit_ns`]).
/// A full update of 300k records takes about 100 ms, so 10 s means the holder is stuck.
pub const DEFAULT_WAIT_LIMIT_NS: i64 = 10_000_000_000;

static WAIT_LIMIT_NS: AtomicI64 = AtomicI64::new(DEFAULT_WAIT_LIMIT_NS);

/// The wait bound in force for every lock in the process.
pub fn wait_limit_ns() -> i64 {
    WAIT_LIMIT_NS.load(Ordering::Relaxed)
}

/// Changes the wait bound (tests shorten it); values below 1 ms are raised to 1 ms.
pub fn set_wait_limit_ns(limit: i64) {
    WAIT_LIMIT_NS.store(limit.max(1_000_000), Ordering::Relaxed);
}

#[derive(Debug, Default)]
pub struct SoftLock {
    bits: Cell<u8>,
    holder: Cell<ThreadId>,
}

impl SoftLock {
    pub fn new() -> Self {
        Self::default()
    }

    /// True while some operation holds the lock (possibly one suspended in another thread).
    pub fn is_held(&self) -> bool {
        self.bits.get() & HELD != 0
    }

    pub fn is_wanted(&self) -> bool {
        self.bits.get() & WANTED != 0
    }

    /// The thread holding the lock, if any.
    pub fn holder(&self) -> Option<ThreadId> {
        self.is_held().then(|| self.holder.get())
    }

    /// Takes the lock for `me` only when nobody holds it and nobody waits for it.
    #[must_use]
    pub fn try_lock(&self, me: ThreadId) -> bool {
        if self.bits.get() != 0 {
            return false;
        }
        self.take(me);
        true
    }

    /// Takes the lock for `me`, calling `wait` (which lets the holder run once, then reads the
    /// monotonic clock) until it is free. Refuses at once with [`HeapError::Reentrant`] when `me`
    /// already holds it (the wait would never end). Past [`wait_limit_ns`] after `started_ns` the
    /// wait ends with [`HeapError::LockTimeout`]. When `wait` fails (an exception was delivered to
    /// the waiting thread) the wait is abandoned with that error. An abandoned wait withdraws its
    /// WANTED bit, so optional work is not locked out forever.
    pub fn lock(
        &self,
        me: ThreadId,
        started_ns: i64,
        wait: &mut dyn FnMut() -> Result<i64>,
    ) -> Result<()> {
        if self.holder() == Some(me) {
            return Err(HeapError::Reentrant);
        }
        let limit = wait_limit_ns();
        let mut now = started_ns;
        while self.is_held() {
            let waited = now.saturating_sub(started_ns);
            let outcome = if waited > limit {
                Err(HeapError::LockTimeout {
                    waited_ms: waited / 1_000_000,
                })
            } else {
                self.bits.set(self.bits.get() | WANTED);
                wait()
            };
            match outcome {
                Ok(at) => now = at,
                Err(e) => {
                    // Another waiter, if any, sets the bit again on its next turn.
                    self.bits.set(self.bits.get() & !WANTED);
                    return Err(e);
                }
            }
        }
        // Free: take it, and clear WANTED since the waiter it stood for is us.
        self.take(me);
        Ok(())
    }

    fn take(&self, me: ThreadId) {
        self.bits.set(HELD);
        self.holder.set(me);
    }

    /// Releases the lock. A `WANTED` bit set by a waiter stays, so `try_lock` keeps failing until
    /// that waiter has had its turn.
    pub fn unlock(&self) {
        self.bits.set(self.bits.get() & !HELD);
        self.holder.set(0);
    }

    /// Forgets all state; for a forked child, where the holder thread no longer exists.
    pub fn reset(&self) {
        self.bits.set(0);
        self.holder.set(0);
    }
}

/// Releases the lock when dropped, so an error or a panic in a locked section cannot leave it held.
pub(crate) struct LockGuard<'a>(pub(crate) &'a SoftLock);

impl Drop for LockGuard<'_> {
    fn drop(&mut self) {
        self.0.unlock();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ME: ThreadId = 1;
    const OTHER: ThreadId = 2;

    #[test]
    fn try_lock_takes_a_free_lock_once() {
        let lock = SoftLock::new();
        assert!(lock.try_lock(ME));
        assert_eq!(lock.holder(), Some(ME));
        assert!(!lock.try_lock(OTHER));
        lock.unlock();
        assert_eq!(lock.holder(), None);
        assert!(lock.try_lock(OTHER));
    }

    #[test]
    fn try_lock_fails_while_a_waiter_wants_it() {
        let lock = SoftLock::new();
        assert!(lock.try_lock(OTHER));
        let mut yields = 0;
        lock.lock(ME, 0, &mut || {
            yields += 1;
            assert!(lock.is_wanted());
            // A third thread trying its luck while we wait: refused.
            assert!(!lock.try_lock(3));
            // The holder finishes; WANTED survives its unlock.
            lock.unlock();
            assert!(lock.is_wanted());
            assert!(!lock.try_lock(3));
            Ok(0)
        })
        .unwrap();
        assert_eq!(yields, 1);
        assert_eq!(lock.holder(), Some(ME));
        assert!(!lock.is_wanted());
        lock.unlock();
        assert!(lock.try_lock(3));
    }

    #[test]
    fn lock_waits_for_as_many_yields_as_the_holder_needs() {
        let lock = SoftLock::new();
        assert!(lock.try_lock(OTHER));
        let mut yields = 0;
        lock.lock(ME, 0, &mut || {
            yields += 1;
            if yields == 5 {
                lock.unlock();
            }
            Ok(0)
        })
        .unwrap();
        assert_eq!(yields, 5);
        assert_eq!(lock.holder(), Some(ME));
    }

    #[test]
    fn lock_on_a_free_lock_never_yields() {
        let lock = SoftLock::new();
        lock.lock(ME, 0, &mut || panic!("must not yield")).unwrap();
        assert!(lock.is_held());
    }

    #[test]
    fn the_holder_asking_again_is_refused_at_once() {
        let lock = SoftLock::new();
        assert!(lock.try_lock(ME));
        let refused = lock.lock(ME, 0, &mut || panic!("must not wait for itself"));
        assert_eq!(refused, Err(HeapError::Reentrant));
        // The holder's own lock is untouched, and nobody is marked as waiting.
        assert_eq!(lock.holder(), Some(ME));
        assert!(!lock.is_wanted());
        assert!(!lock.try_lock(ME), "try_lock is no way around it either");
    }

    #[test]
    fn a_wait_ends_with_a_timeout_past_the_limit() {
        let lock = SoftLock::new();
        assert!(lock.try_lock(OTHER));
        let mut yields = 0;
        let outcome = lock.lock(ME, 5, &mut || {
            yields += 1;
            Ok(5 + yields * 1_000_000_000)
        });
        let limit_s = wait_limit_ns() / 1_000_000_000;
        assert!(
            matches!(outcome, Err(HeapError::LockTimeout { waited_ms }) if waited_ms > limit_s * 1000)
        );
        assert_eq!(yields, limit_s + 1);
        assert!(lock.is_held() && !lock.is_wanted());
        assert_eq!(lock.holder(), Some(OTHER));
    }

    #[test]
    fn reset_clears_both_bits_and_the_holder() {
        let lock = SoftLock::new();
        assert!(lock.try_lock(OTHER));
        lock.lock(ME, 0, &mut || {
            lock.reset();
            Ok(0)
        })
        .unwrap();
        lock.reset();
        assert!(!lock.is_held() && !lock.is_wanted());
        assert_eq!(lock.holder(), None);
        assert!(lock.try_lock(ME));
    }

    #[test]
    fn an_abandoned_wait_withdraws_wanted() {
        let lock = SoftLock::new();
        assert!(lock.try_lock(OTHER));
        let outcome = lock.lock(ME, 0, &mut || Err(HeapError::Host("interrupted".into())));
        assert_eq!(outcome, Err(HeapError::Host("interrupted".into())));
        assert!(lock.is_held() && !lock.is_wanted());
        lock.unlock();
        assert!(lock.try_lock(ME), "optional work can take the lock again");
    }

    #[test]
    fn guard_unlocks_on_drop() {
        let lock = SoftLock::new();
        assert!(lock.try_lock(ME));
        drop(LockGuard(&lock));
        assert!(!lock.is_held());
        assert_eq!(lock.holder(), None);
    }
}
