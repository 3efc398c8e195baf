//! `tensorcomm run` end to end: ranks are `sh -c` scripts started through
//! the real binary.

use std::collections::{BTreeMap, HashMap};
use std::io::{BufRead, BufReader, Read};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_tensorcomm");
/// Only a guard against hangs; every test finishes far sooner.
const HANG_GUARD: Duration = Duration::from_secs(30);
/// What "promptly" means for a job whose ranks would otherwise sleep 60 s.
const PROMPT: Duration = Duration::from_secs(20);

/// Prints the torchrun variables as `KEY=value` words.
const PRINT_ENV: &str = r#"echo "RANK=$RANK WORLD_SIZE=$WORLD_SIZE LOCAL_RANK=$LOCAL_RANK LOCAL_WORLD_SIZE=$LOCAL_WORLD_SIZE GROUP_RANK=$GROUP_RANK MASTER_ADDR=$MASTER_ADDR MASTER_PORT=$MASTER_PORT TENSORCOMM_LAUNCHED=$TENSORCOMM_LAUNCHED""#;

/// A running launcher whose stdout is read line by line as it comes.
struct Launcher {
    child: Child,
    start: Instant,
    lines: Receiver<Vec<u8>>,
    stdout: Vec<Vec<u8>>,
    stderr: JoinHandle<Vec<u8>>,
}

/// A launcher that has exited, with everything it wrote.
#[derive(Debug)]
struct Finished {
    code: Option<i32>,
    stdout: Vec<u8>,
    stderr: String,
    elapsed: Duration,
}

impl Finished {
    fn stdout_text(&self) -> String {
        String::from_utf8_lossy(&self.stdout).into_owned()
    }
}

impl Launcher {
    fn start(args: &[&str]) -> Self {
        Self::start_with(Command::new(BIN).arg("run").args(args))
    }

    fn start_with(command: &mut Command) -> Self {
        let mut child = command
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start tensorcomm");
        let stdout = child.stdout.take().expect("piped stdout");
        let mut stderr = child.stderr.take().expect("piped stderr");
        let (tx, lines) = mpsc::channel();
        thread::spawn(move || {
            let mut reader = BufReader::new(stdout);
            loop {
                let mut line = Vec::new();
                match reader.read_until(b'\n', &mut line) {
                    Ok(0) | Err(_) => break,
                    Ok(_) => {
                        if tx.send(line).is_err() {
                            break;
                        }
                    }
                }
            }
        });
        let stderr = thread::spawn(move || {
            let mut all = Vec::new();
            let _ = stderr.read_to_end(&mut all);
            all
        });
        Launcher {
            child,
            start: Instant::now(),
            lines,
            stdout: Vec::new(),
            stderr,
        }
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Block until `n` stdout lines containing `needle` have arrived; return
    /// them.
    fn wait_for_lines(&mut self, needle: &str, n: usize) -> Vec<String> {
        let deadline = Instant::now() + HANG_GUARD;
        loop {
            let matching: Vec<String> = self
                .stdout
                .iter()
                .map(|l| String::from_utf8_lossy(l).into_owned())
                .filter(|l| l.contains(needle))
                .collect();
            if matching.len() >= n {
                return matching;
            }
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) => self.stdout.push(line),
                Err(e) => {
                    let _ = self.child.kill();
                    panic!(
                        "waited for {n} lines with {needle:?}, got {matching:?} ({e:?}); stdout so far: {:?}",
                        self.stdout
                    );
                }
            }
        }
    }

    fn signal(&self, signal: &str) {
        let status = Command::new("kill")
            .arg(format!("-{signal}"))
            .arg(self.pid().to_string())
            .status()
            .expect("run kill");
        assert!(status.success(), "kill -{signal} {} failed", self.pid());
    }

    /// Wait for the launcher to exit (panicking after [`HANG_GUARD`]) and
    /// collect its output.
    fn finish(mut self) -> Finished {
        let deadline = self.start + HANG_GUARD;
        let status = loop {
            if let Some(status) = self.child.try_wait().expect("wait for tensorcomm") {
                break status;
            }
            if Instant::now() >= deadline {
                let _ = self.child.kill();
                let _ = self.child.wait();
                panic!(
                    "tensorcomm run still running after {HANG_GUARD:?}; stdout so far: {:?}",
                    self.stdout
                );
            }
            thread::sleep(Duration::from_millis(10));
        };
        let elapsed = self.start.elapsed();
        loop {
            match self.lines.recv_timeout(HANG_GUARD) {
                Ok(line) => self.stdout.push(line),
                Err(RecvTimeoutError::Disconnected) => break,
                Err(RecvTimeoutError::Timeout) => panic!("stdout of tensorcomm stayed open"),
            }
        }
        let stderr = self.stderr.join().expect("stderr reader");
        Finished {
            code: status.code(),
            stdout: self.stdout.concat(),
            stderr: String::from_utf8_lossy(&stderr).into_owned(),
            elapsed,
        }
    }
}

