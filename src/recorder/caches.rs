//! The two caches of the sampling path (raw stack -> stack, raw frame -> interned frame) and how
//! their frame handles stay meaningful: the binding keeps every handle they hold alive and
//! unmoved by marking it at every GC ([`HeapRecorder::mark_cached_handles`]), so entries outlive
//! GCs; a GC that found the caches in use (so marked nothing of them) starts a new handle epoch,
//! and nothing filled before it is trusted again.
//!
//! Apart from the recorder's state: the state stays borrowed across calls that may allocate (an
//! object's size function, during updates), the caches are borrowed only where nothing can
//! allocate a Ruby object, so a GC's mark finds them free.

use std::cell::RefMut;
use std::collections::HashMap;
use std::hash::BuildHasherDefault;

use rustc_hash::FxHasher;

use super::HeapRecorder;
use crate::error::{HeapError, Result};
use crate::stacks::{FrameCache, StackCache};
use crate::strings::{Batch, StringId};

/// Most class names the class cache keeps; a full cache starts again empty.
pub const CLASS_CACHE_MAX: usize = 4096;

#[derive(Default)]
pub(crate) struct Caches {
    /// Raw stack key -> a stack in the heap records; holds no reference (see stacks/stack_cache.rs).
    pub(crate) stacks: StackCache,
    /// Raw frame key -> interned frame, for stacks the stack cache misses; holds references on
    /// its ids (see stacks/frame_cache.rs).
    pub(crate) frames: FrameCache,
    /// Class name -> its id, one reference each: a sample of a class seen before counts a
    /// reference instead of interning the name (a string hash and two lookups in the storage).
    classes: HashMap<Box<str>, StringId, BuildHasherDefault<FxHasher>>,
    /// The handle epoch the cached handles belong to. Behind the recorder's (a GC could not mark
    /// them), the handles may have been freed: they are neither marked again nor used, and the
    /// next recording empties the caches (`refresh`).
    epoch: u64,
}

impl Caches {
    /// `name`'s id with one reference taken for the caller, through the class cache.
    pub(crate) fn intern_class(&mut self, strings: &mut Batch<'_>, name: &str) -> Result<StringId> {
        if let Some(&id) = self.classes.get(name) {
            strings.add_ref(id)?;
            return Ok(id);
        }
        let id = strings.intern(name)?;
        if id == 0 {
            return Ok(0);
        }
        if self.classes.len() >= CLASS_CACHE_MAX {
            self.clear_classes(strings)?;
        }
        // The cache's own reference.
        strings.add_ref(id)?;
        self.classes.insert(name.into(), id);
        Ok(id)
    }

    /// The ids the class cache holds a reference on.
    #[cfg(test)]
    pub(crate) fn class_ids(&self) -> impl Iterator<Item = StringId> + '_ {
        self.classes.values().copied()
    }

    /// Forgets every class name, giving back the cache's references.
    pub(crate) fn clear_classes(&mut self, strings: &mut Batch<'_>) -> Result<()> {
        strings.unintern_all(self.classes.drain().map(|(_, id)| id))
    }

    /// Empties the caches if their handles belong to an epoch before `epoch` (see `epoch`).
    pub(crate) fn refresh(&mut self, strings: &mut Batch<'_>, epoch: u64) -> Result<()> {
        if self.epoch == epoch {
            return Ok(());
        }
        self.epoch = epoch;
        self.stacks.clear();
        self.frames.clear(strings)
    }

    /// Forgets everything cached, giving back what the caches hold.
    pub(crate) fn clear(&mut self, strings: &mut Batch<'_>) -> Result<()> {
        self.stacks.clear();
        let frames = self.frames.clear(strings);
        self.clear_classes(strings).and(frames)
    }
}

impl HeapRecorder {
    pub(crate) fn caches(&self) -> Result<RefMut<'_, Caches>> {
        (self.caches)
            .try_borrow_mut()
            .map_err(|_| HeapError::Host("the recorder's caches are in use".into()))
    }

    /// The period in which the frame handles the caches hold are known to be alive and unmoved:
    /// it changes only when a GC could not mark them. Keys of the sampling path carry it.
    pub fn handle_epoch(&self) -> u64 {
        self.handle_epoch.get()
    }

    /// Calls `mark` with every frame handle the caches hold, for the binding's GC mark function:
    /// the VM then keeps each alive and where it is (a marked handle is pinned) for as long as it
    /// is cached. If the caches are in use (a bug: they never are across an allocation), nothing
    /// is marked and the handle epoch moves on, so no entry filled before is trusted again.
    /// Never allocates, raises or panics.
    pub fn mark_cached_handles(&self, mut mark: impl FnMut(u64)) {
        match self.caches.try_borrow() {
            // Handles of an older epoch may have been freed: marking one could touch a dead slot.
            Ok(caches) if caches.epoch == self.handle_epoch() => {
                // The stack cache's keys are among these (see stacks/stack_cache.rs).
                caches.frames.for_each_handle(&mut mark);
            }
            Ok(_) => {}
            Err(_) => (self.handle_epoch).set(self.handle_epoch.get().wrapping_add(1)),
        }
    }

    /// Sizes the stack cache, so the sampling path never has to. Call when sampling starts.
    pub fn reserve_stack_cache(&self) -> Result<()> {
        self.caches()?.stacks.reserve();
        Ok(())
    }

    /// Forgets every cached stack (keeping the table), frame and class name, giving back what
    /// the caches hold. Skipped, harmlessly, if the caches are in use; only the stacks (which
    /// hold no reference) if the storage is.
    pub fn clear_stack_cache(&self) {
        if let Ok(mut caches) = self.caches.try_borrow_mut() {
            match self.strings.try_lock() {
                Some(mut strings) => {
                    let _ = caches.clear(&mut strings);
                }
                None => caches.stacks.clear(),
            }
        }
    }

    /// Test switch: with the caches off every recording names and interns its frames.
    pub fn set_stack_cache_enabled(&self, enabled: bool) -> Result<()> {
        let mut caches = self.caches()?;
        caches.stacks.set_enabled(enabled);
        if !enabled {
            caches.clear(&mut self.strings.lock()?)?;
        }
        Ok(())
    }

    /// Approximate heap bytes the caches hold.
    pub(crate) fn caches_memsize(&self) -> usize {
        (self.caches.try_borrow()).map_or(0, |c| {
            let classes: usize = c.classes.keys().map(|k| k.len() + 24).sum();
            c.stacks.memsize() + c.frames.memsize() + classes
        })
    }
}
