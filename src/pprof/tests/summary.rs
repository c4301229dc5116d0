//! top_sites and diff_sites, on hand-built profiles and on one that went through the encoder.

use std::sync::Arc;

use super::*;

fn frame(name: &str, filename: &str, line: i64) -> SourceFrame {
    SourceFrame {
        name: name.into(),
        filename: filename.into(),
        line,
    }
}

fn sample(
    frames: &[SourceFrame],
    class: Option<&str>,
    age: i64,
    objects: i64,
    bytes: i64,
) -> SampleData {
    SampleData {
        values: vec![objects, bytes],
        frames: Arc::from(frames),
        class: class.map(str::to_owned),
        gen_age: Some(age),
    }
}

fn profile(samples: Vec<SampleData>) -> ProfileData {
    ProfileData {
        sample_types: vec![
            SampleType {
                name: LIVE_SAMPLES_TYPE.into(),
                unit: "count".into(),
            },
            SampleType {
                name: LIVE_SIZE_TYPE.into(),
                unit: "bytes".into(),
            },
        ],
        period_type: None,
        period: 1,
        time_nanos: 0,
        duration_nanos: 0,
        samples,
    }
}

fn stack(file: &str, line: i64) -> Vec<SourceFrame> {
    vec![
        frame("alloc", file, line),
        frame("<main>", "/app/main.rb", 1),
    ]
}

#[test]
fn top_sites_by_size_and_by_count() {
    let p = profile(vec![
        // few big objects
        sample(&stack("/app/big.rb", 1), Some("String"), 1, 10, 10_000),
        // many small ones, over two ages
        sample(&stack("/app/small.rb", 2), Some("Array"), 1, 300, 2_000),
        sample(&stack("/app/small.rb", 2), Some("Array"), 5, 100, 1_000),
        sample(&stack("/app/tiny.rb", 3), None, 2, 90, 7_000),
    ]);
    let by_size = top_sites(&p, 10, SortBy::Size);
    let order: Vec<_> = by_size.iter().map(|s| s.location.as_str()).collect();
    assert_eq!(
        order,
        ["/app/big.rb:1", "/app/tiny.rb:3", "/app/small.rb:2"]
    );
    assert_eq!(
        (by_size[2].live_objects, by_size[2].live_bytes),
        (400, 3_000)
    );
    assert!((by_size[0].share - 0.5).abs() < 1e-12);
    assert!((by_size.iter().map(|s| s.share).sum::<f64>() - 1.0).abs() < 1e-12);
    assert_eq!(by_size[1].class, None);
    assert_eq!(by_size[2].class.as_deref(), Some("Array"));

    let by_count = top_sites(&p, 2, SortBy::Count);
    let order: Vec<_> = by_count.iter().map(|s| s.location.as_str()).collect();
    assert_eq!(
        order,
        ["/app/small.rb:2", "/app/tiny.rb:3"],
        "truncated to n"
    );
    assert!((by_count[0].share - 400.0 / 500.0).abs() < 1e-12);
    // 300 objects of age 1, 100 of age 5: the weighted median is 1.
    assert_eq!(by_count[0].median_gen_age, Some(1));
    assert!(top_sites(&p, 0, SortBy::Size).is_empty());
}

#[test]
fn weighted_median_gen_age() {
    let s = stack("/app/a.rb", 1);
    let median =
        |samples: Vec<SampleData>| top_sites(&profile(samples), 1, SortBy::Count)[0].median_gen_age;
    assert_eq!(
        median(vec![sample(&s, None, 1, 10, 0), sample(&s, None, 7, 11, 0),]),
        Some(7)
    );
    assert_eq!(
        median(vec![sample(&s, None, 9, 5, 0), sample(&s, None, 2, 5, 0),]),
        Some(2),
        "an even split gives the lower age"
    );
    let mut no_age = sample(&s, None, 0, 5, 0);
    no_age.gen_age = None;
    assert_eq!(median(vec![no_age]), None);
}

#[test]
fn class_splits_a_stack_into_sites() {
    let s = stack("/app/a.rb", 1);
    let p = profile(vec![
        sample(&s, Some("String"), 1, 1, 10),
        sample(&s, Some("Hash"), 1, 1, 20),
    ]);
    let sites = top_sites(&p, 10, SortBy::Size);
    assert_eq!(sites.len(), 2);
    assert_eq!(sites[0].class.as_deref(), Some("Hash"));
}

#[test]
fn location_is_the_innermost_app_frame() {
    let gem = "/usr/local/bundle/gems/activesupport-7.1.0/lib/active_support/core_ext.rb";
    let stdlib = "/usr/local/lib/ruby/3.3.0/set.rb";
    let vendored = "vendor/bundle/ruby/3.3.0/gems/rack-3.0.0/lib/rack.rb";
    let frames = [
        frame("Kernel#dup", "<internal:kernel>", 10),
        frame("Set#add", stdlib, 520),
        frame("deep_dup", gem, 33),
        frame("call", vendored, 5),
        frame("Cart#total", "/app/models/cart.rb", 42),
        frame("<main>", "/app/main.rb", 1),
    ];
    let p = profile(vec![sample(&frames, None, 1, 1, 1)]);
    assert_eq!(
        top_sites(&p, 1, SortBy::Size)[0].location,
        "/app/models/cart.rb:42"
    );

    // No app frame at all: the innermost one.
    let p = profile(vec![sample(&frames[..3], None, 1, 1, 1)]);
    assert_eq!(
        top_sites(&p, 1, SortBy::Size)[0].location,
        "<internal:kernel>:10"
    );
    let p = profile(vec![sample(&[], None, 1, 1, 1)]);
    assert_eq!(top_sites(&p, 1, SortBy::Size)[0].location, "(no frames)");

    assert!(is_app_frame("/app/foo.rb"));
    assert!(is_app_frame("lib/foo.rb"));
    assert!(!is_app_frame(""));
    assert!(!is_app_frame("<cfunc>"));
    assert!(!is_app_frame(stdlib));
    assert!(!is_app_frame(gem));
}

