//! The CPU process group between threads, over TCP on loopback and over
//! shared memory (every test runs once per transport, in modules `tcp` and
//! `shm`): collectives against independent references for world sizes 1-8,
//! validation before sending, mismatches, dead and silent peers.

mod common;

use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use common::groups_over as groups;
use tensorcomm::cpu::transport::TransportChoice;
use tensorcomm::group::{ProcessGroup, ReduceOp};
use tensorcomm::store::HashStore;
use tensorcomm::tensor::{DType, Tensor};
use tensorcomm::Error;

over_transports!(
    all_reduce_broadcast_and_barrier_match_references_for_world_sizes_1_to_8,
    invalid_arguments_are_refused_before_sending_and_the_group_stays_usable,
    mismatched_shapes_are_reported_on_both_ranks_with_both_fingerprints,
    mismatched_ops_fail_every_rank_promptly,
    a_mismatch_on_one_rank_of_4_fails_every_rank,
    a_dead_peer_fails_every_survivor_promptly_naming_it,
    a_dead_rank_of_4_is_named_on_every_survivor,
    a_peer_dropped_during_a_collective_fails_the_others_promptly_naming_it,
    a_rank_that_skips_a_collective_times_out_by_name_and_a_fresh_group_works,
);

fn value(rank: usize, i: usize) -> i64 {
    ((rank * 31 + i * 7) % 19) as i64 - 9
}

fn all_reduce_broadcast_and_barrier_match_references_for_world_sizes_1_to_8(
    choice: TransportChoice,
) {
    for world in [1, 2, 3, 4, 8] {
        let pgs = groups(world, &Arc::new(HashStore::new()), "pg", choice);
        thread::scope(|s| {
            for pg in &pgs {
                s.spawn(move || {
                    let rank = pg.rank();
                    // 10 elements: direct; 30k (f32: 120 KB): halving-doubling;
                    // 300k: ring on odd worlds, halving-doubling on the rest.
                    for n in [10usize, 30_000, 300_000] {
                        let sum =
                            Tensor::from_vec((0..n).map(|i| value(rank, i) as f32).collect(), &[n])
                                .unwrap();
                        let max =
                            Tensor::from_vec((0..n).map(|i| value(rank, i) as i32).collect(), &[n])
                                .unwrap();
                        let avg =
                            Tensor::from_vec((0..n).map(|i| value(rank, i) as f64).collect(), &[n])
                                .unwrap();
                        let works = [
                            pg.all_reduce(&sum, ReduceOp::Sum, None).unwrap(),
                            pg.all_reduce(&max, ReduceOp::Max, None).unwrap(),
                            pg.all_reduce(&avg, ReduceOp::Avg, None).unwrap(),
                        ];
                        for w in works {
                            w.wait().unwrap();
                        }
                        let (sum, max, avg) = (
                            sum.to_vec::<f32>().unwrap(),
                            max.to_vec::<i32>().unwrap(),
                            avg.to_vec::<f64>().unwrap(),
                        );
                        for i in 0..n {
                            let all: Vec<i64> = (0..world).map(|r| value(r, i)).collect();
                            let total: i64 = all.iter().sum();
                            assert_eq!(sum[i], total as f32, "sum world {world} n {n} i {i}");
                            assert_eq!(max[i] as i64, *all.iter().max().unwrap());
                            assert_eq!(avg[i], total as f64 / world as f64);
                        }
                    }
                    for root in 0..world {
                        let t = Tensor::from_vec(vec![rank as u8; 33], &[3, 11]).unwrap();
                        pg.broadcast(&t, root, None).unwrap().wait().unwrap();
                        assert_eq!(t.to_vec::<u8>().unwrap(), vec![root as u8; 33]);
                    }
                    pg.barrier(None).unwrap().wait().unwrap();
                });
            }
        });
    }
}

