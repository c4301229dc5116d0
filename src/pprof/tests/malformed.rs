//! The reader on bad input: always an error naming what is wrong, never a panic.

use std::io::Write;

use proptest::prelude::*;

use super::*;
use crate::HeapError;

fn message(bytes: &[u8]) -> String {
    match read_profile(bytes) {
        Err(HeapError::Pprof(message)) => message,
        other => panic!("expected a pprof error, got {other:?}"),
    }
}

fn gzip(bytes: &[u8]) -> Vec<u8> {
    let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    e.write_all(bytes).unwrap();
    e.finish().unwrap()
}

/// A valid raw profile to break.
fn valid_raw() -> Vec<u8> {
    let mut w = World::new(true);
    w.record(&[
        alloc(APP, Some("String"), 1, 10),
        alloc(OTHER, Some("Array"), 2, 20),
    ]);
    gunzip(&encode_world(&mut w).bytes)
}

fn valid() -> pb::Profile {
    pb::Profile::decode(valid_raw().as_slice()).unwrap()
}

#[test]
fn empty_input() {
    assert!(message(&[]).contains("empty"));
}

#[test]
fn garbage_is_not_a_protobuf() {
    let m = message(&[0xff; 64]);
    assert!(m.contains("not a pprof protobuf (64 bytes"), "{m}");
}

#[test]
fn truncated_gzip() {
    let gz = gzip(&valid_raw());
    for cut in [2, 10, gz.len() / 2, gz.len() - 1] {
        let m = message(&gz[..cut]);
        assert!(m.contains(&format!("gzip input of {cut} bytes")), "{m}");
    }
}

#[test]
fn corrupt_zstd() {
    let mut z = zstd::encode_all(valid_raw().as_slice(), 3).unwrap();
    let m = message(&z[..z.len() / 2]);
    assert!(m.starts_with("zstd input of"), "{m}");
    let last = z.len() - 5;
    z[8..last].iter_mut().for_each(|b| *b ^= 0x5a);
    assert!(read_profile(&z).is_err());
}

#[test]
fn gzip_of_garbage() {
    assert!(message(&gzip(&[0xff; 100])).contains("not a pprof protobuf"));
}

#[test]
fn dangling_references_are_named() {
    let mut p = valid();
    p.samples[0].location_ids.push(999);
    let m = message(&p.encode_to_vec());
    assert!(m.contains("sample 0 refers to location 999"), "{m}");

    let mut p = valid();
    p.locations[0].lines[0].function_id = 77;
    let m = message(&p.encode_to_vec());
    assert!(m.contains("location 1 refers to function 77"), "{m}");

    let mut p = valid();
    p.functions[0].name = 5000;
    let m = message(&p.encode_to_vec());
    assert!(m.contains("function 1 refers to string 5000"), "{m}");

    let mut p = valid();
    p.samples[1].values.push(1);
    let m = message(&p.encode_to_vec());
    assert!(
        m.contains("sample 1 has 6 values but the profile has 5 sample types"),
        "{m}"
    );

    let mut p = valid();
    p.sample_types[1].unit = -3;
    let m = message(&p.encode_to_vec());
    assert!(m.contains("sample type 1 refers to string -3"), "{m}");
}

#[test]
fn unsymbolized_locations_show_their_address() {
    let mut p = valid();
    p.locations[0].lines.clear();
    p.locations[0].address = 0xbeef;
    let read = read_profile(&p.encode_to_vec()).unwrap();
    let names: Vec<_> = read
        .samples
        .iter()
        .flat_map(|s| s.frames.iter().map(|f| f.name.clone()))
        .collect();
    assert!(names.contains(&"0xbeef".to_owned()), "{names:?}");
}

#[test]
fn stacks_that_expand_past_the_limit_are_refused() {
    // One location of 1000 inlined lines, named 100 times by one sample: 100k frames from a few
    // KB of input.
    let mut p = valid();
    let function_id = p.functions[0].id;
    p.locations[0].lines = vec![
        pb::Line {
            function_id,
            line: 1
        };
        1000
    ];
    p.samples[0].location_ids = vec![p.locations[0].id; 100];
    let raw = p.encode_to_vec();
    assert!(raw.len() < 10_000);
    let err = read_profile_with_limit(&raw, 1_000_000).unwrap_err();
    assert!(
        matches!(&err, HeapError::ProfileTooLarge { limit: 1_000_000, what, .. }
            if what.contains("its stacks expand to more frames than fit (sample 0's has 100000)")),
        "{err}"
    );
    // The real limit leaves it alone.
    let read = read_profile(&raw).unwrap();
    assert_eq!(read.samples[0].frames.len(), 100_000);
}

/// Reading must not panic, and neither may summarising whatever was read.
fn read_and_summarise(bytes: &[u8]) {
    if let Ok(p) = read_profile(bytes) {
        top_sites(&p, 10, SortBy::Size);
        top_sites(&p, 10, SortBy::Count);
        diff_sites(&p, &p);
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn random_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
        read_and_summarise(&bytes);
    }

    #[test]
    fn random_bytes_behind_magic_never_panic(
        magic in prop_oneof![Just(vec![0x1f, 0x8b]), Just(vec![0x28, 0xb5, 0x2f, 0xfd])],
        bytes in proptest::collection::vec(any::<u8>(), 0..256),
    ) {
        let mut input = magic;
        input.extend(bytes);
        read_and_summarise(&input);
    }

    #[test]
    fn mutated_profiles_never_panic(
        edits in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..8),
        cut in any::<prop::sample::Index>(),
    ) {
        let mut raw = VALID_RAW.with(|r| r.clone());
        for (at, byte) in edits {
            let i = at.index(raw.len());
            raw[i] = byte;
        }
        read_and_summarise(&raw);
        let cut = cut.index(raw.len());
        read_and_summarise(&raw[..cut]);
        read_and_summarise(&gzip(&raw)[..]);
    }

    #[test]
    fn mutated_fields_never_panic(
        sample_value in any::<i64>(),
        age in any::<i64>(),
        location_id in any::<u64>(),
        string in any::<i64>(),
    ) {
        let mut p = VALID_RAW.with(|r| pb::Profile::decode(r.as_slice()).unwrap());
        p.samples[0].values[0] = sample_value;
        p.samples[0].values[1] = sample_value.wrapping_neg();
        p.samples[0].labels.iter_mut().for_each(|l| l.num = age);
        p.samples[1].location_ids[0] = location_id;
        p.functions[0].filename = string;
        read_and_summarise(&p.encode_to_vec());
    }
}

thread_local! {
    static VALID_RAW: Vec<u8> = valid_raw();
}
