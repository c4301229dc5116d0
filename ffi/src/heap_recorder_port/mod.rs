//! A port of Datadog's heap_recorder.c to Rust, the recorder behind heap_recorder.h: heap records
//! (deduplicated stacks of the profiler's string ids) and object records keyed by object id (or
//! record id), the deferred pending queue, updates with their ages and gating, the statistics and
//! their EWMAs, and the snapshot iterated without the GVL. Semantics follow heap_recorder.c, not
//! datadog_heap's own recorder (`datadog_heap_core::HeapRecorder`), whose update, records and
//! statistics are its own; of the core it uses only the EWMA step (`stats::ewma`). docs/c-abi.md
//! says why. The VM comes in through [`DdheapHost`] and the profiler's strings through
//! [`StringTable`].

use std::cell::UnsafeCell;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use rustc_hash::FxHashMap;

use crate::types::{CharSlice, DdheapHost, LiveObjectData, Location, ManagedStringId};

mod iteration;
mod record;
mod update;

// heap_recorder.c's tuning, kept here under its names even where the core's recorder has the same
// value (`OLD_AGE`, `MIN_TIME_BETWEEN_UPDATES_NS`, `MAX_PENDING_RECORDINGS`): the port follows the
// C recorder, and the core's may change for reasons of its own.

/// Objects younger than this many GCs are left out of iterations.
pub const ITERATION_MIN_AGE: usize = 1;
/// Age from which young updates leave an object alone (Ruby's GC old age).
pub const OLD_AGE: usize = 3;
/// Young updates closer together than this are skipped.
pub const MIN_TIME_BETWEEN_UPDATES_NS: i64 = 2_000_000_000;
/// Recordings waiting for their object id.
pub const MAX_PENDING_RECORDINGS: usize = 256;

/// Why a call failed, mapped by the shim to what heap_recorder.c would raise.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Failure {
    Runtime(String),
    Argument(String),
    /// An exception the VM raised inside a callback; the shim re-raises it with rb_jump_tag.
    RubyTag(i32),
}

pub type Outcome<T> = Result<T, Failure>;

/// The profiler's string storage (libdatadog's `ddog_prof_ManagedStringStorage_*`).
pub trait StringTable {
    fn intern(&self, s: CharSlice) -> Outcome<ManagedStringId>;
    fn intern_all(&self, s: &[CharSlice], out: &mut [ManagedStringId]) -> Outcome<()>;
    fn unintern_all(&self, ids: &[ManagedStringId]) -> Outcome<()>;
}

/// One frame of a heap record; compared and hashed field by field.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct HeapFrame {
    pub name: ManagedStringId,
    pub filename: ManagedStringId,
    pub line: i32,
}

type HeapRecord = Arc<[HeapFrame]>;

#[derive(Clone, Debug)]
struct ObjectRecord {
    heap_record: HeapRecord,
    data: LiveObjectData,
}

#[derive(Clone, Debug)]
struct PendingRecording {
    object: usize,
    heap_record: HeapRecord,
    data: LiveObjectData,
    /// Set while a finalize call is taking this object's id: another finalize call that the id
    /// call lets in leaves it alone, so each recording gets exactly one id (with 2.42's record
    /// ids, each id is a weak map entry, which must end up in an object record).
    claimed: bool,
}

#[derive(Default, Clone, Copy, Debug)]
pub struct LastUpdate {
    pub objects_alive: usize,
    pub objects_dead: usize,
    pub objects_skipped: usize,
    pub objects_frozen: usize,
}

#[derive(Default, Clone, Copy, Debug)]
pub struct Lifetime {
    pub updates_successful: u64,
    pub updates_skipped_concurrent: u64,
    pub updates_skipped_gcgen: u64,
    pub updates_skipped_time: u64,
    pub ewma_young_objects_alive: f64,
    pub ewma_young_objects_dead: f64,
    pub ewma_young_objects_skipped: f64,
    pub ewma_objects_alive: f64,
    pub ewma_objects_dead: f64,
    pub ewma_objects_skipped: f64,
    pub deferred_recordings_skipped_buffer_full: u64,
    pub deferred_recordings_finalized: u64,
    /// Ours: samples dropped because the class name could not be interned, or a start came
    /// without an end (heap_recorder.c raises there; we never raise from the sampler).
    pub recordings_dropped: u64,
}

/// `heap_recorder_state_snapshot`'s numbers.
#[derive(Default, Clone, Copy, Debug)]
pub struct StateSnapshot {
    pub num_object_records: usize,
    pub num_heap_records: usize,
    pub pending_recordings_count: usize,
    pub last_update: LastUpdate,
    pub lifetime: Lifetime,
}

enum Active {
    None,
    Skipped,
    Deferred { object: usize, data: LiveObjectData },
}