fn run(args: &[&str]) -> Finished {
    Launcher::start(args).finish()
}

/// `[rankN]: KEY=value ...` lines to rank -> {KEY: value}.
fn env_by_rank(stdout: &str) -> BTreeMap<usize, HashMap<String, String>> {
    let mut ranks = BTreeMap::new();
    for line in stdout.lines() {
        let (prefix, rest) = line
            .split_once("]: ")
            .unwrap_or_else(|| panic!("unprefixed line {line:?}"));
        let rank: usize = prefix
            .strip_prefix("[rank")
            .and_then(|r| r.parse().ok())
            .unwrap_or_else(|| panic!("bad prefix in {line:?}"));
        let vars = rest
            .split_whitespace()
            .filter_map(|word| word.split_once('='))
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        assert!(
            ranks.insert(rank, vars).is_none(),
            "rank {rank} printed twice"
        );
    }
    ranks
}

fn get<'a>(vars: &'a HashMap<String, String>, key: &str) -> &'a str {
    vars.get(key)
        .unwrap_or_else(|| panic!("{key} missing in {vars:?}"))
}

/// Whether `pid` is gone or a zombie (dead, waiting to be reaped).
fn is_dead(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        // The state follows the command name, which is in parentheses.
        Ok(stat) => stat
            .rsplit_once(") ")
            .is_some_and(|(_, rest)| rest.starts_with('Z') || rest.starts_with('X')),
    }
}

fn assert_dies(pid: u32) {
    let deadline = Instant::now() + HANG_GUARD;
    while !is_dead(pid) {
        assert!(Instant::now() < deadline, "process {pid} is still alive");
        thread::sleep(Duration::from_millis(20));
    }
}

fn tempdir() -> tempfile::TempDir {
    tempfile::tempdir().expect("temp dir")
}

#[test]
fn prefixes_each_line_of_both_streams_with_the_rank() {
    let out = run(&[
        "--nproc-per-node",
        "3",
        "--",
        "sh",
        "-c",
        r#"echo "out a $RANK"; echo "err $RANK" >&2; echo "out b $RANK""#,
    ]);
    assert_eq!(out.code, Some(0), "{out:?}");
    let stdout = out.stdout_text();
    for rank in 0..3 {
        for word in ["a", "b"] {
            let line = format!("[rank{rank}]: out {word} {rank}\n");
            assert!(stdout.contains(&line), "{line:?} missing from {stdout:?}");
        }
        let line = format!("[rank{rank}]: err {rank}\n");
        assert!(
            out.stderr.contains(&line),
            "{line:?} missing from {:?}",
            out.stderr
        );
        assert!(!stdout.contains(&line), "stderr line on stdout: {stdout:?}");
    }
    assert_eq!(stdout.lines().count(), 6, "{stdout:?}");
    assert!(stdout.lines().all(|l| l.starts_with("[rank")), "{stdout:?}");
}

#[test]
fn partial_lines_and_raw_bytes_are_passed_through() {
    let out = run(&[
        "--",
        "sh",
        "-c",
        r"printf 'bin \377\376\n'; printf 'progress 1\rprogress 2\r'; printf 'no newline'",
    ]);
    assert_eq!(out.code, Some(0), "{out:?}");
    assert_eq!(
        out.stdout,
        b"[rank0]: bin \xff\xfe\n[rank0]: progress 1\r[rank0]: progress 2\r[rank0]: no newline\n"
    );
}

#[test]
fn no_prefix_passes_output_through_unchanged() {
    let out = run(&[
        "--nproc-per-node",
        "2",
        "--no-prefix",
        "--",
        "sh",
        "-c",
        r#"echo "plain $RANK"; echo "oops $RANK" >&2"#,
    ]);
    assert_eq!(out.code, Some(0), "{out:?}");
    let stdout = out.stdout_text();
    let mut lines: Vec<&str> = stdout.lines().collect();
    lines.sort();
    assert_eq!(lines, ["plain 0", "plain 1"]);
    assert!(out.stderr.contains("oops 0\n") && out.stderr.contains("oops 1\n"));
    assert!(!out.stderr.contains("[rank"), "{:?}", out.stderr);
}

