//! Mismatch detection for backends that carry no bytes of their own
//! (NCCL): the engine's side channel through the store.
//!
//! Every call's fingerprint goes into a small ring of this rank's recent
//! calls (a copy under a lock; nothing is sent while work progresses). A
//! mismatched collective on such a backend hangs or finishes with garbage,
//! so when the oldest pending collective has been running for
//! [`STALL`], the watchdog posts the ring to the store and compares it with
//! the rings the other ranks posted: the first sequence number whose
//! fingerprints differ is a mismatch, reported like the CPU backend's
//! ([`Error::CollectiveMismatch`](crate::Error::CollectiveMismatch), both
//! sides named). A stalled rank also looks for a failure another rank has
//! posted for the group, so every rank stops promptly, not at its timeout.
//!
//! Backends that do carry fingerprints (the CPU backend) find most
//! mismatches in their own messages, but not all: ranks that wait on each
//! other in a circle (broadcasts whose roots disagree) never exchange a
//! message. Their groups run a [`StallMonitor`]: a thread that compares the
//! same rings when the running collective stalls, and on a mismatch posts
//! it and closes the backend's connections, so the blocked collective
//! fails and reports the posted mismatch.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::failure_hooks::OnDeviceFailure;
use super::failure_report::{failed_seq_key, failure_key, FailureReport};
use super::fingerprint::{Fingerprint, FINGERPRINT_LEN};
use super::store_worker::{Reply, StoreWorker};
use crate::store::{read_if_present, Store};
use crate::{Error, Result};

/// How long the oldest pending collective runs before the ring is
/// compared.
pub(crate) const STALL: Duration = Duration::from_millis(50);
/// How often a stalled rank compares again (others may post later).
pub(crate) const RECHECK: Duration = Duration::from_millis(500);
/// Calls the ring remembers.
pub(crate) const RECENT: usize = 64;

/// This rank's most recent calls' fingerprints, oldest first.
#[derive(Clone, Default)]
pub(crate) struct RecentCalls {
    ring: VecDeque<Fingerprint>,
}

impl RecentCalls {
    pub(crate) fn record(&mut self, fp: &Fingerprint) {
        if self.ring.len() == RECENT {
            self.ring.pop_front();
        }
        self.ring.push_back(*fp);
    }

    pub(crate) fn get(&self, seq: u64) -> Option<Fingerprint> {
        self.ring.iter().find(|f| f.seq == seq).copied()
    }

    /// The ring as its store value: the encoded fingerprints in a row.
    pub(crate) fn encode(&self) -> Vec<u8> {
        self.ring.iter().flat_map(Fingerprint::encode).collect()
    }
}

/// This rank's recent calls, shared by the engine (which looks up a call
/// a failure report names) and the thread that checks stalls.
#[derive(Default)]
pub(crate) struct CallRing(Mutex<RecentCalls>);

impl CallRing {
    pub(crate) fn record(&self, fp: &Fingerprint) {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .record(fp);
    }

    /// This rank's fingerprint of collective `seq`, if it is recent.
    pub(crate) fn get(&self, seq: u64) -> Option<Fingerprint> {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(seq)
    }

    /// A copy, to compare without holding the lock.
    pub(crate) fn snapshot(&self) -> RecentCalls {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}

/// The fingerprints in a posted ring (undecodable entries skipped).
fn decode(bytes: &[u8]) -> Vec<(u64, [u8; FINGERPRINT_LEN])> {
    bytes
        .chunks_exact(FINGERPRINT_LEN)
        .filter_map(|c| {
            let raw: [u8; FINGERPRINT_LEN] = c.try_into().ok()?;
            Fingerprint::decode(&raw).map(|f| (f.seq, raw))
        })
        .collect()
}

/// A mismatch found by comparing rings: this rank's call and what `peer`
/// posted for the same sequence number.
pub(crate) struct Found {
    pub(crate) mine: Fingerprint,
    pub(crate) peer: usize,
    pub(crate) theirs: [u8; FINGERPRINT_LEN],
}

impl Found {
    /// The error, as the CPU backend words it.
    pub(crate) fn error(&self, rank: usize) -> Error {
        let theirs = Fingerprint::decode(&self.theirs)
            .map_or_else(|| "an unreadable fingerprint".into(), |f| f.to_string());
        Error::CollectiveMismatch {
            rank,
            peer: self.peer,
            mine: self.mine.to_string(),
            theirs,
        }
    }
}

/// The first sequence number at which `mine` and `theirs` (posted by
/// `peer`) differ.
pub(crate) fn first_difference(
    mine: &RecentCalls,
    peer: usize,
    theirs: &[(u64, [u8; FINGERPRINT_LEN])],
) -> Option<Found> {
    mine.ring.iter().find_map(|f| {
        let (_, raw) = theirs.iter().find(|(seq, _)| *seq == f.seq)?;
        (*raw != f.encode()).then_some(Found {
            mine: *f,
            peer,
            theirs: *raw,
        })
    })
}

/// Where a group's stall checks meet in the store.
#[derive(Clone)]
pub(crate) struct StallKeys {
    pub(crate) prefix: String,
    pub(crate) rank: usize,
    pub(crate) size: usize,
}

/// Where rank `rank` of the group with key prefix `prefix` posts its ring.
pub(crate) fn ring_key(prefix: &str, rank: usize) -> String {
    format!("{prefix}/recent/{rank}")
}

/// The last sequence number in a posted ring: the collective its poster
/// had started last when it posted (`None`: an empty or unreadable ring).
pub(crate) fn ring_last(posted: &[u8]) -> Option<u64> {
    decode(posted).iter().map(|(seq, _)| *seq).max()
}

impl StallKeys {
    fn ring(&self, rank: usize) -> String {
        ring_key(&self.prefix, rank)
    }

