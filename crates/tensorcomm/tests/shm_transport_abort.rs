//! A shared-memory mesh after one rank aborted its transport: that rank's
//! own calls say the fault is its own (`LinkShutDownHere`), as the TCP
//! transport's do, while its peer names it.
#![cfg(target_os = "linux")]

use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use tensorcomm::cpu::transport::shm::{ShmTransport, ShmTransportOptions};
use tensorcomm::cpu::transport::Transport;
use tensorcomm::store::HashStore;
use tensorcomm::Error;

#[test]
fn an_aborted_rank_blames_itself_and_its_peer_names_it() {
    let store = Arc::new(HashStore::new());
    let mesh: Vec<ShmTransport> = (0..2)
        .map(|rank| {
            let store = store.clone();
            thread::spawn(move || {
                let options = ShmTransportOptions {
                    timeout: Duration::from_secs(30),
                    ..ShmTransportOptions::default()
                };
                ShmTransport::connect(&*store, "shm-abort", rank, 2, &options)
            })
        })
        .collect::<Vec<_>>()
        .into_iter()
        .map(|h| h.join().unwrap().unwrap())
        .collect();
    let soon = || Instant::now() + Duration::from_secs(10);
    mesh[0].abort();
    match mesh[0].send(1, b"x", soon()) {
        Err(Error::LinkShutDownHere { peer: 1, during }) => {
            assert!(during.contains("aborted its transport"), "{during}")
        }
        other => panic!("expected LinkShutDownHere naming rank 1, found {other:?}"),
    }
    let started = Instant::now();
    match mesh[1].recv(0, &mut [0u8; 8], soon()) {
        Err(Error::PeerClosed { peer: 0, .. }) => {}
        other => panic!("expected PeerClosed naming rank 0, found {other:?}"),
    }
    assert!(started.elapsed() < Duration::from_secs(5));
}
