//! Running one scenario under `tensorcomm run` and judging it: the
//! launcher's status and message, each survivor's error, the time it took,
//! and what the job left behind (processes, `/dev/shm` names).

use std::collections::BTreeMap;
use std::io::Read;
use std::process::{Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use super::rank::{self, SURVIVOR_FAILED, VICTIM_FAILED};
use super::scenario::{FaultBackend, FaultKind, Scenario};

/// Names the `tensorcomm` binary to launch with, where this test binary
/// runs away from its build (copied to a GPU machine with the binary).
pub const BIN_VAR: &str = "TENSORCOMM_BIN";

/// The `tensorcomm` binary: [`BIN_VAR`] when set, else the one cargo built
/// beside this test.
pub fn tensorcomm_bin() -> std::path::PathBuf {
    std::env::var_os(BIN_VAR).map_or_else(
        || env!("CARGO_BIN_EXE_tensorcomm").into(),
        std::path::PathBuf::from,
    )
}

/// The timing of a job: the group's timeout, the launcher's grace between
/// SIGTERM and SIGKILL, and the harness's hard limit (beyond it the job
/// counts as hung and is killed).
#[derive(Clone, Copy, Debug)]
pub struct Timing {
    pub timeout: Duration,
    pub grace: Duration,
    pub hard_limit: Duration,
    /// How long a rank that got its error waits before exiting.
    pub linger: Duration,
}

/// How one scenario ended.
#[derive(Debug, Default)]
pub struct Verdict {
    /// Passed the hard limit, or a survivor never reported an error.
    pub hung: bool,
    /// A process or a `/dev/shm` name of the job outlived it.
    pub leaked: bool,
    /// Every expectation that did not hold.
    pub problems: Vec<String>,
    pub elapsed: Duration,
    /// Survivors the launcher stopped before their program began (the
    /// victim of a store kill died first): nothing to judge.
    pub not_started: usize,
}

/// One `FAULT-RESULT` line, split into `key=value` fields (`text` last).
#[derive(Debug)]
struct RankResult {
    fields: BTreeMap<String, String>,
}

impl RankResult {
    fn parse(line: &str) -> Self {
        let (head, text) = line.split_once(" text=").unwrap_or((line, ""));
        let mut fields: BTreeMap<String, String> = head
            .split_whitespace()
            .filter_map(|w| w.split_once('=').map(|(k, v)| (k.into(), v.into())))
            .collect();
        fields.insert("text".into(), text.into());
        RankResult { fields }
    }
    fn get(&self, key: &str) -> &str {
        self.fields.get(key).map_or("", String::as_str)
    }
}

/// `[rankN]: KEY rest` lines of the launcher's stdout whose payload starts
/// with `tag`: rank -> payload.
fn tagged(stdout: &str, tag: &str) -> BTreeMap<usize, String> {
    stdout
        .lines()
        .filter_map(|l| {
            let rest = l.strip_prefix("[rank")?;
            let (r, payload) = rest.split_once("]: ")?;
            let payload = payload.strip_prefix(tag)?;
            Some((r.parse().ok()?, payload.trim().to_string()))
        })
        .collect()
}

fn pid_alive(pid: u32) -> bool {
    // SAFETY: signal 0 only checks whether the process exists.
    unsafe { libc::kill(pid as libc::pid_t, 0) == 0 }
}

/// `/dev/shm` names made by tensorcomm for one of `pids`
/// (`tc<kind>.<pid>.`...).
fn shm_names_of(pids: &[u32]) -> Vec<String> {
    let Ok(dir) = std::fs::read_dir("/dev/shm") else {
        return Vec::new();
    };
    dir.filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|name| {
            let Some((_, rest)) = name.strip_prefix("tc").and_then(|r| r.split_once('.')) else {
                return false;
            };
            let pid = rest.split('.').next().and_then(|p| p.parse::<u32>().ok());
            pid.is_some_and(|p| pids.contains(&p))
        })
        .collect()
}

