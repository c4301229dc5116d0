//! Encoder and reader tests: a recorder fed through the fake VM, encoded, read back.

mod fuzz;
mod libdd;
mod malformed;
mod memory;
mod retained;
mod summary;
mod uncertainty;

use std::collections::HashSet;
use std::io::Read;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use libdd_profiling_protobuf::prost_impls as pb;
use prost::Message;

use super::*;
use crate::fake_vm::FakeVm;
use crate::{HeapRecorder, NamedFrame, RecordOutcome, RecorderOptions, Snapshot};

/// One allocation to record: frames innermost first as (name, file, line).
#[derive(Clone)]
pub(super) struct Alloc {
    pub frames: Vec<(String, String, i32)>,
    pub class: Option<String>,
    pub weight: u32,
    pub size: usize,
}

pub(super) fn alloc(
    frames: &[(&str, &str, i32)],
    class: Option<&str>,
    weight: u32,
    size: usize,
) -> Alloc {
    Alloc {
        frames: frames
            .iter()
            .map(|&(n, f, l)| (n.to_owned(), f.to_owned(), l))
            .collect(),
        class: class.map(str::to_owned),
        weight,
        size,
    }
}

/// A recorder and its fake VM.
pub(super) struct World {
    pub rec: HeapRecorder,
    pub vm: FakeVm,
}

impl World {
    pub fn new(size_enabled: bool) -> Self {
        World {
            rec: HeapRecorder::new(RecorderOptions {
                sample_rate: 1,
                size_enabled,
                ..RecorderOptions::default()
            }),
            vm: FakeVm::new(),
        }
    }

    /// Records and commits every allocation; returns their objects.
    pub fn record(&mut self, allocs: &[Alloc]) -> Vec<usize> {
        let mut objects = Vec::with_capacity(allocs.len());
        for a in allocs {
            let object = self.vm.alloc(a.size);
            let frames: Vec<NamedFrame<'_>> = a
                .frames
                .iter()
                .map(|(name, filename, line)| NamedFrame {
                    name,
                    filename,
                    line: *line,
                })
                .collect();
            let r = self
                .rec
                .record_allocation(
                    object,
                    u64::from(a.weight),
                    a.class.as_deref(),
                    &frames,
                    self.vm.gc,
                )
                .unwrap();
            assert_eq!(r.outcome, RecordOutcome::Pending);
            if self.rec.stats().unwrap().pending_recordings_count as usize
                >= crate::MAX_PENDING_RECORDINGS
            {
                self.rec.commit(&mut self.vm).unwrap();
            }
            objects.push(object);
        }
        self.rec.commit(&mut self.vm).unwrap();
        objects
    }

    pub fn snapshot(&mut self) -> Snapshot {
        self.rec.prepare_iteration(&mut self.vm).unwrap()
    }
}

pub(super) fn options() -> EncodeOptions {
    EncodeOptions {
        sample_every: 512,
        start: Some(UNIX_EPOCH + Duration::from_secs(1_700_000_000)),
        end: Some(UNIX_EPOCH + Duration::from_secs(1_700_000_060)),
        uncertainty: true,
    }
}

pub(super) fn gunzip(bytes: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    flate2::read::GzDecoder::new(bytes)
        .read_to_end(&mut out)
        .unwrap();
    out
}

pub(super) fn raw_profile(encoded: &EncodedPprof) -> pb::Profile {
    pb::Profile::decode(gunzip(&encoded.bytes).as_slice()).unwrap()
}

/// Encodes what `world` tracks now (after one more GC, so everything recorded so far is age >= 1).
pub(super) fn encode_world(world: &mut World) -> EncodedPprof {
    world.vm.gc();
    let snapshot = world.snapshot();
    let encoded = encode_profile(&snapshot, &options()).unwrap();
    drop(snapshot);
    world.rec.finish_iteration().unwrap();
    encoded
}

const APP: &[(&str, &str, i32)] = &[
    ("Foo#build", "/app/foo.rb", 12),
    ("Foo#call", "/app/foo.rb", 30),
    ("<main>", "/app/main.rb", 1),
];
const OTHER: &[(&str, &str, i32)] = &[
    ("Bar#make", "/app/bar.rb", 7),
    ("Foo#call", "/app/foo.rb", 30),
    ("<main>", "/app/main.rb", 1),
];

