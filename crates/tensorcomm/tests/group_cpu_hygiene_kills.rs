//! A rank killed mid-collective leaks nothing in the rank that survives:
//! this process hosts one rank of a 2-rank CPU job (`tcp://` init, so
//! rank 0 hosts the TCP store), the other rank is a child process (this
//! test binary re-run as `child_rank_entry`) that runs collectives in a
//! loop (after one send/recv exchange: all_reduce, all_gather, broadcast
//! in turn). After one to three collectives together the child is
//! SIGKILLed while this process's next one is in flight; that call (or,
//! when the child had already handed over its share, one of the next two)
//! must fail within seconds, naming the dead rank, and the group is
//! dropped. Twenty kills: rank 1 (a plain rank) and rank 0 (the store's
//! host), over shared memory and over TCP. Afterwards this process has
//! the same open file descriptors, threads, mappings of shared-memory
//! segments (`/proc/self/maps`, unlinked ones included) and names of the
//! job in `/dev/shm` as before, and no child process, not even a zombie.
//! Linux only (it counts through /proc and /dev/shm). One counting test
//! in its own binary, so no other test's resources come and go meanwhile.

#![cfg(target_os = "linux")]

mod ports;

use std::io::Read;
use std::os::unix::process::ExitStatusExt;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ports::free_port;
use tensorcomm::cpu::transport::TransportChoice;
use tensorcomm::group::{Backend, ProcessGroup, ReduceOp, Work};
use tensorcomm::tensor::{DType, Tensor};
use tensorcomm::{init_process_group_with, Error, InitOptions};

/// Set in the child: `rank,port,transport`.
const CHILD: &str = "TENSORCOMM_HYGIENE_KILLS_CHILD";
/// Kills counted (after a warm-up kill of each kind).
const KILLS: usize = 20;
/// Elements of each collective's tensors (f32, 256 KiB): large enough
/// that a kill often lands while the bytes move.
const ELEMENTS: usize = 64 * 1024;
/// The group's timeout: a survivor that only gives up at its timeout
/// fails the test (see PROMPT).
const TIMEOUT: Duration = Duration::from_secs(30);
/// How soon the survivor must fail once the child is dead (its links see
/// the peer gone; bounds generous for a loaded 2-core machine).
const PROMPT: Duration = Duration::from_secs(10);

fn init_options(transport: TransportChoice) -> InitOptions {
    InitOptions {
        timeout: TIMEOUT,
        group_name: "kills".into(),
        transport,
        ..InitOptions::default()
    }
}

fn init_method(rank: usize, port: u16) -> String {
    format!("tcp://127.0.0.1:{port}?rank={rank}&world_size=2")
}

/// The calls both ranks make, in the same order: one point-to-point
/// exchange, then collectives in turn (the k-th: all_reduce, all_gather,
/// broadcast from rank 0), on tensors each rank fills with `rank + 1`.
struct Calls {
    pg: Arc<dyn ProcessGroup>,
    t: Tensor<'static>,
    gathered: Vec<Tensor<'static>>,
    next: usize,
}

impl Calls {
    fn new(pg: Arc<dyn ProcessGroup>) -> tensorcomm::Result<Self> {
        Ok(Calls {
            pg,
            t: Tensor::zeros(&[ELEMENTS], DType::F32)?,
            gathered: vec![
                Tensor::zeros(&[ELEMENTS], DType::F32)?,
                Tensor::zeros(&[ELEMENTS], DType::F32)?,
            ],
            next: 0,
        })
    }

    fn rank(&self) -> usize {
        self.pg.rank()
    }

    /// Rank 0 sends then receives, rank 1 the other way round; each gets
    /// the other's `rank + 1`.
    fn exchange(&self) -> tensorcomm::Result<()> {
        let (me, peer) = (self.rank(), 1 - self.rank());
        let mine = Tensor::from_vec(vec![me as f32 + 1.0; 16], &[16])?;
        let theirs = Tensor::zeros(&[16], DType::F32)?;
        if me == 0 {
            self.pg.send(&mine, peer, 7, None)?.wait()?;
            self.pg.recv(&theirs, peer, 7, None)?.wait()?;
        } else {
            self.pg.recv(&theirs, peer, 7, None)?.wait()?;
            self.pg.send(&mine, peer, 7, None)?.wait()?;
        }
        assert_eq!(theirs.to_vec::<f32>()?, [peer as f32 + 1.0; 16]);
        Ok(())
    }

    /// Starts the next collective; its name.
    fn start(&mut self) -> tensorcomm::Result<(&'static str, Work)> {
        self.t.fill(self.rank() as f32 + 1.0)?;
        let k = self.next;
        self.next += 1;
        Ok(match k % 3 {
            0 => (
                "all_reduce",
                self.pg.all_reduce(&self.t, ReduceOp::Sum, None)?,
            ),
            1 => (
                "all_gather",
                self.pg.all_gather(&self.gathered, &self.t, None)?,
            ),
            _ => ("broadcast", self.pg.broadcast(&self.t, 0, None)?),
        })
    }

