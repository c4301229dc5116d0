//! The overhead budget (`max_overhead:`): the sampler measures the time of its own work (the
//! sampled path of the hook, the commit job, young updates), compares it with the CPU time the
//! process used over the same period, and scales its mean interval so that the first stays under
//! `max_overhead` of the second: up when over budget, back down (to the configured
//! `sample_every`, never below) when there is room.
//!
//! Besides the stretches it times, it charges estimates of what our samples make the VM do that
//! no clock of ours sees, because that grows with the samples as much as our own work does:
//! every allocation inside a window takes the VM's slow path and calls the hook
//! ([`Budget::charge_window`], [`WINDOW_NS_PER_ALLOCATION`] each), and before Ruby 3.3 every
//! object entered in the WeakMap gets a finalizer that runs when it dies
//! ([`Budget::charge_commits`], [`WEAK_MAP_DEATH_NS`] each). The timer's own cost (its wake-ups,
//! the jobs it asks for) is not charged: it comes about `windows_per_second` times a second
//! whatever the interval, so the interval, the budget's only lever, cannot lower it
//! (docs/performance.md gives it).
//!
//! Weights stay unbiased: each sample weighs the interval its countdown was drawn with, drawn
//! from the mean in force at the time (windowed: over the share of its stratum its window
//! holds), so a change of the mean changes how many samples there are, not what they add up to.
//!
//! Our time is the thread CPU time (`CLOCK_THREAD_CPUTIME_ID`) of the work, not its wall time:
//! a stretch descheduled on a loaded machine (up to milliseconds, seen in the service bench)
//! would otherwise count as ours, and one such stretch in a period raised the interval eightfold
//! for nothing. That clock is a system call, about 0.8 µs a read on the 2-core VMs here, two per
//! stretch: more than a whole sample now costs. So the frequent stretches (a sample, a commit)
//! are timed one in [`TIME_ONE_IN`], drawn at random (a program's own rhythm cannot alias with
//! it), and each timed one is charged for as many: an unbiased estimate of our time at a
//! sixteenth of the clock's cost. What the clock adds to a stretch (the tail of one read and the
//! head of the next, measured once per process as the median of back-to-back reads) is taken off
//! first, and a stretch inside which a GC ran is charged once, not sixteen times: the GC is not our
//! work repeated. Rare, long stretches (young updates) are always timed. The
//! process's CPU time (`CLOCK_PROCESS_CPUTIME_ID`) is read only when a period may end, at most
//! once per `PERIOD_WALL_NS` of wall time (`FIRST_PERIOD_WALL_NS` for the first period), from the
//! commit job (never from the hook).
//!
//! Everything here needs the GVL (the session's Cells); nothing allocates or raises.

use std::cell::Cell;

/// A period ends once this much wall time went by since it started (long enough for tens of
/// samples in a busy process, so one period's share is not mostly noise)...
const PERIOD_WALL_NS: u64 = 250_000_000;
/// ...except the first after sampling starts, which ends sooner: a fresh recorder in a busy loop
/// samples at the interval asked for until its first period ends, which over a quarter of a
/// second cost a `BasicObject.new` loop several percent (docs/performance.md). Its noise is the
/// next periods' to correct.
const FIRST_PERIOD_WALL_NS: u64 = 50_000_000;
/// ...and the process used at least this much CPU time in it (too little to measure a ratio
/// otherwise, and an idle process owes nothing).
const PERIOD_CPU_NS: u64 = 20_000_000;
/// The budget aims at this share of `max_overhead`, so noise around it does not overshoot.
const TARGET_UTILISATION: f64 = 0.8;
/// The scale comes down only when the target asks for this factor less, so it does not hunt.
const HYSTERESIS: f64 = 1.25;
/// Most the scale changes in one period, either way.
const MAX_STEP: f64 = 8.0;
/// Largest scale: intervals up to sample_every x 2^20.
const MAX_SCALE: f64 = 1_048_576.0;

