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

use std::collections::HashMap;
use std::hash::BuildHasherDefault;
use std::sync::Arc;

use rustc_hash::FxHasher;

use crate::error::{HeapError, Result};

use super::read::{ProfileData, SampleData, SampleType, SourceFrame};

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

/// The directories holding the application's own code. A file is app code when it is under one
/// of them and not in an installed gem there (`vendor/bundle/.../gems/NAME-VERSION/`), or when
/// its path is relative (Ruby keeps the main script's path as given, relative to where the
/// program started). With no directory, only relative paths are app code.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AppRoot {
    /// Each ends in '/'.
    dirs: Vec<String>,
}

impl AppRoot {
    /// `dirs` are absolute directories; empty ones are ignored, a trailing '/' is optional.
    pub fn new<S: AsRef<str>>(dirs: impl IntoIterator<Item = S>) -> Self {
        let mut out: Vec<String> = Vec::new();
        for dir in dirs {
            let dir = dir.as_ref();
            if dir.is_empty() {
                continue;
            }
            // "/" itself stays "/": every absolute path is under it.
            let dir = format!("{}/", dir.trim_end_matches('/'));
            if !out.contains(&dir) {
                out.push(dir);
            }
        }
        AppRoot { dirs: out }
    }

    /// The part of `filename` under the app root, if it is under one.
    fn relative<'a>(&self, filename: &'a str) -> Option<&'a str> {
        if !filename.starts_with('/') {
            return Some(filename);
        }
        self.dirs
            .iter()
            .find_map(|d| filename.strip_prefix(d.as_str()))
    }
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

#[derive(Debug, Clone, PartialEq)]
pub struct Site {
    /// The group's heaviest allocation stack (by the sort key), innermost frame first.
    pub frames: Arc<[SourceFrame]>,
    /// Distinct stacks in the group.
    pub stacks: usize,
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
    /// As in [`Site`]; the heaviest stack counts old and new together.
    pub frames: Arc<[SourceFrame]>,
    pub class: Option<String>,
    pub label: String,
    pub location: String,
    pub function: String,
    pub callee: Option<String>,
    pub called_from: Option<String>,
    pub library: String,
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
            .then_with(|| a.label.cmp(&b.label))
            .then_with(|| a.class.cmp(&b.class))
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
            let a = g.attribution;
            Site {
                frames: g.frames,
                stacks: g.stacks,
                class: g.class,
                label: g.label,
                location: a.location.clone(),
                function: a.function.clone(),
                callee: a.callee.clone(),
                called_from: a.called_from.clone(),
                library: a.library.clone(),
                live_bytes: sums.bytes,
                live_objects: sums.objects,
                share,
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
            let a = g.attribution;
            let bytes_change = n.bytes.saturating_sub(o.bytes);
            let objects_change = n.objects.saturating_sub(o.objects);
            SiteDiff {
                frames: g.frames,
                class: g.class,
                label: g.label,
                location: a.location.clone(),
                function: a.function.clone(),
                callee: a.callee.clone(),
                called_from: a.called_from.clone(),
                library: a.library.clone(),
                old_bytes: o.bytes,
                new_bytes: n.bytes,
                old_objects: o.objects,
                new_objects: n.objects,
                bytes_change,
                objects_change,
                bytes_relative: relative(bytes_change, o.bytes),
                objects_relative: relative(objects_change, o.objects),
            }
        })
        .collect();
    diffs.sort_by(|a, b| {
        (b.bytes_change, b.objects_change)
            .cmp(&(a.bytes_change, a.objects_change))
            .then_with(|| a.label.cmp(&b.label))
            .then_with(|| a.class.cmp(&b.class))
    });
    diffs
}

fn relative(change: i64, old: i64) -> Option<f64> {
    (old != 0).then(|| change as f64 / old as f64)
}