    /// Checks the outputs of the collective `op` that just completed.
    fn check(&self, op: &str) -> tensorcomm::Result<()> {
        let all = |t: &Tensor<'static>, want: f32| -> tensorcomm::Result<bool> {
            Ok(t.to_vec::<f32>()?.iter().all(|&x| x == want))
        };
        let ok = match op {
            "all_reduce" => all(&self.t, 3.0)?,
            "all_gather" => all(&self.gathered[0], 1.0)? && all(&self.gathered[1], 2.0)?,
            _ => all(&self.t, 1.0)?,
        };
        assert!(ok, "rank {}: wrong output of {op}", self.rank());
        Ok(())
    }

    /// Runs the next collective to its end and checks it.
    fn run(&mut self) -> tensorcomm::Result<()> {
        let (op, work) = self.start()?;
        work.wait()?;
        self.check(op)
    }
}

/// The child rank when CHILD is set: runs the calls until it is killed.
/// Without CHILD (a plain `cargo test`), nothing to do.
#[test]
fn child_rank_entry() {
    let Ok(spec) = std::env::var(CHILD) else {
        return;
    };
    let parts: Vec<&str> = spec.split(',').collect();
    let rank: usize = parts[0].parse().unwrap();
    let port: u16 = parts[1].parse().unwrap();
    let transport: TransportChoice = parts[2].parse().unwrap();
    let outcome = (|| -> tensorcomm::Result<()> {
        let pg = init_process_group_with(
            Backend::Cpu,
            &init_method(rank, port),
            &init_options(transport),
        )?;
        let mut calls = Calls::new(pg)?;
        calls.exchange()?;
        loop {
            calls.run()?;
        }
    })();
    // Only reached when the parent failed first.
    eprintln!("child rank {rank}: {outcome:?}");
    std::process::exit(3);
}

/// This process and every child it started: the pids whose names in
/// /dev/shm belong to the job.
static JOB: Mutex<Vec<u32>> = Mutex::new(Vec::new());

fn job() -> Vec<u32> {
    let mut job = JOB.lock().unwrap().clone();
    job.push(std::process::id());
    job
}

fn spawn_child(rank: usize, port: u16, transport: TransportChoice) -> Child {
    let child = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "child_rank_entry",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD, format!("{rank},{port},{transport}"))
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn the child rank");
    JOB.lock().unwrap().push(child.id());
    child
}

/// What one kill saw.
struct Killed {
    /// The error that named the dead rank.
    message: String,
    /// The counts while the group was live, before the kill.
    live: Counts,
}

/// One kill: this process is rank `1 - victim`, the child rank `victim`;
/// `calls` collectives together, then the child is killed `delay` after
/// this process starts the next one.
fn kill_mid_collective(
    victim: usize,
    transport: TransportChoice,
    calls: usize,
    delay: Duration,
) -> Killed {
    let me = 1 - victim;
    let port = free_port();
    let mut child = spawn_child(victim, port, transport);
    let pg = init_process_group_with(
        Backend::Cpu,
        &init_method(me, port),
        &init_options(transport),
    )
    .unwrap_or_else(|e| panic!("{transport}, rank {me}: set-up failed: {e}"));
    let mut ops = Calls::new(pg).unwrap();
    ops.exchange().unwrap();
    for _ in 0..calls {
        ops.run().unwrap();
    }
    let live = counts(&job());
    let (mut op, work) = ops.start().unwrap();
    if !delay.is_zero() {
        std::thread::sleep(delay);
    }
    child.kill().unwrap();
    let killed = Instant::now();
    let status = child.wait().unwrap();
    let mut text = String::new();
    let _ = child.stderr.take().unwrap().read_to_string(&mut text);
    assert_eq!(status.signal(), Some(9), "{status:?}: {text}");
    // The call in flight may still complete, and so may the next (when
    // the child handed over its share of both before it died: a
    // broadcast from this rank, then the child's whole input of a small
    // all_reduce); the one after cannot.
    let mut outcome = work.wait();
    for _ in 0..2 {
        if outcome.is_err() {
            break;
        }
        ops.check(op).unwrap();
        outcome = ops.start().and_then(|(next, work)| {
            op = next;
            work.wait()
        });
    }
    let err = outcome.expect_err("three collectives after the peer died completed");
    let took = killed.elapsed();
    let message = err.to_string();
    assert!(
        took < PROMPT,
        "{transport}, rank {victim} killed: failed after {took:?}: {message}"
    );
    match &err {
        Error::CollectiveFailed {
            op: failed,
            ranks,
            source,
            ..
        } => {
            assert_eq!(failed, op, "{message}");
            assert_eq!(ranks, &[victim], "{transport}: {message}");
            assert!(
                matches!(**source, Error::PeerClosed { peer, .. } if peer == victim),
                "{transport}: {message}"
            );
        }
        other => {
            panic!("{transport}, rank {victim} killed: expected CollectiveFailed, got {other:?}")
        }
    }
    // Dropping the group must not wait on a store that died with the
    // victim (its stall checks once retried a refused store until the
    // store's timeout: 30 s).
    let dropping = Instant::now();
    drop(ops);
    assert!(
        dropping.elapsed() < PROMPT,
        "{transport}, rank {victim} killed: dropping the group took {:?}",
        dropping.elapsed()
    );
    Killed { message, live }
}

