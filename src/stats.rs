//! Counters the recorder keeps; the binding turns [`Stats`] into the Ruby hash `stats` returns.

/// Counts from the most recent update.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LastUpdate {
    pub objects_alive: u64,
    pub objects_dead: u64,
    pub objects_skipped: u64,
    pub objects_frozen: u64,
    /// Ours: records this update skipped (old ones, in a young update) that its walk of the
    /// liveness table showed collected, and dropped. Counted in `objects_skipped`, not
    /// `objects_dead`, so the reference's keys keep their meaning: a young update skips what is
    /// old, and its dead are young objects.
    pub skipped_objects_dropped: u64,
}

/// Counts since the recorder was created (or since a fork).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
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
    pub deferred_recordings_committed: u64,
    // Ours, beyond the reference's keys.
    pub recordings_attempted: u64,
    pub recordings_skipped_sample_rate: u64,
    pub recordings_skipped_locked: u64,
    pub recordings_skipped_max_tracked: u64,
    pub recordings_failed: u64,
    pub commits_skipped_locked: u64,
    pub updates_skipped_iterating: u64,
    /// Sampled stacks found in the stack cache (named and interned no more).
    pub stack_cache_hits: u64,
    /// Sampled stacks looked up in the stack cache and named instead: not there, no longer a
    /// heap record, or deeper than the cache keeps (1024 frames).
    pub stack_cache_misses: u64,
    /// Skipped records that update walks dropped because they were collected (see
    /// [`LastUpdate::skipped_objects_dropped`]).
    pub skipped_objects_dropped: u64,
    /// Recordings left out by the thinning in force near `max_tracked_objects` (each kept one
    /// stands for them: see `HeapRecorder::update`).
    pub recordings_skipped_thinned: u64,
    /// Times the records were thinned (half of them dropped at random, the rest weighted double).
    pub thinnings: u64,
    /// Records those thinnings dropped.
    pub records_thinned: u64,
    /// Recordings dropped at their commit because their object was still hidden (no class):
    /// the VM's own, not the program's (see `Vm::is_hidden`).
    pub recordings_dropped_hidden: u64,
}

impl Lifetime {
    pub(crate) fn record_update(&mut self, full: bool, last: &LastUpdate) {
        let (alive, dead, skipped) = if full {
            (
                &mut self.ewma_objects_alive,
                &mut self.ewma_objects_dead,
                &mut self.ewma_objects_skipped,
            )
        } else {
            (
                &mut self.ewma_young_objects_alive,
                &mut self.ewma_young_objects_dead,
                &mut self.ewma_young_objects_skipped,
            )
        };
        *alive = ewma(*alive, last.objects_alive as f64);
        *dead = ewma(*dead, last.objects_dead as f64);
        *skipped = ewma(*skipped, last.objects_skipped as f64);
        self.updates_successful += 1;
        self.skipped_objects_dropped += last.skipped_objects_dropped;
    }
}

/// Exponentially weighted moving average with weight 0.3 on the newest value.
pub fn ewma(previous: f64, current: f64) -> f64 {
    const ALPHA: f64 = 0.3;
    (1.0 - ALPHA) * previous + ALPHA * current
}

/// A value in the stats hash.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum StatValue {
    Count(u64),
    Ratio(f64),
}

/// Everything `stats` reports, read at one moment.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Stats {
    pub num_object_records: u64,
    pub num_heap_records: u64,
    pub pending_recordings_count: u64,
    pub last_update: LastUpdate,
    pub lifetime: Lifetime,
    pub string_refs: u64,
    /// Heap records no object points at any more, kept with their ids for the next sample at
    /// their stack (given back at full updates when unused since the one before).
    pub dormant_heap_records: u64,
    /// Recordings are kept one in `thinning` (a power of two, 1 unless near `max_tracked_objects`)
    /// on top of `sample_rate`, each weighted by it.
    pub thinning: u64,
}

