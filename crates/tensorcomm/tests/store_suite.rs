//! One suite of store semantics, run against every `Store` implementation.
//!
//! Each fixture hands out several clients of one shared store (separate
//! connections for TCP, separate opens of one file for FileStore), so the
//! suite checks what one client sees of another's writes.

use std::sync::{Arc, Barrier};
use std::thread;
use std::time::{Duration, Instant};

use tensorcomm::store::{
    FileStore, HashStore, PrefixStore, Store, TcpStore, TcpStoreOptions, TcpStoreServer,
};
use tensorcomm::Error;

/// Hands out clients of one store.
trait Fixture {
    fn client(&self) -> Arc<dyn Store>;
}

struct Hash(Arc<HashStore>);
impl Fixture for Hash {
    fn client(&self) -> Arc<dyn Store> {
        self.0.clone()
    }
}

struct File {
    _dir: tempfile::TempDir,
    path: std::path::PathBuf,
    // keeps the file alive between clients
    _keeper: FileStore,
}
impl Fixture for File {
    fn client(&self) -> Arc<dyn Store> {
        Arc::new(FileStore::open(&self.path).expect("open file store"))
    }
}

struct Tcp {
    server: TcpStoreServer,
}
impl Fixture for Tcp {
    fn client(&self) -> Arc<dyn Store> {
        let addr = self.server.local_addr().to_string();
        Arc::new(TcpStore::connect(&addr, &TcpStoreOptions::default()).expect("connect"))
    }
}

/// A prefix store over another fixture's clients, checked through the prefix.
struct Prefixed<F>(F);
impl<F: Fixture> Fixture for Prefixed<F> {
    fn client(&self) -> Arc<dyn Store> {
        Arc::new(PrefixStore::new("job7", self.0.client()))
    }
}

fn hash() -> Hash {
    Hash(Arc::new(HashStore::new()))
}

fn file() -> File {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("store");
    let keeper = FileStore::open(&path).expect("open file store");
    File {
        _dir: dir,
        path,
        _keeper: keeper,
    }
}

fn tcp() -> Tcp {
    Tcp {
        server: TcpStoreServer::bind("127.0.0.1:0", &TcpStoreOptions::default()).expect("bind"),
    }
}

const SHORT: Duration = Duration::from_millis(150);
const LONG: Duration = Duration::from_secs(20);

fn set_get_round_trips_bytes(f: &dyn Fixture) {
    let (a, b) = (f.client(), f.client());
    a.set("empty", b"").unwrap();
    assert_eq!(b.get("empty").unwrap(), b"");
    let big: Vec<u8> = (0..1 << 20).map(|i| (i * 7 % 251) as u8).collect();
    a.set("big", &big).unwrap();
    assert_eq!(b.get("big").unwrap(), big);
    a.set("k", b"v1").unwrap();
    b.set("k", b"v2").unwrap();
    assert_eq!(a.get("k").unwrap(), b"v2");
}

fn get_blocks_until_another_client_sets(f: &dyn Fixture) {
    let (a, b) = (f.client(), f.client());
    let setter = thread::spawn(move || {
        thread::sleep(Duration::from_millis(50));
        b.set("late", b"here").unwrap();
    });
    assert_eq!(a.get_timeout("late", LONG).unwrap(), b"here");
    setter.join().unwrap();
}

fn get_timeout_names_key_and_client_stays_usable(f: &dyn Fixture) {
    let a = f.client();
    let start = Instant::now();
    let err = a.get_timeout("never", SHORT).unwrap_err();
    assert!(
        start.elapsed() >= SHORT,
        "returned early: {:?}",
        start.elapsed()
    );
    assert!(start.elapsed() < LONG);
    match &err {
        Error::StoreTimeout { keys, timeout } => {
            assert_eq!(keys, &vec!["never".to_string()]);
            assert_eq!(*timeout, SHORT);
        }
        other => panic!("expected StoreTimeout, got {other:?}"),
    }
    assert!(err.to_string().contains("never"));
    a.set("after", b"ok").unwrap();
    assert_eq!(a.get("after").unwrap(), b"ok");
}