#[derive(Debug, PartialEq, Eq, Clone, Copy)]
struct Counts {
    fds: usize,
    threads: usize,
    /// Lines of /proc/self/maps for tensorcomm's shared-memory segments
    /// (unlinked ones show as "(deleted)").
    shm_maps: usize,
    /// Names in /dev/shm made by this process or one of its children.
    shm_names: usize,
    /// Child processes, zombies included.
    children: usize,
}

fn entries(dir: &str) -> usize {
    std::fs::read_dir(dir).unwrap().count()
}

/// The pids of this process's children (from every process's stat line:
/// field 4 is the parent's pid).
fn children() -> Vec<u32> {
    let me = std::process::id();
    std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
                return false;
            };
            // The command name (field 2) may hold spaces: read after it.
            let after = stat.rsplit_once(')').map_or("", |(_, rest)| rest);
            after.split_whitespace().nth(1) == Some(&me.to_string())
        })
        .collect()
}

/// Names in /dev/shm that tensorcomm gives segments ("tc<kind>.<pid>.")
/// created by one of `pids`.
fn shm_names_of(pids: &[u32]) -> usize {
    std::fs::read_dir("/dev/shm")
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            name.starts_with("tc")
                && name
                    .split('.')
                    .nth(1)
                    .and_then(|p| p.parse::<u32>().ok())
                    .is_some_and(|p| pids.contains(&p))
        })
        .count()
}

fn shm_maps() -> usize {
    std::fs::read_to_string("/proc/self/maps")
        .unwrap()
        .lines()
        .filter(|l| l.contains("/dev/shm/tc"))
        .count()
}

fn counts(job: &[u32]) -> Counts {
    Counts {
        fds: entries("/proc/self/fd"),
        threads: entries("/proc/self/task"),
        shm_maps: shm_maps(),
        shm_names: shm_names_of(job),
        children: children().len(),
    }
}

/// Counts once they stop changing (threads of a dropped group may still
/// be on their way out for a moment): the same over 5 samples 30 ms
/// apart, and equal to `want` when given; the last sample after 3 s.
fn settled_counts(want: Option<Counts>) -> Counts {
    let deadline = Instant::now() + Duration::from_secs(3);
    let mut last = counts(&job());
    let mut same = 0;
    loop {
        std::thread::sleep(Duration::from_millis(30));
        let now = counts(&job());
        same = if now == last { same + 1 } else { 0 };
        last = now;
        let wanted = want.is_none_or(|w| w == now);
        if (same >= 4 && wanted) || Instant::now() > deadline {
            return now;
        }
    }
}

/// The kinds of kill, in turn: (victim rank, transport).
const KINDS: [(usize, TransportChoice); 4] = [
    (1, TransportChoice::Shm),
    (1, TransportChoice::Tcp),
    (0, TransportChoice::Shm),
    (0, TransportChoice::Tcp),
];

#[test]
fn killing_ranks_mid_collective_leaks_no_fds_threads_segments_or_processes() {
    // Warm-up: anything a process sets up once, on its first group or
    // first failure, is in the baseline.
    for (victim, transport) in KINDS {
        kill_mid_collective(victim, transport, 2, Duration::ZERO);
    }
    let before = settled_counts(None);
    assert_eq!(before.children, 0, "{before:?}");
    let started = Instant::now();
    let mut kills = Vec::new();
    for i in 0..KILLS {
        let (victim, transport) = KINDS[i % KINDS.len()];
        // Vary where the kill lands: after 1 to 3 collectives together
        // (so in an all_gather, a broadcast or an all_reduce), from at
        // once to half a millisecond into the next.
        let calls = 1 + i % 3;
        let delay = Duration::from_micros(250 * ((i / KINDS.len()) as u64 % 3));
        kills.push(kill_mid_collective(victim, transport, calls, delay));
    }
    let elapsed = started.elapsed();
    let after = settled_counts(Some(before));
    eprintln!(
        "{KILLS} kills in {elapsed:?}; before {before:?}, live over shm {:?}, after {after:?}; e.g. {}",
        kills[0].live, kills[0].message
    );
    assert_eq!(after, before, "after {KILLS} kills ({elapsed:?})");
    // The counts see a live group's resources: its connections, threads,
    // mappings (over shared memory) and the child.
    for (i, kill) in kills.iter().enumerate() {
        let (live, shm) = (kill.live, KINDS[i % KINDS.len()].1 == TransportChoice::Shm);
        assert!(
            live.fds > before.fds
                && live.threads > before.threads
                && (live.shm_maps > before.shm_maps) == shm
                && live.children == 1,
            "kill {i}: {live:?}"
        );
    }
}
