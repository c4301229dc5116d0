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

/// Tells about one live object during a walk: `probe(measure_size)`.
pub type Probe<'a> = &'a dyn Fn(bool) -> LiveInfo;

/// What a walk calls for each live entry: `visit(record_id, probe)`.
pub type WalkVisitor<'a> = &'a mut dyn FnMut(i64, Probe<'_>);

pub trait Vm {
    /// Remembers `object` under `record_id` in the liveness table (the WeakMap write). May fail,
    /// and may let other threads run before it returns.
    fn remember(&mut self, record_id: i64, object: ObjectRef) -> Result<()>;

    /// Removes the entries of `record_ids` from the liveness table: records dropped while their
    /// objects live (thinning). May fail, and may let other threads run.
    fn forget(&mut self, record_ids: &[i64]) -> Result<()>;

    /// Looks `record_id` up in the liveness table: `None` once the object was collected. Measures
    /// the object's size when `measure_size`. May fail, and may let other threads run.
    fn lookup(&mut self, record_id: i64, measure_size: bool) -> Result<Option<LiveInfo>>;

    /// Walks the whole liveness table once, calling `visit(record_id, probe)` for every entry whose
    /// object is alive; `probe(measure_size)` tells about that object (measuring it when asked).
    /// `visit` must not call back into the VM. Returns `Ok(false)`, having visited nothing, when
    /// this VM cannot walk; callers then look records up one by one. May fail, and may let other
    /// threads run.
    fn walk_live(&mut self, visit: WalkVisitor<'_>) -> Result<bool> {
        let _ = visit;
        Ok(false)
    }

    /// Whether `object`, allocated hidden and about to be committed, is still hidden: CRuby
    /// allocates some objects without a class and gives them one before the program sees them;
    /// those still without one are the VM's own buffers and tables, and their recordings are
    /// dropped (see `HeapRecorder::record_sampled_allocation`). Never fails, never lets
    /// threads run.
    fn is_hidden(&self, object: ObjectRef) -> bool {
        let _ = object;
        false
    }

    /// Lets other threads run (the lock waits with this). Fails when an exception was delivered
    /// to this thread meanwhile (Thread#raise, Thread#kill, Timeout): the wait is abandoned.
    fn yield_thread(&mut self) -> Result<()>;

    /// The calling thread, as the recorder's lock names its holder (never 0).
    fn current_thread(&self) -> crate::lock::ThreadId;

    /// Number of GCs so far: the generation objects are aged by.
    fn gc_count(&self) -> u64;

    /// Monotonic clock in nanoseconds.
    fn now_ns(&self) -> i64;
}
