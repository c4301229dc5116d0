//! The built-in allocation sampler's per-session state and the sampled path of the NEWOBJ hook:
//! when to sample, and what one sample does (capture the stack, name it only if the stack cache
//! does not know it, record it in the core).
//!
//! Two ways to choose the samples ([`Mode`]), both with a mean of `sample_every` allocations per
//! sample:
//! - countdown: a geometric countdown with mean `sample_every` over every allocation. The NEWOBJ
//!   hook is installed all the time, and with it CRuby sends every allocation down its slow path.
//! - windowed: the hook is installed only for windows that a timer opens at random times. A window
//!   covers the next `share * gap` allocations, where `gap` is how many the VM made since the
//!   previous window closed (the VM's counter, `total_allocated_objects`, less the allocations of
//!   our own work, which the hook does not count inside windows either) and `share` is
//!   `m / (sample_every - m)`. Inside, a geometric countdown with mean `m` (`WINDOW_SAMPLE_EVERY`,
//!   or half of a smaller `sample_every`) takes the samples, each weighted by its interval times
//!   `(gap + window) / window`, so a window's samples stand for the gap before it as well:
//!   allocation rates may change between windows without biasing the estimate. Between windows no
//!   hook is installed and allocations run at full speed.
//!
//!   Once the window after a gap has closed too, part of the gap may go back to the window before
//!   it, by the program's allocation rates before and after the gap (see [`share_of_gap_before`]
//!   and `share_last_gap`): the earlier window's records' weights are scaled up and the later
//!   one's down. Where the program slows down inside a gap (a switch of workload at a point in
//!   time the timer does not know), crediting the whole gap to the later window gave the earlier
//!   workload's allocations to the later one's sites.

mod budget;
mod capture;
mod credits;
mod frame_names;
mod sampled;

use std::cell::{Cell, RefCell};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use datadog_heap_core::{HeapRecorder, MAX_FRAMES_LIMIT};
use rb_sys::VALUE;

pub use budget::{empty_stretch_ns, Budget, CostClock};
use capture::CapturedStack;
use credits::{apply_rescales, share_last_gap, Credited, Credits, MIN_RATE_GAP};
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

/// How a session chooses its samples (see the module docs).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Mode {
    Countdown,
    /// `per_second` windows a second on average; inside them, a sample every `mean` allocations
    /// on average (see `SampleConfig::countdown_mean`).
    Windowed {
        per_second: f64,
        mean: u64,
    },
}

impl Mode {
    /// The windowed sampler's rate of windows; `None` for the countdown sampler.
    pub fn windows_per_second(self) -> Option<f64> {
        match self {
            Mode::Windowed { per_second, .. } => Some(per_second),
            Mode::Countdown => None,
        }
    }
}

/// A windowed session's current window.
#[derive(Clone, Copy, Default)]
struct Window {
    open: bool,
    /// Allocations left before it closes.
    left: u64,
    /// (gap + window) / window: what each of its samples' intervals is multiplied by.
    scale: f64,
}

/// When and how one session samples.
pub struct SamplerState {
    /// Allocations left before the next sample.
    countdown: Cell<u64>,
    /// The interval `countdown` started from: the weight of the sample it leads to.
    interval: Cell<u64>,
    rng: Cell<u64>,
    /// Frame buffers for rb_profile_frames, sized when sampling starts (never in the hook).
    frames: RefCell<Vec<VALUE>>,
    lines: RefCell<Vec<i32>>,
    window: Cell<Window>,
    /// Windowed mode: the program's allocation count (the VM's counter less our own allocations)
    /// where the previous window ended.
    last_close: Cell<u64>,
    /// Windowed mode: when the current window closed, and `own_ns` then (set by the hook).
    closed_at: Cell<Option<(Instant, u64)>>,
    /// Wall time of our own work so far (sampled hook paths, commit jobs, updates): a gap's rate
    /// leaves it out.
    own_ns: Cell<u64>,
    credits: RefCell<Credits>,
    /// Test switch: when false, each window keeps the whole gap before it (and the last one
    /// nothing after it), as before gaps were shared.
    gap_sharing: Cell<bool>,
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
    /// Windowed mode: windows opened; timer ticks that found the window still open (the program
    /// allocated less than the window covers since); allocations inside windows.
    pub windows_opened: u64,
    pub windows_still_open: u64,
    pub window_allocations: u64,
    /// Gaps shared between the windows on either side, and weight changes given up because the
    /// core stayed in use (each leaves one gap credited to one window only).
    pub window_gaps_shared: u64,
    pub window_rescales_lost: u64,
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
    /// Windowed mode: a window's length over the gap before it, `m / (sample_every - m)` for an
    /// in-window mean `m`, so that a sample weighs `sample_every` on average (its interval `m`
    /// times `(gap + window) / window`). Infinite (one window that never closes) when
    /// `sample_every` is too small to leave gaps.
    fn window_share(&self) -> f64 {
        let m = self.countdown_mean();
        match self.sample_every > m {
            true => m as f64 / (self.sample_every - m) as f64,
            false => f64::INFINITY,
        }
    }

