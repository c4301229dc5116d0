use super::*;
use crate::fake_vm::FakeVm;
use crate::recorder::update::{UpdateKind, UpdateOutcome, OLD_AGE};
use crate::stacks::NamedFrame;
use crate::vm::Vm;

/// A thread other than the fake VM's own (which is 1), as holder of the soft lock.
const OTHER_THREAD: crate::lock::ThreadId = 2;

fn frames(site: &'static str, line: i32) -> Vec<NamedFrame<'static>> {
    vec![
        NamedFrame {
            name: site,
            filename: "app.rb",
            line,
        },
        NamedFrame {
            name: "main",
            filename: "main.rb",
            line: 1,
        },
    ]
}

fn record(rec: &HeapRecorder, vm: &mut FakeVm, site: &'static str, line: i32) -> ObjectRef {
    let obj = vm.alloc(40);
    let r = rec
        .record_allocation(obj, 1, Some("String"), &frames(site, line), vm.gc)
        .unwrap();
    assert_eq!(r.outcome, RecordOutcome::Pending);
    obj
}

fn full_update(rec: &HeapRecorder, vm: &mut FakeVm) -> LastUpdate {
    match rec.update(vm, UpdateKind::Full).unwrap() {
        UpdateOutcome::Done(last) => last,
        other => panic!("full update did not run: {other:?}"),
    }
}

#[test]
fn recording_is_pending_until_commit() {
    let rec = HeapRecorder::default();
    let mut vm = FakeVm::new();
    let obj = record(&rec, &mut vm, "a", 1);
    let s = rec.stats().unwrap();
    assert_eq!((s.pending_recordings_count, s.num_object_records), (1, 0));
    let mut pending = vec![];
    rec.for_each_pending_object(|o| pending.push(o));
    assert_eq!(pending, vec![obj]);

    assert_eq!(rec.commit(&mut vm).unwrap(), CommitOutcome::Committed(1));
    let s = rec.stats().unwrap();
    assert_eq!((s.pending_recordings_count, s.num_object_records), (0, 1));
    assert_eq!(s.lifetime.deferred_recordings_committed, 1);
    assert_eq!(vm.table.get(&1), Some(&obj));
    assert!(rec.is_recorded(1).unwrap());
}

#[test]
fn commit_drops_objects_still_hidden_and_keeps_revealed_ones() {
    // CRuby allocates some of the program's objects without a class and reveals them before the
    // program sees them (String#encode's result): those are recorded. One allocated hidden and
    // still hidden at its commit is the VM's own: dropped, with what it held.
    // An object allocated visible is never asked about: the VM hides some for a while
    // (sort_by's result while the block runs) and they stay the program's.
    let rec = HeapRecorder::default();
    let mut vm = FakeVm::new();
    let hidden_record = |vm: &mut FakeVm, line| {
        let obj = vm.alloc(40);
        vm.obj(obj).hidden = true;
        let r = rec
            .record_sampled_allocation(
                obj,
                1,
                Some("String"),
                frames("b", line).as_slice(),
                vm.gc,
                true,
                0,
            )
            .unwrap();
        assert_eq!(r.outcome, RecordOutcome::Pending);
        obj
    };
    let revealed = hidden_record(&mut vm, 1);
    vm.obj(revealed).hidden = false;
    let hidden = hidden_record(&mut vm, 2);
    let hidden_for_a_while = record(&rec, &mut vm, "a", 3);
    vm.obj(hidden_for_a_while).hidden = true;
    assert_eq!(rec.commit(&mut vm).unwrap(), CommitOutcome::Committed(2));
    let s = rec.stats().unwrap();
    assert_eq!((s.pending_recordings_count, s.num_object_records), (0, 2));
    assert_eq!(s.lifetime.recordings_dropped_hidden, 1);
    let mut remembered = vm.table.values().copied().collect::<Vec<_>>();
    remembered.sort_unstable();
    assert_eq!(remembered, vec![revealed, hidden_for_a_while]);
    assert!(!remembered.contains(&hidden));
    // Only the kept records' stacks and class are still held.
    assert_eq!(s.num_heap_records, 2);
    let refs_one = s.string_refs;
    vm.kill(revealed);
    vm.kill(hidden_for_a_while);
    vm.gc();
    full_update(&rec, &mut vm);
    full_update(&rec, &mut vm); // the dormant stacks go
    let s = rec.stats().unwrap();
    assert_eq!(
        (s.num_object_records, s.num_heap_records, s.string_refs),
        (0, 0, 0)
    );
    assert!(refs_one > 0);
}

#[test]
fn commit_drains_newest_first() {
    let rec = HeapRecorder::default();
    let mut vm = FakeVm::new();
    for line in 1..=3 {
        record(&rec, &mut vm, "a", line);
    }
    let mut order = vec![];
    struct Spy<'a>(&'a mut FakeVm, &'a mut Vec<i64>);
    impl Vm for Spy<'_> {
        fn remember(&mut self, id: i64, o: ObjectRef) -> Result<()> {
            self.1.push(id);
            self.0.remember(id, o)
        }
        fn forget(&mut self, ids: &[i64]) -> Result<()> {
            self.0.forget(ids)
        }
        fn lookup(&mut self, id: i64, m: bool) -> Result<Option<crate::vm::LiveInfo>> {
            self.0.lookup(id, m)
        }
        fn yield_thread(&mut self) -> Result<()> {
            Ok(())
        }
        fn current_thread(&self) -> crate::lock::ThreadId {
            self.0.current_thread()
        }
        fn gc_count(&self) -> u64 {
            self.0.gc_count()
        }
        fn now_ns(&self) -> i64 {
            self.0.now_ns()
        }
    }
    rec.commit(&mut Spy(&mut vm, &mut order)).unwrap();
    assert_eq!(order, vec![3, 2, 1]);
}

#[test]
fn commit_failure_midway_keeps_the_rest_pending_and_releases_the_lock() {
    let rec = HeapRecorder::default();
    let mut vm = FakeVm::new();
    for line in 1..=5 {
        record(&rec, &mut vm, "a", line);
    }
    vm.fail_remember_after = Some(2);
    assert!(matches!(rec.commit(&mut vm), Err(HeapError::Host(_))));
    let s = rec.stats().unwrap();
    assert_eq!((s.num_object_records, s.pending_recordings_count), (2, 3));
    assert!(!rec.lock().is_held(), "lock released after the error");
    assert_eq!(rec.commit(&mut vm).unwrap(), CommitOutcome::Committed(3));
    let mut ids = rec.record_ids().unwrap();
    ids.sort();
    assert_eq!(ids, vec![1, 2, 3, 4, 5]);
}

