//! A store that is slow or whose host stops (SIGSTOP: its kernel still
//! accepts connections and takes requests, nothing answers) after a CPU
//! group was set up, imitated by a proxy in front of a real store server
//! that delays its replies or stops forwarding. A stopped host must hold
//! neither a collective's failure nor the group's drop for the store's
//! long timeout; a slow store must still let the stall monitor find a
//! mismatch that only the store can reveal.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use tensorcomm::cpu::backend::{CpuOptions, ProcessGroupCpu};
use tensorcomm::group::{ProcessGroup, ReduceOp};
use tensorcomm::store::{Store, TcpStore, TcpStoreOptions, TcpStoreServer};
use tensorcomm::tensor::Tensor;
use tensorcomm::Error;

/// Forwards connections to `upstream`, each reply after a delay that can
/// be set, until frozen; from then on it holds every byte and every new
/// connection, answering nothing.
struct FreezableProxy {
    addr: String,
    frozen: Arc<AtomicBool>,
    reply_delay_ms: Arc<AtomicU64>,
}

impl FreezableProxy {
    fn start(upstream: SocketAddr) -> FreezableProxy {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let frozen = Arc::new(AtomicBool::new(false));
        let reply_delay_ms = Arc::new(AtomicU64::new(0));
        let held: Arc<Mutex<Vec<TcpStream>>> = Arc::default();
        let (flag, delay) = (frozen.clone(), reply_delay_ms.clone());
        thread::spawn(move || {
            for client in listener.incoming() {
                let Ok(client) = client else { return };
                if flag.load(Ordering::Acquire) {
                    held.lock().unwrap().push(client);
                    continue;
                }
                let server = TcpStream::connect(upstream).unwrap();
                for (from, to, replies) in [
                    (
                        client.try_clone().unwrap(),
                        server.try_clone().unwrap(),
                        false,
                    ),
                    (server, client, true),
                ] {
                    let (flag, delay) = (flag.clone(), delay.clone());
                    let delay = replies.then_some(delay);
                    thread::spawn(move || pump(from, to, &flag, delay.as_deref()));
                }
            }
        });
        FreezableProxy {
            addr,
            frozen,
            reply_delay_ms,
        }
    }

    fn delay_replies(&self, delay: Duration) {
        self.reply_delay_ms
            .store(delay.as_millis() as u64, Ordering::Release);
    }

    fn freeze(&self) {
        self.frozen.store(true, Ordering::Release);
    }
}

fn pump(mut from: TcpStream, mut to: TcpStream, frozen: &AtomicBool, delay: Option<&AtomicU64>) {
    let mut buf = [0u8; 64 * 1024];
    loop {
        let n = match from.read(&mut buf) {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        if let Some(delay) = delay {
            thread::sleep(Duration::from_millis(delay.load(Ordering::Acquire)));
        }
        while frozen.load(Ordering::Acquire) {
            thread::sleep(Duration::from_millis(20));
        }
        if to.write_all(&buf[..n]).is_err() {
            return;
        }
    }
}

/// `world` CPU groups, one per thread, each with its own client of the
/// store behind `proxy`.
fn groups(
    world: usize,
    proxy: &FreezableProxy,
    store_options: &TcpStoreOptions,
    timeout: Duration,
) -> Vec<ProcessGroupCpu> {
    thread::scope(|s| {
        let hs: Vec<_> = (0..world)
            .map(|rank| {
                let addr = &proxy.addr;
                s.spawn(move || {
                    let store: Arc<dyn Store> =
                        Arc::new(TcpStore::connect(addr, store_options).unwrap());
                    let options = CpuOptions {
                        timeout,
                        ..CpuOptions::default()
                    };
                    ProcessGroupCpu::new(store, "pg", rank, world, &options).unwrap()
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    })
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
    let mut pgs = groups(2, &proxy, &store_options, group_timeout);
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

#[test]
fn a_slow_store_still_reveals_a_mismatch_only_it_can_find() {
    let store_options = TcpStoreOptions {
        timeout: Duration::from_secs(120),
        ..TcpStoreOptions::default()
    };
    let server = TcpStoreServer::bind("127.0.0.1:0", &store_options).unwrap();
    let proxy = FreezableProxy::start(server.local_addr());
    let timeout = Duration::from_secs(40);
    let pgs = groups(3, &proxy, &store_options, timeout);
    // Every reply takes 2.5 s from now: slow, not gone.
    proxy.delay_replies(Duration::from_millis(2500));
    // Broadcasts from roots [1, 2, 0]: each rank waits on another in a
    // circle, no message flows, and only the rings the stall monitors
    // compare through the store show the mismatch.
    let started = Instant::now();
    let outcomes: Vec<(Result<(), Error>, Duration)> = thread::scope(|s| {
        let hs: Vec<_> = pgs
            .iter()
            .map(|pg| {
                s.spawn(move || {
                    let t = Tensor::from_vec(vec![1.0f32; 6], &[6]).unwrap();
                    let root = (pg.rank() + 1) % 3;
                    let outcome = pg.broadcast(&t, root, None).and_then(|w| w.wait());
                    (outcome, started.elapsed())
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for (rank, (outcome, after)) in outcomes.iter().enumerate() {
        let err = outcome.as_ref().expect_err("a mismatched broadcast");
        let named = match err {
            Error::CollectiveFailed { source, .. } => {
                matches!(**source, Error::CollectiveMismatch { .. })
            }
            _ => false,
        };
        assert!(named, "rank {rank} after {after:?}: {err}");
        // Found through the slow store, well before the timeout (with a
        // 2 s limit on each store call it was never found: the ranks
        // timed out).
        assert!(
            *after < timeout - Duration::from_secs(10),
            "rank {rank} after {after:?}"
        );
    }
    drop(pgs);
}
