//! The heap recorder: pending recordings, committed object records, the stacks they share, the
//! soft lock, and the counters. One per `DatadogHeap::Recorder`.
//!
//! Concurrency contract. Every method is called with the GVL held, except [`Snapshot`]'s, which
//! may run on a thread without it. Methods take `&self`: the state sits in a `RefCell` that is
//! borrowed only in short sections that never call the VM, so when a VM call lets another Ruby
//! thread in (WeakMap writes and reads may), that thread finds the state unborrowed and the soft
//! lock telling it what it may do.

mod caches;
mod commit;
mod iteration;
mod record;
mod update;

use std::cell::{Cell, Ref, RefCell, RefMut};
use std::collections::HashMap;
use std::hash::BuildHasherDefault;

use rustc_hash::FxHasher;

use crate::error::{HeapError, Result, FIXNUM_MAX};
use crate::lock::SoftLock;
use crate::stacks::{HeapRecords, Stack};
use crate::stats::{LastUpdate, Lifetime, Stats};
use crate::strings::{StringId, Strings};
use crate::vm::ObjectRef;

pub use iteration::{LiveObject, Names, Snapshot};
pub use update::{UpdateKind, UpdateOutcome};

/// Most recordings that may wait for a commit.
pub const MAX_PENDING_RECORDINGS: usize = 4096;

/// What the recorder knows of one tracked object.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LiveObjectData {
    /// Allocations this object stands for (sampler weight times heap sample rate). 64 bits: a
    /// 32-bit weight times a 32-bit rate always fits.
    pub weight: u64,
    /// Interned class name; 0 when unknown.
    pub class: StringId,
    /// GC count when it was allocated.
    pub alloc_gen: u64,
    /// Bytes, as of the last update that measured it.
    pub size: usize,
    /// GCs it has survived, as of the last update.
    pub gen_age: u64,
    /// Frozen as of the last update that saw it alive.
    pub frozen: bool,
    /// `size` was measured while the object was frozen: it cannot change any more, so full
    /// updates do not measure it again. Set only where a size is measured: a young update sees
    /// frozen objects too, but measures nothing, and its `frozen` must not stop the measuring.
    pub size_final: bool,
    /// The stretch of allocations it was sampled in, when the sampler watches stretches all
    /// together or not at all (a sampling window); 0 when it was sampled on its own. The
    /// profile's variances sum each cluster's estimate before squaring it (see `pprof::encode`).
    pub cluster: u64,
}

/// A recording waiting for its object to enter the liveness table.
#[derive(Debug, Clone)]
struct PendingRecording {
    object: ObjectRef,
    record_id: i64,
    stack: Stack,
    data: LiveObjectData,
    /// Allocated hidden (see [`HeapRecorder::record_sampled_allocation`]): the commit asks
    /// the VM whether it still is.
    hidden_at_birth: bool,
}

/// A committed, tracked object.
#[derive(Debug, Clone)]
pub(crate) struct ObjectRecord {
    pub(crate) stack: Stack,
    pub(crate) data: LiveObjectData,
    /// The walk (see `update`) that last found this object alive.
    pub(crate) seen_in_walk: u32,
}

/// Options the recorder applies itself.
#[derive(Debug, Clone, Copy)]
pub struct RecorderOptions {
    /// Keep one in `sample_rate` recordings, weighting each by it.
    pub sample_rate: u32,
    /// Measure object sizes during updates.
    pub size_enabled: bool,
    /// Most objects tracked at once (pending and committed); recordings past it are skipped and
    /// counted, which bounds the recorder's memory.
    pub max_tracked_objects: usize,
}

/// Default `max_tracked_objects`: about 256 bytes per tracked object (record, WeakMap entry, its
/// share of stacks) keeps the recorder near 64 MiB at the cap.
pub const DEFAULT_MAX_TRACKED_OBJECTS: usize = 262_144;

impl Default for RecorderOptions {
    fn default() -> Self {
        RecorderOptions {
            sample_rate: 1,
            size_enabled: true,
            max_tracked_objects: DEFAULT_MAX_TRACKED_OBJECTS,
        }
    }
}

