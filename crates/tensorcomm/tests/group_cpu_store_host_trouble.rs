//! A store host that stops (SIGSTOP: its kernel still accepts connections
//! and takes requests, nothing answers) after a CPU group was set up: the
//! group's own threads call the store for diagnostics only, so neither a
//! collective's failure nor the group's drop may wait for the store's
//! long timeout. Imitated by a proxy in front of a real store server that
//! stops forwarding.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use tensorcomm::cpu::backend::{CpuOptions, ProcessGroupCpu};
use tensorcomm::group::{ProcessGroup, ReduceOp};
use tensorcomm::store::{Store, TcpStore, TcpStoreOptions, TcpStoreServer};
use tensorcomm::tensor::Tensor;

/// Forwards connections to `upstream` until frozen; from then on it holds
/// every byte and every new connection, answering nothing.
struct FreezableProxy {
    addr: String,
    frozen: Arc<AtomicBool>,
}

impl FreezableProxy {
    fn start(upstream: SocketAddr) -> FreezableProxy {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let frozen = Arc::new(AtomicBool::new(false));
        let held: Arc<Mutex<Vec<TcpStream>>> = Arc::default();
        let flag = frozen.clone();
        thread::spawn(move || {
            for client in listener.incoming() {
                let Ok(client) = client else { return };
                if flag.load(Ordering::Acquire) {
                    held.lock().unwrap().push(client);
                    continue;
                }
                let server = TcpStream::connect(upstream).unwrap();
                for (from, to) in [
                    (client.try_clone().unwrap(), server.try_clone().unwrap()),
                    (server, client),
                ] {
                    let flag = flag.clone();
                    thread::spawn(move || pump(from, to, &flag));
                }
            }
        });
        FreezableProxy { addr, frozen }
    }

    fn freeze(&self) {
        self.frozen.store(true, Ordering::Release);
    }
}

fn pump(mut from: TcpStream, mut to: TcpStream, frozen: &AtomicBool) {
    let mut buf = [0u8; 64 * 1024];
    loop {
        let n = match from.read(&mut buf) {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        while frozen.load(Ordering::Acquire) {
            thread::sleep(Duration::from_millis(20));
        }
        if to.write_all(&buf[..n]).is_err() {
            return;
        }
    }
}

#[test]
fn a_group_whose_store_host_stopped_fails_and_drops_promptly() {
    // The store's timeout is long, as a real job's is (300 s by default);
    // the group's is short.
    let store_options = TcpStoreOptions {
        timeout: Duration::from_secs(120),
        ..TcpStoreOptions::default()
    };
    let server = TcpStoreServer::bind("127.0.0.1:0", &store_options).unwrap();
    let proxy = FreezableProxy::start(server.local_addr());
    let group_timeout = Duration::from_secs(2);
    let mut pgs: Vec<ProcessGroupCpu> = thread::scope(|s| {
        let hs: Vec<_> = (0..2)
            .map(|rank| {
                let (addr, store_options) = (&proxy.addr, &store_options);
                s.spawn(move || {
                    let store: Arc<dyn Store> =
                        Arc::new(TcpStore::connect(addr, store_options).unwrap());
                    let options = CpuOptions {
                        timeout: group_timeout,
                        ..CpuOptions::default()
                    };
                    ProcessGroupCpu::new(store, "pg", rank, 2, &options).unwrap()
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let rank1 = pgs.pop().unwrap();
    let rank0 = pgs.pop().unwrap();
    proxy.freeze();

    // Rank 1 never comes: rank 0's all_reduce stalls, and its stall
    // monitor asks the stopped store about it.
    let started = Instant::now();
    let t = Tensor::from_vec(vec![1.0f32; 4], &[4]).unwrap();
    let err = rank0
        .all_reduce(&t, ReduceOp::Sum, None)
        .unwrap()
        .wait()
        .unwrap_err();
    let failed_after = started.elapsed();
    assert!(
        failed_after < group_timeout + Duration::from_secs(10),
        "the all_reduce failed after {failed_after:?} ({err})"
    );

    let dropping = Instant::now();
    drop(rank0);
    drop(rank1);
    let dropped_after = dropping.elapsed();
    // Before: the stall monitor's store call waited the store's timeout
    // and 5 s more (125 s here), and the drop joined it.
    assert!(
        dropped_after < Duration::from_secs(8),
        "dropping the groups took {dropped_after:?}"
    );
}
