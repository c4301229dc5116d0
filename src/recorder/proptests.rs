//! Random sequences of operations against a simple model of what must be tracked.

use std::collections::{HashMap, HashSet};

use proptest::prelude::*;

use super::*;
use crate::fake_vm::FakeVm;
use crate::stacks::frame::{refs_of, Frame, NamedFrame};

const SITES: [&str; 4] = ["alpha", "beta", "gamma", "delta"];
const CLASSES: [Option<&str>; 3] = [Some("String"), Some("Array"), None];

#[derive(Debug, Clone)]
enum Op {
    Record {
        site: usize,
        depth: usize,
        class: usize,
    },
    Commit,
    Kill(usize),
    Gc,
    YoungUpdate,
    FullUpdate,
    Iterate,
    Fork,
    FailNextCommit,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (0..SITES.len(), 1..4usize, 0..CLASSES.len())
            .prop_map(|(site, depth, class)| Op::Record { site, depth, class }),
        3 => Just(Op::Commit),
        4 => any::<usize>().prop_map(Op::Kill),
        2 => Just(Op::Gc),
        2 => Just(Op::YoungUpdate),
        2 => Just(Op::FullUpdate),
        1 => Just(Op::Iterate),
        1 => Just(Op::Fork),
        1 => Just(Op::FailNextCommit),
    ]
}

fn stack_for(site: usize, depth: usize) -> Vec<NamedFrame<'static>> {
    (0..depth)
        .map(|i| NamedFrame {
            name: SITES[(site + i) % SITES.len()],
            filename: if i == 0 { "site.rb" } else { "caller.rb" },
            line: i as i32,
        })
        .collect()
}

