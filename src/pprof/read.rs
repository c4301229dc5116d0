//! Reading any pprof file back (ours, libdatadog's, Go's) into plain data for the CLI.
//!
//! Input is gzip, zstd or a raw protobuf, told apart by the first bytes. Malformed input of any
//! kind is an `Err(HeapError::Pprof)` naming what was wrong, never a panic. Memory is bounded
//! too: decompression stops at [`MAX_DECODED_BYTES`], and so does the text of the frames the
//! stacks expand to (a location can have many lines and a sample can name a location many times,
//! so a small file could otherwise ask for a huge amount).

use std::borrow::Cow;
use std::collections::HashMap;
use std::hash::BuildHasherDefault;
use std::io::Read;
use std::sync::Arc;

use flate2::read::MultiGzDecoder;
use libdd_profiling_protobuf::prost_impls as pb;
use prost::Message;
use rustc_hash::FxHasher;

use crate::error::{HeapError, Result};

use super::{CLASS_LABEL, GEN_AGE_LABEL, LIVE_SAMPLES_TYPE, LIVE_SIZE_TYPE, RETAINED_BY_LABEL};

type FxMap<K, V> = HashMap<K, V, BuildHasherDefault<FxHasher>>;

/// Largest decompressed profile accepted (1 GiB).
pub const MAX_DECODED_BYTES: u64 = 1 << 30;

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

/// Reads a gzip, zstd or raw pprof protobuf.
pub fn read_profile(bytes: &[u8]) -> Result<ProfileData> {
    let raw = decompress(bytes)?;
    let profile = pb::Profile::decode(&*raw).map_err(|e| {
        HeapError::Pprof(format!(
            "not a pprof protobuf ({} bytes after decompression): {e}",
            raw.len()
        ))
    })?;
    resolve(&profile, MAX_DECODED_BYTES)
}

/// [`read_profile`] with a smaller bound on expanded frames, so tests can reach it cheaply.
#[cfg(test)]
pub(super) fn read_profile_with_frame_budget(bytes: &[u8], budget: u64) -> Result<ProfileData> {
    let profile = pb::Profile::decode(&*decompress(bytes)?)
        .map_err(|e| HeapError::Pprof(format!("not a pprof protobuf: {e}")))?;
    resolve(&profile, budget)
}

fn decompress(bytes: &[u8]) -> Result<Cow<'_, [u8]>> {
    if bytes.is_empty() {
        return Err(HeapError::Pprof("the input is empty (0 bytes)".into()));
    }
    if bytes.starts_with(&GZIP_MAGIC) {
        return read_all(MultiGzDecoder::new(bytes), "gzip", bytes.len()).map(Cow::Owned);
    }
    if bytes.starts_with(&ZSTD_MAGIC) {
        let decoder = zstd::stream::read::Decoder::with_buffer(bytes).map_err(|e| {
            HeapError::Pprof(format!("zstd decoder for {} bytes: {e}", bytes.len()))
        })?;
        return read_all(decoder, "zstd", bytes.len()).map(Cow::Owned);
    }
    Ok(Cow::Borrowed(bytes))
}

fn read_all(reader: impl Read, format: &str, input_len: usize) -> Result<Vec<u8>> {
    let mut out = Vec::new();
    reader
        .take(MAX_DECODED_BYTES + 1)
        .read_to_end(&mut out)
        .map_err(|e| {
            HeapError::Pprof(format!(
                "{format} input of {input_len} bytes is corrupt or truncated \
                 (after {} decompressed bytes): {e}",
                out.len()
            ))
        })?;
    if out.len() as u64 > MAX_DECODED_BYTES {
        return Err(HeapError::Pprof(format!(
            "{format} input of {input_len} bytes decompresses to more than \
             {MAX_DECODED_BYTES} bytes"
        )));
    }
    Ok(out)
}

/// Turns ids and string indexes into names, checking every reference.
fn resolve(profile: &pb::Profile, frame_budget: u64) -> Result<ProfileData> {
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
    let value_type = |t: &pb::ValueType, what: &str| -> Result<SampleType> {
        Ok(SampleType {
            name: text(t.r#type, &|| what.to_owned())?.to_owned(),
            unit: text(t.unit, &|| what.to_owned())?.to_owned(),
        })
    };

    let sample_types = profile
        .sample_types
        .iter()
        .enumerate()
        .map(|(i, t)| value_type(t, &format!("sample type {i}")))
        .collect::<Result<Vec<_>>>()?;
    let period_type = profile
        .period_type
        .as_ref()
        .map(|t| value_type(t, "the period type"))
        .transpose()?;

    let mut functions: FxMap<u64, (&str, &str)> = FxMap::default();
    for f in &profile.functions {
        let what = || format!("function {}", f.id);
        functions.insert(f.id, (text(f.name, &what)?, text(f.filename, &what)?));
    }

    let mut budget = FrameBudget(frame_budget, frame_budget);
    let mut locations: FxMap<u64, Vec<SourceFrame>> = FxMap::default();
    for location in &profile.locations {
        let mut frames = Vec::with_capacity(location.lines.len().max(1));
        // Several lines mean inlined calls: the first is innermost, the last the caller.
        for line in &location.lines {
            let Some(&(name, filename)) = functions.get(&line.function_id) else {
                return Err(HeapError::Pprof(format!(
                    "location {} refers to function {}, which the profile does not define",
                    location.id, line.function_id
                )));
            };
            budget.spend(name, filename)?;
            frames.push(SourceFrame {
                name: name.to_owned(),
                filename: filename.to_owned(),
                line: line.line,
            });
        }
        if frames.is_empty() {
            // An unsymbolized address: show it rather than drop the frame.
            frames.push(SourceFrame {
                name: format!("0x{:x}", location.address),
                filename: String::new(),
                line: 0,
            });
        }
        locations.insert(location.id, frames);
    }

    let mut stacks: FxMap<&[u64], Arc<[SourceFrame]>> = FxMap::default();
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
                let mut frames = Vec::with_capacity(sample.location_ids.len());
                for id in &sample.location_ids {
                    let Some(location) = locations.get(id) else {
                        return Err(HeapError::Pprof(format!(
                            "sample {i} refers to location {id}, which the profile does not define"
                        )));
                    };
                    for frame in location {
                        budget.spend(&frame.name, &frame.filename)?;
                    }
                    frames.extend_from_slice(location);
                }
                let frames: Arc<[SourceFrame]> = frames.into();
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
                    class = Some(text(label.str, &what)?.to_owned());
                }
                GEN_AGE_LABEL => gen_age = Some(label.num),
                RETAINED_BY_LABEL if label.str != 0 => {
                    retained_by = Some(text(label.str, &what)?.to_owned());
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

    let comments = (profile.comment.iter())
        .map(|&index| text(index, &|| "a comment".to_owned()).map(str::to_owned))
        .collect::<Result<_>>()?;
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

/// Bytes the expanded frames may still take, out of the limit they started with.
struct FrameBudget(u64, u64);

impl FrameBudget {
    fn spend(&mut self, name: &str, filename: &str) -> Result<()> {
        let cost = (std::mem::size_of::<SourceFrame>() + name.len() + filename.len()) as u64;
        self.0 = self.0.checked_sub(cost).ok_or_else(|| {
            HeapError::Pprof(format!(
                "the profile's stacks expand to more than {} bytes of frames",
                self.1
            ))
        })?;
        Ok(())
    }
}
