//! Raw C API calls, each behind a small safe function with its contract. The rest of the crate
//! goes through these (or magnus) and never calls rb-sys directly.

use magnus::{
    rb_sys::{AsRawValue, FromRawValue},
    Error, Value,
};
use rb_sys::{ruby_value_type as T, StableApiDefinition, VALUE};

extern "C" {
    // Exported by libruby (gc.c) but not declared in its public headers. Returns the bytes an
    // object uses, slot included; must only see the types `memsize_of` lets through.
    fn rb_obj_memsize_of(obj: VALUE) -> usize;
}

/// Number of GCs so far. Needs the GVL; never raises or allocates.
pub fn gc_count() -> u64 {
    // SAFETY: reads a counter; safe from any thread holding the GVL, including inside hooks.
    unsafe { rb_sys::rb_gc_count() as u64 }
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

/// Runs a captured Method object with `args`, catching whatever it raises.
pub fn method_call<const N: usize>(method: Value, args: [Value; N]) -> Result<Value, Error> {
    let raw = args.map(|v| v.as_raw());
    let argc = N as std::os::raw::c_int;
    // SAFETY: `method` is a Method object captured at load and registered as a mark object, so it
    // is alive; `raw` holds `argc` live VALUEs (the caller's arguments, on its stack) for the whole
    // call. rb_method_call may raise, and rb_protect (inside `protect`) catches that jump.
    let result = magnus::rb_sys::protect(|| unsafe {
        rb_sys::rb_method_call(argc, raw.as_ptr(), method.as_raw())
    })?;
    // SAFETY: a VALUE returned by a Ruby method call is a valid object reference.
    Ok(unsafe { Value::from_raw(result) })
}

/// What a block made by `method_call_with_block` runs for each set of values yielded to it.
type BlockBody<'a> = &'a mut dyn FnMut(&[VALUE]);

thread_local! {
    /// The body of the block currently running on this thread (a pointer to a `BlockBody` on the
    /// stack of `method_call_with_block`), or null.
    static BLOCK_BODY: std::cell::Cell<*mut std::ffi::c_void> =
        const { std::cell::Cell::new(std::ptr::null_mut()) };
    /// Set when a block body panicked during the current `method_call_with_block`.
    static BLOCK_PANICKED: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// The C function behind the block: hands the yielded values to the current `BlockBody`.
extern "C" fn run_block_body(
    _yielded: VALUE,
    _callback_arg: VALUE,
    argc: std::os::raw::c_int,
    argv: *const VALUE,
    _block_arg: VALUE,
) -> VALUE {
    let body = BLOCK_BODY.with(|b| b.get());
    if !body.is_null() && !argv.is_null() && argc > 0 {
        // SAFETY: the VM passes `argc` live VALUEs at `argv` for the duration of this call.
        let args = unsafe { std::slice::from_raw_parts(argv, argc as usize) };
        // SAFETY: a non-null BLOCK_BODY points at the `BlockBody` that `method_call_with_block`
        // keeps on its stack until the method it calls has returned, and only this thread sees it.
        let body = unsafe { &mut *(body as *mut BlockBody) };
        // A panic must not unwind through the VM's frames: it is caught here, and the whole call
        // then fails, so no caller acts on a walk that skipped an entry.
        if std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| body(args))).is_err() {
            BLOCK_PANICKED.with(|p| p.set(true));
        }
    }
    rb_sys::Qnil as VALUE
}

/// The Proc every `method_call_with_block` passes: made once (at load), so calls allocate nothing.
static BLOCK_PROC: std::sync::OnceLock<magnus::value::Opaque<Value>> = std::sync::OnceLock::new();

/// Makes the shared block Proc. Called once at load, with the GVL; allocates.
pub fn init_block_proc(ruby: &magnus::Ruby) -> Result<(), Error> {
    // SAFETY: rb_proc_new only allocates a Proc around `run_block_body` (a C function that never
    // raises or unwinds); protect catches a NoMemoryError.
    let raw = magnus::rb_sys::protect(|| unsafe {
        rb_sys::rb_proc_new(Some(run_block_body), rb_sys::Qnil as VALUE)
    })?;
    // SAFETY: a VALUE the VM just returned.
    let block = unsafe { Value::from_raw(raw) };
    ruby.gc_register_mark_object(block);
    let _ = BLOCK_PROC.set(block.into());
    Ok(())
}

