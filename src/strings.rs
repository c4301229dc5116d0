//! Interned strings: a thin owner of libdatadog's `ManagedStringStorage`, with the reference
//! counts kept here.
//!
//! Every non-empty string a record (or a cache) refers to is counted here, by id; the storage
//! holds exactly one reference on each id whose count is above zero, and gets it back when the
//! count falls to zero. So taking one more reference on an id already held (`add_ref`, what a new
//! heap record does for each of its frames' ids) is one counter, not a string lookup: the storage
//! can only count a reference by interning the string again. The encoder reads the storage
//! directly (it only needs every id in use to have a reference there). Tearing the recorder down
//! drops both whole.
//!
//! Cheaper still, a holder can take one reference on a *group* of ids instead of one per id
//! ([`Batch::hold_group`]): the frame cache's ids form a group for as long as the cache keeps
//! them, and a heap record built wholly from them holds the group (one counter) rather than two
//! references per frame (two hash lookups each, cold ones on a deep new stack). When the cache
//! lets its ids go ([`Batch::retire_group`]) while records still hold the group, the ids stay
//! with the group until its last holder lets go.

use std::collections::HashMap;
use std::hash::BuildHasherDefault;
use std::num::NonZeroU32;
use std::sync::{Arc, Mutex, MutexGuard, TryLockError};

use libdd_profiling::collections::string_storage::ManagedStringStorage;
use rustc_hash::FxHasher;

use crate::error::{HeapError, Result};

/// Id of an interned string; 0 is the empty string, which is never counted.
pub type StringId = u32;

type Counts = HashMap<StringId, u32, BuildHasherDefault<FxHasher>>;

/// A group of ids held together (see the module docs): 0 is a valid group, the first one any
/// holder of ids (the frame cache) starts with.
pub type GroupId = u64;

/// Our references: per id, and the groups' holders and retired ids.
#[derive(Default)]
struct Refs {
    counts: Counts,
    /// Holders per group (groups nobody holds are absent).
    holders: HashMap<GroupId, u64, BuildHasherDefault<FxHasher>>,
    /// Ids of retired groups that still have holders: one reference each, given back with the
    /// group's last holder.
    retired: HashMap<GroupId, Vec<StringId>, BuildHasherDefault<FxHasher>>,
    /// The last group handed out by `open_group`.
    last_group: GroupId,
}

#[derive(Clone)]
pub struct Strings {
    storage: Arc<Mutex<ManagedStringStorage>>,
    /// Our references per id (ids with none are absent). Locked after `storage`, always.
    counts: Arc<Mutex<Refs>>,
}

impl Default for Strings {
    fn default() -> Self {
        Self::new()
    }
}

fn unpoisoned<T>(guard: std::sync::LockResult<MutexGuard<'_, T>>) -> MutexGuard<'_, T> {
    // A poisoned mutex only means a panic happened while it was held; every operation here
    // leaves the storage and the counts consistent, so keep using them.
    guard.unwrap_or_else(|p| p.into_inner())
}

impl Strings {
    pub fn new() -> Self {
        Strings {
            storage: Arc::new(Mutex::new(ManagedStringStorage::new())),
            counts: Arc::default(),
        }
    }

    /// The shared storage, for pprof encoding (`Profile::try_with_string_storage`).
    pub fn storage(&self) -> &Arc<Mutex<ManagedStringStorage>> {
        &self.storage
    }

    /// Locks the storage, waiting if the (GVL-free) encoder holds it.
    pub fn lock(&self) -> Result<Batch<'_>> {
        let guard = unpoisoned(self.storage.lock());
        let counts = unpoisoned(self.counts.lock());
        Ok(Batch { guard, counts })
    }

    /// Locks the storage only if it is free right now; `None` when another thread holds it.
    /// The allocation hook uses this so it never waits on the encoder.
    pub fn try_lock(&self) -> Option<Batch<'_>> {
        let guard = match self.storage.try_lock() {
            Ok(guard) => guard,
            Err(TryLockError::Poisoned(p)) => p.into_inner(),
            Err(TryLockError::WouldBlock) => return None,
        };
        // Only a holder of the storage's lock takes this one.
        let counts = unpoisoned(self.counts.lock());
        Some(Batch { guard, counts })
    }

    pub fn get(&self, id: StringId) -> Result<String> {
        self.lock()?.get(id)
    }
}

