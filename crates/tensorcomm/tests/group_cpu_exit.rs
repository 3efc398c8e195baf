//! A rank that exits without dropping its CPU group (`std::process::exit`)
//! while hosting the store: its connections close at once, so a peer
//! blocked on it in a collective or a receive fails promptly naming it,
//! while the exiting process keeps serving its store until the peer
//! disconnects (`tcp_store_exit.rs`), then ends promptly. A collective of
//! its own still running when it exits posts nothing: the peer that
//! arrives later is not blamed for it through the store.
//!
//! The exiting rank (rank 0, hosting the store) is a child process, this
//! test binary again told what to do through `CHILD_MODE`; the test is
//! rank 1.

#![cfg(target_os = "linux")]

mod common;
mod ports;

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use common::options_over;
use tensorcomm::cpu::backend::{CpuOptions, ProcessGroupCpu};
use tensorcomm::cpu::transport::TransportChoice;
use tensorcomm::group::{ProcessGroup, ReduceOp};
use tensorcomm::store::{Store, TcpStore, TcpStoreOptions};
use tensorcomm::tensor::Tensor;
use tensorcomm::Error;

const CHILD_MODE: &str = "TCMGROUP_EXIT_CHILD";
/// Where the child hosts the store.
const CHILD_ADDR: &str = "TCMGROUP_EXIT_ADDR";
/// The store's linger and the group's timeout: far longer than any wait
/// the test accepts, so that a failure that waited for either shows.
const LONG: Duration = Duration::from_secs(60);
/// What "promptly" means here.
const PROMPTLY: Duration = Duration::from_secs(5);

fn store_options() -> TcpStoreOptions {
    TcpStoreOptions {
        timeout: Duration::from_secs(20),
        linger: LONG,
        ..TcpStoreOptions::default()
    }
}

fn group_options(choice: TransportChoice) -> CpuOptions {
    CpuOptions {
        timeout: LONG,
        ..options_over(choice)
    }
}

fn say(line: &str) {
    let mut out = std::io::stdout().lock();
    writeln!(out, "{line}").unwrap();
    out.flush().unwrap();
}

/// Elements of the all_reduce rank 0 leaves running as it exits (in flight
/// mode): large enough to be still running.
const IN_FLIGHT: usize = 4 << 20;

/// In the child: rank 0 over the transport `CHILD_MODE` names
/// (`tcp`, `shm`, or either with `/in-flight`); hosts the store, runs one
/// all_reduce with rank 1, sets `k`, then exits when told to, holding its
/// group and its store (in flight: just after starting an all_reduce that
/// rank 1 has not joined).
#[test]
fn child_entry() {
    let Ok(mode) = std::env::var(CHILD_MODE) else {
        return;
    };
    let (choice, in_flight) = match mode.split_once('/') {
        Some((choice, "in-flight")) => (choice, true),
        _ => (mode.as_str(), false),
    };
    let choice: TransportChoice = choice.parse().unwrap();
    let addr = std::env::var(CHILD_ADDR).unwrap();
    let store = Arc::new(TcpStore::host(&addr, 2, &store_options()).unwrap());
    let pg = ProcessGroupCpu::new(store.clone(), "pg", 0, 2, &group_options(choice)).unwrap();
    let t = Tensor::from_vec(vec![1.0f32; 4], &[4]).unwrap();
    pg.all_reduce(&t, ReduceOp::Sum, None)
        .unwrap()
        .wait()
        .unwrap();
    store.set("k", b"set by rank 0").unwrap();
    say("ready");
    let mut line = String::new();
    let _ = std::io::stdin().read_line(&mut line);
    if in_flight {
        let big = Tensor::from_vec(vec![1.0f32; IN_FLIGHT], &[IN_FLIGHT]).unwrap();
        let _running = pg.all_reduce(&big, ReduceOp::Sum, None).unwrap();
        thread::sleep(Duration::from_millis(100));
        say("exiting");
        std::process::exit(3);
    }
    say("exiting");
    std::process::exit(3);
}

struct Rank0 {
    child: Child,
    stdin: ChildStdin,
    lines: std::io::Lines<BufReader<ChildStdout>>,
}

impl Rank0 {
    fn start(mode: &str, addr: &str) -> Self {
        let mut child = Command::new(std::env::current_exe().unwrap())
            .args(["--exact", "child_entry", "--nocapture", "--test-threads=1"])
            .env(CHILD_MODE, mode)
            .env(CHILD_ADDR, addr)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("spawn rank 0");
        let stdin = child.stdin.take().unwrap();
        let lines = BufReader::new(child.stdout.take().unwrap()).lines();
        Rank0 {
            child,
            stdin,
            lines,
        }
    }

    /// What follows `prefix` on the first line that holds it.
    fn line(&mut self, prefix: &str) -> String {
        self.lines
            .find_map(|l| Some(l.unwrap().split_once(prefix)?.1.to_string()))
            .unwrap_or_else(|| panic!("rank 0 never said {prefix:?}"))
    }

    fn running(&mut self) -> bool {
        self.child.try_wait().unwrap().is_none()
    }

    fn exit_code_within(&mut self, limit: Duration) -> Option<i32> {
        let deadline = Instant::now() + limit;
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status.code();
            }
            assert!(
                Instant::now() < deadline,
                "rank 0 still ran {limit:?} after its last peer left"
            );
            thread::sleep(Duration::from_millis(5));
        }
    }
}

