//! `DatadogHeap::Profile`: a pprof file read back into plain Ruby data, for the CLI and for
//! anyone who wants to look at a profile from Ruby.
//!
//! The parsed profile (core `ProfileData`, no Ruby values) lives in a TypedData object, so a
//! profile is decoded once however many questions are asked of it. Every native here returns
//! plain Ruby data (Arrays, Hashes, Strings, Integers, Floats); lib/datadog_heap/profile.rb turns
//! them into Structs and holds the keyword arguments and validation.
//!
//! All natives run with the GVL, may allocate and may raise (`DatadogHeap::Error` for a profile
//! that does not decode, would take more memory than `DATADOG_HEAP_MAX_PROFILE_BYTES` to read, or
//! cannot be summed with others, `ArgumentError` for a bad sort key or grouping or a limit that is
//! not a number of bytes, `TypeError` for a merge list holding something other than profiles). None is reachable from the
//! allocation hook or a GC callback.

use std::collections::HashMap;
use std::sync::Arc;

use datadog_heap_core::{
    diff_sites_with, library_of, merge_profiles, read_profile, short_path, top_sites_with, AppRoot,
    GroupBy, ProfileData, SampleType, SiteOptions, SortBy, SourceFrame,
};
use magnus::{
    function, method, prelude::*, typed_data::Obj, value::ReprValue, DataTypeFunctions, Error,
    IntoValue, RArray, RClass, RHash, RModule, RString, Ruby, TypedData,
};

use crate::errors::{arg_error, heap_error, OrRaise};
use crate::runtime::guarded;

#[derive(TypedData)]
#[magnus(class = "DatadogHeap::Profile", free_immediately, size)]
pub struct Profile {
    data: ProfileData,
    /// Approximate heap bytes `data` holds, computed once at parse time (for `ObjectSpace`).
    memsize: usize,
}

impl DataTypeFunctions for Profile {
    /// Never panics or allocates.
    fn size(&self) -> usize {
        std::mem::size_of::<Self>() + self.memsize
    }
}

/// Heap bytes held by a parsed profile; stacks shared between samples are counted once.
fn memsize(data: &ProfileData) -> usize {
    let mut seen = std::collections::HashSet::new();
    let mut total = data.sample_types.capacity() * std::mem::size_of::<SampleType>()
        + data.samples.capacity() * std::mem::size_of::<datadog_heap_core::SampleData>();
    for sample in &data.samples {
        total += sample.values.capacity() * std::mem::size_of::<i64>();
        total += sample.class.as_ref().map_or(0, String::capacity);
        if seen.insert(sample.frames.as_ptr()) {
            total += sample
                .frames
                .iter()
                .map(|f| std::mem::size_of::<SourceFrame>() + f.name.len() + f.filename.len())
                .sum::<usize>();
        }
    }
    total
}

/// Ruby arrays for the stacks of one answer, one frozen `[[name, path, line], ...]` per distinct
/// stack, so samples and sites that share a stack share its array.
///
/// The arrays are kept in `keep`, a Ruby Array on this native's stack (so the GC sees them and
/// compaction can move them); the map from the Rust stack to its array holds indexes only.
struct StackArrays {
    keep: RArray,
    index: HashMap<*const SourceFrame, usize>,
}

impl StackArrays {
    fn new(ruby: &Ruby) -> Self {
        StackArrays {
            keep: ruby.ary_new(),
            index: HashMap::new(),
        }
    }

    fn get(&mut self, ruby: &Ruby, frames: &Arc<[SourceFrame]>) -> Result<RArray, Error> {
        if let Some(&i) = self.index.get(&frames.as_ptr()) {
            return self.keep.entry(i as isize);
        }
        let array = ruby.ary_new_capa(frames.len());
        for f in frames.iter() {
            let frame = ruby.ary_new_from_values(&[
                ruby.str_new(&f.name).as_value(),
                ruby.str_new(&f.filename).as_value(),
                ruby.integer_from_i64(f.line).as_value(),
            ]);
            frame.freeze();
            array.push(frame)?;
        }
        array.freeze();
        self.index.insert(frames.as_ptr(), self.keep.len());
        self.keep.push(array)?;
        Ok(array)
    }
}

fn value_type(ruby: &Ruby, t: &SampleType) -> RArray {
    ruby.ary_new_from_values(&[
        ruby.str_new(&t.name).as_value(),
        ruby.str_new(&t.unit).as_value(),
    ])
}

