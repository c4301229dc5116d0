//! The built-in allocation sampler: one NEWOBJ hook for the process, serving every running
//! recorder, and a GC-end hook that schedules young updates.
//!
//! The hook runs inside object allocation. It never allocates a Ruby object, never raises, never
//! calls a Ruby method, never releases the GVL and never reaches `xmalloc`; Rust allocations
//! (system allocator) happen only on the sampled path. The non-sampled path is one decrement and
//! one branch per running recorder.

use std::cell::{Cell, RefCell};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::time::Instant;

use datadog_heap_core::{
    FrameSource, RawFrame, RawStackKey, RecordOutcome, Stack, MAX_FRAMES_LIMIT,
};
use rb_sys::{rb_trace_arg_t, VALUE};

use crate::gvl_cell::GvlCell;
use crate::recorder::Recorder;
use crate::{postponed, shims};

extern "C" {
    // Declared here rather than taken from rb-sys: the flags argument is a bit set
    // (SAFE | RAW_ARG), which rb-sys types as an enum that cannot hold the combination.
    fn rb_add_event_hook2(
        func: rb_sys::rb_event_hook_func_t,
        events: rb_sys::rb_event_flag_t,
        data: VALUE,
        flags: u32,
    );
}

const HOOK_FLAG_SAFE: u32 = 1;
const HOOK_FLAG_RAW_ARG: u32 = 4;

struct Hooks {
    installed: bool,
    /// A Ractor was started: sampling stays off for good in this process (see `stop_for_ractors`).
    ractors_started: bool,
    /// Test switch: a NEWOBJ hook that does nothing, to measure what any hook costs.
    empty_hook: bool,
    running: Vec<*const Recorder>,
    /// Threads inside our own native work (commit, update, stats...), with their nesting depth:
    /// allocations they make then are ours, not the program's, and are skipped. Per thread, so
    /// other threads' allocations are still sampled while one thread encodes without the GVL.
    busy: Vec<(VALUE, u32)>,
}

static HOOKS: GvlCell<Hooks> = GvlCell::new(Hooks {
    installed: false,
    ractors_started: false,
    empty_hook: false,
    running: Vec::new(),
    busy: Vec::new(),
});

/// Per-recorder sampler state, inside `Recorder`.
pub struct SamplerState {
    pub running: Cell<bool>,
    /// Allocations left before the next sample.
    countdown: Cell<u64>,
    /// The interval `countdown` started from: added to `allocations_seen` when it runs out.
    interval: Cell<u64>,
    rng: Cell<u64>,
    /// Frame buffers for rb_profile_frames, allocated when the recorder starts.
    frames: RefCell<Vec<VALUE>>,
    lines: RefCell<Vec<i32>>,
    pub disabled_reason: RefCell<Option<String>>,
    pub warned: Cell<bool>,
    pub stats: RefCell<SamplerStats>,
}

#[derive(Default, Clone, Copy)]
pub struct SamplerStats {
    pub allocations_seen: u64,
    pub samples_taken: u64,
    pub samples_recorded: u64,
    pub skipped_internal: u64,
    pub skipped_reentrant: u64,
    pub skipped_by_recorder: u64,
    pub hook_errors: u64,
    pub sampling_ns_total: u64,
    pub sampling_ns_max: u64,
}

impl SamplerState {
    pub fn new() -> Self {
        SamplerState {
            running: Cell::new(false),
            countdown: Cell::new(1),
            interval: Cell::new(1),
            rng: Cell::new(seed()),
            frames: RefCell::new(Vec::new()),
            lines: RefCell::new(Vec::new()),
            disabled_reason: RefCell::new(None),
            warned: Cell::new(false),
            stats: RefCell::new(SamplerStats::default()),
        }
    }

    /// A fresh random stream (per process: called again in a forked child).
    pub fn reseed(&self) {
        self.rng.set(seed());
    }

    /// Test aid: a fixed seed, so estimates cannot flake.
    pub fn set_seed(&self, seed: u64) {
        self.rng.set(seed | 1);
    }

