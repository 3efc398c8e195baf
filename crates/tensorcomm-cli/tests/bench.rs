//! `tensorcomm bench` end to end: it starts its own ranks, prints one
//! checked row per size over the transport asked for, and `--json` gives
//! stdout made of JSON rows only.

use std::process::Command;

fn bench(args: &[&str]) -> (bool, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_tensorcomm"))
        .arg("bench")
        .args(args)
        .env_remove("RANK")
        .output()
        .expect("start tensorcomm bench");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn all_reduce_rows_cover_every_size_and_are_correct() {
    let common = [
        "--backend",
        "cpu",
        "-n",
        "3",
        "-b",
        "8",
        "-e",
        "4K",
        "-f",
        "8",
        "--iters",
        "2",
        "--warmup",
        "1",
    ];
    let (ok, stdout, stderr) = bench(
        &[
            &common[..],
            &["--op", "all_reduce", "--dtype", "i32", "--transport", "tcp"],
        ]
        .concat(),
    );
    assert!(stdout.contains("tcp transport"), "{stdout}");
    assert!(ok, "stdout:\n{stdout}\nstderr:\n{stderr}");
    let rows: Vec<&str> = stdout
        .lines()
        .filter(|l| l.contains(" all_reduce ") && !l.contains('#'))
        .collect();
    let sizes: Vec<&str> = rows
        .iter()
        .map(|l| l.split_whitespace().next().unwrap())
        .collect();
    assert_eq!(sizes, ["8", "64", "512", "4096"], "{stdout}");
    assert!(
        rows.iter().all(|l| l.trim_end().ends_with("OK")),
        "{stdout}"
    );

    let (ok, stdout, stderr) = bench(
        &[
            &common[..],
            &[
                "--op",
                "broadcast",
                "--dtype",
                "bf16",
                "--json",
                "--transport",
                "shm",
            ],
        ]
        .concat(),
    );
    assert!(ok, "stdout:\n{stdout}\nstderr:\n{stderr}");
    // Every line of stdout is a row: no header, no launcher prefix.
    let rows: Vec<serde_json::Value> = stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l:?}")))
        .collect();
    assert_eq!(rows.len(), 4, "{stdout}");
    for row in rows {
        assert_eq!(row["op"], "broadcast");
        assert_eq!(row["dtype"], "bf16");
        assert_eq!(row["correct"], true);
        assert!(row["time_us"].as_f64().unwrap() > 0.0);
    }
}

#[test]
fn bad_size_arguments_are_refused() {
    let (ok, _, stderr) = bench(&["-b", "1M", "-e", "8"]);
    assert!(!ok);
    assert!(stderr.contains("-b <= -e"), "{stderr}");
    let (ok, _, stderr) = bench(&["-b", "12Q"]);
    assert!(!ok);
    assert!(stderr.contains("64K"), "{stderr}");
}

#[test]
fn the_cuda_comm_backend_runs_on_two_gpus_and_says_no_cuda_elsewhere() {
    let args = [
        "--backend",
        "cuda-comm",
        "--op",
        "broadcast,gather",
        "--sizes",
        "1K",
        "--iters",
        "2",
        "--warmup",
        "1",
    ];
    let (ok, stdout, stderr) = bench(&args);
    match tensorcomm::cuda::runtime::device_count() {
        Ok(n) if n >= 2 => {
            assert!(ok, "stdout:\n{stdout}\nstderr:\n{stderr}");
            let rows: Vec<&str> = stdout.lines().filter(|l| !l.starts_with('#')).collect();
            assert!(rows[0].contains("busbw"), "{stdout}");
            assert_eq!(rows.len(), 3, "{stdout}");
            assert!(
                rows[1].contains(" broadcast ") && rows[1].contains(" OK "),
                "{stdout}"
            );
            assert!(
                rows[2].contains(" gather ") && rows[2].contains(" OK "),
                "{stdout}"
            );
        }
        found => {
            println!("no 2 GPUs here ({found:?}): checking the NoCuda failure");
            assert!(!ok, "stdout:\n{stdout}\nstderr:\n{stderr}");
            assert!(stderr.contains("CUDA is not available"), "{stderr}");
            assert!(!stderr.contains("panicked"), "{stderr}");
            assert!(!stdout.contains(" OK "), "{stdout}");
        }
    }
    let (ok, _, stderr) = bench(&["--backend", "cuda-comm", "--op", "all_reduce"]);
    assert!(!ok);
    assert!(stderr.contains("not a cuda-comm op"), "{stderr}");
    let (ok, _, stderr) = bench(&["--op", "reduce_add"]);
    assert!(!ok);
    assert!(stderr.contains("--backend cuda-comm"), "{stderr}");
}