#[test]
fn diff_ranks_growth_first() {
    let grows = stack("/app/leak.rb", 1);
    let steady = stack("/app/steady.rb", 2);
    let shrinks = stack("/app/cache.rb", 3);
    let appears = stack("/app/new.rb", 4);
    let vanishes = stack("/app/gone.rb", 5);
    let old = profile(vec![
        sample(&grows, Some("String"), 1, 10, 1_000),
        sample(&steady, None, 1, 5, 500),
        sample(&shrinks, None, 1, 50, 5_000),
        sample(&vanishes, None, 1, 1, 100),
    ]);
    let new = profile(vec![
        sample(&grows, Some("String"), 1, 30, 3_000),
        sample(&grows, Some("String"), 4, 10, 1_000),
        sample(&steady, None, 3, 5, 500),
        sample(&shrinks, None, 2, 20, 2_000),
        sample(&appears, None, 1, 2, 200),
    ]);
    let diffs = diff_sites(&old, &new);
    let order: Vec<_> = diffs
        .iter()
        .map(|d| (d.location.as_str(), d.bytes_change))
        .collect();
    assert_eq!(
        order,
        [
            ("/app/leak.rb:1", 3_000),
            ("/app/new.rb:4", 200),
            ("/app/steady.rb:2", 0),
            ("/app/gone.rb:5", -100),
            ("/app/cache.rb:3", -3_000),
        ]
    );
    let leak = &diffs[0];
    assert_eq!((leak.old_bytes, leak.new_bytes), (1_000, 4_000));
    assert_eq!(
        (leak.old_objects, leak.new_objects, leak.objects_change),
        (10, 40, 30)
    );
    assert_eq!(leak.bytes_relative, Some(3.0));
    assert_eq!(leak.objects_relative, Some(3.0));
    assert_eq!(leak.class.as_deref(), Some("String"));
    assert_eq!(
        diffs[1].bytes_relative, None,
        "new site: no relative change"
    );
    assert_eq!(diffs[3].bytes_relative, Some(-1.0));
}

#[test]
fn diff_without_sizes_ranks_by_objects() {
    let mut old = profile(vec![sample(&stack("/app/a.rb", 1), None, 1, 5, 0)]);
    let mut new = profile(vec![
        sample(&stack("/app/a.rb", 1), None, 1, 6, 0),
        sample(&stack("/app/b.rb", 1), None, 1, 9, 0),
    ]);
    for p in [&mut old, &mut new] {
        p.sample_types.truncate(1);
        p.samples.iter_mut().for_each(|s| s.values.truncate(1));
    }
    let diffs = diff_sites(&old, &new);
    assert_eq!(diffs[0].location, "/app/b.rb:1");
    assert_eq!((diffs[0].bytes_change, diffs[0].objects_change), (0, 9));
    assert_eq!(diffs[1].objects_relative, Some(0.2));
    assert_eq!(diffs[1].bytes_relative, None);
}

#[test]
fn summaries_of_an_encoded_profile() {
    let mut w = World::new(true);
    let lib = &[
        ("JSON.parse", "/usr/lib/ruby/3.3.0/json/common.rb", 216),
        ("Loader#load", "/app/loader.rb", 9),
        ("<main>", "/app/main.rb", 1),
    ];
    w.record(&[
        alloc(lib, Some("Hash"), 10, 100),
        alloc(APP, Some("String"), 1, 40),
    ]);
    let old = read_profile(&encode_world(&mut w).bytes).unwrap();
    w.record(&[alloc(APP, Some("String"), 100, 40)]);
    let new = read_profile(&encode_world(&mut w).bytes).unwrap();

    let top = top_sites(&old, 5, SortBy::Size);
    assert_eq!(top[0].location, "/app/loader.rb:9");
    assert_eq!((top[0].live_objects, top[0].live_bytes), (10, 1_000));
    assert_eq!(top[0].median_gen_age, Some(1));
    assert_eq!(top[1].location, "/app/foo.rb:12");

    let diffs = diff_sites(&old, &new);
    assert_eq!(diffs[0].location, "/app/foo.rb:12");
    assert_eq!(diffs[0].bytes_change, 4_000);
    assert_eq!(diffs[0].bytes_relative, Some(100.0));
    assert_eq!(diffs[1].bytes_change, 0);
}

#[test]
fn go_heap_profile_types_are_understood() {
    let mut p = profile(vec![]);
    p.sample_types = [
        "alloc_objects/count",
        "alloc_space/bytes",
        "inuse_objects/count",
        "inuse_space/bytes",
    ]
    .iter()
    .map(|t| {
        let (name, unit) = t.split_once('/').unwrap();
        SampleType {
            name: name.into(),
            unit: unit.into(),
        }
    })
    .collect();
    assert_eq!((p.objects_index(), p.bytes_index()), (Some(2), Some(3)));
}
