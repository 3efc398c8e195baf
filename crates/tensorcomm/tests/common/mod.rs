//! Helpers shared by the process-group test files: one group per rank,
//! built on threads over one in-memory store.

#![allow(dead_code)]

use std::sync::Arc;
use std::thread;
use std::time::Duration;

use tensorcomm::cpu::backend::{CpuOptions, ProcessGroupCpu};
use tensorcomm::store::{HashStore, Store};

/// Builds one group per rank (in parallel, as setup needs everyone).
pub fn groups(world: usize, store: &Arc<HashStore>, prefix: &str) -> Vec<ProcessGroupCpu> {
    let store: Arc<dyn Store> = store.clone();
    let handles: Vec<_> = (0..world)
        .map(|rank| {
            let (store, prefix) = (store.clone(), prefix.to_string());
            thread::spawn(move || ProcessGroupCpu::new(store, &prefix, rank, world, &options()))
        })
        .collect();
    handles
        .into_iter()
        .map(|h| h.join().unwrap().unwrap())
        .collect()
}

/// Options with a test-sized default timeout.
pub fn options() -> CpuOptions {
    CpuOptions {
        timeout: Duration::from_secs(30),
        ..CpuOptions::default()
    }
}

/// Runs `f` on every group at once and returns the results in rank order.
pub fn on_every_rank<T: Send>(
    pgs: &[ProcessGroupCpu],
    f: impl Fn(&ProcessGroupCpu) -> T + Sync,
) -> Vec<T> {
    thread::scope(|s| {
        let f = &f;
        let hs: Vec<_> = pgs.iter().map(|pg| s.spawn(move || f(pg))).collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    })
}
