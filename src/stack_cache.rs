//! A small cache from a stack's raw identity, as the sampler captures it (the VM's frame handles
//! and line numbers), to the interned [`Stack`] that identity resolved to. A hit spares the
//! sampler naming every frame and interning every name again.
//!
//! What makes a hit trustworthy:
//! - Frame handles are only stable while something keeps them alive and unmoved. This cache
//!   marks nothing itself: the recorder fills a slot only once the key's handles are in its frame
//!   cache (`crate::frame_cache`), whose distinct handles the binding marks (and so pins) at
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

use crate::error::Result;
use crate::frame_cache::FrameKey;
use std::rc::Rc;

use crate::stack::{Claims, Frame, RawFrame, Stack};

/// Slots in a recorder's stack cache (a power of two, at least [`WAYS`]).
pub const STACK_CACHE_SLOTS: usize = 1024;

/// Slots per set.
const WAYS: usize = 2;

/// Longest key kept. Deeper captures are not cached (always named): a recursion that deep
/// rarely repeats exactly, and the frame cache would have to keep every handle of the key.
pub const STACK_CACHE_MAX_KEY_FRAMES: usize = 1024;

/// The raw identity of one captured stack. Equal keys in one epoch must resolve to equal frames.
#[derive(Debug, Clone, Copy)]
pub struct RawStackKey<'a> {
    /// Opaque frame handles, innermost first (VALUEs in the binding).
    pub frames: &'a [u64],
    /// One line number per handle.
    pub lines: &'a [i32],
    /// Whatever else the resolved frames depend on (the binding: `max_frames`).
    pub salt: u64,
    /// The period in which the handles are stable (the binding: [`crate::HeapRecorder::handle_epoch`]).
    pub epoch: u64,
}

impl RawStackKey<'_> {
    /// The key's two independent 64-bit hashes, `(slot, check)`, in one pass over its frames:
    /// the first picks the set, the second must agree too before a slot matches.
    ///
    /// Each hash runs four lanes, frame `i` going to lane `i % 4`, so the processor works on
    /// eight independent multiplications at a time instead of waiting on one chain (on a Rails
    /// stack of 120 frames: about 120 ns, where two single-chain passes took about 490). A step
    /// is a folded 64×64→128-bit multiplication of the lane (xored with the handle) by the line
    /// (xored with a constant), so handle and line each reach every bit of the lane. The lanes
    /// start from the salt and the length, each from its own constant, and are folded together in
    /// order at the end.
    fn hashes(&self) -> (u64, u64) {
        const SLOT: [u64; 4] = [
            0x243f_6a88_85a3_08d3,
            0x1319_8a2e_0370_7344,
            0xa409_3822_299f_31d0,
            0x082e_fa98_ec4e_6c89,
        ];
        const CHECK: [u64; 4] = [
            0x4528_21e6_38d0_1377,
            0xbe54_66cf_34e9_0c6c,
            0xc0ac_29b7_c97c_50dd,
            0x3f84_d5b5_b547_0917,
        ];
        const LINE_SLOT: u64 = 0x9216_d5d9_8979_fb1b;
        const LINE_CHECK: u64 = 0xd131_0ba6_98df_b5ac;
        let fold = |x: u64, y: u64| {
            let p = u128::from(x).wrapping_mul(u128::from(y));
            (p as u64) ^ ((p >> 64) as u64)
        };
        let seed = self.salt ^ (self.frames.len() as u64).rotate_left(32);
        let mut slot = SLOT.map(|c| c ^ seed);
        let mut check = CHECK.map(|c| c ^ seed.rotate_left(29));
        let n = self.frames.len().min(self.lines.len());
        let (frames, lines) = (&self.frames[..n], &self.lines[..n]);
        let mut step = |lane: usize, frame: u64, line: i32| {
            let line = u64::from(line as u32);
            slot[lane] = fold(slot[lane] ^ frame, line ^ LINE_SLOT);
            check[lane] = fold(check[lane] ^ frame, line ^ LINE_CHECK);
        };
        let (frame_quads, line_quads) = (frames.chunks_exact(4), lines.chunks_exact(4));
        let tail = frame_quads.remainder().iter().zip(line_quads.remainder());
        for (f, l) in frame_quads.zip(line_quads) {
            for lane in 0..4 {
                step(lane, f[lane], l[lane]);
            }
        }
        for (lane, (&f, &l)) in tail.enumerate() {
            step(lane, f, l);
        }
        let finish = |lanes: [u64; 4], k: u64| {
            lanes
                .iter()
                .fold(k, |h, &lane| fold(h ^ lane, k.rotate_left(17) | 1))
        };
        (finish(slot, LINE_CHECK), finish(check, LINE_SLOT))
    }
}