    fn next_random(&self) -> u64 {
        // xorshift64*: small, fast, good enough to place sampling points.
        let mut x = self.rng.get();
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.rng.set(x);
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// Draws the allocations until the next sample: geometric with mean `every`, so periodic
    /// allocation patterns cannot line up with the sampling points.
    pub fn draw_interval(&self, every: u64) {
        let interval = if every <= 1 {
            1
        } else {
            // u in (0, 1]; P(interval = k) = p (1-p)^(k-1) with p = 1/every.
            let u = ((self.next_random() >> 11) as f64 + 1.0) / (1u64 << 53) as f64;
            let p = 1.0 / every as f64;
            let k = (u.ln() / (1.0 - p).ln()).floor() + 1.0;
            if k.is_finite() && k >= 1.0 {
                k.min(u64::MAX as f64 / 2.0) as u64
            } else {
                1
            }
        };
        self.countdown.set(interval);
        self.interval.set(interval);
    }
}

fn seed() -> u64 {
    let t = Instant::now().elapsed().as_nanos() as u64;
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0);
    (now ^ t ^ (u64::from(std::process::id()) << 32)).wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1
}

fn current_thread() -> VALUE {
    // SAFETY: called with the GVL from a Ruby thread; returns the thread's existing object
    // without allocating (usable inside the allocation hook).
    unsafe { rb_sys::rb_thread_current() }
}

/// Marks our own native work on this thread, so allocations it makes are not sampled.
/// Needs the GVL.
pub struct BusyGuard(VALUE);

impl BusyGuard {
    pub fn enter() -> BusyGuard {
        let thread = current_thread();
        // SAFETY: GVL held by every caller (native methods, postponed jobs); no VM call inside.
        unsafe {
            HOOKS.with(|h| match h.busy.iter_mut().find(|(t, _)| *t == thread) {
                Some((_, depth)) => *depth += 1,
                None => h.busy.push((thread, 1)),
            })
        };
        BusyGuard(thread)
    }
}

impl Drop for BusyGuard {
    fn drop(&mut self) {
        let thread = self.0;
        // SAFETY: as in `enter`.
        unsafe {
            HOOKS.with(|h| {
                if let Some(i) = h.busy.iter().position(|(t, _)| *t == thread) {
                    h.busy[i].1 -= 1;
                    if h.busy[i].1 == 0 {
                        h.busy.swap_remove(i);
                    }
                }
            })
        };
    }
}

/// Is the current thread inside our own native work? Allocation-free.
fn current_thread_busy() -> bool {
    // SAFETY: GVL held (called from the hook); no VM call inside the closure.
    let any = unsafe { HOOKS.with(|h| !h.busy.is_empty()) };
    if !any {
        return false;
    }
    let thread = current_thread();
    // SAFETY: as above.
    unsafe { HOOKS.with(|h| h.busy.iter().any(|(t, _)| *t == thread)) }
}

/// Runs `f` (which calls back into user Ruby code) with this thread's busy mark lifted, so its
/// allocations are sampled like any other. Needs the GVL.
pub fn not_busy<T>(f: impl FnOnce() -> T) -> T {
    let thread = current_thread();
    // SAFETY: GVL held; no VM call inside the closures.
    let depth = unsafe {
        HOOKS.with(|h| {
            let i = h.busy.iter().position(|(t, _)| *t == thread)?;
            Some(h.busy.swap_remove(i).1)
        })
    };
    let out = f();
    if let Some(depth) = depth {
        // SAFETY: as above.
        unsafe { HOOKS.with(|h| h.busy.push((thread, depth))) };
    }
    out
}

/// For a forked child: only the forking thread survives, and it is not inside our native work.
pub fn reset_busy_after_fork() {
    // SAFETY: GVL held (called from a Ruby method); no VM call inside.
    unsafe { HOOKS.with(|h| h.busy.clear()) };
}

