//! The watchdog of a device backend's group: collectives whose host part
//! has returned and whose device part is still queued are polled here
//! until their device event passes. One that passes its deadline, or a
//! backend that reports an asynchronous error, fails the group through the
//! engine: the cause is posted to the store, the backend aborted, and
//! every pending collective's `Work` fails with the cause.
//!
//! Each rank also publishes its progress (the last sequence number it
//! started and the last it completed) to the store, so a timeout can say
//! which ranks had and had not reached the collective. A collective that
//! stalls is checked against the other ranks' recent calls
//! (`stall_check.rs`): a mismatch, or a failure another rank posted, ends
//! it long before its deadline.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::time::{Duration, Instant};

use super::absent_ranks::furthest_behind;
use super::call_description::describe;
use super::collective::Collective;
use super::failure_hooks::OnDeviceFailure;
use super::fingerprint::{Fingerprint, FINGERPRINT_LEN};
use super::progress::{progress_prefix, Progress, ProgressKeys};
use super::stall_check::{self, CallRing, Finding, StallKeys, RECHECK, STALL, STORE_REST};
use super::store_worker::{Answer, Reply, StoreWorker};
use super::work::DeviceEvent;
use crate::store::{read_if_present, Store};
use crate::{Error, Result};

/// How often pending device work is polled.
const POLL: Duration = Duration::from_micros(200);
/// How long the watchdog keeps polling after its last pending collective
/// before it sleeps until woken.
const IDLE_AFTER: Duration = Duration::from_millis(20);
/// How often a rank's progress is published while it changes.
const PUBLISH_EVERY: Duration = Duration::from_millis(100);
/// How long a collective's timeout error waits for the other ranks'
/// progress from the store before it says without it.
const PROGRESS_PATIENCE: Duration = Duration::from_secs(5);

/// A collective whose device part is still running: its call, which the
/// watchdog keeps (and with it the tensors) until the device is done.
pub(crate) struct Pending {
    pub(crate) fingerprint: Fingerprint,
    pub(crate) collective: Collective,
    pub(crate) deadline: Instant,
    pub(crate) timeout: Duration,
}

/// A pending collective and the event after which it is done.
struct Tracked {
    pending: Pending,
    event: Arc<dyn DeviceEvent>,
}

/// The failure that broke a device group: the first failed sequence
/// number and its error. Every pending or later collective sees it.
pub(crate) struct DeviceFailure {
    failed: Mutex<Option<(u64, Error)>>,
    /// The first sequence number the watchdog has begun failing (u64::MAX:
    /// none): from then until the error is set, that collective and later
    /// ones are not done, whatever the device says.
    deciding_from: AtomicU64,
}

impl Default for DeviceFailure {
    fn default() -> Self {
        DeviceFailure {
            failed: Mutex::default(),
            deciding_from: AtomicU64::new(u64::MAX),
        }
    }
}

impl DeviceFailure {
    /// The watchdog has found collective `seq` failed (past its deadline,
    /// mismatched, or failed on another rank) and is settling the cause,
    /// which takes store round trips and, for a timeout, a wait for the
    /// peers' progress. Device work that ends meanwhile (a peer that died
    /// or aborted can make a waiting kernel end, with garbage) must not
    /// count as done.
    pub(crate) fn begin(&self, seq: u64) {
        self.deciding_from.fetch_min(seq, Ordering::AcqRel);
    }

    /// Whether the watchdog is failing collective `seq` (see [`begin`]).
    ///
    /// [`begin`]: DeviceFailure::begin
    fn deciding(&self, seq: u64) -> bool {
        seq >= self.deciding_from.load(Ordering::Acquire)
    }

