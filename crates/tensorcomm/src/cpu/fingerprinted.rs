//! A transport that carries the collective's fingerprint in front of the
//! first message to each peer and checks the one in front of the first
//! message from each peer (see [`Fingerprint`]).
//!
//! # Every pair that talks checks both ways
//!
//! A fingerprint travels with data, so a pair of ranks where data flows
//! one way only (a broadcast's parent and child, a reduce's child and
//! parent, a gather's leaf and root) would check it on the receiving side
//! only, and the sender would finish a mismatched call and fail at its
//! next one. So a call ends with [`Fingerprinted::close_call`]: this rank
//! sends its fingerprint alone to every peer it heard from but sent
//! nothing to, then reads the fingerprint of every peer it sent to but
//! heard nothing from, and checks it like any other. Both ranks of a pair
//! that agree on the collective run the same algorithm, so they agree on
//! which of them sends it and which reads it; ranks that disagree read
//! whatever the other sent first (its data, with its fingerprint in
//! front) and fail with [`Error::CollectiveMismatch`], or see the other's
//! connections close when it fails first.
//!
//! Algorithms whose one-way pairs are known up front send that
//! fingerprint as the call starts instead ([`Transport::announce`]: a
//! broadcast child to its parent, a reduce parent to its children, a
//! gather root to every leaf), so that it is usually waiting when the
//! sender finishes: nothing on the slowest rank's path but one small
//! message sent before it starts waiting for data, and no round trip for
//! anyone when calls follow each other. Pairs where data flows both ways
//! (most all-reduces, all-to-all, the arena algorithms' opening barrier)
//! exchange nothing more.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::OnceLock;
use std::time::Instant;

use super::transport::Transport;
use crate::group::fingerprint::{Fingerprint, FINGERPRINT_LEN};
use crate::{Error, Result};

/// Messages up to this size are sent in one write with the fingerprint in
/// front (one copy of a small buffer, no extra round trip); larger ones
/// send the fingerprint first as its own small message. Small enough that
/// the whole write always fits the socket buffers of an idle connection,
/// so a pair sending to each other cannot block on it.
const COMBINE_MAX: usize = 4 << 10;

/// A transport that puts this rank's fingerprint in front of the first
/// message to each peer and checks the one in front of the first message
/// from each peer.
pub(crate) struct Fingerprinted<'a> {
    inner: &'a dyn Transport,
    mine: Fingerprint,
    encoded: [u8; FINGERPRINT_LEN],
    sent: Vec<AtomicBool>,
    received: Vec<AtomicBool>,
    /// The first peer whose fingerprint differed from this rank's, with
    /// the bytes it sent (for the failure report of `group/failure_report.rs`).
    mismatched: OnceLock<(usize, [u8; FINGERPRINT_LEN])>,
    /// Whether send-only pairs check the other way too
    /// ([`Fingerprinted::close_call`], [`Transport::announce`]); off, both
    /// do nothing (every rank of the group agrees on it).
    sender_check: bool,
}

impl<'a> Fingerprinted<'a> {
    /// `inner` carrying `mine`; `sender_check` as
    /// `TENSORCOMM_SENDER_CHECK` says.
    pub(crate) fn new(inner: &'a dyn Transport, mine: Fingerprint, sender_check: bool) -> Self {
        let n = inner.world_size();
        Fingerprinted {
            inner,
            mine,
            encoded: mine.encode(),
            sent: (0..n).map(|_| AtomicBool::new(false)).collect(),
            received: (0..n).map(|_| AtomicBool::new(false)).collect(),
            mismatched: OnceLock::new(),
            sender_check,
        }
    }

    /// The first peer whose fingerprint differed from this rank's and the
    /// encoded fingerprint it sent; `None` while every check has passed.
    pub(crate) fn mismatched(&self) -> Option<(usize, [u8; FINGERPRINT_LEN])> {
        self.mismatched.get().copied()
    }

    fn first_send(&self, to: usize) -> bool {
        self.sent
            .get(to)
            .is_some_and(|s| !s.swap(true, Ordering::Relaxed))
    }

    fn first_recv(&self, from: usize) -> bool {
        self.received
            .get(from)
            .is_some_and(|s| !s.swap(true, Ordering::Relaxed))
    }

    fn check(&self, from: usize, theirs: &[u8; FINGERPRINT_LEN]) -> Result<()> {
        if theirs == &self.encoded {
            return Ok(());
        }
        let _ = self.mismatched.set((from, *theirs));
        Err(mismatch(self.inner.rank(), from, &self.mine, theirs))
    }

    /// Reads `peer`'s fingerprint, expected to be the first thing it sent
    /// in this call, and checks it: the error of a peer that is in another
    /// call ([`Error::CollectiveMismatch`]). `Ok` means the peer is in
    /// this very call.
    #[cfg(feature = "cuda")]
    pub(crate) fn expect_fingerprint(&self, peer: usize, deadline: Instant) -> Result<()> {
        self.confirm(peer, deadline)
    }

    /// Reads and checks the peer's fingerprint on its own: a message of the
    /// wrong length cannot make this rank wait for bytes that never come.
    fn check_header(&self, from: usize, deadline: Instant) -> Result<()> {
        let mut theirs = [0u8; FINGERPRINT_LEN];
        self.inner.recv(from, &mut theirs, deadline)?;
        self.check(from, &theirs)
    }

