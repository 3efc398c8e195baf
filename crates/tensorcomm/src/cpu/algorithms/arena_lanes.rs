//! What the shared-memory all-reduces (`all_reduce_shm_arena.rs`, staged through the
//! arena; `all_reduce_shm_symmetric.rs`, straight out of symmetric memory) have in
//! common: the barrier that opens a call and checks that every rank makes
//! the same kind of call, and lanes (one per thread of a rank) that wait,
//! in the arena's progress counters, for the same lane of other ranks.
//!
//! Every call through the arena opens with [`barrier_with_every_peer`]:
//! each rank takes the arena or the transport by the size of its own
//! tensors, so a rank whose size differs from the others' may take the
//! other path, and only a first message from every peer is sure to meet
//! the other path's messages (and their fingerprints), whatever they are.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use crate::cpu::helper_threads::first_error;
use crate::cpu::transport::shm::{Backoff, Milestone, Progress, ShmArena, ShmWait};
use crate::cpu::transport::Transport;
use crate::cpu::HelperThreads;
use crate::{Error, Result};

/// Waits until every rank of `t` has reached this call: `ceil(log2 N)`
/// rounds, in round `i` signalling rank `+2^i` and waiting on rank `-2^i`.
pub(super) fn barrier(t: &dyn Transport, deadline: Instant) -> Result<()> {
    barrier_agreeing(t, &[1], &|_| "a barrier".to_string(), deadline)
}

/// [`barrier`] that also checks that every rank passes the same `value`
/// (the same length on every rank): each round's message carries it, and
/// a rank that hears another fails with [`Error::CollectiveMismatch`]
/// naming the peer and both values (`what` describes one). Round 0 links
/// every rank to the one before it, so if any two ranks differ, some rank
/// notices (and its failure report reaches the others).
pub(super) fn barrier_agreeing(
    t: &dyn Transport,
    value: &[u8],
    what: &dyn Fn(&[u8]) -> String,
    deadline: Instant,
) -> Result<()> {
    let (rank, world) = (t.rank(), t.world_size());
    let mut theirs = vec![0u8; value.len()];
    let mut distance = 1;
    while distance < world {
        let to = (rank + distance) % world;
        let from = (rank + world - distance) % world;
        t.send_recv(to, value, from, &mut theirs, deadline)?;
        agrees(rank, from, value, &theirs, what)?;
        distance *= 2;
    }
    Ok(())
}

/// [`Error::CollectiveMismatch`] naming `peer` and both values (`what`
/// describes one) unless `theirs`, heard from `peer`, is `mine`.
fn agrees(
    rank: usize,
    peer: usize,
    mine: &[u8],
    theirs: &[u8],
    what: &dyn Fn(&[u8]) -> String,
) -> Result<()> {
    if theirs == mine {
        return Ok(());
    }
    Err(Error::CollectiveMismatch {
        rank,
        peer,
        mine: what(mine),
        theirs: what(theirs),
    })
}

/// How often [`barrier_with_every_peer`] asks after the peers it has
/// already heard from.
const ALIVE_EVERY: Duration = Duration::from_millis(1);

/// How long [`barrier_with_every_peer`] still waits for the peers it has
/// not heard from once a peer it has heard from is gone. That peer may
/// have left for good reason (it heard from everyone, finished the call
/// and dropped its group) while a peer still to come was only slow; or
/// it may have failed (it found a mismatch), and then the peers still to
/// come never send.
const GONE_GRACE: Duration = Duration::from_secs(2);

