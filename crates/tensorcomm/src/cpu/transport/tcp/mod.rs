//! The TCP full-mesh transport.
//!
//! One or more connections per pair of ranks ("lanes"), Nagle off, set
//! up through the store (see `setup.rs`). Each connection is split into a
//! reading and a writing handle, each behind its own lock, so a rank can
//! send to and receive from the same peer at once. Buffers are written and
//! read in place: no copy is made of a message, whatever its size. Large
//! messages are cut into stripes, one per lane, moved in parallel by
//! helper threads (see `striped.rs`).

mod io;
mod pending_hellos;
pub(crate) mod setup;
mod striped;
#[cfg(test)]
mod whose_fault_tests;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use io::{exchange_without_blocking, read_exact, write_all, Context, Half};
use striped::stripe_count;

use crate::cpu::helper_threads::first_error;
use crate::cpu::{host_cores, HelperThreads};

/// The most connections per pair of ranks.
pub const MAX_TCP_LANES: usize = 8;

/// Connections per pair of ranks when the options leave it open: enough
/// that every rank's stripes in both directions get a core each, with
/// `cores` cores for `world_size` ranks on this host, at most 4.
///
/// ```
/// use tensorcomm::cpu::transport::auto_tcp_lanes;
/// assert_eq!(auto_tcp_lanes(2, 32), 4);
/// assert_eq!(auto_tcp_lanes(8, 32), 2);
/// assert_eq!(auto_tcp_lanes(2, 2), 1);
/// ```
pub fn auto_tcp_lanes(world_size: usize, cores: usize) -> usize {
    (cores / (2 * world_size.max(1))).clamp(1, 4)
}

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
    if host_cores() >= 2 * world_size {
        EXCHANGE_PATIENCE
    } else {
        Duration::ZERO
    }
}

use super::{check_peer, Transport};
use crate::job_token::JobToken;
use crate::store::Store;
use crate::{Error, Result};

/// How a [`TcpTransport`] is set up.
#[derive(Clone, Debug)]
pub struct TcpTransportOptions {
    /// The address other ranks reach this one at, and the address the
    /// listener binds (it must be one of this host's, else set-up fails
    /// with [`Error::ListenAddress`]); loopback by default.
    pub advertise_host: String,
    /// Listen on every interface instead of `advertise_host` only; `None`:
    /// `TENSORCOMM_BIND_ALL` (`1` for every interface), else only
    /// `advertise_host`.
    pub bind_all: Option<bool>,
    /// The job's token, which every connection of the mesh proves in its
    /// hello (a peer without it, or with another, is refused); by default
    /// `$TENSORCOMM_STORE_TOKEN` if set and not empty.
    pub token: Option<JobToken>,
    /// How long setup waits for the other ranks.
    pub timeout: Duration,
    /// Connections per pair of ranks (1 to [`MAX_TCP_LANES`]); `None`:
    /// `TENSORCOMM_TCP_LANES` where set, otherwise [`auto_tcp_lanes`].
    /// Rank 0's choice is the group's.
    pub lanes: Option<usize>,
}

impl Default for TcpTransportOptions {
    fn default() -> Self {
        TcpTransportOptions {
            advertise_host: "127.0.0.1".into(),
            bind_all: None,
            token: JobToken::from_env(),
            timeout: Duration::from_secs(300),
            lanes: None,
        }
    }
}

/// The two directions of one connection to a peer.
struct Connection {
    reader: Mutex<Half>,
    writer: Mutex<Half>,
    /// A third handle, never locked, for [`Transport::abort`].
    control: std::net::TcpStream,
}

impl Connection {
    fn new(peer: usize, stream: std::net::TcpStream) -> Result<Connection> {
        let dup = |s: &std::net::TcpStream| {
            s.try_clone()
                .map_err(|e| Error::io(format!("duplicating the socket to rank {peer}"), e))
        };
        Ok(Connection {
            reader: Mutex::new(Half::new(dup(&stream)?)),
            control: dup(&stream)?,
            writer: Mutex::new(Half::new(stream)),
        })
    }