#[test]
fn the_auto_backend_runs_the_cpu_rows_then_uses_gpus_when_present() {
    let (ok, stdout, stderr) = bench(&[
        "--backend",
        "auto",
        "-n",
        "2",
        "-b",
        "8",
        "-e",
        "64",
        "-f",
        "8",
        "--iters",
        "2",
        "--warmup",
        "1",
    ]);
    assert!(ok, "stdout:\n{stdout}\nstderr:\n{stderr}");
    let cpu_rows = stdout
        .lines()
        .filter(|l| l.contains("all_reduce") && l.ends_with("OK"))
        .count();
    assert_eq!(cpu_rows, 2, "{stdout}");
    // Either the GPU half ran (its own title line) or it said why not.
    let gpu_ran = stdout.contains("# tensorcomm bench: cuda-comm");
    let gpu_skipped = stdout.contains("# cuda-comm: skipped");
    assert!(gpu_ran != gpu_skipped, "{stdout}");
}

#[test]
fn ring_barrier_and_sparse_ops_print_checked_rows() {
    let quick = ["--iters", "2", "--warmup", "1"];
    for op in ["send_recv", "send_recv_any"] {
        let (ok, stdout, stderr) = bench(
            &[
                &quick[..],
                &["--op", op, "-n", "2", "-b", "8", "-e", "4K", "-f", "8"],
            ]
            .concat(),
        );
        assert!(ok, "stdout:\n{stdout}\nstderr:\n{stderr}");
        let rows: Vec<&str> = stdout
            .lines()
            .filter(|l| l.contains(&format!(" {op} ")) && !l.starts_with('#'))
            .collect();
        assert_eq!(rows.len(), 4, "{stdout}");
        assert!(rows.iter().all(|l| l.ends_with("OK")), "{stdout}");
    }

    // The barriers: one row of size 0 and count 0, whatever the sizes.
    for op in ["barrier", "monitored_barrier"] {
        let (ok, stdout, stderr) = bench(
            &[
                &quick[..],
                &["--op", op, "-n", "2", "--sizes", "1K,1M", "--json"],
            ]
            .concat(),
        );
        assert!(ok, "stdout:\n{stdout}\nstderr:\n{stderr}");
        let rows: Vec<serde_json::Value> = stdout
            .lines()
            .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l:?}")))
            .collect();
        assert_eq!(rows.len(), 1, "{stdout}");
        assert_eq!(
            (&rows[0]["op"], &rows[0]["size"], &rows[0]["count"]),
            (
                &serde_json::json!(op),
                &serde_json::json!(0),
                &serde_json::json!(0)
            )
        );
        assert_eq!(rows[0]["correct"], true, "{stdout}");
    }

    let (ok, stdout, stderr) = bench(
        &[
            &quick[..],
            &[
                "--op",
                "all_reduce_sparse",
                "-n",
                "3",
                "-b",
                "8",
                "-e",
                "8K",
                "-f",
                "32",
                "--dtype",
                "i8",
            ],
        ]
        .concat(),
    );
    assert!(ok, "stdout:\n{stdout}\nstderr:\n{stderr}");
    let rows: Vec<&str> = stdout
        .lines()
        .filter(|l| l.contains(" all_reduce_sparse ") && !l.starts_with('#'))
        .collect();
    assert_eq!(rows.len(), 3, "{stdout}");
    assert!(rows.iter().all(|l| l.ends_with("OK")), "{stdout}");
}

#[test]
fn a_one_rank_ring_and_symmetric_sparse_tensors_are_refused() {
    let (ok, stdout, stderr) = bench(&["--op", "send_recv", "-n", "1", "--iters", "1"]);
    assert!(!ok, "stdout:\n{stdout}\nstderr:\n{stderr}");
    assert!(
        stderr.contains("send_recv needs at least 2 ranks"),
        "{stderr}"
    );
    assert!(!stdout.contains(" OK"), "{stdout}");
    let (ok, _, stderr) = bench(&["--op", "all_reduce_sparse", "-n", "2", "--symmetric"]);
    assert!(!ok);
    assert!(
        stderr.contains("--symmetric: all_reduce_sparse cannot use symmetric memory"),
        "{stderr}"
    );
}

