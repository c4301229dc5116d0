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

    /// From the allocation sampler: never calls the VM, never raises; mallocs only to intern the
    /// class name (libdatadog's storage). Always deferred: the object id is taken later, in
    /// [`Self::finalize_pending_recordings`]. Returns whether an after-allocation callback is needed.
    pub fn start_recording(&self, object: usize, weight: u32, class: CharSlice) -> bool {
        let sampled = self.with(|s| {
            if !matches!(s.active, Active::None) {
                s.lifetime.recordings_dropped += 1;
            }
            s.num_recordings_skipped = s.num_recordings_skipped.saturating_add(1);
            let sampled = s.num_recordings_skipped >= s.sample_rate && !s.updating;
            if !sampled {
                s.active = Active::Skipped;
            }
            sampled
        });
        // An internal object is skipped after the sample rate has picked it, without resetting
        // the skip count, so the next allocation sample gets its chance (as heap_recorder.c 2.42).
        let internal = |o| self.host.is_internal.is_some_and(|f| f(o));
        if sampled && internal(object) {
            self.with(|s| s.active = Active::Skipped);
            return false;
        }
        let decision = self.with(|s| {
            if !sampled {
                return None;
            }
            if s.pending.len() >= MAX_PENDING_RECORDINGS {
                s.lifetime.deferred_recordings_skipped_buffer_full += 1;
                s.active = Active::Skipped;
                return Some(None);
            }
            let needs_after = s.pending.is_empty() || s.pending.len() >= MAX_PENDING_RECORDINGS / 2;
            s.num_recordings_skipped = 0;
            Some(Some((needs_after, weight.saturating_mul(s.sample_rate))))
        });
        let (needs_after, weight) = match decision {
            None => return false,
            Some(None) => return true,
            Some(Some(d)) => d,
        };
        let alloc_gen = (self.host.gc_count)();
        match self.strings.intern(class) {
            Ok(class) => self.with(|s| {
                s.active = Active::Deferred {
                    object,
                    data: LiveObjectData {
                        weight,
                        class,
                        alloc_gen,
                        ..LiveObjectData::default()
                    },
                }
            }),
            Err(_) => self.with(|s| {
                s.lifetime.recordings_dropped += 1;
                s.active = Active::Skipped;
            }),
        }
        needs_after
    }

    /// Ends the recording `start_recording` began: interns the stack into a heap record and queues
    /// the object. Never calls the VM.
    pub fn end_recording(&self, locations: &[Location]) -> Outcome<()> {
        let active = self.with(|s| std::mem::replace(&mut s.active, Active::None));
        let (object, data) = match active {
            Active::Skipped => return Ok(()),
            Active::None => {
                return Err(Failure::Runtime(
                    "Ended a heap recording that was not started".into(),
                ))
            }
            Active::Deferred { object, data } => (object, data),
        };
        let heap_record = match self.heap_record_for(locations) {
            Ok(r) => r,
            Err(e) => {
                let _ = self.strings.unintern_all(&[data.class]);
                return Err(e);
            }
        };
        self.with(|s| {
            let count = s.heap_records.get_mut(&heap_record).ok_or_else(|| {
                Failure::Runtime("heap record vanished before it was used".into())
            })?;
            if *count == u32::MAX {
                return Err(Failure::Runtime(
                    "Reached maximum number of tracked objects for heap record".into(),
                ));
            }
            *count += 1;
            s.pending.push(PendingRecording {
                object,
                heap_record,
                data,
                claimed: false,
            });
            Ok(())
        })
    }

    fn heap_record_for(&self, locations: &[Location]) -> Outcome<HeapRecord> {
        let n = locations.len();
        let ids = self.with(|s| {
            s.scratch_slices.clear();
            s.scratch_slices
                .extend(locations.iter().map(|l| l.function.filename));
            s.scratch_slices
                .extend(locations.iter().map(|l| l.function.name));
            s.scratch_ids.clear();
            s.scratch_ids.resize(2 * n, ManagedStringId::default());
            self.strings
                .intern_all(&s.scratch_slices, &mut s.scratch_ids)?;
            Ok::<_, Failure>(s.scratch_ids.clone())
        })?;
        let frames: HeapRecord = (0..n)
            .map(|i| HeapFrame {
                filename: ids[i],
                name: ids[i + n],
                line: locations[i].line as i32,
            })
            .collect();
        let existing = self.with(|s| {
            if let Some((k, _)) = s.heap_records.get_key_value(&frames) {
                Some(k.clone())
            } else {
                s.heap_records.insert(frames.clone(), 0);
                None
            }
        });
        match existing {
            Some(k) => {
                self.strings.unintern_all(&ids)?;
                Ok(k)
            }
            None => Ok(frames),
        }
    }

    /// Objects the shim's mark function keeps alive until they have an id.
    pub fn for_each_pending_object(&self, mut f: impl FnMut(usize)) {
        self.with(|s| {
            s.pending.iter().for_each(|p| f(p.object));
            if let Active::Deferred { object, .. } = s.active {
                f(object);
            }
        });
    }

    /// From a postponed job: takes each pending object's id and commits it. Calls the VM.
    ///
    /// Each recording stays on the queue, where the shim's mark function sees it, until its id
    /// is taken: `rb_obj_id` may run a GC, which would otherwise free (or reuse the slot of) an
    /// object whose recording is only on this stack. Only the recordings queued when the call
    /// began are taken; any that the id calls cause wait for the next call.
    ///
    /// The id call may let another thread in, which may call this too: a recording whose id is
    /// being taken is claimed, and the other call skips it. Without that both calls took an id
    /// for the same object; with 2.42's record ids the one that lost the race left a weak map
    /// entry that no object record named (and that no update would ever look up).
    pub fn finalize_pending_recordings(&self) -> Outcome<()> {
        let queued = self.with(|s| s.pending.len());
        let mut result = Ok(());
        for _ in 0..queued {
            // During an update another thread may have released the GVL to us: leave the rest of
            // the queue for the next call instead of changing object_records under the update.
            let Some(object) = self.with(|s| {
                if s.updating {
                    return None;
                }
                let p = s.pending.iter_mut().find(|p| !p.claimed)?;
                p.claimed = true;
                Some(p.object)
            }) else {
                break;
            };
            let mut id = 0i64;
            let rc = (self.host.obj_id)(self.host.ctx, object, &mut id);
            // Only this loop removes pending recordings, and other calls skip a claimed one, so
            // it is still queued; if it were not, there would be nothing to commit the id to.
            let Some(p) = self.with(|s| {
                let at = s
                    .pending
                    .iter()
                    .position(|p| p.claimed && p.object == object)?;
                s.lifetime.deferred_recordings_finalized += 1;
                Some(s.pending.remove(at))
            }) else {
                continue;
            };
            let outcome = match rc {
                0 => self.commit(id, p),
                -1 => {
                    self.drop_record(&p.heap_record, p.data.class);
                    Err(Failure::Runtime(
                        "Heap profiling: no Fixnum id (bignum object id, or record ids exhausted). Heap profiling cannot continue."
                            .into(),
                    ))
                }
                tag => {
                    self.drop_record(&p.heap_record, p.data.class);
                    Err(Failure::RubyTag(tag))
                }
            };
            if result.is_ok() {
                result = outcome;
            }
        }
        result
    }

    fn commit(&self, id: i64, p: PendingRecording) -> Outcome<()> {
        let duplicate = self.with(|s| match s.object_records.entry(id) {
            std::collections::hash_map::Entry::Occupied(_) => true,
            std::collections::hash_map::Entry::Vacant(v) => {
                v.insert(ObjectRecord {
                    heap_record: p.heap_record.clone(),
                    data: p.data,
                });
                false
            }
        });
        if duplicate {
            self.drop_record(&p.heap_record, p.data.class);
            return Err(Failure::Runtime(format!(
                "Object ids are supposed to be unique. We got 2 allocation recordings with the same id. id={id}"
            )));
        }
        Ok(())
    }

    /// One fewer object on `heap_record`; frees it (uninterning its frames) at zero.
    fn drop_record(&self, heap_record: &HeapRecord, class: ManagedStringId) {
        let freed = self.with(|s| match s.heap_records.get_mut(heap_record) {
            Some(c) => {
                *c = c.saturating_sub(1);
                if *c == 0 {
                    s.heap_records.remove(heap_record);
                    true
                } else {
                    false
                }
            }
            None => false,
        });
        let mut ids: Vec<ManagedStringId> = Vec::new();
        if freed {
            ids.extend(heap_record.iter().flat_map(|f| [f.filename, f.name]));
        }
        if class.value != 0 {
            ids.push(class);
        }
        // heap_recorder.c raises on unintern failure; a failed unintern only leaks a string here.
        let _ = self.strings.unintern_all(&ids);
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
