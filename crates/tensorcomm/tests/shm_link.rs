//! ShmLink behaviour: streaming through the rings, ping-pong, non-blocking
//! calls, deadlines, a peer that drops its link or whose process dies, and
//! two real processes (this test binary re-executed as the child).
#![cfg(target_os = "linux")]

use std::process::{Command, ExitStatus};
use std::sync::{mpsc, Arc};
use std::thread;
use std::time::{Duration, Instant};

use tensorcomm::cpu::transport::shm::{ShmLink, DEFAULT_CAPACITY};
use tensorcomm::store::{FileStore, HashStore, Store};
use tensorcomm::Error;

mod rng;
use rng::Rng;

const LONG: Duration = Duration::from_secs(60);

fn after(d: Duration) -> Instant {
    Instant::now() + d
}

/// Connects ranks 0 and 1 through a HashStore, from two threads.
fn pair(prefix: &str, capacity: usize) -> (ShmLink, ShmLink) {
    let store = Arc::new(HashStore::new());
    let s = store.clone();
    let p = prefix.to_string();
    let one = thread::spawn(move || ShmLink::connect(&*s, &p, 1, 0, capacity, LONG));
    let zero = ShmLink::connect(&*store, prefix, 0, 1, capacity, LONG).expect("rank 0 connects");
    let one = one.join().unwrap().expect("rank 1 connects");
    (zero, one)
}

/// FNV-1a over the bytes.
fn checksum(data: &[u8]) -> u64 {
    data.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ b as u64).wrapping_mul(0x100_0000_01b3)
    })
}

/// Sends `data` in pieces of random sizes (up to `max_piece`).
fn send_in_pieces(link: &ShmLink, data: &[u8], seed: u64, max_piece: usize) {
    let mut rng = Rng(seed);
    let mut at = 0;
    while at < data.len() {
        let end = (at + 1 + rng.below(max_piece)).min(data.len());
        link.send(&data[at..end], after(LONG)).expect("send");
        at = end;
    }
}

/// Receives `len` bytes in pieces of random sizes (up to `max_piece`).
fn recv_in_pieces(link: &ShmLink, len: usize, seed: u64, max_piece: usize) -> Vec<u8> {
    let mut rng = Rng(seed);
    let mut out = vec![0u8; len];
    let mut at = 0;
    while at < len {
        let end = (at + 1 + rng.below(max_piece)).min(len);
        link.recv(&mut out[at..end], after(LONG)).expect("recv");
        at = end;
    }
    out
}

#[test]
fn random_sizes_wrap_around_both_ways_at_once_with_checksums() {
    // 1000 bytes per ring: not a power of two, and smaller than many pieces.
    let (a, b) = pair("wrap", 1000);
    let (a, b) = (Arc::new(a), Arc::new(b));
    let len = 2_000_003;
    let a_data = Rng(1).bytes(len);
    let b_data = Rng(2).bytes(len);
    let (a_expected, b_expected) = (checksum(&a_data), checksum(&b_data));

    let senders = [(a.clone(), a_data, 10), (b.clone(), b_data, 20)]
        .map(|(link, data, seed)| thread::spawn(move || send_in_pieces(&link, &data, seed, 3000)));
    let b_recv = {
        let b = b.clone();
        thread::spawn(move || recv_in_pieces(&b, len, 30, 2500))
    };
    let got_at_a = recv_in_pieces(&a, len, 40, 2500);
    let got_at_b = b_recv.join().unwrap();
    for s in senders {
        s.join().unwrap();
    }
    assert_eq!(checksum(&got_at_b), a_expected);
    assert_eq!(checksum(&got_at_a), b_expected);
    assert_eq!(got_at_b, Rng(1).bytes(len));
}

#[test]
fn a_message_larger_than_the_ring_streams_through() {
    let (a, b) = pair("large", 4096);
    let data = Rng(3).bytes((1 << 20) + 17);
    let sent = data.clone();
    let sender = thread::spawn(move || a.send(&sent, after(LONG)).map(|()| a));
    let mut got = vec![0u8; data.len()];
    b.recv(&mut got, after(LONG)).unwrap();
    sender.join().unwrap().unwrap();
    assert_eq!(checksum(&got), checksum(&data));
    assert!(got == data);
}

#[test]
fn ping_pong_of_many_small_messages() {
    let (a, b) = pair("pingpong", 4096);
    const ROUNDS: u64 = 20_000;
    let echo = thread::spawn(move || {
        let mut buf = [0u8; 8];
        for _ in 0..ROUNDS {
            b.recv(&mut buf, after(LONG)).unwrap();
            let v = u64::from_le_bytes(buf) + 1;
            b.send(&v.to_le_bytes(), after(LONG)).unwrap();
        }
    });
    let mut buf = [0u8; 8];
    for i in 0..ROUNDS {
        a.send(&(i * 2).to_le_bytes(), after(LONG)).unwrap();
        a.recv(&mut buf, after(LONG)).unwrap();
        assert_eq!(u64::from_le_bytes(buf), i * 2 + 1);
    }
    echo.join().unwrap();
}