/// `by` as the report ranks sites: "size" (live bytes) or "count" (live objects).
pub(crate) fn sort_by(ruby: &Ruby, by: &str) -> Result<SortBy, Error> {
    match by {
        "size" => Ok(SortBy::Size),
        "count" => Ok(SortBy::Count),
        other => Err(arg_error(
            ruby,
            format!("by must be \"size\" or \"count\", got {other:?}"),
        )),
    }
}

/// What `_native_top` and `_native_diff` are asked: `by` "size" or "count", `group` "site",
/// "location", "file", "gem" or "class", and the app root directories (absolute).
fn site_options(
    ruby: &Ruby,
    by: &str,
    group: &str,
    app_root: Vec<String>,
) -> Result<SiteOptions, Error> {
    let by = sort_by(ruby, by)?;
    let group = match group {
        "site" => GroupBy::Site,
        "location" => GroupBy::Location,
        "file" => GroupBy::File,
        "gem" => GroupBy::Gem,
        "class" => GroupBy::Class,
        other => {
            return Err(arg_error(
                ruby,
                format!(
                    "group must be \"site\", \"location\", \"file\", \"gem\" or \"class\", got {other:?}"
                ),
            ))
        }
    };
    Ok(SiteOptions {
        by,
        group,
        app_root: AppRoot::new(app_root),
    })
}

/// Sum of column `at` over every sample (saturating); `None` when the column does not exist.
fn total(data: &ProfileData, at: Option<usize>) -> Option<i64> {
    let at = at?;
    Some(data.samples.iter().fold(0i64, |sum, s| {
        sum.saturating_add(s.values.get(at).copied().unwrap_or(0))
    }))
}

impl Profile {
    /// `Profile._native_parse(bytes)` -> a Profile. `bytes` is a gzip, zstd or raw pprof. Reading
    /// holds at most the limit `DATADOG_HEAP_MAX_PROFILE_BYTES` sets (by default 4096 times the
    /// size of `bytes`, at least 64 MiB and at most 1 GiB) besides `bytes`; past it
    /// `DatadogHeap::Error` names the limit and the variable (see `read_profile`).
    fn parse(ruby: &Ruby, class: RClass, bytes: RString) -> Result<Obj<Profile>, Error> {
        guarded(ruby, || {
            let bytes = crate::shims::string_bytes(bytes);
            let data = read_profile(&bytes).or_raise(ruby)?;
            drop(bytes);
            if data.sample_types.is_empty() {
                // Arbitrary bytes can happen to decode as a protobuf; a profile always says what
                // its values measure.
                return Err(heap_error(
                    ruby,
                    format!(
                        "pprof: not a profile: it defines no sample types ({} samples)",
                        data.samples.len()
                    ),
                ));
            }
            let memsize = memsize(&data);
            Ok(ruby.obj_wrap_as(Profile { data, memsize }, class))
        })
    }

    /// `Profile._native_merge([profile, ...])` -> a Profile holding the samples of all of them
    /// (see `merge_profiles`: the sample types they share, their period if they agree).
    fn merge(ruby: &Ruby, class: RClass, profiles: RArray) -> Result<Obj<Profile>, Error> {
        guarded(ruby, || {
            // The objects stay referenced by `profiles`, which the caller holds.
            let profiles = (0..profiles.len())
                .map(|i| Obj::<Profile>::try_convert(profiles.entry(i as isize)?))
                .collect::<Result<Vec<_>, Error>>()?;
            let data: Vec<&ProfileData> = profiles.iter().map(|p| &p.data).collect();
            let data = merge_profiles(&data).or_raise(ruby)?;
            let memsize = memsize(&data);
            Ok(ruby.obj_wrap_as(Profile { data, memsize }, class))
        })
    }

