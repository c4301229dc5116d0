//! Updates: age every tracked object, drop the ones the VM collected, refresh sizes.

use crate::error::Result;
use crate::lock::LockGuard;
use crate::stats::LastUpdate;
use crate::vm::{LiveInfo, Probe, Vm};

use super::{HeapRecorder, ObjectRecord};

/// Young updates are held back until this long after the previous update.
pub const MIN_TIME_BETWEEN_UPDATES_NS: i64 = 2_000_000_000;

/// Objects at least this many GCs old are left alone by young updates.
pub const OLD_AGE: u64 = 3;

/// A young update walks the liveness table, rather than looking its young records up one by one,
/// when there is at least one young or newly arrived record in this many (see `update_locked`).
const LOOKUPS_PER_WALKED_OBJECT: usize = 4;

/// Most records an update walks (see `update_locked`): a walk costs 80 to 700 ns per record and
/// lets no other thread run until it ends, so this keeps that pause near 100 ms at most on a small
/// machine. Past it, updates look records up one by one.
pub const WALK_MAX_RECORDS: usize = 300_000;

/// The share of `max_tracked_objects` (numerator, denominator) at which commits and updates thin
/// the records (see `adjust_thinning`): room is left for the recordings that arrive before the
/// next commit (the pending queue holds 4096).
pub const THIN_AT: (usize, usize) = (15, 16);

/// How many tracked objects make `cap` thin its records (see [`THIN_AT`]).
fn thin_threshold(cap: usize) -> usize {
    cap.saturating_mul(THIN_AT.0) / THIN_AT.1
}

/// An update halves the thinning again when fewer than `max_tracked_objects / UNTHIN_BELOW`
/// objects are tracked.
pub const UNTHIN_BELOW: usize = 8;

/// The most thinning there can be (each record then stands for 2^40 sampled allocations).
const MAX_THINNING: u64 = 1 << 40;