    /// Records the failure of collective `seq` (the first one counts), and
    /// ends the decision [`begin`] started: collectives before the recorded
    /// one are done when their device work is, whether or not this call's
    /// failure was the one recorded.
    ///
    /// [`begin`]: DeviceFailure::begin
    /// The failure covers the collectives from the first one [`begin`]
    /// held back, if that is earlier than `seq`: their device work may
    /// have ended meanwhile and left the pending queue.
    pub(crate) fn set(&self, seq: u64, error: Error) {
        let mut failed = self.failed.lock().unwrap_or_else(PoisonError::into_inner);
        if failed.is_none() {
            let held = self.deciding_from.load(Ordering::Acquire);
            *failed = Some((seq.min(held), error));
        }
        self.deciding_from.store(u64::MAX, Ordering::Release);
    }

    /// The error that collective `seq` ends with, if the group failed at
    /// or before it.
    pub(crate) fn of(&self, seq: u64) -> Option<Error> {
        match &*self.failed.lock().unwrap_or_else(PoisonError::into_inner) {
            Some((failed, e)) if seq >= *failed => Some(e.clone()),
            _ => None,
        }
    }
}

/// A backend's device event as the `Work` sees it: the group's failure at
/// or before this collective replaces whatever the device says (aborted
/// work may look complete).
pub(crate) struct TrackedEvent {
    pub(crate) seq: u64,
    pub(crate) inner: Arc<dyn DeviceEvent>,
    pub(crate) failure: Arc<DeviceFailure>,
}

impl DeviceEvent for TrackedEvent {
    fn query(&self) -> Result<bool> {
        // The device first, then whether a decision is under way, then the
        // failure (a decision ends once its failure is recorded): device
        // work seen done before the watchdog began failing the group is
        // done; work seen done after is not.
        let done = self.inner.query();
        let deciding = self.failure.deciding(self.seq);
        if let Some(e) = self.failure.of(self.seq) {
            return Err(e);
        }
        if deciding {
            return Ok(false);
        }
        done
    }

    fn synchronize(&self) -> Result<()> {
        // Poll rather than block in the device's own wait, so that a
        // failure (posted by the watchdog) ends the wait.
        let started = Instant::now();
        loop {
            if self.query()? {
                return Ok(());
            }
            if started.elapsed() < Duration::from_micros(50) {
                std::hint::spin_loop();
            } else {
                std::thread::sleep(Duration::from_micros(20));
            }
        }
    }

    fn wait_on_current_stream(&self) -> Result<()> {
        if let Some(e) = self.failure.of(self.seq) {
            return Err(e);
        }
        self.inner.wait_on_current_stream()
    }
}

/// The watchdog's shared state; the engine queues into it.
pub(crate) struct Watchdog {
    pending: Mutex<VecDeque<Tracked>>,
    wake: Condvar,
    /// Set while the thread sleeps on `wake` (only then does queueing
    /// notify it, which costs a system call).
    sleeping: AtomicBool,
    stop: AtomicBool,
    pub(crate) failure: Arc<DeviceFailure>,
    progress: Mutex<Progress>,
    recent: Arc<CallRing>,
    thread: Mutex<Option<std::thread::JoinHandle<()>>>,
}

impl Watchdog {
    /// Starts the watchdog thread of rank `rank` of a group of `size`
    /// whose progress keys start with `key_prefix`, recording calls in
    /// `recent`.
    pub(crate) fn start(
        store: Arc<dyn Store>,
        key_prefix: &str,
        (rank, size): (usize, usize),
        recent: Arc<CallRing>,
        engine: Arc<dyn OnDeviceFailure>,
    ) -> Result<Arc<Watchdog>> {
        let dog = Arc::new(Watchdog {
            pending: Mutex::new(VecDeque::new()),
            wake: Condvar::new(),
            sleeping: AtomicBool::new(false),
            stop: AtomicBool::new(false),
            failure: Arc::default(),
            progress: Mutex::default(),
            recent,
            thread: Mutex::default(),
        });
        let keys = ProgressKeys {
            prefix: progress_prefix(key_prefix),
            rank,
            size,
        };
        let stall = StallKeys {
            prefix: key_prefix.into(),
            rank,
            size,
        };
        let runner = dog.clone();
        let worker = StoreWorker::start(store, format!("tensorcomm-watchdog-store{rank}"))?;
        let handle = std::thread::Builder::new()
            .name(format!("tensorcomm-watchdog{rank}"))
            .spawn(move || runner.run(&worker, &keys, &stall, &*engine))
            .map_err(|e| Error::io("starting the process group's watchdog", e))?;
        *dog.thread.lock().unwrap_or_else(PoisonError::into_inner) = Some(handle);
        Ok(dog)
    }

