//! Samples summed into groups (rows), from one profile or two (old and new).

use std::sync::Arc;

use super::super::read::{ProfileData, SourceFrame};
use super::super::uncertainty::{Columns, Known, Values};
use super::attribution::Attribution;
use super::{FxMap, GroupBy, Place, SiteOptions};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Side {
    Old = 0,
    New = 1,
}

/// A group's (or a stack's) values summed over its samples of one profile. Counts saturate;
/// variances are summed as floats, so that many large ones do not saturate.
#[derive(Debug, Clone, Default)]
pub(super) struct Sums {
    pub bytes: i64,
    pub objects: i64,
    pub records: i64,
    pub objects_variance: f64,
    pub bytes_variance: f64,
    /// (gen_age, objects) of each sample that has an age.
    pub ages: Vec<(i64, i64)>,
}

impl Sums {
    fn add(&mut self, v: &Values, age: Option<i64>) {
        self.objects = self.objects.saturating_add(v.objects);
        self.bytes = self.bytes.saturating_add(v.bytes);
        self.records = self.records.saturating_add(v.records);
        self.objects_variance += v.objects_variance as f64;
        self.bytes_variance += v.bytes_variance as f64;
        if let Some(age) = age {
            self.ages.push((age, v.objects));
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

pub(super) struct Group {
    class: Option<String>,
    label: String,
    attribution: Arc<Attribution>,
    pub sums: [Sums; 2],
    /// Each stack in the group, with its own sums (ages left out).
    members: Vec<Member>,
}

/// A group once finished: its heaviest stack picked, and its place that stack's.
pub(super) struct Finished {
    pub place: Place,
    pub stacks: usize,
    pub sums: [Sums; 2],
}

/// Samples summed into groups, from one or two profiles (old and new).
pub(super) struct Grouping<'o> {
    options: &'o SiteOptions,
    /// Distinct stacks by content, across profiles.
    stacks: FxMap<Arc<[SourceFrame]>, Stack>,
    keys: FxMap<String, usize>,
    index: FxMap<(usize, Option<String>), usize>,
    /// (group, stack) -> position in the group's `members`.
    members: FxMap<(usize, *const SourceFrame), usize>,
    pub groups: Vec<Group>,
    /// The uncertainty columns of the profile added as each side.
    known: [Known; 2],
}

impl<'o> Grouping<'o> {
    pub fn new(options: &'o SiteOptions) -> Self {
        Grouping {
            options,
            stacks: FxMap::default(),
            keys: FxMap::default(),
            index: FxMap::default(),
            members: FxMap::default(),
            groups: Vec::new(),
            known: Default::default(),
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

    /// Which uncertainty columns the profile added as `side` has (none if it was not added).
    pub fn known(&self, side: Side) -> Known {
        self.known[side as usize]
    }

    pub fn add(&mut self, profile: &ProfileData, side: Side) {
        let columns = Columns::of(profile);
        self.known[side as usize] = columns.known();
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
            let values = columns.read(&sample.values);
            group.sums[side as usize].add(&values, sample.gen_age);
            if let Some(m) = group.members.get_mut(member) {
                m.sums[side as usize].add(&values, None);
            }
        }
    }

    /// The groups in the order they first appeared, each with its heaviest stack by `weight`
    /// (ties to the smaller stack in frame order, so the choice does not depend on file order).
    pub fn finish<K: Ord>(self, weight: impl Fn(&[Sums; 2]) -> K) -> Vec<Finished> {
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
                    place: attribution.place(frames, g.class, g.label),
                    stacks,
                    sums: g.sums,
                }
            })
            .collect()
    }
}

/// The lower weighted median: the smallest age at which at least half of the weight is reached.
/// Samples with no positive weight count once each only if no sample has a positive weight.
pub(super) fn weighted_median(mut ages: Vec<(i64, i64)>) -> Option<i64> {
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
