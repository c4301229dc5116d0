//! Raw C API calls, each behind a small safe function with its contract, by concern: the GVL
//! (`gvl`), event hooks and postponed jobs (`hooks`), method calls (`call`), the GC (`gc`),
//! objects and classes (`class`, the hook's borrowed strings and class names among them), frames
//! (`frames`), the VM's reference walk (`objspace`), the OS clocks (`clock`), and the timer's
//! signal (`signal`).
//! This is the module that calls rb-sys and writes `unsafe` code; every other module of the crate
//! is compiled with `#![deny(unsafe_code)]` (see lib.rs), except for a few items that turn a raw
//! VALUE the VM keeps alive into a `Value` or declare a GVL-bound type `Send`, each with an
//! `allow` and its SAFETY argument, and the GVL-guarded cells declared with `gvl_guarded!`.

mod call;
mod class;
mod clock;
mod frames;
mod gc;
mod gvl;
#[cfg(not(ruby_gte_3_3))]
pub mod gvl_owner;
mod hooks;
pub mod objspace;
pub mod signal;

pub use call::*;
pub use class::*;
pub use clock::*;
pub use frames::*;
pub use gc::*;
pub use gvl::*;
pub use hooks::*;
