//! Updates: which recorded objects are still alive (through the host's lookup), their ages and
//! sizes, and the update statistics. GVL held; the lookups may let other Ruby threads in.

use std::sync::atomic::Ordering;

use datadog_heap_core::stats::ewma;

use super::{
    Failure, HeapRecorder, LastUpdate, Outcome, StringTable, MIN_TIME_BETWEEN_UPDATES_NS, OLD_AGE,
};
use crate::types::{LOOKUP_ALIVE, LOOKUP_DEAD};

impl<S: StringTable> HeapRecorder<S> {
    pub fn update_young_objects(&self) -> Outcome<()> {
        self.update(false)
    }

    pub(super) fn update(&self, full: bool) -> Outcome<()> {
        loop {
            let busy = self.with(|s| {
                if s.updating && !full {
                    s.lifetime.updates_skipped_concurrent += 1;
                }
                s.updating
            });
            if !busy {
                break;
            }
            if !full {
                return Ok(());
            }
            let rc = (self.host.thread_schedule)();
            if rc != 0 {
                return Err(Failure::RubyTag(rc));
            }
        }
        let gc = (self.host.gc_count)();
        let now = (self.host.now_ns)();
        let iterating = self.iterating.load(Ordering::Acquire);
        let go = self.with(|s| {
            if iterating {
                return false;
            }
            if !full {
                if gc == s.update_gen {
                    s.lifetime.updates_skipped_gcgen += 1;
                    return false;
                }
                if now > 0 && now - s.last_update_ns < MIN_TIME_BETWEEN_UPDATES_NS {
                    s.lifetime.updates_skipped_time += 1;
                    return false;
                }
            }
            s.updating = true;
            s.last_update = LastUpdate::default();
            s.update_gen = gc;
            s.update_include_old = full;
            true
        });
        if !go {
            return Ok(());
        }
        let ids: Vec<i64> = self.with(|s| s.object_records.keys().copied().collect());
        let mut result = Ok(());
        for id in ids {
            if let Err(e) = self.update_one(id, gc, full) {
                result = Err(e);
                break;
            }
        }
        self.with(|s| {
            s.last_update_ns = now;
            s.lifetime.updates_successful += 1;
            let (l, lu) = (&mut s.lifetime, s.last_update);
            if full {
                l.ewma_objects_alive = ewma(l.ewma_objects_alive, lu.objects_alive as f64);
                l.ewma_objects_dead = ewma(l.ewma_objects_dead, lu.objects_dead as f64);
                l.ewma_objects_skipped = ewma(l.ewma_objects_skipped, lu.objects_skipped as f64);
            } else {
                l.ewma_young_objects_alive =
                    ewma(l.ewma_young_objects_alive, lu.objects_alive as f64);
                l.ewma_young_objects_dead = ewma(l.ewma_young_objects_dead, lu.objects_dead as f64);
                l.ewma_young_objects_skipped =
                    ewma(l.ewma_young_objects_skipped, lu.objects_skipped as f64);
            }
            s.updating = false;
        });
        result
    }

    fn update_one(&self, id: i64, gc: usize, full: bool) -> Outcome<()> {
        let check = self.with(|s| {
            let size_enabled = s.size_enabled;
            let r = s.object_records.get_mut(&id)?;
            r.data.gen_age = gc.saturating_sub(r.data.alloc_gen);
            if r.data.gen_age == 0 || (!full && r.data.gen_age >= OLD_AGE) {
                s.last_update.objects_skipped += 1;
                return None;
            }
            Some(size_enabled && full && !r.data.is_frozen)
        });
        let Some(measure) = check else { return Ok(()) };
        let (mut size, mut frozen) = (0usize, false);
        match (self.host.lookup)(self.host.ctx, id, measure, &mut size, &mut frozen) {
            LOOKUP_DEAD => {
                let removed = self.with(|s| {
                    s.last_update.objects_dead += 1;
                    s.object_records.remove(&id)
                });
                if let Some(r) = removed {
                    self.drop_record(&r.heap_record, r.data.class);
                }
                Ok(())
            }
            LOOKUP_ALIVE => {
                self.with(|s| {
                    if let Some(r) = s.object_records.get_mut(&id) {
                        if measure {
                            r.data.size = size;
                            r.data.is_frozen = frozen;
                        }
                        s.last_update.objects_alive += 1;
                        if r.data.is_frozen {
                            s.last_update.objects_frozen += 1;
                        }
                    }
                });
                Ok(())
            }
            negated_tag => Err(Failure::RubyTag(-negated_tag)),
        }
    }
}
