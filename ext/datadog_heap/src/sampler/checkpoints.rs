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
    /// The hook counts down to a wake-up before `start` (see [`Checkpoints::wake`]), sampling
    /// nothing: which of the two it is.
    Waking(u8),
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
    ///
    /// Returns whether the first window opened at once (it starts at `now`).
    pub fn restart(&self, now: u64, length: u64, share: f64, u: f64) -> bool {
        self.second.set(None);
        self.plan_stratum(now, length, share, u);
        self.mark.set(now);
        self.left.set(0);
        let ahead = self.start.get().saturating_sub(now);
        match ahead {
            0 => {
                self.open(now);
                return true;
            }
            a if a <= length => {
                self.phase.set(Phase::Armed);
                self.left.set(a);
            }
            _ => {
                self.phase.set(Phase::Idle);
                self.wake(now, WAKE_AFTER, 1);
            }
        }
        false
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
    ///
    /// Returns whether the hook was armed (only from idle, before the start).
    pub fn wake(&self, now: u64, after: u64, stage: u8) -> bool {
        let ahead = self.start.get().saturating_sub(now);
        if self.phase.get() != Phase::Idle || ahead == 0 {
            return false;
        }
        self.phase.set(match after < ahead {
            true => Phase::Waking(stage.max(1)),
            false => Phase::Armed,
        });
        self.mark.set(now);
        self.left.set(after.clamp(1, ahead));
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
                Phase::Waking(stage) => {
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
                        out.woke = stage;
                    }
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
            Phase::Armed | Phase::Waking(_) => (0, since),
            Phase::Idle => (0, 0),
        };
        self.phase.set(Phase::Idle);
        self.left.set(0);
        seen
    }
}

#[cfg(test)]
mod tests;
