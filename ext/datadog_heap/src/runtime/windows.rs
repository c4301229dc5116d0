//! Windowed sampling (see `sampler::Mode`): the timer that opens sampling windows, and the tick it
//! causes, which runs with the GVL: young updates for sessions that met a GC since the last tick,
//! then a window for each windowed session (each keeps a tick with probability its own rate over
//! the timer's, so each gets its own random stream of windows at its rate), then the hooks set to match.
//!
//! The timer is a native thread that never touches the VM. It sleeps a random time with mean
//! 1 / rate (see `next_delay_ns`), then asks for the window job:
//! - Ruby >= 3.3: with `rb_postponed_job_trigger`, which is safe from a thread that is not a Ruby
//!   thread: vm_trace.c finds no execution context there and flags the main Ractor's running one.
//! - Ruby < 3.3: `rb_postponed_job_register_one` reads the caller's execution context, which a
//!   non-Ruby thread does not have (vm_trace.c of 3.1 and 3.2 dereferences it), and flags that
//!   context only, so the job runs when that thread next holds the GVL. The timer thread therefore
//!   sends a real-time signal (`shims::signal`) to the Ruby thread that holds the GVL, whose
//!   handler registers the job (`signalled`). When no thread holds it (all wait on IO, locks or
//!   sleeps), the tick goes to a Ruby thread that waits for such ticks without the GVL
//!   (`DatadogHeap::WindowTimer`, `native::wait_for_call`) and gets the GVL at once then. A Ruby
//!   thread that kept the time itself would reach only about 10 ticks a second next to a
//!   CPU-bound thread, which gives up the GVL every 100 ms.
//! - A Ruby thread (`DatadogHeap::WindowTimer` in lib/datadog_heap.rb) does the sleeping instead
//!   on Ruby 3.3.0 with M:N threads (see `use_ruby_thread`), when no real-time signal is free,
//!   and with `DATADOG_HEAP_WINDOW_TIMER=ruby`.
//!
//! Everything here needs the GVL except the native timer thread's loop.

use std::sync::atomic::{AtomicU64, Ordering};

use magnus::Ruby;

use super::{busy::BusyGuard, sessions, sync_hooks, Session};
use crate::sampler::WAKE_AFTER;
use crate::shims;

/// A windowed session's rate, or `None` for a countdown session.
fn rate_of(session: &Session) -> Option<f64> {
    session.config.mode.windows_per_second()
}

/// The highest rate among the running windowed sessions of `sessions`: what the timer ticks at;
/// `None` when none runs (no timer then).
pub fn timer_rate<'a>(sessions: impl IntoIterator<Item = &'a Session>) -> Option<f64> {
    (sessions.into_iter())
        .filter(|s| s.is_running() && !s.is_dropped())
        .filter_map(rate_of)
        .reduce(f64::max)
}

static THINNING_RNG: AtomicU64 = AtomicU64::new(0x9E37_79B9_7F4A_7C15);

/// A uniform draw in [0, 1). Needs no lock: a lost update between two threads only repeats a draw.
fn uniform() -> f64 {
    let x = datadog_heap_core::xorshift64(THINNING_RNG.load(Ordering::Relaxed));
    THINNING_RNG.store(x, Ordering::Relaxed);
    (x >> 11) as f64 / (1u64 << 53) as f64
}

/// How far ahead of a window's start the hook is armed, in time at the program's current
/// allocation rate; never fewer than [`MIN_HORIZON`] allocations.
const ARM_AHEAD_S: f64 = 5e-4;
const MIN_HORIZON: u64 = 256;
/// The shortest window, in time at the program's allocation rate: twice the horizon, so arming
/// costs at most half what the window does (the strata grow with the windows, so the share
/// watched stays the same).
const MIN_WINDOW_S: f64 = 1e-3;
const MAX_WINDOW: u64 = 1 << 22;
/// A window job that runs within this long of the timer's request ran promptly: no C call or GC
/// held it up (see `Checkpoints::on_check`).
const PROMPT_NS: u64 = 200_000;
/// The soonest the timer ticks again when a window's start is near.
const MIN_TICK_NS: u64 = 200_000;
/// The latest a busy program's next tick is put off to when its next window is far, in the
/// timer's periods (1 / its rate): the longest of its usual delays (see `next_delay_ns`), so a
/// program that goes quiet is noticed as soon as at the usual pace. A quiet tick is what arms
/// the wake-up for the burst after it; put off to four periods (40 ms), ticks missed the
/// 20 ms sleep before the truth bench's burst, which read 0.89 of the truth over 80 runs.
const MAX_PUT_OFF: f64 = 1.5;
/// The program is quiet when it allocated over the last stretch that can tell (at least
/// [`JUDGED_S`] long: a window's boundary job right after a tick is not, nor are hurried ticks,
/// so such ticks leave the stretch to the next one; and without a GC, whose pause would pass
/// for a quiet program; one with a GC still tells a busy program) at under this share of its
/// pace lately
/// ([`Pace::rate`]), when no pace is known yet, or when the last tick is older than
/// [`STALE_S`] (the timer was stopped, as between two recorders, or a long call held the
/// tick): what the program did in so long a stretch says nothing of what it does now. A quiet
/// program's ticks are not hurried, so a phase that merely allocates slower than the one before
/// must not count as quiet: judged against half the fastest pace of the last seconds, windows
/// in such phases came late.
const QUIET_SHARE: f64 = 0.1;
const JUDGED_S: f64 = 5e-4;
const STALE_S: f64 = 0.1;
/// How fast [`Pace::rate`] forgets.
const RATE_HALF_LIFE_S: f64 = 0.05;

