//! Raw C API calls, each behind a small safe function with its contract. The rest of the crate
//! goes through these (or magnus) and never calls rb-sys directly.

mod frames;
pub mod objspace;
pub use frames::*;

use magnus::{
    rb_sys::{AsRawValue, FromRawValue},
    Error, Value,
};
use rb_sys::{ruby_value_type as T, StableApiDefinition, VALUE};

extern "C" {
    // Exported by libruby (gc.c) but not declared in its public headers. Returns the bytes an
    // object uses, slot included; must only see the types `memsize_of` lets through.
    fn rb_obj_memsize_of(obj: VALUE) -> usize;
    // Declared here rather than taken from rb-sys: the flags argument is a bit set
    // (SAFE | RAW_ARG), which rb-sys types as an enum that cannot hold the combination.
    fn rb_add_event_hook2(
        func: rb_sys::rb_event_hook_func_t,
        events: rb_sys::rb_event_flag_t,
        data: VALUE,
        flags: u32,
    );
}

const HOOK_FLAG_SAFE: u32 = 1;
const HOOK_FLAG_RAW_ARG: u32 = 4;

/// An event hook as the VM calls it with RAW_ARG: (data, trace arg).
pub type RawHook = unsafe extern "C" fn(VALUE, *mut rb_sys::rb_trace_arg_t);

fn as_hook_func(hook: RawHook) -> rb_sys::rb_event_hook_func_t {
    // SAFETY: with HOOK_FLAG_RAW_ARG the VM calls the function as (data, rb_trace_arg_t *), which
    // is `RawHook`; rb-sys only types the slot for the plain (event, data, self, id, klass) form.
    unsafe { std::mem::transmute::<RawHook, rb_sys::rb_event_hook_func_t>(hook) }
}

/// Installs `hook` for `events` (internal events included). Needs the GVL; allocates nothing
/// on the Ruby heap; never raises.
pub fn add_event_hook(hook: RawHook, events: rb_sys::rb_event_flag_t) {
    // SAFETY: GVL held per the contract; `hook` is a function of this extension, which is never
    // unloaded, so it stays valid as long as the VM may call it.
    unsafe {
        rb_add_event_hook2(
            as_hook_func(hook),
            events,
            rb_sys::Qnil as VALUE,
            HOOK_FLAG_SAFE | HOOK_FLAG_RAW_ARG,
        )
    };
}

/// Removes every installation of `hook`. Needs the GVL; never raises.
pub fn remove_event_hook(hook: RawHook) {
    // SAFETY: GVL held per the contract; removing a hook only unlinks it (the VM defers freeing
    // an entry that is running), whether or not it is installed.
    unsafe { rb_sys::rb_remove_event_hook(as_hook_func(hook)) };
}

/// The current Ruby thread's object. Needs the GVL; allocates nothing (usable in the hook).
pub fn current_thread() -> VALUE {
    // SAFETY: called with the GVL from a Ruby thread; returns the existing thread object.
    unsafe { rb_sys::rb_thread_current() }
}

/// Marks (and pins) `value` during a GC mark phase. Never allocates or raises.
pub fn gc_mark(value: VALUE) {
    if value == 0 {
        return;
    }
    // SAFETY: called from a mark function, during marking, with a VALUE this extension keeps
    // alive (so it names a live object or an immediate).
    unsafe { rb_sys::rb_gc_mark(value) };
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

/// How many times `without_gvl` handles pending interrupts and tries again before it gives up and
/// runs `f` with the GVL held.
const GVL_RELEASE_ATTEMPTS: usize = 3;

/// Runs `f` with the GVL released; `Ok(None)` if it panicked. `f` must not touch the VM; it is told
/// whether it runs with the GVL held (the fallback below).
///
/// Ruby will not release the GVL while any interrupt is pending for this thread, and a long stretch
/// of GVL-held work with no interrupt check (a full update walking the WeakMap) usually ends with
/// one pending: the timer's "another thread wants the GVL". So when the release is refused, the
/// interrupts are handled (`rb_thread_schedule`, which also lets those threads run) and the release
/// tried again; an exception that handling raises (Thread#raise, Timeout) is returned, `f` not run.
/// After `GVL_RELEASE_ATTEMPTS` refusals `f` runs with the GVL held.
pub fn without_gvl<F: FnOnce(bool) -> T, T>(f: F) -> Result<Option<T>, Error> {
    struct Call<F, T> {
        f: Option<F>,
        out: Option<T>,
    }
    extern "C" fn trampoline<F: FnOnce(bool) -> T, T>(
        data: *mut std::ffi::c_void,
    ) -> *mut std::ffi::c_void {
        // SAFETY: `data` is the `Call` below, alive on the caller's stack for the whole call.
        let call = unsafe { &mut *(data as *mut Call<F, T>) };
        if let Some(f) = call.f.take() {
            // A panic must not cross the C frame of rb_thread_call_without_gvl.
            call.out = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| f(false))).ok();
        }
        std::ptr::null_mut()
    }
    let mut call = Call {
        f: Some(f),
        out: None,
    };
    for attempt in 0..GVL_RELEASE_ATTEMPTS {
        if attempt > 0 {
            thread_schedule()?;
        }
        // SAFETY: called from a Ruby thread holding the GVL; the trampoline makes no VM call, and
        // no unblocking function is given. The "2" variant never checks interrupts after the call
        // (the plain one does, and an exception raised there would jump over our frames); with an
        // interrupt pending it returns without calling the trampoline at all.
        unsafe {
            rb_sys::rb_thread_call_without_gvl2(
                Some(trampoline::<F, T>),
                &mut call as *mut Call<F, T> as *mut std::ffi::c_void,
                None,
                std::ptr::null_mut(),
            );
        }
        if call.f.is_none() {
            return Ok(call.out);
        }
    }
    // Still refused: run it here, with the GVL held; the interrupt is delivered at the VM's next
    // check, once we are back in Ruby.
    Ok(call
        .f
        .take()
        .and_then(|f| std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| f(true))).ok()))
}

