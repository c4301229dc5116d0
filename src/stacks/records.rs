//! Heap records: each distinct allocation stack is kept once, with the number of tracked objects
//! (pending or committed) that were allocated there, and holds the string references of its
//! frames. A record's [`Claims`] are what the stack cache keeps to claim it again without a lookup.

use std::cell::Cell;
use std::collections::HashMap;
use std::hash::BuildHasherDefault;
use std::rc::Rc;
use std::sync::Arc;

use rustc_hash::FxHasher;

use crate::error::{HeapError, Result, MAX_FRAMES_LIMIT};
use crate::stacks::frame::{refs_of, Frame, NamedFrame, Stack};
use crate::stacks::frame_cache::FrameCache;
use crate::stacks::handles::FrameKey;
use crate::stacks::source::FrameSource;
use crate::strings::{Batch, GroupId};

type FxMap<K, V> = HashMap<K, V, BuildHasherDefault<FxHasher>>;

/// Most dormant records kept (stacks no tracked object points at any more, kept with their
/// string ids so that the next sample there interns nothing). Past it, those unused since the
/// last sweep go, then all of them if that is not enough.
pub const MAX_DORMANT_STACKS: usize = 4096;

/// One heap record's claims. `Cell`s so that a lookup can raise the count through the same
/// shared borrow that finds the record's key.
#[derive(Debug, Default)]
pub struct Claims {
    count: Cell<u32>,
    /// Claimed since the last sweep: a dormant record that was not is given back by the next.
    used: Cell<bool>,
    /// The record was swept away (its ids given back): whoever kept these claims (the stack
    /// cache) must not claim through them.
    gone: Cell<bool>,
    /// The string group that holds the record's ids for it (a record built from the frame
    /// cache's frames), or `None` when the record holds a reference per id.
    group: Cell<Option<GroupId>>,
    /// The last frame is a truncation marker whose name the record holds a reference on itself
    /// (group or not).
    marker: bool,
}

/// The set of heap records: stack -> number of tracked objects pointing at it. A record whose
/// count falls to 0 stays, dormant, holding its string ids: in a service most samples are of
/// short-lived objects at stacks seen before, and a dormant record makes the next sample there
/// cost a count instead of interning a whole stack. Dormant records are invisible (`len`,
/// `count`, `iter` see live ones only) and are given back by [`HeapRecords::sweep_dormant`],
/// which the recorder runs at every full update, and past [`MAX_DORMANT_STACKS`].
#[derive(Default)]
pub struct HeapRecords {
    /// Shared so that the stack cache can claim a record it found without a lookup here.
    records: FxMap<Stack, Rc<Claims>>,
    /// Records with a count of 0.
    dormant: usize,
    /// String references held by all records, dormant ones included.
    refs: u64,
    /// Scratch buffer reused by every `acquire`, so a lookup of an existing stack allocates nothing.
    scratch: Vec<Frame>,
}

