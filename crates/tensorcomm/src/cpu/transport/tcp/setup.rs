//! Building the full mesh: every rank listens on an ephemeral port,
//! publishes `host:port` in the store, connects to every lower rank and
//! accepts every higher one. Each new connection starts with a hello in
//! both directions naming the rank, so a stray or stale connection is
//! refused with a typed error instead of joining the mesh.

use std::io::ErrorKind;
use std::net::{TcpListener, TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

use super::io::{read_exact, write_all, Context, Half};
use crate::store::Store;
use crate::{Error, Result};

pub(crate) const MAGIC: &[u8; 4] = b"TCMH";
pub(crate) const VERSION: u32 = 1;
pub(crate) const HELLO_LEN: usize = 24;

/// Who is on the other end of a connection, as the hello says.
pub(crate) struct Hello {
    pub(crate) mesh: u64,
    pub(crate) world_size: u32,
    pub(crate) rank: u32,
}

impl Hello {
    pub(crate) fn encode(&self) -> [u8; HELLO_LEN] {
        let mut out = [0u8; HELLO_LEN];
        out[0..4].copy_from_slice(MAGIC);
        out[4..8].copy_from_slice(&VERSION.to_le_bytes());
        out[8..16].copy_from_slice(&self.mesh.to_le_bytes());
        out[16..20].copy_from_slice(&self.world_size.to_le_bytes());
        out[20..24].copy_from_slice(&self.rank.to_le_bytes());
        out
    }

    /// Parses and checks a hello against what this rank expects; `peer` is
    /// the rank named in errors (the expected one, when known).
    pub(crate) fn decode(bytes: &[u8; HELLO_LEN], expected: &Hello, peer: usize) -> Result<usize> {
        let u32_at =
            |i: usize| u32::from_le_bytes([bytes[i], bytes[i + 1], bytes[i + 2], bytes[i + 3]]);
        let bad = |expected: String, found: String| Error::PeerProtocol {
            peer,
            expected,
            found,
        };
        if &bytes[0..4] != MAGIC {
            return Err(bad(
                format!("a tensorcomm transport hello starting with {MAGIC:?}"),
                format!("{:?}", &bytes[0..4]),
            ));
        }
        if u32_at(4) != VERSION {
            return Err(bad(
                format!("protocol version {VERSION}"),
                u32_at(4).to_string(),
            ));
        }
        let mut mesh = [0u8; 8];
        mesh.copy_from_slice(&bytes[8..16]);
        let mesh = u64::from_le_bytes(mesh);
        if mesh != expected.mesh {
            return Err(bad(
                format!("mesh id {:#x} (same store key prefix)", expected.mesh),
                format!("{mesh:#x}"),
            ));
        }
        if u32_at(16) != expected.world_size {
            return Err(bad(
                format!("world size {}", expected.world_size),
                u32_at(16).to_string(),
            ));
        }
        Ok(u32_at(20) as usize)
    }
}

/// FNV-1a of the key prefix: connections of different meshes never mix.
fn mesh_id(key_prefix: &str) -> u64 {
    key_prefix.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// Connects this rank to every other rank; entry `p` of the result is the
/// stream to rank `p` (`None` for this rank).
pub(super) fn build_mesh(
    store: &dyn Store,
    key_prefix: &str,
    rank: usize,
    world_size: usize,
    advertise_host: &str,
    timeout: Duration,
) -> Result<Vec<Option<TcpStream>>> {
    let started = Instant::now();
    let deadline = started + timeout;
    let me = Hello {
        mesh: mesh_id(key_prefix),
        world_size: world_size as u32,
        rank: rank as u32,
    };
    let mut streams: Vec<Option<TcpStream>> = (0..world_size).map(|_| None).collect();
    if world_size == 1 {
        return Ok(streams);
    }
    let loopback = advertise_host == "localhost"
        || advertise_host.starts_with("127.")
        || advertise_host == "::1";
    let bind_host = match (loopback, advertise_host.contains(':')) {
        (true, _) => advertise_host,
        (false, true) => "::",
        (false, false) => "0.0.0.0",
    };
    let listener = TcpListener::bind(join(bind_host, 0))
        .map_err(|e| Error::io(format!("binding a transport listener on {bind_host}"), e))?;
    let port = listener
        .local_addr()
        .map_err(|e| Error::io("reading the transport listener's port", e))?
        .port();
    let addr = join(advertise_host, port);
    store.set(&format!("{key_prefix}/addr/{rank}"), addr.as_bytes())?;
    tracing::debug!(rank, %addr, "transport listening");

    for (peer, slot) in streams.iter_mut().enumerate().take(rank) {
        *slot = Some(connect_to(store, key_prefix, peer, &me, started, deadline)?);
    }
    accept_higher(&listener, &me, &mut streams, started, deadline)?;
    Ok(streams)
}

fn join(host: &str, port: u16) -> String {
    if host.contains(':') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    }
}

fn exchange_hello(
    stream: TcpStream,
    me: &Hello,
    peer: usize,
    started: Instant,
    deadline: Instant,
) -> Result<(TcpStream, usize)> {
    stream
        .set_nodelay(true)
        .map_err(|e| Error::io(format!("turning off Nagle for rank {peer}"), e))?;
    let mut half = Half::new(stream);
    let cx = Context {
        peer,
        what: "exchanging transport hellos",
        len: HELLO_LEN,
        started,
        deadline,
    };
    write_all(&mut half, &me.encode(), &cx)?;
    let mut theirs = [0u8; HELLO_LEN];
    read_exact(&mut half, &mut theirs, &cx)?;
    let their_rank = Hello::decode(&theirs, me, peer)?;
    Ok((half.stream, their_rank))
}

fn connect_to(
    store: &dyn Store,
    key_prefix: &str,
    peer: usize,
    me: &Hello,
    started: Instant,
    deadline: Instant,
) -> Result<TcpStream> {
    let key = format!("{key_prefix}/addr/{peer}");
    let remaining = deadline.saturating_duration_since(Instant::now());
    let raw = store.get_timeout(&key, remaining)?;
    let addr = String::from_utf8(raw).map_err(|e| Error::PeerProtocol {
        peer,
        expected: format!("a UTF-8 host:port under store key {key:?}"),
        found: format!("{:?}", e.as_bytes()),
    })?;
    let sock = addr
        .to_socket_addrs()
        .map_err(|e| {
            Error::io(
                format!("resolving rank {peer}'s transport address {addr}"),
                e,
            )
        })?
        .next()
        .ok_or_else(|| Error::PeerProtocol {
            peer,
            expected: "a resolvable host:port".into(),
            found: addr.clone(),
        })?;
    loop {
        let remaining = deadline.saturating_duration_since(Instant::now());
        if remaining.is_zero() {
            return Err(Error::PeerTimeout {
                peer,
                during: format!("connecting to its transport at {addr}"),
                timeout: deadline.saturating_duration_since(started),
            });
        }
        match TcpStream::connect_timeout(&sock, remaining) {
            Ok(stream) => {
                let (stream, their_rank) = exchange_hello(stream, me, peer, started, deadline)?;
                if their_rank != peer {
                    return Err(Error::PeerProtocol {
                        peer,
                        expected: format!("rank {peer} listening at {addr}"),
                        found: format!("rank {their_rank}"),
                    });
                }
                tracing::debug!(rank = me.rank, peer, %addr, "transport connected");
                return Ok(stream);
            }
            Err(e)
                if matches!(
                    e.kind(),
                    ErrorKind::ConnectionRefused | ErrorKind::Interrupted
                ) =>
            {
                crate::cpu::setup_watch::check(|| {
                    format!("rank {peer}'s transport at {addr} to accept connections")
                })?;
                std::thread::sleep(Duration::from_millis(2));
            }
            Err(e) if e.kind() == ErrorKind::TimedOut => {}
            Err(e) => {
                return Err(Error::PeerIo {
                    peer,
                    during: format!("connecting to its transport at {addr}"),
                    source: e,
                })
            }
        }
    }
}

fn accept_higher(
    listener: &TcpListener,
    me: &Hello,
    streams: &mut [Option<TcpStream>],
    started: Instant,
    deadline: Instant,
) -> Result<()> {
    let rank = me.rank as usize;
    let missing = |streams: &[Option<TcpStream>]| -> Vec<usize> {
        (rank + 1..streams.len())
            .filter(|&p| streams[p].is_none())
            .collect()
    };
    listener
        .set_nonblocking(true)
        .map_err(|e| Error::io("making the transport listener non-blocking", e))?;
    let mut backoff = Duration::from_micros(50);
    loop {
        let waiting = missing(streams);
        let Some(&first) = waiting.first() else {
            return Ok(());
        };
        match listener.accept() {
            Ok((stream, from)) => {
                backoff = Duration::from_micros(50);
                stream
                    .set_nonblocking(false)
                    .map_err(|e| Error::io(format!("accepting a connection from {from}"), e))?;
                // Until the hello arrives, errors are charged to the lowest
                // rank still missing.
                let (stream, their_rank) = exchange_hello(stream, me, first, started, deadline)?;
                if !waiting.contains(&their_rank) {
                    return Err(Error::PeerProtocol {
                        peer: their_rank,
                        expected: format!("a hello from one of ranks {waiting:?}"),
                        found: format!("rank {their_rank} from {from}"),
                    });
                }
                tracing::debug!(rank, peer = their_rank, %from, "transport accepted");
                streams[their_rank] = Some(stream);
            }
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::Interrupted) => {
                if Instant::now() >= deadline {
                    return Err(Error::PeerTimeout {
                        peer: first,
                        during: format!("waiting for ranks {waiting:?} to connect to rank {rank}"),
                        timeout: deadline.saturating_duration_since(started),
                    });
                }
                crate::cpu::setup_watch::check(|| {
                    format!("ranks {waiting:?} to connect to rank {rank}'s transport")
                })?;
                // Setup only: a listener has no accept-with-timeout in std.
                std::thread::sleep(backoff);
                backoff = (backoff * 2).min(Duration::from_millis(5));
            }
            Err(e) => return Err(Error::io("accepting a transport connection", e)),
        }
    }
}
