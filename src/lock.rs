//! The soft lock that serialises commits and updates.
//!
//! Commits and updates call into the VM (WeakMap reads and writes) and the VM may switch threads
//! while they do. Every access happens with the GVL held, and nothing loses the GVL between reading
//! the lock and setting it, so a plain byte is enough: no atomics, no OS mutex. The `WANTED` bit keeps
//! optional work (`try_lock`) away while a mandatory full update (`lock`) is waiting, so the wait is
//! bounded by the current holder finishing.

use std::cell::Cell;

const HELD: u8 = 0b01;
const WANTED: u8 = 0b10;

#[derive(Debug, Default)]
pub struct SoftLock {
    bits: Cell<u8>,
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

    /// Takes the lock only when nobody holds it and nobody waits for it.
    #[must_use]
    pub fn try_lock(&self) -> bool {
        if self.bits.get() != 0 {
            return false;
        }
        self.bits.set(HELD);
        true
    }

    /// Takes the lock, calling `yield_thread` (which lets the holder run) until it is free.
    /// Must not be called by the holder itself: it would wait forever. When `yield_thread` fails
    /// (an exception was delivered to the waiting thread), the wait is abandoned: our WANTED bit
    /// is withdrawn, so optional work is not locked out forever, and the error is returned.
    pub fn lock<E>(&self, mut yield_thread: impl FnMut() -> Result<(), E>) -> Result<(), E> {
        while self.is_held() {
            self.bits.set(self.bits.get() | WANTED);
            if let Err(e) = yield_thread() {
                // Another waiter, if any, sets the bit again on its next turn.
                self.bits.set(self.bits.get() & !WANTED);
                return Err(e);
            }
        }
        // Free: take it, and clear WANTED since the waiter it stood for is us.
        self.bits.set(HELD);
        Ok(())
    }

    /// Releases the lock. A `WANTED` bit set by a waiter stays, so `try_lock` keeps failing until
    /// that waiter has had its turn.
    pub fn unlock(&self) {
        self.bits.set(self.bits.get() & !HELD);
    }

    /// Forgets all state; for a forked child, where the holder thread no longer exists.
    pub fn reset(&self) {
        self.bits.set(0);
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

    #[test]
    fn try_lock_takes_a_free_lock_once() {
        let lock = SoftLock::new();
        assert!(lock.try_lock());
        assert!(lock.is_held());
        assert!(!lock.try_lock());
        lock.unlock();
        assert!(!lock.is_held());
        assert!(lock.try_lock());
    }

    #[test]
    fn try_lock_fails_while_a_waiter_wants_it() {
        let lock = SoftLock::new();
        assert!(lock.try_lock());
        let mut yields = 0;
        lock.lock(|| -> Result<(), ()> {
            yields += 1;
            assert!(lock.is_wanted());
            // Another thread trying its luck while we wait: refused.
            assert!(!lock.try_lock());
            // The holder finishes; WANTED survives its unlock.
            lock.unlock();
            assert!(lock.is_wanted());
            assert!(!lock.try_lock());
            Ok(())
        })
        .unwrap();
        assert_eq!(yields, 1);
        assert!(lock.is_held());
        assert!(!lock.is_wanted());
        lock.unlock();
        assert!(lock.try_lock());
    }

    #[test]
    fn lock_waits_for_as_many_yields_as_the_holder_needs() {
        let lock = SoftLock::new();
        assert!(lock.try_lock());
        let mut yields = 0;
        lock.lock(|| -> Result<(), ()> {
            yields += 1;
            if yields == 5 {
                lock.unlock();
            }
            Ok(())
        })
        .unwrap();
        assert_eq!(yields, 5);
        assert!(lock.is_held());
    }

    #[test]
    fn lock_on_a_free_lock_never_yields() {
        let lock = SoftLock::new();
        lock.lock(|| -> Result<(), ()> { panic!("must not yield") })
            .unwrap();
        assert!(lock.is_held());
    }

    #[test]
    fn reset_clears_both_bits() {
        let lock = SoftLock::new();
        assert!(lock.try_lock());
        lock.lock(|| -> Result<(), ()> {
            lock.reset();
            Ok(())
        })
        .unwrap();
        lock.reset();
        assert!(!lock.is_held() && !lock.is_wanted());
        assert!(lock.try_lock());
    }

    #[test]
    fn an_abandoned_wait_withdraws_wanted() {
        let lock = SoftLock::new();
        assert!(lock.try_lock());
        assert_eq!(lock.lock(|| Err("interrupted")), Err("interrupted"));
        assert!(lock.is_held() && !lock.is_wanted());
        lock.unlock();
        assert!(lock.try_lock(), "optional work can take the lock again");
    }

    #[test]
    fn guard_unlocks_on_drop() {
        let lock = SoftLock::new();
        assert!(lock.try_lock());
        drop(LockGuard(&lock));
        assert!(!lock.is_held());
    }
}