#[test]
fn every_rank_gets_the_torchrun_environment() {
    let out = Launcher::start_with(
        Command::new(BIN)
            .args(["run", "--nproc-per-node", "4", "--", "sh", "-c", PRINT_ENV])
            // The launcher's own values must not leak into the ranks.
            .env("RANK", "99")
            .env("WORLD_SIZE", "99"),
    )
    .finish();
    assert_eq!(out.code, Some(0), "{out:?}");
    let ranks = env_by_rank(&out.stdout_text());
    assert_eq!(ranks.keys().copied().collect::<Vec<_>>(), [0, 1, 2, 3]);
    let port = get(&ranks[&0], "MASTER_PORT").to_string();
    let port_number: u16 = port.parse().expect("MASTER_PORT is a port number");
    assert_ne!(port_number, 0);
    for (rank, vars) in &ranks {
        let rank = rank.to_string();
        assert_eq!(get(vars, "RANK"), rank);
        assert_eq!(get(vars, "LOCAL_RANK"), rank);
        assert_eq!(get(vars, "WORLD_SIZE"), "4");
        assert_eq!(get(vars, "LOCAL_WORLD_SIZE"), "4");
        assert_eq!(get(vars, "GROUP_RANK"), "0");
        assert_eq!(get(vars, "MASTER_ADDR"), "127.0.0.1");
        assert_eq!(get(vars, "MASTER_PORT"), port, "all ranks share one port");
        assert_eq!(get(vars, "TENSORCOMM_LAUNCHED"), "1");
    }
}

#[test]
fn given_master_addr_and_port_reach_the_ranks() {
    let out = run(&[
        "--nproc-per-node",
        "2",
        "--master-addr",
        "10.1.2.3",
        "--master-port",
        "41234",
        "--",
        "sh",
        "-c",
        PRINT_ENV,
    ]);
    assert_eq!(out.code, Some(0), "{out:?}");
    for vars in env_by_rank(&out.stdout_text()).values() {
        assert_eq!(get(vars, "MASTER_ADDR"), "10.1.2.3");
        assert_eq!(get(vars, "MASTER_PORT"), "41234");
    }
}

#[test]
fn a_master_addr_that_does_not_resolve_on_node_0_is_refused_before_any_rank_starts() {
    // Before, the ranks started: rank 0 hosted the store on every
    // interface, and the others retried a name that never resolved until
    // their timeout (here 600 s; the guard fails the test at 30 s).
    let out = run(&[
        "--nproc-per-node",
        "2",
        "--master-addr",
        "no-such-node.invalid",
        "--",
        BIN,
        "demo",
        "--timeout-secs",
        "600",
        "--bytes",
        "1000",
        "--adds",
        "10",
    ]);
    assert_eq!(out.code, Some(2), "{out:?}");
    assert!(
        out.stderr.contains(
            "tensorcomm run: error: --master-addr \"no-such-node.invalid\" does not resolve on this host ("
        ),
        "{out:?}"
    );
    assert!(out.stdout.is_empty(), "a rank started: {out:?}");
}

#[test]
fn two_launchers_split_one_multi_node_job() {
    let node = |node_rank: &str| {
        Launcher::start(&[
            "--nnodes",
            "2",
            "--node-rank",
            node_rank,
            "--nproc-per-node",
            "3",
            "--master-addr",
            "127.0.0.1",
            "--",
            "sh",
            "-c",
            PRINT_ENV,
        ])
    };
    let (node0, node1) = (node("0"), node("1"));
    let (out0, out1) = (node0.finish(), node1.finish());
    for (node_rank, out) in [(0, &out0), (1, &out1)] {
        assert_eq!(out.code, Some(0), "node {node_rank}: {out:?}");
        let ranks = env_by_rank(&out.stdout_text());
        let expected: Vec<usize> = (0..3).map(|l| node_rank * 3 + l).collect();
        assert_eq!(ranks.keys().copied().collect::<Vec<_>>(), expected);
        for (rank, vars) in &ranks {
            assert_eq!(get(vars, "RANK"), rank.to_string());
            assert_eq!(get(vars, "LOCAL_RANK"), (rank - node_rank * 3).to_string());
            assert_eq!(get(vars, "WORLD_SIZE"), "6");
            assert_eq!(get(vars, "LOCAL_WORLD_SIZE"), "3");
            assert_eq!(get(vars, "GROUP_RANK"), node_rank.to_string());
            assert_eq!(get(vars, "MASTER_ADDR"), "127.0.0.1");
            assert_eq!(get(vars, "MASTER_PORT"), "29500");
        }
    }
}

