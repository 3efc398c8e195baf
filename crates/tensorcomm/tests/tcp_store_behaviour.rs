//! TCP-specific behaviour of `TcpStore` and `TcpStoreServer`: timeouts,
//! lost and restored connections, address conflicts, joining clients,
//! message limits and many concurrent waiters. (Every `Store` method's
//! semantics are covered by the generic store test-suite.)

use std::sync::{Arc, Barrier};
use std::thread;
use std::time::{Duration, Instant};

use tensorcomm::store::{Store, TcpStore, TcpStoreOptions, TcpStoreServer};
use tensorcomm::Error;

fn options(timeout: Duration) -> TcpStoreOptions {
    TcpStoreOptions {
        timeout,
        token: None,
        ..TcpStoreOptions::default()
    }
}

fn server() -> TcpStoreServer {
    TcpStoreServer::bind("127.0.0.1:0", &options(Duration::from_secs(5))).unwrap()
}

fn client(server: &TcpStoreServer) -> TcpStore {
    TcpStore::connect(
        &server.local_addr().to_string(),
        &options(Duration::from_secs(5)),
    )
    .unwrap()
}

/// Waits for a condition on the server's counters (bounded: 5 s).
fn wait_until(mut condition: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(5);
    while !condition() {
        assert!(Instant::now() < deadline, "condition not met in 5 s");
        thread::sleep(Duration::from_millis(1));
    }
}

#[test]
fn a_timed_out_client_stays_usable() {
    let server = server();
    let store = client(&server);
    let short = Duration::from_millis(50);

    let start = Instant::now();
    let err = store.get_timeout("missing", short).unwrap_err();
    let took = start.elapsed();
    match &err {
        Error::StoreTimeout { keys, timeout } => {
            assert_eq!(keys, &["missing".to_string()]);
            assert_eq!(*timeout, short);
        }
        other => panic!("expected StoreTimeout, got {other}"),
    }
    // Answered by the server at the timeout, not by the client's grace period.
    assert!(took >= short && took < Duration::from_secs(3), "{took:?}");

    store.set("present", b"1").unwrap();
    assert_eq!(store.get("present").unwrap(), b"1");

    let err = store
        .wait_timeout(&["present", "absent"], short)
        .unwrap_err();
    assert!(err.to_string().contains("absent"), "{err}");
    let err = store
        .multi_get_timeout(&["present", "absent"], short)
        .unwrap_err();
    assert!(matches!(err, Error::StoreTimeout { .. }), "{err}");
    let err = store.queue_pop_timeout("empty", short).unwrap_err();
    assert!(matches!(err, Error::StoreTimeout { .. }), "{err}");

    store.queue_push("q", b"x").unwrap();
    assert_eq!(store.queue_pop_timeout("q", short).unwrap(), b"x");
    assert_eq!(store.multi_get(&["present"]).unwrap(), vec![b"1".to_vec()]);
    assert_eq!(server.waiting_requests(), 0);
}

#[test]
fn server_errors_are_typed_and_keep_the_connection() {
    let server = server();
    let store = client(&server);
    store.set("text", b"hello").unwrap();
    let err = store.add("text", 1).unwrap_err();
    match &err {
        Error::NotACounter { key, found } => {
            assert_eq!(key, "text");
            assert_eq!(found, "hello");
        }
        other => panic!("expected NotACounter, got {other}"),
    }
    assert_eq!(store.add("counter", 5).unwrap(), 5);
    // One connection served all of it: no reconnect was needed.
    assert_eq!(server.clients_joined(), 1);
}

#[test]
fn dropping_the_server_wakes_a_waiting_client_promptly() {
    let server = server();
    let store = Arc::new(
        TcpStore::connect(
            &server.local_addr().to_string(),
            &options(Duration::from_millis(200)),
        )
        .unwrap(),
    );
    let waiter = {
        let store = store.clone();
        thread::spawn(move || {
            let start = Instant::now();
            (
                store.get_timeout("never", Duration::from_secs(60)),
                start.elapsed(),
            )
        })
    };
    wait_until(|| server.waiting_requests() == 1);
    drop(server);
    let (result, took) = waiter.join().unwrap();
    let err = result.unwrap_err();
    assert!(matches!(err, Error::StoreConnectionLost { .. }), "{err}");
    assert!(took < Duration::from_secs(5), "took {took:?}");

    // The next call tries to connect again and is refused: the server
    // it reached before is gone, which it says at once.
    let err = store.set("k", b"v").unwrap_err();
    assert!(matches!(err, Error::StoreConnectionLost { .. }), "{err}");
}

