//! Watching a CPU group's set-up: the waits of set-up (for a peer's store
//! keys, for its transport connection, for it to map shared memory) say at
//! WARN every [`WARN_EVERY`] what they still wait for, and fail at once,
//! naming the rank, when a peer's process is known to be gone.
//!
//! A peer is known to be gone when
//! - the launcher that started this rank (`tensorcomm run`) lists it as
//!   exited (see [`crate::rendezvous::launch_exits`]): whether or not it
//!   ever reached rendezvous, on this rank's node only; or
//! - it posted its process under [`crate::rendezvous::process_key`] (every
//!   rank does so at rendezvous), runs on this host, and that process has
//!   exited (or is a zombie, or its pid now belongs to a process started
//!   later), with or without a launcher.
//!
//! A peer on another host, or one that died before posting without a
//! launcher to tell it, is waited for until the group's timeout.
//!
//! The watch of the set-up running on a thread is kept in a thread-local,
//! so the transports' wait loops reach it without threading it through
//! every constructor; [`setup_store`] wraps the store the set-up uses so
//! that its blocking calls wait in slices and check between them.

use std::cell::{Cell, RefCell};
use std::path::PathBuf;
use std::rc::Rc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::rendezvous::{launch_exits, process_gone, process_key};
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
    /// The file where this rank's launcher lists the ranks that exited.
    launch_exits: Option<PathBuf>,
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
    let exits = launch_exits::path_from_env();
    enter_with(store, group, rank, global_ranks, exits)
}

/// [`enter`], with the launcher's exits file (if any) given.
fn enter_with(
    store: Arc<dyn Store>,
    group: &str,
    rank: usize,
    global_ranks: &[usize],
    launch_exits: Option<PathBuf>,
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
        launch_exits,
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
    let during = |what: &str| {
        format!(
            "setting up group {:?} (rank {} of {}), waiting for {what}",
            watch.group,
            watch.rank,
            watch.peers.len() + 1
        )
    };
    if let Some(path) = &watch.launch_exits {
        let exits = launch_exits::read(path);
        if let Some((peer, global, ended)) = watch
            .peers
            .iter()
            .find_map(|&(p, g)| exits.get(&g).map(|e| (p, g, e)))
        {
            // Whether it had joined only changes the words: the store
            // being unreachable must not hide the launcher's news.
            let joined = watch.store.check(&[process_key(global).as_str()]).ok();
            let what = what_text();
            let who = if peer == global {
                "it".to_string()
            } else {
                format!("it (job rank {global})")
            };
            let reason = launch_exits::reason(&who, ended, joined);
            tracing::error!(
                group = %watch.group,
                rank = watch.rank,
                peer,
                global,
                "set-up failed: rank {peer} is gone while this rank waited for {what}: {reason}"
            );
            return Err(Error::PeerClosed {
                peer,
                during: during(&what),
                reason,
            });
        }
    }
    for &(peer, global) in &watch.peers {
        // The store's host gone or hung (the client says its connection
        // was lost: an I/O error, a refused redial, or no reply within the
        // store's timeout): the peers' records can no longer be read, and
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
                during: during(&what),
                reason: format!("its process ({process}) exited during set-up"),
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

    #[test]
    fn a_peer_the_launcher_lists_fails_the_wait_naming_it_and_how_it_ended() {
        use crate::rendezvous::launch_exits::{line, Ended};
        use crate::store::HashStore;
        let dir = tempfile::tempdir().unwrap();
        let exits = dir.path().join("exits");
        let store = Arc::new(HashStore::new());
        // A sub-group of job ranks 0, 5 and 7; this is group rank 0.
        let watch = || enter_with(store.clone(), "sub", 0, &[0, 5, 7], Some(exits.clone()));
        let _watch = watch();
        assert!(check(|| "keys".into()).is_ok(), "no file: nothing known");
        // Job rank 3 is not in the group: not waited for.
        std::fs::write(&exits, line(3, &Ended::Status(0))).unwrap();
        std::thread::sleep(CHECK_EVERY);
        assert!(check(|| "keys".into()).is_ok());
        let killed = Ended::Signal {
            number: 9,
            name: Some("SIGKILL".into()),
        };
        std::fs::write(&exits, line(3, &Ended::Status(0)) + &line(7, &killed)).unwrap();
        std::thread::sleep(CHECK_EVERY);
        let err = check(|| "group rank 2's address".into()).unwrap_err();
        assert!(matches!(err, Error::PeerClosed { peer: 2, .. }), "{err}");
        assert_eq!(
            err.to_string(),
            "peer rank 2 is gone while setting up group \"sub\" (rank 0 of 3), waiting for group rank 2's address: \
             it (job rank 7) was killed by signal 9 (SIGKILL) before joining the job (it never reached rendezvous; reported by tensorcomm run)"
        );
        // One that had posted its process record left during set-up.
        store
            .set(&process_key(7), b"elsewhere\npid=1\nstart=1")
            .unwrap();
        let _watch = watch();
        let err = check(|| "keys".into()).unwrap_err();
        assert!(
            err.to_string()
                .ends_with("it (job rank 7) was killed by signal 9 (SIGKILL) after joining, during set-up (reported by tensorcomm run)"),
            "{err}"
        );
    }
}