#[test]
fn a_failing_rank_stops_the_others_and_its_status_is_the_exit_code() {
    let dir = tempdir();
    // Ranks other than 1 start a helper, report its pid, then mark
    // themselves ready; rank 1 fails once all three are ready.
    let script = r#"
        if [ "$RANK" = 1 ]; then
            while [ "$(ls "$SYNC" | wc -l)" -lt 3 ]; do sleep 0.01; done
            exit 3
        fi
        sleep 60 & echo "helper $!"
        touch "$SYNC/ready.$RANK"
        wait
    "#;
    let out = Launcher::start_with(
        Command::new(BIN)
            .args(["run", "--nproc-per-node", "4", "--", "sh", "-c", script])
            .env("SYNC", dir.path()),
    )
    .finish();
    assert_eq!(out.code, Some(3), "{out:?}");
    assert!(out.elapsed < PROMPT, "took {:?}", out.elapsed);
    assert!(
        out.stderr.contains("tensorcomm run: rank 1 (pid ")
            && out
                .stderr
                .contains("exited with status 3; stopped the other 3 ranks"),
        "{:?}",
        out.stderr
    );
    // The SIGTERM reached each rank's whole process group.
    let helpers: Vec<u32> = out
        .stdout_text()
        .lines()
        .filter_map(|l| l.split_once("helper ")?.1.parse().ok())
        .collect();
    assert_eq!(helpers.len(), 3, "{out:?}");
    for pid in helpers {
        assert_dies(pid);
    }
}

#[test]
fn a_rank_killed_by_a_signal_is_reported_as_such() {
    let out = run(&[
        "--nproc-per-node",
        "2",
        "--",
        "sh",
        "-c",
        r#"if [ "$RANK" = 0 ]; then kill -KILL $$; fi; exec sleep 60"#,
    ]);
    assert_eq!(out.code, Some(128 + 9), "{out:?}");
    assert!(out.elapsed < PROMPT, "took {:?}", out.elapsed);
    assert!(
        out.stderr.contains("rank 0 (pid ")
            && out.stderr.contains("was killed by signal 9 (SIGKILL)"),
        "{:?}",
        out.stderr
    );
}

#[test]
fn ranks_that_ignore_sigterm_get_sigkill_after_the_grace() {
    let dir = tempdir();
    let script = r#"
        if [ "$RANK" = 1 ]; then
            while [ ! -e "$SYNC/ready" ]; do sleep 0.01; done
            exit 4
        fi
        trap '' TERM
        touch "$SYNC/ready"
        exec sleep 60
    "#;
    let out = Launcher::start_with(
        Command::new(BIN)
            .args([
                "run",
                "--nproc-per-node",
                "2",
                "--kill-grace-secs",
                "0.3",
                "--",
                "sh",
                "-c",
                script,
            ])
            .env("SYNC", dir.path()),
    )
    .finish();
    assert_eq!(out.code, Some(4), "{out:?}");
    assert!(out.elapsed < PROMPT, "took {:?}", out.elapsed);
    assert!(
        out.stderr.contains("rank 1 (pid ")
            && out.stderr.contains(
                "rank 0 did not exit within 300ms of the stop signal and was killed (SIGKILL)"
            ),
        "{:?}",
        out.stderr
    );
}

/// A rank stopped with SIGSTOP cannot act on SIGTERM until it runs again:
/// the launcher continues it, so it ends at once rather than after the
/// whole grace.
#[test]
fn a_stopped_rank_is_continued_so_that_it_ends_on_sigterm() {
    let dir = tempdir();
    let script = r#"
        if [ "$RANK" = 1 ]; then
            while [ ! -e "$SYNC/stopping" ]; do sleep 0.01; done
            sleep 0.2
            exit 4
        fi
        touch "$SYNC/stopping"
        kill -STOP $$
        sleep 60
    "#;
    let out = Launcher::start_with(
        Command::new(BIN)
            .args([
                "run",
                "--nproc-per-node",
                "2",
                "--kill-grace-secs",
                "60",
                "--",
                "sh",
                "-c",
                script,
            ])
            .env("SYNC", dir.path()),
    )
    .finish();
    assert_eq!(out.code, Some(4), "{out:?}");
    assert!(
        out.elapsed < PROMPT,
        "took {:?}: the stopped rank waited for the 60 s grace",
        out.elapsed
    );
    assert!(
        !out.stderr.contains("was killed (SIGKILL)"),
        "{:?}",
        out.stderr
    );
}

