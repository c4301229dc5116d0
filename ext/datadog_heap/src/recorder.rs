//! `DatadogHeap::Recorder`: a core `HeapRecorder` plus its WeakMap, wrapped as TypedData.
//!
//! Keyword arguments, defaults and type checks of options live in lib/datadog_heap/recorder.rb;
//! the natives here are positional and `_native_`-prefixed where Ruby wraps them.

use std::cell::{Cell, RefCell};

use datadog_heap_core::{
    encode_profile, CommitOutcome, EncodeOptions, HeapRecorder, RawFrame, RecordOutcome,
    RecorderOptions, StatValue, UpdateKind, UpdateOutcome, MAX_FRAMES_LIMIT,
};
use magnus::{
    function, method,
    prelude::*,
    rb_sys::AsRawValue,
    typed_data::Obj,
    value::{Opaque, ReprValue},
    DataTypeFunctions, Error, IntoValue, RArray, RClass, RHash, RModule, RString, Ruby, TypedData,
    Value,
};
use rb_sys::VALUE;

use crate::errors::{arg_error, guarded, heap_error, type_error, OrRaise};
use crate::ruby_vm::RubyVm;
use crate::sampler::{self, SamplerState};
use crate::{postponed, registry, shims, weak_map};

#[derive(TypedData)]
#[magnus(class = "DatadogHeap::Recorder", free_immediately, mark, size)]
pub struct Recorder {
    core: HeapRecorder,
    /// The liveness table (ObjectSpace::WeakMap); marked, so it lives as long as we do.
    weak_map: Opaque<Value>,
    /// Our own Ruby object, so the commit job can keep it alive on its stack while it works.
    self_value: Cell<VALUE>,
    max_frames: Cell<usize>,
    sample_every: Cell<u64>,
    /// Test switch: when false, recordings wait for an explicit `commit`.
    postponed_commits: Cell<bool>,
    /// The last error a postponed commit hit (it cannot raise where it runs); reported by
    /// `stats` and raised by the next explicit `commit`.
    job_error: RefCell<Option<String>>,
    sampler: SamplerState,
}

impl DataTypeFunctions for Recorder {
    /// Marks the WeakMap and the pending objects only. Tracked objects are deliberately not
    /// marked: the WeakMap holds them weakly, which is how we learn they died. Pending objects
    /// are marked (and so pinned) until their commit. Never panics or allocates.
    fn mark(&self, marker: &magnus::gc::Marker) {
        marker.mark(self.weak_map);
        self.core.for_each_pending_object(|object| {
            // SAFETY: pending objects are VALUEs the VM handed us in the allocation hook or in
            // `record_allocation`, kept alive by this very marking since then.
            unsafe { rb_sys::rb_gc_mark(object as VALUE) };
        });
    }

    fn size(&self) -> usize {
        std::mem::size_of::<Self>() + self.core.memsize()
    }
}

impl Drop for Recorder {
    fn drop(&mut self) {
        // SAFETY: runs in the TypedData free function, during GC sweep, with the GVL.
        unsafe { registry::remove(self as *const Recorder) };
        // Removing the hooks during GC is allowed (it only unlinks them); a hook never sees a
        // freed recorder because the running list no longer names it.
        sampler::stop(self as *const Recorder);
    }
}

fn u32_arg(ruby: &Ruby, name: &str, value: u64) -> Result<u32, Error> {
    u32::try_from(value).map_err(|_| {
        arg_error(
            ruby,
            format!("{name} must be at most {}, got {value}", u32::MAX),
        )
    })
}