/// The sum of several profiles (one per forked worker, or per interval), as one: every sample of
/// each, in order. Only the sample types all of them have are kept (so a profile without sizes
/// makes the sum one without sizes); the period is theirs when they agree, else 0; the time
/// span covers all of them. An error when they share no sample type, or `profiles` is empty.
pub fn merge_profiles(profiles: &[&ProfileData]) -> Result<ProfileData> {
    let Some((first, rest)) = profiles.split_first() else {
        return Err(HeapError::Pprof("no profile to sum".into()));
    };
    let mut types: Vec<SampleType> = first.sample_types.clone();
    for (i, p) in rest.iter().enumerate() {
        types.retain(|t| p.sample_types.contains(t));
        if types.is_empty() {
            return Err(HeapError::Pprof(format!(
                "profile {} of {} has no sample type in common with the ones before it \
                 (it has {}; the first has {})",
                i + 2,
                profiles.len(),
                type_list(&p.sample_types),
                type_list(&first.sample_types)
            )));
        }
    }
    let period_agrees = rest
        .iter()
        .all(|p| p.period == first.period && p.period_type == first.period_type);
    let start = profiles.iter().map(|p| p.time_nanos).min().unwrap_or(0);
    let end = profiles
        .iter()
        .map(|p| p.time_nanos.saturating_add(p.duration_nanos))
        .max()
        .unwrap_or(0);
    let mut comments: Vec<String> = Vec::new();
    for comment in profiles.iter().flat_map(|p| &p.comments) {
        if !comments.contains(comment) {
            comments.push(comment.clone());
        }
    }
    let mut samples = Vec::with_capacity(profiles.iter().map(|p| p.samples.len()).sum());
    for p in profiles {
        let columns: Vec<Option<usize>> = types
            .iter()
            .map(|t| p.sample_types.iter().position(|u| u == t))
            .collect();
        for s in &p.samples {
            samples.push(SampleData {
                values: columns
                    .iter()
                    .map(|c| c.and_then(|c| s.values.get(c)).copied().unwrap_or(0))
                    .collect(),
                frames: s.frames.clone(),
                class: s.class.clone(),
                gen_age: s.gen_age,
                retained_by: s.retained_by.clone(),
            });
        }
    }
    Ok(ProfileData {
        sample_types: types,
        period_type: if period_agrees {
            first.period_type.clone()
        } else {
            None
        },
        period: if period_agrees { first.period } else { 0 },
        time_nanos: start,
        duration_nanos: end.saturating_sub(start),
        samples,
        comments,
    })
}

fn type_list(types: &[SampleType]) -> String {
    if types.is_empty() {
        return "none".into();
    }
    let names: Vec<String> = types
        .iter()
        .map(|t| format!("{}/{}", t.name, t.unit))
        .collect();
    names.join(", ")
}

/// Whether a frame's file is the application's own code (see [`AppRoot`]); empty names and
/// pseudo-files (`<internal:kernel>`, `(eval)`...) are not.
pub fn is_app_frame(filename: &str, app_root: &AppRoot) -> bool {
    library_of(filename, app_root) == APP
}

const APP: &str = "app";

