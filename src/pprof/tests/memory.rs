//! The reader's memory limit. This test binary's global allocator counts the bytes each thread
//! holds while it is asked to, so a test can see the peak of one read and check it against the
//! limit the read was given.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::ffi::OsString;
use std::io::Write;

use proptest::prelude::*;

use super::*;
use crate::pprof::budget::{limit_for_input, parse_max_profile_bytes, ProfileLimit};
use crate::pprof::read::read_within;
use crate::pprof::{MAX_EXPANSION, MIN_DEFAULT_PROFILE_BYTES};
use crate::{HeapError, Result};

/// [`System`], plus a count of the bytes held by the threads that turned counting on.
struct CountingAllocator;

thread_local! {
    static COUNTING: Cell<bool> = const { Cell::new(false) };
    static HELD: Cell<i64> = const { Cell::new(0) };
    static PEAK: Cell<i64> = const { Cell::new(0) };
}

/// Adds `change` to this thread's count when it is counting. Never allocates: the thread locals
/// are const-initialised and have no destructor.
fn note(change: i64) {
    let _ = COUNTING.try_with(|counting| {
        if counting.get() {
            let held = HELD.get() + change;
            HELD.set(held);
            PEAK.set(PEAK.get().max(held));
        }
    });
}

// SAFETY: every method hands the call to `System` unchanged and only counts on success.
unsafe impl GlobalAlloc for CountingAllocator {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's contract for `layout` is the one `System.alloc` needs.
        let ptr = unsafe { System.alloc(layout) };
        if !ptr.is_null() {
            note(layout.size() as i64);
        }
        ptr
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: as for `alloc`.
        let ptr = unsafe { System.alloc_zeroed(layout) };
        if !ptr.is_null() {
            note(layout.size() as i64);
        }
        ptr
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` came from this allocator, that is from `System`, with `layout`.
        unsafe { System.dealloc(ptr, layout) };
        note(-(layout.size() as i64));
    }

    /// Counted as growing in place (old and new size are never both held): glibc moves a large
    /// block with mremap, without a copy.
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: `ptr` came from `System` with `layout`; the caller's contract for `new_size`
        // is the one `System.realloc` needs.
        let new = unsafe { System.realloc(ptr, layout, new_size) };
        if !new.is_null() {
            note(new_size as i64 - layout.size() as i64);
        }
        new
    }
}

#[global_allocator]
static ALLOCATOR: CountingAllocator = CountingAllocator;

/// Runs `f` and returns what it returned and the most bytes this thread held at once meanwhile,
/// beyond what it held before (what `f` returns is counted: it is allocated while counting).
pub(super) fn peak_bytes_during<T>(f: impl FnOnce() -> T) -> (T, u64) {
    HELD.set(0);
    PEAK.set(0);
    COUNTING.set(true);
    let result = f();
    COUNTING.set(false);
    (result, PEAK.get().max(0) as u64)
}

fn gzip(bytes: &[u8]) -> Vec<u8> {
    let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    e.write_all(bytes).unwrap();
    e.finish().unwrap()
}

/// A gzip profile of `count` empty samples (`\x12\x00`, two bytes each) and nothing else,
/// compressed without ever holding the raw bytes.
fn empty_sample_bomb(count: usize) -> Vec<u8> {
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
    let chunk = [0x12u8, 0x00].repeat(32 * 1024);
    let mut left = count;
    while left > 0 {
        let n = left.min(chunk.len() / 2);
        gz.write_all(&chunk[..2 * n]).unwrap();
        left -= n;
    }
    gz.finish().unwrap()
}

fn strings(list: &[&str]) -> Vec<String> {
    list.iter().map(|s| s.to_string()).collect()
}

/// A profile shaped like a big real heap profile: `samples` samples with two values, a class and
/// an age label, each with a stack of 20 frames out of 5,000 locations (one line each) over
/// 2,000 functions; 5,000 distinct stacks.
fn typical_profile(samples: usize) -> pb::Profile {
    let mut string_table = strings(&[
        "",
        "heap-live-samples",
        "count",
        "heap-live-size",
        "bytes",
        CLASS_LABEL,
        GEN_AGE_LABEL,
    ]);
    let classes = string_table.len();
    string_table.extend((0..100).map(|i| format!("App::Model{i}")));
    let functions = (0..2000u64)
        .map(|i| {
            string_table.push(format!("App::Service{}#handle_request_{i}", i % 50));
            string_table.push(format!("/srv/app/lib/service_{}.rb", i % 300));
            pb::Function {
                id: i + 1,
                name: string_table.len() as i64 - 2,
                system_name: 0,
                filename: string_table.len() as i64 - 1,
            }
        })
        .collect();
    let locations = (0..5000u64)
        .map(|i| pb::Location {
            id: i + 1,
            mapping_id: 0,
            address: 0,
            lines: vec![pb::Line {
                function_id: 1 + i % 2000,
                line: (i % 400) as i64,
            }],
            is_folded: false,
        })
        .collect();
    let samples = (0..samples as u64)
        .map(|i| pb::Sample {
            location_ids: (0..20).map(|d| 1 + (i * 7 + d * 13) % 5000).collect(),
            values: vec![1 + (i % 5) as i64, 40 * (1 + (i % 5) as i64)],
            labels: vec![
                pb::Label {
                    key: 5,
                    str: (classes + (i % 100) as usize) as i64,
                    num: 0,
                    num_unit: 0,
                },
                pb::Label {
                    key: 6,
                    str: 0,
                    num: (i % 10) as i64,
                    num_unit: 0,
                },
            ],
        })
        .collect();
    pb::Profile {
        sample_types: vec![
            pb::ValueType { r#type: 1, unit: 2 },
            pb::ValueType { r#type: 3, unit: 4 },
        ],
        samples,
        functions,
        locations,
        string_table,
        ..pb::Profile::default()
    }
}

/// Profiles that ask for much more memory than they take on disk, one way each, raw.
fn bombs() -> Vec<(&'static str, Vec<u8>)> {
    let n = 20_000;
    let empty = |samples| pb::Profile {
        samples,
        string_table: strings(&[""]),
        ..pb::Profile::default()
    };
    let mut list = vec![(
        "empty samples",
        empty(vec![pb::Sample::default(); n]).encode_to_vec(),
    )];

    let mut p = empty(vec![]);
    p.string_table.extend((0..n).map(|i| (i % 7).to_string()));
    p.comment = vec![1; n];
    list.push(("one-byte strings, and comments", p.encode_to_vec()));

    // One long string named by every sample's class label and by every comment.
    let mut p = empty(vec![
        pb::Sample {
            labels: vec![pb::Label {
                key: 1,
                str: 2,
                num: 0,
                num_unit: 0,
            }],
            ..pb::Sample::default()
        };
        n / 10
    ]);
    p.string_table = strings(&["", CLASS_LABEL, &"C".repeat(2000)]);
    p.comment = vec![2; n / 10];
    list.push((
        "labels and comments naming a long string",
        p.encode_to_vec(),
    ));

    // One location of 100 inlined lines, named 200 times by each of 10 samples (distinct
    // stacks: each names one more), and 1,000 unsymbolized locations.
    let mut p = empty(vec![]);
    p.string_table = strings(&["", "Foo#bar", "/app/foo.rb"]);
    p.functions = vec![pb::Function {
        id: 1,
        name: 1,
        system_name: 0,
        filename: 2,
    }];
    p.locations = vec![pb::Location {
        id: 1,
        mapping_id: 0,
        address: 0,
        lines: vec![
            pb::Line {
                function_id: 1,
                line: 3
            };
            100
        ],
        is_folded: false,
    }];
    p.locations.extend((2..1002).map(|id| pb::Location {
        id,
        address: u64::MAX - id,
        ..pb::Location::default()
    }));
    p.samples = (0..10)
        .map(|i| pb::Sample {
            location_ids: vec![1; 200 + i],
            ..pb::Sample::default()
        })
        .collect();
    p.samples.push(pb::Sample {
        location_ids: (2..1002).collect(),
        ..pb::Sample::default()
    });
    list.push(("inlined lines and repeated locations", p.encode_to_vec()));

    list.push(("a typical profile", typical_profile(2000).encode_to_vec()));
    list
}

/// Outcome and peak of reading `bytes` with `limit`.
fn read_with(bytes: &[u8], limit: u64) -> (Result<ProfileData>, u64) {
    peak_bytes_during(|| read_profile_with_limit(bytes, limit))
}

/// The smallest limit `bytes` reads with.
fn smallest_limit(bytes: &[u8]) -> u64 {
    let (mut refused, mut reads) = (0u64, 1u64 << 34);
    assert!(read_profile_with_limit(bytes, reads).is_ok());
    while reads - refused > 1 {
        let mid = refused + (reads - refused) / 2;
        match read_profile_with_limit(bytes, mid) {
            Ok(_) => reads = mid,
            Err(HeapError::ProfileTooLarge { .. }) => refused = mid,
            Err(e) => panic!("{e}"),
        }
    }
    reads
}

fn refused_with(result: Result<ProfileData>) -> (u64, String) {
    match result {
        Err(HeapError::ProfileTooLarge { limit, what, .. }) => (limit, what),
        Err(e) => panic!("expected the limit error, got {e}"),
        Ok(p) => panic!("expected the limit error, read {} samples", p.samples.len()),
    }
}

#[test]
fn ten_million_empty_samples_are_refused_before_decoding() {
    let gz = empty_sample_bomb(10_000_000);
    assert!(gz.len() < 64 * 1024, "{} bytes", gz.len());
    let started = std::time::Instant::now();
    let (result, peak) = read_with(&gz, DEFAULT_MAX_PROFILE_BYTES);
    let elapsed = started.elapsed();
    let (limit, what) = refused_with(result);
    assert_eq!(limit, DEFAULT_MAX_PROFILE_BYTES);
    assert!(
        what.starts_with("its 10000000 samples, 0 locations, 0 functions and 0 strings take about"),
        "{what}"
    );
    // The decompressed protobuf (20 MB, in a buffer that doubles) and the decompressor, nothing
    // decoded. The reader before the limit held 2.28 GB here, and read all 10M samples.
    assert!(peak < 40 << 20, "peak {peak} bytes");
    eprintln!(
        "{} bytes of gzip refused in {elapsed:?}, peak {peak} bytes",
        gz.len()
    );
}

#[test]
fn without_the_variable_the_limit_scales_with_the_input() {
    let scaled = |len: usize| limit_for_input(None, len).unwrap();
    let mib = 1u64 << 20;
    assert_eq!(
        scaled(10_000),
        ProfileLimit {
            bytes: 64 * mib,
            input_bytes: Some(10_000)
        }
    );
    assert_eq!(scaled(0).bytes, MIN_DEFAULT_PROFILE_BYTES);
    assert_eq!(scaled(100_000).bytes, 100_000 * MAX_EXPANSION);
    assert_eq!(scaled(100_000).input_bytes, Some(100_000));
    // From 256 KiB of input, the fixed bound.
    assert_eq!(
        scaled(256 * 1024),
        ProfileLimit::fixed(DEFAULT_MAX_PROFILE_BYTES)
    );
    assert_eq!(
        scaled(usize::MAX),
        ProfileLimit::fixed(DEFAULT_MAX_PROFILE_BYTES)
    );
    // The variable, when set, is the limit whatever the input's size, smaller or larger.
    for (value, len, bytes) in [("4294967296", 10, 1u64 << 32), ("1000", 10_000_000, 1000)] {
        assert_eq!(
            limit_for_input(Some(OsString::from(value)), len),
            Ok(ProfileLimit::fixed(bytes))
        );
    }
    assert_eq!(
        limit_for_input(Some(OsString::new()), 10_000),
        Ok(scaled(10_000))
    );
    assert!(limit_for_input(Some(OsString::from("2GB")), 10).is_err());
}

#[test]
fn a_10_kb_file_of_empty_samples_is_refused_at_a_limit_scaled_to_its_size() {
    // 2.5 million empty samples in 5 to 10 kB of gzip: read within the fixed 1 GiB bound alone
    // they took the reader to 641 MB of RSS, 64,000 times a 10 kB file.
    let gz = empty_sample_bomb(2_500_000);
    assert!(gz.len() < 16 * 1024, "{} bytes", gz.len());
    let limit = limit_for_input(None, gz.len()).unwrap();
    let (result, peak) = peak_bytes_during(|| read_within(&gz, limit));
    let message = result.as_ref().err().map(ToString::to_string);
    let (refused_at, what) = refused_with(result);
    assert_eq!(refused_at, MIN_DEFAULT_PROFILE_BYTES);
    assert!(
        what.starts_with("its 2500000 samples, 0 locations, 0 functions and 0 strings take about"),
        "{what}"
    );
    let message = message.unwrap();
    assert!(
        message.starts_with(&format!(
            "pprof: reading this profile needs more memory than the limit of 67108864 bytes \
             (4096 times the {} bytes it is read from, and at least 67108864): its 2500000 samples",
            gz.len()
        )),
        "{message}"
    );
    assert!(
        message.ends_with(
            "; to read it, set the environment variable DATADOG_HEAP_MAX_PROFILE_BYTES to a \
             larger number of bytes"
        ),
        "{message}"
    );
    // The decompressed protobuf (5 MB, in a buffer that doubles), nothing decoded.
    assert!(peak < 16 << 20, "peak {peak} bytes");
    // What they need fits the fixed 1 GiB bound: the scaled limit is what refuses them.
    let needed: u64 = what
        .split("take about ")
        .nth(1)
        .and_then(|rest| rest.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("{what}"));
    assert!(
        (MIN_DEFAULT_PROFILE_BYTES..DEFAULT_MAX_PROFILE_BYTES).contains(&needed),
        "{needed}"
    );
    eprintln!(
        "{} bytes of gzip ask for {needed}: refused at {refused_at}, peak {peak} bytes",
        gz.len()
    );
}

#[test]
fn the_message_names_the_limit_and_how_to_raise_it() {
    let gz = empty_sample_bomb(10_000_000);
    let message = read_profile_with_limit(&gz, 5_000_000)
        .unwrap_err()
        .to_string();
    assert_eq!(
        message,
        format!(
            "pprof: reading this profile needs more memory than the limit of 5000000 bytes: \
             its {} bytes of gzip decompress to more than 4999968 bytes; to read it, set the \
             environment variable DATADOG_HEAP_MAX_PROFILE_BYTES to a larger number of bytes",
            gz.len()
        )
    );
}

#[test]
fn each_bomb_reads_at_its_smallest_limit_holding_no_more_and_is_refused_below() {
    for (name, raw) in bombs() {
        let limit = smallest_limit(&raw);
        let (result, peak) = read_with(&raw, limit);
        assert!(result.is_ok(), "{name}: {:?}", result.err());
        assert!(peak <= limit, "{name}: peak {peak} bytes, limit {limit}");
        // Not too cautious: within what malloc adds to small blocks (the peak counts the bytes
        // asked for).
        assert!(
            limit <= 2 * peak,
            "{name}: peak {peak} bytes, limit {limit}"
        );
        let (result, peak) = read_with(&raw, limit - 1);
        refused_with(result);
        assert!(peak < limit, "{name}: peak {peak} bytes refused");
        eprintln!("{name}: {} bytes need {limit}, hold {peak}", raw.len());
    }
}

#[test]
fn a_compressed_profile_holds_no_more_than_its_limit_besides_the_decompressor() {
    let raw = typical_profile(2000).encode_to_vec();
    let zstd = zstd::encode_all(raw.as_slice(), 3).unwrap();
    for (name, bytes) in [("gzip", gzip(&raw)), ("zstd", zstd)] {
        let limit = smallest_limit(&bytes);
        assert!(limit > smallest_limit(&raw) + raw.len() as u64, "{name}");
        let (result, peak) = read_with(&bytes, limit);
        assert!(result.is_ok(), "{name}");
        // The decompressor's own state is outside the limit.
        assert!(
            peak <= limit + (1 << 20),
            "{name}: peak {peak} bytes, limit {limit}"
        );
        refused_with(read_profile_with_limit(&bytes, limit - 1));
    }
}

#[test]
fn the_biggest_profile_this_gem_writes_by_default_reads_within_a_quarter_of_the_default_limit() {
    // As many samples as the default max_tracked_objects allows, each a distinct object.
    // (A million such samples need 870 MB, within the default.)
    let raw = typical_profile(crate::DEFAULT_MAX_TRACKED_OBJECTS).encode_to_vec();
    let (result, peak) = read_with(&raw, DEFAULT_MAX_PROFILE_BYTES / 4);
    let read = result.unwrap();
    assert_eq!(read.samples.len(), crate::DEFAULT_MAX_TRACKED_OBJECTS);
    eprintln!("{} bytes hold {peak}", raw.len());
}

#[test]
fn the_limit_comes_from_the_environment() {
    let parse = |v: &str| parse_max_profile_bytes(Some(OsString::from(v)));
    assert_eq!(parse_max_profile_bytes(None), Ok(DEFAULT_MAX_PROFILE_BYTES));
    assert_eq!(parse(""), Ok(DEFAULT_MAX_PROFILE_BYTES));
    assert_eq!(parse("4294967296"), Ok(1 << 32));
    assert_eq!(parse(" 2_000_000 "), Ok(2_000_000));
    for bad in ["0", "-1", "1.5", "2GB", "lots"] {
        let err = parse(bad).unwrap_err();
        assert_eq!(
            err.to_string(),
            format!(
                "DATADOG_HEAP_MAX_PROFILE_BYTES must be a positive whole number of bytes, \
                 such as 4294967296, got {bad:?}"
            )
        );
    }
}

thread_local! {
    /// Reads with a limit of 3.2 MB or more.
    static TYPICAL_RAW: Vec<u8> = typical_profile(100).encode_to_vec();
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// Whatever the input and the limit, a read holds no more than its limit: mutated profiles
    /// read, or are refused, within it.
    #[test]
    fn a_read_holds_no_more_than_its_limit(
        edits in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 0..6),
        limit in 0u64..6_000_000,
    ) {
        let mut raw = TYPICAL_RAW.with(|r| r.clone());
        for (at, byte) in edits {
            let i = at.index(raw.len());
            raw[i] = byte;
        }
        let (_, peak) = read_with(&raw, limit);
        prop_assert!(peak <= limit, "peak {} bytes, limit {}", peak, limit);
    }
}
