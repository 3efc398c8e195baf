//! Failures of the CPU process group: monitored barriers naming the ranks
//! that did not come (over TCP and over shared memory), the flight
//! recorder's states and JSON, and a rank process SIGKILLed inside a
//! collective, over TCP and over shared memory (the test binary re-runs
//! itself as that rank, sharing a FileStore).

mod common;

use std::os::unix::process::ExitStatusExt;
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{groups, groups_over, on_every_rank, options_over};
use tensorcomm::cpu::backend::ProcessGroupCpu;
use tensorcomm::cpu::transport::{Route, TransportChoice};
use tensorcomm::group::{ProcessGroup, ReduceOp};
use tensorcomm::store::{FileStore, HashStore, Store};
use tensorcomm::tensor::{DType, Tensor};
use tensorcomm::Error;

over_transports!(
    monitored_barrier_releases_everyone_when_all_arrive,
    monitored_barrier_names_every_absent_rank_with_wait_all,
    monitored_barrier_names_the_first_absent_rank_without_wait_all,
    monitored_barrier_fails_promptly_when_rank_0_is_gone,
    monitored_barrier_without_rank_0_names_it_after_twice_the_timeout,
    a_rank_process_killed_mid_collective_fails_every_survivor_promptly_by_name,
);

fn failed(err: Error) -> (String, u64, Vec<usize>, Error) {
    match err {
        Error::CollectiveFailed {
            op,
            seq,
            ranks,
            source,
            ..
        } => (op, seq, ranks, *source),
        other => panic!("expected CollectiveFailed, got {other:?}"),
    }
}

fn monitored_barrier_releases_everyone_when_all_arrive(choice: TransportChoice) {
    let pgs = groups_over(3, &Arc::new(HashStore::new()), "pg", choice);
    for wait_all in [true, false] {
        let outcomes = on_every_rank(&pgs, |pg| {
            pg.monitored_barrier(Some(Duration::from_secs(30)), wait_all)
                .unwrap()
                .wait()
        });
        assert!(outcomes.iter().all(Result::is_ok), "{outcomes:?}");
    }
    // Still in step with ordinary collectives afterwards.
    on_every_rank(&pgs, |pg| {
        let t = Tensor::from_vec(vec![2u8], &[1]).unwrap();
        pg.all_reduce(&t, ReduceOp::Sum, None)
            .unwrap()
            .wait()
            .unwrap();
        assert_eq!(t.to_vec::<u8>().unwrap(), [6]);
    });
}

/// Ranks 1 and 3 of 4 (over `choice`) never call the barrier; returns
/// each caller's missing ranks (rank 0's and rank 2's).
fn barrier_with_absentees(wait_all: bool, choice: TransportChoice) -> Vec<Option<Vec<usize>>> {
    let pgs = groups_over(4, &Arc::new(HashStore::new()), "pg", choice);
    let started = Instant::now();
    let timeout = Duration::from_millis(300);
    let named = on_every_rank(&pgs, |pg| {
        if pg.rank() % 2 == 1 {
            return None;
        }
        let err = pg
            .monitored_barrier(Some(timeout), wait_all)
            .unwrap()
            .wait()
            .unwrap_err();
        let (op, seq, ranks, source) = failed(err);
        assert_eq!((op.as_str(), seq), ("monitored_barrier", 0));
        match source {
            Error::RanksMissing {
                missing,
                timeout: t,
            } => {
                assert_eq!((&missing, t), (&ranks, timeout));
            }
            other => panic!("{other:?}"),
        }
        Some(ranks)
    });
    assert!(started.elapsed() >= timeout);
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "{:?}",
        started.elapsed()
    );
    named
}

fn monitored_barrier_names_every_absent_rank_with_wait_all(choice: TransportChoice) {
    let named = barrier_with_absentees(true, choice);
    assert_eq!(named, [Some(vec![1, 3]), None, Some(vec![1, 3]), None]);
}

fn monitored_barrier_names_the_first_absent_rank_without_wait_all(choice: TransportChoice) {
    let named = barrier_with_absentees(false, choice);
    assert_eq!(named, [Some(vec![1]), None, Some(vec![1]), None]);
}