fn frames_of(spec: &[(&str, &str, i32)]) -> Vec<SourceFrame> {
    spec.iter()
        .map(|&(n, f, l)| SourceFrame {
            name: n.into(),
            filename: f.into(),
            line: i64::from(l),
        })
        .collect()
}

#[test]
fn round_trip_keeps_types_values_labels_and_period() {
    let mut w = World::new(true);
    w.record(&[
        alloc(APP, Some("String"), 3, 40),
        alloc(APP, Some("String"), 2, 100),
        alloc(OTHER, Some("Array"), 5, 80),
    ]);
    let encoded = encode_world(&mut w);
    assert_eq!(&encoded.bytes[..2], &[0x1f, 0x8b], "gzip magic");
    assert_eq!((encoded.objects, encoded.samples), (3, 2));

    let p = read_profile(&encoded.bytes).unwrap();
    let types: Vec<_> = p
        .sample_types
        .iter()
        .map(|t| (t.name.as_str(), t.unit.as_str()))
        .collect();
    assert_eq!(
        types,
        [
            ("heap-live-samples", "count"),
            ("heap-live-size", "bytes"),
            ("heap-live-records", "count"),
            ("heap-live-samples-variance", "count^2"),
            ("heap-live-size-variance", "bytes^2")
        ]
    );
    assert_eq!(
        p.period_type,
        Some(SampleType {
            name: "allocations".into(),
            unit: "count".into()
        })
    );
    assert_eq!(p.period, 512);
    assert_eq!(p.time_nanos, 1_700_000_000 * 1_000_000_000);
    assert_eq!(p.duration_nanos, 60 * 1_000_000_000);

    let app = p
        .samples
        .iter()
        .find(|s| *s.frames == *frames_of(APP))
        .unwrap();
    assert_eq!(
        app.values,
        vec![
            3 + 2,
            3 * 40 + 2 * 100,
            2,
            3 * 2 + 2,
            3 * 2 * 40 * 40 + 2 * 100 * 100
        ]
    );
    assert_eq!(app.class.as_deref(), Some("String"));
    assert_eq!(app.gen_age, Some(1));
    let other = p
        .samples
        .iter()
        .find(|s| *s.frames == *frames_of(OTHER))
        .unwrap();
    assert_eq!(other.values, vec![5, 5 * 80, 1, 5 * 4, 5 * 4 * 80 * 80]);
    assert_eq!(other.class.as_deref(), Some("Array"));
}

#[test]
fn size_type_is_absent_when_sizes_are_off() {
    let mut w = World::new(false);
    w.record(&[alloc(APP, Some("String"), 4, 40)]);
    let encoded = encode_world(&mut w);
    let p = read_profile(&encoded.bytes).unwrap();
    let names: Vec<&str> = p.sample_types.iter().map(|t| t.name.as_str()).collect();
    assert_eq!(
        names,
        [
            "heap-live-samples",
            "heap-live-records",
            "heap-live-samples-variance"
        ]
    );
    assert_eq!(p.samples[0].values, vec![4, 1, 4 * 3]);
    assert_eq!(p.bytes_index(), None);
}

#[test]
fn same_stack_class_and_age_make_one_sample_and_ages_split() {
    let mut w = World::new(true);
    w.record(&[
        alloc(APP, Some("String"), 1, 10),
        alloc(APP, Some("String"), 1, 10),
    ]);
    w.vm.gc();
    w.record(&[
        alloc(APP, Some("String"), 1, 10),
        alloc(APP, Some("Hash"), 1, 10),
        alloc(APP, None, 1, 10),
    ]);
    let encoded = encode_world(&mut w);
    assert_eq!((encoded.objects, encoded.samples), (5, 4));
    let p = read_profile(&encoded.bytes).unwrap();
    let mut seen: Vec<_> = p
        .samples
        .iter()
        .map(|s| (s.class.clone(), s.gen_age, s.values[0]))
        .collect();
    seen.sort();
    assert_eq!(
        seen,
        vec![
            (None, Some(1), 1),
            (Some("Hash".into()), Some(1), 1),
            (Some("String".into()), Some(1), 1),
            (Some("String".into()), Some(2), 2),
        ]
    );
}

