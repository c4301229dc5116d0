//! Stage costs: thread CPU time spent in each stage of our own work (the sampled path of the hook
//! and its parts, the commit job and its WeakMap writes, the young-update job), for
//! `DatadogHeap::Testing` and the cost breakdown in README (issue 22). Off by default: when off,
//! each probe is one relaxed atomic load and a branch. When on, each probe reads
//! `CLOCK_THREAD_CPUTIME_ID` twice (a system call, about 0.1–0.3 µs, which `overhead_ns`
//! measures so a reader can subtract it), so time the thread spent descheduled on a loaded
//! machine is not counted.
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
}

const STAGES: usize = 7;
const NAMES: [&str; STAGES] = [
    "sample",
    "capture",
    "naming",
    "record",
    "commit",
    "weak_map_set",
    "young_update",
];

static ENABLED: AtomicBool = AtomicBool::new(false);
static NS: [AtomicU64; STAGES] = [const { AtomicU64::new(0) }; STAGES];
static COUNT: [AtomicU64; STAGES] = [const { AtomicU64::new(0) }; STAGES];

/// This thread's CPU time in ns.
fn thread_cpu_ns() -> u64 {
    crate::shims::clock_ns(crate::shims::Clock::ThreadCpu)
}

/// A started measurement; `end` adds it to its stage.
pub struct Probe(Option<(Stage, u64)>);

/// Starts measuring `stage` (nothing when stage costs are off).
#[inline]
pub fn start(stage: Stage) -> Probe {
    match ENABLED.load(Relaxed) {
        true => Probe(Some((stage, thread_cpu_ns()))),
        false => Probe(None),
    }
}

impl Probe {
    #[inline]
    pub fn end(self) {
        if let Some((stage, started)) = self.0 {
            let spent = thread_cpu_ns().saturating_sub(started);
            NS[stage as usize].fetch_add(spent, Relaxed);
            COUNT[stage as usize].fetch_add(1, Relaxed);
        }
    }
}

/// Turns measuring on or off, and zeroes the counters.
pub fn set_enabled(enabled: bool) {
    for i in 0..STAGES {
        NS[i].store(0, Relaxed);
        COUNT[i].store(0, Relaxed);
    }
    ENABLED.store(enabled, Relaxed);
}

/// `[[stage, ns, count], ...]` and, last, `["overhead_ns", one probe's own cost, 1]`.
pub fn snapshot() -> Vec<(String, u64, u64)> {
    let mut out: Vec<(String, u64, u64)> = (0..STAGES)
        .map(|i| {
            (
                NAMES[i].to_string(),
                NS[i].load(Relaxed),
                COUNT[i].load(Relaxed),
            )
        })
        .collect();
    let rounds = 1000u64;
    let started = thread_cpu_ns();
    for _ in 0..rounds {
        std::hint::black_box(thread_cpu_ns());
    }
    let per_read = thread_cpu_ns().saturating_sub(started) / rounds;
    out.push(("overhead_ns".to_string(), per_read * 2, 1));
    out
}