fn invalid_arguments_are_refused_before_sending_and_the_group_stays_usable(
    choice: TransportChoice,
) {
    let pgs = groups(2, &Arc::new(HashStore::new()), "pg", choice);
    let f = Tensor::zeros(&[4], DType::F32).unwrap();
    match pgs[0].all_reduce(&f, ReduceOp::Bxor, None) {
        Err(Error::UnsupportedReduceOp {
            op,
            reduce_op,
            what,
        }) => {
            assert_eq!((op.as_str(), reduce_op.as_str()), ("all_reduce", "BXOR"));
            assert!(what.contains("f32"), "{what}");
        }
        other => panic!("{other:?}"),
    }
    let strided = Tensor::zeros(&[4, 4], DType::I32)
        .unwrap()
        .narrow(1, 0, 2)
        .unwrap();
    assert!(matches!(
        pgs[0].all_reduce(&strided, ReduceOp::Sum, None),
        Err(Error::InvalidCollective { .. })
    ));
    match pgs[0].broadcast(&f, 2, None) {
        Err(Error::InvalidCollective { op, reason }) => {
            assert_eq!(op, "broadcast");
            assert!(reason.contains("found 2"), "{reason}");
        }
        other => panic!("{other:?}"),
    }
    // No sequence number was taken: the next collective matches rank 1's.
    thread::scope(|s| {
        for pg in &pgs {
            s.spawn(move || {
                let t = Tensor::from_vec(vec![1i64, 2], &[2]).unwrap();
                pg.all_reduce(&t, ReduceOp::Sum, None)
                    .unwrap()
                    .wait()
                    .unwrap();
                assert_eq!(t.to_vec::<i64>().unwrap(), [2, 4]);
            });
        }
    });
}

fn expect_failed(err: Error, op: &str, seq: u64) -> (Vec<usize>, Error) {
    match err {
        Error::CollectiveFailed {
            op: o,
            seq: s,
            ranks,
            source,
            ..
        } => {
            assert_eq!((o.as_str(), s), (op, seq));
            (ranks, *source)
        }
        other => panic!("expected CollectiveFailed, got {other:?}"),
    }
}

