//! Which tracked objects a retainer search looks for: a few of each of the top allocation sites,
//! the sites ranked exactly as the CLI's report ranks a profile of the same snapshot.

use std::collections::HashMap;
use std::hash::BuildHasherDefault;
use std::sync::Arc;

use rustc_hash::FxHasher;

use crate::error::Result;
use crate::pprof::{
    row_key, top_sites_with, ProfileData, SampleData, SampleType, Site, SiteOptions, SortBy,
    SourceFrame, LIVE_SAMPLES_TYPE, LIVE_SAMPLES_UNIT, LIVE_SIZE_TYPE, LIVE_SIZE_UNIT,
};
use crate::recorder::{LiveObject, Snapshot};
use crate::stacks::Frame;

type FxMap<K, V> = HashMap<K, V, BuildHasherDefault<FxHasher>>;

/// One sampled object picked for a search.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TargetObject {
    pub record_id: i64,
    pub class: Option<String>,
    /// Bytes of this one object (0 when sizes are not measured).
    pub size: usize,
    pub weight: u64,
    pub gen_age: u64,
}

/// A top site and the objects picked from it.
#[derive(Debug, Clone, PartialEq)]
pub struct TargetSite {
    pub site: Site,
    pub objects: Vec<TargetObject>,
}

/// The `top` sites of `snapshot`'s live objects (age >= 1) under `options`, each with up to
/// `per_site` of its objects: the largest first (the oldest first when ranking by count), ties
/// to the lowest record id.
pub fn pick_targets(
    snapshot: &Snapshot,
    top: usize,
    per_site: usize,
    options: &SiteOptions,
) -> Result<Vec<TargetSite>> {
    let names = snapshot.names();
    let mut stacks: FxMap<*const Frame, Arc<[SourceFrame]>> = FxMap::default();
    let mut objects: Vec<(LiveObject, Arc<[SourceFrame]>, Option<String>)> = Vec::new();
    let mut failure = None;
    snapshot.for_each_live(|object| {
        let frames = match stacks.get(&object.stack.as_ptr()) {
            Some(frames) => frames.clone(),
            None => {
                let mut frames = Vec::with_capacity(object.stack.len());
                for frame in object.stack.iter() {
                    match (names.get(frame.name), names.get(frame.filename)) {
                        (Ok(name), Ok(filename)) => frames.push(SourceFrame {
                            name: name.to_owned(),
                            filename: filename.to_owned(),
                            line: i64::from(frame.line),
                        }),
                        (Err(e), _) | (_, Err(e)) => {
                            failure = Some(e);
                            return false;
                        }
                    }
                }
                let frames: Arc<[SourceFrame]> = frames.into();
                stacks.insert(object.stack.as_ptr(), frames.clone());
                frames
            }
        };
        let class = match object.data.class {
            0 => None,
            id => match names.get(id) {
                Ok(text) => Some(text.to_owned()),
                Err(e) => {
                    failure = Some(e);
                    return false;
                }
            },
        };
        objects.push((object.clone(), frames, class));
        true
    });
    if let Some(e) = failure {
        return Err(e);
    }
    let sized = snapshot.size_enabled();
    let value_type = |name: &str, unit: &str| SampleType {
        name: name.to_owned(),
        unit: unit.to_owned(),
    };
    let mut sample_types = vec![value_type(LIVE_SAMPLES_TYPE, LIVE_SAMPLES_UNIT)];
    if sized {
        sample_types.push(value_type(LIVE_SIZE_TYPE, LIVE_SIZE_UNIT));
    }
    let profile = ProfileData {
        sample_types,
        period_type: None,
        period: 1,
        time_nanos: 0,
        duration_nanos: 0,
        comments: Vec::new(),
        samples: objects
            .iter()
            .map(|(object, frames, class)| {
                let weight = i64::try_from(object.data.weight).unwrap_or(i64::MAX);
                let size = i64::try_from(object.data.size).unwrap_or(i64::MAX);
                let mut values = vec![weight];
                if sized {
                    values.push(weight.saturating_mul(size));
                }
                SampleData {
                    values,
                    frames: frames.clone(),
                    class: class.clone(),
                    gen_age: i64::try_from(object.data.gen_age).ok(),
                    retained_by: None,
                }
            })
            .collect(),
    };
    let sites = top_sites_with(&profile, top, options);
    let mut slot_of: FxMap<(String, Option<String>), usize> = FxMap::default();
    for (i, site) in sites.iter().enumerate() {
        slot_of.insert(row_key(&site.frames, site.class.as_deref(), options), i);
    }
    let mut members: Vec<Vec<(&LiveObject, &Option<String>)>> = vec![Vec::new(); sites.len()];
    let mut keys: FxMap<(*const SourceFrame, Option<&str>), Option<usize>> = FxMap::default();
    for (object, frames, class) in &objects {
        let slot = *keys
            .entry((frames.as_ptr(), class.as_deref()))
            .or_insert_with(|| {
                slot_of
                    .get(&row_key(frames, class.as_deref(), options))
                    .copied()
            });
        if let Some(list) = slot.and_then(|s| members.get_mut(s)) {
            list.push((object, class));
        }
    }
    let by_count = options.by == SortBy::Count;
    Ok(sites
        .into_iter()
        .zip(members)
        .map(|(site, mut list)| {
            list.sort_by(|(a, _), (b, _)| {
                let key = |o: &LiveObject| {
                    if by_count {
                        (o.data.gen_age, o.data.size as u64)
                    } else {
                        (o.data.size as u64, o.data.gen_age)
                    }
                };
                key(b).cmp(&key(a)).then(a.record_id.cmp(&b.record_id))
            });
            let objects = list
                .into_iter()
                .take(per_site)
                .map(|(o, class)| TargetObject {
                    record_id: o.record_id,
                    class: class.clone(),
                    size: o.data.size,
                    weight: o.data.weight,
                    gen_age: o.data.gen_age,
                })
                .collect();
            TargetSite { site, objects }
        })
        .collect())
}