/// Starts sampling for `recorder`, installing the hooks on first use. Needs the GVL. Refuses
/// (returning false) once a Ractor has been started in this process.
pub fn start(recorder: &Recorder) -> bool {
    let state = recorder.sampler();
    // SAFETY: GVL held; no VM call inside.
    if unsafe { HOOKS.with(|h| h.ractors_started) } {
        return false;
    }
    if state.running.get() {
        return true;
    }
    let capacity = MAX_FRAMES_LIMIT;
    state.frames.borrow_mut().resize(capacity, 0);
    state.lines.borrow_mut().resize(capacity, 0);
    // The stack cache's table is built here, not in the hook. This only fails while the state
    // is borrowed, which no caller of `start` does; the cache would then stay off (never wrong).
    let _ = recorder.core().reserve_stack_cache();
    state.draw_interval(recorder.sample_every_value());
    state.running.set(true);
    // SAFETY: GVL held; the closure makes no VM call.
    let install = unsafe {
        HOOKS.with(|h| {
            h.running.push(recorder as *const Recorder);
            !std::mem::replace(&mut h.installed, true)
        })
    };
    if install {
        // SAFETY: GVL held; `on_newobj` and `on_gc_end` have the signatures the VM uses for
        // RAW_ARG hooks (data, trace arg) and stay valid for the life of the process.
        unsafe {
            let newobj: unsafe extern "C" fn(VALUE, *mut rb_trace_arg_t) = on_newobj;
            let gc_end: unsafe extern "C" fn(VALUE, *mut rb_trace_arg_t) = on_gc_end;
            rb_add_event_hook2(
                std::mem::transmute::<
                    unsafe extern "C" fn(VALUE, *mut rb_trace_arg_t),
                    rb_sys::rb_event_hook_func_t,
                >(newobj),
                rb_sys::RUBY_INTERNAL_EVENT_NEWOBJ,
                rb_sys::Qnil as VALUE,
                HOOK_FLAG_SAFE | HOOK_FLAG_RAW_ARG,
            );
            rb_add_event_hook2(
                std::mem::transmute::<
                    unsafe extern "C" fn(VALUE, *mut rb_trace_arg_t),
                    rb_sys::rb_event_hook_func_t,
                >(gc_end),
                rb_sys::RUBY_INTERNAL_EVENT_GC_END_SWEEP,
                rb_sys::Qnil as VALUE,
                HOOK_FLAG_SAFE | HOOK_FLAG_RAW_ARG,
            );
        }
    }
    true
}

/// Called (from Ruby) just before the first `Ractor.new`: stops every recorder's sampling for
/// good and removes the hooks. Internal allocation hooks are not Ractor-safe: Ruby 3.1 itself
/// crashes when a NEWOBJ hook is installed while another Ractor allocates (even Ruby's own
/// `ObjectSpace.trace_object_allocations_start`), and our per-process state assumes one Ractor.
/// Allocations after that point, in any Ractor, are not sampled. Needs the GVL.
pub fn stop_for_ractors() {
    // SAFETY: GVL held; no VM call inside.
    let running = unsafe {
        HOOKS.with(|h| {
            h.ractors_started = true;
            h.running.clone()
        })
    };
    for p in running {
        // SAFETY: pointers in `running` are to live recorders; nothing here can run a GC.
        let recorder = unsafe { &*p };
        recorder.sampler().running.set(false);
        recorder.core().clear_stack_cache();
        recorder.disable(
            "a Ractor was started; allocation sampling is not Ractor-safe and stays off".into(),
        );
        stop(p);
    }
    set_empty_hook(false);
}

/// Test switch: installs (or removes) a NEWOBJ hook that does nothing, to measure the floor any
/// allocation hook costs. Needs the GVL.
pub fn set_empty_hook(enabled: bool) {
    // SAFETY: GVL held; no VM call inside.
    let change =
        unsafe { HOOKS.with(|h| std::mem::replace(&mut h.empty_hook, enabled) != enabled) };
    if !change {
        return;
    }
    let hook: unsafe extern "C" fn(VALUE, *mut rb_trace_arg_t) = on_newobj_empty;
    // SAFETY: GVL held; `on_newobj_empty` has the RAW_ARG hook signature and does nothing.
    unsafe {
        let hook = std::mem::transmute::<
            unsafe extern "C" fn(VALUE, *mut rb_trace_arg_t),
            rb_sys::rb_event_hook_func_t,
        >(hook);
        if enabled {
            rb_add_event_hook2(
                hook,
                rb_sys::RUBY_INTERNAL_EVENT_NEWOBJ,
                rb_sys::Qnil as VALUE,
                HOOK_FLAG_SAFE | HOOK_FLAG_RAW_ARG,
            );
        } else {
            rb_sys::rb_remove_event_hook(hook);
        }
    }
}

