//! A rank that exits 0 before it ever reaches rendezvous, under
//! `tensorcomm run`: the ranks waiting for it at rendezvous (rank 0 for
//! every rank to join, the others for rank 0 to see them all, or still
//! connecting to rank 0's store, as when rank 0 is the one that left)
//! fail at once, naming it and
//! how it ended, instead of waiting until their 30-minute timeout; the
//! launcher's line names it too.

use std::io::Read;
use std::process::{Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_tensorcomm");
/// Well within the ranks' own timeouts (30 min for the bench's group, 10
/// min given to the demo); before the launcher told the ranks, these jobs
/// ran until this guard.
const PROMPT: Duration = Duration::from_secs(20);

/// A finished launcher: its exit code, how long it ran, and everything it
/// and its ranks wrote (stdout, then stderr).
struct Finished {
    code: Option<i32>,
    elapsed: Duration,
    output: String,
}

/// Runs `tensorcomm run --nproc-per-node N -- sh -c SCRIPT`, killing it
/// (and failing) once it has run [`PROMPT`].
fn run(nproc: usize, script: &str) -> Finished {
    let start = Instant::now();
    let mut child = Command::new(BIN)
        .args(["run", "--nproc-per-node", &nproc.to_string(), "--"])
        .args(["sh", "-c", script])
        .env_remove("TENSORCOMM_LAUNCH_EXITS")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start tensorcomm run");
    let mut stdout = child.stdout.take().expect("piped stdout");
    let mut stderr = child.stderr.take().expect("piped stderr");
    let out = thread::spawn(move || {
        let mut all = String::new();
        let _ = stdout.read_to_string(&mut all);
        all
    });
    let err = thread::spawn(move || {
        let mut all = String::new();
        let _ = stderr.read_to_string(&mut all);
        all
    });
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait for tensorcomm run") {
            break status;
        }
        if start.elapsed() > PROMPT {
            // The ranks die with the launcher (parent-death signal).
            let _ = child.kill();
            let _ = child.wait();
            let output = out.join().unwrap() + &err.join().unwrap();
            panic!("the job still ran after {PROMPT:?}:\n{output}");
        }
        thread::sleep(Duration::from_millis(20));
    };
    Finished {
        code: status.code(),
        elapsed: start.elapsed(),
        output: out.join().unwrap() + &err.join().unwrap(),
    }
}

/// The lines of `output` in which a rank other than `gone` says how `gone`
/// ended before it joined (or, told while still connecting itself, before
/// rendezvous was complete).
fn survivors_naming(output: &str, gone: usize, ended: &str) -> Vec<String> {
    output
        .lines()
        .filter(|l| !l.starts_with(&format!("[rank{gone}]")) && l.starts_with("[rank"))
        .filter(|l| {
            l.contains(&format!("peer rank {gone} is gone while"))
                && (l.contains(&format!("it {ended} before joining the job"))
                    || l.contains(&format!("it {ended} before rendezvous was complete")))
        })
        .map(str::to_string)
        .collect()
}

#[test]
fn a_rank_exiting_0_before_rendezvous_fails_the_others_rendezvous_at_once() {
    // Ranks 0 and 1 run a CPU-group benchmark (default timeout 30 min):
    // rank 0 waits at rendezvous for rank 2 to join, rank 1 for rank 0 to
    // see every rank join.
    let script = format!(
        r#"if [ "$RANK" = 2 ]; then exit 0; fi; exec "{BIN}" bench --op barrier --iters 1 --warmup 0 --sizes 8"#
    );
    let out = run(3, &script);
    assert_ne!(out.code, Some(0), "{}", out.output);
    let named = survivors_naming(&out.output, 2, "exited with status 0");
    assert!(
        !named.is_empty(),
        "no survivor named rank 2:\n{}",
        out.output
    );
    assert!(
        out.output
            .lines()
            .any(|l| l.starts_with("tensorcomm run: rank ")
                && l.ends_with("; rank 2 had already exited with status 0")),
        "the launcher's line names rank 2:\n{}",
        out.output
    );
    assert!(out.elapsed < PROMPT, "{:?}", out.elapsed);
}

#[test]
fn rank_0_exiting_0_before_hosting_the_store_fails_the_others_at_once() {
    // Ranks 1 and 2 try to reach the store rank 0 would have hosted.
    let script = format!(
        r#"if [ "$RANK" = 0 ]; then exit 0; fi; exec "{BIN}" demo --timeout-secs 600 --bytes 1000 --adds 10"#
    );
    let out = run(3, &script);
    assert_ne!(out.code, Some(0), "{}", out.output);
    let named = survivors_naming(&out.output, 0, "exited with status 0");
    assert!(
        named
            .iter()
            .any(|l| l.contains("connecting to the TCP store")),
        "no survivor named rank 0:\n{}",
        out.output
    );
}

#[test]
fn a_rank_missing_from_a_file_rendezvous_is_named_at_once() {
    let script = format!(
        r#"if [ "$RANK" = 1 ]; then exit 0; fi; exec "{BIN}" demo --store file --timeout-secs 600 --bytes 1000 --adds 10"#
    );
    let out = run(3, &script);
    assert_ne!(out.code, Some(0), "{}", out.output);
    let named = survivors_naming(&out.output, 1, "exited with status 0");
    assert!(
        named
            .iter()
            .any(|l| l.contains("at the barrier of the file store")),
        "no survivor named rank 1:\n{}",
        out.output
    );
}

/// The launcher names its exits file to every rank, lists each exit there
/// as it reaps the rank, and removes the file when the job ends.
#[test]
fn every_rank_is_told_of_the_exits_and_the_file_goes_with_the_job() {
    let script = r#"if [ "$RANK" = 1 ]; then exit 0; fi
i=0; while ! grep -q "rank 1 exited with status 0" "$TENSORCOMM_LAUNCH_EXITS" && [ $i -lt 400 ]; do sleep 0.05; i=$((i+1)); done
echo "file $TENSORCOMM_LAUNCH_EXITS"; cat "$TENSORCOMM_LAUNCH_EXITS""#;
    let out = run(2, script);
    assert_eq!(out.code, Some(0), "{}", out.output);
    let path = out
        .output
        .lines()
        .find_map(|l| l.strip_prefix("[rank0]: file "))
        .unwrap_or_else(|| panic!("{}", out.output));
    assert!(
        path.starts_with(
            &std::env::temp_dir()
                .join("tensorcomm-exits-")
                .display()
                .to_string()
        ),
        "{path}"
    );
    assert!(
        out.output
            .contains("[rank0]: rank 1 exited with status 0\n"),
        "{}",
        out.output
    );
    assert!(
        !std::path::Path::new(path).exists(),
        "{path} was left behind"
    );
}
