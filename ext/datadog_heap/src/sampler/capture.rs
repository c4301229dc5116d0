//! One stack as `rb_profile_frames` captured it in the hook: frame handles and lines, named only
//! when the session's stack cache does not know them already (`frame_names` says how), and the
//! allocated object's class name. Runs inside the NEWOBJ hook: no Ruby allocation, no raise, no Ruby call.

use datadog_heap_core::{
    truncation, Frame, FrameKey, FrameSource, NamedFrame, Stack, StackHandles,
};
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
    /// `shims::frame_epoch` of the core's handle epoch.
    pub epoch: u64,
}

impl FrameSource for CapturedStack<'_> {
    /// Frame handles are iseqs and method entries: the same handle and line name the same frame
    /// for as long as the handle is alive and unmoved. A frame we see running is alive now; once
    /// cached, the session's mark function marks (and so pins) it at every GC, minor ones
    /// included, for as long as it stays cached, so its slot is never freed and reused and it
    /// never moves. A GC that could not mark the caches moves the core's handle epoch on, a
    /// compaction move the moved count (see `shims::frame_epoch`); the key carries both.
    /// `VALUE` is a 64-bit integer here, as the key's handles are. Naming depends on the whole
    /// capture (a C frame takes the location of the Ruby frame below it; truncation counts the
    /// frames dropped) and on `max_frames` (the salt); the key holds all of it.
    fn key(&self) -> Option<StackHandles<'_>> {
        Some(StackHandles {
            frames: self.frames,
            lines: self.lines,
            salt: self.max_frames as u64,
            epoch: self.epoch,
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
        f: &mut dyn FnMut(&[NamedFrame<'_>]) -> datadog_heap_core::Result<Stack>,
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
            let (filename, line) = match self.location(i) {
                Some((j, line)) => (
                    shims::frame_path(frames[j]).map_or("", shims::hook_string),
                    line,
                ),
                None => ("", 0),
            };
            located.push((names.len(), filename, line));
        }
        let mut named: Vec<NamedFrame> = Vec::with_capacity(keep + 1);
        let mut start = 0;
        for &(end, filename, line) in &located {
            named.push(NamedFrame {
                name: names.get(start..end).unwrap_or(""),
                filename,
                line,
            });
            start = end;
        }
        if let Some(marker) = &marker {
            named.push(NamedFrame {
                name: marker,
                filename: "",
                line: 0,
            });
        }
        naming.end();
        f(&named)
    }
}

impl CapturedStack<'_> {
    /// The frames kept (innermost first) and the truncation marker, as `with_frames` cuts them.
    fn kept(&self) -> (usize, Option<String>) {
        let depth = self.depth();
        truncation(depth, self.max_frames, depth >= self.capacity)
    }

    /// Where kept frame `i` is: the index of the Ruby frame whose file it takes, and the line.
    /// A Ruby frame with a line is where it is. A C frame is at its caller's location: the
    /// nearest outer Ruby frame with a line. So is a Ruby frame without one (the block a
    /// `/...#{}.../o` regexp literal runs once, the top frame of a C extension's Init), rather
    /// than at a line 0 that names no site. With no such caller: the nearest Ruby frame (itself,
    /// for a Ruby frame) at line 0; `None` when there is no Ruby frame at all.
    fn location(&self, i: usize) -> Option<(usize, i32)> {
        let ruby = self.is_ruby(i);
        if ruby && self.lines[i] != 0 {
            return Some((i, self.lines[i]));
        }
        self.place(i, ruby, self.outer_ruby(i + 1))
    }

    /// `location(i)` for every kept frame `i` below `keep`, outermost first, in one pass: each
    /// frame is asked whether it is a Ruby frame once (`location` asks again for every C frame
    /// below one, a VM call each time).
    fn locations(&self, keep: usize) -> impl Iterator<Item = (usize, Option<(usize, i32)>)> + '_ {
        let mut outer = self.outer_ruby(keep);
        (0..keep).rev().map(move |i| {
            let ruby = self.is_ruby(i);
            let location = self.place(i, ruby, outer);
            if ruby {
                outer.any = Some(i);
                if self.lines[i] != 0 {
                    outer.with_line = Some(i);
                }
            }
            (i, location)
        })
    }

    /// `location`'s rule for frame `i`, given whether it is a Ruby frame and the Ruby frames
    /// outside it.
    fn place(&self, i: usize, ruby: bool, outer: OuterRuby) -> Option<(usize, i32)> {
        match (ruby && self.lines[i] != 0, outer.with_line) {
            (true, _) => Some((i, self.lines[i])),
            (false, Some(j)) => Some((j, self.lines[j])),
            (false, None) if ruby => Some((i, 0)),
            (false, None) => outer.any.map(|j| (j, 0)),
        }
    }

    /// The nearest Ruby frames from index `from` outwards: any, and with a line (the scan stops
    /// at that one, all a location can need).
    fn outer_ruby(&self, from: usize) -> OuterRuby {
        let mut outer = OuterRuby::default();
        for j in from..self.depth() {
            if self.is_ruby(j) {
                outer.any = outer.any.or(Some(j));
                if self.lines[j] != 0 {
                    outer.with_line = Some(j);
                    break;
                }
            }
        }
        outer
    }

    /// Whether frame `j` is a Ruby frame (it has a file): a VM call.
    fn is_ruby(&self, j: usize) -> bool {
        shims::frame_path(self.frames[j]).is_some()
    }

    fn depth(&self) -> usize {
        self.frames.len().min(self.lines.len())
    }
}

/// The nearest Ruby frames outside a frame (indices into the capture).
#[derive(Clone, Copy, Default)]
struct OuterRuby {
    any: Option<usize>,
    with_line: Option<usize>,
}

/// Per-frame keys for the recorder's frame cache. A frame's name depends on its
/// handle alone; its file and line on its handle and line for a Ruby frame with a line, and on
/// the frame it is located at otherwise (see `location`): the key holds that frame's handle and
/// line then. The epoch is the stack cache's (see `key`).
impl CapturedStack<'_> {
    pub(crate) fn fill_frame_keys(&self, out: &mut Vec<FrameKey>) -> u64 {
        let (keep, _) = self.kept();
        out.clear();
        for (i, location) in self.locations(keep) {
            let handle = self.frames[i];
            let key = match location {
                Some((j, line)) if j == i => FrameKey {
                    handle,
                    locator: 0,
                    line,
                },
                Some((j, line)) => FrameKey {
                    handle,
                    locator: self.frames[j],
                    line,
                },
                None => FrameKey {
                    handle,
                    locator: 1,
                    line: 0,
                },
            };
            out.push(key);
        }
        // Filled outermost first.
        out.reverse();
        self.epoch
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
        let filename = match self.location(i) {
            Some((j, _)) => shims::frame_path(self.frames[j]).map_or("", shims::hook_string),
            None => "",
        };
        naming.end();
        f(&name, filename)
    }

    pub(crate) fn marker(&self) -> Option<String> {
        self.kept().1
    }
}
