//! Waiting at rendezvous for the ranks to arrive, watching for ranks that
//! will never come.
//!
//! - Rank 0 of a TCP rendezvous hosts the store, then waits until every
//!   rank has posted its process record ([`super::process_key`]), and says
//!   in the store how that ended; the other ranks, their records posted,
//!   wait for that. Each says at WARN every [`WARN_EVERY`] that it waits
//!   (rank 0 naming the ranks still missing).
//! - The other ranks, when started by `tensorcomm run`, first wait until
//!   rank 0's store answers, in short tries, before connecting for good.
//! - The ranks of a file rendezvous wait at a barrier in the file.
//!
//! Under the launcher, each wait fails at once with [`Error::PeerClosed`]
//! naming a rank the launcher lists as exited ([`super::launch_exits`])
//! that had not posted its record: it exited before joining, and would
//! otherwise be waited for until the timeout. The rank that finds it
//! passes the news on through the outcome key, which rank 0 also watches,
//! so every rank names it, also on nodes whose launchers do not know it.
//! A rank still connecting to rank 0's store fails on any listed rank (no
//! rank can end rendezvous before it joins). A file rendezvous's barrier
//! has no outcome key: there, a rank gone on another node is named by its
//! node-mates only, and the others wait until their timeout.

use std::path::Path;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use super::launch_exits;
use super::process_key;
use crate::store::watched::{WatchedStore, SLICE};
use crate::store::{Store, TcpStore, TcpStoreOptions};
use crate::{Error, Result};

/// How often a wait says at WARN what it still waits for.
const WARN_EVERY: Duration = Duration::from_secs(5);
/// The most missing ranks a message lists.
const LISTED: usize = 16;

/// The key that says how a TCP rendezvous ended, set once: `joined` by
/// rank 0 once every rank has, or `gone RANK\nREASON` by the first rank
/// that found rank RANK gone before joining (rank 0's store lingers while
/// clients are connected, so the others read it).
const OUTCOME: &str = "tensorcomm/rendezvous/outcome";

/// A rank of a TCP rendezvous, its process record posted: waits up to
/// `timeout` until every rank has joined. Rank 0 waits for the records of
/// ranks `1..world_size`, then posts the [`OUTCOME`]; the others wait for
/// that. `exits` is the launcher's file, if any (see
/// [`launch_exits::path_for`]).
pub(super) fn wait_for_ranks(
    store: &dyn Store,
    (rank, world_size): (usize, usize),
    timeout: Duration,
    exits: Option<&Path>,
) -> Result<()> {
    let started = Instant::now();
    let last_warn = Mutex::new(started);
    let during = || {
        let hosting = if rank == 0 {
            ", hosting the TCP store"
        } else {
            ""
        };
        format!("meeting the other ranks at rendezvous (rank {rank} of {world_size}{hosting})")
    };
    let watched = WatchedStore::new(store, |_: &[&str]| {
        if let Some(path) = exits {
            fail_if_gone_before_joining(store, path, 0..world_size, rank, during)
                .map_err(|e| pass_on(store, rank, e))?;
        }
        if rank == 0 && store.check(&[OUTCOME])? {
            // Another rank's launcher listed a rank gone before joining.
            return Err(from_outcome(&store.get(OUTCOME)?, during));
        }
        let mut last = last_warn.lock().unwrap_or_else(|p| p.into_inner());
        if last.elapsed() >= WARN_EVERY {
            *last = Instant::now();
            if rank == 0 {
                let missing = missing(store, world_size);
                tracing::warn!(
                    waited = ?started.elapsed(),
                    ?timeout,
                    "rendezvous: rank 0 still waiting for {} of {world_size} ranks to join: {}",
                    missing.len(),
                    list(&missing)
                );
            } else {
                // Rank 0 alone lists who is missing: every rank asking the
                // store would be world_size squared requests.
                tracing::warn!(
                    waited = ?started.elapsed(),
                    ?timeout,
                    "rendezvous: rank {rank} of {world_size} still waiting for rank 0 to see every rank join"
                );
            }
        }
        Ok(())
    });
    let outcome = if rank == 0 {
        let keys: Vec<String> = (1..world_size).map(process_key).collect();
        let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
        match watched.wait_timeout(&keys, timeout) {
            Ok(()) => match store.compare_set(OUTCOME, b"", b"joined")? {
                outcome if outcome == b"joined" => return Ok(()),
                // A rank found one gone as the last record came.
                outcome => Err(from_outcome(&outcome, during)),
            },
            Err(e) => Err(e),
        }
    } else {
        match watched.get_timeout(OUTCOME, timeout) {
            Ok(outcome) if outcome == b"joined" => return Ok(()),
            Ok(outcome) => Err(from_outcome(&outcome, during)),
            Err(e) => Err(e),
        }
    };
    match outcome {
        Err(Error::StoreTimeout { .. }) => {
            let missing = missing(store, world_size);
            tracing::error!(
                "rendezvous: rank {rank} timed out after {timeout:?} waiting for {}",
                list(&missing)
            );
            Err(Error::ClientsTimeout {
                joined: world_size - missing.len(),
                expected: world_size,
                timeout,
            })
        }
        other => other,
    }
}

