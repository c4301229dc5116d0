//! Recording: a sampled allocation's stack made into (or found among) the heap records, and the
//! recording queued for the next commit. Reached from the NEWOBJ hook: see each function's
//! contract.

use super::caches::Caches;
use super::{
    HeapRecorder, LiveObjectData, PendingRecording, RecordOutcome, Recorded, State,
    MAX_PENDING_RECORDINGS,
};
use crate::error::{HeapError, Result, FIXNUM_MAX};
use crate::stacks::{FrameCache, FrameSource, HashedKey, NamedFrame, Stack, StackCache};
use crate::strings::Batch;
use crate::vm::ObjectRef;

/// The heap record for `source`'s stack with its count raised by one. A cache hit raises the
/// count of the cached stack's record (live or dormant), interning nothing; a miss (or a cached
/// stack whose record was given back) names the frames the frame cache does not know, acquires
/// the stack, and caches the result.
fn acquire_stack<S: FrameSource + ?Sized>(
    state: &mut State,
    caches: &mut Caches,
    strings: &mut Batch<'_>,
    source: &S,
) -> Result<Stack> {
    let State {
        heap_records,
        lifetime,
        ..
    } = state;
    let Caches { stacks, frames, .. } = caches;
    // Hashed once, for the lookup and for the insert after a miss.
    let key = source
        .key()
        .filter(|_| stacks.is_active())
        .map(HashedKey::from);
    if let Some(key) = &key {
        if let Some((stack, claims)) = stacks.get(key) {
            if heap_records.acquire_claimed(claims)? {
                lifetime.stack_cache_hits += 1;
                return Ok(stack.clone());
            }
        }
        lifetime.stack_cache_misses += 1;
    }
    let mut keys = std::mem::take(&mut frames.keys);
    let epoch = match stacks.is_active() {
        true => source.frame_keys(&mut keys),
        false => None,
    };
    // The record's claims, for the stack cache (a named stack's come out of the naming call).
    let mut named_claims = None;
    let acquired = match epoch {
        Some(epoch) => enter_frame_cache(frames, stacks, strings, epoch)
            .and_then(|()| heap_records.acquire_cached(strings, frames, &keys, source))
            .map(|(stack, claims)| (stack, Some(claims))),
        None => source
            .with_frames(&mut |named| {
                let (stack, claims) = heap_records.acquire(strings, named)?;
                named_claims = Some(claims);
                Ok(stack)
            })
            .map(|stack| (stack, named_claims.take())),
    };
    keys.clear();
    frames.keys = keys;
    let (stack, claims) = acquired?;
    if let (Some(key), Some(claims)) = (&key, claims) {
        if epoch.is_none() {
            enter_frame_cache(frames, stacks, strings, key.key.epoch)?;
            frames.hold(key.key.frames);
        }
        stacks.insert(key, &stack, claims);
    }
    Ok(stack)
}

/// Makes the frame cache serve `epoch`, emptying the stack cache when it empties the frame
/// cache: the stack cache marks none of its keys' handles, the frame cache keeps them (see
/// stacks/stack_cache.rs).
fn enter_frame_cache(
    frames: &mut FrameCache,
    stacks: &mut StackCache,
    strings: &mut Batch<'_>,
    epoch: u64,
) -> Result<()> {
    if frames.enter(strings, epoch)? {
        stacks.clear();
    }
    Ok(())
}

