//! Where the windowed sampler's windows go: placed in the program's allocations, opened and
//! closed at the VM's interrupt checks.
//!
//! The program's allocations are numbered by the VM's counter less our own (`program_allocations`).
//! From where sampling starts, that line is cut into strata of `length / d` allocations, `d =
//! mean / sample_every`, and each stratum holds one window of `length` at a uniform offset,
//! wrapping around to the stratum's beginning when it runs past its end. So every allocation of a
//! stratum is inside the window with chance `d` exactly, whatever came before (a stratum's
//! length, set from the program's pace when it begins, is known before its offset is drawn), and
//! a sample in one weighs its countdown interval over `d`.
//!
//! The VM only runs our code at its interrupt checks (where postponed jobs run: method returns,
//! backward branches), never inside a C function, and the allocations between two checks are
//! all watched or none is. A window therefore opens at the first check at or past its start and
//! closes at the first check at or past its end: the stretch after a check is watched exactly
//! when that check's count lies inside a window. Which counts the checks fall on is the
//! program's doing, never the sampler's (our own slowdown inside a window moves checks in time,
//! not along the line), so every stretch, one long `Marshal.load` included, is watched with the
//! same chance `d`, and nothing is credited from one site to another. The cost is the variance
//! of a cluster sample: such a stretch is all in or all out.
//!
//! Finding the first check past a point needs the hook installed a little before it: the timer's
//! tick, which also runs at a check, arms the window once the count is within `horizon` of its
//! start (the hook then counts down to the start, sampling nothing, and asks for the window job
//! when it gets there); the job, at the next check, opens it. The same count-down asks for the
//! job at the end. A tick that comes after the start (the program allocated faster than the
//! timer foresaw) moves the window to where it opens, keeping its length and the place of the
//! next one (`window_late_allocations` counts by how much).
//!
//! A program that hardly allocates at a tick (it sleeps, or waits on a socket) gives the timer
//! no pace to foresee a burst by, and the next tick may come after the burst passed several
//! starts. Such a tick arms the hook to wake the sampler instead (`wake`): after a few hundred
//! allocations, the hook asks for the job, whose check measures the program's pace afresh and
//! arms or hurries the timer as for any busy stretch.

use std::cell::Cell;
use std::sync::atomic::{AtomicU64, Ordering};

/// Allocations after which a wake-up asks for the window job (see [`Checkpoints::wake`]); the
/// second wake-up after as many again, so it measures the program's pace over allocating time
/// only. About 15 µs of the hook's slow path each on Ruby 3.1.
pub const WAKE_AFTER: u64 = 512;

/// Where a session's window process stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub(super) enum Phase {
    /// No hook needed: the next window starts at `start`.
    #[default]
    Idle,
    /// The hook counts down to `start`, sampling nothing.
    Armed,
    /// Inside the window: the hook samples, and counts down to `end`.
    Open,
}

/// What a check did (see [`Checkpoints::on_check`]).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub(super) struct CheckOutcome {
    pub opened: bool,
    /// The window closed at this check, having watched this many allocations.
    pub closed: Option<u64>,
    /// Allocations by which a late timer moved a window (see `on_check`).
    pub late: u64,
    /// The hook's wake-up came (see [`Checkpoints::wake`]): its stage, else 0.
    pub woke: u8,
    /// Windows that no check fell inside (a C call or a GC spanned them).
    pub spanned: u64,
    /// The hook counted this many allocations before the window opened (armed, unwatched).
    pub armed: u64,
}

/// One session's windows along the program's allocations.
#[derive(Default)]
pub(super) struct Checkpoints {
    phase: Cell<Phase>,
    /// Allocations the hook still counts before the next boundary (the start when armed, the end
    /// when open); 0 once it asked for the job there.
    left: Cell<u64>,
    start: Cell<u64>,
    end: Cell<u64>,
    /// Where the current stratum ends (the next one begins).
    stratum_end: Cell<u64>,
    /// The stratum's later piece of window, when its window wrapped around (the earlier piece,
    /// at the stratum's beginning, comes first).
    second: Cell<Option<(u64, u64)>>,
    /// Where the window opened, or where arming began.
    mark: Cell<u64>,
    /// What a sample's interval is multiplied by: the stratum's length over its window's, the
    /// inverse of the chance its allocations are watched (set where the stratum is laid out).
    scale: Cell<f64>,
    /// The number of the window open now (see [`WINDOW_SERIAL`]).
    serial: Cell<u64>,
    /// Armed to wake the sampler before the start (see [`Checkpoints::wake`]): the wake-up's
    /// stage; 0 when armed to the start itself.
    waking: Cell<u8>,
}

