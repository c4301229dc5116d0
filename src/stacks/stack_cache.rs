//! A small cache from a stack's raw identity, as the sampler captures it (the VM's frame handles
//! and line numbers), to the interned [`Stack`] that identity resolved to. A hit spares the
//! sampler naming every frame and interning every name again.
//!
//! What makes a hit trustworthy:
//! - Frame handles are only stable while something keeps them alive and unmoved. This cache
//!   marks nothing itself: the recorder fills a slot only once the key's handles are in its frame
//!   cache (frame_cache.rs), whose distinct handles the binding marks (and so pins) at
//!   every GC, and it empties this cache whenever the frame cache empties. (Marking each slot's
//!   copy of its handles too cost a minor GC of rubocop 0.24 ms more: 512 slots of about a
//!   hundred frames, mostly the same handles.) When a GC could not mark, the binding starts a
//!   new period. The caller says which period a key belongs to (`epoch`); an entry filled in
//!   another period never matches.
//! - The cache holds no reference in the recorder (no heap record count, no string id). An entry
//!   keeps its stack with the record's [`Claims`]: the recorder reuses the stack only while the
//!   claims say its record has not been given back, so its references still keep its string ids
//!   meaning what they meant when the entry was filled. So clearing the cache, or dropping it,
//!   gives back nothing.
//! - A key is compared by its length, salt, epoch and two independent 64-bit hashes of every
//!   handle and line, so a slot keeps no copy of its key: comparing element by element read a
//!   47-frame copy, nine cache lines that a service's allocations evict between two samples (a
//!   micro-benchmark with the caches evicted: 1.7 µs a hit). Two different stacks of one length
//!   would have to agree on both hashes to be confused.
//!
//! Fixed size, two-way set-associative: a key may sit in either slot of its set (two adjacent
//! slots), the one used last first; a new key takes the other one over. (Direct-mapped, 512 slots
//! kept 68–72% of the Rails example's samples as hits, where 4,096 slots kept 85%: most of its
//! misses were keys evicting each other, which a second way avoids without more slots.) The table
//! is built once; filling a slot allocates nothing (the stack is shared). Needs no lock: the
//! recorder's state owns it.

use std::rc::Rc;

use crate::stacks::frame::Stack;
use crate::stacks::handles::{HashedKey, StackHandles};
use crate::stacks::records::Claims;

/// Slots in a recorder's stack cache (a power of two, at least one set of `WAYS`).
pub const STACK_CACHE_SLOTS: usize = 1024;

/// Slots per set.
const WAYS: usize = 2;

/// Longest key kept. Deeper captures are not cached (always named): a recursion that deep
/// rarely repeats exactly, and the frame cache would have to keep every handle of the key.
pub const STACK_CACHE_MAX_KEY_FRAMES: usize = 1024;

#[derive(Default)]
struct Slot {
    hash: u64,
    check: u64,
    salt: u64,
    epoch: u64,
    /// The key's length in frames.
    len: usize,
    /// The stack and its heap record's claims; `None` for an empty slot. With the claims a hit
    /// raises the record's count without looking the stack up among the records (nine cache
    /// lines fewer for a stack of 47 frames, in a service whose allocations evicted them since
    /// the last sample).
    entry: Option<(Stack, Rc<Claims>)>,
}

impl Slot {
    /// Whether the slot holds `key`.
    fn matches(&self, &HashedKey { key, hashes }: &HashedKey<'_>) -> bool {
        let (hash, check) = hashes;
        self.entry.is_some()
            && self.hash == hash
            && self.epoch == key.epoch
            && self.salt == key.salt
            && self.len == key.frames.len()
            && self.check == check
    }
}

pub struct StackCache {
    /// Sets of [`WAYS`] slots, the one used last first.
    slots: Box<[Slot]>,
    /// log2 of the set count: the set is the hash's top bits (its final fold mixes every bit).
    shift: u32,
    enabled: bool,
}

/// An empty cache without a table: it finds and keeps nothing until [`StackCache::reserve`].
impl Default for StackCache {
    fn default() -> Self {
        StackCache {
            slots: Box::default(),
            shift: 64,
            enabled: true,
        }
    }
}

impl StackCache {
    /// A cache of `slots` slots, rounded up to a power of two (at least one set).
    pub fn with_slots(slots: usize) -> Self {
        let mut cache = StackCache::default();
        cache.build(slots);
        cache
    }

    fn build(&mut self, slots: usize) {
        let slots = slots.max(WAYS).next_power_of_two();
        self.slots = (0..slots).map(|_| Slot::default()).collect();
        self.shift = 64 - (slots / WAYS).trailing_zeros();
    }

    /// Builds the table of [`STACK_CACHE_SLOTS`] slots if it is not built yet, so the sampling
    /// path never has to. Called when sampling starts, not from the hook.
    pub fn reserve(&mut self) {
        if self.slots.is_empty() {
            self.build(STACK_CACHE_SLOTS);
        }
    }

