//! One client connection, seen from the server: handshake, then requests.
//!
//! Each connection is one tokio task. Anything wrong with what a client
//! sends (bad magic, wrong token, an oversize or truncated frame, bytes that
//! do not decode) ends that connection only, with a `Failed` reply or a
//! refusal where the client could still read one, and a `warn!` naming the
//! peer (at most [`warn_limit::PER_WINDOW`] per window of
//! [`warn_limit::WINDOW`], the rest at debug level). The server and its
//! other clients never notice.
//!
//! A frame's buffer grows with the bytes that arrive, never to what the
//! header announces before they do ([`next_capacity`]), and a client
//! silent in the middle of a frame for the server's idle timeout is
//! disconnected: a peer announcing 64 MiB and sending nothing costs the
//! server a socket and a few KiB, for a bounded time. A client idle
//! between requests is never timed out (ranks may compute for hours).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{
    AsyncBufRead, AsyncBufReadExt, AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, BufReader,
};
use tokio::net::TcpStream;
use tracing::{debug, warn};

use super::handshakes::HandshakeTicket;
use super::options::TOKEN_ENV;
use super::protocol::{
    encode_welcome, Request, Response, FLAG_JOIN, FRAME_HEADER, MAGIC, MAX_TOKEN_LEN, VERSION,
};
use super::server_state::ServerState;
use super::warn_limit::{self, WarnLimit};
use crate::Error;

/// How long a new connection may take to send its hello.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(30);

/// How long a connection refused for being over the cap may take to send
/// its hello before it is closed.
const REFUSAL_TIMEOUT: Duration = Duration::from_secs(5);

/// Buffers larger than this are released after the request that needed them.
const KEEP_BUFFER: usize = 1 << 20;

/// The least a frame's buffer grows by at once.
const READ_CHUNK: usize = 64 << 10;

/// What every connection of one server needs to know.
#[derive(Debug)]
pub(crate) struct ServerConfig {
    pub(crate) token: Option<String>,
    pub(crate) max_message_size: usize,
    /// How long a frame begun may go without a byte.
    pub(crate) idle_timeout: Duration,
    /// Connections open at once, at most.
    pub(crate) max_connections: usize,
    /// Where `max_connections` comes from, for the refusal's reason.
    pub(crate) max_connections_origin: String,
    /// The rate limit on per-connection warnings.
    pub(crate) warnings: WarnLimit,
}

/// Logs a per-connection warning, rate-limited (see [`WarnLimit`]).
fn warn_peer(config: &ServerConfig, peer: SocketAddr, text: std::fmt::Arguments<'_>) {
    match config.warnings.admit(std::time::Instant::now()) {
        Some(0) => warn!(%peer, "{text}"),
        Some(held) => warn!(
            %peer,
            "{text} ({held} similar store connection warnings held back in the last {:?})",
            warn_limit::WINDOW
        ),
        None => debug!(%peer, "{text}"),
    }
}

/// Serves one accepted connection until it closes or misbehaves.
pub(crate) async fn serve(
    stream: TcpStream,
    peer: SocketAddr,
    state: Arc<ServerState>,
    config: Arc<ServerConfig>,
    mut ticket: HandshakeTicket,
) {
    if let Err(e) = stream.set_nodelay(true) {
        debug!(%peer, "could not disable Nagle's algorithm: {e}");
    }
    let (rd, mut wr) = stream.into_split();
    let mut rd = BufReader::new(rd);
    let eviction = ticket.eviction();
    let handshake = handshake(&mut rd, &mut wr, &state, &config, &ticket);
    let outcome = tokio::select! {
        outcome = tokio::time::timeout(HANDSHAKE_TIMEOUT, handshake) => outcome,
        () = eviction => {
            let text = format_args!(
                "store connection closed during the handshake: the server is at its \
                 connection limit ({}) and this connection had waited longest without \
                 a valid hello",
                config.max_connections
            );
            warn_peer(&config, peer, text);
            return;
        }
    };
    drop(ticket);
    match outcome {
        Ok(Ok(Some(joined))) => debug!(%peer, joined, "store client joined"),
        Ok(Ok(None)) => debug!(%peer, "store client connected again"),
        Ok(Err(reason)) => {
            let text = format_args!("store connection closed during the handshake: {reason}");
            warn_peer(&config, peer, text);
            return;
        }
        Err(_) => {
            let text =
                format_args!("store connection closed: no hello within {HANDSHAKE_TIMEOUT:?}");
            warn_peer(&config, peer, text);
            return;
        }
    }
    match serve_requests(&mut rd, &mut wr, &state, &config).await {
        Ok(()) => debug!(%peer, "store client disconnected"),
        Err(reason) => warn_peer(
            &config,
            peer,
            format_args!("store connection closed: {reason}"),
        ),
    }
}

