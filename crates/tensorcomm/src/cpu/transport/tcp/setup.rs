//! Building the full mesh: every rank listens on an ephemeral port of the
//! address it advertises (every interface only with `bind_all`),
//! publishes `host:port` in the store, connects to every lower rank and
//! accepts every higher one.
//!
//! Each new connection starts with a hello naming the mesh, the world
//! size and the rank, and proving the job's token (`TENSORCOMM_STORE_TOKEN`)
//! with a tag derived from it ([`crate::job_token`]); the accepting rank
//! checks it before it answers. A connection that does not prove itself
//! part of this job (not a hello, another protocol version, another mesh,
//! a missing or wrong token) is refused, told why where it speaks the
//! protocol, and set-up goes on waiting for the real peers; if they do not
//! come, the timeout names the refused connections. A connection that did
//! prove itself but disagrees (world size, a rank not awaited) fails
//! set-up at once, as before.
//!
//! The accepting rank reads the hellos of its accepted connections
//! concurrently, each on a thread of its own (`pending_hellos.rs`), and
//! answers them one at a time as they arrive: a stray that connects and
//! sends nothing (or trickles garbage) is dropped after its own
//! [`HELLO_WAIT`] without delaying the real peers behind it, as long as
//! fewer than [`MAX_PENDING_HELLOS`] are pending; past that, a real peer
//! in the backlog waits about [`STALE_AFTER`] for every
//! [`MAX_PENDING_HELLOS`] strays ahead of it.

use std::io::ErrorKind;
use std::net::{SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

use super::io::{read_exact, write_all, Context, Half};
use super::pending_hellos::{Finished, Outcome, PendingHellos, MAX_PENDING_HELLOS, STALE_AFTER};
use crate::job_token::{tag, tags_equal, JobToken};
use crate::store::Store;
use crate::{Error, Result};

const MAGIC: &[u8; 4] = b"TCMH";
const VERSION: u32 = 2;
/// Magic and version: read first, so garbage and other versions are told
/// apart before anything else is read.
const HEAD_LEN: usize = 8;
pub(crate) const HELLO_LEN: usize = 64;
/// How long an accepted connection has to send its hello (a real peer
/// sends it at once).
const HELLO_WAIT: Duration = Duration::from_secs(10);
/// How many refused connections a set-up timeout lists.
const REFUSALS_KEPT: usize = 4;

/// Which end of a connection a hello comes from (part of its tag).
#[derive(Clone, Copy)]
enum Role {
    Connecting = 0,
    Accepting = 1,
}

/// Why an accepting rank refused a hello, as sent back in its answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Refusal {
    OtherMesh = 1,
    WorldSize = 2,
    TokenMissing = 3,
    TokenWrong = 4,
    TokenUnexpected = 5,
    RankNotAwaited = 6,
}

impl Refusal {
    fn from_code(code: u32) -> Option<Refusal> {
        [
            Refusal::OtherMesh,
            Refusal::WorldSize,
            Refusal::TokenMissing,
            Refusal::TokenWrong,
            Refusal::TokenUnexpected,
            Refusal::RankNotAwaited,
        ]
        .into_iter()
        .find(|r| *r as u32 == code)
    }

    /// Why, as the end `speaker` of the connection words it: the
    /// connecting rank (told by the answer) or the accepting one (its log).
    fn describe(self, speaker: Role) -> String {
        let token = crate::env_vars::STORE_TOKEN.name;
        // The accepting rank, the connection, the connecting rank, and
        // the other end, as `speaker` names them.
        let (acceptor, connection, connector, other) = match speaker {
            Role::Connecting => ("it", "this connection", "this rank", "it"),
            Role::Accepting => ("this rank", "the connection", "that rank", "the connection"),
        };
        match self {
            Refusal::OtherMesh => format!("{other} belongs to another mesh (another job or group)"),
            Refusal::WorldSize => format!("{other} has another world size"),
            Refusal::TokenMissing => format!(
                "{acceptor} expects the job's token and {connection} presented none (set {token} on every rank)"
            ),
            Refusal::TokenWrong => format!(
                "{acceptor} expects the job's token and {connection} presented a different one ({token} differs)"
            ),
            Refusal::TokenUnexpected => format!(
                "{acceptor} has no token and {connection} presented one ({token} is set on one side only)"
            ),
            Refusal::RankNotAwaited => {
                format!("{acceptor} does not await a connection from {connector}")
            }
        }
    }
}

