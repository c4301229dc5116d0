//! The GC: marking, pausing, counters, object sizes.

use magnus::{rb_sys::AsRawValue, Value};
use rb_sys::{ruby_value_type as T, VALUE};

use super::heap_type;

extern "C" {
    // Exported by libruby (gc.c) but not declared in its public headers. Returns the bytes an
    // object uses, slot included; must only see the types `memsize_of` lets through.
    fn rb_obj_memsize_of(obj: VALUE) -> usize;
}

/// Marks (and pins) `value` during a GC mark phase. Never allocates or raises.
pub fn gc_mark(value: VALUE) {
    if value == 0 {
        return;
    }
    // SAFETY: called from a mark function, during marking, with a VALUE this extension keeps
    // alive (so it names a live object or an immediate).
    unsafe { rb_sys::rb_gc_mark(value) };
}

/// Keeps the GC from running while it lives (`GC.disable`, which first finishes a lazy sweep),
/// and lets it run again when dropped unless it was disabled before. Needs the GVL; never raises
/// or allocates.
pub struct GcPause {
    was_disabled: bool,
}

impl GcPause {
    pub fn new() -> Self {
        // SAFETY: GVL held per the contract; flips a flag (after finishing a sweep in progress).
        let before = unsafe { rb_sys::rb_gc_disable() };
        GcPause {
            was_disabled: before == rb_sys::Qtrue as VALUE,
        }
    }
}

impl Drop for GcPause {
    fn drop(&mut self) {
        if !self.was_disabled {
            // SAFETY: GVL held (the pause never leaves the thread that made it); flips a flag.
            unsafe { rb_sys::rb_gc_enable() };
        }
    }
}

/// Number of GCs so far. Needs the GVL; never raises or allocates.
pub fn gc_count() -> u64 {
    // SAFETY: reads a counter; safe from any thread holding the GVL, including inside hooks.
    unsafe { rb_sys::rb_gc_count() as u64 }
}

/// Types whose size `rb_obj_memsize_of` can report; the rest (internal VM objects, freed or
/// moved slots) are known to trip it up and report 0.
fn memsize_supported(t: T) -> bool {
    matches!(
        t,
        T::RUBY_T_OBJECT
            | T::RUBY_T_CLASS
            | T::RUBY_T_MODULE
            | T::RUBY_T_FLOAT
            | T::RUBY_T_STRING
            | T::RUBY_T_REGEXP
            | T::RUBY_T_ARRAY
            | T::RUBY_T_HASH
            | T::RUBY_T_STRUCT
            | T::RUBY_T_BIGNUM
            | T::RUBY_T_FILE
            | T::RUBY_T_DATA
            | T::RUBY_T_MATCH
            | T::RUBY_T_COMPLEX
            | T::RUBY_T_RATIONAL
            | T::RUBY_T_SYMBOL
    )
}

/// Bytes used by `object` as `ObjectSpace.memsize_of` counts them (0 for immediates and
/// internal objects). Needs the GVL. For T_DATA it runs the extension's own size function.
pub fn memsize_of(object: Value) -> usize {
    let raw = object.as_raw();
    match heap_type(raw) {
        // SAFETY: a live user-visible heap object of a type rb_obj_memsize_of handles.
        Some(t) if memsize_supported(t) => unsafe { rb_obj_memsize_of(raw) },
        _ => 0,
    }
}

/// `:total_allocated_objects`, a static Symbol (never collected), made by `init_gc_stat`.
static TOTAL_ALLOCATED_KEY: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Makes the GC.stat key `total_allocated_objects` reads, and asks for it once, so that the VM's
/// own GC.stat symbol table exists before the hook reads the counter (its first use interns
/// symbols). Needs the GVL; call once at load.
pub fn init_gc_stat() {
    let name = c"total_allocated_objects";
    // SAFETY: GVL held; `name` is a NUL-terminated literal. rb_intern interns (allocating at most
    // once per name) and raises nothing for a valid name; the ID of a literal name is static.
    let id = unsafe { rb_sys::rb_intern(name.as_ptr()) };
    // SAFETY: a static Symbol for a valid ID; allocates nothing.
    let key = unsafe { rb_sys::rb_id2sym(id) };
    TOTAL_ALLOCATED_KEY.store(key as u64, std::sync::atomic::Ordering::Relaxed);
    let _ = total_allocated_objects();
    init_total_moved_key();
}

