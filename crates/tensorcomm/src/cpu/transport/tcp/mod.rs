//! The TCP full-mesh transport.
//!
//! One connection per pair of ranks, Nagle off, set up through the store
//! (see `setup.rs`). Each connection is split into a reading and a writing
//! handle, each behind its own lock, so a rank can send to and receive from
//! the same peer at once. Buffers are written and read in place: no copy
//! is made of a message, whatever its size.

mod io;
mod setup;

use std::sync::{Mutex, MutexGuard, OnceLock, PoisonError};
use std::time::{Duration, Instant};

use io::{exchange_without_blocking, read_exact, write_all, Context, Half};

/// How long `send_recv` keeps polling both sockets without progress
/// before it falls back to blocking calls (and a helper thread for the
/// send), when the host has at least two cores per rank
/// ([`exchange_patience`]). Short: while a peer computes, a blocked thread
/// costs nothing.
const EXCHANGE_PATIENCE: Duration = Duration::from_micros(200);

/// [`EXCHANGE_PATIENCE`] where every rank of a `world_size` group on this
/// host can have two cores (its own and one for its peer's traffic), zero
/// otherwise: polling ranks that share cores slow each other down.
fn exchange_patience(world_size: usize) -> Duration {
    static CORES: OnceLock<usize> = OnceLock::new();
    let cores = *CORES.get_or_init(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    if cores >= 2 * world_size {
        EXCHANGE_PATIENCE
    } else {
        Duration::ZERO
    }
}

use super::{check_peer, Transport};
use crate::store::Store;
use crate::{Error, Result};

/// How a [`TcpTransport`] is set up.
#[derive(Clone, Debug)]
pub struct TcpTransportOptions {
    /// The address other ranks reach this one at. Loopback (the default)
    /// also binds the listener to loopback; any other address binds every
    /// interface.
    pub advertise_host: String,
    /// How long setup waits for the other ranks.
    pub timeout: Duration,
}

impl Default for TcpTransportOptions {
    fn default() -> Self {
        TcpTransportOptions {
            advertise_host: "127.0.0.1".into(),
            timeout: Duration::from_secs(300),
        }
    }
}

/// The two directions of the connection to one peer.
struct Peer {
    reader: Mutex<Half>,
    writer: Mutex<Half>,
    /// A third handle, never locked, for [`Transport::abort`].
    control: std::net::TcpStream,
}

/// A full mesh of TCP connections between the ranks of a group.
///
/// ```
/// use std::{sync::Arc, thread, time::{Duration, Instant}};
/// use tensorcomm::cpu::transport::{TcpTransport, TcpTransportOptions, Transport};
/// use tensorcomm::store::HashStore;
///
/// let store = Arc::new(HashStore::new());
/// let deadline = || Instant::now() + Duration::from_secs(10);
/// let ranks: Vec<_> = (0..3).map(|rank| {
///     let store = store.clone();
///     thread::spawn(move || -> tensorcomm::Result<u8> {
///         let t = TcpTransport::connect(&*store, "ring", rank, 3, &TcpTransportOptions::default())?;
///         let mut got = [0u8];
///         t.send_recv((rank + 1) % 3, &[rank as u8], (rank + 2) % 3, &mut got, deadline())?;
///         Ok(got[0])
///     })
/// }).collect();
/// let got: Vec<u8> = ranks.into_iter().map(|h| h.join().unwrap()).collect::<Result<_, _>>()?;
/// assert_eq!(got, [2, 0, 1]);
/// # Ok::<(), tensorcomm::Error>(())
/// ```
pub struct TcpTransport {
    rank: usize,
    world_size: usize,
    peers: Vec<Option<Peer>>,
}

impl std::fmt::Debug for TcpTransport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TcpTransport")
            .field("rank", &self.rank)
            .field("world_size", &self.world_size)
            .finish_non_exhaustive()
    }
}