fn mismatched_shapes_are_reported_on_both_ranks_with_both_fingerprints(choice: TransportChoice) {
    let pgs = groups(2, &Arc::new(HashStore::new()), "pg", choice);
    let errors: Vec<Error> = thread::scope(|s| {
        let hs: Vec<_> = pgs
            .iter()
            .map(|pg| {
                s.spawn(move || {
                    let n = 4 + pg.rank();
                    let t = Tensor::zeros(&[n], DType::F32).unwrap();
                    pg.all_reduce(&t, ReduceOp::Sum, None)
                        .unwrap()
                        .wait()
                        .unwrap_err()
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for (rank, err) in errors.into_iter().enumerate() {
        let (ranks, source) = expect_failed(err, "all_reduce", 0);
        assert_eq!(ranks, [1 - rank]);
        match source {
            Error::CollectiveMismatch { mine, theirs, .. } => {
                let (m, t) = if rank == 0 {
                    ("4 elements", "5 elements")
                } else {
                    ("5 elements", "4 elements")
                };
                assert!(mine.contains(m) && theirs.contains(t), "{mine} / {theirs}");
            }
            other => panic!("rank {rank}: {other:?}"),
        }
    }
    // The group is broken now, and says so.
    let t = Tensor::zeros(&[4], DType::F32).unwrap();
    assert!(matches!(
        pgs[0].all_reduce(&t, ReduceOp::Sum, None).unwrap().wait(),
        Err(Error::GroupBroken { seq: 0, .. })
    ));
}

fn mismatched_ops_fail_every_rank_promptly(choice: TransportChoice) {
    let pgs = groups(3, &Arc::new(HashStore::new()), "pg", choice);
    let started = Instant::now();
    let errors: Vec<Error> = thread::scope(|s| {
        let hs: Vec<_> = pgs
            .iter()
            .map(|pg| {
                s.spawn(move || {
                    let t = Tensor::zeros(&[8], DType::I32).unwrap();
                    let op = if pg.rank() == 2 {
                        ReduceOp::Max
                    } else {
                        ReduceOp::Sum
                    };
                    pg.all_reduce(&t, op, None).unwrap().wait().unwrap_err()
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert!(started.elapsed() < Duration::from_secs(10));
    let mut mismatches = 0;
    for err in errors {
        let (_, source) = expect_failed(err, "all_reduce", 0);
        if let Error::CollectiveMismatch { mine, theirs, .. } = source {
            assert!(
                mine.contains("MAX") != theirs.contains("MAX"),
                "{mine} / {theirs}"
            );
            mismatches += 1;
        }
    }
    assert!(mismatches >= 2, "rank 2 and its peers see the mismatch");
}

fn a_dead_peer_fails_every_survivor_promptly_naming_it(choice: TransportChoice) {
    let mut pgs = groups(3, &Arc::new(HashStore::new()), "pg", choice);
    drop(pgs.pop()); // rank 2 goes away, closing its connections
    let started = Instant::now();
    let named: Vec<Vec<usize>> = thread::scope(|s| {
        let hs: Vec<_> = pgs
            .iter()
            .map(|pg| {
                s.spawn(move || {
                    let t = Tensor::zeros(&[16], DType::F64).unwrap();
                    let err = pg
                        .all_reduce(&t, ReduceOp::Sum, None)
                        .unwrap()
                        .wait()
                        .unwrap_err();
                    assert!(
                        err.to_string().contains("all_reduce (sequence number 0)"),
                        "{err}"
                    );
                    let (ranks, source) = expect_failed(err, "all_reduce", 0);
                    assert!(matches!(source, Error::PeerClosed { .. }), "{source:?}");
                    ranks
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "{:?}",
        started.elapsed()
    );
    // A survivor that was waiting on the other survivor (which gave up and
    // closed) learns from the store that rank 2 is the one that is gone.
    assert_eq!(named, [[2], [2]], "{choice}");
}

/// Rank 3 of 4 goes away, before the first collective or inside the
/// second (large enough for the ring or the shared-memory arena); ranks
/// 0-2 all fail promptly, and every one of them names rank 3 as the rank
/// that did not arrive, whichever link it lost first.
fn a_dead_rank_of_4_is_named_on_every_survivor(choice: TransportChoice) {
    for during in [false, true] {
        let mut pgs = groups(4, &Arc::new(HashStore::new()), "pg", choice);
        let mut last = Some(pgs.pop().unwrap());
        let seq = u64::from(during);
        let n = if during {
            // A first collective everyone completes, so the links are in use.
            let t = Tensor::from_vec(vec![1i64; 4], &[4]).unwrap();
            let work = last
                .as_ref()
                .unwrap()
                .all_reduce(&t, ReduceOp::Sum, None)
                .unwrap();
            thread::scope(|s| {
                for pg in &pgs {
                    s.spawn(move || {
                        let t = Tensor::from_vec(vec![1i64; 4], &[4]).unwrap();
                        pg.all_reduce(&t, ReduceOp::Sum, None)
                            .unwrap()
                            .wait()
                            .unwrap();
                        assert_eq!(t.to_vec::<i64>().unwrap(), [4; 4]);
                    });
                }
            });
            work.wait().unwrap();
            1 << 20
        } else {
            drop(last.take());
            16
        };
        let tensors: Vec<_> = (0..3)
            .map(|_| Tensor::zeros(&[n], DType::F32).unwrap())
            .collect();
        let works: Vec<_> = pgs
            .iter()
            .zip(&tensors)
            .map(|(pg, t)| pg.all_reduce(t, ReduceOp::Sum, None).unwrap())
            .collect();
        let started = Instant::now();
        drop(last.take());
        for (rank, work) in works.into_iter().enumerate() {
            let err = work.wait().unwrap_err();
            let text = err.to_string();
            assert!(
                text.contains(&format!("all_reduce (sequence number {seq})")),
                "{text}"
            );
            let (ranks, source) = expect_failed(err, "all_reduce", seq);
            assert_eq!(ranks, [3], "{choice} rank {rank}: {source:?}");
            assert!(
                matches!(source, Error::PeerClosed { peer: 3, .. }),
                "{choice} rank {rank}: {source:?}"
            );
        }
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "{choice}: {:?}",
            started.elapsed()
        );
    }
}

fn a_peer_dropped_during_a_collective_fails_the_others_promptly_naming_it(choice: TransportChoice) {
    let mut pgs = groups(3, &Arc::new(HashStore::new()), "pg", choice);
    // One collective that everyone completes, so the links are in use.
    thread::scope(|s| {
        for pg in &pgs {
            s.spawn(move || {
                let t = Tensor::from_vec(vec![1i32; 8], &[8]).unwrap();
                pg.all_reduce(&t, ReduceOp::Sum, None)
                    .unwrap()
                    .wait()
                    .unwrap();
                assert_eq!(t.to_vec::<i32>().unwrap(), [3; 8]);
            });
        }
    });
    let last = pgs.pop().unwrap();
    // Ranks 0 and 1 start a ring-sized all_reduce (seq 1); rank 2 goes away
    // once both are queued, without joining it.
    let n = 1 << 20;
    let tensors: Vec<_> = (0..2)
        .map(|_| Tensor::zeros(&[n], DType::F32).unwrap())
        .collect();
    let works: Vec<_> = pgs
        .iter()
        .zip(&tensors)
        .map(|(pg, t)| pg.all_reduce(t, ReduceOp::Sum, None).unwrap())
        .collect();
    let started = Instant::now();
    drop(last);
    let mut named = Vec::new();
    for work in works {
        let (ranks, source) = expect_failed(work.wait().unwrap_err(), "all_reduce", 1);
        assert!(
            matches!(source, Error::PeerClosed { .. }),
            "{choice}: {source:?}"
        );
        named.push(ranks);
    }
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{choice}: {:?}",
        started.elapsed()
    );
    assert_eq!(named, [[2], [2]], "{choice}");
}

fn a_rank_that_skips_a_collective_times_out_by_name_and_a_fresh_group_works(
    choice: TransportChoice,
) {
    let store = Arc::new(HashStore::new());
    let pgs = groups(2, &store, "first", choice);
    let t = Tensor::zeros(&[4], DType::I64).unwrap();
    let started = Instant::now();
    let err = pgs[0]
        .all_reduce(&t, ReduceOp::Sum, Some(Duration::from_millis(300)))
        .unwrap()
        .wait()
        .unwrap_err();
    assert!(started.elapsed() >= Duration::from_millis(300));
    let (ranks, source) = expect_failed(err, "all_reduce", 0);
    assert_eq!(ranks, [1]);
    assert!(
        matches!(source, Error::PeerTimeout { peer: 1, .. }),
        "{source:?}"
    );
    drop(pgs);
    let fresh = groups(2, &store, "second", choice);
    thread::scope(|s| {
        for pg in &fresh {
            s.spawn(move || {
                let t = Tensor::from_vec(vec![3i64; 4], &[4]).unwrap();
                pg.all_reduce(&t, ReduceOp::Product, None)
                    .unwrap()
                    .wait()
                    .unwrap();
                assert_eq!(t.to_vec::<i64>().unwrap(), [9; 4]);
            });
        }
    });
}

/// Ranks 0-2 of 4 run an 8-element SUM all_reduce; rank 3 a MAX (or 9
/// elements). Every rank's `Work` fails promptly naming the op and the
/// sequence number, and every rank reports the mismatch with both
/// fingerprints: its own as `mine`, the other side's as `theirs`, naming a
/// rank whose fingerprint differs from its own (rank 3 for ranks 0-2, one
/// of ranks 0-2 for rank 3). Ranks that did not exchange fingerprints with
/// rank 3 learn the mismatch from the report in the group's store.
fn a_mismatch_on_one_rank_of_4_fails_every_rank(choice: TransportChoice) {
    for odd_shape in [false, true] {
        let pgs = groups(4, &Arc::new(HashStore::new()), "pg", choice);
        let started = Instant::now();
        let errors: Vec<Error> = thread::scope(|s| {
            let hs: Vec<_> = pgs
                .iter()
                .map(|pg| {
                    s.spawn(move || {
                        let odd = pg.rank() == 3;
                        let n = if odd && odd_shape { 9 } else { 8 };
                        let op = if odd && !odd_shape {
                            ReduceOp::Max
                        } else {
                            ReduceOp::Sum
                        };
                        let t = Tensor::zeros(&[n], DType::I32).unwrap();
                        pg.all_reduce(&t, op, None).unwrap().wait().unwrap_err()
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        assert!(started.elapsed() < Duration::from_secs(10));
        let (odd_mark, even_mark) = if odd_shape {
            ("9 elements", "8 elements")
        } else {
            ("MAX", "SUM")
        };
        for (rank, err) in errors.into_iter().enumerate() {
            let (ranks, source) = expect_failed(err, "all_reduce", 0);
            match source {
                Error::CollectiveMismatch {
                    rank: r,
                    peer,
                    mine,
                    theirs,
                } => {
                    assert_eq!(r, rank);
                    assert_eq!(ranks, [peer], "{choice} rank {rank}");
                    if rank == 3 {
                        assert!(peer < 3, "{choice}: rank 3 names {peer}");
                    } else {
                        assert_eq!(peer, 3, "{choice} rank {rank}");
                    }
                    // Both fingerprints, each on its own side.
                    let (m, t) = if rank == 3 {
                        (odd_mark, even_mark)
                    } else {
                        (even_mark, odd_mark)
                    };
                    assert!(
                        mine.contains(m) && !mine.contains(t),
                        "{choice} rank {rank}: {mine}"
                    );
                    assert!(
                        theirs.contains(t) && !theirs.contains(m),
                        "{choice} rank {rank}: {theirs}"
                    );
                    assert!(mine.starts_with("all_reduce (seq 0"), "{mine}");
                    assert!(theirs.starts_with("all_reduce (seq 0"), "{theirs}");
                }
                other => panic!("{choice} rank {rank}: {other:?}"),
            }
        }
    }
}