    /// `_native_info` -> Hash: `sample_types` ([[name, unit], ...]), `period_type` ([name, unit]
    /// or nil), `period`, `time_nanos`, `duration_nanos`, `samples` (count), `comments` ([String]),
    /// `objects_index` and
    /// `bytes_index` (which value counts live objects / bytes, or nil), `total_objects` and
    /// `total_bytes` (sums of those values, or nil), `uncertainty` (whether samples carry their
    /// record counts and variances).
    fn info(ruby: &Ruby, rb_self: &Self) -> Result<RHash, Error> {
        guarded(ruby, || {
            let data = &rb_self.data;
            let hash = ruby.hash_new();
            let types = ruby.ary_new_capa(data.sample_types.len());
            for t in &data.sample_types {
                types.push(value_type(ruby, t))?;
            }
            hash.aset(ruby.to_symbol("sample_types"), types)?;
            hash.aset(
                ruby.to_symbol("period_type"),
                data.period_type.as_ref().map(|t| value_type(ruby, t)),
            )?;
            hash.aset(ruby.to_symbol("period"), data.period)?;
            hash.aset(ruby.to_symbol("time_nanos"), data.time_nanos)?;
            hash.aset(ruby.to_symbol("duration_nanos"), data.duration_nanos)?;
            hash.aset(ruby.to_symbol("samples"), data.samples.len())?;
            hash.aset(ruby.to_symbol("comments"), data.comments.clone())?;
            let objects_at = data.objects_index();
            let bytes_at = data.bytes_index();
            hash.aset(ruby.to_symbol("objects_index"), objects_at)?;
            hash.aset(ruby.to_symbol("bytes_index"), bytes_at)?;
            hash.aset(ruby.to_symbol("total_objects"), total(data, objects_at))?;
            hash.aset(ruby.to_symbol("total_bytes"), total(data, bytes_at))?;
            hash.aset(ruby.to_symbol("uncertainty"), data.has_uncertainty())?;
            Ok(hash)
        })
    }

    /// `_native_samples` -> `[[locations, values, class_name, gen_age, retained_by], ...]` in file order;
    /// `locations` innermost frame first, `values` in the order of the sample types.
    fn samples(ruby: &Ruby, rb_self: &Self) -> Result<RArray, Error> {
        guarded(ruby, || {
            let data = &rb_self.data;
            let mut stacks = StackArrays::new(ruby);
            let out = ruby.ary_new_capa(data.samples.len());
            for sample in &data.samples {
                let row = ruby.ary_new_from_values(&[
                    stacks.get(ruby, &sample.frames)?.as_value(),
                    ruby.ary_from_vec(sample.values.clone()).as_value(),
                    sample.class.as_deref().into_value_with(ruby),
                    sample.gen_age.into_value_with(ruby),
                    sample.retained_by.as_deref().into_value_with(ruby),
                ]);
                out.push(row)?;
            }
            Ok(out)
        })
    }

    /// `_native_top(n, by, group, app_root)` (see [`site_options`]) -> `[[locations, class_name,
    /// location, live_bytes, live_objects, share, median_gen_age, label, function, callee,
    /// called_from, library, stacks, samples, objects_stddev, bytes_stddev], ...]`, largest first
    /// (the last three nil when the profile does not carry them).
    fn top(
        ruby: &Ruby,
        rb_self: &Self,
        n: usize,
        by: String,
        group: String,
        app_root: Vec<String>,
    ) -> Result<RArray, Error> {
        guarded(ruby, || {
            let options = site_options(ruby, &by, &group, app_root)?;
            let sites = top_sites_with(&rb_self.data, n, &options);
            let mut stacks = StackArrays::new(ruby);
            let out = ruby.ary_new_capa(sites.len());
            for site in &sites {
                let row = ruby.ary_new_from_values(&[
                    stacks.get(ruby, &site.frames)?.as_value(),
                    site.class.as_deref().into_value_with(ruby),
                    ruby.str_new(&site.location).as_value(),
                    site.live_bytes.into_value_with(ruby),
                    site.live_objects.into_value_with(ruby),
                    site.share.into_value_with(ruby),
                    site.median_gen_age.into_value_with(ruby),
                    ruby.str_new(&site.label).as_value(),
                    ruby.str_new(&site.function).as_value(),
                    site.callee.as_deref().into_value_with(ruby),
                    site.called_from.as_deref().into_value_with(ruby),
                    ruby.str_new(&site.library).as_value(),
                    site.stacks.into_value_with(ruby),
                    site.samples.into_value_with(ruby),
                    site.objects_stddev.into_value_with(ruby),
                    site.bytes_stddev.into_value_with(ruby),
                ]);
                out.push(row)?;
            }
            Ok(out)
        })
    }

    /// `_native_retained_by(n, by, group, app_root)` -> for each site `_native_top` returns, in
    /// its order, `[[path, live_objects, live_bytes], ...]`: the `retained by` labels of its
    /// samples, summed, the most bytes first.
    fn retained_by(
        ruby: &Ruby,
        rb_self: &Self,
        n: usize,
        by: String,
        group: String,
        app_root: Vec<String>,
    ) -> Result<RArray, Error> {
        guarded(ruby, || {
            let options = site_options(ruby, &by, &group, app_root)?;
            let sites = datadog_heap_core::retained_by_sites(&rb_self.data, n, &options);
            let out = ruby.ary_new_capa(sites.len());
            for rows in &sites {
                let list = ruby.ary_new_capa(rows.len());
                for r in rows {
                    list.push(ruby.ary_new_from_values(&[
                        ruby.str_new(&r.path).as_value(),
                        r.objects.into_value_with(ruby),
                        r.bytes.into_value_with(ruby),
                    ]))?;
                }
                out.push(list)?;
            }
            Ok(out)
        })
    }

