use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use crate::shims::{clock_ns, Clock, GvlCell};

struct Shared {
    schedule: Mutex<Schedule>,
    wake: Condvar,
    /// Before 3.3, the calls to the Ruby timer thread (see [`wait_for_call`]).
    call: Mutex<Call>,
    called: Condvar,
}

/// What the timer thread waits by.
struct Schedule {
    /// The rate to tick at; `None` asks the thread to end.
    rate: Option<f64>,
    /// When the next tick is due (monotonic ns; 0: drawn at the usual pace when the timer next
    /// looks). Ticks change it (see [`next_tick_in`]); the timer holds the lock except while it
    /// waits or delivers a tick, so whoever else reads a deadline reads the one the timer waits
    /// for.
    due: u64,
}

/// What the Ruby timer thread is woken for.
#[derive(Default)]
struct Call {
    /// A tick the timer could not deliver (no thread held the GVL).
    tick: bool,
    /// The VM interrupted the wait (`Thread#wakeup` from `WindowTimer.stop`, `Thread#kill`,
    /// exit).
    interrupted: bool,
    /// This timer stopped: no tick will come, whoever waits returns at once. Never reset (a
    /// later timer has a `Shared` of its own).
    stopped: bool,
}

struct Timer {
    shared: Arc<Shared>,
    thread: JoinHandle<()>,
}

static TIMER: GvlCell<Option<Timer>> = GvlCell::new(None);

/// Ticks the Ruby timer thread took from [`wait_for_call`] (before 3.3).
static HANDED: AtomicU64 = AtomicU64::new(0);

/// Ticks handed to the Ruby timer thread so far (see [`wait_for_call`]).
#[cfg_attr(ruby_gte_3_3, allow(dead_code))]
pub fn handed() -> u64 {
    HANDED.load(Ordering::Relaxed)
}

/// How often the timer thread woke: its deadlines and the requests that moved them sooner.
/// Each wake-up is a context switch, which a busy program pays for on a busy machine.
static WAKES: AtomicU64 = AtomicU64::new(0);

/// The timer thread's wake-ups so far (see [`WAKES`]).
pub fn wakes() -> u64 {
    WAKES.load(Ordering::Relaxed)
}

/// A deadline this close to the one asked for is met: the timer ticks rather than wait again,
/// and a request this close to the timer's own deadline changes nothing.
const SLACK_NS: u64 = 50_000;

crate::gvl_guarded!(fn with over TIMER: Option<Timer>);

fn run(shared: Arc<Shared>) {
    let Ok(mut schedule) = shared.schedule.lock() else {
        return;
    };
    while let Some(rate) = schedule.rate {
        let now = clock_ns(Clock::Monotonic);
        if schedule.due == 0 {
            schedule.due = now.saturating_add(super::next_delay_ns(rate));
        }
        if schedule.due <= now.saturating_add(SLACK_NS) {
            schedule.due = 0;
            // Delivered without the lock, which the tick it asks for takes to ask for the next
            // one (see `next_tick_in`): that thread holds the GVL and must not wait on a signal
            // being sent. A request meanwhile sets the deadline the timer then keeps.
            drop(schedule);
            // Before 3.3: a tick no signal could deliver (every Ruby thread waits on IO, a lock
            // or a sleep, so none holds the GVL) goes to the Ruby timer thread, which waits for
            // it without the GVL and gets the GVL at once in such a program.
            if !super::request_tick() {
                shared.tell_ruby_thread(|call| call.tick = true);
            }
            schedule = match shared.schedule.lock() {
                Ok(schedule) => schedule,
                Err(_) => return,
            };
            continue;
        }
        let wait = Duration::from_nanos(schedule.due - now);
        schedule = match shared.wake.wait_timeout(schedule, wait) {
            Ok((schedule, _)) => schedule,
            Err(_) => return,
        };
        WAKES.fetch_add(1, Ordering::Relaxed);
    }
}

impl Shared {
    /// Changes what the Ruby timer thread's wait finds, and wakes it. Any thread; takes only
    /// this timer's own lock.
    fn tell_ruby_thread(&self, what: impl FnOnce(&mut Call)) {
        if let Ok(mut call) = self.call.lock() {
            what(&mut call);
            self.called.notify_all();
        }
    }
}

