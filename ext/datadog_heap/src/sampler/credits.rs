//! The windowed sampler's credits: how many allocations each window's records stand for, and the
//! weight changes that move a gap between the windows on either side of it (see the module docs
//! of `sampler`). Needs the GVL (the timer's tick and `stop`); never reached from the hook.

use datadog_heap_core::HeapRecorder;

use super::SamplerStats;

/// A window whose records may still have their weights moved (see the module docs).
#[derive(Clone, Copy)]
pub(super) struct Credited {
    /// Its recordings are the core's ids after this one, up to `up_to_id`.
    pub after_id: i64,
    /// Set once the next window opens (no recording of this session happens between).
    pub up_to_id: i64,
    /// Allocations in the gap before it.
    pub gap: u64,
    /// The program's allocations per second in that gap (our own work's time left out); `None`
    /// for the first window, whose gap began when sampling started.
    pub gap_rate: Option<f64>,
    /// Allocations in it.
    pub length: u64,
    /// Allocations its records stand for now: the gap before it, itself, and what later moves
    /// gave or took.
    pub credit: f64,
}

impl Credited {
    /// How much more credit it may take (see `MAX_CREDIT_GROWTH`): its first credit is the gap
    /// before it and itself.
    pub(super) fn room(&self) -> f64 {
        ((self.gap + self.length) as f64 * MAX_CREDIT_GROWTH - self.credit).max(0.0)
    }

    /// Adds `change` to its credit and queues the matching scaling of its records.
    pub(super) fn change_credit(&mut self, change: f64, deferred: &mut Vec<Rescale>) {
        let credit = self.credit + change;
        deferred.push((self.after_id, self.up_to_id, credit / self.credit));
        self.credit = credit;
    }

    /// Sampling stopped `seen` allocations into this window (it was still open): its records
    /// stand for `credit * seen / length` so far (each sample weighs its interval times the
    /// window's scale), and are made to stand for what really went by, the gap before it and the
    /// `seen` allocations of it: `credit - (length - seen)`. Nothing when it saw no allocation
    /// (it has no records).
    pub(super) fn cut_short(&mut self, seen: u64, deferred: &mut Vec<Rescale>) {
        let seen = seen.min(self.length);
        let standing = self.credit * seen as f64 / self.length.max(1) as f64;
        let credit = self.credit - (self.length - seen) as f64;
        if seen > 0 && standing > 0.0 && credit > 0.0 {
            deferred.push((self.after_id, self.up_to_id, credit / standing));
            self.credit = credit;
        }
    }

    /// Sampling stopped `after` allocations after this window, the last, closed: its records
    /// take them (no later window will share them), up to its room. Capped as a shared gap is:
    /// they can be many times what it stands for (a program that stops sampling after a long
    /// stretch no window saw), and were once credited whole, one String site 114 times its due.
    pub(super) fn take_the_rest(&mut self, after: u64, deferred: &mut Vec<Rescale>) {
        let change = (after as f64).min(self.room());
        if change > 0.0 && self.credit > 0.0 {
            self.change_credit(change, deferred);
        }
    }
}

/// A weight change waiting for the core: the ids after `.0` up to `.1`, times `.2`.
pub(super) type Rescale = (i64, i64, f64);

/// Most a window's credit may grow, over its first: a gap given back to the window before it
/// stops there, and so do the allocations after the last window at stop (uncapped, a program
/// that allocated 10,000 objects after its last window, a String window standing for 88, had
/// that window's samples stand for 114 times as much). At twice, a switch of workload was
/// sometimes not given back whole (Arrays 0.892 of the truth in one run of twelve).
const MAX_CREDIT_GROWTH: f64 = 3.0;

/// Fewest allocations in a gap for its rate to count (see `share_of_gap_before`): in gaps of a
/// few bursts (tens of allocations, at a small `sample_every` and many windows a second) the
/// rate says more about where the bursts fell than about the program, and one gap can hold ten
/// times the next (7 to 87 allocations in a row in spec/windowed_sampler_spec.rb's slow phase).
pub(super) const MIN_RATE_GAP: u64 = 512;

