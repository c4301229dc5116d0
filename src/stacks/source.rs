//! How a recording's stack comes in: a [`FrameSource`] hands over its handles first (a stack key
//! for the stack cache, frame keys for the frame cache) and names frames only when neither cache
//! can answer, so the sampling path names and interns as little as it can.

use crate::error::Result;
use crate::stacks::frame::{Frame, NamedFrame, Stack};
use crate::stacks::handles::{FrameKey, StackHandles};

/// Where a recording's frames come from: a raw key for the stack cache, when the caller has one,
/// and the named frames, which are only asked for when the cache cannot answer.
pub trait FrameSource {
    /// The stack's raw identity; `None` when it has none worth caching.
    fn key(&self) -> Option<StackHandles<'_>>;

    /// Names the frames and calls `f` with them, returning what `f` returns. The frames may
    /// borrow from memory that only lives as long as this call.
    fn with_frames(&self, f: &mut dyn FnMut(&[NamedFrame<'_>]) -> Result<Stack>) -> Result<Stack>;

    /// Per-frame identities for the frame cache (frame_cache.rs): fills `out` with one key
    /// per kept frame, innermost first, and returns their epoch; `None` (the default) when the
    /// source has none, and then `with_frames` names the stack.
    fn frame_keys(&self, _out: &mut Vec<FrameKey>) -> Option<u64> {
        None
    }

    /// Names kept frame `i` (in `frame_keys`' order) and calls `f` with its name and file.
    fn name_frame(
        &self,
        _i: usize,
        f: &mut dyn FnMut(&str, &str) -> Result<Frame>,
    ) -> Result<Frame> {
        f("", "")
    }

    /// The name of the frame that stands for the frames cut off past `max_frames`, if any.
    fn truncation_marker(&self) -> Option<String> {
        None
    }
}

/// Frames already named (`record_allocation` from Ruby, the tests): nothing to cache.
impl FrameSource for [NamedFrame<'_>] {
    fn key(&self) -> Option<StackHandles<'_>> {
        None
    }

    fn with_frames(&self, f: &mut dyn FnMut(&[NamedFrame<'_>]) -> Result<Stack>) -> Result<Stack> {
        f(self)
    }
}
