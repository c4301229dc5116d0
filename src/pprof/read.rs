//! Reading any pprof file back (ours, libdatadog's, Go's) into plain data for the CLI.
//!
//! Input is gzip, zstd or a raw protobuf, told apart by the first bytes. Malformed input of any
//! kind is an `Err(HeapError::Pprof)` naming what was wrong, never a panic.
//!
//! Memory is bounded, whatever the input: one read holds at most its limit for the profile
//! ([`profile_limit`]: the environment variable `DATADOG_HEAP_MAX_PROFILE_BYTES`, else
//! [`MAX_EXPANSION`] times the input's size, at least [`MIN_DEFAULT_PROFILE_BYTES`] (64 MiB) and
//! at most [`DEFAULT_MAX_PROFILE_BYTES`] (1 GiB)) and past it fails with
//! `HeapError::ProfileTooLarge`, which names the limit and the variable. Each step charges what
//! it will allocate before it allocates it (see `budget.rs`):
//! - decompression stops before its buffer would pass the limit;
//! - the protobuf is counted at the wire level (`scan.rs`), and what decoding it and the lists
//!   and maps [`resolve`] makes from it will take is charged before anything is decoded: a file
//!   of millions of empty samples, a few bytes each, is refused right after decompression;
//! - while names are resolved, every string copied and every stack expanded is charged before
//!   it is made (a location can have many lines, a sample can name a location many times, a
//!   label can name a long string: a small file could otherwise ask for a huge amount).
//!
//! Outside the limit: the input itself, and the decompressor's own state (tens of KiB for gzip;
//! for zstd, the window the frame asks for, at most the 128 MiB zstd allows by default).

use std::borrow::Cow;
use std::collections::HashMap;
use std::fmt::Write as _;
use std::hash::BuildHasherDefault;
use std::io::{ErrorKind, Read};
use std::mem::size_of;
use std::sync::Arc;

use flate2::read::MultiGzDecoder;
use libdd_profiling_protobuf::prost_impls as pb;
use prost::Message;
use rustc_hash::FxHasher;

use crate::error::{HeapError, Result};

use super::budget::{
    alloc_cost, exact_vec_cost, map_cost, profile_limit, text_cost, vecs_cost, MemoryBudget,
    ProfileLimit, MALLOC_SLACK,
};
use super::scan::Shape;
use super::{CLASS_LABEL, GEN_AGE_LABEL, LIVE_SAMPLES_TYPE, LIVE_SIZE_TYPE, RETAINED_BY_LABEL};

#[cfg(doc)]
use super::budget::{DEFAULT_MAX_PROFILE_BYTES, MAX_EXPANSION, MIN_DEFAULT_PROFILE_BYTES};

type FxMap<K, V> = HashMap<K, V, BuildHasherDefault<FxHasher>>;

const GZIP_MAGIC: [u8; 2] = [0x1f, 0x8b];
const ZSTD_MAGIC: [u8; 4] = [0x28, 0xb5, 0x2f, 0xfd];

/// A sample type or the period type: what a value counts, and in which unit.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct SampleType {
    pub name: String,
    pub unit: String,
}

/// One frame of a stack, as the profile names it.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SourceFrame {
    pub name: String,
    pub filename: String,
    pub line: i64,
}

#[derive(Debug, Clone, PartialEq)]
pub struct SampleData {
    /// One value per sample type, in the order of [`ProfileData::sample_types`].
    pub values: Vec<i64>,
    /// Innermost frame first. Samples with the same location list share one allocation.
    pub frames: Arc<[SourceFrame]>,
    /// The `allocation class` label.
    pub class: Option<String>,
    /// The `gc gen age` label.
    pub gen_age: Option<i64>,
    /// The `retained by` label: a chain of references from a GC root to the sample's objects.
    pub retained_by: Option<String>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct ProfileData {
    pub sample_types: Vec<SampleType>,
    pub period_type: Option<SampleType>,
    pub period: i64,
    /// Start of the profiled span, nanoseconds since the Unix epoch, and its length.
    pub time_nanos: i64,
    pub duration_nanos: i64,
    pub samples: Vec<SampleData>,
    /// The profile's comments (ours say when `max_tracked_objects` bounded the estimates).
    pub comments: Vec<String>,
}

impl ProfileData {
    /// Position of the sample type named `name` in each sample's values.
    pub fn value_index(&self, name: &str) -> Option<usize> {
        self.sample_types.iter().position(|t| t.name == name)
    }

    /// Where the live-object count is: `heap-live-samples`, else (another profiler's heap
    /// profile) the last type counted in `count` or `objects`, which for Go's heap profile is
    /// `inuse_objects`.
    pub fn objects_index(&self) -> Option<usize> {
        self.value_index(LIVE_SAMPLES_TYPE)
            .or_else(|| self.last_with_unit(&["count", "objects"]))
    }

