//! The TCP full-mesh transport between threads over loopback: setup for
//! several world sizes, exact delivery in both directions, large exchanges
//! without deadlock, failures that name the peer, and stray connections
//! that neither join the mesh nor hold it up.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use tensorcomm::cpu::algorithms::all_reduce_ring;
use tensorcomm::cpu::reduce_kernels::ReduceOp;
use tensorcomm::cpu::transport::{TcpTransport, TcpTransportOptions, Transport};
use tensorcomm::job_token::JobToken;
use tensorcomm::store::{HashStore, Store};
use tensorcomm::tensor::DType;
use tensorcomm::Error;

fn options(timeout: Duration) -> TcpTransportOptions {
    TcpTransportOptions {
        timeout,
        ..TcpTransportOptions::default()
    }
}

/// Sets up a mesh of `world` transports, one per thread.
fn mesh(world: usize) -> Vec<TcpTransport> {
    mesh_with_lanes(world, |_| None)
}

/// [`mesh`] with each rank's own choice of connections per peer.
fn mesh_with_lanes(world: usize, lanes: impl Fn(usize) -> Option<usize>) -> Vec<TcpTransport> {
    let store = Arc::new(HashStore::new());
    let handles: Vec<_> = (0..world)
        .map(|rank| {
            let store = store.clone();
            let options = TcpTransportOptions {
                lanes: lanes(rank),
                ..options(Duration::from_secs(30))
            };
            thread::spawn(move || TcpTransport::connect(&*store, "mesh", rank, world, &options))
        })
        .collect();
    handles
        .into_iter()
        .map(|h| h.join().unwrap().unwrap())
        .collect()
}

fn soon() -> Instant {
    Instant::now() + Duration::from_secs(30)
}

fn message(from: usize, to: usize, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i * 31 + from * 7 + to * 13) as u8)
        .collect()
}

#[test]
fn every_pair_exchanges_exact_bytes_for_world_sizes_1_to_8() {
    for world in [1, 2, 3, 4, 8] {
        let transports = mesh(world);
        thread::scope(|s| {
            for t in &transports {
                s.spawn(move || {
                    let (rank, world) = (t.rank(), t.world_size());
                    for shift in 1..world {
                        let to = (rank + shift) % world;
                        let from = (rank + world - shift) % world;
                        let len = 100 + shift;
                        let mut got = vec![0u8; len];
                        t.send_recv(to, &message(rank, to, len), from, &mut got, soon())
                            .unwrap();
                        assert_eq!(got, message(from, rank, len), "world {world} rank {rank}");
                    }
                    // Plain send then recv, in order.
                    if world > 1 {
                        let next = (rank + 1) % world;
                        let prev = (rank + world - 1) % world;
                        if rank % 2 == 0 {
                            t.send(next, &[rank as u8; 3], soon()).unwrap();
                        }
                        let mut got = [0u8; 3];
                        t.recv(prev, &mut got, soon()).unwrap();
                        if rank % 2 == 1 {
                            t.send(next, &[rank as u8; 3], soon()).unwrap();
                        }
                        assert_eq!(got, [prev as u8; 3]);
                    }
                });
            }
        });
    }
}

#[test]
fn large_exchanges_in_a_pair_and_a_ring_do_not_deadlock() {
    // A pair sending 8 MiB to each other over one connection.
    let pair = mesh(2);
    let len = 8 << 20;
    thread::scope(|s| {
        for t in &pair {
            s.spawn(move || {
                let peer = 1 - t.rank();
                let mut got = vec![0u8; len];
                t.send_recv(peer, &message(t.rank(), peer, len), peer, &mut got, soon())
                    .unwrap();
                assert!(got == message(peer, t.rank(), len));
            });
        }
    });
    // A ring of three passing 3 MiB each way, twice.
    let ring = mesh(3);
    let len = 3 << 20;
    thread::scope(|s| {
        for t in &ring {
            s.spawn(move || {
                let (to, from) = ((t.rank() + 1) % 3, (t.rank() + 2) % 3);
                for _ in 0..2 {
                    let mut got = vec![0u8; len];
                    t.send_recv(to, &message(t.rank(), to, len), from, &mut got, soon())
                        .unwrap();
                    assert!(got == message(from, t.rank(), len));
                }
            });
        }
    });
}

