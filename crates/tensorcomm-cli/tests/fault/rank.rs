//! The rank program: what each process of a fault-injection job runs (the
//! test binary re-run by `tensorcomm run`). It builds the group of the
//! scenario's backend from the torchrun variables (CPU: host tensors;
//! NCCL: CUDA tensors on the GPU of its local rank, built on the host and
//! copied there), runs the scenario's collectives, and the victim does its
//! fault at its step. A survivor checks every output once its collective
//! is done (NCCL: after `synchronize`); one that holds a wrong value with
//! no error reported is a failure of its own (`error=WrongResult`, exit
//! [`RANK_BROKEN`]). Every rank that gets an error prints one
//! `FAULT-RESULT` line and exits [`SURVIVOR_FAILED`] (the victim
//! [`VICTIM_FAILED`]); survivors ignore SIGTERM so that the launcher
//! stopping the job does not hide whether they would have noticed.

use std::io::Write;
use std::process::exit;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tensorcomm::cpu::transport::TransportChoice;
use tensorcomm::tensor::{DType, Device, Tensor};
use tensorcomm::{init_process_group_with, Backend, Error, InitOptions, ProcessGroup, ReduceOp};

use super::scenario::{FaultBackend, FaultKind, Op, Rng, Scenario, Step};

/// Exit status of a survivor that got the error it should.
pub const SURVIVOR_FAILED: i32 = 17;
/// Exit status of a victim whose own calls failed after its fault.
pub const VICTIM_FAILED: i32 = 18;
/// Exit status of a rank whose set-up broke in a way the suite does not
/// expect (bad environment), or that found a wrong output with no error.
pub const RANK_BROKEN: i32 = 19;

/// Environment of a rank: the seed, the fault kind, the group timeout.
pub const SEED_VAR: &str = "TENSORCOMM_FAULT_RANK_SEED";
pub const KIND_VAR: &str = "TENSORCOMM_FAULT_RANK_KIND";
pub const TIMEOUT_VAR: &str = "TENSORCOMM_FAULT_RANK_TIMEOUT_MS";
/// `1` when rank 0 may be the victim (see [`Scenario::on`]).
pub const VICTIM_0_VAR: &str = "TENSORCOMM_FAULT_RANK_VICTIM_0";
/// `cpu` or `nccl` (see [`FaultBackend`]).
pub const BACKEND_VAR: &str = "TENSORCOMM_FAULT_RANK_BACKEND";
/// Milliseconds a rank that got its error waits before exiting. With 0, a
/// survivor rank 0 that fails first takes the store down with it, and the
/// others, which look there for the root cause, blame rank 0 instead, late
/// (see the `linger` note in `fault_injection.rs`).
pub const LINGER_VAR: &str = "TENSORCOMM_FAULT_RANK_LINGER_MS";
/// A `tracing` filter (`tensorcomm=debug`): each rank logs what it
/// matches on its stderr (inherited from the harness's environment).
pub const LOG_VAR: &str = "TENSORCOMM_FAULT_LOG";

fn env_or_exit(name: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| {
        eprintln!("fault rank: {name} is not set");
        exit(RANK_BROKEN)
    })
}

fn say(line: &str) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{line}");
    let _ = out.flush();
}

/// The variant name of an error (`PeerClosed` of `PeerClosed { .. }`).
fn variant(err: &Error) -> String {
    format!("{err:?}")
        .split(|c: char| !c.is_alphanumeric())
        .next()
        .unwrap_or_default()
        .to_string()
}

/// The peer an error blames, where it names one.
fn peer_of(err: &Error) -> Option<usize> {
    match err {
        Error::PeerClosed { peer, .. }
        | Error::LinkShutDownHere { peer, .. }
        | Error::PeerTimeout { peer, .. }
        | Error::PeerIo { peer, .. }
        | Error::PeerProtocol { peer, .. }
        | Error::CollectiveMismatch { peer, .. } => Some(*peer),
        _ => None,
    }
}

/// Prints the `FAULT-RESULT` line for `err` and exits with `code`.
fn report(rank: usize, phase: &str, call: Duration, err: &Error, code: i32) -> ! {
    let (ranks, source) = match err {
        Error::CollectiveFailed { ranks, source, .. } => (ranks.clone(), &**source),
        other => (Vec::new(), other),
    };
    let peer = peer_of(source).map_or("-".to_string(), |p| p.to_string());
    let text = err.to_string().replace('\n', " | ");
    finish(
        &format!(
            "FAULT-RESULT rank={rank} phase={phase} call_ms={} error={} ranks={ranks:?} source={} peer={peer} text={text}",
            call.as_millis(),
            variant(err),
            variant(source),
        ),
        code,
    )
}