/// A key with its [`RawStackKey::hashes`], computed once for a lookup and for the insert that
/// follows a miss.
#[derive(Debug, Clone, Copy)]
pub struct HashedKey<'a> {
    pub key: RawStackKey<'a>,
    hashes: (u64, u64),
}

impl<'a> From<RawStackKey<'a>> for HashedKey<'a> {
    fn from(key: RawStackKey<'a>) -> Self {
        HashedKey {
            key,
            hashes: key.hashes(),
        }
    }
}

/// Where a recording's frames come from: a raw key for the stack cache, when the caller has one,
/// and the named frames, which are only asked for when the cache cannot answer.
pub trait FrameSource {
    /// The stack's raw identity; `None` when it has none worth caching.
    fn key(&self) -> Option<RawStackKey<'_>>;

    /// Names the frames and calls `f` with them, returning what `f` returns. The frames may
    /// borrow from memory that only lives as long as this call.
    fn with_frames(&self, f: &mut dyn FnMut(&[RawFrame<'_>]) -> Result<Stack>) -> Result<Stack>;

    /// Per-frame identities for the frame cache (`crate::frame_cache`): fills `out` with one key
    /// per kept frame, innermost first, and returns their epoch; `None` (the default) when the
    /// source has none, and then `with_frames` names the stack.
    fn frame_keys(&self, _out: &mut Vec<FrameKey>) -> Option<u64> {
        None
    }

    /// Names kept frame `i` (in `frame_keys`' order) and calls `f` with its name and file.
    fn name_frame(
        &self,
        _i: usize,
        f: &mut dyn FnMut(&str, &str) -> Result<Frame>,
    ) -> Result<Frame> {
        f("", "")
    }

    /// The name of the frame that stands for the frames cut off past `max_frames`, if any.
    fn truncation_marker(&self) -> Option<String> {
        None
    }
}

/// Frames already named (`record_allocation` from Ruby, the tests): nothing to cache.
impl FrameSource for [RawFrame<'_>] {
    fn key(&self) -> Option<RawStackKey<'_>> {
        None
    }

    fn with_frames(&self, f: &mut dyn FnMut(&[RawFrame<'_>]) -> Result<Stack>) -> Result<Stack> {
        f(self)
    }
}

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
    fn accepts(&self, key: &RawStackKey<'_>) -> bool {
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
    use crate::stack::Frame;
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

    fn raw_key<'a>(frames: &'a [u64], lines: &'a [i32], epoch: u64) -> RawStackKey<'a> {
        RawStackKey {
            frames,
            lines,
            salt: 400,
            epoch,
        }
    }

    fn key<'a>(frames: &'a [u64], lines: &'a [i32], epoch: u64) -> HashedKey<'a> {
        raw_key(frames, lines, epoch).into()
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
        let mut salted = raw_key(&[10, 20], &[1, 2], 5);
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

    #[test]
    fn near_identical_stacks_differ_in_both_hashes() {
        // A Rails-deep stack and every small change a program makes to one: a line moved, a
        // handle changed, two frames swapped (in one lane or across lanes), a frame gone, or a
        // handle and a line trading bits. Each must differ from all the others in each hash.
        let frames: Vec<u64> = (0..120)
            .map(|i| 0x7f3a_0000_0000 + 40 * (i * 7 % 120))
            .collect();
        let lines: Vec<i32> = (0..120).map(|i| 10 + 3 * i).collect();
        let mut variants = vec![(frames.clone(), lines.clone())];
        for i in 0..120 {
            let mut l = lines.clone();
            l[i] += 1;
            variants.push((frames.clone(), l));
            let mut f = frames.clone();
            f[i] += 40;
            variants.push((f, lines.clone()));
            let mut f = frames.clone();
            f[i] ^= 1 << 48;
            let mut l = lines.clone();
            l[i] ^= 1;
            variants.push((f, l));
            for apart in [1, 4] {
                if i + apart < 120 {
                    let (mut f, mut l) = (frames.clone(), lines.clone());
                    f.swap(i, i + apart);
                    l.swap(i, i + apart);
                    variants.push((f, l));
                }
            }
            variants.push((frames[..i].to_vec(), lines[..i].to_vec()));
        }
        let mut slots = std::collections::HashSet::new();
        let mut checks = std::collections::HashSet::new();
        for (f, l) in &variants {
            let (slot, check) = raw_key(f, l, 0).hashes();
            assert!(slots.insert(slot), "slot hash repeated");
            assert!(checks.insert(check), "check hash repeated");
        }
        assert_eq!(slots.len(), variants.len());
    }
}