/// The library a file belongs to, for grouping by gem:
/// - `app` for application code (see [`AppRoot`]);
/// - the gem's name for a file in an installed gem (`.../gems/NAME-VERSION/...`, bundler's
///   `.../bundler/gems/NAME-REVISION/...`), wherever it is, the app root included;
/// - `NAME (stdlib)` for a file of Ruby's own library (`.../lib/ruby/3.1.0/NAME/...` or
///   `NAME.rb`, `.../ruby/3.1.0/NAME.so`), `NAME (site_ruby)` and `NAME (vendor_ruby)` likewise (Debian puts packaged
///   libraries in vendor_ruby);
/// - `ruby (internal)` for `<internal:...>` files, `(eval)` for evaluated code, `(unknown)` for
///   a frame without a file, and `(other)` for any other file.
pub fn library_of(filename: &str, app_root: &AppRoot) -> String {
    if filename.is_empty() {
        return "(unknown)".into();
    }
    if filename.starts_with("<internal:") {
        return "ruby (internal)".into();
    }
    if filename.starts_with("(eval") {
        return "(eval)".into();
    }
    if filename.starts_with('<') || filename.starts_with('(') {
        return "(unknown)".into();
    }
    if let Some(inside) = app_root.relative(filename) {
        return gem_of(&format!("/{inside}")).unwrap_or_else(|| APP.into());
    }
    if let Some(gem) = gem_of(filename) {
        return gem;
    }
    // `.../lib/ruby/...`, or Debian's `/usr/lib/<arch>/ruby/3.1.0/` for C extensions.
    let ruby_lib = filename
        .rsplit_once("/lib/ruby/")
        .map(|(_, rest)| rest)
        .or_else(|| {
            let (_, rest) = filename.rsplit_once("/ruby/")?;
            rest.split('/')
                .next()
                .filter(|v| is_version(v))
                .map(|_| rest)
        });
    if let Some(rest) = ruby_lib {
        let mut parts = rest.split('/');
        let (kind, mut name) = match parts.next() {
            Some(dir @ ("site_ruby" | "vendor_ruby")) => (dir, parts.next()),
            first => ("stdlib", first),
        };
        // Skip the version directory, then an architecture one (x86_64-linux-gnu).
        if name.is_some_and(is_version) {
            name = parts.next();
        }
        let mut rest: Vec<&str> = parts.collect();
        while name.is_some_and(|n| n.contains('-') && !rest.is_empty()) {
            name = Some(rest.remove(0));
        }
        if let Some(name) = name.filter(|n| !n.is_empty()) {
            let name = name
                .strip_suffix(".rb")
                .or_else(|| name.strip_suffix(".so"))
                .unwrap_or(name);
            return format!("{name} ({kind})");
        }
    }
    "(other)".into()
}

fn is_version(segment: &str) -> bool {
    segment.starts_with(|c: char| c.is_ascii_digit())
        && segment.chars().all(|c| c.is_ascii_digit() || c == '.')
}

/// The gem a path is in: the directory after the last `/gems/`, less its `-VERSION` (from the
/// first `-` followed by a digit, so platform suffixes go too; else from the last `-`, for
/// bundler's git checkouts).
fn gem_of(path: &str) -> Option<String> {
    let (_, rest) = path.rsplit_once("/gems/")?;
    let (dir, _) = rest.split_once('/')?;
    let bytes = dir.as_bytes();
    let cut = (1..bytes.len())
        .find(|&i| bytes[i - 1] == b'-' && bytes[i].is_ascii_digit())
        .map(|i| i - 1)
        .or_else(|| dir.rfind('-').filter(|&i| i > 0));
    let name = cut.map_or(dir, |i| &dir[..i]);
    (!name.is_empty()).then(|| name.to_owned())
}

/// Where a stack allocated, as the summaries print it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct Attribution {
    location: String,
    function: String,
    callee: Option<String>,
    called_from: Option<String>,
    file: String,
    library: String,
}

impl Attribution {
    fn of(frames: &[SourceFrame], app_root: &AppRoot) -> Attribution {
        let Some(first) = frames.first() else {
            return Attribution {
                location: "(no frames)".into(),
                function: String::new(),
                callee: None,
                called_from: None,
                file: "(no frames)".into(),
                library: "(unknown)".into(),
            };
        };
        // Ruby's own `<internal:...>` methods (Kernel#require under rubygems, Integer#times on
        // 3.3...) are not where the reader should look: the line that called them is.
        let real = frames
            .iter()
            .position(|f| !f.filename.is_empty() && !f.filename.starts_with('<'))
            .unwrap_or(0);
        let ruby = ruby_frame(frames, real);
        let site = &frames[ruby];
        let callee = (ruby > 0 && first.name != site.name).then(|| first.name.clone());
        let library = library_of(&site.filename, app_root);
        let called_from = if library == APP {
            None
        } else {
            (ruby + 1..frames.len())
                .find(|&i| is_app_frame(&frames[i].filename, app_root))
                .map(|i| {
                    let caller = &frames[ruby_frame(frames, i)];
                    format!("{} in {}", location_of(&frames[i]), caller.name)
                })
        };
        Attribution {
            location: location_of(site),
            function: site.name.clone(),
            callee,
            called_from,
            file: if site.filename.is_empty() {
                site.name.clone()
            } else {
                site.filename.clone()
            },
            library,
        }
    }

