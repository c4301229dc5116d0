//! The OS clocks the overhead budget and the stage counters read.

/// Which clock `clock_ns` reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Clock {
    /// Monotonic wall time (vDSO).
    Monotonic,
    /// This thread's CPU time (a system call).
    ThreadCpu,
    /// The whole process's CPU time (a system call).
    ProcessCpu,
}

/// Nanoseconds on `clock`; 0 if the OS refuses. Allocation-free and async-signal-safe, so the
/// NEWOBJ hook may call it.
pub fn clock_ns(clock: Clock) -> u64 {
    let id = match clock {
        Clock::Monotonic => libc::CLOCK_MONOTONIC,
        Clock::ThreadCpu => libc::CLOCK_THREAD_CPUTIME_ID,
        Clock::ProcessCpu => libc::CLOCK_PROCESS_CPUTIME_ID,
    };
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid timespec to write into; clock_gettime allocates nothing and is
    // async-signal-safe.
    match unsafe { libc::clock_gettime(id, &mut ts) } {
        0 => (ts.tv_sec as u64)
            .wrapping_mul(1_000_000_000)
            .wrapping_add(ts.tv_nsec as u64),
        _ => 0,
    }
}
