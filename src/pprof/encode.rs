//! Snapshot -> gzip pprof.
//!
//! Contract: runs on a thread without the GVL. It reads only the snapshot, which owns what it
//! refers to, names included: no VM call, no lock, nothing of the recorder's. So nothing a forked
//! child inherits can be left half-held by it. Allocates with Rust's allocator only.

use std::collections::HashMap;
use std::hash::BuildHasherDefault;
use std::io::Write;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use flate2::write::GzEncoder;
use flate2::Compression;
use libdd_profiling_protobuf::prost_impls as pb;
use prost::Message;
use rustc_hash::FxHasher;

use crate::error::{HeapError, Result};
use crate::recorder::{Names, Snapshot};
use crate::stacks::{Frame, Stack};
use crate::strings::StringId;

use super::uncertainty::{cluster_variances, variance_terms};
use super::{
    CLASS_LABEL, GEN_AGE_LABEL, LIVE_RECORDS_TYPE, LIVE_RECORDS_UNIT, LIVE_SAMPLES_TYPE,
    LIVE_SAMPLES_UNIT, LIVE_SAMPLES_VARIANCE_TYPE, LIVE_SAMPLES_VARIANCE_UNIT, LIVE_SIZE_TYPE,
    LIVE_SIZE_UNIT, LIVE_SIZE_VARIANCE_TYPE, LIVE_SIZE_VARIANCE_UNIT, PERIOD_TYPE, PERIOD_UNIT,
    RETAINED_BY_LABEL,
};

type FxMap<K, V> = HashMap<K, V, BuildHasherDefault<FxHasher>>;

/// gzip level 1. On the `encode_bench` heap (100k objects, 5k stacks, 100k samples) it takes
/// 12 ms for 0.81 MB where the default level 6 takes 116 ms for 0.61 MB: nine times the CPU for a
/// quarter less.
const GZIP_LEVEL: u32 = 1;

/// What the encoder needs besides the snapshot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EncodeOptions {
    /// Mean allocations between two samples (the sampler's `sample_every`): the profile's period.
    pub sample_every: i64,
    /// When the profiled span began; `None` means at `end` (a zero duration).
    pub start: Option<SystemTime>,
    /// When it ended; `None` means now.
    pub end: Option<SystemTime>,
    /// Whether to add the sample types that say how far each estimate can be trusted (records
    /// and variances, see [`crate::pprof`]). Off for uploads: a backend reads only the first two.
    pub uncertainty: bool,
}

impl Default for EncodeOptions {
    fn default() -> Self {
        EncodeOptions {
            sample_every: 1,
            start: None,
            end: None,
            uncertainty: true,
        }
    }
}

/// An encoded profile and what went into it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EncodedPprof {
    /// The gzip-compressed pprof protobuf.
    pub bytes: Vec<u8>,
    /// pprof samples written: live objects with the same stack, class and age share one.
    pub samples: usize,
    /// Live objects (age >= 1) those samples stand for, before weighting.
    pub objects: usize,
    /// Distinct locations (name, file, line) and functions (name, file) written.
    pub locations: usize,
    pub functions: usize,
    /// Length of the protobuf before compression.
    pub uncompressed_len: usize,
}

/// Retainer paths by record id: the `retained by` label of those objects' samples.
pub type RetainedBy = HashMap<i64, String>;

/// Encodes the live objects of `snapshot` (those of age >= 1) as a gzip pprof; see the module
/// docs of [`crate::pprof`] for what it contains. Needs no GVL (see this file's contract).
pub fn encode_profile(snapshot: &Snapshot, options: &EncodeOptions) -> Result<EncodedPprof> {
    encode_profile_retained(snapshot, options, &RetainedBy::new())
}

/// [`encode_profile`], with a `retained by` label on the objects `retained_by` names: each such
/// object's sample is shared only with objects of the same stack, class, age and path.
pub fn encode_profile_retained(
    snapshot: &Snapshot,
    options: &EncodeOptions,
    retained_by: &RetainedBy,
) -> Result<EncodedPprof> {
    if options.sample_every < 1 {
        return Err(HeapError::InvalidArgument {
            name: "sample_every",
            expected: "an Integer >= 1",
            value: options.sample_every.to_string(),
        });
    }
    let (raw, mut encoded) = encode_uncompressed(snapshot, options, retained_by)?;
    encoded.bytes = gzip(&raw, GZIP_LEVEL)?;
    Ok(encoded)
}

