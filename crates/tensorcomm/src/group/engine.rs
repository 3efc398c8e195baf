//! The engine: one collective's life on this rank, the same for every
//! backend. A validated call takes the next sequence number and joins the
//! group's queue; it runs on the group's own thread, or on a caller that
//! waits on its [`Work`] before that thread reaches it (so call-then-wait
//! costs no thread hand-off while that thread sleeps), always after every
//! earlier collective of the group. Where the backend has CPUs to spare
//! ([`GroupBackend::idle_spin`]), the group's thread polls for the next
//! call after each short one instead of sleeping, so it usually takes a
//! call at once, and a caller waiting for a call polls for its outcome
//! (both only after a call that ran no longer than that poll): no wake-up
//! either way. A caller inside [`run_here`](super::run_here) runs its
//! collective without queuing it to that thread at all (no wake-up). On
//! failure the engine breaks the group (later calls fail with
//! [`Error::GroupBroken`]), posts the root cause to the store before the
//! backend closes its connections (so every rank names the same cause),
//! and returns [`Error::CollectiveFailed`] naming the op, the sequence
//! number and the peers involved. The flight recorder sees every step.
//!
//! A device backend ([`GroupBackend::runs_inline`]) only queues work on a
//! device: its collectives run on the caller's thread at once, under the
//! queue's lock (so in call order, with no hand-off), and the
//! [`Watchdog`] polls their device events against their deadlines.

use std::sync::mpsc::{channel, Sender};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::time::{Duration, Instant};

use super::absent_ranks::{blame_absent, blame_unqueued};
use super::backend::{is_aborted, Call, GroupBackend};
use super::call_description::describe;
use super::caller_runs::keep;
use super::collective::{Collective, Validated};
use super::failure_hooks::OnDeviceFailure;
use super::failure_report::FailureBoard;
use super::fingerprint::{Fingerprint, FINGERPRINT_LEN};
use super::idle_poll::{next_job, IdlePoll};
use super::stall_check::{CallRing, StallKeys, StallMonitor};
use super::turn::{Job, QueuedJob, Turn};
use super::watchdog::{Pending, TrackedEvent, Watchdog};
use super::{DeviceEvent, FlightRecorder, Work};
use crate::store::Store;
use crate::{Error, Result};

/// What the group's thread shares with the callers.
struct Shared {
    rank: usize,
    /// The group's size.
    size: usize,
    backend: Arc<dyn GroupBackend>,
    /// The collective whose failure broke the group, if any.
    broken: Mutex<Option<(String, u64)>>,
    recorder: FlightRecorder,
    turn: Turn,
    /// Where a failed collective posts its root cause before the backend
    /// closes its connections (see `failure_report.rs`).
    failures: FailureBoard,
    /// A device backend's watchdog.
    watchdog: OnceLock<Arc<Watchdog>>,
    /// A host backend's stall check.
    monitor: OnceLock<Arc<StallMonitor>>,
    /// This rank's recent calls (recorded by the watchdog or the stall
    /// check, whichever the backend has).
    calls: Arc<CallRing>,
    /// The group's idle poll ([`GroupBackend::idle_spin`]): the group's
    /// thread polls for the next collective, and a caller for its
    /// collective's outcome, only after a short one.
    poll: Arc<IdlePoll>,
}

impl Shared {
    /// This rank's fingerprint of recent collective `seq`.
    fn recent(&self, seq: u64) -> Option<Fingerprint> {
        self.calls.get(seq)
    }
}

/// The next sequence number and the queue to the group's thread, under one
/// lock so that sequence order is queue order.
struct Queue {
    next_seq: u64,
    jobs: Sender<Arc<QueuedJob>>,
    /// A collective kept off the channel for its caller; any later submit
    /// queues it first, so channel order stays sequence order.
    held: Option<Arc<QueuedJob>>,
}

/// Runs a group's collectives through its backend (see the module docs).
pub(crate) struct Engine {
    shared: Arc<Shared>,
    queue: Mutex<Queue>,
    timeout: Duration,
}

