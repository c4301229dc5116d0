//! Records and variances: written per sample, summed per row, summed again by merges, absent
//! from profiles written without them (uploads, older profiles) without breaking anything.

use super::*;
use crate::pprof::uncertainty::variance_terms;

/// Encodes what `world` tracks with `options` (after a GC, so all of it is age >= 1).
fn encode_with(world: &mut World, options: &EncodeOptions) -> ProfileData {
    world.vm.gc();
    let snapshot = world.snapshot();
    let encoded = encode_profile(&snapshot, options).unwrap();
    drop(snapshot);
    world.rec.finish_iteration().unwrap();
    read_profile(&encoded.bytes).unwrap()
}

fn bare() -> EncodeOptions {
    EncodeOptions {
        uncertainty: false,
        ..options()
    }
}

/// Heavy samples at APP (3 of weight 1000, 64 bytes) and light ones at OTHER (50 of weight 2,
/// 40 bytes).
fn mixed() -> Vec<Alloc> {
    let mut allocs = vec![alloc(APP, Some("Hash"), 1000, 64); 3];
    allocs.extend(vec![alloc(OTHER, Some("String"), 2, 40); 50]);
    allocs
}

fn site<'a>(sites: &'a [Site], class: &str) -> &'a Site {
    sites
        .iter()
        .find(|s| s.class.as_deref() == Some(class))
        .unwrap()
}

#[test]
fn rows_carry_their_samples_and_standard_deviations() {
    let mut w = World::new(true);
    w.record(&mixed());
    let p = encode_with(&mut w, &options());
    assert!(p.has_uncertainty());
    let sites = top_sites(&p, 10, SortBy::Size);
    let hash = site(&sites, "Hash");
    assert_eq!(hash.samples, Some(3));
    let objects_var: f64 = 3.0 * 1000.0 * 999.0;
    assert_eq!(hash.objects_stddev, Some(objects_var.sqrt()));
    assert_eq!(hash.bytes_stddev, Some((objects_var * 64.0 * 64.0).sqrt()));
    let string = site(&sites, "String");
    assert_eq!(string.samples, Some(50));
    assert_eq!(string.objects_stddev, Some(100f64.sqrt()));
    assert_eq!(string.bytes_stddev, Some((100.0 * 1600.0f64).sqrt()));
}

#[test]
fn the_estimates_stay_the_default_type_for_pprof_tools() {
    let mut w = World::new(true);
    w.record(&mixed());
    w.vm.gc();
    let snapshot = w.snapshot();
    let encoded = encode_profile(&snapshot, &options()).unwrap();
    drop(snapshot);
    w.rec.finish_iteration().unwrap();
    let raw = raw_profile(&encoded);
    let default = usize::try_from(raw.default_sample_type).unwrap();
    assert_eq!(raw.string_table[default], "heap-live-size");
}

#[test]
fn profiles_without_them_read_with_none() {
    let mut w = World::new(true);
    w.record(&mixed());
    let p = encode_with(&mut w, &bare());
    let names: Vec<&str> = p.sample_types.iter().map(|t| t.name.as_str()).collect();
    assert_eq!(names, ["heap-live-samples", "heap-live-size"]);
    assert!(!p.has_uncertainty());
    let sites = top_sites(&p, 10, SortBy::Size);
    let hash = site(&sites, "Hash");
    assert_eq!(
        (hash.samples, hash.objects_stddev, hash.bytes_stddev),
        (None, None, None)
    );
    assert_eq!((hash.live_objects, hash.live_bytes), (3000, 3000 * 64));
}

#[test]
fn merges_sum_them_and_drop_them_when_one_profile_lacks_them() {
    let mut w = World::new(true);
    w.record(&mixed());
    let a = encode_with(&mut w, &options());
    let b = a.clone();
    let sum = merge_profiles(&[&a, &b]).unwrap();
    let sites = top_sites(&sum, 10, SortBy::Size);
    let hash = site(&sites, "Hash");
    assert_eq!(hash.samples, Some(6));
    assert_eq!(
        hash.objects_stddev,
        Some((2.0 * 3.0 * 1000.0 * 999.0f64).sqrt())
    );

    let old = encode_with(&mut w, &bare());
    let mixed = merge_profiles(&[&a, &old]).unwrap();
    assert!(!mixed.has_uncertainty());
    assert_eq!(
        site(&top_sites(&mixed, 10, SortBy::Size), "Hash").samples,
        None
    );
}

