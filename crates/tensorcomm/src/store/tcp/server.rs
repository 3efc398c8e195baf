//! `TcpStoreServer`: the process that holds a TCP store's keys.

use std::fmt;
use std::io;
use std::net::{SocketAddr, ToSocketAddrs};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// How often [`TcpStoreServer::wait_for_clients`] says at WARN how many
/// clients joined.
const CLIENTS_WARN_EVERY: Duration = Duration::from_secs(5);

use tokio::net::{TcpListener, TcpSocket, TcpStream};
use tokio::runtime::Runtime;
use tracing::{debug, warn};

use super::connection::{self, ServerConfig};
use super::connection_limit::ConnectionLimit;
use super::handshakes::Handshakes;
use super::own_connections::Ends;
use super::protocol::BUSY_REASON_PREFIX;
use super::server_state::{OpenConnection, ServerState};
use super::TcpStoreOptions;
use crate::{Error, Result};

/// Pending connections the kernel queues before `accept` (capped by
/// `net.core.somaxconn`): thousands of ranks connect at once at start-up.
const LISTEN_BACKLOG: u32 = 4096;

/// Worker threads of a server's runtime, at most.
const MAX_WORKERS: usize = 4;

/// Connections over the cap that may wait for their hello (to be answered
/// with a refusal) at once.
const MAX_REFUSING: usize = 64;

/// A TCP store server, running on its own background threads.
///
/// Every connection is a task on a small tokio runtime owned by the server,
/// so thousands of clients cost thousands of tasks, not threads. Dropping
/// the server stops it and closes every connection; clients waiting on it
/// get [`Error::StoreConnectionLost`] at once.
///
/// Most programs call [`super::TcpStore::host`] on rank 0 instead, which
/// keeps a server inside the returned store.
///
/// ```
/// use std::time::Duration;
/// use tensorcomm::store::{Store, TcpStore, TcpStoreOptions, TcpStoreServer};
///
/// let options = TcpStoreOptions::default();
/// let server = TcpStoreServer::bind("127.0.0.1:0", &options)?;
/// let addr = server.local_addr().to_string(); // the real port
/// let client = TcpStore::connect(&addr, &options)?;
/// server.wait_for_clients(1, Duration::from_secs(5))?;
/// client.set("k", b"v")?;
/// assert_eq!(client.get("k")?, b"v");
/// # Ok::<(), tensorcomm::Error>(())
/// ```
pub struct TcpStoreServer {
    local_addr: SocketAddr,
    state: Arc<ServerState>,
    runtime: Option<Runtime>,
}

impl TcpStoreServer {
    /// Binds `addr` ("host:port"; port 0 picks a free port) and starts
    /// serving. A port already in use gives [`Error::AddressInUse`].
    ///
    /// `options.token`, if set, is required from every client;
    /// `options.max_message_size` bounds every request.
    pub fn bind(addr: &str, options: &TcpStoreOptions) -> Result<Self> {
        let candidates: Vec<SocketAddr> = addr
            .to_socket_addrs()
            .map_err(|e| Error::io(format!("resolving the store address {addr:?}"), e))?
            .collect();
        let workers = std::thread::available_parallelism()
            .map_or(1, usize::from)
            .min(MAX_WORKERS);
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(workers)
            .thread_name("tensorcomm-store")
            .enable_io()
            .enable_time()
            .build()
            .map_err(|e| Error::io("starting the store server's runtime", e))?;
        let listener = {
            // The listener registers with this runtime's reactor.
            let _entered = runtime.enter();
            listen_on_any(addr, &candidates)?
        };
        let local_addr = listener
            .local_addr()
            .map_err(|e| Error::io("reading the store server's address", e))?;
        let state = Arc::new(ServerState::default());
        let limit = ConnectionLimit::new(options.max_connections);
        debug!(max = limit.max, origin = %limit.origin, "store server connection cap");
        let config = Arc::new(ServerConfig {
            token: options.token.clone(),
            max_message_size: options.max_message_size,
            idle_timeout: options.idle_timeout,
            max_connections: limit.max,
            max_connections_origin: limit.origin,
            warnings: Default::default(),
        });
        runtime.spawn(accept_loop(listener, state.clone(), config));
        debug!(%local_addr, "store server listening");
        Ok(TcpStoreServer {
            local_addr,
            state,
            runtime: Some(runtime),
        })
    }

