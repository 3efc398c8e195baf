//! A TCP store server facing clients that do not follow the protocol.
//!
//! Each test sends one kind of bad input over a raw socket, checks that the
//! server closed that connection (with a reply saying why, where the client
//! could read one), and then checks that a well-behaved client on the same
//! server still works and that the bad connection was not counted as joined.

use std::io::{ErrorKind, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::time::Duration;

use tensorcomm::store::{Store, TcpStore, TcpStoreOptions, TcpStoreServer};
use tensorcomm::Error;

const MAGIC: &[u8; 8] = b"TCMSTORE";
const TAG_FAILED: u8 = 18;

fn options(token: Option<&str>) -> TcpStoreOptions {
    TcpStoreOptions {
        timeout: Duration::from_secs(5),
        token: token.map(str::to_string),
        ..TcpStoreOptions::default()
    }
}

fn server(token: Option<&str>) -> TcpStoreServer {
    TcpStoreServer::bind("127.0.0.1:0", &options(token)).unwrap()
}

fn raw(addr: SocketAddr) -> TcpStream {
    let stream = TcpStream::connect(addr).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    stream
}

fn hello(version: u32, token: &[u8]) -> Vec<u8> {
    let mut out = MAGIC.to_vec();
    out.extend_from_slice(&version.to_le_bytes());
    out.extend_from_slice(&1u32.to_le_bytes()); // FLAG_JOIN
    out.extend_from_slice(&(token.len() as u32).to_le_bytes());
    out.extend_from_slice(token);
    out
}

/// Sends a hello and returns the server's (status, reason).
fn handshake(stream: &mut TcpStream, version: u32, token: &[u8]) -> (u8, String) {
    stream.write_all(&hello(version, token)).unwrap();
    let mut head = [0u8; 17];
    stream.read_exact(&mut head).unwrap();
    assert_eq!(&head[..8], MAGIC);
    let len = u32::from_le_bytes(head[13..17].try_into().unwrap()) as usize;
    let mut reason = vec![0u8; len];
    stream.read_exact(&mut reason).unwrap();
    (head[12], String::from_utf8(reason).unwrap())
}

/// A connection that completed the handshake.
fn accepted(addr: SocketAddr) -> TcpStream {
    let mut stream = raw(addr);
    assert_eq!(handshake(&mut stream, 1, b""), (0, String::new()));
    stream
}

/// Reads one reply frame and returns the reason of a `Failed` reply.
fn read_failure(stream: &mut TcpStream) -> String {
    let mut len = [0u8; 8];
    stream.read_exact(&mut len).unwrap();
    let mut body = vec![0u8; u64::from_le_bytes(len) as usize];
    stream.read_exact(&mut body).unwrap();
    assert_eq!(
        body[0], TAG_FAILED,
        "expected a failure reply, got {body:?}"
    );
    let reason_len = u64::from_le_bytes(body[1..9].try_into().unwrap()) as usize;
    String::from_utf8(body[9..9 + reason_len].to_vec()).unwrap()
}

/// Asserts the server closed the connection (end of file or reset), rather
/// than leaving it open (which would end in our read timeout).
fn assert_closed(stream: &mut TcpStream) {
    let mut buf = [0u8; 64];
    match stream.read(&mut buf) {
        Ok(0) => {}
        Ok(n) => panic!("expected the connection closed, read {n} more bytes"),
        Err(e) => assert!(
            matches!(e.kind(), ErrorKind::ConnectionReset | ErrorKind::BrokenPipe),
            "expected the connection closed, the read failed with {e}"
        ),
    }
}

/// A good client still gets served, and only good clients were counted.
fn assert_server_healthy(server: &TcpStoreServer, token: Option<&str>, joined_before: usize) {
    let client = TcpStore::connect(&server.local_addr().to_string(), &options(token)).unwrap();
    client.set("still", b"serving").unwrap();
    assert_eq!(client.get("still").unwrap(), b"serving");
    assert_eq!(client.add("n", 2).unwrap(), 2);
    assert_eq!(server.clients_joined(), joined_before + 1);
}

fn frame(body: &[u8]) -> Vec<u8> {
    let mut out = (body.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(body);
    out
}

#[test]
fn garbage_bytes_close_only_that_connection() {
    let server = server(None);
    let mut stream = raw(server.local_addr());
    stream
        .write_all(b"GET / HTTP/1.1\r\nHost: example\r\n\r\n")
        .unwrap();
    assert_closed(&mut stream);
    assert_server_healthy(&server, None, 0);
}

#[test]
fn oversize_length_prefix_closes_the_connection_without_allocating() {
    let server = server(None);
    let mut stream = accepted(server.local_addr());
    assert_eq!(server.clients_joined(), 1);
    // Half of u64::MAX: allocating it would abort the whole test process.
    stream.write_all(&(u64::MAX / 2).to_le_bytes()).unwrap();
    let reason = read_failure(&mut stream);
    assert!(
        reason.contains("exceeds the maximum of 67108864 bytes"),
        "{reason}"
    );
    assert_closed(&mut stream);
    assert_server_healthy(&server, None, 1);
}

#[test]
fn truncated_frame_closes_the_connection() {
    let server = server(None);
    let mut stream = accepted(server.local_addr());
    // Announces 100 bytes, sends 10, then nothing more.
    stream.write_all(&100u64.to_le_bytes()).unwrap();
    stream.write_all(&[1u8; 10]).unwrap();
    stream.shutdown(Shutdown::Write).unwrap();
    assert_closed(&mut stream);
    assert_server_healthy(&server, None, 1);
}

#[test]
fn truncated_request_inside_a_frame_gets_a_failure_reply() {
    let server = server(None);
    let mut stream = accepted(server.local_addr());
    // SET whose key length is cut short.
    stream.write_all(&frame(&[1, 0xff, 0xff])).unwrap();
    let reason = read_failure(&mut stream);
    assert!(reason.contains("bytes left in the frame"), "{reason}");
    assert_closed(&mut stream);
    assert_server_healthy(&server, None, 1);
}

#[test]
fn unknown_opcode_gets_a_failure_reply() {
    let server = server(None);
    let mut stream = accepted(server.local_addr());
    stream.write_all(&frame(&[0xee])).unwrap();
    let reason = read_failure(&mut stream);
    assert!(reason.contains("found opcode 238"), "{reason}");
    assert_closed(&mut stream);
    assert_server_healthy(&server, None, 1);
}

#[test]
fn wrong_or_missing_token_is_refused_and_never_joins() {
    let server = server(Some("right"));
    let addr = server.local_addr().to_string();

    let err = TcpStore::connect(&addr, &options(Some("wrong"))).unwrap_err();
    assert!(matches!(err, Error::StoreRefused { .. }), "{err}");
    assert!(err.to_string().contains("found a different token"), "{err}");

    let err = TcpStore::connect(&addr, &options(None)).unwrap_err();
    assert!(matches!(err, Error::StoreRefused { .. }), "{err}");
    assert!(err.to_string().contains("found no token"), "{err}");

    // The server closes a refused connection after saying why.
    let mut stream = raw(server.local_addr());
    let (status, reason) = handshake(&mut stream, 1, b"guess");
    assert_eq!(status, 1);
    assert!(reason.contains("different token"), "{reason}");
    assert_closed(&mut stream);

    assert_eq!(server.clients_joined(), 0);
    assert_server_healthy(&server, Some("right"), 0);
}

#[test]
fn other_protocol_version_is_refused() {
    let server = server(None);
    let mut stream = raw(server.local_addr());
    let (status, reason) = handshake(&mut stream, 99, b"");
    assert_eq!(status, 1);
    assert_eq!(reason, "expected protocol version 1, found version 99");
    assert_closed(&mut stream);
    assert_server_healthy(&server, None, 0);
}

#[test]
fn client_closing_mid_wait_unregisters_its_waiter() {
    let server = server(None);
    let mut stream = accepted(server.local_addr());
    // WAIT (opcode 5), no timeout, one key "k".
    let mut body = vec![5u8];
    body.extend_from_slice(&u64::MAX.to_le_bytes());
    body.extend_from_slice(&1u32.to_le_bytes());
    body.extend_from_slice(&1u64.to_le_bytes());
    body.push(b'k');
    stream.write_all(&frame(&body)).unwrap();
    wait_until(|| server.waiting_requests() == 1);
    drop(stream);
    wait_until(|| server.waiting_requests() == 0);
    assert_server_healthy(&server, None, 1);
}

/// Waits for a condition on the server's counters (bounded: 5 s).
fn wait_until(mut condition: impl FnMut() -> bool) {
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while !condition() {
        assert!(
            std::time::Instant::now() < deadline,
            "condition not met in 5 s"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
}