impl Recorder {
    /// `_native_new(class, sample_every, sample_rate, size_enabled, max_frames,
    /// max_tracked_objects)`; Ruby has validated.
    fn native_new(
        ruby: &Ruby,
        class: RClass,
        sample_every: u64,
        sample_rate: u64,
        size_enabled: bool,
        max_frames: usize,
        max_tracked_objects: usize,
    ) -> Result<Obj<Recorder>, Error> {
        guarded(ruby, || {
            let recorder_class: RClass =
                ruby.define_module("DatadogHeap")?.const_get("Recorder")?;
            if !class.is_inherited(recorder_class) {
                return Err(type_error(
                    ruby,
                    format!(
                        "_native_new needs DatadogHeap::Recorder or a subclass, got {}",
                        class.inspect()
                    ),
                ));
            }
            if sample_every == 0 || sample_every > u64::from(u32::MAX) {
                return Err(arg_error(
                    ruby,
                    format!(
                        "sample_every must be between 1 and {}, got {sample_every}",
                        u32::MAX
                    ),
                ));
            }
            if sample_rate == 0 {
                return Err(arg_error(
                    ruby,
                    "sample_rate must be a positive Integer, got 0",
                ));
            }
            let sample_rate = u32_arg(ruby, "sample_rate", sample_rate)?;
            if !(1..=MAX_FRAMES_LIMIT).contains(&max_frames) {
                return Err(arg_error(
                    ruby,
                    format!(
                        "max_frames must be between 1 and {MAX_FRAMES_LIMIT}, got {max_frames}"
                    ),
                ));
            }
            let core = HeapRecorder::new(RecorderOptions {
                sample_rate,
                size_enabled,
                max_tracked_objects,
            });
            // Allocates and may GC; nothing refers to the recorder yet, so nothing is half-seen.
            let weak_map = weak_map::new_map(ruby)?;
            let recorder = Recorder {
                core,
                weak_map: weak_map.into(),
                self_value: Cell::new(0),
                max_frames: Cell::new(max_frames),
                sample_every: Cell::new(sample_every),
                postponed_commits: Cell::new(true),
                job_error: RefCell::new(None),
                sampler: SamplerState::new(),
            };
            let obj = ruby.obj_wrap_as(recorder, class);
            obj.self_value.set(obj.as_raw());
            // SAFETY: GVL held; the recorder lives in the TypedData box at a fixed address until
            // its Drop removes it from the registry.
            unsafe { registry::add(&*obj as *const Recorder) };
            Ok(obj)
        })
    }

    /// The commit job has something to do here: a commit, or a disabled reason to warn about.
    pub fn needs_job(&self) -> bool {
        self.has_pending()
            || (!self.sampler.warned.get()
                && self
                    .sampler
                    .disabled_reason
                    .try_borrow()
                    .map(|r| r.is_some())
                    .unwrap_or(false))
    }

    /// Something is pending and the commit job may take it (tests can hold commits back).
    pub fn has_pending(&self) -> bool {
        self.postponed_commits.get() && self.core.has_pending()
    }

    fn weak_map(&self, ruby: &Ruby) -> Value {
        ruby.get_inner(self.weak_map)
    }

    /// Runs `f` with a VM handle, turning a core error into the right Ruby error (the original
    /// exception when a WeakMap call raised).
    fn with_vm<T>(
        &self,
        ruby: &Ruby,
        f: impl FnOnce(&mut RubyVm) -> datadog_heap_core::Result<T>,
    ) -> Result<T, Error> {
        let mut vm = RubyVm::new(ruby, self.weak_map(ruby));
        match f(&mut vm) {
            Ok(v) => Ok(v),
            Err(e) => Err(vm.into_ruby_error(e)),
        }
    }

    pub fn core(&self) -> &HeapRecorder {
        &self.core
    }

    pub fn sampler(&self) -> &SamplerState {
        &self.sampler
    }

    pub fn sample_every_value(&self) -> u64 {
        self.sample_every.get()
    }

    pub fn max_frames_value(&self) -> usize {
        self.max_frames.get()
    }

    /// Turns recording off after an error in the hook, keeping the reason. Never allocates a
    /// Ruby object; the warning is printed later by the commit job.
    pub fn disable(&self, reason: String) {
        if let Ok(mut slot) = self.sampler.disabled_reason.try_borrow_mut() {
            slot.get_or_insert(reason);
        }
        postponed::request_commit();
    }

