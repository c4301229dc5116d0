//! `DatadogHeap::Testing`: switches and probes for the specs and benchmarks, not for production.

use magnus::{function, prelude::*, Error, RModule, Ruby, Value};

use crate::errors::to_ruby;
use crate::recorder::Recorder;
use crate::runtime::{self, guarded};
use crate::sampler::CostClock;

/// Turns the sampler's stack cache on or off.
fn set_stack_cache(ruby: &Ruby, rec: &Recorder, enabled: bool) -> Result<(), Error> {
    guarded(ruby, || {
        (rec.session().core)
            .set_stack_cache_enabled(enabled)
            .map_err(|e| to_ruby(ruby, e))
    })
}

/// Holds the recorder's soft lock as the calling thread while the block runs, as the recorder's
/// own commit or update does while the VM runs a signal trap or finalizer inside it.
fn hold_lock(ruby: &Ruby, rec: &Recorder) -> Result<Value, Error> {
    let block = ruby.block_proc()?;
    let lock = rec.session().core.lock();
    if !lock.try_lock(crate::shims::current_thread() as u64) {
        return Err(crate::errors::heap_error(ruby, "the lock is busy"));
    }
    let result = block.call::<_, Value>(());
    lock.unlock();
    result
}

fn set_window_sample_every(ruby: &Ruby, every: u64) -> Result<u64, Error> {
    match every {
        1..=65_536 => Ok(crate::sampler::set_window_sample_every(every)),
        _ => Err(Error::new(
            ruby.exception_arg_error(),
            format!("window sample_every must be between 1 and 65536, got {every}"),
        )),
    }
}

fn sleep_wake_floor(ruby: &Ruby, ticks: u64, period_us: u64) -> Result<f64, Error> {
    use crate::shims::{clock_ns, without_gvl, Clock, IfRefused};
    use std::sync::{Condvar, Mutex};
    let (ticks, period) = (
        ticks.max(1),
        std::time::Duration::from_micros(period_us.max(1)),
    );
    let failed = |what: &str| {
        Error::new(
            ruby.exception_runtime_error(),
            format!("sleep_wake_floor: {what}"),
        )
    };
    let sleeper = std::thread::Builder::new()
        .spawn(move || {
            let (lock, wake) = (Mutex::new(()), Condvar::new());
            let started = clock_ns(Clock::ThreadCpu);
            for _ in 0..ticks {
                let guard = lock.lock().map_err(|_| ())?;
                drop(wake.wait_timeout(guard, period).map_err(|_| ())?);
            }
            Ok::<u64, ()>(clock_ns(Clock::ThreadCpu).saturating_sub(started))
        })
        .map_err(|e| failed(&e.to_string()))?;
    // Joining makes no VM call: other Ruby threads run meanwhile.
    match without_gvl(|_| sleeper.join(), None, IfRefused::RunWithGvl)? {
        Some(Ok(Ok(ns))) => Ok(ns as f64 / ticks as f64),
        _ => Err(failed("the sleeping thread failed")),
    }
}

fn set_cost_model(rec: &Recorder, ns_per_allocation: Option<f64>, ns_per_sample: u64) {
    let clock = match ns_per_allocation {
        Some(ns_per_allocation) => CostClock::Model {
            ns_per_allocation,
            ns_per_sample,
        },
        None => CostClock::Real,
    };
    (rec.session().sampler.budget).set_clock(clock, runtime::program_allocations());
}

