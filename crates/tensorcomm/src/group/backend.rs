//! The narrow trait a backend implements: run one validated, sequenced
//! collective to its end on the calling thread, and close its connections
//! when the group breaks. Everything else of a collective's life (queue,
//! turns, sequence numbers, deadlines, failure reports, the flight
//! recorder) is the [`Engine`](super::engine::Engine)'s.

use std::any::Any;
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::time::{Duration, Instant};

use super::collective::Collective;
use super::fingerprint::{Fingerprint, FINGERPRINT_LEN};
use super::work::DeviceEvent;
use crate::{Error, Result};

/// The `code` of the [`Error::Nccl`] a device backend fails a call with
/// once the group's own failure handling aborted it
/// ([`GroupBackend::abort`]): the engine then reports the cause posted
/// for the group, not the abort.
pub(crate) const ABORTED: &str = "aborted";

/// The `code` of the [`Error::Nccl`] a device backend fails a call with
/// when it could not queue the call's work before its deadline (NCCL's
/// group end still in progress): the engine then names the ranks furthest
/// behind.
pub(crate) const NOT_QUEUED: &str = "ncclInProgress";

/// True for a call failed by an abort of this rank's group ([`ABORTED`]).
pub(crate) fn is_aborted(err: &Error) -> bool {
    matches!(err, Error::Nccl { code, .. } if code == ABORTED)
}

/// True for a call whose work was never queued ([`NOT_QUEUED`]).
pub(crate) fn is_not_queued(err: &Error) -> bool {
    matches!(err, Error::Nccl { code, .. } if code == NOT_QUEUED)
}

/// What a backend's [`GroupBackend::prepare`] made of a call on the
/// caller's thread, handed back to its [`GroupBackend::run`] through
/// [`Call::take_prepared`]. The engine never looks inside.
pub(crate) type Prepared = Box<dyn Any + Send>;

/// One collective as the engine hands it to a backend: its fingerprint
/// (sequence number filled in) and deadline, what the backend prepared
/// for it at call time, and where the backend says which peer's
/// fingerprint differed when it finds a mismatch, and what the call was
/// when it failed.
pub(crate) struct Call {
    pub(crate) fingerprint: Fingerprint,
    pub(crate) deadline: Instant,
    /// The timeout the caller set, from which `deadline` was computed
    /// (named in timeout errors instead of what a wait measured).
    pub(crate) timeout: Option<std::time::Duration>,
    prepared: Mutex<Option<Result<Option<Prepared>>>>,
    mismatched: OnceLock<(usize, [u8; FINGERPRINT_LEN])>,
    described: OnceLock<String>,
}

impl Call {
    pub(crate) fn new(fingerprint: Fingerprint, deadline: Instant) -> Self {
        Call {
            fingerprint,
            deadline,
            timeout: None,
            prepared: Mutex::new(None),
            mismatched: OnceLock::new(),
            described: OnceLock::new(),
        }
    }

    /// The call with the timeout its deadline was computed from.
    pub(crate) fn with_timeout(mut self, timeout: std::time::Duration) -> Self {
        self.timeout = Some(timeout);
        self
    }

    /// The call with what [`GroupBackend::prepare`] returned for it.
    pub(crate) fn with_prepared(self, prepared: Result<Option<Prepared>>) -> Self {
        *self.prepared.lock().unwrap_or_else(PoisonError::into_inner) = Some(prepared);
        self
    }

    /// What [`GroupBackend::prepare`] returned for this call (its error,
    /// if it failed); `Ok(None)` once taken, or if nothing was prepared.
    pub(crate) fn take_prepared(&self) -> Result<Option<Prepared>> {
        self.prepared
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take()
            .unwrap_or(Ok(None))
    }

    /// Records that `peer` sent the fingerprint `theirs`, unlike this
    /// rank's (the first report is kept); the engine's failure report
    /// carries it to every rank.
    pub(crate) fn report_mismatch(&self, peer: usize, theirs: [u8; FINGERPRINT_LEN]) {
        let _ = self.mismatched.set((peer, theirs));
    }

    /// The peer whose fingerprint differed, and what it sent.
    pub(crate) fn mismatched(&self) -> Option<(usize, [u8; FINGERPRINT_LEN])> {
        self.mismatched.get().copied()
    }

    /// Records, when the call failed, its full description
    /// ([`describe`](super::call_description::describe) of the
    /// collective), which a mismatch error shows instead of the
    /// fingerprint's fields (the first one is kept).
    pub(crate) fn describe(&self, description: String) {
        let _ = self.described.set(description);
    }

    /// The description [`Call::describe`] recorded, if any.
    pub(crate) fn description(&self) -> Option<&str> {
        self.described.get().map(String::as_str)
    }
}

/// What a backend does for the engine.
pub(crate) trait GroupBackend: Send + Sync + 'static {
    /// Runs on the caller's thread when `collective` is submitted, before
    /// it is queued (so in call order with the caller's other work, such
    /// as its current CUDA stream), and may return something for
    /// [`run`](GroupBackend::run) to take back with
    /// [`Call::take_prepared`]. An error is the collective's error when
    /// it runs (so the group fails on every rank, not only here). By
    /// default nothing is prepared.
    fn prepare(&self, collective: &Collective) -> Result<Option<Prepared>> {
        let _ = collective;
        Ok(None)
    }

    /// Runs `collective` (validated, its turn come) on the calling thread
    /// until it completes, fails or passes `call.deadline`. On a mismatch
    /// found through its own messages it calls [`Call::report_mismatch`]
    /// before returning the error; on any failure it should record the
    /// call's description ([`Call::describe`]).
    ///
    /// A device backend returns once the collective is queued on its
    /// device, with the event after which it is done there; the engine's
    /// watchdog polls that event against the deadline.
    /// The engine keeps `collective` (its tensors) until the device work
    /// is done.
    ///
    /// A host backend may also return an event (copies of results back
    /// to a GPU still queued): its `Work` then completes on the device.
    /// The engine does not watch such an event or keep the collective
    /// for it; the backend keeps what the device work needs alive.
    fn run(&self, collective: &Collective, call: &Call) -> Result<Option<Arc<dyn DeviceEvent>>>;

    /// Closes this rank's connections so the other ranks fail promptly;
    /// called once, after a failure has been posted.
    fn abort(&self);

    /// True for a backend whose `run` only queues work on a device and
    /// returns at once: the engine then runs each collective on the
    /// caller's thread, in call order, with no thread hand-off, and
    /// watches its device event.
    fn runs_inline(&self) -> bool {
        false
    }

    /// How long the group's thread, once idle, polls for the next
    /// collective before it sleeps, and how long a caller waiting for a
    /// collective that thread runs polls before it sleeps: a call then
    /// reaches the thread, and its outcome the caller, without a wake-up
    /// (two system calls and two scheduling delays). Zero (the default)
    /// never polls; a backend returns more only where its ranks have
    /// cores to spare for it.
    fn idle_spin(&self) -> Duration {
        Duration::ZERO
    }

    /// An error the backend's device work raised on its own (NCCL's
    /// asynchronous errors), polled by the watchdog.
    fn health(&self) -> Result<()> {
        Ok(())
    }
}
