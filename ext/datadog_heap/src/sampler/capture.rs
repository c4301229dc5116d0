//! One stack as `rb_profile_frames` captured it in the hook: frame handles and lines, named only
//! when the session's stack cache does not know them already (`frame_names` says how), and the
//! allocated object's class name. Runs inside the NEWOBJ hook: no Ruby allocation, no raise, no Ruby call.

use datadog_heap_core::{truncation, Frame, FrameKey, FrameSource, RawFrame, RawStackKey, Stack};
use rb_sys::VALUE;

use super::frame_names;
use crate::shims;
use crate::stage_costs::{self, Stage};

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

    fn frame_keys(&self, out: &mut Vec<FrameKey>) -> Option<u64> {
        Some(self.fill_frame_keys(out))
    }

    fn name_frame(
        &self,
        i: usize,
        f: &mut dyn FnMut(&str, &str) -> datadog_heap_core::Result<Frame>,
    ) -> datadog_heap_core::Result<Frame> {
        self.name_one(i, f)
    }

    fn truncation_marker(&self) -> Option<String> {
        self.marker()
    }

    /// Names the kept frames (and the truncation marker) without allocating a Ruby object, as
    /// `frame_names` says. Allocates the names, the frame list and, for a truncated stack, the
    /// marker (Rust allocator).
    fn with_frames(
        &self,
        f: &mut dyn FnMut(&[RawFrame<'_>]) -> datadog_heap_core::Result<Stack>,
    ) -> datadog_heap_core::Result<Stack> {
        let naming = stage_costs::start(Stage::Naming);
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
        naming.end();
        f(&raw)
    }
}

impl CapturedStack<'_> {
    /// The frames kept (innermost first) and the truncation marker, as `with_frames` cuts them.
    fn kept(&self) -> (usize, Option<String>) {
        let depth = self.frames.len().min(self.lines.len());
        truncation(depth, self.max_frames, depth >= self.capacity)
    }

    /// The Ruby frame at or after `from` whose file a C frame takes: its index, if any.
    fn locating_frame(&self, from: usize) -> Option<usize> {
        let depth = self.frames.len().min(self.lines.len());
        (from..depth).find(|&j| shims::frame_path(self.frames[j]).is_some())
    }
}

/// Per-frame keys for the recorder's frame cache (issue 22). A frame's name depends on its
/// handle alone; its file and line on its handle and line for a Ruby frame, and on the Ruby frame
/// below it for a C frame (which takes that frame's location): the key holds the locating frame's
/// handle and line then. The epoch is the stack cache's (see `key`).
impl CapturedStack<'_> {
    pub(crate) fn fill_frame_keys(&self, out: &mut Vec<FrameKey>) -> u64 {
        let (keep, _) = self.kept();
        out.clear();
        for i in 0..keep {
            let handle = self.frames[i];
            let key = match shims::frame_path(handle) {
                Some(_) => FrameKey {
                    handle,
                    locator: 0,
                    line: self.lines[i],
                },
                None => match self.locating_frame(i + 1) {
                    Some(j) => FrameKey {
                        handle,
                        locator: self.frames[j],
                        line: self.lines[j],
                    },
                    None => FrameKey {
                        handle,
                        locator: 1,
                        line: 0,
                    },
                },
            };
            out.push(key);
        }
        shims::frame_epoch(self.gc_count)
    }

    /// Names kept frame `i` as `with_frames` would. Allocates its name (Rust allocator).
    pub(crate) fn name_one(
        &self,
        i: usize,
        f: &mut dyn FnMut(&str, &str) -> datadog_heap_core::Result<Frame>,
    ) -> datadog_heap_core::Result<Frame> {
        let naming = stage_costs::start(Stage::Naming);
        let frame = self.frames[i];
        let path = shims::frame_path(frame);
        let mut name = String::with_capacity(32);
        frame_names::FrameNamer::default().write(&mut name, frame, path.is_none());
        let filename = match path {
            Some(path) => string_of(path),
            None => match self.locating_frame(i + 1) {
                Some(j) => shims::frame_path(self.frames[j])
                    .map(string_of)
                    .unwrap_or(""),
                None => "",
            },
        };
        naming.end();
        f(&name, filename)
    }

    pub(crate) fn marker(&self) -> Option<String> {
        self.kept().1
    }
}

/// Path and line of the nearest Ruby frame at or after `from`.
fn caller_location<'a>(frames: &[VALUE], lines: &[i32], from: usize) -> (&'a str, i32) {
    for j in from..frames.len() {
        if let Some(path) = shims::frame_path(frames[j]) {
            return (string_of(path), lines[j]);
        }
    }
    ("", 0)
}

/// Borrows the bytes of a Ruby String the VM keeps alive (frame paths and labels, class names)
/// for the rest of this hook call. Not UTF-8 → "" (we never allocate to fix it up here).
#[allow(unsafe_code)] // a String the VM holds for this hook call, see below
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
