//! Raw C API calls, each behind a small safe function with its contract, by concern: the GVL
//! (`gvl`), event hooks and postponed jobs (`hooks`), method calls (`call`), the GC (`gc`),
//! objects and classes (`class`), frames (`frames`), the VM's reference walk (`objspace`), the OS
//! clocks (`clock`), and the timer's signal (`signal`).
//! This is the only module that calls rb-sys or writes `unsafe` code; every other module of the
//! crate is compiled with `#![deny(unsafe_code)]` (see lib.rs).

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