/// Most weight changes that wait for a core in use before the oldest is given up (counted).
const MAX_DEFERRED_RESCALES: usize = 32;

/// Windowed mode: the last two windows and the weight changes not applied yet.
#[derive(Default)]
pub(super) struct Credits {
    pub before_last: Option<Credited>,
    pub last: Option<Credited>,
    pub deferred: Vec<Rescale>,
}

/// The share of a gap that goes back to the window before it, from the program's allocation
/// rates before and after the gap: the part of the gap that the difference of the rates
/// explains, `(rate_before - rate_after) / (rate_before + rate_after)`, when the program
/// allocated faster before the gap; nothing otherwise (or when a rate is unknown).
///
/// With a switch of workload at a uniformly random time inside the gap, the earlier workload made
/// `p = rate_before / (rate_before + rate_after)` of the gap's allocations on average, and the
/// later window, which holds the whole gap first, owes it that. Moving all of `p` removed the
/// bias, but when nothing switched it moved half of every gap between windows of unequal size
/// on noisy rates: on a bursty program (allocations in bursts between sleeps) the estimates'
/// spread was 0.036-0.042 against 0.011 without sharing. Moving `2p - 1` of it keeps the correction where the gap
/// misleads most (the program slowed down: a fast gap credited to slow sites), moves nothing
/// when nothing changed, and leaves at most `min(p, 1 - p)` of the gap where it was, against
/// `p` without any sharing.
fn share_of_gap_before(rate_before: Option<f64>, rate_after: Option<f64>) -> f64 {
    match (rate_before, rate_after) {
        (Some(b), Some(a)) if b > a && a >= 0.0 && (a + b).is_finite() => (b - a) / (b + a),
        _ => 0.0,
    }
}

/// The window that closed last (`credits.last`) is complete: its records are the ids up to
/// `last_id`. If the window before it is known too, moves part of the gap between the two (the
/// one before `last`) to the earlier one, by the rates of the gaps on either side of that pair:
/// the one before the earlier window and the one just ended (`gap_rate`). Those are the
/// program's rates over whole gaps, away from both windows' own samples (a window's own rate,
/// over a few hundred allocations, moved with the time its samples cost: estimates came out 3 to
/// 10% low). The changes are queued in `credits.deferred`.
pub(super) fn share_last_gap(
    credits: &mut Credits,
    stats: &mut SamplerStats,
    last_id: Option<i64>,
    gap_rate: Option<f64>,
) {
    let (Some(last), Some(up_to_id)) = (credits.last.as_mut(), last_id) else {
        credits.last = None;
        return;
    };
    last.up_to_id = up_to_id;
    let Some(before) = credits.before_last.as_mut() else {
        return;
    };
    // At most the window's first credit again: on a bursty program a small window next to a large
    // gap could otherwise come to stand for many times its length (see `MAX_CREDIT_GROWTH`).
    let moved =
        (last.gap as f64 * share_of_gap_before(before.gap_rate, gap_rate)).min(before.room());
    if !(moved > 0.0 && before.credit > 0.0 && last.credit > moved) {
        return;
    }
    before.change_credit(moved, &mut credits.deferred);
    last.change_credit(-moved, &mut credits.deferred);
    stats.window_gaps_shared += 1;
}

/// Applies the queued weight changes `core` takes now, keeping the rest for the next window (the
/// core is in use while a commit or update of it is suspended mid-way); past
/// `MAX_DEFERRED_RESCALES` the oldest are given up, counted.
pub(super) fn apply_rescales(
    deferred: &mut Vec<Rescale>,
    stats: &mut SamplerStats,
    core: &HeapRecorder,
) {
    deferred.retain(|&(after_id, up_to_id, factor)| {
        core.rescale_weights(after_id, up_to_id, factor).is_err()
    });
    if deferred.len() > MAX_DEFERRED_RESCALES {
        let lost = deferred.len() - MAX_DEFERRED_RESCALES;
        deferred.drain(..lost);
        stats.window_rescales_lost += lost as u64;
    }
}