/// The protobuf before compression, and what went into it (`bytes` left empty).
pub(super) fn encode_uncompressed(
    snapshot: &Snapshot,
    options: &EncodeOptions,
    retained_by: &RetainedBy,
) -> Result<(Vec<u8>, EncodedPprof)> {
    let (profile, objects) = build_profile(snapshot, options, retained_by)?;
    let raw = profile.encode_to_vec();
    let encoded = EncodedPprof {
        bytes: Vec::new(),
        samples: profile.samples.len(),
        objects,
        locations: profile.locations.len(),
        functions: profile.functions.len(),
        uncompressed_len: raw.len(),
    };
    Ok((raw, encoded))
}

/// Live objects that share a stack, a class, an age and a retainer path, summed.
struct Aggregate {
    stack: usize,
    class: StringId,
    gen_age: u64,
    /// The `retained by` text, if any (a key of `retained_by`'s values, borrowed).
    retained: Option<usize>,
    objects: i64,
    bytes: i64,
    /// Live objects recorded (each standing for its weight of them).
    records: i64,
    /// Sum over them of `w(w-1)`, and of `w(w-1)·size²` (see [`variance_terms`]); for those
    /// sampled in clusters, the square of each cluster's sum instead (see [`cluster_variances`]).
    objects_variance: i64,
    bytes_variance: i64,
}