/// This rank's side of every hello.
struct Me<'a> {
    mesh: u64,
    world_size: u32,
    rank: u32,
    token: Option<&'a JobToken>,
}

/// A hello as read from a peer.
struct Hello {
    mesh: u64,
    world_size: u32,
    rank: u32,
    verdict: u32,
    has_token: bool,
    tag: [u8; 32],
}

fn tag_context(mesh: u64, world_size: u32, rank: u32, role: Role) -> [u8; 17] {
    let mut out = [0u8; 17];
    out[0..8].copy_from_slice(&mesh.to_le_bytes());
    out[8..12].copy_from_slice(&world_size.to_le_bytes());
    out[12..16].copy_from_slice(&rank.to_le_bytes());
    out[16] = role as u8;
    out
}

impl Me<'_> {
    /// `magic | version | mesh u64 | world u32 | rank u32 | verdict u32 |
    /// has_token u32 | tag [32]`, little-endian; `verdict` is 0 in a
    /// hello and an accepted answer, a [`Refusal`] code in a refusal.
    fn encode(&self, role: Role, refusal: Option<Refusal>) -> [u8; HELLO_LEN] {
        let mut out = [0u8; HELLO_LEN];
        out[0..4].copy_from_slice(MAGIC);
        out[4..8].copy_from_slice(&VERSION.to_le_bytes());
        out[8..16].copy_from_slice(&self.mesh.to_le_bytes());
        out[16..20].copy_from_slice(&self.world_size.to_le_bytes());
        out[20..24].copy_from_slice(&self.rank.to_le_bytes());
        out[24..28].copy_from_slice(&refusal.map_or(0, |r| r as u32).to_le_bytes());
        out[28..32].copy_from_slice(&u32::from(self.token.is_some()).to_le_bytes());
        if refusal.is_none() {
            let context = tag_context(self.mesh, self.world_size, self.rank, role);
            out[32..64].copy_from_slice(&tag(self.token, &context));
        }
        out
    }

    /// Whether `theirs`, sent from `role`, belongs to this rank's job:
    /// the same mesh and the same token (or none on both sides).
    fn authenticate(&self, theirs: &Hello, role: Role) -> std::result::Result<(), Refusal> {
        if theirs.mesh != self.mesh {
            return Err(Refusal::OtherMesh);
        }
        let context = tag_context(theirs.mesh, theirs.world_size, theirs.rank, role);
        if tags_equal(&theirs.tag, &tag(self.token, &context)) {
            return Ok(());
        }
        Err(match (self.token.is_some(), theirs.has_token) {
            (true, false) => Refusal::TokenMissing,
            (false, true) => Refusal::TokenUnexpected,
            _ => Refusal::TokenWrong,
        })
    }
}

/// Checks the magic and version of a hello's first [`HEAD_LEN`] bytes;
/// `Err((expected, found))` otherwise.
fn check_head(head: &[u8; HEAD_LEN]) -> std::result::Result<(), (String, String)> {
    if &head[0..4] != MAGIC {
        return Err((
            format!("a tensorcomm transport hello starting with {MAGIC:?}"),
            format!("{:?}", &head[0..4]),
        ));
    }
    let version = u32::from_le_bytes([head[4], head[5], head[6], head[7]]);
    if version != VERSION {
        return Err((
            format!("transport protocol version {VERSION}"),
            version.to_string(),
        ));
    }
    Ok(())
}

