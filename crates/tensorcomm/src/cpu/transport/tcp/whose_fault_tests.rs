//! Whose fault a broken connection is when this process shut its sockets
//! down itself, without [`Transport::abort`] (as a fault that shuts every
//! socket of a process does): the peer that sends to a socket that no
//! longer reads resets it, as a dead peer would, and the other sockets,
//! still shut on this side only, tell the two apart.

use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use super::*;
use crate::store::HashStore;

fn mesh(world: usize) -> Vec<TcpTransport> {
    let store = Arc::new(HashStore::new());
    let handles: Vec<_> = (0..world)
        .map(|rank| {
            let store = store.clone();
            thread::spawn(move || {
                let options = TcpTransportOptions {
                    timeout: Duration::from_secs(30),
                    lanes: Some(1),
                    ..TcpTransportOptions::default()
                };
                TcpTransport::connect(&*store, "whose", rank, world, &options)
            })
        })
        .collect();
    handles
        .into_iter()
        .map(|h| h.join().unwrap().unwrap())
        .collect()
}

fn soon() -> Instant {
    Instant::now() + Duration::from_secs(30)
}

#[test]
fn sockets_shut_under_a_rank_are_its_fault_even_after_a_peer_reset_one() {
    let t = mesh(3);
    for lane in t[0].peers.iter().flatten().flat_map(|p| &p.lanes) {
        lane.control.shutdown(std::net::Shutdown::Both).unwrap();
    }
    // Rank 1 sends to a socket that no longer reads: the kernel resets
    // that connection (the send itself may still succeed).
    let _ = t[1].send(0, b"late data", soon());
    thread::sleep(Duration::from_millis(50));
    for (op, result) in [
        ("send", t[0].send(1, b"x", soon())),
        ("recv", t[0].recv(1, &mut [0u8; 4], soon())),
        ("check_alive", t[0].check_alive(1)),
    ] {
        match result {
            Err(Error::LinkShutDownHere { peer: 1, .. }) => {}
            other => panic!("{op}: expected LinkShutDownHere naming rank 1, found {other:?}"),
        }
    }
    // The peers still name rank 0.
    for rank in [1, 2] {
        match t[rank].recv(0, &mut [0u8; 64], soon()) {
            Err(Error::PeerClosed { peer: 0, .. }) => {}
            // Rank 1's late data reset its connection.
            Err(Error::PeerIo { peer: 0, .. }) if rank == 1 => {}
            other => panic!("rank {rank}: expected PeerClosed naming rank 0, found {other:?}"),
        }
    }
}

#[test]
fn a_peer_that_closed_first_is_named_even_after_this_rank_shut_its_side() {
    let mut t = mesh(2);
    drop(t.remove(1));
    thread::sleep(Duration::from_millis(50));
    // This side's shutdown comes after the peer's FIN: CLOSE-WAIT, then
    // LAST-ACK, never FIN-WAIT.
    for lane in t[0].peers.iter().flatten().flat_map(|p| &p.lanes) {
        let _ = lane.control.shutdown(std::net::Shutdown::Both);
    }
    match t[0].recv(1, &mut [0u8; 4], soon()) {
        Err(Error::PeerClosed { peer: 1, .. } | Error::PeerIo { peer: 1, .. }) => {}
        other => panic!("expected the peer named, found {other:?}"),
    }
}