#[test]
fn unknown_class_writes_no_class_label() {
    let mut w = World::new(true);
    w.record(&[alloc(APP, None, 1, 10)]);
    let raw = raw_profile(&encode_world(&mut w));
    let keys: Vec<&str> = raw.samples[0]
        .labels
        .iter()
        .map(|l| raw.string_table[l.key as usize].as_str())
        .collect();
    assert_eq!(keys, ["gc gen age"]);
    assert_eq!(raw.samples[0].labels[0].num, 1);
}

#[test]
fn stacks_share_locations_and_functions() {
    let mut w = World::new(true);
    let mut allocs = vec![];
    for i in 0..30 {
        let spec = if i % 2 == 0 { APP } else { OTHER };
        allocs.push(alloc(spec, Some(["A", "B", "C"][i % 3]), 1, 8));
    }
    // Same function as APP's innermost frame on another line: a new location, not a new function.
    allocs.push(alloc(
        &[
            ("Foo#build", "/app/foo.rb", 13),
            ("<main>", "/app/main.rb", 1),
        ],
        None,
        1,
        8,
    ));
    w.record(&allocs);
    let encoded = encode_world(&mut w);
    let raw = raw_profile(&encoded);

    let frames: HashSet<_> = allocs.iter().flat_map(|a| a.frames.clone()).collect();
    let functions: HashSet<_> = frames.iter().map(|(n, f, _)| (n, f)).collect();
    assert_eq!(raw.locations.len(), frames.len());
    assert_eq!(raw.functions.len(), functions.len());
    assert_eq!(
        (encoded.locations, encoded.functions),
        (frames.len(), functions.len())
    );
    assert!(raw.mappings.is_empty());
    let ids: HashSet<u64> = raw.locations.iter().map(|l| l.id).collect();
    for s in &raw.samples {
        assert!(s.location_ids.iter().all(|id| ids.contains(id)));
    }
    // The string table holds each name once.
    let strings: HashSet<_> = raw.string_table.iter().collect();
    assert_eq!(strings.len(), raw.string_table.len());
    assert_eq!(raw.string_table[0], "");
}

#[test]
fn empty_and_newborn_only_profiles_are_valid() {
    let mut w = World::new(true);
    let encoded = encode_world(&mut w);
    assert_eq!((encoded.samples, encoded.objects), (0, 0));
    assert_eq!(&encoded.bytes[..2], &[0x1f, 0x8b]);
    let p = read_profile(&encoded.bytes).unwrap();
    assert!(p.samples.is_empty());
    assert_eq!(p.sample_types.len(), 5);

    // Objects that have not met a GC are left out.
    w.record(&[alloc(APP, Some("String"), 1, 10)]);
    let snapshot = w.snapshot();
    assert_eq!(snapshot.len(), 1);
    let encoded = encode_profile(&snapshot, &options()).unwrap();
    assert_eq!(encoded.samples, 0);
    assert!(read_profile(&encoded.bytes).unwrap().samples.is_empty());
}

#[test]
fn encoding_takes_no_string_references() {
    let mut w = World::new(true);
    let objects = w.record(&[
        alloc(APP, Some("String"), 1, 10),
        alloc(OTHER, Some("Array"), 1, 10),
    ]);
    w.vm.gc();
    let refs = w.rec.stats().unwrap().string_refs;
    for _ in 0..3 {
        let snapshot = w.snapshot();
        encode_profile(&snapshot, &options()).unwrap();
        drop(snapshot);
        w.rec.finish_iteration().unwrap();
        assert_eq!(w.rec.stats().unwrap().string_refs, refs);
    }
    objects.iter().for_each(|&o| w.vm.kill(o));
    w.vm.gc();
    let snapshot = w.snapshot();
    drop(snapshot);
    w.rec.finish_iteration().unwrap();
    assert_eq!(w.rec.stats().unwrap().string_refs, 0);
    // Nothing is left interned once the caches (class names) give back theirs: every id up to
    // the last one handed out is gone.
    w.rec.clear_stack_cache();
    let strings = w.rec.strings().lock().unwrap();
    for id in 1..64 {
        assert!(strings.get(id).is_err(), "id {id} still interned");
    }
}