impl Stats {
    /// The reference's 19 keys, in its order, then ours.
    pub fn entries(&self) -> Vec<(&'static str, StatValue)> {
        use StatValue::{Count as C, Ratio as R};
        let (l, u) = (&self.lifetime, &self.last_update);
        vec![
            ("num_object_records", C(self.num_object_records)),
            ("num_heap_records", C(self.num_heap_records)),
            ("pending_recordings_count", C(self.pending_recordings_count)),
            ("last_update_objects_alive", C(u.objects_alive)),
            ("last_update_objects_dead", C(u.objects_dead)),
            ("last_update_objects_skipped", C(u.objects_skipped)),
            ("last_update_objects_frozen", C(u.objects_frozen)),
            ("lifetime_updates_successful", C(l.updates_successful)),
            (
                "lifetime_updates_skipped_concurrent",
                C(l.updates_skipped_concurrent),
            ),
            ("lifetime_updates_skipped_gcgen", C(l.updates_skipped_gcgen)),
            ("lifetime_updates_skipped_time", C(l.updates_skipped_time)),
            (
                "lifetime_ewma_young_objects_alive",
                R(l.ewma_young_objects_alive),
            ),
            (
                "lifetime_ewma_young_objects_dead",
                R(l.ewma_young_objects_dead),
            ),
            (
                "lifetime_ewma_young_objects_skipped",
                R(l.ewma_young_objects_skipped),
            ),
            ("lifetime_ewma_objects_alive", R(l.ewma_objects_alive)),
            ("lifetime_ewma_objects_dead", R(l.ewma_objects_dead)),
            ("lifetime_ewma_objects_skipped", R(l.ewma_objects_skipped)),
            (
                "lifetime_deferred_recordings_skipped_buffer_full",
                C(l.deferred_recordings_skipped_buffer_full),
            ),
            (
                "lifetime_deferred_recordings_committed",
                C(l.deferred_recordings_committed),
            ),
            ("lifetime_recordings_attempted", C(l.recordings_attempted)),
            (
                "lifetime_recordings_skipped_sample_rate",
                C(l.recordings_skipped_sample_rate),
            ),
            (
                "lifetime_recordings_skipped_locked",
                C(l.recordings_skipped_locked),
            ),
            (
                "lifetime_recordings_skipped_max_tracked",
                C(l.recordings_skipped_max_tracked),
            ),
            ("lifetime_recordings_failed", C(l.recordings_failed)),
            (
                "lifetime_commits_skipped_locked",
                C(l.commits_skipped_locked),
            ),
            (
                "lifetime_updates_skipped_iterating",
                C(l.updates_skipped_iterating),
            ),
            ("lifetime_stack_cache_hits", C(l.stack_cache_hits)),
            ("lifetime_stack_cache_misses", C(l.stack_cache_misses)),
            (
                "last_update_skipped_objects_dropped",
                C(u.skipped_objects_dropped),
            ),
            (
                "lifetime_skipped_objects_dropped",
                C(l.skipped_objects_dropped),
            ),
            ("interned_string_refs", C(self.string_refs)),
            ("dormant_heap_records", C(self.dormant_heap_records)),
            ("thinning", C(self.thinning)),
            (
                "lifetime_recordings_skipped_thinned",
                C(l.recordings_skipped_thinned),
            ),
            ("lifetime_thinnings", C(l.thinnings)),
            ("lifetime_records_thinned", C(l.records_thinned)),
            (
                "lifetime_recordings_dropped_hidden",
                C(l.recordings_dropped_hidden),
            ),
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ewma_weights_the_newest_value_by_0_3() {
        assert!((ewma(0.0, 10.0) - 3.0).abs() < 1e-9);
        assert!((ewma(10.0, 0.0) - 7.0).abs() < 1e-9);
    }

    #[test]
    fn entries_start_with_the_reference_keys() {
        let entries = Stats::default().entries();
        assert_eq!(entries[0].0, "num_object_records");
        assert_eq!(entries[18].0, "lifetime_deferred_recordings_committed");
        let names: std::collections::HashSet<_> = entries.iter().map(|e| e.0).collect();
        assert_eq!(names.len(), entries.len(), "no key twice");
    }

    #[test]
    fn young_and_full_updates_feed_separate_averages() {
        let mut l = Lifetime::default();
        let last = LastUpdate {
            objects_alive: 10,
            ..Default::default()
        };
        l.record_update(false, &last);
        assert!((l.ewma_young_objects_alive - 3.0).abs() < 1e-9);
        assert_eq!(l.ewma_objects_alive, 0.0);
        l.record_update(true, &last);
        assert!((l.ewma_objects_alive - 3.0).abs() < 1e-9);
        assert_eq!(l.updates_successful, 2);
    }
}
