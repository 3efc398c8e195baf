//! One rank of a group passes a tensor of another size than the rest, on
//! the other side of a size threshold: over shared memory the others go
//! through the group's arena while it takes the transport's algorithm (or
//! the other way round). The two paths exchange different messages, so
//! nothing may wait for a message the other path never sends: every rank
//! must finish promptly, well inside the call's timeout, and every rank
//! that fails must report the mismatch, not a timeout.

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

/// f32 elements below every arena threshold (384 B; all_to_all blocks of
/// 48 B at 8 ranks) and above every one (384 KiB; blocks of 48 KiB at 8
/// ranks), divisible by 3 and 8.
const SMALL: usize = 96;
const LARGE: usize = 24 * 4096;

/// The call's timeout; a rank that needs anywhere near it waited for a
/// message that never came.
const TIMEOUT: Duration = Duration::from_secs(20);
const PROMPT: Duration = Duration::from_secs(8);

#[derive(Clone, Copy, Debug)]
enum Op {
    AllReduce,
    Broadcast,
    Reduce,
    Gather,
    Scatter,
    AllToAllSingle,
}

fn call(pg: &ProcessGroupCpu, op: Op, n: usize, root: usize) -> Result<(), Error> {
    let world = pg.size();
    let t = Tensor::zeros(&[n], DType::F32)?;
    let list: Vec<_> = (0..world)
        .map(|_| Tensor::zeros(&[n], DType::F32))
        .collect::<Result<_, _>>()?;
    let list = (pg.rank() == root).then_some(list.as_slice());
    let to = Some(TIMEOUT);
    let work = match op {
        Op::AllReduce => pg.all_reduce(&t, ReduceOp::Sum, to),
        Op::Broadcast => pg.broadcast(&t, root, to),
        Op::Reduce => pg.reduce(&t, root, ReduceOp::Sum, to),
        Op::Gather => pg.gather(&t, list, root, to),
        Op::Scatter => pg.scatter(&t, list, root, to),
        Op::AllToAllSingle => {
            let out = Tensor::zeros(&[n], DType::F32)?;
            pg.all_to_all_single(&out, &t, &[], &[], to)
        }
    }?;
    work.wait()
}

fn mismatch_of(err: &Error) -> Option<&Error> {
    match err {
        Error::CollectiveFailed { source, .. } => match source.as_ref() {
            e @ Error::CollectiveMismatch { .. } => Some(e),
            _ => None,
        },
        _ => None,
    }
}

fn one_rank_on_the_other_path(op: Op, world: usize, root: usize, odd: usize, odd_large: bool) {
    let store = Arc::new(HashStore::new());
    let pgs = groups_over(world, &store, "path", TransportChoice::Shm);
    let started = Instant::now();
    let outcomes = on_every_rank(&pgs, |pg| {
        let large = (pg.rank() == odd) == odd_large;
        let n = if large { LARGE } else { SMALL };
        let result = call(pg, op, n, root);
        (result, started.elapsed())
    });
    let case = format!("{op:?} world {world} root {root} odd rank {odd} (large: {odd_large})");
    for (rank, (result, took)) in outcomes.iter().enumerate() {
        assert!(
            *took < PROMPT,
            "{case}: rank {rank} took {took:?} ({result:?})"
        );
        if let Err(e) = result {
            assert!(
                mismatch_of(e).is_some(),
                "{case}: rank {rank} failed without naming the mismatch: {e}"
            );
        }
    }
    // Somebody always sees it; every rank of an op where every rank
    // receives; and the root of an op where the root receives (a rank
    // that only sends on its path may finish before anyone objects).
    let must_fail: Vec<usize> = match op {
        Op::AllReduce | Op::AllToAllSingle => (0..world).collect(),
        Op::Reduce | Op::Gather => vec![root],
        Op::Broadcast | Op::Scatter => vec![],
    };
    for rank in must_fail {
        assert!(outcomes[rank].0.is_err(), "{case}: rank {rank} succeeded");
    }
    assert!(
        outcomes.iter().any(|o| o.0.is_err()),
        "{case}: every rank succeeded"
    );
}

fn every_case(op: Op) {
    for world in [3, 4, 8] {
        for root in [0, world - 1] {
            for odd in [1, 2, world - 1] {
                for odd_large in [false, true] {
                    one_rank_on_the_other_path(op, world, root, odd, odd_large);
                }
            }
        }
    }
}

#[test]
fn all_reduce() {
    every_case(Op::AllReduce);
}

#[test]
fn broadcast() {
    every_case(Op::Broadcast);
}

#[test]
fn reduce() {
    every_case(Op::Reduce);
}

#[test]
fn gather() {
    every_case(Op::Gather);
}

#[test]
fn scatter() {
    every_case(Op::Scatter);
}

#[test]
fn all_to_all_single() {
    every_case(Op::AllToAllSingle);
}
