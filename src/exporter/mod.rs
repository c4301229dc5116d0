//! Sending profiles to a backend: the Datadog agent's profiling intake, or a Pyroscope server's
//! pprof ingest. The HTTP is libdd-profiling's own exporter (its client, its tokio runtime, its
//! timeouts); the Datadog request is the one its `ProfileExporter` builds (multipart `event.json`
//! plus `profile.pprof`, tags, headers). Pyroscope gets a small adapter: a multipart body with the
//! pprof and a `sample_type_config`, sent through the same exporter.
//!
//! A [`ProfileUploader`] keeps a bounded queue of profiles waiting to go out (at most
//! `max_queue`; a new profile pushes out the oldest, counted). [`ProfileUploader::flush`] sends
//! them oldest first, one request at a time, each bounded by the configured timeout, and stops at
//! the first that fails to reach the backend: an endpoint that is down costs one timeout per
//! flush, not one per queued profile. A profile that failed [`MAX_ATTEMPTS`] times, or that the
//! backend rejected (a 4xx other than 408/429), is dropped and counted. Nothing is lost silently:
//! see [`UploadStats`].
//!
//! Threads and fork: `flush` blocks its caller (libdd-profiling's exporter runs a current-thread
//! runtime on the calling thread), so the binding calls it without the GVL. Everything an
//! uploader locks (its queue, its HTTP client, its last error) lives in a [`ProcessState`] that
//! belongs to one process: a fork can happen while another thread holds any of those mutexes, and
//! the child would inherit them locked with no thread left to unlock them. So the first use in a
//! new process replaces the state with an empty one of its own and leaks the parent's (its
//! runtime's threads do not exist there; dropping it could wait on them). The parent's queued
//! profiles stay the parent's to send. Dropping an uploader never blocks its caller (it may run
//! in a GC sweep): a client is dropped on a thread of its own. Nothing here keeps a process from
//! exiting.

mod multipart;
mod request;

#[cfg(test)]
mod tests;

use std::collections::VecDeque;
use std::sync::atomic::{AtomicPtr, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, TryLockError};
use std::time::{Duration, SystemTime};

pub use tokio_util::sync::CancellationToken;

use crate::error::{HeapError, Result};
use crate::stats::StatValue;

pub use request::{pyroscope_labels, DATADOG_FAMILY, PROFILER_NAME};

/// How many times one profile is tried before it is dropped.
pub const MAX_ATTEMPTS: u32 = 3;
/// The largest queue an uploader accepts.
pub const MAX_QUEUE_LIMIT: usize = 64;
/// The longest timeout an uploader accepts (a request that takes longer is given up).
pub const MAX_TIMEOUT: Duration = Duration::from_secs(600);

/// Where profiles go.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Backend {
    /// A Datadog agent: `url` is its base (`http://localhost:8126`, `unix:///var/run/datadog/apm.socket`);
    /// profiles go to `<url>/profiling/v1/input`.
    DatadogAgent { url: String },
    /// A Pyroscope server: `url` is its base; profiles go to `<url>/ingest?format=pprof&...`,
    /// named `app_name` with the uploader's tags as labels.
    Pyroscope {
        url: String,
        app_name: String,
        /// Sent as `Authorization: Bearer <token>` (Pyroscope Cloud and authenticating proxies).
        auth_token: Option<String>,
        /// Sent as `X-Scope-OrgID` (multi-tenant Pyroscope).
        tenant_id: Option<String>,
    },
}

/// What an uploader is built from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UploaderConfig {
    pub backend: Backend,
    /// `key:value` tags sent with every profile (Datadog's `tags_profiler`, Pyroscope's labels).
    pub tags: Vec<String>,
    /// Bound on one request: connecting, sending, and the response's headers.
    pub timeout: Duration,
    /// Most profiles waiting to be sent.
    pub max_queue: usize,
    /// Version of the profiler that made the profiles (this gem's).
    pub profiler_version: String,
}

/// One profile waiting to be sent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PendingUpload {
    /// The pprof, gzip-compressed (both backends read it as it is).
    pub pprof: Vec<u8>,
    /// The span the profile covers.
    pub start: SystemTime,
    pub end: SystemTime,
    /// Failed attempts so far.
    pub failures: u32,
}