#[test]
fn commit_skips_while_locked() {
    let rec = HeapRecorder::default();
    let mut vm = FakeVm::new();
    record(&rec, &mut vm, "a", 1);
    assert!(rec.lock().try_lock(OTHER_THREAD));
    assert_eq!(rec.commit(&mut vm).unwrap(), CommitOutcome::SkippedLocked);
    assert_eq!(rec.stats().unwrap().lifetime.commits_skipped_locked, 1);
    rec.lock().unlock();
    assert_eq!(rec.commit(&mut vm).unwrap(), CommitOutcome::Committed(1));
}

#[test]
fn duplicate_record_id_is_an_error() {
    let rec = HeapRecorder::default();
    let mut vm = FakeVm::new();
    record(&rec, &mut vm, "a", 1);
    rec.commit(&mut vm).unwrap();
    // Rewind the id source: the next recording reuses id 1.
    rec.state().unwrap().next_record_id = 0;
    record(&rec, &mut vm, "a", 1);
    let err = rec.commit(&mut vm).unwrap_err();
    assert_eq!(err, HeapError::DuplicateRecordId { record_id: 1 });
    assert!(err.to_string().contains("record_id 1"));
    let s = rec.stats().unwrap();
    assert_eq!((s.num_object_records, s.pending_recordings_count), (1, 0));
    assert!(!rec.lock().is_held());
}

#[test]
fn same_site_shares_a_heap_record_and_other_sites_do_not() {
    let rec = HeapRecorder::default();
    let mut vm = FakeVm::new();
    record(&rec, &mut vm, "a", 1);
    record(&rec, &mut vm, "a", 1);
    record(&rec, &mut vm, "b", 2);
    rec.commit(&mut vm).unwrap();
    assert_eq!(rec.stats().unwrap().num_heap_records, 2);
}

#[test]
fn strings_return_to_baseline_when_everything_dies() {
    let rec = HeapRecorder::default();
    let mut vm = FakeVm::new();
    let objs: Vec<_> = (0..20)
        .map(|i| {
            record(
                &rec,
                &mut vm,
                if i % 2 == 0 { "even" } else { "odd" },
                i % 3,
            )
        })
        .collect();
    rec.commit(&mut vm).unwrap();
    let ids: Vec<u32> = {
        let state = rec.state().unwrap();
        state
            .object_records
            .values()
            .flat_map(|r| {
                r.stack
                    .iter()
                    .flat_map(|f| [f.name, f.filename])
                    .chain([r.data.class])
            })
            .collect()
    };
    assert!(rec.stats().unwrap().string_refs > 0);
    vm.gc();
    objs.iter().for_each(|&o| vm.kill(o));
    let last = full_update(&rec, &mut vm);
    assert_eq!(last.objects_dead, 20);
    assert!(rec.stats().unwrap().dormant_heap_records > 0);
    full_update(&rec, &mut vm); // unused since the last: the dormant stacks go
    let s = rec.stats().unwrap();
    assert_eq!(
        (s.num_object_records, s.num_heap_records, s.string_refs),
        (0, 0, 0)
    );
    rec.clear_stack_cache(); // the class cache's references
    for id in ids {
        assert!(rec.strings().get(id).is_err(), "id {id} still interned");
    }
}

#[test]
fn buffer_full_is_counted_and_still_asks_for_a_commit() {
    let rec = HeapRecorder::default();
    let mut vm = FakeVm::new();
    for i in 0..MAX_PENDING_RECORDINGS {
        record(&rec, &mut vm, "a", i as i32);
    }
    let obj = vm.alloc(1);
    for _ in 0..44 {
        let r = rec
            .record_allocation(obj, 1, None, &frames("a", 1), 0)
            .unwrap();
        assert_eq!(r.outcome, RecordOutcome::SkippedBufferFull);
        assert!(r.needs_commit);
    }
    let s = rec.stats().unwrap();
    assert_eq!(s.pending_recordings_count, MAX_PENDING_RECORDINGS as u64);
    assert_eq!(s.lifetime.deferred_recordings_skipped_buffer_full, 44);
    // The profile says its estimates are low, and why.
    rec.commit(&mut vm).unwrap();
    let snapshot = rec.prepare_iteration(&mut vm).unwrap();
    assert!(
        (snapshot.notes().iter()).any(|n| n.contains("estimates are low: 44 recordings were dropped unrecorded (44 with the pending queue full (4096)")),
        "{:?}",
        snapshot.notes()
    );
    drop(snapshot);
    rec.finish_iteration().unwrap();
}

#[test]
fn sample_rate_keeps_one_in_n_and_scales_weight() {
    let rec = HeapRecorder::new(RecorderOptions {
        sample_rate: 3,
        size_enabled: true,
        ..RecorderOptions::default()
    });
    let mut vm = FakeVm::new();
    let outcomes: Vec<_> = (0..6)
        .map(|_| {
            let o = vm.alloc(1);
            rec.record_allocation(o, 5, None, &frames("a", 1), 0)
                .unwrap()
                .outcome
        })
        .collect();
    use RecordOutcome::*;
    assert_eq!(
        outcomes,
        vec![
            SkippedSampleRate,
            SkippedSampleRate,
            Pending,
            SkippedSampleRate,
            SkippedSampleRate,
            Pending
        ]
    );
    rec.commit(&mut vm).unwrap();
    let state = rec.state().unwrap();
    assert!(state.object_records.values().all(|r| r.data.weight == 15));
    assert_eq!(state.lifetime.recordings_skipped_sample_rate, 4);
}

#[test]
fn zero_sample_rate_is_rejected_with_the_value() {
    let rec = HeapRecorder::default();
    let err = rec.set_sample_rate(0).unwrap_err();
    assert_eq!(
        err.to_string(),
        "sample_rate must be a positive Integer, got 0"
    );
    rec.set_sample_rate(2).unwrap();
    assert_eq!(rec.options().unwrap().sample_rate, 2);
}

#[test]
fn a_32_bit_weight_times_a_large_rate_is_kept_whole() {
    // sample_every: 65536, sample_rate: 65536 overflowed 32-bit weights at the first kept sample.
    let rec = HeapRecorder::new(RecorderOptions {
        sample_rate: 65_536,
        size_enabled: true,
        ..RecorderOptions::default()
    });
    let mut vm = FakeVm::new();
    let o = vm.alloc(1);
    let outcomes: Vec<RecordOutcome> = (0..65_536)
        .map(|_| {
            rec.record_allocation(o, 65_536, Some("X"), &frames("a", 1), 0)
                .unwrap()
                .outcome
        })
        .collect();
    assert_eq!(outcomes.last(), Some(&RecordOutcome::Pending));
    assert_eq!(rec.pending().unwrap()[0].data.weight, 1 << 32);
    assert_eq!(rec.stats().unwrap().lifetime.recordings_failed, 0);
}

