//! Helpers shared by the process-group test files: one group per rank,
//! built on threads over one in-memory store, over the transport asked for.

#![allow(dead_code)]

use std::sync::Arc;
use std::thread;
use std::time::Duration;

use tensorcomm::cpu::backend::{CpuOptions, ProcessGroupCpu};
use tensorcomm::cpu::transport::{Route, TransportChoice};
use tensorcomm::group::ProcessGroup;
use tensorcomm::store::{HashStore, Store};

/// Runs each named test body once per transport: `tcp::name` and
/// `shm::name`, each calling `name(choice)` of the including file.
#[macro_export]
macro_rules! over_transports {
    ($($name:ident),* $(,)?) => {
        mod tcp {
            $(#[test]
            fn $name() {
                super::$name(tensorcomm::cpu::transport::TransportChoice::Tcp);
            })*
        }
        mod shm {
            $(#[test]
            fn $name() {
                super::$name(tensorcomm::cpu::transport::TransportChoice::Shm);
            })*
        }
    };
}

/// Builds one group per rank (in parallel, as setup needs everyone) with
/// the transport `TENSORCOMM_TRANSPORT` picks.
pub fn groups(world: usize, store: &Arc<HashStore>, prefix: &str) -> Vec<ProcessGroupCpu> {
    build(world, store, prefix, options())
}

/// Builds one group per rank over `choice` (`Tcp` or `Shm`) and checks
/// that every pair of ranks got the route asked for.
pub fn groups_over(
    world: usize,
    store: &Arc<HashStore>,
    prefix: &str,
    choice: TransportChoice,
) -> Vec<ProcessGroupCpu> {
    let pgs = build(world, store, prefix, options_over(choice));
    for pg in &pgs {
        assert_routes(pg, choice);
    }
    pgs
}

/// Checks that `pg` reaches every other rank of its group over `choice`
/// (`Tcp` or `Shm`) and itself locally.
pub fn assert_routes(pg: &ProcessGroupCpu, choice: TransportChoice) {
    let want = match choice {
        TransportChoice::Tcp => Route::Tcp,
        TransportChoice::Shm => Route::Shm,
        other => panic!("assert_routes takes Tcp or Shm, not {other:?}"),
    };
    for peer in 0..pg.size() {
        let expected = if peer == pg.rank() {
            Route::Local
        } else {
            want
        };
        assert_eq!(pg.route(peer), expected, "rank {} to {peer}", pg.rank());
        let p2p = pg.p2p_route(peer);
        assert_eq!(
            p2p,
            expected,
            "point-to-point, rank {} to {peer}",
            pg.rank()
        );
    }
}

fn build(
    world: usize,
    store: &Arc<HashStore>,
    prefix: &str,
    options: CpuOptions,
) -> Vec<ProcessGroupCpu> {
    let store: Arc<dyn Store> = store.clone();
    let handles: Vec<_> = (0..world)
        .map(|rank| {
            let (store, prefix, options) = (store.clone(), prefix.to_string(), options.clone());
            thread::spawn(move || ProcessGroupCpu::new(store, &prefix, rank, world, &options))
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

/// [`options`] over `choice`; over TCP with three connections per pair,
/// so that messages from 256 KiB travel in parallel stripes (a 2-core
/// machine would otherwise choose one connection and never stripe).
pub fn options_over(choice: TransportChoice) -> CpuOptions {
    CpuOptions {
        transport: choice,
        tcp_lanes: (choice == TransportChoice::Tcp).then_some(3),
        ..options()
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
