//! The window placement's unit tests: the share watched at every position, stretches all in or
//! all out, wrapping, boundaries, wake-ups and late ticks.

use super::*;

fn draws(seed: u64) -> impl FnMut() -> f64 {
    // Scrambled, so that small seeds do not start with small draws.
    let mut x = (seed.wrapping_add(1)).wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        (x >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// Runs the process over a line of `n` allocations with a check every `every` allocations,
/// returning per allocation whether it was watched. The window length changes from stratum
/// to stratum (as the program's pace does), which must not move the chance.
fn simulate(n: u64, every: u64, share: f64, seed: u64) -> Vec<bool> {
    let cp = Checkpoints::default();
    let mut draw = draws(seed);
    cp.restart(0, 64, share, draw());
    let mut watched = vec![false; n as usize];
    for i in 0..n {
        if i % every == 0 {
            let length = 40 + (i / 300) * 16;
            cp.on_check(i, length, share, u64::MAX, false, &mut draw);
        }
        let (inside, ..) = cp.on_allocation();
        watched[i as usize] = inside;
    }
    watched
}

#[test]
fn every_allocation_is_watched_with_the_share_asked() {
    // A check every 7 allocations, windows growing from 40 to 136 at a share of 1/16: the
    // chance of being watched is the share at every position, the first ones included.
    let (n, runs, share) = (2_000u64, 4_000u64, 1.0 / 16.0);
    let mut hits = vec![0u32; n as usize];
    for seed in 0..runs {
        for (i, w) in simulate(n, 7, share, seed * 7919 + 1).iter().enumerate() {
            hits[i] += *w as u32;
        }
    }
    let sigma = (share * (1.0 - share) / runs as f64).sqrt();
    for chunk in hits.chunks(100) {
        let mean = chunk.iter().map(|&h| h as f64).sum::<f64>() / (100 * runs) as f64;
        assert!(
            (mean - share).abs() < 4.0 * sigma,
            "mean {mean} against {share}"
        );
    }
}

#[test]
fn a_stretch_without_checks_is_all_in_or_all_out() {
    // Checks at 0 and at 10,000 only: the 10,000 allocations between are one stretch.
    let cp = Checkpoints::default();
    let mut draw = draws(3);
    let (mut all, mut none) = (0, 0);
    for _ in 0..2_000 {
        cp.restart(0, 64, 0.25, draw());
        cp.on_check(0, 64, 0.25, u64::MAX, false, &mut draw);
        let watched = (0..10_000).filter(|_| cp.on_allocation().0).count();
        match watched {
            0 => none += 1,
            10_000 => all += 1,
            other => panic!("{other} of the stretch watched"),
        }
    }
    let share = all as f64 / (all + none) as f64;
    assert!((share - 0.25).abs() < 0.04, "{share}");
}

#[test]
fn a_window_that_runs_past_its_stratum_wraps_to_its_beginning() {
    let cp = Checkpoints::default();
    // Stratum [1000, 1256) for windows of 64 at a quarter; offset 0.9 * 256 = 230.
    cp.plan_stratum(1_000, 64, 0.25, 0.9);
    assert_eq!((cp.start.get(), cp.end.get()), (1_000, 1_038));
    assert_eq!(cp.second.get(), Some((1_230, 1_256)));
    assert_eq!(cp.stratum_end.get(), 1_256);
    cp.next_window(64, 0.25, 0.0);
    assert_eq!((cp.start.get(), cp.end.get()), (1_230, 1_256));
    cp.next_window(64, 0.25, 0.0);
    assert_eq!((cp.start.get(), cp.end.get()), (1_256, 1_320));
}

#[test]
fn a_window_weighs_by_its_stratum_whatever_the_share_when_it_opens() {
    // Laid out at a quarter (a stratum of 256 for a window of 64); the budget then halves
    // the share before the window opens: its samples still stand for 256 / 64 each.
    let cp = Checkpoints::default();
    cp.plan_stratum(0, 64, 0.25, 100.0 / 256.0);
    let out = cp.on_check(120, 64, 0.125, 100, false, || 0.5);
    assert!(out.opened);
    assert_eq!(cp.scale(), 4.0);
}

#[test]
fn the_hook_asks_for_the_job_at_each_boundary_once() {
    let cp = Checkpoints::default();
    cp.plan_stratum(0, 64, 0.25, 100.0 / 256.0);
    assert_eq!((cp.start.get(), cp.end.get()), (100, 164));
    let out = cp.on_check(40, 64, 0.25, 100, false, || 0.5);
    assert_eq!(out, CheckOutcome::default());
    assert_eq!(cp.phase(), Phase::Armed);
    let asks: Vec<u64> = (40..120).filter(|_| cp.on_allocation().1).collect();
    assert_eq!(asks.len(), 1);
    let out = cp.on_check(120, 64, 0.25, 100, false, || 0.5);
    assert!(out.opened);
    assert_eq!(out.armed, 60);
    assert_eq!(cp.phase(), Phase::Open);
    let asks = (120..200).filter(|_| cp.on_allocation().1).count();
    assert_eq!(asks, 1);
    let out = cp.on_check(200, 64, 0.25, 100, false, || 0.5);
    assert_eq!(out.closed, Some(80));
    assert_eq!(cp.phase(), Phase::Idle);
    // The next window is in the next stratum, wherever the check fell.
    assert_eq!(cp.start.get(), 256 + 128);
}

#[test]
fn a_first_window_at_the_start_opens_at_once_and_says_so() {
    let cp = Checkpoints::default();
    assert!(cp.restart(1_000, 64, 0.25, 0.0));
    assert_eq!(cp.phase(), Phase::Open);
    // Further off: armed or waking, not opened.
    assert!(!cp.restart(1_000, 64, 0.25, 0.5));
    assert_eq!(cp.phase(), Phase::Armed);
}

#[test]
fn a_wake_up_asks_for_the_job_after_its_allocations_and_a_tick_before_it_leaves_it_armed() {
    let cp = Checkpoints::default();
    cp.plan_stratum(0, 64, 0.25, 150.0 / 256.0);
    assert_eq!((cp.start.get(), cp.end.get()), (150, 214));
    assert!(cp.wake(10, 50, 1));
    assert_eq!(cp.phase(), Phase::Waking(1));
    // A tick before the wake-up, the start still beyond its horizon: nothing changes.
    assert_eq!(
        cp.on_check(30, 64, 0.25, 16, true, || 0.5),
        CheckOutcome::default()
    );
    assert_eq!(cp.phase(), Phase::Waking(1));
    let asks: Vec<u64> = (10..70).filter(|_| cp.on_allocation().1).collect();
    assert_eq!(asks.len(), 1);
    let out = cp.on_check(70, 64, 0.25, 16, false, || 0.5);
    assert_eq!((out.woke, out.armed, out.opened), (1, 60, false));
    assert_eq!(cp.phase(), Phase::Idle);
    // The second wake-up; a tick with the start within its horizon arms for the start.
    assert!(cp.wake(70, 50, 2));
    let out = cp.on_check(80, 64, 0.25, 150, true, || 0.5);
    assert_eq!((out.woke, out.armed), (0, 10));
    assert_eq!((cp.phase(), cp.left.get()), (Phase::Armed, 70));
    // Asked to wake later than the start: armed for the start itself.
    let cp = Checkpoints::default();
    cp.plan_stratum(0, 64, 0.25, 150.0 / 256.0);
    assert!(cp.wake(140, 50, 1));
    assert_eq!((cp.phase(), cp.left.get()), (Phase::Armed, 10));
    assert!(!cp.wake(145, 50, 1), "only from idle");
}

#[test]
fn a_late_timer_moves_the_window_and_a_held_up_job_does_not() {
    let cp = Checkpoints::default();
    cp.plan_stratum(0, 64, 0.25, 100.0 / 256.0);
    let out = cp.on_check(130, 64, 0.25, 10, true, || 0.5);
    assert!(out.opened);
    assert_eq!(out.late, 30);
    assert_eq!(cp.end.get(), 194);
    let out = cp.on_check(1_000, 64, 0.25, 10, false, || 0.5);
    assert_eq!(out.closed, Some(870));
    // Past a window that no check fell inside (a C call spanned it): counted, and skipped.
    let cp = Checkpoints::default();
    cp.plan_stratum(0, 64, 0.25, 100.0 / 256.0);
    let out = cp.on_check(170, 64, 0.25, 10, false, || 0.5);
    assert_eq!((out.opened, out.spanned), (false, 1));
    // Held up past the start but not the end: opens for what is left.
    let cp = Checkpoints::default();
    cp.plan_stratum(0, 64, 0.25, 100.0 / 256.0);
    let out = cp.on_check(150, 64, 0.25, 10, false, || 0.5);
    assert!(out.opened && out.late == 0);
    assert_eq!(cp.end.get(), 164);
}