impl PendingUpload {
    pub fn new(pprof: Vec<u8>, start: SystemTime, end: SystemTime) -> Self {
        PendingUpload {
            pprof,
            start,
            end,
            failures: 0,
        }
    }
}

/// Why a request did not deliver its profile.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FailureKind {
    /// No answer within the timeout.
    Timeout,
    /// No connection, or it broke (refused, reset, DNS, TLS); also a client that could not be
    /// set up.
    Connection,
    /// The backend answered with a status that is not 2xx.
    HttpStatus(u16),
    /// The flush was cancelled (the thread doing it was interrupted).
    Cancelled,
}

impl FailureKind {
    /// Worth trying the same profile again later: the backend did not refuse it for what it is.
    fn retryable(self) -> bool {
        match self {
            FailureKind::HttpStatus(status) => status == 408 || status == 429 || status >= 500,
            _ => true,
        }
    }
}

/// A failed request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UploadFailure {
    pub kind: FailureKind,
    pub message: String,
}

/// What a flush did.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct FlushOutcome {
    /// Profiles the backend accepted.
    pub sent: u64,
    /// The last failure, when there was one.
    pub failure: Option<UploadFailure>,
    /// Another flush of this uploader was in progress; nothing was sent.
    pub busy: bool,
}

/// Counters since the uploader was created; see [`ProfileUploader::stats`] for their names.
#[derive(Debug, Default)]
pub struct UploadStats {
    enqueued: AtomicU64,
    sent: AtomicU64,
    bytes_sent: AtomicU64,
    attempts: AtomicU64,
    failures_timeout: AtomicU64,
    failures_connection: AtomicU64,
    failures_http_status: AtomicU64,
    failures_cancelled: AtomicU64,
    dropped_queue_full: AtomicU64,
    dropped_retries_exhausted: AtomicU64,
    dropped_rejected: AtomicU64,
    last_http_status: AtomicU64,
}

fn bump(counter: &AtomicU64) {
    counter.fetch_add(1, Ordering::Relaxed);
}

/// What an uploader locks, for one process (see the module docs).
struct ProcessState {
    pid: u32,
    queue: Mutex<VecDeque<PendingUpload>>,
    /// Built at the first flush in this process (or by `new`, which checks the configuration).
    client: Mutex<Option<request::BackendClient>>,
    last_error: Mutex<Option<String>>,
}

impl ProcessState {
    fn new(pid: u32, client: Option<request::BackendClient>) -> Self {
        ProcessState {
            pid,
            queue: Mutex::new(VecDeque::new()),
            client: Mutex::new(client),
            last_error: Mutex::new(None),
        }
    }
}

/// Sends profiles to one backend; see the module docs. `Send + Sync`: `enqueue` and `stats` may
/// run on any thread while another flushes.
pub struct ProfileUploader {
    config: UploaderConfig,
    /// This process's state: a `Box` leaked into the pointer, replaced (and the old one leaked
    /// for good) at the first use after a fork, freed by `Drop` in the process that owns it.
    state: AtomicPtr<ProcessState>,
    stats: UploadStats,
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic while holding one of these leaves consistent data (a queue, a string).
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

impl ProfileUploader {
    /// Checks `config` (URL, tags, timeout, queue bound) and creates the HTTP client, so a bad
    /// configuration fails here and not at the first upload. Sends nothing.
    pub fn new(config: UploaderConfig) -> Result<Self> {
        if config.max_queue == 0 || config.max_queue > MAX_QUEUE_LIMIT {
            return Err(HeapError::InvalidArgument {
                name: "max_queue",
                expected: "between 1 and 64",
                value: config.max_queue.to_string(),
            });
        }
        if config.timeout.is_zero() || config.timeout > MAX_TIMEOUT {
            return Err(HeapError::InvalidArgument {
                name: "timeout",
                expected: "more than 0 and at most 600 seconds",
                value: format!("{:?}", config.timeout),
            });
        }
        let client = request::BackendClient::new(&config)?;
        let state = ProcessState::new(current_pid(), Some(client));
        Ok(ProfileUploader {
            config,
            state: AtomicPtr::new(Box::into_raw(Box::new(state))),
            stats: UploadStats::default(),
        })
    }

