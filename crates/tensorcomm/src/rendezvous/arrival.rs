//! Waiting at rendezvous for the ranks to arrive, watching for ranks that
//! will never come.
//!
//! - Rank 0 of a TCP rendezvous hosts the store, then waits until every
//!   rank has posted its process record ([`super::process_key`]), and says
//!   so in the store; the other ranks, their records posted, wait for that.
//!   Each says at WARN every [`WARN_EVERY`] which ranks it still waits for.
//! - The other ranks, when started by `tensorcomm run`, first wait until
//!   rank 0's store answers, in short tries, before connecting for good.
//! - The ranks of a file rendezvous wait at a barrier in the file.
//!
//! Under the launcher, each wait fails at once with [`Error::PeerClosed`]
//! naming a rank the launcher lists as exited ([`super::launch_exits`])
//! that had not posted its record: it exited before joining, and would
//! otherwise be waited for until the timeout. A rank that joined and has
//! left since is not blamed here.

use std::path::Path;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use super::launch_exits::{self, Ended};
use super::process_key;
use crate::store::watched::{WatchedStore, SLICE};
use crate::store::{Store, TcpStore, TcpStoreOptions};
use crate::{Error, Result};

/// How often a wait says at WARN what it still waits for.
const WARN_EVERY: Duration = Duration::from_secs(5);
/// The most missing ranks a message lists.
const LISTED: usize = 16;

/// The key rank 0 of a TCP rendezvous sets once every rank has joined.
const ALL_JOINED: &str = "tensorcomm/rendezvous/all-joined";

/// A rank of a TCP rendezvous, its process record posted: waits up to
/// `timeout` until every rank has joined. Rank 0 waits for the records of
/// ranks `1..world_size`, then says so under [`ALL_JOINED`]; the others
/// wait for that. `exits` is the launcher's file, if any (see
/// [`launch_exits::path_for`]).
pub(super) fn wait_for_ranks(
    store: &dyn Store,
    (rank, world_size): (usize, usize),
    timeout: Duration,
    exits: Option<&Path>,
) -> Result<()> {
    let keys: Vec<String> = if rank == 0 {
        (1..world_size).map(process_key).collect()
    } else {
        vec![ALL_JOINED.to_string()]
    };
    let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
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
            fail_if_gone_before_joining(store, path, 0..world_size, rank, during)?;
        }
        let mut last = last_warn.lock().unwrap_or_else(|p| p.into_inner());
        if last.elapsed() >= WARN_EVERY {
            *last = Instant::now();
            let missing = missing(store, world_size);
            tracing::warn!(
                waited = ?started.elapsed(),
                ?timeout,
                "rendezvous: rank {rank} still waiting for {} of {world_size} ranks to join: {}",
                missing.len(),
                list(&missing)
            );
        }
        Ok(())
    });
    match watched.wait_timeout(&keys, timeout) {
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
        Ok(()) if rank == 0 => store.set(ALL_JOINED, b"1"),
        Err(e) => {
            // Rank 0 leaves, taking its store, when it finds a rank gone
            // before joining: where this node's launcher lists that rank,
            // it is the cause to name (with the store gone, a listed rank
            // counts as never joined).
            if let Some(path) = exits {
                fail_if_gone_before_joining(store, path, 0..world_size, rank, during)?;
            }
            Err(e)
        }
        Ok(()) => Ok(()),
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

/// A rank other than 0 of a TCP rendezvous the launcher planned (`exits`
/// its file): waits until the store at `addr` answers, failing at once if
/// the launcher lists rank 0 as exited; without a launcher, returns at
/// once.
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
        if let Some(ended) = launch_exits::read(exits).get(&0) {
            return Err(gone_before_joining(0, ended, || {
                format!(
                    "meeting the other ranks at rendezvous (rank {rank} of {world_size}), connecting to the TCP store rank 0 hosts at {addr}"
                )
            }));
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
/// `store` (a record that cannot be read counts as not posted).
fn fail_if_gone_before_joining(
    store: &dyn Store,
    exits: &Path,
    ranks: std::ops::Range<usize>,
    me: usize,
    during: impl FnOnce() -> String,
) -> Result<()> {
    let listed = launch_exits::read(exits);
    let gone = listed
        .range(ranks)
        .find(|&(&r, _)| r != me && !store.check(&[process_key(r).as_str()]).unwrap_or(false));
    match gone {
        Some((&r, ended)) => Err(gone_before_joining(r, ended, during)),
        None => Ok(()),
    }
}

fn gone_before_joining(rank: usize, ended: &Ended, during: impl FnOnce() -> String) -> Error {
    let reason = launch_exits::before_joining(ended);
    let during = during();
    tracing::error!("rendezvous failed: peer rank {rank} is gone while {during}: {reason}");
    Error::PeerClosed {
        peer: rank,
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