/// The last window opened in this process, by any session: each window's samples share its
/// number as their cluster (see `HeapRecorder::record_sampled_allocation`), unique in the
/// process and in a forked child (which goes on from the parent's count).
static WINDOW_SERIAL: AtomicU64 = AtomicU64::new(0);

impl Checkpoints {
    pub fn phase(&self) -> Phase {
        self.phase.get()
    }

    /// The weight factor of a sample taken now (inside a window).
    pub fn scale(&self) -> f64 {
        self.scale.get()
    }

    /// The number of the window open now, its samples' cluster.
    pub fn serial(&self) -> u64 {
        self.serial.get()
    }

    /// Starts the strata at `now`, from a uniform draw `u`. A first window that starts within
    /// a window's length is armed at once (no tick may come before it); for a later one the hook
    /// wakes the sampler after [`WAKE_AFTER`] allocations, as after a quiet tick: no pace is
    /// known yet, and the first tick may come after the program passed the start. Arming all
    /// the way to a far start would install the hook for up to a whole stratum, a cost a
    /// recorder started often (once a request, say) would pay each time.
    pub fn restart(&self, now: u64, length: u64, share: f64, u: f64) {
        self.second.set(None);
        self.waking.set(0);
        self.plan_stratum(now, length, share, u);
        self.mark.set(now);
        self.left.set(0);
        let ahead = self.start.get().saturating_sub(now);
        match ahead {
            0 => self.open(now),
            a if a <= length => {
                self.phase.set(Phase::Armed);
                self.left.set(a);
            }
            _ => {
                self.phase.set(Phase::Idle);
                self.wake(now, WAKE_AFTER, 1);
            }
        }
    }

    /// Lays out the stratum that begins at `from`: its end, and its window at offset `u` of it
    /// (in two pieces when it wraps around).
    fn plan_stratum(&self, from: u64, length: u64, share: f64, u: f64) {
        let length = length.max(1);
        let span = ((length as f64 / share.clamp(1e-9, 1.0)).round() as u64).max(length);
        let offset = ((u * span as f64) as u64).min(span - 1);
        self.stratum_end.set(from + span);
        self.scale.set(span as f64 / length as f64);
        let (start, end) = match offset + length <= span {
            true => (from + offset, from + offset + length),
            false => {
                self.second.set(Some((from + offset, from + span)));
                (from, from + offset + length - span)
            }
        };
        self.start.set(start);
        self.end.set(end);
    }

    fn open(&self, now: u64) {
        self.phase.set(Phase::Open);
        self.mark.set(now);
        self.left.set(self.end.get().saturating_sub(now));
        self.serial
            .set(WINDOW_SERIAL.fetch_add(1, Ordering::Relaxed) + 1);
    }

    /// The next window: the stratum's later piece, or the next stratum's window.
    fn next_window(&self, length: u64, share: f64, u: f64) {
        match self.second.take() {
            Some((start, end)) => {
                self.start.set(start);
                self.end.set(end);
            }
            None => self.plan_stratum(self.stratum_end.get(), length, share, u),
        }
        self.phase.set(Phase::Idle);
        self.left.set(0);
    }

    /// While idle, arms the hook to ask for the window job after `after` allocations (or at the
    /// window's start if that comes first), so a burst of allocations wakes the sampler however
    /// late the timer's next tick comes. `stage` tells the wake-up's check which one it was.
    /// Whether the hook was armed.
    pub fn wake(&self, now: u64, after: u64, stage: u8) -> bool {
        let ahead = self.start.get().saturating_sub(now);
        if self.phase.get() != Phase::Idle || ahead == 0 {
            return false;
        }
        self.phase.set(Phase::Armed);
        self.mark.set(now);
        self.left.set(after.clamp(1, ahead));
        self.waking.set(if after < ahead { stage.max(1) } else { 0 });
        true
    }