    /// Prints the disabled reason once, from a context where Ruby code may run.
    fn warn_if_disabled(&self, ruby: &Ruby) {
        if self.sampler.warned.get() {
            return;
        }
        let Some(reason) = self.sampler.disabled_reason.borrow().clone() else {
            return;
        };
        self.sampler.warned.set(true);
        let message = format!("datadog_heap: heap recording disabled: {reason}");
        // A user-defined Warning.warn may raise: ignore that rather than let it escape a job.
        let _: Result<Value, Error> = ruby.module_kernel().funcall("warn", (message,));
    }

    /// Young update from the GC-end job: errors are kept, never raised.
    pub fn young_update_from_job(&self) {
        let Ok(ruby) = Ruby::get() else { return };
        let _busy = sampler::BusyGuard::enter();
        let keep_alive = self.self_value.get();
        if let Err(e) = self.with_vm(&ruby, |vm| self.core.update(vm, UpdateKind::Young)) {
            *self.job_error.borrow_mut() = Some(e.to_string());
        }
        std::hint::black_box(&keep_alive);
    }

    /// Ends an iteration this thread prepared. In a forked child the fork hook already ended it
    /// (the child inherited the snapshot mid-way), which is fine.
    fn end_iteration(&self, ruby: &Ruby) -> Result<(), Error> {
        match self.core.finish_iteration() {
            Ok(()) | Err(datadog_heap_core::HeapError::NoIterationPrepared) => Ok(()),
            Err(e) => Err(crate::errors::to_ruby(ruby, e)),
        }
    }

    /// Commit from the postponed job: errors are kept, never raised.
    pub fn commit_pending_from_job(&self) {
        let Ok(ruby) = Ruby::get() else { return };
        let _busy = sampler::BusyGuard::enter();
        let keep_alive = self.self_value.get();
        self.warn_if_disabled(&ruby);
        let result = self.with_vm(&ruby, |vm| self.core.commit(vm));
        if let Err(e) = result {
            *self.job_error.borrow_mut() = Some(e.to_string());
        }
        // Holds our own object on this stack until the commit is over, so a GC the commit lets
        // run cannot free us mid-way (the same idea as RB_GC_GUARD).
        std::hint::black_box(&keep_alive);
    }

    /// `_native_record_allocation(obj, weight, class_name, locations)` -> true when pending.
    fn record_allocation(
        ruby: &Ruby,
        rb_self: &Self,
        object: Value,
        weight: Value,
        class_name: Value,
        locations: Value,
    ) -> Result<bool, Error> {
        guarded(ruby, || {
            let raw = object.as_raw();
            if shims::heap_type(raw).is_none() {
                return Err(arg_error(
                    ruby,
                    format!(
                        "obj must be a heap object, got {} ({}): immediates cannot be tracked",
                        object.inspect(),
                        object.class().inspect()
                    ),
                ));
            }
            let weight = integer_arg(ruby, "weight", weight)?;
            if weight < 1 {
                return Err(arg_error(
                    ruby,
                    format!("weight must be a positive Integer, got {weight}"),
                ));
            }
            let weight = u32_arg(ruby, "weight", weight as u64)?;
            let class_name = if class_name.is_nil() {
                None
            } else {
                let s = RString::from_value(class_name).ok_or_else(|| {
                    type_error(
                        ruby,
                        format!(
                            "class_name must be a String or nil, got {}",
                            class_name.class().inspect()
                        ),
                    )
                })?;
                Some(owned_string(s))
            };
            let frames = convert_locations(ruby, locations, rb_self.max_frames.get())?;
            let raw_frames: Vec<RawFrame> = frames
                .iter()
                .map(|(name, file, line)| RawFrame {
                    name,
                    filename: file,
                    line: *line,
                })
                .collect();
            let recorded = rb_self
                .core
                .record_allocation(
                    raw as usize,
                    weight,
                    class_name.as_deref(),
                    &raw_frames,
                    shims::gc_count(),
                )
                .or_raise(ruby)?;
            if recorded.needs_commit && rb_self.postponed_commits.get() {
                postponed::request_commit();
            }
            Ok(recorded.outcome == RecordOutcome::Pending)
        })
    }