fn add_counts_in_ascii_decimal(f: &dyn Fixture) {
    let (a, b) = (f.client(), f.client());
    assert_eq!(a.add("c", 3).unwrap(), 3);
    assert_eq!(b.add("c", -5).unwrap(), -2);
    assert_eq!(a.get("c").unwrap(), b"-2");
    b.set("c", b"40").unwrap();
    assert_eq!(a.add("c", 2).unwrap(), 42);
    a.set("text", b"hello").unwrap();
    let err = b.add("text", 1).unwrap_err();
    assert!(matches!(err, Error::NotACounter { .. }), "{err:?}");
    // still usable after the error
    assert_eq!(b.add("c", 0).unwrap(), 42);
}

/// A counter that would pass i64::MAX (or MIN) is an error naming the key,
/// and keeps its value; it used to wrap around to negative.
fn add_past_i64_max_is_an_error(f: &dyn Fixture) {
    let (a, b) = (f.client(), f.client());
    a.set("big", i64::MAX.to_string().as_bytes()).unwrap();
    let err = b.add("big", 1).unwrap_err();
    let text = err.to_string();
    assert!(text.contains("overflow") && text.contains("big"), "{err:?}");
    assert_eq!(a.get("big").unwrap(), i64::MAX.to_string().as_bytes());
    assert_eq!(b.add("big", -1).unwrap(), i64::MAX - 1);
    a.set("small", i64::MIN.to_string().as_bytes()).unwrap();
    assert!(b.add("small", -1).is_err());
}

fn compare_set_follows_c10d(f: &dyn Fixture) {
    let (a, b) = (f.client(), f.client());
    assert_eq!(a.compare_set("cs", b"x", b"y").unwrap(), b"x");
    assert!(!b.check(&["cs"]).unwrap());
    assert_eq!(a.compare_set("cs", b"", b"first").unwrap(), b"first");
    assert_eq!(b.compare_set("cs", b"", b"second").unwrap(), b"first");
    assert_eq!(b.compare_set("cs", b"first", b"third").unwrap(), b"third");
    assert_eq!(a.get("cs").unwrap(), b"third");
}

fn wait_and_check(f: &dyn Fixture) {
    let (a, b) = (f.client(), f.client());
    assert!(a.check(&[]).unwrap());
    assert!(!a.check(&["w1", "w2"]).unwrap());
    b.set("w1", b"1").unwrap();
    assert!(!a.check(&["w1", "w2"]).unwrap());
    let err = a.wait_timeout(&["w1", "w2"], SHORT).unwrap_err();
    assert!(matches!(err, Error::StoreTimeout { .. }), "{err:?}");
    assert!(err.to_string().contains("w2"), "{err}");
    let setter = thread::spawn(move || {
        thread::sleep(Duration::from_millis(30));
        b.set("w2", b"2").unwrap();
    });
    a.wait_timeout(&["w1", "w2"], LONG).unwrap();
    assert!(a.check(&["w1", "w2"]).unwrap());
    setter.join().unwrap();
}

fn delete_and_count_keys(f: &dyn Fixture) {
    let (a, b) = (f.client(), f.client());
    let before = a.num_keys().unwrap();
    a.set("d1", b"1").unwrap();
    a.set("d2", b"2").unwrap();
    a.add("d3", 1).unwrap();
    assert_eq!(b.num_keys().unwrap(), before + 3);
    let mut keys = b.list_keys().unwrap();
    keys.sort();
    for k in ["d1", "d2", "d3"] {
        assert!(keys.contains(&k.to_string()), "{k} missing from {keys:?}");
    }
    assert!(b.delete_key("d1").unwrap());
    assert!(!a.delete_key("d1").unwrap());
    assert!(!a.check(&["d1"]).unwrap());
    assert_eq!(a.num_keys().unwrap(), before + 2);
    assert!(a.get_timeout("d1", SHORT).is_err());
}

fn append_concatenates(f: &dyn Fixture) {
    let (a, b) = (f.client(), f.client());
    a.append("log", b"ab").unwrap();
    b.append("log", b"cd").unwrap();
    assert_eq!(a.get("log").unwrap(), b"abcd");
}

