//! The TCP store server's side of one connection, fed arbitrary bytes.
//!
//! The first input byte picks the set-up: bit 0 clear puts a valid hello
//! in front of the rest (so most inputs reach the requests), set sends the
//! rest as it is (the handshake itself is fuzzed); bit 1 gives the server a
//! token (which the prepended hello carries). The rest goes through an
//! in-memory pipe to the same `handshake` and `serve_requests` a TCP
//! connection runs, then the pipe closes. Checked: no panic, the session
//! ends, everything the server wrote is a welcome followed by whole reply
//! frames that the client decodes, and no waiter is left registered.

use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt, BufReader};

use super::input::Input;
use crate::store::tcp::fuzzing::{
    encode_hello, handshake, serve_requests, Handshakes, Response, ServerConfig, ServerState,
    FRAME_HEADER, MAGIC,
};
use crate::store::tcp::DEFAULT_MAX_MESSAGE_SIZE;

const TOKEN: &str = "fuzz-token";

thread_local! {
    static RUNTIME: tokio::runtime::Runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a current-thread tokio runtime");
}

pub fn store_server(data: &[u8]) {
    let mut input = Input(data);
    let mode = input.u8();
    let token = (mode & 2 != 0).then(|| TOKEN.to_string());
    let mut stream = Vec::new();
    if mode & 1 == 0 {
        stream.extend(encode_hello(token.as_deref(), 1));
    }
    stream.extend_from_slice(input.rest());

    let state = Arc::new(ServerState::default());
    let config = ServerConfig {
        token,
        max_message_size: DEFAULT_MAX_MESSAGE_SIZE,
        idle_timeout: Duration::from_secs(30),
        max_connections: 1,
        max_connections_origin: "fuzzing".into(),
        warnings: Default::default(),
    };
    let written = RUNTIME.with(|rt| {
        rt.block_on(async {
            let (client, server) = tokio::io::duplex(64 << 10);
            let (mut client_rd, mut client_wr) = tokio::io::split(client);
            let (server_rd, mut server_wr) = tokio::io::split(server);
            let mut server_rd = BufReader::new(server_rd);
            let ticket = Arc::new(Handshakes::default()).enter();
            let serve = async {
                if handshake(&mut server_rd, &mut server_wr, &state, &config, &ticket)
                    .await
                    .is_ok()
                {
                    let _ = serve_requests(&mut server_rd, &mut server_wr, &state, &config).await;
                }
                // The connection closes, as when the task ends.
                drop(server_rd);
                drop(server_wr);
            };
            let send = async {
                // The server may stop reading early: a failed write is fine.
                let _ = client_wr.write_all(&stream).await;
                let _ = client_wr.shutdown().await;
            };
            let mut written = Vec::new();
            let receive = client_rd.read_to_end(&mut written);
            let ((), (), received) = tokio::join!(serve, send, receive);
            received.expect("reading from an in-memory pipe");
            written
        })
    });
    check_replies(&written);
    assert_eq!(state.waiting_requests(), 0, "a waiter outlived its request");
}

/// What the server wrote: nothing (not a tensorcomm client, or the hello
/// was cut short), or a welcome then whole reply frames that decode.
fn check_replies(written: &[u8]) {
    let mut out = Input(written);
    if out.is_empty() {
        return;
    }
    assert_eq!(out.bytes(8), MAGIC, "a welcome starts with the magic");
    let _version = out.bytes(4);
    let status = out.u8();
    let reason_len = u32::from_le_bytes(out.bytes(4).try_into().expect("a reason length"));
    assert_eq!(out.bytes(reason_len as usize).len(), reason_len as usize);
    if status != 0 {
        assert!(out.is_empty(), "bytes after a refusal");
        return;
    }
    while !out.is_empty() {
        let header = out.bytes(FRAME_HEADER);
        let len = u64::from_le_bytes(header.try_into().expect("a whole frame header"));
        let body = out.bytes(len as usize);
        assert_eq!(body.len() as u64, len, "a reply frame cut short");
        if let Err(e) = Response::decode(body) {
            panic!("the server sent a reply the client cannot decode: {e}");
        }
    }
}