/// Objects the VM has allocated since it started (`GC.stat(:total_allocated_objects)`). Needs
/// the GVL; after `init_gc_stat` it allocates nothing and never raises (a known key), so the
/// NEWOBJ hook may call it.
pub fn total_allocated_objects() -> u64 {
    let key = TOTAL_ALLOCATED_KEY.load(std::sync::atomic::Ordering::Relaxed) as VALUE;
    if key == 0 {
        return 0;
    }
    // SAFETY: GVL held per the contract; `key` is a Symbol rb_gc_stat knows in every Ruby we
    // support, for which it returns the counter without allocating or raising.
    unsafe { rb_sys::rb_gc_stat(key) as u64 }
}

/// `:total_moved_objects`, a static Symbol, set by `init_gc_stat` only when this Ruby's
/// `GC.stat` knows the key (0 otherwise: `rb_gc_stat` raises for an unknown key).
static TOTAL_MOVED_KEY: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Makes the `total_moved_objects` key and checks, under rb_protect, that `rb_gc_stat` answers
/// it. Needs the GVL; called once at load by `init_gc_stat`.
fn init_total_moved_key() {
    let name = c"total_moved_objects";
    // SAFETY: as in `init_gc_stat`.
    let id = unsafe { rb_sys::rb_intern(name.as_ptr()) };
    // SAFETY: a static Symbol for a valid ID; allocates nothing.
    let key = unsafe { rb_sys::rb_id2sym(id) };
    let known = magnus::rb_sys::protect(|| {
        // SAFETY: GVL held, inside rb_protect, which catches the ArgumentError an unknown key
        // raises.
        unsafe { rb_sys::rb_gc_stat(key) };
        rb_sys::Qnil as VALUE
    })
    .is_ok();
    if known {
        TOTAL_MOVED_KEY.store(key as u64, std::sync::atomic::Ordering::Relaxed);
    }
}

/// Objects compaction has moved since the VM started (`GC.stat(:total_moved_objects)`; 0 on a
/// Ruby without the key). Needs the GVL; allocates nothing and never raises (the key was checked
/// at load), so the NEWOBJ hook may call it.
pub fn total_moved_objects() -> u64 {
    let key = TOTAL_MOVED_KEY.load(std::sync::atomic::Ordering::Relaxed) as VALUE;
    if key == 0 {
        return 0;
    }
    // SAFETY: GVL held per the contract; `key` is a Symbol `init_total_moved_key` saw
    // rb_gc_stat answer, which it then does without allocating or raising.
    unsafe { rb_sys::rb_gc_stat(key) as u64 }
}

/// The period in which the frame handles (iseqs, method entries) the caches hold keep naming
/// the frames they named: the core's handle epoch (which moves when a GC could not mark the
/// cached handles; while it stands every cached handle is marked, so alive and pinned) and the
/// objects compaction has moved. Pinning covers what is cached at a GC's mark, not a handle
/// captured after it: the VM marks the frames on a stack movably, and Ruby 3.1 compacts
/// incrementally during the lazy sweep after a major GC with `GC.auto_compact`, so a frame just
/// cached can still move before the next mark pins it. Every move starts a new period (programs
/// that compact start their caches afresh; the others never do). The handle epoch in the high 32
/// bits, the moved count in the low 32. Needs the GVL; allocation-free and never raises
/// (hook-safe).
pub fn frame_epoch(handle_epoch: u64) -> u64 {
    (handle_epoch << 32) | (total_moved_objects() & 0xffff_ffff)
}