#[test]
fn try_calls_move_what_they_can_and_never_block() {
    let (a, b) = pair("try", 100);
    let mut buf = [0u8; 64];
    assert_eq!(b.try_recv_some(&mut buf).unwrap(), 0);
    assert_eq!(a.try_send_some(&[]).unwrap(), 0);
    assert_eq!(b.try_recv_some(&mut []).unwrap(), 0);
    let data: Vec<u8> = (0..150).collect();
    assert_eq!(a.try_send_some(&data).unwrap(), 100);
    assert_eq!(a.try_send_some(&data[100..]).unwrap(), 0); // full
    assert_eq!(b.try_recv_some(&mut buf).unwrap(), 64);
    assert_eq!(&buf[..], &data[..64]);
    assert_eq!(a.try_send_some(&data[100..]).unwrap(), 50); // 64 freed, 50 left
    let mut rest = vec![0u8; 200];
    assert_eq!(b.try_recv_some(&mut rest).unwrap(), 86);
    assert_eq!(&rest[..86], &data[64..]);
    assert_eq!(b.try_recv_some(&mut rest).unwrap(), 0);
    // The other direction is independent.
    assert_eq!(b.try_send_some(b"back").unwrap(), 4);
    assert_eq!(a.try_recv_some(&mut buf).unwrap(), 4);
    assert_eq!(&buf[..4], b"back");
}

#[test]
fn a_dropped_peer_fails_a_blocked_recv_promptly() {
    let (a, b) = pair("drop-recv", 4096);
    let (tx, rx) = mpsc::channel();
    let dropper = thread::spawn(move || {
        thread::sleep(Duration::from_millis(100));
        drop(b);
        tx.send(Instant::now()).unwrap();
    });
    let mut buf = [0u8; 8];
    let err = a.recv(&mut buf, after(LONG)).unwrap_err();
    let noticed = Instant::now();
    dropper.join().unwrap();
    let lag = noticed.saturating_duration_since(rx.recv().unwrap());
    match &err {
        Error::PeerClosed {
            peer,
            during,
            reason,
        } => {
            assert_eq!(*peer, 1);
            assert!(during.contains("receiving 8 bytes"), "{during}");
            assert!(reason.contains("closed"), "{reason}");
        }
        other => panic!("expected PeerClosed, found {other:?}"),
    }
    assert!(err.to_string().contains("peer rank 1"), "{err}");
    assert!(
        lag < Duration::from_millis(100),
        "noticed {lag:?} after the drop"
    );
    assert!(!a.peer_alive());
}

#[test]
fn a_dropped_peer_fails_a_blocked_send_and_later_calls() {
    let (a, b) = pair("drop-send", 4096);
    let dropper = thread::spawn(move || {
        thread::sleep(Duration::from_millis(100));
        drop(b);
    });
    let started = Instant::now();
    let err = a.send(&vec![1u8; 10_000], after(LONG)).unwrap_err();
    dropper.join().unwrap();
    assert!(started.elapsed() < Duration::from_secs(5));
    assert!(
        matches!(&err, Error::PeerClosed { peer: 1, during, .. } if during.contains("sending 10000 bytes to it (4096 sent)")),
        "{err:?}"
    );
    assert!(matches!(
        a.send(b"x", after(LONG)),
        Err(Error::PeerClosed { .. })
    ));
    assert!(matches!(
        a.try_send_some(b"x"),
        Err(Error::PeerClosed { .. })
    ));
}

#[test]
fn bytes_sent_before_a_drop_are_still_delivered() {
    let (a, b) = pair("drain", 4096);
    b.send(&[9u8; 100], after(LONG)).unwrap();
    drop(b);
    let mut buf = [0u8; 60];
    a.recv(&mut buf, after(LONG)).unwrap();
    assert_eq!(a.try_recv_some(&mut buf).unwrap(), 40);
    assert_eq!(buf[..40], [9u8; 40]);
    assert!(matches!(
        a.try_recv_some(&mut buf),
        Err(Error::PeerClosed { peer: 1, .. })
    ));
    assert!(matches!(
        a.recv(&mut buf, after(LONG)),
        Err(Error::PeerClosed { peer: 1, .. })
    ));
}

