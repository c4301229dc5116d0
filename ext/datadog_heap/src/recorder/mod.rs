//! `DatadogHeap::Recorder`: the Ruby surface of a runtime session. The object owns the session
//! (an `Arc` it shares with the runtime while the session is listed) and marks what the session
//! holds; everything the VM calls back into goes through `runtime`.
//!
//! Keyword arguments, defaults and type checks of options live in lib/datadog_heap/recorder.rb;
//! the natives here are positional and `_native_`-prefixed where Ruby wraps them. Every native
//! runs inside `runtime::guarded` and first brings its session into this process if a fork
//! happened since it was last used.

mod args;
mod live_objects;
pub(crate) mod profile;
mod retainers;
mod stats;

use std::sync::Arc;

use datadog_heap_core::{
    CommitOutcome, RecorderOptions, UpdateKind, UpdateOutcome, MAX_FRAMES_LIMIT,
};
use magnus::{
    function, method, prelude::*, rb_sys::AsRawValue, typed_data::Obj, value::ReprValue,
    DataTypeFunctions, Error, RArray, RClass, RHash, RModule, Ruby, TypedData, Value,
};

use crate::errors::{arg_error, heap_error, type_error, OrRaise};
use crate::runtime::{self, guarded, Session, StartRefused};
use crate::sampler::{self, Mode, SampleConfig};
use crate::weak_map;

pub(crate) use stats::stat_value;
use stats::stats_hash;

/// Most window-timer ticks a second a session may ask for (each costs a few microseconds).
pub const MAX_WINDOWS_PER_SECOND: f64 = 100_000.0;

#[derive(TypedData)]
#[magnus(class = "DatadogHeap::Recorder", free_immediately, mark, size)]
pub struct Recorder {
    session: Arc<Session>,
}

impl DataTypeFunctions for Recorder {
    /// Marks what the session holds (see `Session::mark`). Never panics or allocates.
    fn mark(&self, _marker: &magnus::gc::Marker) {
        self.session.mark();
    }

    fn size(&self) -> usize {
        std::mem::size_of::<Self>() + std::mem::size_of::<Session>() + self.session.core.memsize()
    }
}

impl Drop for Recorder {
    /// May run on any thread (a lazy sweep on another Ractor's): only flags the session, and
    /// gives up this reference (the last one frees the session, which no one else can reach).
    fn drop(&mut self) {
        self.session.mark_dropped();
    }
}

/// Runs a method body on `rb_self`'s session (see the module docs), then prints the warnings
/// postponed jobs left (`Session::take_notices`): this is Ruby calling us, a safe place to run
/// `Kernel#warn` and whatever it calls. What the body raised wins over what a warning raises.
fn with_session<T>(
    ruby: &Ruby,
    rb_self: &Recorder,
    f: impl FnOnce(&Arc<Session>) -> Result<T, Error>,
) -> Result<T, Error> {
    guarded(ruby, || {
        rb_self.session.after_fork().or_raise(ruby)?;
        let result = f(&rb_self.session);
        let warned = warn_notices(ruby, &rb_self.session);
        let value = result?;
        warned.map(|()| value)
    })
}

/// Prints each of the session's pending notices with `Kernel#warn`, as the program's own code
/// (its allocations are sampled). Needs the GVL; may raise (a `Warning.warn` that raises), may
/// lose the GVL, allocates.
fn warn_notices(ruby: &Ruby, session: &Session) -> Result<(), Error> {
    for message in session.take_notices() {
        runtime::not_busy(|| {
            ruby.module_kernel()
                .funcall::<_, _, Value>("warn", (message.as_str(),))
        })?;
    }
    Ok(())
}

