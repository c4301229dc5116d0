//! Iteration: the snapshot of live records that `for_each_live_object` walks without the GVL.

use std::sync::atomic::Ordering;

use super::{Failure, HeapRecorder, Outcome, Snapshot, StringTable, ITERATION_MIN_AGE};
use crate::types::{IterationData, Location, SliceLocation};

impl<S: StringTable> HeapRecorder<S> {
    pub fn prepare_iteration(&self) -> Outcome<()> {
        if self.iterating.load(Ordering::Acquire) {
            return Err(Failure::Runtime(
                "New heap recorder iteration prepared without the previous one having been finished."
                    .into(),
            ));
        }
        self.update(true)?;
        let records: Vec<_> = self.with(|s| {
            s.object_records
                .values()
                .map(|r| (r.heap_record.clone(), r.data))
                .collect()
        });
        let deepest = records.iter().map(|(h, _)| h.len()).max().unwrap_or(0);
        // SAFETY: `iterating` was false until just now, so no iteration reads the snapshot, and we
        // hold the GVL so no other prepare/finish runs.
        let snap = unsafe { &mut *self.snapshot.get() };
        snap.records = records;
        snap.locations.clear();
        snap.locations.reserve(deepest);
        self.iterating.store(true, Ordering::Release);
        Ok(())
    }

    pub fn finish_iteration(&self) -> Outcome<()> {
        if !self.iterating.load(Ordering::Acquire) {
            return Err(Failure::Runtime(
                "Heap recorder iteration finished without having been prepared.".into(),
            ));
        }
        self.finish_iteration_unchecked();
        Ok(())
    }

    pub(super) fn finish_iteration_unchecked(&self) {
        // SAFETY: under the GVL; the profiler finishes only after its iteration returned.
        let snap = unsafe { &mut *self.snapshot.get() };
        snap.records = Vec::new();
        snap.locations = Vec::new();
        self.iterating.store(false, Ordering::Release);
    }

    /// May run without the GVL: reads only the snapshot, calls no VM function, never raises.
    /// Returns false when no iteration was prepared.
    ///
    /// # Safety
    /// Called between prepare and finish, never concurrently with itself.
    pub unsafe fn for_each_live_object(&self, mut f: impl FnMut(IterationData) -> bool) -> bool {
        // SAFETY: the caller keeps us between prepare and finish and alone; prepare/finish are the
        // only writers of the snapshot.
        let snap = unsafe { &mut *self.snapshot.get() };
        if !self.iterating.load(Ordering::Acquire) {
            return false;
        }
        let Snapshot { records, locations } = snap;
        for (frames, data) in records.iter() {
            if data.gen_age < ITERATION_MIN_AGE {
                continue;
            }
            locations.clear();
            locations.extend(
                frames
                    .iter()
                    .map(|fr| Location::by_ids(fr.name, fr.filename, fr.line)),
            );
            let item = IterationData {
                locations: SliceLocation {
                    ptr: locations.as_ptr(),
                    len: locations.len(),
                },
                object_data: *data,
            };
            if !f(item) {
                break;
            }
        }
        true
    }
}