/// The frequent stretches are timed one in this many (see the module docs).
pub const TIME_ONE_IN: u64 = 16;

/// An allocation inside a window, beyond what it costs outside one: the VM's slow path, the
/// hook's dispatch and its countdown, as `bench/window_cost.rb` measures it on each Ruby
/// (docs/performance.md, "What no counter sees"): an estimate, which a faster machine pays less
/// of and a slower one more.
pub const WINDOW_NS_PER_ALLOCATION: u64 = 32;

/// An entry in the WeakMap beyond the `WeakMap#[]=` call the commit times. Before Ruby 3.3 the
/// map defines a finalizer on the object, which runs when it dies and keeps it as a zombie for one
/// more GC: a few µs an entry beyond the timed call on 3.1 (`bench/window_cost.rb`,
/// docs/performance.md). From 3.3 the map holds its entries weakly, without finalizers, so
/// nothing is added.
#[cfg(not(ruby_gte_3_3))]
pub const WEAK_MAP_DEATH_NS: u64 = 2_500;
#[cfg(ruby_gte_3_3)]
pub const WEAK_MAP_DEATH_NS: u64 = 0;

/// A stretch of our work being timed: when it started, how many stretches it stands for (0: not
/// timed), and the GC count then (a GC inside the stretch is not ours to multiply).
#[derive(Clone, Copy)]
pub struct Stretch {
    started_ns: u64,
    stands_for: u64,
    gc_count: u64,
}

/// What the clock itself adds to a timed stretch (the end of the first read and the start of the
/// second), in ns: the median of back-to-back reads, measured once per process (0 until then).
static EMPTY_STRETCH_NS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(u64::MAX);

/// Measures the empty stretch once (at the first budget made). GVL held or not: reads a clock.
fn calibrate_empty_stretch() -> u64 {
    use std::sync::atomic::Ordering;
    match EMPTY_STRETCH_NS.load(Ordering::Relaxed) {
        u64::MAX => {
            let mut spans: Vec<u64> = (0..63)
                .map(|_| {
                    let started = thread_cpu_ns();
                    thread_cpu_ns().saturating_sub(started)
                })
                .collect();
            spans.sort_unstable();
            let median = spans[spans.len() / 2];
            EMPTY_STRETCH_NS.store(median, Ordering::Relaxed);
            median
        }
        known => known,
    }
}

/// What a timed stretch is charged: the time it measured less the clock's own share
/// (`empty_ns`), for as many stretches as it stands for; once only when a GC ran inside it, whose
/// time would otherwise be multiplied as if it were ours sixteen times over.
pub fn stretch_charge(spent_ns: u64, empty_ns: u64, stands_for: u64, gc_ran: bool) -> u64 {
    let ours = spent_ns.saturating_sub(empty_ns);
    match gc_ran {
        true => ours,
        false => ours.saturating_mul(stands_for),
    }
}

/// Where the process's CPU time comes from: the kernel, or (tests) a model that charges a fixed
/// cost per allocation of the program and per sample, so a spec can assert what the budget does
/// without depending on the speed of the machine it runs on.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum CostClock {
    Real,
    Model {
        ns_per_allocation: f64,
        ns_per_sample: u64,
    },
}

pub struct Budget {
    /// Largest share of the process's CPU time our own work may take; 0: no budget.
    max_overhead: Cell<f64>,
    /// The mean interval is `sample_every * scale` (>= 1).
    scale: Cell<f64>,
    clock: Cell<CostClock>,
    /// This period: our time so far, its start (wall, process CPU), and (model) the program's
    /// allocation count at the last CPU reading.
    spent_ns: Cell<u64>,
    started_wall_ns: Cell<u64>,
    /// The running period's least wall time: short for the first since [`Budget::restart`].
    period_wall_ns: Cell<u64>,
    started_cpu_ns: Cell<u64>,
    model_cpu_ns: Cell<f64>,
    model_allocations: Cell<u64>,
    /// Lifetime: our time, the process CPU time the periods covered, and scale changes.
    pub spent_total_ns: Cell<u64>,
    /// Lifetime: the part of `spent_total_ns` that is estimates, not timed (`charge_window`,
    /// `charge_commits`).
    pub estimated_total_ns: Cell<u64>,
    pub measured_cpu_ns: Cell<u64>,
    pub raises: Cell<u64>,
    pub lowers: Cell<u64>,
    /// The largest scale it reached.
    pub max_scale: Cell<f64>,
    /// The draw of which stretches are timed (xorshift64).
    draws: Cell<u64>,
    /// The last period's overhead (our time over the process's CPU time).
    pub last_overhead: Cell<f64>,
}