    /// `commit` -> number of recordings committed (0 when another commit/update is busy).
    fn commit(ruby: &Ruby, rb_self: &Self) -> Result<usize, Error> {
        guarded(ruby, || {
            if let Some(message) = rb_self.job_error.borrow_mut().take() {
                return Err(heap_error(
                    ruby,
                    format!("a postponed commit failed: {message}"),
                ));
            }
            match rb_self.with_vm(ruby, |vm| rb_self.core.commit(vm))? {
                CommitOutcome::Committed(n) => Ok(n),
                CommitOutcome::SkippedLocked => Ok(0),
            }
        })
    }

    /// `update_young_objects` -> true when the update ran (it is skipped while busy, within 2 s
    /// of the previous one, or with no GC since).
    fn update_young_objects(ruby: &Ruby, rb_self: &Self) -> Result<bool, Error> {
        guarded(ruby, || {
            let outcome = rb_self.with_vm(ruby, |vm| rb_self.core.update(vm, UpdateKind::Young))?;
            Ok(matches!(outcome, UpdateOutcome::Done(_)))
        })
    }

    /// `_native_each_live_object { |locations, weight, size, class_name, alloc_gen, gen_age, frozen| }`
    /// after a full update; the iteration ends (even on error or break) before this returns.
    fn each_live_object(ruby: &Ruby, rb_self: &Self) -> Result<Value, Error> {
        guarded(ruby, || {
            if !ruby.block_given() {
                return Err(arg_error(ruby, "each_live_object needs a block"));
            }
            let snapshot = rb_self.with_vm(ruby, |vm| rb_self.core.prepare_iteration(vm))?;
            // Names are resolved and the iteration ended before the first yield: a block that
            // never returns (an abandoned Enumerator#next, a suspended Fiber, a throw) cannot
            // leave the recorder stuck mid-iteration.
            let named = name_live_objects(&snapshot);
            let finished = rb_self.end_iteration(ruby);
            let named = named.or_raise(ruby)?;
            finished?;
            drop(snapshot);
            for (object, frames, class) in named {
                let locations = ruby.ary_new_capa(frames.len());
                for (name, file, line) in frames {
                    locations.push((name, file, line))?;
                }
                let d = &object.data;
                let args = ruby.ary_new_capa(7);
                args.push(locations)?;
                args.push(d.weight)?;
                args.push(d.size)?;
                args.push(class)?;
                args.push(d.alloc_gen)?;
                args.push(d.gen_age)?;
                args.push(d.frozen)?;
                // The block's allocations are the program's, not ours: sample them.
                let _: Value = sampler::not_busy(|| ruby.yield_splat(args))?;
            }
            Ok(ruby.qnil().as_value())
        })
    }

    /// `profile` -> gzip pprof of the live objects. The full update and the snapshot run with the
    /// GVL; building and compressing the profile runs without it, so other threads keep going.
    fn profile(ruby: &Ruby, rb_self: &Self) -> Result<RString, Error> {
        guarded(ruby, || {
            let snapshot = rb_self.with_vm(ruby, |vm| rb_self.core.prepare_iteration(vm))?;
            let options = EncodeOptions {
                sample_every: i64::try_from(rb_self.sample_every.get()).unwrap_or(i64::MAX),
                ..EncodeOptions::default()
            };
            let encoded = without_gvl(|gvl_held| {
                let _pass = match gvl_held {
                    true => crate::fork_gate::enter_encoder_with_gvl(),
                    false => crate::fork_gate::enter_encoder(),
                };
                encode_profile(&snapshot, &options)
            });
            let finished = rb_self.end_iteration(ruby);
            let encoded = match encoded? {
                Some(result) => result.or_raise(ruby)?,
                None => {
                    return Err(heap_error(
                        ruby,
                        "internal error (Rust panic) while encoding the profile",
                    ))
                }
            };
            finished?;
            Ok(ruby.str_from_slice(&encoded.bytes))
        })
    }