#[test]
fn a_call_to_a_server_that_went_away_fails_at_once_not_at_its_timeout() {
    let server = server();
    let store = TcpStore::connect(
        &server.local_addr().to_string(),
        &options(Duration::from_secs(20)),
    )
    .unwrap();
    store.set("k", b"v").unwrap();
    drop(server);
    // The pooled connection breaks; then a new one is refused.
    let _ = store.get("k");
    let start = Instant::now();
    let err = store.set("k", b"w").unwrap_err();
    assert!(
        matches!(&err, Error::StoreConnectionLost { reason, .. } if reason.contains("refused")),
        "{err}"
    );
    assert!(
        start.elapsed() < Duration::from_secs(5),
        "took {:?}",
        start.elapsed()
    );
}

#[test]
fn a_client_reconnects_to_a_restarted_server() {
    let first = server();
    let addr = first.local_addr().to_string();
    let store = TcpStore::connect(&addr, &options(Duration::from_secs(5))).unwrap();
    store.set("k", b"old").unwrap();
    drop(first);

    let err = store.get("k").unwrap_err();
    assert!(matches!(err, Error::StoreConnectionLost { .. }), "{err}");

    let second = TcpStoreServer::bind(&addr, &options(Duration::from_secs(5))).unwrap();
    store.set("k", b"new").unwrap();
    assert_eq!(store.get("k").unwrap(), b"new");
    // A reconnect is not a new client.
    assert_eq!(second.clients_joined(), 0);
}

#[test]
fn binding_an_occupied_port_is_address_in_use() {
    let server = server();
    let addr = server.local_addr().to_string();
    let err = TcpStoreServer::bind(&addr, &options(Duration::from_secs(1))).unwrap_err();
    match &err {
        Error::AddressInUse { addr: reported } => assert_eq!(reported, &addr),
        other => panic!("expected AddressInUse, got {other}"),
    }
    // The first server is unaffected.
    client(&server).set("k", b"v").unwrap();
}

#[test]
fn host_reports_how_many_clients_joined() {
    let err = TcpStore::host("127.0.0.1:0", 2, &options(Duration::from_millis(100))).unwrap_err();
    assert!(
        matches!(
            err,
            Error::ClientsTimeout {
                joined: 1,
                expected: 2,
                ..
            }
        ),
        "{err}"
    );
    assert!(err.to_string().contains("1/2 clients joined"), "{err}");
}

#[test]
fn wait_for_clients_returns_when_all_joined() {
    let server = server();
    let addr = server.local_addr().to_string();
    let clients: Vec<_> = (0..3)
        .map(|_| {
            let addr = addr.clone();
            thread::spawn(move || TcpStore::connect(&addr, &options(Duration::from_secs(5))))
        })
        .collect();
    server.wait_for_clients(3, Duration::from_secs(5)).unwrap();
    let clients: Vec<_> = clients
        .into_iter()
        .map(|h| h.join().unwrap().unwrap())
        .collect();
    assert_eq!(server.clients_joined(), 3);
    let err = server
        .wait_for_clients(4, Duration::from_millis(10))
        .unwrap_err();
    assert!(err.to_string().contains("3/4 clients joined"), "{err}");
    drop(clients);
}

#[test]
fn one_client_shared_by_threads_does_not_block_itself() {
    // A thread waiting on a key must not stop another thread of the same
    // client from setting it.
    let server = server();
    let store = Arc::new(client(&server));
    let waiter = {
        let store = store.clone();
        thread::spawn(move || store.get_timeout("later", Duration::from_secs(10)))
    };
    wait_until(|| server.waiting_requests() == 1);
    store.set("later", b"now").unwrap();
    assert_eq!(waiter.join().unwrap().unwrap(), b"now");
    // Extra connections of one client do not count as new clients.
    assert_eq!(server.clients_joined(), 1);
}

#[test]
fn messages_over_the_limit_are_refused_on_either_side() {
    // The client refuses to send a message over its own limit.
    let server = server();
    let small = TcpStoreOptions {
        max_message_size: 1024,
        ..options(Duration::from_secs(5))
    };
    let store = TcpStore::connect(&server.local_addr().to_string(), &small).unwrap();
    let err = store.set("big", &[7u8; 2000]).unwrap_err();
    assert!(
        matches!(err, Error::MessageTooLarge { max: 1024, .. }),
        "{err}"
    );
    store.set("small", b"ok").unwrap();
    // ... and a reply over it.
    let other = client(&server);
    other.set("big", &[7u8; 2000]).unwrap();
    let err = store.get("big").unwrap_err();
    assert!(
        matches!(err, Error::MessageTooLarge { max: 1024, .. }),
        "{err}"
    );
    assert_eq!(store.get("small").unwrap(), b"ok");

    // A server with a small limit drops a client that sends more, and
    // says so; the client connects again on its next call.
    let strict = TcpStoreServer::bind("127.0.0.1:0", &small).unwrap();
    let store = client(&strict);
    let err = store.set("big", &[7u8; 2000]).unwrap_err();
    assert!(matches!(err, Error::StoreServer { .. }), "{err}");
    assert!(
        err.to_string().contains("exceeds the maximum of 1024"),
        "{err}"
    );
    store.set("small", b"ok").unwrap();
    assert_eq!(store.get("small").unwrap(), b"ok");
}