extern "C" {
    // RCLASS_SUPER: the superclass slot as it is (an include class, or 0/nil past BasicObject).
    // Unlike rb_class_superclass it never raises and asserts nothing about its argument's type.
    fn rb_class_get_superclass(klass: VALUE) -> VALUE;
}

/// The bytes of a T_STRING as UTF-8; `None` for anything else or for bytes that are not UTF-8.
///
/// # Safety
/// The string must stay alive and unchanged for `'a`: the caller runs no Ruby code and lets no
/// GC happen while it uses the slice.
pub unsafe fn borrow_str<'a>(value: VALUE) -> Option<&'a str> {
    if heap_type(value) != Some(T::RUBY_T_STRING) {
        return None;
    }
    // SAFETY: a T_STRING (checked above); pointer and length describe its bytes, which the
    // caller keeps in place for 'a.
    let bytes = unsafe {
        std::slice::from_raw_parts(
            rb_sys::RSTRING_PTR(value) as *const u8,
            rb_sys::RSTRING_LEN(value) as usize,
        )
    };
    std::str::from_utf8(bytes).ok()
}

/// The object's class, singleton classes skipped; `None` for a hidden object. Allocates nothing.
pub fn real_class_of(object: VALUE) -> Option<VALUE> {
    let api = rb_sys::stable_api::get_default();
    // SAFETY: `object` is a heap object the VM handed us; reading its class has no side effect.
    let klass = unsafe { api.rbasic_class(object) }?;
    // SAFETY: a class VALUE; rb_class_real walks singleton and include classes and allocates
    // nothing.
    let real = unsafe { rb_sys::rb_class_real(klass.as_ptr() as VALUE) };
    is_class_like(real).then_some(real)
}

fn is_class_like(value: VALUE) -> bool {
    matches!(heap_type(value), Some(T::RUBY_T_CLASS))
}

/// The class's permanent name (a String the class holds), if it has one. Allocates nothing.
pub fn class_path_if_named(class: VALUE) -> Option<VALUE> {
    if !is_class_like(class) {
        return None;
    }
    // SAFETY: a T_CLASS; rb_mod_name returns the cached name or nil, without allocating.
    let name = unsafe { rb_sys::rb_mod_name(class) };
    (name != rb_sys::Qnil as VALUE).then_some(name)
}

/// The superclass, include classes skipped; `None` past BasicObject, for a class not yet
/// initialised, or for anything that is not a class. Never raises or allocates.
pub fn superclass_of(class: VALUE) -> Option<VALUE> {
    let mut current = class;
    for _ in 0..64 {
        if !matches!(heap_type(current), Some(T::RUBY_T_CLASS | T::RUBY_T_ICLASS)) {
            return None;
        }
        // SAFETY: a class or include class (checked above); reads its superclass slot.
        let next = unsafe { rb_class_get_superclass(current) };
        match heap_type(next) {
            Some(T::RUBY_T_CLASS) => return Some(next),
            Some(T::RUBY_T_ICLASS) => current = next,
            _ => return None,
        }
    }
    None
}

