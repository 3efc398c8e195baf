//! Mismatched collectives fail at the mismatched call itself, on the
//! ranks that only send in it too (broadcast root, reduce leaves, gather
//! leaves, scatter root, a broadcast relay whose child disagrees), and the
//! error shows both sides' calls in full: op, reduce op, dtype, shape,
//! root and device, not a hash. Every call has a short timeout and every
//! rank must be done well inside it.

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{groups_over, on_every_rank};
use tensorcomm::cpu::backend::ProcessGroupCpu;
use tensorcomm::cpu::transport::TransportChoice;
use tensorcomm::group::{ProcessGroup, ReduceOp};
use tensorcomm::store::HashStore;
use tensorcomm::tensor::{DType, Tensor};
use tensorcomm::Error;

over_transports!(
    all_reduce_against_reduce_fails_both_ranks_at_that_call,
    a_broadcast_root_fails_when_its_receiver_has_another_shape,
    reduce_leaves_fail_when_the_root_has_another_dtype,
    gather_leaves_fail_when_the_root_has_another_shape,
    a_scatter_root_fails_when_the_others_have_another_shape,
    a_broadcast_relay_fails_when_its_child_disagrees,
    broadcasts_from_different_roots_on_3_ranks_name_the_mismatch_on_every_rank,
    two_agreeing_ranks_against_one_name_the_mismatch_by_the_next_call,
);

/// Each call's timeout; a rank that needs anywhere near it waited for a
/// message that never came.
const TIMEOUT: Duration = Duration::from_secs(20);
const PROMPT: Duration = Duration::from_secs(8);

/// The mismatch a failed collective names: op, sequence number, and both
/// sides' descriptions.
fn mismatch(err: &Error) -> Option<(&str, u64, &str, &str)> {
    match err {
        Error::CollectiveFailed {
            op, seq, source, ..
        } => match source.as_ref() {
            Error::CollectiveMismatch { mine, theirs, .. } => {
                Some((op.as_str(), *seq, mine.as_str(), theirs.as_str()))
            }
            _ => None,
        },
        _ => None,
    }
}

/// Runs `call` on every rank of a fresh group of `world` over `choice`
/// and returns each rank's outcome, checking that every rank was prompt.
fn run(
    world: usize,
    choice: TransportChoice,
    call: impl Fn(&ProcessGroupCpu) -> tensorcomm::Result<()> + Sync,
) -> Vec<tensorcomm::Result<()>> {
    let pgs = groups_over(world, &Arc::new(HashStore::new()), "mm", choice);
    let started = Instant::now();
    let outcomes = on_every_rank(&pgs, |pg| {
        let outcome = call(pg);
        (outcome, started.elapsed())
    });
    outcomes
        .into_iter()
        .enumerate()
        .map(|(rank, (outcome, took))| {
            assert!(
                took < PROMPT,
                "{choice} rank {rank} took {took:?}: {outcome:?}"
            );
            outcome
        })
        .collect()
}

/// Every rank in `ranks` failed its first call (sequence number 0) naming
/// the mismatch; returns their `(mine, theirs)` descriptions.
fn every_rank_names_it(
    outcomes: &[tensorcomm::Result<()>],
    ranks: impl IntoIterator<Item = usize>,
    op: &str,
    choice: TransportChoice,
) -> Vec<(String, String)> {
    ranks
        .into_iter()
        .map(|rank| {
            let err = outcomes[rank].as_ref().expect_err(&format!(
                "{choice}: rank {rank} completed the mismatched call"
            ));
            let (o, seq, mine, theirs) = mismatch(err).unwrap_or_else(|| {
                panic!("{choice}: rank {rank} failed without naming the mismatch: {err}")
            });
            assert_eq!((o, seq), (op, 0), "{choice} rank {rank}: {err}");
            (mine.to_string(), theirs.to_string())
        })
        .collect()
}

fn f32s(shape: &[usize]) -> Tensor<'static> {
    Tensor::zeros(shape, DType::F32).unwrap()
}