/// Checks every invariant that must hold between operations.
fn check(
    rec: &HeapRecorder,
    vm: &FakeVm,
    model_tracked: &HashSet<ObjectRef>,
    seen_ids: &HashSet<u32>,
) {
    let state = rec.state().unwrap();

    // Each object the model says is tracked is exactly one pending or committed record.
    let mut tracked: Vec<ObjectRef> = rec.pending().unwrap().iter().map(|p| p.object).collect();
    tracked.extend(state.object_records.keys().map(|id| vm.table[id]));
    let tracked_set: HashSet<_> = tracked.iter().copied().collect();
    assert_eq!(tracked.len(), tracked_set.len(), "an object tracked twice");
    assert_eq!(&tracked_set, model_tracked);

    // Heap record counts equal the records pointing at them.
    let mut claims: HashMap<&[Frame], u32> = HashMap::new();
    let pending = rec.pending().unwrap();
    let stacks = pending.iter().map(|p| (&p.stack, p.data.class)).chain(
        state
            .object_records
            .values()
            .map(|r| (&r.stack, r.data.class)),
    );
    // Dormant records keep their ids until a sweep gives them back.
    let mut live_ids: HashSet<u32> = (state.heap_records.iter_all())
        .flat_map(|(s, _)| s.iter().flat_map(|f| [f.name, f.filename]))
        .collect();
    live_ids.extend(rec.caches().unwrap().class_ids());
    let mut class_refs = 0;
    for (stack, class) in stacks {
        *claims.entry(&**stack).or_default() += 1;
        live_ids.extend(stack.iter().flat_map(|f| [f.name, f.filename]));
        if class != 0 {
            live_ids.insert(class);
            class_refs += 1;
        }
    }
    assert_eq!(state.heap_records.len(), claims.len());
    for (stack, count) in state.heap_records.iter() {
        assert_eq!(claims.get(&**stack), Some(&count));
    }

    // The storage holds exactly what live records reference.
    let expected_refs: u64 = state
        .heap_records
        .iter_all()
        .map(|(s, _)| refs_of(s))
        .sum::<u64>()
        + class_refs;
    assert_eq!(state.class_refs + state.heap_records.refs(), expected_refs);
    for id in seen_ids.iter().filter(|&&id| id != 0) {
        assert_eq!(
            rec.strings().get(*id).is_ok(),
            live_ids.contains(id),
            "string id {id} interned state disagrees with the records"
        );
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn recorder_matches_model(ops in prop::collection::vec(op(), 1..120)) {
        let rec = HeapRecorder::default();
        let mut vm = FakeVm::new();
        // The model: pending objects in push order, committed objects with their alloc gen.
        let mut pending: Vec<ObjectRef> = vec![];
        let mut committed: HashMap<ObjectRef, u64> = HashMap::new();
        let mut all_objects: Vec<ObjectRef> = vec![];
        let mut seen_ids: HashSet<u32> = HashSet::new();
        let mut alloc_gen: HashMap<ObjectRef, u64> = HashMap::new();

        for op in ops {
            match op {
                Op::Record { site, depth, class } => {
                    let obj = vm.alloc(8 * (site + 1));
                    all_objects.push(obj);
                    alloc_gen.insert(obj, vm.gc);
                    let r = rec.record_allocation(obj, 1, CLASSES[class], &stack_for(site, depth), vm.gc).unwrap();
                    if pending.len() < MAX_PENDING_RECORDINGS {
                        prop_assert_eq!(r.outcome, RecordOutcome::Pending);
                        pending.push(obj);
                        let queue = rec.pending().unwrap();
                        let p = queue.last().unwrap();
                        seen_ids.extend(p.stack.iter().flat_map(|f| [f.name, f.filename]));
                        seen_ids.insert(p.data.class);
                    } else {
                        prop_assert_eq!(r.outcome, RecordOutcome::SkippedBufferFull);
                    }
                }
                Op::Commit => {
                    prop_assert_eq!(rec.commit(&mut vm).unwrap(), CommitOutcome::Committed(pending.len()));
                    committed.extend(pending.drain(..).map(|o| (o, alloc_gen[&o])));
                }
                Op::FailNextCommit => {
                    vm.fail_remember_after = Some(1);
                    let result = rec.commit(&mut vm);
                    vm.fail_remember_after = None;
                    // The newest entry commits, then the write for the next one fails.
                    prop_assert_eq!(result.is_err(), pending.len() > 1);
                    if let Some(o) = pending.pop() {
                        committed.insert(o, alloc_gen[&o]);
                    }
                    if result.is_ok() {
                        committed.extend(pending.drain(..).map(|o| (o, alloc_gen[&o])));
                    }
                }
                Op::Kill(i) => {
                    if !all_objects.is_empty() {
                        vm.kill(all_objects[i % all_objects.len()]);
                    }
                }
                Op::Gc => vm.gc(),
                Op::YoungUpdate | Op::FullUpdate | Op::Iterate => {
                    let full = !matches!(op, Op::YoungUpdate);
                    let ran = if let Op::Iterate = op {
                        let snap = rec.prepare_iteration(&mut vm).unwrap();
                        let mut yielded = 0;
                        snap.for_each_live(|o| {
                            assert!(o.data.gen_age >= 1);
                            yielded += 1;
                            true
                        });
                        let expected = committed.iter().filter(|(o, g)| vm.objects[*o].alive && vm.gc > **g).count();
                        prop_assert_eq!(yielded, expected);
                        rec.finish_iteration().unwrap();
                        true
                    } else {
                        let kind = if full { UpdateKind::Full } else { UpdateKind::Young };
                        matches!(rec.update(&mut vm, kind).unwrap(), UpdateOutcome::Done(_))
                    };
                    if ran {
                        let gen = vm.gc;
                        let objects = &vm.objects;
                        committed.retain(|o, g| {
                            let age = gen.saturating_sub(*g);
                            let visited = age >= 1 && (full || age < 3);
                            !visited || objects[o].alive
                        });
                    }
                }
                Op::Fork => rec.after_fork().unwrap(),
            }
            let model: HashSet<ObjectRef> = pending.iter().chain(committed.keys()).copied().collect();
            check(&rec, &vm, &model, &seen_ids);
        }

        // Finally everything dies: a commit and a full update after a GC leave nothing behind.
        everything_dies(&rec, &mut vm, &all_objects, &seen_ids)?;
    }
}

/// Kills every object, commits and runs a full update after a GC; checks that no record, stack or
/// string reference is left, and that every string id ever used is gone from the storage.
pub(super) fn everything_dies(
    rec: &HeapRecorder,
    vm: &mut FakeVm,
    objects: &[ObjectRef],
    seen_ids: &HashSet<u32>,
) -> Result<(), TestCaseError> {
    rec.commit(vm).unwrap();
    objects.iter().for_each(|&o| vm.kill(o));
    vm.gc();
    rec.update(vm, UpdateKind::Full).unwrap();
    // The stacks are dormant now; the next full update finds them unused since and gives back
    // their ids.
    let s = rec.stats().unwrap();
    prop_assert_eq!((s.num_object_records, s.num_heap_records), (0, 0));
    rec.update(vm, UpdateKind::Full).unwrap();
    let s = rec.stats().unwrap();
    prop_assert_eq!(
        (s.num_heap_records, s.dormant_heap_records, s.string_refs),
        (0, 0, 0)
    );
    // The caches (class names, frames) hold theirs until cleared.
    rec.clear_stack_cache();
    for id in seen_ids.iter().filter(|&&id| id != 0) {
        prop_assert!(rec.strings().get(*id).is_err());
    }
    Ok(())
}