#[test]
fn weight_overflow_is_an_error_that_leaves_nothing_behind() {
    let rec = HeapRecorder::new(RecorderOptions {
        sample_rate: 2,
        size_enabled: true,
        ..RecorderOptions::default()
    });
    let mut vm = FakeVm::new();
    let o = vm.alloc(1);
    rec.record_allocation(o, u64::MAX, Some("X"), &frames("a", 1), 0)
        .unwrap();
    let err = rec
        .record_allocation(o, u64::MAX, Some("X"), &frames("a", 1), 0)
        .unwrap_err();
    assert!(matches!(err, HeapError::WeightOverflow { .. }));
    let s = rec.stats().unwrap();
    assert_eq!((s.pending_recordings_count, s.string_refs), (0, 0));
    assert_eq!(s.lifetime.recordings_failed, 1);
}

#[test]
fn recording_skips_while_the_lock_is_held() {
    let rec = HeapRecorder::default();
    let mut vm = FakeVm::new();
    assert!(rec.lock().try_lock(OTHER_THREAD));
    let o = vm.alloc(1);
    let r = rec
        .record_allocation(o, 1, None, &frames("a", 1), 0)
        .unwrap();
    assert_eq!(
        r,
        Recorded {
            outcome: RecordOutcome::SkippedLocked,
            needs_commit: false
        }
    );
    assert_eq!(rec.stats().unwrap().lifetime.recordings_skipped_locked, 1);
    rec.lock().unlock();
}

#[test]
fn a_held_string_storage_is_an_error_not_a_wait_nor_a_silent_skip() {
    let rec = HeapRecorder::default();
    let mut vm = FakeVm::new();
    let o = vm.alloc(1);
    let held = rec.strings().lock().unwrap();
    let err = rec
        .record_allocation(o, 1, None, &frames("a", 1), 0)
        .unwrap_err();
    assert!(err.to_string().contains("string storage"), "{err}");
    assert_eq!(rec.stats().unwrap().lifetime.recordings_failed, 1);
    drop(held);
    let r = rec
        .record_allocation(o, 1, None, &frames("a", 1), 0)
        .unwrap();
    assert_eq!(r.outcome, RecordOutcome::Pending);
}

#[test]
fn record_ids_past_the_fixnum_max_disable_recording() {
    let rec = HeapRecorder::default();
    let mut vm = FakeVm::new();
    rec.state().unwrap().next_record_id = FIXNUM_MAX - 1;
    let o = vm.alloc(1);
    rec.record_allocation(o, 1, None, &frames("a", 1), 0)
        .unwrap();
    assert_eq!(rec.pending().unwrap()[0].record_id, FIXNUM_MAX);
    for _ in 0..3 {
        let err = rec
            .record_allocation(o, 1, None, &frames("a", 1), 0)
            .unwrap_err();
        assert_eq!(err, HeapError::RecordIdsExhausted { max: FIXNUM_MAX });
    }
    // Still readable and committable.
    assert_eq!(rec.commit(&mut vm).unwrap(), CommitOutcome::Committed(1));
    rec.exhaust_record_ids().unwrap();
    assert!(rec
        .record_allocation(o, 1, None, &frames("a", 1), 0)
        .is_err());
    assert_eq!(rec.stats().unwrap().num_object_records, 1);
}

#[test]
fn frame_cap_3000_accepted_3001_refused_cleanly() {
    let rec = HeapRecorder::default();
    let mut vm = FakeVm::new();
    let o = vm.alloc(1);
    let deep = vec![
        NamedFrame {
            name: "f",
            filename: "f.rb",
            line: 1
        };
        3001
    ];
    let err = rec
        .record_allocation(o, 1, Some("Deep"), &deep, 0)
        .unwrap_err();
    assert!(err.to_string().contains("3001") && err.to_string().contains("3000"));
    let s = rec.stats().unwrap();
    assert_eq!((s.pending_recordings_count, s.string_refs), (0, 0));
    assert!(rec
        .record_allocation(o, 1, Some("Deep"), &deep[..3000], 0)
        .is_ok());
}

#[test]
fn young_update_gates_on_gc_generation_and_interval() {
    let rec = HeapRecorder::default();
    let mut vm = FakeVm::new();
    record(&rec, &mut vm, "a", 1);
    rec.commit(&mut vm).unwrap();
    vm.gc();
    assert!(matches!(
        rec.update(&mut vm, UpdateKind::Young).unwrap(),
        UpdateOutcome::Done(_)
    ));
    // Same GC generation: skipped.
    assert_eq!(
        rec.update(&mut vm, UpdateKind::Young).unwrap(),
        UpdateOutcome::SkippedGcGen
    );
    // New generation but within 2 s: skipped.
    vm.gc += 1;
    vm.now += 1_000_000_000;
    assert_eq!(
        rec.update(&mut vm, UpdateKind::Young).unwrap(),
        UpdateOutcome::SkippedTime
    );
    // reset_last_update lifts the interval.
    rec.reset_last_update().unwrap();
    assert!(matches!(
        rec.update(&mut vm, UpdateKind::Young).unwrap(),
        UpdateOutcome::Done(_)
    ));
    // A full update ignores both gates.
    assert!(matches!(
        rec.update(&mut vm, UpdateKind::Full).unwrap(),
        UpdateOutcome::Done(_)
    ));
    let l = rec.stats().unwrap().lifetime;
    assert_eq!(
        (
            l.updates_successful,
            l.updates_skipped_gcgen,
            l.updates_skipped_time
        ),
        (3, 1, 1)
    );
}

#[test]
fn young_update_skips_when_locked_but_full_waits() {
    let rec = HeapRecorder::default();
    let mut vm = FakeVm::new();
    vm.gc();
    assert!(rec.lock().try_lock(OTHER_THREAD));
    assert_eq!(
        rec.update(&mut vm, UpdateKind::Young).unwrap(),
        UpdateOutcome::SkippedConcurrent
    );
    assert_eq!(rec.stats().unwrap().lifetime.updates_skipped_concurrent, 1);

    // The full update yields until the holder (simulated by the yield) releases.
    struct Releasing<'a>(&'a HeapRecorder, FakeVm, usize);
    impl Vm for Releasing<'_> {
        fn remember(&mut self, id: i64, o: ObjectRef) -> Result<()> {
            self.1.remember(id, o)
        }
        fn forget(&mut self, ids: &[i64]) -> Result<()> {
            self.1.forget(ids)
        }
        fn lookup(&mut self, id: i64, m: bool) -> Result<Option<crate::vm::LiveInfo>> {
            self.1.lookup(id, m)
        }
        fn yield_thread(&mut self) -> Result<()> {
            self.2 += 1;
            if self.2 == 3 {
                self.0.lock().unlock();
            }
            Ok(())
        }
        fn current_thread(&self) -> crate::lock::ThreadId {
            self.1.thread
        }
        fn gc_count(&self) -> u64 {
            self.1.gc
        }
        fn now_ns(&self) -> i64 {
            self.1.now
        }
    }
    let mut releasing = Releasing(&rec, vm, 0);
    assert!(matches!(
        rec.update(&mut releasing, UpdateKind::Full).unwrap(),
        UpdateOutcome::Done(_)
    ));
    assert_eq!(releasing.2, 3);
    assert!(!rec.lock().is_held());
}