/// The example: rank 0 all-reduces, rank 1 reduces to rank 0.
/// Rank 1 only sends in its view, and still fails at this call.
fn all_reduce_against_reduce_fails_both_ranks_at_that_call(choice: TransportChoice) {
    let outcomes = run(2, choice, |pg| {
        let t = f32s(&[8]);
        let work = if pg.rank() == 0 {
            pg.all_reduce(&t, ReduceOp::Sum, Some(TIMEOUT))?
        } else {
            pg.reduce(&t, 0, ReduceOp::Sum, Some(TIMEOUT))?
        };
        work.wait()
    });
    for (rank, op) in [(0, "all_reduce"), (1, "reduce")] {
        let sides = every_rank_names_it(&outcomes, [rank], op, choice);
        let (mine, theirs) = &sides[0];
        let other = if rank == 0 {
            "reduce (seq 0"
        } else {
            "all_reduce (seq 0"
        };
        assert!(
            mine.starts_with(&format!("{op} (seq 0")),
            "{choice}: {mine}"
        );
        assert!(theirs.starts_with(other), "{choice}: {theirs}");
        for side in [mine, theirs] {
            assert!(
                side.contains("f32 tensor of shape [8]") && side.contains("on cpu"),
                "{choice}: {side}"
            );
        }
    }
}

/// A two-rank broadcast whose receiver passes `[20, 10]` for the root's
/// `[20, 2]`: the root, which only sends, fails too, and both errors show
/// both shapes.
fn a_broadcast_root_fails_when_its_receiver_has_another_shape(choice: TransportChoice) {
    let outcomes = run(2, choice, |pg| {
        let t = f32s(if pg.rank() == 0 { &[20, 2] } else { &[20, 10] });
        pg.broadcast(&t, 0, Some(TIMEOUT))?.wait()
    });
    let sides = every_rank_names_it(&outcomes, 0..2, "broadcast", choice);
    for (rank, (mine, theirs)) in sides.iter().enumerate() {
        let (m, t) = if rank == 0 {
            ("[20, 2]", "[20, 10]")
        } else {
            ("[20, 10]", "[20, 2]")
        };
        assert!(
            mine.contains(&format!("f32 tensor of shape {m},")) && mine.contains("root 0"),
            "{choice} rank {rank}: {mine}"
        );
        assert!(
            theirs.contains(&format!("f32 tensor of shape {t},")) && theirs.contains("root 0"),
            "{choice} rank {rank}: {theirs}"
        );
        assert!(mine.contains("on cpu") && theirs.contains("on cpu"));
    }
}

/// Three ranks reduce to rank 0, which passes f64 where the leaves pass
/// f32: the leaves only send, and every rank fails showing both dtypes.
fn reduce_leaves_fail_when_the_root_has_another_dtype(choice: TransportChoice) {
    let outcomes = run(3, choice, |pg| {
        let dtype = if pg.rank() == 0 {
            DType::F64
        } else {
            DType::F32
        };
        let t = Tensor::zeros(&[4], dtype)?;
        pg.reduce(&t, 0, ReduceOp::Max, Some(TIMEOUT))?.wait()
    });
    let sides = every_rank_names_it(&outcomes, 0..3, "reduce", choice);
    for (rank, (mine, theirs)) in sides.iter().enumerate() {
        let (m, t) = if rank == 0 {
            ("f64", "f32")
        } else {
            ("f32", "f64")
        };
        assert!(
            mine.contains(&format!("MAX, {m} tensor of shape [4]")),
            "{choice} rank {rank}: {mine}"
        );
        assert!(
            theirs.contains(&format!("MAX, {t} tensor of shape [4]")),
            "{choice} rank {rank}: {theirs}"
        );
    }
}

/// Three ranks gather to rank 0, which passes `[3]` where the others pass
/// `[5]`: the leaves only send, and every rank fails.
fn gather_leaves_fail_when_the_root_has_another_shape(choice: TransportChoice) {
    let outcomes = run(3, choice, |pg| {
        let n = if pg.rank() == 0 { 3 } else { 5 };
        let input = f32s(&[n]);
        let list: Vec<_> = (0..3).map(|_| f32s(&[n])).collect();
        let list = (pg.rank() == 0).then_some(list.as_slice());
        pg.gather(&input, list, 0, Some(TIMEOUT))?.wait()
    });
    let sides = every_rank_names_it(&outcomes, 0..3, "gather", choice);
    let (mine, theirs) = &sides[1];
    assert!(
        mine.contains("shape [5]") && theirs.contains("shape [3]"),
        "{mine} / {theirs}"
    );
}

