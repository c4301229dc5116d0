//! `Recorder#retainers`' natives: which objects to look for (the top sites' sampled objects) and
//! the search from the GC roots to them. lib/datadog_heap/retainers.rb names each reference of
//! the paths found and holds the options.
//!
//! The search is native, over the VM's own reference walk (`shims::objspace`, which passes on
//! live objects only). The GC is paused from the moment the targets are looked up until every
//! object of every path found is in `holder`, an Array that grows with what the search finds,
//! and the search itself allocates no Ruby object. So the raw addresses the search keeps stay
//! valid, nothing it keeps is a GC root, and nothing of it outlives the call (a GC.compact
//! between two calls moves nothing the search holds).
//!
//! Roots: every root the GC marks from but one, the calling thread's machine stack
//! ("machine_context"), which is scanned conservatively and, at this point, holds this native's
//! own references to the targets and stale words. Other threads' machine stacks are seen through
//! their Thread objects. An object reachable only from the calling thread's machine stack is
//! reported as not reachable.

use std::time::Duration;

use datadog_heap_core::{
    find_root_paths, pick_targets, AppRoot, GroupBy, HeapGraph, SearchLimits, SiteOptions,
};
use magnus::{
    rb_sys::{AsRawValue, FromRawValue},
    value::ReprValue,
    Error, IntoValue, RArray, Ruby, Value,
};
use rb_sys::VALUE;

use super::{with_session, Recorder};
use crate::errors::{arg_error, heap_error, OrRaise};
use crate::shims::{self, objspace};
use crate::{profile_reader, weak_map};

/// The root category left out (see the module docs).
const CALLER_MACHINE_STACK: &str = "machine_context";

/// Most targets one search takes (top sites times objects per site).
const MAX_TARGETS: usize = 10_000;
/// Deepest path a search may be asked for.
pub const MAX_DEPTH_LIMIT: u32 = 10_000;

/// `_native_retainer_targets(top, per_site, by, app_root)` -> one entry per top site, ranked as
/// `Profile#top` ranks a profile of the same objects: `[label, class, location, function,
/// callee, called_from, live_bytes, live_objects, share, median_gen_age, objects]`, `objects`
/// being `[[record_id, class, size, weight, gen_age], ...]`. Runs a full update.
pub fn retainer_targets(
    ruby: &Ruby,
    rb_self: &Recorder,
    top: usize,
    per_site: usize,
    by: String,
    app_root: Vec<String>,
) -> Result<RArray, Error> {
    with_session(ruby, rb_self, |session| {
        if top == 0 || per_site == 0 || top.saturating_mul(per_site) > MAX_TARGETS {
            return Err(arg_error(
                ruby,
                format!("top * per_site must be between 1 and {MAX_TARGETS}, got top: {top}, per_site: {per_site}"),
            ));
        }
        let by = profile_reader::sort_by(ruby, &by)?;
        let snapshot = session.with_vm(ruby, |vm| session.core.prepare_iteration(vm))?;
        session.core.finish_iteration().or_raise(ruby)?;
        let options = SiteOptions {
            by,
            group: GroupBy::Site,
            app_root: AppRoot::new(app_root),
        };
        let sites = pick_targets(&snapshot, top, per_site, &options).or_raise(ruby)?;
        let out = ruby.ary_new_capa(sites.len());
        for t in sites {
            let s = &t.site;
            let objects = ruby.ary_new_capa(t.objects.len());
            for o in &t.objects {
                objects.push(ruby.ary_new_from_values(&[
                    o.record_id.into_value_with(ruby),
                    o.class.as_deref().into_value_with(ruby),
                    o.size.into_value_with(ruby),
                    o.weight.into_value_with(ruby),
                    o.gen_age.into_value_with(ruby),
                ]))?;
            }
            out.push(ruby.ary_new_from_values(&[
                s.label.as_str().into_value_with(ruby),
                s.class.as_deref().into_value_with(ruby),
                s.location.as_str().into_value_with(ruby),
                s.function.as_str().into_value_with(ruby),
                s.callee.as_deref().into_value_with(ruby),
                s.called_from.as_deref().into_value_with(ruby),
                s.live_bytes.into_value_with(ruby),
                s.live_objects.into_value_with(ruby),
                s.share.into_value_with(ruby),
                s.median_gen_age.into_value_with(ruby),
                objects.as_value(),
            ]))?;
        }
        Ok(out)
    })
}

/// A path found, once its objects are in `holder`: the root category, where its first object
/// sits in `holder`, and for each node the description of an internal one (its slot skipped).
type PathLayout = (String, usize, Vec<Option<String>>);

/// The VM's heap for the core's search. Needs the GVL; allocates no Ruby object.
struct VmHeap {
    weak_map_class: VALUE,
}

impl HeapGraph for VmHeap {
    fn roots(&mut self, visit: &mut dyn FnMut(&str, u64)) {
        objspace::reachable_from_roots(&mut |category, object| {
            if category != CALLER_MACHINE_STACK {
                visit(category, object);
            }
        });
    }

    fn children(&mut self, node: u64, visit: &mut dyn FnMut(u64)) {
        objspace::reachable_from(node as VALUE, &mut |child| visit(child));
    }

    fn is_weak(&mut self, node: u64) -> bool {
        self.weak_map_class != 0 && objspace::raw_class(node as VALUE) == self.weak_map_class
    }
}

