//! Mapping errors to Ruby exceptions, in one place, and keeping panics out of Ruby.
//!
//! `HeapError::InvalidArgument` becomes `ArgumentError`; every other core error becomes
//! `DatadogHeap::Error` (a `RuntimeError`). `runtime::guarded` turns a panic in a native method
//! into `DatadogHeap::Error` too.

use std::sync::OnceLock;

use datadog_heap_core::HeapError;
use magnus::{value::Opaque, Error, ExceptionClass, Module, RModule, Ruby};

static ERROR_CLASS: OnceLock<Opaque<ExceptionClass>> = OnceLock::new();

/// Captures `DatadogHeap::Error` (defined by lib/datadog_heap.rb, or here if the extension is
/// loaded on its own). Registered as a mark object either way: the static holds a VALUE that
/// must stay alive and in place (a registered object is pinned), whatever happens to the
/// constant later.
pub fn init(ruby: &Ruby, module: RModule) -> Result<(), Error> {
    let class: ExceptionClass = match module.const_get::<_, ExceptionClass>("Error") {
        Ok(class) => class,
        Err(_) => module.define_error("Error", ruby.exception_runtime_error())?,
    };
    ruby.gc_register_mark_object(class);
    let _ = ERROR_CLASS.set(class.into());
    Ok(())
}

fn error_class(ruby: &Ruby) -> ExceptionClass {
    ERROR_CLASS
        .get()
        .map(|c| ruby.get_inner(*c))
        .unwrap_or_else(|| ruby.exception_runtime_error())
}

/// `DatadogHeap::Error` with `message`.
pub fn heap_error(ruby: &Ruby, message: impl Into<String>) -> Error {
    Error::new(error_class(ruby), message.into())
}

pub fn arg_error(ruby: &Ruby, message: impl Into<String>) -> Error {
    Error::new(ruby.exception_arg_error(), message.into())
}

pub fn type_error(ruby: &Ruby, message: impl Into<String>) -> Error {
    Error::new(ruby.exception_type_error(), message.into())
}

pub fn to_ruby(ruby: &Ruby, err: HeapError) -> Error {
    match err {
        HeapError::InvalidArgument { .. } => arg_error(ruby, err.to_string()),
        other => heap_error(ruby, other.to_string()),
    }
}

/// `result.or_raise(ruby)`: a core result as a Ruby one, its error mapped by [`to_ruby`].
pub trait OrRaise<T> {
    fn or_raise(self, ruby: &Ruby) -> Result<T, Error>;
}

impl<T> OrRaise<T> for datadog_heap_core::Result<T> {
    fn or_raise(self, ruby: &Ruby) -> Result<T, Error> {
        self.map_err(|e| to_ruby(ruby, e))
    }
}

/// The text a panic was raised with.
pub fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "unknown panic".into())
}