    /// Notes that collective `fp` started (its host part runs now).
    pub(crate) fn started(&self, fp: &Fingerprint) {
        self.lock_progress().started = Some(fp.seq);
        self.recent.record(fp);
    }

    /// The first collective a failure of collective `seq` covers: the
    /// first pending one, or `seq`.
    fn first_failed(&self, seq: u64) -> u64 {
        self.pending
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .front()
            .map_or(seq, |t| t.pending.fingerprint.seq.min(seq))
    }

    /// A failure of collective `seq` is being settled (see
    /// [`DeviceFailure::begin`]); [`Watchdog::fail_pending`] ends that.
    pub(crate) fn begin_failing(&self, seq: u64) {
        self.failure.begin(self.first_failed(seq));
    }

    /// Fails every pending collective and collective `seq` (whose host
    /// part failed) with `error`, before the backend is aborted.
    pub(crate) fn fail_pending(&self, seq: u64, error: Error) {
        self.failure.set(self.first_failed(seq), error);
    }

    /// Queues `pending` to be polled until `event`, after its device
    /// work, has passed.
    pub(crate) fn track(&self, pending: Pending, event: Arc<dyn DeviceEvent>) {
        self.pending
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push_back(Tracked { pending, event });
        // The thread sets `sleeping` under the lock before it waits, so
        // it either sees the new entry or is woken here.
        if self.sleeping.load(Ordering::Acquire) {
            self.wake.notify_one();
        }
    }

    /// Ends the watchdog thread and waits for it (the group is dropped):
    /// after this nothing calls into the backend from that thread, so the
    /// backend may be torn down.
    pub(crate) fn stop(&self) {
        self.stop.store(true, Ordering::Release);
        {
            // Under the lock, so a thread about to wait sees `stop` or the
            // notification.
            let _pending = self.pending.lock().unwrap_or_else(PoisonError::into_inner);
            self.wake.notify_one();
        }
        let handle = self
            .thread
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        if let Some(handle) = handle {
            if handle.thread().id() != std::thread::current().id() {
                let _ = handle.join();
            }
        }
    }

