//! Stacks and heap records: each distinct allocation stack is kept once, with the number of
//! tracked objects (pending or committed) that were allocated there.

use std::cell::Cell;
use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hash, Hasher};
use std::sync::Arc;

use rustc_hash::FxHasher;

use crate::error::{HeapError, Result, MAX_FRAMES_LIMIT};
use crate::frame_cache::{FrameCache, FrameKey};
use crate::stack_cache::FrameSource;
use crate::strings::{Batch, StringId};

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

/// A frame as the caller hands it in, before interning.
#[derive(Debug, Clone, Copy)]
pub struct RawFrame<'a> {
    pub name: &'a str,
    pub filename: &'a str,
    pub line: i32,
}

/// A deduplicated stack, innermost frame first. Cheap to clone; immutable once built, so a
/// snapshot can hand clones to a thread that does not hold the GVL.
pub type Stack = Arc<[Frame]>;

type FxMap<K, V> = HashMap<K, V, BuildHasherDefault<FxHasher>>;

/// The set of heap records: stack -> number of tracked objects pointing at it.
#[derive(Default)]
pub struct HeapRecords {
    /// A `Cell` so that `acquire_existing` can raise a count in the same lookup that finds the
    /// record's key.
    records: FxMap<Stack, Cell<u32>>,
    /// Scratch buffer reused by every `acquire`, so a lookup of an existing stack allocates nothing.
    scratch: Vec<Frame>,
}

impl HeapRecords {
    pub fn len(&self) -> usize {
        self.records.len()
    }

    pub fn is_empty(&self) -> bool {
        self.records.is_empty()
    }

    /// Number of objects that point at `stack` (0 when it is not recorded).
    pub fn count(&self, stack: &[Frame]) -> u32 {
        self.records.get(stack).map_or(0, Cell::get)
    }

    pub fn iter(&self) -> impl Iterator<Item = (&Stack, u32)> {
        self.records.iter().map(|(s, c)| (s, c.get()))
    }

    /// Interns `frames` in one batch and returns the heap record for them with its count raised
    /// by one. When an equal stack exists, the ids just interned are given back and the existing
    /// record is shared. Fails (changing nothing) past the frame cap or the per-stack count limit.
    pub fn acquire(&mut self, strings: &mut Batch<'_>, frames: &[RawFrame<'_>]) -> Result<Stack> {
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

        if let Some((stack, count)) = self.records.get_key_value(self.scratch.as_slice()) {
            // The existing record already holds its own references; give back ours first, so a
            // count overflow below leaves the storage as it was.
            release_ids(strings, &self.scratch);
            add_object(count)?;
            return Ok(stack.clone());
        }

        let stack: Stack = Arc::from(self.scratch.as_slice());
        self.records.insert(stack.clone(), Cell::new(1));
        Ok(stack)
    }

    /// [`HeapRecords::acquire`] for a source with per-frame keys: frames the frame cache knows
    /// are taken from it, the others named by `source` and added to it; then an equal stack that
    /// is a heap record already is shared (interning nothing), else a new record takes its own
    /// references on the ids. `keys` are the kept frames' keys (from `source.frame_keys`).
    pub fn acquire_cached<S: FrameSource + ?Sized>(
        &mut self,
        strings: &mut Batch<'_>,
        cache: &mut FrameCache,
        keys: &[FrameKey],
        source: &S,
    ) -> Result<Stack> {
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
        if let Some((stack, count)) = self.records.get_key_value(self.scratch.as_slice()) {
            if let Some(name) = marker {
                strings.unintern(name)?;
            }
            add_object(count)?;
            return Ok(stack.clone());
        }
        // A new record: its own reference on each id the cache lent (the marker has one).
        let lent = self.scratch.len() - usize::from(marker.is_some());
        for (i, frame) in self.scratch[..lent].iter().enumerate() {
            let added =
                strings
                    .add_ref(frame.name)
                    .and_then(|()| match strings.add_ref(frame.filename) {
                        Ok(()) => Ok(()),
                        Err(e) => {
                            let _ = strings.unintern(frame.name);
                            Err(e)
                        }
                    });
            if let Err(e) = added {
                release_ids(strings, &self.scratch[..i]);
                if let Some(name) = marker {
                    let _ = strings.unintern(name);
                }
                return Err(e);
            }
        }
        let stack: Stack = Arc::from(self.scratch.as_slice());
        self.records.insert(stack.clone(), Cell::new(1));
        Ok(stack)
    }

    /// Raises by one the count of `stack` if that very stack (not merely an equal one) is still a
    /// heap record, and says whether it was. A stack that stopped being a record may have given
    /// back its string ids, which may since name other strings, so only the live original is
    /// trusted. Interns nothing; never allocates. Fails (changing nothing) at the count limit.
    pub fn acquire_existing(&mut self, stack: &Stack) -> Result<bool> {
        // One lookup: the count is a Cell, so it can be raised through the shared borrow that
        // also hands out the record's own Arc to compare with.
        let Some((record, count)) = self.records.get_key_value(&**stack) else {
            return Ok(false);
        };
        if !Arc::ptr_eq(record, stack) {
            return Ok(false);
        }
        let next = count
            .get()
            .checked_add(1)
            .ok_or(HeapError::TooManyObjectsForStack { count: count.get() })?;
        count.set(next);
        Ok(true)
    }

    /// Drops one object's claim on `stack`; the last claim removes the record and gives back all
    /// of its string ids.
    pub fn release(&mut self, strings: &mut Batch<'_>, stack: &Stack) -> Result<()> {
        let Some(count) = self.records.get_mut(&**stack) else {
            return Err(HeapError::Strings(
                "released a stack that has no heap record".into(),
            ));
        };
        let left = count.get() - 1;
        count.set(left);
        if left == 0 {
            self.records.remove(&**stack);
            release_ids(strings, stack);
        }
        Ok(())
    }

    /// Test aid: sets the count of a recorded stack.
    #[cfg(test)]
    pub(crate) fn set_count_for_test(&self, stack: &[Frame], count: u32) {
        if let Some(c) = self.records.get(stack) {
            c.set(count);
        }
    }

    /// Approximate heap bytes held (tables and stacks), for `ObjectSpace.memsize_of`.
    pub fn memsize(&self) -> usize {
        let table = self.records.capacity() * (std::mem::size_of::<(Stack, Cell<u32>)>() + 1);
        let stacks: usize = self
            .records
            .keys()
            .map(|s| 16 + std::mem::size_of_val(&**s))
            .sum();
        table + stacks + self.scratch.capacity() * std::mem::size_of::<Frame>()
    }
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

