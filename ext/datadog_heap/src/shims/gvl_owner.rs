//! Ruby < 3.3: whether the calling thread holds the GVL, asked from a signal handler.
//!
//! Before 3.3, `rb_postponed_job_register_one` from a thread that does not hold the GVL races
//! with the holder's `rb_postponed_job_flush` (the VM bumps the job index before it writes the
//! job, so the flush can run a stale job with stale data, or lose one; fixed in 3.3). The window
//! timer's signal can land in a thread blocked in a system call or waiting for the GVL, so its
//! handler registers the job only when the thread it interrupted is the GVL owner.
//!
//! The VM keeps the owner in a private field: `threads.gvl.owner` of the main Ractor on 3.0 and
//! 3.1, `threads.sched.running` on 3.2, a `rb_thread_t *` written whenever a thread takes or
//! gives up the GVL. No header says where it is, so `probe` finds it at load: the only word of
//! the Ractor's struct that holds the running thread's pointer both when the main thread runs and
//! when a thread it starts runs, and not the newest thread while that one sleeps. The timer
//! signals the owner itself: the kernel thread id the VM keeps in the owner's struct (`tid`, what
//! `Thread#native_thread_id` answers) is found the same way, the one 32-bit field holding the id
//! the struct says (`Thread#native_thread_id`) in the loading thread and its own id in a thread
//! the probe starts. In a child of fork the loading thread's struct still holds the parent's id,
//! so there its real id is kept apart (`after_fork`). Every read of a thread's struct stays
//! within the struct's size (`thread_struct_len`). Where the probe finds either not exactly
//! once (a layout we have not seen, such as 3.2's if it keeps the id behind a pointer: no machine
//! here runs 3.2), nothing asks for the owner, the handler is not installed, and the window timer
//! is a Ruby thread.

use std::ffi::c_void;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicUsize, Ordering};

use magnus::{prelude::*, rb_sys::AsRawValue, Error, RClass, Ruby, Value};
use rb_sys::VALUE;

/// Address of the owner word (0: not found).
static OWNER_WORD: AtomicUsize = AtomicUsize::new(0);
/// Offset of the kernel thread id in a thread's struct (valid once OWNER_WORD is set).
static TID_OFFSET: AtomicUsize = AtomicUsize::new(0);
/// In a forked child, the thread that forked (its struct) and its id in this process: Ruby
/// before 3.3 leaves the parent's id in that thread's struct (`Thread#native_thread_id` answers
/// the parent's too).
static FORKED_THREAD: AtomicUsize = AtomicUsize::new(0);
static FORKED_TID: AtomicI32 = AtomicI32::new(0);

/// The furthest into the Ractor's struct the probe looks: the owner word sits within its first
/// few hundred bytes on 3.0-3.2 (after the public part, the sync part and a few thread counts).
const SCAN_LIMIT: usize = 2048;

/// The struct behind a TypedData object (a Thread or a Ractor). Never raises or allocates, and
/// reads nothing but the object's header: async-signal-safe.
fn data_of(object: VALUE) -> usize {
    // SAFETY: callers pass a live TypedData object (a Thread or a Ractor); the read is one field
    // of its header.
    unsafe { rb_sys::macros::RTYPEDDATA_GET_DATA(object) as usize }
}

/// The running Ruby thread's `rb_thread_t *`. Needs a Ruby thread (any GVL state): it reads the
/// thread's execution context, a thread-local the VM sets up with the thread.
fn current_thread_struct() -> usize {
    // SAFETY: rb_thread_current reads the calling Ruby thread's execution context and returns
    // the thread object stored there; it allocates nothing and takes no lock.
    data_of(unsafe { rb_sys::rb_thread_current() })
}

/// 32-bit fields of `base` (the first `len` bytes) holding `value`, by offset.
fn int_offsets_holding(base: usize, len: usize, value: i32) -> Vec<usize> {
    (0..len / 4)
        .map(|i| i * 4)
        .filter(|&offset| {
            // SAFETY: `base .. base + len` lies inside a thread's struct: `len` is at most
            // `thread_struct_len` (see `probe`).
            unsafe { std::ptr::read_volatile((base + offset) as *const i32) == value }
        })
        .collect()
}

