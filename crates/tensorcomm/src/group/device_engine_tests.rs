//! The engine with a device backend that moves no bytes (as NCCL): a fake
//! whose "device work" finishes once every rank has queued a call with the
//! same fingerprint and hangs otherwise, as a mismatched NCCL collective
//! does. Mismatches must fail every rank long before the timeout, with
//! both calls described; a rank that never comes must end in a timeout
//! that names it.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use super::backend::{Call, GroupBackend, ABORTED, NOT_QUEUED};
use super::collective::{Capabilities, Collective, Scope, Validated};
use super::engine::Engine;
use super::fingerprint::{CollectiveKind, FINGERPRINT_LEN};
use super::{DeviceEvent, FlightRecorder, ReduceOp};
use crate::store::{HashStore, Store};
use crate::tensor::Tensor;
use crate::{Error, Result};

/// What every rank queued, per sequence number.
#[derive(Default)]
struct Device {
    calls: Mutex<HashMap<u64, Vec<[u8; FINGERPRINT_LEN]>>>,
    changed: Condvar,
}

struct FakeBackend {
    device: Arc<Device>,
    size: usize,
    /// Calls that cannot be queued: `run` waits until the backend is
    /// aborted (or the call's deadline), as NCCL's non-blocking group end
    /// does for a mismatched or unconnectable group.
    stuck: Option<CollectiveKind>,
    /// Every call fails at once with the link to this rank closed (a rank
    /// whose peer died, as its own transport would find).
    lost_peer: Option<usize>,
    /// Device work ends this long after its deadline whatever the peers
    /// did, as a kernel waiting on a peer that died or aborted can.
    done_late: Option<Duration>,
    /// Set when this backend is aborted: the group's store is gone from
    /// then on (its host rank exited once it had reported).
    kills_store: Option<Arc<AtomicBool>>,
    aborted: Arc<(Mutex<bool>, Condvar)>,
}

/// What a rank's fake backend does differently (see [`FakeBackend`]).
#[derive(Default)]
struct Quirks {
    stuck: Option<CollectiveKind>,
    lost_peer: Option<usize>,
    done_late: Option<Duration>,
    kills_store: bool,
}

/// The group's store, which fails every call once `dead` is set.
struct MortalStore {
    inner: HashStore,
    dead: Arc<AtomicBool>,
}

impl MortalStore {
    fn alive(&self) -> Result<&HashStore> {
        if self.dead.load(Ordering::SeqCst) {
            return Err(Error::StoreConnectionLost {
                addr: "127.0.0.1:1".into(),
                reason: "connection refused (its host exited)".into(),
            });
        }
        Ok(&self.inner)
    }
}

impl Store for MortalStore {
    fn set(&self, key: &str, value: &[u8]) -> Result<()> {
        self.alive()?.set(key, value)
    }
    fn get_timeout(&self, key: &str, timeout: Duration) -> Result<Vec<u8>> {
        self.alive()?.get_timeout(key, timeout)
    }
    fn add(&self, key: &str, delta: i64) -> Result<i64> {
        self.alive()?.add(key, delta)
    }
    fn compare_set(&self, key: &str, expected: &[u8], desired: &[u8]) -> Result<Vec<u8>> {
        self.alive()?.compare_set(key, expected, desired)
    }
    fn wait_timeout(&self, keys: &[&str], timeout: Duration) -> Result<()> {
        self.alive()?.wait_timeout(keys, timeout)
    }
    fn check(&self, keys: &[&str]) -> Result<bool> {
        self.alive()?.check(keys)
    }
    fn delete_key(&self, key: &str) -> Result<bool> {
        self.alive()?.delete_key(key)
    }
    fn num_keys(&self) -> Result<usize> {
        self.alive()?.num_keys()
    }
    fn append(&self, key: &str, value: &[u8]) -> Result<()> {
        self.alive()?.append(key, value)
    }
    fn multi_get_timeout(&self, keys: &[&str], timeout: Duration) -> Result<Vec<Vec<u8>>> {
        self.alive()?.multi_get_timeout(keys, timeout)
    }
    fn multi_set(&self, keys: &[&str], values: &[&[u8]]) -> Result<()> {
        self.alive()?.multi_set(keys, values)
    }
    fn list_keys(&self) -> Result<Vec<String>> {
        self.alive()?.list_keys()
    }
    fn queue_push(&self, key: &str, value: &[u8]) -> Result<()> {
        self.alive()?.queue_push(key, value)
    }
    fn queue_pop_timeout(&self, key: &str, timeout: Duration) -> Result<Vec<u8>> {
        self.alive()?.queue_pop_timeout(key, timeout)
    }
    fn queue_len(&self, key: &str) -> Result<usize> {
        self.alive()?.queue_len(key)
    }
    fn timeout(&self) -> Duration {
        self.inner.timeout()
    }
    fn set_timeout(&self, timeout: Duration) {
        self.inner.set_timeout(timeout)
    }
}