/// Prints `line`, lingers and exits with `code`.
fn finish(line: &str, code: i32) -> ! {
    say(line);
    // Rank 0 hosts the store through which the others learn the root
    // cause; see LINGER_VAR.
    let linger: u64 = std::env::var(LINGER_VAR)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    std::thread::sleep(Duration::from_millis(linger));
    exit(code)
}

fn ignore_sigterm() {
    // SAFETY: SIG_IGN is a valid disposition and no handler runs.
    unsafe {
        libc::signal(libc::SIGTERM, libc::SIG_IGN);
    }
}

fn raise(signal: libc::c_int) {
    // SAFETY: raising a signal at this process; the handlers are defaults.
    unsafe {
        libc::raise(signal);
    }
}

/// Shuts down (both directions) every socket this process has open; the
/// descriptors stay valid, so nothing else reuses their numbers.
fn shut_down_sockets() {
    let Ok(dir) = std::fs::read_dir("/proc/self/fd") else {
        return;
    };
    let fds: Vec<i32> = dir
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .collect();
    for fd in fds {
        // SAFETY: shutdown on a descriptor that is not a socket fails with
        // ENOTSOCK and changes nothing.
        unsafe {
            libc::shutdown(fd, libc::SHUT_RDWR);
        }
    }
}

/// What rank `src` sends towards rank `dst` at element `i`: 0 to 2, so
/// that a sum over 8 ranks (at most 16) is exact in every dtype of the
/// scenarios, u8 included.
fn value(src: usize, dst: usize, i: usize) -> f64 {
    ((src + 2 * dst + i) % 3) as f64
}

/// What an output holds before its call: no result is 99.
const UNSET: f64 = 99.0;

fn values(n: usize, f: impl Fn(usize) -> f64) -> Vec<f64> {
    (0..n).map(f).collect()
}

/// A tensor of `dtype` holding `values`, on `device`: built on the host,
/// then copied there.
fn tensor(dtype: DType, values: &[f64], device: Device) -> tensorcomm::Result<Tensor<'static>> {
    let shape = [values.len()];
    let host = match dtype {
        DType::F32 => Tensor::from_vec(values.iter().map(|&v| v as f32).collect(), &shape),
        DType::F64 => Tensor::from_vec(values.to_vec(), &shape),
        DType::I32 => Tensor::from_vec(values.iter().map(|&v| v as i32).collect(), &shape),
        DType::U8 => Tensor::from_vec(values.iter().map(|&v| v as u8).collect(), &shape),
        other => Err(Error::InvalidArgument(format!("no fault data for {other}"))),
    }?;
    match device {
        Device::Cpu => Ok(host),
        device => host.to_device(device),
    }
}

/// The elements of `t` (on any device) as f64.
fn read(t: &Tensor<'_>) -> tensorcomm::Result<Vec<f64>> {
    Ok(match t.dtype() {
        DType::F32 => t.to_vec::<f32>()?.into_iter().map(f64::from).collect(),
        DType::F64 => t.to_vec::<f64>()?,
        DType::I32 => t.to_vec::<i32>()?.into_iter().map(f64::from).collect(),
        DType::U8 => t.to_vec::<u8>()?.into_iter().map(f64::from).collect(),
        other => return Err(Error::InvalidArgument(format!("no fault data for {other}"))),
    })
}

/// A started step: its work, the tensors it uses (kept until it is done)
/// and what each output must hold then (index into `tensors`, values).
struct Started {
    work: tensorcomm::Work,
    tensors: Vec<Tensor<'static>>,
    expect: Vec<(usize, Vec<f64>)>,
}

