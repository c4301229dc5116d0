//! The frame cache seen through the recorder: a new stack that shares frames with one seen in the
//! same epoch names only its new frames, an equal stack already recorded is found by ids, the
//! stacks equal what naming every frame gives, and every reference is given back.

use std::cell::Cell;
use std::sync::Arc;

use super::*;
use crate::fake_vm::FakeVm;
use crate::stacks::{
    Frame, FrameKey, FrameSource, NamedFrame, StackHandles, FRAME_CACHE_MAX_FRAMES,
};

/// A capture with per-frame keys: handle i names `names[i]`, at line i + 1 of app.rb.
struct Keyed {
    handles: Vec<u64>,
    lines: Vec<i32>,
    names: Vec<&'static str>,
    epoch: u64,
    /// Frames named one by one (frame-cache misses).
    named: Cell<usize>,
    /// A distinct raw key per capture, so the stack cache never answers (the frame cache does).
    salt: u64,
    /// The truncation marker's name, for a capture cut at max_frames.
    marker: Option<&'static str>,
}

impl Keyed {
    fn new(handles: &[u64], names: &[&'static str], epoch: u64, salt: u64) -> Self {
        Keyed {
            handles: handles.to_vec(),
            lines: (1..=handles.len() as i32).collect(),
            names: names.to_vec(),
            epoch,
            named: Cell::new(0),
            salt,
            marker: None,
        }
    }

    fn truncated(self, marker: &'static str) -> Self {
        Keyed {
            marker: Some(marker),
            ..self
        }
    }
}

impl FrameSource for Keyed {
    fn key(&self) -> Option<StackHandles<'_>> {
        Some(StackHandles {
            frames: &self.handles,
            lines: &self.lines,
            salt: self.salt,
            epoch: self.epoch,
        })
    }