fn monitored_barrier_fails_promptly_when_rank_0_is_gone(choice: TransportChoice) {
    let mut pgs = groups_over(2, &Arc::new(HashStore::new()), "pg", choice);
    drop(pgs.remove(0));
    let started = Instant::now();
    let err = pgs[0]
        .monitored_barrier(None, true)
        .unwrap()
        .wait()
        .unwrap_err();
    let (op, _, ranks, source) = failed(err);
    assert_eq!((op.as_str(), ranks), ("monitored_barrier", vec![0]));
    assert!(
        matches!(source, Error::PeerClosed { peer: 0, .. }),
        "{source:?}"
    );
    assert!(started.elapsed() < Duration::from_secs(10));
}

fn monitored_barrier_without_rank_0_names_it_after_twice_the_timeout(choice: TransportChoice) {
    let pgs = groups_over(2, &Arc::new(HashStore::new()), "pg", choice);
    let timeout = Duration::from_millis(150);
    let started = Instant::now();
    let err = pgs[1]
        .monitored_barrier(Some(timeout), false)
        .unwrap()
        .wait()
        .unwrap_err();
    assert!(started.elapsed() >= 2 * timeout);
    let (op, seq, ranks, source) = failed(err);
    assert_eq!((op.as_str(), seq, ranks), ("monitored_barrier", 0, vec![0]));
    assert!(
        matches!(source, Error::PeerTimeout { peer: 0, .. }),
        "{source:?}"
    );
}

fn entries(pg: &ProcessGroupCpu) -> Vec<serde_json::Value> {
    let json: serde_json::Value = serde_json::from_str(&pg.flight_recorder_json()).unwrap();
    assert_eq!(json["rank"], pg.rank());
    assert_eq!(json["world_size"], pg.size());
    json["entries"].as_array().unwrap().clone()
}

fn states(pg: &ProcessGroupCpu) -> Vec<String> {
    entries(pg)
        .iter()
        .map(|e| e["state"].as_str().unwrap().to_string())
        .collect()
}

#[test]
fn the_flight_recorder_tracks_states_and_dumps_valid_json() {
    let pgs = groups(2, &Arc::new(HashStore::new()), "pg");
    let t = Tensor::zeros(&[2, 3], DType::F32).unwrap();
    // Rank 0 queues two collectives; rank 1 has not joined yet, so the
    // first waits in the algorithm and the second in the queue.
    let first = pgs[0].all_reduce(&t, ReduceOp::Max, None).unwrap();
    let second = pgs[0].broadcast(&t, 1, None).unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while states(&pgs[0]) != ["started", "queued"] {
        assert!(Instant::now() < deadline, "{:?}", states(&pgs[0]));
        std::thread::yield_now();
    }
    let u = Tensor::zeros(&[2, 3], DType::F32).unwrap();
    pgs[1]
        .all_reduce(&u, ReduceOp::Max, None)
        .unwrap()
        .wait()
        .unwrap();
    pgs[1].broadcast(&u, 1, None).unwrap().wait().unwrap();
    first.wait().unwrap();
    second.wait().unwrap();
    let e = entries(&pgs[0]);
    assert_eq!(states(&pgs[0]), ["completed", "completed"]);
    assert_eq!(e[0]["op"], "all_reduce");
    assert_eq!(e[0]["seq"], 0);
    assert_eq!(e[0]["numel"], 6);
    assert_eq!(e[0]["dtype"], "f32");
    assert_eq!(e[0]["reduce_op"], "MAX");
    assert_eq!(e[0]["peers"], serde_json::json!([1]));
    assert!(e[0]["queued_to_started_us"].is_u64() && e[0]["started_to_finished_us"].is_u64());
    assert_eq!(
        (&e[1]["op"], &e[1]["seq"], &e[1]["root"]),
        (&"broadcast".into(), &1.into(), &1.into())
    );
    assert!(e[1]["error"].is_null());

    // A collective rank 1 skips times out: recorded as failed, with the
    // error, and the group refuses the next one without running it.
    let err = pgs[0]
        .all_reduce(&t, ReduceOp::Sum, Some(Duration::from_millis(100)))
        .unwrap()
        .wait()
        .unwrap_err();
    let refused = pgs[0].barrier(None).unwrap().wait().unwrap_err();
    assert!(
        matches!(refused, Error::GroupBroken { seq: 2, .. }),
        "{refused:?}"
    );
    let e = entries(&pgs[0]);
    assert_eq!(
        states(&pgs[0]),
        ["completed", "completed", "failed", "failed"]
    );
    assert_eq!(e[2]["error"].as_str().unwrap(), err.to_string());
    assert!(e[2]["error"]
        .as_str()
        .unwrap()
        .contains("sequence number 2"));
    assert!(
        e[3]["queued_to_started_us"].is_null(),
        "never ran: {}",
        e[3]
    );
    assert_eq!(e[3]["op"], "barrier");
}

