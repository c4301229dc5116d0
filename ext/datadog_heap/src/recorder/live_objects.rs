//! `each_live_object`: the snapshot of the tracked objects, handed to a Ruby block as the values
//! lib/datadog_heap/recorder.rb builds `DatadogHeap::LiveObject`s from.

use std::collections::HashMap;

use datadog_heap_core::{Frame, LiveObject, Snapshot};
use magnus::{value::ReprValue, Error, IntoValue, RArray, Ruby, Value};

use super::{with_session, Recorder};
use crate::errors::{arg_error, OrRaise};
use crate::runtime;

/// `_native_each_live_object { |locations, weight, size, class_name, alloc_gen, gen_age, frozen| }`
/// after a full update. Objects that share a stack share one frozen `locations` Array. The
/// iteration ends (even on error or break) before this returns, and before the first yield: a
/// block that never returns (an abandoned Enumerator#next, a suspended Fiber, a throw) cannot
/// leave the recorder stuck mid-iteration.
pub fn each_live_object(ruby: &Ruby, rb_self: &Recorder) -> Result<Value, Error> {
    with_session(ruby, rb_self, |session| {
        if !ruby.block_given() {
            return Err(arg_error(ruby, "each_live_object needs a block"));
        }
        let snapshot = session.with_vm(ruby, |vm| session.core.prepare_iteration(vm))?;
        let objects = live_objects(&snapshot);
        let finished = session.core.finish_iteration();
        let names = NamedObjects::new(ruby, &snapshot, objects.len());
        match finished {
            Ok(()) | Err(datadog_heap_core::HeapError::NoIterationPrepared) => {}
            Err(e) => return Err(crate::errors::to_ruby(ruby, e)),
        }
        let mut names = names;
        for object in objects {
            let locations = names.locations(ruby, &object.stack)?;
            let class = match object.data.class {
                0 => None,
                id => Some(snapshot.names().get(id).or_raise(ruby)?),
            };
            let d = &object.data;
            let args = ruby.ary_new_capa(7);
            args.push(locations)?;
            args.push(d.weight)?;
            args.push(d.size)?;
            args.push(class)?;
            args.push(d.alloc_gen)?;
            args.push(d.gen_age)?;
            args.push(d.frozen)?;
            // The block's allocations are the program's, not ours: sample them.
            let _: Value = runtime::not_busy(|| ruby.yield_splat(args))?;
        }
        Ok(ruby.qnil().as_value())
    })
}

/// The objects a snapshot yields (those that met a GC), copied so the iteration can end first.
fn live_objects(snapshot: &Snapshot) -> Vec<LiveObject> {
    let mut objects = Vec::with_capacity(snapshot.len());
    snapshot.for_each_live(|object| {
        objects.push(object.clone());
        true
    });
    objects
}

/// One frozen `[[name, path, line], ...]` per distinct stack. The Arrays live in `keep`, a Ruby
/// Array on this native's stack (so the GC sees them and compaction may move them); the map
/// from a stack to its Array holds indexes only.
struct NamedObjects<'a> {
    snapshot: &'a Snapshot,
    keep: RArray,
    index: HashMap<*const Frame, usize>,
}

impl<'a> NamedObjects<'a> {
    fn new(ruby: &Ruby, snapshot: &'a Snapshot, capacity: usize) -> Self {
        NamedObjects {
            snapshot,
            keep: ruby.ary_new_capa(capacity.min(4096)),
            index: HashMap::new(),
        }
    }

    fn locations(&mut self, ruby: &Ruby, stack: &[Frame]) -> Result<RArray, Error> {
        if let Some(&i) = self.index.get(&stack.as_ptr()) {
            return self.keep.entry(i as isize);
        }
        let names = self.snapshot.names();
        let locations = ruby.ary_new_capa(stack.len());
        for frame in stack {
            let name = names.get(frame.name).or_raise(ruby)?;
            let file = names.get(frame.filename).or_raise(ruby)?;
            let entry = ruby.ary_new_from_values(&[
                ruby.str_new(name).as_value(),
                ruby.str_new(file).as_value(),
                frame.line.into_value_with(ruby),
            ]);
            entry.freeze();
            locations.push(entry)?;
        }
        locations.freeze();
        self.index.insert(stack.as_ptr(), self.keep.len());
        self.keep.push(locations)?;
        Ok(locations)
    }
}