#[test]
fn sigterm_to_the_launcher_is_forwarded_to_every_rank() {
    let mut launcher = Launcher::start(&[
        "--nproc-per-node",
        "3",
        "--",
        "sh",
        "-c",
        r#"trap 'echo "rank $RANK got TERM"; exit 0' TERM; sleep 60 & echo ready; wait"#,
    ]);
    launcher.wait_for_lines("ready", 3);
    launcher.signal("TERM");
    let out = launcher.finish();
    assert_eq!(out.code, Some(128 + 15), "{out:?}");
    assert!(out.elapsed < PROMPT, "took {:?}", out.elapsed);
    let stdout = out.stdout_text();
    for rank in 0..3 {
        let line = format!("[rank{rank}]: rank {rank} got TERM\n");
        assert!(stdout.contains(&line), "{line:?} missing from {stdout:?}");
    }
    assert!(
        out.stderr
            .contains("tensorcomm run: received SIGTERM; forwarded it to 3 ranks"),
        "{:?}",
        out.stderr
    );
}

#[test]
fn sigint_to_the_launcher_stops_ranks_that_do_not_handle_it() {
    let mut launcher = Launcher::start(&[
        "--nproc-per-node",
        "2",
        "--",
        "sh",
        "-c",
        "echo ready; exec sleep 60",
    ]);
    launcher.wait_for_lines("ready", 2);
    launcher.signal("INT");
    let out = launcher.finish();
    assert_eq!(out.code, Some(128 + 2), "{out:?}");
    assert!(out.elapsed < PROMPT, "took {:?}", out.elapsed);
    assert!(
        out.stderr
            .contains("received SIGINT; forwarded it to 2 ranks"),
        "{:?}",
        out.stderr
    );
}

#[test]
fn ranks_die_when_the_launcher_is_killed_hard() {
    let mut launcher = Launcher::start(&[
        "--nproc-per-node",
        "2",
        "--",
        "sh",
        "-c",
        r#"echo "exits $TENSORCOMM_LAUNCH_EXITS"; echo "pid $$"; exec sleep 60"#,
    ]);
    let pids: Vec<u32> = launcher
        .wait_for_lines("pid ", 2)
        .iter()
        .map(|l| {
            l.trim_end()
                .rsplit_once(' ')
                .and_then(|(_, pid)| pid.parse().ok())
                .unwrap_or_else(|| panic!("no pid in {l:?}"))
        })
        .collect();
    let exits = launcher.wait_for_lines("exits ", 1)[0]
        .trim_end()
        .trim_start_matches("[rank0]: ")
        .trim_start_matches("[rank1]: ")
        .trim_start_matches("exits ")
        .to_string();
    assert!(Path::new(&exits).is_file(), "{exits:?}");
    launcher.signal("KILL");
    let out = launcher.finish();
    assert_eq!(out.code, None, "killed by a signal: {out:?}");
    for pid in pids {
        assert_dies(pid);
    }
    // The guardian removes the job's exits file too.
    let deadline = Instant::now() + Duration::from_secs(5);
    while Path::new(&exits).exists() && Instant::now() < deadline {
        thread::sleep(Duration::from_millis(20));
    }
    assert!(!Path::new(&exits).exists(), "{exits} was left behind");
}

