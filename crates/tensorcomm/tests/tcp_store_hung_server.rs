//! A server that accepts a client and then never answers (as a stopped
//! process's kernel still accepts connections): the client must give up
//! with `StoreConnectionLost` after the request's own timeout plus a grace
//! of half the store's timeout (1 to 5 s), not hang, and a new connection
//! whose handshake is never answered must fail within the store's
//! timeout, not the 30 s a handshake may otherwise take.

use std::io::{Read, Write};
use std::net::TcpListener;
use std::thread;
use std::time::{Duration, Instant};

use tensorcomm::store::{Store, TcpStore, TcpStoreOptions};
use tensorcomm::Error;

/// Accepts one connection, completes the handshake when `welcome` is set,
/// then reads requests and never replies, until the client goes away.
fn hung_server(welcome: bool) -> (String, thread::JoinHandle<()>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let handle = thread::spawn(move || {
        let (mut stream, _) = listener.accept().unwrap();
        if welcome {
            let mut hello = [0u8; 20];
            stream.read_exact(&mut hello).unwrap();
            assert_eq!(&hello[..8], b"TCMSTORE");
            let mut welcome = b"TCMSTORE".to_vec();
            welcome.extend_from_slice(&1u32.to_le_bytes());
            welcome.push(0); // accepted
            welcome.extend_from_slice(&0u32.to_le_bytes());
            stream.write_all(&welcome).unwrap();
        }
        let mut sink = [0u8; 256];
        while matches!(stream.read(&mut sink), Ok(n) if n > 0) {}
    });
    (addr, handle)
}

fn options(timeout: Duration) -> TcpStoreOptions {
    TcpStoreOptions {
        timeout,
        token: None,
        ..TcpStoreOptions::default()
    }
}

fn assert_lost(err: &Error, addr: &str) {
    match err {
        Error::StoreConnectionLost { addr: a, reason } => {
            assert_eq!(a, addr);
            assert!(reason.contains("no reply within"), "{reason}");
        }
        other => panic!("expected StoreConnectionLost, got {other}"),
    }
}

#[test]
fn a_hung_server_gives_connection_lost_after_the_grace_period() {
    // Store timeout 4 s: a grace of 2 s.
    let (addr, server) = hung_server(true);
    let store = TcpStore::connect(&addr, &options(Duration::from_secs(4))).unwrap();
    let start = Instant::now();
    let err = store
        .get_timeout("k", Duration::from_millis(500))
        .unwrap_err();
    let took = start.elapsed();
    assert_lost(&err, &addr);
    assert!(
        took >= Duration::from_millis(2500) && took < Duration::from_secs(4),
        "a get of 500 ms took {took:?}"
    );
    drop(store);
    server.join().unwrap();
}

#[test]
fn a_request_answered_at_once_waits_only_the_grace() {
    // Before, `check` waited the store's whole timeout (60 s) and 5 s more.
    let (addr, server) = hung_server(true);
    let store = TcpStore::connect(&addr, &options(Duration::from_secs(60))).unwrap();
    let start = Instant::now();
    let err = store.check(&["k"]).unwrap_err();
    let took = start.elapsed();
    assert_lost(&err, &addr);
    assert!(
        took >= Duration::from_secs(5) && took < Duration::from_secs(8),
        "a check took {took:?}"
    );
    drop(store);
    server.join().unwrap();
}

#[test]
fn an_unanswered_handshake_fails_within_the_timeout() {
    let (addr, server) = hung_server(false);
    let start = Instant::now();
    let err = TcpStore::connect(&addr, &options(Duration::from_secs(2))).unwrap_err();
    let took = start.elapsed();
    assert!(matches!(err, Error::StoreConnect { .. }), "{err}");
    assert!(took < Duration::from_secs(5), "connecting took {took:?}");
    server.join().unwrap();
}
