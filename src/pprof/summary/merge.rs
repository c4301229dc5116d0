//! The sum of several profiles, as one.

use crate::error::{HeapError, Result};

use super::super::read::{ProfileData, SampleData, SampleType};

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
