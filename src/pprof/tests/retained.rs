//! The `retained by` label: written on the objects a retainer search named a path for, read back.

use super::*;

const SITE: &[(&str, &str, i32)] = &[("make", "/app/leak.rb", 3)];

#[test]
fn retained_by_labels_split_samples_and_read_back() {
    let mut w = World::new(true);
    w.record(&[
        alloc(SITE, Some("String"), 1, 10),
        alloc(SITE, Some("String"), 1, 10),
        alloc(SITE, Some("String"), 1, 10),
    ]);
    w.vm.gc();
    let snapshot = w.snapshot();
    let mut ids = Vec::new();
    snapshot.for_each_live(|o| {
        ids.push(o.record_id);
        true
    });
    ids.sort_unstable();
    let path = "constant LeakyCache::CACHE (Hash) -> [:k] (String)".to_owned();
    let mut retained = RetainedBy::new();
    retained.insert(ids[0], path.clone());
    retained.insert(ids[1], path.clone());
    let encoded = encode_profile_retained(&snapshot, &options(), &retained).unwrap();
    drop(snapshot);
    w.rec.finish_iteration().unwrap();

    let p = read_profile(&encoded.bytes).unwrap();
    let mut samples: Vec<_> = p
        .samples
        .iter()
        .map(|s| (s.retained_by.clone(), s.values[0]))
        .collect();
    samples.sort();
    assert_eq!(samples, [(None, 1), (Some(path), 2)]);
}

#[test]
fn without_paths_there_is_no_retained_by_label_at_all() {
    let mut w = World::new(true);
    w.record(&[alloc(SITE, Some("String"), 1, 10)]);
    let encoded = encode_world(&mut w);
    let raw = raw_profile(&encoded);
    assert!(!raw.string_table.iter().any(|s| s == RETAINED_BY_LABEL));
}
