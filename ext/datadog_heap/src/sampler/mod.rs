//! The built-in allocation sampler's per-session state and the sampled path of the NEWOBJ hook:
//! when to sample, and what one sample does (capture the stack, name it only if the stack cache
//! does not know it, record it in the core).
//!
//! Two ways to choose the samples ([`Mode`]), both with a mean of `sample_every` allocations per
//! sample:
//! - countdown: a geometric countdown with mean `sample_every` over every allocation. The NEWOBJ
//!   hook is installed all the time, and with it CRuby sends every allocation down its slow path.
//! - windowed: the hook is installed only for windows placed along the program's allocations (the
//!   VM's counter, `total_allocated_objects`, less the allocations of our own work, which the
//!   hook does not count either), a share `d = m / sample_every` of them, opened and closed at the
//!   VM's interrupt checks (see `checkpoints`). Inside, a geometric countdown with mean `m`
//!   (`WINDOW_SAMPLE_EVERY`, or half of a smaller `sample_every`) takes the samples, each weighted
//!   by its interval over `d`: every allocation is watched with chance `d`, one long C call's
//!   included, so nothing is credited from one site to another. A window's samples share its
//!   number as their cluster, which the profile's variances account for. Between windows no hook
//!   is installed and allocations run at full speed.

mod budget;
mod capture;
mod checkpoints;
mod frame_names;
mod sampled;

use std::cell::{Cell, RefCell};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use datadog_heap_core::MAX_FRAMES_LIMIT;
use rb_sys::VALUE;

pub use budget::{empty_stretch_ns, Budget, CostClock};
use capture::CapturedStack;
pub use checkpoints::WAKE_AFTER;
use checkpoints::{CheckOutcome, Checkpoints, Phase};
pub use frame_names::frame_name;
pub use sampled::sample;

/// Mean allocations between two samples inside a window: near where a sample's own cost (about
/// 1.5 µs) spread over the interval matches the slow path every allocation in a window pays
/// (about 28 ns on Ruby 3.1). Means of 32, 16 and 8 measured no cheaper (bench/window_mean.rb).
pub const WINDOW_SAMPLE_EVERY: u64 = 64;

/// The in-window mean that recorders made from now on take: [`WINDOW_SAMPLE_EVERY`] unless a
/// benchmark set another (see [`set_window_sample_every`]). Read once per recorder, into its
/// [`Mode`], never from the hook.
static WINDOW_MEAN: AtomicU64 = AtomicU64::new(WINDOW_SAMPLE_EVERY);

/// Benchmark aid: the in-window mean of the windowed recorders made from now on; returns the
/// previous one.
pub fn set_window_sample_every(every: u64) -> u64 {
    WINDOW_MEAN.swap(every.max(1), Ordering::Relaxed)
}

/// The in-window mean a windowed recorder made now takes.
pub fn window_sample_every() -> u64 {
    WINDOW_MEAN.load(Ordering::Relaxed)
}

/// Samples a window holds on average: its length is at least this many times the in-window mean
/// (longer where the program allocates fast, see `runtime::windows`).
const MIN_WINDOW_SAMPLES: u64 = 32;

/// How a session chooses its samples (see the module docs).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Mode {
    Countdown,
    /// The window timer ticks `per_second` times a second on average; inside windows, a sample
    /// every `mean` allocations on average (see `SampleConfig::countdown_mean`).
    Windowed {
        per_second: f64,
        mean: u64,
    },
}

impl Mode {
    /// The windowed sampler's timer rate; `None` for the countdown sampler.
    pub fn windows_per_second(self) -> Option<f64> {
        match self {
            Mode::Windowed { per_second, .. } => Some(per_second),
            Mode::Countdown => None,
        }
    }
}

