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
    while let Some(r) = *rate {
        let usual = super::next_delay_ns(r);
        let delay = match SOONER_NS.swap(0, Ordering::Relaxed) {
            0 => usual,
            sooner => sooner.min(usual),
        };
        let delay = Duration::from_nanos(delay);
        rate = match shared.wake.wait_timeout(rate, delay) {
            Ok((guard, timeout)) => {
                if timeout.timed_out() && guard.is_some() {
                    super::request_tick();
                }
                guard
            }
            Err(_) => return,
        };
    }
}

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
