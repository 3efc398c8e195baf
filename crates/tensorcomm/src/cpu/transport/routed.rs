//! [`RoutedTransport`]: one transport per peer, shared memory with ranks on
//! this host and TCP with the others, chosen by [`TransportChoice`].
//!
//! Setup exchanges [`host_identity`](super::host_identity) through the
//! store. Every rank sees the same identities, so the pairs agree on their
//! route. The TCP mesh is built only when some pair needs it (forced TCP, or
//! ranks on more than one host), and then between all ranks, which keeps
//! its setup the one every rank already knows.

use std::time::{Duration, Instant};

use super::choice::TransportChoice;
use super::host_identity::{exchange, host_identity};
use super::shm::{ShmTransport, ShmTransportOptions, ShmWait};
use super::{check_peer, TcpTransport, TcpTransportOptions, Transport};
use crate::store::Store;
use crate::{Error, Result};

/// How a [`RoutedTransport`] is set up.
#[derive(Clone, Debug, Default)]
pub struct RoutedTransportOptions {
    /// Which transport to use between which ranks.
    pub choice: TransportChoice,
    /// Options of the TCP mesh (its timeout also bounds the whole setup).
    pub tcp: TcpTransportOptions,
    /// Ring capacity per direction of each shared-memory link (`None`:
    /// [`DEFAULT_CAPACITY`](super::shm::DEFAULT_CAPACITY)).
    pub shm_capacity: Option<usize>,
    /// How calls blocked on a shared-memory link wait (see
    /// [`ShmTransportOptions::wait`]); the CPU process group sets it from
    /// `TENSORCOMM_SHM_WAIT`.
    pub shm_wait: ShmWait,
    /// This rank's host identity (`None`: [`host_identity`]). Ranks with
    /// equal identities use shared memory between them; override it only
    /// to split ranks of one host into separate "hosts".
    pub host_identity: Option<String>,
}

/// The transport that carries traffic to one peer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Route {
    /// This rank itself: nothing to carry.
    Local,
    /// A shared-memory link.
    Shm,
    /// A TCP connection.
    Tcp,
}

/// Shared memory to the ranks on this host, TCP to the rest.
///
/// ```
/// use std::{sync::Arc, thread, time::{Duration, Instant}};
/// use tensorcomm::cpu::transport::{Route, RoutedTransport, RoutedTransportOptions, Transport, TransportChoice};
/// use tensorcomm::cpu::transport::shm::ShmWait;
/// use tensorcomm::store::HashStore;
///
/// let store = Arc::new(HashStore::new());
/// let ranks: Vec<_> = (0..2).map(|rank| {
///     let store = store.clone();
///     thread::spawn(move || -> tensorcomm::Result<(Route, u8)> {
///         let options = RoutedTransportOptions {
///             choice: TransportChoice::Auto,
///             shm_wait: ShmWait::Sleep,
///             ..Default::default()
///         };
///         let t = RoutedTransport::connect(&*store, "doc", rank, 2, &options)?;
///         assert_eq!(t.shm_wait(), Some(ShmWait::Sleep)); // None without shared-memory links
///         let mut got = [0u8];
///         t.send_recv(1 - rank, &[rank as u8 + 10], 1 - rank, &mut got, Instant::now() + Duration::from_secs(10))?;
///         Ok((t.route(1 - rank), got[0]))
///     })
/// }).collect();
/// let got: Vec<(Route, u8)> = ranks.into_iter().map(|h| h.join().unwrap()).collect::<Result<_, _>>()?;
/// assert_eq!(got, [(Route::Shm, 11), (Route::Shm, 10)]); // threads share a host
/// # Ok::<(), tensorcomm::Error>(())
/// ```
pub struct RoutedTransport {
    rank: usize,
    world_size: usize,
    routes: Vec<Route>,
    shm: Option<ShmTransport>,
    tcp: Option<TcpTransport>,
}

impl std::fmt::Debug for RoutedTransport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RoutedTransport")
            .field("rank", &self.rank)
            .field("world_size", &self.world_size)
            .field("routes", &self.routes)
            .finish()
    }
}

impl RoutedTransport {
    /// Connects rank `rank` of `world_size` to every other rank through
    /// keys under `key_prefix` in `store`, each pair over the route
    /// `options.choice` gives it. Every rank calls this with the same prefix
    /// and the same choice.
    pub fn connect(
        store: &dyn Store,
        key_prefix: &str,
        rank: usize,
        world_size: usize,
        options: &RoutedTransportOptions,
    ) -> Result<Self> {
        if rank >= world_size {
            return Err(Error::InvalidArgument(format!(
                "RoutedTransport::connect: expected a rank in 0..{world_size}, found {rank}"
            )));
        }
        let choice = options.choice.resolve()?;
        let timeout = options.tcp.timeout;
        let mine = options.host_identity.clone().unwrap_or_else(host_identity);
        let routes = plan_routes(store, key_prefix, rank, world_size, choice, &mine, timeout)?;
        let shm_peers: Vec<usize> = (0..world_size)
            .filter(|&p| routes[p] == Route::Shm)
            .collect();
        let shm = if !shm_peers.is_empty() {
            Some(connect_shm(
                store, key_prefix, rank, world_size, &shm_peers, options, timeout,
            )?)
        } else {
            None
        };
        // Whether any pair in the group uses TCP is the same on every rank
        // (forced TCP, or more than one host), so all build the mesh or none.
        let tcp = if routes.contains(&Route::Tcp) {
            Some(TcpTransport::connect(
                store,
                &format!("{key_prefix}/tcp"),
                rank,
                world_size,
                &options.tcp,
            )?)
        } else {
            None
        };
        tracing::debug!(rank, world_size, ?routes, "routed transport connected");
        Ok(RoutedTransport {
            rank,
            world_size,
            routes,
            shm,
            tcp,
        })
    }