/// When and how one session samples.
pub struct SamplerState {
    /// Allocations left before the next sample.
    countdown: Cell<u64>,
    /// The mean `countdown` was drawn with: the weight of the sample it leads to (see
    /// `draw_interval`).
    mean: Cell<u64>,
    rng: Cell<u64>,
    /// Frame buffers for rb_profile_frames, sized when sampling starts (never in the hook).
    frames: RefCell<Vec<VALUE>>,
    lines: RefCell<Vec<i32>>,
    /// Windowed mode: where the windows are (see `checkpoints`).
    checkpoints: Checkpoints,
    /// Windowed mode: the thread that asked for the window job at a boundary (see `tick`).
    asked_from: Cell<VALUE>,
    pub stats: RefCell<SamplerStats>,
    /// The overhead budget: scales the mean interval (see `budget`).
    pub budget: Budget,
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
    /// Windowed mode: windows opened, and the allocations they watched.
    pub windows_opened: u64,
    pub window_allocations: u64,
    /// Windowed mode: allocations the hook counted before a window opened (armed), allocations
    /// by which late ticks moved windows, and windows no check fell inside.
    pub window_armed_allocations: u64,
    pub window_late_allocations: u64,
    pub windows_spanned: u64,
    /// Windowed mode: the timer's ticks that checked this session's window (not the jobs the hook
    /// asked for at a window's boundary).
    pub window_ticks: u64,
    /// Windowed mode: the hook's wake-ups after a quiet tick that came (see `Checkpoints::wake`).
    pub window_wakeups: u64,
}

/// What a sample needs from its session's options.
#[derive(Clone, Copy)]
pub struct SampleConfig {
    pub sample_every: u64,
    pub max_frames: usize,
    pub mode: Mode,
    /// Largest share of the process's CPU time the sampler's own work may take (0: no budget).
    pub max_overhead: f64,
}

impl SampleConfig {
    /// Windowed mode: the share of the program's allocations inside windows, `d = m /
    /// sample_every` for an in-window mean `m` (a sample then weighs `m / d = sample_every` on
    /// average), and a window's shortest length in allocations.
    fn window_shape(&self) -> (f64, u64) {
        let m = self.countdown_mean();
        let share = (m as f64 / self.sample_every.max(1) as f64).min(1.0);
        (share, m.saturating_mul(MIN_WINDOW_SAMPLES))
    }

    /// Mean interval of the countdown (inside windows, for the windowed sampler: at most half of
    /// `sample_every`, so windows hold at most half of the allocations).
    fn countdown_mean(&self) -> u64 {
        match self.mode {
            Mode::Countdown => self.sample_every,
            Mode::Windowed { mean, .. } => mean.min(self.sample_every / 2).max(1),
        }
    }
}

/// What a windowed check found (see [`SamplerState::check`]).
pub struct Checked {
    /// Allocations to the next window's start while no hook is needed (the timer should tick
    /// again before then).
    pub ahead: Option<u64>,
    /// How late this tick came to a window's start (0 when it did not).
    pub late: u64,
    /// The stage of the wake-up that asked for this check (0: none, see `Checkpoints::wake`).
    pub woke: u8,
}

/// What one allocation did to a session's sampler (see `SamplerState::tick`).
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct Tick {
    /// This allocation is to be sampled.
    pub due: bool,
    /// Windowed mode: the count reached a window's start or end; the window job must run at the
    /// next interrupt check.
    pub boundary: bool,
}

impl Default for SamplerState {
    fn default() -> Self {
        SamplerState {
            countdown: Cell::new(1),
            mean: Cell::new(1),
            rng: Cell::new(seed()),
            frames: RefCell::new(Vec::new()),
            lines: RefCell::new(Vec::new()),
            checkpoints: Checkpoints::default(),
            asked_from: Cell::new(0),
            stats: RefCell::new(SamplerStats::default()),
            budget: Budget::new(0.0),
        }
    }
}

impl SamplerState {
    /// Gets ready to sample: frame buffers, the first interval, and (windowed) the first window,
    /// placed from the program's allocation count `now`. Needs the GVL; allocates (Rust
    /// allocator), so never call it from the hook.
    pub fn prepare(&self, config: SampleConfig, now: u64) {
        self.frames.borrow_mut().resize(MAX_FRAMES_LIMIT, 0);
        self.lines.borrow_mut().resize(MAX_FRAMES_LIMIT, 0);
        self.budget.restart(now);
        let effective = self.effective(config);
        self.draw_interval(effective.countdown_mean());
        if let Mode::Windowed { .. } = config.mode {
            let (share, length) = effective.window_shape();
            let opened = self.checkpoints.restart(now, length, share, self.uniform());
            self.count_windows(CheckOutcome {
                opened,
                ..CheckOutcome::default()
            });
        }
    }