/// When the native timer last asked for the window job (monotonic ns; 0: not since the last job).
static ASKED_AT_NS: AtomicU64 = AtomicU64::new(0);

/// (The timer asked for this job, it ran promptly after); forgets the request.
fn timer_request() -> (bool, bool) {
    let asked = ASKED_AT_NS.swap(0, Ordering::Relaxed);
    let now = shims::clock_ns(shims::Clock::Monotonic);
    (
        asked != 0,
        asked != 0 && now.saturating_sub(asked) < PROMPT_NS,
    )
}

/// The Ruby timer thread's tick (`DatadogHeap::WindowTimer`): one a timer asked for, the native
/// one (which noted when it asked, see `native::wait_for_call`) or the Ruby thread's own.
pub fn tick_from_ruby_timer(ruby: &Ruby) -> Option<f64> {
    let now = shims::clock_ns(shims::Clock::Monotonic);
    let _ = ASKED_AT_NS.compare_exchange(0, now, Ordering::Relaxed, Ordering::Relaxed);
    tick(ruby)
}

/// The program's allocation rate as the ticks see it (for arming windows in time).
struct Pace {
    /// The program's allocation count, the time and the GC count at the last tick.
    last: Option<Mark>,
    /// The same at the last tick that judged whether the program is quiet, where the stretch
    /// the next judgement covers begins. Ticks too close to it to tell leave it be: hurried ticks
    /// 0.2 ms apart, each judging only its own stretch, never judged at all, and a program that
    /// stopped allocating just short of a window's start kept being taken for busy and ticked
    /// at 5,000 a second for tens of milliseconds (until 2026-12-06).
    judged: Option<Mark>,
    /// How late ticks have come to windows' starts lately, in allocations: the most recent
    /// lateness, or nine tenths of the estimate before if higher. The horizon is at least twice
    /// it: on a loaded machine the timer wakes late, and a window moved by a late tick credits
    /// its place to what came after it.
    late: f64,
    /// Allocations per second: the last stretch's, or the previous estimate if higher, halved
    /// every [`RATE_HALF_LIFE_S`] (by time: hurried ticks come often in a busy stretch, and a
    /// decay by tick forgot the pace within a millisecond or two). A rate that falls is believed
    /// slowly, so ticks come early rather than late. A stretch with a GC in it counts too, its
    /// pace too low if anything (the GC paused the program), so it can only keep the estimate
    /// up; leaving such stretches out, as this did until 2026-12-06, let the estimate decay
    /// through a phase that collects every few milliseconds, and ticks came late.
    rate: f64,
    /// The program was quiet over the last stretch that could tell (see [`QUIET_SHARE`]).
    quiet: bool,
}

/// The program's allocation count, the time and the GC count, at a tick.
type Mark = (u64, std::time::Instant, u64);

static PACE: shims::GvlCell<Pace> = shims::GvlCell::new(Pace {
    last: None,
    judged: None,
    rate: 0.0,
    late: 0.0,
    quiet: true,
});

/// What a tick learns of the program's pace (see [`pace`]).
struct Seen {
    /// Allocations per second, as [`Pace::rate`] (0 when not known yet).
    rate: f64,
    /// How late ticks came lately, as [`Pace::late`].
    late: f64,
    /// The program allocates at a small share of its recent pace, or no pace is known yet: a
    /// burst may come before the timer's next tick foresees it (see [`QUIET_SHARE`]).
    quiet: bool,
}