#[test]
fn one_set_wakes_two_hundred_waiting_clients() {
    const CLIENTS: usize = 200;
    let server = server();
    let addr = server.local_addr().to_string();
    let connected = Arc::new(Barrier::new(CLIENTS + 1));
    let waiters: Vec<_> = (0..CLIENTS)
        .map(|_| {
            let addr = addr.clone();
            let connected = connected.clone();
            thread::Builder::new()
                .stack_size(256 * 1024)
                .spawn(move || {
                    let store =
                        TcpStore::connect(&addr, &options(Duration::from_secs(10))).unwrap();
                    connected.wait();
                    store.get_timeout("go", Duration::from_secs(10))
                })
                .unwrap()
        })
        .collect();
    connected.wait();
    wait_until(|| server.waiting_requests() == CLIENTS);
    client(&server).set("go", b"now").unwrap();
    for waiter in waiters {
        assert_eq!(waiter.join().unwrap().unwrap(), b"now");
    }
    assert_eq!(server.clients_joined(), CLIENTS + 1);
    wait_until(|| server.waiting_requests() == 0);
}

#[test]
fn every_waiter_of_a_queue_gets_one_element() {
    const CLIENTS: usize = 8;
    let server = server();
    let poppers: Vec<_> = (0..CLIENTS)
        .map(|_| {
            let store = client(&server);
            thread::spawn(move || store.queue_pop_timeout("jobs", Duration::from_secs(10)))
        })
        .collect();
    wait_until(|| server.waiting_requests() == CLIENTS);
    let pusher = client(&server);
    for i in 0..CLIENTS {
        pusher.queue_push("jobs", &[i as u8]).unwrap();
    }
    let mut got: Vec<u8> = poppers
        .into_iter()
        .map(|h| h.join().unwrap().unwrap()[0])
        .collect();
    got.sort_unstable();
    assert_eq!(got, (0..CLIENTS as u8).collect::<Vec<_>>());
    assert_eq!(pusher.queue_len("jobs").unwrap(), 0);
}

#[test]
fn connect_retries_until_the_server_is_up() {
    // A free port with nothing listening on it (yet).
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let addr = format!("127.0.0.1:{port}");

    let err = TcpStore::connect(&addr, &options(Duration::from_millis(100))).unwrap_err();
    match &err {
        Error::StoreConnect {
            addr: a,
            timeout,
            reason,
        } => {
            assert_eq!(a, &addr);
            assert_eq!(*timeout, Duration::from_millis(100));
            assert!(reason.contains("refused"), "{reason}");
        }
        other => panic!("expected StoreConnect, got {other}"),
    }

    let connecting = {
        let addr = addr.clone();
        thread::spawn(move || TcpStore::connect(&addr, &options(Duration::from_secs(10))))
    };
    // Not a synchronisation: the test passes whether the client's first
    // attempt comes before or after the bind; this makes "before" likely.
    thread::sleep(Duration::from_millis(50));
    let server = TcpStoreServer::bind(&addr, &options(Duration::from_secs(5))).unwrap();
    let store = connecting.join().unwrap().unwrap();
    store.set("k", b"v").unwrap();
    assert_eq!(server.clients_joined(), 1);
}

/// Rank 0 hosts the server; when it sets a key and leaves at once, a rank
/// still waiting for that key must get the value, not a lost connection.
#[test]
fn a_hosting_store_lingers_until_its_clients_are_done() {
    for round in 0..20 {
        let options = TcpStoreOptions::default();
        let host = TcpStore::host("127.0.0.1:0", 1, &options).unwrap();
        let addr = host.server_addr().to_string();
        let client = TcpStore::connect(&addr, &options).unwrap();
        let waiter = std::thread::spawn(move || {
            let value = client.get_timeout("done", Duration::from_secs(20));
            // connected all along, so the host's server waited for us
            drop(client);
            value
        });
        host.set("done", b"bye").unwrap();
        let start = Instant::now();
        drop(host);
        assert_eq!(waiter.join().unwrap().unwrap(), b"bye", "round {round}");
        assert!(start.elapsed() < Duration::from_secs(10), "round {round}");
    }
}

/// Hosting a store for a world of 0 ranks is refused before binding (the
/// hosting rank is itself one of the world); it used to be accepted.
#[test]
fn hosting_for_a_world_of_zero_is_refused() {
    let err = TcpStore::host("127.0.0.1:0", 0, &options(Duration::from_secs(5)))
        .expect_err("world_size 0 must be refused");
    assert!(matches!(err, Error::BadValue { .. }), "{err:?}");
    assert!(err.to_string().contains("world_size"), "{err}");
    let one = TcpStore::host("127.0.0.1:0", 1, &options(Duration::from_secs(5))).unwrap();
    one.set("k", b"v").unwrap();
}