/// Starts `step` on `pg` with this rank's inputs on `device`.
fn start(pg: &dyn ProcessGroup, step: Step, device: Device) -> tensorcomm::Result<Started> {
    let (rank, world) = (pg.rank(), pg.size());
    let len = step.tensor_numel(world);
    let t = |v: Vec<f64>| tensor(step.dtype, &v, device);
    let unset = || t(vec![UNSET; len]);
    let many = |f: &dyn Fn(usize, usize) -> f64| {
        (0..world)
            .map(|j| t(values(len, |i| f(j, i))))
            .collect::<tensorcomm::Result<Vec<_>>>()
    };
    Ok(match step.op {
        Op::AllReduce => {
            let x = t(values(len, |i| value(rank, 0, i)))?;
            let sum = values(len, |i| (0..world).map(|r| value(r, 0, i)).sum());
            let work = pg.all_reduce(&x, ReduceOp::Sum, None)?;
            Started {
                work,
                tensors: vec![x],
                expect: vec![(0, sum)],
            }
        }
        Op::Broadcast { root } => {
            let x = t(values(len, |i| value(rank, 0, i)))?;
            let work = pg.broadcast(&x, root, None)?;
            Started {
                work,
                tensors: vec![x],
                expect: vec![(0, values(len, |i| value(root, 0, i)))],
            }
        }
        Op::AllGather => {
            let outs = (0..world)
                .map(|_| unset())
                .collect::<tensorcomm::Result<Vec<_>>>()?;
            let x = t(values(len, |i| value(rank, 0, i)))?;
            let work = pg.all_gather(&outs, &x, None)?;
            let expect = (0..world)
                .map(|j| (j, values(len, |i| value(j, 0, i))))
                .collect();
            Started {
                work,
                tensors: outs.into_iter().chain([x]).collect(),
                expect,
            }
        }
        Op::ReduceScatter => {
            let (out, ins) = (unset()?, many(&|j, i| value(rank, j, i))?);
            let work = pg.reduce_scatter(&out, &ins, ReduceOp::Sum, None)?;
            let sum = values(len, |i| (0..world).map(|r| value(r, rank, i)).sum());
            Started {
                work,
                tensors: [out].into_iter().chain(ins).collect(),
                expect: vec![(0, sum)],
            }
        }
        Op::AllToAll => {
            let outs = (0..world)
                .map(|_| unset())
                .collect::<tensorcomm::Result<Vec<_>>>()?;
            let ins = many(&|j, i| value(rank, j, i))?;
            let work = pg.all_to_all(&outs, &ins, None)?;
            let expect = (0..world)
                .map(|j| (j, values(len, |i| value(j, rank, i))))
                .collect();
            Started {
                work,
                tensors: outs.into_iter().chain(ins).collect(),
                expect,
            }
        }
        Op::Barrier => Started {
            work: pg.barrier(None)?,
            tensors: Vec::new(),
            expect: Vec::new(),
        },
    })
}

