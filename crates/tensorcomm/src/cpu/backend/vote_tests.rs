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
use crate::group::backend::Call;
use crate::group::fingerprint::{CollectiveKind, Fingerprint};
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

/// An all_reduce's fingerprint at sequence number 0 over `numel` f32.
fn fingerprint(kind: CollectiveKind, numel: u64) -> Fingerprint {
    Fingerprint {
        kind,
        reduce_op: 1,
        dtype: Some(DType::F32),
        root: 0,
        seq: 0,
        numel,
        shape_hash: 0,
    }
}

/// What rank 1 does while rank 0 votes on an all_reduce of 2 elements.
#[derive(Clone, Copy, Debug)]
enum Peer {
    /// Votes `[1, -1]` on the same call.
    Votes,
    /// Votes on an all_reduce of another size.
    VotesOnAnother,
    /// Sends rank 0 a message of a broadcast instead.
    SendsAnotherCall,
    /// Sends rank 0 a message of this very call without voting.
    SendsThisCall,
}

/// What one rank's vote gave (`None` for a rank that only sent), and the
/// mismatch its call recorded.
type Voted = (Option<Result<[i32; 2]>>, Option<(usize, [u8; 32])>);

/// The vote itself, straight through the backend (no engine, so no stall
/// monitor to find a mismatch on its own), rank 0 voting `[2, 0]`.
fn vote_against(peer: Peer) -> Vec<Voted> {
    use crate::cpu::fingerprinted::Fingerprinted;
    use crate::cpu::transport::Transport;
    let pgs = groups(2, &format!("direct{peer:?}"));
    let mine = fingerprint(CollectiveKind::AllReduce, 2);
    let theirs = match peer {
        Peer::Votes | Peer::SendsThisCall => mine,
        Peer::VotesOnAnother => fingerprint(CollectiveKind::AllReduce, 3),
        Peer::SendsAnotherCall => fingerprint(CollectiveKind::Broadcast, 2),
    };
    let described = Collective::AllReduce {
        tensor: Tensor::zeros(&[2], DType::F32).unwrap(),
        op: ReduceOp::Sum,
    };
    on_every_rank(&pgs, |pg| {
        let deadline = Instant::now() + TIMEOUT;
        let fp = if pg.rank() == 0 { mine } else { theirs };
        let sends = matches!(peer, Peer::SendsAnotherCall | Peer::SendsThisCall);
        if pg.rank() == 1 && sends {
            let t = Fingerprinted::new(&pg.backend.transport, fp, true);
            t.send(0, &[0; 8], deadline).unwrap();
            return (None, None);
        }
        let call = Call::new(fp, deadline);
        let votes = if pg.rank() == 0 { [2, 0] } else { [1, -1] };
        let got = pg.backend.vote(votes, &described, &call);
        (Some(got), call.mismatched())
    })
}

#[test]
fn the_vote_agrees_or_names_the_peer_in_another_call() {
    for (rank, got) in vote_against(Peer::Votes).iter().enumerate() {
        assert!(
            matches!(got, (Some(Ok([1, -1])), None)),
            "rank {rank}: {got:?}"
        );
    }

    let other_size = fingerprint(CollectiveKind::AllReduce, 3).encode();
    let same_size = fingerprint(CollectiveKind::AllReduce, 2).encode();
    let ends = vote_against(Peer::VotesOnAnother);
    for (rank, peer, theirs) in [(0, 1, other_size), (1, 0, same_size)] {
        match &ends[rank] {
            (Some(Err(Error::CollectiveMismatch { peer: p, .. })), Some(seen))
                if *p == peer && *seen == (peer, theirs) => {}
            other => panic!("rank {rank}: expected a mismatch naming rank {peer}, found {other:?}"),
        }
    }

    let broadcast = fingerprint(CollectiveKind::Broadcast, 2).encode();
    match &vote_against(Peer::SendsAnotherCall)[0] {
        (
            Some(Err(Error::CollectiveMismatch {
                peer: 1, theirs, ..
            })),
            Some(seen),
        ) if theirs.contains("broadcast") && *seen == (1, broadcast) => {}
        other => panic!("expected rank 1's broadcast named, found {other:?}"),
    }

    match &vote_against(Peer::SendsThisCall)[0] {
        (
            Some(Err(Error::PeerProtocol {
                peer: 1, expected, ..
            })),
            None,
        ) => {
            assert!(expected.contains("ballot"), "{expected}")
        }
        other => panic!("expected a protocol error naming rank 1, found {other:?}"),
    }
}
