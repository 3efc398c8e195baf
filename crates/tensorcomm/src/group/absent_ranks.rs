//! Whom a timeout blames. A rank that times out waiting on a peer names
//! that peer, but the peer may itself be waiting: on a rank that never
//! started the collective (stopped by SIGSTOP or a debugger, stuck in its
//! own code), further along a ring, or in an earlier collective that rank
//! never started (a broadcast's subtree below it). The first rank to time
//! out posts the report every other rank keeps (`failure_report.rs`), so
//! without a look around every rank would name a rank that was only
//! waiting, and that rank would name itself.
//!
//! Every rank stalled in a collective has posted its recent calls to the
//! store ([`stall_check`](super::stall_check), 50 ms into the stall, long
//! before any timeout), so the last sequence number in its ring is where
//! it waits. Before a timeout in collective `seq` is reported, the ranks
//! behind `seq` (no ring, or a last call before `seq`) are the suspects,
//! and those furthest behind the culprits: a rank waiting in an earlier
//! collective is ahead of the rank it waits for. When the peer waited on
//! posted that it started `seq` (so it waits too) and is not among the
//! culprits, the timeout names the first of them (all of them in its
//! text); without that evidence the blame stays on the peer. Only the failure path reads the store, within the
//! failure report's patience.
//!
//! Limits: a rank that started the collective and then stopped looks like
//! one that waits (the blame stays where the wait put it); a rank that
//! finished a collective early (a broadcast's root) and called nothing
//! since is behind too.

use super::backend::is_not_queued;
use super::failure_report::FailureBoard;
use super::progress::published_start;
use super::stall_check::{ring_key, ring_last};
use crate::store::read_if_present;
use crate::Error;

/// The ranks furthest behind collective `seq`, given each rank's last
/// started collective (`None`: none posted); empty when every rank has
/// started `seq`. `Option`'s order puts ranks that posted nothing first.
pub(crate) fn furthest_behind(last: &[Option<u64>], seq: u64) -> Vec<usize> {
    let behind = last.iter().filter(|&&l| l < Some(seq));
    let Some(&least) = behind.min() else {
        return Vec::new();
    };
    (0..last.len()).filter(|&r| last[r] == least).collect()
}

/// `err` as rank `rank` of a group of `size` reports it from collective
/// `seq`: unchanged unless it is a timeout waiting on a peer that is not
/// among the ranks furthest behind `seq`; then a timeout naming the first
/// of those (see the module docs).
pub(crate) fn blame_absent(
    board: &FailureBoard,
    (rank, size): (usize, usize),
    seq: u64,
    err: Error,
) -> Error {
    let Error::PeerTimeout {
        peer,
        during,
        timeout,
    } = err
    else {
        return err;
    };
    let last = last_started(board, (rank, size), seq);
    // Blame moves only with evidence that the peer waited on is itself
    // waiting in this collective (its ring says it started it): a peer
    // that posted nothing may simply be the one that never came.
    let (culprits, peer_waits) = match &last {
        Some(last) => (
            furthest_behind(last, seq),
            last.get(peer).copied().flatten() >= Some(seq),
        ),
        None => (Vec::new(), false),
    };
    match culprits.first() {
        Some(&first) if peer_waits && !culprits.contains(&peer) => {
            tracing::debug!(
                seq,
                waited_on = peer,
                ?culprits,
                "timed out on a rank that was itself waiting"
            );
            Error::PeerTimeout {
                peer: first,
                during: format!(
                    "waiting on rank {peer} ({during}), which had started a later collective \
                     than ranks {culprits:?} (the furthest behind collective {seq})"
                ),
                timeout,
            }
        }
        _ => {
            // The peer waited on is stalled in an earlier collective (its
            // ring says so): its own timeout began before this one, and the
            // report it is about to post names the cause, which this rank
            // then tells (`FailureBoard::earlier_cause`). A ring can be
            // stale (the peer stalled there once, then went on), so this
            // only waits a little.
            // A peer that is itself among the furthest behind is the one
            // that never came: nothing to wait for.
            let peer_last = last.as_ref().and_then(|l| l.get(peer).copied().flatten());
            if peer_last.is_some_and(|s| s < seq) && !culprits.contains(&peer) {
                board.await_earlier_failure(seq, EARLIER_REPORT_PATIENCE);
            }
            Error::PeerTimeout {
                peer,
                during,
                timeout,
            }
        }
    }
}

/// How long a timeout on a peer stalled in an earlier collective waits for
/// that collective's report (see [`blame_absent`]).
const EARLIER_REPORT_PATIENCE: std::time::Duration = std::time::Duration::from_secs(1);

/// Each rank's last started collective, the later of what its posted
/// recent calls and (device groups) its watchdog's published progress say
/// (this rank's is `seq`; `None`: nothing posted; a rank posts its calls
/// only when it stalls, so a rank that finished and went idle is known by
/// its progress), read within the store's patience; `None` when the store
/// did not answer.
fn last_started(
    board: &FailureBoard,
    (rank, size): (usize, usize),
    seq: u64,
) -> Option<Vec<Option<u64>>> {
    board.ask(
        "read which collectives the ranks started",
        move |store, prefix| {
            (0..size)
                .map(|r| {
                    if r == rank {
                        return Ok(Some(seq));
                    }
                    // Only a key that is there is read (a get would wait).
                    let posted = read_if_present(store, &ring_key(prefix, r))?
                        .and_then(|ring| ring_last(&ring));
                    Ok(posted.max(published_start(store, prefix, r)?))
                })
                .collect::<crate::Result<Vec<Option<u64>>>>()
        },
    )
}