/// Before 3.3, the Ruby timer thread's wait beside the native timer: `None` when no native
/// timer runs (the Ruby thread keeps its own time then), else whether a tick was handed over;
/// `Some(false)` when the wait ended without one (the VM interrupted it, or a second passed).
/// GVL held on entry and on return, released while waiting.
///
/// Until 2026-12-06 the Ruby thread slept and ticked at the timer's rate beside it: in a busy
/// server that is a hundred GVL hand-overs a second for ticks the signals already delivered
/// (0.4–0.5% of a Rails worker's CPU on that thread, and about a point more in the program's own
/// threads, bench/service_toggle.rb side by side). Now it wakes only for the ticks no signal
/// could deliver.
pub fn wait_for_call() -> Result<Option<bool>, magnus::Error> {
    use crate::shims::{without_gvl, IfRefused};
    let shared = with(|timer| timer.as_ref().map(|t| t.shared.clone()));
    let Some(shared) = shared else {
        return Ok(None);
    };
    let wait = |_| {
        let Ok(mut call) = shared.call.lock() else {
            return false;
        };
        if !call.tick && !call.interrupted && !call.stopped {
            call = match shared.called.wait_timeout(call, Duration::from_secs(1)) {
                Ok((call, _)) => call,
                Err(_) => return false,
            };
        }
        let ticked = std::mem::take(&mut call.tick);
        call.interrupted = false;
        ticked
    };
    let interrupt = || shared.tell_ruby_thread(|call| call.interrupted = true);
    let handed = without_gvl(wait, Some(&interrupt), IfRefused::Skip)?.unwrap_or(false);
    if handed {
        HANDED.fetch_add(1, Ordering::Relaxed);
    }
    Ok(Some(handed))
}

/// Starts the timer at `rate`, changes its rate, or (`None`) stops it and joins its thread.
pub fn set_rate(rate: Option<f64>) {
    let stopped = with(|timer| match (timer.as_ref(), rate) {
        (Some(t), Some(_)) => {
            if let Ok(mut schedule) = t.shared.schedule.lock() {
                schedule.rate = rate;
            }
            None
        }
        (Some(_), None) => timer.take(),
        (None, Some(_)) => {
            let shared = Arc::new(Shared {
                schedule: Mutex::new(Schedule { rate, due: 0 }),
                wake: Condvar::new(),
                call: Mutex::new(Call::default()),
                called: Condvar::new(),
            });
            let for_thread = shared.clone();
            let spawned = std::thread::Builder::new()
                .name("datadog_heap timer".into())
                .spawn(move || run(for_thread));
            if let Ok(thread) = spawned {
                *timer = Some(Timer { shared, thread });
            }
            None
        }
        (None, None) => None,
    });
    if let Some(timer) = stopped {
        if let Ok(mut schedule) = timer.shared.schedule.lock() {
            schedule.rate = None;
        }
        timer.shared.wake.notify_all();
        // A Ruby timer thread that took this timer's `Shared` and is about to wait on it (an
        // interrupt check let `WindowTimer.stop` run in between) returns at once.
        timer.shared.tell_ruby_thread(|call| call.stopped = true);
        // Quick: the thread wakes at once and needs neither the GVL nor anything we hold.
        let _ = timer.thread.join();
    }
}

/// Asks for the next tick in `ns` nanoseconds rather than at the timer's usual pace: sooner
/// when a window's start is near, later when it is far and the program busy. Only a sooner one
/// wakes the timer (it finds a later one when it wakes at its old deadline, and waits on without
/// a tick), and one within [`SLACK_NS`] of the timer's own deadline changes nothing: each
/// wake-up is a context switch. GVL held.
pub fn next_tick_in(ns: u64) {
    let shared = with(|timer| timer.as_ref().map(|t| t.shared.clone()));
    let Some(shared) = shared else { return };
    let wanted = clock_ns(Clock::Monotonic).saturating_add(ns).max(1);
    let sooner = match shared.schedule.lock() {
        Ok(mut schedule) => {
            if schedule.due != 0 && schedule.due.abs_diff(wanted) <= SLACK_NS {
                return;
            }
            let sooner = schedule.due == 0 || wanted < schedule.due;
            schedule.due = wanted;
            sooner
        }
        Err(_) => return,
    };
    if sooner {
        shared.wake.notify_all();
    }
}

/// In a forked child: the timer thread was not copied, and its lock may have been held by it
/// at the fork, so the old timer is forgotten unused (leaked), not stopped.
pub fn after_fork() {
    if let Some(timer) = with(|timer| timer.take()) {
        std::mem::forget(timer);
    }
}

/// Stops the timer for good (process exit).
pub fn shutdown() {
    set_rate(None);
}
