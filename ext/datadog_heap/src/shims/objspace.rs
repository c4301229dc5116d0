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

/// The VM's own test that a heap object is alive: not a free slot, and not garbage a lazy sweep
/// has yet to free. What the objspace extension filters its walks with. Ruby 3.1 to 3.3 export
/// `rb_objspace_markable_object_p` (markable and live), 3.4 only `rb_objspace_garbage_object_p`;
/// both are looked up once by name, so the extension loads whichever this Ruby has.
enum LiveCheck {
    Markable(unsafe extern "C" fn(VALUE) -> i32),
    Garbage(unsafe extern "C" fn(VALUE) -> i32),
    /// Neither symbol exists: only the type word is checked.
    TypeOnly,
}

fn live_check() -> &'static LiveCheck {
    static CHECK: std::sync::OnceLock<LiveCheck> = std::sync::OnceLock::new();
    CHECK.get_or_init(|| {
        extern "C" {
            fn dlsym(handle: *mut c_void, symbol: *const c_char) -> *mut c_void;
        }
        // RTLD_DEFAULT: the global scope, where libruby (or the ruby executable) is.
        let find = |name: &CStr| {
            // SAFETY: a NUL-terminated name; dlsym only reads it.
            let address = unsafe { dlsym(std::ptr::null_mut(), name.as_ptr()) };
            // SAFETY: both functions are `int f(VALUE)` in gc.c, so a non-null address has
            // that signature.
            (!address.is_null()).then(|| unsafe {
                std::mem::transmute::<*mut c_void, unsafe extern "C" fn(VALUE) -> i32>(address)
            })
        };
        if let Some(f) = find(c"rb_objspace_markable_object_p") {
            LiveCheck::Markable(f)
        } else if let Some(f) = find(c"rb_objspace_garbage_object_p") {
            LiveCheck::Garbage(f)
        } else {
            LiveCheck::TypeOnly
        }
    })
}

/// Whether `object` is a live heap object (see `LiveCheck`): false for immediates, free slots,
/// zombies, moved slots and unswept garbage. Roots and children can be such objects: a stale
/// word on a thread's machine stack is scanned conservatively. Never allocates or raises.
pub fn is_live_heap_object(object: VALUE) -> bool {
    let Some(t) = heap_type(object) else {
        return false;
    };
    if matches!(t, T::RUBY_T_NONE | T::RUBY_T_ZOMBIE | T::RUBY_T_MOVED) {
        return false;
    }
    match live_check() {
        // SAFETY: a heap pointer the VM handed out; both functions only read the slot and its
        // page's mark bits, with the GVL held and outside a GC (module contract).
        LiveCheck::Markable(f) => unsafe { f(object) != 0 },
        // SAFETY: as above.
        LiveCheck::Garbage(f) => unsafe { f(object) == 0 },
        LiveCheck::TypeOnly => true,
    }
}

/// Calls `visit(category, object)` for every live object a GC root refers to ("vm",
/// "global_tbl", "machine_context", ...); dead ones (see `is_live_heap_object`) and immediates
/// are left out. See the module contract.
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
            if is_live_heap_object(object) {
                visit(category, object);
            }
        }));
    }
    let mut visit = visit;
    let data: *mut &mut dyn FnMut(&str, VALUE) = &mut visit;
    // SAFETY: GVL held and not during a GC (module contract); `data` outlives the call, which
    // runs the callback synchronously only.
    unsafe { rb_objspace_reachable_objects_from_root(trampoline, data.cast()) };
}

/// Calls `visit(child)` for every live object `object` refers to (dead ones and immediates are
/// left out, as by `reachable_from_roots`). `object` must be an object the VM handed out during
/// this walk; a dead one has no children. See the module contract.
pub fn reachable_from(object: VALUE, visit: &mut dyn FnMut(VALUE)) {
    unsafe extern "C" fn trampoline(child: VALUE, data: *mut c_void) {
        let _ = catch_unwind(AssertUnwindSafe(|| {
            // SAFETY: `data` is the `&mut &mut dyn FnMut` below, alive for the whole walk.
            let visit = unsafe { &mut *data.cast::<&mut dyn FnMut(VALUE)>() };
            if is_live_heap_object(child) {
                visit(child);
            }
        }));
    }
    if !is_live_heap_object(object) {
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
