//! Rendezvous: turning an init method into a rank, a world size and a store.
//!
//! Three init methods, as in `torch.distributed`:
//! - `env://` reads the torchrun contract (`MASTER_ADDR`, `MASTER_PORT`,
//!   `RANK`, `WORLD_SIZE`, `LOCAL_RANK`, `LOCAL_WORLD_SIZE`), falling back to
//!   SLURM (`SLURM_PROCID`, `SLURM_NTASKS`, `SLURM_LOCALID`) and Open MPI
//!   (`OMPI_COMM_WORLD_RANK`, `_SIZE`, `_LOCAL_RANK`) variables;
//! - `tcp://host:port?rank=R&world_size=W`;
//! - `file:///path?rank=R&world_size=W` (a [`FileStore`] on a shared file
//!   system).
//!
//! For TCP, rank 0 hosts the [`TcpStore`] server and waits until every rank
//! has posted its process record, and the others wait until it has seen
//! them all; for a file, every rank waits at a barrier in the file. Under
//! `tensorcomm run`, these waits fail at once naming a rank the launcher
//! saw exit before it joined (see [`launch_exits`]).
//! Rank 0's server listens on the address `MASTER_ADDR` (the URL's host)
//! resolves to, not on every interface, unless `TENSORCOMM_BIND_ALL=1`
//! (see [`crate::listen_address`]): rank 0 must run on the host that
//! address names.

mod arrival;
mod init_method;
pub mod launch_exits;

use std::sync::Arc;
use std::time::Duration;

pub use init_method::{InitMethod, StoreAddress};

use crate::listen_address::{bind_all_from_env, explain_bind_error, store_listen_address};
use crate::store::{FileStore, Store, TcpStore, TcpStoreOptions};
use crate::{Error, Result};

/// A process that has found its peers.
pub struct Rendezvous {
    /// This process's rank, `0..world_size`.
    pub rank: usize,
    /// The number of ranks in the job.
    pub world_size: usize,
    /// This process's index among the ranks of its node, when known.
    pub local_rank: Option<usize>,
    /// How many ranks run on this node, when known.
    pub local_world_size: Option<usize>,
    /// The store every rank of the job is connected to.
    pub store: Arc<dyn Store>,
}

impl std::fmt::Debug for Rendezvous {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Rendezvous")
            .field("rank", &self.rank)
            .field("world_size", &self.world_size)
            .field("local_rank", &self.local_rank)
            .field("local_world_size", &self.local_world_size)
            .finish_non_exhaustive()
    }
}

/// Meets the other ranks described by `init_method`, reading the process
/// environment for `env://`, and waiting at most `timeout` for them.
///
/// ```
/// use std::time::Duration;
/// use tensorcomm::rendezvous::rendezvous;
///
/// // A job of one: rank 0 hosts the store on a free port.
/// let r = rendezvous("tcp://127.0.0.1:0?rank=0&world_size=1", Duration::from_secs(10))?;
/// assert_eq!((r.rank, r.world_size), (0, 1));
/// r.store.set("hello", b"world")?;
/// # Ok::<(), tensorcomm::Error>(())
/// ```
pub fn rendezvous(init_method: &str, timeout: Duration) -> Result<Rendezvous> {
    let method = InitMethod::parse(init_method, |name| std::env::var(name).ok())?;
    connect(&method, timeout)
}