/// `:total_allocated_objects`, a static Symbol (never collected), made by `init_gc_stat`.
static TOTAL_ALLOCATED_KEY: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Makes the GC.stat key `total_allocated_objects` reads, and asks for it once, so that the VM's
/// own GC.stat symbol table exists before the hook reads the counter (its first use interns
/// symbols). Needs the GVL; call once at load.
pub fn init_gc_stat() {
    let name = c"total_allocated_objects";
    // SAFETY: GVL held; `name` is a NUL-terminated literal. rb_intern interns (allocating at most
    // once per name) and raises nothing for a valid name; the ID of a literal name is static.
    let id = unsafe { rb_sys::rb_intern(name.as_ptr()) };
    // SAFETY: a static Symbol for a valid ID; allocates nothing.
    let key = unsafe { rb_sys::rb_id2sym(id) };
    TOTAL_ALLOCATED_KEY.store(key as u64, std::sync::atomic::Ordering::Relaxed);
    let _ = total_allocated_objects();
    init_total_moved_key();
}

/// Objects the VM has allocated since it started (`GC.stat(:total_allocated_objects)`). Needs
/// the GVL; after `init_gc_stat` it allocates nothing and never raises (a known key), so the
/// NEWOBJ hook may call it.
pub fn total_allocated_objects() -> u64 {
    let key = TOTAL_ALLOCATED_KEY.load(std::sync::atomic::Ordering::Relaxed) as VALUE;
    if key == 0 {
        return 0;
    }
    // SAFETY: GVL held per the contract; `key` is a Symbol rb_gc_stat knows in every Ruby we
    // support, for which it returns the counter without allocating or raising.
    unsafe { rb_sys::rb_gc_stat(key) as u64 }
}

/// `:total_moved_objects`, a static Symbol, set by `init_gc_stat` only when this Ruby's
/// `GC.stat` knows the key (0 otherwise: `rb_gc_stat` raises for an unknown key).
static TOTAL_MOVED_KEY: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Makes the `total_moved_objects` key and checks, under rb_protect, that `rb_gc_stat` answers
/// it. Needs the GVL; called once at load by `init_gc_stat`.
fn init_total_moved_key() {
    let name = c"total_moved_objects";
    // SAFETY: as in `init_gc_stat`.
    let id = unsafe { rb_sys::rb_intern(name.as_ptr()) };
    // SAFETY: a static Symbol for a valid ID; allocates nothing.
    let key = unsafe { rb_sys::rb_id2sym(id) };
    let known = magnus::rb_sys::protect(|| {
        // SAFETY: GVL held, inside rb_protect, which catches the ArgumentError an unknown key
        // raises.
        unsafe { rb_sys::rb_gc_stat(key) };
        rb_sys::Qnil as VALUE
    })
    .is_ok();
    if known {
        TOTAL_MOVED_KEY.store(key as u64, std::sync::atomic::Ordering::Relaxed);
    }
}

/// Objects compaction has moved since the VM started (`GC.stat(:total_moved_objects)`; 0 on a
/// Ruby without the key). Needs the GVL; allocates nothing and never raises (the key was checked
/// at load), so the NEWOBJ hook may call it.
pub fn total_moved_objects() -> u64 {
    let key = TOTAL_MOVED_KEY.load(std::sync::atomic::Ordering::Relaxed) as VALUE;
    if key == 0 {
        return 0;
    }
    // SAFETY: GVL held per the contract; `key` is a Symbol `init_total_moved_key` saw
    // rb_gc_stat answer, which it then does without allocating or raising.
    unsafe { rb_sys::rb_gc_stat(key) as u64 }
}

/// The period in which frame handles (iseqs, method entries) keep their addresses: it changes
/// at every GC (which may free a handle and reuse its slot) and at every object compaction
/// moves. A GC count alone is not enough: Ruby 3.1 compacts incrementally, during the lazy sweep
/// that follows a major GC with `GC.auto_compact`, so objects move between two allocations while
/// `rb_gc_count` stays put. The GC count in the high 32 bits, the moved count in the low 32: two
/// periods share an epoch only 2^32 GCs or 2^32 moves apart with nothing else changing. Needs
/// the GVL; allocation-free and never raises (hook-safe).
pub fn frame_epoch(gc_count: u64) -> u64 {
    (gc_count << 32) | (total_moved_objects() & 0xffff_ffff)
}

/// Runs `f` when the VM is torn down (after every Ruby thread has stopped, before the VM's
/// memory is freed). Needs the GVL.
pub fn at_vm_exit(f: unsafe extern "C" fn(*mut rb_sys::ruby_vm_t)) {
    // SAFETY: GVL held; `f` is a function of this extension, valid for the life of the process.
    unsafe { rb_sys::ruby_vm_at_exit(Some(f)) };
}