    /// Where a failing rank says which sequence number failed.
    pub(crate) fn failed(&self) -> String {
        failed_seq_key(&self.prefix)
    }
}

/// Posts this rank's ring and compares it with every ring posted so far.
/// An error: a store call failed, and the comparison stopped there.
fn compare(store: &dyn Store, keys: &StallKeys, mine: &RecentCalls) -> Result<Option<Found>> {
    store.set(&keys.ring(keys.rank), &mine.encode())?;
    for r in (0..keys.size).filter(|&r| r != keys.rank) {
        let Some(theirs) = read_if_present(store, &keys.ring(r))? else {
            continue;
        };
        if let Some(found) = first_difference(mine, r, &decode(&theirs)) {
            return Ok(Some(found));
        }
    }
    Ok(None)
}

/// A failure another rank posted for this group, as this rank reports it
/// (`front` is this rank's oldest pending call, `mine` its recent calls).
/// An error: a store call failed.
fn posted_failure(
    store: &dyn Store,
    keys: &StallKeys,
    mine: &RecentCalls,
    front: &Fingerprint,
) -> Result<Option<(Fingerprint, Error)>> {
    let Some(failed) = read_if_present(store, &keys.failed())? else {
        return Ok(None);
    };
    let Some(seq) = String::from_utf8(failed)
        .ok()
        .and_then(|text| text.trim().parse::<u64>().ok())
    else {
        return Ok(None);
    };
    let Some(report) = read_if_present(store, &failure_key(&keys.prefix, seq))? else {
        return Ok(None);
    };
    let Some(report) = FailureReport::decode(&report) else {
        return Ok(None);
    };
    let fp = mine.get(seq).unwrap_or(*front);
    Ok(Some((fp, report.to_error(&fp, keys.rank))))
}

/// What a stall check found.
pub(crate) enum Finding {
    /// Nothing: the stall has no cause the store knows of yet.
    Nothing,
    /// A mismatch with another rank's calls.
    Mismatch(Found),
    /// A failure another rank posted for this group: the collective it
    /// names (as this rank knows it) and the error to report.
    Posted(Fingerprint, Error),
}

/// One stall check of collective `front`: compares this rank's recent
/// calls `mine` with the other ranks' and, when `look_for_posted`, looks
/// for a failure another rank posted. An error: a store call failed.
pub(crate) fn check(
    store: &dyn Store,
    keys: &StallKeys,
    mine: &RecentCalls,
    front: &Fingerprint,
    look_for_posted: bool,
) -> Result<Finding> {
    if let Some(found) = compare(store, keys, mine)? {
        return Ok(Finding::Mismatch(found));
    }
    if look_for_posted {
        if let Some((fp, error)) = posted_failure(store, keys, mine, front)? {
            return Ok(Finding::Posted(fp, error));
        }
    }
    Ok(Finding::Nothing)
}

/// How long a thread that watches a group's collectives leaves the store
/// alone after a store call failed.
pub(crate) const STORE_REST: Duration = Duration::from_secs(5);

/// The longest wait between two checks of one stalled collective.
const MAX_RECHECK: Duration = Duration::from_secs(8);
/// How often a [`StallMonitor`] looks at the running collective.
const MONITOR_EVERY: Duration = Duration::from_millis(10);

/// The stall check of a group whose backend runs each collective to its
/// end on one thread (see the module docs), or of a device group's call
/// while its backend queues it: a queuing that blocks (NCCL's non-blocking
/// group end, in progress while a peer is missing or mismatched) would
/// otherwise post nothing, and its peers could not see the mismatch.
pub(crate) struct StallMonitor {
    recent: Arc<CallRing>,
    /// Whether [`begin`](StallMonitor::begin) records the call (a device
    /// group's watchdog records its calls itself).
    records: bool,
    /// The running collective and when it started, and whether the
    /// thread is parked (only then does a start wake it: a notify is a
    /// syscall even with nobody to wake).
    running: Mutex<(Option<(Fingerprint, Instant)>, bool)>,
    /// Wakes the thread, parked while nothing runs, when a collective
    /// starts or the monitor stops.
    wake: Condvar,
    stop: AtomicBool,
    thread: Mutex<Option<JoinHandle<()>>>,
}

impl StallMonitor {
    /// Starts the monitor thread of a group (`keys`), recording calls in
    /// `recent` (unless `records` is false: another part records them
    /// there) and acting through `engine`.
    pub(crate) fn start(
        store: Arc<dyn Store>,
        keys: StallKeys,
        (recent, records): (Arc<CallRing>, bool),
        engine: Arc<dyn OnDeviceFailure>,
    ) -> Result<Arc<StallMonitor>> {
        let monitor = Arc::new(StallMonitor {
            recent,
            records,
            running: Mutex::default(),
            wake: Condvar::new(),
            stop: AtomicBool::new(false),
            thread: Mutex::default(),
        });
        let runner = monitor.clone();
        let worker = StoreWorker::start(store, format!("tensorcomm-stall-store{}", keys.rank))?;
        let handle = std::thread::Builder::new()
            .name(format!("tensorcomm-stall{}", keys.rank))
            .spawn(move || runner.run(&worker, &keys, &*engine))
            .map_err(|e| Error::io("starting the process group's stall monitor", e))?;
        *monitor
            .thread
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Some(handle);
        Ok(monitor)
    }

