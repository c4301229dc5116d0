//! What an object is: its builtin type, frozenness, whether it is internal, its class and the
//! class's name and superclass.

use magnus::{rb_sys::AsRawValue, Value};
use rb_sys::{ruby_value_type as T, StableApiDefinition, VALUE};

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

/// A copy of a String's bytes. Never raises; allocates only Rust memory.
pub fn string_bytes(s: magnus::RString) -> Vec<u8> {
    // SAFETY: the bytes are copied before any Ruby code can run or a GC can happen.
    unsafe { s.as_slice() }.to_vec()
}