/// `err`, a device backend's failure to queue collective `seq` before its
/// deadline (NCCL's group end still in progress: NCCL is connecting to a
/// peer that never answers), as a timeout naming the ranks furthest behind
/// `seq` by their posted recent calls (a rank stuck queuing posts them
/// 50 ms into the stall, through the group's stall monitor); unchanged for
/// other errors, or when no rank is behind.
pub(crate) fn blame_unqueued(
    board: &FailureBoard,
    (rank, size): (usize, usize),
    seq: u64,
    err: Error,
    timeout: std::time::Duration,
) -> Error {
    if !is_not_queued(&err) {
        return err;
    }
    let Some(last) = last_started(board, (rank, size), seq) else {
        return err;
    };
    let culprits = furthest_behind(&last, seq);
    if culprits.is_empty() {
        return err;
    }
    let posted: Vec<String> = last
        .iter()
        .enumerate()
        .map(|(r, l)| match l {
            Some(l) => format!("rank {r} had started seq {l}"),
            None => format!("rank {r} had started none"),
        })
        .collect();
    Error::CollectiveTimeout {
        what: format!("collective {seq}, never queued ({err}),"),
        timeout,
        progress: posted.join("; "),
        lagging: culprits,
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::{Duration, Instant};

    use super::*;
    use crate::group::fingerprint::{CollectiveKind, Fingerprint};
    use crate::store::{HashStore, Store};

    fn fp(seq: u64) -> Fingerprint {
        Fingerprint {
            kind: CollectiveKind::AllReduce,
            reduce_op: 1,
            dtype: Some(crate::tensor::DType::F32),
            root: 0,
            seq,
            numel: 8,
            shape_hash: 7,
        }
    }

    fn timed_out(peer: usize) -> Error {
        Error::PeerTimeout {
            peer,
            during: "receiving 32 bytes from it".into(),
            timeout: Duration::from_secs(2),
        }
    }

    #[test]
    fn a_timeout_on_a_peer_stalled_earlier_tells_that_peers_cause() {
        // Rank 1 of 8 timed out in collective 3 on rank 0, whose ring says
        // it is stalled in collective 2 (on rank 6, which was stopped).
        // Rank 0's own timeout posts its report 300 ms later: rank 1 must
        // tell that cause, not blame rank 0 (seen 1 run in 4 at 8 ranks).
        let store: Arc<dyn Store> = Arc::new(HashStore::new());
        store.set(&ring_key("g", 0), &fp(2).encode()).unwrap();
        let rank0 = FailureBoard::new(store.clone(), "g");
        let poster = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(300));
            rank0.settle(&fp(2), 0, timed_out(6), None)
        });
        let board = FailureBoard::new(store, "g");
        let began = Instant::now();
        let err = blame_absent(&board, (1, 8), 3, timed_out(0));
        let (cause, earlier) = board.earlier_cause(3, 1, err, |seq| Some(fp(seq)));
        poster.join().unwrap();
        assert_eq!(earlier, Some(2), "{cause}");
        assert!(
            matches!(&cause, Error::PeerTimeout { peer: 6, .. }),
            "{cause:?}"
        );
        assert!(
            began.elapsed() < EARLIER_REPORT_PATIENCE,
            "{:?}",
            began.elapsed()
        );
    }

    #[test]
    fn a_timeout_on_the_rank_furthest_behind_names_it_without_waiting() {
        // Rank 1 of 3 timed out in collective 3 on rank 0, whose ring is
        // stale (it stalled in collective 1 once, then stopped before 3);
        // rank 2 waits in 3 too. Rank 0 is the furthest behind: the one
        // that never came, named at once, with no report to wait for.
        let store: Arc<dyn Store> = Arc::new(HashStore::new());
        store.set(&ring_key("g", 0), &fp(1).encode()).unwrap();
        store.set(&ring_key("g", 2), &fp(3).encode()).unwrap();
        let board = FailureBoard::new(store, "g");
        let began = Instant::now();
        let err = blame_absent(&board, (1, 3), 3, timed_out(0));
        assert!(matches!(err, Error::PeerTimeout { peer: 0, .. }), "{err:?}");
        assert!(
            began.elapsed() < EARLIER_REPORT_PATIENCE / 2,
            "{:?}",
            began.elapsed()
        );
    }

    #[test]
    fn the_ranks_furthest_behind_are_the_culprits() {
        // Rank 2 waits in collective 4 on rank 3, which posted nothing.
        assert_eq!(furthest_behind(&[Some(5), Some(5), Some(4), None], 5), [3]);
        // A stale ring (collective 0) is further behind than a wait in 4.
        assert_eq!(furthest_behind(&[Some(5), Some(0), Some(4)], 5), [1]);
        assert_eq!(furthest_behind(&[Some(5), Some(3), Some(3)], 5), [1, 2]);
        assert!(furthest_behind(&[Some(5), Some(6), Some(5)], 5).is_empty());
    }
}
