//! Updates: age every tracked object, drop the ones the VM collected, refresh sizes.

use crate::error::Result;
use crate::lock::LockGuard;
use crate::stats::LastUpdate;
use crate::vm::Vm;

use super::HeapRecorder;

/// Young updates are held back until this long after the previous update.
pub const MIN_TIME_BETWEEN_UPDATES_NS: i64 = 2_000_000_000;

/// Objects at least this many GCs old are left alone by young updates.
pub const OLD_AGE: u64 = 3;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UpdateKind {
    /// Optional and cheap: skipped when busy, when no GC happened since the last update, or when
    /// the last one was less than 2 s ago; visits only objects younger than [`OLD_AGE`].
    Young,
    /// Mandatory: waits for the lock, ignores the gates, visits everything.
    Full,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UpdateOutcome {
    Done(LastUpdate),
    SkippedConcurrent,
    SkippedGcGen,
    SkippedTime,
    SkippedIterating,
}

impl HeapRecorder {
    /// Runs an update. Needs the GVL; may lose it (and may allocate) through `vm`. On an error
    /// from `vm` the lock is released and the records visited so far keep their new state.
    pub fn update(&self, vm: &mut dyn Vm, kind: UpdateKind) -> Result<UpdateOutcome> {
        let full = kind == UpdateKind::Full;
        if full {
            self.lock.lock(|| vm.yield_thread())?;
        } else if !self.lock.try_lock() {
            self.state()?.lifetime.updates_skipped_concurrent += 1;
            return Ok(UpdateOutcome::SkippedConcurrent);
        }
        let _unlock = LockGuard(&self.lock);
        self.update_locked(vm, full)
    }

    fn update_locked(&self, vm: &mut dyn Vm, full: bool) -> Result<UpdateOutcome> {
        let (ids, size_enabled, update_gen, now) = {
            let mut state = self.state()?;
            if state.iterating {
                // Records must stay as the snapshot saw them until the iteration finishes.
                state.lifetime.updates_skipped_iterating += 1;
                return Ok(UpdateOutcome::SkippedIterating);
            }
            let gc = vm.gc_count();
            let now = vm.now_ns();
            if !full {
                if gc == state.update_gen {
                    state.lifetime.updates_skipped_gcgen += 1;
                    return Ok(UpdateOutcome::SkippedGcGen);
                }
                if let Some(last) = state.last_update_ns {
                    if now.saturating_sub(last) < MIN_TIME_BETWEEN_UPDATES_NS {
                        state.lifetime.updates_skipped_time += 1;
                        return Ok(UpdateOutcome::SkippedTime);
                    }
                }
            }
            state.update_gen = gc;
            state.last_update = LastUpdate::default();
            let ids: Vec<i64> = state.object_records.keys().copied().collect();
            (ids, state.options.size_enabled, gc, now)
        };

        let mut any_dead = false;
        for id in ids {
            let measure_size = {
                let mut state = self.state()?;
                let Some(record) = state.object_records.get_mut(&id) else {
                    continue;
                };
                // An object allocated after the GC count was read would show a negative age.
                let age = update_gen.saturating_sub(record.data.alloc_gen);
                record.data.gen_age = age;
                let frozen = record.data.frozen;
                // Age 0: it has not met a GC yet, so it is almost surely alive; old objects are
                // left to full updates.
                if age == 0 || (!full && age >= OLD_AGE) {
                    state.last_update.objects_skipped += 1;
                    continue;
                }
                size_enabled && !frozen
            };

            let found = vm.lookup(id, measure_size)?;

            let mut state = self.state()?;
            match found {
                None => {
                    if let Some(record) = state.object_records.remove(&id) {
                        self.release_record(&mut state, &record.stack, record.data.class)?;
                    }
                    state.last_update.objects_dead += 1;
                    any_dead = true;
                }
                Some(info) => {
                    if let Some(record) = state.object_records.get_mut(&id) {
                        if let Some(size) = info.size {
                            record.data.size = size;
                        }
                        record.data.frozen = info.frozen;
                    }
                    state.last_update.objects_alive += 1;
                    if info.frozen {
                        state.last_update.objects_frozen += 1;
                    }
                }
            }
        }

        if any_dead {
            self.strings.lock()?.compact();
        }
        let mut state = self.state()?;
        state.last_update_ns = Some(now);
        let last = state.last_update;
        state.lifetime.record_update(full, &last);
        Ok(UpdateOutcome::Done(last))
    }
}
