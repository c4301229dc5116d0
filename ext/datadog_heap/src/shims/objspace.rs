//! The VM's own walk of references (what `ObjectSpace.reachable_objects_from` and
//! `reachable_objects_from_root` use), and descriptions of the internal objects it passes
//! through. For the retainer search (recorder/retainers.rs).
//!
//! Contract of every function here: needs the GVL, must not run during a GC (Ruby calls
//! `rb_bug` then: never call them from a GC callback or the allocation hook), never raises,
//! allocates no Ruby object. The callbacks run inside the VM's marking code: they must not
//! allocate Ruby objects, raise or call Ruby either; a panic in one is caught and ends nothing
//! but that callback.

use std::ffi::{c_char, c_void, CStr};
use std::panic::{catch_unwind, AssertUnwindSafe};

use rb_sys::{ruby_value_type as T, StableApiDefinition, VALUE};

use super::heap_type;

extern "C" {
    // Exported by libruby (gc.c), declared in its internal headers only; the objspace extension
    // that ships with Ruby calls them.
    fn rb_objspace_reachable_objects_from(
        obj: VALUE,
        func: unsafe extern "C" fn(VALUE, *mut c_void),
        data: *mut c_void,
    );
    fn rb_objspace_reachable_objects_from_root(
        func: unsafe extern "C" fn(*const c_char, VALUE, *mut c_void),
        data: *mut c_void,
    );
}

/// Calls `visit(category, object)` for every object a GC root refers to ("vm", "global_tbl",
/// "machine_context", ...). See the module contract.
pub fn reachable_from_roots(visit: &mut dyn FnMut(&str, VALUE)) {
    unsafe extern "C" fn trampoline(category: *const c_char, object: VALUE, data: *mut c_void) {
        let _ = catch_unwind(AssertUnwindSafe(|| {
            // SAFETY: `data` is the `&mut &mut dyn FnMut` below, alive for the whole walk.
            let visit = unsafe { &mut *data.cast::<&mut dyn FnMut(&str, VALUE)>() };
            let category = if category.is_null() {
                "(unnamed)"
            } else {
                // SAFETY: the VM passes a static NUL-terminated category name.
                unsafe { CStr::from_ptr(category) }
                    .to_str()
                    .unwrap_or("(unnamed)")
            };
            visit(category, object);
        }));
    }
    let mut visit = visit;
    let data: *mut &mut dyn FnMut(&str, VALUE) = &mut visit;
    // SAFETY: GVL held and not during a GC (module contract); `data` outlives the call, which
    // runs the callback synchronously only.
    unsafe { rb_objspace_reachable_objects_from_root(trampoline, data.cast()) };
}

/// Calls `visit(child)` for every object `object` refers to. `object` must be a live heap object
/// the VM handed out during this walk (the VM checks it can be marked). See the module contract.
pub fn reachable_from(object: VALUE, visit: &mut dyn FnMut(VALUE)) {
    unsafe extern "C" fn trampoline(child: VALUE, data: *mut c_void) {
        let _ = catch_unwind(AssertUnwindSafe(|| {
            // SAFETY: `data` is the `&mut &mut dyn FnMut` below, alive for the whole walk.
            let visit = unsafe { &mut *data.cast::<&mut dyn FnMut(VALUE)>() };
            visit(child);
        }));
    }
    if heap_type(object).is_none() {
        return;
    }
    let mut visit = visit;
    let data: *mut &mut dyn FnMut(VALUE) = &mut visit;
    // SAFETY: GVL held, not during a GC (module contract); `object` is a live heap object and
    // `data` outlives the synchronous call.
    unsafe { rb_objspace_reachable_objects_from(object, trampoline, data.cast()) };
}

/// The raw class field, 0 when hidden. Reads one word; allocates nothing.
pub fn raw_class(object: VALUE) -> VALUE {
    if heap_type(object).is_none() {
        return 0;
    }
    let api = rb_sys::stable_api::get_default();
    // SAFETY: a heap object the VM handed out; reading its class word has no side effect.
    unsafe { api.rbasic_class(object) }.map_or(0, |k| k.as_ptr() as VALUE)
}

/// What an internal object (see `is_internal_object`) is, for a reader: `env` (the captured
/// locals of a block or a frame), `method entry`, `iseq` (compiled code)... Allocates nothing
/// on the Ruby heap.
pub fn describe_internal(object: VALUE) -> String {
    let Some(t) = heap_type(object) else {
        return "immediate".into();
    };
    let name = match t {
        T::RUBY_T_IMEMO => {
            // SAFETY: a heap object: its first word is the flags. The imemo kind sits in the
            // 4 bits above FL_USHIFT (12), numbered alike on Ruby 3.1 to 3.4 for these kinds.
            let flags = unsafe { (*(object as *const rb_sys::RBasic)).flags };
            return match (flags >> 12) & 0x0f {
                0 => "env",
                1 => "cref",
                2 => "svar",
                3 => "throw data",
                4 => "ifunc",
                5 => "memo",
                6 => "method entry",
                7 => "iseq",
                8 => "tmpbuf",
                _ => "imemo",
            }
            .into();
        }
        T::RUBY_T_NODE => "node",
        T::RUBY_T_ICLASS => "included module",
        T::RUBY_T_ZOMBIE => "zombie",
        T::RUBY_T_MOVED => "moved",
        T::RUBY_T_NONE => "free slot",
        T::RUBY_T_ARRAY => "hidden Array",
        T::RUBY_T_HASH => "hidden Hash",
        T::RUBY_T_STRING => "hidden String",
        T::RUBY_T_OBJECT => "hidden Object",
        T::RUBY_T_DATA => "hidden Data",
        T::RUBY_T_CLASS => "hidden Class",
        _ => "hidden object",
    };
    name.into()
}