/// `_native_retainer_paths(record_ids, max_depth, max_visited, time_budget_seconds)` ->
/// `[paths, visited, elapsed_seconds, stopped, depth_cut]`. `paths` has one entry per record id:
/// `nil` when the object was collected already, `false` when the search did not reach it, else
/// `[root_category, nodes, notes]`: the objects from the one a root refers to down to the
/// target, an internal VM object being `nil` in `nodes` and described in `notes` (nil for the
/// others). `stopped` is nil, "time_budget" or "max_visited".
pub fn retainer_paths(
    ruby: &Ruby,
    rb_self: &Recorder,
    record_ids: Vec<i64>,
    max_depth: u32,
    max_visited: usize,
    time_budget: f64,
) -> Result<RArray, Error> {
    with_session(ruby, rb_self, |session| {
        if record_ids.len() > MAX_TARGETS {
            return Err(arg_error(
                ruby,
                format!(
                    "record_ids must hold at most {MAX_TARGETS} ids, got {}",
                    record_ids.len()
                ),
            ));
        }
        if !(1..=MAX_DEPTH_LIMIT).contains(&max_depth) {
            return Err(arg_error(
                ruby,
                format!("max_depth must be between 1 and {MAX_DEPTH_LIMIT}, got {max_depth}"),
            ));
        }
        if max_visited == 0 || max_visited > u32::MAX as usize - 1 {
            return Err(arg_error(
                ruby,
                format!(
                    "max_visited must be between 1 and {}, got {max_visited}",
                    u32::MAX - 1
                ),
            ));
        }
        if !(time_budget.is_finite() && time_budget > 0.0) {
            return Err(arg_error(
                ruby,
                format!("time_budget must be a number of seconds above 0, got {time_budget}"),
            ));
        }
        let map = session.weak_map(ruby)?;
        // No GC from here until every object the answer names sits in `holder`: the search
        // keeps raw references, which a GC could free (unswept garbage) or move. Pausing the GC
        // (rather than sizing `holder` for the deepest possible paths up front, ids times
        // max_depth) lets `holder` grow with what the search finds.
        let _no_gc = shims::GcPause::new();
        let holder = ruby.ary_new_capa(record_ids.len());
        let mut present = Vec::with_capacity(record_ids.len());
        for &id in &record_ids {
            match weak_map::get(ruby, map, id)? {
                Some(object) => {
                    holder.push(object)?;
                    present.push(true);
                }
                None => present.push(false),
            }
        }
        // From here to the end of the search no Ruby object is made (and the GC is paused).
        let gc_before = shims::gc_count();
        let targets: Vec<u64> = (0..holder.len())
            .map(|i| holder.entry::<Value>(i as isize).map(|v| v.as_raw()))
            .collect::<Result<_, _>>()?;
        let mut heap = VmHeap {
            weak_map_class: objspace::raw_class(map.as_raw()),
        };
        let limits = SearchLimits {
            max_depth,
            max_visited,
            time_budget: Duration::from_secs_f64(time_budget.min(86_400.0)),
        };
        let outcome = find_root_paths(&mut heap, &targets, &limits);
        drop(targets);
        // Each path's objects into `holder` (internal ones described instead); `holder` grows,
        // which allocates, but no GC runs while it does.
        let mut layouts: Vec<Option<PathLayout>> = Vec::new();
        for path in &outcome.paths {
            let Some(path) = path else {
                layouts.push(None);
                continue;
            };
            let start = holder.len();
            let mut notes = Vec::with_capacity(path.nodes.len());
            for &node in &path.nodes {
                let raw = node as VALUE;
                if shims::is_internal_object(raw) {
                    notes.push(Some(objspace::describe_internal(raw)));
                } else {
                    #[allow(unsafe_code)] // a VALUE the VM just handed out, see below
                    // SAFETY: the VM handed this object to the search just now (and the search
                    // only keeps live ones), and no GC has run since (paused): it is a live,
                    // user-visible object.
                    let object = unsafe { Value::from_raw(raw) };
                    holder.push(object)?;
                    notes.push(None);
                }
            }
            layouts.push(Some((path.category.clone(), start, notes)));
        }
        if shims::gc_count() != gc_before {
            return Err(heap_error(
                ruby,
                "internal error: a GC ran during the retainer search; its paths are not trusted",
            ));
        }
        // Allocating again is fine: `holder` keeps every object the answer names.
        let paths = ruby.ary_new_capa(record_ids.len());
        let mut found = layouts.into_iter();
        for alive in present {
            if !alive {
                paths.push(ruby.qnil())?;
                continue;
            }
            match found.next().flatten() {
                None => paths.push(false)?,
                Some((category, start, notes)) => {
                    let nodes = ruby.ary_new_capa(notes.len());
                    let texts = ruby.ary_new_capa(notes.len());
                    let mut at = start;
                    for note in notes {
                        match note {
                            Some(text) => {
                                nodes.push(ruby.qnil())?;
                                texts.push(text)?;
                            }
                            None => {
                                nodes.push(holder.entry::<Value>(at as isize)?)?;
                                texts.push(ruby.qnil())?;
                                at += 1;
                            }
                        }
                    }
                    paths.push(ruby.ary_new_from_values(&[
                        category.into_value_with(ruby),
                        nodes.as_value(),
                        texts.as_value(),
                    ]))?;
                }
            }
        }
        std::hint::black_box(&holder);
        Ok(ruby.ary_new_from_values(&[
            paths.as_value(),
            outcome.visited.into_value_with(ruby),
            outcome.elapsed.as_secs_f64().into_value_with(ruby),
            outcome.stopped.map(|s| s.name()).into_value_with(ruby),
            outcome.depth_cut.into_value_with(ruby),
        ]))
    })
}