/// Done once every rank queued `seq` with one fingerprint.
struct FakeEvent {
    device: Arc<Device>,
    seq: u64,
    size: usize,
    /// Done from then on, whatever the peers queued.
    done_at: Option<Instant>,
}

impl DeviceEvent for FakeEvent {
    fn query(&self) -> Result<bool> {
        if let Some(at) = self.done_at {
            return Ok(Instant::now() >= at);
        }
        let calls = self.device.calls.lock().unwrap();
        Ok(calls
            .get(&self.seq)
            .is_some_and(|c| c.len() == self.size && c.iter().all(|f| *f == c[0])))
    }

    fn synchronize(&self) -> Result<()> {
        while !self.query()? {
            std::thread::sleep(Duration::from_millis(1));
        }
        Ok(())
    }

    fn wait_on_current_stream(&self) -> Result<()> {
        Ok(())
    }
}

impl GroupBackend for FakeBackend {
    fn run(&self, _: &Collective, call: &Call) -> Result<Option<Arc<dyn DeviceEvent>>> {
        let fp = call.fingerprint;
        if let Some(peer) = self.lost_peer {
            return Err(Error::PeerClosed {
                peer,
                during: "queuing".into(),
                reason: "the fake link to it closed".into(),
            });
        }
        if Some(fp.kind) == self.stuck {
            let (lock, cv) = &*self.aborted;
            let mut aborted = lock.lock().unwrap();
            while !*aborted && Instant::now() < call.deadline {
                aborted = cv
                    .wait_timeout(aborted, Duration::from_millis(5))
                    .unwrap()
                    .0;
            }
            return Err(Error::Nccl {
                call: "ncclGroupEnd".into(),
                code: if *aborted { ABORTED } else { NOT_QUEUED }.into(),
                message: "the fake group could not be queued".into(),
            });
        }
        self.device
            .calls
            .lock()
            .unwrap()
            .entry(fp.seq)
            .or_default()
            .push(fp.encode());
        self.device.changed.notify_all();
        Ok(Some(Arc::new(FakeEvent {
            device: self.device.clone(),
            seq: fp.seq,
            size: self.size,
            done_at: self.done_late.map(|late| call.deadline + late),
        })))
    }

    fn abort(&self) {
        if let Some(dead) = &self.kills_store {
            dead.store(true, Ordering::SeqCst);
        }
        let (lock, cv) = &*self.aborted;
        *lock.lock().unwrap() = true;
        cv.notify_all();
    }

    fn runs_inline(&self) -> bool {
        true
    }
}

fn engines(size: usize, timeout: Duration) -> Vec<(Engine, Scope)> {
    engines_stuck_on(size, timeout, |_| None)
}

/// `engines`, where rank r's backend cannot queue calls of kind `stuck(r)`.
fn engines_stuck_on(
    size: usize,
    timeout: Duration,
    stuck: impl Fn(usize) -> Option<CollectiveKind>,
) -> Vec<(Engine, Scope)> {
    engines_with(size, timeout, |rank| Quirks {
        stuck: stuck(rank),
        ..Quirks::default()
    })
}