crate::gvl_guarded!(fn with_pace over PACE: Pace);

/// Updates the allocation rate with the count `now` and the GC count `gcs` (see [`Seen`]).
fn pace(now: u64, gcs: u64) -> Seen {
    let at = std::time::Instant::now();
    // The allocations and seconds since `mark`; `None` when that says nothing of now (see
    // [`STALE_S`]) or the count went back.
    let since = |(count, then, _): Mark| {
        let secs = at.duration_since(then).as_secs_f64();
        (secs < STALE_S && now >= count).then(|| ((now - count) as f64, secs))
    };
    with_pace(|p| {
        let mut before = p.rate;
        if let Some(last) = p.last {
            let secs = at.duration_since(last.1).as_secs_f64();
            before *= 0.5f64.powf(secs / RATE_HALF_LIFE_S);
            let stretch = since(last).filter(|&(_, secs)| secs > 1e-5);
            p.rate = stretch.map_or(0.0, |(n, secs)| n / secs).max(before);
        }
        match p.judged.map(|judged| (since(judged), judged.2)) {
            // Too short to tell: the next tick judges from the same mark.
            Some((Some((_, secs)), _)) if secs < JUDGED_S => {}
            Some((Some((n, secs)), gcs_then)) => {
                let rate = n / secs;
                if gcs == gcs_then {
                    p.quiet = rate < QUIET_SHARE * before;
                } else if rate >= QUIET_SHARE * before {
                    // With a GC inside, the pace is too low if anything: a busy one still tells.
                    p.quiet = false;
                }
                p.judged = Some((now, at, gcs));
            }
            _ => {
                p.quiet = true;
                p.judged = Some((now, at, gcs));
            }
        }
        p.last = Some((now, at, gcs));
        Seen {
            rate: p.rate,
            late: p.late,
            quiet: p.quiet,
        }
    })
}

/// One tick of the window timer. GVL held; may run Ruby code (young updates use the WeakMaps),
/// where other threads may stop or start sessions. Returns the timer's rate after it, read once
/// the tick is over (so a stop meanwhile is seen), `None` when no windowed session runs any more.
pub fn tick(ruby: &Ruby) -> Option<f64> {
    let _busy = BusyGuard::enter();
    let running = sessions(|s| s.is_running() && rate_of(s).is_some());
    let timer_rate = timer_rate(running.iter().map(|s| &**s));
    let gc_count = shims::gc_count();
    let Seen { rate, late, quiet } = pace(super::busy::program_allocations(), gc_count);
    let horizon = ((rate * ARM_AHEAD_S).max(2.0 * late) as u64).max(MIN_HORIZON);
    let min_length = ((rate * MIN_WINDOW_S) as u64).min(MAX_WINDOW);
    let (asked, prompt) = timer_request();
    // The soonest a session needs the next tick, in allocations; how late this tick came to a
    // window.
    let mut soonest: Option<u64> = None;
    let mut came_late = 0u64;
    let mut woke = 0u8;
    for session in &running {
        // Kept on this stack, so the GC's conservative scan marks it while we use it (as jobs do).
        let map = std::hint::black_box(session.weak_map_raw());
        if session.is_dropped() || !session.is_running() {
            continue;
        }
        // Scheduled here rather than by a GC-end hook, which would cost every allocation the
        // slow path on Ruby 3.1. The core's gating (GC generation, minimum interval) applies.
        if session.note_gc_count(gc_count) {
            session.young_update_from_job(ruby);
        }
        let now = super::busy::program_allocations();
        let checked =
            (session.sampler).check(session.config, now, horizon, min_length, (asked, prompt));
        came_late = came_late.max(checked.late);
        woke = woke.max(checked.woke);
        let mut ahead = checked.ahead;
        if checked.woke == 1 {
            // The first wake-up after a quiet stretch: the program allocates again. Its pace
            // over the stretch is mostly the quiet part's, so it is measured again over the next
            // few hundred allocations (the tick is left unhurried meanwhile).
            if session.sampler.wake(now, WAKE_AFTER, 2) {
                ahead = None;
            }
        } else if asked && quiet {
            // A quiet tick of the timer's: a burst could pass several windows' starts before
            // the next one, so the hook wakes the sampler once the program allocates again. At
            // most one a tick (a wake-up never arms another of its stage), so it costs nothing
            // in a program that stays quiet and a few hundred slow-path allocations in one that
            // wakes up.
            session.sampler.wake(now, WAKE_AFTER, 1);
        }
        soonest = match (soonest, ahead) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        std::hint::black_box(&map);
    }
    with_pace(|p| p.late = (came_late as f64).max(p.late * 0.9));
    if let (Some(ahead), Some(top)) = (soonest, timer_rate) {
        // Come back halfway to where the count should be half the horizon short of the start:
        // the rate may rise meanwhile, and each tick measures it again. That is sooner than the
        // timer's usual pace when the start is near, and as late as its latest usual delay when
        // it is far (`MAX_PUT_OFF`): a busy program needs no tick before, and each one is a
        // wake-up of the timer and a signal that it pays for. Not while the program is quiet (it
        // waits on IO, say): ticks every few hundred µs would cost it more than the wake-up armed
        // above, and its usual ticks are what notices it is quiet. After a second wake-up the
        // program is known to allocate at `rate`.
        if rate > 0.0 && (!quiet || woke == 2) {
            let secs = 0.5 * ahead.saturating_sub(horizon / 2) as f64 / rate;
            let ns = (secs * 1e9).clamp(MIN_TICK_NS as f64, MAX_PUT_OFF * 1e9 / top);
            // A no-op where the Ruby timer thread keeps the time (it keeps its own pace).
            native::next_tick_in(ns as u64);
        }
    }
    if woke == 1 {
        // The second wake-up measures the pace from here, after this job's own work.
        let now = super::busy::program_allocations();
        let at = std::time::Instant::now();
        with_pace(|p| {
            p.last = Some((now, at, shims::gc_count()));
            p.judged = p.last;
        });
    }
    sync_hooks();
    let after = sessions(|s| s.is_running() && rate_of(s).is_some());
    self::timer_rate(after.iter().map(|s| &**s))
}