    /// Where the live bytes are: `heap-live-size`, else the last type in `bytes`. `None` when
    /// sizes were not measured.
    pub fn bytes_index(&self) -> Option<usize> {
        self.value_index(LIVE_SIZE_TYPE)
            .or_else(|| self.last_with_unit(&["bytes"]))
    }

    fn last_with_unit(&self, units: &[&str]) -> Option<usize> {
        self.sample_types
            .iter()
            .rposition(|t| units.contains(&t.unit.as_str()))
    }
}

/// Reads a gzip, zstd or raw pprof protobuf, holding at most [`profile_limit`] for it (scaled to
/// the size of `bytes` unless `DATADOG_HEAP_MAX_PROFILE_BYTES` is set). `Err(InvalidArgument)`
/// when that variable is set to something that is not a number of bytes.
pub fn read_profile(bytes: &[u8]) -> Result<ProfileData> {
    read_within(bytes, profile_limit(bytes.len())?)
}

/// [`read_profile`] holding at most `max_bytes` for the profile (see the module doc for what
/// that covers), whatever the size of `bytes`; `Err(ProfileTooLarge)` past it.
pub fn read_profile_with_limit(bytes: &[u8], max_bytes: u64) -> Result<ProfileData> {
    read_within(bytes, ProfileLimit::fixed(max_bytes))
}

pub(super) fn read_within(bytes: &[u8], limit: ProfileLimit) -> Result<ProfileData> {
    let mut budget = MemoryBudget::new(limit);
    let raw = decompress(bytes, &mut budget)?;
    let not_protobuf = |e: &dyn std::fmt::Display| {
        HeapError::Pprof(format!(
            "not a pprof protobuf ({} bytes after decompression): {e}",
            raw.len()
        ))
    };
    let shape = Shape::scan(&raw).map_err(|e| not_protobuf(&e))?;
    let decoded = shape.decoded_bytes.saturating_add(resolved_bytes(&shape));
    budget.spend(decoded, || {
        format!(
            "its {} samples, {} locations, {} functions and {} strings take about {} bytes \
             decoded, besides the {} bytes of protobuf they are read from",
            shape.samples,
            shape.locations,
            shape.functions,
            shape.strings,
            decoded,
            raw.len()
        )
    })?;
    let profile = decode(&raw, &shape).map_err(|e| not_protobuf(&e))?;
    resolve(&profile, &mut budget)
}

fn decompress<'a>(bytes: &'a [u8], budget: &mut MemoryBudget) -> Result<Cow<'a, [u8]>> {
    if bytes.is_empty() {
        return Err(HeapError::Pprof("the input is empty (0 bytes)".into()));
    }
    if bytes.starts_with(&GZIP_MAGIC) {
        let decoder = MultiGzDecoder::new(bytes);
        return read_all(decoder, "gzip", bytes.len(), budget).map(Cow::Owned);
    }
    if bytes.starts_with(&ZSTD_MAGIC) {
        let decoder = zstd::stream::read::Decoder::with_buffer(bytes).map_err(|e| {
            HeapError::Pprof(format!("zstd decoder for {} bytes: {e}", bytes.len()))
        })?;
        return read_all(decoder, "zstd", bytes.len(), budget).map(Cow::Owned);
    }
    Ok(Cow::Borrowed(bytes))
}

/// Reads `reader` to its end into a buffer that grows as a `Vec` does but never past what
/// `budget` has left, and charges it.
fn read_all(
    mut reader: impl Read,
    format: &str,
    input_len: usize,
    budget: &mut MemoryBudget,
) -> Result<Vec<u8>> {
    let most = usize::try_from(budget.left().saturating_sub(MALLOC_SLACK)).unwrap_or(usize::MAX);
    let mut out = Vec::new();
    let mut chunk = [0u8; 16 * 1024];
    loop {
        let n = match reader.read(&mut chunk) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == ErrorKind::Interrupted => continue,
            Err(e) => {
                return Err(HeapError::Pprof(format!(
                    "{format} input of {input_len} bytes is corrupt or truncated \
                     (after {} decompressed bytes): {e}",
                    out.len()
                )))
            }
        };
        let len = out.len().saturating_add(n);
        if len > most {
            return Err(budget.exceeded(format!(
                "its {input_len} bytes of {format} decompress to more than {most} bytes"
            )));
        }
        if len > out.capacity() {
            let capacity = len.max(out.capacity().saturating_mul(2)).min(most);
            out.reserve_exact(capacity - out.len());
        }
        out.extend_from_slice(&chunk[..n]);
    }
    out.shrink_to_fit();
    budget.spend(alloc_cost(out.len() as u64), || {
        format!(
            "its {input_len} bytes of {format} decompress to {} bytes",
            out.len()
        )
    })?;
    Ok(out)
}

