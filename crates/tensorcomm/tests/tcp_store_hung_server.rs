//! A server that accepts a client and then never answers (as a stopped
//! process's kernel still accepts connections): the client must give up
//! with `StoreConnectionLost` 5 s past the request's own timeout, not hang;
//! a first connection whose handshake is never answered must fail within
//! the store's timeout and half of it more, not the 30 s a handshake may
//! otherwise take; and a new connection to a server that answered earlier
//! ones, left unanswered, is the server lost. (Within rendezvous and a
//! group's set-up the set-up's timeout bounds these waits: unit tests in
//! `store/tcp/reply_grace.rs` and `store/tcp/client.rs`.)

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::thread;
use std::time::{Duration, Instant};

use tensorcomm::store::{Store, TcpStore, TcpStoreOptions};
use tensorcomm::Error;

/// Accepts connections, welcomes the first `welcomed` of them, then reads
/// requests on every one and never replies, until the client goes away.
fn hung_server(welcomed: usize) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    thread::spawn(move || {
        for (n, stream) in listener.incoming().enumerate() {
            let Ok(stream) = stream else { return };
            thread::spawn(move || never_answer(stream, n < welcomed));
        }
    });
    addr
}

fn never_answer(mut stream: TcpStream, welcome: bool) {
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
}

fn options(timeout: Duration) -> TcpStoreOptions {
    TcpStoreOptions {
        timeout,
        token: None,
        ..TcpStoreOptions::default()
    }
}

fn assert_lost(err: &Error, addr: &str, says: &str) {
    match err {
        Error::StoreConnectionLost { addr: a, reason } => {
            assert_eq!(a, addr);
            assert!(reason.contains(says), "{reason}");
        }
        other => panic!("expected StoreConnectionLost, got {other}"),
    }
}

#[test]
fn a_hung_server_gives_connection_lost_after_the_grace_period() {
    let addr = hung_server(1);
    let store = TcpStore::connect(&addr, &options(Duration::from_secs(60))).unwrap();
    let start = Instant::now();
    let err = store
        .get_timeout("k", Duration::from_millis(500))
        .unwrap_err();
    let took = start.elapsed();
    assert_lost(&err, &addr, "no reply within");
    assert!(
        took >= Duration::from_millis(5500) && took < Duration::from_secs(9),
        "a get of 500 ms took {took:?}"
    );
}

#[test]
fn a_request_answered_at_once_waits_the_store_timeout_and_the_grace() {
    // A busy server may be slow: an ordinary call does not give up early.
    let addr = hung_server(1);
    let store = TcpStore::connect(&addr, &options(Duration::from_secs(1))).unwrap();
    let start = Instant::now();
    let err = store.check(&["k"]).unwrap_err();
    let took = start.elapsed();
    assert_lost(&err, &addr, "no reply within");
    assert!(
        took >= Duration::from_secs(6) && took < Duration::from_secs(9),
        "a check took {took:?}"
    );
}

#[test]
fn an_unanswered_first_handshake_fails_within_the_timeout_and_half_of_it() {
    let addr = hung_server(0);
    let start = Instant::now();
    let err = TcpStore::connect(&addr, &options(Duration::from_secs(2))).unwrap_err();
    let took = start.elapsed();
    assert!(matches!(err, Error::StoreConnect { .. }), "{err}");
    assert!(took < Duration::from_secs(5), "connecting took {took:?}");
}

#[test]
fn an_unanswered_handshake_after_answered_ones_is_the_server_lost() {
    let addr = hung_server(1);
    let store =
        std::sync::Arc::new(TcpStore::connect(&addr, &options(Duration::from_secs(2))).unwrap());
    // The welcomed connection is busy with a get the server never answers,
    // so the next call dials a new one.
    let busy = {
        let store = store.clone();
        thread::spawn(move || store.get_timeout("k", Duration::from_secs(20)))
    };
    thread::sleep(Duration::from_millis(200));
    let start = Instant::now();
    let err = store.set("k", b"v").unwrap_err();
    let took = start.elapsed();
    assert_lost(&err, &addr, "did not answer its handshake");
    // The dial's 2 s and half of it: 3 s.
    assert!(
        took >= Duration::from_millis(2500) && took < Duration::from_secs(6),
        "the set took {took:?}"
    );
    drop(busy); // its get gives up by itself, 25 s from now
}