    fn stats(ruby: &Ruby, rb_self: &Self) -> Result<RHash, Error> {
        guarded(ruby, || {
            let stats = rb_self.core.stats().or_raise(ruby)?;
            let hash = ruby.hash_new();
            for (key, value) in stats.entries() {
                let value = match value {
                    StatValue::Count(c) => c.into_value_with(ruby),
                    StatValue::Ratio(r) => r.into_value_with(ruby),
                };
                hash.aset(ruby.to_symbol(key), value)?;
            }
            hash.aset(
                ruby.to_symbol("last_commit_error"),
                rb_self.job_error.borrow().clone(),
            )?;
            let st = *rb_self.sampler.stats.borrow();
            for (key, value) in [
                ("sampler_allocations_seen", st.allocations_seen),
                ("sampler_samples_taken", st.samples_taken),
                ("sampler_samples_recorded", st.samples_recorded),
                ("sampler_skipped_internal", st.skipped_internal),
                ("sampler_skipped_reentrant", st.skipped_reentrant),
                ("sampler_skipped_by_recorder", st.skipped_by_recorder),
                ("sampler_hook_errors", st.hook_errors),
                ("sampler_time_ns_total", st.sampling_ns_total),
                ("sampler_time_ns_max", st.sampling_ns_max),
            ] {
                hash.aset(ruby.to_symbol(key), value)?;
            }
            hash.aset(ruby.to_symbol("running"), rb_self.sampler.running.get())?;
            hash.aset(
                ruby.to_symbol("disabled_reason"),
                rb_self.sampler.disabled_reason.borrow().clone(),
            )?;
            Ok(hash)
        })
    }

    fn after_fork(ruby: &Ruby, rb_self: &Self) -> Result<(), Error> {
        guarded(ruby, || rb_self.core.after_fork().or_raise(ruby))
    }

    /// `debug` -> `[[:records, [String, ...]], [:state, stats]]`.
    fn debug(ruby: &Ruby, rb_self: &Self) -> Result<RArray, Error> {
        let lines = guarded(ruby, || rb_self.core.debug_lines().or_raise(ruby))?;
        let stats = Self::stats(ruby, rb_self)?;
        let records = ruby.ary_from_vec(lines);
        let records =
            ruby.ary_new_from_values(&[ruby.to_symbol("records").as_value(), records.as_value()]);
        let state =
            ruby.ary_new_from_values(&[ruby.to_symbol("state").as_value(), stats.as_value()]);
        Ok(ruby.ary_new_from_values(&[records, state]))
    }

    /// `record_id_for(obj)` -> the id under which `obj` is tracked, or nil.
    fn record_id_for(ruby: &Ruby, rb_self: &Self, object: Value) -> Result<Option<i64>, Error> {
        guarded(ruby, || {
            let ids = rb_self.core.record_ids().or_raise(ruby)?;
            let map = rb_self.weak_map(ruby);
            for id in ids {
                if let Some(found) = weak_map::get(ruby, map, id)? {
                    if found.as_raw() == object.as_raw() {
                        return Ok(Some(id));
                    }
                }
            }
            Ok(None)
        })
    }

    fn is_recorded(ruby: &Ruby, rb_self: &Self, record_id: Value) -> Result<bool, Error> {
        guarded(ruby, || {
            let id = integer_arg(ruby, "record_id", record_id)?;
            rb_self.core.is_recorded(id).or_raise(ruby)
        })
    }

    fn exhaust_record_ids(ruby: &Ruby, rb_self: &Self) -> Result<(), Error> {
        guarded(ruby, || rb_self.core.exhaust_record_ids().or_raise(ruby))
    }

    fn reset_last_update(ruby: &Ruby, rb_self: &Self) -> Result<(), Error> {
        guarded(ruby, || rb_self.core.reset_last_update().or_raise(ruby))
    }

    fn sample_rate(ruby: &Ruby, rb_self: &Self) -> Result<u32, Error> {
        guarded(ruby, || {
            Ok(rb_self.core.options().or_raise(ruby)?.sample_rate)
        })
    }

    fn set_sample_rate(ruby: &Ruby, rb_self: &Self, rate: u64) -> Result<(), Error> {
        guarded(ruby, || {
            let rate = u32_arg(ruby, "sample_rate", rate)?;
            rb_self.core.set_sample_rate(rate).or_raise(ruby)
        })
    }