    /// The address the server listens on, with the real port when 0 was
    /// asked for.
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// Clients that completed the handshake so far (cumulative: a client
    /// that left still counts; one that reconnects is not counted again;
    /// refused and stray connections never count).
    pub fn clients_joined(&self) -> usize {
        self.state.clients_joined()
    }

    /// Blocks until `expected` clients have joined, or fails with
    /// [`Error::ClientsTimeout`] saying how many did.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tensorcomm::{Error, store::{TcpStoreOptions, TcpStoreServer}};
    ///
    /// let server = TcpStoreServer::bind("127.0.0.1:0", &TcpStoreOptions::default())?;
    /// let err = server.wait_for_clients(1, Duration::from_millis(10)).unwrap_err();
    /// assert!(matches!(err, Error::ClientsTimeout { joined: 0, expected: 1, .. }));
    /// # Ok::<(), tensorcomm::Error>(())
    /// ```
    pub fn wait_for_clients(&self, expected: usize, timeout: Duration) -> Result<()> {
        // Says at WARN every 5 s how many joined, so that a rank waiting
        // for one that never comes (or died) is not silent.
        let started = std::time::Instant::now();
        let deadline = started + timeout;
        let joined = loop {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            let joined = self
                .state
                .wait_for_clients(expected, left.min(CLIENTS_WARN_EVERY));
            if joined >= expected || left <= CLIENTS_WARN_EVERY {
                break joined;
            }
            tracing::warn!(
                addr = %self.local_addr(),
                joined,
                expected,
                waited = ?started.elapsed(),
                ?timeout,
                "store server still waiting for clients: {joined} of {expected} joined (every rank of the job connects once)"
            );
        };
        if joined < expected {
            return Err(Error::ClientsTimeout {
                joined,
                expected,
                timeout,
            });
        }
        Ok(())
    }

    /// Connections open right now (clients of any kind, until they close).
    pub fn open_connections(&self) -> usize {
        self.state.open_connections()
    }

    /// Blocks until every client has closed its connection, at most
    /// `timeout`; returns whether that happened.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tensorcomm::store::{TcpStore, TcpStoreOptions, TcpStoreServer};
    ///
    /// let options = TcpStoreOptions::default();
    /// let server = TcpStoreServer::bind("127.0.0.1:0", &options)?;
    /// let client = TcpStore::connect(&server.local_addr().to_string(), &options)?;
    /// assert!(!server.wait_until_idle(Duration::from_millis(10)));
    /// drop(client);
    /// assert!(server.wait_until_idle(Duration::from_secs(10)));
    /// # Ok::<(), tensorcomm::Error>(())
    /// ```
    pub fn wait_until_idle(&self, timeout: Duration) -> bool {
        self.state.wait_until_idle(timeout) == 0
    }

    /// The state its connections share (for the exit-time wait,
    /// `at_exit.rs`).
    pub(crate) fn state(&self) -> &Arc<ServerState> {
        &self.state
    }

    /// Requests (get, wait, multi_get, queue_pop) blocked on the server
    /// right now, waiting for keys or queue elements.
    ///
    /// Useful to know that a set of clients is waiting before waking them,
    /// in tests and benchmarks.
    pub fn waiting_requests(&self) -> usize {
        self.state.waiting_requests()
    }
}

impl fmt::Debug for TcpStoreServer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TcpStoreServer")
            .field("local_addr", &self.local_addr)
            .field("clients_joined", &self.clients_joined())
            .finish()
    }
}

