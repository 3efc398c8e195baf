//! The launcher's list of exited ranks (`TENSORCOMM_LAUNCH_EXITS`), written
//! here by the test in the launcher's format (`launch_exits::line`): ranks started by hand as
//! processes (the test binary re-runs itself as each, `exits_rank_entry`).
//! A rank listed before it ever joined fails the others' rendezvous at
//! once, naming it and how it ended; a rank listed after it joined fails
//! nothing that no longer waits for it; a sub-group's set-up names a
//! member whose process is gone by its process record.

mod ports;

use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use ports::free_port;
use tensorcomm::group::{Backend, ReduceOp};
use tensorcomm::tensor::Tensor;
use tensorcomm::{init_process_group_with, InitOptions};

/// Set in a child: the group's timeout in milliseconds.
const CHILD_TIMEOUT_MS: &str = "TENSORCOMM_LAUNCH_EXITS_TEST_TIMEOUT_MS";
/// Set in a child: after the default group's first all_reduce, ranks 0 and
/// 1 wait for this file, then make a sub-group (of ranks 0 and 1, or those
/// in CHILD_MEMBERS); rank 2 leaves.
const CHILD_GO: &str = "TENSORCOMM_LAUNCH_EXITS_TEST_GO";
/// Set in a child: the sub-group's members, `0,2`.
const CHILD_MEMBERS: &str = "TENSORCOMM_LAUNCH_EXITS_TEST_MEMBERS";
/// Set in a child: the rank that leaves after the first all_reduce
/// (default 2).
const CHILD_LEAVER: &str = "TENSORCOMM_LAUNCH_EXITS_TEST_LEAVER";
const JOINED: &str = "LAUNCH-EXITS: joined";
const SUBGROUP_DONE: &str = "LAUNCH-EXITS: sub-group all_reduce";
const FAILED: &str = "LAUNCH-EXITS: failed: ";

/// A group's timeout far beyond what the tests wait: a rank that waits for
/// it fails them.
const TIMEOUT: Duration = Duration::from_secs(600);
/// How long a test waits for a rank (generous for a loaded 2-core machine;
/// failing at once takes about a second).
const PROMPT: Duration = Duration::from_secs(30);

/// One rank of a hand-started job when CHILD_TIMEOUT_MS is set; without
/// it (a plain `cargo test`), nothing to do.
#[test]
fn exits_rank_entry() {
    let Ok(ms) = std::env::var(CHILD_TIMEOUT_MS) else {
        return;
    };
    let timeout = Duration::from_millis(ms.parse().unwrap());
    let outcome = (|| -> tensorcomm::Result<()> {
        let options = InitOptions {
            timeout,
            ..InitOptions::default()
        };
        let pg = init_process_group_with(Backend::Cpu, "env://", &options)?;
        let t = Tensor::from_vec(vec![1.0f32; 4], &[4])?;
        pg.all_reduce(&t, ReduceOp::Sum, None)?.wait()?;
        eprintln!("{JOINED}");
        let Ok(go) = std::env::var(CHILD_GO) else {
            return Ok(());
        };
        let leaver = std::env::var(CHILD_LEAVER).map_or(2, |r| r.parse().unwrap());
        if pg.rank() == leaver {
            return Ok(());
        }
        while !Path::new(&go).exists() {
            std::thread::sleep(Duration::from_millis(10));
        }
        let members: Vec<usize> = std::env::var(CHILD_MEMBERS)
            .map(|m| m.split(',').map(|r| r.parse().unwrap()).collect())
            .unwrap_or_else(|_| vec![0, 1]);
        let Some(pair) = pg.new_group(&members)? else {
            return Ok(());
        };
        let t = Tensor::from_vec(vec![pair.rank() as f32 + 1.0], &[1])?;
        pair.all_reduce(&t, ReduceOp::Sum, None)?.wait()?;
        assert_eq!(t.to_vec::<f32>()?, [3.0]);
        eprintln!("{SUBGROUP_DONE}");
        Ok(())
    })();
    match outcome {
        Ok(()) => std::process::exit(0),
        Err(e) => {
            eprintln!("{FAILED}{e}");
            std::process::exit(3);
        }
    }
}

/// The line in which a rank said why it failed; `who` names the rank in
/// the panic when it said none.
fn failed_line(text: &str, who: impl FnOnce() -> String) -> &str {
    text.lines()
        .find(|l| l.starts_with(FAILED))
        .unwrap_or_else(|| panic!("{}", who()))
}

struct Rank {
    child: Child,
    lines: mpsc::Receiver<String>,
    seen: Vec<String>,
}

fn spawn_rank(rank: usize, world: usize, port: u16, exits: &Path, go: Option<&Path>) -> Rank {
    spawn_rank_with(rank, world, port, exits, go, None, None)
}

