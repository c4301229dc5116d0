//! The recorder's bookkeeping against a fake VM (thread-local) and a counting string table.

use std::cell::{Cell, RefCell};
use std::collections::{HashMap, HashSet};
use std::ffi::c_void;

use crate::heap_recorder_port::{
    Failure, HeapRecorder, Outcome, StringTable, MAX_PENDING_RECORDINGS,
};
use crate::types::*;

thread_local! {
    static GC: Cell<usize> = const { Cell::new(0) };
    static ALIVE: RefCell<HashSet<i64>> = RefCell::new(HashSet::new());
}

extern "C" fn gc_count() -> usize {
    GC.with(|g| g.get())
}
extern "C" fn now_ns() -> i64 {
    0
}
/// The object "VALUE" is its id; ids above 1<<62 play bignums.
extern "C" fn obj_id(_ctx: *mut c_void, obj: usize, out: *mut i64) -> i32 {
    if obj > 1 << 62 {
        return -1;
    }
    // SAFETY: the recorder passes a pointer to a local i64.
    unsafe { *out = obj as i64 };
    0
}
extern "C" fn lookup(
    _ctx: *mut c_void,
    id: i64,
    measure: bool,
    size: *mut usize,
    frozen: *mut bool,
) -> i32 {
    if ALIVE.with(|a| a.borrow().contains(&id)) {
        if measure {
            // SAFETY: the recorder passes pointers to locals.
            unsafe {
                *size = 40;
                *frozen = false;
            }
        }
        LOOKUP_ALIVE
    } else {
        LOOKUP_DEAD
    }
}
extern "C" fn thread_schedule() -> i32 {
    0
}

fn host() -> DdheapHost {
    DdheapHost {
        gc_count,
        now_ns,
        obj_id,
        lookup,
        thread_schedule,
        is_internal: None,
        ctx: std::ptr::null_mut(),
    }
}

/// Interns by content and counts references, like ManagedStringStorage.
#[derive(Default)]
struct Counting {
    ids: RefCell<HashMap<Vec<u8>, (u32, u32)>>,
}

impl Counting {
    fn live(&self) -> usize {
        self.ids.borrow().values().filter(|(_, n)| *n > 0).count()
    }
}

impl StringTable for Counting {
    fn intern(&self, s: CharSlice) -> Outcome<ManagedStringId> {
        // SAFETY: tests pass static strings.
        let b = unsafe { s.bytes() }.to_vec();
        if b.is_empty() {
            return Ok(ManagedStringId::default());
        }
        let mut ids = self.ids.borrow_mut();
        let next = ids.len() as u32 + 1;
        let e = ids.entry(b).or_insert((next, 0));
        e.1 += 1;
        Ok(ManagedStringId { value: e.0 })
    }
    fn intern_all(&self, s: &[CharSlice], out: &mut [ManagedStringId]) -> Outcome<()> {
        for (i, o) in s.iter().zip(out.iter_mut()) {
            *o = self.intern(*i)?;
        }
        Ok(())
    }
    fn unintern_all(&self, ids: &[ManagedStringId]) -> Outcome<()> {
        let mut map = self.ids.borrow_mut();
        for id in ids.iter().filter(|i| i.value != 0) {
            let e = map.values_mut().find(|(v, _)| *v == id.value);
            match e {
                Some(e) if e.1 > 0 => e.1 -= 1,
                _ => return Err(Failure::Runtime(format!("unknown id {}", id.value))),
            }
        }
        Ok(())
    }
}

fn cs(s: &'static str) -> CharSlice {
    CharSlice {
        ptr: s.as_ptr().cast(),
        len: s.len(),
    }
}

fn loc(name: &'static str, file: &'static str, line: i64) -> Location {
    let mut l = Location::by_ids(ManagedStringId::default(), ManagedStringId::default(), 0);
    l.function.name = cs(name);
    l.function.filename = cs(file);
    l.line = line;
    l
}

fn record(r: &HeapRecorder<Counting>, obj: usize, stack: &[Location]) {
    r.start_recording(obj, 1, cs("String"));
    r.end_recording(stack).unwrap();
}

fn live(r: &HeapRecorder<Counting>) -> Vec<(u32, usize, i64)> {
    r.prepare_iteration().unwrap();
    let mut out = Vec::new();
    // SAFETY: between prepare and finish, one thread.
    assert!(unsafe {
        r.for_each_live_object(|d| {
            // Inside the outer unsafe block: the recorder hands `len` locations valid during the callback.
            let l = std::slice::from_raw_parts(d.locations.ptr, d.locations.len);
            out.push((d.object_data.weight, d.object_data.size, l[0].line));
            true
        })
    });
    r.finish_iteration().unwrap();
    out.sort();
    out
}

