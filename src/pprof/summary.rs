//! What the CLI prints from a profile: the allocation sites holding the most live memory, and
//! the sites whose live memory grew between two profiles.
//!
//! A site is an allocation stack plus the allocated class; its samples (one per gc gen age, or
//! more in another tool's profile) are summed. Sums saturate, so a hostile profile cannot make
//! them panic.

use std::collections::HashMap;
use std::hash::BuildHasherDefault;
use std::sync::Arc;

use rustc_hash::FxHasher;

use super::read::{ProfileData, SourceFrame};

type FxMap<K, V> = HashMap<K, V, BuildHasherDefault<FxHasher>>;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SortBy {
    /// Live bytes. A profile without sizes has 0 everywhere: objects then decide the order, and
    /// every share is 0.0.
    Size,
    /// Live objects.
    Count,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Site {
    /// The allocation stack, innermost frame first.
    pub frames: Arc<[SourceFrame]>,
    pub class: Option<String>,
    /// `file:line` of the innermost app frame (see [`is_app_frame`]), else of the innermost frame.
    pub location: String,
    pub live_bytes: i64,
    pub live_objects: i64,
    /// This site's fraction (0.0..=1.0) of the whole profile's total by the sort key; 0.0 when
    /// that total is not positive.
    pub share: f64,
    /// Median gc gen age of the site's objects, weighting each sample by its object count;
    /// `None` when no sample has an age.
    pub median_gen_age: Option<i64>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct SiteDiff {
    pub frames: Arc<[SourceFrame]>,
    pub class: Option<String>,
    pub location: String,
    pub old_bytes: i64,
    pub new_bytes: i64,
    pub old_objects: i64,
    pub new_objects: i64,
    /// `new - old`.
    pub bytes_change: i64,
    pub objects_change: i64,
    /// `(new - old) / old`; `None` when `old` is 0 (a new site, or no sizes).
    pub bytes_relative: Option<f64>,
    pub objects_relative: Option<f64>,
}

/// The `n` sites with the most live memory (`by` size) or objects (`by` count), largest first.
/// Ties go to the other measure, then to the location and class, so the order is stable.
pub fn top_sites(profile: &ProfileData, n: usize, by: SortBy) -> Vec<Site> {
    let groups = group_sites(profile);
    let key = |g: &Group| match by {
        SortBy::Size => (g.bytes, g.objects),
        SortBy::Count => (g.objects, g.bytes),
    };
    let total = groups
        .iter()
        .fold(0i64, |sum, g| sum.saturating_add(key(g).0));
    let mut groups = groups;
    groups.sort_by(|a, b| {
        key(b)
            .cmp(&key(a))
            .then_with(|| a.location.cmp(&b.location))
            .then_with(|| a.class.cmp(&b.class))
    });
    groups.truncate(n);
    groups
        .into_iter()
        .map(|g| {
            let share = if total > 0 {
                key(&g).0 as f64 / total as f64
            } else {
                0.0
            };
            Site {
                median_gen_age: weighted_median(g.ages),
                frames: g.frames,
                class: g.class,
                location: g.location,
                live_bytes: g.bytes,
                live_objects: g.objects,
                share,
            }
        })
        .collect()
}

/// Every site of either profile, the largest growth in live bytes first (then in objects, then
/// by location and class). Sites that shrank or vanished come last; a caller hunting leaks
/// keeps those with `bytes_change > 0` (or `objects_change > 0` when the profiles have no sizes).
pub fn diff_sites(old: &ProfileData, new: &ProfileData) -> Vec<SiteDiff> {
    let mut index: FxMap<(Arc<[SourceFrame]>, Option<String>), usize> = FxMap::default();
    let mut diffs: Vec<SiteDiff> = Vec::new();
    for (is_new, profile) in [(false, old), (true, new)] {
        for g in group_sites(profile) {
            let key = (g.frames.clone(), g.class.clone());
            let slot = *index.entry(key).or_insert_with(|| {
                diffs.push(SiteDiff {
                    frames: g.frames,
                    class: g.class,
                    location: g.location,
                    old_bytes: 0,
                    new_bytes: 0,
                    old_objects: 0,
                    new_objects: 0,
                    bytes_change: 0,
                    objects_change: 0,
                    bytes_relative: None,
                    objects_relative: None,
                });
                diffs.len() - 1
            });
            if let Some(d) = diffs.get_mut(slot) {
                if is_new {
                    (d.new_bytes, d.new_objects) = (g.bytes, g.objects);
                } else {
                    (d.old_bytes, d.old_objects) = (g.bytes, g.objects);
                }
            }
        }
    }
    for d in &mut diffs {
        d.bytes_change = d.new_bytes.saturating_sub(d.old_bytes);
        d.objects_change = d.new_objects.saturating_sub(d.old_objects);
        d.bytes_relative = relative(d.bytes_change, d.old_bytes);
        d.objects_relative = relative(d.objects_change, d.old_objects);
    }
    diffs.sort_by(|a, b| {
        (b.bytes_change, b.objects_change)
            .cmp(&(a.bytes_change, a.objects_change))
            .then_with(|| a.location.cmp(&b.location))
            .then_with(|| a.class.cmp(&b.class))
    });
    diffs
}

fn relative(change: i64, old: i64) -> Option<f64> {
    (old != 0).then(|| change as f64 / old as f64)
}

/// Whether a frame's file is the application's own code rather than Ruby's or a gem's. A small
/// heuristic, meant to point the reader at the line to look at first:
/// - empty names and pseudo-files (`<internal:kernel>`, `<cfunc>`, `<main>`...) are not app code;
/// - nor is anything under a Ruby install's `/lib/ruby/` (stdlib, default and bundled gems);
/// - nor anything under a `/gems/` directory (installed gems, bundler's vendor/bundle, git gems).
pub fn is_app_frame(filename: &str) -> bool {
    !(filename.is_empty()
        || filename.starts_with('<')
        || filename.contains("/lib/ruby/")
        || filename.contains("/gems/"))
}

/// Label for a site: `file:line` of its innermost app frame, else of its innermost frame.
fn site_location(frames: &[SourceFrame]) -> String {
    let frame = frames
        .iter()
        .find(|f| is_app_frame(&f.filename))
        .or_else(|| frames.first());
    match frame {
        None => "(no frames)".to_owned(),
        Some(f) => {
            let file = if f.filename.is_empty() {
                &f.name
            } else {
                &f.filename
            };
            if f.line > 0 {
                format!("{file}:{}", f.line)
            } else {
                file.clone()
            }
        }
    }
}

struct Group {
    frames: Arc<[SourceFrame]>,
    class: Option<String>,
    location: String,
    bytes: i64,
    objects: i64,
    /// (gen_age, objects) of each sample that has an age.
    ages: Vec<(i64, i64)>,
}

/// Sums the samples of each (stack, class), in the order the sites first appear.
fn group_sites(profile: &ProfileData) -> Vec<Group> {
    let objects_at = profile.objects_index();
    let bytes_at = profile.bytes_index();
    let value = |values: &[i64], at: Option<usize>| at.and_then(|i| values.get(i)).copied();

    // Samples read from one file share an `Arc` per location list, so most are matched by
    // pointer; equal stacks behind different pointers (duplicate locations) meet in `stack_ids`.
    let mut by_pointer: FxMap<*const SourceFrame, usize> = FxMap::default();
    let mut stack_ids: FxMap<&[SourceFrame], usize> = FxMap::default();
    let mut index: FxMap<(usize, Option<&str>), usize> = FxMap::default();
    let mut groups: Vec<Group> = Vec::new();
    for sample in &profile.samples {
        let frames = &sample.frames;
        let next_id = stack_ids.len();
        let stack_id = *by_pointer
            .entry(frames.as_ptr())
            .or_insert_with(|| *stack_ids.entry(frames).or_insert(next_id));
        let slot = *index
            .entry((stack_id, sample.class.as_deref()))
            .or_insert_with(|| {
                groups.push(Group {
                    location: site_location(frames),
                    frames: frames.clone(),
                    class: sample.class.clone(),
                    bytes: 0,
                    objects: 0,
                    ages: Vec::new(),
                });
                groups.len() - 1
            });
        let Some(group) = groups.get_mut(slot) else {
            continue;
        };
        let objects = value(&sample.values, objects_at).unwrap_or(0);
        group.objects = group.objects.saturating_add(objects);
        group.bytes = group
            .bytes
            .saturating_add(value(&sample.values, bytes_at).unwrap_or(0));
        if let Some(age) = sample.gen_age {
            group.ages.push((age, objects));
        }
    }
    groups
}

/// The lower weighted median: the smallest age at which at least half of the weight is reached.
/// Samples with no positive weight count once each only if no sample has a positive weight.
fn weighted_median(mut ages: Vec<(i64, i64)>) -> Option<i64> {
    if ages.is_empty() {
        return None;
    }
    if ages.iter().all(|&(_, w)| w <= 0) {
        ages.iter_mut().for_each(|(_, w)| *w = 1);
    }
    ages.retain(|&(_, w)| w > 0);
    ages.sort_unstable_by_key(|&(age, _)| age);
    let total = ages.iter().fold(0i128, |sum, &(_, w)| sum + i128::from(w));
    let mut seen = 0i128;
    for &(age, weight) in &ages {
        seen += i128::from(weight);
        if seen * 2 >= total {
            return Some(age);
        }
    }
    ages.last().map(|&(age, _)| age)
}