    fn reader(&self) -> MutexGuard<'_, Half> {
        lock(&self.reader)
    }

    fn writer(&self) -> MutexGuard<'_, Half> {
        lock(&self.writer)
    }
}

/// Every connection to one peer; a message shorter than
/// `striped::STRIPED_MIN_BYTES` uses the first.
struct Peer {
    lanes: Vec<Connection>,
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
    /// Connections per peer.
    lanes: usize,
    /// The threads that move the stripes of large messages.
    helpers: HelperThreads,
    /// Set by [`Transport::abort`] before it shuts the connections down:
    /// a transfer that fails after it failed here, not at the peer.
    aborted: AtomicBool,
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
    /// `err`, a connection to a peer that ended or broke, as
    /// [`Error::LinkShutDownHere`] when this side shut it down: this
    /// transport was aborted, or one of its sockets is shut down on this
    /// side (see [`io::shut_down_here`]; something in this process shut
    /// them, as a fault may shut every socket of a process). The failing
    /// socket alone may not tell: once the peer sends to a socket that no
    /// longer reads, the connection is reset, as when the peer died. Other
    /// errors are returned as they are.
    fn whose(&self, err: Error) -> Error {
        let (Error::PeerClosed { peer, during, .. } | Error::PeerIo { peer, during, .. }) = &err
        else {
            return err;
        };
        let here = self.aborted.load(Ordering::Acquire)
            || self
                .peers
                .iter()
                .flatten()
                .flat_map(|p| &p.lanes)
                .any(|lane| io::shut_down_here(&lane.control));
        if !here {
            return err;
        }
        Error::LinkShutDownHere {
            peer: *peer,
            during: during.clone(),
        }
    }

    /// Whether bytes from `peer` wait on the first connection, without
    /// blocking or consuming them; [`Error::PeerClosed`] (saying it was
    /// found `during` something) when the peer closed that connection or
    /// it broke.
    fn peek(&self, peer: usize, during: &str) -> Result<bool> {
        let p = self.peer(peer, "peek")?;
        #[cfg(unix)]
        {
            use std::os::fd::AsRawFd;
            let fd = p.lanes[0].control.as_raw_fd();
            let mut byte = 0u8;
            // SAFETY: a one-byte peek into a local; MSG_PEEK consumes
            // nothing and MSG_DONTWAIT never blocks.
            let n = unsafe {
                libc::recv(
                    fd,
                    (&mut byte as *mut u8).cast(),
                    1,
                    libc::MSG_PEEK | libc::MSG_DONTWAIT,
                )
            };
            let closed = match n {
                0 => "it closed its TCP connection".to_string(),
                n if n > 0 => return Ok(true),
                _ => {
                    let e = std::io::Error::last_os_error();
                    match e.kind() {
                        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::Interrupted => {
                            return Ok(false)
                        }
                        kind => format!("its TCP connection broke ({kind})"),
                    }
                }
            };
            Err(self.whose(Error::PeerClosed {
                peer,
                during: during.into(),
                reason: closed,
            }))
        }
        #[cfg(not(unix))]
        {
            // Cannot tell without blocking: a receive may as well wait.
            let _ = p;
            Ok(true)
        }
    }

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
        let bind_all = match options.bind_all {
            Some(all) => all,
            None => crate::listen_address::bind_all_from_env()?,
        };
        let lanes = agree_on_lanes(store, key_prefix, rank, world_size, options)?;
        let mut peers: Vec<Option<Peer>> = (0..world_size)
            .map(|p| (p != rank).then(|| Peer { lanes: Vec::new() }))
            .collect();
        for lane in 0..lanes {
            // Lane 0 meets under the group's own prefix, as before lanes.
            let prefix = match lane {
                0 => key_prefix.to_string(),
                n => format!("{key_prefix}/lane{n}"),
            };
            let mesh = setup::MeshOptions {
                advertise_host: &options.advertise_host,
                bind_all,
                token: options.token.as_ref(),
                timeout: options.timeout,
            };
            let streams = setup::build_mesh(store, &prefix, rank, world_size, &mesh)?;
            for (p, stream) in streams.into_iter().enumerate() {
                if let (Some(stream), Some(peer)) = (stream, peers[p].as_mut()) {
                    peer.lanes.push(Connection::new(p, stream)?);
                }
            }
        }
        Ok(TcpTransport {
            rank,
            world_size,
            peers,
            lanes,
            helpers: HelperThreads::new(&format!("tcp-rank{rank}")),
            aborted: AtomicBool::new(false),
        })
    }

    /// Connections per peer (see [`TcpTransportOptions::lanes`]).
    pub fn lanes(&self) -> usize {
        self.lanes
    }

    fn peer(&self, peer: usize, op: &str) -> Result<&Peer> {
        check_peer(self.rank, self.world_size, peer, op)?;
        self.peers
            .get(peer)
            .and_then(Option::as_ref)
            .ok_or_else(|| Error::InvalidArgument(format!("{op}: no connection to rank {peer}")))
    }
}