    fn label(&self, group: GroupBy, class: Option<&str>) -> String {
        let in_function = || {
            // A C extension's init frame is named by its file.
            if self.function.is_empty() || self.function == self.file {
                self.location.clone()
            } else {
                format!("{} in {}", self.location, self.function)
            }
        };
        match group {
            GroupBy::Site => match &self.callee {
                Some(callee) => format!("{} via {callee}", in_function()),
                None => in_function(),
            },
            GroupBy::Location => in_function(),
            GroupBy::File => self.file.clone(),
            GroupBy::Gem => self.library.clone(),
            GroupBy::Class => class.unwrap_or("?").to_owned(),
        }
    }

    /// What tells two groups apart, besides the class.
    fn group_key(&self, group: GroupBy) -> String {
        match group {
            GroupBy::Site => format!(
                "{}\0{}\0{}\0{}",
                self.location,
                self.function,
                self.callee.as_deref().unwrap_or(""),
                self.called_from.as_deref().unwrap_or("")
            ),
            GroupBy::Location => self.location.clone(),
            GroupBy::File => self.file.clone(),
            GroupBy::Gem => self.library.clone(),
            GroupBy::Class => String::new(),
        }
    }
}

/// The frame whose method holds `frames[i]`'s line: `i` itself, or, when `frames[i]` is a C
/// frame (it has the `file:line` of the frame outside it), the Ruby frame it was called from.
fn ruby_frame(frames: &[SourceFrame], i: usize) -> usize {
    let Some(f) = frames.get(i) else {
        return i;
    };
    let mut j = i;
    if f.filename.is_empty() || f.line <= 0 {
        return j;
    }
    while frames
        .get(j + 1)
        .is_some_and(|next| next.line == f.line && next.filename == f.filename)
    {
        j += 1;
    }
    j
}

/// `file:line` of a frame; the file alone without a line, the name without a file.
fn location_of(f: &SourceFrame) -> String {
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

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Side {
    Old = 0,
    New = 1,
}

#[derive(Debug, Clone, Default)]
struct Sums {
    bytes: i64,
    objects: i64,
    /// (gen_age, objects) of each sample that has an age.
    ages: Vec<(i64, i64)>,
}

impl Sums {
    fn add(&mut self, objects: i64, bytes: i64, age: Option<i64>) {
        self.objects = self.objects.saturating_add(objects);
        self.bytes = self.bytes.saturating_add(bytes);
        if let Some(age) = age {
            self.ages.push((age, objects));
        }
    }
}

/// A distinct stack: its frames (one `Arc` for all the samples that have them), where it
/// allocated, and the id of its group key.
#[derive(Clone)]
struct Stack {
    frames: Arc<[SourceFrame]>,
    attribution: Arc<Attribution>,
    key: usize,
}

struct Member {
    stack: Stack,
    sums: [Sums; 2],
}

struct Group {
    class: Option<String>,
    label: String,
    attribution: Arc<Attribution>,
    sums: [Sums; 2],
    /// Each stack in the group, with its own sums (ages left out).
    members: Vec<Member>,
}

/// A group once finished: its heaviest stack picked.
struct Finished {
    class: Option<String>,
    label: String,
    attribution: Arc<Attribution>,
    frames: Arc<[SourceFrame]>,
    stacks: usize,
    sums: [Sums; 2],
}

/// Samples summed into groups, from one or two profiles (old and new).
struct Grouping<'o> {
    options: &'o SiteOptions,
    /// Distinct stacks by content, across profiles.
    stacks: FxMap<Arc<[SourceFrame]>, Stack>,
    keys: FxMap<String, usize>,
    index: FxMap<(usize, Option<String>), usize>,
    /// (group, stack) -> position in the group's `members`.
    members: FxMap<(usize, *const SourceFrame), usize>,
    groups: Vec<Group>,
}

