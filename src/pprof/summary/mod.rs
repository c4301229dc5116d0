//! What the CLI prints from profiles: the allocation sites holding the most live memory, and the
//! sites whose live memory grew between two profiles; grouped by site (the default), by
//! `file:line`, by file, by gem or by class.
//!
//! A site is where Ruby code allocated, plus the allocated class: the `file:line` of the
//! innermost frame in a real file (Ruby's `<internal:...>` methods count as the C methods they
//! mostly replace) and the Ruby method that line is in, the innermost frame's name when it is
//! another method called there (`via`: `String#*`, `Class#new`, `Kernel#require`), and the nearest application frame further out when the
//! site is not application code itself (`called from`). Stacks that agree on all of that are one
//! site, so a helper reached through many paths is one row, not one per path. Sums saturate, so a
//! hostile profile cannot make them panic.
//!
//! C frames carry the `file:line` of the Ruby frame that called them (the sampler names them
//! so), which is how a C frame is told apart: it shares its `file:line` with the frame outside it.

//!
//! Every row says how many samples (recorded objects) it rests on and the standard deviation of
//! its estimates when the profile carries them (see [`crate::pprof`]); a diff says whether each
//! change exceeds its own noise.

mod attribution;
mod grouping;
mod library;
mod merge;

use std::collections::HashMap;
use std::hash::BuildHasherDefault;
use std::sync::Arc;

use rustc_hash::FxHasher;

use super::read::{ProfileData, SourceFrame};
use super::uncertainty::{significant, stddev};
use attribution::Attribution;
use grouping::{weighted_median, Grouping, Side, Sums};

pub use library::{is_app_frame, library_of, short_path, AppRoot};
pub use merge::merge_profiles;

type FxMap<K, V> = HashMap<K, V, BuildHasherDefault<FxHasher>>;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SortBy {
    /// Live bytes. A profile without sizes has 0 everywhere: objects then decide the order, and
    /// every share is 0.0.
    Size,
    /// Live objects.
    Count,
}

/// What one row of a summary stands for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum GroupBy {
    /// Site and class: innermost `file:line`, its method, the C method called there, the nearest
    /// application frame, the allocated class.
    #[default]
    Site,
    /// Innermost `file:line`, all classes and callers together.
    Location,
    /// The innermost frame's file.
    File,
    /// The library of the innermost frame's file (see [`library_of`]).
    Gem,
    /// The allocated class.
    Class,
}

/// How a summary is made: the sort key, what a row stands for, what is app code.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SiteOptions {
    pub by: SortBy,
    pub group: GroupBy,
    pub app_root: AppRoot,
}

impl Default for SiteOptions {
    fn default() -> Self {
        SiteOptions {
            by: SortBy::Size,
            group: GroupBy::Site,
            app_root: AppRoot::default(),
        }
    }
}

/// What a row of a summary stands for and where it allocated: the part of a row that [`Site`]
/// and [`SiteDiff`] share (both read it through `Deref`: `site.location`). The Ruby extension
/// converts it field by field, in this order, and names the fields for Ruby.
#[derive(Debug, Clone, PartialEq)]
pub struct Place {
    /// The group's heaviest allocation stack (by the sort key), innermost frame first; in a
    /// diff, old and new counted together.
    pub frames: Arc<[SourceFrame]>,
    /// The allocated class when grouping by site or class; `None` otherwise, or when unknown.
    pub class: Option<String>,
    /// What the row stands for, as printed: `file:line in method[ via callee]` (site),
    /// `file:line in method` (location), the file, the library, or the class (`?` if unknown).
    pub label: String,
    /// `file:line` of the innermost frame; with the fields below, of the heaviest stack when
    /// the group is not a site.
    pub location: String,
    /// The Ruby method that `location` is in (the innermost frame's name if it is not a C frame).
    pub function: String,
    /// The C method called at `location` that allocated, when the innermost frame is one.
    pub callee: Option<String>,
    /// `file:line in method` of the nearest application frame outside the site's method, when
    /// the site is not application code; `None` when it is, or when no frame is.
    pub called_from: Option<String>,
    /// The library of `location`'s file (see [`library_of`]).
    pub library: String,
}