/// A barrier in which every rank hears from every other: each sends
/// `value` to every peer, then takes the peers' messages as they arrive,
/// checking each as [`barrier_agreeing`] does. It opens a call whose ranks
/// chose the arena by their own tensors' sizes. A rank of the same call
/// that took an algorithm over the transport instead (its size differs)
/// either sends this rank something, whose fingerprint then fails the
/// receive with [`Error::CollectiveMismatch`], or receives something from
/// a rank here, which fails there; a rank that fails closes its links, and
/// a rank waiting here notices a closed link of any peer it has not heard
/// from. So a mismatch fails the call promptly instead of leaving a rank
/// waiting for a message the other path never sends. A peer heard from
/// that is gone later (asked every millisecond or so, through
/// [`Transport::check_alive`]) fails the barrier if the peers still to
/// come do not send within [`GONE_GRACE`]. Past it, every rank has
/// finished its previous call. It polls the links' `has_data` itself, so
/// it waits by `wait` (the arena's, [`ShmArena::wait`]) between polls:
/// with [`ShmWait::Sleep`] it sleeps on the data of a peer it has not
/// heard from ([`Transport::sleep_for_data`]), which it cannot pass the
/// barrier without, so that peer's message wakes it; messages from the
/// others are taken when it wakes.
pub(super) fn barrier_with_every_peer(
    t: &dyn Transport,
    value: &[u8],
    what: &dyn Fn(&[u8]) -> String,
    wait: ShmWait,
    deadline: Instant,
) -> Result<()> {
    let (rank, world) = (t.rank(), t.world_size());
    for q in (0..world).filter(|&q| q != rank) {
        t.send(q, value, deadline)?;
    }
    let mut waiting: Vec<usize> = (0..world).filter(|&q| q != rank).collect();
    let mut theirs = vec![0u8; value.len()];
    let mut backoff = Backoff::with(wait);
    let mut asked = Instant::now();
    // A peer heard from that has gone since, and when that was seen.
    let mut gone: Option<(Instant, Error)> = None;
    while !waiting.is_empty() {
        // Past the deadline, the receive from a silent peer fails naming it.
        let late = Instant::now() >= deadline;
        let mut heard = false;
        let mut i = 0;
        while i < waiting.len() {
            let q = waiting[i];
            if late || t.has_data(q)? {
                t.recv(q, &mut theirs, deadline)?;
                agrees(rank, q, value, &theirs, what)?;
                waiting.swap_remove(i);
                heard = true;
            } else {
                i += 1;
            }
        }
        if heard {
            backoff.reset();
            continue;
        }
        if gone.is_some() {
            if let Some((_, e)) = gone.take_if(|(since, _)| since.elapsed() >= GONE_GRACE) {
                return Err(e);
            }
        } else if asked.elapsed() >= ALIVE_EVERY {
            // A peer heard from may have failed since (it found the
            // mismatch, say), and the peers still to come then never
            // send: its closed links say so (see GONE_GRACE).
            let heard = (0..world).filter(|q| *q != rank && !waiting.contains(q));
            if let Some(e) = heard.filter_map(|q| t.check_alive(q).err()).next() {
                gone = Some((Instant::now(), e));
            }
            asked = Instant::now();
        }
        match wait {
            // Woken by the peer's message (or its closing); never past the
            // deadline, where the receive above fails naming the peer.
            ShmWait::Sleep => backoff.snooze_on(|d| {
                let d = d.min(deadline.saturating_duration_since(Instant::now()));
                t.sleep_for_data(waiting[0], d)
            }),
            _ => backoff.snooze(),
        }
    }
    Ok(())
}

/// The barriers of one call of an arena algorithm whose ranks chose the
/// arena by their own sizes: the first is [`barrier_with_every_peer`], the
/// others the cheaper [`barrier`].
pub(super) struct CallBarriers<'a> {
    t: &'a dyn Transport,
    /// How the first barrier waits between polls (the arena's).
    wait: ShmWait,
    deadline: Instant,
    opened: bool,
}

impl<'a> CallBarriers<'a> {
    pub(super) fn new(t: &'a dyn Transport, wait: ShmWait, deadline: Instant) -> CallBarriers<'a> {
        CallBarriers {
            t,
            wait,
            deadline,
            opened: false,
        }
    }

    /// Waits until every rank has reached the same barrier of the call.
    pub(super) fn pass(&mut self) -> Result<()> {
        if std::mem::replace(&mut self.opened, true) {
            barrier(self.t, self.deadline)
        } else {
            barrier_with_every_peer(
                self.t,
                &[1],
                &|_| "a barrier".to_string(),
                self.wait,
                self.deadline,
            )
        }
    }
}

/// What every rank of a shared-memory all-reduce must agree on before it
/// starts: the number of lanes (the work's split depends on it) and, for
/// a tensor in symmetric memory, which allocation and where in it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct ArenaCall {
    pub threads: u8,
    /// The symmetric allocation's number and the tensor's byte offset in
    /// it; `None` for a call staged through the arena.
    pub symmetric: Option<(u64, u64)>,
}

const ARENA_CALL_LEN: usize = 17;

impl ArenaCall {
    fn encode(self) -> [u8; ARENA_CALL_LEN] {
        let (id, offset) = self.symmetric.unwrap_or((u64::MAX, u64::MAX));
        let mut out = [0u8; ARENA_CALL_LEN];
        out[0] = self.threads;
        out[1..9].copy_from_slice(&id.to_le_bytes());
        out[9..].copy_from_slice(&offset.to_le_bytes());
        out
    }

    fn describe(bytes: &[u8]) -> String {
        let word = |at: usize| {
            bytes
                .get(at..at + 8)
                .and_then(|b| b.try_into().ok())
                .map_or(u64::MAX, u64::from_le_bytes)
        };
        let threads = bytes.first().copied().unwrap_or(0);
        match (word(1), word(9)) {
            (u64::MAX, _) => format!(
                "all_reduce of a private tensor, staged through the shared-memory arena with {threads} threads per rank"
            ),
            (id, offset) => format!(
                "all_reduce of a tensor at byte {offset} of symmetric allocation {id}, with {threads} threads per rank"
            ),
        }
    }