#[test]
fn ages_skip_and_death() {
    let rec = HeapRecorder::default();
    let mut vm = FakeVm::new();
    let old = record(&rec, &mut vm, "old", 1); // alloc_gen 0
    rec.commit(&mut vm).unwrap();
    for _ in 0..3 {
        vm.gc();
    }
    let young = record(&rec, &mut vm, "young", 2); // alloc_gen 3
    let newborn_dead = vm.alloc(1);
    rec.record_allocation(newborn_dead, 1, None, &frames("n", 3), 4)
        .unwrap(); // alloc_gen 4 > gen 3
    rec.commit(&mut vm).unwrap();
    vm.gc(); // gen 4: old is 4 GCs old, young 1, newborn 0
    vm.kill(newborn_dead);

    // Young update: old (age 4) and newborn (age 0) skipped, young checked.
    let UpdateOutcome::Done(last) = rec.update(&mut vm, UpdateKind::Young).unwrap() else {
        panic!()
    };
    assert_eq!(
        (last.objects_alive, last.objects_dead, last.objects_skipped),
        (1, 0, 2)
    );

    // Full update: old checked too; newborn still age 0 so skipped even though it is dead.
    vm.kill(old);
    let last = full_update(&rec, &mut vm);
    assert_eq!(
        (last.objects_alive, last.objects_dead, last.objects_skipped),
        (1, 1, 1)
    );
    assert_eq!(rec.stats().unwrap().num_object_records, 2);
    let _ = young;
}

#[test]
fn sizes_refresh_until_frozen() {
    let rec = HeapRecorder::default();
    let mut vm = FakeVm::new();
    let o = record(&rec, &mut vm, "a", 1);
    rec.commit(&mut vm).unwrap();
    vm.gc();
    vm.obj(o).size = 100;
    full_update(&rec, &mut vm);
    vm.obj(o).size = 200;
    vm.obj(o).frozen = true;
    let last = full_update(&rec, &mut vm);
    assert_eq!(last.objects_frozen, 1);
    vm.obj(o).size = 999;
    full_update(&rec, &mut vm);
    let data = rec.state().unwrap().object_records[&1].data;
    assert_eq!(
        (data.size, data.frozen),
        (200, true),
        "frozen objects are sized once more, then never"
    );
    assert_eq!(vm.size_measurements, 2);
}

/// An object frozen before any full update measured it: the young update that sees it first
/// measures nothing, so the next full update must still measure it (frozen objects
/// reported at size 0); one that grew and froze after a measurement is measured once more.
#[test]
fn a_young_update_seeing_frozen_objects_does_not_stop_their_measuring() {
    let young_update = |rec: &HeapRecorder, vm: &mut FakeVm| {
        vm.gc();
        rec.reset_last_update().unwrap();
        match rec.update(vm, UpdateKind::Young).unwrap() {
            UpdateOutcome::Done(last) => last,
            other => panic!("young update did not run: {other:?}"),
        }
    };
    for walk in [false, true] {
        let rec = HeapRecorder::default();
        let mut vm = FakeVm::new();
        vm.walk_enabled = walk;
        let frozen_early = record(&rec, &mut vm, "a", 1);
        let frozen_late = record(&rec, &mut vm, "b", 2);
        rec.commit(&mut vm).unwrap();
        vm.obj(frozen_early).frozen = true;
        assert_eq!(young_update(&rec, &mut vm).objects_frozen, 1);
        full_update(&rec, &mut vm);
        assert_eq!(vm.size_measurements, 2, "walk={walk}: both measured");

        vm.obj(frozen_late).size = 300;
        vm.obj(frozen_late).frozen = true;
        assert_eq!(young_update(&rec, &mut vm).objects_frozen, 2);
        full_update(&rec, &mut vm);
        assert_eq!(vm.size_measurements, 3, "walk={walk}: frozen_late again");
        full_update(&rec, &mut vm);
        assert_eq!(vm.size_measurements, 3, "walk={walk}: both measured frozen");

        let state = rec.state().unwrap();
        let data = |id: i64| {
            let d = state.object_records[&id].data;
            (d.size, d.frozen)
        };
        assert_eq!([data(1), data(2)], [(40, true), (300, true)], "walk={walk}");
    }
}

#[test]
fn size_disabled_never_measures() {
    let rec = HeapRecorder::new(RecorderOptions {
        sample_rate: 1,
        size_enabled: false,
        ..RecorderOptions::default()
    });
    let mut vm = FakeVm::new();
    record(&rec, &mut vm, "a", 1);
    rec.commit(&mut vm).unwrap();
    vm.gc();
    full_update(&rec, &mut vm);
    assert_eq!(vm.size_measurements, 0);
    rec.set_size_enabled(true).unwrap();
    full_update(&rec, &mut vm);
    assert_eq!(vm.size_measurements, 1);
}

#[test]
fn lookup_failure_midway_releases_lock_and_keeps_state_consistent() {
    let rec = HeapRecorder::default();
    let mut vm = FakeVm::new();
    let objs: Vec<_> = (0..4).map(|i| record(&rec, &mut vm, "a", i)).collect();
    rec.commit(&mut vm).unwrap();
    vm.gc();
    objs.iter().for_each(|&o| vm.kill(o));
    vm.fail_lookup_after = Some(2);
    assert!(rec.update(&mut vm, UpdateKind::Full).is_err());
    assert!(!rec.lock().is_held());
    assert_eq!(rec.stats().unwrap().num_object_records, 2);
    let last = full_update(&rec, &mut vm);
    assert_eq!(last.objects_dead, 2);
    full_update(&rec, &mut vm); // the dormant stack goes
    assert_eq!(rec.stats().unwrap().string_refs, 0);
}