impl Budget {
    pub fn new(max_overhead: f64) -> Self {
        if max_overhead > 0.0 {
            calibrate_empty_stretch();
        }
        Budget {
            max_overhead: Cell::new(max_overhead),
            scale: Cell::new(1.0),
            clock: Cell::new(CostClock::Real),
            spent_ns: Cell::new(0),
            started_wall_ns: Cell::new(0),
            period_wall_ns: Cell::new(FIRST_PERIOD_WALL_NS),
            started_cpu_ns: Cell::new(0),
            model_cpu_ns: Cell::new(0.0),
            model_allocations: Cell::new(0),
            spent_total_ns: Cell::new(0),
            estimated_total_ns: Cell::new(0),
            measured_cpu_ns: Cell::new(0),
            raises: Cell::new(0),
            lowers: Cell::new(0),
            max_scale: Cell::new(1.0),
            last_overhead: Cell::new(0.0),
            draws: Cell::new(0x9e37_79b9_7f4a_7c15),
        }
    }

    /// Sets the limit (at session creation, before anything samples).
    pub fn set_max_overhead(&self, max_overhead: f64) {
        if max_overhead > 0.0 {
            calibrate_empty_stretch();
        }
        self.max_overhead.set(max_overhead);
    }

    /// The limit: the largest share of the process's CPU time our work may take (0: none).
    pub fn max_overhead(&self) -> f64 {
        self.max_overhead.get()
    }

    /// Whether there is a budget to time our work for (no clock is read otherwise).
    #[inline]
    pub fn active(&self) -> bool {
        self.max_overhead.get() > 0.0
    }

    /// Starts a frequent stretch (a sample, a commit): timed one in [`TIME_ONE_IN`], at random,
    /// and only under a budget (no system call otherwise).
    #[inline]
    pub fn start(&self) -> Stretch {
        match self.active() && self.draw() % TIME_ONE_IN == 0 {
            true => Stretch {
                started_ns: thread_cpu_ns(),
                stands_for: TIME_ONE_IN,
                gc_count: crate::shims::gc_count(),
            },
            false => Stretch {
                started_ns: 0,
                stands_for: 0,
                gc_count: 0,
            },
        }
    }

    /// The next draw of which stretches are timed (xorshift64; only drawn under a budget).
    fn draw(&self) -> u64 {
        let x = datadog_heap_core::xorshift64(self.draws.get());
        self.draws.set(x);
        x
    }

    /// Starts a rare stretch (a young update): always timed under a budget.
    pub fn start_always(&self) -> Stretch {
        let active = self.active();
        Stretch {
            started_ns: if active { thread_cpu_ns() } else { 0 },
            stands_for: u64::from(active),
            gc_count: if active { crate::shims::gc_count() } else { 0 },
        }
    }

    /// Charges the thread CPU time since `stretch` started, less the clock's own share, for as
    /// many stretches as it stands for (see `stretch_charge`); nothing for an untimed one.
    #[inline]
    pub fn charge_since(&self, stretch: Stretch) {
        if stretch.stands_for > 0 {
            let spent = thread_cpu_ns().saturating_sub(stretch.started_ns);
            let gc_ran = crate::shims::gc_count() != stretch.gc_count;
            let empty = EMPTY_STRETCH_NS.load(std::sync::atomic::Ordering::Relaxed);
            let empty = if empty == u64::MAX { 0 } else { empty };
            self.charge(stretch_charge(spent, empty, stretch.stands_for, gc_ran));
        }
    }

