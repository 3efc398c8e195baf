//! Point-to-point byte movement between the ranks of one group.
//!
//! A [`Transport`] knows its rank and world size and moves exact byte
//! counts to and from peers, each call bounded by a deadline. There is no
//! framing: both sides know how many bytes a step of an algorithm moves, and
//! the process group adds its own headers where it needs them. Failures name
//! the peer ([`Error::PeerClosed`](crate::Error::PeerClosed), [`Error::PeerTimeout`](crate::Error::PeerTimeout),
//! [`Error::PeerIo`](crate::Error::PeerIo)), so a collective can say which rank went missing.
//!
//! [`TcpTransport`] is a full mesh of TCP connections set up through a
//! [`Store`](crate::store::Store). [`shm::ShmTransport`] implements the
//! same trait over per-peer `ShmLink`s: `send`/`recv` map to the link's
//! blocking calls and [`Transport::send_recv`] to a loop over its
//! non-blocking `try_send_some`/`try_recv_some`. [`RoutedTransport`] picks
//! one of them per peer ([`TransportChoice`]: shared memory with ranks on
//! this host, found by exchanging [`host_identity`], TCP with the others),
//! and is what the CPU process group uses.
//!
//! ```
//! use std::{sync::Arc, thread, time::{Duration, Instant}};
//! use tensorcomm::cpu::transport::{TcpTransport, TcpTransportOptions, Transport};
//! use tensorcomm::store::HashStore;
//!
//! let store = Arc::new(HashStore::new());
//! let peer = {
//!     let store = store.clone();
//!     thread::spawn(move || -> tensorcomm::Result<Vec<u8>> {
//!         let t = TcpTransport::connect(&*store, "doc", 1, 2, &TcpTransportOptions::default())?;
//!         let mut buf = vec![0u8; 5];
//!         t.recv(0, &mut buf, Instant::now() + Duration::from_secs(10))?;
//!         Ok(buf)
//!     })
//! };
//! let t = TcpTransport::connect(&*store, "doc", 0, 2, &TcpTransportOptions::default())?;
//! t.send(1, b"hello", Instant::now() + Duration::from_secs(10))?;
//! assert_eq!(peer.join().unwrap()?, b"hello");
//! # Ok::<(), tensorcomm::Error>(())
//! ```

mod choice;
mod host_identity;
mod routed;
pub mod shm;
pub(crate) mod tcp;

#[cfg(all(test, target_os = "linux"))]
mod sleep_for_data_tests;

use std::time::{Duration, Instant};

pub use choice::{TransportChoice, TRANSPORT_ENV};
pub use host_identity::host_identity;
pub use routed::{Route, RoutedTransport, RoutedTransportOptions};
pub use tcp::{auto_tcp_lanes, TcpTransport, TcpTransportOptions, MAX_TCP_LANES};

use crate::Result;

/// Moves bytes between the ranks of one group.
///
/// Every call blocks until the whole buffer has moved, the deadline passes
/// ([`Error::PeerTimeout`](crate::Error::PeerTimeout)) or the peer fails
/// ([`Error::PeerClosed`](crate::Error::PeerClosed),
/// [`Error::PeerIo`](crate::Error::PeerIo)). Messages between a pair of
/// ranks arrive in the order they were sent. A transport may be shared by
/// threads, but the algorithms of one group use it from one thread at a
/// time; concurrent sends to the same peer are serialised. Each message is
/// received by one call of the length it was sent with (the TCP transport
/// cuts large messages into stripes by their length).
pub trait Transport: Send + Sync {
    /// This process's rank in the group.
    fn rank(&self) -> usize;

    /// The number of ranks in the group.
    fn world_size(&self) -> usize;

    /// Sends all of `data` to rank `to`.
    fn send(&self, to: usize, data: &[u8], deadline: Instant) -> Result<()>;

    /// Receives exactly `buf.len()` bytes from rank `from`.
    fn recv(&self, from: usize, buf: &mut [u8], deadline: Instant) -> Result<()>;

    /// Sends `data` to `to` while receiving `buf.len()` bytes from `from`,
    /// making progress on both at once, so that every rank of a ring (or
    /// both ranks of a pair exchanging) can call it at the same time without
    /// deadlock, whatever the message size. `to` and `from` may be the same
    /// rank.
    fn send_recv(
        &self,
        to: usize,
        data: &[u8],
        from: usize,
        buf: &mut [u8],
        deadline: Instant,
    ) -> Result<()>;

    /// Fails with [`Error::PeerClosed`](crate::Error::PeerClosed) if `peer`
    /// is known to be gone (it closed or aborted its end, or its process
    /// exited); `Ok` while it looks alive or when this transport cannot
    /// tell without moving data. For algorithms that wait on shared memory
    /// instead of messages; may cost a system call.
    fn check_alive(&self, peer: usize) -> Result<()>;

    /// Whether a message (or part of one) from `from` is waiting, so that
    /// a `recv` from it would not wait for its first byte; never blocks.
    /// Fails with [`Error::PeerClosed`](crate::Error::PeerClosed) when
    /// nothing waits and `from` is known to be gone. Lets a rank that
    /// expects one message from each of several peers take them in the
    /// order they come, and notice a peer that failed meanwhile, instead
    /// of blocking on one that may never send.
    fn has_data(&self, from: usize) -> Result<bool>;

    /// Sleeps at most `timeout`, returning early once a message from
    /// `from` may have arrived (or `from` closed its end), for a caller
    /// that polls [`has_data`](Self::has_data) and sleeps in between. It
    /// may also return early for nothing: the caller polls again. Over
    /// shared memory the peer's write wakes it at once (the ring's
    /// futex). The default, for a transport that cannot be woken so,
    /// sleeps `timeout` but never more than a millisecond.
    fn sleep_for_data(&self, from: usize, timeout: Duration) {
        let _ = from;
        std::thread::sleep(timeout.min(Duration::from_millis(1)));
    }

    /// Tells `to` early that this rank has reached the current call, for a
    /// transport that checks each call's fingerprint: an algorithm calls it
    /// for a peer that sends to this rank in this call and to which this
    /// rank sends nothing, so the peer (which, sending only, would otherwise
    /// never see this rank's fingerprint) finds it waiting when it finishes.
    /// Plain transports have nothing to tell: the default does nothing.
    fn announce(&self, to: usize, deadline: Instant) -> Result<()> {
        let _ = (to, deadline);
        Ok(())
    }

    /// Closes every connection at once, so that peers blocked on this rank
    /// fail promptly (a collective that failed here must not leave the
    /// others waiting for their timeout). The transport is unusable
    /// afterwards.
    fn abort(&self);
}

/// Checks that `peer` is another rank of a group of `world_size`.
pub(crate) fn check_peer(rank: usize, world_size: usize, peer: usize, op: &str) -> Result<()> {
    if peer >= world_size || peer == rank {
        return Err(crate::Error::InvalidArgument(format!(
            "{op}: expected a peer rank in 0..{world_size} other than this rank {rank}, found {peer}"
        )));
    }
    Ok(())
}