impl Engine {
    /// The engine of rank `rank` of a group whose store keys start with
    /// `key_prefix`, running collectives through `backend` with `timeout`
    /// unless a call says otherwise; starts the group's thread.
    pub(crate) fn start(
        backend: Arc<dyn GroupBackend>,
        store: Arc<dyn Store>,
        key_prefix: &str,
        (rank, size): (usize, usize),
        recorder: FlightRecorder,
        timeout: Duration,
    ) -> Result<Self> {
        let (jobs, incoming) = channel::<Arc<QueuedJob>>();
        let poll = Arc::new(IdlePoll::new(backend.idle_spin()));
        let thread_poll = poll.clone();
        std::thread::Builder::new()
            .name(format!("tensorcomm-pg-rank{rank}"))
            .spawn(move || {
                while let Some(job) = next_job(&incoming, thread_poll.now()) {
                    job.run_once();
                }
            })
            .map_err(|e| Error::io("starting the process group's thread", e))?;
        Ok(Engine {
            shared: Arc::new(Shared {
                rank,
                size,
                backend,
                broken: Mutex::new(None),
                recorder,
                turn: Turn::default(),
                failures: FailureBoard::new(store.clone(), key_prefix),
                watchdog: OnceLock::new(),
                monitor: OnceLock::new(),
                calls: Arc::default(),
                poll,
            }),
            queue: Mutex::new(Queue {
                next_seq: 0,
                jobs,
                held: None,
            }),
            timeout,
        })
        .and_then(|engine| {
            let hooks = Arc::new(DeviceHooks {
                shared: engine.shared.clone(),
            });
            let inline = engine.shared.backend.runs_inline();
            if inline {
                let calls = engine.shared.calls.clone();
                let dog = Watchdog::start(
                    store.clone(),
                    key_prefix,
                    (rank, size),
                    calls,
                    hooks.clone(),
                )?;
                let _ = engine.shared.watchdog.set(dog);
            }
            // A host backend's collectives run on the group's thread; a
            // device backend's are only queued there, but queuing may
            // block (NCCL's group end while a peer is missing or
            // mismatched), and the watchdog only sees queued work: the
            // monitor watches the call while it is in the backend.
            if size > 1 {
                let keys = StallKeys {
                    prefix: key_prefix.into(),
                    rank,
                    size,
                };
                let calls = (engine.shared.calls.clone(), !inline);
                let monitor = StallMonitor::start(store, keys, calls, hooks)?;
                let _ = engine.shared.monitor.set(monitor);
            }
            Ok(engine)
        })
    }

    /// Says that rank `rank` of the group hosts its store (see
    /// [`FailureBoard::set_store_host`]).
    pub(crate) fn set_store_host(&self, rank: usize) {
        self.shared.failures.set_store_host(rank);
    }

    /// The timeout of a call that names none.
    pub(crate) fn default_timeout(&self) -> Duration {
        self.timeout
    }

    /// The flight recorder's record of this group, as JSON.
    pub(crate) fn flight_recorder_json(&self) -> String {
        self.shared.recorder.to_json()
    }

    /// Takes the next sequence number and queues `call` to run under it,
    /// on the group's thread or on a thread that waits on the returned
    /// `Work` first; either way after every earlier collective of the
    /// group.
    pub(crate) fn submit(&self, call: Validated, timeout: Option<Duration>) -> Result<Work> {
        let Validated {
            mut fingerprint,
            collective,
        } = call;
        let timeout = timeout.unwrap_or(self.timeout);
        // On the caller's thread, before the call is queued: what the
        // backend must do in call order with the caller (see
        // `GroupBackend::prepare`); a failure here fails the collective
        // when it runs, so every rank hears of it.
        let prepared = self.shared.backend.prepare(&collective);
        let deadline = Instant::now() + timeout;
        let mut queue = self.queue.lock().unwrap_or_else(PoisonError::into_inner);
        fingerprint.seq = queue.next_seq;
        self.shared.recorder.queued(&fingerprint);
        if let Some(dog) = self.shared.watchdog.get() {
            queue.next_seq += 1;
            // Still under the queue's lock: device work is queued in call
            // order.
            dog.started(&fingerprint);
            let call = Call::new(fingerprint, deadline)
                .with_timeout(timeout)
                .with_prepared(prepared);
            let outcome = run(&self.shared, call, &collective);
            let pending = Pending {
                fingerprint,
                collective,
                deadline,
                timeout,
            };
            // Tracked before the lock is released, so in sequence order.
            let work = self.device_work(dog, pending, outcome);
            drop(queue);
            return Ok(work);
        }
        let (work, completion) = Work::polling_for(self.shared.poll.now());
        let shared = self.shared.clone();
        let job: Job = Box::new(move || {
            // Device work keeps its tensors until the job ends, as before.
            let mut kept = None;
            let hooks = {
                let _turn = shared.turn.wait_for(fingerprint.seq);
                let call = Call::new(fingerprint, deadline)
                    .with_timeout(timeout)
                    .with_prepared(prepared);
                let result = shared.poll.timed(|| run(&shared, call, &collective));
                let (outcome, event) = match result {
                    Ok(event) => (Ok(()), event),
                    Err(e) => (Err(e), None),
                };
                shared.recorder.finished(fingerprint.seq, &outcome);
                // Host-only work lets go of its tensors before the waiter
                // hears of it, so that a caller back from `wait` holds the
                // only handle (as `Tensor::into_vec` needs); device work
                // keeps them until the job ends, as before.
                if event.is_some() {
                    kept = Some(collective);
                } else {
                    drop(collective);
                }
                // Complete before the turn passes on (when `_turn` drops),
                // so no later collective (a barrier) can finish while this
                // one's Work is not complete. A host backend may leave
                // device work behind (copies of CUDA tensors back to their
                // GPU): the work then completes on the device, as a device
                // backend's does.
                completion.settle(outcome, event)
            };
            // The futures' callbacks run after the turn has passed on, so
            // one may wait on another collective of this group.
            hooks.run();
            drop(kept);
        });
        let job = Arc::new(QueuedJob {
            job: Mutex::new(Some(job)),
        });
        let runner = job.clone();
        let work = work.with_runner(Box::new(move || runner.run_once()));
        // A collective kept for its caller goes to the queue before this
        // one, unless its caller has already taken it (the usual case:
        // queuing it then would only wake the group's thread for nothing).
        if let Some(held) = queue.held.take().filter(|h| !h.is_taken()) {
            let _ = queue.jobs.send(held);
        }
        if keep(&job) {
            queue.held = Some(job);
        } else if queue.jobs.send(job).is_err() {
            return Ok(Work::done(Err(Error::GroupBroken {
                op: fingerprint.kind.name().into(),
                seq: fingerprint.seq,
            })));
        }
        queue.next_seq += 1;
        Ok(work)
    }