    /// Collective `fp` starts running.
    pub(crate) fn begin(&self, fp: &Fingerprint) {
        if self.records {
            self.recent.record(fp);
        }
        let parked = {
            let mut running = self.running.lock().unwrap_or_else(PoisonError::into_inner);
            running.0 = Some((*fp, Instant::now()));
            running.1
        };
        if parked {
            self.wake.notify_one();
        }
    }

    /// The running collective ended.
    pub(crate) fn end(&self) {
        self.running
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .0 = None;
    }

    /// Ends the thread and waits for it.
    pub(crate) fn stop(&self) {
        {
            // Under the lock, so the thread sees `stop` or is woken.
            let _running = self.running.lock().unwrap_or_else(PoisonError::into_inner);
            self.stop.store(true, Ordering::Release);
            self.wake.notify_all();
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

    fn run(&self, worker: &StoreWorker, keys: &StallKeys, engine: &dyn OnDeviceFailure) {
        // The last check: which collective, when, and the wait before the
        // next check of the same one (doubling, so a collective that is
        // merely slow costs the store little).
        let mut checked: Option<(u64, Instant, Duration)> = None;
        // After a store call failed, no check until then.
        let mut rest_until: Option<Instant> = None;
        while !self.stop.load(Ordering::Acquire) {
            {
                // Parked while nothing runs (most of the time).
                let mut running = self.running.lock().unwrap_or_else(PoisonError::into_inner);
                while running.0.is_none() && !self.stop.load(Ordering::Acquire) {
                    running.1 = true;
                    running = self
                        .wake
                        .wait(running)
                        .unwrap_or_else(PoisonError::into_inner);
                    running.1 = false;
                }
            }
            std::thread::sleep(MONITOR_EVERY);
            let running = self
                .running
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .0;
            let Some((fp, since)) = running else {
                continue;
            };
            let next_wait = match checked {
                Some((seq, at, wait)) if seq == fp.seq => {
                    if at.elapsed() < wait {
                        continue;
                    }
                    (wait * 2).min(MAX_RECHECK)
                }
                _ => RECHECK,
            };
            if since.elapsed() < STALL || rest_until.is_some_and(|t| Instant::now() < t) {
                continue;
            }
            // Compared on a copy: the group thread records its next call
            // meanwhile, without waiting for the store. A device group's
            // call stuck being queued also looks for another rank's
            // failure posted for this group (a peer gone, as a rank's own
            // links find it): it would otherwise wait for its deadline.
            // (A host group's own links find such failures; its abort
            // would turn its own timeout into a closed link.)
            let (recent, keys_there, look_for_posted) =
                (self.recent.snapshot(), keys.clone(), !self.records);
            let answer =
                worker.ask(move |store| check(store, &keys_there, &recent, &fp, look_for_posted));
            // Waited for on this thread, which stops when told even while
            // the store takes its time.
            let finding = loop {
                if self.stop.load(Ordering::Acquire) {
                    return;
                }
                match answer.wait(MONITOR_EVERY) {
                    Reply::Answered(finding) => break finding,
                    Reply::Waiting => {}
                    Reply::Gone => return,
                }
            };
            // The next check waits from the answer, so a slow store is not
            // asked again at once.
            checked = Some((fp.seq, Instant::now(), next_wait));
            match finding {
                Ok(Finding::Nothing) => {}
                Err(e) => {
                    tracing::debug!("stall check: the store failed: {e}");
                    rest_until = Some(Instant::now() + STORE_REST);
                }
                Ok(Finding::Mismatch(found)) => {
                    engine.begin_failing(found.mine.seq);
                    let error = found.error(keys.rank);
                    let cause = engine.settle(&found.mine, Some((found.peer, found.theirs)), error);
                    // Device work queued before the mismatch fails with it
                    // before the abort (aborted work may look finished).
                    engine.fail_pending(found.mine.seq, engine.named(&found.mine, cause));
                    // The blocked collective fails now and reports the
                    // mismatch posted above.
                    engine.abort();
                    return;
                }
                Ok(Finding::Posted(failed, error)) => {
                    engine.fail_pending(failed.seq, engine.named(&failed, error));
                    engine.abort();
                    return;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::group::fingerprint::CollectiveKind;
    use crate::store::HashStore;
    use crate::tensor::DType;

    fn fp(seq: u64, numel: u64) -> Fingerprint {
        Fingerprint {
            kind: CollectiveKind::AllReduce,
            reduce_op: 1,
            dtype: Some(DType::F32),
            root: 0,
            seq,
            numel,
            shape_hash: 3,
        }
    }

    fn ring(calls: &[(u64, u64)]) -> RecentCalls {
        let mut r = RecentCalls::default();
        for &(seq, numel) in calls {
            r.record(&fp(seq, numel));
        }
        r
    }

    #[test]
    fn the_first_differing_sequence_number_is_found_across_rings() {
        let mine = ring(&[(4, 10), (5, 10), (6, 20)]);
        let theirs = decode(&ring(&[(5, 10), (6, 30), (7, 1)]).encode());
        let found = first_difference(&mine, 2, &theirs).expect("seq 6 differs");
        assert_eq!((found.mine.seq, found.peer), (6, 2));
        let text = found.error(0).to_string();
        assert!(
            text.contains("20 elements") && text.contains("30 elements"),
            "{text}"
        );
        let same = decode(&ring(&[(5, 10), (6, 20)]).encode());
        assert!(first_difference(&mine, 1, &same).is_none());
    }

    #[test]
    fn the_ring_keeps_the_most_recent_calls() {
        let calls: Vec<(u64, u64)> = (0..RECENT as u64 + 5).map(|s| (s, 1)).collect();
        let r = ring(&calls);
        assert!(r.get(4).is_none());
        assert_eq!(r.get(5).map(|f| f.seq), Some(5));
        assert_eq!(decode(&r.encode()).len(), RECENT);
    }

    #[test]
    fn a_posted_ring_tells_the_last_call_started() {
        assert_eq!(ring_last(&ring(&[(4, 10), (5, 10)]).encode()), Some(5));
        assert_eq!(ring_last(&[]), None);
    }

    #[test]
    fn ranks_compare_through_the_store() {
        let store = HashStore::new();
        let keys = |rank| StallKeys {
            prefix: "pg".into(),
            rank,
            size: 3,
        };
        let same = ring(&[(0, 8), (1, 8)]);
        assert!(compare(&store, &keys(0), &same).unwrap().is_none());
        assert!(compare(&store, &keys(1), &same).unwrap().is_none());
        let differs = compare(&store, &keys(2), &ring(&[(0, 8), (1, 9)]));
        let found = differs.unwrap().expect("differs");
        assert_eq!((found.peer, found.mine.seq), (0, 1));
    }
}
