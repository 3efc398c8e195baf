//! [`Transport::sleep_for_data`] over shared memory, directly on
//! [`ShmTransport`] and through the transports that wrap it
//! ([`RoutedTransport`], the collectives' `Fingerprinted`): a sleep asked
//! for 10 s ends within moments of the peer's send, or of the peer
//! closing, and lasts until then (one call, not a poll of short sleeps).
//! The arena's opening barrier sleeps this way
//! (`algorithms/arena_lanes.rs`), so a sleep the peer cannot end would
//! cost it the whole timeout.

use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use super::shm::{ShmTransport, ShmTransportOptions, ShmWait};
use super::{RoutedTransport, RoutedTransportOptions, Transport, TransportChoice};
use crate::cpu::fingerprinted::Fingerprinted;
use crate::group::fingerprint::{CollectiveKind, Fingerprint};
use crate::store::HashStore;

/// What each call of `sleep_for_data` asks for: far more than a test takes.
const ASKED: Duration = Duration::from_secs(10);
/// How soon after the peer acts the sleeper must be back.
const PROMPT: Duration = Duration::from_secs(2);

/// What rank 1 does while rank 0 sleeps for its data.
#[derive(Clone, Copy, Debug)]
enum Act {
    Send,
    Close,
}

impl Act {
    fn run(self, t: &dyn Transport) {
        match self {
            Act::Send => t.send(0, b"wake", Instant::now() + ASKED).unwrap(),
            Act::Close => t.abort(),
        }
    }
}

/// Rank 0 sleeps on `t0.sleep_for_data(1, ASKED)` until `has_data(1)`
/// says there is data (or fails: the peer closed) while rank 1 does `act`
/// on `t1` after 300 ms; checks that rank 0 was back within [`PROMPT`]
/// of it, through at most a few calls (each sleeps until woken).
fn woken_by(what: &str, t0: &dyn Transport, t1: &dyn Transport, act: Act) {
    let (calls, late) = thread::scope(|s| {
        let peer = s.spawn(move || {
            thread::sleep(Duration::from_millis(300));
            let acted = Instant::now();
            act.run(t1);
            acted
        });
        let mut calls = 0;
        while matches!(t0.has_data(1), Ok(false)) {
            assert!(calls < 100, "{what} {act:?}: sleep_for_data does not sleep");
            t0.sleep_for_data(1, ASKED);
            calls += 1;
        }
        let back = Instant::now();
        (calls, back.saturating_duration_since(peer.join().unwrap()))
    });
    assert!(
        late < PROMPT,
        "{what} {act:?}: back {late:?} after the peer acted"
    );
    // The peer acts 300 ms in: a call that returns within a millisecond
    // or so (the trait's default) would take hundreds.
    assert!(
        (1..=3).contains(&calls),
        "{what} {act:?}: {calls} calls to sleep_for_data"
    );
}

/// Both ranks of a two-rank group built by `connect(store, rank)`.
fn pair<T: Send>(connect: impl Fn(&HashStore, usize) -> T + Sync) -> (T, T) {
    let store = Arc::new(HashStore::new());
    thread::scope(|s| {
        let one = s.spawn(|| connect(&store, 1));
        (connect(&store, 0), one.join().unwrap())
    })
}

fn shm(prefix: &str) -> (ShmTransport, ShmTransport) {
    let options = ShmTransportOptions {
        timeout: Duration::from_secs(30),
        wait: ShmWait::Sleep,
        ..Default::default()
    };
    pair(|store, rank| ShmTransport::connect(store, prefix, rank, 2, &options).unwrap())
}

fn routed(prefix: &str) -> (RoutedTransport, RoutedTransport) {
    let options = RoutedTransportOptions {
        choice: TransportChoice::Shm,
        shm_wait: ShmWait::Sleep,
        ..Default::default()
    };
    pair(|store, rank| RoutedTransport::connect(store, prefix, rank, 2, &options).unwrap())
}

fn fingerprint() -> Fingerprint {
    Fingerprint {
        kind: CollectiveKind::AllReduce,
        reduce_op: 0,
        dtype: None,
        root: 0,
        seq: 1,
        numel: 4,
        shape_hash: 0,
    }
}

#[test]
fn a_shm_transport_sleeping_for_data_wakes_when_the_peer_sends_or_closes() {
    for act in [Act::Send, Act::Close] {
        let (t0, t1) = shm(&format!("sfd-shm-{act:?}"));
        woken_by("ShmTransport", &t0, &t1, act);
    }
}

#[test]
fn a_routed_transport_sleeping_for_data_wakes_when_the_peer_sends_or_closes() {
    for act in [Act::Send, Act::Close] {
        let (t0, t1) = routed(&format!("sfd-routed-{act:?}"));
        assert_eq!(t0.route(1), super::Route::Shm);
        woken_by("RoutedTransport", &t0, &t1, act);
    }
}

#[test]
fn a_fingerprinted_transport_sleeping_for_data_wakes_when_the_peer_sends_or_closes() {
    for act in [Act::Send, Act::Close] {
        let (i0, i1) = shm(&format!("sfd-fp-shm-{act:?}"));
        let (f0, f1) = (
            Fingerprinted::new(&i0, fingerprint(), true),
            Fingerprinted::new(&i1, fingerprint(), true),
        );
        woken_by("Fingerprinted over ShmTransport", &f0, &f1, act);
        let (r0, r1) = routed(&format!("sfd-fp-routed-{act:?}"));
        let (f0, f1) = (
            Fingerprinted::new(&r0, fingerprint(), true),
            Fingerprinted::new(&r1, fingerprint(), true),
        );
        woken_by("Fingerprinted over RoutedTransport", &f0, &f1, act);
    }
}
