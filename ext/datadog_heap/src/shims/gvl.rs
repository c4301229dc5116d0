//! The GVL: the current thread, yielding it, and running Rust code without it.

use std::cell::UnsafeCell;
use std::ffi::c_void;

use magnus::Error;
use rb_sys::VALUE;

/// The current Ruby thread's object. Needs the GVL; allocates nothing (usable in the hook).
pub fn current_thread() -> VALUE {
    // SAFETY: called with the GVL from a Ruby thread; returns the existing thread object.
    unsafe { rb_sys::rb_thread_current() }
}

/// Lets other Ruby threads run. Needs the GVL and releases it for a moment: callers must hold
/// no borrow of shared state across it. `rb_thread_schedule` also delivers pending interrupts
/// (Thread#raise, Thread#kill, Timeout), so it runs under rb_protect and such an exception
/// comes back as an error instead of unwinding through our frames.
pub fn thread_schedule() -> Result<(), magnus::Error> {
    magnus::rb_sys::protect(|| {
        // SAFETY: called from a Ruby thread that holds the GVL (all callers are Ruby methods),
        // inside rb_protect, which catches the jump an interrupt would make.
        unsafe { rb_sys::rb_thread_schedule() };
        rb_sys::Qnil as VALUE
    })
    .map(|_| ())
}

/// How many times `without_gvl` handles pending interrupts and tries again before it gives up.
const GVL_RELEASE_ATTEMPTS: usize = 3;

/// What `without_gvl` does when the VM keeps refusing to release the GVL.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IfRefused {
    /// Runs `f` with the GVL held (told so by its argument).
    RunWithGvl,
    /// Gives up: `Ok(None)`, `f` not run.
    Skip,
}

/// Runs `f` with the GVL released; `Ok(None)` if it panicked (or was skipped, see `IfRefused`).
/// `f` must not touch the VM; it is told whether it runs with the GVL held. `cancel`, when
/// given, is the unblocking function: the VM calls it (from another thread, or a signal) to
/// interrupt `f` (Thread#kill, Timeout, Ctrl-C); it must make `f` return soon.
///
/// Ruby will not release the GVL while any interrupt is pending for this thread, and a long stretch
/// of GVL-held work with no interrupt check (a full update walking the WeakMap) usually ends with
/// one pending: the timer's "another thread wants the GVL". So when the release is refused, the
/// interrupts are handled (`rb_thread_schedule`, which also lets those threads run) and the release
/// tried again; an exception that handling raises (Thread#raise, Timeout) is returned, `f` not run.
/// After `GVL_RELEASE_ATTEMPTS` refusals, `if_refused` decides.
pub fn without_gvl<F: FnOnce(bool) -> T, T>(
    f: F,
    cancel: Option<&(dyn Fn() + Sync)>,
    if_refused: IfRefused,
) -> Result<Option<T>, Error> {
    struct Call<F, T> {
        f: Option<F>,
        out: Option<T>,
    }
    extern "C" fn trampoline<F: FnOnce(bool) -> T, T>(data: *mut c_void) -> *mut c_void {
        // SAFETY: `data` is the `Call` below, alive on the caller's stack for the whole call and
        // touched by no one else meanwhile (the unblocking function gets `cancel`, not this).
        let call = unsafe { &mut *(data as *mut Call<F, T>) };
        if let Some(f) = call.f.take() {
            // A panic must not cross the C frame of rb_thread_call_without_gvl2.
            call.out = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| f(false))).ok();
        }
        std::ptr::null_mut()
    }
    unsafe extern "C" fn unblock(data: *mut c_void) {
        // SAFETY: `data` is `cancel` below (a reference to a `&dyn Fn + Sync`), alive until
        // rb_thread_call_without_gvl2 returns, which is the only time the VM may call this.
        let cancel = unsafe { &*(data as *const &(dyn Fn() + Sync)) };
        let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(cancel));
    }
    let mut call = Call {
        f: Some(f),
        out: None,
    };
    let (ubf, ubf_data): (rb_sys::rb_unblock_function_t, *mut c_void) = match &cancel {
        Some(cancel) => (
            Some(unblock),
            cancel as *const &(dyn Fn() + Sync) as *mut c_void,
        ),
        None => (None, std::ptr::null_mut()),
    };
    for attempt in 0..GVL_RELEASE_ATTEMPTS {
        if attempt > 0 {
            thread_schedule()?;
        }
        // SAFETY: called from a Ruby thread holding the GVL; the trampoline makes no VM call, and
        // the unblocking function only runs `cancel`, which is Sync. The "2" variant never checks
        // interrupts after the call (the plain one does, and an exception raised there would jump
        // over our frames); with an interrupt pending it returns without calling the trampoline.
        unsafe {
            rb_sys::rb_thread_call_without_gvl2(
                Some(trampoline::<F, T>),
                &mut call as *mut Call<F, T> as *mut c_void,
                ubf,
                ubf_data,
            );
        }
        if call.f.is_none() {
            return Ok(call.out);
        }
    }
    // Still refused: the interrupt is delivered at the VM's next check, once we are back in Ruby.
    Ok(match if_refused {
        IfRefused::Skip => None,
        IfRefused::RunWithGvl => (call.f.take())
            .and_then(|f| std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| f(true))).ok()),
    })
}

// Process-wide state that only threads holding the GVL touch.

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

/// Defines `fn NAME<R>(f: impl FnOnce(&mut T) -> R) -> R` over the `GvlCell<T>` `CELL`, for a
/// module whose every caller holds the GVL and whose closures make no VM call, as its docs state:
/// the one place where that contract meets `GvlCell::with`, so no module writes it out again.
///
/// `crate::gvl_guarded!(fn with over RUNTIME: Runtime);`
#[macro_export]
macro_rules! gvl_guarded {
    ($vis:vis fn $name:ident over $cell:path : $t:ty) => {
        #[allow(unsafe_code)] // the calling module's contract, see `gvl_guarded`'s docs
        $vis fn $name<R>(f: impl FnOnce(&mut $t) -> R) -> R {
            // SAFETY: every caller holds the GVL and `f` makes no call that could release it,
            // allocate a Ruby object or re-enter (the calling module's contract).
            unsafe { $cell.with(f) }
        }
    };
}