    fn lock_progress(&self) -> std::sync::MutexGuard<'_, Progress> {
        self.progress.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn run(
        &self,
        worker: &StoreWorker,
        keys: &ProgressKeys,
        stall: &StallKeys,
        engine: &dyn OnDeviceFailure,
    ) {
        // Store calls go through the worker, so this loop keeps checking
        // deadlines (and `stop`) while the store takes its time; after a
        // failed one, the store is left alone for a while.
        let mut store_rests_until: Option<Instant> = None;
        // The stall check and the progress publication in flight, if any.
        let mut checking: Option<(u64, Answer<Result<Finding>>)> = None;
        let mut publishing: Option<(Progress, Answer<Result<()>>)> = None;
        let mut published = Progress::default();
        let mut last_publish = Instant::now();
        let mut busy = Instant::now();
        // The front collective's sequence number, when it became the front
        // one, and when its stall was last checked.
        let mut front_since: Option<(u64, Instant)> = None;
        let mut checked: Option<Instant> = None;
        while !self.stop.load(Ordering::Acquire) {
            let front = {
                let mut pending = self.pending.lock().unwrap_or_else(PoisonError::into_inner);
                if pending.is_empty()
                    && busy.elapsed() >= IDLE_AFTER
                    && !self.stop.load(Ordering::Acquire)
                {
                    self.sleeping.store(true, Ordering::Release);
                    pending = self
                        .wake
                        .wait_timeout(pending, PUBLISH_EVERY)
                        .unwrap_or_else(PoisonError::into_inner)
                        .0;
                    self.sleeping.store(false, Ordering::Release);
                }
                if !pending.is_empty() {
                    busy = Instant::now();
                }
                pending
                    .front()
                    .map(|t| (t.pending.fingerprint, t.pending.deadline, t.event.clone()))
            };
            let front_seq = front.as_ref().map(|(fp, _, _)| fp.seq);
            if let Some((fp, deadline, event)) = front {
                // While another thread settles a failure that covers this
                // collective, it is not done (see `DeviceFailure::begin`).
                let held = self.failure.deciding(fp.seq);
                match event.query() {
                    Ok(true) if !held => {
                        self.pending
                            .lock()
                            .unwrap_or_else(PoisonError::into_inner)
                            .pop_front();
                        let outcome = match self.failure.of(fp.seq) {
                            Some(e) => Err(e),
                            None => {
                                self.lock_progress().completed = Some(fp.seq);
                                Ok(())
                            }
                        };
                        engine.finished(fp.seq, &outcome);
                        continue;
                    }
                    Ok(true) => {
                        // Held: wait for the settling thread's verdict.
                        std::thread::sleep(POLL);
                        continue;
                    }
                    Ok(false) => {
                        // Any pending collective may be the first past its
                        // deadline (calls may pass shorter timeouts).
                        if let Some(late) = self.first_overdue(deadline) {
                            // `fp` is the front: the first pending one.
                            self.failure.begin(fp.seq);
                            let error = self.timeout_error(worker, keys, late);
                            self.fail_all(engine, &late, error, None);
                            return;
                        }
                    }
                    Err(e) => {
                        self.fail_all(engine, &fp, e, None);
                        return;
                    }
                }
                let since = match front_since {
                    Some((seq, at)) if seq == fp.seq => at,
                    _ => {
                        front_since = Some((fp.seq, Instant::now()));
                        Instant::now()
                    }
                };
                let due = checked.is_none_or(|at| at.elapsed() >= RECHECK)
                    && store_rests_until.is_none_or(|t| Instant::now() >= t)
                    && checking.is_none();
                if since.elapsed() >= STALL && due {
                    checked = Some(Instant::now());
                    // Compared on a copy: callers record their calls
                    // meanwhile.
                    let (recent, stall) = (self.recent.snapshot(), stall.clone());
                    let answer = worker
                        .ask(move |store| stall_check::check(store, &stall, &recent, &fp, true));
                    checking = Some((fp.seq, answer));
                }
            }
            if let Some((asked_for, answer)) = &checking {
                let asked_for = *asked_for;
                match answer.poll() {
                    Reply::Waiting => {}
                    Reply::Gone => checking = None,
                    Reply::Answered(finding) => {
                        checking = None;
                        match finding {
                            Ok(Finding::Nothing) => {}
                            // The collective checked is done meanwhile: a
                            // finding about it would fail one that
                            // succeeded (a real cause is found again by
                            // the next stalled collective's check).
                            Ok(_) if front_seq != Some(asked_for) => {}
                            Ok(Finding::Mismatch(found)) => {
                                let error = found.error(stall.rank);
                                let mismatched = Some((found.peer, found.theirs));
                                self.fail_all(engine, &found.mine, error, mismatched);
                                return;
                            }
                            Ok(Finding::Posted(fp, error)) => {
                                self.fail_all(engine, &fp, error, None);
                                return;
                            }
                            Err(e) => {
                                tracing::debug!("stall check: the store failed: {e}");
                                store_rests_until = Some(Instant::now() + STORE_REST);
                            }
                        }
                    }
                }
            }
            if let Err(e) = engine.health() {
                let fp = self
                    .pending
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .front()
                    .map(|t| t.pending.fingerprint);
                if let Some(fp) = fp {
                    self.fail_all(engine, &fp, e, None);
                    return;
                }
            }
            if let Some((progress, answer)) = &publishing {
                match answer.poll() {
                    Reply::Waiting => {}
                    Reply::Gone => publishing = None,
                    Reply::Answered(outcome) => {
                        // Published only once the store has it.
                        match outcome {
                            Ok(()) => published = *progress,
                            Err(e) => {
                                tracing::debug!("publishing progress: the store failed: {e}");
                                store_rests_until = Some(Instant::now() + STORE_REST);
                            }
                        }
                        publishing = None;
                    }
                }
            }
            let now = *self.lock_progress();
            if now != published
                && publishing.is_none()
                && last_publish.elapsed() >= PUBLISH_EVERY
                && store_rests_until.is_none_or(|t| Instant::now() >= t)
            {
                let key = keys.key(keys.rank);
                let answer = worker.ask(move |store| store.set(&key, now.encode().as_bytes()));
                publishing = Some((now, answer));
                last_publish = Instant::now();
            }
            std::thread::sleep(POLL);
        }
    }

