//! More ranks than cores over shared memory: with waits that yield and
//! then sleep on the rings' futexes ([`ShmWait::Sleep`], what `Auto`
//! picks on such a host), thousands of small all-reduces among 8 rank
//! threads still give every rank the exact sum, whichever algorithm moves
//! them, and rings smaller than a message (sends and receives waiting at
//! once) still stream. The same holds for all-reduces through the group's
//! shared-memory arena, whose waits then sleep on its counters' futexes
//! (and its opening barrier on the rings'). A lost wake-up would stall a
//! call until the sleep's timeout; the whole run is bounded far below
//! what that would cost. (Most waits here end while yielding; the unit
//! tests of the arena, `arena/wait_tests.rs`, and of the links,
//! `link/wait_tests.rs`, sleep at once and with timeouts of seconds, so
//! that a lost wake-up there stalls far past their bounds.)
#![cfg(target_os = "linux")]

use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use tensorcomm::cpu::algorithms::{
    all_reduce_shm_arena, all_reduce_with, AllReduceAlgorithm, ArenaThreads,
};
use tensorcomm::cpu::reduce_kernels::ReduceOp;
use tensorcomm::cpu::transport::shm::{ShmArena, ShmTransport, ShmTransportOptions, ShmWait};
use tensorcomm::cpu::transport::Transport;
use tensorcomm::cpu::HelperThreads;
use tensorcomm::store::HashStore;
use tensorcomm::tensor::DType;

const WORLD: usize = 8;

/// Runs `f` on each of `WORLD` rank threads over a shared-memory mesh
/// whose waits are `wait`, with rings of `capacity` bytes.
fn run<R: Send>(
    prefix: &str,
    wait: ShmWait,
    capacity: usize,
    f: impl Fn(&ShmTransport) -> R + Sync,
) -> Vec<R> {
    run_with_store(prefix, wait, capacity, |t, _| f(t))
}