/// The storage, locked for a batch of operations.
pub struct Batch<'a> {
    guard: MutexGuard<'a, ManagedStringStorage>,
    counts: MutexGuard<'a, Refs>,
}

impl Batch<'_> {
    /// Interns `s` and takes a reference on it.
    pub fn intern(&mut self, s: &str) -> Result<StringId> {
        let id = self.guard.intern(s).map_err(HeapError::strings)?;
        if id == 0 {
            return Ok(0);
        }
        match self.counts.counts.get_mut(&id) {
            Some(count) => {
                *count = count.checked_add(1).ok_or_else(|| overflow(id))?;
                // The storage keeps one reference per id: give back the one just taken.
                self.storage_unintern(id)
            }
            None => {
                self.counts.counts.insert(id, 1);
                Ok(())
            }
        }?;
        Ok(id)
    }

    /// Takes one more reference on `id`, which the caller holds a reference on already (so it
    /// still names its string). The empty string (id 0) is not counted and is skipped.
    pub fn add_ref(&mut self, id: StringId) -> Result<()> {
        if id == 0 {
            return Ok(());
        }
        let count = (self.counts.counts.get_mut(&id)).ok_or_else(|| {
            HeapError::Strings(format!(
                "a reference was added to string id {id}, which has none"
            ))
        })?;
        *count = count.checked_add(1).ok_or_else(|| overflow(id))?;
        Ok(())
    }

    /// Gives back one reference; the empty string (id 0) is not counted and is skipped.
    pub fn unintern(&mut self, id: StringId) -> Result<()> {
        if id == 0 {
            return Ok(());
        }
        let count = (self.counts.counts.get_mut(&id)).ok_or_else(|| {
            HeapError::Strings(format!(
                "string id {id} was given back more often than taken"
            ))
        })?;
        *count -= 1;
        if *count == 0 {
            self.counts.counts.remove(&id);
            self.storage_unintern(id)?;
        }
        Ok(())
    }

    fn storage_unintern(&mut self, id: StringId) -> Result<()> {
        match NonZeroU32::new(id) {
            Some(id) => self.guard.unintern(id).map_err(HeapError::strings),
            None => Ok(()),
        }
    }

    /// Gives back every id; keeps going past a failure and reports the first one.
    pub fn unintern_all(&mut self, ids: impl IntoIterator<Item = StringId>) -> Result<()> {
        let mut first_err = Ok(());
        for id in ids {
            if let Err(e) = self.unintern(id) {
                if first_err.is_ok() {
                    first_err = Err(e);
                }
            }
        }
        first_err
    }

    /// A new group, held by nobody and distinct from every group handed out before.
    pub fn open_group(&mut self) -> GroupId {
        self.counts.last_group += 1;
        self.counts.last_group
    }

    /// One more holder of `group`, whose ids its owner (the frame cache) keeps referenced until
    /// it retires the group. Never fails; allocates (Rust allocator) only for a group's first
    /// holder.
    pub fn hold_group(&mut self, group: GroupId) {
        *self.counts.holders.entry(group).or_insert(0) += 1;
    }

    /// Whether `group` was retired while held (its ids are kept for its holders).
    pub fn is_retired(&self, group: GroupId) -> bool {
        self.counts.retired.contains_key(&group)
    }

    /// Whether any group was retired while held.
    pub fn any_retired(&self) -> bool {
        !self.counts.retired.is_empty()
    }

    /// One holder of `group` lets go; the last holder of a retired group gives back its ids.
    pub fn release_group(&mut self, group: GroupId) -> Result<()> {
        let Some(holders) = self.counts.holders.get_mut(&group) else {
            return Err(HeapError::Strings(format!(
                "group {group} was released more often than held"
            )));
        };
        *holders -= 1;
        if *holders > 0 {
            return Ok(());
        }
        self.counts.holders.remove(&group);
        match self.counts.retired.remove(&group) {
            Some(ids) => self.unintern_all(ids),
            None => Ok(()),
        }
    }

    /// The group's owner lets go of `ids` (one reference each, its own): given back now when
    /// nobody holds the group, else kept (allocating, Rust allocator) until its last holder lets
    /// go.
    pub fn retire_group(
        &mut self,
        group: GroupId,
        ids: impl IntoIterator<Item = StringId>,
    ) -> Result<()> {
        if !self.counts.holders.contains_key(&group) {
            return self.unintern_all(ids);
        }
        let kept = ids.into_iter().filter(|&id| id != 0).collect();
        self.counts.retired.insert(group, kept);
        Ok(())
    }

    pub fn get(&self, id: StringId) -> Result<String> {
        self.guard
            .get_string(id)
            .map(|s| s.to_string())
            .map_err(HeapError::strings)
    }

    /// Drops strings nobody references any more (the storage keeps them until told).
    pub fn compact(&mut self) {
        self.guard.advance_gen();
    }
}

