//! Calling Ruby methods without looking names up: captured Method objects, and a block made once.

use magnus::{
    rb_sys::{AsRawValue, FromRawValue},
    Error, Value,
};
use rb_sys::VALUE;

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

/// The values yielded to a block made by `method_call_with_block`, lent to its body for one
/// yield.
pub struct Yielded<'a>(&'a [VALUE]);

impl Yielded<'_> {
    /// The `i`th value yielded, if there is one.
    pub fn get(&self, i: usize) -> Option<Value> {
        // SAFETY: the VM yielded these live VALUEs for the duration of the block call, which is
        // as long as this `Yielded` is lent.
        self.0.get(i).map(|&raw| unsafe { Value::from_raw(raw) })
    }
}

/// What a block made by `method_call_with_block` runs for each set of values yielded to it.
type BlockBody<'a> = &'a mut dyn FnMut(Yielded<'_>);

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
        if std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| body(Yielded(args)))).is_err() {
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
    mut body: impl FnMut(Yielded<'_>),
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
