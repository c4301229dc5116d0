//! Ruby binding for datadog_heap: the only crate that touches the VM (docs/architecture.md).
//!
//! Layers, each using only those above it:
//!
//! ```text
//! errors, shims, weak_map, ruby_vm   raw C API calls, the WeakMap, the core's Vm trait
//! sampler                                      per-session sampling state; the sampled path
//! runtime                                      sessions, hooks, postponed jobs, busy set, fork
//! recorder, profile_reader, exporter, testing  one module per Ruby class or module
//! lib.rs                                       `init`
//! ```
//!
//! `init` runs once, under the GVL, when Ruby loads `datadog_heap.so`.

#![deny(unsafe_op_in_unsafe_fn)]
#![deny(clippy::undocumented_unsafe_blocks)]

// `shims` is the one module that calls rb-sys or writes `unsafe` code; the others deny it, and
// the few items that must convert a raw VALUE the VM keeps alive (or share GVL-guarded state)
// say so with an `allow` and their SAFETY argument.
#[deny(unsafe_code)]
mod errors;
#[deny(unsafe_code)]
mod exporter;
#[deny(unsafe_code)]
mod profile_reader;
#[deny(unsafe_code)]
mod recorder;
#[deny(unsafe_code)]
mod ruby_vm;
#[deny(unsafe_code)]
mod runtime;
#[deny(unsafe_code)]
mod sampler;
mod shims;
#[deny(unsafe_code)]
mod stage_costs;
#[deny(unsafe_code)]
mod testing;
#[deny(unsafe_code)]
mod weak_map;

use magnus::{function, prelude::*, Error, Ruby};

/// The binding crate's version; the gem checks it against `DatadogHeap::VERSION`.
///
/// Needs the GVL (allocates a Ruby String); does not raise.
fn native_version() -> &'static str {
    env!("CARGO_PKG_VERSION")
}

/// Runs in a forked child (lib/datadog_heap.rb's fork hook). Never raises.
fn after_fork_all(ruby: &Ruby) -> Result<(), Error> {
    runtime::guarded(ruby, || {
        runtime::after_fork();
        Ok(())
    })
}

/// One tick of the window timer, for the Ruby timer thread of Rubies before 3.3 (see
/// `runtime::windows`): the rate to tick at next, nil when no windowed session runs.
fn window_tick(ruby: &Ruby) -> Result<Option<f64>, Error> {
    runtime::guarded(ruby, || Ok(runtime::window_tick(ruby)))
}

/// The Ruby timer thread's wait beside the native timer (see `runtime::windows`): true when
/// the native timer handed it a tick, false when the wait ended without one, nil when no native
/// timer runs. Releases the GVL while waiting, not marked busy then: other threads' allocations
/// meanwhile are the program's.
fn window_timer_wait(ruby: &Ruby) -> Result<Option<bool>, Error> {
    runtime::guarded(ruby, || runtime::not_busy(runtime::window_timer_wait))
}

/// Extension entry point (`Init_datadog_heap`). Runs under the GVL; may allocate and raise.
#[magnus::init]
fn init(ruby: &Ruby) -> Result<(), Error> {
    // `define_module` reopens the module when lib/datadog_heap.rb has already defined it.
    // Before anything can sample: whether frames can be named with their class (shims::frames).
    shims::verify_method_entry_layout(sampler::frame_name);
    let module = ruby.define_module("DatadogHeap")?;
    errors::init(ruby, module)?;
    weak_map::init(ruby)?;
    runtime::init(ruby, module)?;
    recorder::init(ruby, module)?;
    profile_reader::init(ruby, module)?;
    exporter::init(ruby, module)?;
    testing::init(ruby, module)?;
    module.define_singleton_method("_native_version", function!(native_version, 0))?;
    module.define_singleton_method("_native_after_fork_all", function!(after_fork_all, 0))?;
    module.define_singleton_method(
        "_native_ractors_starting",
        function!(runtime::stop_for_ractors, 0),
    )?;
    module.define_singleton_method("_native_window_tick", function!(window_tick, 0))?;
    // The Ruby timer thread's wait for the ticks the native timer could not deliver (before 3.3;
    // nil where no native timer runs).
    module.define_singleton_method("_native_window_timer_wait", function!(window_timer_wait, 0))?;
    // Around `exec` (lib/datadog_heap.rb's ExecGuard): no timer signal may outlive the program.
    module.define_singleton_method("_native_before_exec", function!(runtime::before_exec, 0))?;
    module.define_singleton_method(
        "_native_after_failed_exec",
        function!(runtime::after_failed_exec, 0),
    )?;
    // Runs the block as the gem's own work: the sampler skips what this thread allocates in it
    // (lib/datadog_heap.rb's DatadogHeap.own_work).
    module.define_singleton_method("_native_own_work", function!(runtime::own_work, 0))?;
    // Makes the window timer a Ruby thread on any Ruby (lib/datadog_heap.rb, on 3.3.0 with M:N
    // threads); `_native_native_window_timer` says which one runs.
    module.define_singleton_method(
        "_native_use_ruby_timer",
        function!(runtime::use_ruby_timer, 1),
    )?;
    module.define_singleton_method(
        "_native_native_window_timer",
        function!(runtime::native_window_timer, 0),
    )?;
    // Why the native window timer cannot open windows at the rate asked for here (a String), or
    // nil: lib/datadog_heap.rb warns and the default sampler becomes the countdown.
    module.define_singleton_method(
        "_native_window_timer_problem",
        function!(runtime::window_timer_problem, 0),
    )?;
    module.define_singleton_method("_native_shutdown", function!(runtime::shutdown, 0))?;
    Ok(())
}
