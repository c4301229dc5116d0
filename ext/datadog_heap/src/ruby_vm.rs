//! The core's `Vm` trait over the real VM: WeakMap reads and writes, object sizes, the GC count,
//! the monotonic clock, and yielding to other threads.

use std::cell::Cell;
use std::sync::OnceLock;
use std::time::Instant;

use datadog_heap_core::{HeapError, LiveInfo, ObjectRef, Vm, WalkVisitor};
use magnus::{
    rb_sys::{AsRawValue, FromRawValue},
    Error, Ruby, Value,
};

use crate::stage_costs::{self, Stage};
use crate::{shims, weak_map};

/// One use of the VM by a core operation. A Ruby exception raised by a WeakMap call is kept
/// here, and the core sees only `HeapError::Host`; `into_ruby_error` hands the original back so
/// it is re-raised unchanged (an `Interrupt` or a `Timeout::Error` stays what it was).
pub struct RubyVm<'a> {
    ruby: &'a Ruby,
    /// The session's WeakMap, which `forget` may replace (before Ruby 3.3); marked by the session.
    weak_map: &'a Cell<rb_sys::VALUE>,
    raised: Option<Error>,
}

impl<'a> RubyVm<'a> {
    /// Over the WeakMap in `weak_map`, a VALUE its owner keeps marked (never 0).
    pub fn new(ruby: &'a Ruby, weak_map: &'a Cell<rb_sys::VALUE>) -> Self {
        RubyVm {
            ruby,
            weak_map,
            raised: None,
        }
    }

    #[allow(unsafe_code)] // a VALUE the session keeps marked
    fn map(&self) -> Value {
        // SAFETY: the session marks the WeakMap in this slot for as long as it lives, and made
        // it before any VM handle over it (`Session::with_vm` checks for 0).
        unsafe { Value::from_raw(self.weak_map.get()) }
    }

    /// The Ruby error for a core error, the original exception when a VM call raised.
    pub fn into_ruby_error(mut self, err: HeapError) -> Error {
        match (err, self.raised.take()) {
            (HeapError::Host(_), Some(raised)) => raised,
            (err, _) => crate::errors::to_ruby(self.ruby, err),
        }
    }

    fn keep(&mut self, err: Error) -> HeapError {
        let message = err.to_string();
        self.raised = Some(err);
        HeapError::Host(message)
    }
}

impl Vm for RubyVm<'_> {
    #[allow(unsafe_code)] // a VALUE the session keeps marked, see below
    fn remember(&mut self, record_id: i64, object: ObjectRef) -> datadog_heap_core::Result<()> {
        // SAFETY: `object` came from a pending recording, which the recorder's mark function
        // keeps marked (and so alive and unmoved) until this commit takes it off the queue.
        let object = unsafe { Value::from_raw(object as rb_sys::VALUE) };
        let probe = stage_costs::start(Stage::WeakMapSet);
        let set = weak_map::set(self.ruby, self.map(), record_id, object);
        probe.end();
        set.map_err(|e| self.keep(e))
    }

    fn forget(&mut self, record_ids: &[i64]) -> datadog_heap_core::Result<()> {
        weak_map::remove(self.ruby, self.weak_map, record_ids).map_err(|e| self.keep(e))
    }

    fn lookup(
        &mut self,
        record_id: i64,
        measure_size: bool,
    ) -> datadog_heap_core::Result<Option<LiveInfo>> {
        let found = weak_map::get(self.ruby, self.map(), record_id).map_err(|e| self.keep(e))?;
        Ok(found
            .filter(|&object| visible(object))
            .map(|object| live_info(object, measure_size)))
    }

    fn walk_live(&mut self, visit: WalkVisitor<'_>) -> datadog_heap_core::Result<bool> {
        weak_map::walk(self.ruby, self.map(), |record_id, object| {
            if visible(object) {
                visit(record_id, &|measure_size| live_info(object, measure_size));
            }
        })
        .map(|()| true)
        .map_err(|e| self.keep(e))
    }

    fn is_hidden(&self, object: ObjectRef) -> bool {
        shims::is_internal_object(object as rb_sys::VALUE)
    }

    fn yield_thread(&mut self) -> datadog_heap_core::Result<()> {
        shims::thread_schedule().map_err(|e| self.keep(e))
    }

    fn current_thread(&self) -> datadog_heap_core::lock::ThreadId {
        shims::current_thread() as u64
    }

    fn gc_count(&self) -> u64 {
        shims::gc_count()
    }

    fn now_ns(&self) -> i64 {
        monotonic_ns()
    }
}

/// Whether a live object is still the program's. The VM hides some objects it allocated visible
/// and keeps them as its own: the Hash and Array literals the compiler freezes into the code it
/// loads (`freeze_hide_obj` in compile.c: frozen, then hidden). An update finds such an object
/// gone, as `ObjectSpace.each_object` does, and its record is dropped like a dead one. An object
/// hidden but not frozen is kept: the VM hides some of the program's objects only for a while
/// (`sort_by` its result Array, while the block runs), and an update may run inside that while.
fn visible(object: Value) -> bool {
    !(shims::is_internal_object(object.as_raw()) && shims::is_frozen(object))
}

/// What a liveness check tells about a live object; measures it only when asked.
fn live_info(object: Value, measure_size: bool) -> LiveInfo {
    LiveInfo {
        frozen: shims::is_frozen(object),
        size: measure_size.then(|| shims::memsize_of(object)),
    }
}

/// Nanoseconds on a monotonic clock (from the first call in this process image; a forked child
/// inherits the same origin).
pub fn monotonic_ns() -> i64 {
    static ORIGIN: OnceLock<Instant> = OnceLock::new();
    let origin = ORIGIN.get_or_init(Instant::now);
    i64::try_from(origin.elapsed().as_nanos()).unwrap_or(i64::MAX)
}