#[test]
fn striped_messages_of_every_size_arrive_exactly_and_in_order() {
    // Three connections per pair: messages from 256 KiB up are cut into
    // stripes moved in parallel; small and odd-sized ones between them
    // must still come out in order on both ends.
    let transports = mesh_with_lanes(3, |_| Some(3));
    let sizes = [5, 262_144, 1_000_003, 17, 3 << 20, 262_143, 0, 600_001];
    thread::scope(|s| {
        for t in &transports {
            s.spawn(move || {
                assert_eq!(t.lanes(), 3);
                let rank = t.rank();
                let (to, from) = ((rank + 1) % 3, (rank + 2) % 3);
                for (k, &len) in sizes.iter().enumerate() {
                    // A ring of send_recv, then plain sends and receives.
                    let mut got = vec![0u8; len];
                    t.send_recv(to, &message(rank, to + k, len), from, &mut got, soon())
                        .unwrap();
                    assert!(got == message(from, rank + k, len), "send_recv of {len}");
                    if rank == 0 {
                        t.send(1, &message(0, k, len), soon()).unwrap();
                    } else if rank == 1 {
                        let mut got = vec![0u8; len];
                        t.recv(0, &mut got, soon()).unwrap();
                        assert!(got == message(0, k, len), "recv of {len}");
                    }
                }
                // Different sizes each way in one call.
                let (out, inp) = if rank == 0 {
                    (2 << 20, 300_000)
                } else {
                    (300_000, 2 << 20)
                };
                if rank < 2 {
                    let peer = 1 - rank;
                    let mut got = vec![0u8; inp];
                    t.send_recv(peer, &message(rank, 9, out), peer, &mut got, soon())
                        .unwrap();
                    assert!(got == message(peer, 9, inp), "uneven send_recv");
                }
            });
        }
    });
}

#[test]
fn striped_exchanges_from_two_threads_at_once_share_the_helpers_without_deadlock() {
    // Rank 0 exchanges with ranks 1 and 2 from two threads at once: one
    // call gets the helper threads, the other moves its stripes one after
    // the other, against peers that move theirs in parallel.
    let transports = mesh_with_lanes(3, |_| Some(4));
    let len = 4 << 20;
    thread::scope(|s| {
        let t0 = &transports[0];
        for peer in [1, 2] {
            s.spawn(move || {
                for round in 0..3 {
                    let mut got = vec![0u8; len];
                    t0.send_recv(peer, &message(0, peer + round, len), peer, &mut got, soon())
                        .unwrap();
                    assert!(got == message(peer, round, len), "rank 0 from {peer}");
                }
            });
        }
        for t in &transports[1..] {
            s.spawn(move || {
                for round in 0..3 {
                    let mut got = vec![0u8; len];
                    t.send_recv(0, &message(t.rank(), round, len), 0, &mut got, soon())
                        .unwrap();
                    assert!(got == message(0, t.rank() + round, len));
                }
            });
        }
    });
}

#[test]
fn rank_0_decides_the_connections_per_peer_and_bad_counts_are_refused() {
    let transports = mesh_with_lanes(3, |rank| Some([2, 4, 1][rank]));
    assert!(transports.iter().all(|t| t.lanes() == 2));
    let store = HashStore::new();
    let bad = TcpTransportOptions {
        lanes: Some(0),
        ..options(Duration::from_secs(5))
    };
    match TcpTransport::connect(&store, "bad", 0, 2, &bad) {
        Err(Error::BadValue {
            name,
            expected,
            found,
        }) => {
            assert!(name.contains("lanes"), "{name}");
            assert!(expected.contains("from 1 to"), "{expected}");
            assert_eq!(found, "0");
        }
        other => panic!("expected BadValue for 0 lanes, got {other:?}"),
    }
}