/// Answers the hello of a connection over the server's cap with a refusal
/// giving `reason`, then closes it (after [`REFUSAL_TIMEOUT`] at most).
/// Reading the hello first lets the client read the refusal, rather than
/// a reset.
pub(crate) async fn refuse(
    stream: TcpStream,
    peer: SocketAddr,
    reason: String,
    config: Arc<ServerConfig>,
) {
    let (rd, mut wr) = stream.into_split();
    let mut rd = BufReader::new(rd);
    let hello = tokio::time::timeout(REFUSAL_TIMEOUT, read_hello(&mut rd)).await;
    let _ = wr.write_all(&encode_welcome(Err(&reason))).await;
    let _ = wr.shutdown().await;
    let read = match hello {
        Ok(Ok(_)) => "refused".to_string(),
        Ok(Err(e)) => format!("closed ({e})"),
        Err(_) => format!("closed (no hello within {REFUSAL_TIMEOUT:?})"),
    };
    warn_peer(
        &config,
        peer,
        format_args!("store connection {read}: {reason}"),
    );
}

/// Reads the hello and answers it. When accepted, returns the number of
/// joined clients if this one asked to be counted (it is counted before the
/// welcome goes out, so a client whose `connect` returned is counted).
/// The connection leaves the server's handshake list (its `ticket`) before
/// it is welcomed, so that a client whose `connect` returned is never
/// evicted to make room; one evicted first is closed unanswered.
pub(crate) async fn handshake<R: AsyncRead + Unpin, W: AsyncWrite + Unpin>(
    rd: &mut R,
    wr: &mut W,
    state: &ServerState,
    config: &ServerConfig,
    ticket: &HandshakeTicket,
) -> Result<Option<usize>, String> {
    let verdict = read_hello(rd).await?;
    let verdict = verdict.and_then(|(flags, token)| {
        check_token(config.token.as_deref(), &token)?;
        Ok(flags)
    });
    if verdict.is_ok() && !ticket.leave() {
        return Err(format!(
            "the server is at its connection limit ({}) and evicted this connection, \
             the longest in its handshake, before its hello was checked",
            config.max_connections
        ));
    }
    let joined = match &verdict {
        Ok(flags) if flags & FLAG_JOIN != 0 => Some(state.client_joined()),
        _ => None,
    };
    let welcome = encode_welcome(verdict.as_ref().map(|_| ()).map_err(String::as_str));
    wr.write_all(&welcome)
        .await
        .map_err(|e| format!("could not send the handshake reply: {e}"))?;
    verdict.map(|_| joined)
}

/// Reads a hello. `Err` when the peer is not a tensorcomm client or the
/// read failed (no reply is worth sending); else `Ok` of the verdict: the
/// flags and token, or why the hello is refused (another version, a token
/// too long; a token too long is not read).
async fn read_hello<R: AsyncRead + Unpin>(
    rd: &mut R,
) -> Result<Result<(u32, Vec<u8>), String>, String> {
    let mut magic = [0u8; 8];
    rd.read_exact(&mut magic)
        .await
        .map_err(|e| format!("expected an 8-byte magic number, the read failed: {e}"))?;
    if magic != MAGIC {
        // Not a tensorcomm client: it would not understand a refusal either.
        return Err(format!(
            "expected the magic number {:?}, found {:?} (not a tensorcomm store client)",
            String::from_utf8_lossy(&MAGIC),
            String::from_utf8_lossy(&magic)
        ));
    }
    let mut head = [0u8; 12];
    rd.read_exact(&mut head)
        .await
        .map_err(|e| format!("expected the rest of the hello, the read failed: {e}"))?;
    let field = |i: usize| u32::from_le_bytes([head[i], head[i + 1], head[i + 2], head[i + 3]]);
    let (version, flags, token_len) = (field(0), field(4), field(8) as usize);
    Ok(if version != VERSION {
        Err(format!(
            "expected protocol version {VERSION}, found version {version}"
        ))
    } else if token_len > MAX_TOKEN_LEN {
        Err(format!(
            "expected a token of at most {MAX_TOKEN_LEN} bytes, found {token_len} bytes"
        ))
    } else {
        let mut token = vec![0u8; token_len];
        rd.read_exact(&mut token)
            .await
            .map_err(|e| format!("expected a {token_len}-byte token, the read failed: {e}"))?;
        Ok((flags, token))
    })
}