    /// The `Work` of a device backend's collective `pending`, whose host
    /// part ended with `outcome`; device work goes to the watchdog, which
    /// keeps the collective's tensors until it is done.
    fn device_work(
        &self,
        dog: &Watchdog,
        pending: Pending,
        outcome: Result<Option<Arc<dyn DeviceEvent>>>,
    ) -> Work {
        let fp = pending.fingerprint;
        match outcome {
            Ok(Some(event)) => {
                let tracked = Arc::new(TrackedEvent {
                    seq: fp.seq,
                    inner: event.clone(),
                    failure: dog.failure.clone(),
                });
                dog.track(pending, event);
                let (work, completion) = Work::new();
                completion.complete_on_device(Ok(()), tracked);
                work
            }
            Ok(None) => {
                self.shared.recorder.finished(fp.seq, &Ok(()));
                Work::done(Ok(()))
            }
            Err(e) => {
                let outcome = Err(e);
                self.shared.recorder.finished(fp.seq, &outcome);
                Work::done(outcome)
            }
        }
    }
}

impl Drop for Engine {
    fn drop(&mut self) {
        if let Some(dog) = self.shared.watchdog.get() {
            dog.stop();
        }
        if let Some(monitor) = self.shared.monitor.get() {
            monitor.stop();
        }
    }
}

/// What the watchdog of a device backend's group does through the engine.
struct DeviceHooks {
    shared: Arc<Shared>,
}

impl OnDeviceFailure for DeviceHooks {
    fn settle(
        &self,
        fp: &Fingerprint,
        mismatched: Option<(usize, [u8; FINGERPRINT_LEN])>,
        source: Error,
    ) -> Error {
        settle(&self.shared, fp, mismatched, source).0
    }

    fn abort(&self) {
        self.shared.backend.abort();
    }

    fn begin_failing(&self, seq: u64) {
        if let Some(dog) = self.shared.watchdog.get() {
            dog.begin_failing(seq);
        }
    }

    fn fail_pending(&self, seq: u64, error: Error) {
        if let Some(dog) = self.shared.watchdog.get() {
            dog.fail_pending(seq, error);
        }
    }

    fn with_both_sides(&self, fp: &Fingerprint, source: Error, mine: Option<&str>) -> Error {
        self.shared.failures.with_both_sides(fp, source, mine)
    }

    fn named(&self, fp: &Fingerprint, source: Error) -> Error {
        named(&self.shared, fp, source)
    }

    fn health(&self) -> Result<()> {
        self.shared.backend.health()
    }

    fn finished(&self, seq: u64, outcome: &Result<()>) {
        self.shared.recorder.finished(seq, outcome);
    }
}

/// Runs one collective (on the group's thread or a waiting caller's):
/// refuses to run on a broken group, and on failure settles the cause
/// through the store, closes the backend's connections and names the op,
/// sequence number and peers.
fn run(
    shared: &Shared,
    call: Call,
    collective: &Collective,
) -> Result<Option<Arc<dyn DeviceEvent>>> {
    let fp = call.fingerprint;
    let op = fp.kind.name();
    if let Some((op, seq)) = shared
        .broken
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .clone()
    {
        return Err(Error::GroupBroken { op, seq });
    }
    shared.recorder.started(fp.seq);
    let started = Instant::now();
    let monitor = shared.monitor.get();
    if let Some(m) = monitor {
        m.begin(&fp);
    }
    let outcome = shared.backend.run(collective, &call);
    if let Some(m) = monitor {
        m.end();
    }
    if outcome.is_err() && call.description().is_none() {
        // A mismatch is told with this rank's call in full (a host backend
        // has described it already).
        call.describe(describe(&fp, collective));
    }
    tracing::debug!(
        op,
        seq = fp.seq,
        elapsed_us = started.elapsed().as_micros() as u64,
        ok = outcome.is_ok(),
        "collective"
    );
    outcome.map_err(|source| fail(shared, &fp, &call, source))
}