    /// The pending collective with the earliest deadline, if that has
    /// passed (`front`: the front one's deadline, checked first).
    fn first_overdue(&self, front: Instant) -> Option<Fingerprint> {
        let now = Instant::now();
        let pending = self.pending.lock().unwrap_or_else(PoisonError::into_inner);
        if now >= front {
            return pending.front().map(|t| t.pending.fingerprint);
        }
        pending
            .iter()
            .filter(|t| now >= t.pending.deadline)
            .min_by_key(|t| t.pending.deadline)
            .map(|t| t.pending.fingerprint)
    }

    /// The error of pending collective `late` having passed its deadline,
    /// naming every rank's progress (this rank's published first).
    fn timeout_error(&self, worker: &StoreWorker, keys: &ProgressKeys, late: Fingerprint) -> Error {
        let (fp, what, timeout) = {
            let pending = self.pending.lock().unwrap_or_else(PoisonError::into_inner);
            let t = pending
                .iter()
                .find(|t| t.pending.fingerprint.seq == late.seq)
                .expect("a pending collective timed out");
            let fp = t.pending.fingerprint;
            (fp, describe(&fp, &t.pending.collective), t.pending.timeout)
        };
        let mine = *self.lock_progress();
        let keys = keys.clone();
        let rank = keys.rank;
        let answer = worker.ask(move |store| read_all_progress(store, &keys, mine));
        // Behind a call the store holds (its host stopped), or slow: the
        // error says so and blames no rank (unknown is not behind).
        let (progress, lagging) = match answer.wait(PROGRESS_PATIENCE) {
            Reply::Answered(Some(all)) => describe_progress(fp.seq, &all),
            Reply::Answered(None) | Reply::Waiting | Reply::Gone => {
                let unknown = format!(
                    "{}; the store did not give the other ranks' progress within \
                     {PROGRESS_PATIENCE:?}",
                    describe_one(&format!("rank {rank}"), Some(&mine))
                );
                (unknown, Vec::new())
            }
        };
        Error::CollectiveTimeout {
            what,
            timeout,
            progress,
            lagging,
        }
    }

    /// Breaks the group at `fp` (posting the cause and, for stalled peers,
    /// which collective failed) and makes every pending `Work` fail (a
    /// mismatch told with both sides' descriptions) before the backend is
    /// aborted.
    fn fail_all(
        &self,
        engine: &dyn OnDeviceFailure,
        fp: &Fingerprint,
        source: Error,
        mismatched: Option<(usize, [u8; FINGERPRINT_LEN])>,
    ) {
        let first = self.first_failed(fp.seq);
        self.failure.begin(first);
        let source = engine.settle(fp, mismatched, source);
        // A mismatch is told in full: this rank's call and the peer's, which
        // it posts when it finds the mismatch too (peers of a device group
        // learn through the store, so this comes before the abort).
        let source = if matches!(source, Error::CollectiveMismatch { .. }) {
            let mine = self
                .pending
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .iter()
                .find(|t| t.pending.fingerprint.seq == fp.seq)
                .map(|t| describe(fp, &t.pending.collective));
            engine.with_both_sides(fp, source, mine.as_deref())
        } else {
            source
        };
        // Before the abort, which may wait for the device: waiters see the
        // failure at once.
        self.failure.set(first, engine.named(fp, source));
        engine.abort();
        let error = self
            .failure
            .of(u64::MAX)
            .expect("the failure was recorded above");
        let drained: Vec<Tracked> = self
            .pending
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .drain(..)
            .collect();
        for t in drained {
            engine.finished(t.pending.fingerprint.seq, &Err(error.clone()));
        }
    }
}