/// Draws the time to the next tick, in nanoseconds: uniform between half and one and a half
/// times the mean 1 / `rate`, at least 10 µs and at most 10 s. Random, so the ticks cannot keep
/// step with a periodic program.
pub fn next_delay_ns(rate: f64) -> u64 {
    let mean = 1e9 / rate.max(1e-3);
    ((0.5 + uniform()) * mean).clamp(10_000.0, 10e9) as u64
}

/// Set at load when the native timer must not be used on this Ruby (see `use_ruby_thread`).
static RUBY_THREAD_FORCED: std::sync::atomic::AtomicBool =
    std::sync::atomic::AtomicBool::new(false);

/// Makes the timer a Ruby thread: lib/datadog_heap.rb asks for it on 3.3.0 with
/// `RUBY_MN_THREADS=1`, where `rb_postponed_job_trigger` from a native thread crashes the VM
/// (Ruby bug #20016, fixed in 3.3.1), and with `DATADOG_HEAP_WINDOW_TIMER=ruby`. Called once at
/// load, before any timer starts.
pub fn use_ruby_thread(forced: bool) {
    RUBY_THREAD_FORCED.store(forced, Ordering::Relaxed);
}

/// Whether the timer is the native thread (else the Ruby one). Before 3.3 this installs the
/// timer's signal handler if it is not yet installed (without a free signal the timer is the
/// Ruby thread): call it only where a timer is about to start (or to ask which one would).
pub fn native_timer() -> bool {
    native(true)
}

/// Whether the timer is the native thread; before 3.3, `install` lets this install the signal
/// handler, else it answers whether an earlier start installed it, so a process that never runs
/// a windowed sampler never gets the handler (after a fork, at exit).
fn native(install: bool) -> bool {
    if RUBY_THREAD_FORCED.load(Ordering::Relaxed) {
        return false;
    }
    #[cfg(ruby_gte_3_3)]
    return {
        let _ = install;
        true
    };
    #[cfg(not(ruby_gte_3_3))]
    return match install {
        true => signalled::ready(),
        false => signalled::installed(),
    };
}

/// Whether the timer is, or would be, the native thread, without installing anything: not when
/// the Ruby thread was chosen at load, nor before 3.3 when the native timer cannot reach the VM
/// (`problem`).
pub fn would_be_native() -> bool {
    !RUBY_THREAD_FORCED.load(Ordering::Relaxed) && problem().is_none()
}

