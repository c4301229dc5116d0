//! Thinning near `max_tracked_objects` and the liveness table.

use super::*;
use crate::fake_vm::FakeVm;
use crate::stacks::NamedFrame;

#[test]
fn thinning_removes_the_dropped_records_from_the_liveness_table() {
    let rec = HeapRecorder::new(RecorderOptions {
        max_tracked_objects: 64,
        ..RecorderOptions::default()
    });
    let mut vm = FakeVm::new();
    for i in 0..2_000u32 {
        let object = vm.alloc(40);
        let site = [NamedFrame {
            name: "a",
            filename: "a.rb",
            line: (i % 7) as i32,
        }];
        rec.record_allocation(object, 1, Some("String"), &site, vm.gc)
            .unwrap();
        rec.commit(&mut vm).unwrap();
    }
    let stats = rec.stats().unwrap();
    assert!(stats.lifetime.thinnings >= 3, "{:?}", stats.lifetime);
    // Every object is alive: the table holds exactly the records, not every object ever tracked.
    assert_eq!(vm.table.len() as u64, stats.num_object_records);
    assert!(rec
        .record_ids()
        .unwrap()
        .iter()
        .all(|id| vm.table.contains_key(id)));
}
