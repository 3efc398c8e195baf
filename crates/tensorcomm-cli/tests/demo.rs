//! The README's main job: `tensorcomm demo` across several local ranks.

use std::process::Command;

fn demo(args: &[&str]) -> (bool, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_tensorcomm"))
        .arg("demo")
        .args(args)
        .env_remove("RANK")
        .output()
        .expect("start tensorcomm demo");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn demo_ranks_meet_over_tcp_and_verify_everything() {
    let (ok, stdout, stderr) =
        demo(&["--nproc-per-node", "3", "--bytes", "65536", "--adds", "100"]);
    assert!(ok, "stdout:\n{stdout}\nstderr:\n{stderr}");
    for rank in 0..3 {
        assert!(
            stdout.contains(&format!("[rank{rank}]: exchanged 3 payloads")),
            "{stdout}"
        );
        assert!(
            stdout.contains(&format!("[rank{rank}]: 100 adds")),
            "{stdout}"
        );
    }
    assert!(stdout.contains("counter 300 = 3 x 100"), "{stdout}");
    assert!(
        stdout.contains("[rank0]: ring token went round all 3 ranks: 0,1,2"),
        "{stdout}"
    );
    assert!(stdout.contains("[rank0]: demo OK"), "{stdout}");
}

#[test]
fn demo_ranks_meet_through_a_file_store() {
    let (ok, stdout, stderr) = demo(&[
        "--nproc-per-node",
        "2",
        "--store",
        "file",
        "--bytes",
        "1000",
        "--adds",
        "20",
    ]);
    assert!(ok, "stdout:\n{stdout}\nstderr:\n{stderr}");
    assert!(stdout.contains("counter 40 = 2 x 20"), "{stdout}");
    assert!(stdout.contains("[rank0]: demo OK"), "{stdout}");
}

#[test]
fn a_demo_rank_that_cannot_meet_the_others_fails_with_the_reason() {
    // One rank alone in a world of two: rank 0 waits for its peer in vain.
    let out = Command::new(env!("CARGO_BIN_EXE_tensorcomm"))
        .args(["demo", "--timeout-secs", "1"])
        .env("RANK", "0")
        .env("WORLD_SIZE", "2")
        .env("MASTER_ADDR", "127.0.0.1")
        .env("MASTER_PORT", "0")
        .output()
        .expect("start tensorcomm demo");
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("1/2 clients joined"), "{stderr}");
}

/// A payload that cannot fit in memory is refused before any rank starts;
/// before, it panicked or aborted in the allocator.
#[test]
fn a_payload_that_cannot_fit_is_refused_up_front() {
    for bytes in ["18446744073709551615", "107374182400000"] {
        let (ok, stdout, stderr) = demo(&["--nproc-per-node", "2", "--bytes", bytes]);
        assert!(
            !ok,
            "--bytes {bytes} must fail\nstdout:\n{stdout}\nstderr:\n{stderr}"
        );
        assert!(!stderr.contains("panicked"), "{stderr}");
        assert!(
            stderr.contains("does not fit in memory") && stderr.contains("available"),
            "--bytes {bytes}: {stderr}"
        );
    }
}

/// A rank that cannot reach the store is not silent: after 5 s, and every
/// 5 s after, it says what it is trying to reach and why it cannot.
#[test]
fn a_rank_that_cannot_reach_the_store_says_so_every_few_seconds() {
    use std::io::Read;
    let mut child = Command::new(env!("CARGO_BIN_EXE_tensorcomm"))
        .arg("demo")
        .env("MASTER_ADDR", "no-such-host.invalid")
        .env("MASTER_PORT", "29511")
        .env("RANK", "1")
        .env("WORLD_SIZE", "2")
        .env_remove("TENSORCOMM_LOG")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(std::time::Duration::from_millis(6500));
    child.kill().unwrap();
    child.wait().unwrap();
    let mut stderr = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut stderr)
        .unwrap();
    assert!(
        stderr.contains("still trying to reach the store")
            && stderr.contains("no-such-host.invalid:29511"),
        "{stderr}"
    );
}