    fn size_enabled(ruby: &Ruby, rb_self: &Self) -> Result<bool, Error> {
        guarded(ruby, || {
            Ok(rb_self.core.options().or_raise(ruby)?.size_enabled)
        })
    }

    fn set_size_enabled(ruby: &Ruby, rb_self: &Self, enabled: bool) -> Result<(), Error> {
        guarded(ruby, || {
            rb_self.core.set_size_enabled(enabled).or_raise(ruby)
        })
    }

    fn max_tracked_objects(ruby: &Ruby, rb_self: &Self) -> Result<usize, Error> {
        guarded(ruby, || {
            Ok(rb_self.core.options().or_raise(ruby)?.max_tracked_objects)
        })
    }

    fn max_frames(&self) -> usize {
        self.max_frames.get()
    }

    fn sample_every(&self) -> u64 {
        self.sample_every.get()
    }

    /// Test switch: turns the sampler's stack cache on or off.
    fn set_stack_cache(ruby: &Ruby, rec: &Self, enabled: bool) -> Result<(), Error> {
        guarded(ruby, || {
            rec.core
                .set_stack_cache_enabled(enabled)
                .map_err(|e| crate::errors::to_ruby(ruby, e))
        })
    }

    fn set_postponed_commits(&self, enabled: bool) {
        self.postponed_commits.set(enabled);
    }
}

type NamedObject = (
    datadog_heap_core::LiveObject,
    Vec<(String, String, i32)>,
    Option<String>,
);

/// Every live object of the snapshot with its frames and class name spelled out. Makes no VM call.
fn name_live_objects(
    snapshot: &datadog_heap_core::Snapshot,
) -> datadog_heap_core::Result<Vec<NamedObject>> {
    let strings = snapshot.strings().lock()?;
    let mut named = Vec::new();
    let mut failed = None;
    snapshot.for_each_live(|object| {
        let resolved = (|| {
            let frames = object
                .stack
                .iter()
                .map(|f| Ok((strings.get(f.name)?, strings.get(f.filename)?, f.line)))
                .collect::<datadog_heap_core::Result<Vec<_>>>()?;
            let class = match object.data.class {
                0 => None,
                id => Some(strings.get(id)?),
            };
            Ok((object.clone(), frames, class))
        })();
        match resolved {
            Ok(entry) => {
                named.push(entry);
                true
            }
            Err(e) => {
                failed = Some(e);
                false
            }
        }
    });
    match failed {
        Some(e) => Err(e),
        None => Ok(named),
    }
}

/// How many times `without_gvl` handles pending interrupts and tries again before it gives up and
/// runs `f` with the GVL held.
const GVL_RELEASE_ATTEMPTS: usize = 3;

/// Runs `f` with the GVL released; `Ok(None)` if it panicked. `f` must not touch the VM; it is told
/// whether it runs with the GVL held (the fallback below).
///
/// Ruby will not release the GVL while any interrupt is pending for this thread, and a long stretch
/// of GVL-held work with no interrupt check (a full update walking the WeakMap) usually ends with
/// one pending: the timer's "another thread wants the GVL". So when the release is refused, the
/// interrupts are handled (`rb_thread_schedule`, which also lets those threads run) and the release
/// tried again; an exception that handling raises (Thread#raise, Timeout) is returned, `f` not run.
/// After `GVL_RELEASE_ATTEMPTS` refusals `f` runs with the GVL held.
fn without_gvl<F: FnOnce(bool) -> T, T>(f: F) -> Result<Option<T>, Error> {
    struct Call<F, T> {
        f: Option<F>,
        out: Option<T>,
    }
    extern "C" fn trampoline<F: FnOnce(bool) -> T, T>(
        data: *mut std::ffi::c_void,
    ) -> *mut std::ffi::c_void {
        // SAFETY: `data` is the `Call` below, alive on the caller's stack for the whole call.
        let call = unsafe { &mut *(data as *mut Call<F, T>) };
        if let Some(f) = call.f.take() {
            // A panic must not cross the C frame of rb_thread_call_without_gvl.
            call.out = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| f(false))).ok();
        }
        std::ptr::null_mut()
    }
    let mut call = Call {
        f: Some(f),
        out: None,
    };
    for attempt in 0..GVL_RELEASE_ATTEMPTS {
        if attempt > 0 {
            shims::thread_schedule()?;
        }
        // SAFETY: called from a Ruby thread holding the GVL; the trampoline makes no VM call, and
        // no unblocking function is given. The "2" variant never checks interrupts after the call
        // (the plain one does, and an exception raised there would jump over our frames); with an
        // interrupt pending it returns without calling the trampoline at all.
        unsafe {
            rb_sys::rb_thread_call_without_gvl2(
                Some(trampoline::<F, T>),
                &mut call as *mut Call<F, T> as *mut std::ffi::c_void,
                None,
                std::ptr::null_mut(),
            );
        }
        if call.f.is_none() {
            return Ok(call.out);
        }
    }
    // Still refused: run it here, with the GVL held; the interrupt is delivered at the VM's next
    // check, once we are back in Ruby.
    Ok(call
        .f
        .take()
        .and_then(|f| std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| f(true))).ok()))
}

