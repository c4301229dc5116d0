//! `DatadogHeap::Profile`: a pprof file read back into plain Ruby data, for the CLI and for
//! anyone who wants to look at a profile from Ruby.
//!
//! The parsed profile (core `ProfileData`, no Ruby values) lives in a TypedData object, so a
//! profile is decoded once however many questions are asked of it. Every native here returns
//! plain Ruby data (Arrays, Hashes, Strings, Integers, Floats); lib/datadog_heap/profile.rb turns
//! them into Structs and holds the keyword arguments and validation.
//!
//! A site row's fields are declared once, here ([`SITE`], [`SITE_DIFF`], [`PLACE`]): each row is
//! a Hash from field name to value, and the lists of names are exported as
//! `Profile::SITE_FIELDS`, `SITE_DIFF_FIELDS` and `PLACE_FIELDS`, which the Structs are made of.
//!
//! All natives run with the GVL, may allocate and may raise (`DatadogHeap::Error` for a profile
//! that does not decode, would take more memory than `DATADOG_HEAP_MAX_PROFILE_BYTES` to read, or
//! cannot be summed with others, `ArgumentError` for a bad sort key or grouping or a limit that is
//! not a number of bytes, `TypeError` for a merge list holding something other than profiles). None is reachable from the
//! allocation hook or a GC callback.

use std::collections::HashMap;
use std::ops::Deref;
use std::sync::Arc;

use datadog_heap_core::{
    diff_sites_with, library_of, merge_profiles, pprof::Place, read_profile, short_path,
    top_sites_with, AppRoot, GroupBy, ProfileData, SampleType, Site, SiteDiff, SiteOptions, SortBy,
    SourceFrame,
};
use magnus::{
    function, method, prelude::*, typed_data::Obj, value::ReprValue, DataTypeFunctions, Error,
    IntoValue, RArray, RClass, RHash, RModule, RString, Ruby, StaticSymbol, TypedData, Value,
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

/// A field of the core's [`Place`] (what a row stands for and where it allocated), as Ruby
/// names it. [`PLACE`] lists them in the order `DatadogHeap::Profile::PLACE_FIELDS` exports.
#[derive(Clone, Copy)]
enum PlaceField {
    /// The heaviest stack: `[[name, path, line], ...]`, innermost first, frozen.
    Locations,
    ClassName,
    Location,
    Label,
    Function,
    Callee,
    CalledFrom,
    Library,
}

/// Every [`PlaceField`], in the order Ruby's rows that have no measures of their own take them
/// (`Profile::SiteTrend` starts with them).
const PLACE: &[PlaceField] = &[
    PlaceField::Locations,
    PlaceField::ClassName,
    PlaceField::Location,
    PlaceField::Label,
    PlaceField::Function,
    PlaceField::Callee,
    PlaceField::CalledFrom,
    PlaceField::Library,
];

impl PlaceField {
    fn name(self) -> &'static str {
        match self {
            PlaceField::Locations => "locations",
            PlaceField::ClassName => "class_name",
            PlaceField::Location => "location",
            PlaceField::Label => "label",
            PlaceField::Function => "function",
            PlaceField::Callee => "callee",
            PlaceField::CalledFrom => "called_from",
            PlaceField::Library => "library",
        }
    }

    fn value(self, ruby: &Ruby, stacks: &mut StackArrays, place: &Place) -> Result<Value, Error> {
        Ok(match self {
            PlaceField::Locations => stacks.get(ruby, &place.frames)?.as_value(),
            PlaceField::ClassName => place.class.as_deref().into_value_with(ruby),
            PlaceField::Location => place.location.as_str().into_value_with(ruby),
            PlaceField::Label => place.label.as_str().into_value_with(ruby),
            PlaceField::Function => place.function.as_str().into_value_with(ruby),
            PlaceField::Callee => place.callee.as_deref().into_value_with(ruby),
            PlaceField::CalledFrom => place.called_from.as_deref().into_value_with(ruby),
            PlaceField::Library => place.library.as_str().into_value_with(ruby),
        })
    }
}

/// One field of a row as Ruby sees it: a field of the row's [`Place`], or one of its own
/// measures (its Ruby name and how to read it).
enum Field<R> {
    Place(PlaceField),
    Own(&'static str, fn(&Ruby, &R) -> Value),
}

impl<R> Field<R> {
    fn name(&self) -> &'static str {
        match self {
            Field::Place(f) => f.name(),
            Field::Own(name, _) => name,
        }
    }
}

/// A row's fields, in order, from runs of place fields (`place(Label, ...)`: [`PlaceField`]s)
/// and of the row's own (`own(live_bytes, ...)`: each read as `row.live_bytes`, named so).
macro_rules! fields {
    ($row:ty: $($kind:ident($($field:ident),+)),+ $(,)?) => {
        &[$($(fields!(@$kind $row, $field)),+),+]
    };
    (@place $row:ty, $field:ident) => {
        Field::Place(PlaceField::$field)
    };
    (@own $row:ty, $field:ident) => {
        Field::Own(stringify!($field), |ruby, row: &$row| row.$field.into_value_with(ruby))
    };
}