/// What `ObjectSpace.memsize_of` says of a thread, less what it counts outside the struct that
/// the probe can see: the thread's VM stack, counted while the thread has no root fiber (a
/// thread that never ran a Fiber: 1 MiB by default), and the object's own slot. A thread with
/// thread variables counts their table too, so this is an upper bound for such a thread and
/// exact for one that has none.
fn thread_struct_bound(thread: Value, vm_stack_bytes: usize, slot_bytes: usize) -> usize {
    let size = super::memsize_of(thread);
    let size = match vm_stack_bytes {
        stack if stack > 0 && size > stack => size - stack,
        _ => size,
    };
    size.saturating_sub(slot_bytes)
}

/// Words of `base` (the first `len` bytes) holding `value`, by offset.
fn offsets_holding(base: usize, len: usize, value: usize) -> Vec<usize> {
    (0..len / 8)
        .map(|i| i * 8)
        .filter(|&offset| {
            // SAFETY: `base .. base + len` lies inside the Ractor's struct (see `probe`).
            unsafe { std::ptr::read_volatile((base + offset) as *const usize) == value }
        })
        .collect()
}

struct ThreadCheck {
    base: usize,
    candidates: Vec<usize>,
    confirmed: Vec<usize>,
    /// What memsize counts of a thread beyond its struct (see `thread_struct_bound`).
    vm_stack_bytes: usize,
    slot_bytes: usize,
    /// How many bytes of a thread's struct the probe reads: the main and the calling thread's
    /// bound, then no more than the second thread's, which is exact (see `thread_struct_len`).
    thread_len: usize,
    /// Offsets in the second thread's struct holding its own kernel id.
    tid_here: Vec<usize>,
    checked: AtomicBool,
    /// Set by the probe once it has looked again from its own thread: the second thread may end.
    release: AtomicBool,
}

unsafe extern "C" fn in_second_thread(arg: *mut c_void) -> VALUE {
    // SAFETY: `arg` is the ThreadCheck on `probe`'s stack, which joins this thread before it
    // returns; the probe's thread touches nothing in it but `checked` until `checked` is set.
    let check = unsafe { &mut *(arg as *mut ThreadCheck) };
    let me = current_thread_struct();
    let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        // SAFETY: this thread's object, current and alive.
        let thread = unsafe {
            <Value as magnus::rb_sys::FromRawValue>::from_raw(rb_sys::rb_thread_current())
        };
        // Started a moment ago, with no thread variable and no fiber: its bound is exact.
        let own = thread_struct_bound(thread, check.vm_stack_bytes, check.slot_bytes);
        check.thread_len = check.thread_len.min(own);
        // A thread started in this process: its struct holds its own kernel id.
        check.tid_here = int_offsets_holding(me, check.thread_len, super::signal::current_tid());
        check.confirmed = (check.candidates.iter().copied())
            .filter(|&offset| {
                // SAFETY: a candidate offset lies inside the struct (see `probe`).
                unsafe { std::ptr::read_volatile((check.base + offset) as *const usize) == me }
            })
            .collect();
    }));
    check.checked.store(true, Ordering::Release);
    // SAFETY: as above; from here on the probe's thread writes `release` (an atomic) and nothing
    // else, so this thread only reads through a shared reference.
    let check = unsafe { &*(arg as *const ThreadCheck) };
    // Stays alive, asleep without the GVL a millisecond at a time, while the probe looks again
    // from its own thread, until it says so. A flag, not Thread#wakeup: a wake-up sent before
    // this thread fell asleep would be lost, and the probe's join would wait forever.
    while !check.release.load(Ordering::Acquire) {
        let slept = magnus::rb_sys::protect(|| {
            // SAFETY: a Ruby thread with the GVL, inside rb_protect, which catches the jump an
            // interrupt (an exception raised into this thread) would make.
            unsafe {
                rb_sys::rb_thread_wait_for(rb_sys::timeval {
                    tv_sec: 0,
                    tv_usec: 1000,
                })
            };
            rb_sys::Qnil as VALUE
        });
        if slept.is_err() {
            break;
        }
    }
    rb_sys::Qnil as VALUE
}

/// What the probe found (see `probe_report`).
static STRUCT_LEN: AtomicUsize = AtomicUsize::new(0);

