//! [`connect_group_segment`]: one shared-memory segment mapped by every
//! rank of a group on one host, set up through the group's store. It
//! either succeeds on every rank or fails on every rank, naming the rank
//! where it went wrong, and no rank waits for one that already gave up.
//!
//! The exchange, under the caller's `{key}`:
//! 1. Rank 0 creates the segment (reserving its pages, so a full
//!    `/dev/shm` is an error here rather than a `SIGBUS` later) and
//!    publishes `{key}` = `ok <asked> <name>`, or `error <reason>` when it
//!    could not, and then fails at once.
//! 2. Every other rank maps it, if it was asked for the same size, and
//!    answers under `{key}/answer/{rank}`: `ok`, `size <asked>` or
//!    `error <reason>`.
//! 3. Rank 0 waits for every answer, unlinks the name and publishes the
//!    verdict under `{key}/verdict`: `ok`, or the first rank's problem
//!    (`size <rank> <asked>`, `error <rank> <reason>`, or `missing <ranks>`
//!    when some never answered within the timeout). Every rank returns
//!    what the verdict says.
//!
//! Rank 0 removes `{key}` and the answers; the last rank to read the
//! verdict (counted under `{key}/read`) removes it and the count. Once set
//! up, nothing is left in `/dev/shm`. If rank 0 dies between creating the
//! segment and unlinking it, the name stays there until removed by hand.
//! The mapping keeps no descriptor open: a group may hold many segments.

use std::time::Duration;

use super::segment::{self, Segment};
use crate::store::Store;
use crate::{Error, Result};

/// How much longer than the timeout the other ranks wait for rank 0's
/// verdict (see [`Exchange::follow`]).
const VERDICT_GRACE: Duration = Duration::from_secs(2);

/// A name no other segment of this host uses now.
fn unique_name(kind: &str) -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::time::{SystemTime, UNIX_EPOCH};
    static SEQ: AtomicU64 = AtomicU64::new(0);
    let seq = SEQ.fetch_add(1, Ordering::Relaxed);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    format!("/tc{kind}.{}.{seq}.{nanos:08x}", std::process::id())
}

/// What a group segment is for, in errors and in its name.
pub(super) struct Purpose<'a> {
    /// A short tag for the segment's name (`arena`, `sym`).
    pub tag: &'a str,
    /// What the segment is, for messages: "shared-memory arena".
    pub what: &'a str,
    /// The size every rank must be asked for (per rank, or a chunk: what
    /// the caller's users chose), compared across ranks.
    pub asked: usize,
    /// What `asked` means, for a mismatch: "slot halves of 1048576 bytes".
    pub asked_means: &'a dyn Fn(usize) -> String,
}

/// The exchange of one rank: its place, the keys and the wording.
struct Exchange<'a> {
    store: &'a dyn Store,
    key: &'a str,
    rank: usize,
    world_size: usize,
    purpose: &'a Purpose<'a>,
    timeout: Duration,
}

