//! What the engine lets the threads that watch a group's collectives (the
//! device watchdog, the host stall monitor) do when they find a failure.

use super::fingerprint::{Fingerprint, FINGERPRINT_LEN};
use crate::{Error, Result};

/// What the engine gives the watchdog thread to act on.
pub(crate) trait OnDeviceFailure: Send + Sync {
    /// Marks the group broken after collective `fp` failed with `source`
    /// (`mismatched`: the peer and fingerprint of a mismatch) and posts
    /// the cause; returns the root cause (another rank's, if it posted
    /// first).
    fn settle(
        &self,
        fp: &Fingerprint,
        mismatched: Option<(usize, [u8; FINGERPRINT_LEN])>,
        source: Error,
    ) -> Error;
    /// Aborts the backend's device work.
    fn abort(&self);
    /// Says that a failure of collective `seq` is being settled: until
    /// [`fail_pending`](Self::fail_pending) records it, device work of
    /// `seq` or later (or of the first pending collective) that ends is not
    /// done (see `watchdog.rs`).
    fn begin_failing(&self, seq: u64);
    /// Fails the device work queued before collective `seq` and `seq`
    /// itself with `error` (call it before [`abort`](Self::abort), so that
    /// aborted work is not taken for finished work).
    fn fail_pending(&self, seq: u64, error: Error);
    /// A mismatch with both sides' descriptions (see `mismatch_sides.rs`).
    fn with_both_sides(&self, fp: &Fingerprint, source: Error, mine: Option<&str>) -> Error;
    /// The error naming collective `fp`, this rank and the peers of
    /// `source`.
    fn named(&self, fp: &Fingerprint, source: Error) -> Error;
    /// The backend's asynchronous error, if it has one.
    fn health(&self) -> Result<()>;
    /// Marks `seq` finished with `outcome` in the flight recorder.
    fn finished(&self, seq: u64, outcome: &Result<()>);
}