/// Publishes this rank's progress `mine`, lets the others publish theirs,
/// and reads every rank's (`None` for a rank that published none);
/// `None` when a store call failed.
fn read_all_progress(
    store: &dyn Store,
    keys: &ProgressKeys,
    mine: Progress,
) -> Option<Vec<Option<Progress>>> {
    store
        .set(&keys.key(keys.rank), mine.encode().as_bytes())
        .ok()?;
    // The others publish within PUBLISH_EVERY of a change.
    std::thread::sleep(PUBLISH_EVERY * 2);
    (0..keys.size)
        .map(|r| match r == keys.rank {
            true => Some(Some(mine)),
            false => read_if_present(store, &keys.key(r))
                .ok()
                .map(|read| read.and_then(|v| Progress::decode(&v))),
        })
        .collect()
}

/// Where `who` (a rank, ranks, every rank) was: `progress` published,
/// or none.
fn describe_one(who: &str, progress: Option<&Progress>) -> String {
    let seq_text = |v: Option<u64>| v.map_or("none".into(), |v| format!("seq {v}"));
    match progress {
        Some(p) => format!(
            "{who} last started {}, last completed {}",
            seq_text(p.started),
            seq_text(p.completed)
        ),
        None => format!("{who} published no progress"),
    }
}

/// Says where every rank was when collective `seq` timed out, grouping
/// ranks at the same point, and lists the ranks that never started it and
/// are furthest behind: a rank that stopped early leaves the ranks after
/// it stuck at later collectives (and timing out there), and naming those
/// too would blame the ranks it held up (4 ranks on NCCL: rank 1 stopped
/// at seq 1 and rank 2, waiting for it, stayed at seq 3).
pub(crate) fn describe_progress(seq: u64, all: &[Option<Progress>]) -> (String, Vec<usize>) {
    let mut groups: Vec<(Option<Progress>, Vec<usize>)> = Vec::new();
    for (rank, p) in all.iter().enumerate() {
        match groups.iter_mut().find(|(q, _)| q == p) {
            Some((_, ranks)) => ranks.push(rank),
            None => groups.push((*p, vec![rank])),
        }
    }
    let parts: Vec<String> = groups
        .iter()
        .map(|(p, ranks)| {
            let who = if ranks.len() == all.len() && all.len() > 1 {
                "every rank".to_string()
            } else if ranks.len() == 1 {
                format!("rank {}", ranks[0])
            } else {
                format!(
                    "ranks {}",
                    ranks
                        .iter()
                        .map(ToString::to_string)
                        .collect::<Vec<_>>()
                        .join(", ")
                )
            };
            describe_one(&who, p.as_ref())
        })
        .collect();
    // How far each rank got: `None` (nothing started, or no progress
    // published) is furthest behind.
    let reached: Vec<Option<u64>> = all.iter().map(|p| p.and_then(|p| p.started)).collect();
    (parts.join("; "), furthest_behind(&reached, seq))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Device work that has finished.
    struct Finished;

    impl DeviceEvent for Finished {
        fn query(&self) -> Result<bool> {
            Ok(true)
        }
        fn synchronize(&self) -> Result<()> {
            Ok(())
        }
        fn wait_on_current_stream(&self) -> Result<()> {
            Ok(())
        }
    }

    #[test]
    fn finished_work_is_not_done_while_its_failure_is_settled_and_done_before_it() {
        let failure = Arc::new(DeviceFailure::default());
        let event = |seq| TrackedEvent {
            seq,
            inner: Arc::new(Finished),
            failure: failure.clone(),
        };
        let why = |what: &str| Error::InvalidArgument(what.into());
        // Another path recorded a failure at 5 first; then the watchdog
        // begins failing 2 (a posted failure of an earlier collective).
        failure.set(5, why("first"));
        failure.begin(2);
        assert!(!event(3).query().unwrap(), "settling: not done");
        assert!(event(1).query().unwrap(), "before the decision: done");
        // Its own failure is not the one kept, yet the decision is over:
        // work before the recorded failure is done again, not waited for
        // forever (a review found that).
        failure.set(2, why("second"));
        assert!(event(3).query().unwrap());
        assert!(matches!(event(5).query(), Err(Error::InvalidArgument(w)) if w == "first"));
    }

    #[test]
    fn a_failure_covers_what_its_decision_held_back() {
        // The engine began failing at seq 0 (the first pending then); seq
        // 0's device work ended while it settled and left the queue, so
        // the failure it records from what is pending names seq 1. Seq 0
        // must fail with it, not be done (a review found that).
        let failure = DeviceFailure::default();
        failure.begin(0);
        failure.set(1, Error::InvalidArgument("settled".into()));
        assert!(failure.of(0).is_some());
    }

    fn at(started: u64, completed: u64) -> Option<Progress> {
        Some(Progress {
            started: Some(started),
            completed: Some(completed),
        })
    }

    #[test]
    fn a_rank_behind_the_others_is_named_and_lagging() {
        let (text, lagging) = describe_progress(42, &[at(42, 41), at(41, 41), at(42, 41)]);
        assert_eq!(
            text,
            "ranks 0, 2 last started seq 42, last completed seq 41; \
             rank 1 last started seq 41, last completed seq 41"
        );
        assert_eq!(lagging, [1]);
    }

    #[test]
    fn only_the_ranks_furthest_behind_are_blamed() {
        // Rank 1 stopped at seq 1; rank 2 got stuck at seq 3 waiting for it.
        let (text, lagging) = describe_progress(4, &[at(4, 3), at(1, 0), at(3, 2), at(4, 3)]);
        assert!(text.contains("rank 1 last started seq 1"), "{text}");
        assert!(text.contains("rank 2 last started seq 3"), "{text}");
        assert_eq!(lagging, [1]);
        // Two ranks stopped at the same point are both named; a rank that
        // published nothing is behind every rank that did.
        let (_, lagging) = describe_progress(5, &[at(5, 4), at(2, 1), at(2, 1), at(4, 3)]);
        assert_eq!(lagging, [1, 2]);
        let (_, lagging) = describe_progress(5, &[at(5, 4), at(2, 1), None]);
        assert_eq!(lagging, [2]);
    }

    #[test]
    fn ranks_without_progress_lag_and_say_so() {
        let (text, lagging) = describe_progress(0, &[at(0, 0), None]);
        assert!(text.contains("rank 1 published no progress"), "{text}");
        assert_eq!(lagging, [1]);
        let (text, lagging) = describe_progress(3, &[at(3, 2), at(3, 2)]);
        assert_eq!(text, "every rank last started seq 3, last completed seq 2");
        assert!(lagging.is_empty());
    }

    #[test]
    fn a_failure_covers_its_collective_and_later_ones_only() {
        let f = DeviceFailure::default();
        assert!(f.of(5).is_none());
        f.set(5, Error::InvalidArgument("boom".into()));
        f.set(3, Error::InvalidArgument("later report".into()));
        assert!(f.of(4).is_none());
        assert!(f.of(5).unwrap().to_string().contains("boom"));
        assert!(f.of(9).is_some());
    }
}