#[test]
fn a_deadline_gives_a_timeout_naming_the_peer_and_the_wait() {
    let (a, b) = pair("deadline", 4096);
    let mut buf = [0u8; 8];
    let started = Instant::now();
    let err = b
        .recv(&mut buf, after(Duration::from_millis(50)))
        .unwrap_err();
    let took = started.elapsed();
    match &err {
        Error::PeerTimeout {
            peer,
            during,
            timeout: waited,
        } => {
            assert_eq!(*peer, 0);
            assert!(
                during.contains("rank 1 was receiving 8 bytes from it (0 received)"),
                "{during}"
            );
            assert!(*waited >= Duration::from_millis(50), "{waited:?}");
        }
        other => panic!("expected PeerTimeout, found {other:?}"),
    }
    assert!(err.to_string().contains("peer rank 0"), "{err}");
    assert!(took < Duration::from_secs(2), "{took:?}");

    // A send into a full ring times out too, saying how far it got.
    let err = a
        .send(&[0u8; 5000], after(Duration::from_millis(50)))
        .unwrap_err();
    assert!(
        matches!(&err, Error::PeerTimeout { peer: 1, during, .. } if during.contains("(4096 sent)")),
        "{err:?}"
    );
    // Both sides are still usable afterwards.
    b.recv(&mut buf, after(LONG)).unwrap();
    assert!(a.peer_alive() && b.peer_alive());
}

/// Segment names of this process for ranks `lo`-`hi` in /dev/shm.
fn leftover_segments(lo: usize, hi: usize) -> Vec<String> {
    let prefix = format!("tcshm.{}.", std::process::id());
    let suffix = format!(".{lo}-{hi}");
    std::fs::read_dir("/dev/shm")
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|n| n.starts_with(&prefix) && n.ends_with(&suffix))
        .collect()
}

#[test]
fn nothing_is_left_in_dev_shm_once_connected() {
    let store = Arc::new(HashStore::new());
    let s = store.clone();
    let hi = thread::spawn(move || ShmLink::connect(&*s, "leak", 7002, 7001, 4096, LONG));
    let lo = ShmLink::connect(&*store, "leak", 7001, 7002, 4096, LONG).unwrap();
    let hi = hi.join().unwrap().unwrap();
    assert_eq!(leftover_segments(7001, 7002), Vec::<String>::new());
    assert!(
        !store.check(&["leak/shm/7001-7002"]).unwrap(),
        "the key is deleted"
    );
    assert_eq!((lo.peer_rank(), hi.peer_rank()), (7002, 7001));
    assert!(lo.peer_alive() && hi.peer_alive());
    // The same prefix can connect the pair again.
    let s = store.clone();
    let hi2 = thread::spawn(move || ShmLink::connect(&*s, "leak", 7002, 7001, 4096, LONG));
    let lo2 = ShmLink::connect(&*store, "leak", 7001, 7002, 4096, LONG).unwrap();
    let hi2 = hi2.join().unwrap().unwrap();
    lo2.send(b"again", after(LONG)).unwrap();
    let mut buf = [0u8; 5];
    hi2.recv(&mut buf, after(LONG)).unwrap();
    assert_eq!(&buf, b"again");
    drop(hi);
    assert!(!lo.peer_alive());
}

#[test]
fn connect_without_a_peer_times_out_and_leaves_nothing() {
    let store = HashStore::new();
    let started = Instant::now();
    let err = ShmLink::connect(
        &store,
        "alone",
        7101,
        7102,
        4096,
        Duration::from_millis(100),
    )
    .unwrap_err();
    assert!(
        matches!(&err, Error::PeerTimeout { peer: 7102, during, .. } if during.contains("waiting for rank 7102 to map")),
        "{err:?}"
    );
    assert!(started.elapsed() < Duration::from_secs(5));
    assert_eq!(leftover_segments(7101, 7102), Vec::<String>::new());

    let err = ShmLink::connect(
        &store,
        "alone2",
        7202,
        7201,
        4096,
        Duration::from_millis(100),
    )
    .unwrap_err();
    assert!(
        matches!(&err, Error::StoreTimeout { keys, .. } if keys == &["alone2/shm/7201-7202"]),
        "{err:?}"
    );
}

// ---- two processes ---------------------------------------------------

/// Set in the child: what it should do ("stream" or "crash").
const CHILD_ROLE: &str = "TENSORCOMM_SHM_TEST_CHILD_ROLE";
/// Set in the child: the FileStore both processes share.
const CHILD_STORE: &str = "TENSORCOMM_SHM_TEST_CHILD_STORE";
const STREAM_BYTES: usize = 64 << 20;

fn spawn_child(role: &str, store: &std::path::Path) -> std::process::Child {
    Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "child_process_entry",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD_ROLE, role)
        .env(CHILD_STORE, store)
        .spawn()
        .expect("spawn the child test process")
}