#[test]
fn a_peer_leaving_mid_striped_transfer_fails_the_receiver_promptly_naming_it() {
    let mut transports = mesh_with_lanes(2, |_| Some(3));
    let gone = transports.remove(1);
    let started = Instant::now();
    let outcome = thread::scope(|s| {
        s.spawn(move || {
            // Half of a 2 MiB message, then the peer is gone.
            gone.send(0, &message(1, 0, 1 << 20), soon()).unwrap();
            drop(gone);
        });
        let mut buf = vec![0u8; 2 << 20];
        transports[0].recv(1, &mut buf, soon())
    });
    match outcome {
        Err(Error::PeerClosed {
            peer: 1, during, ..
        }) => {
            assert!(during.contains("receiving (stripe"), "{during}")
        }
        other => panic!("expected PeerClosed naming rank 1, got {other:?}"),
    }
    assert!(started.elapsed() < Duration::from_secs(10));
}

#[test]
fn a_peer_closing_its_connection_fails_the_receiver_promptly_naming_it() {
    let mut transports = mesh(3);
    let gone = transports.remove(2);
    drop(gone);
    let started = Instant::now();
    let mut buf = [0u8; 16];
    match transports[0].recv(2, &mut buf, soon()) {
        Err(Error::PeerClosed {
            peer,
            during,
            reason,
        }) => {
            assert_eq!(peer, 2);
            assert!(during.contains("receiving"), "{during}");
            assert!(reason.contains("TCP connection"), "{reason}");
        }
        other => panic!("expected PeerClosed naming rank 2, got {other:?}"),
    }
    assert!(started.elapsed() < Duration::from_secs(5));
    // Sending to the closed peer fails too (perhaps after the first write
    // lands in the socket buffer), naming it.
    let err = (0..64)
        .find_map(|_| transports[1].send(2, &[0u8; 65536], soon()).err())
        .expect("sending to a closed peer must fail");
    assert!(
        matches!(
            err,
            Error::PeerClosed { peer: 2, .. } | Error::PeerIo { peer: 2, .. }
        ),
        "{err:?}"
    );
    // The connection between the survivors still works.
    thread::scope(|s| {
        s.spawn(|| transports[1].send(0, b"ok", soon()).unwrap());
        let mut got = [0u8; 2];
        transports[0].recv(1, &mut got, soon()).unwrap();
        assert_eq!(&got, b"ok");
    });
}

#[test]
fn a_silent_peer_times_out_naming_it() {
    let transports = mesh(2);
    let mut buf = [0u8; 4];
    let started = Instant::now();
    match transports[1].recv(0, &mut buf, Instant::now() + Duration::from_millis(150)) {
        Err(Error::PeerTimeout {
            peer: 0, during, ..
        }) => {
            assert!(during.contains("0 of 4 bytes"), "{during}")
        }
        other => panic!("expected PeerTimeout naming rank 0, got {other:?}"),
    }
    assert!(started.elapsed() >= Duration::from_millis(150));
    assert!(started.elapsed() < Duration::from_secs(5));
}

#[test]
fn setup_names_a_rank_that_never_arrives() {
    let store = HashStore::new();
    let err = TcpTransport::connect(&store, "lonely", 0, 3, &options(Duration::from_millis(200)))
        .unwrap_err();
    match err {
        Error::PeerTimeout { peer, during, .. } => {
            assert_eq!(peer, 1);
            assert!(during.contains("[1, 2]"), "{during}");
        }
        other => panic!("{other:?}"),
    }
    // A higher rank waiting for a lower rank's address gets a store timeout.
    let err = TcpTransport::connect(
        &store,
        "lonely2",
        1,
        2,
        &options(Duration::from_millis(100)),
    )
    .unwrap_err();
    assert!(matches!(err, Error::StoreTimeout { .. }), "{err:?}");
}

