//! The rank program: what each process of a fault-injection job runs (the
//! test binary re-run by `tensorcomm run`). It builds the CPU group from
//! the torchrun variables, runs the scenario's collectives, and the victim
//! does its fault at its step. Every rank that gets an error prints one
//! `FAULT-RESULT` line and exits [`SURVIVOR_FAILED`] (the victim
//! [`VICTIM_FAILED`]); survivors ignore SIGTERM so that the launcher
//! stopping the job does not hide whether they would have noticed.

use std::io::Write;
use std::process::exit;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tensorcomm::cpu::transport::TransportChoice;
use tensorcomm::tensor::Tensor;
use tensorcomm::{init_process_group_with, Backend, Error, InitOptions, ProcessGroup, ReduceOp};

use super::scenario::{FaultKind, Op, Rng, Scenario, Step};

/// Exit status of a survivor that got the error it should.
pub const SURVIVOR_FAILED: i32 = 17;
/// Exit status of a victim whose own calls failed after its fault.
pub const VICTIM_FAILED: i32 = 18;
/// Exit status of a rank whose set-up broke in a way the suite does not
/// expect (bad environment).
pub const RANK_BROKEN: i32 = 19;

/// Environment of a rank: the seed, the fault kind, the group timeout.
pub const SEED_VAR: &str = "TENSORCOMM_FAULT_RANK_SEED";
pub const KIND_VAR: &str = "TENSORCOMM_FAULT_RANK_KIND";
pub const TIMEOUT_VAR: &str = "TENSORCOMM_FAULT_RANK_TIMEOUT_MS";
/// `1` when rank 0 may be the victim (see [`Scenario::new`]).
pub const VICTIM_0_VAR: &str = "TENSORCOMM_FAULT_RANK_VICTIM_0";
/// Milliseconds a rank that got its error waits before exiting. With 0, a
/// survivor rank 0 that fails first takes the store down with it, and the
/// others, which look there for the root cause, blame rank 0 instead, late
/// (see the `linger` note in `fault_injection.rs`).
pub const LINGER_VAR: &str = "TENSORCOMM_FAULT_RANK_LINGER_MS";

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
    say(&format!(
        "FAULT-RESULT rank={rank} phase={phase} call_ms={} error={} ranks={ranks:?} source={} peer={peer} text={text}",
        call.as_millis(),
        variant(err),
        variant(source),
    ));
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

/// Starts `step` on `pg`; the tensors live as long as the returned work.
fn start(
    pg: &dyn ProcessGroup,
    step: Step,
) -> tensorcomm::Result<(tensorcomm::Work, Vec<Tensor<'static>>)> {
    let world = pg.size();
    let t = |n: usize| Tensor::zeros(&[n], step.dtype);
    let many = |n: usize| {
        (0..world)
            .map(|_| t(n))
            .collect::<tensorcomm::Result<Vec<_>>>()
    };
    let len = step.tensor_numel(world);
    Ok(match step.op {
        Op::AllReduce => {
            let x = t(len)?;
            (pg.all_reduce(&x, ReduceOp::Sum, None)?, vec![x])
        }
        Op::Broadcast { root } => {
            let x = t(len)?;
            (pg.broadcast(&x, root, None)?, vec![x])
        }
        Op::AllGather => {
            let (outs, x) = (many(len)?, t(len)?);
            let w = pg.all_gather(&outs, &x, None)?;
            (w, outs.into_iter().chain([x]).collect())
        }
        Op::ReduceScatter => {
            let (out, ins) = (t(len)?, many(len)?);
            let w = pg.reduce_scatter(&out, &ins, ReduceOp::Sum, None)?;
            (w, ins.into_iter().chain([out]).collect())
        }
        Op::AllToAll => {
            let (outs, ins) = (many(len)?, many(len)?);
            let w = pg.all_to_all(&outs, &ins, None)?;
            (w, outs.into_iter().chain(ins).collect())
        }
        Op::Barrier => (pg.barrier(None)?, Vec::new()),
    })
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
    let sc = Scenario::new(
        seed,
        kind,
        std::env::var(VICTIM_0_VAR).as_deref() == Ok("1"),
    );
    say(&format!("FAULT-PID rank={rank} pid={}", std::process::id()));
    let victim = rank == sc.victim;
    // The victims that die or stop keep the default SIGTERM; every rank that
    // is to report an error ignores it.
    if !victim || matches!(kind, FaultKind::Mismatch | FaultKind::CloseSockets) {
        ignore_sigterm();
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
    let options = InitOptions {
        timeout: Duration::from_millis(timeout_ms),
        transport: sc.transport.parse::<TransportChoice>().unwrap_or_default(),
        ..InitOptions::default()
    };
    let began = Instant::now();
    let pg: Arc<dyn ProcessGroup> = match init_process_group_with(Backend::Cpu, "env://", &options)
    {
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
        dtype: tensorcomm::tensor::DType::U8,
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
        let outcome = start(&*pg, step).and_then(|(work, tensors)| {
            if let Some((signal, delay)) = signal_inside {
                std::thread::sleep(delay);
                raise(signal);
            }
            let done = work.wait();
            drop(tensors);
            done
        });
        if let Err(err) = outcome {
            report(rank, &phase, call.elapsed(), &err, failed);
        }
        if victim && i == sc.fault_step && kind == FaultKind::Stop {
            // Continued: the launcher is ending the job.
            exit(RANK_BROKEN);
        }
    }
    say(&format!("FAULT-RESULT rank={rank} phase=done ok"));
    exit(0)
}