    /// This process's state, a fresh one at the first use after a fork (see the module docs).
    fn state(&self) -> &ProcessState {
        let pid = current_pid();
        let current = self.state.load(Ordering::Acquire);
        // SAFETY: the pointer always comes from `Box::into_raw`, and a state is only freed by
        // `Drop` (which has `&mut self`, so no reference from here is alive) or never (a replaced
        // one is leaked), so it is valid for as long as `self` is borrowed.
        let state = unsafe { &*current };
        if state.pid == pid {
            return state;
        }
        let fresh = Box::into_raw(Box::new(ProcessState::new(pid, None)));
        match (self.state).compare_exchange(current, fresh, Ordering::AcqRel, Ordering::Acquire) {
            // SAFETY: as above; `fresh` now lives in the pointer and is never freed but by Drop.
            Ok(_) => unsafe { &*fresh },
            Err(winner) => {
                // Another thread of this process replaced it first: use that one.
                // SAFETY: `fresh` was never shared, so this is its only owner.
                drop(unsafe { Box::from_raw(fresh) });
                // SAFETY: as above.
                unsafe { &*winner }
            }
        }
    }

    pub fn config(&self) -> &UploaderConfig {
        &self.config
    }

    /// Queues `profile`; when the queue is full the oldest waiting profile is dropped (counted
    /// as `upload_dropped_queue_full`). Returns whether one was dropped. Never blocks on a flush.
    pub fn enqueue(&self, profile: PendingUpload) -> bool {
        bump(&self.stats.enqueued);
        let mut queue = lock(&self.state().queue);
        queue.push_back(profile);
        self.trim(&mut queue)
    }

    /// Drops the oldest profiles past `max_queue`; whether any was dropped.
    fn trim(&self, queue: &mut VecDeque<PendingUpload>) -> bool {
        let mut dropped = false;
        while queue.len() > self.config.max_queue {
            queue.pop_front();
            bump(&self.stats.dropped_queue_full);
            dropped = true;
        }
        dropped
    }

    pub fn queue_len(&self) -> usize {
        lock(&self.state().queue).len()
    }

    /// Sends the queued profiles, oldest first, until the queue is empty or one fails to reach
    /// the backend (see the module docs). Blocks: each request takes up to the timeout, or until
    /// `cancel` is cancelled. Returns at once, `busy`, when another thread is flushing.
    pub fn flush(&self, cancel: &CancellationToken) -> FlushOutcome {
        let mut outcome = FlushOutcome::default();
        let state = self.state();
        let mut slot = match state.client.try_lock() {
            Ok(guard) => guard,
            Err(TryLockError::Poisoned(poisoned)) => poisoned.into_inner(),
            Err(TryLockError::WouldBlock) => {
                outcome.busy = true;
                return outcome;
            }
        };
        let client = match self.client(&mut slot) {
            Ok(client) => client,
            Err(failure) => {
                self.count_failure(&failure, None);
                outcome.failure = Some(failure);
                return outcome;
            }
        };
        loop {
            if cancel.is_cancelled() {
                break;
            }
            let Some(mut profile) = lock(&state.queue).pop_front() else {
                break;
            };
            bump(&self.stats.attempts);
            match client.send(&self.config, &profile, cancel) {
                Ok(()) => {
                    bump(&self.stats.sent);
                    self.stats
                        .bytes_sent
                        .fetch_add(profile.pprof.len() as u64, Ordering::Relaxed);
                    outcome.sent += 1;
                }
                Err(failure) => {
                    let retry = failure.kind.retryable();
                    if retry && failure.kind != FailureKind::Cancelled {
                        profile.failures += 1;
                    }
                    self.count_failure(&failure, Some(&profile));
                    let stop = retry;
                    if retry && profile.failures < MAX_ATTEMPTS {
                        let mut queue = lock(&state.queue);
                        queue.push_front(profile);
                        self.trim(&mut queue);
                    }
                    outcome.failure = Some(failure);
                    if stop {
                        break;
                    }
                }
            }
        }
        if outcome.failure.is_none() && outcome.sent > 0 {
            *lock(&state.last_error) = None;
        }
        outcome
    }

