//! A fake VM for the core's tests: a heap of objects that tests kill, freeze and resize by hand,
//! a GC counter and a clock they advance, and failures they can inject.

use std::collections::HashMap;

use crate::error::{HeapError, Result};
use crate::vm::{LiveInfo, ObjectRef, Vm, WalkVisitor};

#[derive(Debug, Clone, Copy)]
pub struct FakeObject {
    pub alive: bool,
    pub frozen: bool,
    pub size: usize,
    /// No class (see `Vm::is_hidden`).
    pub hidden: bool,
}

#[derive(Default)]
pub struct FakeVm {
    pub objects: HashMap<ObjectRef, FakeObject>,
    /// The liveness table: record_id -> object.
    pub table: HashMap<i64, ObjectRef>,
    pub gc: u64,
    pub now: i64,
    /// Fail the remember call after this many more succeed.
    pub fail_remember_after: Option<usize>,
    /// Fail the lookup call after this many more succeed.
    pub fail_lookup_after: Option<usize>,
    /// Answer `walk_live` (off by default, so most tests cover the one-by-one lookups).
    pub walk_enabled: bool,
    pub walks: usize,
    pub remember_calls: usize,
    pub lookup_calls: usize,
    pub size_measurements: usize,
    pub yields: usize,
    /// The thread the tests run as (what `current_thread` answers).
    pub thread: crate::lock::ThreadId,
    next_object: ObjectRef,
}

impl FakeVm {
    pub fn new() -> Self {
        FakeVm {
            now: 10_000_000_000,
            thread: 1,
            next_object: 8,
            ..Default::default()
        }
    }

    pub fn alloc(&mut self, size: usize) -> ObjectRef {
        self.next_object += 8;
        self.objects.insert(
            self.next_object,
            FakeObject {
                alive: true,
                frozen: false,
                size,
                hidden: false,
            },
        );
        self.next_object
    }

    pub fn kill(&mut self, object: ObjectRef) {
        if let Some(o) = self.objects.get_mut(&object) {
            o.alive = false;
        }
    }

    pub fn obj(&mut self, object: ObjectRef) -> &mut FakeObject {
        self.objects.entry(object).or_insert(FakeObject {
            alive: true,
            frozen: false,
            size: 0,
            hidden: false,
        })
    }

    /// A GC: advances the generation and the clock past the young-update interval.
    pub fn gc(&mut self) {
        self.gc += 1;
        self.now += 3_000_000_000;
    }

    fn tick(budget: &mut Option<usize>, what: &str) -> Result<()> {
        match budget {
            Some(0) => {
                *budget = None;
                Err(HeapError::Host(format!("injected {what} failure")))
            }
            Some(n) => {
                *n -= 1;
                Ok(())
            }
            None => Ok(()),
        }
    }
}

impl Vm for FakeVm {
    fn is_hidden(&self, object: ObjectRef) -> bool {
        self.objects.get(&object).is_some_and(|o| o.hidden)
    }

    fn remember(&mut self, record_id: i64, object: ObjectRef) -> Result<()> {
        Self::tick(&mut self.fail_remember_after, "remember")?;
        self.remember_calls += 1;
        self.table.insert(record_id, object);
        Ok(())
    }

    fn forget(&mut self, record_ids: &[i64]) -> Result<()> {
        for id in record_ids {
            self.table.remove(id);
        }
        Ok(())
    }

    fn lookup(&mut self, record_id: i64, measure_size: bool) -> Result<Option<LiveInfo>> {
        Self::tick(&mut self.fail_lookup_after, "lookup")?;
        self.lookup_calls += 1;
        let Some(object) = self.table.get(&record_id).copied() else {
            return Ok(None);
        };
        match self.objects.get(&object).copied() {
            Some(o) if o.alive => {
                if measure_size {
                    self.size_measurements += 1;
                }
                Ok(Some(LiveInfo {
                    frozen: o.frozen,
                    size: measure_size.then_some(o.size),
                }))
            }
            _ => {
                self.table.remove(&record_id);
                Ok(None)
            }
        }
    }

    fn walk_live(&mut self, visit: WalkVisitor<'_>) -> Result<bool> {
        if !self.walk_enabled {
            return Ok(false);
        }
        Self::tick(&mut self.fail_lookup_after, "walk")?;
        self.walks += 1;
        // Like a WeakMap: entries of collected objects are gone, the rest come in no set order.
        let objects = &self.objects;
        self.table
            .retain(|_, object| objects.get(object).is_some_and(|o| o.alive));
        let measured = std::cell::Cell::new(0);
        for (&record_id, object) in &self.table {
            let o = self.objects[object];
            let probe = |measure_size: bool| {
                if measure_size {
                    measured.set(measured.get() + 1);
                }
                LiveInfo {
                    frozen: o.frozen,
                    size: measure_size.then_some(o.size),
                }
            };
            visit(record_id, &probe);
        }
        self.size_measurements += measured.get();
        Ok(true)
    }

    fn yield_thread(&mut self) -> Result<()> {
        self.yields += 1;
        Ok(())
    }

    fn current_thread(&self) -> crate::lock::ThreadId {
        self.thread
    }

    fn gc_count(&self) -> u64 {
        self.gc
    }

    fn now_ns(&self) -> i64 {
        self.now
    }
}