#[test]
fn records_dedups_ages_and_drops_dead_objects() {
    GC.with(|g| g.set(10));
    ALIVE.with(|a| a.borrow_mut().extend([1, 2, 3]));
    let r = HeapRecorder::new(host(), Counting::default());
    let stack = [loc("foo", "a.rb", 1), loc("main", "a.rb", 9)];
    assert!(
        r.start_recording(1, 1, cs("String")),
        "first pending asks for after_allocation"
    );
    r.end_recording(&stack).unwrap();
    record(&r, 2, &stack);
    record(&r, 3, &[loc("bar", "b.rb", 2)]);
    let s = r.state_snapshot();
    assert_eq!(
        (
            s.pending_recordings_count,
            s.num_heap_records,
            s.num_object_records
        ),
        (3, 2, 0)
    );
    r.finalize_pending_recordings().unwrap();
    assert!(r.is_object_recorded(2));
    assert_eq!(r.state_snapshot().num_object_records, 3);
    // Same GC generation: age 0, nothing iterated.
    assert!(live(&r).is_empty());
    GC.with(|g| g.set(11));
    ALIVE.with(|a| a.borrow_mut().remove(&3));
    assert_eq!(live(&r), vec![(1, 40, 1), (1, 40, 1)]);
    let s = r.state_snapshot();
    assert_eq!((s.num_object_records, s.num_heap_records), (2, 1));
    assert_eq!(
        (s.last_update.objects_alive, s.last_update.objects_dead),
        (2, 1)
    );
    // foo, a.rb, main + one String per live object.
    assert_eq!(r.strings().live(), 4);
    ALIVE.with(|a| a.borrow_mut().clear());
    assert!(live(&r).is_empty());
    assert_eq!(
        r.strings().live(),
        0,
        "every id uninterned once its objects died"
    );
}

#[test]
fn sample_rate_skips_and_weights() {
    GC.with(|g| g.set(0));
    let r = HeapRecorder::new(host(), Counting::default());
    assert!(matches!(r.set_sample_rate(0), Err(Failure::Argument(_))));
    r.set_sample_rate(3).unwrap();
    for obj in 100..106 {
        record(&r, obj, &[loc("x", "x.rb", 1)]);
    }
    r.finalize_pending_recordings().unwrap();
    assert_eq!(r.state_snapshot().num_object_records, 2);
    ALIVE.with(|a| a.borrow_mut().extend(100..106));
    GC.with(|g| g.set(1));
    assert!(live(&r).iter().all(|(w, _, _)| *w == 3));
}

#[test]
fn end_without_start_fails_and_pending_queue_is_bounded() {
    let r = HeapRecorder::new(host(), Counting::default());
    assert!(matches!(r.end_recording(&[]), Err(Failure::Runtime(_))));
    for obj in 0..MAX_PENDING_RECORDINGS + 5 {
        record(&r, 1000 + obj, &[loc("x", "x.rb", 1)]);
    }
    let s = r.state_snapshot();
    assert_eq!(s.pending_recordings_count, MAX_PENDING_RECORDINGS);
    assert_eq!(s.lifetime.deferred_recordings_skipped_buffer_full, 5);
    let mut marked = 0;
    r.for_each_pending_object(|_| marked += 1);
    assert_eq!(marked, MAX_PENDING_RECORDINGS);
}

#[test]
fn iteration_protocol_errors_like_the_reference() {
    let r = HeapRecorder::new(host(), Counting::default());
    assert!(matches!(r.finish_iteration(), Err(Failure::Runtime(_))));
    // SAFETY: single thread.
    assert!(
        !unsafe { r.for_each_live_object(|_| true) },
        "no iteration prepared"
    );
    r.prepare_iteration().unwrap();
    assert!(matches!(r.prepare_iteration(), Err(Failure::Runtime(_))));
    r.finish_iteration().unwrap();
}

#[test]
fn bignum_ids_and_duplicates_fail_without_leaking() {
    let r = HeapRecorder::new(host(), Counting::default());
    record(&r, (1 << 62) + 1, &[loc("x", "x.rb", 1)]);
    assert!(matches!(
        r.finalize_pending_recordings(),
        Err(Failure::Runtime(_))
    ));
    record(&r, 7, &[loc("x", "x.rb", 1)]);
    record(&r, 7, &[loc("x", "x.rb", 1)]);
    assert!(matches!(
        r.finalize_pending_recordings(),
        Err(Failure::Runtime(_))
    ));
    let s = r.state_snapshot();
    assert_eq!((s.num_object_records, s.num_heap_records), (1, 1));
}