/// What memsize counts of a thread beyond its struct, as (VM stack bytes, slot bytes), and a
/// first bound of a thread's struct from the main and the calling thread (every `rb_thread_t`
/// has the same size; a thread variable table makes either bound larger, never smaller). The
/// second thread, which has neither, lowers it to the exact size (`in_second_thread`). At most
/// `SCAN_LIMIT`.
fn thread_struct_len(ruby: &Ruby) -> Result<(usize, usize, usize), Error> {
    let vm: RClass = ruby.class_object().const_get("RubyVM")?;
    let params: magnus::RHash = vm.const_get("DEFAULT_PARAMS")?;
    let vm_stack_bytes: usize = params
        .lookup::<_, Option<usize>>(ruby.to_symbol("thread_vm_stack_size"))?
        .unwrap_or(0);
    // The slot an object takes in the heap, which memsize counts for every object.
    let slot_bytes = super::memsize_of(ruby.class_object().new_instance(())?);
    let thread_class: RClass = ruby.class_object().const_get("Thread")?;
    let main: Value = thread_class.funcall("main", ())?;
    // SAFETY: the calling thread's object, current and alive.
    let current =
        unsafe { <Value as magnus::rb_sys::FromRawValue>::from_raw(rb_sys::rb_thread_current()) };
    let len = [main, current]
        .into_iter()
        .map(|thread| thread_struct_bound(thread, vm_stack_bytes, slot_bytes))
        .min()
        .unwrap_or(0)
        .min(SCAN_LIMIT);
    Ok((vm_stack_bytes, slot_bytes, len))
}

/// The kernel id the calling thread's struct holds: `Thread#native_thread_id`, which reads it.
/// Before Ruby 3.3 a child of `fork` keeps the parent's id there (the thread that forked is not
/// told its new id), so this differs from `gettid()` in such a child.
fn struct_tid(ruby: &Ruby) -> Result<i32, Error> {
    let thread_class: RClass = ruby.class_object().const_get("Thread")?;
    let current: Value = thread_class.funcall("current", ())?;
    match current.respond_to("native_thread_id", false)? {
        true => Ok(current
            .funcall::<_, _, Option<i32>>("native_thread_id", ())?
            .unwrap_or(0)),
        false => Ok(super::signal::current_tid()),
    }
}

/// Finds the owner word (see the module docs): true when found. Needs the GVL, on the main
/// Ractor; starts and joins a Ruby thread, so call it at load, never from a job or the hook.
pub fn probe(ruby: &Ruby) -> Result<bool, Error> {
    let ractor_class: RClass = ruby.class_object().const_get("Ractor")?;
    let ractor: Value = ractor_class.funcall("current", ())?;
    if super::heap_type(ractor.as_raw()) != Some(rb_sys::ruby_value_type::RUBY_T_DATA) {
        return Ok(false);
    }
    let base = data_of(ractor.as_raw());
    // What memsize counts beyond the struct (the object's slot, the Ractor's message queues, a
    // few dozen bytes each while no message waits) is under 256 bytes, so the scan stays inside
    // the struct (752 bytes in all on 3.1).
    let len = super::memsize_of(ractor)
        .saturating_sub(256)
        .min(SCAN_LIMIT);
    if base == 0 || len < 64 {
        return Ok(false);
    }
    let main = current_thread_struct();
    // The id this thread's struct holds: ours, or in a child of fork before 3.3 the parent's.
    let own_tid = super::signal::current_tid();
    let held_tid = struct_tid(ruby)?;
    let (vm_stack_bytes, slot_bytes, thread_len) = thread_struct_len(ruby)?;
    // Every field is set before the second thread exists: it reads them while this thread
    // waits, and this thread reads what it wrote only once `checked` says it is done.
    let mut check = ThreadCheck {
        base,
        candidates: offsets_holding(base, len, main),
        confirmed: Vec::new(),
        vm_stack_bytes,
        slot_bytes,
        thread_len,
        tid_here: Vec::new(),
        checked: AtomicBool::new(false),
        release: AtomicBool::new(false),
    };
    if check.candidates.is_empty() {
        return Ok(false);
    }
    let check_ptr = &mut check as *mut ThreadCheck;
    // SAFETY: rb_thread_create copies the function and argument into a new Ruby thread; `check`
    // outlives it (joined below, before `check` goes out of scope), and this thread reads it
    // only through `check_ptr` from here on.
    let thread = magnus::rb_sys::protect(|| unsafe {
        rb_sys::rb_thread_create(Some(in_second_thread), check_ptr as *mut c_void)
    })?;
    // SAFETY: a thread object the VM just returned, kept on this stack while we use it.
    let thread = unsafe { <Value as magnus::rb_sys::FromRawValue>::from_raw(thread) };
    // SAFETY: `check_ptr` points at `check`, alive on this stack; `checked` is an atomic.
    let checked = || unsafe { (*check_ptr).checked.load(Ordering::Acquire) };
    // SAFETY: as above; `release` is an atomic.
    let release = || unsafe { (*check_ptr).release.store(true, Ordering::Release) };
    // Lets it run until it has looked; it then sleeps, alive, without the GVL.
    for _ in 0..100_000 {
        if checked() {
            break;
        }
        super::thread_schedule()?;
    }
    if !checked() {
        release();
        let _: Value = thread.funcall("join", ())?;
        return Ok(false);
    }
    // SAFETY: the second thread is done with `check` (`checked`, with Acquire, orders its writes
    // before these reads) and only sleeps now.
    let check = unsafe { &*check_ptr };
    let thread_len = check.thread_len;
    let tid_confirmed: Vec<usize> = int_offsets_holding(main, thread_len, held_tid)
        .into_iter()
        .filter(|offset| check.tid_here.contains(offset))
        .collect();
    // Back on this thread, the other one alive: the owner word holds this thread again, where a
    // word that names the newest thread (the tail of the Ractor's thread list) does not.
    let found: Vec<usize> = (check.confirmed.iter().copied())
        .filter(|&offset| offsets_holding(base + offset, 8, main) == [0])
        .collect();
    release();
    let _: Value = thread.funcall("join", ())?;
    STRUCT_LEN.store(thread_len, Ordering::Relaxed);
    if let ([offset], [tid_offset]) = (&found[..], &tid_confirmed[..]) {
        TID_OFFSET.store(*tid_offset, Ordering::Relaxed);
        if held_tid != own_tid {
            // First loaded in a child of fork (no fork hook of ours ran): this thread's struct
            // names the parent's thread, so its id comes from here, as after a fork we saw.
            after_fork();
        }
        OWNER_WORD.store(base + offset, Ordering::Release);
        return Ok(true);
    }
    Ok(false)
}