impl Recorder {
    /// `_native_new(class, sample_every, sample_rate, size_enabled, max_frames,
    /// max_tracked_objects, windows_per_second, max_overhead)`, windows_per_second nil for the
    /// countdown sampler, max_overhead nil for no budget; Ruby has validated, this checks again.
    #[allow(clippy::too_many_arguments)] // positional, as Ruby passes them (see the file docs)
    fn native_new(
        ruby: &Ruby,
        class: RClass,
        sample_every: u64,
        sample_rate: u64,
        size_enabled: bool,
        max_frames: usize,
        max_tracked_objects: usize,
        windows_per_second: Option<f64>,
        max_overhead: Option<f64>,
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
            let sample_rate = args::positive_u32(ruby, "sample_rate", sample_rate)?;
            if !(1..=MAX_FRAMES_LIMIT).contains(&max_frames) {
                return Err(arg_error(
                    ruby,
                    format!(
                        "max_frames must be between 1 and {MAX_FRAMES_LIMIT}, got {max_frames}"
                    ),
                ));
            }
            let mode = match windows_per_second {
                None => Mode::Countdown,
                Some(rate) if rate.is_finite() && rate > 0.0 && rate <= MAX_WINDOWS_PER_SECOND => {
                    Mode::Windowed {
                        per_second: rate,
                        mean: sampler::window_sample_every(),
                    }
                }
                Some(rate) => {
                    return Err(arg_error(
                        ruby,
                        format!(
                            "windows_per_second must be above 0 and at most \
                             {MAX_WINDOWS_PER_SECOND}, got {rate}"
                        ),
                    ))
                }
            };
            let max_overhead = match max_overhead {
                None => 0.0,
                Some(share) if share.is_finite() && share > 0.0 && share <= 1.0 => share,
                Some(share) => {
                    return Err(arg_error(
                        ruby,
                        format!("max_overhead must be above 0 and at most 1, got {share}"),
                    ))
                }
            };
            let session = Session::new(
                RecorderOptions {
                    sample_rate,
                    size_enabled,
                    max_tracked_objects,
                },
                SampleConfig {
                    sample_every,
                    max_frames,
                    mode,
                    max_overhead,
                },
            );
            let obj = ruby.obj_wrap_as(
                Recorder {
                    session: Arc::new(session),
                },
                class,
            );
            // Made once the object that marks it exists (its mark accepts "no map yet"), and kept
            // on this stack until it is in place, so no GC in between can lose it.
            let map = weak_map::new_map(ruby)?;
            obj.session.set_weak_map(map);
            std::hint::black_box(&map);
            Ok(obj)
        })
    }

    /// `start`: installs the allocation hook for this recorder; idempotent. Raises the reason
    /// again when an earlier error disabled recording.
    fn start(ruby: &Ruby, rb_self: Obj<Recorder>) -> Result<bool, Error> {
        with_session(ruby, &rb_self, |session| match runtime::start(session) {
            Ok(()) => Ok(true),
            Err(StartRefused::Disabled(reason)) => Err(heap_error(
                ruby,
                format!("heap recording was disabled: {reason}"),
            )),
            Err(StartRefused::Ractors) => Err(heap_error(
                ruby,
                "a Ractor was started in this process: allocation sampling is not Ractor-safe",
            )),
        })
    }

    /// `stop`: stops sampling for this recorder; keeps what it tracks. Idempotent.
    fn stop(ruby: &Ruby, rb_self: &Self) -> Result<bool, Error> {
        with_session(ruby, rb_self, |session| Ok(runtime::stop(session)))
    }

    fn is_running(&self) -> bool {
        self.session.is_running()
    }

    /// `commit` -> number of recordings committed (0 when another commit/update is busy). An
    /// error an earlier postponed job hit is not raised here: it was that job's, and is warned
    /// about once (`with_session`) and kept in `stats[:last_commit_error]`.
    fn commit(ruby: &Ruby, rb_self: &Self) -> Result<usize, Error> {
        with_session(ruby, rb_self, |session| {
            let outcome = session.commit(ruby)?;
            runtime::prune();
            match outcome {
                CommitOutcome::Committed(n) => Ok(n),
                CommitOutcome::SkippedLocked => Ok(0),
            }
        })
    }

    /// `update_young_objects` -> true when the update ran (it is skipped while busy, within 2 s
    /// of the previous one, or with no GC since).
    fn update_young_objects(ruby: &Ruby, rb_self: &Self) -> Result<bool, Error> {
        with_session(ruby, rb_self, |session| {
            let outcome = session.with_vm(ruby, |vm| session.core.update(vm, UpdateKind::Young))?;
            Ok(matches!(outcome, UpdateOutcome::Done(_)))
        })
    }

    fn stats(ruby: &Ruby, rb_self: &Self) -> Result<RHash, Error> {
        with_session(ruby, rb_self, |session| stats_hash(ruby, session))
    }

    /// `after_fork`: what the fork hook does, for a child the hook missed. Only a change of pid
    /// resets anything (`with_session` brings this recorder's session over): without a fork,
    /// another thread may hold the lock or iterate, and resetting those would let two commits
    /// run at once.
    fn after_fork(ruby: &Ruby, rb_self: &Self) -> Result<(), Error> {
        with_session(ruby, rb_self, |_session| {
            runtime::after_fork();
            Ok(())
        })
    }

    /// `debug` -> `[[:records, [String, ...]], [:state, stats]]`.
    fn debug(ruby: &Ruby, rb_self: &Self) -> Result<RArray, Error> {
        with_session(ruby, rb_self, |session| {
            let lines = session.core.debug_lines().or_raise(ruby)?;
            let stats = stats_hash(ruby, session)?;
            let pair = |key: &str, value: Value| {
                ruby.ary_new_from_values(&[ruby.to_symbol(key).as_value(), value])
            };
            let records = pair("records", ruby.ary_from_vec(lines).as_value());
            let state = pair("state", stats.as_value());
            Ok(ruby.ary_new_from_values(&[records, state]))
        })
    }

    /// `record_id_for(obj)` -> the id under which `obj` is tracked, or nil.
    fn record_id_for(ruby: &Ruby, rb_self: &Self, object: Value) -> Result<Option<i64>, Error> {
        with_session(ruby, rb_self, |session| {
            let ids = session.core.record_ids().or_raise(ruby)?;
            let map = session.weak_map(ruby)?;
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
        with_session(ruby, rb_self, |session| {
            let id = args::integer(ruby, "record_id", record_id)?;
            session.core.is_recorded(id).or_raise(ruby)
        })
    }

    fn exhaust_record_ids(ruby: &Ruby, rb_self: &Self) -> Result<(), Error> {
        with_session(ruby, rb_self, |s| {
            s.core.exhaust_record_ids().or_raise(ruby)
        })
    }

    fn reset_last_update(ruby: &Ruby, rb_self: &Self) -> Result<(), Error> {
        with_session(ruby, rb_self, |s| s.core.reset_last_update().or_raise(ruby))
    }

    fn options(ruby: &Ruby, rb_self: &Self) -> Result<RecorderOptions, Error> {
        with_session(ruby, rb_self, |s| s.core.options().or_raise(ruby))
    }

    fn sample_rate(ruby: &Ruby, rb_self: &Self) -> Result<u32, Error> {
        Ok(Self::options(ruby, rb_self)?.sample_rate)
    }

    fn set_sample_rate(ruby: &Ruby, rb_self: &Self, rate: u64) -> Result<(), Error> {
        with_session(ruby, rb_self, |session| {
            let rate = args::positive_u32(ruby, "sample_rate", rate)?;
            session.core.set_sample_rate(rate).or_raise(ruby)
        })
    }

    fn size_enabled(ruby: &Ruby, rb_self: &Self) -> Result<bool, Error> {
        Ok(Self::options(ruby, rb_self)?.size_enabled)
    }

    fn set_size_enabled(ruby: &Ruby, rb_self: &Self, enabled: bool) -> Result<(), Error> {
        with_session(ruby, rb_self, |s| {
            s.core.set_size_enabled(enabled).or_raise(ruby)
        })
    }

    fn max_tracked_objects(ruby: &Ruby, rb_self: &Self) -> Result<usize, Error> {
        Ok(Self::options(ruby, rb_self)?.max_tracked_objects)
    }

    fn max_frames(&self) -> usize {
        self.session.config.max_frames
    }

    fn sample_every(&self) -> u64 {
        self.session.config.sample_every
    }

    /// `max_overhead`: the budget's share of the process's CPU time, nil for no budget.
    fn max_overhead(&self) -> Option<f64> {
        let share = self.session.config.max_overhead;
        (share > 0.0).then_some(share)
    }

    /// `windows_per_second`: the windowed sampler's rate, nil for the countdown sampler.
    fn windows_per_second(&self) -> Option<f64> {
        self.session.config.mode.windows_per_second()
    }

    /// The session, for the Testing module.
    pub fn session(&self) -> &Arc<Session> {
        &self.session
    }
}

pub fn init(ruby: &Ruby, module: RModule) -> Result<(), Error> {
    let class = module.define_class("Recorder", ruby.class_object())?;
    class.undef_default_alloc_func();
    class.define_singleton_method("_native_new", function!(Recorder::native_new, 8))?;
    class.define_method(
        "_native_record_allocation",
        method!(args::record_allocation, 4),
    )?;
    class.define_method("commit", method!(Recorder::commit, 0))?;
    class.define_method(
        "update_young_objects",
        method!(Recorder::update_young_objects, 0),
    )?;
    class.define_method(
        "_native_each_live_object",
        method!(live_objects::each_live_object, 0),
    )?;
    class.define_method("stats", method!(Recorder::stats, 0))?;
    class.define_method("profile", method!(profile::profile, 0))?;
    class.define_method(
        "_native_note_full_gc",
        method!(
            |ruby: &Ruby, rb_self: &Recorder| with_session(ruby, rb_self, |session| {
                session.note_full_gc_before_profile();
                Ok(())
            }),
            0
        ),
    )?;
    // What lib/ changed of the sampler asked for (a String, or nil): in stats and profiles.
    class.define_method(
        "_native_set_sampler_note",
        method!(
            |rb_self: &Recorder, note: Option<String>| rb_self.session().set_sampler_note(note),
            1
        ),
    )?;
    class.define_method(
        "_native_profile_retained",
        method!(profile::profile_retained, 1),
    )?;
    class.define_method(
        "_native_retainer_targets",
        method!(retainers::retainer_targets, 4),
    )?;
    class.define_method(
        "_native_retainer_paths",
        method!(retainers::retainer_paths, 4),
    )?;
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
    class.define_method("max_overhead", method!(Recorder::max_overhead, 0))?;
    class.define_method(
        "windows_per_second",
        method!(Recorder::windows_per_second, 0),
    )?;
    class.define_method("start", method!(Recorder::start, 0))?;
    class.define_method("stop", method!(Recorder::stop, 0))?;
    class.define_method("running?", method!(Recorder::is_running, 0))?;
    Ok(())
}
