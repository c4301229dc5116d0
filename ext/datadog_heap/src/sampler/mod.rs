//! The built-in allocation sampler's per-session state and the sampled path of the NEWOBJ hook:
//! when to sample (a geometric countdown), and what one sample does (capture the stack, name it
//! only if the stack cache does not know it, record it in the core).
//!
//! Nothing here knows about sessions, hooks or jobs (that is `runtime`); everything here runs
//! inside the NEWOBJ hook or next to it and keeps its rules: it never allocates a Ruby object,
//! never raises, never calls a Ruby method, never releases the GVL and never reaches `xmalloc`.
//! Rust allocations (system allocator) happen only on the sampled path.

mod capture;
mod frame_names;

use std::cell::{Cell, RefCell};
use std::time::Instant;

use datadog_heap_core::{HeapError, HeapRecorder, RecordOutcome, MAX_FRAMES_LIMIT};
use rb_sys::VALUE;

use crate::shims;
use capture::CapturedStack;
pub use frame_names::frame_name;

/// When and how one session samples.
pub struct SamplerState {
    /// Allocations left before the next sample.
    countdown: Cell<u64>,
    /// The interval `countdown` started from: added to `allocations_seen` when it runs out.
    interval: Cell<u64>,
    rng: Cell<u64>,
    /// Frame buffers for rb_profile_frames, sized when sampling starts (never in the hook).
    frames: RefCell<Vec<VALUE>>,
    lines: RefCell<Vec<i32>>,
    pub stats: RefCell<SamplerStats>,
}

#[derive(Default, Clone, Copy)]
pub struct SamplerStats {
    pub allocations_seen: u64,
    pub samples_taken: u64,
    pub samples_recorded: u64,
    pub skipped_internal: u64,
    pub skipped_reentrant: u64,
    pub skipped_by_recorder: u64,
    pub hook_errors: u64,
    pub sampling_ns_total: u64,
    pub sampling_ns_max: u64,
}

/// What a sample needs from its session's options.
#[derive(Clone, Copy)]
pub struct SampleConfig {
    pub sample_every: u64,
    pub max_frames: usize,
}

impl Default for SamplerState {
    fn default() -> Self {
        SamplerState {
            countdown: Cell::new(1),
            interval: Cell::new(1),
            rng: Cell::new(seed()),
            frames: RefCell::new(Vec::new()),
            lines: RefCell::new(Vec::new()),
            stats: RefCell::new(SamplerStats::default()),
        }
    }
}

impl SamplerState {
    /// Gets ready to sample: frame buffers and the first interval. Needs no GVL; allocates
    /// (Rust allocator), so never call it from the hook.
    pub fn prepare(&self, every: u64) {
        self.frames.borrow_mut().resize(MAX_FRAMES_LIMIT, 0);
        self.lines.borrow_mut().resize(MAX_FRAMES_LIMIT, 0);
        self.draw_interval(every);
    }

    /// For a forked child: a fresh random stream (parent and child must not sample the same
    /// allocations) and counters from zero.
    pub fn after_fork(&self) {
        self.rng.set(seed());
        if let Ok(mut stats) = self.stats.try_borrow_mut() {
            *stats = SamplerStats::default();
        }
    }

    /// Test aid: a fixed seed, so estimates cannot flake.
    pub fn set_seed(&self, seed: u64) {
        self.rng.set(seed | 1);
    }

    /// One allocation went by: true when it is the one to sample. The hook's only work on an
    /// allocation that is not sampled. Wrapping, so it cannot panic whatever state a caught
    /// panic left behind.
    #[inline]
    pub fn tick(&self) -> bool {
        let left = self.countdown.get().wrapping_sub(1);
        self.countdown.set(left);
        left == 0
    }

    /// Lets the next allocation take the sample instead (more sessions were due at once than
    /// one hook call serves).
    pub fn postpone(&self) {
        self.countdown.set(1);
    }

    fn next_random(&self) -> u64 {
        // xorshift64*: small, fast, good enough to place sampling points.
        let mut x = self.rng.get();
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.rng.set(x);
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// Draws the allocations until the next sample: geometric with mean `every`, so periodic
    /// allocation patterns cannot line up with the sampling points.
    fn draw_interval(&self, every: u64) {
        let interval = if every <= 1 {
            1
        } else {
            // u in (0, 1]; P(interval = k) = p (1-p)^(k-1) with p = 1/every.
            let u = ((self.next_random() >> 11) as f64 + 1.0) / (1u64 << 53) as f64;
            let p = 1.0 / every as f64;
            let k = (u.ln() / (1.0 - p).ln()).floor() + 1.0;
            if k.is_finite() && k >= 1.0 {
                k.min(u64::MAX as f64 / 2.0) as u64
            } else {
                1
            }
        };
        self.countdown.set(interval);
        self.interval.set(interval);
    }

    /// The countdown ran out: counts the allocations it covered and draws the next interval.
    /// Call before deciding whether to take the sample, so skipped samples are counted too.
    pub fn on_due(&self, every: u64) {
        if let Ok(mut stats) = self.stats.try_borrow_mut() {
            stats.allocations_seen = stats.allocations_seen.wrapping_add(self.interval.get());
        }
        self.draw_interval(every);
    }
}

/// A seed from the clock and the pid (so a forked child differs from its parent).
fn seed() -> u64 {
    let t = Instant::now().elapsed().as_nanos() as u64;
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0);
    (now ^ t ^ (u64::from(std::process::id()) << 32)).wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1
}

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
    stats.samples_taken += 1;
    if busy {
        stats.skipped_reentrant += 1;
        return Ok(core.has_pending());
    }
    if shims::is_internal_object(object) {
        stats.skipped_internal += 1;
        return Ok(core.has_pending());
    }
    let started = Instant::now();
    let mut frames = state
        .frames
        .try_borrow_mut()
        .map_err(|_| HeapError::Host("frame buffer in use (reentrant hook)".into()))?;
    let mut lines = state
        .lines
        .try_borrow_mut()
        .map_err(|_| HeapError::Host("line buffer in use (reentrant hook)".into()))?;
    let capacity = frames.len().min(lines.len());
    let depth = shims::profile_frames(&mut frames[..capacity], &mut lines[..capacity]);
    let gc_count = shims::gc_count();
    let captured = CapturedStack {
        frames: &frames[..depth],
        lines: &lines[..depth],
        capacity,
        max_frames: config.max_frames,
        gc_count,
    };
    let class_name = capture::class_name_of(object);
    let recorded = core.record_allocation_from(
        object as usize,
        config.sample_every,
        Some(class_name),
        &captured,
        gc_count,
    );
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
    let spent = started.elapsed().as_nanos() as u64;
    stats.sampling_ns_total = stats.sampling_ns_total.wrapping_add(spent);
    stats.sampling_ns_max = stats.sampling_ns_max.max(spent);
    Ok(recorded.needs_commit)
}
