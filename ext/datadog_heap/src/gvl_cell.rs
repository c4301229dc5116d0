//! Process-wide state that only threads holding the GVL touch.

use std::cell::UnsafeCell;

/// A global guarded by the GVL instead of a lock. Ruby runs one thread at a time (per Ractor;
/// non-main Ractors never reach our state), so a caller that holds the GVL has exclusive access
/// for as long as it does not let the VM switch threads.
pub struct GvlCell<T>(UnsafeCell<T>);

// SAFETY: every access goes through `with`, whose contract (GVL held, no VM call inside `f`)
// means at most one thread touches the value at a time.
unsafe impl<T> Sync for GvlCell<T> {}

impl<T> GvlCell<T> {
    pub const fn new(value: T) -> Self {
        GvlCell(UnsafeCell::new(value))
    }

    /// Runs `f` with exclusive access.
    ///
    /// # Safety
    /// The caller holds the GVL, and `f` makes no call that could release it or re-enter `with`
    /// on the same cell (no Ruby method calls, no allocation of Ruby objects).
    pub unsafe fn with<R>(&self, f: impl FnOnce(&mut T) -> R) -> R {
        // SAFETY: exclusive per the contract above.
        f(unsafe { &mut *self.0.get() })
    }
}
