//! Rendezvous of several ranks (threads here) through tcp:// and file://.

use std::net::TcpListener;
use std::thread;
use std::time::{Duration, Instant};

use tensorcomm::rendezvous::rendezvous;
use tensorcomm::Error;

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

/// Runs `world` ranks of `url_of(rank)` and checks they share one store.
fn meet(world: usize, url_of: impl Fn(usize) -> String) {
    let handles: Vec<_> = (0..world)
        .map(|rank| {
            let url = url_of(rank);
            thread::spawn(move || {
                let r = rendezvous(&url, Duration::from_secs(20)).expect("rendezvous");
                assert_eq!((r.rank, r.world_size), (rank, world));
                r.store
                    .set(&format!("hello/{rank}"), rank.to_string().as_bytes())
                    .unwrap();
                let keys: Vec<String> = (0..world).map(|p| format!("hello/{p}")).collect();
                let refs: Vec<&str> = keys.iter().map(String::as_str).collect();
                let all = r.store.multi_get(&refs).unwrap();
                for (peer, value) in all.iter().enumerate() {
                    assert_eq!(value, peer.to_string().as_bytes());
                }
                r.store.barrier("done", world, None).unwrap();
                r.store.timeout()
            })
        })
        .collect();
    for h in handles {
        // rendezvous hands back stores with the c10d default timeout
        assert_eq!(h.join().unwrap(), Duration::from_secs(300));
    }
}

#[test]
fn ranks_meet_over_tcp() {
    let port = free_port();
    meet(4, |rank| {
        format!("tcp://127.0.0.1:{port}?rank={rank}&world_size=4")
    });
}

#[test]
fn ranks_meet_over_a_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("rdzv");
    let shown = path.display().to_string();
    meet(3, |rank| format!("file://{shown}?rank={rank}&world_size=3"));
    assert!(!path.exists(), "the last user removes the file");
}

#[test]
fn rank_zero_reports_how_many_ranks_joined() {
    let port = free_port();
    let start = Instant::now();
    let err = rendezvous(
        &format!("tcp://127.0.0.1:{port}?rank=0&world_size=2"),
        Duration::from_millis(300),
    )
    .unwrap_err();
    assert!(
        matches!(
            err,
            Error::ClientsTimeout {
                joined: 1,
                expected: 2,
                ..
            }
        ),
        "{err:?}"
    );
    assert!(err.to_string().contains("1/2 clients joined"), "{err}");
    assert!(start.elapsed() < Duration::from_secs(10));
}

#[test]
fn a_rank_without_its_host_names_the_address() {
    let port = free_port();
    let err = rendezvous(
        &format!("tcp://127.0.0.1:{port}?rank=1&world_size=2"),
        Duration::from_millis(300),
    )
    .unwrap_err();
    assert!(matches!(err, Error::StoreConnect { .. }), "{err:?}");
    assert!(
        err.to_string().contains(&format!("127.0.0.1:{port}")),
        "{err}"
    );
}

#[test]
fn a_file_rendezvous_reports_missing_ranks() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!(
        "file://{}?rank=0&world_size=3",
        dir.path().join("f").display()
    );
    let err = rendezvous(&url, Duration::from_millis(200)).unwrap_err();
    assert!(err.to_string().contains("1/3"), "{err}");
}

/// A path that is not a regular file (here a link to `/dev/null`, which
/// before this check was accepted and, as root, unlinked on drop) is refused,
/// and the path is left alone.
#[test]
fn a_file_store_refuses_what_is_not_a_regular_file() {
    let dir = tempfile::tempdir().unwrap();
    let link = dir.path().join("null");
    std::os::unix::fs::symlink("/dev/null", &link).unwrap();
    let err = tensorcomm::store::FileStore::open(&link)
        .err()
        .expect("a character device is not a store file");
    assert!(matches!(err, Error::StoreFileNotRegular { .. }), "{err:?}");
    assert!(err.to_string().contains("character device"), "{err}");
    let url = format!("file://{}?rank=0&world_size=1", link.display());
    let err = rendezvous(&url, Duration::from_secs(5)).unwrap_err();
    assert!(matches!(err, Error::StoreFileNotRegular { .. }), "{err:?}");
    assert!(
        link.symlink_metadata().is_ok(),
        "the path must not be removed"
    );
    let err = tensorcomm::store::FileStore::open(dir.path())
        .err()
        .expect("a directory is not a store file");
    assert!(err.to_string().contains("directory"), "{err}");
    assert!(dir.path().is_dir());
}

