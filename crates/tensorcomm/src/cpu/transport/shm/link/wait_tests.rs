//! Blocked `send`s and `recv`s that sleep on the rings' signals: no
//! wake-up is lost when two ranks answer each other round after round.
//! The links here wait by [`ShmWait::Sleep`] and sleep at once, for
//! [`LONG`], without the yield window (`test_sleep`), so the futexes do
//! the waking: a write (or read) that failed to wake its peer would stall
//! a round for `LONG` instead of going unnoticed while the peer yields.

use std::time::{Duration, Instant};

use super::*;
use crate::store::HashStore;

/// How long a blocked call sleeps on a ring's signal unless woken.
const LONG: Duration = Duration::from_secs(10);

/// Both ends of a link of `capacity` bytes per direction (rank 0's
/// first), each waiting by `ShmWait::Sleep` and sleeping [`LONG`] at once.
fn sleeping_pair(prefix: &str, capacity: usize) -> (ShmLink, ShmLink) {
    let store = HashStore::new();
    let timeout = Duration::from_secs(30);
    let (mut a, mut b) = std::thread::scope(|s| {
        let b = s.spawn(|| ShmLink::connect(&store, prefix, 1, 0, capacity, timeout));
        let a = ShmLink::connect(&store, prefix, 0, 1, capacity, timeout);
        (
            a.expect("rank 0 link"),
            b.join().unwrap().expect("rank 1 link"),
        )
    });
    for link in [&mut a, &mut b] {
        link.set_wait(ShmWait::Sleep);
        link.test_sleep = Some(LONG);
    }
    (a, b)
}

/// `rounds` round trips of 1 to `max_len` bytes: rank 0 sends, rank 1
/// echoes each byte plus one. Returns the slowest round trip. A round
/// that took `LONG / 2` or more (a lost wake-up) fails the test; rank 0
/// then drops its link, which wakes rank 1 and ends it too.
fn ping_pong(prefix: &str, capacity: usize, rounds: usize, max_len: usize) -> Duration {
    let (a, b) = sleeping_pair(prefix, capacity);
    let deadline = Instant::now() + Duration::from_secs(120);
    std::thread::scope(|s| {
        s.spawn(move || {
            let mut buf = vec![0u8; max_len];
            for round in 0..rounds {
                let msg = &mut buf[..round % max_len + 1];
                if b.recv(msg, deadline).is_err() {
                    return; // rank 0 gave up (and says why)
                }
                msg.iter_mut().for_each(|x| *x = x.wrapping_add(1));
                if b.send(msg, deadline).is_err() {
                    return;
                }
            }
        });
        // Its own thread, so that a failed round drops (closes) its link
        // before the scope waits for rank 1.
        let rank0 = s.spawn(move || {
            let mut slowest = Duration::ZERO;
            let mut back = vec![0u8; max_len];
            for round in 0..rounds {
                let len = round % max_len + 1;
                let msg: Vec<u8> = (0..len).map(|i| (round + i) as u8).collect();
                let started = Instant::now();
                a.send(&msg, deadline).unwrap();
                a.recv(&mut back[..len], deadline).unwrap();
                let took = started.elapsed();
                assert!(
                    took < LONG / 2,
                    "round {round} ({len} bytes) took {took:?}: a wake-up was lost"
                );
                slowest = slowest.max(took);
                let want: Vec<u8> = msg.iter().map(|x| x.wrapping_add(1)).collect();
                assert_eq!(&back[..len], &want[..], "round {round}");
            }
            slowest
        });
        rank0.join().unwrap()
    })
}

#[test]
fn sleeping_receivers_are_woken_by_every_write() {
    // Small messages in a roomy ring: every wait is a recv, woken by the
    // peer's write (`Ring::write` notifying the ring's data signal).
    let slowest = ping_pong("wake-data", 4096, 3000, 16);
    assert!(slowest < LONG / 2, "{slowest:?}");
}

#[test]
fn sleeping_senders_are_woken_by_every_read() {
    // Messages up to 5 times the ring: sends wait for space too, woken by
    // the peer's read (`Ring::read` notifying the ring's space signal).
    let slowest = ping_pong("wake-space", 64, 1000, 320);
    assert!(slowest < LONG / 2, "{slowest:?}");
}