/// Runs `sc` under the launcher and judges it.
pub fn run(sc: &Scenario, timing: Timing) -> Verdict {
    let mut verdict = Verdict::default();
    let started = Instant::now();
    let bin = tensorcomm_bin();
    let mut child = Command::new(&bin)
        .args([
            "run",
            "--nproc-per-node",
            &sc.world.to_string(),
            "--kill-grace-secs",
            &timing.grace.as_secs_f64().to_string(),
            "--",
        ])
        .arg(std::env::current_exe().expect("the test binary"))
        .args([
            "--exact",
            "fault_rank_entry",
            "--nocapture",
            "--test-threads=1",
            "-q",
        ])
        .env(rank::SEED_VAR, format!("{:x}", sc.seed))
        .env(rank::KIND_VAR, sc.kind.to_string())
        .env(rank::TIMEOUT_VAR, timing.timeout.as_millis().to_string())
        .env(rank::LINGER_VAR, timing.linger.as_millis().to_string())
        .env(rank::VICTIM_0_VAR, if sc.victim_0 { "1" } else { "0" })
        .env(rank::BACKEND_VAR, sc.backend.to_string())
        .env_remove("TENSORCOMM_TRANSPORT")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("starting {} run: {e}", bin.display()));
    let readers = [
        child
            .stdout
            .take()
            .map(|s| Box::new(s) as Box<dyn Read + Send>),
        child
            .stderr
            .take()
            .map(|s| Box::new(s) as Box<dyn Read + Send>),
    ]
    .map(|pipe| {
        thread::spawn(move || {
            let mut all = Vec::new();
            if let Some(mut pipe) = pipe {
                let _ = pipe.read_to_end(&mut all);
            }
            String::from_utf8_lossy(&all).into_owned()
        })
    });
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait for tensorcomm run") {
            break Some(status);
        }
        if started.elapsed() > timing.hard_limit {
            // SIGKILL: its guardian ends the ranks.
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        thread::sleep(Duration::from_millis(5));
    };
    verdict.elapsed = started.elapsed();
    let [stdout, stderr] = readers.map(|r| r.join().unwrap_or_default());
    let Some(status) = status else {
        verdict.hung = true;
        verdict
            .problems
            .push(format!("still running after {:?}", timing.hard_limit));
        verdict.leaked = leaks(&stdout, &mut verdict.problems);
        explain(&stdout, &stderr, &mut verdict.problems);
        keep_output(sc, &stdout, &stderr);
        return verdict;
    };
    judge_launcher(sc, status.code(), &stderr, &mut verdict.problems);
    let results: BTreeMap<usize, RankResult> = tagged(&stdout, "FAULT-RESULT ")
        .into_iter()
        .map(|(r, line)| (r, RankResult::parse(&line)))
        .collect();
    let started = tagged(&stdout, "FAULT-PID ");
    for r in (0..sc.world).filter(|&r| r != sc.victim) {
        match results.get(&r) {
            // The launcher stopped it (SIGTERM) before its program began,
            // when a store kill's victim died within milliseconds of the
            // start (other faults wait for every rank's rendezvous): it ran
            // nothing, so it has nothing to report and nothing to leak.
            None if !started.contains_key(&r) && sc.kind == FaultKind::StoreKill => {
                verdict.not_started += 1;
            }
            None => {
                verdict.hung = true;
                verdict
                    .problems
                    .push(format!("survivor rank {r} reported no error"));
            }
            Some(res) => judge_survivor(sc, timing, r, res, &mut verdict.problems),
        }
    }
    verdict.leaked = leaks(&stdout, &mut verdict.problems);
    if !verdict.problems.is_empty() {
        explain(&stdout, &stderr, &mut verdict.problems);
        keep_output(sc, &stdout, &stderr);
    }
    verdict
}

/// With `TENSORCOMM_FAULT_KEEP_OUTPUT=<dir>`, a failed scenario's whole
/// output (the launcher's and every rank's) goes to
/// `<dir>/<seed>-<kind>-<unix ms>.{stdout,stderr}` (reruns of a seed do
/// not overwrite each other), for what the summary leaves out.
fn keep_output(sc: &Scenario, stdout: &str, stderr: &str) {
    let Some(dir) = std::env::var_os("TENSORCOMM_FAULT_KEEP_OUTPUT") else {
        return;
    };
    let dir = std::path::Path::new(&dir);
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis());
    let stem = format!("{:#x}-{}-{now}", sc.seed, sc.kind);
    for (ext, text) in [("stdout", stdout), ("stderr", stderr)] {
        let path = dir.join(format!("{stem}.{ext}"));
        if let Err(e) = std::fs::create_dir_all(dir).and_then(|()| std::fs::write(&path, text)) {
            eprintln!("could not keep {}: {e}", path.display());
        }
    }
}

/// Adds what the launcher and the ranks said, for a failed scenario.
fn explain(stdout: &str, stderr: &str, problems: &mut Vec<String>) {
    let launcher: Vec<&str> = stderr
        .lines()
        .filter(|l| l.starts_with("tensorcomm run:"))
        .collect();
    problems.push(format!("launcher said: {launcher:?}"));
    problems.extend(
        stdout
            .lines()
            .filter(|l| l.contains("FAULT-RESULT"))
            .map(|l| l.chars().take(400).collect::<String>()),
    );
}

