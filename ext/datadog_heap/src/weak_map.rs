//! The liveness table: one `ObjectSpace::WeakMap` per recorder, record_id (Fixnum) -> object.
//!
//! A WeakMap entry goes away when its key or its value is collected. A Fixnum key is never
//! collected, so the entry lives exactly as long as the object: reading it back answers "is it
//! alive?". We never store nil, so nil from a read always means "collected".
//!
//! The class and its `[]`, `[]=` and `each` methods are captured when the extension loads, each as
//! `UnboundMethod#bind_call` already bound to it (a Method object), and called with
//! `rb_method_call`, which runs a Method object without looking any name up. So code that later
//! redefines `WeakMap#[]`, `#[]=`, or even `UnboundMethod#bind_call` does not change what we do.
//!
//! These calls need the GVL, may raise, may let other threads run, and may allocate (before Ruby
//! 3.3 `[]=` registers finalizers; the call machinery makes a few internal objects): never call
//! them from the allocation hook.

use std::sync::OnceLock;

use crate::shims;

use magnus::{
    rb_sys::{AsRawValue, FromRawValue},
    value::{Opaque, ReprValue},
    Class, Error, Fixnum, Module, RClass, RModule, Ruby, Value,
};

struct WeakMapMethods {
    class: Opaque<RClass>,
    /// `bind_call` bound to `WeakMap#[]`: called as (map, key).
    aref: Opaque<Value>,
    /// `bind_call` bound to `WeakMap#[]=`: called as (map, key, value).
    aset: Opaque<Value>,
    /// `bind_call` bound to `WeakMap#each`: called as (map) with a block.
    each: Opaque<Value>,
    /// `bind_call` bound to `WeakMap#size`: called as (map).
    size: Opaque<Value>,
    /// `bind_call` bound to `WeakMap#delete` (Ruby >= 3.3): called as (map, key).
    delete: Option<Opaque<Value>>,
}

static METHODS: OnceLock<WeakMapMethods> = OnceLock::new();

pub fn init(ruby: &Ruby) -> Result<(), Error> {
    let object_space: RModule = ruby.class_object().const_get("ObjectSpace")?;
    let class: RClass = object_space.const_get("WeakMap")?;
    let unbound_method: RClass = ruby.class_object().const_get("UnboundMethod")?;
    let bind_call: Value =
        unbound_method.funcall("instance_method", (ruby.to_symbol("bind_call"),))?;
    let bound = |name: &str| -> Result<Value, Error> {
        let method: Value = class.funcall("instance_method", (ruby.to_symbol(name),))?;
        bind_call.funcall("bind", (method,))
    };
    let aref = bound("[]")?;
    let aset = bound("[]=")?;
    let each = bound("each")?;
    let size = bound("size")?;
    let has_delete: bool = class.funcall("method_defined?", (ruby.to_symbol("delete"),))?;
    let delete = match has_delete {
        true => Some(bound("delete")?),
        false => None,
    };
    for method in [aref, aset, each, size].into_iter().chain(delete) {
        ruby.gc_register_mark_object(method);
    }
    shims::init_block_proc(ruby)?;
    let _ = METHODS.set(WeakMapMethods {
        class: class.into(),
        aref: aref.into(),
        aset: aset.into(),
        each: each.into(),
        size: size.into(),
        delete: delete.map(Into::into),
    });
    Ok(())
}

fn methods(ruby: &Ruby) -> Result<&'static WeakMapMethods, Error> {
    METHODS.get().ok_or_else(|| {
        crate::errors::heap_error(ruby, "datadog_heap: WeakMap methods not captured at load")
    })
}

/// A new, empty WeakMap. Allocates.
pub fn new_map(ruby: &Ruby) -> Result<Value, Error> {
    let m = methods(ruby)?;
    ruby.get_inner(m.class).new_instance(())
}

/// `map[record_id] = object`.
pub fn set(ruby: &Ruby, map: Value, record_id: i64, object: Value) -> Result<(), Error> {
    let m = methods(ruby)?;
    if object.is_nil() {
        return Err(crate::errors::heap_error(
            ruby,
            "cannot track nil: a nil value would read as collected",
        ));
    }
    let key = ruby.integer_from_i64(record_id).as_value();
    shims::method_call(ruby.get_inner(m.aset), [map, key, object])?;
    Ok(())
}

/// `map[record_id]`: the object, or `None` once it was collected.
pub fn get(ruby: &Ruby, map: Value, record_id: i64) -> Result<Option<Value>, Error> {
    let m = methods(ruby)?;
    let key = ruby.integer_from_i64(record_id).as_value();
    let found = shims::method_call(ruby.get_inner(m.aref), [map, key])?;
    Ok((!found.is_nil()).then_some(found))
}

/// Calls `visit(record_id, object)` for every entry whose object is alive (`WeakMap#each`, which
/// skips collected ones). `visit` must not raise, call into Ruby, or allocate Ruby objects. Makes
/// no Proc (one made at load serves every walk).
pub fn walk(ruby: &Ruby, map: Value, mut visit: impl FnMut(i64, Value)) -> Result<(), Error> {
    let m = methods(ruby)?;
    shims::method_call_with_block(ruby, ruby.get_inner(m.each), [map], |pair| {
        if let (Some(key), Some(object)) = (pair.get(0), pair.get(1)) {
            // Our keys are Fixnum record ids; anything else is not ours to look at.
            if let Some(id) = Fixnum::from_value(key) {
                visit(id.to_i64(), object);
            }
        }
    })
}

/// `map.size`: its entries, those of collected objects included until the VM drops them.
pub fn size(ruby: &Ruby, map: Value) -> Result<i64, Error> {
    let m = methods(ruby)?;
    let size = shims::method_call(ruby.get_inner(m.size), [map])?;
    Ok(Fixnum::from_value(size).map_or(0, |n| n.to_i64()))
}

/// Removes the entries of `record_ids` from the WeakMap in `slot` (a VALUE its owner keeps
/// marked): with `WeakMap#delete` where the Ruby has it (3.3 and later); before that, by putting
/// a new WeakMap holding the other live entries in `slot`. The copy runs with the GC disabled
/// (as it was, if the program had disabled it), so no object collected or moved between the walk
/// that finds it and the write that keeps it. Allocates; may let other threads run.
#[allow(unsafe_code)] // the VALUE in `slot`, kept marked by its owner
pub fn remove(
    ruby: &Ruby,
    slot: &std::cell::Cell<rb_sys::VALUE>,
    record_ids: &[i64],
) -> Result<(), Error> {
    let m = methods(ruby)?;
    // SAFETY: the slot's owner keeps the VALUE it holds marked for as long as it lives.
    let map = unsafe { Value::from_raw(slot.get()) };
    if let Some(delete) = m.delete {
        let delete = ruby.get_inner(delete);
        for &id in record_ids {
            shims::method_call(delete, [map, ruby.integer_from_i64(id).as_value()])?;
        }
        return Ok(());
    }
    let dropped: std::collections::HashSet<i64> = record_ids.iter().copied().collect();
    let _gc_off = shims::GcPause::new();
    let mut kept = Vec::new();
    walk(ruby, map, |id, object| {
        if !dropped.contains(&id) {
            kept.push((id, object));
        }
    })?;
    let copy = new_map(ruby)?;
    for (id, object) in kept {
        set(ruby, copy, id, object)?;
    }
    slot.set(copy.as_raw());
    Ok(())
}
