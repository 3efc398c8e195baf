//! The store connections this process opened as a client, so that a
//! server in the same process can tell its own process's clients from the
//! others'.
//!
//! A hosting store that waits at process exit for its clients to leave
//! (`at_exit.rs`) waits only for other processes: connections of this
//! process (the hosting store's own pool, a thread still blocked in a
//! `get`) end with it anyway, and waiting for them would hold every exit
//! for the whole linger. A connection is known by its two addresses, the
//! same seen from either side of a connection on one host; every client
//! connection registers them here while it is open.

use std::collections::BTreeMap;
use std::net::{SocketAddr, TcpStream};
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use crate::process_exit::lock_within;

/// The two ends of a TCP connection: the client's address and the
/// server's. An IPv4 address mapped into IPv6 is written as IPv4 (and a
/// scope or flow label dropped), so that a dual-stack server's view of a
/// connection matches its client's.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct Ends {
    client: SocketAddr,
    server: SocketAddr,
}

impl Ends {
    pub(crate) fn new(client: SocketAddr, server: SocketAddr) -> Self {
        let canonical = |a: SocketAddr| SocketAddr::new(a.ip().to_canonical(), a.port());
        Ends {
            client: canonical(client),
            server: canonical(server),
        }
    }
}

/// Every open client connection of this process, counted by its ends.
static OWN: Mutex<BTreeMap<Ends, usize>> = Mutex::new(BTreeMap::new());

fn own() -> MutexGuard<'static, BTreeMap<Ends, usize>> {
    // Each update is one map insert or removal: a panic cannot leave it
    // half done.
    OWN.lock().unwrap_or_else(|p| p.into_inner())
}

/// Counts a client connection as this process's for as long as it lives.
#[derive(Debug)]
pub(crate) struct OwnConnection(Option<Ends>);

impl OwnConnection {
    /// Registers `stream`'s ends. A socket whose addresses cannot be read
    /// is not registered: its server counts it as another process's, which
    /// at worst makes an exit wait longer.
    pub(crate) fn new(stream: &TcpStream) -> Self {
        let ends = match (stream.local_addr(), stream.peer_addr()) {
            (Ok(local), Ok(peer)) => Ends::new(local, peer),
            _ => return OwnConnection(None),
        };
        *own().entry(ends).or_insert(0) += 1;
        OwnConnection(Some(ends))
    }
}

impl Drop for OwnConnection {
    fn drop(&mut self) {
        let Some(ends) = self.0 else {
            return;
        };
        let mut own = own();
        if let Some(n) = own.get_mut(&ends) {
            *n -= 1;
            if *n == 0 {
                own.remove(&ends);
            }
        }
    }
}

/// How many of `open` (connections by ends, `None` for one whose ends are
/// unknown) belong to other processes; `None` when the registry's lock
/// could not be had within `patience` (see `at_exit.rs`: the exit handler
/// never blocks on a lock without bound).
pub(crate) fn count_others(
    open: &BTreeMap<Option<Ends>, usize>,
    patience: Duration,
) -> Option<usize> {
    let own = lock_within(&OWN, patience)?;
    Some(
        open.iter()
            .filter(|(ends, _)| ends.is_none_or(|e| !own.contains_key(&e)))
            .map(|(_, n)| n)
            .sum(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;

    #[test]
    fn a_connection_is_own_while_open_and_seen_the_same_from_both_ends() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let stream = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (accepted, peer) = listener.accept().unwrap();
        let seen = Ends::new(peer, accepted.local_addr().unwrap());
        let mut open = BTreeMap::new();
        open.insert(Some(seen), 1);
        open.insert(None, 2);
        let patience = Duration::from_secs(1);
        assert_eq!(count_others(&open, patience), Some(3));
        let own = OwnConnection::new(&stream);
        assert_eq!(count_others(&open, patience), Some(2));
        drop(own);
        assert_eq!(count_others(&open, patience), Some(3));
    }

    #[test]
    fn ipv4_mapped_addresses_match_their_ipv4_form() {
        let v4: SocketAddr = "127.0.0.1:5".parse().unwrap();
        let mapped: SocketAddr = "[::ffff:127.0.0.1]:5".parse().unwrap();
        assert_eq!(Ends::new(v4, v4), Ends::new(mapped, mapped));
    }
}