    /// Mean interval of the countdown (inside windows, for the windowed sampler: at most half of
    /// `sample_every`, so windows leave gaps).
    fn countdown_mean(&self) -> u64 {
        match self.mode {
            Mode::Countdown => self.sample_every,
            Mode::Windowed { mean, .. } => mean.min(self.sample_every / 2).max(1),
        }
    }
}

/// What one allocation did to a session's sampler (see `SamplerState::tick`).
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct Tick {
    /// This allocation is to be sampled.
    pub due: bool,
    /// Windowed mode: the window closed with this allocation.
    pub closed: bool,
}

impl Default for SamplerState {
    fn default() -> Self {
        SamplerState {
            countdown: Cell::new(1),
            interval: Cell::new(1),
            rng: Cell::new(seed()),
            frames: RefCell::new(Vec::new()),
            lines: RefCell::new(Vec::new()),
            window: Cell::new(Window::default()),
            last_close: Cell::new(0),
            closed_at: Cell::new(None),
            own_ns: Cell::new(0),
            credits: RefCell::new(Credits::default()),
            gap_sharing: Cell::new(true),
            stats: RefCell::new(SamplerStats::default()),
            budget: Budget::new(0.0),
        }
    }
}

impl SamplerState {
    /// Gets ready to sample: frame buffers, the first interval, and (windowed) a closed window
    /// with the program's allocation count `now` to measure the first gap from. Needs the GVL;
    /// allocates (Rust allocator), so never call it from the hook.
    pub fn prepare(&self, config: SampleConfig, now: u64) {
        self.frames.borrow_mut().resize(MAX_FRAMES_LIMIT, 0);
        self.lines.borrow_mut().resize(MAX_FRAMES_LIMIT, 0);
        self.budget.restart(now);
        self.draw_interval(self.effective(config).countdown_mean());
        self.window.set(Window::default());
        self.last_close.set(now);
        self.closed_at.set(None);
        if let Ok(mut credits) = self.credits.try_borrow_mut() {
            *credits = Credits::default();
        }
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
            Mode::Windowed { .. } => self.window.get().open,
        }
    }

    /// Windowed mode: opens a window over `share * gap` allocations, unless one is open; `now` is
    /// the program's allocation count. First shares the gap before the window that closed last
    /// between it and the one before (see the module docs), scaling their records in `core`.
    /// Needs the GVL (called from the timer's tick, never from the hook).
    pub fn open_window(&self, config: SampleConfig, now: u64, core: &HeapRecorder) {
        let mut stats = self.stats.borrow_mut();
        if self.window.get().open {
            stats.windows_still_open += 1;
            return;
        }
        let gap = now.saturating_sub(self.last_close.get());
        let measured = self.closed_at.get().filter(|_| gap >= MIN_RATE_GAP);
        let gap_rate = measured.map(|(closed, own_at_close)| {
            let wall = closed.elapsed().as_nanos() as u64;
            let ours = self.own_ns.get().saturating_sub(own_at_close);
            gap as f64 / (wall.saturating_sub(ours).max(1_000) as f64 * 1e-9)
        });
        let last_id = core.last_record_id().ok();
        if let Ok(mut credits) = self.credits.try_borrow_mut() {
            share_last_gap(&mut credits, &mut stats, last_id, gap_rate);
            apply_rescales(&mut credits.deferred, &mut stats, core);
            credits.before_last = credits.last.take();
        }
        let length = (gap as f64 * self.effective(config).window_share()).round();
        let length = match length.is_finite() {
            true => (length as u64).clamp(1, u64::MAX / 4),
            false => u64::MAX / 4,
        };
        let covered = length.min(gap.max(1));
        stats.windows_opened += 1;
        stats.window_allocations = stats.window_allocations.saturating_add(covered);
        self.budget.charge_window(covered);
        self.window.set(Window {
            open: true,
            left: length,
            scale: (gap + length) as f64 / length as f64,
        });
        self.last_close.set(now.saturating_add(length));
        self.closed_at.set(None);
        // With gap sharing off (a test switch) no window is kept, so none is shared or closed out.
        let kept = last_id.filter(|_| self.gap_sharing.get());
        if let (Ok(mut credits), Some(after_id)) = (self.credits.try_borrow_mut(), kept) {
            credits.last = Some(Credited {
                after_id,
                up_to_id: after_id,
                gap,
                gap_rate,
                length,
                credit: gap as f64 + length as f64,
            });
        }
    }

    /// Windowed mode, when sampling stops at the program's allocation count `now`: the last
    /// window's records take the allocations since it closed, or, if it is still open, stand for
    /// the part of it that came and no more (see `Credited`). Queued weight changes that `core`
    /// still refuses are given up, counted. Needs the GVL; never from the hook.
    pub fn close_out(&self, config: SampleConfig, now: u64, core: &HeapRecorder) {
        let Mode::Windowed { .. } = config.mode else {
            return;
        };
        let (Ok(mut stats), Ok(mut credits)) =
            (self.stats.try_borrow_mut(), self.credits.try_borrow_mut())
        else {
            return;
        };
        let window = self.window.get();
        let credits = &mut *credits;
        if let (Some(last), Ok(up_to_id)) = (credits.last.as_mut(), core.last_record_id()) {
            last.up_to_id = up_to_id;
            match window.open {
                true => last.cut_short(
                    last.length.saturating_sub(window.left),
                    &mut credits.deferred,
                ),
                false => last.take_the_rest(
                    now.saturating_sub(self.last_close.get()),
                    &mut credits.deferred,
                ),
            }
        }
        apply_rescales(&mut credits.deferred, &mut stats, core);
        stats.window_rescales_lost += credits.deferred.len() as u64;
        *credits = Credits::default();
        self.window.set(Window::default());
        self.last_close.set(now);
    }

    /// One allocation went by: whether it is the one to sample, and (windowed) whether it closed
    /// the window. The hook's only work on an allocation that is not sampled. Wrapping, so it
    /// cannot panic whatever state a caught panic left behind.
    #[inline]
    pub fn tick(&self, mode: Mode) -> Tick {
        let mut closed = false;
        if let Mode::Windowed { .. } = mode {
            let mut window = self.window.get();
            window.left = window.left.wrapping_sub(1);
            if window.left == 0 {
                window.open = false;
                closed = true;
                self.closed_at
                    .set(Some((Instant::now(), self.own_ns.get())));
            }
            self.window.set(window);
        }
        let left = self.countdown.get().wrapping_sub(1);
        self.countdown.set(left);
        Tick {
            due: left == 0,
            closed,
        }
    }

    /// Counts `ns` of wall time spent in our own work (see `own_ns`).
    pub fn add_own_time(&self, ns: u64) {
        self.own_ns.set(self.own_ns.get().wrapping_add(ns));
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

    /// Test switch (see `gap_sharing`).
    pub fn set_gap_sharing(&self, enabled: bool) {
        self.gap_sharing.set(enabled);
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
    fn draw_interval(&self, every: u64) {
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

    /// The countdown ran out: the weight of the sample due now (its interval, scaled up to the
    /// window's gap in windowed mode), counted as seen, and the next interval drawn. Called
    /// before deciding whether to take the sample, so skipped samples are counted too.
    fn on_due(&self, stats: &mut SamplerStats, config: SampleConfig) -> u64 {
        let interval = self.interval.get();
        let weight = match config.mode {
            Mode::Countdown => interval,
            Mode::Windowed { .. } => {
                let scaled = (interval as f64 * self.window.get().scale).round();
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