impl HeapRecords {
    /// Live records (at least one object points at them).
    pub fn len(&self) -> usize {
        self.records.len() - self.dormant
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Dormant records (see the type's docs).
    pub fn dormant(&self) -> usize {
        self.dormant
    }

    /// String references held by every record, dormant ones included.
    pub fn refs(&self) -> u64 {
        self.refs
    }

    /// Number of objects that point at `stack` (0 when it is not recorded, or dormant).
    pub fn count(&self, stack: &[Frame]) -> u32 {
        self.records.get(stack).map_or(0, |c| c.count.get())
    }

    /// The live records and their counts.
    pub fn iter(&self) -> impl Iterator<Item = (&Stack, u32)> {
        (self.records.iter())
            .map(|(s, c)| (s, c.count.get()))
            .filter(|&(_, count)| count > 0)
    }

    /// Every record, dormant ones included (their count is 0).
    #[cfg(test)]
    pub fn iter_all(&self) -> impl Iterator<Item = (&Stack, u32)> {
        self.records.iter().map(|(s, c)| (s, c.count.get()))
    }

    /// A new record for the frames in `scratch`, claimed once; its ids are its own references,
    /// or `group`'s (see [`Claims`]).
    fn insert_scratch(&mut self, group: Option<GroupId>, marker: bool) -> (Stack, Rc<Claims>) {
        let stack: Stack = Arc::from(self.scratch.as_slice());
        self.refs += refs_of(&stack);
        let claims = Rc::new(Claims {
            count: Cell::new(1),
            used: Cell::new(true),
            gone: Cell::new(false),
            group: Cell::new(group),
            marker,
        });
        self.records.insert(stack.clone(), claims.clone());
        (stack, claims)
    }

    /// Gives back every dormant record that was not claimed since the last sweep (`all`: every
    /// dormant record), with its string ids; the others are marked unclaimed for the next.
    /// Returns how many went.
    ///
    /// Records that outlived their group's frame cache take a reference per id first, so that
    /// a retired group's ids (a whole frame cache's) stay held only until the next sweep.
    pub fn sweep_dormant(&mut self, strings: &mut Batch<'_>, all: bool) -> usize {
        self.hold_own_ids_of_retired_groups(strings);
        let mut gone = Vec::new();
        self.records.retain(|stack, claims| {
            let keep = claims.count.get() > 0 || (claims.used.get() && !all);
            claims.used.set(false);
            if !keep {
                claims.gone.set(true);
                gone.push((stack.clone(), claims.clone()));
            }
            keep
        });
        for (stack, claims) in &gone {
            self.refs = self.refs.saturating_sub(refs_of(stack));
            give_back(strings, stack, claims);
        }
        self.dormant -= gone.len();
        gone.len()
    }

    /// Every record whose group was retired takes its own reference on each of its ids and
    /// lets go of the group (the last to do so gives back the group's ids).
    fn hold_own_ids_of_retired_groups(&mut self, strings: &mut Batch<'_>) {
        if !strings.any_retired() {
            return;
        }
        for (stack, claims) in &self.records {
            let Some(group) = claims.group.get().filter(|&g| strings.is_retired(g)) else {
                continue;
            };
            let held = &stack[..stack.len() - usize::from(claims.marker)];
            let ids = || held.iter().flat_map(|f| [f.name, f.filename]);
            // The group holds a reference on each of these ids, so add_ref fails only on an
            // overflow; then the record keeps the group, and the references taken go back.
            let added = ids().take_while(|&id| strings.add_ref(id).is_ok()).count();
            if added == held.len() * 2 {
                claims.group.set(None);
                let _ = strings.release_group(group);
            } else {
                let _ = strings.unintern_all(ids().take(added));
            }
        }
    }

    /// Interns `frames` in one batch and returns the heap record for them with its count raised
    /// by one, and the record's claims (for the stack cache). When an equal stack exists, the ids
    /// just interned are given back and the existing record is shared. Fails (changing nothing)
    /// past the frame cap or the per-stack count limit.
    pub fn acquire(
        &mut self,
        strings: &mut Batch<'_>,
        frames: &[NamedFrame<'_>],
    ) -> Result<(Stack, Rc<Claims>)> {
        if frames.len() > MAX_FRAMES_LIMIT {
            return Err(HeapError::TooManyFrames {
                frames: frames.len(),
                limit: MAX_FRAMES_LIMIT,
            });
        }
        self.scratch.clear();
        self.scratch.reserve(frames.len());
        for raw in frames {
            let interned =
                strings
                    .intern(raw.name)
                    .and_then(|name| match strings.intern(raw.filename) {
                        Ok(filename) => Ok((name, filename)),
                        Err(e) => {
                            let _ = strings.unintern(name);
                            Err(e)
                        }
                    });
            match interned {
                Ok((name, filename)) => self.scratch.push(Frame {
                    name,
                    filename,
                    line: raw.line,
                }),
                Err(e) => {
                    release_ids(strings, &self.scratch);
                    return Err(e);
                }
            }
        }

        if let Some((stack, claims)) = self.records.get_key_value(self.scratch.as_slice()) {
            // The existing record already holds its own references; give back ours first, so a
            // count overflow below leaves the storage as it was.
            release_ids(strings, &self.scratch);
            claim(claims, &mut self.dormant)?;
            return Ok((stack.clone(), claims.clone()));
        }
        Ok(self.insert_scratch(None, false))
    }

    /// [`HeapRecords::acquire`] for a source with per-frame keys: frames the frame cache knows
    /// are taken from it, the others named by `source` and added to it; then an equal stack that
    /// is a heap record already is shared (interning nothing), else a new record holds the frame
    /// cache's string group (one count, however deep the stack). `keys` are the kept frames' keys
    /// (from `source.frame_keys`).
    pub fn acquire_cached<S: FrameSource + ?Sized>(
        &mut self,
        strings: &mut Batch<'_>,
        cache: &mut FrameCache,
        keys: &[FrameKey],
        source: &S,
    ) -> Result<(Stack, Rc<Claims>)> {
        if keys.len() + 1 > MAX_FRAMES_LIMIT {
            return Err(HeapError::TooManyFrames {
                frames: keys.len(),
                limit: MAX_FRAMES_LIMIT,
            });
        }
        self.scratch.clear();
        self.scratch.reserve(keys.len() + 1);
        for (i, key) in keys.iter().enumerate() {
            let frame = match cache.get(key) {
                Some(frame) => frame,
                None => source.name_frame(i, &mut |name, filename| {
                    cache.insert(strings, *key, name, filename)
                })?,
            };
            self.scratch.push(frame);
        }
        // The marker's ids are this call's own reference (given back if the stack exists).
        let marker = match source.truncation_marker() {
            Some(marker) => {
                let name = strings.intern(&marker)?;
                self.scratch.push(Frame {
                    name,
                    filename: 0,
                    line: 0,
                });
                Some(name)
            }
            None => None,
        };
        if let Some((stack, claims)) = self.records.get_key_value(self.scratch.as_slice()) {
            if let Some(name) = marker {
                strings.unintern(name)?;
            }
            claim(claims, &mut self.dormant)?;
            return Ok((stack.clone(), claims.clone()));
        }
        // A new record: the cache's group keeps the ids it lent (the marker has its own).
        strings.hold_group(cache.group());
        Ok(self.insert_scratch(Some(cache.group()), marker.is_some()))
    }

    /// Raises by one the count of the record whose `claims` the stack cache kept (live or
    /// dormant), and says whether it could: not once the record was swept away, since a record
    /// given back has given back its string ids, which may since name other strings. One memory
    /// access instead of a lookup; interns nothing, never allocates. Fails (changing nothing) at
    /// the count limit.
    pub fn acquire_claimed(&mut self, claims: &Claims) -> Result<bool> {
        if claims.gone.get() {
            return Ok(false);
        }
        claim(claims, &mut self.dormant)?;
        Ok(true)
    }

    /// Drops one object's claim on `stack`; the last claim makes the record dormant (see the
    /// type's docs), and past [`MAX_DORMANT_STACKS`] dormant records are swept.
    pub fn release(&mut self, strings: &mut Batch<'_>, stack: &Stack) -> Result<()> {
        let live = self.records.get(&**stack).map(|c| (c, c.count.get()));
        let Some((claims, count @ 1..)) = live else {
            return Err(HeapError::Strings(
                "released a stack that has no live heap record".into(),
            ));
        };
        claims.count.set(count - 1);
        if count == 1 {
            self.dormant += 1;
            if self.dormant > MAX_DORMANT_STACKS {
                self.sweep_dormant(strings, false);
            }
            if self.dormant > MAX_DORMANT_STACKS {
                self.sweep_dormant(strings, true);
            }
        }
        Ok(())
    }

    /// Test aid: sets the count of a live recorded stack.
    #[cfg(test)]
    pub(crate) fn set_count_for_test(&self, stack: &[Frame], count: u32) {
        if let Some(c) = self.records.get(stack) {
            c.count.set(count);
        }
    }

    /// Approximate heap bytes held (tables and stacks), for `ObjectSpace.memsize_of`.
    pub fn memsize(&self) -> usize {
        let table = self.records.capacity() * (std::mem::size_of::<(Stack, Rc<Claims>)>() + 1)
            + self.records.len() * std::mem::size_of::<Claims>();
        let stacks: usize = self
            .records
            .keys()
            .map(|s| 16 + std::mem::size_of_val(&**s))
            .sum();
        table + stacks + self.scratch.capacity() * std::mem::size_of::<Frame>()
    }
}

/// Gives back what a swept record holds: its group (and its marker's reference), or a reference
/// per id.
fn give_back(strings: &mut Batch<'_>, stack: &[Frame], claims: &Claims) {
    match claims.group.get() {
        Some(group) => {
            // As in release_ids: a failure here is a storage bug with nothing better to do.
            let _ = strings.release_group(group);
            if claims.marker {
                let _ = strings.unintern(stack.last().map_or(0, |f| f.name));
            }
        }
        None => release_ids(strings, stack),
    }
}

fn release_ids(strings: &mut Batch<'_>, frames: &[Frame]) {
    // Unintern of an id we interned moments ago cannot fail short of a storage bug; there is
    // nothing better to do with such a failure than to carry on giving back the rest.
    let _ = strings.unintern_all(frames.iter().flat_map(|f| [f.name, f.filename]));
}

/// One more object on a heap record (waking it if it was dormant): an error, with the count
/// unchanged, past `u32::MAX`.
fn claim(claims: &Claims, dormant: &mut usize) -> Result<()> {
    let count = claims.count.get();
    let next = count
        .checked_add(1)
        .ok_or(HeapError::TooManyObjectsForStack { count })?;
    claims.count.set(next);
    claims.used.set(true);
    if count == 0 {
        *dormant -= 1;
    }
    Ok(())
}

#[cfg(test)]
#[path = "records_tests.rs"]
mod tests;