pub fn init(_ruby: &Ruby, module: RModule) -> Result<(), Error> {
    let testing = module.define_module("Testing")?;
    // A NEWOBJ hook that does nothing: the floor any allocation hook costs.
    testing.define_singleton_method("_native_empty_hook", function!(runtime::set_empty_hook, 1))?;
    testing.define_singleton_method(
        "_native_set_seed",
        function!(
            |rec: &Recorder, seed: u64| rec.session().sampler.set_seed(seed),
            2
        ),
    )?;
    testing.define_singleton_method("_native_set_stack_cache", function!(set_stack_cache, 2))?;
    // When false, recordings wait for an explicit `commit`.
    testing.define_singleton_method(
        "_native_set_postponed_commits",
        function!(
            |rec: &Recorder, enabled: bool| rec.session().set_postponed_commits(enabled),
            2
        ),
    )?;
    // Whether the recorder's last profile was encoded with the GVL released (nil before any).
    testing.define_singleton_method(
        "_native_last_encode_released_gvl",
        function!(|rec: &Recorder| rec.session().last_encode_released_gvl(), 1),
    )?;
    // Objects our own work allocated in this process (windowed estimates leave them out).
    testing.define_singleton_method(
        "_native_own_allocations",
        function!(runtime::own_allocations, 0),
    )?;
    // [NEWOBJ hook installed, GC-end hook installed, window timer rate or nil].
    testing.define_singleton_method("_native_hooks", function!(runtime::hook_state, 0))?;
    // Before Ruby 3.3: [timer signals that asked for the window job, signals that landed in a
    // thread without the GVL, ticks handed to the Ruby timer thread as no thread held the GVL];
    // nil from 3.3 on.
    testing.define_singleton_method(
        "_native_window_signals",
        function!(runtime::window_signal_counts, 0),
    )?;
    // How often the native window timer's thread has woken in this process (its deadlines and
    // the requests that moved them sooner).
    testing.define_singleton_method(
        "_native_window_timer_wakes",
        function!(runtime::window_timer_wakes, 0),
    )?;
    // Before Ruby 3.3: the real-time signal the window timer sends, once a windowed start
    // installed its handler; nil otherwise.
    testing.define_singleton_method(
        "_native_window_signal_number",
        function!(runtime::window_signal_number, 0),
    )?;
    // How many sessions the runtime lists (running, or with work for a postponed job).
    testing.define_singleton_method(
        "_native_listed_sessions",
        function!(runtime::listed_count, 0),
    )?;
    // Keeps a message as if a postponed job had failed with it (what happens next is the
    // recorder's: one warning, stats, commit unaffected).
    testing.define_singleton_method(
        "_native_note_job_error",
        function!(
            |rec: &Recorder, message: String| rec.session().note_job_error(message),
            2
        ),
    )?;
    // The caches' epoch now for a recorder whose GCs all marked its caches (see
    // shims::frame_epoch).
    testing.define_singleton_method(
        "_native_frame_epoch",
        function!(|| crate::shims::frame_epoch(0), 0),
    )?;
    // Whether frames are named with their class: the load-time check of method entries passed.
    testing.define_singleton_method(
        "_native_frame_classes_named",
        function!(crate::shims::method_entry_layout_verified, 0),
    )?;
    testing.define_singleton_method("_native_hold_lock", function!(hold_lock, 1))?;
    // Before Ruby 3.3: [GVL owner found, offset of the kernel id in a thread's struct, bytes of a
    // thread's struct the probe read, whether the id of the thread that forked is kept apart];
    // nil from 3.3 on, where nothing is probed.
    testing.define_singleton_method(
        "_native_gvl_probe",
        function!(
            || {
                #[cfg(not(ruby_gte_3_3))]
                return Some(crate::shims::gvl_owner::probe_report());
                #[cfg(ruby_gte_3_3)]
                None::<(bool, usize, usize, bool)>
            },
            0
        ),
    )?;
    // What the overhead budget takes off each timed stretch for the clock's own reads, in ns
    // (nil before any budget was made).
    testing.define_singleton_method(
        "_native_budget_clock_ns",
        function!(crate::sampler::empty_stretch_ns, 0),
    )?;
    // A profile as written before profiles carried records and variances.
    testing.define_singleton_method(
        "_native_profile_without_uncertainty",
        function!(crate::recorder::profile::profile_without_uncertainty, 1),
    )?;
    // The longest any lock wait lasts, in seconds (tests shorten it).
    testing.define_singleton_method(
        "_native_set_lock_wait_limit",
        function!(
            |seconds: f64| datadog_heap_core::lock::set_wait_limit_ns((seconds * 1e9) as i64),
            1
        ),
    )?;
    // The overhead budget's cost model: with ns_per_allocation (Float) the process's CPU time is
    // that much per program allocation and each sample costs ns_per_sample, instead of the
    // clocks; nil: the real clocks again. Starts a new budget period.
    testing.define_singleton_method("_native_set_cost_model", function!(set_cost_model, 3))?;
    // The windowed sampler's in-window mean (allocations per sample inside a window) for the
    // recorders made from now on; returns the previous one. Benchmarks compare means side by side.
    testing.define_singleton_method(
        "_native_set_window_sample_every",
        function!(set_window_sample_every, 1),
    )?;
    // The platform's floor under any window timer: a bare native thread that sleeps `ticks`
    // times on a condition variable with a timeout of `period_us` (as the window timer does) and
    // wakes; returns its thread CPU time per wake, in ns. The caller waits for it (about
    // ticks x period_us) with the GVL released.
    testing.define_singleton_method("_native_sleep_wake_floor", function!(sleep_wake_floor, 2))?;
    // Stage costs (thread CPU time per stage of our own work): on/off (zeroes them), and
    // [[stage, ns, count], ..., ["overhead_ns", a probe's own cost, 1]].
    testing.define_singleton_method(
        "_native_set_stage_costs",
        function!(crate::stage_costs::set_enabled, 1),
    )?;
    testing.define_singleton_method(
        "_native_stage_costs",
        function!(crate::stage_costs::snapshot, 0),
    )?;
    Ok(())
}