fn release_ids(strings: &mut Batch<'_>, frames: &[Frame]) {
    // Unintern of an id we interned moments ago cannot fail short of a storage bug; there is
    // nothing better to do with such a failure than to carry on giving back the rest.
    let _ = strings.unintern_all(frames.iter().flat_map(|f| [f.name, f.filename]));
}

/// One more object on a heap record: an error, with the count unchanged, past `u32::MAX`.
fn add_object(count: &Cell<u32>) -> Result<()> {
    let next = count
        .get()
        .checked_add(1)
        .ok_or(HeapError::TooManyObjectsForStack { count: count.get() })?;
    count.set(next);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::strings::Strings;

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

    fn raw(frames: &[(&'static str, &'static str, i32)]) -> Vec<RawFrame<'static>> {
        frames
            .iter()
            .map(|&(name, filename, line)| RawFrame {
                name,
                filename,
                line,
            })
            .collect()
    }

    #[test]
    fn equal_stacks_share_one_record() {
        let strings = Strings::new();
        let mut b = strings.lock().unwrap();
        let mut records = HeapRecords::default();
        let frames = raw(&[("a", "x.rb", 1), ("b", "y.rb", 2)]);
        let s1 = records.acquire(&mut b, &frames).unwrap();
        let s2 = records.acquire(&mut b, &frames).unwrap();
        assert!(Arc::ptr_eq(&s1, &s2));
        assert_eq!(records.len(), 1);
        assert_eq!(records.count(&s1), 2);
    }

    #[test]
    fn different_lines_are_different_stacks() {
        let strings = Strings::new();
        let mut b = strings.lock().unwrap();
        let mut records = HeapRecords::default();
        records.acquire(&mut b, &raw(&[("a", "x.rb", 1)])).unwrap();
        records.acquire(&mut b, &raw(&[("a", "x.rb", 2)])).unwrap();
        assert_eq!(records.len(), 2);
    }

    #[test]
    fn last_release_removes_record_and_strings() {
        let strings = Strings::new();
        let mut b = strings.lock().unwrap();
        let mut records = HeapRecords::default();
        let frames = raw(&[("only_here", "only_here.rb", 1)]);
        let s = records.acquire(&mut b, &frames).unwrap();
        records.acquire(&mut b, &frames).unwrap();
        records.release(&mut b, &s).unwrap();
        assert_eq!(b.get(s[0].name).unwrap(), "only_here");
        records.release(&mut b, &s).unwrap();
        assert!(records.is_empty());
        assert!(b.get(s[0].name).is_err());
        assert!(b.get(s[0].filename).is_err());
        assert!(records.release(&mut b, &s).is_err());
    }

    #[test]
    fn frame_cap_is_3000() {
        let strings = Strings::new();
        let mut b = strings.lock().unwrap();
        let mut records = HeapRecords::default();
        let frames = vec![
            RawFrame {
                name: "f",
                filename: "f.rb",
                line: 1
            };
            3001
        ];
        let err = records.acquire(&mut b, &frames).unwrap_err();
        assert_eq!(
            err,
            HeapError::TooManyFrames {
                frames: 3001,
                limit: 3000
            }
        );
        assert!(err.to_string().contains("3001"));
        assert!(records.acquire(&mut b, &frames[..3000]).is_ok());
    }

    #[test]
    fn count_overflow_is_an_error_and_changes_nothing() {
        let strings = Strings::new();
        let mut b = strings.lock().unwrap();
        let mut records = HeapRecords::default();
        let frames = raw(&[("a", "x.rb", 1)]);
        let s = records.acquire(&mut b, &frames).unwrap();
        records.records[&*s].set(u32::MAX);
        let err = records.acquire(&mut b, &frames).unwrap_err();
        assert!(matches!(err, HeapError::TooManyObjectsForStack { .. }));
        assert_eq!(records.count(&s), u32::MAX);
    }
}
