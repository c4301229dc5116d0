//! C ABI of Datadog's `heap_recorder.h` (datadog 2.41/2.42): a Rust port of its `heap_recorder.c`
//! ([`heap_recorder_port`]), a separate recorder from datadog_heap's own.
//!
//! `c/heap_recorder_shim.c` defines the header's functions with its exact names and arguments and
//! calls the `ddheap_*` functions below; it alone touches Ruby (raising, hashes, strings, GC
//! marking, rb_protect around every VM call it hands us as a callback), so no Ruby exception ever
//! crosses a Rust frame. Every `extern "C"` body runs inside `catch_unwind`: a panic becomes an
//! error status the shim raises as a RuntimeError (or, in the sampler, a dropped sample).

pub mod heap_recorder_port;
pub mod types;

#[cfg(not(test))]
mod abi;
#[cfg(not(test))]
mod ddog;
#[cfg(not(test))]
pub use abi::*;

#[cfg(test)]
mod tests;
