//! The frames of an allocation stack in their two forms, and the stack itself: a [`NamedFrame`] is
//! named (a frame's name and file as text, as the caller hands it in), a [`Frame`] is interned
//! (ids into the recorder's string storage). A [`Stack`] is a deduplicated run of interned frames.
//! Nothing here holds a reference in the storage: the heap records do (records.rs).

use std::hash::{Hash, Hasher};
use std::sync::Arc;

use crate::strings::StringId;

/// One frame of an allocation stack, as ids into the recorder's string storage.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Frame {
    pub name: StringId,
    pub filename: StringId,
    pub line: i32,
}

/// One word per frame instead of three: a stack is hashed on every sample that finds its heap
/// record, and Fx's cost is one multiply per word. Equal frames give equal words; frames that
/// share a word (ids or lines past 2^20 overlapping) only share a hash bucket.
impl Hash for Frame {
    fn hash<H: Hasher>(&self, state: &mut H) {
        let ids = (u64::from(self.name) << 32) | u64::from(self.filename);
        state.write_u64(ids ^ (u64::from(self.line as u32) << 20));
    }
}

/// A frame named, not yet interned: its name and file as text, as the caller hands it in.
#[derive(Debug, Clone, Copy)]
pub struct NamedFrame<'a> {
    pub name: &'a str,
    pub filename: &'a str,
    pub line: i32,
}

/// A deduplicated stack, innermost frame first. Cheap to clone; immutable once built, so a
/// snapshot can hand clones to a thread that does not hold the GVL.
pub type Stack = Arc<[Frame]>;

/// The string references a stack's frames hold (the empty string's id 0 holds none).
pub(crate) fn refs_of(stack: &[Frame]) -> u64 {
    stack
        .iter()
        .map(|f| u64::from(f.name != 0) + u64::from(f.filename != 0))
        .sum()
}

/// How a stack of `depth` frames is cut to `max_frames`: the frames kept (innermost first) and,
/// when some were dropped, the name of the one frame that stands for them at the end. `open_ended`
/// says the capture filled its buffer, so more frames may have been dropped than it saw.
pub fn truncation(depth: usize, max_frames: usize, open_ended: bool) -> (usize, Option<String>) {
    if depth <= max_frames {
        return (depth, None);
    }
    let keep = max_frames.saturating_sub(1);
    let dropped = depth - keep;
    let plus = if open_ended { "+" } else { "" };
    (keep, Some(format!("({dropped}{plus} frames truncated)")))
}

#[cfg(test)]
mod tests {
    use super::truncation;

    #[test]
    fn truncation_keeps_max_frames_in_all_marker_included() {
        assert_eq!(truncation(5, 5, false), (5, None));
        assert_eq!(truncation(5, 5, true), (5, None));
        assert_eq!(
            truncation(10, 4, false),
            (3, Some("(7 frames truncated)".into()))
        );
        assert_eq!(
            truncation(10, 4, true),
            (3, Some("(7+ frames truncated)".into()))
        );
        assert_eq!(truncation(3, 1, false).0, 0);
    }
}