    /// The slots of `hash`'s set; `None` while the table is not built.
    fn set(&mut self, hash: u64) -> Option<&mut [Slot]> {
        if self.slots.is_empty() {
            return None;
        }
        // `checked_shr` covers the one-set table (a shift by 64).
        let first = hash.checked_shr(self.shift).unwrap_or(0) as usize * WAYS;
        self.slots.get_mut(first..first + WAYS)
    }

    /// Whether `key` can be cached at all.
    fn accepts(&self, key: &StackHandles<'_>) -> bool {
        self.enabled
            && key.frames.len() == key.lines.len()
            && key.frames.len() <= STACK_CACHE_MAX_KEY_FRAMES
    }

    /// The stack last stored for `key` and its record's claims, if any (the caller still checks
    /// that the record was not given back since); a hit becomes its set's last used. Never
    /// allocates.
    pub fn get(&mut self, key: &HashedKey<'_>) -> Option<(&Stack, &Rc<Claims>)> {
        if !self.accepts(&key.key) {
            return None;
        }
        let set = self.set(key.hashes.0)?;
        let way = set.iter().position(|slot| slot.matches(key))?;
        set[..=way].rotate_right(1);
        set[0].entry.as_ref().map(|(stack, claims)| (stack, claims))
    }

    /// Stores `stack` and its record's `claims` for `key` as its set's last used, in the slot
    /// that held `key` or else the one used longest ago. The caller keeps the key's handles
    /// alive and unmoved for as long as the entry stays (see the module docs). Allocates nothing.
    pub fn insert(&mut self, key: &HashedKey<'_>, stack: &Stack, claims: Rc<Claims>) {
        if !self.accepts(&key.key) {
            return;
        }
        let Some(set) = self.set(key.hashes.0) else {
            return;
        };
        let way = (set.iter().position(|slot| slot.matches(key))).unwrap_or(WAYS - 1);
        set[..=way].rotate_right(1);
        let slot = &mut set[0];
        (slot.hash, slot.check) = key.hashes;
        slot.salt = key.key.salt;
        slot.epoch = key.key.epoch;
        slot.len = key.key.frames.len();
        slot.entry = Some((stack.clone(), claims));
    }

    /// Empties every slot (their buffers are kept for reuse). Gives nothing back to the recorder:
    /// the cache holds no reference there.
    pub fn clear(&mut self) {
        for slot in self.slots.iter_mut() {
            slot.entry = None;
        }
    }

    /// Test switch: a disabled cache finds nothing and keeps nothing.
    pub fn set_enabled(&mut self, enabled: bool) {
        self.enabled = enabled;
        if !enabled {
            self.clear();
        }
    }

    /// Whether lookups can find anything: enabled, with its table built.
    pub fn is_active(&self) -> bool {
        self.enabled && !self.slots.is_empty()
    }

