//! The vote that opens an all_reduce in a group that may stage CUDA
//! tensors in chunks: every all_reduce of 2 MiB or more votes, in a group
//! one of whose ranks runs on a host with GPUs (here the ranks pretend to,
//! `PRETEND_GPU_HOST`). Over shared memory the vote goes through the
//! arena's ballot lines, with no message: the sums must stay exact call
//! after call, and a rank that is in another call, whether it votes on
//! another all_reduce or sends messages of another collective, must fail
//! every voter promptly with the mismatch named, not with a timeout.

use std::time::Instant;

use super::*;
use crate::cpu::pipeline_choice::PRETEND_GPU_HOST;
use crate::group::{ProcessGroup, ReduceOp};
use crate::store::HashStore;
use crate::tensor::{DType, Tensor};

/// f32 elements of an all_reduce that votes (just over 2 MiB), divisible
/// by 3 and 4 for the all_to_all.
const LARGE: usize = 12 * 43_691;
/// Below the vote's threshold.
const SMALL: usize = 96;

const TIMEOUT: Duration = Duration::from_secs(20);
const PROMPT: Duration = Duration::from_secs(8);

/// `world` ranks over shared memory, each on a host that says it has GPUs.
fn groups(world: usize, prefix: &str) -> Vec<ProcessGroupCpu> {
    groups_over(world, prefix, TransportChoice::Shm)
}