impl Exchange<'_> {
    fn answer_key(&self, rank: usize) -> String {
        format!("{}/answer/{rank}", self.key)
    }

    fn verdict_key(&self) -> String {
        format!("{}/verdict", self.key)
    }

    /// This rank asked for the segment's size and `peer` for `theirs`
    /// (a size, or something that is not one).
    fn mismatch(&self, peer: usize, theirs: &str) -> Error {
        let described = |n: usize| {
            format!(
                "a {} with {}",
                self.purpose.what,
                (self.purpose.asked_means)(n)
            )
        };
        Error::CollectiveMismatch {
            rank: self.rank,
            peer,
            mine: described(self.purpose.asked),
            theirs: match theirs.parse::<usize>() {
                Ok(n) => described(n),
                Err(_) => format!("an answer {theirs:?}"),
            },
        }
    }

    fn failed_on(&self, failed: usize, reason: impl Into<String>) -> Error {
        Error::GroupSetupFailed {
            what: self.purpose.what.to_string(),
            rank: self.rank,
            failed,
            reason: reason.into(),
        }
    }

    /// Counts this rank out of the readers of `{key}`'s last message; the
    /// last one removes the listed keys and the count.
    fn count_out(&self, keys: &[String]) -> Result<()> {
        let read_key = format!("{}/read", self.key);
        if self.store.add(&read_key, 1)? == (self.world_size - 1) as i64 {
            for k in keys {
                self.store.delete_key(k)?;
            }
            self.store.delete_key(&read_key)?;
        }
        Ok(())
    }

    /// Ranks 1..: map rank 0's segment, answer, follow the verdict.
    fn follow(&self, len: usize) -> Result<Segment> {
        let raw = self.store.get_timeout(self.key, self.timeout)?;
        let published = String::from_utf8_lossy(&raw).into_owned();
        let (word, rest) = published.split_once(' ').unwrap_or((&published, ""));
        if word == "error" {
            self.count_out(&[self.key.to_string()])?;
            return Err(self.failed_on(0, rest));
        }
        let (theirs, name) = rest.split_once(' ').unwrap_or((rest, ""));
        let (answer, mapped) = if word != "ok" || theirs != self.purpose.asked.to_string() {
            let answer = format!("size {}", self.purpose.asked);
            let theirs = if word == "ok" {
                theirs.to_string()
            } else {
                published.clone()
            };
            (answer, Err(self.mismatch(0, &theirs)))
        } else {
            match self.open(name, len) {
                Ok(segment) => ("ok".to_string(), Ok(segment)),
                Err(e) => (format!("error {e}"), Err(e)),
            }
        };
        self.store
            .set(&self.answer_key(self.rank), answer.as_bytes())?;
        // Rank 0 gives its verdict at the latest `timeout` after it began
        // waiting, which was before this rank answered; the grace covers
        // the few store calls it makes then.
        let verdict = self
            .store
            .get_timeout(&self.verdict_key(), self.timeout + VERDICT_GRACE);
        if verdict.is_ok() {
            self.count_out(&[self.verdict_key()])?;
        }
        // This rank's own problem first: it says the most.
        let segment = mapped?;
        let verdict = String::from_utf8_lossy(&verdict?).into_owned();
        self.judge(&verdict).map(|()| segment)
    }

    /// Opens `name` and checks it is `len` bytes.
    fn open(&self, name: &str, len: usize) -> Result<Segment> {
        let what = self.purpose.what;
        let mut segment =
            Segment::open(name).map_err(|e| Error::io(format!("opening {what} {name}"), e))?;
        if segment.len() != len {
            return Err(Error::ShmBadHeader {
                segment: name.to_string(),
                field: "size".to_string(),
                expected: format!("{len} bytes"),
                found: format!("{} bytes", segment.len()),
            });
        }
        segment.close_descriptor();
        Ok(segment)
    }

    /// The error a verdict other than `ok` means on this rank.
    fn judge(&self, verdict: &str) -> Result<()> {
        let mut words = verdict.splitn(3, ' ');
        let (word, peer, rest) = (words.next(), words.next(), words.next().unwrap_or(""));
        let peer = peer.and_then(|p| p.parse::<usize>().ok());
        match (word, peer) {
            (Some("ok"), _) => Ok(()),
            (Some("size"), Some(peer)) => Err(self.mismatch(peer, rest)),
            (Some("error"), Some(peer)) => Err(self.failed_on(peer, rest)),
            (Some("missing"), _) => Err(self.failed_on(
                0,
                format!(
                    "ranks [{}] did not answer rank 0 within {:?}",
                    verdict.trim_start_matches("missing "),
                    self.timeout
                ),
            )),
            _ => Err(Error::Protocol {
                expected: format!("a verdict on the {} from rank 0", self.purpose.what),
                found: format!("{verdict:?}"),
            }),
        }
    }

    /// Rank 0: create, publish, collect the answers, unlink, give the
    /// verdict.
    fn lead(&self, len: usize) -> Result<Segment> {
        let what = self.purpose.what;
        let created = loop {
            let name = unique_name(self.purpose.tag);
            match Segment::create(&name, len) {
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
                other => break other.map(|segment| (name, segment)),
            }
        };
        let (name, mut segment) = match created {
            Ok(made) => made,
            Err(e) => {
                let e = Error::io(format!("creating {what} of {len} bytes"), e);
                self.store.set(self.key, format!("error {e}").as_bytes())?;
                return Err(e);
            }
        };
        segment.close_descriptor();
        let published = format!("ok {} {name}", self.purpose.asked);
        if let Err(e) = self.store.set(self.key, published.as_bytes()) {
            let _ = segment::unlink(&name);
            return Err(e);
        }
        let answers = self.answers();
        let unlinked = segment::unlink(&name);
        let verdict = match &answers {
            Ok(answers) => answers
                .iter()
                .enumerate()
                .find(|(_, a)| a.as_str() != "ok")
                .map_or("ok".to_string(), |(i, a)| {
                    let (word, rest) = a.split_once(' ').unwrap_or((a, ""));
                    let word = if word == "size" { "size" } else { "error" };
                    format!("{word} {} {rest}", i + 1)
                }),
            Err(Missing(ranks)) => format!("missing {}", join(ranks)),
        };
        if self.world_size > 1 {
            self.store.set(&self.verdict_key(), verdict.as_bytes())?;
        }
        self.store.delete_key(self.key)?;
        for r in 1..self.world_size {
            self.store.delete_key(&self.answer_key(r))?;
        }
        if let Err(Missing(ranks)) = answers {
            return Err(Error::PeerTimeout {
                peer: ranks[0],
                during: format!(
                    "setting up the {what} (ranks [{}] never answered)",
                    join(&ranks)
                ),
                timeout: self.timeout,
            });
        }
        unlinked.map_err(|e| Error::io(format!("unlinking {what} {name}"), e))?;
        self.judge(&verdict).map(|()| segment)
    }

    /// Every other rank's answer, in rank order, or the ranks that did
    /// not answer within the timeout.
    fn answers(&self) -> std::result::Result<Vec<String>, Missing> {
        let keys: Vec<String> = (1..self.world_size).map(|r| self.answer_key(r)).collect();
        let refs: Vec<&str> = keys.iter().map(String::as_str).collect();
        let missing = || {
            Missing(
                (1..self.world_size)
                    .filter(|&r| !self.store.check(&[&self.answer_key(r)]).unwrap_or(false))
                    .collect(),
            )
        };
        if self.store.wait_timeout(&refs, self.timeout).is_err() {
            return Err(missing());
        }
        keys.iter()
            .map(|k| {
                self.store
                    .get(k)
                    .map(|a| String::from_utf8_lossy(&a).into_owned())
            })
            .collect::<Result<_>>()
            .map_err(|_| missing())
    }
}