/// [`run`], also handing each rank the store the mesh met through.
fn run_with_store<R: Send>(
    prefix: &str,
    wait: ShmWait,
    capacity: usize,
    f: impl Fn(&ShmTransport, &HashStore) -> R + Sync,
) -> Vec<R> {
    let store = Arc::new(HashStore::new());
    let f = &f;
    thread::scope(|s| {
        let handles: Vec<_> = (0..WORLD)
            .map(|rank| {
                let store = store.clone();
                s.spawn(move || {
                    let options = ShmTransportOptions {
                        capacity,
                        timeout: Duration::from_secs(30),
                        wait,
                    };
                    let t = ShmTransport::connect(&*store, prefix, rank, WORLD, &options)
                        .expect("shm mesh setup");
                    assert_eq!(t.wait(), wait);
                    f(&t, &store)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

/// `rounds` all-reduces of `elems` i64s by `algorithm`; round `i`, rank
/// `r`, element `e` holds `i * 1000 + r * 10 + e`, so every sum is known.
/// Returns the number of wrong elements seen.
fn all_reduces(
    t: &dyn Transport,
    algorithm: AllReduceAlgorithm,
    rounds: i64,
    elems: usize,
) -> usize {
    let deadline = Instant::now() + Duration::from_secs(60);
    let all_reduce =
        |buf: &mut [u8]| all_reduce_with(algorithm, t, buf, DType::I64, ReduceOp::Sum, deadline);
    exact_sums(t, rounds, elems, all_reduce)
}

/// [`all_reduces`] through `all_reduce`.
fn exact_sums(
    t: &dyn Transport,
    rounds: i64,
    elems: usize,
    all_reduce: impl Fn(&mut [u8]) -> tensorcomm::Result<()>,
) -> usize {
    let rank = t.rank() as i64;
    let world = WORLD as i64;
    let mut wrong = 0;
    for i in 0..rounds {
        let mine: Vec<i64> = (0..elems as i64)
            .map(|e| i * 1000 + rank * 10 + e)
            .collect();
        let mut buf: Vec<u8> = mine.iter().flat_map(|v| v.to_ne_bytes()).collect();
        all_reduce(&mut buf).expect("all_reduce");
        for (e, got) in buf.chunks_exact(8).enumerate() {
            let got = i64::from_ne_bytes(got.try_into().unwrap());
            let want = world * (i * 1000 + e as i64) + 10 * world * (world - 1) / 2;
            wrong += usize::from(got != want);
        }
    }
    wrong
}

#[test]
fn thousands_of_small_all_reduces_among_8_sleeping_ranks_are_exact() {
    let started = Instant::now();
    for (algorithm, rounds) in [
        (AllReduceAlgorithm::Direct, 1500),
        (AllReduceAlgorithm::HalvingDoubling, 1500),
    ] {
        let prefix = format!("oversub-small-{algorithm:?}");
        let wrong = run(&prefix, ShmWait::Sleep, 1 << 16, |t| {
            all_reduces(t, algorithm, rounds, 1)
        });
        assert_eq!(
            wrong,
            vec![0; WORLD],
            "{algorithm:?}: wrong elements per rank"
        );
    }
    // 2 × 1500 rounds; a wake-up lost once per 100 rounds would already
    // cost 30 × 100 µs-20 ms timeouts per rank, and one lost forever
    // would hang; on the 2-core VM this takes about a second.
    assert!(
        started.elapsed() < Duration::from_secs(60),
        "took {:?}",
        started.elapsed()
    );
}

#[test]
fn hundreds_of_arena_all_reduces_among_8_sleeping_ranks_are_exact() {
    // 4 KiB slot halves: 2 KiB (one step), 16 KiB (4 steps, pipelined)
    // and 100 KiB (25 steps) messages, one lane per rank as on a host
    // with fewer cores than ranks, and two lanes.
    let started = Instant::now();
    for (lanes, elems, rounds) in [(1, 256, 400), (1, 2048, 100), (2, 12_800, 20)] {
        let prefix = format!("oversub-arena-{lanes}-{elems}");
        let wrong = run_with_store(&prefix, ShmWait::Sleep, 1 << 16, |t, store| {
            let mut arena = ShmArena::connect(
                store,
                &prefix,
                t.rank(),
                WORLD,
                4096,
                Duration::from_secs(30),
            )
            .expect("arena setup");
            arena.set_wait(ShmWait::Sleep);
            let helpers = HelperThreads::new("oversub");
            let deadline = Instant::now() + Duration::from_secs(60);
            let threads = ArenaThreads {
                helpers: &helpers,
                count: lanes,
            };
            exact_sums(t, rounds, elems, |buf| {
                all_reduce_shm_arena(t, &arena, threads, buf, DType::I64, ReduceOp::Sum, deadline)
            })
        });
        assert_eq!(
            wrong,
            vec![0; WORLD],
            "{lanes} lanes, {elems} elements: wrong elements per rank"
        );
    }
    assert!(
        started.elapsed() < Duration::from_secs(60),
        "took {:?}",
        started.elapsed()
    );
}

#[test]
fn messages_larger_than_the_rings_stream_among_8_sleeping_ranks() {
    // 4 KiB rings and 64 KiB messages: every exchange waits for space
    // and for data, often both at once.
    let wrong = run("oversub-large", ShmWait::Sleep, 4096, |t| {
        all_reduces(t, AllReduceAlgorithm::Ring, 20, 8192)
    });
    assert_eq!(wrong, vec![0; WORLD], "wrong elements per rank");
}

#[test]
fn auto_sleeps_exactly_when_the_ranks_outnumber_the_cores() {
    let want = if WORLD > tensorcomm::cpu::host_cores() {
        ShmWait::Sleep
    } else {
        ShmWait::Spin
    };
    let store = Arc::new(HashStore::new());
    let waits: Vec<ShmWait> = thread::scope(|s| {
        let handles: Vec<_> = (0..WORLD)
            .map(|rank| {
                let store = store.clone();
                s.spawn(move || {
                    let options = ShmTransportOptions {
                        capacity: 4096,
                        ..ShmTransportOptions::default()
                    };
                    ShmTransport::connect(&*store, "oversub-auto", rank, WORLD, &options)
                        .expect("shm mesh setup")
                        .wait()
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert_eq!(waits, vec![want; WORLD]);
}
