//! A rank that exits without dropping its CPU group (`std::process::exit`)
//! while hosting the store: its connections close at once, so a peer
//! blocked on it in a collective or a receive fails promptly naming it,
//! although the exiting process keeps serving its store until the peer
//! disconnects (`tcp_store_exit.rs`); the process then ends promptly.
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

/// In the child: rank 0 over the transport `CHILD_MODE` names; hosts the
/// store, runs one all_reduce with rank 1, then exits when told to,
/// holding its group and its store.
#[test]
fn child_entry() {
    let Ok(mode) = std::env::var(CHILD_MODE) else {
        return;
    };
    let choice: TransportChoice = mode.parse().unwrap();
    let addr = std::env::var(CHILD_ADDR).unwrap();
    let store = Arc::new(TcpStore::host(&addr, 2, &store_options()).unwrap());
    let pg = ProcessGroupCpu::new(store.clone(), "pg", 0, 2, &group_options(choice)).unwrap();
    let t = Tensor::from_vec(vec![1.0f32; 4], &[4]).unwrap();
    pg.all_reduce(&t, ReduceOp::Sum, None)
        .unwrap()
        .wait()
        .unwrap();
    say("ready");
    let mut line = String::new();
    let _ = std::io::stdin().read_line(&mut line);
    say("exiting");
    std::process::exit(3);
}

struct Rank0 {
    child: Child,
    stdin: ChildStdin,
    lines: std::io::Lines<BufReader<ChildStdout>>,
}

impl Rank0 {
    fn start(choice: TransportChoice, addr: &str) -> Self {
        let mut child = Command::new(std::env::current_exe().unwrap())
            .args(["--exact", "child_entry", "--nocapture", "--test-threads=1"])
            .env(CHILD_MODE, choice.to_string())
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
    let mut rank0 = Rank0::start(choice, &addr);
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

over_transports!(
    an_exiting_rank_fails_a_peer_in_a_collective_at_once,
    an_exiting_rank_fails_a_peer_in_a_receive_at_once,
);