/// For the specs: [owner word found, offset of the id in a thread's struct, bytes of a thread's
/// struct the probe read, whether this process's thread that forked has its id kept here].
pub fn probe_report() -> (bool, usize, usize, bool) {
    (
        gvl_owner_known(),
        TID_OFFSET.load(Ordering::Relaxed),
        STRUCT_LEN.load(Ordering::Relaxed),
        FORKED_THREAD.load(Ordering::Acquire) != 0,
    )
}

/// Whether the owner word was found at load.
pub fn gvl_owner_known() -> bool {
    OWNER_WORD.load(Ordering::Acquire) != 0
}

/// The GVL owner's `rb_thread_t *` as the VM last wrote it (0: none, or not known). A racy read
/// of one word the VM writes under its GVL lock: async-signal-safe, never blocks.
pub fn gvl_owner() -> usize {
    match OWNER_WORD.load(Ordering::Acquire) {
        0 => 0,
        // SAFETY: the address of a word inside the main Ractor's struct, which lives as long as
        // the process (found by `probe`).
        word => unsafe { std::ptr::read_volatile(word as *const usize) },
    }
}

/// Whether the calling Ruby thread holds the GVL now. Async-signal-safe; the caller must be a
/// Ruby thread (`signal::on_ruby_thread`). False when the owner word is not known.
pub fn holds_gvl() -> bool {
    let owner = gvl_owner();
    owner != 0 && owner == current_thread_struct()
}

/// The kernel thread id of the GVL owner, 0 when no thread holds the GVL (or the owner word is
/// not known). From any thread, without the GVL: two racy reads, the owner word, then the id in
/// the owner's struct. The struct cannot be freed between them: a thread's struct goes with its
/// Thread object, at a GC after the thread ended, and a thread gives up the GVL (clearing the
/// owner word) before it ends; at worst the id read is that of a thread that just gave the GVL
/// up, and a signal to it asks for nothing (`holds_gvl`).
pub fn gvl_owner_tid() -> i32 {
    match gvl_owner() {
        0 => 0,
        owner if owner == FORKED_THREAD.load(Ordering::Acquire) => {
            FORKED_TID.load(Ordering::Relaxed)
        }
        // SAFETY: a live thread struct (see above), in which the probe found the id's offset.
        owner => unsafe {
            std::ptr::read_volatile((owner + TID_OFFSET.load(Ordering::Relaxed)) as *const i32)
        },
    }
}

/// In a forked child, on the thread that forked (the only one): remembers its id here, which its
/// struct does not say (see `FORKED_THREAD`). Needs a Ruby thread.
pub fn after_fork() {
    FORKED_TID.store(super::signal::current_tid(), Ordering::Relaxed);
    FORKED_THREAD.store(current_thread_struct(), Ordering::Release);
}
