//! The stack cache seen through the recorder: hits share the live record and intern nothing,
//! stale entries (another epoch, a stack no longer recorded) fall back to naming the frames, and
//! reference counts stay exactly what the uncached path gives.

use std::cell::Cell;
use std::collections::HashSet;
use std::sync::Arc;

use proptest::prelude::*;

use super::*;
use crate::fake_vm::FakeVm;
use crate::stacks::frame::refs_of;
use crate::stacks::{FrameSource, NamedFrame, StackHandles};

/// A captured stack as the binding sees it: handles and lines (the key), and the names they
/// stand for, which it counts being asked for.
struct Captured {
    handles: Vec<u64>,
    lines: Vec<i32>,
    epoch: u64,
    frames: Vec<NamedFrame<'static>>,
    named: Cell<usize>,
}

impl Captured {
    fn new(handles: &[u64], epoch: u64, frames: Vec<NamedFrame<'static>>) -> Self {
        Captured {
            handles: handles.to_vec(),
            lines: frames.iter().map(|f| f.line).collect(),
            epoch,
            frames,
            named: Cell::new(0),
        }
    }
}

impl FrameSource for Captured {
    fn key(&self) -> Option<StackHandles<'_>> {
        Some(StackHandles {
            frames: &self.handles,
            lines: &self.lines,
            salt: 0,
            epoch: self.epoch,
        })
    }

    fn with_frames(&self, f: &mut dyn FnMut(&[NamedFrame<'_>]) -> Result<Stack>) -> Result<Stack> {
        self.named.set(self.named.get() + 1);
        f(&self.frames)
    }
}

fn frames(names: &[&'static str]) -> Vec<NamedFrame<'static>> {
    names
        .iter()
        .enumerate()
        .map(|(i, &name)| NamedFrame {
            name,
            filename: "app.rb",
            line: i as i32 + 1,
        })
        .collect()
}

fn cached_recorder() -> HeapRecorder {
    let rec = HeapRecorder::default();
    rec.reserve_stack_cache().unwrap();
    rec
}

fn record(rec: &HeapRecorder, vm: &mut FakeVm, source: &Captured) -> ObjectRef {
    let obj = vm.alloc(40);
    let r = rec
        .record_allocation_from(obj, 1, Some("String"), source, vm.gc)
        .unwrap();
    assert_eq!(r.outcome, RecordOutcome::Pending);
    obj
}

fn names_of(rec: &HeapRecorder, stack: &Stack) -> Vec<String> {
    let strings = rec.strings().lock().unwrap();
    stack.iter().map(|f| strings.get(f.name).unwrap()).collect()
}

fn newest_pending_names(rec: &HeapRecorder) -> Vec<String> {
    let stack = rec.pending().unwrap().last().unwrap().stack.clone();
    names_of(rec, &stack)
}

#[test]
fn a_hit_shares_the_record_and_names_nothing() {
    let rec = cached_recorder();
    let mut vm = FakeVm::new();
    let site = Captured::new(&[100, 200], 0, frames(&["inner", "outer"]));
    record(&rec, &mut vm, &site);
    let after_one = rec.stats().unwrap().string_refs;
    record(&rec, &mut vm, &site);
    record(&rec, &mut vm, &site);
    assert_eq!(site.named.get(), 1, "named once, then found in the cache");
    let s = rec.stats().unwrap();
    assert_eq!(
        (s.lifetime.stack_cache_hits, s.lifetime.stack_cache_misses),
        (2, 1)
    );
    assert_eq!(s.num_heap_records, 1);
    // Each hit adds only the class name's reference.
    assert_eq!(s.string_refs, after_one + 2);
    let state = rec.state().unwrap();
    let pending = rec.pending().unwrap();
    let (first, last) = (&pending[0].stack, &pending[2].stack);
    assert!(Arc::ptr_eq(first, last));
    assert_eq!(state.heap_records.count(first), 3);
}

#[test]
fn cached_and_uncached_recorders_end_in_the_same_state() {
    let cached = cached_recorder();
    let plain = HeapRecorder::default();
    let mut vm = FakeVm::new();
    let sites = [
        Captured::new(&[1, 2], 0, frames(&["a", "main"])),
        Captured::new(&[3, 2], 0, frames(&["b", "main"])),
        Captured::new(
            &[1, 2, 9],
            0,
            frames(&["a", "main", "(1 frames truncated)"]),
        ),
    ];
    for i in 0..30 {
        let site = &sites[i % 3];
        record(&cached, &mut vm, site);
        record(&plain, &mut vm, site);
    }
    let (c, p) = (cached.stats().unwrap(), plain.stats().unwrap());
    assert_eq!(c.num_heap_records, p.num_heap_records);
    assert_eq!(c.string_refs, p.string_refs);
    assert_eq!(c.lifetime.stack_cache_hits, 27);
    assert_eq!(
        p.lifetime.stack_cache_hits + p.lifetime.stack_cache_misses,
        0
    );
    let stacks = |rec: &HeapRecorder| {
        let state = rec.state().unwrap();
        let mut out: Vec<(Vec<String>, u32)> = state
            .heap_records
            .iter()
            .map(|(s, n)| (names_of(rec, s), n))
            .collect();
        out.sort();
        out
    };
    assert_eq!(stacks(&cached), stacks(&plain));
}

#[test]
fn another_epoch_names_the_frames_again() {
    let rec = cached_recorder();
    let mut vm = FakeVm::new();
    record(
        &rec,
        &mut vm,
        &Captured::new(&[100], 0, frames(&["before"])),
    );
    // Same handle after a GC: it may be another frame now (moved or reused).
    let moved = Captured::new(&[100], 1, frames(&["after"]));
    record(&rec, &mut vm, &moved);
    assert_eq!(moved.named.get(), 1);
    assert_eq!(newest_pending_names(&rec), ["after"]);
}

#[test]
fn a_cached_stack_that_is_no_longer_recorded_is_not_reused() {
    let rec = cached_recorder();
    let mut vm = FakeVm::new();
    let site = Captured::new(&[100, 200], 7, frames(&["gone", "main"]));
    let obj = record(&rec, &mut vm, &site);
    rec.commit(&mut vm).unwrap();
    vm.kill(obj);
    vm.gc();
    // Dormant after the first full update, given back at the second.
    for _ in 0..2 {
        assert!(matches!(
            rec.update(&mut vm, UpdateKind::Full).unwrap(),
            UpdateOutcome::Done(_)
        ));
    }
    let s = rec.stats().unwrap();
    assert_eq!((s.num_heap_records, s.string_refs), (0, 0));

    // The cache still has the entry (same epoch, as the key says), but its stack is no record
    // any more and its string ids were given back: the frames are named and interned again.
    let again = Captured::new(&[100, 200], 7, frames(&["gone", "main"]));
    record(&rec, &mut vm, &again);
    assert_eq!(again.named.get(), 1);
    assert_eq!(newest_pending_names(&rec), ["gone", "main"]);
    let s = rec.stats().unwrap();
    assert_eq!(s.num_heap_records, 1);
    // Two names, a filename per frame, one class.
    assert_eq!(s.string_refs, 5);
    assert_eq!(s.lifetime.stack_cache_misses, 2);
}

#[test]
fn count_limit_on_a_hit_is_an_error_that_changes_nothing() {
    let rec = cached_recorder();
    let mut vm = FakeVm::new();
    let site = Captured::new(&[100], 0, frames(&["full"]));
    record(&rec, &mut vm, &site);
    let stack = rec.pending().unwrap()[0].stack.clone();
    rec.state()
        .unwrap()
        .heap_records
        .set_count_for_test(&stack, u32::MAX);
    let refs = rec.stats().unwrap().string_refs;
    let err = rec
        .record_allocation_from(vm.alloc(8), 1, Some("String"), &site, vm.gc)
        .unwrap_err();
    assert!(matches!(err, HeapError::TooManyObjectsForStack { .. }));
    let s = rec.stats().unwrap();
    assert_eq!((s.string_refs, s.pending_recordings_count), (refs, 1));
    assert_eq!(s.lifetime.recordings_failed, 1);
}

#[test]
fn fork_and_the_test_switch_empty_the_cache() {
    let rec = cached_recorder();
    let mut vm = FakeVm::new();
    let site = Captured::new(&[100], 0, frames(&["x"]));
    record(&rec, &mut vm, &site);
    rec.after_fork().unwrap();
    record(&rec, &mut vm, &site);
    assert_eq!(site.named.get(), 2, "after a fork the cache starts empty");
    rec.set_stack_cache_enabled(false).unwrap();
    record(&rec, &mut vm, &site);
    record(&rec, &mut vm, &site);
    assert_eq!(
        site.named.get(),
        4,
        "disabled: every recording names its frames"
    );
    rec.set_stack_cache_enabled(true).unwrap();
    rec.clear_stack_cache();
    record(&rec, &mut vm, &site);
    record(&rec, &mut vm, &site);
    assert_eq!(site.named.get(), 5);
}

#[test]
fn a_recorder_that_never_sampled_has_no_table() {
    let rec = HeapRecorder::default();
    let mut vm = FakeVm::new();
    let site = Captured::new(&[100], 0, frames(&["x"]));
    record(&rec, &mut vm, &site);
    record(&rec, &mut vm, &site);
    assert_eq!(site.named.get(), 2);
    let before = rec.memsize();
    rec.reserve_stack_cache().unwrap();
    assert!(rec.memsize() > before);
}

// Handles are reassigned at every GC, as compaction and slot reuse do: a cache that outlived its
// epoch would hand out another site's stack, which the name check below would catch.
proptest! {
    #![proptest_config(ProptestConfig { cases: 128, ..ProptestConfig::default() })]

    #[test]
    fn cached_recordings_name_the_right_site_and_leak_nothing(
        ops in prop::collection::vec((0..6u8, 0..4usize), 1..200),
        slots in prop_oneof![Just(1usize), Just(4), Just(512)],
    ) {
        const NAMES: [&str; 4] = ["w", "x", "y", "z"];
        let rec = HeapRecorder::default();
        rec.caches().unwrap().stacks = crate::stacks::StackCache::with_slots(slots);
        let mut vm = FakeVm::new();
        let mut objects = vec![];
        let mut seen_ids = HashSet::new();
        for (op, site) in ops {
            match op {
                0..=2 => {
                    // Site `site` has handle (site + gc) % 4 in this epoch.
                    let handle = ((site as u64 + vm.gc) % 4) * 40 + 0x1000;
                    let names = [NAMES[site], "main"];
                    let source = Captured::new(&[handle, 0x2000], vm.gc, frames(&names));
                    let obj = vm.alloc(8);
                    let r = rec.record_allocation_from(obj, 1, None, &source, vm.gc).unwrap();
                    if r.outcome == RecordOutcome::Pending {
                        objects.push(obj);
                        prop_assert_eq!(newest_pending_names(&rec), names);
                        let queue = rec.pending().unwrap();
                        let stack = &queue.last().unwrap().stack;
                        seen_ids.extend(stack.iter().flat_map(|f| [f.name, f.filename]));
                    }
                }
                3 => { rec.commit(&mut vm).unwrap(); }
                4 => {
                    if !objects.is_empty() {
                        let o = objects.swap_remove(site % objects.len());
                        vm.kill(o);
                    }
                }
                _ => {
                    vm.gc();
                    rec.commit(&mut vm).unwrap();
                    rec.update(&mut vm, UpdateKind::Full).unwrap();
                }
            }
            let state = rec.state().unwrap();
            let expected: u64 = state.heap_records.iter_all().map(|(s, _)| refs_of(s)).sum();
            prop_assert_eq!(state.heap_records.refs(), expected);
        }
        super::proptests::everything_dies(&rec, &mut vm, &objects, &seen_ids)?;
    }
}

#[test]
fn the_gc_mark_sees_every_cached_handle_and_none_after_a_gc_that_could_not_mark() {
    let rec = cached_recorder();
    let mut vm = FakeVm::new();
    let site = Captured::new(&[100, 200], rec.handle_epoch(), frames(&["inner", "outer"]));
    record(&rec, &mut vm, &site);
    let mut marked = Vec::new();
    rec.mark_cached_handles(|h| marked.push(h));
    marked.sort_unstable();
    marked.dedup();
    assert_eq!(marked, vec![100, 200]);

    // A GC while the caches are in use marks nothing and moves the epoch on...
    let epoch = rec.handle_epoch();
    {
        let _busy = rec.caches().unwrap();
        rec.mark_cached_handles(|_| panic!("marked while the caches were in use"));
    }
    assert_eq!(rec.handle_epoch(), epoch + 1);
    // ...so the handles kept from before may be dead: no later GC marks them,
    rec.mark_cached_handles(|h| panic!("marked handle {h} of an older epoch"));
    // and the next recording starts the caches afresh (the old entry is not a hit).
    let hits = rec.stats().unwrap().lifetime.stack_cache_hits;
    let site = Captured::new(&[100, 200], rec.handle_epoch(), frames(&["inner", "outer"]));
    record(&rec, &mut vm, &site);
    assert_eq!(rec.stats().unwrap().lifetime.stack_cache_hits, hits);
    let mut marked = Vec::new();
    rec.mark_cached_handles(|h| marked.push(h));
    assert!(marked.contains(&100) && marked.contains(&200));
}