/// One row of [`top_sites_with`]: a [`Place`] and its live memory.
#[derive(Debug, Clone, PartialEq)]
pub struct Site {
    pub place: Place,
    /// Distinct stacks in the group.
    pub stacks: usize,
    pub live_bytes: i64,
    pub live_objects: i64,
    /// This site's fraction (0.0..=1.0) of the whole profile's total by the sort key; 0.0 when
    /// that total is not positive.
    pub share: f64,
    /// Median gc gen age of the site's objects, weighting each sample by its object count;
    /// `None` when no sample has an age.
    pub median_gen_age: Option<i64>,
    /// Live objects recorded (the samples the estimates rest on); `None` when the profile does
    /// not say (written before it did, or by another profiler).
    pub samples: Option<i64>,
    /// One standard deviation of the sampling error of `live_objects` and of `live_bytes`;
    /// `None` when the profile does not carry the variances (`bytes_stddev` also without sizes).
    pub objects_stddev: Option<f64>,
    pub bytes_stddev: Option<f64>,
}

/// One row of [`diff_sites_with`]: a [`Place`] and how its live memory changed.
#[derive(Debug, Clone, PartialEq)]
pub struct SiteDiff {
    pub place: Place,
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
    /// Samples in each profile, as [`Site::samples`].
    pub old_samples: Option<i64>,
    pub new_samples: Option<i64>,
    /// One standard deviation of the sampling error of each change: the root of the sum of
    /// both sides' variances; `None` when either profile lacks them.
    pub bytes_change_stddev: Option<f64>,
    pub objects_change_stddev: Option<f64>,
    /// Whether the change in bytes (in objects when `options.by` is [`SortBy::Count`]) exceeds
    /// its noise: more than [`crate::pprof::SIGNIFICANT_SDS`] standard deviations. `None` when
    /// the standard deviation is unknown.
    pub significant: Option<bool>,
}

impl std::ops::Deref for Site {
    type Target = Place;

    fn deref(&self) -> &Place {
        &self.place
    }
}

impl std::ops::Deref for SiteDiff {
    type Target = Place;

    fn deref(&self) -> &Place {
        &self.place
    }
}

/// What tells the rows of a summary apart: two samples are summed into one row of
/// [`top_sites_with`] under `options` exactly when their keys are equal. A [`Site`]'s key is the
/// key of its `frames` and `class`.
pub fn row_key(
    frames: &[SourceFrame],
    class: Option<&str>,
    options: &SiteOptions,
) -> (String, Option<String>) {
    let attribution = Attribution::of(frames, &options.app_root);
    let keeps_class = matches!(options.group, GroupBy::Site | GroupBy::Class);
    (
        attribution.group_key(options.group),
        class.filter(|_| keeps_class).map(str::to_owned),
    )
}

/// [`top_sites_with`] grouped by site, with no app root (only relative paths are app code).
pub fn top_sites(profile: &ProfileData, n: usize, by: SortBy) -> Vec<Site> {
    let options = SiteOptions {
        by,
        ..SiteOptions::default()
    };
    top_sites_with(profile, n, &options)
}