/// Breaks the group after collective `fp` failed with `source`: posts the
/// report before the connections close (so a rank that fails because they
/// closed finds it), closes them, adds both sides' descriptions of a
/// mismatch, and names what failed.
fn fail(shared: &Shared, fp: &Fingerprint, call: &Call, source: Error) -> Error {
    // A call failed by this group's own abort: whoever aborted (the stall
    // monitor, the watchdog) recorded the cause first. It is told when the
    // store, where it was posted too, cannot give it any more (its host
    // rank exits once it has reported).
    let recorded = shared.watchdog.get().and_then(|dog| {
        // Earlier device work that ends while this settles is not done.
        dog.begin_failing(fp.seq);
        dog.failure.of(fp.seq).filter(|_| is_aborted(&source))
    });
    let source = with_timeout_set(call, source);
    // A call that never got queued names the ranks that never came.
    let ranks = (shared.rank, shared.size);
    let timeout = call.timeout.unwrap_or_default();
    let source = blame_unqueued(&shared.failures, ranks, fp.seq, source, timeout);
    let (source, earlier) = settle(shared, fp, call.mismatched(), source);
    if let Some(dog) = shared.watchdog.get() {
        // Device work queued before this call is aborted with it: its
        // `Work`s fail too, not report aborted kernels as done.
        dog.fail_pending(fp.seq, named(shared, fp, source.clone()));
    }
    shared.backend.abort();
    // Both sides' descriptions are of this call; a cause inherited from an
    // earlier collective is told as its report has it.
    let source = match earlier {
        None => shared
            .failures
            .with_both_sides(fp, source, call.description()),
        Some(_) => source,
    };
    let aborted = is_aborted(&source);
    match recorded {
        // Told for this collective when it broke the group at an earlier
        // one (the same cause, as the path through the store tells it).
        Some(Error::CollectiveFailed {
            seq, source: cause, ..
        }) if aborted && seq != fp.seq => named(shared, fp, *cause),
        Some(recorded) if aborted => recorded,
        _ => named(shared, fp, source),
    }
}

/// A peer timeout names the timeout the caller set (a wait inside the
/// call measures from its own start, a little later), then what it
/// measured.
fn with_timeout_set(call: &Call, source: Error) -> Error {
    match (source, call.timeout) {
        (
            Error::PeerTimeout {
                peer,
                during,
                timeout: measured,
            },
            Some(set),
        ) => Error::PeerTimeout {
            peer,
            during: format!("{during}; this wait measured {measured:?}"),
            timeout: set,
        },
        (source, _) => source,
    }
}

/// [`fail`] short of closing the connections: marks the group broken and
/// posts the report; gives the root cause, and the sequence number of the
/// earlier collective it belongs to when it is not `fp`'s.
fn settle(
    shared: &Shared,
    fp: &Fingerprint,
    mismatched: Option<(usize, [u8; FINGERPRINT_LEN])>,
    source: Error,
) -> (Error, Option<u64>) {
    let op = fp.kind.name();
    *shared.broken.lock().unwrap_or_else(PoisonError::into_inner) = Some((op.into(), fp.seq));
    // A timeout on a rank that was itself waiting names the rank that
    // never came, before the report is posted.
    let source = blame_absent(&shared.failures, (shared.rank, shared.size), fp.seq, source);
    let source = shared.failures.settle(fp, shared.rank, source, mismatched);
    shared
        .failures
        .earlier_cause(fp.seq, shared.rank, source, |seq| shared.recent(seq))
}

/// The error naming collective `fp`, this rank and the peers involved in
/// `source`.
fn named(shared: &Shared, fp: &Fingerprint, source: Error) -> Error {
    let op = fp.kind.name();
    let ranks = match &source {
        Error::PeerClosed { peer, .. }
        | Error::PeerTimeout { peer, .. }
        | Error::PeerIo { peer, .. }
        | Error::PeerProtocol { peer, .. }
        | Error::CollectiveMismatch { peer, .. } => vec![*peer],
        // The fault is this rank's own.
        Error::LinkShutDownHere { .. } => vec![shared.rank],
        Error::RanksMissing { missing, .. } => missing.clone(),
        Error::CollectiveTimeout { lagging, .. } => lagging.clone(),
        _ => Vec::new(),
    };
    Error::CollectiveFailed {
        op: op.into(),
        seq: fp.seq,
        rank: shared.rank,
        ranks,
        source: Box::new(source),
    }
}
