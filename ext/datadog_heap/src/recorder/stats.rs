//! `Recorder#stats`: the core's counters, then the sampler's, the overhead budget's and the
//! session's, as one Hash.

use datadog_heap_core::StatValue;
use magnus::{Error, IntoValue, RHash, Ruby, Value};

use crate::errors::OrRaise;
use crate::runtime::Session;

/// One of the core's stat values as Ruby sees it: an Integer count or a Float ratio.
pub(crate) fn stat_value(ruby: &Ruby, value: StatValue) -> Value {
    match value {
        StatValue::Count(c) => c.into_value_with(ruby),
        StatValue::Ratio(r) => r.into_value_with(ruby),
    }
}

/// `stats`: the core's counters (the reference's keys first), then the sampler's and the
/// session's.
pub(super) fn stats_hash(ruby: &Ruby, session: &Session) -> Result<RHash, Error> {
    let stats = session.core.stats().or_raise(ruby)?;
    let hash = ruby.hash_new();
    for (key, value) in stats.entries() {
        hash.aset(ruby.to_symbol(key), stat_value(ruby, value))?;
    }
    hash.aset(ruby.to_symbol("last_commit_error"), session.job_error())?;
    hash.aset(ruby.to_symbol("lifetime_job_errors"), session.job_errors())?;
    let map = session.weak_map(ruby)?;
    hash.aset(
        ruby.to_symbol("weak_map_size"),
        crate::weak_map::size(ruby, map)?,
    )?;
    let st = *session.sampler.stats.borrow();
    for (key, value) in [
        ("sampler_allocations_seen", st.allocations_seen),
        ("sampler_samples_taken", st.samples_taken),
        ("sampler_samples_recorded", st.samples_recorded),
        ("sampler_skipped_internal", st.skipped_internal),
        ("sampler_skipped_reentrant", st.skipped_reentrant),
        ("sampler_skipped_by_recorder", st.skipped_by_recorder),
        ("sampler_hook_errors", st.hook_errors),
        ("sampler_time_ns_total", st.sampling_ns_total),
        ("sampler_time_ns_max", st.sampling_ns_max),
        ("sampler_windows_opened", st.windows_opened),
        ("sampler_window_allocations", st.window_allocations),
        ("sampler_window_ticks", st.window_ticks),
        (
            "sampler_window_armed_allocations",
            st.window_armed_allocations,
        ),
        (
            "sampler_window_late_allocations",
            st.window_late_allocations,
        ),
        ("sampler_windows_spanned", st.windows_spanned),
        ("sampler_window_wakeups", st.window_wakeups),
    ] {
        hash.aset(ruby.to_symbol(key), value)?;
    }
    // The overhead budget: the mean interval in force, our own time and the process CPU time it
    // was measured against, the last period's share, and how often the interval moved.
    let sampler = &session.sampler;
    let budget = &sampler.budget;
    let effective = sampler.effective(session.config).sample_every;
    for (key, value) in [
        ("sampler_asked_sample_every", session.config.sample_every),
        ("sampler_effective_sample_every", effective),
        (
            "sampler_max_sample_every",
            (session.config.sample_every as f64 * budget.max_scale.get()).round() as u64,
        ),
        ("sampler_overhead_ns_total", budget.spent_total_ns.get()),
        (
            "sampler_overhead_estimated_ns",
            budget.estimated_total_ns.get(),
        ),
        ("sampler_overhead_cpu_ns", budget.measured_cpu_ns.get()),
        ("sampler_budget_raises", budget.raises.get()),
        ("sampler_budget_lowers", budget.lowers.get()),
    ] {
        hash.aset(ruby.to_symbol(key), value)?;
    }
    hash.aset(
        ruby.to_symbol("sampler_last_overhead"),
        budget.last_overhead.get(),
    )?;
    hash.aset(ruby.to_symbol("sampler_budget_note"), session.budget_note())?;
    // What lib/ changed of the sampler asked for, which timer opens the windows (nil for the
    // countdown), and what a Ruby timer means for the numbers.
    hash.aset(ruby.to_symbol("sampler_note"), session.sampler_note())?;
    hash.aset(ruby.to_symbol("window_timer"), session.window_timer())?;
    hash.aset(ruby.to_symbol("window_timer_note"), session.timer_note())?;
    hash.aset(ruby.to_symbol("running"), session.is_running())?;
    hash.aset(ruby.to_symbol("disabled_reason"), session.disabled_reason())?;
    Ok(hash)
}