#[test]
fn cuda_tensors_through_the_cpu_backend_run_on_a_gpu_and_say_no_cuda_elsewhere() {
    let args = [
        "--device",
        "cuda",
        "-n",
        "2",
        "--op",
        "all_reduce",
        "--sizes",
        "8,1M",
        "--iters",
        "2",
        "--warmup",
        "1",
    ];
    let (ok, stdout, stderr) = bench(&args);
    match tensorcomm::cuda::runtime::device_count() {
        Ok(n) if n >= 1 => {
            assert!(ok, "stdout:\n{stdout}\nstderr:\n{stderr}");
            assert!(stdout.contains("tensors on cuda:0"), "{stdout}");
            let rows: Vec<&str> = stdout
                .lines()
                .filter(|l| l.contains(" all_reduce "))
                .collect();
            assert_eq!(rows.len(), 2, "{stdout}");
            assert!(
                rows.iter().all(|r| r.trim_end().ends_with("OK")),
                "{stdout}"
            );
        }
        found => {
            println!("no GPU here ({found:?}): checking the NoCuda failure");
            assert!(!ok, "stdout:\n{stdout}\nstderr:\n{stderr}");
            assert!(stderr.contains("CUDA is not available"), "{stderr}");
            assert!(!stderr.contains("panicked"), "{stderr}");
        }
    }
    let (ok, _, stderr) = bench(&["--device", "cuda", "--backend", "nccl"]);
    assert!(!ok);
    assert!(
        stderr.contains("--device cuda goes with --backend cpu"),
        "{stderr}"
    );
}

/// Sizes that cannot fit in memory are refused before any rank starts,
/// with the size, what it needs and what the machine has; before, they
/// panicked (`capacity overflow`), aborted in the allocator or grew until
/// memory ran out.
#[test]
fn sizes_that_cannot_fit_are_refused_up_front() {
    let cases: [&[&str]; 3] = [
        &["--sizes", "18446744073709551615"],
        &["--sizes", "8,100000G"],
        &["-n", "4", "-b", "8", "-e", "100000G"],
    ];
    for args in cases {
        let start = std::time::Instant::now();
        let (ok, stdout, stderr) = bench(args);
        assert!(
            !ok,
            "{args:?} must fail\nstdout:\n{stdout}\nstderr:\n{stderr}"
        );
        assert!(!stderr.contains("panicked"), "{args:?}: {stderr}");
        assert!(
            stderr.contains("does not fit in memory") && stderr.contains("available"),
            "{args:?}: {stderr}"
        );
        assert!(stdout.is_empty(), "no rank ran: {stdout}");
        assert!(start.elapsed() < std::time::Duration::from_secs(5));
    }
}

/// `tensorcomm bench | head`: a reader that goes away ends the job quietly.
/// Before, rank 0 panicked (`failed printing to stdout: Broken pipe`), the
/// other ranks dumped their flight recorders and the job failed.
#[test]
fn a_closed_stdout_ends_the_job_quietly() {
    use std::io::Read;
    use std::process::Stdio;
    for read_first in [false, true] {
        let start = std::time::Instant::now();
        let mut child = Command::new(env!("CARGO_BIN_EXE_tensorcomm"))
            .args(["bench", "-n", "3", "-b", "8", "-e", "64K", "--iters", "1"])
            .args(["--warmup", "0", "--transport", "tcp"])
            .env_remove("RANK")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start tensorcomm bench");
        let mut stdout = child.stdout.take().unwrap();
        if read_first {
            // Read the header's first bytes, then go away like `head -c`.
            let mut first = [0u8; 16];
            stdout.read_exact(&mut first).unwrap();
            assert!(first.starts_with(b"# tensorcomm"));
        }
        drop(stdout);
        let out = child.wait_with_output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{:?}\n{stderr}", out.status);
        assert!(!stderr.contains("panicked"), "{stderr}");
        assert!(!stderr.contains("flight recorder"), "{stderr}");
        assert!(!stderr.contains("failed"), "{stderr}");
        assert!(start.elapsed() < std::time::Duration::from_secs(5));
    }
}

