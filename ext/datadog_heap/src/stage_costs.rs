//! Stage costs: time spent in each stage of our own work (the sampled path of the hook and its
//! parts, the commit job and its WeakMap writes, the young-update job, the GC mark), for
//! `DatadogHeap::Testing` and the cost tables in docs/performance.md. Off by default: when off,
//! each probe is one relaxed atomic load and a branch. When on, each probe reads the monotonic
//! clock twice (vDSO, about 20–30 ns a read, so nested probes barely disturb each other) and adds
//! the time to its stage's total and to a log-linear histogram, from which `snapshot` reports the
//! median: a thread descheduled inside a stage (a loaded machine) inflates the total, hardly the
//! median.
//!
//! Process-wide, inherited by a forked child (its counters start from the parent's values).
//! Callable from the hook: no allocation, no raise, no GVL release.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};

/// The stages measured.
#[derive(Clone, Copy)]
pub enum Stage {
    /// The whole sampled path of the NEWOBJ hook (what follows is inside it).
    Sample,
    /// `rb_profile_frames`.
    Capture,
    /// Naming the frames of a stack the stack cache did not know.
    Naming,
    /// The core's record: stack cache, naming, interning, dedup, pending queue.
    Record,
    /// The commit job, all sessions.
    Commit,
    /// `WeakMap#[]=` calls (inside Commit).
    WeakMapSet,
    /// The young-update job, all sessions.
    YoungUpdate,
    /// The window job (windowed sampler): opening windows, installing the hook. (A window's
    /// close, the hook's removal, is in the commit job that follows it.)
    Window,
    /// A recorder's GC mark function: the weak map, the pending objects and the frame handles
    /// the caches keep (inside a GC, at every GC, minor ones included).
    Mark,
}

const STAGES: usize = 9;
const NAMES: [&str; STAGES] = [
    "sample",
    "capture",
    "naming",
    "record",
    "commit",
    "weak_map_set",
    "young_update",
    "window",
    "mark",
];

static ENABLED: AtomicBool = AtomicBool::new(false);
static NS: [AtomicU64; STAGES] = [const { AtomicU64::new(0) }; STAGES];
static COUNT: [AtomicU64; STAGES] = [const { AtomicU64::new(0) }; STAGES];

/// Histogram buckets per stage: values under 16 ns one each, then 8 per power of two.
const BUCKETS: usize = 16 + 8 * 48;
static HISTOGRAM: [[AtomicU64; BUCKETS]; STAGES] =
    [const { [const { AtomicU64::new(0) }; BUCKETS] }; STAGES];

/// The bucket of a duration of `ns` nanoseconds.
fn bucket(ns: u64) -> usize {
    if ns < 16 {
        return ns as usize;
    }
    let exp = 63 - ns.leading_zeros() as usize; // 4 and up
    let sub = ((ns >> (exp - 3)) & 7) as usize;
    (16 + (exp - 4) * 8 + sub).min(BUCKETS - 1)
}

/// The middle of bucket `i`'s range of durations.
fn bucket_middle(i: usize) -> u64 {
    if i < 16 {
        return i as u64;
    }
    let (exp, sub) = ((i - 16) / 8 + 4, ((i - 16) % 8) as u64);
    let low = (8 + sub) << (exp - 3);
    low + (1 << (exp - 3)) / 2
}

/// The monotonic clock in ns.
fn now_ns() -> u64 {
    crate::shims::clock_ns(crate::shims::Clock::Monotonic)
}

/// A started measurement; `end` adds it to its stage.
pub struct Probe(Option<(Stage, u64)>);

/// Starts measuring `stage` (nothing when stage costs are off).
#[inline]
pub fn start(stage: Stage) -> Probe {
    match ENABLED.load(Relaxed) {
        true => Probe(Some((stage, now_ns()))),
        false => Probe(None),
    }
}

impl Probe {
    #[inline]
    pub fn end(self) {
        if let Some((stage, started)) = self.0 {
            let spent = now_ns().saturating_sub(started);
            NS[stage as usize].fetch_add(spent, Relaxed);
            COUNT[stage as usize].fetch_add(1, Relaxed);
            HISTOGRAM[stage as usize][bucket(spent)].fetch_add(1, Relaxed);
        }
    }
}

/// Turns measuring on or off, and zeroes the counters.
pub fn set_enabled(enabled: bool) {
    for i in 0..STAGES {
        NS[i].store(0, Relaxed);
        COUNT[i].store(0, Relaxed);
        HISTOGRAM[i].iter().for_each(|b| b.store(0, Relaxed));
    }
    ENABLED.store(enabled, Relaxed);
}

/// The median of stage `i`'s durations (within 1/16 of it), 0 before any.
fn median(i: usize) -> u64 {
    let counts: Vec<u64> = HISTOGRAM[i].iter().map(|b| b.load(Relaxed)).collect();
    let total: u64 = counts.iter().sum();
    let mut seen = 0;
    for (b, &n) in counts.iter().enumerate() {
        seen += n;
        if total > 0 && seen * 2 >= total {
            return bucket_middle(b);
        }
    }
    0
}

/// `[[stage, total ns, count, median ns], ...]` and, last, `["overhead_ns", one probe's own
/// cost, 1, the same]`.
pub fn snapshot() -> Vec<(String, u64, u64, u64)> {
    let mut out: Vec<(String, u64, u64, u64)> = (0..STAGES)
        .map(|i| {
            (
                NAMES[i].to_string(),
                NS[i].load(Relaxed),
                COUNT[i].load(Relaxed),
                median(i),
            )
        })
        .collect();
    let rounds = 1000u64;
    let started = now_ns();
    for _ in 0..rounds {
        std::hint::black_box(now_ns());
    }
    let per_pair = now_ns().saturating_sub(started) * 2 / rounds;
    out.push(("overhead_ns".to_string(), per_pair, 1, per_pair));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_are_ordered_and_their_middles_fall_inside_them() {
        let mut last = 0;
        for ns in (0..100_000u64).chain([1 << 20, 1 << 40, u64::MAX]) {
            let b = bucket(ns);
            assert!(b >= last, "{ns}");
            last = b;
        }
        for ns in [5u64, 16, 17, 100, 1_000, 2_900, 15_000, 1 << 30] {
            let middle = bucket_middle(bucket(ns));
            assert!(middle.abs_diff(ns) * 16 <= ns.max(16), "{ns} -> {middle}");
        }
    }
}