/// `kill -9` of the launcher also ends what the ranks started: a rank
/// dies of its parent-death signal, but its children used to survive it.
#[test]
fn the_ranks_children_die_when_the_launcher_is_killed_hard() {
    let mut launcher = Launcher::start(&[
        "--nproc-per-node",
        "3",
        "--",
        "sh",
        "-c",
        r#"sleep 30 & echo "child $!"; wait"#,
    ]);
    let pids: Vec<u32> = launcher
        .wait_for_lines("child ", 3)
        .iter()
        .map(|l| {
            l.trim_end()
                .rsplit_once(' ')
                .and_then(|(_, pid)| pid.parse().ok())
                .unwrap_or_else(|| panic!("no pid in {l:?}"))
        })
        .collect();
    launcher.signal("KILL");
    let deadline = Instant::now() + Duration::from_secs(5);
    while !pids.iter().all(|&pid| is_dead(pid)) && Instant::now() < deadline {
        thread::sleep(Duration::from_millis(20));
    }
    let alive: Vec<u32> = pids.iter().copied().filter(|&p| !is_dead(p)).collect();
    for pid in &alive {
        // Do not leave them behind when the assertion fails.
        let _ = Command::new("kill")
            .args(["-KILL", &pid.to_string()])
            .status();
    }
    assert!(
        alive.is_empty(),
        "children {alive:?} of {pids:?} survived the launcher"
    );
    let out = launcher.finish();
    assert_eq!(out.code, None, "killed by a signal: {out:?}");
}

#[test]
fn a_missing_program_is_named_and_exits_127() {
    let out = run(&[
        "--nproc-per-node",
        "2",
        "--",
        "/nonexistent/tc-no-such-program",
    ]);
    assert_eq!(out.code, Some(127), "{out:?}");
    assert!(
        out.stderr
            .contains("cannot start rank 0: program `/nonexistent/tc-no-such-program` not found"),
        "{:?}",
        out.stderr
    );
    assert!(out.stdout.is_empty());
}

#[test]
fn a_program_that_is_not_executable_exits_126() {
    let dir = tempdir();
    let path = dir.path().join("not-executable");
    std::fs::write(&path, "#!/bin/sh\necho hi\n").expect("write script");
    let path = path.to_str().expect("utf-8 temp path");
    let out = run(&["--", path]);
    assert_eq!(out.code, Some(126), "{out:?}");
    assert!(
        out.stderr
            .contains(&format!("program `{path}` is not executable")),
        "{:?}",
        out.stderr
    );
}

#[test]
fn invalid_arguments_are_rejected_before_anything_starts() {
    let dir = tempdir();
    let marker = dir.path().join("started");
    let script = format!("touch '{}'", marker.display());
    let cases: [(&[&str], &str); 5] = [
        (
            &["--nproc-per-node", "0"],
            "--nproc-per-node must be at least 1 (found 0)",
        ),
        (
            &["--nnodes", "2", "--node-rank", "2", "--master-addr", "h"],
            "--node-rank must be less than --nnodes 2 (expected 0..=1, found 2)",
        ),
        (
            &["--nnodes", "2", "--node-rank", "1"],
            "needs --master-addr",
        ),
        (&["--nnodes", "0"], "--nnodes must be at least 1 (found 0)"),
        (
            &["--kill-grace-secs", "-1"],
            "--kill-grace-secs must be a finite number",
        ),
    ];
    for (flags, message) in cases {
        let mut args = flags.to_vec();
        args.extend(["--", "sh", "-c", &script]);
        let out = run(&args);
        assert_eq!(out.code, Some(2), "{flags:?}: {out:?}");
        assert!(out.stderr.contains(message), "{flags:?}: {:?}", out.stderr);
    }
    let out = run(&["--nproc-per-node", "2"]);
    assert_eq!(out.code, Some(2), "{out:?}");
    assert!(out.stderr.contains("<PROGRAM>"), "{:?}", out.stderr);
    assert!(!Path::new(&marker).exists(), "a rank started");
}

#[test]
fn a_helper_left_holding_the_output_does_not_hang_the_launcher() {
    let out = run(&[
        "--kill-grace-secs",
        "0.2",
        "--",
        "sh",
        "-c",
        r#"sleep 30 & echo "helper $!"; echo done"#,
    ]);
    // The launcher waits at least 1 s for output to stop arriving. The helper
    // outlives its rank by design here; end it ourselves.
    let helper = out
        .stdout_text()
        .lines()
        .find_map(|l| l.split_once("helper ")?.1.parse::<u32>().ok());
    if let Some(pid) = helper {
        let _ = Command::new("kill").arg(pid.to_string()).status();
    }
    assert_eq!(out.code, Some(0), "{out:?}");
    assert!(helper.is_some(), "{out:?}");
    assert!(out.elapsed < PROMPT, "took {:?}", out.elapsed);
    assert!(out.stdout_text().contains("[rank0]: done\n"), "{out:?}");
    assert!(
        out.stderr
            .contains("rank 0's stdout is still open 1s after it exited"),
        "{:?}",
        out.stderr
    );
}