/// The launcher exits non-zero naming the rank that failed first: the
/// victim, by signal, when it was killed; else a rank that reported an
/// error, with its status.
fn judge_launcher(sc: &Scenario, code: Option<i32>, stderr: &str, problems: &mut Vec<String>) {
    let Some(code) = code.filter(|&c| c != 0) else {
        problems.push(format!("launcher exited with {code:?}, expected a failure"));
        return;
    };
    let named = stderr.lines().find_map(|l| {
        let rest = l.split_once("tensorcomm run: rank ")?.1;
        let (rank, rest) = rest.split_once(" (pid ")?;
        Some((rank.parse::<usize>().ok()?, rest.to_string()))
    });
    let Some((rank, how)) = named else {
        problems.push("launcher named no rank".into());
        return;
    };
    let killed = matches!(sc.kind, FaultKind::Kill | FaultKind::StoreKill);
    let ok = if killed {
        rank == sc.victim && how.contains("killed by signal 9 (SIGKILL)") && code == 128 + 9
    } else if rank == sc.victim {
        // Only a victim that carries on fails with its own status.
        matches!(sc.kind, FaultKind::Mismatch | FaultKind::CloseSockets)
            && how.contains(&format!("exited with status {VICTIM_FAILED}"))
            && code == VICTIM_FAILED
    } else {
        how.contains(&format!("exited with status {SURVIVOR_FAILED}")) && code == SURVIVOR_FAILED
    };
    if !ok {
        problems.push(format!(
            "launcher exited {code} naming rank {rank}: {how} (victim {})",
            sc.victim
        ));
    }
}

/// A survivor's error names the victim, and came before the timeout (well
/// before it when a connection dropped).
fn judge_survivor(
    sc: &Scenario,
    timing: Timing,
    rank: usize,
    res: &RankResult,
    problems: &mut Vec<String>,
) {
    if res.get("phase") == "done" {
        problems.push(format!("survivor rank {rank} completed every collective"));
        return;
    }
    let victim = sc.victim.to_string();
    let text = res.get("text");
    let names_victim = if res.get("phase") == "init" {
        // Rank 0, the store's host, failed before the group existed: the
        // error names the store (its address), which rank 0 serves, or
        // rank 0 itself (a connection to it broke while setting up).
        sc.victim == 0 && (text.contains("store") || res.get("peer") == victim)
    } else {
        res.get("ranks") == format!("[{victim}]")
            && (res.get("peer") == victim || res.get("peer") == "-")
    };
    if !names_victim {
        problems.push(format!(
            "survivor rank {rank} did not name victim {victim}: {text}"
        ));
    }
    let call = Duration::from_millis(res.get("call_ms").parse().unwrap_or(u64::MAX));
    let limit = if res.get("phase") == "init" {
        // A client keeps trying to reach a store that may not be up yet.
        timing.timeout + Duration::from_secs(1)
    } else if sc.backend == FaultBackend::Nccl {
        // Within a host NCCL's peers share GPU memory, not a connection
        // that drops: a dead or stopped peer is found when the watchdog's
        // deadline passes (then a moment to read the others' progress),
        // a mismatch when the stalled call is compared (`stall_check.rs`).
        timing.timeout + Duration::from_secs(1)
    } else if sc.kind.drops_connection() {
        timing.timeout / 2
    } else {
        timing.timeout * 2 + Duration::from_secs(1)
    };
    if call > limit {
        problems.push(format!(
            "survivor rank {rank} took {call:?} to fail (limit {limit:?}): {text}"
        ));
    }
}

/// No process of the job is left, nor a `/dev/shm` name one of them made.
fn leaks(stdout: &str, problems: &mut Vec<String>) -> bool {
    let pids: Vec<u32> = tagged(stdout, "FAULT-PID ")
        .values()
        .filter_map(|p| p.split_once("pid=")?.1.parse().ok())
        .collect();
    // The launcher reaped its ranks before exiting; allow a moment for a
    // rank killed by the guardian after a hang.
    let deadline = Instant::now() + Duration::from_secs(2);
    let mut alive: Vec<u32> = pids.clone();
    while !alive.is_empty() && Instant::now() < deadline {
        alive.retain(|&p| pid_alive(p));
        thread::sleep(Duration::from_millis(10));
    }
    let names = shm_names_of(&pids);
    let mut leaked = false;
    if !alive.is_empty() {
        problems.push(format!("processes left: {alive:?}"));
        for pid in &alive {
            // SAFETY: ends a leftover rank of this job.
            unsafe {
                libc::kill(*pid as libc::pid_t, libc::SIGKILL);
            }
        }
        leaked = true;
    }
    if !names.is_empty() {
        problems.push(format!("/dev/shm names left: {names:?}"));
        for n in &names {
            let _ = std::fs::remove_file(format!("/dev/shm/{n}"));
        }
        leaked = true;
    }
    leaked
}
