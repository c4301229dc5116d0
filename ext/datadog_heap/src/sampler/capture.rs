//! One stack as `rb_profile_frames` captured it in the hook: frame handles and lines, named only
//! when the session's stack cache does not know them already (`frame_names` says how), and the
//! allocated object's class name. Runs inside the NEWOBJ hook: no Ruby allocation, no raise, no Ruby call.

use datadog_heap_core::{truncation, FrameSource, RawFrame, RawStackKey, Stack};
use rb_sys::VALUE;

use super::frame_names;
use crate::shims;

pub struct CapturedStack<'a> {
    pub frames: &'a [VALUE],
    pub lines: &'a [i32],
    /// The buffers' size: a capture that filled them may have been cut short by it.
    pub capacity: usize,
    pub max_frames: usize,
    pub gc_count: u64,
}

impl FrameSource for CapturedStack<'_> {
    /// Frame handles are iseqs and method entries: the same handle and line name the same frame
    /// until the next GC (which may free it and reuse its slot) or the next compaction move, so
    /// `shims::frame_epoch` (GC count and moved-object count) is the key's epoch. (A frame we
    /// see running is alive, so even a lazy sweep still finishing the GC that set the count
    /// cannot free it; `rb_gc_count` moves at the start of the next GC, before that one marks or
    /// frees anything, and every move bumps the moved count.) `VALUE` is a 64-bit integer here, as
    /// the key's handles are. Naming depends on the whole capture (a C frame takes the location
    /// of the Ruby frame below it; truncation counts the frames dropped) and on `max_frames`
    /// (the salt); the key holds all of it.
    fn key(&self) -> Option<RawStackKey<'_>> {
        Some(RawStackKey {
            frames: self.frames,
            lines: self.lines,
            salt: self.max_frames as u64,
            epoch: shims::frame_epoch(self.gc_count),
        })
    }

    /// Names the kept frames (and the truncation marker) without allocating a Ruby object, as
    /// `frame_names` says. Allocates the names, the frame list and, for a truncated stack, the
    /// marker (Rust allocator).
    fn with_frames(
        &self,
        f: &mut dyn FnMut(&[RawFrame<'_>]) -> datadog_heap_core::Result<Stack>,
    ) -> datadog_heap_core::Result<Stack> {
        let (frames, lines) = (self.frames, self.lines);
        let depth = frames.len().min(lines.len());
        let (keep, marker) = truncation(depth, self.max_frames, depth >= self.capacity);
        // Every name goes into one buffer; the frames borrow their slices of it afterwards.
        let mut names = String::with_capacity(keep * 24);
        let mut located: Vec<(usize, &str, i32)> = Vec::with_capacity(keep);
        let mut namer = frame_names::FrameNamer::default();
        for i in 0..keep {
            let frame = frames[i];
            let path = shims::frame_path(frame);
            namer.write(&mut names, frame, path.is_none());
            let (filename, line) = match path {
                // A C frame: at the caller's location.
                None => caller_location(&frames[..depth], &lines[..depth], i + 1),
                // A Ruby frame with no line: the block a `/...#{}.../o` regexp literal runs once,
                // the top frame of a C extension's Init. At the caller's location too, rather
                // than at a line 0 that names no site.
                Some(path) if lines[i] == 0 => {
                    match caller_location(&frames[..depth], &lines[..depth], i + 1) {
                        ("", 0) => (string_of(path), 0),
                        caller => caller,
                    }
                }
                Some(path) => (string_of(path), lines[i]),
            };
            located.push((names.len(), filename, line));
        }
        let mut raw: Vec<RawFrame> = Vec::with_capacity(keep + 1);
        let mut start = 0;
        for &(end, filename, line) in &located {
            raw.push(RawFrame {
                name: names.get(start..end).unwrap_or(""),
                filename,
                line,
            });
            start = end;
        }
        if let Some(marker) = &marker {
            raw.push(RawFrame {
                name: marker,
                filename: "",
                line: 0,
            });
        }
        f(&raw)
    }
}

/// Path and line of the nearest Ruby frame at or after `from` that has a line; else the path of
/// the nearest Ruby frame, at line 0; else ("", 0).
fn caller_location<'a>(frames: &[VALUE], lines: &[i32], from: usize) -> (&'a str, i32) {
    let mut lineless = None;
    for j in from..frames.len() {
        if let Some(path) = shims::frame_path(frames[j]) {
            if lines[j] != 0 {
                return (string_of(path), lines[j]);
            }
            lineless.get_or_insert(path);
        }
    }
    lineless.map_or(("", 0), |path| (string_of(path), 0))
}

/// Borrows the bytes of a Ruby String the VM keeps alive (frame paths and labels, class names)
/// for the rest of this hook call. Not UTF-8 → "" (we never allocate to fix it up here).
pub(super) fn string_of<'a>(value: VALUE) -> &'a str {
    // SAFETY: the strings we are given (frame paths and labels, class names) are held by the VM
    // for at least as long as this hook call, which runs no Ruby code and no GC before the core
    // has copied them.
    unsafe { shims::borrow_str(value) }.unwrap_or("")
}

/// The object's class name without allocating: the class's permanent name, else the nearest
/// named ancestor, else "Object".
pub fn class_name_of<'a>(object: VALUE) -> &'a str {
    let mut class = shims::real_class_of(object);
    for _ in 0..32 {
        let Some(c) = class else { break };
        if let Some(name) = shims::class_path_if_named(c) {
            let s = string_of(name);
            if !s.is_empty() && !s.starts_with("#<") {
                return s;
            }
        }
        class = shims::superclass_of(c);
    }
    "Object"
}
