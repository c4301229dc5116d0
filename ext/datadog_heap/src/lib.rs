//! Ruby binding for datadog_heap: the only crate that touches the VM (DESIGN.md §3).
//!
//! `init` runs once, under the GVL, when Ruby loads `datadog_heap.so`. Each Ruby class has its
//! own module with an `init`, called from the one `#[magnus::init]` below; raw C API calls live
//! in `shims`.

mod errors;
mod fork_gate;
mod gvl_cell;
mod postponed;
mod profile_reader;
mod recorder;
mod registry;
mod ruby_vm;
mod sampler;
mod shims;
mod weak_map;

use magnus::{function, prelude::*, Error, Ruby};

/// The binding crate's version; the gem checks it against `DatadogHeap::VERSION`.
///
/// Needs the GVL (allocates a Ruby String); does not raise.
fn native_version() -> &'static str {
    env!("CARGO_PKG_VERSION")
}

/// Calls `after_fork` on every live recorder; lib/datadog_heap.rb runs it in a forked child.
fn after_fork_all(ruby: &Ruby) -> Result<(), Error> {
    errors::guarded(ruby, || {
        // SAFETY: a Ruby method, so the GVL is held; `after_fork` makes no VM call, so no GC can
        // free a recorder while we walk the list.
        for recorder in unsafe { registry::all() } {
            // SAFETY: pointers in the registry are to live recorders (see registry docs).
            unsafe { &*recorder }.reset_after_fork();
        }
        sampler::reset_busy_after_fork();
        fork_gate::after_fork(true);
        Ok(())
    })
}

/// Runs right before a fork, GVL held: waits until no profile is being encoded on another thread
/// (see `fork_gate`).
fn before_fork() {
    fork_gate::before_fork();
}

/// Runs in the parent after a fork, or after a fork that failed.
fn after_fork_parent() {
    fork_gate::after_fork(false);
}

/// Extension entry point (`Init_datadog_heap`). Runs under the GVL; may allocate and raise.
#[magnus::init]
fn init(ruby: &Ruby) -> Result<(), Error> {
    // `define_module` reopens the module when lib/datadog_heap.rb has already defined it.
    let module = ruby.define_module("DatadogHeap")?;
    errors::init(ruby, module)?;
    weak_map::init(ruby)?;
    postponed::init();
    recorder::init(ruby, module)?;
    profile_reader::init(ruby, module)?;
    module.define_singleton_method("_native_version", function!(native_version, 0))?;
    module.define_singleton_method("_native_after_fork_all", function!(after_fork_all, 0))?;
    module.define_singleton_method("_native_before_fork", function!(before_fork, 0))?;
    module.define_singleton_method("_native_after_fork_parent", function!(after_fork_parent, 0))?;
    module.define_singleton_method(
        "_native_ractors_starting",
        function!(sampler::stop_for_ractors, 0),
    )?;
    Ok(())
}
