//! The memory one profile read may take, and the bookkeeping that keeps it there.
//!
//! Every allocation the reader makes for the profile (the decompressed protobuf, the decoded
//! messages, the [`ProfileData`](super::ProfileData) built from them) is charged to a
//! [`MemoryBudget`] before it is made, so a read that would pass the limit fails with
//! [`HeapError::ProfileTooLarge`] instead. Charges stay until the read ends, except where the
//! reader gives one back as it frees what it charged for; so the limit bounds the most the read
//! holds at any moment.
//!
//! Costs are estimates of what malloc hands out: [`alloc_cost`] charges each allocation its size
//! plus [`MALLOC_SLACK`], and containers are charged for the capacity std's `Vec` and hash map
//! grow to, not just their length.

use std::ffi::OsString;

use crate::error::{HeapError, Result};

/// The environment variable that sets the limit: a number of bytes.
pub const MAX_PROFILE_BYTES_ENV: &str = "DATADOG_HEAP_MAX_PROFILE_BYTES";

/// The limit when [`MAX_PROFILE_BYTES_ENV`] is not set (1 GiB): about a million samples of
/// typical depth, four times what this gem's default `max_tracked_objects` lets a profile hold.
pub const DEFAULT_MAX_PROFILE_BYTES: u64 = 1 << 30;

/// When [`MAX_PROFILE_BYTES_ENV`] is not set, a read may also take at most this many times the
/// bytes it reads (but never less than [`MIN_DEFAULT_PROFILE_BYTES`]): a heap profile takes some
/// 40 to 100 times its gzip file once read, while a file of empty samples asks for 100,000 times
/// its size, so a small file cannot make a command that reads it take a gigabyte.
pub const MAX_EXPANSION: u64 = 4096;

/// The least a read may take when [`MAX_PROFILE_BYTES_ENV`] is not set, however small its input
/// (64 MiB: a profile of some 70,000 samples).
pub const MIN_DEFAULT_PROFILE_BYTES: u64 = 64 << 20;

/// What a heap block costs beyond the bytes asked for: glibc's 8-byte header and rounding to 16,
/// or its smallest chunk (32 bytes) for a small request.
pub(super) const MALLOC_SLACK: u64 = 32;

/// The limit for reads of any size: [`MAX_PROFILE_BYTES_ENV`] when it is set and not empty, else
/// [`DEFAULT_MAX_PROFILE_BYTES`]. `Err(InvalidArgument)` when it is set to anything but a
/// positive whole number. A read of a given input may be held to less: see [`profile_limit`].
pub fn max_profile_bytes() -> Result<u64> {
    parse_max_profile_bytes(std::env::var_os(MAX_PROFILE_BYTES_ENV))
}

/// The limit for one read, and whether it was scaled to the input's size.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProfileLimit {
    pub bytes: u64,
    /// The size of the input the limit was scaled to; `None` for a fixed limit.
    pub input_bytes: Option<u64>,
}

impl ProfileLimit {
    /// A limit that does not depend on the input.
    pub fn fixed(bytes: u64) -> Self {
        ProfileLimit {
            bytes,
            input_bytes: None,
        }
    }
}

/// The limit for reading `input_len` bytes: [`MAX_PROFILE_BYTES_ENV`] when it is set and not
/// empty, whatever the input; else [`MAX_EXPANSION`] times `input_len`, at least
/// [`MIN_DEFAULT_PROFILE_BYTES`] and at most [`DEFAULT_MAX_PROFILE_BYTES`].
/// `Err(InvalidArgument)` when the variable is set to anything but a positive whole number.
pub fn profile_limit(input_len: usize) -> Result<ProfileLimit> {
    limit_for_input(std::env::var_os(MAX_PROFILE_BYTES_ENV), input_len)
}

pub(super) fn limit_for_input(value: Option<OsString>, input_len: usize) -> Result<ProfileLimit> {
    if value.as_ref().is_some_and(|v| !v.is_empty()) {
        return parse_max_profile_bytes(value).map(ProfileLimit::fixed);
    }
    let input_bytes = input_len as u64;
    let scaled = input_bytes
        .saturating_mul(MAX_EXPANSION)
        .max(MIN_DEFAULT_PROFILE_BYTES);
    if scaled >= DEFAULT_MAX_PROFILE_BYTES {
        return Ok(ProfileLimit::fixed(DEFAULT_MAX_PROFILE_BYTES));
    }
    Ok(ProfileLimit {
        bytes: scaled,
        input_bytes: Some(input_bytes),
    })
}