impl Drop for TcpStoreServer {
    fn drop(&mut self) {
        let Some(runtime) = self.runtime.take() else {
            return;
        };
        if tokio::runtime::Handle::try_current().is_ok() {
            // Inside an async context blocking is not allowed: the workers
            // drop every task (closing its connection) in the background.
            runtime.shutdown_background();
        } else {
            // Waits for the workers, which drop every task and so close
            // every connection and the listener before this returns.
            runtime.shutdown_timeout(Duration::from_secs(5));
        }
        debug!(local_addr = %self.local_addr, "store server stopped");
    }
}

/// Listens on the first of `candidates` that binds.
fn listen_on_any(addr: &str, candidates: &[SocketAddr]) -> Result<TcpListener> {
    let mut last_error = None;
    for candidate in candidates {
        match listen(*candidate) {
            Ok(listener) => return Ok(listener),
            Err(e) if e.kind() == io::ErrorKind::AddrInUse => {
                return Err(Error::AddressInUse {
                    addr: addr.to_string(),
                })
            }
            Err(e) => last_error = Some(e),
        }
    }
    Err(match last_error {
        Some(e) => Error::io(format!("binding the store server to {addr}"), e),
        None => Error::InvalidArgument(format!(
            "store address {addr:?} resolved to no socket address, expected host:port"
        )),
    })
}

fn listen(addr: SocketAddr) -> io::Result<TcpListener> {
    let socket = if addr.is_ipv4() {
        TcpSocket::new_v4()?
    } else {
        TcpSocket::new_v6()?
    };
    // Lets a restarted server take its port back from TIME_WAIT
    // connections; a live listener on the port still gives EADDRINUSE.
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    socket.listen(LISTEN_BACKLOG)
}

async fn accept_loop(listener: TcpListener, state: Arc<ServerState>, config: Arc<ServerConfig>) {
    let handshakes = Arc::new(Handshakes::default());
    let refusing = Arc::new(AtomicUsize::new(0));
    loop {
        match listener.accept().await {
            Ok((stream, peer)) => {
                let open_now = state.open_connections();
                // At the cap, a connection still in its handshake makes room
                // (see `handshakes.rs`); one that authenticated never does.
                if open_now >= config.max_connections && !handshakes.evict_oldest() {
                    refuse(stream, peer, open_now, &config, &refusing);
                    continue;
                }
                debug!(%peer, "store connection accepted");
                let ends = stream.local_addr().ok().map(|local| Ends::new(peer, local));
                let open = OpenConnection::new(&state, ends);
                let ticket = handshakes.enter();
                let serve = connection::serve(stream, peer, state.clone(), config.clone(), ticket);
                tokio::spawn(async move {
                    serve.await;
                    drop(open);
                });
            }
            Err(e) => {
                // Usually out of file descriptors: back off instead of
                // spinning, the connections waiting will be taken later.
                warn!("store server could not accept a connection: {e}");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
}

/// Refuses a connection over the cap with a reason the client shows (not
/// counted, and gone within a few seconds whatever the peer does). At most
/// [`MAX_REFUSING`] refusals wait for their hello at once; past that, a
/// connection is closed at once (its client sees the connection close and
/// tries again), so a flood over the cap cannot hold descriptors either.
fn refuse(
    stream: TcpStream,
    peer: SocketAddr,
    open_now: usize,
    config: &Arc<ServerConfig>,
    refusing: &Arc<AtomicUsize>,
) {
    if refusing.fetch_add(1, Ordering::Relaxed) >= MAX_REFUSING {
        refusing.fetch_sub(1, Ordering::Relaxed);
        drop(stream);
        return;
    }
    let reason = format!(
        "{BUSY_REASON_PREFIX}the store server has {open_now} connections open, its limit \
         ({}); try again later",
        config.max_connections_origin
    );
    let refusal = connection::refuse(stream, peer, reason, config.clone());
    let refusing = refusing.clone();
    tokio::spawn(async move {
        refusal.await;
        refusing.fetch_sub(1, Ordering::Relaxed);
    });
}