fn overflow(id: StringId) -> HeapError {
    HeapError::Strings(format!("string id {id} has too many references"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn interning_twice_gives_one_id_and_two_references() {
        let strings = Strings::new();
        let mut b = strings.lock().unwrap();
        let a = b.intern("foo").unwrap();
        assert_eq!(b.intern("foo").unwrap(), a);
        b.unintern(a).unwrap();
        assert_eq!(b.get(a).unwrap(), "foo");
        b.unintern(a).unwrap();
        assert!(b.get(a).is_err(), "no references left");
    }

    #[test]
    fn empty_string_is_free() {
        let strings = Strings::new();
        let mut b = strings.lock().unwrap();
        assert_eq!(b.intern("").unwrap(), 0);
        b.unintern(0).unwrap();
        b.unintern(0).unwrap();
        assert_eq!(b.get(0).unwrap(), "");
    }

    #[test]
    fn a_retired_group_keeps_its_ids_until_its_last_holder_lets_go() {
        let strings = Strings::new();
        let mut b = strings.lock().unwrap();
        let group = b.open_group();
        let ids = vec![b.intern("a").unwrap(), b.intern("b").unwrap()];
        b.hold_group(group);
        b.hold_group(group);
        b.retire_group(group, ids.clone()).unwrap();
        assert!(b.is_retired(group));
        b.release_group(group).unwrap();
        assert_eq!(b.get(ids[1]).unwrap(), "b", "one holder left");
        b.release_group(group).unwrap();
        assert!(ids.iter().all(|&id| b.get(id).is_err()));
        assert!(!b.is_retired(group));
        assert!(
            b.release_group(group).is_err(),
            "released more often than held"
        );
    }

    #[test]
    fn a_group_nobody_holds_gives_back_its_ids_when_retired() {
        let strings = Strings::new();
        let mut b = strings.lock().unwrap();
        let (first, second) = (b.open_group(), b.open_group());
        assert_ne!(first, second);
        let id = b.intern("a").unwrap();
        b.retire_group(first, vec![id]).unwrap();
        assert!(b.get(id).is_err());
        assert!(!b.is_retired(first));
    }

    #[test]
    fn try_lock_fails_while_held() {
        let strings = Strings::new();
        let held = strings.lock().unwrap();
        assert!(strings.try_lock().is_none());
        drop(held);
        assert!(strings.try_lock().is_some());
    }
}
