//! The reader against mutated valid profiles: bit flips, truncation, inserted and deleted bytes,
//! spliced profiles, damaged containers (gzip, zstd) and damaged messages behind intact ones,
//! plus structure-aware edits of the decoded protobuf. Whatever comes in, `read_profile` returns
//! (an `Err` naming the problem, or data), never panics, and the summaries the CLI prints from
//! what it read never panic either. `malformed.rs` has the targeted cases; this is the bulk.

use std::io::Write;

use proptest::prelude::*;

use super::*;

/// A profile with what real ones have: shared frames, deep and shallow stacks, classes and none,
/// several ages, sizes, long and non-ASCII names.
fn rich_raw() -> Vec<u8> {
    let mut w = World::new(true);
    let mut allocs = Vec::new();
    for i in 0..40 {
        let depth = 1 + i % 7;
        let frames: Vec<(String, String, i32)> = (0..depth)
            .map(|d| {
                (
                    format!("Mod{}::Klass#méthode_{}", i % 5, d),
                    format!("/app/lib/{}/file_{}.rb", "x".repeat(i % 3), (i + d) % 9),
                    (i * 10 + d) as i32,
                )
            })
            .collect();
        let class = match i % 4 {
            0 => None,
            1 => Some("String".to_owned()),
            2 => Some("Hash".to_owned()),
            _ => Some(format!("Anon{i}")),
        };
        allocs.push(Alloc {
            frames,
            class,
            weight: 1 + (i as u32 % 5) * 100,
            size: 40 + i * 8,
        });
        if i % 13 == 12 {
            w.record(&allocs);
            allocs.clear();
            w.vm.gc();
        }
    }
    w.record(&allocs);
    gunzip(&encode_world(&mut w).bytes)
}

/// A small profile: two samples, three frames each.
fn small_raw() -> Vec<u8> {
    let mut w = World::new(true);
    w.record(&[
        alloc(APP, Some("String"), 1, 10),
        alloc(OTHER, Some("Array"), 2, 20),
    ]);
    gunzip(&encode_world(&mut w).bytes)
}

thread_local! {
    static RICH_RAW: Vec<u8> = rich_raw();
    static RICH: ProfileData = read_profile(&rich_raw()).unwrap();
}

fn raw() -> Vec<u8> {
    RICH_RAW.with(|r| r.clone())
}

fn gzip(bytes: &[u8]) -> Vec<u8> {
    let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    e.write_all(bytes).unwrap();
    e.finish().unwrap()
}

fn zstd(bytes: &[u8]) -> Vec<u8> {
    zstd::encode_all(bytes, 1).unwrap()
}

/// Reads, and on success summarises, as the CLI's `report` and `diff` do.
fn read_and_summarise(bytes: &[u8]) {
    if let Ok(p) = read_profile(bytes) {
        for by in [SortBy::Size, SortBy::Count] {
            top_sites(&p, 5, by);
            top_sites(&p, usize::MAX, by);
        }
        diff_sites(&p, &p);
        RICH.with(|base| {
            diff_sites(base, &p);
            diff_sites(&p, base);
        });
    }
}

/// Byte-level edits of an input.
#[derive(Debug, Clone)]
enum Edit {
    FlipBit(prop::sample::Index, u8),
    SetByte(prop::sample::Index, u8),
    Insert(prop::sample::Index, Vec<u8>),
    Delete(prop::sample::Index, usize),
    /// Copies a range of the input over another place (repeated fields, swapped lengths).
    Duplicate(prop::sample::Index, prop::sample::Index, usize),
    Truncate(prop::sample::Index),
}

fn edit() -> impl Strategy<Value = Edit> {
    prop_oneof![
        4 => (any::<prop::sample::Index>(), 0u8..8).prop_map(|(i, b)| Edit::FlipBit(i, b)),
        2 => (any::<prop::sample::Index>(), any::<u8>()).prop_map(|(i, b)| Edit::SetByte(i, b)),
        1 => (any::<prop::sample::Index>(), proptest::collection::vec(any::<u8>(), 1..12))
            .prop_map(|(i, v)| Edit::Insert(i, v)),
        1 => (any::<prop::sample::Index>(), 1usize..32).prop_map(|(i, n)| Edit::Delete(i, n)),
        1 => (any::<prop::sample::Index>(), any::<prop::sample::Index>(), 1usize..64)
            .prop_map(|(a, b, n)| Edit::Duplicate(a, b, n)),
        1 => any::<prop::sample::Index>().prop_map(Edit::Truncate),
    ]
}