impl Drop for Rank0 {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Rank 1 starts `call` on rank 0, which then exits: the call fails
/// promptly naming rank 0, and rank 0's process ends once rank 1 leaves.
fn exit_fails_the_peer_at_once(
    choice: TransportChoice,
    call: impl Fn(&ProcessGroupCpu, &Tensor<'static>) -> tensorcomm::Result<tensorcomm::Work>,
) {
    let addr = format!("127.0.0.1:{}", ports::free_port());
    let mut rank0 = Rank0::start(&choice.to_string(), &addr);
    let store: Arc<dyn Store> = Arc::new(TcpStore::connect(&addr, &store_options()).unwrap());
    let pg = ProcessGroupCpu::new(store.clone(), "pg", 1, 2, &group_options(choice)).unwrap();
    let t = Tensor::from_vec(vec![2.0f32; 4], &[4]).unwrap();
    pg.all_reduce(&t, ReduceOp::Sum, None)
        .unwrap()
        .wait()
        .unwrap();
    assert_eq!(t.to_vec::<f32>().unwrap(), [3.0; 4]);
    rank0.line("ready");

    let work = call(&pg, &t).unwrap();
    writeln!(rank0.stdin, "go").unwrap();
    rank0.stdin.flush().unwrap();
    rank0.line("exiting");
    let started = Instant::now();
    let err = work
        .wait()
        .expect_err(&format!("{choice}: the call completed without rank 0"));
    let took = started.elapsed();
    assert!(
        took < PROMPTLY,
        "{choice}: failed after {took:?} (timeout {LONG:?}): {err}"
    );
    let text = err.to_string();
    assert!(text.contains("rank 0"), "{choice}: {text}");
    if let Error::CollectiveFailed { ranks, .. } = &err {
        assert_eq!(ranks, &[0], "{choice}: {text}");
    }
    // Rank 0 still serves its store while rank 1 is connected.
    assert!(
        rank0.running(),
        "{choice}: rank 0 ended with rank 1 connected"
    );
    assert_eq!(store.get("k").unwrap(), b"set by rank 0", "{choice}");
    drop(pg);
    drop(store);
    assert_eq!(rank0.exit_code_within(PROMPTLY), Some(3), "{choice}");
}

fn an_exiting_rank_fails_a_peer_in_a_collective_at_once(choice: TransportChoice) {
    exit_fails_the_peer_at_once(choice, |pg, t| pg.all_reduce(t, ReduceOp::Sum, None));
}

fn an_exiting_rank_fails_a_peer_in_a_receive_at_once(choice: TransportChoice) {
    exit_fails_the_peer_at_once(choice, |pg, t| pg.recv(t, 0, 7, None));
}

/// Rank 0 exits while its own all_reduce runs (rank 1 not in it yet): the
/// all_reduce fails on rank 0 because rank 0 closed its connections, which
/// must not be posted as rank 1's failure; rank 1, arriving later, names
/// rank 0.
fn an_exiting_ranks_own_collective_blames_no_peer(choice: TransportChoice) {
    let addr = format!("127.0.0.1:{}", ports::free_port());
    let mut rank0 = Rank0::start(&format!("{choice}/in-flight"), &addr);
    let store: Arc<dyn Store> = Arc::new(TcpStore::connect(&addr, &store_options()).unwrap());
    let pg = ProcessGroupCpu::new(store.clone(), "pg", 1, 2, &group_options(choice)).unwrap();
    let t = Tensor::from_vec(vec![2.0f32; 4], &[4]).unwrap();
    pg.all_reduce(&t, ReduceOp::Sum, None)
        .unwrap()
        .wait()
        .unwrap();
    rank0.line("ready");
    writeln!(rank0.stdin, "go").unwrap();
    rank0.stdin.flush().unwrap();
    rank0.line("exiting");
    thread::sleep(Duration::from_millis(500));
    assert!(
        rank0.running(),
        "{choice}: rank 0 ended with rank 1 connected"
    );
    let big = Tensor::from_vec(vec![1.0f32; IN_FLIGHT], &[IN_FLIGHT]).unwrap();
    let started = Instant::now();
    let err = pg
        .all_reduce(&big, ReduceOp::Sum, None)
        .unwrap()
        .wait()
        .expect_err(&format!(
            "{choice}: the all_reduce completed without rank 0"
        ));
    let took = started.elapsed();
    let text = err.to_string();
    assert!(took < PROMPTLY, "{choice}: failed after {took:?}: {text}");
    match &err {
        Error::CollectiveFailed { ranks, .. } => assert_eq!(ranks, &[0], "{choice}: {text}"),
        other => panic!("{choice}: expected CollectiveFailed, got {other:?}"),
    }
    assert!(!text.contains("peer rank 1"), "{choice}: {text}");
    drop(pg);
    drop(store);
    assert_eq!(rank0.exit_code_within(PROMPTLY), Some(3), "{choice}");
}

over_transports!(
    an_exiting_rank_fails_a_peer_in_a_collective_at_once,
    an_exiting_rank_fails_a_peer_in_a_receive_at_once,
    an_exiting_ranks_own_collective_blames_no_peer,
);
