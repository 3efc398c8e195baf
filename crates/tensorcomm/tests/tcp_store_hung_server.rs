//! A server that accepts a client and then never answers: the client must
//! give up with `StoreConnectionLost` after its timeout plus a grace period
//! (5 s), not hang. This file takes about 5 s for that reason.

use std::io::{Read, Write};
use std::net::TcpListener;
use std::thread;
use std::time::{Duration, Instant};

use tensorcomm::store::{Store, TcpStore, TcpStoreOptions};
use tensorcomm::Error;

/// Accepts one connection, completes the handshake, then reads requests
/// and never replies, until the client goes away.
fn hung_server() -> (String, thread::JoinHandle<()>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let handle = thread::spawn(move || {
        let (mut stream, _) = listener.accept().unwrap();
        let mut hello = [0u8; 20];
        stream.read_exact(&mut hello).unwrap();
        assert_eq!(&hello[..8], b"TCMSTORE");
        let mut welcome = b"TCMSTORE".to_vec();
        welcome.extend_from_slice(&1u32.to_le_bytes());
        welcome.push(0); // accepted
        welcome.extend_from_slice(&0u32.to_le_bytes());
        stream.write_all(&welcome).unwrap();
        let mut sink = [0u8; 256];
        while matches!(stream.read(&mut sink), Ok(n) if n > 0) {}
    });
    (addr, handle)
}

#[test]
fn a_hung_server_gives_connection_lost_after_the_grace_period() {
    let (addr, server) = hung_server();
    let options = TcpStoreOptions {
        timeout: Duration::from_secs(5),
        token: None,
        ..TcpStoreOptions::default()
    };
    let store = TcpStore::connect(&addr, &options).unwrap();
    let start = Instant::now();
    let err = store
        .get_timeout("k", Duration::from_millis(10))
        .unwrap_err();
    let took = start.elapsed();
    match &err {
        Error::StoreConnectionLost { addr: a, reason } => {
            assert_eq!(a, &addr);
            assert!(reason.contains("no reply within"), "{reason}");
        }
        other => panic!("expected StoreConnectionLost, got {other}"),
    }
    assert!(
        took >= Duration::from_secs(5) && took < Duration::from_secs(9),
        "took {took:?}"
    );
    drop(store);
    server.join().unwrap();
}