/// The help texts name every command and what the CPU backend really
/// uses, a bad --op lists the valid ones, and one rank is "1 rank".
#[test]
fn help_op_errors_and_titles_say_what_is_true() {
    let top = Command::new(env!("CARGO_BIN_EXE_tensorcomm"))
        .arg("--help")
        .output()
        .unwrap();
    let top = String::from_utf8_lossy(&top.stdout);
    assert!(top.lines().next().unwrap().contains("bench"), "{top}");
    let (ok, help, _) = bench(&["--help"]);
    assert!(ok);
    assert!(!help.contains("TCP between ranks"), "{help}");
    assert!(help.contains("shared memory"), "{help}");
    let (ok, _, stderr) = bench(&["--op", "all_reduc"]);
    assert!(!ok);
    assert!(
        stderr.contains("expected one of") && stderr.contains("all_reduce, broadcast"),
        "{stderr}"
    );
    assert!(stderr.contains("monitored_barrier"), "{stderr}");
    let (ok, stdout, stderr) = bench(&["-n", "1", "--sizes", "8", "--iters", "1", "--warmup", "0"]);
    assert!(ok, "{stdout}\n{stderr}");
    assert!(stdout.contains(" on 1 rank ("), "{stdout}");
}

#[test]
fn the_header_names_the_summed_reduce_op_and_a_summary_line_closes_the_table() {
    // f16 on 3 ranks: repeated in-place SUMs of the check's inputs (up to
    // 4) would pass f16's 65504 within ten calls; the timed calls start
    // from zeros, so they stay finite and the rows stay correct.
    let (ok, stdout, stderr) = bench(&[
        "--backend",
        "cpu",
        "-n",
        "3",
        "-b",
        "64",
        "-e",
        "1K",
        "-f",
        "4",
        "--iters",
        "20",
        "--warmup",
        "2",
        "--op",
        "all_reduce",
        "--dtype",
        "f16",
        "--transport",
        "shm",
    ]);
    assert!(ok, "stdout:\n{stdout}\nstderr:\n{stderr}");
    let header = stdout.lines().next().unwrap_or_default();
    assert!(header.contains("reduce op SUM"), "{stdout}");
    assert!(header.contains("mean of 20 calls"), "{stdout}");
    let last = stdout.lines().last().unwrap_or_default();
    assert!(
        last.starts_with("# Avg bus bandwidth    : "),
        "the last line is {last:?}:\n{stdout}"
    );
    let avg: f64 = last.rsplit(':').next().unwrap().trim().parse().unwrap();
    assert!(avg > 0.0, "{stdout}");

    // Ops that reduce nothing say so.
    let (ok, stdout, stderr) = bench(&[
        "--backend",
        "cpu",
        "-n",
        "2",
        "--sizes",
        "1K",
        "--iters",
        "2",
        "--warmup",
        "1",
        "--op",
        "broadcast",
    ]);
    assert!(ok, "stdout:\n{stdout}\nstderr:\n{stderr}");
    assert!(
        stdout.lines().next().unwrap().contains("no reduce op"),
        "{stdout}"
    );
}

#[test]
fn ddp_reports_step_communication_and_exposed_times() {
    let common = [
        "--op",
        "ddp",
        "-n",
        "2",
        "--model",
        "4K,256,16K",
        "--bucket-cap",
        "16K",
        "--compute-us",
        "50",
        "--iters",
        "3",
        "--warmup",
        "2",
    ];
    let (ok, stdout, stderr) = bench(&[&common[..], &["--json"]].concat());
    assert!(ok, "stdout:\n{stdout}\nstderr:\n{stderr}");
    let rows: Vec<serde_json::Value> = stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l:?}")))
        .collect();
    assert_eq!(rows.len(), 1, "{stdout}");
    let row = &rows[0];
    assert_eq!(row["op"], "ddp");
    assert_eq!(row["params"], 4096 + 256 + 16384);
    assert_eq!(
        (row["tensors"].as_u64(), row["layers"].as_u64()),
        (Some(3), Some(3))
    );
    assert_eq!(row["ranks"], 2);
    assert_eq!(row["hook"], "allreduce");
    assert_eq!(row["compute_us"], 150);
    assert!(row["buckets"].as_u64().unwrap() >= 2, "{row}");
    let (step, comm, exposed, tail) = (
        row["step_us"].as_f64().unwrap(),
        row["comm_us"].as_f64().unwrap(),
        row["exposed_us"].as_f64().unwrap(),
        row["tail_us"].as_f64().unwrap(),
    );
    // A step holds its compute and its tail; the exposed communication is
    // part of both the communication time and the tail.
    assert!(step >= 150.0 && comm > 0.0 && tail > 0.0, "{row}");
    assert!(exposed <= comm && exposed <= tail && tail <= step, "{row}");

    let (ok, stdout, stderr) = bench(&[&common[..], &["--hook", "powersgd"]].concat());
    assert!(ok, "stdout:\n{stdout}\nstderr:\n{stderr}");
    assert!(stdout.contains("powersgd hook"), "{stdout}");
    let last = stdout.lines().last().unwrap();
    assert_eq!(last.split_whitespace().count(), 6, "{stdout}");
    assert_eq!(last.split_whitespace().next(), Some("20736"), "{stdout}");

    let (ok, _, stderr) = bench(&["--op", "ddp", "--hook", "gzip"]);
    assert!(!ok && stderr.contains("--hook"), "{stderr}");
}

