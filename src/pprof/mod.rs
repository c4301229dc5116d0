//! pprof in and out: the encoder that turns a [`Snapshot`](crate::Snapshot) into the gzip pprof
//! `Recorder#profile` returns, the reader the CLI uses on any pprof file, and the summaries it
//! prints (top allocation sites, and the growth between two profiles).
//!
//! What a profile holds:
//! - sample types `heap-live-samples`/`count` and, when sizes are measured, `heap-live-size`/`bytes`
//!   (the default type); then, unless asked not to (uploads), what says how far those can be
//!   trusted: `heap-live-records`/`count` (the live objects recorded, each standing for its
//!   weight w of them), `heap-live-samples-variance`/`count^2` (the sum of w(w-1), the sampling
//!   variance of the object count) and, with sizes, `heap-live-size-variance`/`bytes^2` (the sum
//!   of w(w-1)·size²). All of them add up when samples are merged, so any grouping of samples
//!   has its own count and variance; one standard deviation is the variance's square root;
//! - period type `allocations`/`count`, period = the sampler's mean allocations between samples;
//! - one sample per (allocation stack, class, gc gen age) with the sum over the live objects that
//!   share them of `weight` and `weight * size`. Objects that agree on all three are
//!   indistinguishable to any pprof tool, so they are written once with summed values (as
//!   libdatadog does) instead of once each: same totals, smaller file;
//! - labels `allocation class` (string; absent when the class is unknown) and `gc gen age` (number),
//!   and `retained by` (string) on the objects a retainer search named a path for;
//! - locations and functions shared by every stack that contains them.
//!
//! The encoder writes the protobuf itself (with the message types of `libdd-profiling-protobuf`)
//! rather than going through libdatadog's `Profile`, which only emits zstd (not read by go tool
//! pprof, Pyroscope or speedscope). On the ignored `encode_bench` test (100k objects, 5k stacks of
//! 10 frames, release build) the direct way gives a gzip pprof in 20-77 ms where libdatadog plus
//! zstd-to-gzip takes 120-300 ms, and it takes the string storage's mutex a few times instead of
//! once per string reference (twice per frame of every sample), so the allocation hook seldom
//! finds it busy. libdatadog's `Profile` stays the reference the tests compare against.

mod budget;
mod encode;
mod read;
mod scan;
mod summary;
mod uncertainty;

#[cfg(test)]
mod tests;

pub(crate) use budget::limit_basis;
pub use budget::{
    max_profile_bytes, profile_limit, ProfileLimit, DEFAULT_MAX_PROFILE_BYTES, MAX_EXPANSION,
    MAX_PROFILE_BYTES_ENV, MIN_DEFAULT_PROFILE_BYTES,
};
pub use encode::{
    encode_profile, encode_profile_retained, EncodeOptions, EncodedPprof, RetainedBy,
};
pub use read::{
    read_profile, read_profile_with_limit, ProfileData, SampleData, SampleType, SourceFrame,
};
pub use summary::{
    diff_sites, diff_sites_with, is_app_frame, library_of, merge_profiles, row_key, short_path,
    top_sites, top_sites_with, AppRoot, GroupBy, Place, Site, SiteDiff, SiteOptions, SortBy,
};
pub use uncertainty::SIGNIFICANT_SDS;

/// Sample type counting live objects (each sampled object stands for `weight` of them).
pub const LIVE_SAMPLES_TYPE: &str = "heap-live-samples";
pub const LIVE_SAMPLES_UNIT: &str = "count";
/// Sample type for the bytes those objects hold; left out when sizes are not measured.
pub const LIVE_SIZE_TYPE: &str = "heap-live-size";
pub const LIVE_SIZE_UNIT: &str = "bytes";
/// Sample type counting the live objects recorded (the samples an estimate rests on).
pub const LIVE_RECORDS_TYPE: &str = "heap-live-records";
pub const LIVE_RECORDS_UNIT: &str = "count";
/// Sample type summing `w(w-1)` over the recorded objects: the variance of `heap-live-samples`.
pub const LIVE_SAMPLES_VARIANCE_TYPE: &str = "heap-live-samples-variance";
pub const LIVE_SAMPLES_VARIANCE_UNIT: &str = "count^2";
/// Sample type summing `w(w-1)·size²`: the variance of `heap-live-size`; left out without sizes.
pub const LIVE_SIZE_VARIANCE_TYPE: &str = "heap-live-size-variance";
pub const LIVE_SIZE_VARIANCE_UNIT: &str = "bytes^2";
pub const PERIOD_TYPE: &str = "allocations";
pub const PERIOD_UNIT: &str = "count";
/// String label: the class of the allocated object.
pub const CLASS_LABEL: &str = "allocation class";
/// Number label: how many GCs the object has survived.
pub const GEN_AGE_LABEL: &str = "gc gen age";
/// String label, on samples a retainer search was asked for: what keeps the objects alive, a
/// chain of references from a GC root (`constant Foo::BAR (Hash) -> [:k] (String)`).
pub const RETAINED_BY_LABEL: &str = "retained by";