impl TcpTransport {
    /// Connects rank `rank` of `world_size` to every other rank, meeting
    /// them through keys under `key_prefix` in `store`. Every rank of the
    /// group calls this with the same prefix.
    pub fn connect(
        store: &dyn Store,
        key_prefix: &str,
        rank: usize,
        world_size: usize,
        options: &TcpTransportOptions,
    ) -> Result<Self> {
        if rank >= world_size {
            return Err(Error::InvalidArgument(format!(
                "TcpTransport::connect: expected a rank in 0..{world_size}, found {rank}"
            )));
        }
        let streams = setup::build_mesh(
            store,
            key_prefix,
            rank,
            world_size,
            &options.advertise_host,
            options.timeout,
        )?;
        let mut peers = Vec::with_capacity(world_size);
        for (peer, stream) in streams.into_iter().enumerate() {
            let Some(stream) = stream else {
                peers.push(None);
                continue;
            };
            let reader = stream
                .try_clone()
                .map_err(|e| Error::io(format!("duplicating the socket to rank {peer}"), e))?;
            let control = stream
                .try_clone()
                .map_err(|e| Error::io(format!("duplicating the socket to rank {peer}"), e))?;
            peers.push(Some(Peer {
                control,
                reader: Mutex::new(Half::new(reader)),
                writer: Mutex::new(Half::new(stream)),
            }));
        }
        Ok(TcpTransport {
            rank,
            world_size,
            peers,
        })
    }

    fn peer(&self, peer: usize, op: &str) -> Result<&Peer> {
        check_peer(self.rank, self.world_size, peer, op)?;
        self.peers
            .get(peer)
            .and_then(Option::as_ref)
            .ok_or_else(|| Error::InvalidArgument(format!("{op}: no connection to rank {peer}")))
    }
}

fn lock(half: &Mutex<Half>) -> MutexGuard<'_, Half> {
    // A panic mid-transfer leaves the stream's position unknown either way;
    // the next transfer's checks (lengths, fingerprints) catch it.
    half.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Transport for TcpTransport {
    fn rank(&self) -> usize {
        self.rank
    }

    fn world_size(&self) -> usize {
        self.world_size
    }

    fn send(&self, to: usize, data: &[u8], deadline: Instant) -> Result<()> {
        let peer = self.peer(to, "send")?;
        let cx = Context {
            peer: to,
            what: "sending",
            len: data.len(),
            started: Instant::now(),
            deadline,
        };
        write_all(&mut lock(&peer.writer), data, &cx)
    }

    fn recv(&self, from: usize, buf: &mut [u8], deadline: Instant) -> Result<()> {
        let peer = self.peer(from, "recv")?;
        let cx = Context {
            peer: from,
            what: "receiving",
            len: buf.len(),
            started: Instant::now(),
            deadline,
        };
        read_exact(&mut lock(&peer.reader), buf, &cx)
    }

    fn send_recv(
        &self,
        to: usize,
        data: &[u8],
        from: usize,
        buf: &mut [u8],
        deadline: Instant,
    ) -> Result<()> {
        let out = self.peer(to, "send_recv")?;
        let inp = self.peer(from, "send_recv")?;
        let started = Instant::now();
        let send_cx = Context {
            peer: to,
            what: "sending",
            len: data.len(),
            started,
            deadline,
        };
        let recv_cx = Context {
            peer: from,
            what: "receiving",
            len: buf.len(),
            started,
            deadline,
        };
        let mut writer = lock(&out.writer);
        let mut reader = lock(&inp.reader);
        // Both directions are first driven together on this thread
        // without blocking, while data keeps moving (the common case: both
        // peers are in the same step). If that stalls, what is left is
        // moved blocking: the rest of the send by a helper thread while
        // this one reads, so two ranks sending to each other always
        // progress.
        let (sent, received) = exchange_without_blocking(
            &mut writer,
            data,
            &send_cx,
            &mut reader,
            buf,
            &recv_cx,
            exchange_patience(self.world_size),
        )?;
        let buf = &mut buf[received..];
        if sent == data.len() {
            return read_exact(&mut reader, buf, &recv_cx);
        }
        let rest = &data[sent..];
        let writer = &mut *writer;
        let send_cx = &send_cx;
        let (sent, received) = std::thread::scope(|s| {
            let sender = s.spawn(move || write_all(writer, rest, send_cx));
            let received = read_exact(&mut reader, buf, &recv_cx);
            let sent = sender.join().unwrap_or_else(|_| {
                Err(Error::InvalidArgument(
                    "send_recv: the sending thread panicked".into(),
                ))
            });
            (sent, received)
        });
        received.and(sent)
    }

    fn abort(&self) {
        for peer in self.peers.iter().flatten() {
            // Already closed by the peer is fine: it is closed either way.
            let _ = peer.control.shutdown(std::net::Shutdown::Both);
        }
    }
}