#[test]
fn layouts_match_libdatadog_v40_and_heap_recorder_h() {
    use std::mem::size_of;
    assert_eq!(size_of::<Location>(), 160);
    assert_eq!(size_of::<LiveObjectData>(), 48);
    assert_eq!(size_of::<IterationData>(), 64);
}

thread_local! {
    /// The recorder whose pending queue `obj_id_after_gc` marks, as the shim's mark function does.
    static MARKING: Cell<*const HeapRecorder<Counting>> = const { Cell::new(std::ptr::null()) };
    /// Objects asked for an id while the mark function did not see them.
    static UNMARKED: RefCell<Vec<usize>> = const { RefCell::new(Vec::new()) };
}

/// `rb_obj_id` as it behaves when it allocates and a GC runs inside it: the mark function walks
/// the pending objects, and an object it does not reach would be freed before its id is read.
extern "C" fn obj_id_after_gc(ctx: *mut c_void, obj: usize, out: *mut i64) -> i32 {
    let recorder = MARKING.with(|m| m.get());
    let mut marked = Vec::new();
    // SAFETY: the test points MARKING at a recorder that outlives the finalize call, on this thread.
    unsafe { &*recorder }.for_each_pending_object(|o| marked.push(o));
    if !marked.contains(&obj) {
        UNMARKED.with(|u| u.borrow_mut().push(obj));
    }
    obj_id(ctx, obj, out)
}

#[test]
fn pending_objects_stay_marked_while_their_ids_are_taken() {
    GC.with(|g| g.set(0));
    let r = HeapRecorder::new(
        DdheapHost {
            obj_id: obj_id_after_gc,
            ..host()
        },
        Counting::default(),
    );
    MARKING.with(|m| m.set(&r));
    for obj in 200..210 {
        record(&r, obj, &[loc("x", "x.rb", 1)]);
    }
    r.finalize_pending_recordings().unwrap();
    MARKING.with(|m| m.set(std::ptr::null()));
    assert_eq!(UNMARKED.with(|u| u.borrow().clone()), Vec::<usize>::new());
    let s = r.state_snapshot();
    assert_eq!((s.num_object_records, s.pending_recordings_count), (10, 0));
    assert_eq!(s.lifetime.deferred_recordings_finalized, 10);
}

/// Objects 1000..2000 play VM-internal ones.
extern "C" fn internal_range(obj: usize) -> bool {
    (1000..2000).contains(&obj)
}

#[test]
fn internal_objects_are_never_tracked_and_keep_the_sample_rate_count() {
    let r = HeapRecorder::new(
        DdheapHost {
            is_internal: Some(internal_range),
            ..host()
        },
        Counting::default(),
    );
    r.set_sample_rate(2).unwrap();
    // 1: skipped by the rate. 1001: picked by the rate but internal, so skipped without asking
    // for a commit, and the count is not reset: 3, the next sample, is tracked, not skipped.
    assert!(!r.start_recording(1, 1, cs("String")));
    r.end_recording(&[loc("a", "a.rb", 1)]).unwrap();
    assert!(!r.start_recording(1001, 1, cs("Internal")));
    r.end_recording(&[loc("a", "a.rb", 2)]).unwrap();
    assert!(r.start_recording(3, 1, cs("String")));
    r.end_recording(&[loc("a", "a.rb", 3)]).unwrap();
    assert_eq!(r.state_snapshot().pending_recordings_count, 1);
    r.finalize_pending_recordings().unwrap();
    assert!(r.is_object_recorded(3));
    assert!(!r.is_object_recorded(1001) && !r.is_object_recorded(1));
    // Without the callback (datadog 2.41) the same object is tracked.
    let all = HeapRecorder::new(host(), Counting::default());
    record(&all, 1001, &[loc("a", "a.rb", 2)]);
    all.finalize_pending_recordings().unwrap();
    assert!(all.is_object_recorded(1001));
}

/// Record ids as the 2.42 shim gives them: a counter behind `ctx`, not the object.
extern "C" fn next_record_id(ctx: *mut c_void, _obj: usize, out: *mut i64) -> i32 {
    // SAFETY: the test passes a pointer to its own i64 counter as ctx; out is the recorder's local.
    unsafe {
        *ctx.cast::<i64>() += 1;
        *out = *ctx.cast::<i64>();
    }
    0
}

#[test]
fn ids_come_from_the_host_with_its_context() {
    let mut counter = 40i64;
    let r = HeapRecorder::new(
        DdheapHost {
            obj_id: next_record_id,
            ctx: (&mut counter as *mut i64).cast(),
            ..host()
        },
        Counting::default(),
    );
    for obj in [7, 8, 9] {
        record(&r, obj, &[loc("x", "x.rb", 1)]);
    }
    r.finalize_pending_recordings().unwrap();
    let recorded: Vec<bool> = (40..=44).map(|id| r.is_object_recorded(id)).collect();
    assert_eq!(recorded, [false, true, true, true, false]);
    assert!(!r.is_object_recorded(7));
    drop(r);
    assert_eq!(counter, 43);
}