    /// The factor on `sample_every` in force.
    pub fn scale(&self) -> f64 {
        self.scale.get()
    }

    /// Test aid: the cost model (or the real clocks again); starts a new period.
    pub fn set_clock(&self, clock: CostClock, program_allocations: u64) {
        self.clock.set(clock);
        self.model_allocations.set(program_allocations);
        self.restart(program_allocations);
    }

    /// Adds `ns` of our own work. Allocation-free; fine in the hook.
    #[inline]
    pub fn charge(&self, ns: u64) {
        if let CostClock::Model { .. } = self.clock.get() {
            return; // the model charges per sample (`charge_sample`), not by the clock
        }
        self.add(ns);
    }

    /// A window over `allocations` of the program's allocations opened: each takes the slow path
    /// and the hook ([`WINDOW_NS_PER_ALLOCATION`]). Nothing without a budget, or under the test
    /// model (which charges per sample only).
    pub fn charge_window(&self, allocations: u64) {
        self.charge_estimate(allocations.saturating_mul(WINDOW_NS_PER_ALLOCATION));
    }

    /// `committed` objects entered the WeakMap ([`WEAK_MAP_DEATH_NS`]). Nothing without a
    /// budget, or under the test model.
    pub fn charge_commits(&self, committed: usize) {
        self.charge_estimate((committed as u64).saturating_mul(WEAK_MAP_DEATH_NS));
    }

    fn charge_estimate(&self, ns: u64) {
        if !self.active() || ns == 0 || matches!(self.clock.get(), CostClock::Model { .. }) {
            return;
        }
        self.add(ns);
        self.estimated_total_ns
            .set(self.estimated_total_ns.get().saturating_add(ns));
    }

    /// One sample was taken (the model's unit of cost).
    #[inline]
    pub fn charge_sample(&self) {
        if let CostClock::Model { ns_per_sample, .. } = self.clock.get() {
            self.add(ns_per_sample);
        }
    }

    fn add(&self, ns: u64) {
        self.spent_ns.set(self.spent_ns.get().saturating_add(ns));
        self.spent_total_ns
            .set(self.spent_total_ns.get().saturating_add(ns));
    }

    /// Starts a period now (sampling starts, or after a fork).
    pub fn restart(&self, program_allocations: u64) {
        self.spent_ns.set(0);
        self.started_wall_ns.set(monotonic_ns());
        self.period_wall_ns.set(FIRST_PERIOD_WALL_NS);
        self.started_cpu_ns.set(self.cpu_ns(program_allocations));
    }

    /// The process's CPU time (or the model's).
    fn cpu_ns(&self, program_allocations: u64) -> u64 {
        match self.clock.get() {
            CostClock::Real => process_cpu_ns(),
            CostClock::Model {
                ns_per_allocation, ..
            } => {
                let made = program_allocations.saturating_sub(self.model_allocations.get());
                self.model_allocations.set(program_allocations);
                let cpu = self.model_cpu_ns.get() + made as f64 * ns_per_allocation;
                self.model_cpu_ns.set(cpu);
                cpu as u64
            }
        }
    }