    /// At an interrupt check (the window job, a timer tick, or the hook's request), with the
    /// program's allocation count `now`: opens, closes or arms. `length` and `share` lay out the
    /// next stratum; `horizon`: how far ahead of a start to arm; `draw` gives the uniform draws
    /// that place the windows in their strata.
    ///
    /// A tick that finds a window's start behind it (the hook was not armed) is late. When the
    /// timer itself was late (`prompt`: the job ran as soon as the timer asked), the program ran
    /// Ruby code past the start, which a window must not miss: the window opens now for its
    /// whole length, and the strata stay where they were, so the windows keep their share.
    /// When the job itself was held up (a long C call or a GC ran
    /// past the start, where no check falls), what went by belongs to a stretch that began
    /// before the start, outside the window: it opens now with its end unchanged, or not at all.
    pub fn on_check(
        &self,
        now: u64,
        length: u64,
        share: f64,
        horizon: u64,
        prompt: bool,
        mut draw: impl FnMut() -> f64,
    ) -> CheckOutcome {
        let mut out = CheckOutcome::default();
        // Bounded: each pass moves a window forward or returns.
        for _ in 0..1_000_000 {
            match self.phase.get() {
                Phase::Open => {
                    if now < self.end.get() {
                        return out;
                    }
                    out.closed = Some(now.saturating_sub(self.mark.get()));
                    self.next_window(length, share, draw());
                }
                Phase::Armed if self.waking.get() != 0 => {
                    // Armed to wake. A tick before the wake-up leaves it armed unless the start
                    // is near enough to arm for (a tick that finds the program busy does not
                    // arm another, and its hurried successor may find the program asleep); the
                    // wake-up's own check decides anew from here, the start included.
                    let fired = self.left.get() == 0;
                    if !fired && self.start.get().saturating_sub(now) > horizon {
                        return out;
                    }
                    out.armed += now.saturating_sub(self.mark.get());
                    if fired {
                        out.woke = self.waking.get();
                    }
                    self.waking.set(0);
                    self.phase.set(Phase::Idle);
                }
                Phase::Armed => {
                    if now < self.start.get() {
                        return out;
                    }
                    out.armed += self.start.get().saturating_sub(self.mark.get());
                    if now >= self.end.get() {
                        // No check fell inside the window (one C call spanned it): nothing of it
                        // was the program's to watch.
                        out.spanned += 1;
                        self.next_window(length, share, draw());
                        continue;
                    }
                    self.open(now);
                    out.opened = true;
                }
                Phase::Idle => {
                    let (start, end) = (self.start.get(), self.end.get());
                    if now >= start && prompt {
                        out.late += now - start;
                        self.end.set(now + (end - start));
                        self.open(now);
                        out.opened = true;
                        return out;
                    }
                    if now >= end {
                        out.spanned += 1;
                        self.next_window(length, share, draw());
                        continue;
                    }
                    if now >= start {
                        self.open(now);
                        out.opened = true;
                        return out;
                    }
                    if start - now <= horizon {
                        self.phase.set(Phase::Armed);
                        self.mark.set(now);
                        self.left.set(start - now);
                    }
                    return out;
                }
            }
        }
        out
    }

    /// Allocations until the start of the next window when idle (for the timer to come back in
    /// time); `None` when the hook is counting.
    pub fn allocations_to_start(&self, now: u64) -> Option<u64> {
        match self.phase.get() {
            Phase::Idle => Some(self.start.get().saturating_sub(now)),
            _ => None,
        }
    }

    /// One allocation the hook saw: (inside the window, reached a boundary: ask for the job,
    /// past a boundary: the job was asked for and has not run yet).
    #[inline]
    pub fn on_allocation(&self) -> (bool, bool, bool) {
        let phase = self.phase.get();
        if phase == Phase::Idle {
            return (false, false, false);
        }
        let left = self.left.get();
        let boundary = left == 1;
        if left > 0 {
            self.left.set(left - 1);
        }
        (phase == Phase::Open, boundary, left == 0)
    }