/// `engines`, where `setup(r)` gives rank r's backend its [`Quirks`].
fn engines_with(
    size: usize,
    timeout: Duration,
    setup: impl Fn(usize) -> Quirks,
) -> Vec<(Engine, Scope)> {
    let dead = Arc::new(AtomicBool::new(false));
    let store: Arc<dyn Store> = Arc::new(MortalStore {
        inner: HashStore::new(),
        dead: dead.clone(),
    });
    let device = Arc::new(Device::default());
    (0..size)
        .map(|rank| {
            let quirks = setup(rank);
            let backend = Arc::new(FakeBackend {
                device: device.clone(),
                size,
                stuck: quirks.stuck,
                lost_peer: quirks.lost_peer,
                done_late: quirks.done_late,
                kills_store: quirks.kills_store.then(|| dead.clone()),
                aborted: Arc::default(),
            });
            let recorder = FlightRecorder::new(16, rank, size, "fake");
            let engine = Engine::start(
                backend,
                store.clone(),
                "fake",
                (rank, size),
                recorder,
                timeout,
            )
            .unwrap();
            let scope = Scope {
                rank,
                size,
                caps: Capabilities {
                    host: true,
                    cuda: true,
                },
            };
            (engine, scope)
        })
        .collect()
}

/// Submits `make(scope)` on every rank of `groups` at once, a thread each,
/// and gives each rank's outcome of waiting for it on the host.
fn on_each(
    groups: &[(Engine, Scope)],
    make: impl Fn(&Scope) -> Validated + Sync,
) -> Vec<Result<()>> {
    std::thread::scope(|s| {
        let make = &make;
        let handles: Vec<_> = groups
            .iter()
            .map(|(engine, scope)| {
                s.spawn(move || engine.submit(make(scope), None).unwrap().synchronize())
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

/// An all_reduce of 8 elements on ranks 0 and 1 of `groups`, each rank's
/// outcome; all of it well within 10 s (the tests' timeouts are longer or
/// the calls must fail before them).
fn all_reduce_on_ranks_0_and_1_failing_fast(groups: &[(Engine, Scope)]) -> Vec<Result<()>> {
    let started = Instant::now();
    let outcomes = on_each(&groups[..2], |scope| {
        let t = Tensor::zeros(&[8], crate::tensor::DType::F32).unwrap();
        Collective::all_reduce(scope, &t, ReduceOp::Sum).unwrap()
    });
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "{:?}",
        started.elapsed()
    );
    outcomes
}

/// The text of rank `rank`'s failure, which must name the ranks `named`.
fn failure_naming(outcome: Result<()>, rank: usize, named: &[usize]) -> String {
    let err = outcome.expect_err("the call must fail");
    let text = err.to_string();
    assert!(
        matches!(&err, Error::CollectiveFailed { ranks, .. } if ranks == named),
        "rank {rank}: {text}"
    );
    text
}

#[test]
fn matching_calls_complete_on_the_device() {
    let groups = engines(2, Duration::from_secs(30));
    let works: Vec<_> = groups
        .iter()
        .map(|(engine, scope)| {
            let t = Tensor::zeros(&[4], crate::tensor::DType::F32).unwrap();
            let call = Collective::all_reduce(scope, &t, ReduceOp::Sum).unwrap();
            engine.submit(call, None).unwrap()
        })
        .collect();
    for w in works {
        w.synchronize().unwrap();
    }
}

#[test]
fn a_mismatch_fails_every_rank_at_that_call_with_both_shapes() {
    let groups = engines(2, Duration::from_secs(30));
    let started = Instant::now();
    let outcomes = on_each(&groups, |scope| {
        let width = if scope.rank == 0 { 2 } else { 10 };
        let t = Tensor::zeros(&[20, width], crate::tensor::DType::F32).unwrap();
        Collective::all_reduce(scope, &t, ReduceOp::Sum).unwrap()
    });
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "{:?}",
        started.elapsed()
    );
    for (rank, outcome) in outcomes.into_iter().enumerate() {
        let err = outcome.expect_err("a mismatched call must fail");
        let text = err.to_string();
        assert!(
            matches!(&err, Error::CollectiveFailed { source, .. } if matches!(**source, Error::CollectiveMismatch { .. })),
            "rank {rank}: {text}"
        );
        assert!(
            text.contains("[20, 2]") && text.contains("[20, 10]"),
            "rank {rank}: {text}"
        );
    }
    // The groups are broken: later calls say so at once.
    let (engine, scope) = &groups[0];
    let t = Tensor::zeros(&[1], crate::tensor::DType::F32).unwrap();
    let call = Collective::all_reduce(scope, &t, ReduceOp::Sum).unwrap();
    let later = engine.submit(call, None).unwrap().wait();
    assert!(matches!(later, Err(Error::GroupBroken { .. })), "{later:?}");
}

#[test]
fn a_rank_that_never_calls_ends_in_a_timeout_naming_it() {
    let groups = engines(2, Duration::from_millis(400));
    let (engine, scope) = &groups[0];
    let t = Tensor::zeros(&[3], crate::tensor::DType::F32).unwrap();
    let call = Collective::all_reduce(scope, &t, ReduceOp::Sum).unwrap();
    let started = Instant::now();
    let err = engine
        .submit(call, None)
        .unwrap()
        .synchronize()
        .unwrap_err();
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
    let text = err.to_string();
    assert!(
        text.contains("did not finish on the device within 400ms"),
        "{text}"
    );
    assert!(text.contains("rank 1 published no progress"), "{text}");
    assert!(
        matches!(&err, Error::CollectiveFailed { ranks, .. } if ranks == &[1]),
        "{err:?}"
    );
}

#[test]
fn a_mismatch_is_found_while_a_rank_is_stuck_queuing_its_call() {
    // Rank 1 calls a broadcast where rank 0 calls an all_reduce, and its
    // backend cannot queue it (as NCCL's group end stays in progress): its
    // call never reaches the device, yet both ranks must fail with the
    // mismatch long before the 30 s timeout, and rank 1's call must end.
    let groups = engines_stuck_on(2, Duration::from_secs(30), |rank| {
        (rank == 1).then_some(CollectiveKind::Broadcast)
    });
    let started = Instant::now();
    let outcomes = on_each(&groups, |scope| {
        let width = if scope.rank == 0 { 2 } else { 10 };
        let t = Tensor::zeros(&[4, width], crate::tensor::DType::F32).unwrap();
        if scope.rank == 0 {
            Collective::all_reduce(scope, &t, ReduceOp::Sum).unwrap()
        } else {
            Collective::broadcast(scope, &t, 0).unwrap()
        }
    });
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "{:?}",
        started.elapsed()
    );
    for (rank, outcome) in outcomes.into_iter().enumerate() {
        let err = outcome.expect_err("a mismatched call must fail");
        let text = err.to_string();
        assert!(
            matches!(&err, Error::CollectiveFailed { source, .. } if matches!(**source, Error::CollectiveMismatch { .. })),
            "rank {rank}: {text}"
        );
        assert!(
            text.contains("all_reduce") && text.contains("broadcast"),
            "rank {rank}: {text}"
        );
        // Both calls told in full, the stuck rank's too.
        assert!(
            text.contains("[4, 2]") && text.contains("[4, 10]"),
            "rank {rank}: {text}"
        );
    }
}

#[test]
fn a_call_that_never_gets_queued_names_the_rank_that_never_came() {
    // Ranks 0 and 1 cannot queue their all_reduce (as NCCL's group end
    // stays in progress while it connects to a dead rank); rank 2 never
    // calls. The stuck ranks fail at their timeout naming rank 2, by the
    // recent calls each posted while stuck.
    let groups = engines_stuck_on(3, Duration::from_millis(600), |rank| {
        (rank < 2).then_some(CollectiveKind::AllReduce)
    });
    let outcomes = all_reduce_on_ranks_0_and_1_failing_fast(&groups);
    for (rank, outcome) in outcomes.into_iter().enumerate() {
        let text = failure_naming(outcome, rank, &[2]);
        assert!(
            text.contains("rank 2 had started none"),
            "rank {rank}: {text}"
        );
        assert!(text.contains("ncclInProgress"), "rank {rank}: {text}");
    }
}

#[test]
fn a_rank_stuck_queuing_takes_the_failure_another_rank_posted() {
    // Rank 0 finds its link to rank 2 closed and posts that; rank 1 cannot
    // queue its all_reduce (NCCL's group end in progress, connecting to the
    // gone rank). Rank 1 must fail with rank 0's cause long before its
    // 30 s timeout, not wait for it.
    for kills_store in [false, true] {
        // With `kills_store`, the store is gone once rank 1's monitor has
        // read the cause and aborted (its host exited after reporting, as
        // rank 0 of a job does): rank 1 must still tell that cause, which
        // it recorded before the abort, not the abort. Four H200s showed
        // both survivors of a mismatch naming no one that way.
        let groups = engines_with(3, Duration::from_secs(30), |rank| match rank {
            0 => Quirks {
                lost_peer: Some(2),
                ..Quirks::default()
            },
            1 => Quirks {
                stuck: Some(CollectiveKind::AllReduce),
                kills_store,
                ..Quirks::default()
            },
            _ => Quirks::default(),
        });
        let outcomes = all_reduce_on_ranks_0_and_1_failing_fast(&groups);
        for (rank, outcome) in outcomes.into_iter().enumerate() {
            let text = failure_naming(outcome, rank, &[2]);
            assert!(
                text.contains("the fake link to it closed"),
                "rank {rank}, store killed: {kills_store}: {text}"
            );
        }
    }
}

#[test]
fn device_work_that_ends_after_its_deadline_fails_with_the_timeout() {
    // Rank 1 never calls; rank 0's device work ends 100 ms after its
    // deadline anyway, while the watchdog is still settling the timeout
    // (it waits for the peers' progress), as NCCL kernels can when a peer
    // died or aborted. Four H200s showed this: two survivors reported a
    // barrier done that the third timed out on, the victim never having
    // called it. The work must fail with the timeout, not be done.
    let groups = engines_with(2, Duration::from_millis(300), |rank| Quirks {
        done_late: (rank == 0).then_some(Duration::from_millis(100)),
        ..Quirks::default()
    });
    let (engine, scope) = &groups[0];
    let t = Tensor::zeros(&[3], crate::tensor::DType::F32).unwrap();
    let call = Collective::all_reduce(scope, &t, ReduceOp::Sum).unwrap();
    let outcome = engine.submit(call, None).unwrap().synchronize();
    let text = failure_naming(outcome, 0, &[1]);
    assert!(
        text.contains("did not finish on the device within 300ms"),
        "{text}"
    );
}

#[test]
fn a_call_stuck_queuing_when_an_earlier_one_timed_out_names_itself_and_that_cause() {
    // Rank 0's all_reduce (seq 0) waits on the device for rank 1, which
    // never calls; its broadcast (seq 1) cannot be queued. The watchdog
    // times seq 0 out and aborts, and the store goes with the abort (its
    // host exited), so seq 1 learns the cause only from what the watchdog
    // recorded: it must fail as seq 1, with seq 0's timeout as the cause.
    let groups = engines_with(2, Duration::from_millis(300), |rank| Quirks {
        stuck: (rank == 0).then_some(CollectiveKind::Broadcast),
        kills_store: rank == 0,
        ..Quirks::default()
    });
    let (engine, scope) = &groups[0];
    let t = Tensor::zeros(&[3], crate::tensor::DType::F32).unwrap();
    let first = engine
        .submit(
            Collective::all_reduce(scope, &t, ReduceOp::Sum).unwrap(),
            None,
        )
        .unwrap();
    // A longer timeout of its own: the abort comes first.
    let second = engine
        .submit(
            Collective::broadcast(scope, &t, 0).unwrap(),
            Some(Duration::from_secs(5)),
        )
        .and_then(|w| w.wait());
    let err = second.expect_err("the stuck call must fail");
    let text = err.to_string();
    assert!(
        matches!(&err, Error::CollectiveFailed { seq: 1, ranks, .. } if ranks == &[1]),
        "{text}"
    );
    assert!(
        text.contains("did not finish on the device within 300ms"),
        "{text}"
    );
    assert!(first.synchronize().is_err());
}