    /// Approximate heap bytes held: the table. The stacks are counted with the heap records
    /// (one that only the cache still points at is freed when its slot is reused or cleared).
    pub fn memsize(&self) -> usize {
        self.slots.len() * std::mem::size_of::<Slot>()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stacks::frame::Frame;
    use crate::stacks::handles::stack_handles;
    use std::sync::Arc;

    fn stack(line: i32) -> Stack {
        Arc::from(
            &[Frame {
                name: 1,
                filename: 2,
                line,
            }][..],
        )
    }

    fn key<'a>(frames: &'a [u64], lines: &'a [i32], epoch: u64) -> HashedKey<'a> {
        stack_handles(frames, lines, epoch).into()
    }

    #[test]
    fn an_unreserved_cache_keeps_nothing() {
        let mut cache = StackCache::default();
        assert!(!cache.is_active());
        cache.insert(&key(&[10], &[1], 0), &stack(1), Rc::default());
        assert!(cache.get(&key(&[10], &[1], 0)).is_none());
        cache.reserve();
        assert!(cache.is_active());
        cache.insert(&key(&[10], &[1], 0), &stack(1), Rc::default());
        assert!(cache.get(&key(&[10], &[1], 0)).is_some());
    }

    #[test]
    fn finds_what_was_stored_for_an_equal_key() {
        let mut cache = StackCache::with_slots(STACK_CACHE_SLOTS);
        let s = stack(1);
        cache.insert(&key(&[10, 20], &[1, 2], 5), &s, Rc::default());
        let (found, _) = cache.get(&key(&[10, 20], &[1, 2], 5)).unwrap();
        assert!(Arc::ptr_eq(found, &s));
    }

    #[test]
    fn another_epoch_line_handle_length_or_salt_misses() {
        let mut cache = StackCache::with_slots(STACK_CACHE_SLOTS);
        cache.insert(&key(&[10, 20], &[1, 2], 5), &stack(1), Rc::default());
        assert!(cache.get(&key(&[10, 20], &[1, 2], 6)).is_none());
        assert!(cache.get(&key(&[10, 20], &[1, 3], 5)).is_none());
        assert!(cache.get(&key(&[10, 21], &[1, 2], 5)).is_none());
        assert!(cache.get(&key(&[10], &[1], 5)).is_none());
        assert!(cache.get(&key(&[10, 20, 30], &[1, 2, 0], 5)).is_none());
        let mut salted = stack_handles(&[10, 20], &[1, 2], 5);
        salted.salt = 399;
        assert!(cache.get(&salted.into()).is_none());
    }

    #[test]
    fn keys_sharing_a_set_are_told_apart_and_the_one_used_longest_ago_goes() {
        // One set: every key lands in it, so only the full comparison can tell them apart.
        let mut cache = StackCache::with_slots(1);
        let (a, b, c) = (stack(1), stack(2), stack(3));
        let (ka, kb, kc) = (
            key(&[10], &[1], 0),
            key(&[11], &[1], 0),
            key(&[12], &[1], 0),
        );
        cache.insert(&ka, &a, Rc::default());
        assert!(cache.get(&kb).is_none());
        cache.insert(&kb, &b, Rc::default());
        assert!(Arc::ptr_eq(cache.get(&kb).unwrap().0, &b));
        // a, used since b, stays when c comes; b goes.
        assert!(Arc::ptr_eq(cache.get(&ka).unwrap().0, &a));
        cache.insert(&kc, &c, Rc::default());
        assert!(cache.get(&kb).is_none(), "evicted");
        assert!(Arc::ptr_eq(cache.get(&ka).unwrap().0, &a));
        assert!(Arc::ptr_eq(cache.get(&kc).unwrap().0, &c));
        // Storing a key again replaces its own slot, never the other one.
        cache.insert(&kc, &b, Rc::default());
        assert!(Arc::ptr_eq(cache.get(&kc).unwrap().0, &b));
        assert!(Arc::ptr_eq(cache.get(&ka).unwrap().0, &a));
    }

    #[test]
    fn clear_and_disable_forget_everything() {
        let mut cache = StackCache::with_slots(STACK_CACHE_SLOTS);
        let s = stack(1);
        cache.insert(&key(&[10], &[1], 0), &s, Rc::default());
        assert_eq!(Arc::strong_count(&s), 2);
        cache.clear();
        assert!(cache.get(&key(&[10], &[1], 0)).is_none());
        assert_eq!(Arc::strong_count(&s), 1, "the cache let go of the stack");
        cache.set_enabled(false);
        cache.insert(&key(&[10], &[1], 0), &s, Rc::default());
        assert!(cache.get(&key(&[10], &[1], 0)).is_none());
        assert_eq!(Arc::strong_count(&s), 1);
        cache.set_enabled(true);
        cache.insert(&key(&[10], &[1], 0), &s, Rc::default());
        assert!(cache.get(&key(&[10], &[1], 0)).is_some());
    }

    #[test]
    fn mismatched_key_lengths_are_never_cached() {
        let mut cache = StackCache::with_slots(STACK_CACHE_SLOTS);
        cache.insert(&key(&[10, 20], &[1], 0), &stack(1), Rc::default());
        assert!(cache.get(&key(&[10, 20], &[1], 0)).is_none());
    }

    #[test]
    fn keys_past_the_length_cap_are_never_cached() {
        let mut cache = StackCache::with_slots(STACK_CACHE_SLOTS);
        let n = STACK_CACHE_MAX_KEY_FRAMES;
        let (frames, lines) = (vec![7u64; n + 1], vec![1i32; n + 1]);
        cache.insert(&key(&frames, &lines, 0), &stack(1), Rc::default());
        assert!(cache.get(&key(&frames, &lines, 0)).is_none());
        cache.insert(&key(&frames[..n], &lines[..n], 0), &stack(1), Rc::default());
        assert!(cache.get(&key(&frames[..n], &lines[..n], 0)).is_some());
    }

    #[test]
    fn many_keys_spread_over_the_slots() {
        let mut cache = StackCache::with_slots(STACK_CACHE_SLOTS);
        let s = stack(1);
        // Handles like VALUEs: 40-byte aligned, so their low bits say little.
        let handles: Vec<u64> = (0..64).map(|i| 0x7f00_0000_0000 + 40 * i).collect();
        for h in &handles {
            cache.insert(&key(std::slice::from_ref(h), &[7], 0), &s, Rc::default());
        }
        let kept = handles
            .iter()
            .filter(|h| cache.get(&key(std::slice::from_ref(*h), &[7], 0)).is_some())
            .count();
        assert!(
            kept >= 60,
            "only {kept} of 64 keys kept in {STACK_CACHE_SLOTS} slots"
        );
    }
}
