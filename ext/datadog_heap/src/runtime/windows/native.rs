use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use crate::shims::GvlCell;

struct Shared {
    /// The rate to tick at; `None` asks the thread to end.
    rate: Mutex<Option<f64>>,
    wake: Condvar,
}

struct Timer {
    shared: Arc<Shared>,
    thread: JoinHandle<()>,
}

static TIMER: GvlCell<Option<Timer>> = GvlCell::new(None);

/// A sooner tick asked for by the last tick (nanoseconds from when the timer reads it; 0:
/// none), see `hurry`.
static SOONER_NS: AtomicU64 = AtomicU64::new(0);

crate::gvl_guarded!(fn with over TIMER: Option<Timer>);

fn run(shared: Arc<Shared>) {
    let Ok(mut rate) = shared.rate.lock() else {
        return;
    };
    // Tries left for a hurried tick that found no thread holding the GVL (before 3.3).
    let mut retries = 0u32;
    while let Some(r) = *rate {
        let usual = super::next_delay_ns(r);
        let sooner = SOONER_NS.swap(0, Ordering::Relaxed);
        let delay = match (sooner, retries) {
            (0, 0) => usual,
            (0, _) => RETRY_NS.min(usual),
            (sooner, _) => sooner.min(usual),
        };
        if sooner != 0 {
            retries = MAX_RETRIES;
        }
        let delay = Duration::from_nanos(delay);
        rate = match shared.wake.wait_timeout(rate, delay) {
            Ok((guard, timeout)) => {
                if timeout.timed_out() && guard.is_some() {
                    let reached = super::request_tick();
                    retries = match reached {
                        true => 0,
                        false => retries.saturating_sub(1),
                    };
                }
                guard
            }
            Err(_) => return,
        };
    }
}

/// A hurried tick (a window's start is near) that found every Ruby thread waiting (before 3.3
/// no signal can reach the VM then) is tried again every `RETRY_NS`, up to `MAX_RETRIES` times:
/// a server's threads wait on their sockets between bursts, and the tick the first burst
/// needed came at the timer's usual pace, often after it. Usual ticks are not retried, so an
/// idle program's timer wakes no more often than asked.
const RETRY_NS: u64 = 100_000;
const MAX_RETRIES: u32 = 50;

/// Starts the timer at `rate`, changes its rate, or (`None`) stops it and joins its thread.
pub fn set_rate(rate: Option<f64>) {
    let stopped = with(|timer| match (timer.as_ref(), rate) {
        (Some(t), Some(_)) => {
            if let Ok(mut r) = t.shared.rate.lock() {
                *r = rate;
            }
            None
        }
        (Some(_), None) => timer.take(),
        (None, Some(_)) => {
            let shared = Arc::new(Shared {
                rate: Mutex::new(rate),
                wake: Condvar::new(),
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
        if let Ok(mut r) = timer.shared.rate.lock() {
            *r = None;
        }
        timer.shared.wake.notify_all();
        // Quick: the thread wakes at once and needs neither the GVL nor anything we hold.
        let _ = timer.thread.join();
    }
}

/// Wakes the timer to tick again within `ns` nanoseconds. GVL held. The timer's lock is
/// taken around the request so the wake cannot fall between its read and its wait.
pub fn hurry(ns: u64) {
    let shared = with(|timer| timer.as_ref().map(|t| t.shared.clone()));
    let Some(shared) = shared else { return };
    match shared.rate.lock() {
        Ok(guard) => {
            SOONER_NS.store(ns.max(1), Ordering::Relaxed);
            drop(guard);
        }
        Err(_) => return,
    };
    shared.wake.notify_all();
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