/// Three ranks scatter from rank 0, which passes `[2]` where the others
/// pass `[4]`: the root only sends its data, and every rank fails.
fn a_scatter_root_fails_when_the_others_have_another_shape(choice: TransportChoice) {
    let outcomes = run(3, choice, |pg| {
        let n = if pg.rank() == 0 { 2 } else { 4 };
        let output = f32s(&[n]);
        let list: Vec<_> = (0..3).map(|_| f32s(&[n])).collect();
        let list = (pg.rank() == 0).then_some(list.as_slice());
        pg.scatter(&output, list, 0, Some(TIMEOUT))?.wait()
    });
    let sides = every_rank_names_it(&outcomes, 0..3, "scatter", choice);
    let (mine, theirs) = &sides[0];
    assert!(
        mine.contains("shape [2]") && theirs.contains("shape [4]"),
        "{mine} / {theirs}"
    );
}

/// Four ranks broadcast from rank 0 down a binomial tree (0 to 2 and 1, 2
/// to 3); rank 3 passes another shape. Rank 2 relays to rank 3, which only
/// receives, and both fail at this call. Ranks 0 and 1 exchanged
/// fingerprints only with ranks that agree with them: they may complete
/// (knowing would take a round over the whole group on every call), and
/// if they fail, they name the mismatch.
fn a_broadcast_relay_fails_when_its_child_disagrees(choice: TransportChoice) {
    let outcomes = run(4, choice, |pg| {
        let t = f32s(if pg.rank() == 3 { &[20, 10] } else { &[20, 2] });
        pg.broadcast(&t, 0, Some(TIMEOUT))?.wait()
    });
    let sides = every_rank_names_it(&outcomes, [2, 3], "broadcast", choice);
    let (mine, theirs) = &sides[0];
    assert!(
        mine.contains("shape [20, 2],") && theirs.contains("shape [20, 10],"),
        "{choice}: {mine} / {theirs}"
    );
    for rank in [0, 1] {
        if let Err(e) = &outcomes[rank] {
            assert!(mismatch(e).is_some(), "{choice} rank {rank}: {e}");
        }
    }
}

/// Three ranks broadcast, disagreeing about the root: each rank its own
/// (everyone only sends), ranks 0 and 1 each naming the other (both only
/// receive) while rank 2 names itself, each naming the next (a circle of
/// receivers). Every rank names the mismatch at this call, with both
/// roots.
fn broadcasts_from_different_roots_on_3_ranks_name_the_mismatch_on_every_rank(
    choice: TransportChoice,
) {
    // [1, 2, 0] and [2, 0, 1]: each rank waits on another in a circle and
    // no message ever flows; the stall check (group/stall_check.rs) finds
    // these.
    for roots in [[0, 1, 2], [1, 0, 2], [1, 2, 0], [2, 0, 1]] {
        let outcomes = run(3, choice, |pg| {
            let t = f32s(&[6]);
            pg.broadcast(&t, roots[pg.rank()], Some(TIMEOUT))?.wait()
        });
        let sides = every_rank_names_it(&outcomes, 0..3, "broadcast", choice);
        for (rank, (mine, theirs)) in sides.iter().enumerate() {
            assert!(
                mine.contains(&format!("root {}", roots[rank])),
                "{choice} {roots:?} rank {rank}: {mine}"
            );
            assert!(
                theirs.contains("root ") && !theirs.contains(&format!("root {})", roots[rank])),
                "{choice} {roots:?} rank {rank}: {theirs}"
            );
        }
    }
}

/// Roots [0, 0, 1]: ranks 0 and 2 disagree and fail at the call; rank 1
/// heard only from rank 0, which agrees with it, so it may complete, and
/// then fails at its next call naming the mismatch of the first.
fn two_agreeing_ranks_against_one_name_the_mismatch_by_the_next_call(choice: TransportChoice) {
    let roots = [0, 0, 1];
    let outcomes = run(3, choice, |pg| {
        let t = f32s(&[6]);
        pg.broadcast(&t, roots[pg.rank()], Some(TIMEOUT))?.wait()?;
        pg.barrier(Some(TIMEOUT))?.wait()
    });
    every_rank_names_it(&outcomes, [0, 2], "broadcast", choice);
    let err = outcomes[1]
        .as_ref()
        .expect_err("rank 1's barrier must fail");
    // It names the broadcast it ran (seq 0, root 0), not its barrier.
    match err {
        Error::CollectiveFailed { op, source, .. } => match source.as_ref() {
            Error::CollectiveMismatch { mine, .. } => {
                assert_eq!(op, "barrier", "{choice}: {err}");
                assert!(
                    mine.starts_with("broadcast (seq 0") && mine.contains("root 0"),
                    "{choice}: {err}"
                );
            }
            other => panic!("{choice}: rank 1 failed without naming the mismatch: {other}"),
        },
        other => panic!("{choice}: {other}"),
    }
}
