//! Interned strings: a thin owner of libdatadog's `ManagedStringStorage`.
//!
//! Every non-empty string a record refers to holds one reference in the storage; the recorder
//! gives each back (`unintern`) when the record goes away. `live_refs` counts the references we
//! hold, so tests (and `stats`) can check that nothing leaks. Tearing the recorder down drops the
//! storage whole and gives nothing back one by one.

use std::num::NonZeroU32;
use std::sync::{Arc, Mutex, MutexGuard, TryLockError};

use libdd_profiling::collections::string_storage::ManagedStringStorage;

use crate::error::{HeapError, Result};

/// Id of an interned string; 0 is the empty string, which is never counted.
pub type StringId = u32;

#[derive(Clone)]
pub struct Strings {
    storage: Arc<Mutex<ManagedStringStorage>>,
}

impl Default for Strings {
    fn default() -> Self {
        Self::new()
    }
}

impl Strings {
    pub fn new() -> Self {
        Strings {
            storage: Arc::new(Mutex::new(ManagedStringStorage::new())),
        }
    }

    /// The shared storage, for pprof encoding (`Profile::try_with_string_storage`).
    pub fn storage(&self) -> &Arc<Mutex<ManagedStringStorage>> {
        &self.storage
    }

    /// Locks the storage, waiting if the (GVL-free) encoder holds it.
    pub fn lock(&self) -> Result<Batch<'_>> {
        // A poisoned mutex only means a panic happened while it was held; the storage's own
        // operations keep it consistent, so keep using it.
        let guard = self.storage.lock().unwrap_or_else(|p| p.into_inner());
        Ok(Batch { guard })
    }

    /// Locks the storage only if it is free right now; `None` when another thread holds it.
    /// The allocation hook uses this so it never waits on the encoder.
    pub fn try_lock(&self) -> Option<Batch<'_>> {
        match self.storage.try_lock() {
            Ok(guard) => Some(Batch { guard }),
            Err(TryLockError::Poisoned(p)) => Some(Batch {
                guard: p.into_inner(),
            }),
            Err(TryLockError::WouldBlock) => None,
        }
    }

    pub fn get(&self, id: StringId) -> Result<String> {
        self.lock()?.get(id)
    }
}

/// The storage, locked for a batch of operations.
pub struct Batch<'a> {
    guard: MutexGuard<'a, ManagedStringStorage>,
}

impl Batch<'_> {
    pub fn intern(&mut self, s: &str) -> Result<StringId> {
        self.guard.intern(s).map_err(HeapError::strings)
    }

    /// Takes one more reference on `id`, which the caller holds a reference on already (so it
    /// still names its string). The empty string (id 0) is not counted and is skipped.
    pub fn add_ref(&mut self, id: StringId) -> Result<()> {
        if id == 0 {
            return Ok(());
        }
        let s = self.guard.get_string(id).map_err(HeapError::strings)?;
        let again = self.intern(&s)?;
        if again != id {
            let _ = self.unintern(again);
            return Err(HeapError::Strings(format!(
                "string id {id} interned again as {again}"
            )));
        }
        Ok(())
    }

    /// Gives back one reference; the empty string (id 0) is not counted and is skipped.
    pub fn unintern(&mut self, id: StringId) -> Result<()> {
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
    fn try_lock_fails_while_held() {
        let strings = Strings::new();
        let held = strings.lock().unwrap();
        assert!(strings.try_lock().is_none());
        drop(held);
        assert!(strings.try_lock().is_some());
    }
}
