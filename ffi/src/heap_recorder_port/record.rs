//! Recording: a sampled allocation's start and end (its class and stack made into a heap record),
//! the pending queue, and the finalize/commit call that gives each recording its object id (or
//! record id) and makes it an object record. As in heap_recorder.c, the sampler's calls (start
//! and end) never call the VM.

use super::{
    Active, Failure, HeapFrame, HeapRecord, HeapRecorder, ObjectRecord, Outcome, PendingRecording,
    StringTable, MAX_PENDING_RECORDINGS,
};
use crate::types::{CharSlice, LiveObjectData, Location, ManagedStringId};

impl<S: StringTable> HeapRecorder<S> {
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
    pub(super) fn drop_record(&self, heap_record: &HeapRecord, class: ManagedStringId) {
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
}