/// [`groups`] over `transport`.
fn groups_over(world: usize, prefix: &str, transport: TransportChoice) -> Vec<ProcessGroupCpu> {
    let store: Arc<dyn Store> = Arc::new(HashStore::new());
    std::thread::scope(|s| {
        let hs: Vec<_> = (0..world)
            .map(|rank| {
                let store = store.clone();
                s.spawn(move || {
                    PRETEND_GPU_HOST.set(true);
                    let options = CpuOptions {
                        timeout: Duration::from_secs(30),
                        transport,
                        ..CpuOptions::default()
                    };
                    ProcessGroupCpu::new(store, prefix, rank, world, &options).unwrap()
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

/// Runs `f` on every group at once; the results in rank order.
fn on_every_rank<T: Send>(
    pgs: &[ProcessGroupCpu],
    f: impl Fn(&ProcessGroupCpu) -> T + Sync,
) -> Vec<T> {
    std::thread::scope(|s| {
        let f = &f;
        let hs: Vec<_> = pgs.iter().map(|pg| s.spawn(move || f(pg))).collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

/// How many ballots rank `pg` took through its arena (none without one).
fn ballots(pg: &ProcessGroupCpu) -> u64 {
    pg.backend
        .arena
        .as_ref()
        .map_or(0, |arena| arena.shm.ballots_taken())
}

#[test]
fn voted_all_reduces_stay_exact_call_after_call() {
    // Over TCP there is no arena: the vote is an all_reduce over the links.
    let cases = [
        (2, TransportChoice::Shm, 8),
        (3, TransportChoice::Shm, 8),
        (4, TransportChoice::Shm, 8),
        (2, TransportChoice::Tcp, 0),
    ];
    for (world, transport, want_ballots) in cases {
        let pgs = groups_over(world, &format!("exact{world}{transport:?}"), transport);
        assert!(pgs.iter().all(|pg| pg.backend.pipelines), "world {world}");
        let wrong = on_every_rank(&pgs, |pg| {
            let mut wrong = 0;
            for call in 0..8usize {
                // Sizes alternate, so a ballot read a round late would
                // carry the wrong fingerprint.
                let n = LARGE + (call % 3) * 4;
                let mine = |i: usize| ((pg.rank() + 1) * (i % 7 + call)) as f32;
                let t = Tensor::from_vec((0..n).map(mine).collect::<Vec<f32>>(), &[n]).unwrap();
                let small = Tensor::from_vec(vec![1.0f32; SMALL], &[SMALL]).unwrap();
                pg.all_reduce(&small, ReduceOp::Sum, Some(TIMEOUT))
                    .unwrap()
                    .wait()
                    .unwrap();
                pg.all_reduce(&t, ReduceOp::Sum, Some(TIMEOUT))
                    .unwrap()
                    .wait()
                    .unwrap();
                let ranks_sum = (world * (world + 1) / 2) as f32;
                let got = t.to_vec::<f32>().unwrap();
                wrong += (0..n)
                    .filter(|&i| got[i] != ranks_sum * (i % 7 + call) as f32)
                    .count();
            }
            wrong
        });
        assert_eq!(wrong, vec![0; world], "world {world} {transport:?}");
        // Over shared memory one ballot per large call, none for the small.
        let taken: Vec<u64> = pgs.iter().map(ballots).collect();
        assert_eq!(
            taken,
            vec![want_ballots; world],
            "world {world} {transport:?}"
        );
    }
}

#[derive(Clone, Copy, Debug)]
enum Odd {
    /// Votes too, on an all_reduce of another size.
    AllReduceOtherSize,
    /// An all_reduce too small to vote.
    AllReduceSmall,
    Broadcast,
    Reduce,
    Gather,
    Scatter,
    AllToAllSingle,
}

fn call(pg: &ProcessGroupCpu, odd: Option<Odd>, root: usize) -> Result<(), Error> {
    let n = match odd {
        Some(Odd::AllReduceOtherSize) => LARGE + 12,
        Some(Odd::AllReduceSmall) => SMALL,
        _ => LARGE,
    };
    let t = Tensor::zeros(&[n], DType::F32)?;
    let list: Vec<_> = (0..pg.size())
        .map(|_| Tensor::zeros(&[n], DType::F32))
        .collect::<Result<_, _>>()?;
    let list = (pg.rank() == root).then_some(list.as_slice());
    let to = Some(TIMEOUT);
    let work = match odd {
        None | Some(Odd::AllReduceOtherSize) | Some(Odd::AllReduceSmall) => {
            pg.all_reduce(&t, ReduceOp::Sum, to)
        }
        Some(Odd::Broadcast) => pg.broadcast(&t, root, to),
        Some(Odd::Reduce) => pg.reduce(&t, root, ReduceOp::Sum, to),
        Some(Odd::Gather) => pg.gather(&t, list, root, to),
        Some(Odd::Scatter) => pg.scatter(&t, list, root, to),
        Some(Odd::AllToAllSingle) => {
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

#[test]
fn a_rank_in_another_call_fails_the_voters_promptly_naming_the_mismatch() {
    use Odd::*;
    let odds = [
        AllReduceOtherSize,
        AllReduceSmall,
        Broadcast,
        Reduce,
        Gather,
        Scatter,
        AllToAllSingle,
    ];
    for world in [2, 3, 4] {
        for odd_rank in [0, world - 1] {
            for root in [0, world - 1] {
                for odd in odds {
                    let case = format!("world {world}, rank {odd_rank} in {odd:?} (root {root})");
                    let pgs = groups(world, &format!("odd{world}{odd_rank}{root}{odd:?}"));
                    let started = Instant::now();
                    let outcomes = on_every_rank(&pgs, |pg| {
                        let mine = (pg.rank() == odd_rank).then_some(odd);
                        (call(pg, mine, root), started.elapsed())
                    });
                    for (rank, (result, took)) in outcomes.iter().enumerate() {
                        assert!(
                            *took < PROMPT,
                            "{case}: rank {rank} took {took:?} ({result:?})"
                        );
                        if rank != odd_rank {
                            assert!(result.is_err(), "{case}: voter {rank} succeeded");
                        }
                        if let Err(e) = result {
                            assert!(
                                mismatch_of(e).is_some(),
                                "{case}: rank {rank} failed without naming the mismatch: {e}"
                            );
                        }
                    }
                }
            }
        }
    }
}
