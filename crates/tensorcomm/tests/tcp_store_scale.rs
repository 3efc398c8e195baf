//! The TCP store's scale goal: 4096 clients (threads) join one server, each
//! sets its address, waits for every other one to have joined, reads a
//! neighbour's address, then all meet at a barrier. The bound is generous
//! (a loaded 2-core CI machine); the time and peak memory measured are
//! printed (`--nocapture`) and reported in the store's bench results.

use std::time::{Duration, Instant};

use tensorcomm::store::{Store, TcpStore, TcpStoreOptions, TcpStoreServer};

const CLIENTS: usize = 4096;

fn open_file_limit() -> usize {
    std::fs::read_to_string("/proc/self/limits")
        .ok()
        .and_then(|l| {
            let line = l.lines().find(|l| l.starts_with("Max open files"))?;
            line["Max open files".len()..]
                .split_whitespace()
                .next()?
                .parse()
                .ok()
        })
        .unwrap_or(usize::MAX)
}

fn peak_rss_mib() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib >> 10)
}

#[test]
fn thousands_of_clients_join_exchange_addresses_and_meet_at_a_barrier() {
    // Each client holds a socket here and the server one more; keep room.
    let clients = CLIENTS.min(open_file_limit().saturating_sub(512) / 3);
    assert!(clients >= 64, "open-file limit too low for this test");
    let options = TcpStoreOptions {
        timeout: Duration::from_secs(120),
        token: None,
        ..TcpStoreOptions::default()
    };
    let server = TcpStoreServer::bind("127.0.0.1:0", &options).unwrap();
    let addr = server.local_addr().to_string();
    let started = Instant::now();
    let handles: Vec<_> = (0..clients)
        .map(|rank| {
            let (addr, options) = (addr.clone(), options.clone());
            std::thread::Builder::new()
                .stack_size(256 << 10)
                .spawn(move || {
                    let store = TcpStore::connect(&addr, &options).unwrap();
                    store
                        .set(
                            &format!("addr/{rank}"),
                            format!("10.0.0.{rank}:4000").as_bytes(),
                        )
                        .unwrap();
                    if store.add("joined", 1).unwrap() == clients as i64 {
                        store.set("all-joined", b"1").unwrap();
                    }
                    store.wait(&["all-joined"]).unwrap();
                    let next = (rank + 1) % clients;
                    let got = store.get(&format!("addr/{next}")).unwrap();
                    assert_eq!(got, format!("10.0.0.{next}:4000").as_bytes());
                    store.barrier("done", clients, None).unwrap();
                })
                .unwrap()
        })
        .collect();
    for handle in handles {
        handle.join().unwrap();
    }
    let took = started.elapsed();
    println!(
        "{clients} clients: join + set + wait for all + get + barrier in {took:?}; \
         peak RSS of the test process (server and clients) {:?} MiB",
        peak_rss_mib()
    );
    assert!(took < Duration::from_secs(120), "took {took:?}");
}