/// After an update, the records table gives memory back when it is this many times larger than
/// what it holds (a burst of short-lived samples grew it).
const SHRINK_WHEN_CAPACITY_EXCEEDS: usize = 4;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UpdateKind {
    /// Optional and cheap: skipped when busy, when no GC happened since the last update, or when
    /// the last one was less than 2 s ago; checks only objects younger than [`OLD_AGE`] and
    /// measures no size, as the reference (a walk still drops old ones that died, counted as
    /// skipped and in `skipped_objects_dropped`).
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
        let me = vm.current_thread();
        if full {
            let started = vm.now_ns();
            self.lock.lock(me, started, &mut || {
                vm.yield_thread()?;
                Ok(vm.now_ns())
            })?;
        } else if !self.lock.try_lock(me) {
            self.state()?.lifetime.updates_skipped_concurrent += 1;
            return Ok(UpdateOutcome::SkippedConcurrent);
        }
        let _unlock = LockGuard(&self.lock);
        self.update_locked(vm, full)
    }

    fn update_locked(&self, vm: &mut dyn Vm, full: bool) -> Result<UpdateOutcome> {
        let pending = self.pending_len()?;
        let (size_enabled, update_gen, now, total, walk_worth_it) = {
            let mut state = self.state()?;
            if state.iterating {
                // Records must stay as the snapshot saw them until the iteration finishes.
                state.lifetime.updates_skipped_iterating += 1;
                return Ok(UpdateOutcome::SkippedIterating);
            }
            let gc = vm.gc_count();
            let now = vm.now_ns();
            // Near the cap the dead are pruned (and the rest thinned) at every GC: waiting out
            // the interval would skip recordings meanwhile.
            let near_cap = state.object_records.len() + pending
                >= thin_threshold(state.options.max_tracked_objects);
            if !full {
                if gc == state.update_gen {
                    state.lifetime.updates_skipped_gcgen += 1;
                    return Ok(UpdateOutcome::SkippedGcGen);
                }
                if let (Some(last), false) = (state.last_update_ns, near_cap) {
                    if now.saturating_sub(last) < MIN_TIME_BETWEEN_UPDATES_NS {
                        state.lifetime.updates_skipped_time += 1;
                        return Ok(UpdateOutcome::SkippedTime);
                    }
                }
            }
            state.update_gen = gc;
            state.last_update = LastUpdate::default();
            let total = state.object_records.len();
            // A walk costs about what a lookup does per LOOKUPS_PER_WALKED_OBJECT records, and it
            // shows every record that died, old ones included. A young update walks when it has
            // that many young records to look up anyway, or when that many records came in since
            // the last walk (short-lived samples that aged past young before dying would pile up
            // until a full update otherwise), or at max_tracked_objects (every dead record dropped
            // makes room). A steady heap of old objects gets the cheap lookups of its few young.
            let walk_worth_it = full || {
                let young = |age: u64| age > 0 && age < OLD_AGE;
                let visits = (state.object_records.values())
                    .filter(|r| young(gc.saturating_sub(r.data.alloc_gen)))
                    .count();
                let arrivals = usize::try_from(state.committed_since_walk).unwrap_or(usize::MAX);
                near_cap
                    || visits
                        .saturating_add(arrivals)
                        .saturating_mul(LOOKUPS_PER_WALKED_OBJECT)
                        >= total
            };
            (state.options.size_enabled, gc, now, total, walk_worth_it)
        };

        // A walk holds the GVL from start to end: past WALK_MAX_RECORDS, lookups, which let other
        // threads in between, keep their waits short.
        let walked = if walk_worth_it && total <= WALK_MAX_RECORDS {
            self.update_by_walk(vm, full, update_gen, size_enabled)?
        } else {
            None
        };
        let any_dead = match walked {
            Some(any_dead) => any_dead,
            None => self.update_by_lookup(vm, full, update_gen, size_enabled)?,
        };

        let thinned = self.adjust_thinning(vm)?;
        // Dormant stacks unused since the last full update give their ids back (see stack.rs).
        let swept = full && {
            let mut state = self.state()?;
            state
                .heap_records
                .sweep_dormant(&mut self.strings.lock()?, false)
                > 0
        };
        if any_dead || thinned || swept {
            self.strings.lock()?.compact();
        }
        let mut state = self.state()?;
        let (len, capacity) = (state.object_records.len(), state.object_records.capacity());
        if capacity > 1024 && capacity > len.saturating_mul(SHRINK_WHEN_CAPACITY_EXCEEDS) {
            state.object_records.shrink_to(len.saturating_mul(2));
        }
        state.last_update_ns = Some(now);
        let last = state.last_update;
        state.lifetime.record_update(full, &last);
        Ok(UpdateOutcome::Done(last))
    }

    /// Near `max_tracked_objects` (at [`THIN_AT`] of it, after an update's pruning of the dead,
    /// or after a commit), drops each
    /// tracked object (committed or pending) with probability one half and doubles the weight of
    /// the rest, and doubles the thinning of new recordings: every estimate stays unbiased (each
    /// record's weight is still the inverse of the chance it had to be kept), with more variance,
    /// and recording goes on instead of stopping at the cap. Halves the thinning again once the
    /// records fall under [`UNTHIN_BELOW`] (records kept so far keep their weights). Returns
    /// whether records were thinned (as many halvings as it takes). Runs under the lock. The
    /// dropped records' entries leave the liveness table too (`Vm::forget`), so the cap bounds
    /// the table and the walks over it as well as the records; the table may let other threads
    /// run meanwhile, which find the records already gone.
    pub(super) fn adjust_thinning(&self, vm: &mut dyn Vm) -> Result<bool> {
        let mut thinned = false;
        let mut forgotten = Vec::new();
        while self.thin_once(&mut forgotten)? {
            thinned = true;
        }
        if !forgotten.is_empty() {
            vm.forget(&forgotten)?;
        }
        if !thinned {
            let mut state = self.state()?;
            let tracked = state.object_records.len() + self.pending_len()?;
            if state.thinning > 1 && tracked < state.options.max_tracked_objects / UNTHIN_BELOW {
                state.thinning /= 2;
            }
        }
        Ok(thinned)
    }

    /// One halving of the tracked objects, if they are at [`THIN_AT`] of the cap: whether it ran.
    /// The ids of the committed records it drops are added to `forgotten`.
    fn thin_once(&self, forgotten: &mut Vec<i64>) -> Result<bool> {
        let mut state = self.state()?;
        let mut pending = self.pending()?;
        let cap = state.options.max_tracked_objects;
        let tracked = state.object_records.len() + pending.len();
        if tracked >= thin_threshold(cap) && state.thinning < MAX_THINNING {
            let ids: Vec<i64> = state.object_records.keys().copied().collect();
            let mut dropped = 0;
            for id in ids {
                if state.next_random() & 1 == 0 {
                    if let Some(record) = state.object_records.remove(&id) {
                        self.release_record(&mut state, &record.stack, record.data.class)?;
                        forgotten.push(id);
                        dropped += 1;
                    }
                } else if let Some(record) = state.object_records.get_mut(&id) {
                    record.data.weight = record.data.weight.saturating_mul(2);
                }
            }
            let mut kept = Vec::with_capacity(pending.len());
            for mut p in pending.drain(..) {
                if state.next_random() & 1 == 0 {
                    self.release_record(&mut state, &p.stack, p.data.class)?;
                    dropped += 1;
                } else {
                    p.data.weight = p.data.weight.saturating_mul(2);
                    kept.push(p);
                }
            }
            *pending = kept;
            state.thinning *= 2;
            state.lifetime.thinnings += 1;
            state.lifetime.records_thinned += dropped;
            return Ok(true);
        }
        Ok(false)
    }

    /// Ages a record and says whether this update visits it (else counts it as skipped).
    fn visit(
        record: &mut ObjectRecord,
        last: &mut LastUpdate,
        full: bool,
        update_gen: u64,
    ) -> bool {
        // An object allocated after the GC count was read would show a negative age.
        let age = update_gen.saturating_sub(record.data.alloc_gen);
        record.data.gen_age = age;
        if Self::skips(age, full) {
            last.objects_skipped += 1;
            return false;
        }
        true
    }

    /// Whether an update leaves a record of this age alone, as the reference does. Age 0: it
    /// has not met a GC yet, so it is almost surely alive; old objects are left to full updates.
    fn skips(age: u64, full: bool) -> bool {
        age == 0 || (!full && age >= OLD_AGE)
    }

    /// Whether this update measures a visited record's size: only full updates do, as in the
    /// reference (a young update only learns which young objects died), and each of them
    /// measures every record again (objects grow and shrink after allocation: a profile reports
    /// their size at the time of the profile) except those measured while frozen.
    fn measures_size(record: &ObjectRecord, full: bool, size_enabled: bool) -> bool {
        full && size_enabled && !record.data.size_final
    }

    fn note_alive(record: &mut ObjectRecord, last: &mut LastUpdate, info: LiveInfo) {
        if let Some(size) = info.size {
            record.data.size = size;
            record.data.size_final = info.frozen;
        }
        record.data.frozen = info.frozen;
        last.objects_alive += 1;
        if info.frozen {
            last.objects_frozen += 1;
        }
    }

    /// One walk over the liveness table: what it shows is alive, what it misses was collected.
    /// `None` when the VM cannot walk; else whether anything died.
    fn update_by_walk(
        &self,
        vm: &mut dyn Vm,
        full: bool,
        update_gen: u64,
        size_enabled: bool,
    ) -> Result<Option<bool>> {
        let epoch = {
            let mut state = self.state()?;
            state.walk_epoch = state.walk_epoch.wrapping_add(1);
            state.walk_epoch
        };
        let mut failure = None;
        let mut visit = |id: i64, probe: Probe<'_>| {
            // The state is not borrowed while `probe` runs: measuring a size runs the object's
            // own size function (an extension's, for T_DATA), which may allocate and so GC.
            let measure_size = {
                let mut state = match self.state() {
                    Ok(state) => state,
                    Err(e) => {
                        failure.get_or_insert(e);
                        return;
                    }
                };
                let state = &mut *state;
                let Some(record) = state.object_records.get_mut(&id) else {
                    return; // an entry whose record is gone (cleared, or before a fork)
                };
                record.seen_in_walk = epoch;
                if !Self::visit(record, &mut state.last_update, full, update_gen) {
                    return;
                }
                Self::measures_size(record, full, size_enabled)
            };
            let info = probe(measure_size);
            match self.state() {
                Ok(mut state) => {
                    let state = &mut *state;
                    if let Some(record) = state.object_records.get_mut(&id) {
                        Self::note_alive(record, &mut state.last_update, info);
                    }
                }
                Err(e) => {
                    failure.get_or_insert(e);
                }
            }
        };
        let walked = vm.walk_live(&mut visit)?;
        if let Some(e) = failure {
            return Err(e);
        }
        if !walked {
            return Ok(None);
        }

        let mut state = self.state()?;
        state.committed_since_walk = 0;
        let dead: Vec<i64> = (state.object_records.iter())
            .filter(|(_, r)| r.seen_in_walk != epoch)
            .map(|(&id, _)| id)
            .collect();
        for id in &dead {
            if let Some(record) = state.object_records.remove(id) {
                // A record this update skips (an old one in a young update) counts as skipped,
                // as the reference, which never looks at it, counts it; the walk drops it anyway.
                let age = update_gen.saturating_sub(record.data.alloc_gen);
                if Self::skips(age, full) {
                    state.last_update.objects_skipped += 1;
                    state.last_update.skipped_objects_dropped += 1;
                } else {
                    state.last_update.objects_dead += 1;
                }
                self.release_record(&mut state, &record.stack, record.data.class)?;
            }
        }
        Ok(Some(!dead.is_empty()))
    }

    /// Looks each record up in the liveness table. Whether anything died.
    fn update_by_lookup(
        &self,
        vm: &mut dyn Vm,
        full: bool,
        update_gen: u64,
        size_enabled: bool,
    ) -> Result<bool> {
        let ids: Vec<i64> = self.state()?.object_records.keys().copied().collect();
        let mut any_dead = false;
        for id in ids {
            let measure_size = {
                let mut state = self.state()?;
                let state = &mut *state;
                let Some(record) = state.object_records.get_mut(&id) else {
                    continue;
                };
                if !Self::visit(record, &mut state.last_update, full, update_gen) {
                    continue;
                }
                Self::measures_size(record, full, size_enabled)
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
                    let state = &mut *state;
                    if let Some(record) = state.object_records.get_mut(&id) {
                        Self::note_alive(record, &mut state.last_update, info);
                    }
                }
            }
        }
        Ok(any_dead)
    }
}