    /// Opens the call: a barrier that fails with
    /// [`Error::CollectiveMismatch`] when ranks make different calls, and
    /// in which every rank hears from every other
    /// ([`barrier_with_every_peer`]): ranks choose the arena by the size
    /// of their own tensor. Past it, every rank has finished its previous
    /// call. It waits by `wait` (the arena's, [`ShmArena::wait`]).
    pub(super) fn open(self, t: &dyn Transport, wait: ShmWait, deadline: Instant) -> Result<()> {
        barrier_with_every_peer(t, &self.encode(), &ArenaCall::describe, wait, deadline)
    }
}

/// How one lane of one rank waits for the same lane of the others.
pub(super) struct LaneWaiter<'b> {
    pub t: &'b dyn Transport,
    pub arena: &'b ShmArena,
    pub lane: usize,
    /// When the call started, and when it must end.
    pub started: Instant,
    pub deadline: Instant,
    /// Set by a lane of this rank that failed: the others stop waiting.
    pub failed: &'b AtomicBool,
}

impl LaneWaiter<'_> {
    /// Waits until every other rank's lane has done `kind` for `step`;
    /// false if another lane of this rank failed meanwhile.
    pub(super) fn wait_all(&self, kind: Progress, step: u64) -> Result<bool> {
        let rank = self.t.rank();
        for q in (0..self.t.world_size()).filter(|&q| q != rank) {
            if !self.wait_for(q, kind, step)? {
                return Ok(false);
            }
        }
        Ok(true)
    }

    /// Waits until rank `q`'s lane has done `kind` for `step`; false if
    /// another lane of this rank failed meanwhile.
    pub(super) fn wait_for(&self, q: usize, kind: Progress, step: u64) -> Result<bool> {
        let (rank, world) = (self.t.rank(), self.t.world_size());
        let milestone = Milestone {
            rank: q,
            lane: self.lane,
            kind,
            step,
        };
        // Asks after `q` first, then every other peer: if `q` itself waits
        // for a dead rank, that one is named.
        let alive = || {
            self.t.check_alive(q)?;
            (0..world)
                .filter(|&p| p != rank && p != q)
                .try_for_each(|p| self.t.check_alive(p))
        };
        self.arena.wait_progress(
            milestone,
            (self.started, self.deadline),
            &|| self.failed.load(Ordering::Acquire),
            &alive,
        )
    }

    /// Publishes that this rank's lane has done `kind` for `step`.
    pub(super) fn publish(&self, kind: Progress, step: u64) {
        self.arena.publish(self.lane, kind, step);
    }
}

/// Raises a rank's `failed` flag when dropped: held by a lane until it
/// has succeeded, so an error or a panic stops the rank's other lanes.
struct StopOthers<'a>(&'a AtomicBool);

impl Drop for StopOthers<'_> {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Release);
    }
}