#[test]
fn iteration_yields_aged_objects_and_blocks_updates() {
    let rec = HeapRecorder::default();
    let mut vm = FakeVm::new();
    record(&rec, &mut vm, "a", 1);
    rec.commit(&mut vm).unwrap();
    vm.gc();
    let newborn = vm.alloc(1);
    rec.record_allocation(newborn, 1, None, &frames("b", 1), vm.gc)
        .unwrap();
    rec.commit(&mut vm).unwrap();

    let snap = rec.prepare_iteration(&mut vm).unwrap();
    assert_eq!(snap.len(), 2);
    let mut seen = vec![];
    snap.for_each_live(|o| {
        seen.push((o.record_id, o.data.gen_age));
        true
    });
    assert_eq!(seen, vec![(1, 1)], "age-0 objects are not yielded");

    assert_eq!(
        rec.prepare_iteration(&mut vm).err(),
        Some(HeapError::IterationInProgress)
    );
    vm.gc();
    assert_eq!(
        rec.update(&mut vm, UpdateKind::Full).unwrap(),
        UpdateOutcome::SkippedIterating
    );
    // Recording and committing still work during an iteration.
    record(&rec, &mut vm, "c", 1);
    rec.commit(&mut vm).unwrap();

    rec.finish_iteration().unwrap();
    assert_eq!(
        rec.finish_iteration().err(),
        Some(HeapError::NoIterationPrepared)
    );
    assert!(matches!(
        rec.update(&mut vm, UpdateKind::Full).unwrap(),
        UpdateOutcome::Done(_)
    ));
}

#[test]
fn snapshot_names_survive_on_another_thread() {
    let rec = HeapRecorder::default();
    let mut vm = FakeVm::new();
    record(&rec, &mut vm, "threaded", 7);
    rec.commit(&mut vm).unwrap();
    vm.gc();
    let snap = rec.prepare_iteration(&mut vm).unwrap();
    let names = std::thread::spawn(move || {
        let mut names = vec![];
        snap.for_each_live(|o| {
            names.push(snap.names().get(o.stack[0].name).unwrap().to_owned());
            true
        });
        names
    })
    .join()
    .unwrap();
    assert_eq!(names, vec!["threaded".to_string()]);
    rec.finish_iteration().unwrap();
}

#[test]
fn after_fork_with_dangling_snapshot_and_held_lock() {
    let rec = HeapRecorder::default();
    let mut vm = FakeVm::new();
    record(&rec, &mut vm, "a", 1);
    rec.commit(&mut vm).unwrap();
    record(&rec, &mut vm, "b", 1);
    vm.gc();
    let _snap = rec.prepare_iteration(&mut vm).unwrap();
    assert!(rec.lock().try_lock(OTHER_THREAD));
    // Leave WANTED | HELD set, as a fork in the middle of a wait would.
    rec.lock()
        .lock(1, 0, &mut || -> Result<i64> {
            rec.lock().reset();
            Ok(0)
        })
        .unwrap();
    assert!(!rec.lock().try_lock(OTHER_THREAD));
    assert!(rec.stats().unwrap().lifetime.updates_successful > 0);

    rec.after_fork().unwrap();
    assert!(!rec.is_iterating().unwrap());
    assert!(!rec.lock().is_held() && !rec.lock().is_wanted());
    let s = rec.stats().unwrap();
    assert_eq!(s.lifetime, Lifetime::default());
    assert_eq!((s.num_object_records, s.pending_recordings_count), (1, 1));
    assert!(matches!(
        rec.update(&mut vm, UpdateKind::Full).unwrap(),
        UpdateOutcome::Done(_)
    ));
}

#[test]
fn dropping_a_recorder_with_records_and_pending_is_fine() {
    let rec = HeapRecorder::default();
    let mut vm = FakeVm::new();
    record(&rec, &mut vm, "a", 1);
    rec.commit(&mut vm).unwrap();
    record(&rec, &mut vm, "b", 1);
    drop(rec);
}

#[test]
fn debug_lines_describe_records() {
    let rec = HeapRecorder::default();
    let mut vm = FakeVm::new();
    record(&rec, &mut vm, "a", 42);
    rec.commit(&mut vm).unwrap();
    let lines = rec.debug_lines().unwrap();
    assert_eq!(lines.len(), 1);
    assert!(
        lines[0].starts_with("record_id=1 weight=1 size=0 location=app.rb:42"),
        "{}",
        lines[0]
    );
    assert!(lines[0].ends_with("class=String"));
}

#[test]
fn memsize_grows_with_tracked_objects() {
    let rec = HeapRecorder::default();
    let mut vm = FakeVm::new();
    let before = rec.memsize();
    for i in 0..200 {
        record(&rec, &mut vm, "a", i);
        rec.commit(&mut vm).unwrap();
    }
    assert!(
        rec.memsize() > before + 200 * 32,
        "{} vs {}",
        rec.memsize(),
        before
    );
}

#[test]
fn max_tracked_objects_bounds_pending_plus_committed() {
    let rec = HeapRecorder::new(RecorderOptions {
        max_tracked_objects: 4,
        ..RecorderOptions::default()
    });
    let mut vm = FakeVm::new();
    // Between two commits nothing can make room: past the cap, recordings are skipped.
    (0..4).for_each(|i| {
        record(&rec, &mut vm, "a", i);
    });
    let extra = vm.alloc(1);
    let r = rec
        .record_allocation(extra, 1, None, &frames("a", 1), 0)
        .unwrap();
    assert_eq!(r.outcome, RecordOutcome::SkippedMaxTracked);
    assert_eq!(
        rec.stats().unwrap().lifetime.recordings_skipped_max_tracked,
        1
    );
    // The commit thins them (at fifteen sixteenths of the cap, 3 of 4): room again.
    rec.commit(&mut vm).unwrap();
    let stats = rec.stats().unwrap();
    assert!(stats.lifetime.thinnings >= 1 && stats.thinning >= 2);
    assert!(stats.num_object_records + stats.pending_recordings_count < 3);
    let r = rec
        .record_allocation(extra, 1, None, &frames("a", 1), 0)
        .unwrap();
    assert_ne!(r.outcome, RecordOutcome::SkippedMaxTracked);
}