fn spawn_rank_with(
    rank: usize,
    world: usize,
    port: u16,
    exits: &Path,
    go: Option<&Path>,
    members: Option<&str>,
    leaver: Option<usize>,
) -> Rank {
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    cmd.args([
        "--exact",
        "exits_rank_entry",
        "--nocapture",
        "--test-threads=1",
    ])
    .env("MASTER_ADDR", "127.0.0.1")
    .env("MASTER_PORT", port.to_string())
    .env("RANK", rank.to_string())
    .env("LOCAL_RANK", rank.to_string())
    .env("WORLD_SIZE", world.to_string())
    .env("LOCAL_WORLD_SIZE", world.to_string())
    .env("TENSORCOMM_LAUNCH_EXITS", exits)
    .env(CHILD_TIMEOUT_MS, TIMEOUT.as_millis().to_string())
    .env_remove(CHILD_GO)
    .env_remove(CHILD_MEMBERS)
    .env_remove(CHILD_LEAVER)
    .stdout(Stdio::null())
    .stderr(Stdio::piped());
    if let Some(go) = go {
        cmd.env(CHILD_GO, go);
    }
    if let Some(members) = members {
        cmd.env(CHILD_MEMBERS, members);
    }
    if let Some(leaver) = leaver {
        cmd.env(CHILD_LEAVER, leaver.to_string());
    }
    let mut child = cmd.spawn().expect("spawn a rank");
    let (tx, rx) = mpsc::channel();
    let err = child.stderr.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(err).lines() {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    Rank {
        child,
        lines: rx,
        seen: Vec::new(),
    }
}

/// A test that fails leaves no rank running.
impl Drop for Rank {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Rank {
    /// Waits (at most [`PROMPT`]) for the process to exit; its exit code
    /// (`None` if it had to be killed) and everything it wrote.
    fn finish(&mut self) -> (Option<i32>, String) {
        let deadline = Instant::now() + PROMPT;
        let code = loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                break status.code();
            }
            if Instant::now() >= deadline {
                let _ = self.child.kill();
                let _ = self.child.wait();
                break None;
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        while let Ok(line) = self.lines.recv_timeout(Duration::from_millis(500)) {
            self.seen.push(line);
        }
        (code, std::mem::take(&mut self.seen).join("\n"))
    }
}

#[test]
fn a_rank_listed_before_it_joined_fails_rendezvous_at_once() {
    // Rank 1 starts with rank 0, or after rank 0 has already failed and
    // taken its store away (it then finds rank 2 listed while connecting).
    for late in [Duration::ZERO, Duration::from_millis(1500)] {
        let dir = tempfile::tempdir().unwrap();
        let exits = dir.path().join("exits");
        // Rank 2 of 3 never starts; its launcher saw it killed.
        std::fs::write(&exits, "rank 2 was killed by signal 9 (SIGKILL)\n").unwrap();
        let port = free_port();
        let started = Instant::now();
        let mut ranks = vec![spawn_rank(0, 3, port, &exits, None)];
        std::thread::sleep(late);
        ranks.push(spawn_rank(1, 3, port, &exits, None));
        for (rank, r) in ranks.iter_mut().enumerate() {
            let (code, text) = r.finish();
            assert_eq!(
                code,
                Some(3),
                "rank {rank} ({late:?}) did not fail:\n{text}"
            );
            let failed = failed_line(&text, || format!("rank {rank} ({late:?}):\n{text}"));
            assert!(
                failed.contains("peer rank 2 is gone while")
                    && failed.contains("it was killed by signal 9 (SIGKILL) before"),
                "rank {rank} ({late:?}): {failed}"
            );
        }
        assert!(started.elapsed() < PROMPT, "{:?}", started.elapsed());
    }
}

#[test]
fn rank_0_tells_ranks_whose_launcher_does_not_know() {
    // Rank 1 runs as if on another node: its launcher's file lists
    // nothing. Rank 0 finds rank 2 gone, and rank 1 learns it from rank 0.
    let dir = tempfile::tempdir().unwrap();
    let exits = dir.path().join("exits");
    let elsewhere = dir.path().join("elsewhere");
    std::fs::write(&exits, "rank 2 exited with status 0\n").unwrap();
    std::fs::write(&elsewhere, "").unwrap();
    let port = free_port();
    let mut rank_1 = spawn_rank(1, 3, port, &elsewhere, None);
    std::thread::sleep(Duration::from_millis(300));
    let mut rank_0 = spawn_rank(0, 3, port, &exits, None);
    for (rank, r) in [(0, &mut rank_0), (1, &mut rank_1)] {
        let (code, text) = r.finish();
        assert_eq!(code, Some(3), "rank {rank} did not fail:\n{text}");
        let failed = failed_line(&text, || format!("rank {rank}:\n{text}"));
        assert!(
            failed.contains("peer rank 2 is gone while")
                && failed.contains("it exited with status 0 before joining the job"),
            "rank {rank}: {failed}"
        );
        if rank == 1 {
            assert!(failed.ends_with("; rank 0 found it"), "{failed}");
        }
    }
}

#[test]
fn a_rank_whose_launcher_knows_tells_rank_0_and_the_others() {
    // Rank 3 of 4 ran on rank 1's node, and only rank 1's launcher lists
    // it (ranks 0 and 2 are as if on other nodes). Rank 1 posts the news;
    // rank 0 (watching the outcome key) and rank 2 learn it from the
    // store. Before, ranks 0 and 2 waited until their timeout.
    let dir = tempfile::tempdir().unwrap();
    let knows = dir.path().join("knows");
    let elsewhere = dir.path().join("elsewhere");
    std::fs::write(&knows, "rank 3 exited with status 0\n").unwrap();
    std::fs::write(&elsewhere, "").unwrap();
    let port = free_port();
    let started = Instant::now();
    let mut ranks: Vec<Rank> = [(0, &elsewhere), (1, &knows), (2, &elsewhere)]
        .into_iter()
        .map(|(rank, exits)| spawn_rank(rank, 4, port, exits, None))
        .collect();
    for (rank, r) in ranks.iter_mut().enumerate() {
        let (code, text) = r.finish();
        assert_eq!(code, Some(3), "rank {rank} did not fail:\n{text}");
        let failed = failed_line(&text, || format!("rank {rank}:\n{text}"));
        assert!(
            failed.contains("peer rank 3 is gone while")
                && failed.contains("it exited with status 0 before joining the job"),
            "rank {rank}: {failed}"
        );
        if rank != 1 {
            assert!(failed.ends_with("; rank 1 found it"), "{failed}");
        }
    }
    assert!(started.elapsed() < PROMPT, "{:?}", started.elapsed());
}

#[test]
fn a_rank_listed_after_it_joined_fails_nothing_that_no_longer_waits_for_it() {
    // Job rank 1 leaves; ranks 0 and 2 then make a group of the two, in
    // which group rank 1 is job rank 2: a set-up that mistook the group
    // ranks for the job ranks the launcher lists would fail it.
    let dir = tempfile::tempdir().unwrap();
    let exits = dir.path().join("exits");
    let go = dir.path().join("go");
    std::fs::write(&exits, "").unwrap();
    let port = free_port();
    let mut ranks: Vec<Rank> = (0..3)
        .map(|r| spawn_rank_with(r, 3, port, &exits, Some(&go), Some("0,2"), Some(1)))
        .collect();
    // Rank 1 joins, all-reduces once and leaves; as a launcher would, the
    // test lists it, then lets ranks 0 and 2 set up their group.
    let (code, text) = ranks[1].finish();
    assert_eq!(code, Some(0), "rank 1:\n{text}");
    assert!(text.contains(JOINED), "{text}");
    let mut file = std::fs::OpenOptions::new()
        .append(true)
        .open(&exits)
        .unwrap();
    file.write_all(b"rank 1 exited with status 0\n").unwrap();
    std::fs::write(&go, b"").unwrap();
    for rank in [0, 2] {
        let (code, text) = ranks[rank].finish();
        assert_eq!(code, Some(0), "rank {rank}:\n{text}");
        assert!(text.contains(SUBGROUP_DONE), "rank {rank}:\n{text}");
    }
}

#[test]
fn a_sub_group_names_a_member_whose_process_is_gone_during_set_up() {
    // Before, a sub-group's set-up looked for process records under its
    // own key prefix, found none, and waited until its timeout.
    let dir = tempfile::tempdir().unwrap();
    let exits = dir.path().join("exits");
    let go = dir.path().join("go");
    std::fs::write(&exits, "").unwrap();
    let port = free_port();
    let mut ranks: Vec<Rank> = (0..3)
        .map(|r| spawn_rank_with(r, 3, port, &exits, Some(&go), Some("0,2"), None))
        .collect();
    let (code, text) = ranks[2].finish();
    assert_eq!(code, Some(0), "rank 2:\n{text}");
    // Rank 2 is gone (and not listed); ranks 0 and 1 make a group of
    // ranks 0 and 2.
    std::fs::write(&go, b"").unwrap();
    let started = Instant::now();
    let (code, text) = ranks[1].finish();
    assert_eq!(code, Some(0), "rank 1, not a member:\n{text}");
    let (code, text) = ranks[0].finish();
    assert_eq!(code, Some(3), "rank 0 did not fail:\n{text}");
    let failed = failed_line(&text, || format!("rank 0:\n{text}"));
    assert!(
        failed.contains("peer rank 1 is gone while setting up group")
            && failed.contains("its process (job rank 2, pid ")
            && failed.contains("exited during set-up"),
        "{failed}"
    );
    assert!(started.elapsed() < PROMPT, "{:?}", started.elapsed());
}
