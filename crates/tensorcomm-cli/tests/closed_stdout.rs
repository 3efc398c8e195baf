//! `tensorcomm … | head`: once the reader of stdout goes away, every
//! command that prints ends quietly (exit 0, no panic, no flight recorder,
//! no rank left waiting) instead of panicking in `println!` (Rust ignores
//! SIGPIPE, so a write to a closed pipe is an error, not a signal). The
//! cpu collective bench has its own test in `bench.rs`; the GPU benches
//! (nccl, intranode, cuda-comm) cannot run here.

use std::io::{BufRead, BufReader, Read};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// How long a run may take, its reader gone, before it counts as hung.
const BOUND: Duration = Duration::from_secs(10);

/// Runs `tensorcomm args`, reads `lines` lines of its stdout (none: the
/// pipe is closed before it writes anything), closes the pipe like
/// `head -n` does, and asserts the job ends quietly and in time.
fn ends_quietly_after(args: &[&str], lines: usize) {
    let start = Instant::now();
    let mut child = Command::new(env!("CARGO_BIN_EXE_tensorcomm"))
        .args(args)
        .env_remove("RANK")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start tensorcomm");
    // Drained as it comes, so that a long stderr (a flight-recorder dump)
    // cannot block the child and pass for a hang.
    let mut stderr_pipe = child.stderr.take().expect("piped stderr");
    let stderr_reader = std::thread::spawn(move || {
        let mut text = Vec::new();
        let _ = stderr_pipe.read_to_end(&mut text);
        text
    });
    let mut stdout = BufReader::new(child.stdout.take().expect("piped stdout"));
    for _ in 0..lines {
        let mut line = String::new();
        let n = stdout.read_line(&mut line).expect("read a line");
        assert!(n > 0, "{args:?}: stdout ended before {lines} line(s)");
    }
    drop(stdout);
    // Wait with a deadline: a rank left waiting must fail the test, not hang it.
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait for tensorcomm") {
            break status;
        }
        if start.elapsed() > BOUND {
            let _ = child.kill();
            let _ = child.wait();
            let text = stderr_reader.join().unwrap_or_default();
            panic!(
                "{args:?} (reader gone after {lines} line(s)) still running after {BOUND:?}; stderr:\n{}",
                String::from_utf8_lossy(&text)
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let text = stderr_reader.join().unwrap_or_default();
    let stderr = String::from_utf8_lossy(&text);
    let what = format!("{args:?} (reader gone after {lines} line(s)): {status:?}\n{stderr}");
    assert!(status.success(), "{what}");
    assert!(!stderr.contains("panicked"), "{what}");
    assert!(!stderr.contains("flight recorder"), "{what}");
    assert!(!stderr.contains("failed"), "{what}");
}

#[test]
fn a_closed_stdout_ends_the_ddp_bench_quietly() {
    let ddp = [
        "bench",
        "--op",
        "ddp",
        "-n",
        "3",
        "--model",
        "1K,1K,1K",
        "--bucket-cap",
        "4K",
        "--compute-us",
        "0",
        "--iters",
        "1",
        "--warmup",
        "0",
        "--transport",
        "tcp",
    ];
    // The reader gone before the first line (after one, the whole table is
    // already in the pipe, which proves nothing).
    ends_quietly_after(&ddp, 0);
    ends_quietly_after(&[&ddp[..], &["--json"]].concat(), 0);
}

#[test]
fn a_closed_stdout_ends_launched_ranks_quietly() {
    // Through `tensorcomm run`: its output thread stops copying once our
    // stdout is closed and closes the ranks' pipes, so each rank meets the
    // closed pipe at its next line.
    let run = [
        "run",
        "--nproc-per-node",
        "3",
        "--",
        env!("CARGO_BIN_EXE_tensorcomm"),
        "demo",
        "--bytes",
        "1000",
        "--adds",
        "10",
    ];
    for lines in [0, 1] {
        ends_quietly_after(&run, lines);
    }
}

#[test]
fn a_closed_stdout_ends_the_demo_quietly() {
    let demo = [
        "demo",
        "--nproc-per-node",
        "3",
        "--bytes",
        "1000",
        "--adds",
        "10",
    ];
    // Before the launcher's first line, then with the ranks printing.
    for lines in [0, 1] {
        ends_quietly_after(&demo, lines);
    }
}

#[test]
fn a_closed_stdout_ends_the_store_bench_quietly() {
    let store = [
        "store",
        "bench",
        "--clients",
        "4",
        "--ops",
        "20",
        "--rounds",
        "1",
        "--threads",
        "1,2",
    ];
    // As for the ddp bench, the reader gone before the first line.
    ends_quietly_after(&store, 0);
    ends_quietly_after(&[&store[..], &["--json"]].concat(), 0);
}
