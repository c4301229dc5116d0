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
    is_internal_type(t) || is_hidden(raw)
}

/// Builtin types that are the VM's own and never become the program's objects.
fn is_internal_type(t: T) -> bool {
    matches!(
        t,
        T::RUBY_T_NONE
            | T::RUBY_T_IMEMO
            | T::RUBY_T_NODE
            | T::RUBY_T_ICLASS
            | T::RUBY_T_ZOMBIE
            | T::RUBY_T_MOVED
    )
}

/// A heap object with no class (yet): hidden from the program. Never allocates or raises.
fn is_hidden(raw: VALUE) -> bool {
    let api = rb_sys::stable_api::get_default();
    // SAFETY: a heap object (the callers check); reading its class field has no side effect.
    unsafe { api.rbasic_class(raw).is_none() }
}

/// What the sampler leaves out at allocation time: immediates and objects of the VM's own types
/// (iseqs, method entries, ...). An object of an ordinary type allocated hidden (no class) is
/// *not* left out: the VM makes some of the program's objects that way and gives them their class
/// before handing them over (`rb_obj_reveal`: String#encode's result, `sort_by`'s Array, ...), so
/// it is recorded, and the commit drops it if `is_internal_object` still says so then. Never
/// allocates or raises; usable inside the allocation hook.
pub fn is_never_the_programs(raw: VALUE) -> bool {
    heap_type(raw).is_some_and(is_internal_type)
}

/// The class a hidden object gets from its builtin type when the VM reveals it (String, Array,
/// Hash, ...: `rb_obj_reveal` is given the type's own class); `None` for an object with a class.
pub fn hidden_class_name(raw: VALUE) -> Option<&'static str> {
    let t = heap_type(raw)?;
    if !is_hidden(raw) {
        return None;
    }
    Some(match t {
        T::RUBY_T_STRING => "String",
        T::RUBY_T_ARRAY => "Array",
        T::RUBY_T_HASH => "Hash",
        T::RUBY_T_STRUCT => "Struct",
        T::RUBY_T_BIGNUM => "Integer",
        T::RUBY_T_FLOAT => "Float",
        T::RUBY_T_REGEXP => "Regexp",
        T::RUBY_T_MATCH => "MatchData",
        T::RUBY_T_RATIONAL => "Rational",
        T::RUBY_T_COMPLEX => "Complex",
        T::RUBY_T_CLASS => "Class",
        T::RUBY_T_MODULE => "Module",
        T::RUBY_T_FILE => "File",
        T::RUBY_T_SYMBOL => "Symbol",
        _ => "Object",
    })
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

/// Borrows the bytes of a Ruby String the VM keeps alive for the rest of the current hook call
/// (frame paths and labels, class names). Not UTF-8 → "" (nothing is allocated to fix it up).
pub fn hook_string<'a>(value: VALUE) -> &'a str {
    // SAFETY: the strings the sampler passes (frame paths and labels, class names) are held by
    // the VM for at least as long as the hook call, which runs no Ruby code and no GC before the
    // core has copied them.
    unsafe { borrow_str(value) }.unwrap_or("")
}

/// The object's class name without allocating: the class's permanent name, else the nearest
/// named ancestor, else "Object". For the hook's use (see `hook_string`).
pub fn class_name_of<'a>(object: VALUE) -> &'a str {
    let mut class = real_class_of(object);
    for _ in 0..32 {
        let Some(c) = class else { break };
        if let Some(name) = class_path_if_named(c) {
            let s = hook_string(name);
            if !s.is_empty() && !s.starts_with("#<") {
                return s;
            }
        }
        class = superclass_of(c);
    }
    "Object"
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
