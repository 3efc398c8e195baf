//! One client connection, seen from the server: handshake, then requests.
//!
//! Each connection is one tokio task. Anything wrong with what a client
//! sends (bad magic, wrong token, an oversize or truncated frame, bytes that
//! do not decode) ends that connection only, with a `Failed` reply or a
//! refusal where the client could still read one, and a `warn!` naming the
//! peer. The server and its other clients never notice.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::TcpStream;
use tracing::{debug, warn};

use super::options::TOKEN_ENV;
use super::protocol::{
    encode_welcome, Request, Response, FLAG_JOIN, FRAME_HEADER, MAGIC, MAX_TOKEN_LEN, VERSION,
};
use super::server_state::ServerState;
use crate::Error;

/// How long a new connection may take to send its hello.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(30);

/// Buffers larger than this are released after the request that needed them.
const KEEP_BUFFER: usize = 1 << 20;

/// What every connection of one server needs to know.
#[derive(Debug)]
pub(crate) struct ServerConfig {
    pub(crate) token: Option<String>,
    pub(crate) max_message_size: usize,
}

/// Serves one accepted connection until it closes or misbehaves.
pub(crate) async fn serve(
    stream: TcpStream,
    peer: SocketAddr,
    state: Arc<ServerState>,
    config: Arc<ServerConfig>,
) {
    if let Err(e) = stream.set_nodelay(true) {
        debug!(%peer, "could not disable Nagle's algorithm: {e}");
    }
    let (rd, mut wr) = stream.into_split();
    let mut rd = BufReader::new(rd);
    let handshake = handshake(&mut rd, &mut wr, &state, &config);
    match tokio::time::timeout(HANDSHAKE_TIMEOUT, handshake).await {
        Ok(Ok(Some(joined))) => debug!(%peer, joined, "store client joined"),
        Ok(Ok(None)) => debug!(%peer, "store client connected again"),
        Ok(Err(reason)) => {
            warn!(%peer, "store connection closed during the handshake: {reason}");
            return;
        }
        Err(_) => {
            warn!(%peer, "store connection closed: no hello within {HANDSHAKE_TIMEOUT:?}");
            return;
        }
    }
    match serve_requests(&mut rd, &mut wr, &state, &config).await {
        Ok(()) => debug!(%peer, "store client disconnected"),
        Err(reason) => warn!(%peer, "store connection closed: {reason}"),
    }
}

/// Reads the hello and answers it. When accepted, returns the number of
/// joined clients if this one asked to be counted (it is counted before the
/// welcome goes out, so a client whose `connect` returned is counted).
async fn handshake(
    rd: &mut BufReader<OwnedReadHalf>,
    wr: &mut OwnedWriteHalf,
    state: &ServerState,
    config: &ServerConfig,
) -> Result<Option<usize>, String> {
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
    let verdict = if version != VERSION {
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
        check_token(config.token.as_deref(), &token)
    };
    let joined = match &verdict {
        Ok(()) if flags & FLAG_JOIN != 0 => Some(state.client_joined()),
        _ => None,
    };
    let welcome = encode_welcome(verdict.as_ref().map(|_| ()).map_err(String::as_str));
    wr.write_all(&welcome)
        .await
        .map_err(|e| format!("could not send the handshake reply: {e}"))?;
    verdict.map(|()| joined)
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
async fn serve_requests(
    rd: &mut BufReader<OwnedReadHalf>,
    wr: &mut OwnedWriteHalf,
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
        rd.read_exact(&mut header)
            .await
            .map_err(|e| format!("expected an 8-byte frame length, the read failed: {e}"))?;
        let len = u64::from_le_bytes(header);
        if len > config.max_message_size as u64 {
            let err = Error::MessageTooLarge {
                size: len,
                max: config.max_message_size as u64,
            };
            return Err(fail(wr, &mut out, err).await);
        }
        // len <= max_message_size, a usize: the conversion is exact.
        body.resize(len as usize, 0);
        rd.read_exact(&mut body)
            .await
            .map_err(|e| format!("expected a request of {len} bytes, the read failed: {e}"))?;
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

/// Sends a best-effort `Failed` reply; returns the reason for the log.
async fn fail(wr: &mut OwnedWriteHalf, out: &mut Vec<u8>, err: Error) -> String {
    let reason = err.to_string();
    Response::Failed(reason.clone()).encode_frame(out);
    let _ = wr.write_all(out).await;
    reason
}

/// Resolves when a client with a pending blocking request closes its
/// connection (`Ok`) or sends more bytes before its reply (`Err`).
async fn client_activity(rd: &mut BufReader<OwnedReadHalf>) -> Result<(), String> {
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