    /// Reads `from`'s fingerprint unless a message from it was already
    /// read in this call, and checks it.
    fn confirm(&self, from: usize, deadline: Instant) -> Result<()> {
        if self.first_recv(from) {
            self.check_header(from, deadline)?;
        }
        Ok(())
    }

    /// Ends the call's fingerprint exchange (see the module docs): sends
    /// this rank's fingerprint to every peer it heard from and sent nothing
    /// to, then reads and checks the fingerprint of every peer it sent to
    /// and heard nothing from. Call it once the algorithm has finished.
    pub(crate) fn close_call(&self, deadline: Instant) -> Result<()> {
        if !self.sender_check {
            return Ok(());
        }
        let rank = self.inner.rank();
        let peers = || (0..self.inner.world_size()).filter(move |&p| p != rank);
        let was = |flags: &[AtomicBool], p: usize| flags[p].load(Ordering::Relaxed);
        for p in peers().filter(|&p| was(&self.received, p) && !was(&self.sent, p)) {
            self.announce(p, deadline)?;
        }
        for p in peers().filter(|&p| was(&self.sent, p) && !was(&self.received, p)) {
            self.confirm(p, deadline)?;
        }
        Ok(())
    }

    fn with_header(&self, data: &[u8]) -> Vec<u8> {
        let mut staged = Vec::with_capacity(FINGERPRINT_LEN + data.len());
        staged.extend_from_slice(&self.encoded);
        staged.extend_from_slice(data);
        staged
    }
}

/// The error of rank `rank`, in the call `mine`, finding that `peer` is in
/// the call whose encoded fingerprint is `theirs`.
pub(crate) fn mismatch(
    rank: usize,
    peer: usize,
    mine: &Fingerprint,
    theirs: &[u8; FINGERPRINT_LEN],
) -> Error {
    let described = match Fingerprint::decode(theirs) {
        Some(fp) => fp.to_string(),
        None => format!("unrecognised fingerprint bytes {theirs:?}"),
    };
    Error::CollectiveMismatch {
        rank,
        peer,
        mine: mine.to_string(),
        theirs: described,
    }
}

impl Transport for Fingerprinted<'_> {
    fn rank(&self) -> usize {
        self.inner.rank()
    }

    fn world_size(&self) -> usize {
        self.inner.world_size()
    }

    fn send(&self, to: usize, data: &[u8], deadline: Instant) -> Result<()> {
        if !self.first_send(to) {
            return self.inner.send(to, data, deadline);
        }
        if data.len() <= COMBINE_MAX {
            return self.inner.send(to, &self.with_header(data), deadline);
        }
        self.inner.send(to, &self.encoded, deadline)?;
        self.inner.send(to, data, deadline)
    }

    /// Sends this rank's fingerprint alone to `to`, unless something was
    /// sent to it already in this call.
    fn announce(&self, to: usize, deadline: Instant) -> Result<()> {
        if self.sender_check && self.first_send(to) {
            self.inner.send(to, &self.encoded, deadline)?;
        }
        Ok(())
    }

    fn abort(&self) {
        self.inner.abort();
    }

    fn check_alive(&self, peer: usize) -> Result<()> {
        self.inner.check_alive(peer)
    }

    fn has_data(&self, from: usize) -> Result<bool> {
        self.inner.has_data(from)
    }

    fn sleep_for_data(&self, from: usize, timeout: std::time::Duration) {
        self.inner.sleep_for_data(from, timeout)
    }

    fn recv(&self, from: usize, buf: &mut [u8], deadline: Instant) -> Result<()> {
        if self.first_recv(from) {
            self.check_header(from, deadline)?;
        }
        self.inner.recv(from, buf, deadline)
    }

    fn send_recv(
        &self,
        to: usize,
        data: &[u8],
        from: usize,
        buf: &mut [u8],
        deadline: Instant,
    ) -> Result<()> {
        let (header_out, header_in) = (self.first_send(to), self.first_recv(from));
        match (header_out, header_in) {
            (false, false) => self.inner.send_recv(to, data, from, buf, deadline),
            (true, false) if data.len() <= COMBINE_MAX => {
                self.inner
                    .send_recv(to, &self.with_header(data), from, buf, deadline)
            }
            (true, false) => {
                self.inner.send(to, &self.encoded, deadline)?;
                self.inner.send_recv(to, data, from, buf, deadline)
            }
            (true, true) if data.len() <= COMBINE_MAX => {
                // Everything goes out while the peer's fingerprint comes in;
                // the rest of its message is already on its way.
                let mut theirs = [0u8; FINGERPRINT_LEN];
                self.inner
                    .send_recv(to, &self.with_header(data), from, &mut theirs, deadline)?;
                self.check(from, &theirs)?;
                self.inner.recv(from, buf, deadline)
            }
            (out, true) => {
                let header: &[u8] = if out { &self.encoded } else { &[] };
                let mut theirs = [0u8; FINGERPRINT_LEN];
                self.inner
                    .send_recv(to, header, from, &mut theirs, deadline)?;
                self.check(from, &theirs)?;
                self.inner.send_recv(to, data, from, buf, deadline)
            }
        }
    }
}
