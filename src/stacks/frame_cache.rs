//! A per-frame cache for stacks the stack cache does not know: from one frame's raw identity (the
//! VM's frame handle, what locates it, its line) to its interned [`Frame`], for the period the
//! caller's handles are stable in (its epoch: in the binding, for as long as every GC marked the
//! handles held here, see [`FrameCache::for_each_handle`]). In a service
//! most of a new stack is frames seen a moment ago (the server's and framework's, the bottom
//! tens of frames of every request): those are neither named nor interned again, and an equal
//! stack that is already a heap record is found by ids alone, interning nothing.
//!
//! Unlike the stack cache, this cache holds one reference on every string id it keeps, so a kept
//! id always names the string it was interned for (ids are never reused); it gives them back
//! when its epoch ends, when it fills up, and when it is cleared. Its ids form a string group
//! (strings.rs): a heap record made only of its frames holds the group instead of a reference per
//! id, and a group still held when the cache lets go keeps its ids until its last holder goes.
//! Needs no lock: the recorder's state owns it, and every method takes the string storage's batch.

use std::collections::{HashMap, HashSet};
use std::hash::BuildHasherDefault;

use rustc_hash::FxHasher;

use crate::error::Result;
use crate::stacks::frame::Frame;
use crate::stacks::handles::{FrameKey, LAST_SENTINEL_LOCATOR};
use crate::strings::{Batch, GroupId};

/// Most frames kept; a full cache starts again empty (about 60 bytes each). A program that runs
/// much distinct code (rubocop) kept refilling a cache of 8,192 and naming the same frames again;
/// the GC marks each distinct handle once however many frames share it (see `handles`).
pub const FRAME_CACHE_MAX_FRAMES: usize = 65536;

type FxMap<K, V> = HashMap<K, V, BuildHasherDefault<FxHasher>>;
type FxSet<T> = HashSet<T, BuildHasherDefault<FxHasher>>;

#[derive(Default)]
pub struct FrameCache {
    epoch: u64,
    frames: FxMap<FrameKey, Frame>,
    /// Each distinct handle the keys hold (handles and locators): what the GC mark walks (one
    /// method's frames at many lines share one handle). Emptied with the frames, never in part.
    handles: FxSet<u64>,
    /// Scratch for the keys of one capture (reused, so a lookup allocates nothing).
    pub(crate) keys: Vec<FrameKey>,
    /// The string group of the ids kept now (a new one after every clear).
    group: GroupId,
}

impl FrameCache {
    /// Makes the cache serve `epoch`: a new epoch (or a full cache) gives back every id first.
    /// Returns whether it emptied the cache (the stack cache must then be emptied too: it relies
    /// on this cache's handles being marked).
    pub fn enter(&mut self, strings: &mut Batch<'_>, epoch: u64) -> Result<bool> {
        if self.epoch != epoch || self.frames.len() >= FRAME_CACHE_MAX_FRAMES {
            self.clear(strings)?;
            self.epoch = epoch;
            return Ok(true);
        }
        Ok(false)
    }

    /// Keeps `handles` for the GC mark without frames: those of a stack cache key whose frames
    /// were named without per-frame keys (a source that has none), so the stack cache can rely
    /// on this cache for every key it holds. Allocates (Rust allocator) to grow the set.
    pub fn hold(&mut self, handles: &[u64]) {
        self.handles.extend(handles.iter().copied());
    }

    pub fn get(&self, key: &FrameKey) -> Option<Frame> {
        self.frames.get(key).copied()
    }

    /// Interns `name` and `filename` (the references are the cache's) and keeps the frame.
    pub fn insert(
        &mut self,
        strings: &mut Batch<'_>,
        key: FrameKey,
        name: &str,
        filename: &str,
    ) -> Result<Frame> {
        let name = strings.intern(name)?;
        let filename = match strings.intern(filename) {
            Ok(id) => id,
            Err(e) => {
                let _ = strings.unintern(name);
                return Err(e);
            }
        };
        let frame = Frame {
            name,
            filename,
            line: key.line,
        };
        match self.frames.insert(key, frame) {
            // Cannot happen (the caller inserts only what it did not find); keep the counts right.
            Some(old) => strings.unintern_all([old.name, old.filename])?,
            None => {
                self.handles.insert(key.handle);
                if key.locator > LAST_SENTINEL_LOCATOR {
                    self.handles.insert(key.locator);
                }
            }
        }
        Ok(frame)
    }

    /// Calls `f` with every frame handle the kept keys hold (handles and locators; the locator's
    /// small sentinels are not handles) and those kept with [`FrameCache::hold`], for the binding
    /// to keep alive and unmoved: then a handle never names another frame while it is kept, here
    /// or in the stack cache (see stack_cache.rs). Never allocates.
    pub fn for_each_handle(&self, mut f: impl FnMut(u64)) {
        self.handles.iter().for_each(|&h| f(h));
    }

    /// The string group the kept ids form: a holder of it keeps every id this cache holds now
    /// (see the module docs).
    pub fn group(&self) -> GroupId {
        self.group
    }

    /// Forgets every frame, giving back its references (to the group's holders, if any: see
    /// the module docs), and starts a new group.
    pub fn clear(&mut self, strings: &mut Batch<'_>) -> Result<()> {
        self.handles.clear();
        let ids = self.frames.drain().flat_map(|(_, f)| [f.name, f.filename]);
        let retired = strings.retire_group(self.group, ids);
        self.group = strings.open_group();
        retired
    }

    pub fn len(&self) -> usize {
        self.frames.len()
    }

    pub fn is_empty(&self) -> bool {
        self.frames.is_empty()
    }

    /// Approximate heap bytes held.
    pub fn memsize(&self) -> usize {
        self.frames.capacity() * (std::mem::size_of::<(FrameKey, Frame)>() + 1)
            + self.handles.capacity() * (std::mem::size_of::<u64>() + 1)
            + self.keys.capacity() * std::mem::size_of::<FrameKey>()
    }
}