    /// `_native_diff(other, by, group, app_root)` -> every group of either profile, from `self`
    /// (old) to `other` (new), largest growth in live bytes first: `[[locations, class_name,
    /// location, old_bytes, new_bytes, old_objects, new_objects, bytes_change, objects_change,
    /// bytes_relative, objects_relative, label, function, callee, called_from, library,
    /// old_samples, new_samples, bytes_change_stddev, objects_change_stddev, significant], ...]`
    /// (relative changes are nil when the old value is 0; `by` picks each group's heaviest stack
    /// and the measure `significant` judges; the last five are nil when a profile lacks them).
    fn diff(
        ruby: &Ruby,
        rb_self: &Self,
        other: &Profile,
        by: String,
        group: String,
        app_root: Vec<String>,
    ) -> Result<RArray, Error> {
        guarded(ruby, || {
            let options = site_options(ruby, &by, &group, app_root)?;
            let diffs = diff_sites_with(&rb_self.data, &other.data, &options);
            let mut stacks = StackArrays::new(ruby);
            let out = ruby.ary_new_capa(diffs.len());
            for d in &diffs {
                let row = ruby.ary_new_from_values(&[
                    stacks.get(ruby, &d.frames)?.as_value(),
                    d.class.as_deref().into_value_with(ruby),
                    ruby.str_new(&d.location).as_value(),
                    d.old_bytes.into_value_with(ruby),
                    d.new_bytes.into_value_with(ruby),
                    d.old_objects.into_value_with(ruby),
                    d.new_objects.into_value_with(ruby),
                    d.bytes_change.into_value_with(ruby),
                    d.objects_change.into_value_with(ruby),
                    d.bytes_relative.into_value_with(ruby),
                    d.objects_relative.into_value_with(ruby),
                    ruby.str_new(&d.label).as_value(),
                    ruby.str_new(&d.function).as_value(),
                    d.callee.as_deref().into_value_with(ruby),
                    d.called_from.as_deref().into_value_with(ruby),
                    ruby.str_new(&d.library).as_value(),
                    d.old_samples.into_value_with(ruby),
                    d.new_samples.into_value_with(ruby),
                    d.bytes_change_stddev.into_value_with(ruby),
                    d.objects_change_stddev.into_value_with(ruby),
                    d.significant.into_value_with(ruby),
                ]);
                out.push(row)?;
            }
            Ok(out)
        })
    }
}

/// `Profile._native_place(path, app_root)` -> `[short, library]`: how a report shows the file
/// `path` (core `short_path`) and the library it belongs to (core `library_of`), `app_root` the
/// app root directories (absolute). Never raises but for a non-String argument.
fn place(ruby: &Ruby, path: String, app_root: Vec<String>) -> Result<RArray, Error> {
    guarded(ruby, || {
        let root = AppRoot::new(app_root);
        Ok(ruby.ary_new_from_values(&[
            ruby.str_new(&short_path(&path, &root)).as_value(),
            ruby.str_new(&library_of(&path, &root)).as_value(),
        ]))
    })
}

/// Defines `DatadogHeap::Profile` (reopened by lib/datadog_heap/profile.rb). Runs under the GVL.
pub fn init(ruby: &Ruby, module: RModule) -> Result<(), Error> {
    let class = module.define_class("Profile", ruby.class_object())?;
    class.undef_default_alloc_func();
    class.define_singleton_method("_native_parse", function!(Profile::parse, 2))?;
    class.define_singleton_method("_native_merge", function!(Profile::merge, 2))?;
    class.define_singleton_method("_native_place", function!(place, 2))?;
    class.define_method("_native_info", method!(Profile::info, 0))?;
    class.define_method("_native_samples", method!(Profile::samples, 0))?;
    class.define_method("_native_top", method!(Profile::top, 4))?;
    class.define_method("_native_retained_by", method!(Profile::retained_by, 4))?;
    class.define_method("_native_diff", method!(Profile::diff, 4))?;
    Ok(())
}