fn multi_get_and_multi_set(f: &dyn Fixture) {
    let (a, b) = (f.client(), f.client());
    a.multi_set(&["m1", "m2", "m3"], &[b"one", b"", b"three"])
        .unwrap();
    assert_eq!(
        b.multi_get(&["m3", "m1", "m2"]).unwrap(),
        vec![b"three".to_vec(), b"one".to_vec(), b"".to_vec()]
    );
    let err = a.multi_set(&["x", "y"], &[b"1"]).unwrap_err();
    assert!(matches!(err, Error::InvalidArgument(_)), "{err:?}");
    let err = b.multi_get_timeout(&["m1", "absent"], SHORT).unwrap_err();
    assert!(err.to_string().contains("absent"), "{err}");
    assert!(b.multi_get(&[]).unwrap().is_empty());
}

fn queues_are_fifo_and_pop_blocks(f: &dyn Fixture) {
    let (a, b) = (f.client(), f.client());
    assert_eq!(a.queue_len("q").unwrap(), 0);
    a.queue_push("q", b"first").unwrap();
    a.queue_push("q", b"second").unwrap();
    assert_eq!(b.queue_len("q").unwrap(), 2);
    assert_eq!(b.queue_pop("q").unwrap(), b"first");
    assert_eq!(a.queue_pop("q").unwrap(), b"second");
    let err = a.queue_pop_timeout("q", Duration::ZERO).unwrap_err();
    assert!(matches!(err, Error::StoreTimeout { .. }), "{err:?}");
    let pusher = thread::spawn(move || {
        thread::sleep(Duration::from_millis(30));
        b.queue_push("q", b"late").unwrap();
    });
    assert_eq!(a.queue_pop_timeout("q", LONG).unwrap(), b"late");
    pusher.join().unwrap();
}

fn default_timeout_is_300s_and_settable(f: &dyn Fixture) {
    let a = f.client();
    assert_eq!(a.timeout(), Duration::from_secs(300));
    a.set_timeout(SHORT);
    assert_eq!(a.timeout(), SHORT);
    let start = Instant::now();
    assert!(a.get("nothing-here").is_err());
    assert!(start.elapsed() < LONG);
    a.set_timeout(Duration::from_secs(300));
}

fn barrier_releases_all_and_reports_arrivals(f: &dyn Fixture) {
    let world = 4;
    let handles: Vec<_> = (0..world)
        .map(|_| {
            let c = f.client();
            thread::spawn(move || c.barrier("b1", world, Some(LONG)))
        })
        .collect();
    for h in handles {
        h.join().unwrap().unwrap();
    }
    let c = f.client();
    let err = c.barrier("b2", 3, Some(SHORT)).unwrap_err();
    assert!(err.to_string().contains("1/3"), "{err}");
}

fn concurrent_adds_are_atomic(f: &dyn Fixture) {
    let threads = 8;
    let per = 50;
    let start = Arc::new(Barrier::new(threads));
    let handles: Vec<_> = (0..threads)
        .map(|_| {
            let c = f.client();
            let start = start.clone();
            thread::spawn(move || {
                start.wait();
                let mut seen = Vec::new();
                for _ in 0..per {
                    seen.push(c.add("atomic", 1).unwrap());
                }
                seen
            })
        })
        .collect();
    let mut all: Vec<i64> = handles
        .into_iter()
        .flat_map(|h| h.join().unwrap())
        .collect();
    all.sort();
    // every value from 1 to threads*per handed out exactly once
    assert_eq!(all, (1..=(threads * per) as i64).collect::<Vec<_>>());
}

macro_rules! suite {
    ($module:ident, $fixture:expr) => {
        mod $module {
            use super::*;
            suite!(@tests $fixture;
                set_get_round_trips_bytes,
                get_blocks_until_another_client_sets,
                get_timeout_names_key_and_client_stays_usable,
                add_counts_in_ascii_decimal,
                add_past_i64_max_is_an_error,
                compare_set_follows_c10d,
                wait_and_check,
                delete_and_count_keys,
                append_concatenates,
                multi_get_and_multi_set,
                queues_are_fifo_and_pop_blocks,
                default_timeout_is_300s_and_settable,
                barrier_releases_all_and_reports_arrivals,
                concurrent_adds_are_atomic
            );
        }
    };
    (@tests $fixture:expr; $($case:ident),*) => {
        $(
            #[test]
            fn $case() {
                let fixture = $fixture;
                super::$case(&fixture);
            }
        )*
    };
}

suite!(hash_store, hash());
suite!(file_store, file());
suite!(tcp_store, tcp());
suite!(prefix_over_hash, Prefixed(hash()));
suite!(prefix_over_tcp, Prefixed(tcp()));