unsafe extern "C" fn on_newobj_empty(_data: VALUE, _arg: *mut rb_trace_arg_t) {}

/// Stops sampling for `recorder`; removes the hooks when no recorder runs. Needs the GVL.
/// Also called from the recorder's Drop.
pub fn stop(recorder: *const Recorder) {
    // SAFETY: GVL held; the closure makes no VM call.
    let uninstall = unsafe {
        HOOKS.with(|h| {
            h.running.retain(|&p| p != recorder);
            let uninstall = h.installed && h.running.is_empty();
            if uninstall {
                h.installed = false;
            }
            uninstall
        })
    };
    if uninstall {
        // SAFETY: GVL held; removes the hooks `start` added (by function pointer).
        unsafe {
            let newobj: unsafe extern "C" fn(VALUE, *mut rb_trace_arg_t) = on_newobj;
            let gc_end: unsafe extern "C" fn(VALUE, *mut rb_trace_arg_t) = on_gc_end;
            rb_sys::rb_remove_event_hook(std::mem::transmute::<
                unsafe extern "C" fn(VALUE, *mut rb_trace_arg_t),
                rb_sys::rb_event_hook_func_t,
            >(newobj));
            rb_sys::rb_remove_event_hook(std::mem::transmute::<
                unsafe extern "C" fn(VALUE, *mut rb_trace_arg_t),
                rb_sys::rb_event_hook_func_t,
            >(gc_end));
        }
    }
}

/// The NEWOBJ hook. See the module docs for what it must never do.
unsafe extern "C" fn on_newobj(_data: VALUE, arg: *mut rb_trace_arg_t) {
    // SAFETY: the VM calls us with the GVL held; only `sample` (below) runs for long, and it makes
    // no call that could re-enter the hook or release the GVL.
    let running = unsafe {
        HOOKS.with(|h| {
            let mut due = [std::ptr::null::<Recorder>(); 4];
            let mut n = 0;
            for &p in &h.running {
                // Pointers in `running` are to live recorders (Drop removes them).
                let state = (*p).sampler();
                let left = state.countdown.get() - 1;
                state.countdown.set(left);
                if left == 0 {
                    if n < due.len() {
                        due[n] = p;
                        n += 1;
                    } else {
                        // More recorders due at once than we sample in one call: the rest
                        // take the next allocation instead.
                        state.countdown.set(1);
                    }
                }
            }
            (due, n)
        })
    };
    let (due, n) = running;
    if n == 0 {
        return;
    }
    for &p in &due[..n] {
        // SAFETY: as above; `sample` makes no call that could free the recorder.
        let recorder = unsafe { &*p };
        // A panic must not unwind into the VM: it disables this recorder instead.
        if let Err(panic) = catch_unwind(AssertUnwindSafe(|| sample(recorder, arg))) {
            recorder.disable(format!(
                "panic in the allocation hook: {}",
                crate::errors::panic_message(&*panic)
            ));
        }
    }
}