    /// Sampling stopped at the count `now`: no window, no hook (`restart` begins anew). Returns
    /// what the hook saw of the window it ends: (allocations watched, allocations armed).
    pub fn forget(&self, now: u64) -> (u64, u64) {
        let since = now.saturating_sub(self.mark.get());
        let seen = match self.phase.get() {
            Phase::Open => (since, 0),
            Phase::Armed => (0, since),
            Phase::Idle => (0, 0),
        };
        self.phase.set(Phase::Idle);
        self.left.set(0);
        self.waking.set(0);
        seen
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn draws(seed: u64) -> impl FnMut() -> f64 {
        // Scrambled, so that small seeds do not start with small draws.
        let mut x = (seed.wrapping_add(1)).wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 11) as f64 / (1u64 << 53) as f64
        }
    }

    /// Runs the process over a line of `n` allocations with a check every `every` allocations,
    /// returning per allocation whether it was watched. The window length changes from stratum
    /// to stratum (as the program's pace does), which must not move the chance.
    fn simulate(n: u64, every: u64, share: f64, seed: u64) -> Vec<bool> {
        let cp = Checkpoints::default();
        let mut draw = draws(seed);
        cp.restart(0, 64, share, draw());
        let mut watched = vec![false; n as usize];
        for i in 0..n {
            if i % every == 0 {
                let length = 40 + (i / 300) * 16;
                cp.on_check(i, length, share, u64::MAX, false, &mut draw);
            }
            let (inside, ..) = cp.on_allocation();
            watched[i as usize] = inside;
        }
        watched
    }

    #[test]
    fn every_allocation_is_watched_with_the_share_asked() {
        // A check every 7 allocations, windows growing from 40 to 136 at a share of 1/16: the
        // chance of being watched is the share at every position, the first ones included.
        let (n, runs, share) = (2_000u64, 4_000u64, 1.0 / 16.0);
        let mut hits = vec![0u32; n as usize];
        for seed in 0..runs {
            for (i, w) in simulate(n, 7, share, seed * 7919 + 1).iter().enumerate() {
                hits[i] += *w as u32;
            }
        }
        let sigma = (share * (1.0 - share) / runs as f64).sqrt();
        for chunk in hits.chunks(100) {
            let mean = chunk.iter().map(|&h| h as f64).sum::<f64>() / (100 * runs) as f64;
            assert!(
                (mean - share).abs() < 4.0 * sigma,
                "mean {mean} against {share}"
            );
        }
    }

    #[test]
    fn a_stretch_without_checks_is_all_in_or_all_out() {
        // Checks at 0 and at 10,000 only: the 10,000 allocations between are one stretch.
        let cp = Checkpoints::default();
        let mut draw = draws(3);
        let (mut all, mut none) = (0, 0);
        for _ in 0..2_000 {
            cp.restart(0, 64, 0.25, draw());
            cp.on_check(0, 64, 0.25, u64::MAX, false, &mut draw);
            let watched = (0..10_000).filter(|_| cp.on_allocation().0).count();
            match watched {
                0 => none += 1,
                10_000 => all += 1,
                other => panic!("{other} of the stretch watched"),
            }
        }
        let share = all as f64 / (all + none) as f64;
        assert!((share - 0.25).abs() < 0.04, "{share}");
    }

    #[test]
    fn a_window_that_runs_past_its_stratum_wraps_to_its_beginning() {
        let cp = Checkpoints::default();
        // Stratum [1000, 1256) for windows of 64 at a quarter; offset 0.9 * 256 = 230.
        cp.plan_stratum(1_000, 64, 0.25, 0.9);
        assert_eq!((cp.start.get(), cp.end.get()), (1_000, 1_038));
        assert_eq!(cp.second.get(), Some((1_230, 1_256)));
        assert_eq!(cp.stratum_end.get(), 1_256);
        cp.next_window(64, 0.25, 0.0);
        assert_eq!((cp.start.get(), cp.end.get()), (1_230, 1_256));
        cp.next_window(64, 0.25, 0.0);
        assert_eq!((cp.start.get(), cp.end.get()), (1_256, 1_320));
    }

    #[test]
    fn a_window_weighs_by_its_stratum_whatever_the_share_when_it_opens() {
        // Laid out at a quarter (a stratum of 256 for a window of 64); the budget then halves
        // the share before the window opens: its samples still stand for 256 / 64 each.
        let cp = Checkpoints::default();
        cp.plan_stratum(0, 64, 0.25, 100.0 / 256.0);
        let out = cp.on_check(120, 64, 0.125, 100, false, || 0.5);
        assert!(out.opened);
        assert_eq!(cp.scale(), 4.0);
    }

    #[test]
    fn the_hook_asks_for_the_job_at_each_boundary_once() {
        let cp = Checkpoints::default();
        cp.plan_stratum(0, 64, 0.25, 100.0 / 256.0);
        assert_eq!((cp.start.get(), cp.end.get()), (100, 164));
        let out = cp.on_check(40, 64, 0.25, 100, false, || 0.5);
        assert_eq!(out, CheckOutcome::default());
        assert_eq!(cp.phase(), Phase::Armed);
        let asks: Vec<u64> = (40..120).filter(|_| cp.on_allocation().1).collect();
        assert_eq!(asks.len(), 1);
        let out = cp.on_check(120, 64, 0.25, 100, false, || 0.5);
        assert!(out.opened);
        assert_eq!(out.armed, 60);
        assert_eq!(cp.phase(), Phase::Open);
        let asks = (120..200).filter(|_| cp.on_allocation().1).count();
        assert_eq!(asks, 1);
        let out = cp.on_check(200, 64, 0.25, 100, false, || 0.5);
        assert_eq!(out.closed, Some(80));
        assert_eq!(cp.phase(), Phase::Idle);
        // The next window is in the next stratum, wherever the check fell.
        assert_eq!(cp.start.get(), 256 + 128);
    }

    #[test]
    fn a_wake_up_asks_for_the_job_after_its_allocations_and_a_tick_before_it_leaves_it_armed() {
        let cp = Checkpoints::default();
        cp.plan_stratum(0, 64, 0.25, 150.0 / 256.0);
        assert_eq!((cp.start.get(), cp.end.get()), (150, 214));
        assert!(cp.wake(10, 50, 1));
        assert_eq!(cp.phase(), Phase::Armed);
        // A tick before the wake-up, the start still beyond its horizon: nothing changes.
        assert_eq!(cp.on_check(30, 64, 0.25, 16, true, || 0.5), CheckOutcome::default());
        assert_eq!(cp.phase(), Phase::Armed);
        let asks: Vec<u64> = (10..70).filter(|_| cp.on_allocation().1).collect();
        assert_eq!(asks.len(), 1);
        let out = cp.on_check(70, 64, 0.25, 16, false, || 0.5);
        assert_eq!((out.woke, out.armed, out.opened), (1, 60, false));
        assert_eq!(cp.phase(), Phase::Idle);
        // The second wake-up; a tick with the start within its horizon arms for the start.
        assert!(cp.wake(70, 50, 2));
        let out = cp.on_check(80, 64, 0.25, 150, true, || 0.5);
        assert_eq!((out.woke, out.armed), (0, 10));
        assert_eq!((cp.phase(), cp.waking.get(), cp.left.get()), (Phase::Armed, 0, 70));
        // Asked to wake later than the start: armed for the start itself.
        let cp = Checkpoints::default();
        cp.plan_stratum(0, 64, 0.25, 150.0 / 256.0);
        assert!(cp.wake(140, 50, 1));
        assert_eq!((cp.waking.get(), cp.left.get()), (0, 10));
        assert!(!cp.wake(145, 50, 1), "only from idle");
    }

    #[test]
    fn a_late_timer_moves_the_window_and_a_held_up_job_does_not() {
        let cp = Checkpoints::default();
        cp.plan_stratum(0, 64, 0.25, 100.0 / 256.0);
        let out = cp.on_check(130, 64, 0.25, 10, true, || 0.5);
        assert!(out.opened);
        assert_eq!(out.late, 30);
        assert_eq!(cp.end.get(), 194);
        let out = cp.on_check(1_000, 64, 0.25, 10, false, || 0.5);
        assert_eq!(out.closed, Some(870));
        // Past a window that no check fell inside (a C call spanned it): counted, and skipped.
        let cp = Checkpoints::default();
        cp.plan_stratum(0, 64, 0.25, 100.0 / 256.0);
        let out = cp.on_check(170, 64, 0.25, 10, false, || 0.5);
        assert_eq!((out.opened, out.spanned), (false, 1));
        // Held up past the start but not the end: opens for what is left.
        let cp = Checkpoints::default();
        cp.plan_stratum(0, 64, 0.25, 100.0 / 256.0);
        let out = cp.on_check(150, 64, 0.25, 10, false, || 0.5);
        assert!(out.opened && out.late == 0);
        assert_eq!(cp.end.get(), 164);
    }
}