#[test]
fn full_update_abandoned_by_an_interrupt_leaves_the_lock_usable() {
    struct Interrupted(FakeVm);
    impl Vm for Interrupted {
        fn remember(&mut self, id: i64, o: ObjectRef) -> Result<()> {
            self.0.remember(id, o)
        }
        fn forget(&mut self, ids: &[i64]) -> Result<()> {
            self.0.forget(ids)
        }
        fn lookup(&mut self, id: i64, m: bool) -> Result<Option<crate::vm::LiveInfo>> {
            self.0.lookup(id, m)
        }
        fn yield_thread(&mut self) -> Result<()> {
            Err(HeapError::Host("Interrupt".into()))
        }
        fn current_thread(&self) -> crate::lock::ThreadId {
            self.0.thread
        }
        fn gc_count(&self) -> u64 {
            self.0.gc
        }
        fn now_ns(&self) -> i64 {
            self.0.now
        }
    }
    let rec = HeapRecorder::default();
    let mut vm = Interrupted(FakeVm::new());
    assert!(rec.lock().try_lock(OTHER_THREAD)); // a commit in another thread holds it
    assert_eq!(
        rec.update(&mut vm, UpdateKind::Full).unwrap_err(),
        HeapError::Host("Interrupt".into())
    );
    assert!(rec.lock().is_held() && !rec.lock().is_wanted());
    rec.lock().unlock();
    assert_eq!(rec.commit(&mut vm.0).unwrap(), CommitOutcome::Committed(0));
}

/// Builds the same history on a recorder whose VM walks and on one whose VM looks up: objects of
/// several ages, some dead, some frozen, sizes changing. Returns the two (recorder, vm) pairs.
fn twin_histories(steps: u64) -> Vec<(HeapRecorder, FakeVm)> {
    [true, false]
        .into_iter()
        .map(|walk| {
            let rec = HeapRecorder::default();
            let mut vm = FakeVm::new();
            vm.walk_enabled = walk;
            let mut objects = Vec::new();
            let mut seed = 0x2545_f491_4f6c_dd1du64;
            let mut next = move || {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                seed
            };
            for step in 0..steps {
                for i in 0..20 {
                    objects.push(record(&rec, &mut vm, ["a", "b", "c"][i % 3], i as i32));
                }
                rec.commit(&mut vm).unwrap();
                vm.gc();
                for &o in &objects {
                    match next() % 10 {
                        0 => vm.kill(o),
                        1 => vm.obj(o).frozen = true,
                        2 => vm.obj(o).size += 8,
                        _ => {}
                    }
                }
                let kind = match step % 3 {
                    0 => UpdateKind::Full,
                    _ => UpdateKind::Young,
                };
                rec.update(&mut vm, kind).unwrap();
            }
            (rec, vm)
        })
        .collect()
}

#[test]
fn walking_and_looking_up_agree_after_a_full_update() {
    let mut pairs = twin_histories(12);
    for (rec, vm) in &mut pairs {
        let objects: Vec<ObjectRef> = vm.objects.keys().copied().collect();
        (objects.iter())
            .filter(|&&o| o % 7 == 0)
            .for_each(|&o| vm.kill(o));
        let last = full_update(rec, vm);
        assert!(last.objects_alive > 0 && last.objects_dead > 0, "{last:?}");
    }
    let [(walked, walk_vm), (looked, lookup_vm)] = &pairs[..] else {
        unreachable!()
    };
    assert!(walk_vm.walks > 0 && walk_vm.lookup_calls == 0);
    assert!(lookup_vm.walks == 0 && lookup_vm.lookup_calls > 0);
    let records = |rec: &HeapRecorder| {
        let state = rec.state().unwrap();
        let mut all: Vec<_> = (state.object_records.iter())
            .map(|(&id, r)| (id, r.data))
            .collect();
        all.sort_by_key(|(id, _)| *id);
        all
    };
    assert_eq!(records(walked), records(looked));
    let (a, b) = (walked.stats().unwrap(), looked.stats().unwrap());
    assert_eq!(
        (a.num_object_records, a.num_heap_records, a.string_refs),
        (b.num_object_records, b.num_heap_records, b.string_refs)
    );
}

#[test]
fn a_young_walk_also_drops_old_objects_that_died() {
    let rec = HeapRecorder::default();
    let mut vm = FakeVm::new();
    vm.walk_enabled = true;
    let old = record(&rec, &mut vm, "old", 1);
    rec.commit(&mut vm).unwrap();
    for _ in 0..OLD_AGE {
        vm.gc();
    }
    for line in 0..4 {
        record(&rec, &mut vm, "young", line);
    }
    rec.commit(&mut vm).unwrap();
    vm.gc();
    vm.kill(old);
    let UpdateOutcome::Done(last) = rec.update(&mut vm, UpdateKind::Young).unwrap() else {
        panic!("young update did not run")
    };
    assert_eq!(vm.walks, 1);
    // The old record counts as skipped (as the reference, which never looks at it, counts it),
    // not dead: a young update's dead are young objects.
    assert_eq!(
        (
            last.objects_alive,
            last.objects_dead,
            last.objects_skipped,
            last.skipped_objects_dropped
        ),
        (4, 0, 1, 1)
    );
    assert!(!rec.is_recorded(1).unwrap(), "the old dead record is gone");
    let stats = rec.stats().unwrap();
    assert_eq!(stats.num_object_records, 4);
    assert_eq!(stats.lifetime.ewma_young_objects_dead, 0.0);
    assert_eq!(stats.lifetime.skipped_objects_dropped, 1);
}

#[test]
fn a_young_walk_counts_only_young_objects_dead() {
    let rec = HeapRecorder::default();
    let mut vm = FakeVm::new();
    vm.walk_enabled = true;
    let old: Vec<_> = (0..2).map(|i| record(&rec, &mut vm, "old", i)).collect();
    rec.commit(&mut vm).unwrap();
    for _ in 0..OLD_AGE {
        vm.gc();
    }
    let young: Vec<_> = (0..4).map(|i| record(&rec, &mut vm, "young", i)).collect();
    rec.commit(&mut vm).unwrap();
    vm.gc();
    vm.kill(old[0]);
    vm.kill(young[0]);
    let UpdateOutcome::Done(last) = rec.update(&mut vm, UpdateKind::Young).unwrap() else {
        panic!("young update did not run")
    };
    assert_eq!(vm.walks, 1);
    assert_eq!(
        (
            last.objects_alive,
            last.objects_dead,
            last.objects_skipped,
            last.skipped_objects_dropped
        ),
        (3, 1, 2, 1)
    );
    let l = rec.stats().unwrap().lifetime;
    assert!((l.ewma_young_objects_dead - 0.3).abs() < 1e-9, "{l:?}");
    assert!((l.ewma_young_objects_skipped - 0.6).abs() < 1e-9, "{l:?}");
    // A full update then counts an old dead record as dead.
    vm.kill(old[1]);
    let last = full_update(&rec, &mut vm);
    assert_eq!((last.objects_dead, last.skipped_objects_dropped), (1, 0));
}