/// Ranks that never answered rank 0.
struct Missing(Vec<usize>);

fn join(ranks: &[usize]) -> String {
    ranks
        .iter()
        .map(usize::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}

/// Maps the `len`-byte segment of the group whose ranks meet under `key`
/// (see the module docs); every rank passes the same `key`, and should be
/// asked for the same size (`purpose.asked`, from which `len` follows).
/// Waiting for the others ends after `timeout`.
pub(super) fn connect_group_segment(
    store: &dyn Store,
    key: &str,
    (rank, world_size): (usize, usize),
    len: usize,
    purpose: &Purpose<'_>,
    timeout: Duration,
) -> Result<Segment> {
    let exchange = Exchange {
        store,
        key,
        rank,
        world_size,
        purpose,
        timeout,
    };
    if rank == 0 {
        exchange.lead(len)
    } else {
        exchange.follow(len)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::HashStore;
    use std::time::Instant;

    fn purpose(asked: usize) -> Purpose<'static> {
        Purpose {
            tag: "gstest",
            what: "test segment",
            asked,
            asked_means: &|n| format!("{n} test bytes"),
        }
    }

    /// Runs ranks `present` of `world` at once, rank r asking `asked(r)`
    /// bytes (and mapping that many), each waiting at most `timeout`.
    fn connect_all(
        store: &HashStore,
        world: usize,
        present: &[usize],
        asked: impl Fn(usize) -> usize + Sync,
        timeout: Duration,
    ) -> Vec<Result<Segment>> {
        std::thread::scope(|s| {
            let handles: Vec<_> = present
                .iter()
                .map(|&rank| {
                    let asked = &asked;
                    s.spawn(move || {
                        let p = purpose(asked(rank));
                        connect_group_segment(store, "g", (rank, world), asked(rank), &p, timeout)
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        })
    }

    #[test]
    fn every_rank_maps_the_same_memory_and_nothing_is_left() {
        let store = HashStore::new();
        let segments = connect_all(&store, 3, &[0, 1, 2], |_| 8192, Duration::from_secs(30));
        let segments: Vec<Segment> = segments.into_iter().map(Result::unwrap).collect();
        // SAFETY: every mapping is 8192 bytes long and alive.
        unsafe {
            segments[2].base().as_ptr().add(100).write_volatile(7);
            assert_eq!(segments[0].base().as_ptr().add(100).read_volatile(), 7);
            assert_eq!(segments[1].base().as_ptr().add(100).read_volatile(), 7);
        }
        assert_eq!(store.num_keys().unwrap(), 0);
        // The descriptors are closed: locks are refused, the memory stays.
        assert!(segments[1].lock_byte(0).is_err());
        let one = connect_all(&store, 1, &[0], |_| 4096, Duration::from_secs(5));
        assert!(one[0].is_ok());
        assert_eq!(store.num_keys().unwrap(), 0);
    }

    #[test]
    fn one_rank_of_three_asking_another_size_fails_every_rank() {
        let store = HashStore::new();
        let asked = |r: usize| if r == 2 { 8192 } else { 4096 };
        let outcomes = connect_all(&store, 3, &[0, 1, 2], asked, Duration::from_secs(30));
        for (rank, outcome) in outcomes.into_iter().enumerate() {
            let (peer, theirs) = if rank == 2 { (0, 4096) } else { (2, 8192) };
            match outcome {
                Err(Error::CollectiveMismatch {
                    rank: r,
                    peer: p,
                    mine,
                    theirs: t,
                }) => assert!(
                    r == rank
                        && p == peer
                        && mine.contains(&format!("{} test bytes", asked(rank)))
                        && t.contains(&format!("{theirs} test bytes")),
                    "rank {rank}: {r} {p} {mine} / {t}"
                ),
                other => panic!("rank {rank}: expected a mismatch, found {other:?}"),
            }
        }
        assert_eq!(store.num_keys().unwrap(), 0);
    }

    #[test]
    fn a_segment_rank_0_cannot_create_fails_the_others_at_once() {
        let store = HashStore::new();
        // Far more than any /dev/shm holds: reserving the pages fails.
        let huge = 1usize << 60;
        let start = Instant::now();
        let outcomes = connect_all(&store, 3, &[0, 1, 2], |_| huge, Duration::from_secs(120));
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "{:?}",
            start.elapsed()
        );
        for (rank, outcome) in outcomes.into_iter().enumerate() {
            match outcome {
                Err(Error::Io { context, .. }) if rank == 0 => {
                    assert!(context.contains("creating test segment"), "{context}")
                }
                Err(Error::GroupSetupFailed {
                    rank: r,
                    failed: 0,
                    reason,
                    ..
                }) if rank != 0 => assert!(r == rank && reason.contains("creating"), "{reason}"),
                other => panic!("rank {rank}: found {other:?}"),
            }
        }
        assert_eq!(store.num_keys().unwrap(), 0);
    }

    #[test]
    fn a_rank_that_never_comes_is_named_on_the_ranks_that_did() {
        let store = HashStore::new();
        let timeout = Duration::from_millis(300);
        let outcomes = connect_all(&store, 3, &[0, 1], |_| 4096, timeout);
        match &outcomes[0] {
            Err(Error::PeerTimeout {
                peer: 2, during, ..
            }) => {
                assert!(during.contains("ranks [2]"), "{during}")
            }
            other => panic!("rank 0: found {other:?}"),
        }
        match &outcomes[1] {
            Err(Error::GroupSetupFailed { reason, .. }) => {
                assert!(reason.contains("ranks [2] did not answer"), "{reason}")
            }
            other => panic!("rank 1: found {other:?}"),
        }
    }
}