/// A rank killed while a group is being set up can leave a shared-memory
/// name behind; once every rank has ended, the launcher removes the names
/// its ranks made (here a rank makes one the way tensorcomm names them,
/// then is killed).
#[test]
fn shared_memory_names_left_by_killed_ranks_are_removed_when_the_job_ends() {
    let out = run(&[
        "--",
        "sh",
        "-c",
        r#"name="tcshm.$$.0.00000000.0-1"; : > "/dev/shm/$name"; echo "$name"; kill -9 $$"#,
    ]);
    assert_eq!(out.code, Some(137), "{out:?}");
    let text = out.stdout_text();
    let names: Vec<&str> = text
        .lines()
        .filter_map(|l| l.split_once("]: ").map(|(_, n)| n.trim()))
        .collect();
    assert_eq!(names.len(), 1, "{text}");
    for name in names {
        assert!(
            !std::path::Path::new(&format!("/dev/shm/{name}")).exists(),
            "{name} is still in /dev/shm"
        );
    }
}

/// Ranks writing long lines to both streams at once, with the launcher's
/// stdout and stderr on one pipe: every line that comes out is one whole
/// line one rank wrote, behind that rank's prefix (lines are longer than a
/// pipe holds, so each takes several writes).
#[test]
fn long_lines_of_concurrent_ranks_come_out_whole() {
    const RANKS: usize = 4;
    const LINES: usize = 6;
    const LEN: usize = 100_000;
    let script = format!(
        r#"x=$(head -c {LEN} /dev/zero | tr '\0' x); i=0; while [ $i -lt {LINES} ]; do echo "$RANK out $i $x"; echo "$RANK err $i $x" >&2; i=$((i+1)); done; printf "$RANK last $x""#
    );
    let nproc = RANKS.to_string();
    let out = Launcher::start_with(Command::new("sh").args([
        "-c",
        r#"exec "$0" "$@" 2>&1"#,
        BIN,
        "run",
        "--nproc-per-node",
        &nproc,
        "--",
        "sh",
        "-c",
        &script,
    ]))
    .finish();
    assert_eq!(out.code, Some(0), "{:?}", out.stderr);
    let text = out.stdout_text();
    let mut seen = BTreeMap::new();
    for line in text.lines() {
        let short: String = line.chars().take(80).collect();
        let (prefix, body) = line
            .split_once("]: ")
            .unwrap_or_else(|| panic!("line without a rank prefix: {short:?}"));
        let rank: usize = prefix
            .strip_prefix("[rank")
            .and_then(|r| r.parse().ok())
            .unwrap_or_else(|| panic!("line without a rank prefix: {short:?}"));
        let mut words = body.split(' ');
        let (writer, what) = (words.next(), words.next());
        let (index, xs) = match what {
            Some("last") => (Some("-"), words.next()),
            _ => (words.next(), words.next()),
        };
        assert_eq!(writer, Some(rank.to_string().as_str()), "{short:?}");
        assert!(
            xs.is_some_and(|xs| xs.len() == LEN && xs.bytes().all(|b| b == b'x'))
                && words.next().is_none(),
            "line of rank {rank} is not one whole line it wrote: {short:?}... ({} bytes)",
            line.len()
        );
        *seen
            .entry((rank, what.map(str::to_owned), index.map(str::to_owned)))
            .or_insert(0) += 1;
    }
    // Every line, the last one without a newline included, exactly once.
    assert_eq!(seen.len(), RANKS * (2 * LINES + 1), "{seen:?}");
    assert!(seen.values().all(|&n| n == 1), "{seen:?}");
}

/// Threads of process `pid`, from /proc.
fn threads_of(pid: u32) -> usize {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("read status");
    status
        .lines()
        .find_map(|l| l.strip_prefix("Threads:"))
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or_else(|| panic!("no Threads line in {status}"))
}