/// A server without a token accepts everyone; one with a token only
/// clients presenting the same token.
fn check_token(expected: Option<&str>, found: &[u8]) -> Result<(), String> {
    let Some(expected) = expected else {
        return Ok(());
    };
    if found.is_empty() {
        return Err(format!(
            "expected this store's token (set {TOKEN_ENV}), found no token"
        ));
    }
    if !constant_time_eq(expected.as_bytes(), found) {
        return Err(format!(
            "expected this store's token (set {TOKEN_ENV}), found a different token"
        ));
    }
    Ok(())
}

/// Compares without stopping at the first difference, so the time taken
/// does not tell an attacker how much of a guess was right.
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// Answers requests one after another until the client closes (`Ok`) or
/// sends something that is not a valid request (`Err`, after a `Failed`
/// reply where possible).
pub(crate) async fn serve_requests<R: AsyncBufRead + Unpin, W: AsyncWrite + Unpin>(
    rd: &mut R,
    wr: &mut W,
    state: &Arc<ServerState>,
    config: &ServerConfig,
) -> Result<(), String> {
    let mut body = Vec::new();
    let mut out = Vec::new();
    loop {
        match rd.fill_buf().await {
            Ok([]) => return Ok(()),
            Ok(_) => {}
            Err(e) => return Err(format!("read failed: {e}")),
        }
        let mut header = [0u8; FRAME_HEADER];
        let idle = config.idle_timeout;
        match tokio::time::timeout(idle, rd.read_exact(&mut header)).await {
            Ok(Ok(_)) => {}
            Ok(Err(e)) => {
                return Err(format!(
                    "expected an 8-byte frame length, the read failed: {e}"
                ))
            }
            Err(_) => {
                return Err(format!(
                    "expected an 8-byte frame length, received part of it then nothing for \
                     {idle:?} (the idle timeout)"
                ))
            }
        }
        let len = u64::from_le_bytes(header);
        if len > config.max_message_size as u64 {
            let err = Error::MessageTooLarge {
                size: len,
                max: config.max_message_size as u64,
            };
            return Err(fail(wr, &mut out, err).await);
        }
        // len <= max_message_size, a usize: the conversion is exact.
        read_body(rd, &mut body, len as usize, idle).await?;
        let request = match Request::decode(&body) {
            Ok(request) => request,
            Err(err) => return Err(fail(wr, &mut out, err).await),
        };
        let response = if request.is_blocking() {
            tokio::select! {
                biased;
                response = state.handle(&request) => response,
                closed = client_activity(rd) => return closed,
            }
        } else {
            state.handle(&request).await
        };
        response.encode_frame(&mut out);
        wr.write_all(&out)
            .await
            .map_err(|e| format!("could not send a reply: {e}"))?;
        if let Response::Failed(reason) = response {
            // The client drops a connection that failed; so does the server.
            return Err(reason);
        }
        if body.capacity() > KEEP_BUFFER {
            body = Vec::new();
        }
        if out.capacity() > KEEP_BUFFER {
            out = Vec::new();
        }
    }
}

/// The length a frame's buffer grows to when its `filled` bytes (of the
/// `len` announced) are all read: twice what arrived, at least
/// [`READ_CHUNK`], at most `len`. Memory follows the bytes a peer sends,
/// not the length it claims.
fn next_capacity(filled: usize, len: usize) -> usize {
    len.min(filled.saturating_mul(2).max(READ_CHUNK))
}