thread_local! {
    /// The recorder `obj_id_letting_a_thread_in` calls back into, as another Ruby thread would.
    static REENTER: Cell<*const HeapRecorder<Counting>> = const { Cell::new(std::ptr::null()) };
    /// The shim's weak map as `obj_id_letting_a_thread_in` fills it: record id => object.
    static WEAK_MAP: RefCell<HashMap<i64, usize>> = RefCell::new(HashMap::new());
}

/// The 2.42 shim's `obj_id`: a fresh record id and a weak map entry for it. The first call lets
/// "another thread" in (the weak map call may switch threads), which finalizes the queue too.
extern "C" fn obj_id_letting_a_thread_in(_ctx: *mut c_void, obj: usize, out: *mut i64) -> i32 {
    let id = WEAK_MAP.with(|m| {
        let mut m = m.borrow_mut();
        let id = m.len() as i64 + 1;
        m.insert(id, obj);
        id
    });
    // SAFETY: out is the recorder's local.
    unsafe { *out = id };
    let recorder = REENTER.with(|r| r.replace(std::ptr::null()));
    if !recorder.is_null() {
        // SAFETY: the test points REENTER at a recorder that outlives the finalize call, on this
        // thread; it is taken out first, so this runs once.
        unsafe { &*recorder }.finalize_pending_recordings().unwrap();
    }
    0
}

#[test]
fn a_finalize_that_another_thread_interrupts_leaves_no_weak_map_entry_behind() {
    let r = HeapRecorder::new(
        DdheapHost {
            obj_id: obj_id_letting_a_thread_in,
            ..host()
        },
        Counting::default(),
    );
    for obj in [70, 71, 72] {
        record(&r, obj, &[loc("x", "x.rb", 1)]);
    }
    REENTER.with(|p| p.set(&r));
    r.finalize_pending_recordings().unwrap();
    let s = r.state_snapshot();
    assert_eq!((s.num_object_records, s.pending_recordings_count), (3, 0));
    assert_eq!(s.lifetime.deferred_recordings_finalized, 3);
    // One entry per object, each the id of an object record. Before recordings were claimed, the
    // interrupting call took 70's id again and the interrupted one dropped its own: 4 entries, one
    // orphaned.
    let map = WEAK_MAP.with(|m| m.borrow().clone());
    let mut objects: Vec<usize> = map.values().copied().collect();
    objects.sort();
    assert_eq!(objects, [70, 71, 72]);
    for id in map.keys() {
        assert!(
            r.is_object_recorded(*id),
            "weak map entry {id} has no object record"
        );
    }
}

thread_local! {
    /// The recorder `obj_id_then_fork` forks, and what the child's finalize left pending.
    static FORKING: Cell<*const HeapRecorder<Counting>> = const { Cell::new(std::ptr::null()) };
    static CHILD_PENDING: Cell<Option<usize>> = const { Cell::new(None) };
}

/// Acts out a fork by another thread while this finalize call takes an id: what runs after
/// `after_fork` here is the child, where the thread that claimed the recording does not exist.
extern "C" fn obj_id_then_fork(ctx: *mut c_void, obj: usize, out: *mut i64) -> i32 {
    let recorder = FORKING.with(|r| r.replace(std::ptr::null()));
    if !recorder.is_null() {
        // SAFETY: the test points FORKING at a recorder that outlives the finalize call, on this
        // thread; it is taken out first, so this runs once.
        let child = unsafe { &*recorder };
        child.after_fork();
        child.finalize_pending_recordings().unwrap();
        let pending = child.state_snapshot().pending_recordings_count;
        CHILD_PENDING.with(|c| c.set(Some(pending)));
    }
    obj_id(ctx, obj, out)
}

#[test]
fn a_fork_releases_the_claims_of_finalize_calls_the_child_does_not_have() {
    let r = HeapRecorder::new(
        DdheapHost {
            obj_id: obj_id_then_fork,
            ..host()
        },
        Counting::default(),
    );
    record(&r, 80, &[loc("x", "x.rb", 1)]);
    FORKING.with(|p| p.set(&r));
    r.finalize_pending_recordings().unwrap();
    // The child's first finalize commits the recording the parent's thread had claimed.
    assert_eq!(CHILD_PENDING.with(Cell::get), Some(0));
    assert!(r.is_object_recorded(80));
}