/// The group's connections per pair: rank 0 decides (from `options`, the
/// environment or the host) and publishes its choice under
/// `{key_prefix}/lanes`; the others read it, so hosts with different core
/// counts still agree.
fn agree_on_lanes(
    store: &dyn Store,
    key_prefix: &str,
    rank: usize,
    world_size: usize,
    options: &TcpTransportOptions,
) -> Result<usize> {
    const VAR: &str = "TENSORCOMM_TCP_LANES";
    let key = format!("{key_prefix}/lanes");
    let check = |n: usize, what: &str, found: String| {
        if (1..=MAX_TCP_LANES).contains(&n) {
            Ok(n)
        } else {
            Err(Error::BadValue {
                name: what.to_string(),
                expected: format!("a number of connections per peer from 1 to {MAX_TCP_LANES}"),
                found,
            })
        }
    };
    // A bad explicit count fails on every rank that has it, at once,
    // rather than leaving the others to wait for rank 0's choice.
    if let Some(n) = options.lanes {
        check(n, "TcpTransportOptions::lanes", n.to_string())?;
    }
    if rank == 0 {
        let lanes = match options.lanes {
            Some(n) => n,
            None => crate::tuning::env_count(VAR, 1..=MAX_TCP_LANES)
                .unwrap_or_else(|| auto_tcp_lanes(world_size, host_cores())),
        };
        store.set(&key, lanes.to_string().as_bytes())?;
        Ok(lanes)
    } else {
        let raw = store.get_timeout(&key, options.timeout)?;
        let text = String::from_utf8_lossy(&raw).into_owned();
        let n = text.parse::<usize>().unwrap_or(0);
        check(n, &key, text)
    }
}

fn lock(half: &Mutex<Half>) -> MutexGuard<'_, Half> {
    // A panic mid-transfer leaves the stream's position unknown either way;
    // the next transfer's checks (lengths, fingerprints) catch it.
    half.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Moves `data` out on `out` and `buf.len()` bytes in on `inp` at once,
