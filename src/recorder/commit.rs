//! Commits: pending recordings enter the liveness table and become tracked records; and what a
//! record gives back when it goes.

use super::{CommitOutcome, HeapRecorder, ObjectRecord, State};
use crate::error::{HeapError, Result};
use crate::lock::LockGuard;
use crate::stacks::Stack;
use crate::strings::StringId;
use crate::vm::Vm;

impl HeapRecorder {
    /// Moves pending recordings into the tracked set, newest first: each is written to the
    /// liveness table through `vm` and only then leaves the queue, so a failure (or a thread
    /// switch) midway loses nothing; the failed entry and those older stay pending.
    ///
    /// Needs the GVL; may lose it and may allocate (through `vm`).
    pub fn commit(&self, vm: &mut dyn Vm) -> Result<CommitOutcome> {
        if !self.lock.try_lock(vm.current_thread()) {
            self.state()?.lifetime.commits_skipped_locked += 1;
            return Ok(CommitOutcome::SkippedLocked);
        }
        let _unlock = LockGuard(&self.lock);
        let mut committed = 0;
        loop {
            let next = (self.pending()?.last()).map(|p| (p.record_id, p.object, p.hidden_at_birth));
            let Some((record_id, object, hidden_at_birth)) = next else {
                break;
            };
            if hidden_at_birth && vm.is_hidden(object) {
                let mut state = self.state()?;
                let Some(pending) = self.pending()?.pop() else {
                    break;
                };
                state.lifetime.recordings_dropped_hidden += 1;
                self.release_record(&mut state, &pending.stack, pending.data.class)?;
                continue;
            }
            vm.remember(record_id, object)?;

            let mut state = self.state()?;
            let Some(pending) = self.pending()?.pop() else {
                break;
            };
            if state.object_records.contains_key(&pending.record_id) {
                // Cannot happen with ids we hand out; drop the entry (and what it holds) rather
                // than loop on it forever.
                self.release_record(&mut state, &pending.stack, pending.data.class)?;
                return Err(HeapError::DuplicateRecordId {
                    record_id: pending.record_id,
                });
            }
            let seen_in_walk = state.walk_epoch;
            state.object_records.insert(
                pending.record_id,
                ObjectRecord {
                    stack: pending.stack,
                    data: pending.data,
                    seen_in_walk,
                },
            );
            state.lifetime.deferred_recordings_committed += 1;
            state.committed_since_walk += 1;
            committed += 1;
        }
        // Thinned here too, not only by updates (which wait for a GC): between two GCs the
        // records could otherwise reach the cap, and recordings past it are lost.
        if self.adjust_thinning(vm)? {
            self.strings.lock()?.compact();
        }
        Ok(CommitOutcome::Committed(committed))
    }

    /// Gives back what one record holds: its claim on the stack and its class name.
    pub(super) fn release_record(
        &self,
        state: &mut State,
        stack: &Stack,
        class: StringId,
    ) -> Result<()> {
        let mut strings = self.strings.lock()?;
        state.heap_records.release(&mut strings, stack)?;
        state.class_refs = state.class_refs.saturating_sub(u64::from(class != 0));
        strings.unintern(class)
    }
}
