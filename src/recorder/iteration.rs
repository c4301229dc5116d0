//! Iteration over a point-in-time snapshot of the tracked objects.
//!
//! `prepare_iteration` runs a full update and copies the records; while the snapshot exists no
//! update runs, so every id it refers to stays interned. The snapshot owns what it reads (stacks
//! are shared `Arc`s, the storage is behind its mutex), so it can be walked and encoded on a
//! thread that does not hold the GVL.

use crate::error::{HeapError, Result};
use crate::stack::Stack;
use crate::strings::Strings;
use crate::vm::Vm;

use super::{HeapRecorder, LiveObjectData, UpdateKind};

/// Objects younger than this (not yet through a GC) are left out of iterations.
pub const ITERATION_MIN_AGE: u64 = 1;

/// One tracked object as the snapshot saw it.
#[derive(Debug, Clone)]
pub struct LiveObject {
    pub record_id: i64,
    pub stack: Stack,
    pub data: LiveObjectData,
}

pub struct Snapshot {
    objects: Vec<LiveObject>,
    strings: Strings,
    size_enabled: bool,
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

    pub fn strings(&self) -> &Strings {
        &self.strings
    }

    pub fn size_enabled(&self) -> bool {
        self.size_enabled
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
    /// Full update, then a snapshot of every record. Fails if an iteration is already prepared.
    /// Needs the GVL; may lose it during the update.
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
        let objects = state
            .object_records
            .iter()
            .map(|(&record_id, r)| LiveObject {
                record_id,
                stack: r.stack.clone(),
                data: r.data,
            })
            .collect();
        state.iterating = true;
        Ok(Snapshot {
            objects,
            strings: self.strings.clone(),
            size_enabled: state.options.size_enabled,
        })
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
