//! Watching a CPU group's set-up: the waits of set-up (for a peer's store
//! keys, for its transport connection, for it to map shared memory) say at
//! WARN every [`WARN_EVERY`] what they still wait for, and fail at once,
//! naming the rank, when a peer's process is known to be gone.
//!
//! A peer is known to be gone when it posted its process under
//! [`crate::rendezvous::process_key`] (every rank does so at rendezvous),
//! runs on this host, and that process has exited (or is a zombie, or its
//! pid now belongs to a process started later). A peer on another host, or
//! one that died before posting, is waited for until the group's timeout.
//!
//! The watch of the set-up running on a thread is kept in a thread-local,
//! so the transports' wait loops reach it without threading it through
//! every constructor; [`setup_store`] wraps the store the set-up uses so
//! that its blocking calls wait in slices and check between them.

use std::cell::{Cell, RefCell};
use std::rc::Rc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::rendezvous::process_gone;
use crate::store::watched::WatchedStore;
use crate::store::Store;
use crate::{Error, Result};

/// How often a set-up wait says at WARN what it still waits for.
pub(crate) const WARN_EVERY: Duration = Duration::from_secs(5);
/// How often a wait checks whether its peers' processes are alive.
const CHECK_EVERY: Duration = Duration::from_millis(250);

struct Watch {
    store: Arc<dyn Store>,
    group: String,
    rank: usize,
    /// (group rank, global rank) of every other rank.
    peers: Vec<(usize, usize)>,
    started: Instant,
    last_warn: Cell<Instant>,
    last_check: Cell<Option<Instant>>,
}

thread_local! {
    static CURRENT: RefCell<Option<Rc<Watch>>> = const { RefCell::new(None) };
}

/// Ends the watch of this thread's set-up when dropped.
pub(crate) struct Guard {
    previous: Option<Rc<Watch>>,
}

impl Drop for Guard {
    fn drop(&mut self) {
        let previous = self.previous.take();
        CURRENT.with(|c| *c.borrow_mut() = previous);
    }
}

/// Watches the set-up of group `group` (rank `rank`, `global_ranks[r]` the
/// job rank of group rank `r`) on this thread until the guard drops.
pub(crate) fn enter(
    store: Arc<dyn Store>,
    group: &str,
    rank: usize,
    global_ranks: &[usize],
) -> Guard {
    let now = Instant::now();
    let watch = Rc::new(Watch {
        store,
        group: group.into(),
        rank,
        peers: global_ranks
            .iter()
            .enumerate()
            .filter(|&(r, _)| r != rank)
            .map(|(r, &g)| (r, g))
            .collect(),
        started: now,
        last_warn: Cell::new(now),
        last_check: Cell::new(None),
    });
    let previous = CURRENT.with(|c| c.borrow_mut().replace(watch));
    Guard { previous }
}

/// Called from set-up waits while they wait for `what` (built only when
/// needed): fails naming the rank if a peer's process is gone, and says at
/// WARN every [`WARN_EVERY`] what the wait is for. Without a set-up watched
/// on this thread, does nothing.
pub(crate) fn check(what: impl FnOnce() -> String) -> Result<()> {
    let Some(watch) = CURRENT.with(|c| c.borrow().clone()) else {
        return Ok(());
    };
    let now = Instant::now();
    if watch
        .last_check
        .get()
        .is_some_and(|t| now.duration_since(t) < CHECK_EVERY)
    {
        return Ok(());
    }
    watch.last_check.set(Some(now));
    let warn = now.duration_since(watch.last_warn.get()) >= WARN_EVERY;
    let mut what = Some(what);
    let mut what_text = || what.take().map(|f| f()).unwrap_or_default();
    for &(peer, global) in &watch.peers {
        // The store's host gone or hung (the client says its connection
        // was lost: an I/O error, a refused or unanswered redial, or no
        // reply by the set-up's deadline and its grace, `reply_grace.rs`):
        // the peers' records can no longer be read, and
        // a peer that found the store gone first has left, so this wait
        // would end at its timeout blaming that peer. The lost store is the
        // cause (`init_process_group` names its host rank).
        let gone = process_gone(&*watch.store, global).inspect_err(|e| {
            let what = what_text();
            tracing::error!(
                group = %watch.group,
                rank = watch.rank,
                %e,
                "set-up failed: the store was lost while this rank waited for {what}"
            );
        })?;
        if let Some(process) = gone {
            let what = what_text();
            tracing::error!(
                group = %watch.group,
                rank = watch.rank,
                peer,
                %process,
                "set-up failed: the process of rank {peer} exited while this rank waited for {what}"
            );
            return Err(Error::PeerClosed {
                peer,
                during: format!(
                    "setting up group {:?} (rank {} of {}), waiting for {what}",
                    watch.group,
                    watch.rank,
                    watch.peers.len() + 1
                ),
                reason: if peer == global {
                    format!("its process ({process}) exited during set-up")
                } else {
                    format!("its process (job rank {global}, {process}) exited during set-up")
                },
            });
        }
    }
    if warn {
        watch.last_warn.set(now);
        let what = what_text();
        tracing::warn!(
            group = %watch.group,
            rank = watch.rank,
            waited = ?now.duration_since(watch.started),
            "set-up still waiting for {what}"
        );
    }
    Ok(())
}

/// `store`, whose blocking calls, during a watched set-up, wait in slices
/// and [`check`] between them; the whole wait still ends at its timeout
/// with the error the store gives for it.
pub(crate) fn setup_store(
    store: &dyn Store,
) -> WatchedStore<'_, impl Fn(&[&str]) -> Result<()> + Send + Sync> {
    WatchedStore::new(store, |keys: &[&str]| {
        check(|| format!("store keys {keys:?}"))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{TcpStore, TcpStoreOptions, TcpStoreServer};

    #[test]
    fn a_wait_fails_at_once_with_the_store_lost_when_its_host_is_gone() {
        // Rank 1 of 3 waits during set-up; rank 0's store server goes away.
        // The peers' records cannot be read any more, so no peer is "known
        // gone": before, the wait went on to its timeout and blamed the
        // peer it waited for, which had itself left on losing the store.
        let options = TcpStoreOptions::default();
        let server = TcpStoreServer::bind("127.0.0.1:0", &options).unwrap();
        let client = TcpStore::connect(&server.local_addr().to_string(), &options).unwrap();
        client.set("warm-up", b"1").unwrap();
        let _watch = enter(Arc::new(client), "default", 1, &[0, 1, 2]);
        assert!(check(|| "rank 2 to connect".into()).is_ok());
        drop(server);
        // The next check is due CHECK_EVERY after the last.
        std::thread::sleep(CHECK_EVERY);
        let err = check(|| "rank 2 to connect".into()).unwrap_err();
        assert!(matches!(err, Error::StoreConnectionLost { .. }), "{err}");
    }
}
