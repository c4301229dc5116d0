//! The `retained by` labels of a profile read back, summed per top site (the CLI's `why`).

use std::collections::HashMap;
use std::hash::BuildHasherDefault;

use rustc_hash::FxHasher;

use crate::pprof::{row_key, top_sites_with, ProfileData, SiteOptions};

type FxMap<K, V> = HashMap<K, V, BuildHasherDefault<FxHasher>>;

/// One retainer path of a site, with the live objects and bytes of the samples that carry it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RetainedRow {
    pub path: String,
    pub objects: i64,
    pub bytes: i64,
}

/// For each of the `n` top sites of `profile` under `options` (the order of
/// [`top_sites_with`]), the paths its samples are labelled with, the most bytes first (then the
/// most objects, then the path). Samples without a label are left out.
pub fn retained_by_sites(
    profile: &ProfileData,
    n: usize,
    options: &SiteOptions,
) -> Vec<Vec<RetainedRow>> {
    let sites = top_sites_with(profile, n, options);
    let mut slot_of: FxMap<(String, Option<String>), usize> = FxMap::default();
    for (i, site) in sites.iter().enumerate() {
        slot_of.insert(row_key(&site.frames, site.class.as_deref(), options), i);
    }
    let objects_at = profile.objects_index();
    let bytes_at = profile.bytes_index();
    let value =
        |values: &[i64], at: Option<usize>| at.and_then(|i| values.get(i)).copied().unwrap_or(0);
    let mut rows: Vec<Vec<RetainedRow>> = vec![Vec::new(); sites.len()];
    let mut index: FxMap<(usize, &str), usize> = FxMap::default();
    for sample in &profile.samples {
        let Some(path) = sample.retained_by.as_deref() else {
            continue;
        };
        let key = row_key(&sample.frames, sample.class.as_deref(), options);
        let Some(&slot) = slot_of.get(&key) else {
            continue;
        };
        let Some(list) = rows.get_mut(slot) else {
            continue;
        };
        let at = *index.entry((slot, path)).or_insert_with(|| {
            list.push(RetainedRow {
                path: path.to_owned(),
                objects: 0,
                bytes: 0,
            });
            list.len() - 1
        });
        if let Some(row) = list.get_mut(at) {
            row.objects = row
                .objects
                .saturating_add(value(&sample.values, objects_at));
            row.bytes = row.bytes.saturating_add(value(&sample.values, bytes_at));
        }
    }
    for list in &mut rows {
        list.sort_by(|a, b| {
            (b.bytes, b.objects)
                .cmp(&(a.bytes, a.objects))
                .then_with(|| a.path.cmp(&b.path))
        });
    }
    rows
}