/// An Integer argument as i64; TypeError for non-Integers, ArgumentError past 64 bits.
fn integer_arg(ruby: &Ruby, name: &str, value: Value) -> Result<i64, Error> {
    let Some(int) = magnus::Integer::from_value(value) else {
        return Err(type_error(
            ruby,
            format!("{name} must be an Integer, got {}", value.class().inspect()),
        ));
    };
    int.to_i64()
        .map_err(|_| arg_error(ruby, format!("{name} is out of range: {}", value.inspect())))
}

/// The bytes of a Ruby String as UTF-8, replacing invalid sequences.
fn owned_string(s: RString) -> String {
    // SAFETY: the slice is copied out before any other Ruby call could move or change `s`.
    let bytes = unsafe { s.as_slice() };
    String::from_utf8_lossy(bytes).into_owned()
}

/// `locations` -> owned frames, innermost first. A stack deeper than `max_frames` keeps its
/// innermost `max_frames - 1` frames and ends with a "(N frames truncated)" frame.
fn convert_locations(
    ruby: &Ruby,
    locations: Value,
    max_frames: usize,
) -> Result<Vec<(String, String, i32)>, Error> {
    let array = RArray::from_value(locations).ok_or_else(|| {
        type_error(
            ruby,
            format!(
                "locations must be an Array of [name, path, line], got {}",
                locations.class().inspect()
            ),
        )
    })?;
    let len = array.len();
    let keep = if len > max_frames {
        max_frames.saturating_sub(1)
    } else {
        len
    };
    let mut frames = Vec::with_capacity(keep + 1);
    for i in 0..keep {
        let entry: Value = array.entry(i as isize)?;
        let bad = || {
            type_error(
                ruby,
                format!(
                    "locations[{i}] must be [String, String, Integer], got {}",
                    entry.inspect()
                ),
            )
        };
        let frame = RArray::from_value(entry).ok_or_else(bad)?;
        if frame.len() != 3 {
            return Err(bad());
        }
        let name = RString::from_value(frame.entry(0)?).ok_or_else(bad)?;
        let path = RString::from_value(frame.entry(1)?).ok_or_else(bad)?;
        let line_value: Value = frame.entry(2)?;
        if magnus::Integer::from_value(line_value).is_none() {
            return Err(bad());
        }
        let line = integer_arg(ruby, "line", line_value)?;
        let line = i32::try_from(line).map_err(|_| {
            arg_error(
                ruby,
                format!("locations[{i}] line must fit in 32 bits, got {line}"),
            )
        })?;
        frames.push((owned_string(name), owned_string(path), line));
    }
    if len > keep {
        frames.push((
            format!("({} frames truncated)", len - keep),
            String::new(),
            0,
        ));
    }
    Ok(frames)
}