fn sample(recorder: &Recorder, arg: *mut rb_trace_arg_t) {
    let state = recorder.sampler();
    let mut stats = state.stats.borrow_mut();
    stats.allocations_seen += state.interval.get();
    state.draw_interval(recorder.sample_every_value());
    if state.disabled_reason.borrow().is_some() {
        return;
    }
    stats.samples_taken += 1;
    if current_thread_busy() {
        stats.skipped_reentrant += 1;
        return;
    }
    // SAFETY: `arg` is the trace arg of a NEWOBJ event, for which the VM provides the object.
    let object = unsafe { rb_sys::rb_tracearg_object(arg) };
    if shims::is_internal_object(object) {
        stats.skipped_internal += 1;
        return;
    }
    let started = Instant::now();

    let mut frames = state.frames.borrow_mut();
    let mut lines = state.lines.borrow_mut();
    let capacity = frames.len().min(lines.len()) as i32;
    // SAFETY: the buffers hold `capacity` entries each; rb_profile_frames writes at most that
    // many and allocates nothing.
    let depth =
        unsafe { rb_sys::rb_profile_frames(0, capacity, frames.as_mut_ptr(), lines.as_mut_ptr()) };
    let depth = depth.clamp(0, capacity) as usize;
    let gc_count = shims::gc_count();
    let captured = CapturedStack {
        frames: &frames[..depth],
        lines: &lines[..depth],
        capacity: capacity as usize,
        max_frames: recorder.max_frames_value(),
        gc_count,
    };

    let class_name = class_name_of(object);
    let weight = u32::try_from(recorder.sample_every_value()).unwrap_or(u32::MAX);
    match recorder.core().record_allocation_from(
        object as usize,
        weight,
        Some(class_name),
        &captured,
        gc_count,
    ) {
        Ok(recorded) => {
            if recorded.outcome == RecordOutcome::Pending {
                stats.samples_recorded += 1;
            } else {
                stats.skipped_by_recorder += 1;
            }
            if recorded.needs_commit && recorder.has_pending() {
                postponed::request_commit();
            }
        }
        Err(e) => {
            stats.hook_errors += 1;
            drop(stats);
            recorder.disable(e.to_string());
            return;
        }
    }
    let spent = started.elapsed().as_nanos() as u64;
    stats.sampling_ns_total += spent;
    stats.sampling_ns_max = stats.sampling_ns_max.max(spent);
}

/// One stack as `rb_profile_frames` captured it in this hook call: frame handles and lines,
/// named only when the recorder's stack cache does not know them already.
struct CapturedStack<'a> {
    frames: &'a [VALUE],
    lines: &'a [i32],
    /// The buffers' size: a capture that filled them may have been cut short by it.
    capacity: usize,
    max_frames: usize,
    gc_count: u64,
}

impl FrameSource for CapturedStack<'_> {
    /// Frame handles are iseqs and method entries: the same handle and line name the same frame
    /// until the next GC (which may move it, or free it and reuse its slot), so the GC count is
    /// the key's epoch. (A frame we see running is alive, so even a lazy sweep still finishing
    /// the GC that set the count cannot free it; `rb_gc_count` moves at the start of the next
    /// GC, before that one marks, moves or frees anything.) `VALUE` is a 64-bit integer here, as
    /// the key's handles are. Naming depends on the whole capture (a C frame takes the location of the
    /// Ruby frame below it; truncation counts the frames dropped) and on `max_frames` (the salt);
    /// the key holds all of it.
    fn key(&self) -> Option<RawStackKey<'_>> {
        Some(RawStackKey {
            frames: self.frames,
            lines: self.lines,
            salt: self.max_frames as u64,
            epoch: self.gc_count,
        })
    }

    /// Names the kept frames (and the truncation marker) without allocating a Ruby object.
    /// Allocates the frame list and, for a truncated stack, the marker (Rust allocator).
    fn with_frames(
        &self,
        f: &mut dyn FnMut(&[RawFrame<'_>]) -> datadog_heap_core::Result<Stack>,
    ) -> datadog_heap_core::Result<Stack> {
        let (frames, lines) = (self.frames, self.lines);
        let depth = frames.len().min(lines.len());
        let keep = if depth > self.max_frames {
            self.max_frames.saturating_sub(1)
        } else {
            depth
        };

        let mut raw: Vec<RawFrame> = Vec::with_capacity(keep + 1);
        for i in 0..keep {
            let frame = frames[i];
            // SAFETY: `frame` came from rb_profile_frames in this hook call; these accessors
            // return strings the VM already holds (iseq path and label, method names) without
            // allocating.
            let path = unsafe { rb_sys::rb_profile_frame_path(frame) };
            let (name, filename, line) = if path == rb_sys::Qnil as VALUE {
                // A C frame: its method name, at the caller's location.
                let (filename, line) = caller_location(&frames[..depth], &lines[..depth], i + 1);
                // SAFETY: as for the path above.
                let name = unsafe { rb_sys::rb_profile_frame_method_name(frame) };
                (string_of(name), filename, line)
            } else {
                // SAFETY: as for the path above.
                let label = unsafe { rb_sys::rb_profile_frame_base_label(frame) };
                (string_of(label), string_of(path), lines[i])
            };
            raw.push(RawFrame {
                name,
                filename,
                line,
            });
        }
        let marker;
        if depth > keep {
            let dropped = depth - keep;
            marker = if depth >= self.capacity {
                format!("({dropped}+ frames truncated)")
            } else {
                format!("({dropped} frames truncated)")
            };
            raw.push(RawFrame {
                name: &marker,
                filename: "",
                line: 0,
            });
        }
        f(&raw)
    }
}

/// Path and line of the nearest Ruby frame at or after `from`.
fn caller_location<'a>(frames: &[VALUE], lines: &[i32], from: usize) -> (&'a str, i32) {
    for j in from..frames.len() {
        // SAFETY: a frame from rb_profile_frames; no allocation.
        let path = unsafe { rb_sys::rb_profile_frame_path(frames[j]) };
        if path != rb_sys::Qnil as VALUE {
            return (string_of(path), lines[j]);
        }
    }
    ("", 0)
}