struct State {
    size_enabled: bool,
    sample_rate: u32,
    num_recordings_skipped: u32,
    heap_records: FxHashMap<HeapRecord, u32>,
    object_records: FxHashMap<i64, ObjectRecord>,
    pending: Vec<PendingRecording>,
    active: Active,
    updating: bool,
    update_gen: usize,
    update_include_old: bool,
    last_update_ns: i64,
    last_update: LastUpdate,
    lifetime: Lifetime,
    scratch_ids: Vec<ManagedStringId>,
    scratch_slices: Vec<CharSlice>,
}

/// What `for_each_live_object` walks: filled by prepare, emptied by finish, never touched in
/// between, so it can be read without the GVL while sampling threads change [`State`].
struct Snapshot {
    records: Vec<(HeapRecord, LiveObjectData)>,
    locations: Vec<Location>,
}

/// GVL discipline: every method but [`HeapRecorder::for_each_live_object`] runs under the GVL,
/// one thread at a time; `State` is only borrowed in short scopes that never call the VM, since a
/// VM callback may let another thread in to call us.
pub struct HeapRecorder<S: StringTable> {
    host: DdheapHost,
    strings: S,
    state: UnsafeCell<State>,
    snapshot: UnsafeCell<Snapshot>,
    /// Whether a snapshot is prepared: an atomic, since the iteration reads it without the GVL
    /// while sampling threads may be changing `state`.
    iterating: AtomicBool,
}

impl<S: StringTable> HeapRecorder<S> {
    pub fn new(host: DdheapHost, strings: S) -> Self {
        HeapRecorder {
            host,
            strings,
            state: UnsafeCell::new(State {
                size_enabled: true,
                sample_rate: 1,
                num_recordings_skipped: 0,
                heap_records: FxHashMap::default(),
                object_records: FxHashMap::default(),
                pending: Vec::with_capacity(MAX_PENDING_RECORDINGS),
                active: Active::None,
                updating: false,
                update_gen: 0,
                update_include_old: false,
                last_update_ns: 0,
                last_update: LastUpdate::default(),
                lifetime: Lifetime::default(),
                scratch_ids: Vec::new(),
                scratch_slices: Vec::new(),
            }),
            snapshot: UnsafeCell::new(Snapshot {
                records: Vec::new(),
                locations: Vec::new(),
            }),
            iterating: AtomicBool::new(false),
        }
    }

    fn with<R>(&self, f: impl FnOnce(&mut State) -> R) -> R {
        // SAFETY: callers hold the GVL, so one thread at a time is here, and no caller keeps a
        // borrow across a VM callback (which is where another thread could come in); see the type.
        f(unsafe { &mut *self.state.get() })
    }

    pub fn strings(&self) -> &S {
        &self.strings
    }

    pub fn set_size_enabled(&self, enabled: bool) {
        self.with(|s| s.size_enabled = enabled);
    }

    pub fn set_sample_rate(&self, rate: i32) -> Outcome<()> {
        if rate <= 0 {
            return Err(Failure::Argument(format!(
                "Heap sample rate must be a positive integer value but was {rate}"
            )));
        }
        self.with(|s| {
            s.sample_rate = rate as u32;
            s.num_recordings_skipped = 0;
        });
        Ok(())
    }

    pub fn after_fork(&self) {
        if self.iterating.load(Ordering::Acquire) {
            self.finish_iteration_unchecked();
        }
        self.with(|s| {
            s.lifetime = Lifetime::default();
            // A claim belongs to a finalize call of a thread the fork did not copy: release it,
            // or the recording would wait in the child's queue for good.
            s.pending.iter_mut().for_each(|p| p.claimed = false);
        });
    }

    pub fn state_snapshot(&self) -> StateSnapshot {
        self.with(|s| StateSnapshot {
            num_object_records: s.object_records.len(),
            num_heap_records: s.heap_records.len(),
            pending_recordings_count: s.pending.len(),
            last_update: s.last_update,
            lifetime: s.lifetime,
        })
    }

    pub fn is_object_recorded(&self, id: i64) -> bool {
        self.with(|s| s.object_records.contains_key(&id))
    }

    pub fn reset_last_update(&self) {
        self.with(|s| s.last_update_ns = 0);
    }

    /// For the debug dump: (obj id, top frame (filename id, line), data), no VM calls.
    pub fn debug_records(&self) -> Vec<(i64, Option<HeapFrame>, LiveObjectData)> {
        self.with(|s| {
            s.object_records
                .iter()
                .map(|(id, r)| (*id, r.heap_record.first().copied(), r.data))
                .collect()
        })
    }

    /// Interns `s` `times` times, one call each or (`use_all`) in one batch: the profiler's
    /// string-storage benchmark.
    pub fn benchmark_intern(&self, s: CharSlice, times: usize, use_all: bool) -> Outcome<()> {
        if use_all {
            let slices = vec![s; times];
            let mut out = vec![ManagedStringId::default(); times];
            self.strings.intern_all(&slices, &mut out)
        } else {
            for _ in 0..times {
                self.strings.intern(s)?;
            }
            Ok(())
        }
    }
}
