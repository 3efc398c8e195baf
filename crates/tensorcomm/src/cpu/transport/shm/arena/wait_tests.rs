//! Waiting on the arena's counters by [`ShmWait::Sleep`]: publishers wake
//! sleepers exactly while some rank may sleep, a sleeping wait is woken by
//! the publish it waits for (not by its timeout), and no wake-up is lost
//! when ranks that outnumber the cores wait on each other round after
//! round. The sleeping tests give the sleeps a timeout of a minute
//! (`test_sleep`), so a lost wake-up stalls them far past their bounds
//! instead of costing a few milliseconds.

use std::sync::atomic::AtomicU64;
use std::sync::Arc;

use super::*;
use crate::store::HashStore;

/// The arenas of one group of `waits.len()` ranks (slot halves of 64
/// bytes), rank `r` waiting by `waits[r]`, set before any rank waits.
fn arenas(prefix: &str, waits: &[ShmWait]) -> Vec<ShmArena> {
    let store = Arc::new(HashStore::new());
    let world = waits.len();
    let mut arenas: Vec<ShmArena> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..world)
            .map(|rank| {
                let store = store.clone();
                s.spawn(move || {
                    ShmArena::connect(&*store, prefix, rank, world, 64, Duration::from_secs(30))
                        .expect("arena setup")
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for (arena, &wait) in arenas.iter_mut().zip(waits) {
        arena.set_wait(wait);
        arena.test_sleep = Some(Duration::from_secs(60));
    }
    arenas
}

/// A call that started now and ends in a minute.
fn a_minute() -> (Instant, Instant) {
    let now = Instant::now();
    (now, now + Duration::from_secs(60))
}

#[test]
fn publishers_wake_sleepers_exactly_while_some_rank_waits_by_sleep() {
    let mut a = arenas("gate", &[ShmWait::Spin, ShmWait::Spin]);
    assert!(!a[0].wakes_sleepers() && !a[1].wakes_sleepers());
    // The count is shared: rank 0, spinning itself, now wakes rank 1.
    a[1].set_wait(ShmWait::Sleep);
    assert!(a[0].wakes_sleepers() && a[1].wakes_sleepers());
    // Counted once, however often it is set.
    a[1].set_wait(ShmWait::Sleep);
    a[1].set_wait(ShmWait::Spin);
    assert!(!a[0].wakes_sleepers());
    a[0].set_wait(ShmWait::Sleep);
    a[1].set_wait(ShmWait::Sleep);
    // A rank that drops its arena counts itself out.
    drop(a.pop());
    assert!(a[0].wakes_sleepers());
    a[0].set_wait(ShmWait::Spin);
    assert!(!a[0].wakes_sleepers());
}

#[test]
fn a_sleeping_wait_is_woken_by_the_publish_it_waits_for() {
    // Rank 1 spins itself: its publishes must still wake rank 0.
    let a = arenas("wake", &[ShmWait::Sleep, ShmWait::Spin]);
    for (step, kind) in [
        (0, Progress::CopiedIn),
        (0, Progress::Reduced),
        (1, Progress::CopiedIn),
        (5, Progress::CopiedOut),
    ] {
        let milestone = Milestone {
            rank: 1,
            lane: 3,
            kind,
            step,
        };
        let late = std::thread::scope(|s| {
            let waiter =
                s.spawn(|| a[0].wait_progress(milestone, a_minute(), &|| false, &|| Ok(())));
            // Publishes once rank 0 sleeps on the counter's signal.
            while a[1].signal(1, 3, kind).sleepers() == 0 {
                std::thread::yield_now();
            }
            let published = Instant::now();
            a[1].publish(3, kind, step);
            assert!(matches!(waiter.join().unwrap(), Ok(true)));
            published.elapsed()
        });
        assert!(
            late < Duration::from_secs(20),
            "{kind:?} {step}: woke {late:?} after the publish"
        );
    }
}

#[test]
fn a_sleeping_wait_stops_at_its_deadline_and_when_told_to() {
    let mut a = arenas("stop", &[ShmWait::Sleep, ShmWait::Sleep]);
    a[0].test_sleep = None;
    let milestone = Milestone {
        rank: 1,
        lane: 0,
        kind: Progress::Reduced,
        step: 0,
    };
    let started = Instant::now();
    let soon = (started, started + Duration::from_millis(100));
    match a[0].wait_progress(milestone, soon, &|| false, &|| Ok(())) {
        Err(Error::PeerTimeout { peer: 1, .. }) => {}
        other => panic!("expected a timeout naming rank 1, found {other:?}"),
    }
    // Its sleeps end by the deadline, not a whole sleep later.
    assert!(started.elapsed() < Duration::from_secs(5));
    let stop = AtomicBool::new(false);
    let stopped = std::thread::scope(|s| {
        let waiter = s.spawn(|| {
            let stopped = || stop.load(Ordering::Acquire);
            a[0].wait_progress(milestone, a_minute(), &stopped, &|| Ok(()))
        });
        std::thread::sleep(Duration::from_millis(50));
        stop.store(true, Ordering::Release);
        waiter.join().unwrap()
    });
    assert!(matches!(stopped, Ok(false)), "{stopped:?}");
}

#[test]
fn no_wake_up_is_lost_while_sleeping_ranks_wait_on_each_others_counters() {
    // 4 ranks on (at most) a few cores, a barrier through the counters
    // each round: every rank publishes, then waits for every other. A
    // wake-up lost once would stall a rank for a minute.
    let world = 4;
    let rounds = 2000;
    let a = arenas("stress", &[ShmWait::Sleep; 4]);
    let waits = AtomicU64::new(0);
    let started = Instant::now();
    std::thread::scope(|s| {
        for (rank, arena) in a.iter().enumerate() {
            let waits = &waits;
            s.spawn(move || {
                for step in 0..rounds {
                    let kind = [Progress::CopiedIn, Progress::Reduced][step as usize % 2];
                    arena.publish(1, kind, step);
                    for q in (0..world).filter(|&q| q != rank) {
                        let milestone = Milestone {
                            rank: q,
                            lane: 1,
                            kind,
                            step,
                        };
                        let met = arena.wait_progress(milestone, a_minute(), &|| false, &|| Ok(()));
                        assert!(matches!(met, Ok(true)), "rank {rank} step {step}: {met:?}");
                        waits.fetch_add(1, Ordering::Relaxed);
                    }
                }
            });
        }
    });
    assert_eq!(waits.into_inner(), (world * (world - 1)) as u64 * rounds);
    assert!(
        started.elapsed() < Duration::from_secs(50),
        "{rounds} rounds took {:?}",
        started.elapsed()
    );
}
