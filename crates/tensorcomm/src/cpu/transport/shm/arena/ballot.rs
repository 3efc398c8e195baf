//! [`ShmArena::ballot`]: every rank of the arena posts two numbers under a
//! tag and learns the element-wise minimum over all ranks, through lines
//! of shared memory and no message: about one cache-line transfer per
//! peer, where an all_reduce of the same 8 bytes over the group's links
//! takes several microseconds.
//!
//! # The lines
//!
//! Each rank has two ballot lines (parity 0 and 1) after the arena's
//! counters. Ballot `b` (counted by every rank alike: the ranks take the
//! same ballots in the same order) uses parity `b % 2`. A rank writes its
//! tag and votes into its line, then stores `b + 1` as the line's round
//! (Release) and wakes whoever sleeps on the line's signal; it then waits
//! for every peer's line of that parity to reach round `b + 1` (Acquire),
//! and reads the peer's tag and votes.
//!
//! A line is not overwritten while a peer may still read it: a rank
//! rewrites parity `b % 2` only for ballot `b + 2`, which it starts after
//! ballot `b + 1` ended, that is after every peer posted `b + 1`, which
//! each does only after reading every line of ballot `b`.
//!
//! # Tags, and peers that went elsewhere
//!
//! The tag says what the ballot is for (the CPU group passes the call's
//! fingerprint). A peer whose tag differs ends the ballot as
//! [`BallotEnd::Mismatched`]. A peer that is in another call altogether
//! never posts; the caller's `elsewhere` says when it has shown it (the
//! CPU group: it sent this rank a message over the links, which a peer
//! still voting cannot have done), and the ballot ends as
//! [`BallotEnd::Elsewhere`] unless the peer's line shows it posted after
//! all. A peer that neither posts nor shows itself elsewhere is waited
//! for until the call's deadline, as any wait in the arena is.
//!
//! Only the CPU group's votes on how CUDA tensors go use it.
#![cfg_attr(not(feature = "cuda"), allow(dead_code))]

use std::sync::atomic::{AtomicI32, AtomicU64, Ordering};
use std::time::Instant;

use super::{Awaited, ShmArena, Signal, LINE};
use crate::Result;

/// Bytes of a ballot's tag.
pub(crate) const BALLOT_TAG_LEN: usize = 32;

/// Where the line's [`Signal`] lies, after the round.
const SIGNAL_AT: usize = 8;
/// Where the tag lies, as `BALLOT_TAG_LEN / 8` 64-bit words.
const TAG_AT: usize = 16;
/// Where the two votes lie.
const VOTES_AT: usize = TAG_AT + BALLOT_TAG_LEN;

const _: () = assert!(
    SIGNAL_AT + std::mem::size_of::<Signal>() <= TAG_AT
        && BALLOT_TAG_LEN.is_multiple_of(8)
        && VOTES_AT + 2 * std::mem::size_of::<AtomicI32>() <= LINE
);

/// Ballot lines in a `world_size`-rank arena: two per rank.
pub(super) fn lines(world_size: usize) -> usize {
    world_size * 2
}

/// How a ballot ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum BallotEnd {
    /// Every rank posted under this rank's tag: the element-wise minimum
    /// of every rank's votes.
    Agreed([i32; 2]),
    /// `peer` posted under `theirs`, another tag.
    Mismatched {
        peer: usize,
        theirs: [u8; BALLOT_TAG_LEN],
    },
    /// `peer` showed itself elsewhere (the caller's `elsewhere`) and had
    /// not posted.
    Elsewhere { peer: usize },
}

/// One rank's ballot line of one parity, seen through the mapping.
struct Line<'a> {
    round: &'a AtomicU64,
    signal: &'a Signal,
    tag: [&'a AtomicU64; BALLOT_TAG_LEN / 8],
    votes: [&'a AtomicI32; 2],
}

impl Line<'_> {
    fn read_tag(&self) -> [u8; BALLOT_TAG_LEN] {
        let mut tag = [0u8; BALLOT_TAG_LEN];
        for (word, out) in self.tag.iter().zip(tag.chunks_exact_mut(8)) {
            out.copy_from_slice(&word.load(Ordering::Relaxed).to_le_bytes());
        }
        tag
    }

    fn write_tag(&self, tag: &[u8; BALLOT_TAG_LEN]) {
        for (word, bytes) in self.tag.iter().zip(tag.chunks_exact(8)) {
            let mut b = [0u8; 8];
            b.copy_from_slice(bytes);
            word.store(u64::from_le_bytes(b), Ordering::Relaxed);
        }
    }
}