pub fn init(ruby: &Ruby, module: RModule) -> Result<(), Error> {
    let class = module.define_class("Recorder", ruby.class_object())?;
    class.undef_default_alloc_func();
    class.define_singleton_method("_native_new", function!(Recorder::native_new, 6))?;
    class.define_method(
        "_native_record_allocation",
        method!(Recorder::record_allocation, 4),
    )?;
    class.define_method("commit", method!(Recorder::commit, 0))?;
    class.define_method(
        "update_young_objects",
        method!(Recorder::update_young_objects, 0),
    )?;
    class.define_method(
        "_native_each_live_object",
        method!(Recorder::each_live_object, 0),
    )?;
    class.define_method("stats", method!(Recorder::stats, 0))?;
    class.define_method("profile", method!(Recorder::profile, 0))?;
    class.define_method("after_fork", method!(Recorder::after_fork, 0))?;
    class.define_method("debug", method!(Recorder::debug, 0))?;
    class.define_method("record_id_for", method!(Recorder::record_id_for, 1))?;
    class.define_method("recorded?", method!(Recorder::is_recorded, 1))?;
    class.define_method(
        "exhaust_record_ids!",
        method!(Recorder::exhaust_record_ids, 0),
    )?;
    class.define_method(
        "reset_last_update!",
        method!(Recorder::reset_last_update, 0),
    )?;
    class.define_method("sample_rate", method!(Recorder::sample_rate, 0))?;
    class.define_method(
        "_native_set_sample_rate",
        method!(Recorder::set_sample_rate, 1),
    )?;
    class.define_method("size_enabled", method!(Recorder::size_enabled, 0))?;
    class.define_method(
        "_native_set_size_enabled",
        method!(Recorder::set_size_enabled, 1),
    )?;
    class.define_method("max_frames", method!(Recorder::max_frames, 0))?;
    class.define_method(
        "max_tracked_objects",
        method!(Recorder::max_tracked_objects, 0),
    )?;
    class.define_method("sample_every", method!(Recorder::sample_every, 0))?;

    class.define_method("start", method!(Recorder::start, 0))?;
    class.define_method("stop", method!(Recorder::stop, 0))?;
    class.define_method("running?", method!(Recorder::is_running, 0))?;

    let testing = module.define_module("Testing")?;
    testing.define_singleton_method("_native_empty_hook", function!(sampler::set_empty_hook, 1))?;
    testing.define_singleton_method(
        "_native_set_seed",
        function!(|rec: &Recorder, seed: u64| rec.sampler.set_seed(seed), 2),
    )?;
    testing.define_singleton_method(
        "_native_set_stack_cache",
        function!(Recorder::set_stack_cache, 2),
    )?;
    testing.define_singleton_method(
        "_native_set_postponed_commits",
        function!(
            |rec: &Recorder, enabled: bool| rec.set_postponed_commits(enabled),
            2
        ),
    )?;
    Ok(())
}

impl Recorder {
    /// The fork hook's entry: never raises (a failure leaves the recorder as it was).
    pub fn reset_after_fork(&self) {
        let _ = self.core.after_fork();
        self.job_error.borrow_mut().take();
        self.sampler.reseed();
        *self.sampler.stats.borrow_mut() = Default::default();
    }

    /// `start`: installs the allocation hook for this recorder; idempotent. Raises the reason
    /// again when an earlier error disabled recording.
    fn start(ruby: &Ruby, rb_self: &Self) -> Result<bool, Error> {
        guarded(ruby, || {
            if let Some(reason) = rb_self.sampler.disabled_reason.borrow().clone() {
                return Err(heap_error(
                    ruby,
                    format!("heap recording was disabled: {reason}"),
                ));
            }
            if !sampler::start(rb_self) {
                return Err(heap_error(
                    ruby,
                    "a Ractor was started in this process: allocation sampling is not Ractor-safe",
                ));
            }
            Ok(true)
        })
    }

    /// `stop`: removes this recorder from the hook; keeps what it tracks. Idempotent.
    fn stop(ruby: &Ruby, rb_self: &Self) -> Result<bool, Error> {
        guarded(ruby, || {
            let was = rb_self.sampler.running.replace(false);
            sampler::stop(rb_self as *const Recorder);
            // Nothing is sampled until the next start, by when the frames it names may be gone.
            rb_self.core.clear_stack_cache();
            Ok(was)
        })
    }

    fn is_running(&self) -> bool {
        self.sampler.running.get()
    }
}