/// The `n` groups with the most live memory (`by` size) or objects (`by` count), largest first.
/// Ties go to the other measure, then to the label and class, so the order is stable.
pub fn top_sites_with(profile: &ProfileData, n: usize, options: &SiteOptions) -> Vec<Site> {
    let mut groups = Grouping::new(options);
    groups.add(profile, Side::Old);
    let known = groups.known(Side::Old);
    let by = options.by;
    let key = |s: &Sums| match by {
        SortBy::Size => (s.bytes, s.objects),
        SortBy::Count => (s.objects, s.bytes),
    };
    let total = groups
        .groups
        .iter()
        .fold(0i64, |sum, g| sum.saturating_add(key(&g.sums[0]).0));
    let mut list = groups.finish(|s| key(&s[0]));
    list.sort_by(|a, b| {
        key(&b.sums[0])
            .cmp(&key(&a.sums[0]))
            .then_with(|| a.place.label.cmp(&b.place.label))
            .then_with(|| a.place.class.cmp(&b.place.class))
    });
    list.truncate(n);
    list.into_iter()
        .map(|g| {
            let [sums, _] = g.sums;
            let share = if total > 0 {
                key(&sums).0 as f64 / total as f64
            } else {
                0.0
            };
            Site {
                place: g.place,
                stacks: g.stacks,
                live_bytes: sums.bytes,
                live_objects: sums.objects,
                share,
                samples: known.records.then_some(sums.records),
                objects_stddev: known
                    .objects_variance
                    .then(|| stddev(sums.objects_variance)),
                bytes_stddev: known.bytes_variance.then(|| stddev(sums.bytes_variance)),
                median_gen_age: weighted_median(sums.ages),
            }
        })
        .collect()
}

/// [`diff_sites_with`] grouped by site, with no app root.
pub fn diff_sites(old: &ProfileData, new: &ProfileData) -> Vec<SiteDiff> {
    diff_sites_with(old, new, &SiteOptions::default())
}

/// Every group of either profile, the largest growth in live bytes first (then in objects, then
/// by label and class). Groups that shrank or vanished come last; a caller hunting leaks keeps
/// those with `bytes_change > 0` (or `objects_change > 0` when the profiles have no sizes).
/// `options.by` only picks each group's heaviest stack.
pub fn diff_sites_with(
    old: &ProfileData,
    new: &ProfileData,
    options: &SiteOptions,
) -> Vec<SiteDiff> {
    let mut groups = Grouping::new(options);
    groups.add(old, Side::Old);
    groups.add(new, Side::New);
    let (known_old, known_new) = (groups.known(Side::Old), groups.known(Side::New));
    let by = options.by;
    let weight = |s: &[Sums; 2]| {
        let (bytes, objects) = (
            s[0].bytes.saturating_add(s[1].bytes),
            s[0].objects.saturating_add(s[1].objects),
        );
        match by {
            SortBy::Size => (bytes, objects),
            SortBy::Count => (objects, bytes),
        }
    };
    let mut diffs: Vec<SiteDiff> = groups
        .finish(weight)
        .into_iter()
        .map(|g| {
            let [o, n] = &g.sums;
            let bytes_change = n.bytes.saturating_sub(o.bytes);
            let objects_change = n.objects.saturating_sub(o.objects);
            let change_stddev = |known: bool, old: f64, new: f64| known.then(|| stddev(old + new));
            let bytes_change_stddev = change_stddev(
                known_old.bytes_variance && known_new.bytes_variance,
                o.bytes_variance,
                n.bytes_variance,
            );
            let objects_change_stddev = change_stddev(
                known_old.objects_variance && known_new.objects_variance,
                o.objects_variance,
                n.objects_variance,
            );
            let significant = match by {
                SortBy::Size => bytes_change_stddev.map(|sd| significant(bytes_change, sd)),
                SortBy::Count => objects_change_stddev.map(|sd| significant(objects_change, sd)),
            };
            SiteDiff {
                place: g.place,
                old_bytes: o.bytes,
                new_bytes: n.bytes,
                old_objects: o.objects,
                new_objects: n.objects,
                bytes_change,
                objects_change,
                bytes_relative: relative(bytes_change, o.bytes),
                objects_relative: relative(objects_change, o.objects),
                old_samples: known_old.records.then_some(o.records),
                new_samples: known_new.records.then_some(n.records),
                bytes_change_stddev,
                objects_change_stddev,
                significant,
            }
        })
        .collect();
    diffs.sort_by(|a, b| {
        (b.bytes_change, b.objects_change)
            .cmp(&(a.bytes_change, a.objects_change))
            .then_with(|| a.place.label.cmp(&b.place.label))
            .then_with(|| a.place.class.cmp(&b.place.class))
    });
    diffs
}

fn relative(change: i64, old: i64) -> Option<f64> {
    (old != 0).then(|| change as f64 / old as f64)
}