/// The launcher's threads do not grow with the ranks (a thread per pipe
/// made every later fork copy all their stacks: start-up was quadratic).
#[test]
fn the_launcher_copies_all_output_with_a_fixed_number_of_threads() {
    let dir = tempdir();
    let go = dir.path().join("go");
    let script = format!(
        r#"echo up; while [ ! -e '{}' ]; do sleep 0.05; done; echo bye"#,
        go.display()
    );
    let mut launcher = Launcher::start(&["--nproc-per-node", "64", "--", "sh", "-c", &script]);
    launcher.wait_for_lines("]: up", 64);
    let threads = threads_of(launcher.pid());
    std::fs::write(&go, b"").expect("create go");
    let out = launcher.finish();
    assert_eq!(out.code, Some(0), "{out:?}");
    assert_eq!(out.stdout_text().matches("]: bye\n").count(), 64, "{out:?}");
    assert!(
        threads <= 4,
        "the launcher of 64 ranks has {threads} threads"
    );
}

/// A rank that fails while the others are still being started stops the
/// start-up: the launcher looks at its ranks while starting them rather
/// than only once all are up. (Starting 1000 ranks takes over a second;
/// rank 0's failure is seen within tens of milliseconds.)
#[test]
fn a_rank_failing_during_start_up_stops_the_start_up() {
    const RANKS: usize = 1000;
    let nproc = RANKS.to_string();
    let out = run(&[
        "--nproc-per-node",
        &nproc,
        "--",
        "sh",
        "-c",
        r#"if [ "$RANK" = 0 ]; then exit 3; fi; echo started; exec sleep 60"#,
    ]);
    assert_eq!(out.code, Some(3), "{}", out.stderr);
    assert!(out.stderr.contains("rank 0 (pid"), "{}", out.stderr);
    let started = out.stdout_text().matches("]: started\n").count();
    assert!(
        started < RANKS - 1,
        "all {started} other ranks were started before rank 0's failure was seen"
    );
}

/// A rank that exits 0 while another keeps running is named on stderr, and
/// nothing is stopped for it: the other rank ends by itself, here once the
/// test has seen the message (it gives up after 20 s, and the test fails).
#[test]
fn a_rank_exiting_early_while_others_run_is_named_once() {
    let dir = tempdir();
    let go = dir.path().join("go");
    let script = format!(
        r#"if [ "$RANK" = 0 ]; then exit 0; fi; i=0; while [ ! -e '{}' ] && [ $i -lt 400 ]; do sleep 0.05; i=$((i+1)); done; echo still here"#,
        go.display()
    );
    let mut child = Command::new(BIN)
        .args(["run", "--nproc-per-node", "2", "--", "sh", "-c", &script])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start tensorcomm");
    let stdout = child.stdout.take().expect("piped stdout");
    let stdout = thread::spawn(move || {
        let mut all = String::new();
        let _ = BufReader::new(stdout).read_to_string(&mut all);
        all
    });
    let mut stderr = Vec::new();
    for line in BufReader::new(child.stderr.take().expect("piped stderr")).lines() {
        let line = line.expect("read stderr");
        let seen = line.contains("rank 0 exited with status 0");
        stderr.push(line);
        if seen {
            std::fs::write(&go, b"").expect("create go");
        }
    }
    let status = child.wait().expect("wait for tensorcomm");
    let stdout = stdout.join().expect("stdout reader");
    assert_eq!(status.code(), Some(0), "{stderr:?}");
    assert!(stdout.contains("[rank1]: still here\n"), "{stdout:?}");
    let notices: Vec<&String> = stderr
        .iter()
        .filter(|l| l.contains("exited with status 0"))
        .collect();
    assert_eq!(notices.len(), 1, "{stderr:?}");
    assert!(
        notices[0].starts_with("tensorcomm run: rank 0 exited with status 0 ")
            && notices[0].contains("1 other rank still runs")
            && notices[0].contains("nothing is stopped"),
        "{stderr:?}"
    );
}

/// A job the open-file limit has no room for (two pipes per rank) is
/// refused before any rank starts, naming the limit.
#[test]
fn a_job_beyond_the_open_file_limit_is_refused_up_front() {
    let dir = tempdir();
    let marker = dir.path().join("started");
    let script = format!("touch '{}'", marker.display());
    let out = Launcher::start_with(Command::new("sh").args([
        "-c",
        r#"ulimit -n 256 && exec "$0" "$@""#,
        BIN,
        "run",
        "--nproc-per-node",
        "300",
        "--",
        "sh",
        "-c",
        &script,
    ]))
    .finish();
    assert_eq!(out.code, Some(2), "{out:?}");
    assert!(
        out.stderr
            .contains("300 ranks with prefixed output need about 632 open files")
            && out.stderr.contains("its limit is 256 (ulimit -n"),
        "{}",
        out.stderr
    );
    assert!(!marker.exists(), "a rank started");
}
