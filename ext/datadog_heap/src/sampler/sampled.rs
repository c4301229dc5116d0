//! What one due sample does in the NEWOBJ hook: capture the stack, name the class, and record
//! it in the core (the stack cache names frames only when it does not know the stack).

use std::time::Instant;

use datadog_heap_core::{HeapError, HeapRecorder, RecordOutcome};
use rb_sys::VALUE;

use super::{CapturedStack, SampleConfig, SamplerState};
use crate::shims;
use crate::stage_costs::{self, Stage};

/// Takes the due sample of `object` into `core`: `Ok(true)` when something waits for a commit
/// (the caller asks for the commit job). `busy` says the allocating thread is inside our own
/// native work, whose allocations are not the program's. An error means the core refused in a
/// way that should disable recording; every other outcome is counted in `state.stats`.
///
/// Runs inside the NEWOBJ hook, GVL held; see the module docs for what it never does.
pub fn sample(
    state: &SamplerState,
    core: &HeapRecorder,
    config: SampleConfig,
    object: VALUE,
    busy: bool,
) -> Result<bool, HeapError> {
    let mut stats = state
        .stats
        .try_borrow_mut()
        .map_err(|_| HeapError::Host("sampler state in use (reentrant hook)".into()))?;
    let weight = state.on_due(&mut stats, config);
    stats.samples_taken += 1;
    if busy {
        stats.skipped_reentrant += 1;
        return Ok(core.has_pending());
    }
    // Hidden objects of ordinary types are sampled: the VM reveals some before the program gets
    // them, and the commit drops those still hidden (see `shims::is_never_the_programs`).
    if shims::is_never_the_programs(object) {
        stats.skipped_internal += 1;
        return Ok(core.has_pending());
    }
    let started = Instant::now();
    let cpu_started = state.budget.start();
    let probe = stage_costs::start(Stage::Sample);
    let mut frames = state
        .frames
        .try_borrow_mut()
        .map_err(|_| HeapError::Host("frame buffer in use (reentrant hook)".into()))?;
    let mut lines = state
        .lines
        .try_borrow_mut()
        .map_err(|_| HeapError::Host("line buffer in use (reentrant hook)".into()))?;
    let capacity = frames.len().min(lines.len());
    let capture = stage_costs::start(Stage::Capture);
    let depth = shims::profile_frames(&mut frames[..capacity], &mut lines[..capacity]);
    capture.end();
    let gc_count = shims::gc_count();
    let captured = CapturedStack {
        frames: &frames[..depth],
        lines: &lines[..depth],
        capacity,
        max_frames: config.max_frames,
        epoch: shims::frame_epoch(core.handle_epoch()),
    };
    let hidden = shims::hidden_class_name(object);
    let class_name = hidden.unwrap_or_else(|| shims::class_name_of(object));
    let record = stage_costs::start(Stage::Record);
    let recorded = core.record_sampled_allocation(
        object as usize,
        weight,
        Some(class_name),
        &captured,
        gc_count,
        hidden.is_some(),
        state.cluster(config.mode),
    );
    record.end();
    let recorded = match recorded {
        Ok(recorded) => recorded,
        Err(e) => {
            stats.hook_errors += 1;
            return Err(e);
        }
    };
    if recorded.outcome == RecordOutcome::Pending {
        stats.samples_recorded += 1;
    } else {
        stats.skipped_by_recorder += 1;
    }
    probe.end();
    let spent = started.elapsed().as_nanos() as u64;
    stats.sampling_ns_total = stats.sampling_ns_total.wrapping_add(spent);
    stats.sampling_ns_max = stats.sampling_ns_max.max(spent);
    state.budget.charge_since(cpu_started);
    state.budget.charge_sample();
    Ok(recorded.needs_commit)
}