/// The fields after the head (bytes [`HEAD_LEN`]..[`HELLO_LEN`]).
fn parse_rest(rest: &[u8; HELLO_LEN - HEAD_LEN]) -> Hello {
    let at = |i: usize| i - HEAD_LEN;
    let u32_at = |i: usize| {
        let i = at(i);
        u32::from_le_bytes([rest[i], rest[i + 1], rest[i + 2], rest[i + 3]])
    };
    let mut mesh = [0u8; 8];
    mesh.copy_from_slice(&rest[at(8)..at(16)]);
    let mut tag = [0u8; 32];
    tag.copy_from_slice(&rest[at(32)..at(64)]);
    Hello {
        mesh: u64::from_le_bytes(mesh),
        world_size: u32_at(16),
        rank: u32_at(20),
        verdict: u32_at(24),
        has_token: u32_at(28) != 0,
        tag,
    }
}

/// Reads a whole hello; a wrong head is [`Error::PeerProtocol`].
fn read_hello(half: &mut Half, cx: &Context<'_>) -> Result<Hello> {
    let mut head = [0u8; HEAD_LEN];
    read_exact(half, &mut head, &cx.part(cx.what, HEAD_LEN))?;
    check_head(&head).map_err(|(expected, found)| Error::PeerProtocol {
        peer: cx.peer,
        expected,
        found,
    })?;
    let mut rest = [0u8; HELLO_LEN - HEAD_LEN];
    read_exact(half, &mut rest, &cx.part(cx.what, HELLO_LEN - HEAD_LEN))?;
    Ok(parse_rest(&rest))
}

/// The fuzz target's view of a hello (`fuzz_targets::transport_frames`):
/// `bytes` as a connecting rank's hello to rank 0 of a 4-rank mesh whose
/// id is `mesh` and whose token is `token`; `Some(claimed rank)` when it
/// passes the head check and authentication.
pub(crate) fn accepted_hello(
    bytes: &[u8; HELLO_LEN],
    mesh: u64,
    token: Option<&JobToken>,
) -> Option<u32> {
    let mut head = [0u8; HEAD_LEN];
    head.copy_from_slice(&bytes[..HEAD_LEN]);
    check_head(&head).ok()?;
    let mut rest = [0u8; HELLO_LEN - HEAD_LEN];
    rest.copy_from_slice(&bytes[HEAD_LEN..]);
    let hello = parse_rest(&rest);
    let me = Me {
        mesh,
        world_size: 4,
        rank: 0,
        token,
    };
    me.authenticate(&hello, Role::Connecting).ok()?;
    Some(hello.rank)
}

/// A connecting rank's hello, as [`accepted_hello`] reads it.
pub(crate) fn connecting_hello(
    mesh: u64,
    world_size: u32,
    rank: u32,
    token: Option<&JobToken>,
) -> [u8; HELLO_LEN] {
    Me {
        mesh,
        world_size,
        rank,
        token,
    }
    .encode(Role::Connecting, None)
}

/// FNV-1a of the key prefix: connections of different meshes never mix.
fn mesh_id(key_prefix: &str) -> u64 {
    key_prefix.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// How one mesh is set up.
pub(super) struct MeshOptions<'a> {
    /// The address other ranks reach this one at.
    pub(super) advertise_host: &'a str,
    /// Listen on every interface instead of `advertise_host` only.
    pub(super) bind_all: bool,
    /// The job's token, which every connection proves.
    pub(super) token: Option<&'a JobToken>,
    /// How long set-up waits for the other ranks.
    pub(super) timeout: Duration,
}