/// What became of one `record_allocation` call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RecordOutcome {
    /// The object now waits for a commit.
    Pending,
    SkippedSampleRate,
    /// A commit or update holds the lock (it may be suspended in another thread).
    SkippedLocked,
    SkippedBufferFull,
    /// `max_tracked_objects` reached.
    SkippedMaxTracked,
    /// Left out by the thinning in force near `max_tracked_objects`.
    SkippedThinned,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Recorded {
    pub outcome: RecordOutcome,
    /// Something is pending: the caller should schedule a commit.
    pub needs_commit: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CommitOutcome {
    Committed(usize),
    /// Another commit or update holds the lock; the entries stay pending.
    SkippedLocked,
}

type FxMap<K, V> = HashMap<K, V, BuildHasherDefault<FxHasher>>;

pub(crate) struct State {
    options: RecorderOptions,
    heap_records: HeapRecords,
    object_records: FxMap<i64, ObjectRecord>,
    next_record_id: i64,
    /// Recordings seen since the last one kept, against `sample_rate`.
    since_last_kept: u32,
    /// An iteration snapshot exists: no update may run.
    iterating: bool,
    update_gen: u64,
    /// Numbers the liveness-table walks; records carry the number of the last walk that saw them.
    walk_epoch: u32,
    /// Records committed since the last walk (see `update`).
    committed_since_walk: u64,
    /// When the last successful update ran; `None` before the first.
    last_update_ns: Option<i64>,
    last_update: LastUpdate,
    lifetime: Lifetime,
    /// Class-name references the records hold in the storage (the stacks' are counted by
    /// `heap_records`).
    class_refs: u64,
    /// Recordings are kept one in `thinning` on top of `sample_rate`, each weighted by it: a power
    /// of two, 1 unless the records neared `max_tracked_objects` (see `update`).
    thinning: u64,
    /// The thinning's random stream (xorshift64).
    rng: u64,
}

impl State {
    fn next_random(&mut self) -> u64 {
        self.rng = crate::xorshift64(self.rng);
        self.rng
    }
}

pub struct HeapRecorder {
    lock: SoftLock,
    state: RefCell<State>,
    /// Recordings waiting for a commit. Apart from `state` so that the binding's GC mark, which can
    /// run whenever the VM allocates, always finds them: `state` stays borrowed across calls that
    /// may allocate (an object's size function, during updates), this never does.
    pending: RefCell<Vec<PendingRecording>>,
    /// The sampling path's caches, apart for the same reason (see caches.rs).
    caches: RefCell<caches::Caches>,
    /// The period in which the caches' frame handles are known alive and unmoved (see
    /// `handle_epoch()`). Apart from the caches, so a GC's mark can move it when they are in use.
    handle_epoch: Cell<u64>,
    strings: Strings,
}

impl Default for HeapRecorder {
    fn default() -> Self {
        Self::new(RecorderOptions::default())
    }
}

impl HeapRecorder {
    pub fn new(options: RecorderOptions) -> Self {
        HeapRecorder {
            lock: SoftLock::new(),
            state: RefCell::new(State {
                options,
                heap_records: HeapRecords::default(),
                object_records: FxMap::default(),
                next_record_id: 0,
                since_last_kept: 0,
                iterating: false,
                update_gen: 0,
                walk_epoch: 0,
                committed_since_walk: 0,
                last_update_ns: None,
                last_update: LastUpdate::default(),
                lifetime: Lifetime::default(),
                class_refs: 0,
                thinning: 1,
                rng: 0x9E37_79B9_7F4A_7C15,
            }),
            pending: RefCell::new(Vec::with_capacity(MAX_PENDING_RECORDINGS)),
            caches: RefCell::default(),
            handle_epoch: Cell::new(0),
            strings: Strings::new(),
        }
    }

    fn pending(&self) -> Result<RefMut<'_, Vec<PendingRecording>>> {
        self.pending.try_borrow_mut().map_err(|_| {
            HeapError::Host("pending recordings are already in use (reentrant call)".into())
        })
    }

    fn pending_len(&self) -> Result<usize> {
        Ok(self.pending()?.len())
    }

    pub(crate) fn state(&self) -> Result<RefMut<'_, State>> {
        self.state.try_borrow_mut().map_err(|_| {
            HeapError::Host("heap recorder state is already in use (reentrant call)".into())
        })
    }

    fn state_ref(&self) -> Result<Ref<'_, State>> {
        self.state.try_borrow().map_err(|_| {
            HeapError::Host("heap recorder state is being changed (reentrant call)".into())
        })
    }

    pub fn strings(&self) -> &Strings {
        &self.strings
    }

    pub fn lock(&self) -> &SoftLock {
        &self.lock
    }

    pub fn options(&self) -> Result<RecorderOptions> {
        Ok(self.state_ref()?.options)
    }

    pub fn set_sample_rate(&self, sample_rate: u32) -> Result<()> {
        if sample_rate == 0 {
            return Err(HeapError::InvalidArgument {
                name: "sample_rate",
                expected: "a positive Integer",
                value: sample_rate.to_string(),
            });
        }
        let mut state = self.state()?;
        state.options.sample_rate = sample_rate;
        state.since_last_kept = 0;
        Ok(())
    }

    pub fn set_size_enabled(&self, enabled: bool) -> Result<()> {
        self.state()?.options.size_enabled = enabled;
        Ok(())
    }

    /// Calls `f` with every pending object; the binding marks them so none is collected (or
    /// moved) before its commit. Never allocates, never calls the VM.
    /// Returns false, having called nothing, when the queue is borrowed, which no caller does
    /// across an allocation (so never during a GC).
    pub fn for_each_pending_object(&self, mut f: impl FnMut(ObjectRef)) -> bool {
        match self.pending.try_borrow() {
            Ok(pending) => {
                pending.iter().for_each(|p| f(p.object));
                true
            }
            Err(_) => false,
        }
    }

    /// For a forked child: the lock holder and any iterating thread are gone with the parent's
    /// other threads. Records (and pending recordings) stay; lifetime counters start again.
    pub fn after_fork(&self) -> Result<()> {
        self.lock.reset();
        let mut state = self.state()?;
        state.iterating = false;
        state.lifetime = Lifetime::default();
        self.caches()?.clear(&mut self.strings.lock()?)?;
        Ok(())
    }

    pub fn stats(&self) -> Result<Stats> {
        let state = self.state_ref()?;
        Ok(Stats {
            num_object_records: state.object_records.len() as u64,
            num_heap_records: state.heap_records.len() as u64,
            pending_recordings_count: self.pending_len()? as u64,
            last_update: state.last_update,
            lifetime: state.lifetime,
            string_refs: state.class_refs + state.heap_records.refs(),
            dormant_heap_records: state.heap_records.dormant() as u64,
            thinning: state.thinning,
        })
    }

    /// Whether anything waits for a commit. Cheap (no stats snapshot); usable from the hook.
    pub fn has_pending(&self) -> bool {
        self.pending
            .try_borrow()
            .map(|p| !p.is_empty())
            .unwrap_or(false)
    }

    /// The newest record id handed out so far (0 before the first recording). Ids grow by one
    /// per recording kept, so the recordings made between two readings are the ids after the
    /// first reading up to the second.
    pub fn last_record_id(&self) -> Result<i64> {
        Ok(self.state_ref()?.next_record_id)
    }

    /// Multiplies the weight of every recording with an id in `after_id + 1 ..= up_to_id`,
    /// pending or committed, by `factor` (rounded, at least 1): the windowed sampler moves part
    /// of a gap's credit between two windows once it knows both. Recordings that died or were
    /// dropped meanwhile are not there to scale. Returns how many were scaled. Never calls the
    /// VM; refused (an error, nothing scaled) when the state or the queue is in use.
    pub fn rescale_weights(&self, after_id: i64, up_to_id: i64, factor: f64) -> Result<u64> {
        if !(factor.is_finite() && factor > 0.0) {
            return Err(HeapError::Host(format!(
                "weight factor must be finite and positive, got {factor}"
            )));
        }
        let mut state = self.state()?;
        let mut pending = self.pending()?;
        let scale = |weight: &mut u64| {
            let scaled = (*weight as f64 * factor).round();
            *weight = match scaled >= 1.0 {
                true => scaled.min((u64::MAX / 2) as f64) as u64,
                false => 1,
            };
        };
        let in_range = |id: i64| id > after_id && id <= up_to_id;
        let mut scaled = 0;
        for entry in pending.iter_mut().filter(|p| in_range(p.record_id)) {
            scale(&mut entry.data.weight);
            scaled += 1;
        }
        let span = up_to_id.saturating_sub(after_id).max(0) as usize;
        if span <= state.object_records.len() {
            for id in after_id.saturating_add(1)..=up_to_id {
                if let Some(record) = state.object_records.get_mut(&id) {
                    scale(&mut record.data.weight);
                    scaled += 1;
                }
            }
        } else {
            for (_, record) in state
                .object_records
                .iter_mut()
                .filter(|(id, _)| in_range(**id))
            {
                scale(&mut record.data.weight);
                scaled += 1;
            }
        }
        Ok(scaled)
    }

    pub fn is_recorded(&self, record_id: i64) -> Result<bool> {
        Ok(self.state_ref()?.object_records.contains_key(&record_id))
    }

    /// Ids of all committed records, in no particular order.
    pub fn record_ids(&self) -> Result<Vec<i64>> {
        Ok(self.state_ref()?.object_records.keys().copied().collect())
    }

    /// Test aid: the next recording will find the ids used up.
    pub fn exhaust_record_ids(&self) -> Result<()> {
        self.state()?.next_record_id = FIXNUM_MAX;
        Ok(())
    }

    /// Test aid: the next young update is not held back by the minimum interval.
    pub fn reset_last_update(&self) -> Result<()> {
        self.state()?.last_update_ns = None;
        Ok(())
    }

    /// One line per committed record, for `debug`.
    pub fn debug_lines(&self) -> Result<Vec<String>> {
        let state = self.state_ref()?;
        let strings = self.strings.lock()?;
        let mut ids: Vec<_> = state.object_records.keys().copied().collect();
        ids.sort_unstable();
        Ok(ids
            .iter()
            .filter_map(|id| state.object_records.get(id).map(|r| (id, r)))
            .map(|(id, r)| {
                let d = &r.data;
                let top = r.stack.first();
                let file = top.map_or(Ok(String::new()), |f| strings.get(f.filename));
                let class = strings.get(d.class);
                format!(
                    "record_id={id} weight={} size={} location={}:{} frames={} alloc_gen={} gen_age={} frozen={} class={}",
                    d.weight,
                    d.size,
                    file.unwrap_or_else(|e| format!("<{e}>")),
                    top.map_or(0, |f| f.line),
                    r.stack.len(),
                    d.alloc_gen,
                    d.gen_age,
                    d.frozen,
                    class.unwrap_or_else(|e| format!("<{e}>")),
                )
            })
            .collect())
    }

    /// Approximate heap bytes held by the recorder (records, stacks, queue), for
    /// `ObjectSpace.memsize_of`. Does not count the string storage, which is not introspectable.
    pub fn memsize(&self) -> usize {
        let (Ok(state), Ok(pending)) = (self.state.try_borrow(), self.pending.try_borrow()) else {
            return std::mem::size_of::<Self>();
        };
        let object_entry = std::mem::size_of::<(i64, ObjectRecord)>() + 1;
        std::mem::size_of::<Self>()
            + state.object_records.capacity() * object_entry
            + pending.capacity() * std::mem::size_of::<PendingRecording>()
            + state.heap_records.memsize()
            + self.caches_memsize()
            + (state.class_refs + state.heap_records.refs()) as usize * 8
    }
}

#[cfg(test)]
mod frame_cache_tests;
#[cfg(test)]
mod proptests;
#[cfg(test)]
mod stack_cache_tests;
#[cfg(test)]
mod tests;
#[cfg(test)]
mod thinning_tests;