/// Starts the timer at `rate`, changes its rate, or (`None`) stops it.
pub fn set_rate(rate: Option<f64>) {
    if native(rate.is_some()) {
        native::set_rate(rate);
        // Before 3.3 the native timer reaches the VM only through a thread that holds the GVL
        // (see `signalled`): in a program that mostly sleeps or waits on IO that is rarely so
        // when it ticks, and windows would be few. The Ruby timer thread waits beside it for the
        // ticks no signal could deliver, and gets the GVL at once in such a program.
        #[cfg(not(ruby_gte_3_3))]
        ruby_thread::set_rate(rate);
        return;
    }
    ruby_thread::set_rate(rate)
}

/// In a forked child (see each timer's own).
pub fn after_fork() {
    #[cfg(not(ruby_gte_3_3))]
    signalled::after_fork();
    if native(false) {
        native::after_fork();
    }
    ruby_thread::after_fork()
}

/// Stops the timer for good (process exit).
pub fn shutdown() {
    if native(false) {
        return native::shutdown();
    }
    ruby_thread::shutdown()
}

/// Asks for the window job from the timer thread; whether the request reached the VM (before
/// 3.3, not while no thread holds the GVL).
fn request_tick() -> bool {
    ASKED_AT_NS.store(shims::clock_ns(shims::Clock::Monotonic), Ordering::Relaxed);
    #[cfg(ruby_gte_3_3)]
    return {
        super::jobs::request_window();
        true
    };
    #[cfg(not(ruby_gte_3_3))]
    signalled::request()
}

/// Ruby < 3.3: getting the window job to the Ruby thread that holds the GVL, by signal.
#[cfg(not(ruby_gte_3_3))]
mod signalled;

/// Why the window timer is, or would be, only the Ruby thread (about 10 ticks a second next to
/// a busy thread instead of the rate asked for), beyond the load-time choices lib/datadog_heap.rb
/// makes and names itself (`use_ruby_thread`); `None` when the native timer works. Before 3.3
/// only: from 3.3 on the native timer needs no signal. Installs nothing.
pub fn problem() -> Option<&'static str> {
    #[cfg(not(ruby_gte_3_3))]
    return signalled::problem();
    #[cfg(ruby_gte_3_3)]
    None
}

/// At load, before any timer starts: before 3.3, finds where the VM keeps the GVL owner, which
/// the timer's signal handler needs (without it the timer is a Ruby thread). GVL held.
pub fn init(ruby: &Ruby) {
    #[cfg(not(ruby_gte_3_3))]
    signalled::probe(ruby);
    #[cfg(ruby_gte_3_3)]
    let _ = ruby;
}

/// Before 3.3: the real-time signal the timer sends (`None` before a windowed start installed
/// its handler, and from 3.3 on).
pub fn signal_number() -> Option<i32> {
    #[cfg(not(ruby_gte_3_3))]
    return Some(signalled::number()).filter(|&sig| sig != 0);
    #[cfg(ruby_gte_3_3)]
    None
}

/// Before 3.3: (timer signals that asked for the window job, signals that landed in a thread
/// without the GVL and asked for nothing, ticks handed to the Ruby timer thread because no
/// thread held the GVL); `None` from 3.3 on, where no signal is sent.
pub fn signal_counts() -> Option<(u64, u64, u64)> {
    #[cfg(not(ruby_gte_3_3))]
    return Some({
        let (registered, not_owner) = signalled::counts();
        (registered, not_owner, native::handed())
    });
    #[cfg(ruby_gte_3_3)]
    None
}

/// The native timer thread; `runtime` reaches its `wait_for_call` (the Ruby timer thread's wait).
pub(super) mod native;

mod ruby_thread {
    use magnus::{prelude::*, Error, RModule, Ruby, Value};

    fn timer_module(ruby: &Ruby) -> Result<RModule, Error> {
        ruby.define_module("DatadogHeap")?.const_get("WindowTimer")
    }

    /// Starts the Ruby timer thread (it reads its rate from each tick), or (`None`) stops it and
    /// joins it. A failure (the Ruby side missing or raising) leaves windows unopened, never
    /// raises: sampling just gets no windows, which the stats show.
    pub fn set_rate(rate: Option<f64>) {
        let Ok(ruby) = Ruby::get() else { return };
        let Ok(module) = timer_module(&ruby) else {
            return;
        };
        let _: Result<Value, Error> = match rate {
            Some(rate) => module.funcall("start", (rate,)),
            None => module.funcall("stop", ()),
        };
    }

    /// In a forked child the Ruby thread is gone; the Ruby side notices (`Thread#alive?`).
    pub fn after_fork() {}

    /// At exit Ruby ends its threads itself.
    pub fn shutdown() {}
}