/// `method_call`, with a block that runs `body` on whatever is yielded to it. `body` must not
/// raise, call back into Ruby, or allocate Ruby objects. Allocates nothing itself.
pub fn method_call_with_block<const N: usize>(
    ruby: &magnus::Ruby,
    method: Value,
    args: [Value; N],
    mut body: impl FnMut(&[VALUE]),
) -> Result<(), Error> {
    let Some(block) = BLOCK_PROC.get() else {
        return Err(crate::errors::heap_error(
            ruby,
            "datadog_heap: block Proc not made at load",
        ));
    };
    let block = ruby.get_inner(*block).as_raw();
    let raw = args.map(|v| v.as_raw());
    let argc = N as std::os::raw::c_int;
    let mut body: BlockBody = &mut body;
    let previous = BLOCK_BODY.with(|b| b.replace(&mut body as *mut BlockBody as *mut _));
    let panicked_before = BLOCK_PANICKED.with(|p| p.replace(false));
    // SAFETY: as in `method_call`; `block` is the Proc made at load, registered as a mark object.
    // `body` stays on this stack frame until the call returns, after which the pointer to it is
    // taken down again, so `run_block_body` never sees it dangling.
    let result = magnus::rb_sys::protect(|| unsafe {
        rb_sys::rb_method_call_with_block(argc, raw.as_ptr(), method.as_raw(), block)
    });
    BLOCK_BODY.with(|b| b.set(previous));
    if BLOCK_PANICKED.with(|p| p.replace(panicked_before)) {
        return Err(crate::errors::heap_error(
            ruby,
            "internal error (Rust panic) in a block body; the call's result was discarded",
        ));
    }
    result.map(|_| ())
}

/// The builtin type of a heap object, `None` for immediates (Integer, Symbol, nil, ...).
pub fn heap_type(raw: VALUE) -> Option<T> {
    let api = rb_sys::stable_api::get_default();
    if api.special_const_p(raw) {
        return None;
    }
    // SAFETY: not a special constant, so `raw` points at a live heap slot (the caller holds a
    // reference to it or got it from the VM just now).
    Some(unsafe { api.builtin_type(raw) })
}

/// Is this object frozen? Never raises or allocates.
pub fn is_frozen(object: Value) -> bool {
    let raw = object.as_raw();
    let api = rb_sys::stable_api::get_default();
    if api.special_const_p(raw) {
        return true;
    }
    // SAFETY: a heap object handed to us by the VM (a WeakMap read) and still referenced.
    unsafe { api.frozen_p(raw) }
}

/// Types whose size `rb_obj_memsize_of` can report; the rest (internal VM objects, freed or
/// moved slots) are known to trip it up and report 0.
fn memsize_supported(t: T) -> bool {
    matches!(
        t,
        T::RUBY_T_OBJECT
            | T::RUBY_T_CLASS
            | T::RUBY_T_MODULE
            | T::RUBY_T_FLOAT
            | T::RUBY_T_STRING
            | T::RUBY_T_REGEXP
            | T::RUBY_T_ARRAY
            | T::RUBY_T_HASH
            | T::RUBY_T_STRUCT
            | T::RUBY_T_BIGNUM
            | T::RUBY_T_FILE
            | T::RUBY_T_DATA
            | T::RUBY_T_MATCH
            | T::RUBY_T_COMPLEX
            | T::RUBY_T_RATIONAL
            | T::RUBY_T_SYMBOL
    )
}

/// Bytes used by `object` as `ObjectSpace.memsize_of` counts them (0 for immediates and
/// internal objects). Needs the GVL. For T_DATA it runs the extension's own size function.
pub fn memsize_of(object: Value) -> usize {
    let raw = object.as_raw();
    match heap_type(raw) {
        // SAFETY: a live user-visible heap object of a type rb_obj_memsize_of handles.
        Some(t) if memsize_supported(t) => unsafe { rb_obj_memsize_of(raw) },
        _ => 0,
    }
}

/// Internal VM objects that must never be tracked: not user-visible, or hidden (no class).
/// Never allocates or raises; usable inside the allocation hook.
pub fn is_internal_object(raw: VALUE) -> bool {
    let Some(t) = heap_type(raw) else {
        return false;
    };
    if matches!(
        t,
        T::RUBY_T_NONE
            | T::RUBY_T_IMEMO
            | T::RUBY_T_NODE
            | T::RUBY_T_ICLASS
            | T::RUBY_T_ZOMBIE
            | T::RUBY_T_MOVED
    ) {
        return true;
    }
    let api = rb_sys::stable_api::get_default();
    // SAFETY: a heap object (checked above); reading its class field has no side effect.
    unsafe { api.rbasic_class(raw).is_none() }
}