/// Posts a rank found gone (`found`, from [`fail_if_gone_before_joining`])
/// as the [`OUTCOME`], unless one is posted already, so that every rank
/// names it (those on other nodes, whose launchers do not know it,
/// included); returns `found`. A store error here changes nothing: the
/// rank fails on `found` either way.
fn pass_on(store: &dyn Store, rank: usize, found: Error) -> Error {
    if let Error::PeerClosed { peer, reason, .. } = &found {
        let outcome = format!("gone {peer}\n{reason}; rank {rank} found it");
        let _ = store.compare_set(OUTCOME, b"", outcome.as_bytes());
    }
    found
}

/// The error of a rank told by the [`OUTCOME`] that a rank is gone
/// (`gone RANK\nREASON`); anything else there is a protocol error.
fn from_outcome(outcome: &[u8], during: impl FnOnce() -> String) -> Error {
    let text = String::from_utf8_lossy(outcome);
    let parsed = text
        .strip_prefix("gone ")
        .and_then(|rest| rest.split_once('\n'))
        .and_then(|(peer, reason)| Some((peer.parse::<usize>().ok()?, reason)));
    match parsed {
        Some((peer, reason)) => peer_gone(peer, during(), reason.to_string()),
        // Any rank may have written it: no peer to name.
        None => Error::Protocol {
            expected: format!("\"joined\" or \"gone RANK\\nREASON\" under {OUTCOME}"),
            found: format!("{text:?}"),
        },
    }
}

/// The ranks of a file rendezvous: the barrier every rank arrives at,
/// waiting up to `timeout`.
pub(super) fn file_barrier(
    store: &dyn Store,
    path: &Path,
    (rank, world_size): (usize, usize),
    timeout: Duration,
    exits: Option<&Path>,
) -> Result<()> {
    let during = || {
        format!(
            "meeting the other ranks at rendezvous (rank {rank} of {world_size}, at the barrier of the file store {})",
            path.display()
        )
    };
    let watched = WatchedStore::new(store, |_: &[&str]| match exits {
        Some(exits) => fail_if_gone_before_joining(store, exits, 0..world_size, rank, during),
        None => Ok(()),
    });
    watched.barrier("tensorcomm/rendezvous", world_size, Some(timeout))
}

/// A rank other than 0 of a TCP rendezvous of the launcher's ranks
/// (`exits` its file): waits until the store at `addr` answers, failing at
/// once if the launcher lists any other rank as exited; without a
/// launcher, returns at once.
/// Each try is a connection of its own (dropped), so the store the rank
/// keeps is then connected with `options`' whole patience for redials.
pub(super) fn reach_store_host(
    addr: &str,
    options: &TcpStoreOptions,
    (rank, world_size): (usize, usize),
    exits: Option<&Path>,
) -> Result<()> {
    let Some(exits) = exits else {
        return Ok(());
    };
    let started = Instant::now();
    let deadline = started + options.timeout;
    let mut said = started;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let slice = left.min(SLICE);
        let probe = TcpStoreOptions {
            timeout: slice,
            ..options.clone()
        };
        let reason = match TcpStore::connect(addr, &probe) {
            Ok(_probe) => return Ok(()),
            Err(Error::StoreConnect { addr, reason, .. }) if slice == left => {
                return Err(Error::StoreConnect {
                    addr,
                    timeout: options.timeout,
                    reason,
                })
            }
            Err(Error::StoreConnect { reason, .. }) => reason,
            Err(other) => return Err(other),
        };
        // No rank can end rendezvous before this one joins, so any rank
        // listed (first reaped first) is one the job will not get back.
        if let Some((gone, ended)) = launch_exits::first_listed(exits, rank) {
            let during = format!(
                "meeting the other ranks at rendezvous (rank {rank} of {world_size}), connecting to the TCP store rank 0 hosts at {addr}"
            );
            let reason = launch_exits::before_rendezvous_ended(&ended);
            return Err(peer_gone(gone, during, reason));
        }
        if said.elapsed() >= WARN_EVERY {
            said = Instant::now();
            tracing::warn!(
                addr,
                "still trying to reach the store after {:.0?} (of {:?}): {reason}",
                started.elapsed(),
                options.timeout
            );
        }
    }
}