    /// How calls blocked on this rank's shared-memory links wait
    /// ([`ShmWait::Spin`] or [`ShmWait::Sleep`]); `None` without any.
    pub fn shm_wait(&self) -> Option<ShmWait> {
        self.shm.as_ref().map(ShmTransport::wait)
    }

    /// Every shared-memory link's peer and how its blocked calls wait, in
    /// peer order (none without shared memory).
    #[cfg(test)]
    pub(crate) fn shm_link_waits(&self) -> Vec<(usize, ShmWait)> {
        self.shm
            .as_ref()
            .map_or_else(Vec::new, ShmTransport::link_waits)
    }

    /// The transport that carries traffic to `peer` (`Local` for this rank
    /// and for ranks outside the group).
    pub fn route(&self, peer: usize) -> Route {
        self.routes.get(peer).copied().unwrap_or(Route::Local)
    }

    fn transport(&self, peer: usize, op: &str) -> Result<&dyn Transport> {
        check_peer(self.rank, self.world_size, peer, op)?;
        let t: Option<&dyn Transport> = match self.route(peer) {
            Route::Shm => self.shm.as_ref().map(|t| t as &dyn Transport),
            Route::Tcp => self.tcp.as_ref().map(|t| t as &dyn Transport),
            Route::Local => None,
        };
        t.ok_or_else(|| Error::InvalidArgument(format!("{op}: no route to rank {peer}")))
    }
}

fn connect_shm(
    store: &dyn Store,
    key_prefix: &str,
    rank: usize,
    world_size: usize,
    peers: &[usize],
    options: &RoutedTransportOptions,
    timeout: Duration,
) -> Result<ShmTransport> {
    let defaults = ShmTransportOptions::default();
    ShmTransport::connect_to(
        store,
        &format!("{key_prefix}/shm"),
        rank,
        world_size,
        peers,
        &ShmTransportOptions {
            capacity: options.shm_capacity.unwrap_or(defaults.capacity),
            timeout,
            wait: options.shm_wait,
        },
    )
}

/// Exchanges host identities and gives each peer its route.
fn plan_routes(
    store: &dyn Store,
    key_prefix: &str,
    rank: usize,
    world_size: usize,
    choice: TransportChoice,
    identity: &str,
    timeout: Duration,
) -> Result<Vec<Route>> {
    let local = |p: usize| if p == rank { Route::Local } else { Route::Tcp };
    if choice == TransportChoice::Tcp || world_size == 1 || !cfg!(target_os = "linux") {
        if choice == TransportChoice::Shm && world_size > 1 {
            return Err(Error::InvalidArgument(
                "TENSORCOMM_TRANSPORT=shm: shared memory is only available on Linux".into(),
            ));
        }
        return Ok((0..world_size).map(local).collect());
    }
    let started = Instant::now();
    let ids = exchange(
        store,
        &format!("{key_prefix}/host"),
        rank,
        world_size,
        identity,
        timeout,
    )?;
    tracing::debug!(
        rank,
        elapsed_us = started.elapsed().as_micros() as u64,
        "host identities exchanged"
    );
    let mine = &ids[rank];
    (0..world_size)
        .map(|p| {
            if p == rank {
                Ok(Route::Local)
            } else if &ids[p] == mine {
                Ok(Route::Shm)
            } else if choice == TransportChoice::Shm {
                Err(Error::ShmPeerNotLocal {
                    peer: p,
                    expected: mine.clone(),
                    found: ids[p].clone(),
                })
            } else {
                Ok(Route::Tcp)
            }
        })
        .collect()
}

impl Transport for RoutedTransport {
    fn rank(&self) -> usize {
        self.rank
    }

    fn world_size(&self) -> usize {
        self.world_size
    }

    fn send(&self, to: usize, data: &[u8], deadline: Instant) -> Result<()> {
        self.transport(to, "send")?.send(to, data, deadline)
    }

    fn recv(&self, from: usize, buf: &mut [u8], deadline: Instant) -> Result<()> {
        self.transport(from, "recv")?.recv(from, buf, deadline)
    }

    fn send_recv(
        &self,
        to: usize,
        data: &[u8],
        from: usize,
        buf: &mut [u8],
        deadline: Instant,
    ) -> Result<()> {
        let out = self.transport(to, "send_recv")?;
        let inp = self.transport(from, "send_recv")?;
        if self.route(to) == self.route(from) {
            return out.send_recv(to, data, from, buf, deadline);
        }
        // Different transports: the send runs on a helper thread while this
        // one receives, so neither direction waits for the other.
        let (sent, received) = std::thread::scope(|s| {
            let sender = s.spawn(|| out.send(to, data, deadline));
            let received = inp.recv(from, buf, deadline);
            let sent = sender.join().unwrap_or_else(|_| {
                Err(Error::InvalidArgument(
                    "send_recv: the sending thread panicked".into(),
                ))
            });
            (sent, received)
        });
        received.and(sent)
    }

    fn check_alive(&self, peer: usize) -> Result<()> {
        self.transport(peer, "check_alive")?.check_alive(peer)
    }

    fn has_data(&self, from: usize) -> Result<bool> {
        self.transport(from, "has_data")?.has_data(from)
    }

    fn sleep_for_data(&self, from: usize, timeout: Duration) {
        if let Ok(t) = self.transport(from, "sleep_for_data") {
            t.sleep_for_data(from, timeout);
        }
    }

    fn abort(&self) {
        if let Some(shm) = &self.shm {
            shm.abort();
        }
        if let Some(tcp) = &self.tcp {
            tcp.abort();
        }
    }
}