/// over one connection each way: first both together on this thread
/// without blocking, while data keeps moving (the common case: both peers
/// are in the same step); if that stalls, the rest blocking, the send on
/// a helper thread while this one reads, so two ranks sending to each
/// other always progress. The non-blocking part switches both sockets
/// (shared by their reading and writing handles) to non-blocking mode for
/// its duration, so nothing else may use these connections meanwhile: the
/// algorithms of a group use the transport from one thread at a time.
#[allow(clippy::too_many_arguments)]
fn exchange(
    helpers: &HelperThreads,
    world_size: usize,
    out: &Connection,
    data: &[u8],
    send_cx: &Context<'_>,
    inp: &Connection,
    buf: &mut [u8],
    recv_cx: &Context<'_>,
) -> Result<()> {
    if data.is_empty() {
        return read_exact(&mut inp.reader(), buf, recv_cx);
    }
    if buf.is_empty() {
        return write_all(&mut out.writer(), data, send_cx);
    }
    let mut writer = out.writer();
    let mut reader = inp.reader();
    let (sent, received) = exchange_without_blocking(
        &mut writer,
        data,
        send_cx,
        &mut reader,
        buf,
        recv_cx,
        exchange_patience(world_size),
    )?;
    let buf = &mut buf[received..];
    if sent == data.len() {
        return read_exact(&mut reader, buf, recv_cx);
    }
    let rest = &data[sent..];
    let writer = Mutex::new(&mut *writer);
    let reader = Mutex::new((&mut *reader, buf));
    let lane = |i: usize| -> Result<()> {
        if i == 0 {
            let mut guard = reader.lock().unwrap_or_else(PoisonError::into_inner);
            let (reader, buf) = &mut *guard;
            read_exact(reader, buf, recv_cx)
        } else {
            let mut writer = writer.lock().unwrap_or_else(PoisonError::into_inner);
            write_all(&mut writer, rest, send_cx)
        }
    };
    let outcomes = match helpers.try_run(2, lane) {
        Some(outcomes) => outcomes,
        // The helpers are moving another call's stripes: a thread of our own.
        None => std::thread::scope(|s| {
            let sender = s.spawn(|| lane(1));
            let received = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| lane(0)));
            vec![received, sender.join()]
        }),
    };
    first_error(outcomes, "send_recv")
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
        match stripe_count(data.len(), self.lanes) {
            1 => write_all(&mut peer.lanes[0].writer(), data, &cx),
            n => striped::send(&self.helpers, &peer.lanes, data, n, &cx),
        }
        .map_err(|e| self.whose(e))
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
        match stripe_count(buf.len(), self.lanes) {
            1 => read_exact(&mut peer.lanes[0].reader(), buf, &cx),
            n => striped::recv(&self.helpers, &peer.lanes, buf, n, &cx),
        }
        .map_err(|e| self.whose(e))
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
        let send_count = stripe_count(data.len(), self.lanes);
        let recv_count = stripe_count(buf.len(), self.lanes);
        let world = self.world_size;
        if send_count == 1 && recv_count == 1 {
            let (o, i) = (&out.lanes[0], &inp.lanes[0]);
            return exchange(&self.helpers, world, o, data, &send_cx, i, buf, &recv_cx)
                .map_err(|e| self.whose(e));
        }
        striped::send_recv(
            &self.helpers,
            &out.lanes,
            data,
            send_count,
            &send_cx,
            &inp.lanes,
            buf,
            recv_count,
            &recv_cx,
            |i, data, buf, scx, rcx| {
                // Helpers busy: stripe `i` each way, pairwise; the helpers
                // may be free again for the blocking part.
                let (o, n) = (&out.lanes[i], &inp.lanes[i]);
                exchange(&self.helpers, world, o, data, scx, n, buf, rcx)
            },
        )
        .map_err(|e| self.whose(e))
    }

    /// Peeks at the first connection without blocking: end of stream or a
    /// reset means the peer closed it (or died); pending data or nothing
    /// to read means it is there.
    fn check_alive(&self, peer: usize) -> Result<()> {
        self.peek(peer, "checking that it is alive").map(|_| ())
    }

    /// Peeks at the first connection, where every message starts (a
    /// striped one with its first stripe): pending bytes mean a message
    /// is there.
    fn has_data(&self, from: usize) -> Result<bool> {
        self.peek(from, "waiting for a message from it")
    }

    fn abort(&self) {
        self.aborted.store(true, Ordering::Release);
        for peer in self.peers.iter().flatten() {
            for lane in &peer.lanes {
                // Already closed by the peer is fine: it is closed either way.
                let _ = lane.control.shutdown(std::net::Shutdown::Both);
            }
        }
    }
}