/// Reads a frame body of `len` bytes into `body`, growing it as bytes
/// arrive ([`next_capacity`]); fails when the peer closes, or sends
/// nothing for `idle`, before the end.
async fn read_body<R: AsyncRead + Unpin>(
    rd: &mut R,
    body: &mut Vec<u8>,
    len: usize,
    idle: Duration,
) -> Result<(), String> {
    body.clear();
    let mut filled = 0;
    while filled < len {
        if filled == body.len() {
            body.resize(next_capacity(filled, len), 0);
        }
        match tokio::time::timeout(idle, rd.read(&mut body[filled..])).await {
            Ok(Ok(0)) => {
                return Err(format!(
                    "expected a request of {len} bytes, the connection closed after {filled}"
                ))
            }
            Ok(Ok(n)) => filled += n,
            Ok(Err(e)) => {
                return Err(format!(
                    "expected a request of {len} bytes, the read failed after {filled}: {e}"
                ))
            }
            Err(_) => {
                return Err(format!(
                    "expected a request of {len} bytes, received {filled} then nothing for \
                     {idle:?} (the idle timeout)"
                ))
            }
        }
    }
    Ok(())
}

/// Sends a best-effort `Failed` reply; returns the reason for the log.
async fn fail<W: AsyncWrite + Unpin>(wr: &mut W, out: &mut Vec<u8>, err: Error) -> String {
    let reason = err.to_string();
    Response::Failed(reason.clone()).encode_frame(out);
    let _ = wr.write_all(out).await;
    reason
}

/// Resolves when a client with a pending blocking request closes its
/// connection (`Ok`) or sends more bytes before its reply (`Err`).
async fn client_activity<R: AsyncBufRead + Unpin>(rd: &mut R) -> Result<(), String> {
    match rd.fill_buf().await {
        Ok([]) => Ok(()),
        Ok(_) => Err("expected no bytes while a blocking request is pending, found more".into()),
        Err(e) => Err(format!(
            "read failed while a blocking request was pending: {e}"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_frame_buffer_grows_with_what_arrived_not_with_what_was_announced() {
        let announced = 64 << 20;
        assert_eq!(next_capacity(0, announced), READ_CHUNK);
        assert_eq!(next_capacity(READ_CHUNK, announced), 2 * READ_CHUNK);
        assert_eq!(next_capacity(40 << 20, announced), announced);
        assert_eq!(next_capacity(0, 100), 100);
        assert_eq!(next_capacity(0, 0), 0);
    }

    #[test]
    fn a_body_announced_large_and_sent_small_holds_only_what_came_then_times_out() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let (mut peer, mut ours) = tokio::io::duplex(1 << 16);
            peer.write_all(&[7u8; 1000]).await.unwrap();
            let mut body = Vec::new();
            let idle = Duration::from_millis(50);
            let err = read_body(&mut ours, &mut body, 64 << 20, idle)
                .await
                .unwrap_err();
            assert!(err.contains("received 1000 then nothing"), "{err}");
            assert!(body.capacity() <= READ_CHUNK, "{}", body.capacity());
            // A whole body arrives in pieces, and only it is read.
            let mut sent = vec![1u8; 300_000];
            sent.extend_from_slice(b"next frame");
            let writer = tokio::spawn(async move {
                for piece in sent.chunks(4096) {
                    peer.write_all(piece).await.unwrap();
                }
                peer
            });
            read_body(&mut ours, &mut body, 300_000, idle)
                .await
                .unwrap();
            assert_eq!(body.len(), 300_000);
            assert!(body.iter().all(|&b| b == 1));
            let _peer = writer.await.unwrap();
            let mut rest = [0u8; 10];
            ours.read_exact(&mut rest).await.unwrap();
            assert_eq!(&rest, b"next frame");
        });
    }

    #[test]
    fn tokens_are_checked_only_when_the_server_has_one() {
        assert!(check_token(None, b"").is_ok());
        assert!(check_token(None, b"anything").is_ok());
        assert!(check_token(Some("abc"), b"abc").is_ok());
        let missing = check_token(Some("abc"), b"").unwrap_err();
        assert!(missing.contains("found no token"), "{missing}");
        let wrong = check_token(Some("abc"), b"abd").unwrap_err();
        assert!(wrong.contains("found a different token"), "{wrong}");
        assert!(check_token(Some("abc"), b"abcd").is_err());
    }
}
