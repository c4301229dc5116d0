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
    ruby.gc_register_mark_object(aref);
    ruby.gc_register_mark_object(aset);
    ruby.gc_register_mark_object(each);
    shims::init_block_proc(ruby)?;
    let _ = METHODS.set(WeakMapMethods {
        class: class.into(),
        aref: aref.into(),
        aset: aset.into(),
        each: each.into(),
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
