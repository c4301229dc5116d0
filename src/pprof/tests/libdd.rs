//! The road not taken: encoding through libdatadog's `Profile` (zstd out), kept here to check
//! that our reader takes libdatadog's output and agrees with our encoder, and to measure both
//! ways (the ignored `encode_bench`).

use std::time::Instant;

use libdd_profiling::api::{
    ManagedStringId, Period, StringIdFunction, StringIdLabel, StringIdLocation, StringIdSample,
    ValueType,
};
use libdd_profiling::internal::Profile;

use super::*;
use crate::pprof::encode::{encode_uncompressed, gzip};
use crate::strings::Strings;

/// Encodes like `encode_profile` but through libdatadog; returns its zstd buffer. Interns the
/// two label keys for the length of the call and gives them back.
fn encode_with_libdd(
    snapshot: &Snapshot,
    storage: &Strings,
    sample_every: i64,
) -> Result<Vec<u8>, String> {
    let (class_key, age_key) = {
        let mut strings = storage.lock().map_err(|e| e.to_string())?;
        let class_key = strings.intern(CLASS_LABEL).map_err(|e| e.to_string())?;
        let age_key = strings.intern(GEN_AGE_LABEL).map_err(|e| e.to_string())?;
        (
            ManagedStringId::new(class_key),
            ManagedStringId::new(age_key),
        )
    };
    let result = (|| {
        let mut types = vec![ValueType::new(LIVE_SAMPLES_TYPE, LIVE_SAMPLES_UNIT)];
        if snapshot.size_enabled() {
            types.push(ValueType::new(LIVE_SIZE_TYPE, LIVE_SIZE_UNIT));
        }
        let period = Period {
            r#type: ValueType::new(PERIOD_TYPE, PERIOD_UNIT),
            value: sample_every,
        };
        let mut profile =
            Profile::try_with_string_storage(&types, Some(period), storage.storage().clone())
                .map_err(|e| e.to_string())?;
        let mut failed = Ok(());
        snapshot.for_each_live(|o| {
            let locations = o
                .stack
                .iter()
                .map(|f| StringIdLocation {
                    function: StringIdFunction {
                        name: ManagedStringId::new(f.name),
                        system_name: ManagedStringId::empty(),
                        filename: ManagedStringId::new(f.filename),
                    },
                    line: i64::from(f.line),
                    ..Default::default()
                })
                .collect();
            let mut labels = Vec::with_capacity(2);
            if o.data.class != 0 {
                labels.push(StringIdLabel {
                    key: class_key,
                    str: ManagedStringId::new(o.data.class),
                    ..Default::default()
                });
            }
            labels.push(StringIdLabel {
                key: age_key,
                num: o.data.gen_age as i64,
                ..Default::default()
            });
            let weight = o.data.weight as i64;
            let values = [weight, weight.saturating_mul(o.data.size as i64)];
            let n = if snapshot.size_enabled() { 2 } else { 1 };
            failed = profile
                .add_string_id_sample(
                    StringIdSample {
                        locations,
                        values: &values[..n],
                        labels,
                    },
                    None,
                )
                .map_err(|e| e.to_string());
            failed.is_ok()
        });
        failed?;
        profile
            .serialize_into_compressed_pprof(None, None)
            .map(|p| p.buffer)
            .map_err(|e| e.to_string())
    })();
    let mut strings = storage.lock().map_err(|e| e.to_string())?;
    strings
        .unintern_all([class_key.value, age_key.value])
        .map_err(|e| e.to_string())?;
    result
}

fn sorted_sites(p: &ProfileData) -> Vec<Site> {
    top_sites(p, usize::MAX, SortBy::Size)
}

#[test]
fn libdatadog_output_is_zstd_and_reads_like_ours() {
    let mut w = World::new(true);
    w.record(&[
        alloc(APP, Some("String"), 3, 40),
        alloc(APP, Some("String"), 2, 100),
        alloc(OTHER, None, 5, 80),
    ]);
    w.vm.gc();
    let snapshot = w.snapshot();
    let refs = w.rec.stats().unwrap().string_refs;
    let zstd = encode_with_libdd(&snapshot, w.rec.strings(), 512).unwrap();
    assert_eq!(
        &zstd[..4],
        &[0x28, 0xb5, 0x2f, 0xfd],
        "libdatadog writes zstd"
    );
    // libdatadog writes the two estimates only, as an upload does.
    let bare = EncodeOptions {
        uncertainty: false,
        ..options()
    };
    let ours = encode_profile(&snapshot, &bare).unwrap();
    drop(snapshot);
    w.rec.finish_iteration().unwrap();
    assert_eq!(w.rec.stats().unwrap().string_refs, refs);

    let theirs = read_profile(&zstd).unwrap();
    let ours = read_profile(&ours.bytes).unwrap();
    assert_eq!(theirs.sample_types, ours.sample_types);
    assert_eq!(
        (theirs.period_type.clone(), theirs.period),
        (ours.period_type.clone(), 512)
    );
    assert_eq!(sorted_sites(&theirs), sorted_sites(&ours));
    assert_eq!(
        theirs.samples.len(),
        ours.samples.len(),
        "libdatadog aggregates the same way"
    );
}