/// `--op ddp --device cuda`: CUDA gradients through the CPU group on a
/// machine with a GPU (ranks sharing it), a clear error without one; NCCL
/// wants CUDA tensors and one GPU per rank.
#[test]
fn ddp_on_cuda_gradients_runs_on_a_gpu_and_says_no_cuda_elsewhere() {
    let args = [
        "--op",
        "ddp",
        "-n",
        "2",
        "--model",
        "4K,256",
        "--bucket-cap",
        "16K",
        "--iters",
        "2",
        "--warmup",
        "1",
        "--device",
        "cuda",
        "--json",
    ];
    let (ok, stdout, stderr) = bench(&args);
    match tensorcomm::cuda::runtime::device_count() {
        Ok(n) if n >= 1 => {
            assert!(ok, "stdout:\n{stdout}\nstderr:\n{stderr}");
            let row: serde_json::Value = serde_json::from_str(stdout.trim()).unwrap();
            assert_eq!(
                (&row["op"], &row["device"]),
                (&"ddp".into(), &"cuda".into())
            );
            assert_eq!(row["params"], 4096 + 256);
            assert!(row["step_us"].as_f64().unwrap() > 0.0, "{row}");
        }
        found => {
            println!("no GPU here ({found:?}): checking the NoCuda failure");
            assert!(!ok, "stdout:\n{stdout}\nstderr:\n{stderr}");
            assert!(
                stderr.contains("--device cuda: CUDA is not available"),
                "{stderr}"
            );
            assert!(!stderr.contains("panicked"), "{stderr}");
        }
    }
    let (ok, _, stderr) = bench(&["--op", "ddp", "--backend", "nccl"]);
    assert!(!ok && stderr.contains("expected --device cuda"), "{stderr}");
    let (ok, _, stderr) = bench(&[
        "--op",
        "ddp",
        "--backend",
        "nccl",
        "--device",
        "cuda",
        "-n",
        "64",
    ]);
    assert!(!ok, "{stderr}");
    assert!(
        stderr.contains("one GPU per rank") || stderr.contains("CUDA is not available"),
        "{stderr}"
    );
}

#[test]
fn more_ranks_than_a_launcher_starts_are_refused_up_front() {
    let (ok, stdout, stderr) = bench(&["-n", "100000", "--sizes", "8", "--iters", "1"]);
    assert!(!ok, "{stdout}");
    assert!(
        stderr.contains("1 to 4096 processes") && stderr.contains("100000"),
        "{stderr}"
    );
}

#[test]
fn median_timing_is_named_in_the_header_and_passed_to_every_rank() {
    let (ok, stdout, stderr) = bench(&[
        "-n", "2", "--sizes", "8,4K", "--iters", "5", "--warmup", "1", "--median",
    ]);
    assert!(ok, "stdout:\n{stdout}\nstderr:\n{stderr}");
    let header = stdout.lines().next().unwrap_or_default();
    assert!(header.contains("median of 5 calls"), "{stdout}");
    // Rank 0 prints the header from its own arguments: it says median
    // only if the launcher passed --median on. Both sizes timed and checked.
    let rows: Vec<&str> = stdout
        .lines()
        .filter(|l| l.trim_end().ends_with("OK"))
        .collect();
    assert_eq!(rows.len(), 2, "{stdout}");
    for row in rows {
        let time: f64 = row.split_whitespace().nth(4).unwrap().parse().unwrap();
        assert!(time > 0.0, "{row}");
    }
}