/// Borrows the bytes of a Ruby String the VM keeps alive (frame paths and labels, class names)
/// for the rest of this hook call. Not UTF-8 → "" (we never allocate to fix it up here).
fn string_of<'a>(value: VALUE) -> &'a str {
    if shims::heap_type(value) != Some(rb_sys::ruby_value_type::RUBY_T_STRING) {
        return "";
    }
    // SAFETY: a T_STRING; pointer and length describe its bytes, which stay put until the VM
    // runs Ruby code or a GC again, and the hook does neither before the core copies them.
    let bytes = unsafe {
        std::slice::from_raw_parts(
            rb_sys::RSTRING_PTR(value) as *const u8,
            rb_sys::RSTRING_LEN(value) as usize,
        )
    };
    std::str::from_utf8(bytes).unwrap_or("")
}

/// The object's class name without allocating: the class's permanent name, else the nearest
/// named ancestor, else "Object".
fn class_name_of<'a>(object: VALUE) -> &'a str {
    let api = rb_sys::stable_api::get_default();
    use rb_sys::StableApiDefinition;
    // SAFETY: `object` is a user-visible heap object (internal ones were skipped), so it has a
    // class; rb_class_real skips singleton classes and allocates nothing.
    let mut class = match unsafe { api.rbasic_class(object) } {
        Some(klass) => unsafe { rb_sys::rb_class_real(klass.as_ptr() as VALUE) },
        None => return "Object",
    };
    for _ in 0..32 {
        if class == 0 || class == rb_sys::Qnil as VALUE || class == rb_sys::Qfalse as VALUE {
            break;
        }
        // SAFETY: a class; rb_mod_name returns its cached name (or nil) without allocating.
        let name = unsafe { rb_sys::rb_mod_name(class) };
        if name != rb_sys::Qnil as VALUE {
            let s = string_of(name);
            if !s.is_empty() && !s.starts_with("#<") {
                return s;
            }
        }
        // SAFETY: reads the superclass chain (RCLASS_SUPER, skipping include classes); an
        // initialised class always has one until BasicObject.
        class = unsafe { rb_sys::rb_class_superclass(class) };
    }
    "Object"
}

/// The GC-end hook: asks for a young update soon. Never allocates.
unsafe extern "C" fn on_gc_end(_data: VALUE, _arg: *mut rb_trace_arg_t) {
    postponed::request_young_update();
}