fn apply(bytes: &mut Vec<u8>, edits: &[Edit]) {
    for e in edits {
        if bytes.is_empty() {
            return;
        }
        let len = bytes.len();
        match e {
            Edit::FlipBit(i, bit) => bytes[i.index(len)] ^= 1 << bit,
            Edit::SetByte(i, b) => bytes[i.index(len)] = *b,
            Edit::Insert(i, v) => {
                let at = i.index(len + 1);
                bytes.splice(at..at, v.iter().copied());
            }
            Edit::Delete(i, n) => {
                let at = i.index(len);
                bytes.drain(at..(at + n).min(len));
            }
            Edit::Duplicate(from, to, n) => {
                let from = from.index(len);
                let chunk: Vec<u8> = bytes[from..(from + n).min(len)].to_vec();
                let to = to.index(len);
                let end = (to + chunk.len()).min(len);
                bytes[to..end].copy_from_slice(&chunk[..end - to]);
            }
            Edit::Truncate(i) => bytes.truncate(i.index(len)),
        }
    }
}

/// Structure-aware edits: a field of the decoded profile set to an edge value.
#[derive(Debug, Clone)]
enum FieldEdit {
    SampleValue(prop::sample::Index, prop::sample::Index, i64),
    SampleLocation(prop::sample::Index, u64),
    RepeatLocation(prop::sample::Index, usize),
    DropValues(prop::sample::Index),
    LabelKey(prop::sample::Index, i64),
    LabelStr(prop::sample::Index, i64),
    LabelNum(prop::sample::Index, i64),
    LocationId(prop::sample::Index, u64),
    LineFunction(prop::sample::Index, u64),
    LineNumber(prop::sample::Index, i64),
    FunctionName(prop::sample::Index, i64),
    FunctionId(prop::sample::Index, u64),
    StringEntry(prop::sample::Index, String),
    ClearStrings,
    SampleType(prop::sample::Index, i64, i64),
    DropSampleType,
    Period(i64),
    Times(i64, i64),
}

fn edge_i64() -> impl Strategy<Value = i64> {
    prop_oneof![
        Just(0i64),
        Just(-1),
        Just(1),
        Just(i64::MIN),
        Just(i64::MAX),
        Just(i64::from(i32::MAX) + 1),
        -100i64..100,
        any::<i64>(),
    ]
}

fn edge_u64() -> impl Strategy<Value = u64> {
    prop_oneof![
        Just(0u64),
        Just(1),
        Just(u64::MAX),
        Just(u64::from(u32::MAX) + 1),
        0u64..100,
        any::<u64>()
    ]
}

fn field_edit() -> impl Strategy<Value = FieldEdit> {
    use prop::sample::Index;
    let i = || any::<Index>();
    prop_oneof![
        (i(), i(), edge_i64()).prop_map(|(s, v, x)| FieldEdit::SampleValue(s, v, x)),
        (i(), edge_u64()).prop_map(|(s, x)| FieldEdit::SampleLocation(s, x)),
        (i(), 0usize..5000).prop_map(|(s, n)| FieldEdit::RepeatLocation(s, n)),
        i().prop_map(FieldEdit::DropValues),
        (i(), edge_i64()).prop_map(|(s, x)| FieldEdit::LabelKey(s, x)),
        (i(), edge_i64()).prop_map(|(s, x)| FieldEdit::LabelStr(s, x)),
        (i(), edge_i64()).prop_map(|(s, x)| FieldEdit::LabelNum(s, x)),
        (i(), edge_u64()).prop_map(|(s, x)| FieldEdit::LocationId(s, x)),
        (i(), edge_u64()).prop_map(|(s, x)| FieldEdit::LineFunction(s, x)),
        (i(), edge_i64()).prop_map(|(s, x)| FieldEdit::LineNumber(s, x)),
        (i(), edge_i64()).prop_map(|(s, x)| FieldEdit::FunctionName(s, x)),
        (i(), edge_u64()).prop_map(|(s, x)| FieldEdit::FunctionId(s, x)),
        (i(), ".{0,20}").prop_map(|(s, x)| FieldEdit::StringEntry(s, x)),
        Just(FieldEdit::ClearStrings),
        (i(), edge_i64(), edge_i64()).prop_map(|(s, a, b)| FieldEdit::SampleType(s, a, b)),
        Just(FieldEdit::DropSampleType),
        edge_i64().prop_map(FieldEdit::Period),
        (edge_i64(), edge_i64()).prop_map(|(a, b)| FieldEdit::Times(a, b)),
    ]
}

