//! Iteration over a point-in-time snapshot of the tracked objects.
//!
//! `prepare_iteration` runs a full update, copies the records and the text of every string they
//! name (each distinct one once). The snapshot then owns all it reads (stacks are shared `Arc`s,
//! names are its own copies), so it can be walked and encoded on a thread that does not hold the
//! GVL without touching the recorder or its string storage.

use std::collections::HashMap;
use std::hash::BuildHasherDefault;

use rustc_hash::{FxHashSet, FxHasher};

use crate::error::{HeapError, Result};
use crate::stacks::Stack;
use crate::strings::StringId;
use crate::vm::Vm;

use super::{HeapRecorder, LiveObjectData, State, UpdateKind, MAX_PENDING_RECORDINGS};

/// Objects younger than this (not yet through a GC) are left out of iterations.
pub const ITERATION_MIN_AGE: u64 = 1;

/// One tracked object as the snapshot saw it.
#[derive(Debug, Clone)]
pub struct LiveObject {
    pub record_id: i64,
    pub stack: Stack,
    pub data: LiveObjectData,
}

/// The text of the strings a snapshot refers to, by storage id.
#[derive(Debug, Default)]
pub struct Names {
    texts: HashMap<StringId, Box<str>, BuildHasherDefault<FxHasher>>,
}

impl Names {
    /// The text of `id`; "" for id 0. An id the snapshot does not refer to is an error naming it.
    pub fn get(&self, id: StringId) -> Result<&str> {
        if id == 0 {
            return Ok("");
        }
        self.texts.get(&id).map(|t| &**t).ok_or_else(|| {
            HeapError::Pprof(format!("string id {id} is not one of the snapshot's names"))
        })
    }

    /// Distinct non-empty strings held.
    pub fn len(&self) -> usize {
        self.texts.len()
    }

    pub fn is_empty(&self) -> bool {
        self.texts.is_empty()
    }
}

pub struct Snapshot {
    objects: Vec<LiveObject>,
    names: Names,
    size_enabled: bool,
    notes: Vec<String>,
}

impl Snapshot {
    /// Calls `f` with each object of age >= 1 until it returns false. Makes no VM call: safe on
    /// a thread without the GVL.
    pub fn for_each_live(&self, mut f: impl FnMut(&LiveObject) -> bool) {
        for object in &self.objects {
            if object.data.gen_age >= ITERATION_MIN_AGE && !f(object) {
                break;
            }
        }
    }

    /// Every name (frame names and files, class names) the snapshot's objects refer to.
    pub fn names(&self) -> &Names {
        &self.names
    }

    pub fn size_enabled(&self) -> bool {
        self.size_enabled
    }

    /// What a reader must know to trust the numbers: the recorder was bounded by
    /// `max_tracked_objects` (pprof comments; `datadog-heap report` prints them).
    pub fn notes(&self) -> &[String] {
        &self.notes
    }

    /// Adds what the binding knows a reader must know (an interval the overhead budget raised,
    /// a full GC before the profile).
    pub fn add_note(&mut self, note: String) {
        self.notes.push(note);
    }

    /// Objects in the snapshot, young ones included.
    pub fn len(&self) -> usize {
        self.objects.len()
    }

    pub fn is_empty(&self) -> bool {
        self.objects.is_empty()
    }
}

impl HeapRecorder {
    /// Full update, then a snapshot of every record and of the names they use. Fails if an
    /// iteration is already prepared. Needs the GVL; may lose it during the update, not after.
    pub fn prepare_iteration(&self, vm: &mut dyn Vm) -> Result<Snapshot> {
        if self.state_ref()?.iterating {
            return Err(HeapError::IterationInProgress);
        }
        self.update(vm, UpdateKind::Full)?;
        let mut state = self.state()?;
        if state.iterating {
            // Another thread prepared one while the update let it run.
            return Err(HeapError::IterationInProgress);
        }
        let objects: Vec<LiveObject> = state
            .object_records
            .iter()
            .map(|(&record_id, r)| LiveObject {
                record_id,
                stack: r.stack.clone(),
                data: r.data,
            })
            .collect();
        let names = self.names_of(&objects)?;
        state.iterating = true;
        Ok(Snapshot {
            objects,
            names,
            size_enabled: state.options.size_enabled,
            notes: bounded_notes(&state),
        })
    }

    /// The text of every string `objects` refer to, read from the storage in one hold of its lock.
    /// Each distinct stack is looked at once (stacks are shared), so this costs about one hash
    /// lookup per frame of each distinct stack plus one per object.
    fn names_of(&self, objects: &[LiveObject]) -> Result<Names> {
        let strings = self.strings.lock()?;
        let mut names = Names::default();
        let mut add = |id: StringId| -> Result<()> {
            if id == 0 || names.texts.contains_key(&id) {
                return Ok(());
            }
            let text = strings.get(id).map_err(|e| {
                HeapError::Pprof(format!("string id {id} of a record is not interned: {e}"))
            })?;
            names.texts.insert(id, text.into_boxed_str());
            Ok(())
        };
        let mut seen_stacks: FxHashSet<*const crate::stacks::Frame> = FxHashSet::default();
        for object in objects {
            add(object.data.class)?;
            if seen_stacks.insert(object.stack.as_ptr()) {
                for frame in object.stack.iter() {
                    add(frame.name)?;
                    add(frame.filename)?;
                }
            }
        }
        Ok(names)
    }

    /// Ends the iteration; updates may run again.
    pub fn finish_iteration(&self) -> Result<()> {
        let mut state = self.state()?;
        if !state.iterating {
            return Err(HeapError::NoIterationPrepared);
        }
        state.iterating = false;
        Ok(())
    }

    pub fn is_iterating(&self) -> Result<bool> {
        Ok(self.state_ref()?.iterating)
    }
}

/// The notes a snapshot carries when something bounded the recorder (see `Snapshot::notes`):
/// `max_tracked_objects`, or recordings dropped before they reached it.
fn bounded_notes(state: &State) -> Vec<String> {
    let cap = state.options.max_tracked_objects;
    let mut notes = Vec::new();
    let l = &state.lifetime;
    let (full, locked) = (
        l.deferred_recordings_skipped_buffer_full,
        l.recordings_skipped_locked,
    );
    if full + locked > 0 {
        notes.push(format!(
            "datadog_heap: estimates are low: {} recordings were dropped unrecorded ({full} with \
             the pending queue full ({MAX_PENDING_RECORDINGS}): many samples between two safe \
             points, as in a long C call at a small sample_every; {locked} while a commit or \
             update was mid-way in another thread)",
            full + locked
        ));
    }
    if l.recordings_skipped_max_tracked > 0 {
        notes.push(format!(
            "datadog_heap: estimates are low: {} recordings were skipped at max_tracked_objects \
             ({cap}) before the records could be thinned",
            l.recordings_skipped_max_tracked
        ));
    }
    if l.thinnings > 0 {
        notes.push(format!(
            "datadog_heap: max_tracked_objects ({cap}) was neared, so records were thinned {} \
             time{} (half dropped at random, the rest weighted double; new recordings kept one \
             in {}): estimates stay unbiased, with more variance",
            l.thinnings,
            if l.thinnings == 1 { "" } else { "s" },
            state.thinning
        ));
    }
    notes
}
