//! [`ShmTransport`]: the [`Transport`] trait over one [`ShmLink`] per peer.
//!
//! `send` and `recv` are the link's blocking calls. `send_recv` drives the
//! link to `to` and the link from `from` together through their
//! non-blocking `try_send_some`/`try_recv_some`, so two ranks exchanging
//! more than a ring holds (or every rank of a ring) always progress. The
//! links are set up pair by pair in (lower rank, higher rank) order, the
//! same order on every rank, so setup cannot deadlock.
//!
//! The transport counts its ranks on this host (itself and its peers)
//! against the host's CPUs online and, with more ranks than CPUs, makes
//! every wait sleep soon ([`ShmWait`]; `TENSORCOMM_SHM_WAIT` overrides it
//! for a group).

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use super::wait::{Backoff, ShmWait, MAX_SLEEP};
use super::{ShmLink, DEFAULT_CAPACITY};
use crate::cpu::transport::{check_peer, Transport};
use crate::store::Store;
use crate::{Error, Result};

/// How a [`ShmTransport`] is set up.
#[derive(Clone, Debug)]
pub struct ShmTransportOptions {
    /// Ring capacity per direction of each link, in bytes.
    pub capacity: usize,
    /// How long setup waits for each peer.
    pub timeout: Duration,
    /// How blocked calls wait; `Auto` (the default) sleeps soon when this
    /// rank and its peers outnumber the host's CPUs online.
    pub wait: ShmWait,
}

impl Default for ShmTransportOptions {
    fn default() -> Self {
        ShmTransportOptions {
            capacity: DEFAULT_CAPACITY,
            timeout: Duration::from_secs(300),
            wait: ShmWait::Auto,
        }
    }
}

/// Shared-memory links from this rank to some or all of the other ranks of
/// a group on the same host.
///
/// ```
/// use std::{sync::Arc, thread, time::{Duration, Instant}};
/// use tensorcomm::cpu::transport::shm::{ShmTransport, ShmTransportOptions, ShmWait};
/// use tensorcomm::cpu::transport::Transport;
/// use tensorcomm::store::HashStore;
///
/// let store = Arc::new(HashStore::new());
/// let deadline = || Instant::now() + Duration::from_secs(10);
/// let ranks: Vec<_> = (0..3).map(|rank| {
///     let store = store.clone();
///     thread::spawn(move || -> tensorcomm::Result<u8> {
///         let options = ShmTransportOptions { wait: ShmWait::Spin, ..Default::default() };
///         let t = ShmTransport::connect(&*store, "ring", rank, 3, &options)?;
///         assert_eq!(t.wait(), ShmWait::Spin); // every link's blocked calls spin first
///         let mut got = [0u8];
///         t.send_recv((rank + 1) % 3, &[rank as u8], (rank + 2) % 3, &mut got, deadline())?;
///         Ok(got[0])
///     })
/// }).collect();
/// let got: Vec<u8> = ranks.into_iter().map(|h| h.join().unwrap()).collect::<Result<_, _>>()?;
/// assert_eq!(got, [2, 0, 1]);
/// # Ok::<(), tensorcomm::Error>(())
/// ```
pub struct ShmTransport {
    rank: usize,
    world_size: usize,
    links: Vec<Option<ShmLink>>,
    /// How blocked calls wait: `Spin` or `Sleep`, never `Auto`.
    wait: ShmWait,
    aborted: AtomicBool,
}

impl std::fmt::Debug for ShmTransport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let peers: Vec<usize> = self.peers().collect();
        f.debug_struct("ShmTransport")
            .field("rank", &self.rank)
            .field("world_size", &self.world_size)
            .field("peers", &peers)
            .finish()
    }
}

impl ShmTransport {
    /// Links rank `rank` of `world_size` to every other rank through keys
    /// under `key_prefix` in `store`. Every rank calls this with the same
    /// prefix and options.
    pub fn connect(
        store: &dyn Store,
        key_prefix: &str,
        rank: usize,
        world_size: usize,
        options: &ShmTransportOptions,
    ) -> Result<Self> {
        let all: Vec<usize> = (0..world_size).filter(|&p| p != rank).collect();
        Self::connect_to(store, key_prefix, rank, world_size, &all, options)
    }

    /// Links this rank to the ranks in `peers` only (others stay
    /// unreachable through this transport). Both ranks of each pair must
    /// list each other.
    pub fn connect_to(
        store: &dyn Store,
        key_prefix: &str,
        rank: usize,
        world_size: usize,
        peers: &[usize],
        options: &ShmTransportOptions,
    ) -> Result<Self> {
        if rank >= world_size {
            return Err(Error::InvalidArgument(format!(
                "ShmTransport::connect: expected a rank in 0..{world_size}, found {rank}"
            )));
        }
        let mut links: Vec<Option<ShmLink>> = (0..world_size).map(|_| None).collect();
        let mut sorted = peers.to_vec();
        sorted.sort_unstable();
        sorted.dedup();
        let local_ranks = sorted.len() + 1;
        let wait = options
            .wait
            .resolve(local_ranks, crate::cpu::host_cpus_online());
        // Pairs (min, max) in lexicographic order on every rank: lower
        // peers first (ascending), then higher ones.
        for peer in sorted {
            check_peer(rank, world_size, peer, "ShmTransport::connect")?;
            let mut link = ShmLink::connect(
                store,
                key_prefix,
                rank,
                peer,
                options.capacity,
                options.timeout,
            )?;
            link.set_wait(wait);
            links[peer] = Some(link);
        }
        tracing::debug!(rank, local_ranks, ?wait, "shm transport connected");
        Ok(ShmTransport {
            rank,
            world_size,
            links,
            wait,
            aborted: AtomicBool::new(false),
        })
    }