fn build_profile(
    snapshot: &Snapshot,
    options: &EncodeOptions,
    retained_by: &RetainedBy,
) -> Result<(pb::Profile, usize)> {
    let mut stacks: Vec<Stack> = Vec::new();
    let mut stack_index: FxMap<Stack, usize> = FxMap::default();
    let mut aggregates: Vec<Aggregate> = Vec::new();
    let mut aggregate_index: FxMap<(usize, StringId, u64, Option<usize>), usize> = FxMap::default();
    let mut objects = 0usize;
    let mut paths: Vec<&str> = Vec::new();
    let mut path_index: FxMap<&str, usize> = FxMap::default();
    // (aggregate, cluster, weight, size) of the objects sampled in clusters.
    let mut clustered: Vec<(usize, u64, u64, usize)> = Vec::new();

    snapshot.for_each_live(|object| {
        objects += 1;
        let stack = *stack_index.entry(object.stack.clone()).or_insert_with(|| {
            stacks.push(object.stack.clone());
            stacks.len() - 1
        });
        let data = &object.data;
        let retained = retained_by.get(&object.record_id).map(|path| {
            *path_index.entry(path.as_str()).or_insert_with(|| {
                paths.push(path.as_str());
                paths.len() - 1
            })
        });
        let key = (stack, data.class, data.gen_age, retained);
        let slot = *aggregate_index.entry(key).or_insert_with(|| {
            aggregates.push(Aggregate {
                stack,
                class: data.class,
                gen_age: data.gen_age,
                retained,
                objects: 0,
                bytes: 0,
                records: 0,
                objects_variance: 0,
                bytes_variance: 0,
            });
            aggregates.len() - 1
        });
        if let Some(aggregate) = aggregates.get_mut(slot) {
            let weight = i64::try_from(data.weight).unwrap_or(i64::MAX);
            let size = i64::try_from(data.size).unwrap_or(i64::MAX);
            aggregate.objects = aggregate.objects.saturating_add(weight);
            aggregate.bytes = aggregate.bytes.saturating_add(weight.saturating_mul(size));
            aggregate.records = aggregate.records.saturating_add(1);
            match data.cluster {
                0 => {
                    let (objects_variance, bytes_variance) = variance_terms(data.weight, data.size);
                    aggregate.objects_variance =
                        aggregate.objects_variance.saturating_add(objects_variance);
                    aggregate.bytes_variance =
                        aggregate.bytes_variance.saturating_add(bytes_variance);
                }
                cluster => clustered.push((slot, cluster, data.weight, data.size)),
            }
        }
        true
    });
    for (slot, objects_variance, bytes_variance) in cluster_variances(clustered) {
        if let Some(aggregate) = aggregates.get_mut(slot) {
            aggregate.objects_variance =
                aggregate.objects_variance.saturating_add(objects_variance);
            aggregate.bytes_variance = aggregate.bytes_variance.saturating_add(bytes_variance);
        }
    }
    drop(stack_index);
    drop(aggregate_index);
    drop(path_index);
    // Samples of one stack side by side: their location lists repeat, which gzip compresses well.
    aggregates.sort_unstable_by_key(|a| (a.stack, a.class, a.gen_age, a.retained));

    let mut strings = StringTable::new();
    let mut tables = LocationTables::default();
    let stack_locations: Vec<Vec<u64>> = stacks
        .iter()
        .map(|stack| {
            stack
                .iter()
                .map(|frame| tables.location(&mut strings, frame))
                .collect()
        })
        .collect();

    let mut sample_types = vec![value_type(
        &mut strings,
        LIVE_SAMPLES_TYPE,
        LIVE_SAMPLES_UNIT,
    )];
    if snapshot.size_enabled() {
        sample_types.push(value_type(&mut strings, LIVE_SIZE_TYPE, LIVE_SIZE_UNIT));
    }
    // Tools show the default type first (go tool pprof would otherwise pick the last one).
    let default_sample_type = sample_types.last().map_or(0, |t| t.r#type);
    if options.uncertainty {
        sample_types.push(value_type(
            &mut strings,
            LIVE_RECORDS_TYPE,
            LIVE_RECORDS_UNIT,
        ));
        sample_types.push(value_type(
            &mut strings,
            LIVE_SAMPLES_VARIANCE_TYPE,
            LIVE_SAMPLES_VARIANCE_UNIT,
        ));
        if snapshot.size_enabled() {
            sample_types.push(value_type(
                &mut strings,
                LIVE_SIZE_VARIANCE_TYPE,
                LIVE_SIZE_VARIANCE_UNIT,
            ));
        }
    }
    let class_key = strings.fixed(CLASS_LABEL);
    let gen_age_key = strings.fixed(GEN_AGE_LABEL);
    let retained_key = (!paths.is_empty()).then(|| strings.fixed(RETAINED_BY_LABEL));
    let path_strings: Vec<i64> = paths
        .iter()
        .map(|p| strings.push((*p).to_owned()))
        .collect();
    let samples = aggregates
        .iter()
        .map(|a| {
            let mut labels = Vec::with_capacity(3);
            if a.class != 0 {
                labels.push(pb::Label {
                    key: class_key,
                    str: strings.stored(a.class),
                    ..Default::default()
                });
            }
            labels.push(pb::Label {
                key: gen_age_key,
                num: i64::try_from(a.gen_age).unwrap_or(i64::MAX),
                ..Default::default()
            });
            if let (Some(key), Some(&str)) =
                (retained_key, a.retained.and_then(|r| path_strings.get(r)))
            {
                labels.push(pb::Label {
                    key,
                    str,
                    ..Default::default()
                });
            }
            let mut values = Vec::with_capacity(5);
            values.push(a.objects);
            if snapshot.size_enabled() {
                values.push(a.bytes);
            }
            if options.uncertainty {
                values.extend([a.records, a.objects_variance]);
                if snapshot.size_enabled() {
                    values.push(a.bytes_variance);
                }
            }
            pb::Sample {
                location_ids: stack_locations.get(a.stack).cloned().unwrap_or_default(),
                values,
                labels,
            }
        })
        .collect();
    let period_type = Some(value_type(&mut strings, PERIOD_TYPE, PERIOD_UNIT));

    let end = options.end.unwrap_or_else(SystemTime::now);
    let start = options.start.unwrap_or(end);
    let comment = (snapshot.notes().iter())
        .map(|note| strings.push(note.clone()))
        .collect();
    let profile = pb::Profile {
        comment,
        sample_types,
        samples,
        locations: tables.locations,
        functions: tables.functions,
        string_table: strings.resolve(snapshot.names())?,
        time_nanos: nanos(start.duration_since(UNIX_EPOCH).unwrap_or(Duration::ZERO)),
        duration_nanos: nanos(end.duration_since(start).unwrap_or(Duration::ZERO)),
        period_type,
        period: options.sample_every,
        default_sample_type,
        ..Default::default()
    };
    Ok((profile, objects))
}

fn nanos(d: Duration) -> i64 {
    i64::try_from(d.as_nanos()).unwrap_or(i64::MAX)
}

fn value_type(
    strings: &mut StringTable,
    r#type: &'static str,
    unit: &'static str,
) -> pb::ValueType {
    pb::ValueType {
        r#type: strings.fixed(r#type),
        unit: strings.fixed(unit),
    }
}

/// Locations (one per distinct frame) and functions (one per distinct name and file), with the
/// 1-based ids pprof gives them.
#[derive(Default)]
struct LocationTables {
    location_ids: FxMap<Frame, u64>,
    function_ids: FxMap<(StringId, StringId), u64>,
    locations: Vec<pb::Location>,
    functions: Vec<pb::Function>,
}

impl LocationTables {
    fn location(&mut self, strings: &mut StringTable, frame: &Frame) -> u64 {
        if let Some(&id) = self.location_ids.get(frame) {
            return id;
        }
        let function_id = match self.function_ids.get(&(frame.name, frame.filename)) {
            Some(&id) => id,
            None => {
                let id = self.functions.len() as u64 + 1;
                self.functions.push(pb::Function {
                    id,
                    name: strings.stored(frame.name),
                    system_name: 0,
                    filename: strings.stored(frame.filename),
                });
                self.function_ids.insert((frame.name, frame.filename), id);
                id
            }
        };
        let id = self.locations.len() as u64 + 1;
        self.locations.push(pb::Location {
            id,
            lines: vec![pb::Line {
                function_id,
                line: i64::from(frame.line),
            }],
            ..Default::default()
        });
        self.location_ids.insert(*frame, id);
        id
    }
}

/// The pprof string table being built: our own fixed strings, plus slots for storage ids whose
/// text is copied in from the snapshot's names at the end.
struct StringTable {
    strings: Vec<String>,
    fixed: FxMap<&'static str, i64>,
    stored: FxMap<StringId, i64>,
    /// (storage id, slot in `strings`) still to copy.
    unresolved: Vec<(StringId, usize)>,
}

impl StringTable {
    fn new() -> Self {
        StringTable {
            // pprof wants "" at index 0; storage id 0 is "" too.
            strings: vec![String::new()],
            fixed: FxMap::default(),
            stored: FxMap::default(),
            unresolved: Vec::new(),
        }
    }

    fn push(&mut self, text: String) -> i64 {
        self.strings.push(text);
        self.strings.len() as i64 - 1
    }

    fn fixed(&mut self, text: &'static str) -> i64 {
        if let Some(&index) = self.fixed.get(text) {
            return index;
        }
        let index = self.push(text.to_owned());
        self.fixed.insert(text, index);
        index
    }

    fn stored(&mut self, id: StringId) -> i64 {
        if id == 0 {
            return 0;
        }
        if let Some(&index) = self.stored.get(&id) {
            return index;
        }
        let index = self.push(String::new());
        self.unresolved.push((id, self.strings.len() - 1));
        self.stored.insert(id, index);
        index
    }

    /// Copies the names in and returns the finished table. The snapshot holds the text of every
    /// id it refers to, so a missing one is a recorder bug, reported with the id.
    fn resolve(mut self, names: &Names) -> Result<Vec<String>> {
        for &(id, slot) in &self.unresolved {
            let text = names.get(id)?;
            if let Some(entry) = self.strings.get_mut(slot) {
                *entry = text.to_owned();
            }
        }
        Ok(self.strings)
    }
}

pub(super) fn gzip(raw: &[u8], level: u32) -> Result<Vec<u8>> {
    let mut encoder = GzEncoder::new(
        Vec::with_capacity(raw.len() / 4 + 64),
        Compression::new(level),
    );
    let failed = |e: std::io::Error| {
        HeapError::Pprof(format!("gzip of a {} byte profile failed: {e}", raw.len()))
    };
    encoder.write_all(raw).map_err(failed)?;
    encoder.finish().map_err(failed)
}
