//! Why is it alive: shortest chains of references from the GC roots to sampled objects of the
//! top allocation sites. [`pick_targets`] chooses the objects from a snapshot;
//! [`find_root_paths`] searches a heap graph (the binding's walk of the VM) for them. Naming
//! each reference the way a Ruby reader would (`constant Foo::BAR`, `@ivar`, `[3]`) needs the
//! objects themselves and is done by the binding and lib/datadog_heap/retainers.rb.

mod labels;
mod search;
mod targets;

#[cfg(test)]
mod tests;

pub use labels::{retained_by_sites, RetainedRow};
pub use search::{
    find_root_paths, HeapGraph, RootPath, SearchLimits, SearchOutcome, Stop, TIME_CHECK_EVERY,
};
pub use targets::{pick_targets, TargetObject, TargetSite};