    /// This process's client, built at its first flush here (see the module docs).
    fn client<'a>(
        &self,
        slot: &'a mut Option<request::BackendClient>,
    ) -> std::result::Result<&'a request::BackendClient, UploadFailure> {
        if slot.is_none() {
            let client = request::BackendClient::new(&self.config).map_err(|e| UploadFailure {
                kind: FailureKind::Connection,
                message: format!("could not set up the HTTP client: {e}"),
            })?;
            *slot = Some(client);
        }
        slot.as_ref().ok_or_else(|| UploadFailure {
            kind: FailureKind::Connection,
            message: "no HTTP client".into(),
        })
    }

    fn count_failure(&self, failure: &UploadFailure, profile: Option<&PendingUpload>) {
        match failure.kind {
            FailureKind::Timeout => bump(&self.stats.failures_timeout),
            FailureKind::Connection => bump(&self.stats.failures_connection),
            FailureKind::HttpStatus(status) => {
                bump(&self.stats.failures_http_status);
                self.stats
                    .last_http_status
                    .store(u64::from(status), Ordering::Relaxed);
            }
            FailureKind::Cancelled => bump(&self.stats.failures_cancelled),
        }
        if let Some(profile) = profile {
            if !failure.kind.retryable() {
                bump(&self.stats.dropped_rejected);
            } else if profile.failures >= MAX_ATTEMPTS {
                bump(&self.stats.dropped_retries_exhausted);
            }
        }
        *lock(&self.state().last_error) = Some(failure.message.clone());
    }

    /// The counters, by the names `stats` gives them in Ruby, and the last error (None once a
    /// flush has succeeded since).
    pub fn stats(&self) -> (Vec<(&'static str, StatValue)>, Option<String>) {
        let s = &self.stats;
        let get = |c: &AtomicU64| StatValue::Count(c.load(Ordering::Relaxed));
        let counts = vec![
            ("upload_profiles_enqueued", get(&s.enqueued)),
            ("upload_profiles_sent", get(&s.sent)),
            ("upload_bytes_sent", get(&s.bytes_sent)),
            ("upload_attempts", get(&s.attempts)),
            ("upload_failures_timeout", get(&s.failures_timeout)),
            ("upload_failures_connection", get(&s.failures_connection)),
            ("upload_failures_http_status", get(&s.failures_http_status)),
            ("upload_failures_cancelled", get(&s.failures_cancelled)),
            ("upload_dropped_queue_full", get(&s.dropped_queue_full)),
            (
                "upload_dropped_retries_exhausted",
                get(&s.dropped_retries_exhausted),
            ),
            ("upload_dropped_rejected", get(&s.dropped_rejected)),
            ("upload_last_http_status", get(&s.last_http_status)),
            (
                "upload_queue_length",
                StatValue::Count(self.queue_len() as u64),
            ),
        ];
        (counts, lock(&self.state().last_error).clone())
    }
}

impl Drop for ProfileUploader {
    fn drop(&mut self) {
        let current = *self.state.get_mut();
        // SAFETY: from `Box::into_raw`, and `&mut self` means no reference from `state()` lives.
        let state = unsafe { &*current };
        if state.pid != current_pid() {
            // Inherited through fork: its runtime's threads are the parent's (see module docs).
            return;
        }
        // SAFETY: this process's own state, owned by the pointer alone; nothing uses it after.
        let state = unsafe { Box::from_raw(current) };
        let client = state
            .client
            .into_inner()
            .unwrap_or_else(PoisonError::into_inner);
        if let Some(client) = client {
            // Dropping libdd's runtime waits for its blocking threads (a DNS lookup in flight):
            // never in the caller, which may be a GC sweep. If no thread can start, it leaks.
            let handoff = Arc::new(Mutex::new(Some(client)));
            let theirs = Arc::clone(&handoff);
            let spawned = std::thread::Builder::new()
                .name("datadog-heap-drop".into())
                .spawn(move || drop(lock(&theirs).take()));
            if spawned.is_err() {
                std::mem::forget(lock(&handoff).take());
            }
        }
    }
}

/// The process id, overridable in tests to act out a fork.
fn current_pid() -> u32 {
    #[cfg(test)]
    if let Some(pid) = tests::FAKE_PID.with(std::cell::Cell::get) {
        return pid;
    }
    std::process::id()
}