impl ShmArena {
    /// The ballot line of `rank` for `parity`.
    fn ballot_line(&self, rank: usize, parity: usize) -> Line<'_> {
        assert!(
            rank < self.world_size && parity < 2,
            "ballot line out of bounds: rank {rank} parity {parity}"
        );
        let at = (super::counter_lines(self.world_size) + 1 + rank * 2 + parity) * LINE;
        let base = self.segment.base().as_ptr();
        // SAFETY: `at` is a line of the ballot region inside the control
        // region at the start of the mapping (`control_len` counts
        // `lines`), 64-byte aligned in a page-aligned mapping that lives as
        // long as self; the offsets within the line are aligned for their
        // types and fit in it (the assertion above); only atomics (and the
        // Signal's atomics) touch it, and zeroed bytes are a valid value
        // of each (round 0: no ballot posted yet).
        unsafe {
            let word = |off: usize| &*base.add(at + off).cast::<AtomicU64>();
            let vote = |off: usize| &*base.add(at + off).cast::<AtomicI32>();
            Line {
                round: word(0),
                signal: &*base.add(at + SIGNAL_AT).cast::<Signal>(),
                tag: [
                    word(TAG_AT),
                    word(TAG_AT + 8),
                    word(TAG_AT + 16),
                    word(TAG_AT + 24),
                ],
                votes: [vote(VOTES_AT), vote(VOTES_AT + 4)],
            }
        }
    }

    /// How many ballots this rank has taken.
    #[cfg(test)]
    pub(crate) fn ballots_taken(&self) -> u64 {
        self.ballots.load(Ordering::Relaxed)
    }

    /// Posts `votes` under `tag` and waits for every other rank's post of
    /// the same ballot (see the module docs): [`BallotEnd::Agreed`] with
    /// the element-wise minimum when every rank posted under `tag`.
    ///
    /// While it waits for a peer it asks `elsewhere(peer)` at every turn
    /// of the wait, and `alive(peer)` (then every other peer) every few milliseconds;
    /// an `alive` error, or the deadline of the call `(started, deadline)`,
    /// ends it with that error, naming the peer. A ballot that did not end
    /// `Agreed` leaves the ranks' ballot counts apart: the caller fails its
    /// call, which takes the group down.
    pub(crate) fn ballot(
        &self,
        tag: &[u8; BALLOT_TAG_LEN],
        votes: [i32; 2],
        call: (Instant, Instant),
        elsewhere: &dyn Fn(usize) -> bool,
        alive: &dyn Fn(usize) -> Result<()>,
    ) -> Result<BallotEnd> {
        let ballot = self.ballots.fetch_add(1, Ordering::Relaxed);
        let parity = (ballot % 2) as usize;
        let mine = self.ballot_line(self.rank, parity);
        mine.write_tag(tag);
        for (slot, v) in mine.votes.iter().zip(votes) {
            slot.store(v, Ordering::Relaxed);
        }
        mine.round.store(ballot + 1, Ordering::Release);
        // Unconditionally (one fence): a peer may have taken a sleeping
        // wait since the last barrier this rank passed.
        mine.signal.notify();
        let mut least = votes;
        for peer in (0..self.world_size).filter(|&p| p != self.rank) {
            let theirs = self.ballot_line(peer, parity);
            let all_alive = || {
                alive(peer)?;
                (0..self.world_size)
                    .filter(|&p| p != self.rank && p != peer)
                    .try_for_each(alive)
            };
            let awaited = Awaited {
                peer,
                counter: theirs.round,
                signal: theirs.signal,
                past: ballot,
                closed: &|| {
                    format!(
                        "rank {} waited in shared memory for rank {peer}'s ballot {ballot}",
                        self.rank
                    )
                },
                timed_out: &|| format!("waiting in shared memory for its ballot {ballot}"),
            };
            let posted = self.wait_for(awaited, call, &|| elsewhere(peer), &all_alive)?;
            // It may have posted just before showing itself elsewhere.
            if !posted && theirs.round.load(Ordering::Acquire) <= ballot {
                return Ok(BallotEnd::Elsewhere { peer });
            }
            let their_tag = theirs.read_tag();
            if &their_tag != tag {
                return Ok(BallotEnd::Mismatched {
                    peer,
                    theirs: their_tag,
                });
            }
            for (l, v) in least.iter_mut().zip(theirs.votes) {
                *l = (*l).min(v.load(Ordering::Relaxed));
            }
        }
        Ok(BallotEnd::Agreed(least))
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use super::*;
    use crate::cpu::transport::shm::ShmWait;
    use crate::store::HashStore;
    use crate::Error;

    fn arenas(n: usize, prefix: &str) -> Vec<ShmArena> {
        let store = Arc::new(HashStore::new());
        std::thread::scope(|s| {
            let hs: Vec<_> = (0..n)
                .map(|rank| {
                    let store = store.clone();
                    s.spawn(move || {
                        ShmArena::connect(&*store, prefix, rank, n, 64, Duration::from_secs(10))
                            .unwrap()
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        })
    }

    fn within(d: Duration) -> (Instant, Instant) {
        let now = Instant::now();
        (now, now + d)
    }

    fn never(_: usize) -> bool {
        false
    }

    fn fine(_: usize) -> Result<()> {
        Ok(())
    }

    /// Rank `r`'s votes in ballot `b`: different on every rank and ballot.
    fn votes_of(r: usize, b: usize) -> [i32; 2] {
        let x = (r * 7919 + b * 104_729) % 1000;
        [x as i32 - 500, (b % 3) as i32 - r as i32]
    }

    #[test]
    fn every_rank_learns_the_minimum_ballot_after_ballot() {
        for (n, wait) in [(2, ShmWait::Spin), (3, ShmWait::Spin), (4, ShmWait::Sleep)] {
            let mut arenas = arenas(n, &format!("min{n}"));
            for a in &mut arenas {
                a.set_wait(wait);
            }
            let rounds = 2000;
            let results: Vec<Vec<BallotEnd>> = std::thread::scope(|s| {
                let hs: Vec<_> = arenas
                    .iter()
                    .enumerate()
                    .map(|(r, a)| {
                        s.spawn(move || {
                            (0..rounds)
                                .map(|b| {
                                    let tag = [b as u8; BALLOT_TAG_LEN];
                                    let call = within(Duration::from_secs(30));
                                    a.ballot(&tag, votes_of(r, b), call, &never, &fine).unwrap()
                                })
                                .collect()
                        })
                    })
                    .collect();
                hs.into_iter().map(|h| h.join().unwrap()).collect()
            });
            for b in 0..rounds {
                let want = (0..n)
                    .map(|r| votes_of(r, b))
                    .fold([i32::MAX; 2], |acc, v| [acc[0].min(v[0]), acc[1].min(v[1])]);
                for (r, got) in results.iter().enumerate() {
                    assert_eq!(got[b], BallotEnd::Agreed(want), "n {n} rank {r} ballot {b}");
                }
            }
        }
    }

    #[test]
    fn a_peer_posting_under_another_tag_is_named_with_its_tag() {
        let arenas = arenas(3, "tag");
        let ends: Vec<BallotEnd> = std::thread::scope(|s| {
            let hs: Vec<_> = arenas
                .iter()
                .enumerate()
                .map(|(r, a)| {
                    s.spawn(move || {
                        let tag = [u8::from(r == 2); BALLOT_TAG_LEN];
                        let call = within(Duration::from_secs(10));
                        a.ballot(&tag, [1, 1], call, &never, &fine).unwrap()
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        let odd = |peer| BallotEnd::Mismatched {
            peer,
            theirs: [u8::from(peer == 2); BALLOT_TAG_LEN],
        };
        assert_eq!(ends[0], odd(2));
        assert_eq!(ends[1], odd(2));
        assert_eq!(ends[2], odd(0));
    }

    #[test]
    fn a_peer_that_never_posts_is_named_at_the_deadline() {
        let arenas = arenas(3, "late");
        let call = within(Duration::from_secs(1));
        // Rank 1 posts, rank 2 never does.
        let ends = std::thread::scope(|s| {
            let one =
                s.spawn(|| arenas[1].ballot(&[0; BALLOT_TAG_LEN], [0, 0], call, &never, &fine));
            let zero = arenas[0].ballot(&[0; BALLOT_TAG_LEN], [0, 0], call, &never, &fine);
            (zero, one.join().unwrap())
        });
        for (rank, end) in [(0, ends.0), (1, ends.1)] {
            match end {
                Err(Error::PeerTimeout {
                    peer: 2, during, ..
                }) => {
                    assert!(during.contains("ballot 0"), "rank {rank}: {during}")
                }
                other => panic!("rank {rank}: expected a timeout naming rank 2, found {other:?}"),
            }
        }
    }

    #[test]
    fn a_peer_shown_elsewhere_ends_the_ballot_unless_it_posted() {
        let arenas = arenas(2, "away");
        let call = within(Duration::from_secs(10));
        let away = |p: usize| p == 1;
        assert_eq!(
            arenas[0]
                .ballot(&[0; BALLOT_TAG_LEN], [3, 4], call, &away, &fine)
                .unwrap(),
            BallotEnd::Elsewhere { peer: 1 }
        );
        // Rank 1 posts that ballot just before it is seen elsewhere (after
        // rank 0 last looked at its line): counted, not called away.
        let arenas = self::arenas(2, "back");
        let posts_then_away = |p: usize| {
            let line = arenas[0].ballot_line(1, 0);
            line.write_tag(&[0; BALLOT_TAG_LEN]);
            line.votes[0].store(5, Ordering::Relaxed);
            line.votes[1].store(1, Ordering::Relaxed);
            line.round.store(1, Ordering::Release);
            p == 1
        };
        let zero = arenas[0].ballot(&[0; BALLOT_TAG_LEN], [3, 4], call, &posts_then_away, &fine);
        assert_eq!(zero.unwrap(), BallotEnd::Agreed([3, 1]));
    }

    #[test]
    fn a_dead_peer_found_while_waiting_is_named() {
        let arenas = arenas(2, "dead");
        let call = within(Duration::from_secs(10));
        let gone = |p: usize| {
            Err(Error::PeerClosed {
                peer: p,
                during: String::new(),
                reason: "its process exited".into(),
            })
        };
        match arenas[0].ballot(&[0; BALLOT_TAG_LEN], [0, 0], call, &never, &gone) {
            Err(Error::PeerClosed {
                peer: 1,
                during,
                reason,
            }) => {
                assert!(during.contains("rank 1's ballot 0"), "{during}");
                assert_eq!(reason, "its process exited");
            }
            other => panic!("expected rank 1 named as gone, found {other:?}"),
        }
    }
}
