//! Event hooks, postponed jobs and VM teardown: how the VM calls back into us.

use rb_sys::VALUE;

extern "C" {
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
type RawHook = extern "C" fn(VALUE, *mut rb_sys::rb_trace_arg_t);

fn as_hook_func(hook: RawHook) -> rb_sys::rb_event_hook_func_t {
    // SAFETY: with HOOK_FLAG_RAW_ARG the VM calls the function as (data, rb_trace_arg_t *), which
    // is `RawHook`; rb-sys only types the slot for the plain (event, data, self, id, klass) form.
    unsafe { std::mem::transmute::<RawHook, rb_sys::rb_event_hook_func_t>(hook) }
}

/// One NEWOBJ event, lent to the handler for the length of the VM's call.
pub struct NewObj {
    arg: *mut rb_sys::rb_trace_arg_t,
}

impl NewObj {
    /// The object being allocated (not yet initialised: never call Ruby on it here). Never
    /// allocates or raises.
    pub fn object(&self) -> VALUE {
        // SAFETY: only `newobj_trampoline` makes a `NewObj`, from the trace arg of the NEWOBJ
        // event the VM is calling it for, and lends it to the handler for that call only.
        unsafe { rb_sys::rb_tracearg_object(self.arg) }
    }
}

/// What the hooks run: set once at load (`init_hooks`).
struct Handlers {
    newobj: fn(&NewObj),
    gc_end: fn(),
}

static HANDLERS: std::sync::OnceLock<Handlers> = std::sync::OnceLock::new();

/// Sets what the NEWOBJ and GC-end hooks run. Call once at load, before any hook is installed.
pub fn init_hooks(newobj: fn(&NewObj), gc_end: fn()) {
    let _ = HANDLERS.set(Handlers { newobj, gc_end });
}

extern "C" fn newobj_trampoline(_data: VALUE, arg: *mut rb_sys::rb_trace_arg_t) {
    if let Some(handlers) = HANDLERS.get() {
        (handlers.newobj)(&NewObj { arg });
    }
}

extern "C" fn empty_trampoline(_data: VALUE, _arg: *mut rb_sys::rb_trace_arg_t) {}

extern "C" fn gc_end_trampoline(_data: VALUE, _arg: *mut rb_sys::rb_trace_arg_t) {
    if let Some(handlers) = HANDLERS.get() {
        (handlers.gc_end)();
    }
}

/// The hooks this extension installs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Hook {
    /// Every object allocation, running the `newobj` handler.
    NewObj,
    /// Every object allocation, running nothing: the floor any allocation hook costs.
    NewObjEmpty,
    /// The end of each GC's sweep, running the `gc_end` handler.
    GcEnd,
}

/// Installs or removes `hook`. Needs the GVL; allocates nothing on the Ruby heap; never raises.
/// Removing removes every installation of it.
pub fn set_hook(hook: Hook, installed: bool) {
    let (func, events) = match hook {
        Hook::NewObj => (
            newobj_trampoline as RawHook,
            rb_sys::RUBY_INTERNAL_EVENT_NEWOBJ,
        ),
        Hook::NewObjEmpty => (
            empty_trampoline as RawHook,
            rb_sys::RUBY_INTERNAL_EVENT_NEWOBJ,
        ),
        Hook::GcEnd => (
            gc_end_trampoline as RawHook,
            rb_sys::RUBY_INTERNAL_EVENT_GC_END_SWEEP,
        ),
    };
    if installed {
        // SAFETY: GVL held per the contract; `func` is a function of this extension, which is
        // never unloaded, so it stays valid as long as the VM may call it.
        unsafe {
            rb_add_event_hook2(
                as_hook_func(func),
                events,
                rb_sys::Qnil as VALUE,
                HOOK_FLAG_SAFE | HOOK_FLAG_RAW_ARG,
            )
        };
    } else {
        // SAFETY: GVL held per the contract; removing a hook only unlinks it (the VM defers
        // freeing an entry that is running), whether or not it is installed.
        unsafe { rb_sys::rb_remove_event_hook(as_hook_func(func)) };
    }
}

/// A postponed job as the VM runs it (with the GVL, at a safe point).
pub type Job = extern "C" fn(*mut std::ffi::c_void);

/// Registers `job` once for `postponed_job_trigger` (Ruby >= 3.3); `u32::MAX` if refused. Needs
/// the GVL; call at load.
#[cfg(dh_postponed_job_preregister)]
pub fn postponed_job_preregister(job: Job) -> u32 {
    // SAFETY: GVL held per the contract; `job` is a function of this extension, valid for the
    // life of the process (the extension is never unloaded).
    unsafe { rb_sys::rb_postponed_job_preregister(0, Some(job), std::ptr::null_mut()) }
}

/// Asks the VM to run the preregistered job `handle` soon. Safe from any context, a signal
/// handler, the NEWOBJ hook or a thread that is not a Ruby thread included (Ruby 4's GC threads
/// too: the GC-end hook calls nothing else).
#[cfg(dh_postponed_job_preregister)]
pub fn postponed_job_trigger(handle: u32) {
    if handle != u32::MAX {
        // SAFETY: `handle` came from rb_postponed_job_preregister; vm_trace.c documents
        // triggering as safe from any context.
        unsafe { rb_sys::rb_postponed_job_trigger(handle) };
    }
}

/// Asks the VM to run `job` soon (Ruby < 3.3; the VM dedups by function). Needs a Ruby thread
/// (it reads the caller's execution context); fine inside the NEWOBJ hook and from a signal
/// handler on that thread. A full buffer drops the request; the next sample or GC asks again.
/// Compiled only where the headers lack the 3.3 API (build.rs), and only where they declare
/// this one: Ruby 4.1 removed it.
#[cfg(all(not(dh_postponed_job_preregister), dh_postponed_job_register_one))]
pub fn postponed_job_register_one(job: Job) {
    // SAFETY: rb_postponed_job_register_one only appends to a preallocated buffer (or reports it
    // full); it is meant for signal handlers and hooks.
    unsafe {
        rb_sys::rb_postponed_job_register_one(0, Some(job), std::ptr::null_mut());
    }
}

/// Runs `f` when the VM is torn down (after every Ruby thread has stopped, before the VM's
/// memory is freed). Needs the GVL; the last registration wins.
pub fn at_vm_exit(f: fn()) {
    static AT_EXIT: std::sync::OnceLock<fn()> = std::sync::OnceLock::new();
    extern "C" fn trampoline(_vm: *mut rb_sys::ruby_vm_t) {
        if let Some(f) = AT_EXIT.get() {
            let _ = std::panic::catch_unwind(f);
        }
    }
    let _ = AT_EXIT.set(f);
    // SAFETY: GVL held; `trampoline` is a function of this extension, valid for the life of the
    // process.
    unsafe { rb_sys::ruby_vm_at_exit(Some(trampoline)) };
}
