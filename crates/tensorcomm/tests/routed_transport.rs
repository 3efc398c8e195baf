//! RoutedTransport between threads split into pretend hosts (through the
//! host identity override): shared memory inside a host, TCP across, a
//! ring all-reduce over both at once, and `shm` required across hosts
//! refused on every rank naming a remote peer.

use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use tensorcomm::cpu::algorithms::{all_reduce_with, AllReduceAlgorithm};
use tensorcomm::cpu::reduce_kernels::ReduceOp;
use tensorcomm::cpu::transport::{
    Route, RoutedTransport, RoutedTransportOptions, TcpTransportOptions, Transport, TransportChoice,
};
use tensorcomm::store::HashStore;
use tensorcomm::tensor::DType;
use tensorcomm::Error;

/// Connects `hosts.len()` ranks, rank r claiming host `hosts[r]`.
fn connect(
    hosts: &[&str],
    choice: TransportChoice,
    prefix: &str,
) -> Vec<tensorcomm::Result<RoutedTransport>> {
    let store = Arc::new(HashStore::new());
    let world = hosts.len();
    let handles: Vec<_> = hosts
        .iter()
        .enumerate()
        .map(|(rank, host)| {
            let (store, prefix) = (store.clone(), prefix.to_string());
            let options = RoutedTransportOptions {
                choice,
                tcp: TcpTransportOptions {
                    timeout: Duration::from_secs(20),
                    ..TcpTransportOptions::default()
                },
                shm_capacity: Some(64 << 10),
                host_identity: Some(host.to_string()),
                ..RoutedTransportOptions::default()
            };
            thread::spawn(move || RoutedTransport::connect(&*store, &prefix, rank, world, &options))
        })
        .collect();
    handles.into_iter().map(|h| h.join().unwrap()).collect()
}

#[test]
fn ranks_on_one_host_use_shm_and_across_hosts_tcp_and_a_ring_works_over_both() {
    let hosts = ["a", "a", "b", "b", "a"];
    let ts: Vec<RoutedTransport> = connect(&hosts, TransportChoice::Auto, "mixed")
        .into_iter()
        .map(Result::unwrap)
        .collect();
    for t in &ts {
        for peer in 0..hosts.len() {
            let want = if peer == t.rank() {
                Route::Local
            } else if hosts[peer] == hosts[t.rank()] {
                Route::Shm
            } else {
                Route::Tcp
            };
            assert_eq!(t.route(peer), want, "rank {} to {peer}", t.rank());
        }
    }
    // 300k i32 through a ring: every step's send_recv mixes or matches
    // routes depending on the neighbours, and messages exceed the rings.
    let n = 300_000;
    let world = hosts.len() as i64;
    thread::scope(|s| {
        for t in &ts {
            s.spawn(move || {
                let rank = t.rank() as i64;
                let mut buf: Vec<u8> = (0..n as i64)
                    .flat_map(|i| ((i % 1000) * (rank + 1)).to_ne_bytes()[..4].to_vec())
                    .collect();
                let deadline = Instant::now() + Duration::from_secs(20);
                all_reduce_with(
                    AllReduceAlgorithm::Ring,
                    t,
                    &mut buf,
                    DType::I32,
                    ReduceOp::Sum,
                    deadline,
                )
                .unwrap();
                let factor = world * (world + 1) / 2;
                for (i, chunk) in buf.chunks_exact(4).enumerate() {
                    let got = i32::from_ne_bytes(chunk.try_into().unwrap()) as i64;
                    assert_eq!(got, (i as i64 % 1000) * factor, "element {i}");
                }
            });
        }
    });
}

#[test]
fn forced_tcp_uses_tcp_between_ranks_of_one_host() {
    let ts: Vec<RoutedTransport> = connect(&["a", "a"], TransportChoice::Tcp, "forced")
        .into_iter()
        .map(Result::unwrap)
        .collect();
    assert_eq!(ts[0].route(1), Route::Tcp);
    assert_eq!(ts[1].route(0), Route::Tcp);
}

#[test]
fn required_shm_across_hosts_fails_on_every_rank_naming_a_remote_peer() {
    let hosts = ["a", "b", "a"];
    for (rank, result) in connect(&hosts, TransportChoice::Shm, "required")
        .into_iter()
        .enumerate()
    {
        match result {
            Err(Error::ShmPeerNotLocal {
                peer,
                expected,
                found,
            }) => {
                assert_ne!(hosts[peer], hosts[rank], "rank {rank} named {peer}");
                assert_eq!(expected, hosts[rank]);
                assert_eq!(found, hosts[peer]);
            }
            other => panic!("rank {rank}: expected ShmPeerNotLocal, found {other:?}"),
        }
    }
}