impl HeapRecorder {
    /// Records one sampled allocation: it becomes pending until a commit puts it in the liveness
    /// table. `alloc_gen` is the current GC count.
    ///
    /// Called from the NEWOBJ hook: needs the GVL, never loses it, never calls the VM, allocates
    /// only through Rust's allocator (and not at all when the stack is already known), and never
    /// waits for a lock. Everything that can fail happens before the push, so an error leaves no
    /// half-built entry and no string reference behind.
    pub fn record_allocation(
        &self,
        object: ObjectRef,
        weight: u64,
        class_name: Option<&str>,
        frames: &[NamedFrame<'_>],
        alloc_gen: u64,
    ) -> Result<Recorded> {
        self.record_allocation_from(object, weight, class_name, frames, alloc_gen)
    }

    /// [`HeapRecorder::record_allocation`] with frames that are named only when needed: when
    /// `source` has a raw key and the stack cache knows it (and its stack is still a heap record),
    /// the recording shares that stack without naming or interning anything, allocating nothing.
    /// Same contract otherwise.
    pub fn record_allocation_from<S: FrameSource + ?Sized>(
        &self,
        object: ObjectRef,
        weight: u64,
        class_name: Option<&str>,
        source: &S,
        alloc_gen: u64,
    ) -> Result<Recorded> {
        self.record_sampled_allocation(object, weight, class_name, source, alloc_gen, false, 0)
    }

    /// [`HeapRecorder::record_allocation_from`], saying whether the VM allocated the object
    /// hidden (with no class). CRuby makes some of the program's objects that way and gives them
    /// their class before the program sees them (String#encode's result); others stay the VM's
    /// own. The commit keeps a recording made `hidden_at_birth` only if the object is no longer
    /// hidden then ([`Vm::is_hidden`]); otherwise it drops it, counted in
    /// `recordings_dropped_hidden`. `cluster`: see [`LiveObjectData::cluster`].
    #[allow(clippy::too_many_arguments)]
    pub fn record_sampled_allocation<S: FrameSource + ?Sized>(
        &self,
        object: ObjectRef,
        weight: u64,
        class_name: Option<&str>,
        source: &S,
        alloc_gen: u64,
        hidden_at_birth: bool,
        cluster: u64,
    ) -> Result<Recorded> {
        let mut state = self.state()?;
        let mut pending = self.pending()?;
        state.lifetime.recordings_attempted += 1;
        let result = self.record_locked_state(
            &mut state,
            &mut pending,
            object,
            weight,
            class_name,
            source,
            alloc_gen,
            (hidden_at_birth, cluster),
        );
        if result.is_err() {
            state.lifetime.recordings_failed += 1;
        }
        result
    }

    #[allow(clippy::too_many_arguments)]
    fn record_locked_state<S: FrameSource + ?Sized>(
        &self,
        state: &mut State,
        pending: &mut Vec<PendingRecording>,
        object: ObjectRef,
        weight: u64,
        class_name: Option<&str>,
        source: &S,
        alloc_gen: u64,
        (hidden_at_birth, cluster): (bool, u64),
    ) -> Result<Recorded> {
        // Anything pending asks for a commit, even when this allocation is skipped: a commit that
        // was asked for earlier may not have run yet.
        let needs_commit = !pending.is_empty();
        let skipped = |_: &mut State, outcome| {
            Ok(Recorded {
                outcome,
                needs_commit,
            })
        };

        if state.next_record_id >= FIXNUM_MAX {
            return Err(HeapError::RecordIdsExhausted { max: FIXNUM_MAX });
        }
        state.since_last_kept += 1;
        if state.since_last_kept < state.options.sample_rate {
            state.lifetime.recordings_skipped_sample_rate += 1;
            return skipped(state, RecordOutcome::SkippedSampleRate);
        }
        if state.thinning > 1 && state.next_random() % state.thinning != 0 {
            // This one stood for `sample_rate` recordings; the next one kept stands for it.
            state.since_last_kept = 0;
            state.lifetime.recordings_skipped_thinned += 1;
            return skipped(state, RecordOutcome::SkippedThinned);
        }
        if self.lock.is_held() {
            // A commit or update is mid-way (maybe suspended in another thread): touching what it
            // works on is not safe, so this one is dropped, and counted.
            state.lifetime.recordings_skipped_locked += 1;
            return skipped(state, RecordOutcome::SkippedLocked);
        }
        if pending.len() >= MAX_PENDING_RECORDINGS {
            state.lifetime.deferred_recordings_skipped_buffer_full += 1;
            return skipped(state, RecordOutcome::SkippedBufferFull);
        }
        if state.object_records.len() + pending.len() >= state.options.max_tracked_objects {
            state.lifetime.recordings_skipped_max_tracked += 1;
            return skipped(state, RecordOutcome::SkippedMaxTracked);
        }
        // Nothing holds the storage across a VM call or off the GVL, so it is free whenever the
        // VM allocates; finding it held is a bug, reported rather than waited on.
        let mut strings = self.strings.try_lock().ok_or_else(|| {
            HeapError::Host("the string storage is held during an allocation".into())
        })?;
        state.since_last_kept = 0;

        let weight = weight
            .checked_mul(u64::from(state.options.sample_rate))
            .and_then(|w| w.checked_mul(state.thinning))
            .ok_or(HeapError::WeightOverflow {
                weight,
                sample_rate: state.options.sample_rate,
            })?;
        let mut caches = self.caches()?;
        caches.refresh(&mut strings, self.handle_epoch())?;
        let class = caches.intern_class(&mut strings, class_name.unwrap_or(""))?;
        let stack = match acquire_stack(state, &mut caches, &mut strings, source) {
            Ok(acquired) => acquired,
            Err(e) => {
                let _ = strings.unintern(class);
                return Err(e);
            }
        };
        // The id is taken last: nothing can fail after this point.
        state.next_record_id += 1;
        let record_id = state.next_record_id;
        state.class_refs += u64::from(class != 0);
        pending.push(PendingRecording {
            object,
            record_id,
            stack,
            data: LiveObjectData {
                weight,
                class,
                alloc_gen,
                size: 0,
                gen_age: 0,
                frozen: false,
                size_final: false,
                cluster,
            },
            hidden_at_birth,
        });
        Ok(Recorded {
            outcome: RecordOutcome::Pending,
            needs_commit: true,
        })
    }
}