/// Builds 100k live objects over 5k distinct stacks of depth 10 and times both encoders, twice:
/// with few classes (objects aggregate into ~11k samples) and with many (almost one sample per
/// object, the worst case). Run with
/// `cargo test --release -p datadog_heap_core encode_bench -- --ignored --nocapture`.
#[test]
#[ignore = "benchmark: prints numbers"]
fn encode_bench() {
    bench_case("8 classes", |i| i % 8);
    bench_case("61 classes", |i| (i / 7) % 61);
}

fn bench_case(label: &str, class_of: impl Fn(usize) -> usize) {
    const OBJECTS: usize = 100_000;
    const STACKS: usize = 5_000;
    const DEPTH: usize = 10;
    const RUNS: usize = 5;

    let stacks: Vec<Vec<(String, String, i32)>> = (0..STACKS)
        .map(|s| {
            (0..DEPTH)
                .map(|d| {
                    let f = (s * 7 + d * 13) % 400;
                    (
                        format!("Module{}::Class{}#method_{}", f % 17, f % 40, f),
                        format!("/srv/app/lib/component_{}/file_{}.rb", f % 23, f % 90),
                        ((s * 31 + d) % 700) as i32 + 1,
                    )
                })
                .collect()
        })
        .collect();
    let allocs: Vec<Alloc> = (0..OBJECTS)
        .map(|i| Alloc {
            frames: stacks[(i * 2_654_435_761) % STACKS].clone(),
            class: Some(format!("App::Model{}", class_of(i))),
            weight: 1 + (i % 3) as u32,
            size: 40 + (i % 50) * 8,
        })
        .collect();
    let mut w = World::new(true);
    // Spread over a few GCs so ages differ, as in a real heap.
    for chunk in allocs.chunks(OBJECTS / 4) {
        w.record(chunk);
        w.vm.gc();
    }
    let snapshot = w.snapshot();

    fn best<T>(runs: usize, mut f: impl FnMut() -> T) -> (f64, T) {
        let mut best = f64::MAX;
        let mut out = None;
        for _ in 0..runs {
            let t = Instant::now();
            let r = f();
            best = best.min(t.elapsed().as_secs_f64() * 1e3);
            out = Some(r);
        }
        (best, out.unwrap())
    }

    let (t_raw, (raw, info)) = best(RUNS, || {
        encode_uncompressed(&snapshot, &options(), &Default::default()).unwrap()
    });
    let (t_gz1, gz1) = best(RUNS, || gzip(&raw, 1).unwrap());
    let (t_gz6, gz6) = best(RUNS, || gzip(&raw, 6).unwrap());
    let (t_ours, ours) = best(RUNS, || encode_profile(&snapshot, &options()).unwrap());
    let (t_dd, zstd) = best(RUNS, || {
        encode_with_libdd(&snapshot, w.rec.strings(), 512).unwrap()
    });
    let (t_unzstd, dd_raw) = best(RUNS, || zstd::decode_all(zstd.as_slice()).unwrap());
    let (t_dd_gz1, dd_gz1) = best(RUNS, || gzip(&dd_raw, 1).unwrap());
    let (t_dd_gz6, dd_gz6) = best(RUNS, || gzip(&dd_raw, 6).unwrap());
    let (t_read, read) = best(RUNS, || read_profile(&ours.bytes).unwrap());
    let (t_top, _) = best(RUNS, || top_sites(&read, 20, SortBy::Size));

    println!(
        "[{label}] {} live objects, {STACKS} stacks x {DEPTH} frames -> {} samples, {} locations, \
         {} functions; best of {RUNS} runs:",
        info.objects, info.samples, info.locations, info.functions
    );
    println!(
        "  ours: protobuf {t_raw:.1} ms ({} B) + gzip-1 {t_gz1:.1} ms ({} B) | gzip-6 {t_gz6:.1} ms \
         ({} B); encode_profile {t_ours:.1} ms ({} B)",
        raw.len(),
        gz1.len(),
        gz6.len(),
        ours.bytes.len()
    );
    println!(
        "  libdatadog: samples + zstd {t_dd:.1} ms ({} B zstd) + unzstd {t_unzstd:.1} ms ({} B) \
         + gzip-1 {t_dd_gz1:.1} ms ({} B) | gzip-6 {t_dd_gz6:.1} ms ({} B); to gzip-1 {:.1} ms",
        zstd.len(),
        dd_raw.len(),
        dd_gz1.len(),
        dd_gz6.len(),
        t_dd + t_unzstd + t_dd_gz1
    );
    println!("  read_profile {t_read:.1} ms, top_sites(20) {t_top:.1} ms");
    drop(snapshot);
    w.rec.finish_iteration().unwrap();
}