/// Decodes `raw`, whose shape `scan` counted, with the top-level lists reserved to those counts
/// so that they take what was charged for them.
fn decode(raw: &[u8], shape: &Shape) -> Result<pb::Profile, prost::DecodeError> {
    let mut profile = pb::Profile::default();
    profile.sample_types.reserve_exact(shape.sample_types);
    profile.samples.reserve_exact(shape.samples);
    profile.mappings.reserve_exact(shape.mappings);
    profile.locations.reserve_exact(shape.locations);
    profile.functions.reserve_exact(shape.functions);
    profile.string_table.reserve_exact(shape.strings);
    profile.comment.reserve_exact(shape.comments);
    profile.merge(raw)?;
    Ok(profile)
}

/// A location's frames, innermost first, and the bytes of their names (what copying them into
/// a stack costs besides the frames themselves).
struct Location {
    frames: Vec<SourceFrame>,
    text: u64,
}

/// The longest name of an unsymbolized frame: `0x` and 16 hex digits.
const ADDRESS_NAME_BYTES: usize = 18;

/// What [`resolve`] allocates in proportion to the counts of `shape`, before it copies a string
/// or expands a stack: the maps from ids, each location's frames, the result's sample types,
/// samples (with their values) and comments. Charged together with the decoding.
fn resolved_bytes(shape: &Shape) -> u64 {
    [
        map_cost(shape.functions, size_of::<(u64, (&str, &str))>()),
        map_cost(shape.locations, size_of::<(u64, Location)>()),
        vecs_cost(
            shape.locations,
            shape.lines.saturating_add(shape.locations_without_lines),
            size_of::<SourceFrame>(),
        ),
        map_cost(shape.samples, size_of::<(&[u64], Arc<[SourceFrame]>)>()),
        exact_vec_cost(shape.sample_types, size_of::<SampleType>()),
        exact_vec_cost(shape.samples, size_of::<SampleData>()),
        vecs_cost(shape.samples_with_values, shape.values, size_of::<i64>()),
        exact_vec_cost(shape.comments, size_of::<String>()),
    ]
    .into_iter()
    .fold(0, u64::saturating_add)
}

/// A copy of `text`, charged to `budget`; `what` names whose text it is, for the error.
fn copy_text(budget: &mut MemoryBudget, text: &str, what: &str) -> Result<String> {
    budget.spend(text_cost(text), || {
        format!("copies of the text {what} name do not fit")
    })?;
    Ok(text.to_owned())
}