/// How the limit of a `ProfileTooLarge` error was set, for its message: empty for a fixed limit.
pub(crate) fn limit_basis(input_bytes: &Option<u64>) -> String {
    match input_bytes {
        Some(n) => format!(
            " ({MAX_EXPANSION} times the {n} bytes it is read from, and at least \
             {MIN_DEFAULT_PROFILE_BYTES})"
        ),
        None => String::new(),
    }
}

pub(super) fn parse_max_profile_bytes(value: Option<OsString>) -> Result<u64> {
    let Some(value) = value.filter(|v| !v.is_empty()) else {
        return Ok(DEFAULT_MAX_PROFILE_BYTES);
    };
    let text = value.to_string_lossy();
    match text.trim().replace('_', "").parse::<u64>() {
        Ok(limit) if limit > 0 => Ok(limit),
        _ => Err(HeapError::InvalidArgument {
            name: MAX_PROFILE_BYTES_ENV,
            expected: "a positive whole number of bytes, such as 4294967296",
            value: format!("{text:?}"),
        }),
    }
}

/// Bytes a read may still take, out of its limit.
#[derive(Debug)]
pub(super) struct MemoryBudget {
    limit: ProfileLimit,
    spent: u64,
}

impl MemoryBudget {
    pub fn new(limit: ProfileLimit) -> Self {
        MemoryBudget { limit, spent: 0 }
    }

    pub fn left(&self) -> u64 {
        self.limit.bytes - self.spent
    }

    /// Charges `bytes`, or, when they do not fit, returns `ProfileTooLarge` with `what()` (a
    /// clause saying what did not fit) and charges nothing.
    pub fn spend(&mut self, bytes: u64, what: impl FnOnce() -> String) -> Result<()> {
        if bytes > self.left() {
            return Err(self.exceeded(what()));
        }
        self.spent += bytes;
        Ok(())
    }

    /// Gives back `bytes` charged earlier, for memory the reader has freed.
    pub fn give_back(&mut self, bytes: u64) {
        self.spent = self.spent.saturating_sub(bytes);
    }

    pub fn exceeded(&self, what: String) -> HeapError {
        HeapError::ProfileTooLarge {
            limit: self.limit.bytes,
            input_bytes: self.limit.input_bytes,
            what,
        }
    }
}

/// What an allocation of `bytes` costs: nothing for 0 (Rust does not allocate), else the bytes
/// plus [`MALLOC_SLACK`].
pub(super) fn alloc_cost(bytes: u64) -> u64 {
    if bytes == 0 {
        0
    } else {
        bytes.saturating_add(MALLOC_SLACK)
    }
}

/// The text of a `String` copied from the string table.
pub(super) fn text_cost(text: &str) -> u64 {
    alloc_cost(text.len() as u64)
}

/// A `Vec` of `len` elements of `size` bytes made with that capacity.
pub(super) fn exact_vec_cost(len: usize, size: usize) -> u64 {
    alloc_cost((len as u64).saturating_mul(size as u64))
}

/// `vecs` such `Vec`s holding `len` elements of `size` bytes between them.
pub(super) fn vecs_cost(vecs: usize, len: usize, size: usize) -> u64 {
    (len as u64)
        .saturating_mul(size as u64)
        .saturating_add((vecs as u64).saturating_mul(MALLOC_SLACK))
}

/// A `Vec` of `len` elements of `size` bytes grown one push at a time, as std grows one: the
/// capacity doubles from 4 elements (8 for 1-byte ones), so it ends at the next power of two.
pub(super) fn grown_vec_cost(len: usize, size: usize) -> u64 {
    if len == 0 {
        return 0;
    }
    let smallest = if size == 1 { 8 } else { 4 };
    let capacity = (len as u64)
        .checked_next_power_of_two()
        .unwrap_or(u64::MAX)
        .max(smallest);
    alloc_cost(capacity.saturating_mul(size as u64))
}

/// A std `HashMap` made with capacity for `len` entries of `size` bytes: hashbrown's buckets
/// (a power of two at least 8/7 of the capacity) of one entry and one control byte each, plus
/// 16 control bytes.
pub(super) fn map_cost(len: usize, size: usize) -> u64 {
    if len == 0 {
        return 0;
    }
    let len = len as u64;
    let buckets = match len {
        0..4 => 4,
        4..8 => 8,
        _ => (len.saturating_mul(8) / 7)
            .checked_next_power_of_two()
            .unwrap_or(u64::MAX),
    };
    let entries = buckets.saturating_mul(size as u64).next_multiple_of(16);
    alloc_cost(entries.saturating_add(buckets).saturating_add(16))
}