/// Runs `lanes[i]` through `run` on the calling thread (lane 0) and
/// helpers, all at once; a lane that fails or panics raises `failed`, so
/// the others stop waiting. The first error (a panic named `what`) wins.
pub(super) fn run_lanes<L: Send>(
    helpers: &HelperThreads,
    lanes: Vec<L>,
    failed: &AtomicBool,
    run: impl Fn(&mut L) -> Result<()> + Sync,
    what: &str,
) -> Result<()> {
    let lanes: Vec<Mutex<L>> = lanes.into_iter().map(Mutex::new).collect();
    let outcomes = helpers.run(lanes.len(), |i| -> Result<()> {
        let stop = StopOthers(failed);
        let mut lane = lanes[i].lock().unwrap_or_else(PoisonError::into_inner);
        let outcome = run(&mut lane);
        if outcome.is_ok() {
            std::mem::forget(stop);
        }
        outcome
    });
    first_error(outcomes, what)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpu::algorithms::testing::{deadline, run_ranks};

    /// Rank 2 runs the barrier's own steps but is held up for 50 ms
    /// between its sends to ranks 0 and 1; rank 0 hears from everyone,
    /// leaves and drops its transport (as a broadcast root with one chunk
    /// may leave the whole call). Rank 1, which heard from rank 0 and still
    /// waits for rank 2, passes: rank 0 left for good reason.
    #[test]
    fn a_peer_that_left_a_passed_barrier_does_not_fail_a_slower_rank() {
        let results = run_ranks(3, |t| -> Result<()> {
            let v = [1u8];
            if t.rank() == 2 {
                t.send(0, &v, deadline())?;
                std::thread::sleep(Duration::from_millis(50));
                t.send(1, &v, deadline())?;
                let mut b = [0u8; 1];
                t.recv(0, &mut b, deadline())?;
                t.recv(1, &mut b, deadline())
            } else {
                barrier_with_every_peer(t, &v, &|_| "a barrier".into(), ShmWait::Spin, deadline())
            }
        });
        for (rank, r) in results.iter().enumerate() {
            assert!(r.is_ok(), "rank {rank}: {r:?}");
        }
    }

    /// Rank 0 hears from everyone and leaves; rank 2 never sends rank 1
    /// anything. Rank 1 fails within the grace after rank 0 is gone,
    /// naming it, instead of waiting for its deadline.
    #[test]
    fn a_gone_peer_fails_a_barrier_whose_other_peers_never_come() {
        let started = Instant::now();
        let results = run_ranks(3, |t| -> Result<()> {
            let v = [1u8];
            match t.rank() {
                2 => {
                    t.send(0, &v, deadline())?;
                    let mut b = [0u8; 1];
                    t.recv(0, &mut b, deadline())?;
                    // Stays until rank 1 has given up.
                    std::thread::sleep(GONE_GRACE + Duration::from_secs(1));
                    Ok(())
                }
                _ => barrier_with_every_peer(
                    t,
                    &v,
                    &|_| "a barrier".into(),
                    ShmWait::Spin,
                    deadline(),
                ),
            }
        });
        assert!(results[0].is_ok(), "{:?}", results[0]);
        assert!(
            matches!(results[1], Err(Error::PeerClosed { peer: 0, .. })),
            "{:?}",
            results[1]
        );
        assert!(started.elapsed() < GONE_GRACE + Duration::from_secs(5));
    }

    /// `inner`, recording when each `sleep_for_data` was asked for and
    /// for how long.
    struct SleepsRecorded<'a> {
        inner: &'a dyn Transport,
        asked: Mutex<Vec<(Instant, Duration)>>,
    }

    impl Transport for SleepsRecorded<'_> {
        fn rank(&self) -> usize {
            self.inner.rank()
        }
        fn world_size(&self) -> usize {
            self.inner.world_size()
        }
        fn send(&self, to: usize, data: &[u8], deadline: Instant) -> Result<()> {
            self.inner.send(to, data, deadline)
        }
        fn recv(&self, from: usize, buf: &mut [u8], deadline: Instant) -> Result<()> {
            self.inner.recv(from, buf, deadline)
        }
        fn send_recv(
            &self,
            to: usize,
            data: &[u8],
            from: usize,
            buf: &mut [u8],
            deadline: Instant,
        ) -> Result<()> {
            self.inner.send_recv(to, data, from, buf, deadline)
        }
        fn check_alive(&self, peer: usize) -> Result<()> {
            self.inner.check_alive(peer)
        }
        fn has_data(&self, from: usize) -> Result<bool> {
            self.inner.has_data(from)
        }
        fn sleep_for_data(&self, from: usize, timeout: Duration) {
            self.asked.lock().unwrap().push((Instant::now(), timeout));
            self.inner.sleep_for_data(from, timeout);
        }
        fn abort(&self) {
            self.inner.abort()
        }
    }

    /// A sleeping barrier whose peer never comes asks for sleeps that
    /// end by the call's deadline (they grow to 20 ms otherwise), and
    /// fails at the deadline naming the peer. (Over TCP, whose
    /// `sleep_for_data` sleeps a millisecond at most: only what is asked
    /// matters here.)
    #[test]
    fn a_sleeping_barrier_never_sleeps_past_its_deadline() {
        let results = run_ranks(2, |t| -> Result<Vec<(Instant, Duration)>> {
            if t.rank() == 1 {
                // Silent until rank 0 has given up.
                std::thread::sleep(Duration::from_millis(500));
                return Ok(Vec::new());
            }
            let t = SleepsRecorded {
                inner: t,
                asked: Mutex::new(Vec::new()),
            };
            let deadline = Instant::now() + Duration::from_millis(80);
            let what = |_: &[u8]| "a barrier".to_string();
            let outcome = barrier_with_every_peer(&t, &[1], &what, ShmWait::Sleep, deadline);
            assert!(
                matches!(outcome, Err(Error::PeerTimeout { peer: 1, .. })),
                "{outcome:?}"
            );
            let asked = t.asked.into_inner().unwrap();
            assert!(!asked.is_empty(), "the barrier never slept");
            // (`at` is taken a moment after the barrier measured what
            // was left; uncapped, the last sleeps overshoot by ~20 ms.)
            for &(at, timeout) in &asked {
                assert!(
                    at + timeout <= deadline + Duration::from_millis(2),
                    "asked at {:?} before the deadline to sleep {timeout:?}",
                    deadline - at
                );
            }
            Ok(asked)
        });
        results[0].as_ref().unwrap();
    }
}