#[test]
fn young_updates_measure_no_size_full_updates_do() {
    for walk in [false, true] {
        let rec = HeapRecorder::default();
        let mut vm = FakeVm::new();
        vm.walk_enabled = walk;
        let objs: Vec<_> = (0..3).map(|i| record(&rec, &mut vm, "a", i)).collect();
        rec.commit(&mut vm).unwrap();
        vm.gc();
        objs.iter().for_each(|&o| vm.obj(o).size = 100);
        let UpdateOutcome::Done(last) = rec.update(&mut vm, UpdateKind::Young).unwrap() else {
            panic!("young update did not run")
        };
        assert_eq!(last.objects_alive, 3);
        assert_eq!(vm.size_measurements, 0, "walk: {walk}");
        full_update(&rec, &mut vm);
        assert_eq!(vm.size_measurements, 3, "walk: {walk}");
    }
}

#[test]
fn an_update_shrinks_the_records_table_after_a_burst() {
    let rec = HeapRecorder::default();
    let mut vm = FakeVm::new();
    vm.walk_enabled = true;
    let mut objs = Vec::new();
    for i in 0..5000 {
        objs.push(record(&rec, &mut vm, "a", i % 7));
        if i % 200 == 199 {
            rec.commit(&mut vm).unwrap();
        }
    }
    rec.commit(&mut vm).unwrap();
    vm.gc();
    objs.iter().skip(10).for_each(|&o| vm.kill(o));
    let before = rec.state().unwrap().object_records.capacity();
    full_update(&rec, &mut vm);
    let state = rec.state().unwrap();
    assert_eq!(state.object_records.len(), 10);
    assert!(
        state.object_records.capacity() < before / 4,
        "{} -> {}",
        before,
        state.object_records.capacity()
    );
}

#[test]
fn a_failed_walk_releases_the_lock_and_drops_nothing() {
    let rec = HeapRecorder::default();
    let mut vm = FakeVm::new();
    vm.walk_enabled = true;
    let objs: Vec<_> = (0..4).map(|i| record(&rec, &mut vm, "a", i)).collect();
    rec.commit(&mut vm).unwrap();
    vm.gc();
    vm.kill(objs[0]);
    vm.fail_lookup_after = Some(0);
    assert!(rec.update(&mut vm, UpdateKind::Full).is_err());
    assert!(!rec.lock().is_held());
    assert_eq!(rec.stats().unwrap().num_object_records, 4);
    let last = full_update(&rec, &mut vm);
    assert_eq!((last.objects_alive, last.objects_dead), (3, 1));
}

#[test]
fn near_max_tracked_objects_a_young_update_walks_to_prune_before_thinning() {
    // Thinning starts at fifteen sixteenths of the cap: 22 of 24.
    let rec = HeapRecorder::new(RecorderOptions {
        max_tracked_objects: 24,
        ..RecorderOptions::default()
    });
    let mut vm = FakeVm::new();
    vm.walk_enabled = true;
    let old: Vec<_> = (0..20).map(|i| record(&rec, &mut vm, "old", i)).collect();
    rec.commit(&mut vm).unwrap();
    for _ in 0..OLD_AGE {
        vm.gc();
    }
    record(&rec, &mut vm, "young", 1);
    rec.commit(&mut vm).unwrap();
    record(&rec, &mut vm, "pending", 1);
    vm.gc();
    old.iter().take(10).for_each(|&o| vm.kill(o));
    // One young object among 22: lookups would be chosen, and the 10 old dead would stay.
    let UpdateOutcome::Done(last) = rec.update(&mut vm, UpdateKind::Young).unwrap() else {
        panic!("young update did not run")
    };
    assert_eq!(vm.walks, 1);
    assert_eq!((last.objects_dead, last.skipped_objects_dropped), (0, 10));
    // The dead made room: nothing was thinned.
    let stats = rec.stats().unwrap();
    assert_eq!((stats.thinning, stats.lifetime.thinnings), (1, 0));
    assert_eq!(
        record_outcome(&rec, &mut vm),
        RecordOutcome::Pending,
        "room again"
    );
}

fn record_outcome(rec: &HeapRecorder, vm: &mut FakeVm) -> RecordOutcome {
    let obj = vm.alloc(8);
    rec.record_allocation(obj, 1, None, &frames("again", 1), vm.gc)
        .unwrap()
        .outcome
}

/// 20 old, alive records, already walked once (so no arrivals are pending).
fn steady_old_heap() -> (HeapRecorder, FakeVm) {
    let rec = HeapRecorder::default();
    let mut vm = FakeVm::new();
    vm.walk_enabled = true;
    for line in 0..20 {
        record(&rec, &mut vm, "old", line);
    }
    rec.commit(&mut vm).unwrap();
    for _ in 0..OLD_AGE {
        vm.gc();
    }
    full_update(&rec, &mut vm);
    assert_eq!(vm.walks, 1);
    (rec, vm)
}

#[test]
fn a_young_update_of_a_steady_old_heap_looks_up_its_few_young_records() {
    let (rec, mut vm) = steady_old_heap();
    record(&rec, &mut vm, "young", 1);
    rec.commit(&mut vm).unwrap();
    vm.gc();
    let UpdateOutcome::Done(last) = rec.update(&mut vm, UpdateKind::Young).unwrap() else {
        panic!("young update did not run")
    };
    assert_eq!((vm.walks, vm.lookup_calls), (1, 1));
    assert_eq!((last.objects_alive, last.objects_skipped), (1, 20));
}

#[test]
fn short_lived_arrivals_that_aged_past_young_make_a_young_update_walk() {
    let (rec, mut vm) = steady_old_heap();
    let arrivals: Vec<_> = (0..10).map(|i| record(&rec, &mut vm, "burst", i)).collect();
    rec.commit(&mut vm).unwrap();
    for _ in 0..OLD_AGE {
        vm.gc();
    }
    arrivals.iter().for_each(|&o| vm.kill(o));
    let UpdateOutcome::Done(last) = rec.update(&mut vm, UpdateKind::Young).unwrap() else {
        panic!("young update did not run")
    };
    assert_eq!(vm.walks, 2);
    // They aged past young: dropped by the walk, counted as skipped, not dead.
    assert_eq!((last.objects_dead, last.skipped_objects_dropped), (0, 10));
    assert_eq!(rec.stats().unwrap().num_object_records, 20);
}

