//! A session: one recorder's state, as the runtime and the Ruby class both see it. The core
//! recorder, its liveness WeakMap, the sampler's state, and what postponed jobs leave behind.
//!
//! Every method needs the GVL of the main Ractor, except `mark_dropped`/`is_dropped` (atomics,
//! callable from any thread) and `Drop` (which runs only once nothing else holds the session).

use std::cell::{Cell, RefCell};
use std::sync::atomic::{AtomicBool, Ordering};

use datadog_heap_core::{CommitOutcome, HeapRecorder, RecorderOptions, UpdateKind};
use magnus::{rb_sys::FromRawValue, Error, Ruby, Value};
use rb_sys::VALUE;

use crate::errors::heap_error;
use crate::ruby_vm::RubyVm;
use crate::sampler::{SampleConfig, SamplerState};
use crate::shims;
use crate::stage_costs::{self, Stage};

/// The overhead budget's raise was warned about (once per process, see `take_notices`).
static BUDGET_WARNED: AtomicBool = AtomicBool::new(false);

/// In a forked child: a new process, warned anew.
pub fn after_fork_warnings() {
    BUDGET_WARNED.store(false, Ordering::Relaxed);
}

pub struct Session {
    pub core: HeapRecorder,
    /// The liveness table (an ObjectSpace::WeakMap), 0 until it is made, which happens only
    /// once the Ruby object that marks it exists.
    weak_map: Cell<VALUE>,
    pub sampler: SamplerState,
    pub config: SampleConfig,
    /// The built-in sampler is on.
    running: Cell<bool>,
    /// Test switch: when false, recordings wait for an explicit `commit`.
    postponed_commits: Cell<bool>,
    /// The last error a postponed job hit (it cannot raise where it runs); kept for `stats`
    /// (`last_commit_error`) until a fork.
    job_error: RefCell<Option<String>>,
    /// `job_error` is newer than the last warning about it (see `take_notices`).
    job_error_unreported: Cell<bool>,
    /// Errors postponed jobs hit (`stats[:lifetime_job_errors]`).
    job_errors: Cell<u64>,
    /// Why recording turned itself off, if it did; kept for good (a new recorder starts afresh).
    disabled_reason: RefCell<Option<String>>,
    /// The disabled reason was handed out to be warned about.
    warned: Cell<bool>,
    /// The process this session was last used in: a different pid means a fork happened since.
    pid: Cell<u32>,
    /// Whether the last profile was encoded with the GVL released (`None` before the first).
    last_encode_released_gvl: Cell<Option<bool>>,
    /// Windowed mode: the GC count the window timer last saw (young updates follow GCs).
    last_gc_seen: Cell<u64>,
    /// The Ruby object that owned this session was freed; nothing may use the session again.
    dropped: AtomicBool,
    /// The next profile follows a full GC the program asked for (`Recorder#profile(gc: true)`):
    /// its notes say so. Taken by the encode.
    full_gc_before_profile: Cell<bool>,
    /// What lib/ changed of the sampler asked for, and why (the default sampler taken as the
    /// countdown where the window timer cannot keep its rate): in `stats` and every profile.
    sampler_note: RefCell<Option<String>>,
}

// SAFETY: a session is used only by threads holding the GVL of the main Ractor, one at a time,
// so its Cells and RefCells never see concurrent access. The exceptions are `dropped`, an
// atomic, and the final drop, which runs only when no other reference exists. Ruby's TypedData
// needs `Send` because a lazy sweep may free the owning object on another Ractor's thread:
// the owner's Drop then only sets `dropped` and releases its reference.
#[allow(unsafe_code)]
unsafe impl Send for Session {}
// SAFETY: as above.
#[allow(unsafe_code)]
unsafe impl Sync for Session {}

impl Session {
    pub fn new(options: RecorderOptions, config: SampleConfig) -> Self {
        let sampler = SamplerState::default();
        sampler.budget.set_max_overhead(config.max_overhead);
        Session {
            core: HeapRecorder::new(options),
            weak_map: Cell::new(0),
            sampler,
            config,
            running: Cell::new(false),
            postponed_commits: Cell::new(true),
            job_error: RefCell::new(None),
            job_error_unreported: Cell::new(false),
            job_errors: Cell::new(0),
            disabled_reason: RefCell::new(None),
            warned: Cell::new(false),
            pid: Cell::new(std::process::id()),
            last_encode_released_gvl: Cell::new(None),
            last_gc_seen: Cell::new(0),
            dropped: AtomicBool::new(false),
            full_gc_before_profile: Cell::new(false),
            sampler_note: RefCell::new(None),
        }
    }

