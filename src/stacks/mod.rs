//! Allocation stacks, from capture to heap record. A stack passes through three forms: handles
//! (the VM's frame handles and lines, as a capture hands them in: [`FrameKey`], [`StackHandles`]),
//! named (a frame's name and file as text: [`NamedFrame`]) and interned (ids into the string
//! storage: [`Frame`], and a deduplicated [`Stack`] of them). A [`FrameSource`] gives a recording's
//! stack in whichever forms it has; the recorder finds or makes its heap record
//! ([`HeapRecords`]), naming and interning only what the two caches cannot answer:
//!
//! - the stack cache (stack_cache.rs): a whole stack's handles -> its stack and its record's
//!   [`Claims`], holding no reference;
//! - the frame cache (frame_cache.rs): one frame's handles -> its interned frame, holding a
//!   reference on every id it keeps.
//!
//! The files depend one way: frame.rs and handles.rs on nothing here; source.rs on both;
//! frame_cache.rs on frame.rs and handles.rs; records.rs on those and source.rs; stack_cache.rs
//! on records.rs for the claims. Needs no lock: the recorder's state owns every piece.

pub mod frame;
pub mod frame_cache;
pub mod handles;
pub mod records;
pub mod source;
pub mod stack_cache;

pub use frame::{truncation, Frame, NamedFrame, Stack};
pub use frame_cache::{FrameCache, FRAME_CACHE_MAX_FRAMES};
pub use handles::{FrameKey, HashedKey, StackHandles};
pub use records::{Claims, HeapRecords, MAX_DORMANT_STACKS};
pub use source::FrameSource;
pub use stack_cache::{StackCache, STACK_CACHE_SLOTS};