impl<'o> Grouping<'o> {
    fn new(options: &'o SiteOptions) -> Self {
        Grouping {
            options,
            stacks: FxMap::default(),
            keys: FxMap::default(),
            index: FxMap::default(),
            members: FxMap::default(),
            groups: Vec::new(),
        }
    }

    /// The stack of these frames, attributed the first time it is seen.
    fn stack(&mut self, frames: &Arc<[SourceFrame]>) -> Stack {
        if let Some(stack) = self.stacks.get(frames) {
            return stack.clone();
        }
        let attribution = Arc::new(Attribution::of(frames, &self.options.app_root));
        let next = self.keys.len();
        let key = *self
            .keys
            .entry(attribution.group_key(self.options.group))
            .or_insert(next);
        let stack = Stack {
            frames: frames.clone(),
            attribution,
            key,
        };
        self.stacks.insert(frames.clone(), stack.clone());
        stack
    }

    fn add(&mut self, profile: &ProfileData, side: Side) {
        let objects_at = profile.objects_index();
        let bytes_at = profile.bytes_index();
        let value = |values: &[i64], at: Option<usize>| at.and_then(|i| values.get(i)).copied();
        let group_by = self.options.group;
        let keeps_class = matches!(group_by, GroupBy::Site | GroupBy::Class);
        // Samples read from one file share an `Arc` per location list: one lookup by pointer.
        let mut by_pointer: FxMap<*const SourceFrame, Stack> = FxMap::default();
        for sample in &profile.samples {
            let stack = match by_pointer.get(&sample.frames.as_ptr()) {
                Some(stack) => stack.clone(),
                None => {
                    let stack = self.stack(&sample.frames);
                    by_pointer.insert(sample.frames.as_ptr(), stack.clone());
                    stack
                }
            };
            let class = if keeps_class {
                sample.class.clone()
            } else {
                None
            };
            let slot = match self.index.get(&(stack.key, class.clone())) {
                Some(&slot) => slot,
                None => {
                    self.groups.push(Group {
                        label: stack.attribution.label(group_by, class.as_deref()),
                        class: class.clone(),
                        attribution: stack.attribution.clone(),
                        sums: Default::default(),
                        members: Vec::new(),
                    });
                    self.index.insert((stack.key, class), self.groups.len() - 1);
                    self.groups.len() - 1
                }
            };
            let Some(group) = self.groups.get_mut(slot) else {
                continue;
            };
            let pointer = stack.frames.as_ptr();
            let member = match self.members.get(&(slot, pointer)) {
                Some(&m) => m,
                None => {
                    group.members.push(Member {
                        stack,
                        sums: Default::default(),
                    });
                    self.members
                        .insert((slot, pointer), group.members.len() - 1);
                    group.members.len() - 1
                }
            };
            let objects = value(&sample.values, objects_at).unwrap_or(0);
            let bytes = value(&sample.values, bytes_at).unwrap_or(0);
            group.sums[side as usize].add(objects, bytes, sample.gen_age);
            if let Some(m) = group.members.get_mut(member) {
                m.sums[side as usize].add(objects, bytes, None);
            }
        }
    }

    /// The groups in the order they first appeared, each with its heaviest stack by `weight`
    /// (ties to the smaller stack in frame order, so the choice does not depend on file order).
    fn finish<K: Ord>(self, weight: impl Fn(&[Sums; 2]) -> K) -> Vec<Finished> {
        self.groups
            .into_iter()
            .map(|g| {
                let stacks = g.members.len();
                let heaviest = g.members.into_iter().max_by(|a, b| {
                    weight(&a.sums)
                        .cmp(&weight(&b.sums))
                        .then_with(|| b.stack.frames.cmp(&a.stack.frames))
                });
                let (frames, attribution) = match heaviest {
                    Some(m) => (m.stack.frames, m.stack.attribution),
                    None => (Arc::from(Vec::new()), g.attribution),
                };
                Finished {
                    class: g.class,
                    label: g.label,
                    attribution,
                    frames,
                    stacks,
                    sums: g.sums,
                }
            })
            .collect()
    }
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
