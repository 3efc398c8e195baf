//! A hosting store keeps serving while its process exits.
//!
//! Rank 0 hosts the store through which the other ranks read each other's
//! failure reports. Dropping its [`super::TcpStore`] waits up to the
//! linger for the other clients to leave (`client.rs`), but a process that
//! ends with `std::process::exit` runs no destructors, and one that
//! returns from `main` does not drop what statics or other threads still
//! hold: the store died with the process at once, and the others, finding
//! it gone, named rank 0 as the failed rank instead of the real one.
//!
//! So [`super::TcpStore::host`] registers its server here, and the first
//! registration of a process installs the exit hook (`process_exit.rs`,
//! which runs at `exit` and at a return from `main` alike, after the
//! process's groups closed their connections). The hook waits, up to each
//! server's linger, until no connection from another process is left on
//! any hosted server still running. Connections of this process
//! (`own_connections.rs`: the hosting store's own pool, a thread still
//! blocked in a `get`) are not waited for: they end with it.
//!
//! The handler never:
//! - waits when no hosted server is running (it reads one counter first),
//!   for a server already stopped (dropping its store marks it once its
//!   drop-time linger is over, so the two waits never add up), or when no
//!   other process is connected;
//! - waits in a child that `fork()` made without `exec` (it inherits the
//!   handler and a copy of the registry, but none of the servers'
//!   threads): every registration records its process id, and the handler
//!   waits only on its own process's servers, and takes no lock at all in
//!   a process that registered none;
//! - blocks without bound on a lock: it runs on the exiting thread while
//!   the other threads still run. The locks it takes (the registry, each
//!   server's connection table, the own-connection table) are held
//!   elsewhere only for one map update, never by code that could call
//!   `exit`; still, it tries each for at most [`PATIENCE`] and gives up the
//!   wait if one cannot be had;
//! - logs through `tracing`: the exiting thread's thread-locals (a
//!   subscriber's buffers among them) are destroyed before `atexit`
//!   handlers run. When it gives up with clients still connected, it says
//!   so in one line on stderr, as the drop-time linger warns.

use std::io::Write;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use super::own_connections::count_others;
use super::server_state::ServerState;
use super::TcpStoreServer;
use crate::process_exit::{lock_within, on_exit, ExitStage};

/// The longest the handler tries for one lock.
const PATIENCE: Duration = Duration::from_secs(1);
/// How often the handler looks at the connections while it waits.
const POLL: Duration = Duration::from_millis(5);

/// One hosted server, as the exit handler sees it.
struct Hosted {
    state: Arc<ServerState>,
    addr: SocketAddr,
    linger: Duration,
    /// The process that hosts it (a forked child holds a copy, not it).
    pid: u32,
    /// Its store was dropped: nothing serves any more.
    stopped: AtomicBool,
}

impl Hosted {
    /// Connections from other processes; `None` if a lock could not be had.
    fn others_connected(&self) -> Option<usize> {
        count_others(&self.state.open_ends(PATIENCE)?, PATIENCE)
    }
}

/// Every server hosted in this process (and, in a forked child, its
/// parent's, marked with the parent's id).
static HOSTED: Mutex<Vec<Weak<Hosted>>> = Mutex::new(Vec::new());
/// Hosted servers not stopped yet (a copy of the parent's in a forked
/// child, which the pid check below makes harmless).
static RUNNING: AtomicUsize = AtomicUsize::new(0);
/// The process that last registered a server (0: none yet).
static HOSTING_PID: AtomicU32 = AtomicU32::new(0);

/// Keeps a hosted server waited for at exit, until dropped (which marks
/// it stopped): held by the hosting store next to its server.
pub(crate) struct ExitWait(Arc<Hosted>);

impl ExitWait {
    /// Registers `server`, which its store keeps serving up to `linger`
    /// for other processes' clients when the process exits.
    pub(crate) fn register(server: &TcpStoreServer, linger: Duration) -> Self {
        let pid = std::process::id();
        let hosted = Arc::new(Hosted {
            state: server.state().clone(),
            addr: server.local_addr(),
            linger,
            pid,
            stopped: AtomicBool::new(false),
        });
        {
            let mut registry = HOSTED.lock().unwrap_or_else(|p| p.into_inner());
            registry.retain(|h| h.strong_count() > 0);
            registry.push(Arc::downgrade(&hosted));
        }
        RUNNING.fetch_add(1, Ordering::AcqRel);
        HOSTING_PID.store(pid, Ordering::Release);
        on_exit(ExitStage::ServeStores, wait_for_other_processes);
        ExitWait(hosted)
    }
}

impl Drop for ExitWait {
    fn drop(&mut self) {
        if !self.0.stopped.swap(true, Ordering::AcqRel) {
            RUNNING.fetch_sub(1, Ordering::AcqRel);
        }
        let mut registry = HOSTED.lock().unwrap_or_else(|p| p.into_inner());
        let this = Arc::as_ptr(&self.0);
        registry.retain(|h| h.strong_count() > 0 && !std::ptr::eq(h.as_ptr(), this));
    }
}

/// Waits until no other process is connected to a hosted server of this
/// process that still runs, each for at most its linger.
fn wait_for_other_processes() {
    let pid = std::process::id();
    if HOSTING_PID.load(Ordering::Acquire) != pid || RUNNING.load(Ordering::Acquire) == 0 {
        return;
    }
    let Some(registry) = lock_within(&HOSTED, PATIENCE) else {
        return;
    };
    let mut waiting: Vec<Arc<Hosted>> = registry
        .iter()
        .filter_map(Weak::upgrade)
        .filter(|h| h.pid == pid)
        .collect();
    drop(registry);
    let started = Instant::now();
    let mut gave_up = Vec::new();
    loop {
        waiting.retain(|h| {
            if h.stopped.load(Ordering::Acquire) {
                return false;
            }
            match h.others_connected() {
                None | Some(0) => false,
                Some(open) if started.elapsed() >= h.linger => {
                    gave_up.push((h.addr, open, h.linger));
                    false
                }
                Some(_) => true,
            }
        });
        if waiting.is_empty() {
            break;
        }
        std::thread::sleep(POLL);
    }
    for (addr, open, linger) in gave_up.into_iter().filter(|g| !g.2.is_zero()) {
        let _ = writeln!(
            std::io::stderr(),
            "tensorcomm: the store hosted at {addr} stops with the exiting process with \
             {open} client connection(s) of other processes still open after its linger \
             ({linger:?})"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{TcpStore, TcpStoreOptions};

    fn options(linger: Duration) -> TcpStoreOptions {
        TcpStoreOptions {
            timeout: Duration::from_secs(10),
            linger,
            ..TcpStoreOptions::default()
        }
    }

    #[test]
    fn the_hosting_stores_own_connections_do_not_hold_the_exit() {
        let host = TcpStore::host("127.0.0.1:0", 1, &options(Duration::from_secs(30))).unwrap();
        let registry = HOSTED.lock().unwrap();
        let hosted: Vec<Arc<Hosted>> = registry.iter().filter_map(Weak::upgrade).collect();
        drop(registry);
        let ours = hosted
            .iter()
            .find(|h| h.addr == host.server_addr())
            .expect("the hosting store registered its server");
        assert!(ours.state.open_connections() >= 1);
        assert_eq!(ours.others_connected(), Some(0));
        let started = Instant::now();
        wait_for_other_processes();
        assert!(started.elapsed() < Duration::from_secs(5));
        drop(host);
        assert!(ours.stopped.load(Ordering::Acquire));
    }
}