#[test]
fn a_diff_is_significant_only_beyond_two_standard_deviations_of_its_noise() {
    let mut w = World::new(true);
    w.record(&mixed());
    let old = encode_with(&mut w, &options());
    // One more heavy sample (+1000 objects, sd of the change sqrt(7 * 1000 * 999) = 2644), and
    // 400 more light ones (+800 objects, sd sqrt((50 + 450) * 2) = 32).
    let mut more = vec![alloc(APP, Some("Hash"), 1000, 64)];
    more.extend(vec![alloc(OTHER, Some("String"), 2, 40); 400]);
    w.record(&more);
    let new = encode_with(&mut w, &options());
    let diffs = diff_sites(&old, &new);
    let hash = diffs
        .iter()
        .find(|d| d.class.as_deref() == Some("Hash"))
        .unwrap();
    assert_eq!((hash.old_samples, hash.new_samples), (Some(3), Some(4)));
    let sd = (7.0 * 1000.0 * 999.0 * 64.0 * 64.0f64).sqrt();
    assert_eq!(hash.bytes_change_stddev, Some(sd));
    assert_eq!(hash.significant, Some(false));
    let string = diffs
        .iter()
        .find(|d| d.class.as_deref() == Some("String"))
        .unwrap();
    assert_eq!(string.objects_change_stddev, Some(1000f64.sqrt()));
    assert_eq!(string.significant, Some(true));

    // Against a profile without them, nothing can be said.
    let bare_new = encode_with(&mut w, &bare());
    let d = diff_sites(&old, &bare_new);
    assert!(d
        .iter()
        .all(|d| d.significant.is_none() && d.bytes_change_stddev.is_none()));
    assert!(d
        .iter()
        .all(|d| d.old_samples.is_some() && d.new_samples.is_none()));
}

#[test]
fn unsampled_objects_add_no_variance() {
    assert_eq!(variance_terms(1, 1 << 40), (0, 0));
    assert_eq!(variance_terms(0, 100), (0, 0));
    assert_eq!(variance_terms(3, 10), (6, 600));
    assert_eq!(variance_terms(u64::MAX, usize::MAX), (i64::MAX, i64::MAX));
}

/// Records `(class, cluster)` objects of weight 16 and 40 bytes, all at one line.
fn record_clustered(w: &mut World, objects: &[(&str, u64)]) {
    for &(class, cluster) in objects {
        let object = w.vm.alloc(40);
        let frames = [NamedFrame {
            name: "leak",
            filename: "app.rb",
            line: 1,
        }];
        let r = (w.rec)
            .record_sampled_allocation(
                object,
                16,
                Some(class),
                &frames[..],
                w.vm.gc,
                false,
                cluster,
            )
            .unwrap();
        assert_eq!(r.outcome, RecordOutcome::Pending);
    }
    w.rec.commit(&mut w.vm).unwrap();
}

#[test]
fn samples_of_one_window_add_the_square_of_their_sum() {
    // A windowed sampler watches a stretch all together or not at all: three samples of weight
    // 16 from one window are one draw of 48, whose variance bound is 48², not 3 · 16 · 15.
    let mut w = World::new(true);
    record_clustered(
        &mut w,
        &[("Hash", 7), ("Hash", 7), ("Hash", 7), ("String", 9)],
    );
    let p = encode_with(&mut w, &options());
    let sites = top_sites(&p, 10, SortBy::Count);
    let hash = site(&sites, "Hash");
    assert_eq!(hash.samples, Some(3));
    assert_eq!(hash.objects_stddev, Some(48.0));
    assert_eq!(hash.bytes_stddev, Some(48.0 * 40.0));
    assert_eq!(site(&sites, "String").objects_stddev, Some(16.0));
}

#[test]
fn windows_add_up_as_independent_draws() {
    // Two windows of two samples each: (32² + 32²), against 4 · 16 · 15 had they been sampled
    // one by one.
    let mut w = World::new(true);
    record_clustered(
        &mut w,
        &[("Hash", 1), ("Hash", 1), ("Hash", 2), ("Hash", 2)],
    );
    let p = encode_with(&mut w, &options());
    let sites = top_sites(&p, 10, SortBy::Count);
    assert_eq!(
        site(&sites, "Hash").objects_stddev,
        Some((2.0 * 32.0f64 * 32.0).sqrt())
    );
}