/// Connects this rank to every other rank; entry `p` of the result is the
/// stream to rank `p` (`None` for this rank).
pub(super) fn build_mesh(
    store: &dyn Store,
    key_prefix: &str,
    rank: usize,
    world_size: usize,
    options: &MeshOptions<'_>,
) -> Result<Vec<Option<TcpStream>>> {
    let started = Instant::now();
    let deadline = started + options.timeout;
    let me = Me {
        mesh: mesh_id(key_prefix),
        world_size: world_size as u32,
        rank: rank as u32,
        token: options.token,
    };
    let mut streams: Vec<Option<TcpStream>> = (0..world_size).map(|_| None).collect();
    if world_size == 1 {
        return Ok(streams);
    }
    let advertise_host = options.advertise_host;
    let bind_host = crate::listen_address::listen_host(advertise_host, options.bind_all);
    let bind_addr = join(bind_host, 0);
    let listener = TcpListener::bind(&bind_addr).map_err(|e| {
        let what = format!("rank {rank}'s transport");
        let told = format!("the advertised address {advertise_host}");
        match e.kind() {
            ErrorKind::AddrNotAvailable => {
                crate::listen_address::not_here(&what, &bind_addr, &told)
            }
            _ => Error::io(format!("binding a transport listener on {bind_host}"), e),
        }
    })?;
    let port = listener
        .local_addr()
        .map_err(|e| Error::io("reading the transport listener's port", e))?
        .port();
    let addr = join(advertise_host, port);
    store.set(&format!("{key_prefix}/addr/{rank}"), addr.as_bytes())?;
    tracing::debug!(rank, %addr, bind = %bind_host, "transport listening");

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

fn nodelay(stream: &TcpStream, peer: usize) -> Result<()> {
    stream
        .set_nodelay(true)
        .map_err(|e| Error::io(format!("turning off Nagle for rank {peer}"), e))
}

/// The connecting side's hello: send ours, read the answer, and check
/// that it comes from rank `peer` of this job and accepted us.
fn hello_as_connector(
    stream: TcpStream,
    me: &Me<'_>,
    peer: usize,
    addr: &str,
    started: Instant,
    deadline: Instant,
) -> Result<TcpStream> {
    nodelay(&stream, peer)?;
    let mut half = Half::new(stream);
    let cx = Context {
        peer,
        what: "exchanging transport hellos",
        len: HELLO_LEN,
        started,
        deadline,
    };
    write_all(&mut half, &me.encode(Role::Connecting, None), &cx)?;
    let theirs = read_hello(&mut half, &cx)?;
    if theirs.verdict != 0 {
        let reason = Refusal::from_code(theirs.verdict).map_or_else(
            || format!("refusal code {}", theirs.verdict),
            |r| r.describe(Role::Connecting),
        );
        return Err(Error::PeerRefused {
            peer,
            addr: addr.to_string(),
            reason,
        });
    }
    let bad = |expected: String, found: String| Error::PeerProtocol {
        peer,
        expected,
        found,
    };
    if let Err(refusal) = me.authenticate(&theirs, Role::Accepting) {
        return Err(bad(
            format!("an answer from rank {peer} of this job at {addr}"),
            format!(
                "one that fails the check: {}",
                refusal.describe(Role::Connecting)
            ),
        ));
    }
    if theirs.world_size != me.world_size {
        return Err(bad(
            format!("world size {}", me.world_size),
            theirs.world_size.to_string(),
        ));
    }
    if theirs.rank as usize != peer {
        return Err(bad(
            format!("rank {peer} listening at {addr}"),
            format!("rank {}", theirs.rank),
        ));
    }
    Ok(half.stream)
}

fn connect_to(
    store: &dyn Store,
    key_prefix: &str,
    peer: usize,
    me: &Me<'_>,
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
                let stream = hello_as_connector(stream, me, peer, &addr, started, deadline)?;
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

/// What became of one accepted connection.
enum Accepted {
    /// Rank `.1` of this job, connected.
    Peer(TcpStream, usize),
    /// Not proven part of this job: closed; set-up goes on.
    Refused(String),
}

/// The ranks above this one that are not connected yet.
fn missing(rank: usize, streams: &[Option<TcpStream>]) -> Vec<usize> {
    (rank + 1..streams.len())
        .filter(|&p| streams[p].is_none())
        .collect()
}

/// The connections rank `rank` refused so far, for the log and the set-up
/// timeout's message.
struct Refusals {
    rank: usize,
    count: usize,
    /// The first [`REFUSALS_KEPT`] reasons.
    kept: Vec<String>,
}

impl Refusals {
    fn new(rank: usize) -> Self {
        Refusals {
            rank,
            count: 0,
            kept: Vec::new(),
        }
    }

    fn note(&mut self, why: String) {
        tracing::warn!(
            rank = self.rank,
            "transport refused a connection from {why}"
        );
        self.count += 1;
        if self.kept.len() < REFUSALS_KEPT {
            self.kept.push(why);
        }
    }
}

/// Starts reading the hello of a connection accepted from `from` on a
/// thread of its own ([`PendingHellos`]); it has [`HELLO_WAIT`]. Its wait
/// is not cut to set-up's deadline: the end of set-up closes it anyway,
/// and a silent connection is so still pending at the deadline, and named
/// in the timeout as one. Errors of the read are charged to `first`, the
/// lowest rank still awaited, until a hello names one. A connection that
/// cannot be read (this process is out of descriptors or threads, as a
/// flood of strays may leave it) is refused and closed: set-up goes on
/// (a real peer refused so sees its connection closed and fails its own).
fn start_reading(
    pending: &mut PendingHellos<Hello>,
    refusals: &mut Refusals,
    (stream, from): (TcpStream, SocketAddr),
    first: usize,
) {
    // A connection reset before it is set up is a stray's, not an error.
    if let Err(e) = stream
        .set_nonblocking(false)
        .and_then(|()| stream.set_nodelay(true))
    {
        refusals.note(format!("{from}: closed at once ({e})"));
        return;
    }
    let started = Instant::now();
    let deadline = started + HELLO_WAIT;
    let read = pending.start(stream, from, move |half| {
        let cx = Context {
            peer: first,
            what: "reading a transport hello",
            len: HELLO_LEN,
            started,
            deadline,
        };
        read_hello(half, &cx)
    });
    if let Err(e) = read {
        refusals.note(format!("{from}: closed unread ({e})"));
    }
}

/// The accepting side's answer to a hello read from `from`: given only
/// once it proved itself part of this job. `waiting` are the ranks still
/// awaited.
fn hello_as_acceptor(
    mut half: Half,
    from: SocketAddr,
    theirs: &Hello,
    me: &Me<'_>,
    waiting: &[usize],
    started: Instant,
    deadline: Instant,
) -> Result<Accepted> {
    let their_rank = theirs.rank as usize;
    let cx = Context {
        peer: their_rank,
        what: "answering a transport hello",
        len: HELLO_LEN,
        started,
        deadline: deadline.min(Instant::now() + HELLO_WAIT),
    };
    let answer = |half: &mut Half, refusal: Option<Refusal>| {
        write_all(half, &me.encode(Role::Accepting, refusal), &cx)
    };
    if let Err(refusal) = me.authenticate(theirs, Role::Connecting) {
        // Best effort: it learns why; it is closed either way.
        let _ = answer(&mut half, Some(refusal));
        return Ok(Accepted::Refused(format!(
            "{from} (claiming rank {their_rank}): {}",
            refusal.describe(Role::Accepting)
        )));
    }
    if theirs.world_size != me.world_size {
        let _ = answer(&mut half, Some(Refusal::WorldSize));
        return Err(Error::PeerProtocol {
            peer: their_rank,
            expected: format!("world size {}", me.world_size),
            found: format!("{} from {from}", theirs.world_size),
        });
    }
    if !waiting.contains(&their_rank) {
        let _ = answer(&mut half, Some(Refusal::RankNotAwaited));
        return Err(Error::PeerProtocol {
            peer: their_rank,
            expected: format!("a hello from one of ranks {waiting:?}"),
            found: format!("rank {their_rank} from {from}"),
        });
    }
    answer(&mut half, None)?;
    Ok(Accepted::Peer(half.stream, their_rank))
}

/// Admits or refuses one connection whose hello read ended.
fn settle(
    done: Finished<Hello>,
    me: &Me<'_>,
    streams: &mut [Option<TcpStream>],
    refusals: &mut Refusals,
    started: Instant,
    deadline: Instant,
) -> Result<()> {
    let rank = me.rank as usize;
    let from = done.from;
    let (half, theirs) = match done.outcome {
        Outcome::Read(half, theirs) => (half, theirs),
        Outcome::Failed(e) => {
            refusals.note(format!("{from}: no valid hello ({e})"));
            return Ok(());
        }
        Outcome::CutShort => {
            refusals.note(format!(
                "{from}: no hello within {STALE_AFTER:?} while {MAX_PENDING_HELLOS} \
                 connections awaited theirs (closed to make room)"
            ));
            return Ok(());
        }
    };
    let waiting = missing(rank, streams);
    match hello_as_acceptor(half, from, &theirs, me, &waiting, started, deadline)? {
        Accepted::Peer(stream, their_rank) => {
            tracing::debug!(rank, peer = their_rank, %from, "transport accepted");
            streams[their_rank] = Some(stream);
        }
        Accepted::Refused(why) => refusals.note(why),
    }
    Ok(())
}

/// Accepts the connections of the ranks above this one. Hellos are read
/// concurrently ([`PendingHellos`]), so a stray that sends nothing holds up
/// no one but itself (below the cap, see the module docs); answers are
/// given here, one at a time, so that the ranks still awaited are known.
fn accept_higher(
    listener: &TcpListener,
    me: &Me<'_>,
    streams: &mut [Option<TcpStream>],
    started: Instant,
    deadline: Instant,
) -> Result<()> {
    let rank = me.rank as usize;
    listener
        .set_nonblocking(true)
        .map_err(|e| Error::io("making the transport listener non-blocking", e))?;
    let mut refusals = Refusals::new(rank);
    // Dropped on return: the hellos still pending are cut short.
    let mut pending = PendingHellos::new(MAX_PENDING_HELLOS);
    let mut backoff = Duration::from_micros(50);
    loop {
        let waiting = missing(rank, streams);
        let Some(&first) = waiting.first() else {
            return Ok(());
        };
        // Checked on every pass, so that connections arriving without end
        // (strays, each refused) cannot keep set-up past its deadline.
        if Instant::now() >= deadline {
            // The reads that ended are settled first, so that their
            // refusals are named (a real peer's hello read only now cannot
            // be answered in time: that timeout is the error); the
            // connections left sent no hello.
            while let Some(done) = pending.next(Duration::ZERO) {
                settle(done, me, streams, &mut refusals, started, deadline)?;
            }
            let mut during = format!("waiting for ranks {waiting:?} to connect to rank {rank}");
            let mut strays = Vec::new();
            if refusals.count > 0 {
                strays.push(format!(
                    "refused {} connection(s) not proven part of this job: {}",
                    refusals.count,
                    refusals.kept.join("; ")
                ));
            }
            let silent = pending.without_hello();
            if silent > 0 {
                strays.push(format!("{silent} connection(s) still sending no hello"));
            }
            if !strays.is_empty() {
                during.push_str(&format!(" ({})", strays.join("; and ")));
            }
            return Err(Error::PeerTimeout {
                peer: first,
                during,
                timeout: deadline.saturating_duration_since(started),
            });
        }
        crate::cpu::setup_watch::check(|| {
            format!("ranks {waiting:?} to connect to rank {rank}'s transport")
        })?;
        if let Some(done) = pending.next(Duration::ZERO) {
            settle(done, me, streams, &mut refusals, started, deadline)?;
            continue;
        }
        if pending.is_full() {
            // No room: newcomers wait in the backlog until a read ends.
            pending.cut_stale(STALE_AFTER);
        } else {
            match listener.accept() {
                Ok(accepted) => {
                    backoff = Duration::from_micros(50);
                    start_reading(&mut pending, &mut refusals, accepted, first);
                    continue;
                }
                // A connection that went away while queued is a stray's.
                Err(e) if e.kind() == ErrorKind::ConnectionAborted => continue,
                Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::Interrupted) => {}
                Err(e) => return Err(Error::io("accepting a transport connection", e)),
            }
        }
        // Nothing to accept, or no room: wait for a hello read to end.
        // Set-up only: a listener has no accept-with-timeout in std.
        if let Some(done) = pending.next(backoff) {
            settle(done, me, streams, &mut refusals, started, deadline)?;
        } else {
            backoff = (backoff * 2).min(Duration::from_millis(5));
        }
    }
}