#[test]
fn a_stray_connection_is_refused_and_named_if_the_real_peer_never_comes() {
    let store = Arc::new(HashStore::new());
    let rank0 = {
        let store = store.clone();
        thread::spawn(move || {
            TcpTransport::connect(&*store, "stray", 0, 2, &options(Duration::from_millis(500)))
        })
    };
    let addr = String::from_utf8(store.get("stray/addr/0").unwrap()).unwrap();
    let mut stream = TcpStream::connect(addr).unwrap();
    stream
        .write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        .unwrap();
    match rank0.join().unwrap() {
        Err(Error::PeerTimeout { peer, during, .. }) => {
            assert_eq!(peer, 1);
            assert!(during.contains("refused 1 connection"), "{during}");
            assert!(during.contains("71, 69, 84"), "{during}"); // "GET"
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_silent_stray_is_named_if_the_real_peer_never_comes() {
    let store = Arc::new(HashStore::new());
    let rank0 = {
        let store = store.clone();
        thread::spawn(move || {
            TcpTransport::connect(
                &*store,
                "silent",
                0,
                2,
                &options(Duration::from_millis(500)),
            )
        })
    };
    let addr = String::from_utf8(store.get("silent/addr/0").unwrap()).unwrap();
    // One that sends nothing, one refused for its garbage.
    let mut silent = TcpStream::connect(&addr).unwrap();
    let mut garbage = TcpStream::connect(&addr).unwrap();
    garbage
        .write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        .unwrap();
    match rank0.join().unwrap() {
        Err(Error::PeerTimeout { peer, during, .. }) => {
            assert_eq!(peer, 1);
            assert!(during.contains("refused 1 connection"), "{during}");
            assert!(
                during.contains("and 1 connection(s) still sending no hello"),
                "{during}"
            );
        }
        other => panic!("{other:?}"),
    }
    // Set-up over: closed, not left open until its own hello wait ends.
    assert!(closed_soon(&mut silent), "the silent stray was left open");
}

/// How long an accepting rank waits for one connection's hello before it
/// drops it (`HELLO_WAIT` in the transport's set-up). When hellos were
/// read one after the other, every silent stray ahead of the real peers
/// added this much to their set-up.
const HELLO_WAIT: Duration = Duration::from_secs(10);

/// How long a hello may be pending before it is cut short to make room,
/// once the accepting rank reads as many as it reads at once (64;
/// `STALE_AFTER` and `MAX_PENDING_HELLOS` in the transport's set-up).
const STALE_AFTER: Duration = Duration::from_secs(1);

/// Starts rank 0 of a `world`-rank mesh under `prefix` on a thread and
/// returns it with the address its listener published.
fn rank_0_listening(
    store: &Arc<HashStore>,
    prefix: &str,
    world: usize,
) -> (thread::JoinHandle<tensorcomm::Result<TcpTransport>>, String) {
    let rank0 = {
        let (store, prefix) = (store.clone(), prefix.to_string());
        thread::spawn(move || {
            TcpTransport::connect(
                &*store,
                &prefix,
                0,
                world,
                &options(Duration::from_secs(120)),
            )
        })
    };
    let addr = String::from_utf8(store.get(&format!("{prefix}/addr/0")).unwrap()).unwrap();
    (rank0, addr)
}

/// Connects ranks 1.. of the mesh rank 0 started, each on a thread, and
/// returns the whole mesh once every rank is set up.
fn the_other_ranks_join(
    store: &Arc<HashStore>,
    prefix: &str,
    world: usize,
    rank0: thread::JoinHandle<tensorcomm::Result<TcpTransport>>,
) -> Vec<TcpTransport> {
    let others: Vec<_> = (1..world)
        .map(|rank| {
            let (store, prefix) = (store.clone(), prefix.to_string());
            thread::spawn(move || {
                let options = options(Duration::from_secs(120));
                TcpTransport::connect(&*store, &prefix, rank, world, &options)
            })
        })
        .collect();
    std::iter::once(rank0)
        .chain(others)
        .map(|h| h.join().unwrap().expect("a real rank's set-up"))
        .collect()
}

/// Whether the client end of a stray sees its connection closed within 5 s
/// (rather than left open until its hello wait runs out).
fn closed_soon(stray: &mut TcpStream) -> bool {
    stray
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    let mut buf = [0u8; 256];
    loop {
        match stray.read(&mut buf) {
            Ok(0) => return true,
            // A refusal's answer, if any, precedes the close.
            Ok(_) => continue,
            Err(e) => {
                return matches!(
                    e.kind(),
                    std::io::ErrorKind::ConnectionReset | std::io::ErrorKind::BrokenPipe
                )
            }
        }
    }
}

/// Ring all-reduces (sum) each rank's `[rank + 1; 1000]` over the mesh and
/// checks every rank got `world (world + 1) / 2` everywhere.
fn all_reduce_sums_right(mesh: &[TcpTransport]) {
    let world = mesh.len();
    let want = (world * (world + 1) / 2) as f32;
    thread::scope(|s| {
        for t in mesh {
            s.spawn(move || {
                let mine = vec![(t.rank() + 1) as f32; 1000];
                let mut buf: Vec<u8> = mine.iter().flat_map(|x| x.to_le_bytes()).collect();
                all_reduce_ring(t, &mut buf, DType::F32, ReduceOp::Sum, soon()).unwrap();
                let got: Vec<f32> = buf
                    .chunks_exact(4)
                    .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                    .collect();
                assert!(got.iter().all(|&x| x == want), "rank {}: {got:?}", t.rank());
            });
        }
    });
}

#[test]
fn silent_and_garbage_connections_ahead_of_the_real_peers_do_not_delay_them() {
    let store = Arc::new(HashStore::new());
    let world = 3;
    let (rank0, addr) = rank_0_listening(&store, "early", world);
    // Ahead of the real peers: four connections that send nothing, one
    // that trickles a hello-looking head and zeros a byte every 100 ms,
    // and one that sends an HTTP request at once.
    let mut silent: Vec<TcpStream> = (0..4).map(|_| TcpStream::connect(&addr).unwrap()).collect();
    let stop = Arc::new(AtomicBool::new(false));
    let trickler = {
        let (mut stream, stop) = (TcpStream::connect(&addr).unwrap(), stop.clone());
        thread::spawn(move || {
            let mut junk = [0u8; 64];
            junk[..4].copy_from_slice(b"TCMH");
            junk[4] = 2;
            for byte in junk {
                if stop.load(Ordering::Relaxed) || stream.write_all(&[byte]).is_err() {
                    break;
                }
                thread::sleep(Duration::from_millis(100));
            }
        })
    };
    let mut garbage = TcpStream::connect(&addr).unwrap();
    garbage
        .write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        .unwrap();

    let started = Instant::now();
    let mesh = the_other_ranks_join(&store, "early", world, rank0);
    let took = started.elapsed();
    // Read one after the other, the silent four alone held set-up 4 x 10 s.
    assert!(
        took < HELLO_WAIT / 2,
        "set-up took {took:?} behind 6 stray connections"
    );
    all_reduce_sums_right(&mesh);
    // Once set-up is done, the strays still waiting are closed, not left
    // open until their own hello wait ends; the garbage was refused.
    for stray in silent.iter_mut().chain([&mut garbage]) {
        assert!(closed_soon(stray), "a stray connection was left open");
    }
    stop.store(true, Ordering::Relaxed);
    trickler.join().unwrap();
}

#[test]
fn a_flood_of_silent_connections_is_cut_short_and_the_mesh_still_forms() {
    let store = Arc::new(HashStore::new());
    let (rank0, addr) = rank_0_listening(&store, "flood", 2);
    // More silent connections than rank 0 reads hellos from at once (64):
    // it stops accepting, then closes those pending over a second.
    let started = Instant::now();
    let mut silent: Vec<TcpStream> = (0..80)
        .map(|_| TcpStream::connect(&addr).unwrap())
        .collect();
    let mesh = the_other_ranks_join(&store, "flood", 2, rank0);
    let took = started.elapsed();
    // The real peer queued behind 64 pending hellos: it got in only once
    // they were cut short, all accepted after `started`, at STALE_AFTER
    // at the soonest. Without the cap it would get in at once.
    assert!(
        took >= STALE_AFTER,
        "set-up took {took:?}: the cap of 64 pending hellos did not hold"
    );
    // About a second; were silent ones only dropped at their own hello
    // wait, at least HELLO_WAIT.
    assert!(
        took < HELLO_WAIT * 4 / 5,
        "set-up took {took:?} behind 80 silent connections"
    );
    all_reduce_sums_right(&mesh);
    for stray in &mut silent {
        assert!(closed_soon(stray), "a silent connection was left open");
    }
}

fn with_token(token: Option<&str>, timeout: Duration) -> TcpTransportOptions {
    TcpTransportOptions {
        token: token.map(JobToken::new),
        ..options(timeout)
    }
}

#[test]
fn a_peer_without_the_jobs_token_is_refused_and_the_mesh_still_forms() {
    let store = Arc::new(HashStore::new());
    let rank0 = {
        let store = store.clone();
        thread::spawn(move || {
            let options = with_token(Some("right"), Duration::from_secs(20));
            TcpTransport::connect(&*store, "job", 0, 2, &options)
        })
    };
    // Another job's rank 1 (no token, then another token) is told why.
    for (token, why) in [(None, "presented none"), (Some("wrong"), "different one")] {
        let options = with_token(token, Duration::from_secs(5));
        match TcpTransport::connect(&*store, "job", 1, 2, &options) {
            Err(Error::PeerRefused { peer, reason, .. }) => {
                assert_eq!(peer, 0);
                assert!(reason.contains(why), "{reason}");
                assert!(reason.contains("TENSORCOMM_STORE_TOKEN"), "{reason}");
            }
            Err(other) => panic!("expected PeerRefused, got {other:?}"),
            Ok(_) => panic!("a rank with token {token:?} joined the mesh"),
        }
    }
    // The real rank 1 still joins, and bytes flow.
    let options = with_token(Some("right"), Duration::from_secs(20));
    let rank1 = TcpTransport::connect(&*store, "job", 1, 2, &options).expect("rank 1");
    let rank0 = rank0.join().unwrap().expect("rank 0");
    rank1.send(0, b"ping", soon()).unwrap();
    let mut buf = [0u8; 4];
    rank0.recv(1, &mut buf, soon()).unwrap();
    assert_eq!(&buf, b"ping");
}

#[test]
fn a_token_on_one_side_only_refuses_the_connection() {
    let store = Arc::new(HashStore::new());
    let rank0 = {
        let store = store.clone();
        thread::spawn(move || {
            let options = with_token(None, Duration::from_millis(500));
            TcpTransport::connect(&*store, "half", 0, 2, &options)
        })
    };
    let options = with_token(Some("mine"), Duration::from_secs(5));
    match TcpTransport::connect(&*store, "half", 1, 2, &options) {
        Err(Error::PeerRefused { reason, .. }) => {
            assert!(reason.contains("one side only"), "{reason}")
        }
        other => panic!("expected PeerRefused, got {:?}", other.err()),
    }
    match rank0.join().unwrap() {
        Err(Error::PeerTimeout { during, .. }) => {
            assert!(during.contains("claiming rank 1"), "{during}");
        }
        other => panic!("expected PeerTimeout, got {:?}", other.err()),
    }
}

#[test]
fn the_listener_binds_the_advertised_address_only() {
    // 192.0.2.0/24 (TEST-NET-1) is never this host's: binding it fails
    // rather than falling back to every interface.
    let store = HashStore::new();
    let options = TcpTransportOptions {
        advertise_host: "192.0.2.1".into(),
        bind_all: Some(false),
        ..options(Duration::from_secs(5))
    };
    match TcpTransport::connect(&store, "far", 0, 2, &options) {
        Err(Error::ListenAddress { addr, reason, .. }) => {
            assert_eq!(addr, "192.0.2.1:0");
            assert!(reason.contains("192.0.2.1"), "{reason}");
            assert!(reason.contains("TENSORCOMM_BIND_ALL=1"), "{reason}");
        }
        other => panic!("expected ListenAddress, got {:?}", other.err()),
    }
}

#[test]
fn bad_peer_ranks_are_refused_before_any_io() {
    let transports = mesh(2);
    let t = &transports[0];
    assert!(matches!(
        t.send(0, b"x", soon()),
        Err(Error::InvalidArgument(_))
    ));
    assert!(matches!(
        t.recv(5, &mut [0], soon()),
        Err(Error::InvalidArgument(_))
    ));
    assert!(matches!(
        t.send_recv(1, b"x", 2, &mut [0], soon()),
        Err(Error::InvalidArgument(_))
    ));
}

#[test]
fn abort_fails_a_peer_blocked_on_this_rank_at_once() {
    let transports = mesh(2);
    thread::scope(|s| {
        let blocked = s.spawn(|| {
            let mut buf = [0u8; 8];
            transports[1].recv(0, &mut buf, soon())
        });
        // The receiver is blocked (or about to be): abort wakes it either way.
        transports[0].abort();
        let started = Instant::now();
        let err = blocked.join().unwrap().unwrap_err();
        assert!(matches!(err, Error::PeerClosed { peer: 0, .. }), "{err:?}");
        assert!(started.elapsed() < Duration::from_secs(5));
    });
    assert!(transports[0].send(1, b"x", soon()).is_err());
}

/// A rank whose transport was aborted must not blame the peer: a write
/// after a local shutdown fails with a broken pipe and a read ends, just
/// as when the peer left, and a report naming the peer would send every
/// rank after the wrong one. The peers still name it.
#[test]
fn a_rank_whose_own_side_was_shut_down_says_so_and_its_peer_names_it() {
    let transports = mesh(3);
    transports[0].abort();
    // Data sent to an aborted socket resets its connection, as a dead
    // peer's would: the abort still counts as this rank's.
    let _ = transports[1].send(0, b"late", soon());
    thread::sleep(Duration::from_millis(50));
    let mut buf = [0u8; 8];
    for peer in [1, 2] {
        match transports[0].send(peer, b"x", soon()) {
            Err(Error::LinkShutDownHere { peer: p, during }) => {
                assert_eq!(p, peer);
                assert!(during.contains("sending"), "{during}");
            }
            other => panic!("expected LinkShutDownHere naming rank {peer}, got {other:?}"),
        }
        match transports[0].recv(peer, &mut buf, soon()) {
            Err(Error::LinkShutDownHere { peer: p, .. }) => assert_eq!(p, peer),
            other => panic!("expected LinkShutDownHere naming rank {peer}, got {other:?}"),
        }
    }
    for rank in [1, 2] {
        match transports[rank].recv(0, &mut buf, soon()) {
            Err(Error::PeerClosed { peer: 0, .. } | Error::PeerIo { peer: 0, .. }) => {}
            other => panic!("rank {rank}: expected PeerClosed naming rank 0, got {other:?}"),
        }
    }
    // The survivors' own connection is untouched.
    thread::scope(|s| {
        s.spawn(|| transports[1].send(2, b"ok", soon()).unwrap());
        let mut got = [0u8; 2];
        transports[2].recv(1, &mut got, soon()).unwrap();
        assert_eq!(&got, b"ok");
    });
}