    /// Keeps what lib/ says it changed of the sampler (see `sampler_note`).
    pub fn set_sampler_note(&self, note: Option<String>) {
        if let Ok(mut kept) = self.sampler_note.try_borrow_mut() {
            *kept = note;
        }
    }

    pub fn sampler_note(&self) -> Option<String> {
        self.sampler_note.try_borrow().ok()?.clone()
    }

    /// Which timer opens this session's windows: "native" or "ruby"; `None` for the countdown.
    pub fn window_timer(&self) -> Option<&'static str> {
        self.config.mode.windows_per_second()?;
        Some(match super::windows::would_be_native() {
            true => "native",
            false => "ruby",
        })
    }

    /// For a windowed session whose windows only the Ruby timer thread opens (or whose native
    /// timer lost its way to the VM), what that means for its numbers; `None` otherwise.
    pub fn timer_note(&self) -> Option<String> {
        let rate = self.config.mode.windows_per_second()?;
        let why = match (super::windows::would_be_native(), super::windows::problem()) {
            (true, None) => return None,
            (_, Some(problem)) => problem,
            (false, None) => {
                "chosen at load (DATADOG_HEAP_WINDOW_TIMER=ruby, Ruby 3.3.0 with M:N threads, \
                 or a loaded gem that the timer's signals would break)"
            }
        };
        Some(format!(
            "datadog_heap: the windowed sampler's windows were opened by a Ruby thread ({why}): \
             next to a busy thread it ticks about 10 times a second instead of {rate}, too seldom \
             to arm windows in time, so windows open where a tick finds them, past short phases, \
             and estimates can be off by more than their +/-; sampler: :countdown avoids it \
             (docs/samplers.md)"
        ))
    }

    /// What the profile says when late ticks moved the windows by more than twice what they
    /// watched (the timer woke well after their starts: a loaded machine, or the Ruby timer
    /// thread): estimates near where they were due can be off by more than their ±. `None`
    /// otherwise. (Moves of about what the windows watch are usual in a tight allocation loop on
    /// a quiet machine, where they did not bias the truth bench's phases.)
    pub fn late_note(&self) -> Option<String> {
        let stats = *self.sampler.stats.try_borrow().ok()?;
        let (late, watched) = (stats.window_late_allocations, stats.window_allocations);
        if stats.windows_opened < 4 || late < watched.saturating_mul(2) {
            return None;
        }
        Some(format!(
            "datadog_heap: the window timer woke late for many windows (they moved by {late} \
             allocations in all, against {watched} watched), as on a loaded machine: a window \
             moved past where it was due credits its place to what ran after, so sites near \
             phase changes can be off by more than their +/- (docs/accuracy.md)"
        ))
    }

    /// Sets the WeakMap, once, right after it was made (with no allocation in between).
    pub fn set_weak_map(&self, map: Value) {
        use magnus::rb_sys::AsRawValue;
        self.weak_map.set(map.as_raw());
    }

    /// The WeakMap's VALUE (0 before it is made), to keep on a stack while a job uses it.
    pub fn weak_map_raw(&self) -> VALUE {
        self.weak_map.get()
    }

    #[allow(unsafe_code)] // a VALUE we keep marked, see below
    pub fn weak_map(&self, ruby: &Ruby) -> Result<Value, Error> {
        match self.weak_map.get() {
            0 => Err(heap_error(ruby, "the recorder's WeakMap was never made")),
            // SAFETY: a VALUE we made and keep marked (see `mark`) for as long as we live.
            raw => Ok(unsafe { Value::from_raw(raw) }),
        }
    }

    /// Marks (and pins) every Ruby object the session holds: the WeakMap, the objects of
    /// pending recordings (alive and unmoved until their commit), and the frame handles (iseqs,
    /// method entries) the sampling path's caches hold, so that a cached handle keeps naming the
    /// frame it named (see `capture.rs`). Tracked objects are not marked: the WeakMap holds them
    /// weakly, which is how we learn they died. Called from mark functions; never allocates,
    /// raises or panics.
    pub fn mark(&self) {
        let probe = stage_costs::start(Stage::Mark);
        shims::gc_mark(self.weak_map.get());
        // The queue and the caches are never borrowed across an allocation, so a GC finds them
        // free (if not, the core starts a new handle epoch).
        let _ = (self.core).for_each_pending_object(|object| shims::gc_mark(object as VALUE));
        (self.core).mark_cached_handles(|handle| shims::gc_mark(handle as VALUE));
        probe.end();
    }

    pub fn mark_dropped(&self) {
        self.dropped.store(true, Ordering::Release);
    }

    /// The owning Ruby object was freed. Callable from any thread.
    pub fn is_dropped(&self) -> bool {
        self.dropped.load(Ordering::Acquire)
    }

    pub fn is_running(&self) -> bool {
        self.running.get()
    }

    pub fn set_running(&self, running: bool) {
        self.running.set(running);
    }

    /// Something is pending and the commit job may take it (tests can hold commits back).
    pub fn has_pending(&self) -> bool {
        self.postponed_commits.get() && self.core.has_pending()
    }

    pub fn set_postponed_commits(&self, enabled: bool) {
        self.postponed_commits.set(enabled);
    }

    /// The runtime has a reason to keep this session listed: it samples, or has recordings for
    /// the commit job.
    pub fn has_work(&self) -> bool {
        !self.is_dropped() && (self.running.get() || self.has_pending())
    }

    /// The commit job has something to do here.
    pub fn needs_job(&self) -> bool {
        !self.is_dropped() && self.has_pending()
    }

    pub fn disabled_reason(&self) -> Option<String> {
        self.disabled_reason.try_borrow().ok()?.clone()
    }

    /// Turns recording off for good, keeping the first reason. Never allocates a Ruby object or
    /// raises (usable in the hook); the runtime removes the hooks from the commit job, and the
    /// next call into the recorder from Ruby warns (`take_notices`).
    pub fn disable(&self, reason: String) {
        self.running.set(false);
        if let Ok(mut slot) = self.disabled_reason.try_borrow_mut() {
            slot.get_or_insert(reason);
        }
    }

    /// The warnings nobody got yet, each handed out once: that recording was disabled, and the
    /// last error a postponed job hit. Printed by the next call into the recorder from Ruby, not
    /// by the job: a job runs wherever the interrupted thread was (inside a logger holding its
    /// lock, say), and Ruby discards what it raises. Allocates (Rust) only when there is one.
    pub fn take_notices(&self) -> Vec<String> {
        let mut notices = Vec::new();
        if let Some(raised) = self.budget_note() {
            // Once per process: every recorder's profile carries its own note.
            if !BUDGET_WARNED.swap(true, Ordering::Relaxed) {
                notices.push(raised);
            }
        }
        if let Some(reason) = self.disabled_reason() {
            if !self.warned.replace(true) {
                notices.push(format!("datadog_heap: heap recording disabled: {reason}"));
            }
        }
        if self.job_error_unreported.replace(false) {
            if let Some(message) = self.job_error() {
                notices.push(format!("datadog_heap: a postponed job failed: {message}"));
            }
        }
        notices
    }

    /// What the overhead budget did to the interval asked for, when it raised it: for the
    /// once-per-process warning, the profile's notes and the report's header. `None` when it
    /// never did (or there is no budget).
    pub fn budget_note(&self) -> Option<String> {
        let budget = &self.sampler.budget;
        if budget.raises.get() == 0 || budget.max_overhead() <= 0.0 {
            return None;
        }
        let asked = self.config.sample_every;
        let now = self.sampler.effective(self.config).sample_every;
        let most = (asked as f64 * budget.max_scale.get()).round() as u64;
        Some(format!(
            "datadog_heap: asked 1 in {asked} allocations, sampled 1 in {now} (up to 1 in {most}) to \
             stay under {}% of CPU (max_overhead: {}); fewer samples, so rougher estimates. Pass \
             max_overhead: nil to keep the interval asked, or a larger max_overhead",
            budget.max_overhead() * 100.0,
            budget.max_overhead()
        ))
    }

    pub fn job_error(&self) -> Option<String> {
        self.job_error.try_borrow().ok()?.clone()
    }

    pub fn job_errors(&self) -> u64 {
        self.job_errors.get()
    }

    fn keep_job_error(&self, error: Error) {
        self.note_job_error(error.to_string());
    }

    /// Keeps `message` as the error a postponed job hit (public for the Testing module).
    pub fn note_job_error(&self, message: String) {
        if let Ok(mut slot) = self.job_error.try_borrow_mut() {
            *slot = Some(message);
        }
        self.job_error_unreported.set(true);
        self.job_errors.set(self.job_errors.get().saturating_add(1));
    }

    /// Windowed mode: whether a GC happened since the window timer last asked.
    pub fn note_gc_count(&self, gc_count: u64) -> bool {
        self.last_gc_seen.replace(gc_count) != gc_count
    }

    /// Says that a full GC ran just before the next profile (GVL held, right before the encode).
    pub fn note_full_gc_before_profile(&self) {
        self.full_gc_before_profile.set(true);
    }

    /// Whether a full GC ran just before this profile, taken once.
    pub fn take_full_gc_before_profile(&self) -> bool {
        self.full_gc_before_profile.replace(false)
    }

    pub fn last_encode_released_gvl(&self) -> Option<bool> {
        self.last_encode_released_gvl.get()
    }

    pub fn set_last_encode_released_gvl(&self, released: bool) {
        self.last_encode_released_gvl.set(Some(released));
    }

    /// Runs `f` with a VM handle over this session's WeakMap, turning a core error into the right
    /// Ruby error (the original exception when a WeakMap call raised).
    pub fn with_vm<T>(
        &self,
        ruby: &Ruby,
        f: impl FnOnce(&mut RubyVm) -> datadog_heap_core::Result<T>,
    ) -> Result<T, Error> {
        self.weak_map(ruby)?;
        let mut vm = RubyVm::new(ruby, &self.weak_map);
        match f(&mut vm) {
            Ok(v) => Ok(v),
            Err(e) => Err(vm.into_ruby_error(e)),
        }
    }

    /// Commits the pending recordings into the WeakMap, and charges the budget for the entries
    /// made (their finalizers before Ruby 3.3, see `Budget::charge_commits`), whoever asked.
    pub fn commit(&self, ruby: &Ruby) -> Result<CommitOutcome, Error> {
        let outcome = self.with_vm(ruby, |vm| self.core.commit(vm))?;
        if let CommitOutcome::Committed(n) = outcome {
            self.sampler.budget.charge_commits(n);
        }
        Ok(outcome)
    }

    /// The commit from the postponed job: errors are kept, never raised.
    /// Its time counts against the overhead budget, which may then rescale the interval.
    pub fn commit_from_job(&self, ruby: &Ruby) {
        self.own_work(false, || {
            if let Err(e) = self.commit(ruby) {
                self.keep_job_error(e);
            }
        });
        (self.sampler.budget).maybe_adjust(super::busy::program_allocations);
    }

    /// The gated young update from the GC-end job: errors are kept, never raised.
    /// Its time counts against the overhead budget.
    pub fn young_update_from_job(&self, ruby: &Ruby) {
        self.own_work(true, || {
            if let Err(e) = self.with_vm(ruby, |vm| self.core.update(vm, UpdateKind::Young)) {
                self.keep_job_error(e);
            }
        });
    }

    /// Runs `work`, a job's share of our own work: its thread CPU time counts against the
    /// overhead budget (`rare` work is always timed, the rest one time in sixteen: see
    /// budget.rs).
    fn own_work(&self, rare: bool, work: impl FnOnce()) {
        let budget = &self.sampler.budget;
        let started = if rare {
            budget.start_always()
        } else {
            budget.start()
        };
        work();
        self.sampler.budget.charge_since(started);
    }

    /// Brings the session into this process if it was last used before a fork: what only the
    /// parent's threads held (the soft lock, an iteration, the sampler's random stream, the
    /// counters, a job's error) starts afresh; records and pending recordings stay. The one
    /// after-fork path, run by the fork hook for listed sessions and by every entry point for
    /// the rest. Without a change of pid it does nothing.
    pub fn after_fork(&self) -> datadog_heap_core::Result<()> {
        let pid = std::process::id();
        if self.pid.get() == pid {
            return Ok(());
        }
        self.pid.set(pid);
        self.sampler.after_fork();
        (self.sampler.budget).after_fork(super::busy::program_allocations());
        if let Ok(mut slot) = self.job_error.try_borrow_mut() {
            slot.take();
        }
        self.job_error_unreported.set(false);
        self.job_errors.set(0);
        self.core.after_fork()
    }
}