#[test]
fn the_lock_holder_asking_for_a_full_update_is_refused_not_left_waiting() {
    // A signal trap or finalizer runs inside the holder's own VM call, on the holder's thread.
    let rec = HeapRecorder::default();
    let mut vm = FakeVm::new();
    record(&rec, &mut vm, "a", 1);
    assert!(rec.lock().try_lock(vm.thread));
    assert_eq!(
        rec.update(&mut vm, UpdateKind::Full).unwrap_err(),
        HeapError::Reentrant
    );
    assert_eq!(vm.yields, 0, "it never waited for itself");
    assert_eq!(rec.commit(&mut vm).unwrap(), CommitOutcome::SkippedLocked);
    assert_eq!(
        rec.lock().holder(),
        Some(vm.thread),
        "the holder keeps its lock"
    );
    rec.lock().unlock();
    assert!(matches!(
        rec.update(&mut vm, UpdateKind::Full).unwrap(),
        UpdateOutcome::Done(_)
    ));
}

/// Sum of the weights of every tracked object, committed or pending.
fn tracked_weight(rec: &HeapRecorder) -> u64 {
    let state = rec.state_ref().unwrap();
    let committed: u64 = state.object_records.values().map(|r| r.data.weight).sum();
    let pending: u64 = rec.pending.borrow().iter().map(|p| p.data.weight).sum();
    committed + pending
}

#[test]
fn near_max_tracked_objects_records_are_thinned_and_reweighted_not_skipped() {
    let rec = HeapRecorder::new(RecorderOptions {
        max_tracked_objects: 1000,
        ..RecorderOptions::default()
    });
    let mut vm = FakeVm::new();
    // 950 live objects of weight 3: past fifteen sixteenths of the cap.
    for i in 0..950 {
        let obj = vm.alloc(40);
        rec.record_allocation(obj, 3, Some("String"), &frames("a", i % 7), vm.gc)
            .unwrap();
        // 800 committed (under the threshold), the last 150 left pending.
        if i % 200 == 199 && i < 800 {
            rec.commit(&mut vm).unwrap();
        }
    }
    assert_eq!(tracked_weight(&rec), 2850);
    vm.gc();
    assert!(matches!(
        rec.update(&mut vm, UpdateKind::Young).unwrap(),
        UpdateOutcome::Done(_)
    ));
    let stats = rec.stats().unwrap();
    assert_eq!((stats.thinning, stats.lifetime.thinnings), (2, 1));
    let kept = stats.num_object_records + stats.pending_recordings_count;
    assert_eq!(kept + stats.lifetime.records_thinned, 950);
    // Each record survived with probability 1/2 and now weighs double: the total is unbiased
    // (sigma = 3 * sqrt(950) = 92).
    let total = tracked_weight(&rec);
    assert_eq!(total, kept * 6);
    assert!(total.abs_diff(2850) <= 4 * 92, "total weight {total}");

    // New recordings: one in two kept, at double weight.
    let mut outcomes = Vec::new();
    for i in 0..100 {
        let obj = vm.alloc(40);
        let r = rec
            .record_allocation(obj, 3, Some("String"), &frames("b", i), vm.gc)
            .unwrap();
        outcomes.push(r.outcome);
    }
    let pending = outcomes
        .iter()
        .filter(|o| **o == RecordOutcome::Pending)
        .count() as u64;
    let thinned = rec.stats().unwrap().lifetime.recordings_skipped_thinned;
    assert_eq!(pending + thinned, 100);
    assert!((30..=70).contains(&pending), "{pending} of 100 kept");
    assert!(rec.pending.borrow().iter().all(|p| p.data.weight == 6));

    // The profile says so.
    rec.commit(&mut vm).unwrap();
    let snapshot = rec.prepare_iteration(&mut vm).unwrap();
    assert!(snapshot.notes()[0].contains("records were thinned 1 time ("));
    drop(snapshot);
    rec.finish_iteration().unwrap();
}

#[test]
fn thinning_is_halved_again_once_few_objects_are_tracked() {
    let rec = HeapRecorder::new(RecorderOptions {
        max_tracked_objects: 100,
        ..RecorderOptions::default()
    });
    let mut vm = FakeVm::new();
    let objs: Vec<_> = (0..95).map(|i| record(&rec, &mut vm, "a", i)).collect();
    rec.commit(&mut vm).unwrap();
    vm.gc();
    rec.update(&mut vm, UpdateKind::Full).unwrap();
    assert_eq!(rec.stats().unwrap().thinning, 2);
    for obj in objs {
        vm.kill(obj);
    }
    vm.gc();
    rec.update(&mut vm, UpdateKind::Full).unwrap();
    let stats = rec.stats().unwrap();
    assert_eq!((stats.num_object_records, stats.thinning), (0, 1));
    let snapshot = rec.prepare_iteration(&mut vm).unwrap();
    assert!(
        snapshot
            .notes()
            .iter()
            .any(|n| n.contains("thinned 1 time (")),
        "the profile still says the estimates were thinned: {:?}",
        snapshot.notes()
    );
    drop(snapshot);
    rec.finish_iteration().unwrap();
}

#[test]
fn rescale_weights_scales_the_id_range_pending_and_committed_and_nothing_else() {
    let rec = HeapRecorder::default();
    let mut vm = FakeVm::new();
    let weigh = |rec: &HeapRecorder, vm: &mut FakeVm, weight| {
        let obj = vm.alloc(40);
        let r = rec.record_allocation(obj, weight, Some("String"), &frames("a", 1), vm.gc);
        assert_eq!(r.unwrap().outcome, RecordOutcome::Pending);
    };
    assert_eq!(rec.last_record_id().unwrap(), 0);
    weigh(&rec, &mut vm, 100); // id 1: before the range
    weigh(&rec, &mut vm, 100); // id 2: in it, committed below
    rec.commit(&mut vm).unwrap();
    weigh(&rec, &mut vm, 1000); // id 3: in it, still pending
    weigh(&rec, &mut vm, 100); // id 4: after it
    assert_eq!(rec.last_record_id().unwrap(), 4);

    assert_eq!(rec.rescale_weights(1, 3, 1.5).unwrap(), 2);
    // A factor that would round to nothing leaves a weight of 1.
    assert_eq!(rec.rescale_weights(3, 4, 1e-9).unwrap(), 1);
    rec.commit(&mut vm).unwrap();
    let state = rec.state().unwrap();
    let weights: Vec<u64> = (1..=4)
        .map(|id| state.object_records[&id].data.weight)
        .collect();
    assert_eq!(weights, vec![100, 150, 1500, 1]);
    drop(state);

    let refused = rec.rescale_weights(0, 4, f64::NAN).unwrap_err();
    assert!(refused.to_string().contains("NaN"), "{refused}");
    let refused = rec.rescale_weights(0, 4, 0.0).unwrap_err();
    assert!(refused.to_string().contains("positive"), "{refused}");
    // An empty or reversed range scales nothing.
    assert_eq!(rec.rescale_weights(4, 4, 2.0).unwrap(), 0);
    assert_eq!(rec.rescale_weights(4, 1, 2.0).unwrap(), 0);
}