    /// The ranks this transport has links to.
    pub fn peers(&self) -> impl Iterator<Item = usize> + '_ {
        self.links
            .iter()
            .enumerate()
            .filter_map(|(i, l)| l.as_ref().map(|_| i))
    }

    /// How blocked calls wait: [`ShmWait::Spin`] or [`ShmWait::Sleep`].
    pub fn wait(&self) -> ShmWait {
        self.wait
    }

    /// Every link's peer and how its blocked calls wait, in peer order
    /// (each should be [`wait`](Self::wait)).
    #[cfg(test)]
    pub(crate) fn link_waits(&self) -> Vec<(usize, ShmWait)> {
        self.links
            .iter()
            .enumerate()
            .filter_map(|(peer, l)| l.as_ref().map(|l| (peer, l.wait())))
            .collect()
    }

    fn link(&self, peer: usize, op: &str) -> Result<&ShmLink> {
        check_peer(self.rank, self.world_size, peer, op)?;
        let link = self
            .links
            .get(peer)
            .and_then(Option::as_ref)
            .ok_or_else(|| {
                Error::InvalidArgument(format!("{op}: no shared-memory link to rank {peer}"))
            })?;
        if self.aborted.load(Ordering::Relaxed) {
            // This rank's doing, not the peer's (as the TCP transport says
            // after its abort).
            return Err(Error::LinkShutDownHere {
                peer,
                during: format!("{op} was called after this rank aborted its transport"),
            });
        }
        Ok(link)
    }
}

impl Transport for ShmTransport {
    fn rank(&self) -> usize {
        self.rank
    }

    fn world_size(&self) -> usize {
        self.world_size
    }

    fn send(&self, to: usize, data: &[u8], deadline: Instant) -> Result<()> {
        self.link(to, "send")?.send(data, deadline)
    }

    fn check_alive(&self, peer: usize) -> Result<()> {
        self.link(peer, "check_alive")?
            .check_alive("waiting on it in shared memory")
    }

    fn recv(&self, from: usize, buf: &mut [u8], deadline: Instant) -> Result<()> {
        self.link(from, "recv")?.recv(buf, deadline)
    }

    fn has_data(&self, from: usize) -> Result<bool> {
        self.link(from, "has_data")?
            .has_data("waiting for a message from it")
    }

    /// Sleeps on the link's data signal, which the peer's next write (or
    /// its closing) wakes; returns at once when there is no such link
    /// (the caller's next `has_data` says why).
    fn sleep_for_data(&self, from: usize, timeout: Duration) {
        if let Ok(link) = self.link(from, "sleep_for_data") {
            link.sleep_for_data(timeout);
        }
    }

    fn send_recv(
        &self,
        to: usize,
        data: &[u8],
        from: usize,
        buf: &mut [u8],
        deadline: Instant,
    ) -> Result<()> {
        let out = self.link(to, "send_recv")?;
        let inp = self.link(from, "send_recv")?;
        let started = Instant::now();
        let (mut sent, mut got) = (0, 0);
        let mut backoff = Backoff::with(self.wait);
        while sent < data.len() || got < buf.len() {
            let mut progress = false;
            if sent < data.len() {
                let n = out.try_send_some(&data[sent..])?;
                sent += n;
                progress |= n > 0;
            }
            if got < buf.len() {
                let n = inp.try_recv_some(&mut buf[got..])?;
                got += n;
                progress |= n > 0;
            }
            if progress {
                backoff.reset();
                continue;
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(Error::PeerTimeout {
                    peer: if got < buf.len() { from } else { to },
                    during: format!(
                        "rank {} was sending {} bytes to rank {to} ({sent} sent) and receiving {} bytes from rank {from} ({got} received)",
                        self.rank,
                        data.len(),
                        buf.len()
                    ),
                    timeout: now - started,
                });
            }
            // Sleep on the one ring this call waits for; when it waits for
            // both, a read by `to` (space) wakes nobody, so that sleep is
            // kept as short as a plain one.
            let (sending, receiving) = (sent < data.len(), got < buf.len());
            backoff.snooze_on(|d| match (sending, receiving) {
                (true, false) => out.sleep_for_space(d),
                (false, _) => inp.sleep_for_data(d),
                (true, true) => inp.sleep_for_data(d.min(MAX_SLEEP)),
            });
        }
        Ok(())
    }

    fn abort(&self) {
        self.aborted.store(true, Ordering::Relaxed);
        for link in self.links.iter().flatten() {
            link.close();
        }
    }
}