/// Turns ids and string indexes into names, checking every reference. The containers it makes
/// in proportion to the profile's counts were charged already ([`resolved_bytes`]); it charges
/// each string it copies and each stack it expands to `budget`.
fn resolve(profile: &pb::Profile, budget: &mut MemoryBudget) -> Result<ProfileData> {
    let table = &profile.string_table;
    let text = |index: i64, what: &dyn Fn() -> String| -> Result<&str> {
        if index == 0 {
            return Ok("");
        }
        usize::try_from(index)
            .ok()
            .and_then(|i| table.get(i))
            .map(String::as_str)
            .ok_or_else(|| {
                HeapError::Pprof(format!(
                    "{} refers to string {index}, but the string table has {} entries",
                    what(),
                    table.len()
                ))
            })
    };
    let mut value_type = |t: &pb::ValueType, what: &str| -> Result<SampleType> {
        let name = text(t.r#type, &|| what.to_owned())?;
        let unit = text(t.unit, &|| what.to_owned())?;
        Ok(SampleType {
            name: copy_text(budget, name, "its sample types")?,
            unit: copy_text(budget, unit, "its sample types")?,
        })
    };

    let mut sample_types = Vec::with_capacity(profile.sample_types.len());
    for (i, t) in profile.sample_types.iter().enumerate() {
        sample_types.push(value_type(t, &format!("sample type {i}"))?);
    }
    let period_type = profile
        .period_type
        .as_ref()
        .map(|t| value_type(t, "the period type"))
        .transpose()?;

    let mut functions: FxMap<u64, (&str, &str)> =
        FxMap::with_capacity_and_hasher(profile.functions.len(), Default::default());
    for f in &profile.functions {
        let what = || format!("function {}", f.id);
        functions.insert(f.id, (text(f.name, &what)?, text(f.filename, &what)?));
    }

    let mut locations: FxMap<u64, Location> =
        FxMap::with_capacity_and_hasher(profile.locations.len(), Default::default());
    for location in &profile.locations {
        let mut frames = Vec::with_capacity(location.lines.len().max(1));
        let mut text = 0u64;
        // Several lines mean inlined calls: the first is innermost, the last the caller.
        for line in &location.lines {
            let Some(&(name, filename)) = functions.get(&line.function_id) else {
                return Err(HeapError::Pprof(format!(
                    "location {} refers to function {}, which the profile does not define",
                    location.id, line.function_id
                )));
            };
            let frame = SourceFrame {
                name: copy_text(budget, name, "the frames of its locations")?,
                filename: copy_text(budget, filename, "the frames of its locations")?,
                line: line.line,
            };
            text = text.saturating_add(text_cost(name) + text_cost(filename));
            frames.push(frame);
        }
        if frames.is_empty() {
            // An unsymbolized address: show it rather than drop the frame.
            let cost = alloc_cost(ADDRESS_NAME_BYTES as u64);
            budget.spend(cost, || {
                "the names of its unsymbolized locations do not fit".to_owned()
            })?;
            let mut name = String::with_capacity(ADDRESS_NAME_BYTES);
            let _ = write!(name, "0x{:x}", location.address);
            text = cost;
            frames.push(SourceFrame {
                name,
                filename: String::new(),
                line: 0,
            });
        }
        locations.insert(location.id, Location { frames, text });
    }

    let mut stacks: FxMap<&[u64], Arc<[SourceFrame]>> =
        FxMap::with_capacity_and_hasher(profile.samples.len(), Default::default());
    let mut samples = Vec::with_capacity(profile.samples.len());
    for (i, sample) in profile.samples.iter().enumerate() {
        if sample.values.len() != sample_types.len() {
            return Err(HeapError::Pprof(format!(
                "sample {i} has {} values but the profile has {} sample types",
                sample.values.len(),
                sample_types.len()
            )));
        }
        let frames = match stacks.get(sample.location_ids.as_slice()) {
            Some(frames) => frames.clone(),
            None => {
                let frames = expand_stack(i, &sample.location_ids, &locations, budget)?;
                stacks.insert(&sample.location_ids, frames.clone());
                frames
            }
        };
        let mut class = None;
        let mut gen_age = None;
        let mut retained_by = None;
        for label in &sample.labels {
            let what = || format!("a label of sample {i}");
            match text(label.key, &what)? {
                CLASS_LABEL if label.str != 0 => {
                    let name = text(label.str, &what)?;
                    class = Some(copy_text(budget, name, "its labels")?);
                }
                GEN_AGE_LABEL => gen_age = Some(label.num),
                RETAINED_BY_LABEL if label.str != 0 => {
                    let path = text(label.str, &what)?;
                    retained_by = Some(copy_text(budget, path, "its labels")?);
                }
                _ => {}
            }
        }
        samples.push(SampleData {
            values: sample.values.clone(),
            frames,
            class,
            gen_age,
            retained_by,
        });
    }

    let mut comments = Vec::with_capacity(profile.comment.len());
    for &index in &profile.comment {
        let comment = text(index, &|| "a comment".to_owned())?;
        comments.push(copy_text(budget, comment, "its comments")?);
    }
    Ok(ProfileData {
        sample_types,
        period_type,
        period: profile.period,
        time_nanos: profile.time_nanos,
        duration_nanos: profile.duration_nanos,
        samples,
        comments,
    })
}

/// The frames of the stack `location_ids` names (sample `sample`'s), innermost first, charged to
/// `budget` before they are made: collected in a `Vec`, then moved into the shared `Arc` (the
/// `Vec`'s charge is given back once it is freed).
fn expand_stack(
    sample: usize,
    location_ids: &[u64],
    locations: &FxMap<u64, Location>,
    budget: &mut MemoryBudget,
) -> Result<Arc<[SourceFrame]>> {
    let (mut count, mut text) = (0usize, 0u64);
    for id in location_ids {
        let Some(location) = locations.get(id) else {
            return Err(HeapError::Pprof(format!(
                "sample {sample} refers to location {id}, which the profile does not define"
            )));
        };
        count = count.saturating_add(location.frames.len());
        text = text.saturating_add(location.text);
    }
    let bytes = (count as u64).saturating_mul(size_of::<SourceFrame>() as u64);
    // The Arc's two counts precede the frames.
    let arc = bytes.saturating_add(2 * size_of::<usize>() as u64);
    let cost = alloc_cost(bytes)
        .saturating_add(alloc_cost(arc))
        .saturating_add(text);
    budget.spend(cost, || {
        format!("its stacks expand to more frames than fit (sample {sample}'s has {count})")
    })?;
    let mut frames = Vec::with_capacity(count);
    for id in location_ids {
        if let Some(location) = locations.get(id) {
            frames.extend_from_slice(&location.frames);
        }
    }
    let frames: Arc<[SourceFrame]> = frames.into();
    budget.give_back(alloc_cost(bytes));
    Ok(frames)
}