    /// Counts in the stats, and charges to the budget, what the windows did at a check, at
    /// `start` (`prepare`) or at `stop` (`close_out`): the one place windows are counted.
    fn count_windows(&self, out: CheckOutcome) {
        if let Ok(mut stats) = self.stats.try_borrow_mut() {
            stats.windows_opened += out.opened as u64;
            stats.window_armed_allocations =
                stats.window_armed_allocations.saturating_add(out.armed);
            stats.window_late_allocations += out.late;
            stats.windows_spanned += out.spanned;
            stats.window_wakeups += (out.woke != 0) as u64;
            if let Some(watched) = out.closed {
                stats.window_allocations = stats.window_allocations.saturating_add(watched);
            }
        }
        let watched = out.closed.unwrap_or(0);
        self.budget.charge_window(watched.saturating_add(out.armed));
    }

    /// `config` with the mean interval in force: `sample_every` times the budget's scale.
    pub fn effective(&self, config: SampleConfig) -> SampleConfig {
        let scaled = (config.sample_every as f64 * self.budget.scale()).round();
        let sample_every = match scaled.is_finite() && scaled >= 1.0 {
            true => (scaled.min((u64::MAX / 4) as f64) as u64).max(config.sample_every),
            false => config.sample_every,
        };
        SampleConfig {
            sample_every,
            ..config
        }
    }

    /// Whether this session needs the NEWOBJ hook now.
    pub fn wants_hook(&self, mode: Mode) -> bool {
        match mode {
            Mode::Countdown => true,
            Mode::Windowed { .. } => self.checkpoints.phase() != Phase::Idle,
        }
    }

    /// Windowed mode, at an interrupt check (the window job) with the program's allocation count
    /// `now`: opens, closes or arms this session's window (see `checkpoints`), counting what it
    /// did. `horizon`: how many allocations ahead of a window's start to arm; `min_length`: the
    /// shortest window to place next (long enough for the timer to arm it in time, see
    /// `runtime::windows`); `asked`: the timer asked for this job (else the hook did, at a
    /// boundary); `prompt`: it ran as soon as the timer asked (see `Checkpoints::on_check`).
    /// Needs the GVL; never from the hook.
    pub fn check(
        &self,
        config: SampleConfig,
        now: u64,
        horizon: u64,
        min_length: u64,
        (asked, prompt): (bool, bool),
    ) -> Checked {
        let (share, length) = self.effective(config).window_shape();
        let length = length.max(min_length);
        let mut rng = || self.uniform();
        let out: CheckOutcome =
            (self.checkpoints).on_check(now, length, share, horizon, prompt, &mut rng);
        if let Ok(mut stats) = self.stats.try_borrow_mut() {
            stats.window_ticks += asked as u64;
        }
        self.count_windows(out);
        Checked {
            ahead: self.checkpoints.allocations_to_start(now),
            late: out.late,
            woke: out.woke,
        }
    }

    /// Windowed mode, while no window is near: arms the hook to ask for the window job after
    /// `after` of the program's allocations from `now` (see `Checkpoints::wake`); whether it did.
    /// Needs the GVL; never from the hook.
    pub fn wake(&self, now: u64, after: u64, stage: u8) -> bool {
        self.checkpoints.wake(now, after, stage)
    }

    /// When sampling stops at the program's allocation count `now`: no window any more (every
    /// sample already weighs what it stands for); what the hook saw of the window it ends is
    /// counted and charged. Needs the GVL; never from the hook.
    pub fn close_out(&self, now: u64) {
        let (watched, armed) = self.checkpoints.forget(now);
        self.count_windows(CheckOutcome {
            closed: Some(watched),
            armed,
            ..CheckOutcome::default()
        });
    }