/// Fails naming the first rank of `ranks` but `me` that the launcher's
/// file at `exits` lists and that has not posted its process record in
/// `store`. A record that cannot be read is the store's error, not a rank
/// to blame: a rank that did join may have left on losing the store.
fn fail_if_gone_before_joining(
    store: &dyn Store,
    exits: &Path,
    ranks: std::ops::Range<usize>,
    me: usize,
    during: impl FnOnce() -> String,
) -> Result<()> {
    let listed = launch_exits::read(exits);
    for (&r, ended) in listed.range(ranks) {
        if r != me && !store.check(&[process_key(r).as_str()])? {
            return Err(peer_gone(r, during(), launch_exits::before_joining(ended)));
        }
    }
    Ok(())
}

/// The error of a rendezvous wait that found rank `peer` gone, logged.
fn peer_gone(peer: usize, during: String, reason: String) -> Error {
    tracing::error!("rendezvous failed: peer rank {peer} is gone while {during}: {reason}");
    Error::PeerClosed {
        peer,
        during,
        reason,
    }
}

/// The ranks `1..world_size` whose process records `store` lacks.
fn missing(store: &dyn Store, world_size: usize) -> Vec<usize> {
    (1..world_size)
        .filter(|&r| !store.check(&[process_key(r).as_str()]).unwrap_or(false))
        .collect()
}

/// `ranks [2, 5]`, or the first [`LISTED`] and a count.
fn list(ranks: &[usize]) -> String {
    match ranks.len() {
        0 => "no rank".into(),
        n if n <= LISTED => format!("ranks {ranks:?}"),
        n => format!("ranks {:?} and {} more", &ranks[..LISTED], n - LISTED),
    }
}

#[cfg(test)]
mod tests {
    use super::launch_exits::Ended;
    use super::*;
    use crate::store::HashStore;

    #[test]
    fn a_listed_rank_without_a_record_is_gone_before_joining() {
        let dir = tempfile::tempdir().unwrap();
        let exits = dir.path().join("exits");
        let store = HashStore::new();
        let during = || "waiting".to_string();
        // Nothing listed, or no file at all: nothing known.
        assert!(fail_if_gone_before_joining(&store, &exits, 0..4, 0, during).is_ok());
        std::fs::write(&exits, "").unwrap();
        assert!(fail_if_gone_before_joining(&store, &exits, 0..4, 0, during).is_ok());
        // Rank 1 joined, then left: not waited for, not blamed.
        store.set(&process_key(1), b"host\npid=1\nstart=1").unwrap();
        std::fs::write(&exits, launch_exits::line(1, &Ended::Status(0))).unwrap();
        assert!(fail_if_gone_before_joining(&store, &exits, 0..4, 0, during).is_ok());
        // Rank 3 never joined.
        let killed = Ended::Signal {
            number: 9,
            name: Some("SIGKILL".into()),
        };
        let text = launch_exits::line(1, &Ended::Status(0)) + &launch_exits::line(3, &killed);
        std::fs::write(&exits, text).unwrap();
        let err = fail_if_gone_before_joining(&store, &exits, 0..4, 0, during).unwrap_err();
        assert!(matches!(err, Error::PeerClosed { peer: 3, .. }), "{err}");
        assert!(
            err.to_string()
                .contains("was killed by signal 9 (SIGKILL) before joining the job"),
            "{err}"
        );
        // Outside the ranks asked about, or this rank itself: not blamed.
        assert!(fail_if_gone_before_joining(&store, &exits, 0..3, 0, during).is_ok());
        assert!(fail_if_gone_before_joining(&store, &exits, 0..4, 3, during).is_ok());
    }

    #[test]
    fn the_first_rank_to_find_one_gone_posts_it_for_every_rank() {
        let store = HashStore::new();
        let during = || "waiting".to_string();
        let found = |peer| peer_gone(peer, "waiting".into(), "it exited before joining".into());
        let err = pass_on(&store, 3, found(7));
        assert!(matches!(err, Error::PeerClosed { peer: 7, .. }), "{err}");
        // A later finder does not overwrite the first.
        pass_on(&store, 1, found(5));
        let err = from_outcome(&store.get(OUTCOME).unwrap(), during);
        assert!(matches!(err, Error::PeerClosed { peer: 7, .. }), "{err}");
        assert!(
            err.to_string()
                .ends_with("it exited before joining; rank 3 found it"),
            "{err}"
        );
        for bad in [&b"gone x\nwhy"[..], b"gone 7", b"maybe"] {
            let err = from_outcome(bad, during);
            assert!(matches!(err, Error::Protocol { .. }), "{err}");
        }
    }

    #[test]
    fn missing_ranks_are_listed_up_to_a_limit() {
        assert_eq!(list(&[]), "no rank");
        assert_eq!(list(&[2, 5]), "ranks [2, 5]");
        let many: Vec<usize> = (1..=20).collect();
        assert!(list(&many).ends_with("and 4 more"), "{}", list(&many));
        let store = HashStore::new();
        store.set(&process_key(2), b"x").unwrap();
        assert_eq!(missing(&store, 4), [1, 3]);
    }
}
