//! Measures a ShmLink between two threads of this process: the round-trip
//! time of an 8-byte ping-pong and the bandwidth of 16 MiB messages.
//!
//! ```text
//! cargo run --release --example shm_pingpong [capacity_bytes]
//! ```
//! Both threads spin while waiting, so give the process two free cores.

use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use tensorcomm::cpu::transport::shm::{ShmLink, DEFAULT_CAPACITY};
use tensorcomm::store::HashStore;

const PING_ROUNDS: usize = 200_000;
const PING_BATCH: usize = 1_000;
const BIG: usize = 16 << 20;
const BIG_ROUNDS: usize = 40;

fn main() -> Result<(), tensorcomm::Report> {
    let capacity = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(DEFAULT_CAPACITY);
    let timeout = Duration::from_secs(30);
    let store = Arc::new(HashStore::new());
    let s = store.clone();
    let peer = thread::spawn(move || -> tensorcomm::Result<()> {
        let link = ShmLink::connect(&*s, "bench", 1, 0, capacity, timeout)?;
        let deadline = Instant::now() + Duration::from_secs(600);
        let mut small = [0u8; 8];
        for _ in 0..PING_ROUNDS + PING_BATCH {
            link.recv(&mut small, deadline)?;
            link.send(&small, deadline)?;
        }
        let mut big = vec![0u8; BIG];
        for _ in 0..BIG_ROUNDS + 2 {
            link.recv(&mut big, deadline)?;
        }
        link.send(&big[..8], deadline)?;
        Ok(())
    });
    let link = ShmLink::connect(&*store, "bench", 0, 1, capacity, timeout)?;
    let deadline = Instant::now() + Duration::from_secs(600);

    // Ping-pong: one warm-up batch, then batches whose mean round trip we keep.
    let mut small = [0u8; 8];
    let mut batch_means = Vec::new();
    for batch in 0..PING_ROUNDS / PING_BATCH + 1 {
        let start = Instant::now();
        for i in 0..PING_BATCH {
            link.send(&(i as u64).to_le_bytes(), deadline)?;
            link.recv(&mut small, deadline)?;
        }
        if batch > 0 {
            batch_means.push(start.elapsed().as_secs_f64() / PING_BATCH as f64);
        }
    }
    batch_means.sort_by(f64::total_cmp);
    let median = batch_means[batch_means.len() / 2];
    let best = batch_means[0];
    let mean = batch_means.iter().sum::<f64>() / batch_means.len() as f64;
    println!(
        "ping-pong 8 B, {PING_ROUNDS} round trips: round trip median {:.2} µs, best batch {:.2} µs, mean {:.2} µs (one way ≈ {:.2} µs)",
        median * 1e6,
        best * 1e6,
        mean * 1e6,
        median * 1e6 / 2.0
    );

    // Bandwidth: two warm-up messages, then BIG_ROUNDS timed ones, closed by
    // the peer's 8-byte acknowledgement.
    let big: Vec<u8> = (0..BIG).map(|i| i as u8).collect();
    link.send(&big, deadline)?;
    link.send(&big, deadline)?;
    let start = Instant::now();
    for _ in 0..BIG_ROUNDS {
        link.send(&big, deadline)?;
    }
    link.recv(&mut small, deadline)?;
    let secs = start.elapsed().as_secs_f64();
    let bytes = (BIG * BIG_ROUNDS) as f64;
    println!(
        "bandwidth 16 MiB x {BIG_ROUNDS} through a {} KiB ring: {:.2} GB/s ({:.2} GiB/s), {:.2} ms per message",
        capacity >> 10,
        bytes / secs / 1e9,
        bytes / secs / (1u64 << 30) as f64,
        secs * 1e3 / BIG_ROUNDS as f64
    );
    peer.join().expect("peer thread")?;
    Ok(())
}