/// The first output (of `tensors`, as `expect` says) that does not hold
/// what it must, said.
fn wrong_output(
    tensors: &[Tensor<'static>],
    expect: &[(usize, Vec<f64>)],
) -> tensorcomm::Result<Option<String>> {
    for (index, want) in expect {
        let got = read(&tensors[*index])?;
        if let Some(i) = (0..want.len()).find(|&i| got.get(i) != Some(&want[i])) {
            return Ok(Some(format!(
                "output {index} element {i} of {}: expected {}, found {:?} (no error was reported)",
                want.len(),
                want[i],
                got.get(i)
            )));
        }
    }
    Ok(None)
}

/// Runs this rank of the scenario named by the environment; never returns.
pub fn main() -> ! {
    let seed = env_or_exit(SEED_VAR);
    let seed = u64::from_str_radix(seed.trim_start_matches("0x"), 16).unwrap_or_else(|_| {
        eprintln!("fault rank: bad seed {seed:?}");
        exit(RANK_BROKEN)
    });
    let kind: FaultKind = env_or_exit(KIND_VAR).parse().unwrap_or_else(|e| {
        eprintln!("fault rank: {e}");
        exit(RANK_BROKEN)
    });
    let timeout_ms: u64 = env_or_exit(TIMEOUT_VAR).parse().unwrap_or(3000);
    let rank: usize = env_or_exit("RANK").parse().unwrap_or(usize::MAX);
    let backend: FaultBackend = env_or_exit(BACKEND_VAR).parse().unwrap_or_else(|e| {
        eprintln!("fault rank: {e}");
        exit(RANK_BROKEN)
    });
    let victim_0 = std::env::var(VICTIM_0_VAR).as_deref() == Ok("1");
    let local_rank: usize = env_or_exit("LOCAL_RANK").parse().unwrap_or(usize::MAX);
    let (world, device) = match backend {
        FaultBackend::Cpu => (None, Device::Cpu),
        FaultBackend::Nccl => (
            env_or_exit("WORLD_SIZE").parse().ok(),
            Device::Cuda(local_rank),
        ),
    };
    let sc = Scenario::on(seed, kind, victim_0, backend, world);
    let victim = rank == sc.victim;
    // The victims that die or stop keep the default SIGTERM; every rank that
    // is to report an error ignores it, from before it says it started (a
    // rank the launcher stopped before that never ran; see `job.rs`).
    if !victim || matches!(kind, FaultKind::Mismatch | FaultKind::CloseSockets) {
        ignore_sigterm();
    }
    say(&format!("FAULT-PID rank={rank} pid={}", std::process::id()));
    if let Ok(filter) = std::env::var(LOG_VAR) {
        let _ = tracing_subscriber::fmt()
            .with_env_filter(filter)
            .with_writer(std::io::stderr)
            .try_init();
    }
    if kind == FaultKind::StoreKill {
        if victim {
            let delay = Duration::from_micros(sc.delay_us.unwrap_or(0));
            std::thread::spawn(move || {
                std::thread::sleep(delay);
                raise(libc::SIGKILL);
            });
        } else {
            let mut rng = Rng::new(seed ^ (rank as u64 + 1));
            std::thread::sleep(Duration::from_micros(rng.next() % 300_000));
        }
    }
    let (backend, options) = match backend {
        FaultBackend::Cpu => (
            Backend::Cpu,
            InitOptions {
                timeout: Duration::from_millis(timeout_ms),
                transport: sc.transport.parse::<TransportChoice>().unwrap_or_default(),
                ..InitOptions::default()
            },
        ),
        FaultBackend::Nccl => (
            Backend::Nccl,
            InitOptions {
                timeout: Duration::from_millis(timeout_ms),
                device: Some(local_rank),
                ..InitOptions::default()
            },
        ),
    };
    let began = Instant::now();
    let pg: Arc<dyn ProcessGroup> = match init_process_group_with(backend, "env://", &options) {
        Ok(pg) => pg,
        Err(err) => report(rank, "init", began.elapsed(), &err, SURVIVOR_FAILED),
    };
    let failed = if victim {
        VICTIM_FAILED
    } else {
        SURVIVOR_FAILED
    };
    let barrier = Step {
        op: Op::Barrier,
        dtype: DType::U8,
        numel: 1,
    };
    for (i, &step) in sc.steps.iter().chain([&barrier]).enumerate() {
        let mut step = step;
        let mut signal_inside = None;
        if victim && kind == FaultKind::StoreKill && i == sc.steps.len() {
            // The timer has not fired yet: die before the last barrier, so
            // the others are still meeting through the store (a kill after
            // the job would test nothing).
            raise(libc::SIGKILL);
        }
        if victim && i == sc.fault_step {
            match kind {
                FaultKind::Kill | FaultKind::Stop => {
                    let signal = if kind == FaultKind::Kill {
                        libc::SIGKILL
                    } else {
                        libc::SIGSTOP
                    };
                    match sc.delay_us {
                        None => raise(signal),
                        Some(us) => signal_inside = Some((signal, Duration::from_micros(us))),
                    }
                }
                FaultKind::ExitEarly => exit(0),
                FaultKind::CloseSockets => shut_down_sockets(),
                FaultKind::Mismatch => step = sc.wrong,
                FaultKind::StoreKill => {}
            }
        }
        let phase = format!("step{i}");
        let call = Instant::now();
        let outcome = start(&*pg, step, device).and_then(|started| {
            if let Some((signal, delay)) = signal_inside {
                std::thread::sleep(delay);
                raise(signal);
            }
            let Started {
                work,
                tensors,
                expect,
            } = started;
            match device {
                Device::Cpu => work.wait(),
                Device::Cuda(_) => work.synchronize(),
            }?;
            // The victim's outputs count for nothing once it has failed.
            if victim {
                Ok(None)
            } else {
                wrong_output(&tensors, &expect)
            }
        });
        match outcome {
            Err(err) => report(rank, &phase, call.elapsed(), &err, failed),
            Ok(Some(wrong)) => finish(
                &format!(
                    "FAULT-RESULT rank={rank} phase={phase} call_ms={} error=WrongResult ranks=[] source=WrongResult peer=- text={wrong}",
                    call.elapsed().as_millis()
                ),
                RANK_BROKEN,
            ),
            Ok(None) => say(&format!(
                "FAULT-STEP rank={rank} phase={phase} at_unix_ms={}",
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(0, |d| d.as_millis())
            )),
        }
        if victim && i == sc.fault_step && kind == FaultKind::Stop {
            // Continued: the launcher is ending the job.
            exit(RANK_BROKEN);
        }
    }
    say(&format!("FAULT-RESULT rank={rank} phase=done ok"));
    exit(0)
}
