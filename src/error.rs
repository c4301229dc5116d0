//! The one error type of the core crate. The binding maps each variant to a Ruby exception class
//! once (see `ext/datadog_heap/src/errors.rs`): `InvalidArgument` becomes `ArgumentError`, the rest
//! `DatadogHeap::Error`.

use thiserror::Error;

/// Largest integer that is a Fixnum on 64-bit CRuby (2**62 - 1). Record ids are handed to Ruby as
/// Fixnum keys of the liveness WeakMap, so no id may pass it.
pub const FIXNUM_MAX: i64 = (1 << 62) - 1;

/// Hard cap on frames in one stack; the binding truncates to `max_frames` (<= this) before it
/// calls the core, so hitting it means a caller bug, not user input.
pub const MAX_FRAMES_LIMIT: usize = 3000;

#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum HeapError {
    /// An argument out of range; `name` is the argument as the user wrote it.
    #[error("{name} must be {expected}, got {value}")]
    InvalidArgument {
        name: &'static str,
        expected: &'static str,
        value: String,
    },

    #[error("stack has {frames} frames, more than the limit of {limit}")]
    TooManyFrames { frames: usize, limit: usize },

    #[error("record ids exhausted: the next id would pass the Fixnum maximum ({max}); recording is disabled")]
    RecordIdsExhausted { max: i64 },

    #[error("weight {weight} times sample_rate {sample_rate} does not fit in 64 bits")]
    WeightOverflow { weight: u64, sample_rate: u32 },

    #[error("heap record already tracks {count} objects, the most one stack can hold")]
    TooManyObjectsForStack { count: u32 },

    #[error("record_id {record_id} is already committed; record ids must be unique")]
    DuplicateRecordId { record_id: i64 },

    #[error("an iteration is already in progress; finish it before preparing another")]
    IterationInProgress,

    #[error("no iteration was prepared")]
    NoIterationPrepared,

    /// The thread holding the recorder's lock asked for it again: a signal trap or finalizer ran
    /// inside the recorder's own update or commit (the VM runs them inside our calls).
    #[error(
        "this thread is already inside the recorder's own update or commit (a signal trap or \
finalizer interrupted it), so it cannot wait for it; take the profile outside the trap, for \
example in a new Thread"
    )]
    Reentrant,

    /// Another thread held the recorder's lock past the wait bound.
    #[error("gave up after waiting {waited_ms} ms for another thread's update or commit of this recorder")]
    LockTimeout { waited_ms: i64 },

    #[error("string storage: {0}")]
    Strings(String),

    /// The host (Ruby VM) failed in a call the core made through [`crate::Vm`]; the binding keeps
    /// the original exception and re-raises it, this variant only carries a description.
    #[error("{0}")]
    Host(String),

    #[error("pprof: {0}")]
    Pprof(String),

    /// Reading a profile would take more memory than its limit (see
    /// [`crate::pprof::profile_limit`]); `what` says what did not fit. `input_bytes` is the size
    /// of the input when the limit was scaled to it, `None` for a fixed limit.
    #[error(
        "pprof: reading this profile needs more memory than the limit of {limit} bytes{}: {what}; \
to read it, set the environment variable {env} to a larger number of bytes",
        crate::pprof::limit_basis(.input_bytes),
        env = crate::pprof::MAX_PROFILE_BYTES_ENV
    )]
    ProfileTooLarge {
        limit: u64,
        input_bytes: Option<u64>,
        what: String,
    },
}

impl HeapError {
    pub(crate) fn strings(err: impl std::fmt::Display) -> Self {
        HeapError::Strings(err.to_string())
    }
}

pub type Result<T, E = HeapError> = std::result::Result<T, E>;