/// Meets the other ranks of an already parsed init method.
pub fn connect(method: &InitMethod, timeout: Duration) -> Result<Rendezvous> {
    let exits = launch_exits::path_for(method);
    let exits = exits.as_deref();
    let store: Arc<dyn Store> = match &method.address {
        StoreAddress::Tcp { host, port } => {
            let options = TcpStoreOptions {
                timeout,
                ..TcpStoreOptions::default()
            };
            let addr = host_port(host, *port);
            if method.rank == 0 {
                // Listen where the other ranks are told to connect (the
                // interface MASTER_ADDR names), unless TENSORCOMM_BIND_ALL=1.
                let nodes = method.local_world_size.map(|l| (method.world_size, l));
                let bind = store_listen_address(host, *port, nodes, bind_all_from_env()?)?;
                tracing::debug!(%bind, world_size = method.world_size, "rank 0 hosting the TCP store");
                let what = "the TCP store (rank 0)";
                let told = format!("MASTER_ADDR {host}");
                // The other ranks are waited for below, by their process
                // records, a wait that can tell who is missing and who
                // will never come.
                Arc::new(
                    TcpStore::host(&bind, 1, &options)
                        .map_err(|e| explain_bind_error(e, what, &bind, &told))?,
                )
            } else {
                tracing::debug!(%addr, rank = method.rank, "connecting to the TCP store");
                arrival::reach_store_host(
                    &addr,
                    &options,
                    (method.rank, method.world_size),
                    exits,
                )?;
                Arc::new(TcpStore::connect(&addr, &options)?)
            }
        }
        StoreAddress::File { path } => {
            let store = FileStore::open(path)?;
            let ranks = (method.rank, method.world_size);
            arrival::file_barrier(&store, path, ranks, timeout, exits)?;
            Arc::new(store)
        }
    };
    store.set_timeout(crate::store::DEFAULT_TIMEOUT);
    // A store host that stops answering fails rendezvous within its
    // timeout (see `store/tcp/reply_grace.rs`).
    let _grace = crate::store::tcp::reply_grace::set_up_on_this_thread(timeout);
    // Lets the others' set-up waits tell when this process is gone, and
    // tells rank 0 this rank has arrived.
    store.set(&process_key(method.rank), this_process().as_bytes())?;
    if matches!(method.address, StoreAddress::Tcp { .. }) {
        let ranks = (method.rank, method.world_size);
        arrival::wait_for_ranks(&*store, ranks, timeout, exits)?;
    }
    Ok(Rendezvous {
        rank: method.rank,
        world_size: method.world_size,
        local_rank: method.local_rank,
        local_world_size: method.local_world_size,
        store,
    })
}

/// `host:port`, with brackets around an IPv6 literal.
///
/// ```
/// use tensorcomm::rendezvous::host_port;
/// assert_eq!(host_port("10.0.0.1", 29500), "10.0.0.1:29500");
/// assert_eq!(host_port("::", 1), "[::]:1");
/// assert_eq!(host_port("[::1]", 2), "[::1]:2");
/// assert_eq!(host_port("node7", 3), "node7:3");
/// ```
pub fn host_port(host: &str, port: u16) -> String {
    if host.contains(':') && !host.starts_with('[') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    }
}

/// The store key under which rank `rank` of a job posts its process at
/// rendezvous (see [`process_gone`]); rank 0 of a TCP rendezvous waits
/// for every rank's.
pub(crate) fn process_key(rank: usize) -> String {
    format!("tensorcomm/rendezvous/process/{rank}")
}

/// This process: host identity, pid and start time (in clock ticks after
/// boot, from `/proc/self/stat`; empty where unreadable).
fn this_process() -> String {
    let pid = std::process::id();
    format!(
        "{}\npid={pid}\nstart={}",
        crate::cpu::transport::host_identity(),
        start_time(pid).unwrap_or_default()
    )
}

/// The start time of process `pid` and whether it is a zombie or dead
/// (`/proc/PID/stat` fields 3 and 22); `None` if it does not exist.
fn stat_of(pid: u32) -> Option<(char, String)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) may hold spaces and parentheses.
    let rest = &stat[stat.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let state = fields.first()?.chars().next()?;
    Some((state, fields.get(19)?.to_string()))
}

fn start_time(pid: u32) -> Option<String> {
    stat_of(pid).map(|(_, start)| start)
}

/// `Some(description)` when rank `rank` of the job posted its process (at
/// rendezvous), runs on this host, and that process has exited: no such
/// pid, a zombie, or a pid reused by a process started later. `None` when
/// it is alive, on another host, or never posted (nothing known). The one
/// error is [`Error::StoreConnectionLost`]: the store itself is gone.
pub(crate) fn process_gone(store: &dyn Store, rank: usize) -> Result<Option<String>> {
    let key = process_key(rank);
    match store.check(&[key.as_str()]) {
        Ok(true) => Ok(posted_process_gone(store, &key)),
        Err(e @ Error::StoreConnectionLost { .. }) => Err(e),
        Ok(false) | Err(_) => Ok(None),
    }
}

/// [`process_gone`] once rank's record, under `key`, is known to be there.
fn posted_process_gone(store: &dyn Store, key: &str) -> Option<String> {
    let posted = String::from_utf8(store.get_timeout(key, Duration::from_secs(1)).ok()?).ok()?;
    let mut lines = posted.lines();
    let host = lines.next()?;
    let pid: u32 = lines.next()?.strip_prefix("pid=")?.parse().ok()?;
    let start = lines.next()?.strip_prefix("start=")?;
    if host != crate::cpu::transport::host_identity() || pid == std::process::id() {
        return None;
    }
    let gone = match stat_of(pid) {
        None => true,
        Some((state, now_start)) => {
            matches!(state, 'Z' | 'X' | 'x') || (!start.is_empty() && now_start != start)
        }
    };
    gone.then(|| format!("pid {pid} on this host"))
}