fn apply_field(p: &mut pb::Profile, e: &FieldEdit) {
    use FieldEdit::*;
    match e {
        SampleValue(s, v, x) if !p.samples.is_empty() => {
            let n = p.samples.len();
            let sample = &mut p.samples[s.index(n)];
            if !sample.values.is_empty() {
                let n = sample.values.len();
                sample.values[v.index(n)] = *x;
            }
        }
        SampleLocation(s, x) if !p.samples.is_empty() => {
            let n = p.samples.len();
            p.samples[s.index(n)].location_ids.push(*x);
        }
        RepeatLocation(s, count) if !p.samples.is_empty() => {
            let n = p.samples.len();
            let sample = &mut p.samples[s.index(n)];
            if let Some(&first) = sample.location_ids.first() {
                sample.location_ids = vec![first; *count];
            }
        }
        DropValues(s) if !p.samples.is_empty() => {
            let n = p.samples.len();
            p.samples[s.index(n)].values.clear();
        }
        LabelKey(s, x) | LabelStr(s, x) | LabelNum(s, x) if !p.samples.is_empty() => {
            let n = p.samples.len();
            if let Some(label) = p.samples[s.index(n)].labels.first_mut() {
                match e {
                    LabelKey(..) => label.key = *x,
                    LabelStr(..) => label.str = *x,
                    _ => label.num = *x,
                }
            }
        }
        LocationId(s, x) if !p.locations.is_empty() => {
            let n = p.locations.len();
            p.locations[s.index(n)].id = *x;
        }
        LineFunction(s, _) | LineNumber(s, _) if !p.locations.is_empty() => {
            let n = p.locations.len();
            if let Some(line) = p.locations[s.index(n)].lines.first_mut() {
                match e {
                    LineFunction(_, f) => line.function_id = *f,
                    LineNumber(_, l) => line.line = *l,
                    _ => {}
                }
            }
        }
        FunctionName(s, x) if !p.functions.is_empty() => {
            let n = p.functions.len();
            p.functions[s.index(n)].name = *x;
        }
        FunctionId(s, x) if !p.functions.is_empty() => {
            let n = p.functions.len();
            p.functions[s.index(n)].id = *x;
        }
        StringEntry(s, x) if !p.string_table.is_empty() => {
            let n = p.string_table.len();
            p.string_table[s.index(n)] = x.clone();
        }
        ClearStrings => p.string_table.clear(),
        SampleType(s, a, b) if !p.sample_types.is_empty() => {
            let n = p.sample_types.len();
            let t = &mut p.sample_types[s.index(n)];
            t.r#type = *a;
            t.unit = *b;
        }
        DropSampleType => {
            p.sample_types.pop();
        }
        Period(x) => p.period = *x,
        Times(a, b) => {
            p.time_nanos = *a;
            p.duration_nanos = *b;
        }
        _ => {}
    }
}

#[test]
fn every_truncation_of_the_raw_and_compressed_profile() {
    let raw = raw();
    for input in [raw.clone(), gzip(&raw), zstd(&raw)] {
        for cut in 0..input.len() {
            read_and_summarise(&input[..cut]);
        }
    }
}

#[test]
fn every_single_bit_flip_of_a_small_profile() {
    let raw = small_raw();
    let mut input = raw.clone();
    for i in 0..raw.len() {
        for bit in 0..8 {
            input[i] ^= 1 << bit;
            read_and_summarise(&input);
            input[i] ^= 1 << bit;
        }
    }
}

#[test]
fn the_rich_profile_reads_back() {
    let p = read_profile(&raw()).unwrap();
    assert!(raw().len() > 2_000, "{}", raw().len());
    assert!(p.samples.len() > 20, "{}", p.samples.len());
    assert!(p.samples.iter().any(|s| s.frames.len() == 7));
    assert!(p.samples.iter().any(|s| s.class.is_none()));
}

/// 400 cases per property; PROPTEST_CASES=N for a longer hunt.
fn cases() -> u32 {
    std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(400)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(cases()))]

    #[test]
    fn edited_raw_profiles_never_panic(edits in proptest::collection::vec(edit(), 1..10)) {
        let mut input = raw();
        apply(&mut input, &edits);
        read_and_summarise(&input);
        // The same damage behind an intact container.
        read_and_summarise(&gzip(&input));
        read_and_summarise(&zstd(&input));
    }

    #[test]
    fn edited_containers_never_panic(
        edits in proptest::collection::vec(edit(), 1..6),
        zstd_container in any::<bool>(),
    ) {
        let raw = raw();
        let mut input = if zstd_container { zstd(&raw) } else { gzip(&raw) };
        apply(&mut input, &edits);
        read_and_summarise(&input);
    }

    #[test]
    fn spliced_profiles_never_panic(a in any::<prop::sample::Index>(), b in any::<prop::sample::Index>()) {
        let raw = raw();
        let (a, b) = (a.index(raw.len()), b.index(raw.len()));
        let mut input = raw[..a].to_vec();
        input.extend_from_slice(&raw[b..]);
        read_and_summarise(&input);
        // Two gzip members back to back, the second one damaged.
        let mut two = gzip(&raw);
        two.extend_from_slice(&gzip(&raw)[..a.min(raw.len() / 2)]);
        read_and_summarise(&two);
    }

    #[test]
    fn edited_fields_never_panic(edits in proptest::collection::vec(field_edit(), 1..6)) {
        let mut p = RICH_RAW.with(|r| pb::Profile::decode(r.as_slice()).unwrap());
        for e in &edits {
            apply_field(&mut p, e);
        }
        let bytes = p.encode_to_vec();
        read_and_summarise(&bytes);
        read_and_summarise(&gzip(&bytes));
    }
}