/// An existing empty file is used but never deleted: the store did not
/// create it. The last user leaves it empty, as it was given, so the next
/// job can use it again.
#[test]
fn a_file_store_keeps_a_file_it_did_not_create() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("given");
    std::fs::write(&path, b"").unwrap();
    let url = format!("file://{}?rank=0&world_size=1", path.display());
    for round in 0..2 {
        let r = rendezvous(&url, Duration::from_secs(5)).unwrap();
        assert!(
            !r.store.check(&["k"]).unwrap(),
            "round {round} starts empty"
        );
        r.store.set("k", b"v").unwrap();
        drop(r);
        let meta = std::fs::metadata(&path).expect("the given file must stay");
        assert_eq!(meta.len(), 0, "round {round}: left as it was given");
    }
}

/// A parameter given twice is refused rather than silently keeping the
/// first value; so is a host that is no host name or address (`%00`).
#[test]
fn a_repeated_parameter_or_a_bad_host_is_refused() {
    use tensorcomm::rendezvous::InitMethod;
    for url in [
        "tcp://127.0.0.1:29500?rank=0&world_size=2&rank=1",
        "file:///tmp/x?rank=0&world_size=2&world_size=3",
    ] {
        let err = InitMethod::parse(url, |_| None).unwrap_err();
        assert!(matches!(err, Error::BadValue { .. }), "{url}: {err:?}");
        assert!(err.to_string().contains("once"), "{url}: {err}");
    }
    for host in ["%00", "a b", "x\u{0}y", "[::1%00]", "h/x", "[::1]x"] {
        let url = format!("tcp://{host}:29500?rank=0&world_size=1");
        let err = InitMethod::parse(&url, |_| None).unwrap_err();
        assert!(matches!(err, Error::BadValue { .. }), "{url:?}: {err:?}");
        assert!(err.to_string().contains("host"), "{url:?}: {err}");
    }
    for host in ["node-7.cluster_a", "10.0.0.1", "[::1]", "[fe80::1]"] {
        let url = format!("tcp://{host}:29500?rank=0&world_size=1");
        InitMethod::parse(&url, |_| None).unwrap_or_else(|e| panic!("{url}: {e}"));
    }
}

#[test]
fn rank_zero_hosts_the_store_on_master_addr_only() {
    let port = free_port();
    let url = format!("tcp://127.0.0.1:{port}?rank=0&world_size=1");
    let r = rendezvous(&url, Duration::from_secs(10)).expect("rendezvous");
    assert!(std::net::TcpStream::connect(("127.0.0.1", port)).is_ok());
    // 127.0.0.2 is this host too (all of 127/8 is loopback): a listener on
    // every interface would accept it, one on MASTER_ADDR does not.
    let other = std::net::TcpStream::connect(("127.0.0.2", port));
    assert!(
        other.is_err(),
        "the store answered on 127.0.0.2:{port}, so it listens beyond MASTER_ADDR"
    );
    drop(r);
}

#[test]
fn rank_zero_refuses_a_master_addr_that_is_not_this_host() {
    // 192.0.2.0/24 is TEST-NET-1: never an address of this host.
    let url = "tcp://192.0.2.1:29999?rank=0&world_size=1";
    match rendezvous(url, Duration::from_secs(5)) {
        Err(Error::ListenAddress { addr, reason, .. }) => {
            assert_eq!(addr, "192.0.2.1:29999");
            assert!(reason.contains("MASTER_ADDR 192.0.2.1"), "{reason}");
            assert!(reason.contains("TENSORCOMM_BIND_ALL=1"), "{reason}");
        }
        other => panic!("expected ListenAddress, got {other:?}"),
    }
}