/// The child's side of the two-process tests when CHILD_ROLE is set; run
/// without it (as in a normal `cargo test`) it checks a small round trip
/// in this process.
#[test]
fn child_process_entry() {
    let Ok(role) = std::env::var(CHILD_ROLE) else {
        let (a, b) = pair("child-entry-sanity", 4096);
        let data = Rng(5).bytes(10_000);
        let sent = data.clone();
        let t = thread::spawn(move || a.send(&sent, after(LONG)));
        let mut got = vec![0u8; data.len()];
        b.recv(&mut got, after(LONG)).unwrap();
        t.join().unwrap().unwrap();
        assert_eq!(got, data);
        return;
    };
    let path = std::env::var(CHILD_STORE).expect("store path");
    let store = FileStore::open(&path).unwrap();
    let link = ShmLink::connect(&store, &role, 1, 0, DEFAULT_CAPACITY, LONG).unwrap();
    match role.as_str() {
        "stream" => {
            let data = Rng(64).bytes(STREAM_BYTES);
            send_in_pieces(&link, &data, 65, 3 << 20);
            link.send(&checksum(&data).to_le_bytes(), after(LONG))
                .unwrap();
            let mut ack = [0u8; 8];
            link.recv(&mut ack, after(LONG)).unwrap();
            assert_eq!(
                u64::from_le_bytes(ack),
                checksum(&data),
                "parent's checksum"
            );
        }
        "crash" => {
            link.send(&[1u8; 1 << 20], after(LONG)).unwrap();
            // Let the parent block in recv, then exit mid-transfer: no
            // destructor runs, the link is never marked closed.
            thread::sleep(Duration::from_millis(200));
            std::process::exit(3);
        }
        other => panic!("unknown child role {other:?}"),
    }
}

fn wait_child(mut child: std::process::Child) -> ExitStatus {
    child.wait().expect("wait for the child")
}

#[test]
fn two_processes_stream_64_mib_with_a_checksum() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store");
    let store = FileStore::open(&path).unwrap();
    let child = spawn_child("stream", &path);
    let link = ShmLink::connect(&store, "stream", 0, 1, DEFAULT_CAPACITY, LONG).unwrap();
    let expected = Rng(64).bytes(STREAM_BYTES);
    let got = recv_in_pieces(&link, STREAM_BYTES, 66, 5 << 20);
    let mut theirs = [0u8; 8];
    link.recv(&mut theirs, after(LONG)).unwrap();
    let mine = checksum(&got);
    assert_eq!(u64::from_le_bytes(theirs), mine, "child's checksum");
    assert_eq!(mine, checksum(&expected));
    assert!(got == expected, "the bytes differ");
    link.send(&mine.to_le_bytes(), after(LONG)).unwrap();
    let status = wait_child(child);
    assert!(status.success(), "child failed: {status}");
}

/// Blocks until `pid` has exited, leaving it unreaped (a zombie), and
/// returns when that was seen.
fn exit_seen_at(pid: u32) -> Instant {
    // SAFETY: an all-zero siginfo_t is a valid out-parameter.
    let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
    // SAFETY: waitid on our own child with a valid out-pointer; WNOWAIT
    // leaves the child waitable for `Child::wait` later.
    let rc = unsafe {
        libc::waitid(
            libc::P_PID,
            pid as libc::id_t,
            &mut info,
            libc::WEXITED | libc::WNOWAIT,
        )
    };
    assert_eq!(rc, 0, "waitid: {}", std::io::Error::last_os_error());
    Instant::now()
}

#[test]
fn a_child_that_exits_mid_transfer_fails_the_parent_promptly() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store");
    let store = FileStore::open(&path).unwrap();
    let child = spawn_child("crash", &path);
    let pid = child.id();
    let exited = thread::spawn(move || exit_seen_at(pid));
    let link = ShmLink::connect(&store, "crash", 0, 1, DEFAULT_CAPACITY, LONG).unwrap();
    let mut buf = vec![0u8; 64 << 20];
    link.recv(&mut buf[..1 << 20], after(LONG)).unwrap();
    assert!(buf[..1 << 20].iter().all(|&b| b == 1));
    // Blocks until the child exits (it stays an unreaped zombie meanwhile,
    // which `kill(pid, 0)` would still call alive).
    let err = link.recv(&mut buf[1 << 20..], after(LONG)).unwrap_err();
    let failed_at = Instant::now();
    let lag = failed_at.saturating_duration_since(exited.join().unwrap());
    let status = wait_child(child);
    assert_eq!(status.code(), Some(3), "{status}");
    match &err {
        Error::PeerClosed {
            peer,
            reason,
            during,
        } => {
            assert_eq!(*peer, 1);
            assert!(reason.contains("exited"), "{reason}");
            assert!(during.contains("(0 received)"), "{during}");
        }
        other => panic!("expected PeerClosed, found {other:?}"),
    }
    eprintln!("peer death noticed {lag:?} after the child exited");
    assert!(
        lag < Duration::from_millis(500),
        "noticed {lag:?} after the exit"
    );
    assert!(!link.peer_alive());
}