    /// Ends the period if it is long enough, and rescales: returns the new scale when it
    /// changed. `program_allocations` is only read by the model. Called from the commit job.
    pub fn maybe_adjust(&self, program_allocations: impl FnOnce() -> u64) -> Option<f64> {
        let limit = self.max_overhead.get();
        if limit <= 0.0 {
            return None;
        }
        let model = matches!(self.clock.get(), CostClock::Model { .. });
        let started = self.started_wall_ns.get();
        if !model && monotonic_ns().saturating_sub(started) < self.period_wall_ns.get() {
            return None;
        }
        let now_cpu = self.cpu_ns(if model { program_allocations() } else { 0 });
        let cpu = now_cpu.saturating_sub(self.started_cpu_ns.get());
        if cpu < PERIOD_CPU_NS {
            return None;
        }
        let spent = self.spent_ns.get();
        self.spent_ns.set(0);
        self.started_cpu_ns.set(now_cpu);
        self.started_wall_ns.set(monotonic_ns());
        self.period_wall_ns.set(PERIOD_WALL_NS);
        self.measured_cpu_ns
            .set(self.measured_cpu_ns.get().saturating_add(cpu));
        let overhead = spent as f64 / cpu as f64;
        self.last_overhead.set(overhead);
        let scale = self.scale.get();
        // What would have put this period at the target: the work scales with the samples, which
        // scale with 1 / scale.
        let wanted = scale * overhead / (limit * TARGET_UTILISATION);
        let next = if overhead > limit {
            wanted.min(scale * MAX_STEP)
        } else if wanted < scale / HYSTERESIS && scale > 1.0 {
            // Room: come back down, not below what was asked for.
            wanted.max(scale / MAX_STEP)
        } else {
            return None;
        };
        let next = next.clamp(1.0, MAX_SCALE);
        if next == scale {
            return None;
        }
        if next > scale {
            self.raises.set(self.raises.get() + 1);
            self.max_scale.set(self.max_scale.get().max(next));
        } else {
            self.lowers.set(self.lowers.get() + 1);
        }
        self.scale.set(next);
        Some(next)
    }

    /// A forked child measures its own process from a fresh period.
    pub fn after_fork(&self, program_allocations: u64) {
        self.spent_total_ns.set(0);
        self.estimated_total_ns.set(0);
        self.measured_cpu_ns.set(0);
        self.raises.set(0);
        self.lowers.set(0);
        self.restart(program_allocations);
    }
}

/// Nanoseconds on the monotonic clock (vDSO; allocation-free).
pub fn monotonic_ns() -> u64 {
    crate::shims::clock_ns(crate::shims::Clock::Monotonic)
}

/// This thread's CPU time in ns (a system call; allocation-free, async-signal-safe).
pub fn thread_cpu_ns() -> u64 {
    crate::shims::clock_ns(crate::shims::Clock::ThreadCpu)
}

fn process_cpu_ns() -> u64 {
    crate::shims::clock_ns(crate::shims::Clock::ProcessCpu)
}

/// What the clock adds to each timed stretch, as measured (`None` before any budget was made).
pub fn empty_stretch_ns() -> Option<u64> {
    match EMPTY_STRETCH_NS.load(std::sync::atomic::Ordering::Relaxed) {
        u64::MAX => None,
        ns => Some(ns),
    }
}

#[cfg(test)]
mod tests {
    use super::{stretch_charge, TIME_ONE_IN};

    #[test]
    fn a_timed_stretch_is_charged_without_the_clocks_own_share() {
        // 1,000 ns measured, of which 235 are the two clock reads: 765 ours, sixteen times over.
        assert_eq!(
            stretch_charge(1_000, 235, TIME_ONE_IN, false),
            765 * TIME_ONE_IN
        );
        // A stretch shorter than the clock's share costs nothing, never wraps.
        assert_eq!(stretch_charge(200, 235, TIME_ONE_IN, false), 0);
    }

    #[test]
    fn a_gc_inside_a_timed_stretch_is_charged_once() {
        // A 2 ms minor GC inside a 3 us commit: once, not sixteen times (32 ms of a 250 ms period).
        let spent = 2_000_000 + 3_000;
        assert_eq!(stretch_charge(spent, 0, TIME_ONE_IN, true), spent);
        assert_eq!(
            stretch_charge(spent, 0, TIME_ONE_IN, false),
            spent * TIME_ONE_IN
        );
        // An always-timed stretch (a young update) is charged once either way.
        assert_eq!(
            stretch_charge(spent, 100, 1, true),
            stretch_charge(spent, 100, 1, false)
        );
    }
}
