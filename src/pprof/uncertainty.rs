//! How far an estimate can be trusted: where a profile keeps the counts and variances its
//! samples carry (see [`crate::pprof`] for the sample types), and the arithmetic on them.
//!
//! A live object recorded with weight w stands for w objects: it was kept with probability 1/w.
//! The estimate N = Σ wᵢ then has the (Horvitz-Thompson) variance Σ wᵢ(wᵢ-1), and the bytes
//! Σ wᵢ·sᵢ have Σ wᵢ(wᵢ-1)·sᵢ². Variances of disjoint sets of objects add, so a row's variance
//! is the sum over its samples, and a change between two profiles has the sum of both sides'.
//! Objects a sampler watched as one cluster (a window) are one draw: their sum is squared.

use super::read::ProfileData;
use super::{LIVE_RECORDS_TYPE, LIVE_SAMPLES_VARIANCE_TYPE, LIVE_SIZE_VARIANCE_TYPE};

/// A change is significant when it exceeds this many of its own standard deviations.
pub const SIGNIFICANT_SDS: f64 = 2.0;

impl ProfileData {
    /// Where the number of recorded objects is (`heap-live-records`), if the profile has it.
    pub fn records_index(&self) -> Option<usize> {
        self.value_index(LIVE_RECORDS_TYPE)
    }

    /// Where the variance of the live-object count is (`heap-live-samples-variance`).
    pub fn objects_variance_index(&self) -> Option<usize> {
        self.value_index(LIVE_SAMPLES_VARIANCE_TYPE)
    }

    /// Where the variance of the live bytes is (`heap-live-size-variance`).
    pub fn bytes_variance_index(&self) -> Option<usize> {
        self.value_index(LIVE_SIZE_VARIANCE_TYPE)
    }

    /// Whether the profile says how many samples each estimate rests on and how far off it may
    /// be: false for profiles written before it did, and for other profilers'.
    pub fn has_uncertainty(&self) -> bool {
        self.records_index().is_some() && self.objects_variance_index().is_some()
    }
}

/// Which of the uncertainty columns a profile has.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct Known {
    pub records: bool,
    pub objects_variance: bool,
    pub bytes_variance: bool,
}

/// The positions of the values a summary reads from each sample of one profile.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct Columns {
    objects: Option<usize>,
    bytes: Option<usize>,
    records: Option<usize>,
    objects_variance: Option<usize>,
    bytes_variance: Option<usize>,
}

/// One sample's values, 0 for a column the profile lacks.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct Values {
    pub objects: i64,
    pub bytes: i64,
    pub records: i64,
    pub objects_variance: i64,
    pub bytes_variance: i64,
}

impl Columns {
    pub fn of(profile: &ProfileData) -> Self {
        let bytes = profile.bytes_index();
        Columns {
            objects: profile.objects_index(),
            bytes,
            records: profile.records_index(),
            objects_variance: profile.objects_variance_index(),
            // A bytes variance means nothing without the bytes it is the variance of.
            bytes_variance: bytes.and(profile.bytes_variance_index()),
        }
    }

    pub fn known(&self) -> Known {
        Known {
            records: self.records.is_some(),
            objects_variance: self.objects_variance.is_some(),
            bytes_variance: self.bytes_variance.is_some(),
        }
    }

    /// Never panics: a missing value (a short `values`) reads as 0.
    pub fn read(&self, values: &[i64]) -> Values {
        let at = |column: Option<usize>| column.and_then(|i| values.get(i)).copied().unwrap_or(0);
        Values {
            objects: at(self.objects),
            bytes: at(self.bytes),
            records: at(self.records),
            objects_variance: at(self.objects_variance),
            bytes_variance: at(self.bytes_variance),
        }
    }
}

/// One standard deviation from a variance; a negative variance (only a hostile profile has one)
/// counts as 0.
pub fn stddev(variance: f64) -> f64 {
    variance.max(0.0).sqrt()
}

/// Whether `change` exceeds [`SIGNIFICANT_SDS`] standard deviations `sd`. With `sd` 0 (nothing
/// sampled: every weight 1) any change is.
pub fn significant(change: i64, sd: f64) -> bool {
    (change as f64).abs() > SIGNIFICANT_SDS * sd
}

/// The variance terms of objects sampled in clusters, per aggregate: the square of each
/// cluster's estimate (objects, and bytes), summed. A sampler that watches a stretch of
/// allocations all together or not at all (a window, with chance `d`) estimates each stretch as
/// a whole, and the variance of the sum is that of a cluster sample: `Σ (1 - d) E_c²` over the
/// clusters, plus what the sampling inside them adds, `Σ w (w - 1/d)`. `Σ E_c²` bounds both
/// from above (it holds every `w²`), needs no `d`, and is what the ± of a row then shows: a
/// little wide, never narrow. `items`: (aggregate, cluster, weight, size) per object.
pub(super) fn cluster_variances(
    mut items: Vec<(usize, u64, u64, usize)>,
) -> Vec<(usize, i64, i64)> {
    items.sort_unstable_by_key(|&(slot, cluster, ..)| (slot, cluster));
    let mut out: Vec<(usize, i64, i64)> = Vec::new();
    let mut i = 0;
    while i < items.len() {
        let (slot, cluster, ..) = items[i];
        let (mut objects, mut bytes) = (0u128, 0u128);
        while i < items.len() && items[i].0 == slot && items[i].1 == cluster {
            let w = u128::from(items[i].2);
            objects = objects.saturating_add(w);
            let size = u128::try_from(items[i].3).unwrap_or(u128::MAX);
            bytes = bytes.saturating_add(w.saturating_mul(size));
            i += 1;
        }
        let terms = (
            clamp(objects.saturating_mul(objects)),
            clamp(bytes.saturating_mul(bytes)),
        );
        match out.last_mut() {
            Some(last) if last.0 == slot => {
                last.1 = last.1.saturating_add(terms.0);
                last.2 = last.2.saturating_add(terms.1);
            }
            _ => out.push((slot, terms.0, terms.1)),
        }
    }
    out
}

/// What one live object of weight `w` and `size` bytes adds to the variance of its sample's object
/// count, `w(w-1)`, and of its bytes, `w(w-1)·size²`: the Horvitz-Thompson variance of an object
/// kept with probability 1/w. Saturates at `i64::MAX` (a standard deviation of 3 GiB or more).
pub(super) fn variance_terms(weight: u64, size: usize) -> (i64, i64) {
    let w = u128::from(weight);
    let objects = w.saturating_mul(w.saturating_sub(1));
    let size = u128::try_from(size).unwrap_or(u128::MAX);
    let bytes = objects.saturating_mul(size).saturating_mul(size);
    (clamp(objects), clamp(bytes))
}

/// A variance term as the profile stores it: `i64::MAX` where it does not fit.
fn clamp(v: u128) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}