    /// One allocation went by: whether it is the one to sample, and (windowed) whether the window
    /// job must be asked for. The hook's only work on an allocation that is not sampled. Wrapping,
    /// so it cannot panic whatever state a caught panic left behind.
    ///
    /// Before Ruby 3.3 the job asked for runs on the thread that asked, at its next interrupt
    /// check; a thread that blocks on IO right after asking would hold the window open (or shut)
    /// while other threads allocate. So while the job is awaited, an allocation on another
    /// thread (which got the GVL at a check of its own) asks again, from that thread.
    #[inline]
    pub fn tick(&self, mode: Mode) -> Tick {
        let mut boundary = false;
        if let Mode::Windowed { .. } = mode {
            let (inside, at_boundary, waiting) = self.checkpoints.on_allocation();
            if at_boundary || waiting {
                let thread = crate::shims::current_thread();
                boundary = self.asked_from.replace(thread) != thread || at_boundary;
            }
            if !inside {
                return Tick {
                    due: false,
                    boundary,
                };
            }
        }
        let left = self.countdown.get().wrapping_sub(1);
        self.countdown.set(left);
        Tick {
            due: left == 0,
            boundary,
        }
    }

    /// The cluster a sample taken now belongs to: the window's number in windowed mode (its
    /// samples were watched together), 0 (none) for the countdown.
    pub fn cluster(&self, mode: Mode) -> u64 {
        match mode {
            Mode::Countdown => 0,
            Mode::Windowed { .. } => self.checkpoints.serial(),
        }
    }

    /// Lets the next allocation take the sample instead (more sessions were due at once than
    /// one hook call serves).
    pub fn postpone(&self) {
        self.countdown.set(1);
    }

    /// For a forked child: a fresh random stream (parent and child must not sample the same
    /// allocations) and counters from zero.
    pub fn after_fork(&self) {
        self.rng.set(seed());
        if let Ok(mut stats) = self.stats.try_borrow_mut() {
            *stats = SamplerStats::default();
        }
    }

    /// Test aid: a fixed seed, so estimates cannot flake.
    pub fn set_seed(&self, seed: u64) {
        self.rng.set(seed | 1);
    }

    /// A uniform draw in [0, 1).
    fn uniform(&self) -> f64 {
        (self.next_random() >> 11) as f64 / (1u64 << 53) as f64
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
    /// allocation patterns cannot line up with the sampling points. A geometric countdown is a
    /// coin of chance 1 / `every` tossed at each allocation, so the sample it leads to weighs
    /// `every`, not the interval it ended: an interval's allocations are not all of the sampled
    /// one's kind, and weighing the interval gives the allocations at the start of a recording
    /// (the first interval is cut short there) and those after the last sample no weight at all,
    /// which read a block of objects made right after `start` about one interval low.
    fn draw_interval(&self, every: u64) {
        let every = every.max(1);
        let interval = if every == 1 {
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
        self.mean.set(every);
    }

    /// The countdown ran out: the weight of the sample due now (the mean its countdown was drawn
    /// with, over the chance that its window watched it in windowed mode), counted as seen, and
    /// the next interval drawn. Called before deciding whether to take the sample, so skipped
    /// samples are counted too.
    fn on_due(&self, stats: &mut SamplerStats, config: SampleConfig) -> u64 {
        let mean = self.mean.get();
        let weight = match config.mode {
            Mode::Countdown => mean,
            Mode::Windowed { .. } => {
                let scaled = (mean as f64 * self.checkpoints.scale()).round();
                if scaled.is_finite() && scaled >= 1.0 {
                    scaled.min(u64::MAX as f64 / 2.0) as u64
                } else {
                    1
                }
            }
        };
        stats.allocations_seen = stats.allocations_seen.wrapping_add(weight);
        self.draw_interval(self.effective(config).countdown_mean());
        weight
    }
}

/// A seed from the clock and the pid (so a forked child differs from its parent).
fn seed() -> u64 {
    let t = Instant::now().elapsed().as_nanos() as u64;
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0);
    (now ^ t ^ (u64::from(std::process::id()) << 32)).wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1
}