    fn with_frames(&self, f: &mut dyn FnMut(&[NamedFrame<'_>]) -> Result<Stack>) -> Result<Stack> {
        let frames: Vec<NamedFrame> = (self.names.iter().zip(&self.lines))
            .map(|(&name, &line)| NamedFrame {
                name,
                filename: "app.rb",
                line,
            })
            .collect();
        f(&frames)
    }

    fn frame_keys(&self, out: &mut Vec<FrameKey>) -> Option<u64> {
        out.clear();
        out.extend(
            (self.handles.iter().zip(&self.lines)).map(|(&handle, &line)| FrameKey {
                handle,
                locator: 0,
                line,
            }),
        );
        Some(self.epoch)
    }

    fn name_frame(
        &self,
        i: usize,
        f: &mut dyn FnMut(&str, &str) -> Result<Frame>,
    ) -> Result<Frame> {
        self.named.set(self.named.get() + 1);
        f(self.names[i], "app.rb")
    }

    fn truncation_marker(&self) -> Option<String> {
        self.marker.map(String::from)
    }
}

fn names_of(rec: &HeapRecorder, stack: &Stack) -> Vec<String> {
    let strings = rec.strings().lock().unwrap();
    stack.iter().map(|f| strings.get(f.name).unwrap()).collect()
}

#[test]
fn shared_frames_are_named_once_per_epoch_and_references_balance() {
    let rec = HeapRecorder::default();
    rec.reserve_stack_cache().unwrap();
    let mut vm = FakeVm::new();
    let mut objects = Vec::new();
    let mut record = |vm: &mut FakeVm, source: &Keyed| {
        let obj = vm.alloc(40);
        objects.push(obj);
        let r = rec
            .record_allocation_from(obj, 1, Some("String"), source, 0)
            .unwrap();
        assert_eq!(r.outcome, RecordOutcome::Pending);
        rec.pending().unwrap().last().unwrap().stack.clone()
    };
    let a = Keyed::new(&[1, 10, 20, 30], &["a", "rack", "puma", "main"], 7, 1);
    let b = Keyed::new(&[2, 10, 20, 30], &["b", "rack", "puma", "main"], 7, 2);
    let a_again = Keyed::new(&[1, 10, 20, 30], &["a", "rack", "puma", "main"], 7, 3);
    let stack_a = record(&mut vm, &a);
    let stack_b = record(&mut vm, &b);
    let stack_a2 = record(&mut vm, &a_again);
    assert_eq!(
        (a.named.get(), b.named.get(), a_again.named.get()),
        (4, 1, 0)
    );
    assert_eq!(names_of(&rec, &stack_b), ["b", "rack", "puma", "main"]);
    assert!(Arc::ptr_eq(&stack_a, &stack_a2), "an equal stack is shared");
    // Another epoch: named again.
    let later = Keyed::new(&[1, 10, 20, 30], &["a", "rack", "puma", "main"], 8, 4);
    let stack_later = record(&mut vm, &later);
    assert_eq!(later.named.get(), 4);
    assert!(Arc::ptr_eq(&stack_a, &stack_later));
    // Two stacks, as the uncached path gives.
    assert_eq!(rec.stats().unwrap().num_heap_records, 2);
    rec.commit(&mut vm).unwrap();
    // Everything dies: the records give back theirs, clearing the cache gives back its own.
    for obj in objects.clone() {
        vm.kill(obj);
    }
    vm.gc();
    rec.update(&mut vm, UpdateKind::Full).unwrap();
    let s = rec.stats().unwrap();
    assert_eq!((s.num_heap_records, s.dormant_heap_records), (0, 2));
    // Unused since, the dormant stacks go at the next full update.
    rec.update(&mut vm, UpdateKind::Full).unwrap();
    let s = rec.stats().unwrap();
    assert_eq!((s.num_heap_records, s.string_refs), (0, 0));
    rec.clear_stack_cache();
    let mut strings = rec.strings().lock().unwrap();
    strings.compact();
    for id in 1..20 {
        assert!(strings.get(id).is_err(), "string id {id} still referenced");
    }
}

#[test]
fn a_frame_cache_that_fills_up_empties_the_stack_cache_whose_handles_it_keeps() {
    let rec = HeapRecorder::default();
    rec.reserve_stack_cache().unwrap();
    let mut vm = FakeVm::new();
    let epoch = rec.handle_epoch();
    let mut record = |source: &Keyed| {
        let obj = vm.alloc(40);
        let r = rec.record_allocation_from(obj, 1, Some("String"), source, 0);
        assert_eq!(r.unwrap().outcome, RecordOutcome::Pending);
        obj
    };
    let marked = |rec: &HeapRecorder| {
        let mut marked = Vec::new();
        rec.mark_cached_handles(|h| marked.push(h));
        marked.sort_unstable();
        marked
    };
    let hits = |rec: &HeapRecorder| rec.stats().unwrap().lifetime.stack_cache_hits;
    let site = Keyed::new(&[100, 200], &["inner", "outer"], epoch, 0);
    record(&site);
    record(&site);
    assert_eq!(hits(&rec), 1);
    assert_eq!(
        marked(&rec),
        vec![100, 200],
        "the stack cache's key, through the frame cache"
    );

    // Distinct frames (one handle each) until the frame cache is full...
    let names = vec!["filler"; 1000];
    let mut next = 1_000u64;
    while next - 1_000 < FRAME_CACHE_MAX_FRAMES as u64 {
        let handles: Vec<u64> = (next..next + 1000).collect();
        next += 1000;
        record(&Keyed::new(&handles, &names, epoch, 0));
    }
    // ...so the next miss empties it, and the stack cache with it: the site's entry, whose
    // handles no GC marks any more, is not a hit.
    record(&Keyed::new(&[300], &["other"], epoch, 0));
    assert_eq!(marked(&rec), vec![300]);
    let before = hits(&rec);
    record(&site);
    assert_eq!(hits(&rec), before);
    assert_eq!(site.named.get(), 4, "both frames named again");
    assert_eq!(marked(&rec), vec![100, 200, 300]);
}

#[test]
fn a_record_outlives_its_frame_cache_on_the_group_then_on_its_own_references() {
    let rec = HeapRecorder::default();
    rec.reserve_stack_cache().unwrap();
    let mut vm = FakeVm::new();
    let record = |vm: &mut FakeVm, source: &Keyed| {
        let obj = vm.alloc(40);
        let r = rec.record_allocation_from(obj, 1, None, source, 0);
        assert_eq!(r.unwrap().outcome, RecordOutcome::Pending);
        (obj, rec.pending().unwrap().last().unwrap().stack.clone())
    };
    let resolves = |rec: &HeapRecorder, id| {
        let mut strings = rec.strings().lock().unwrap();
        strings.compact();
        strings.get(id).is_ok()
    };
    let a = Keyed::new(&[1, 10], &["a", "main"], 7, 1).truncated("(5 frames truncated)");
    let (kept, stack_a) = record(&mut vm, &a);
    let b = Keyed::new(&[2, 10], &["b", "main"], 7, 2).truncated("(6 frames truncated)");
    let (dropped, stack_b) = record(&mut vm, &b);
    rec.commit(&mut vm).unwrap();
    // b's record goes (dormant, then swept); "b" stays in the frame cache.
    vm.kill(dropped);
    vm.gc();
    rec.update(&mut vm, UpdateKind::Full).unwrap();
    rec.update(&mut vm, UpdateKind::Full).unwrap();
    assert_eq!(rec.stats().unwrap().num_heap_records, 1);
    let (b, b_marker) = (stack_b[0].name, stack_b[2].name);
    assert!(resolves(&rec, b), "the frame cache holds it");
    assert!(!resolves(&rec, b_marker), "the record held its marker");

    // A new epoch empties the frame cache; a's record still holds the cache's old group, which
    // keeps every id the cache had, "b" included...
    record(&mut vm, &Keyed::new(&[3], &["c"], 8, 3));
    assert_eq!(
        names_of(&rec, &stack_a),
        ["a", "main", "(5 frames truncated)"]
    );
    assert!(resolves(&rec, b), "held by the retired group");
    // ...until the next sweep, where a's record takes its own references and the group goes.
    rec.commit(&mut vm).unwrap();
    rec.update(&mut vm, UpdateKind::Full).unwrap();
    assert!(!resolves(&rec, b), "no record uses it");
    assert_eq!(
        names_of(&rec, &stack_a),
        ["a", "main", "(5 frames truncated)"]
    );

    // a's record gives back its own references when it goes.
    let names: Vec<_> = stack_a.iter().map(|f| f.name).collect();
    let file = stack_a[0].filename;
    drop(stack_a);
    vm.kill(kept);
    vm.gc();
    rec.update(&mut vm, UpdateKind::Full).unwrap();
    rec.update(&mut vm, UpdateKind::Full).unwrap();
    let s = rec.stats().unwrap();
    assert_eq!(
        (
            s.num_object_records,
            s.num_heap_records,
            s.dormant_heap_records
        ),
        (1, 1, 0)
    );
    assert!(names.iter().all(|&id| !resolves(&rec, id)), "{names:?}");
    assert!(
        resolves(&rec, file),
        "the frame cache's \"c\" is in app.rb too"
    );
}
