//! datadog_heap_core: the parts of the datadog_heap live-heap recorder that need no Ruby VM.
//!
//! A [`HeapRecorder`] keeps sampled allocations: pending until committed to the VM's liveness
//! table, then tracked with their deduplicated allocation stack until an update finds them
//! collected. What needs the VM (liveness, size, frozen-ness, the GC count, yielding) comes in
//! through the [`Vm`] trait, which the `datadog_heap` binding implements and the tests fake.

pub mod error;
pub mod exporter;
pub mod lock;
pub mod pprof;
pub mod recorder;
pub mod retainers;
pub mod stacks;
pub mod stats;
pub mod strings;
pub mod vm;

#[cfg(test)]
pub(crate) mod fake_vm;

/// One step of xorshift64 (shifts 13, 7, 17): the small random streams that place thinning,
/// budget timings and windows. Fast and good enough for that; a zero state stays zero.
pub fn xorshift64(mut x: u64) -> u64 {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    x
}

pub use error::{HeapError, Result, FIXNUM_MAX, MAX_FRAMES_LIMIT};
pub use pprof::{
    diff_sites, diff_sites_with, encode_profile, library_of, merge_profiles, read_profile,
    short_path, top_sites, top_sites_with, AppRoot, EncodeOptions, EncodedPprof, GroupBy,
    ProfileData, SampleData, SampleType, Site, SiteDiff, SiteOptions, SortBy, SourceFrame,
};
pub use recorder::{
    CommitOutcome, HeapRecorder, LiveObject, LiveObjectData, Names, RecordOutcome, Recorded,
    RecorderOptions, Snapshot, UpdateKind, UpdateOutcome, DEFAULT_MAX_TRACKED_OBJECTS,
    MAX_PENDING_RECORDINGS,
};
pub use retainers::{
    find_root_paths, pick_targets, retained_by_sites, HeapGraph, RetainedRow, RootPath,
    SearchLimits, SearchOutcome, Stop, TargetObject, TargetSite,
};
pub use stacks::{
    truncation, Frame, FrameKey, FrameSource, NamedFrame, Stack, StackHandles, STACK_CACHE_SLOTS,
};
pub use stats::{StatValue, Stats};
pub use vm::{LiveInfo, ObjectRef, Probe, Vm, WalkVisitor};