/// The fields of a core [`Site`] as `Profile#top` gives them to Ruby, in the order of
/// `Profile::Site`'s members (`Profile::SITE_FIELDS`). A field added here reaches the Struct.
static SITE: &[Field<Site>] = fields![Site:
    place(Locations, ClassName, Location),
    own(live_bytes, live_objects, share, median_gen_age),
    place(Label, Function, Callee, CalledFrom, Library),
    own(stacks, samples, objects_stddev, bytes_stddev),
];

/// The fields of a core [`SiteDiff`] as `Profile#diff` gives them to Ruby, in the order of
/// `Profile::SiteDiff`'s members (`Profile::SITE_DIFF_FIELDS`).
static SITE_DIFF: &[Field<SiteDiff>] = fields![SiteDiff:
    place(Locations, ClassName, Location),
    own(old_bytes, new_bytes, old_objects, new_objects, bytes_change, objects_change),
    own(bytes_relative, objects_relative),
    place(Label, Function, Callee, CalledFrom, Library),
    own(old_samples, new_samples, bytes_change_stddev, objects_change_stddev, significant),
];

/// `items` as Ruby rows: one Hash each, from the Symbol of each of `fields` to its value, in
/// that order. Rows sharing a stack share one frozen locations array.
fn rows<R: Deref<Target = Place>>(
    ruby: &Ruby,
    fields: &[Field<R>],
    items: &[R],
) -> Result<RArray, Error> {
    let keys: Vec<StaticSymbol> = fields.iter().map(|f| ruby.sym_new(f.name())).collect();
    let mut stacks = StackArrays::new(ruby);
    let out = ruby.ary_new_capa(items.len());
    for item in items {
        let row = ruby.hash_new();
        for (field, &key) in fields.iter().zip(&keys) {
            let value = match field {
                Field::Place(f) => f.value(ruby, &mut stacks, item)?,
                Field::Own(_, read) => read(ruby, item),
            };
            row.aset(key, value)?;
        }
        out.push(row)?;
    }
    Ok(out)
}

/// The Ruby names of `names`, as a frozen Array of Symbols.
fn field_names(ruby: &Ruby, names: impl Iterator<Item = &'static str>) -> RArray {
    let list = ruby.ary_from_iter(names.map(|name| ruby.sym_new(name)));
    list.freeze();
    list
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

/// What `_native_top`, `_native_retained_by` and `_native_diff` are asked, as Ruby passes it:
/// `[by, group, app_root]` (see [`site_options`]).
type Query = (String, String, Vec<String>);

/// A [`Query`] read: `by` "size" or "count", `group` "site", "location", "file", "gem" or
/// "class", and the app root directories (absolute).
fn site_options(ruby: &Ruby, (by, group, app_root): Query) -> Result<SiteOptions, Error> {
    let by = sort_by(ruby, &by)?;
    let group = match group.as_str() {
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

    /// `_native_top(n, [by, group, app_root])` (see [`site_options`]) -> `[{field => value},
    /// ...]`, largest first: one Hash a site, keyed by the Symbols of `SITE_FIELDS` (see [`SITE`]).
    fn top(ruby: &Ruby, rb_self: &Self, n: usize, query: Query) -> Result<RArray, Error> {
        guarded(ruby, || {
            let options = site_options(ruby, query)?;
            rows(ruby, SITE, &top_sites_with(&rb_self.data, n, &options))
        })
    }

    /// `_native_retained_by(n, [by, group, app_root])` -> for each site `_native_top` returns, in
    /// its order, `[[path, live_objects, live_bytes], ...]`: the `retained by` labels of its
    /// samples, summed, the most bytes first.
    fn retained_by(ruby: &Ruby, rb_self: &Self, n: usize, query: Query) -> Result<RArray, Error> {
        guarded(ruby, || {
            let options = site_options(ruby, query)?;
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

    /// `_native_diff(other, [by, group, app_root])` -> every group of either profile, from `self`
    /// (old) to `other` (new), largest growth in live bytes first: one Hash a group, keyed by the
    /// Symbols of `SITE_DIFF_FIELDS` (see [`SITE_DIFF`]). `by` picks each group's heaviest stack
    /// and the measure `significant` judges.
    fn diff(ruby: &Ruby, rb_self: &Self, other: &Profile, query: Query) -> Result<RArray, Error> {
        guarded(ruby, || {
            let options = site_options(ruby, query)?;
            rows(
                ruby,
                SITE_DIFF,
                &diff_sites_with(&rb_self.data, &other.data, &options),
            )
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
    class.define_method("_native_top", method!(Profile::top, 2))?;
    class.define_method("_native_retained_by", method!(Profile::retained_by, 2))?;
    class.define_method("_native_diff", method!(Profile::diff, 2))?;
    // The rows' shapes, for lib/datadog_heap/profile.rb's Structs.
    class.const_set(
        "PLACE_FIELDS",
        field_names(ruby, PLACE.iter().map(|f| f.name())),
    )?;
    class.const_set(
        "SITE_FIELDS",
        field_names(ruby, SITE.iter().map(Field::name)),
    )?;
    class.const_set(
        "SITE_DIFF_FIELDS",
        field_names(ruby, SITE_DIFF.iter().map(Field::name)),
    )?;
    Ok(())
}