// ---- a rank process killed mid-collective -----------------------------

/// Set in the child: the FileStore all processes share.
const CHILD_STORE: &str = "TENSORCOMM_GROUP_FAILURES_CHILD_STORE";
/// Set in the child: the transport (`tcp` or `shm`).
const CHILD_TRANSPORT: &str = "TENSORCOMM_GROUP_FAILURES_CHILD_TRANSPORT";
/// Set by the child in the store once it is inside collective seq 1.
const CHILD_INSIDE: &str = "child-inside-seq-1";
/// Elements of the f32 all_reduce (seq 1) the child is killed in.
const BIG: usize = 1 << 20;

/// Rank 1 of 3 when CHILD_STORE is set: one all_reduce with everyone, then
/// a second (seq 1) that rank 2 has not joined, so the child waits inside
/// it until the parent kills it. Run without it (as in a normal `cargo
/// test`) it checks that a group of one does the same all_reduce.
#[test]
fn child_rank_entry() {
    let (store, rank, world, choice): (Arc<dyn Store>, usize, usize, TransportChoice) =
        match std::env::var(CHILD_STORE) {
            Ok(path) => {
                let choice = std::env::var(CHILD_TRANSPORT).unwrap().parse().unwrap();
                (Arc::new(FileStore::open(path).unwrap()), 1, 3, choice)
            }
            Err(_) => (Arc::new(HashStore::new()), 0, 1, TransportChoice::Tcp),
        };
    let pg = ProcessGroupCpu::new(store.clone(), "pg", rank, world, &options_over(choice)).unwrap();
    let t = Tensor::from_vec(vec![1.0f64; 8], &[8]).unwrap();
    pg.all_reduce(&t, ReduceOp::Sum, None)
        .unwrap()
        .wait()
        .unwrap();
    assert_eq!(t.to_vec::<f64>().unwrap(), vec![world as f64; 8]);
    if world == 1 {
        return;
    }
    // Large enough (4 MiB) that rank 1 cannot hand over its whole share
    // before rank 2 takes part.
    let big = Tensor::zeros(&[BIG], DType::F32).unwrap();
    let work = pg.all_reduce(&big, ReduceOp::Sum, None).unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while !pg
        .flight_recorder_json()
        .contains(r#""seq":1,"state":"started""#)
    {
        assert!(Instant::now() < deadline, "seq 1 never started");
        std::thread::yield_now();
    }
    store.set(CHILD_INSIDE, b"1").unwrap();
    let outcome = work.wait();
    // Only reached if the parent did not kill this process.
    eprintln!("child rank: seq 1 returned {outcome:?}");
    std::process::exit(2);
}

/// Ranks 0 and 2 run here (threads), rank 1 in a child process. Ranks 0
/// and 1 enter all_reduce seq 1; rank 1 is SIGKILLed inside it; rank 2
/// joins afterwards. Both survivors fail within seconds (of a 30 s
/// timeout) with the op, the sequence number and rank 1 named.
fn a_rank_process_killed_mid_collective_fails_every_survivor_promptly_by_name(
    choice: TransportChoice,
) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store");
    let store: Arc<dyn Store> = Arc::new(FileStore::open(&path).unwrap());
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "child_rank_entry",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD_STORE, &path)
        .env(CHILD_TRANSPORT, choice.to_string())
        .spawn()
        .expect("spawn the child rank");
    let pgs: Vec<ProcessGroupCpu> = std::thread::scope(|s| {
        let hs: Vec<_> = [0, 2]
            .map(|rank| {
                let store = store.clone();
                s.spawn(move || {
                    ProcessGroupCpu::new(store, "pg", rank, 3, &options_over(choice)).unwrap()
                })
            })
            .into_iter()
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let want = if choice == TransportChoice::Tcp {
        Route::Tcp
    } else {
        Route::Shm
    };
    assert_eq!((pgs[0].route(1), pgs[1].route(1)), (want, want));
    let tensors: Vec<_> = (0..2)
        .map(|_| Tensor::from_vec(vec![1.0f64; 8], &[8]).unwrap())
        .collect();
    on_every_rank(&pgs, |pg| {
        let t = &tensors[pg.rank() / 2];
        pg.all_reduce(t, ReduceOp::Sum, None)
            .unwrap()
            .wait()
            .unwrap();
        assert_eq!(t.to_vec::<f64>().unwrap(), [3.0; 8]);
    });

    let big: Vec<_> = (0..2)
        .map(|_| Tensor::zeros(&[BIG], DType::F32).unwrap())
        .collect();
    let first = pgs[0].all_reduce(&big[0], ReduceOp::Sum, None).unwrap();
    store
        .wait_timeout(&[CHILD_INSIDE], Duration::from_secs(30))
        .unwrap();
    child.kill().unwrap();
    let status = child.wait().unwrap();
    assert_eq!(status.signal(), Some(9), "{status:?}");
    let started = Instant::now();
    let second = pgs[1].all_reduce(&big[1], ReduceOp::Sum, None).unwrap();
    let mut named = Vec::new();
    for (pg, work) in pgs.iter().zip([first, second]) {
        let err = work
            .wait()
            .expect_err(&format!("{choice}: rank {} completed", pg.rank()));
        let text = err.to_string();
        assert!(
            text.contains("all_reduce (sequence number 1)"),
            "{choice}: {text}"
        );
        let (op, seq, ranks, source) = failed(err);
        assert_eq!((op.as_str(), seq), ("all_reduce", 1));
        assert!(
            matches!(source, Error::PeerClosed { peer: 1, .. }),
            "{choice}: {source:?}"
        );
        assert!(
            pg.flight_recorder_json()
                .contains(r#""seq":1,"state":"failed""#),
            "{choice}"
        );
        named.push(ranks);
    }
    let elapsed = started.elapsed();
    assert!(
        elapsed < Duration::from_secs(10),
        "{choice}: took {elapsed:?} of a 30 s timeout"
    );
    // Rank 2 may first lose its link to rank 0 (which gave up), but learns
    // from the store that rank 1 is the one that died.
    assert_eq!(named, [[1], [1]], "{choice}");
}

/// A peer timeout names the timeout the caller set (1 ms), not what the
/// wait inside the call measured from its own, later start; the measured
/// time follows.
#[test]
fn a_peer_timeout_names_the_timeout_the_caller_set() {
    let pgs = groups(2, &Arc::new(HashStore::new()), "timeout-set");
    let t = Tensor::from_vec(vec![1.0f32; 4], &[4]).unwrap();
    // Rank 1 never calls.
    let err = pgs[0]
        .all_reduce(&t, ReduceOp::Sum, Some(Duration::from_millis(1)))
        .unwrap()
        .wait()
        .unwrap_err();
    let Error::CollectiveFailed { source, .. } = &err else {
        panic!("{err:?}");
    };
    match &**source {
        Error::PeerTimeout {
            peer: 1,
            timeout,
            during,
        } => {
            assert_eq!(*timeout, Duration::from_millis(1), "{err}");
            assert!(during.contains("this wait measured"), "{err}");
        }
        other => panic!("{other:?}"),
    }
    assert!(err.to_string().contains("within 1ms"), "{err}");
}

/// A rank that never arrives (stopped, hung elsewhere) is the one named,
/// not the rank that waited on it. Over a ring of 3 (an all_reduce of
/// 16 KiB), rank 1 waits on rank 0, which waits on rank 2, which never
/// calls; rank 1's shorter timeout fires first, so its error is the report
/// every rank keeps: it must name rank 2, not rank 0 (which then named
/// itself).
#[test]
fn a_timeout_names_the_rank_that_never_arrived_not_a_rank_waiting_on_it() {
    let pgs = groups_over(
        3,
        &Arc::new(HashStore::new()),
        "absent",
        TransportChoice::Tcp,
    );
    let timeouts = [Duration::from_millis(1000), Duration::from_millis(300)];
    let errors = on_every_rank(&pgs[..2], |pg| {
        let t = Tensor::from_vec(vec![1.0f32; 4096], &[4096]).unwrap();
        let timeout = timeouts[pg.rank()];
        let err = pg
            .all_reduce(&t, ReduceOp::Sum, Some(timeout))
            .unwrap()
            .wait()
            .unwrap_err();
        let text = err.to_string();
        let (op, seq, ranks, source) = failed(err);
        assert_eq!((op.as_str(), seq), ("all_reduce", 0), "{text}");
        (ranks, source, text)
    });
    for (rank, (ranks, source, text)) in errors.into_iter().enumerate() {
        assert_eq!(ranks, [2], "rank {rank} should name rank 2: {text}");
        assert!(
            matches!(source, Error::PeerTimeout { peer: 2, .. }),
            "rank {rank} should time out on rank 2: {source:?}"
        );
    }
}