#[test]
fn encodes_on_a_thread_without_the_recorder() {
    let mut w = World::new(true);
    w.record(&[alloc(APP, Some("String"), 2, 10)]);
    w.vm.gc();
    let snapshot = w.snapshot();
    let encoded = std::thread::spawn(move || encode_profile(&snapshot, &options()))
        .join()
        .unwrap()
        .unwrap();
    w.rec.finish_iteration().unwrap();
    assert_eq!(
        read_profile(&encoded.bytes).unwrap().samples[0].values,
        [2, 20, 1, 2, 2 * 10 * 10]
    );
}

#[test]
fn encoding_needs_neither_the_recorder_nor_its_storage() {
    // The snapshot carries its names: the encoder works with the storage locked by someone else
    // and the recorder gone, which is what makes it safe off the GVL and across a fork.
    let mut w = World::new(true);
    w.record(&[alloc(APP, Some("String"), 1, 10)]);
    w.vm.gc();
    let snapshot = w.snapshot();
    w.rec.finish_iteration().unwrap();
    let held = w.rec.strings().lock().unwrap();
    let encoded = encode_profile(&snapshot, &options()).unwrap();
    drop(held);
    let data = read_profile(&encoded.bytes).unwrap();
    assert_eq!(data.samples[0].class.as_deref(), Some("String"));
    assert!(snapshot.names().len() >= 2, "class, frame name and file");
}

#[test]
fn sample_every_below_one_is_rejected_with_its_value() {
    let mut w = World::new(true);
    let snapshot = w.snapshot();
    let err = encode_profile(
        &snapshot,
        &EncodeOptions {
            sample_every: 0,
            ..options()
        },
    )
    .unwrap_err();
    assert!(matches!(
        err,
        crate::HeapError::InvalidArgument {
            name: "sample_every",
            ..
        }
    ));
    assert!(err.to_string().contains("got 0"), "{err}");
}

#[test]
fn times_default_to_now_with_zero_duration() {
    let mut w = World::new(true);
    let snapshot = w.snapshot();
    let before = SystemTime::now().duration_since(UNIX_EPOCH).unwrap();
    let encoded = encode_profile(&snapshot, &EncodeOptions::default()).unwrap();
    let p = read_profile(&encoded.bytes).unwrap();
    assert!(p.time_nanos >= before.as_nanos() as i64);
    assert_eq!((p.duration_nanos, p.period), (0, 1));
    // A start after the end is a zero duration, not an error.
    let encoded = encode_profile(
        &snapshot,
        &EncodeOptions {
            start: options().end,
            end: options().start,
            ..options()
        },
    )
    .unwrap();
    assert_eq!(read_profile(&encoded.bytes).unwrap().duration_nanos, 0);
}

#[test]
fn huge_weight_times_size_saturates() {
    let mut w = World::new(true);
    w.record(&[
        alloc(APP, Some("String"), u32::MAX, usize::MAX / 2),
        alloc(APP, Some("String"), u32::MAX, usize::MAX / 2),
    ]);
    let p = read_profile(&encode_world(&mut w).bytes).unwrap();
    // The variances saturate too: 3 GiB of standard deviation or more reads as i64::MAX.
    assert_eq!(
        p.samples[0].values,
        [2 * i64::from(u32::MAX), i64::MAX, 2, i64::MAX, i64::MAX]
    );
}

#[test]
fn raw_and_gzip_read_the_same() {
    let mut w = World::new(true);
    w.record(&[alloc(APP, Some("String"), 1, 10)]);
    let encoded = encode_world(&mut w);
    let raw = gunzip(&encoded.bytes);
    assert_eq!(raw.len(), encoded.uncompressed_len);
    assert_eq!(
        read_profile(&raw).unwrap(),
        read_profile(&encoded.bytes).unwrap()
    );
    let zstd = zstd::encode_all(raw.as_slice(), 1).unwrap();
    assert_eq!(
        read_profile(&zstd).unwrap(),
        read_profile(&encoded.bytes).unwrap()
    );
}
