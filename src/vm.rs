//! What the core needs from the Ruby VM, as a trait: the binding implements it over the real VM,
//! the tests over a fake heap. Nothing else in the core knows a VM exists.

use crate::error::Result;

/// An object as the VM names it (a `VALUE` in CRuby), opaque to the core. The core only stores it
/// in pending recordings and hands it back through [`Vm::remember`]; the binding keeps those
/// pending objects marked.
pub type ObjectRef = usize;

/// What a liveness check found out about an object that is still alive.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct LiveInfo {
    pub frozen: bool,
    /// Bytes, when the caller asked for the size.
    pub size: Option<usize>,
}

pub trait Vm {
    /// Remembers `object` under `record_id` in the liveness table (the WeakMap write). May fail,
    /// and may let other threads run before it returns.
    fn remember(&mut self, record_id: i64, object: ObjectRef) -> Result<()>;

    /// Looks `record_id` up in the liveness table: `None` once the object was collected. Measures
    /// the object's size when `measure_size`. May fail, and may let other threads run.
    fn lookup(&mut self, record_id: i64, measure_size: bool) -> Result<Option<LiveInfo>>;

    /// Lets other threads run (the lock waits with this). Fails when an exception was delivered
    /// to this thread meanwhile (Thread#raise, Thread#kill, Timeout): the wait is abandoned.
    fn yield_thread(&mut self) -> Result<()>;

    /// Number of GCs so far: the generation objects are aged by.
    fn gc_count(&self) -> u64;

    /// Monotonic clock in nanoseconds.
    fn now_ns(&self) -> i64;
}
