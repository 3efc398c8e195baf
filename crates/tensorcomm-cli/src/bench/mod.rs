//! `tensorcomm bench`: nccl-tests-style collective benchmarks.
//!
//! `tensorcomm bench --op all_reduce --backend cpu -n 4 -b 8 -e 64M -f 2
//! --dtype f32` starts 4 local ranks of itself (or, inside `tensorcomm run`,
//! is one rank), and for each size from `-b` to `-e`, multiplying by `-f`,
//! times `--iters` collectives after `--warmup` ones and prints size,
//! count, dtype, op, time (the slowest rank's mean, µs), algbw and busbw
//! (nccl-tests formulas, `row.rs`) and a correctness check of a separate
//! run against the reference in `data.rs`. `--json` prints one JSON object
//! per row instead, and nothing else on stdout: the ranks the bench starts
//! itself write to its own stdout and stderr without the launcher's
//! `[rankN]: ` prefix, and only rank 0 prints rows. `--transport` picks the
//! CPU backend's transport (`auto`, `tcp`, `shm`; default: the
//! `TENSORCOMM_TRANSPORT` variable, else `auto`). When stderr is a terminal,
//! rank 0 shows which size it is on there (`progress.rs`).
//!
//! Besides the collectives, the cpu backend times point-to-point messages
//! (`send_recv`, `send_recv_any`: a ring, nccl-tests' sendrecv), the
//! barriers (`barrier`, `monitored_barrier`: one row of size 0, whatever
//! the sizes asked for) and the sparse all-reduce (`all_reduce_sparse`:
//! 1-D COO tensors whose entries partly overlap between ranks,
//! `sparse.rs`); `ops.rs` says what each row's count is and checks.
//!
//! `--device cuda` (with `--backend cpu`) puts each rank's tensors on
//! cuda:(LOCAL_RANK % GPUs), so the CPU backend stages them through pinned
//! host memory; each call is timed to the end of its copies back (`wait()`
//! then the device synchronized), as `bench/gloo_cuda_torch.py` times
//! PyTorch's Gloo on CUDA tensors (`bench/compare_gloo.py --device cuda`
//! prints the ratios).
//!
//! `--backend nccl` times the NCCL process group on CUDA tensors, one rank
//! per GPU, with the caller's host time per call beside the device time
//! (`nccl.rs`).
//!
//! `--backend cuda-comm` times `cuda::comm` (broadcast, scatter, gather,
//! reduce_add, broadcast_coalesced and a plain peer copy) over GPUs 0 to
//! `-n` - 1 in this one process (`cuda_comm.rs`), with the same columns
//! plus, given `--torch FILE` (from `bench/cuda_comm_torch.py --gpus N`),
//! PyTorch's time and the ratio. Without `-n` GPUs it fails with a NoCuda
//! error.
//!
//! `--op ddp` times a simulated backward pass through the DDP Reducer
//! (`--model`, `--hook`, `--compute-us`, `--bucket-cap`): step time,
//! communication time and exposed communication (`ddp.rs`), on host
//! gradients or, with `--device cuda`, CUDA gradients through the cpu
//! backend or NCCL.

mod cuda_comm;
mod data;
mod ddp;
mod intranode;
mod nccl;
mod ops;
mod pending;
mod progress;
mod row;
mod sparse;

use crate::memory;
use crate::stdout::Stdout;
use std::ffi::OsString;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use tensorcomm::cpu::transport::{TransportChoice, TRANSPORT_ENV};
use tensorcomm::tensor::{DType, Device, Tensor};
use tensorcomm::{Backend, ProcessGroup, ReduceOp};

pub use row::Row;

/// Where the cpu backend's tensors are.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum BenchDevice {
    /// Host memory.
    Cpu,
    /// GPU memory (cuda:LOCAL_RANK % GPUs), staged through pinned host
    /// memory by the CPU backend.
    Cuda,
}

/// Which process-group backend runs the collectives.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum BenchBackend {
    /// The CPU backend (shared memory between ranks on one host, TCP
    /// across hosts).
    Cpu,
    /// The NCCL backend: one rank per GPU, CUDA tensors.
    Nccl,
    /// The peer-memory all-reduce (`cuda::intranode`): ranks of one host,
    /// one GPU each (TENSORCOMM_INTRANODE=shared lets ranks share one).
    Intranode,
    /// `cuda::comm` between two GPUs of this process.
    #[value(name = "cuda-comm")]
    CudaComm,
    /// The cpu run, then, on a machine with two or more GPUs, the
    /// cuda-comm run with its default ops and sizes.
    Auto,
}

/// The collectives that can be benchmarked.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum BenchOp {
    /// SUM all-reduce.
    #[value(name = "all_reduce")]
    AllReduce,
    /// Broadcast from rank 0.
    #[value(name = "broadcast")]
    Broadcast,
    /// SUM reduce to rank 0.
    #[value(name = "reduce")]
    Reduce,
    /// SUM all-reduce of two tensors as one collective.
    #[value(name = "all_reduce_coalesced")]
    AllReduceCoalesced,
    /// All-gather into one output tensor per rank.
    #[value(name = "all_gather")]
    AllGather,
    /// All-gather into one concatenated output tensor.
    #[value(name = "all_gather_into_tensor")]
    AllGatherIntoTensor,
    /// Coalesced all-gather (one input tensor).
    #[value(name = "all_gather_coalesced")]
    AllGatherCoalesced,
    /// Gather to rank 0.
    #[value(name = "gather")]
    Gather,
    /// Scatter from rank 0.
    #[value(name = "scatter")]
    Scatter,
    /// SUM reduce-scatter from one input tensor per rank.
    #[value(name = "reduce_scatter")]
    ReduceScatter,
    /// SUM reduce-scatter from one concatenated input tensor.
    #[value(name = "reduce_scatter_tensor")]
    ReduceScatterTensor,
    /// All-to-all over lists of tensors (equal sizes).
    #[value(name = "all_to_all")]
    AllToAll,
    /// All-to-all over one tensor, equal splits.
    #[value(name = "all_to_all_single")]
    AllToAllSingle,
    /// A ring of sends and receives (nccl-tests' sendrecv): rank r sends
    /// its buffer to rank (r + 1) % n and receives one from rank
    /// (r - 1 + n) % n, both posted before waiting. 2 ranks or more.
    #[value(name = "send_recv")]
    SendRecv,
    /// send_recv whose receive takes its message from any source; the
    /// check also wants the previous rank as the reported source.
    #[value(name = "send_recv_any")]
    SendRecvAny,
    /// Barrier. Moves no data: one row of size 0 and count 0, whatever
    /// -b, -e or --sizes say.
    #[value(name = "barrier")]
    Barrier,
    /// Monitored barrier (all ranks report to rank 0, which releases
    /// them). One row of size 0 and count 0, as barrier.
    #[value(name = "monitored_barrier")]
    MonitoredBarrier,
    /// SUM all-reduce of a 1-D sparse COO tensor of `count` entries per
    /// rank, half of them at indices every rank holds, half at indices
    /// of its own; size is the bytes of its values.
    #[value(name = "all_reduce_sparse")]
    AllReduceSparse,
}

impl BenchOp {
    /// Every op, in the order above.
    const ALL: [BenchOp; 18] = [
        BenchOp::AllReduce,
        BenchOp::Broadcast,
        BenchOp::Reduce,
        BenchOp::AllReduceCoalesced,
        BenchOp::AllGather,
        BenchOp::AllGatherIntoTensor,
        BenchOp::AllGatherCoalesced,
        BenchOp::Gather,
        BenchOp::Scatter,
        BenchOp::ReduceScatter,
        BenchOp::ReduceScatterTensor,
        BenchOp::AllToAll,
        BenchOp::AllToAllSingle,
        BenchOp::SendRecv,
        BenchOp::SendRecvAny,
        BenchOp::Barrier,
        BenchOp::MonitoredBarrier,
        BenchOp::AllReduceSparse,
    ];

    fn name(self) -> &'static str {
        match self {
            BenchOp::AllReduce => "all_reduce",
            BenchOp::Broadcast => "broadcast",
            BenchOp::Reduce => "reduce",
            BenchOp::AllReduceCoalesced => "all_reduce_coalesced",
            BenchOp::AllGather => "all_gather",
            BenchOp::AllGatherIntoTensor => "all_gather_into_tensor",
            BenchOp::AllGatherCoalesced => "all_gather_coalesced",
            BenchOp::Gather => "gather",
            BenchOp::Scatter => "scatter",
            BenchOp::ReduceScatter => "reduce_scatter",
            BenchOp::ReduceScatterTensor => "reduce_scatter_tensor",
            BenchOp::AllToAll => "all_to_all",
            BenchOp::AllToAllSingle => "all_to_all_single",
            BenchOp::SendRecv => "send_recv",
            BenchOp::SendRecvAny => "send_recv_any",
            BenchOp::Barrier => "barrier",
            BenchOp::MonitoredBarrier => "monitored_barrier",
            BenchOp::AllReduceSparse => "all_reduce_sparse",
        }
    }
}

#[derive(clap::Args, Debug, Clone)]
pub struct BenchArgs {
    /// What to time. cpu: one collective (default all_reduce), or ddp (a
    /// simulated backward pass through the DDP Reducer). cuda-comm: a comma
    /// list of peer_copy, broadcast, scatter, gather, reduce_add,
    /// broadcast_coalesced (default all of them).
    #[arg(long, value_delimiter = ',')]
    op: Vec<String>,
    /// The backend running it.
    #[arg(long, value_enum, default_value_t = BenchBackend::Cpu)]
    backend: BenchBackend,
    /// Ranks to start when run on its own (ignored inside a launcher).
    #[arg(short = 'n', long = "nproc", default_value_t = 2)]
    nproc: usize,
    /// Smallest size in bytes per rank (suffixes K, M, G: binary).
    #[arg(short = 'b', long = "minbytes", default_value = "8", value_parser = parse_size)]
    min_bytes: usize,
    /// Largest size in bytes per rank.
    #[arg(short = 'e', long = "maxbytes", default_value = "1M", value_parser = parse_size)]
    max_bytes: usize,
    /// Multiply the size by this factor between rows.
    #[arg(short = 'f', long = "stepfactor", default_value_t = 2)]
    factor: usize,
    /// Element type.
    #[arg(long, default_value = "f32")]
    dtype: DType,
    /// Timed iterations per size.
    #[arg(long, default_value_t = 20)]
    iters: usize,
    /// Untimed iterations per size before the timed ones.
    #[arg(long, default_value_t = 5)]
    warmup: usize,
    /// cpu: report each rank's median call (every call timed on its own)
    /// instead of its mean, the slowest rank's as before: the statistic
    /// bench/gloo_cuda_torch.py reports, and one a few slow calls on a
    /// busy machine do not move.
    #[arg(long)]
    median: bool,
    /// Print one JSON object per row instead of a table.
    #[arg(long)]
    json: bool,
    /// CPU transport between ranks: auto (shared memory on one host, TCP
    /// across), tcp or shm. Default: TENSORCOMM_TRANSPORT, else auto.
    #[arg(long, value_parser = parse_transport)]
    transport: Option<TransportChoice>,
    /// Place the tensors in the group's symmetric memory
    /// (`ProcessGroup::symmetric_zeros`: shared memory the other ranks
    /// read, when every rank is on this host), not in private memory.
    /// Every op but gather, scatter and all_reduce_sparse (the barriers
    /// have no tensors to place).
    #[arg(long)]
    symmetric: bool,
    /// Exact sizes to time (comma list, suffixes K, M, G), instead of the
    /// -b .. -e sweep. The barriers ignore sizes: one row of size 0.
    #[arg(long, value_delimiter = ',', value_parser = parse_size)]
    sizes: Vec<usize>,
    /// cuda-comm: bucket sizes of the broadcast_coalesced rows.
    #[arg(long, value_delimiter = ',', value_parser = parse_size, default_value = "25M,1M")]
    buffers: Vec<usize>,
    /// cuda-comm: PyTorch timings (JSON lines {"op", "bytes", "time_us"},
    /// from bench/cuda_comm_torch.py) to print ratios against.
    #[arg(long)]
    torch: Option<std::path::PathBuf>,
    /// cpu: where the tensors are. cuda puts rank r's on cuda:(LOCAL_RANK %
    /// GPUs) (ranks may share a GPU); each call is then timed to the end
    /// of its copies back (`wait()`, then the device synchronized), as
    /// bench/gloo_cuda_torch.py times PyTorch's Gloo. ddp: where the
    /// gradients are (cuda with --backend cpu or nccl).
    #[arg(long, value_enum, default_value_t = BenchDevice::Cpu)]
    device: BenchDevice,
    /// A label printed in the table's title line (e.g. the copy method).
    #[arg(long, default_value = "")]
    label: String,
    /// ddp: the gradients: mlp (six 2048x2048 layers and a 2048x10 head,
    /// 25.2M parameters), resnet50 (25.6M in 161 tensors), or a comma list
    /// of element counts, one 1-D parameter per layer.
    #[arg(long, default_value = "mlp")]
    model: String,
    /// ddp: the communication hook: allreduce, fp16, bf16, powersgd
    /// (compressing from the third step) or noop.
    #[arg(long, default_value = "allreduce")]
    hook: String,
    /// ddp: backward compute per layer before its gradients are ready, in
    /// µs (a busy wait on the rank's core).
    #[arg(long, default_value_t = 100)]
    compute_us: u64,
    /// ddp: the Reducer's bucket size limit (DDP's bucket_cap_mb).
    #[arg(long, default_value = "25M", value_parser = parse_size)]
    bucket_cap: usize,
    /// ddp: PowerSGD's matrix approximation rank.
    #[arg(long, default_value_t = 1)]
    powersgd_rank: usize,
    /// ddp: the simulated backward writes each gradient straight into its
    /// bucket view (`Reducer::gradient`, with `gradient_as_bucket_view`,
    /// as PyTorch DDP's `gradient_as_bucket_view=True`), within the
    /// layer's --compute-us: nothing is copied into the buckets or back.
    #[arg(long)]
    grad_as_bucket_view: bool,
    /// ddp: threads per rank that copy a large gradient into its bucket
    /// and the average back (`ReducerOptions::copy_threads`); default the
    /// rank's share of this host's cores, at most 4.
    #[arg(long)]
    copy_threads: Option<usize>,
    /// cpu with --device cuda: give the group peer memory (the device path:
    /// all_reduce on the GPUs when every rank can; TENSORCOMM_INTRANODE
    /// says which groups qualify, `shared` for ranks sharing a GPU).
    /// All_reduces of 2 MiB or more are staged in pipelined chunks with or
    /// without it, on hosts with GPUs.
    #[arg(long)]
    peer_memory: bool,
    /// intranode: run the -n ranks as threads of this process instead of
    /// processes (ranks sharing a GPU then run side by side, where
    /// processes take turns on it).
    #[arg(long)]
    in_process: bool,
}

impl BenchArgs {
    /// The one process-group collective of a cpu, nccl or intranode run.
    fn cpu_op(&self) -> Result<BenchOp, String> {
        use clap::ValueEnum;
        match self.op.as_slice() {
            [] => Ok(BenchOp::AllReduce),
            [one] => BenchOp::from_str(one, false).map_err(|_| {
                let valid: Vec<&str> = BenchOp::ALL.iter().map(|op| op.name()).collect();
                format!(
                    "--op {one:?} is not a collective of the cpu backend: expected one of {} (cuda-comm ops need --backend cuda-comm)",
                    valid.join(", ")
                )
            }),
            many => Err(format!(
                "the cpu, nccl and intranode backends time one op per run, found {}",
                many.join(",")
            )),
        }
    }
}

/// Parses `auto`, `tcp` or `shm`.
fn parse_transport(s: &str) -> Result<TransportChoice, String> {
    match s.parse::<TransportChoice>() {
        Ok(TransportChoice::Env) | Err(_) => Err(format!("expected auto, tcp or shm, found {s:?}")),
        Ok(choice) => Ok(choice),
    }
}

/// Parses `8`, `64K`, `64M`, `1G` (binary multiples).
fn parse_size(s: &str) -> Result<usize, String> {
    tensorcomm::tuning::parse_size(s)
        .ok_or_else(|| format!("expected a size such as 8, 64K, 64M or 1G, found {s:?}"))
}

pub fn main(args: BenchArgs) -> ExitCode {
    if args.op == ["ddp"] {
        return ddp::main(&args);
    }
    if args.factor < 2 || args.min_bytes == 0 || args.min_bytes > args.max_bytes || args.iters == 0
    {
        eprintln!("tensorcomm bench: expected 0 < -b <= -e, -f >= 2 and --iters >= 1");
        return ExitCode::from(2);
    }
    if args.device == BenchDevice::Cuda && (args.backend != BenchBackend::Cpu || args.symmetric) {
        eprintln!("tensorcomm bench: --device cuda goes with --backend cpu, without --symmetric");
        return ExitCode::from(2);
    }
    if args.peer_memory && args.device != BenchDevice::Cuda {
        eprintln!("tensorcomm bench: --peer-memory goes with --backend cpu --device cuda");
        return ExitCode::from(2);
    }
    if args.sizes.contains(&0) {
        eprintln!("tensorcomm bench: expected --sizes above 0");
        return ExitCode::from(2);
    }
    match args.backend {
        BenchBackend::CudaComm => return cuda_comm::main(&args),
        BenchBackend::Auto => return cpu_then_gpus(args),
        BenchBackend::Cpu | BenchBackend::Nccl | BenchBackend::Intranode => {}
    }
    if let Err(msg) = args.cpu_op().and_then(|op| fits_in_memory(&args, op)) {
        eprintln!("tensorcomm bench: {msg}");
        return ExitCode::from(2);
    }
    if args.backend == BenchBackend::Intranode && args.in_process {
        return match args
            .cpu_op()
            .map_err(tensorcomm::Error::InvalidArgument)
            .and_then(|op| intranode::run_threads(&args, op))
        {
            Ok(true) => ExitCode::SUCCESS,
            Ok(false) => {
                eprintln!("tensorcomm bench: some results were WRONG");
                ExitCode::FAILURE
            }
            Err(err) => {
                eprintln!("tensorcomm bench failed: {err}");
                ExitCode::FAILURE
            }
        };
    }
    if std::env::var_os("RANK").is_none() {
        return launch_self(&args);
    }
    let outcome = match args.backend {
        BenchBackend::Nccl => args
            .cpu_op()
            .map_err(tensorcomm::Error::InvalidArgument)
            .and_then(|op| nccl::run_rank(&args, op)),
        BenchBackend::Intranode => args
            .cpu_op()
            .map_err(tensorcomm::Error::InvalidArgument)
            .and_then(|op| intranode::run_rank(&args, op)),
        _ => run_rank(&args),
    };
    match outcome {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => {
            eprintln!("tensorcomm bench: some results were WRONG");
            ExitCode::FAILURE
        }
        Err(err) => {
            let rank = std::env::var("RANK").unwrap_or_default();
            eprintln!("tensorcomm bench failed on rank {rank}: {err}");
            ExitCode::FAILURE
        }
    }
}

/// `--backend auto`: the cpu run, then cuda::comm when this machine has
/// the two GPUs it needs (said in a line when it does not).
fn cpu_then_gpus(args: BenchArgs) -> ExitCode {
    let cpu = main(BenchArgs {
        backend: BenchBackend::Cpu,
        ..args.clone()
    });
    if cpu != ExitCode::SUCCESS {
        return cpu;
    }
    // Best effort: the reader may have gone (`| head`).
    let mut stdout = Stdout::new(true);
    match tensorcomm::cuda::runtime::device_count() {
        Ok(n) if n >= 2 => {
            stdout.line(format_args!(""));
            if !stdout.is_open() {
                // The reader of the rows went away: done.
                return ExitCode::SUCCESS;
            }
            cuda_comm::main(&BenchArgs {
                backend: BenchBackend::CudaComm,
                op: Vec::new(),
                nproc: n,
                ..args
            })
        }
        Ok(n) => {
            stdout.line(format_args!(
                "# cuda-comm: skipped, this machine has {n} GPU(s) and it needs 2"
            ));
            ExitCode::SUCCESS
        }
        Err(e) => {
            stdout.line(format_args!("# cuda-comm: skipped ({e})"));
            ExitCode::SUCCESS
        }
    }
}

/// Refuses a run whose largest row cannot fit in this host's memory: each
/// rank holds at least an input and an output of the row's bytes, and
/// ranks started here (`-n`, or `LOCAL_WORLD_SIZE` inside a launcher) share
/// the host.
fn fits_in_memory(args: &BenchArgs, op: BenchOp) -> Result<(), String> {
    let launched = std::env::var_os("RANK").is_some();
    let env_count = |name: &str| {
        std::env::var(name)
            .ok()
            .and_then(|v| v.parse::<usize>().ok())
    };
    let (ranks, on_host) = if launched {
        let ranks = env_count("WORLD_SIZE").unwrap_or(1).max(1);
        (ranks, env_count("LOCAL_WORLD_SIZE").unwrap_or(ranks).max(1))
    } else {
        (args.nproc.max(1), args.nproc.max(1))
    };
    let dtype = args.dtype.size();
    let Some(largest) = op_sizes(args, op).into_iter().max() else {
        return Ok(());
    };
    if ops::sizeless(op) {
        return Ok(());
    }
    let row = ops::row_count(op, (largest / dtype).max(1), ranks) as u128 * dtype as u128;
    let needed = row * 2 * on_host as u128;
    memory::check(
        &format!("a row of {largest} bytes"),
        needed,
        &format!(
            "{on_host} rank(s) on this host, each with an input and an output of {}",
            memory::human(row)
        ),
    )
}

/// `1 rank`, `4 ranks`.
pub(crate) fn rank_count(n: usize) -> String {
    if n == 1 {
        "1 rank".into()
    } else {
        format!("{n} ranks")
    }
}

/// The name of the cpu run's op (already validated by `main`).
fn op_name(args: &BenchArgs) -> &'static str {
    args.cpu_op().map_or("all_reduce", BenchOp::name)
}

fn launch_self(args: &BenchArgs) -> ExitCode {
    let exe = match std::env::current_exe() {
        Ok(exe) => exe,
        Err(err) => {
            eprintln!("tensorcomm bench: cannot find its own executable: {err}");
            return ExitCode::FAILURE;
        }
    };
    let mut rank_args: Vec<String> = vec![
        "bench".into(),
        format!("--op={}", op_name(args)),
        format!(
            "--backend={}",
            match args.backend {
                BenchBackend::Nccl => "nccl",
                BenchBackend::Intranode => "intranode",
                _ => "cpu",
            }
        ),
        format!("--minbytes={}", args.min_bytes),
        format!("--maxbytes={}", args.max_bytes),
        format!("--stepfactor={}", args.factor),
        format!("--dtype={}", args.dtype),
        format!("--iters={}", args.iters),
        format!("--warmup={}", args.warmup),
    ];
    if args.json {
        rank_args.push("--json".into());
    }
    if let Some(transport) = args.transport {
        rank_args.push(format!("--transport={transport}"));
    }
    if args.symmetric {
        rank_args.push("--symmetric".into());
    }
    if args.peer_memory {
        rank_args.push("--peer-memory".into());
    }
    if args.median {
        rank_args.push("--median".into());
    }
    if args.device == BenchDevice::Cuda {
        rank_args.push("--device=cuda".into());
    }
    if !args.sizes.is_empty() {
        let sizes: Vec<String> = args.sizes.iter().map(usize::to_string).collect();
        rank_args.push(format!("--sizes={}", sizes.join(",")));
    }
    let rank_args: Vec<OsString> = rank_args.into_iter().map(OsString::from).collect();
    // Unprefixed: rank 0 alone prints rows, so stdout stays clean (JSON
    // lines with --json), and rank 0 sees whether stderr is a terminal.
    crate::launch::launch_local_with(&exe, &rank_args, args.nproc, None, &[], false)
}

/// Runs every size on this rank; rank 0 prints. True when all rows were
/// correct.
fn run_rank(args: &BenchArgs) -> tensorcomm::Result<bool> {
    if let Some(transport) = args.transport {
        // Read by the CPU backend when the group is created, below.
        std::env::set_var(TRANSPORT_ENV, transport.to_string());
    }
    let transport = TransportChoice::Env.resolve()?;
    let op = args.cpu_op().map_err(tensorcomm::Error::InvalidArgument)?;
    if let (true, Some(why)) = (args.symmetric, ops::symmetric_refused(op)) {
        return Err(tensorcomm::Error::InvalidArgument(format!(
            "--symmetric: {} cannot use symmetric memory: {why}",
            op.name()
        )));
    }
    let pg = tensorcomm::init_process_group_with(
        Backend::Cpu,
        "env://",
        &tensorcomm::InitOptions {
            peer_memory: args.peer_memory,
            ..tensorcomm::InitOptions::default()
        },
    )?;
    let (rank, ranks) = (pg.rank(), pg.size());
    ops::check_ranks(op, ranks)?;
    let dtype = args.dtype;
    let device = bench_device(args.device)?;
    // Rank 0's stdout, until a write to it fails (`bench | head`).
    let mut stdout = Stdout::new(rank == 0);
    if rank == 0 && !args.json {
        stdout.line(format_args!(
            "# tensorcomm bench: {} {} on {} ({:?} backend, {transport} transport, tensors on {device}{}), {}; time: {} of {} calls after {} warm-up, slowest rank",
            op.name(),
            dtype,
            rank_count(ranks),
            args.backend,
            if args.symmetric && !ops::sizeless(op) {
                ", symmetric memory"
            } else if args.peer_memory {
                ", peer memory"
            } else {
                ""
            },
            reduce_label(op),
            if args.median { "median" } else { "mean" },
            args.iters,
            args.warmup
        ));
        stdout.line(format_args!("{}", Row::header()));
    }
    let mut all_correct = true;
    let mut busbw = Vec::new();
    let sizes = op_sizes(args, op);
    let mut progress = progress::Progress::on_terminal(rank == 0, sizes.len());
    for size in sizes {
        if !stdout.agree_open(&*pg, Device::Cpu)? {
            // Nobody reads the rows any more: every rank stops here.
            break;
        }
        let count = ops::row_count(op, (size / dtype.size()).max(1), ranks);
        let bytes = count * dtype.size();
        progress.show(bytes);
        let correct = check(&*pg, op, dtype, count, args.symmetric, device)?;
        let time_us = time(&*pg, op, args, dtype, count, device)?;
        all_correct &= correct;
        progress.clear();
        if rank == 0 {
            let row = Row::new(
                bytes,
                count,
                dtype.name(),
                op.name(),
                ranks,
                time_us,
                correct,
            );
            stdout.line(format_args!(
                "{}",
                if args.json { row.json() } else { row.text() }
            ));
            busbw.push(row.busbw);
        }
    }
    if rank == 0 && !args.json && !busbw.is_empty() {
        stdout.line(format_args!("{}", row::summary(&busbw)));
    }
    pg.barrier(None)?.wait()?;
    Ok(all_correct)
}

/// What the header says of the reduce op (the same for the checked and
/// the timed calls).
fn reduce_label(op: BenchOp) -> String {
    match ops::timed_reduce(op) {
        Some(reduce) if ops::sums_in_place(op) => {
            format!("reduce op {reduce} (timed in place on zero inputs, which stay finite)")
        }
        Some(reduce) => format!("reduce op {reduce}"),
        None => "no reduce op".into(),
    }
}

/// The sizes a cpu run of `op` goes through: [`sizes`], except for the
/// barriers, which move no data: just 0.
fn op_sizes(args: &BenchArgs, op: BenchOp) -> Vec<usize> {
    if ops::sizeless(op) {
        vec![0]
    } else {
        sizes(args)
    }
}

/// The sizes a run goes through: `--sizes` when given, else from `-b` to
/// `-e`, times `-f` each step.
fn sizes(args: &BenchArgs) -> Vec<usize> {
    if !args.sizes.is_empty() {
        return args.sizes.clone();
    }
    let mut sizes = vec![args.min_bytes];
    while let Some(next) = sizes[sizes.len() - 1].checked_mul(args.factor) {
        if next > args.max_bytes {
            break;
        }
        sizes.push(next);
    }
    sizes
}

/// The device `--device` puts this rank's tensors on: cuda:(LOCAL_RANK %
/// GPUs) for cuda.
fn bench_device(device: BenchDevice) -> tensorcomm::Result<Device> {
    match device {
        BenchDevice::Cpu => Ok(Device::Cpu),
        BenchDevice::Cuda => {
            let gpus = tensorcomm::cuda::runtime::device_count()?;
            if gpus == 0 {
                return Err(tensorcomm::Error::NoCuda {
                    reason: "--device cuda: this machine has no GPU".into(),
                });
            }
            let local: usize = std::env::var("LOCAL_RANK")
                .ok()
                .and_then(|r| r.parse().ok())
                .unwrap_or(0);
            Ok(Device::Cuda(local % gpus))
        }
    }
}

/// After an op's `wait()`: on a GPU, blocks until the device is done too
/// (PyTorch's `torch.cuda.synchronize()`), so the host may read results
/// and a timed call includes its copies back.
fn settle(device: Device) -> tensorcomm::Result<()> {
    match device {
        Device::Cpu => Ok(()),
        Device::Cuda(gpu) => tensorcomm::cuda::runtime::context(gpu)?.synchronize(),
    }
}

/// Runs the op once on fresh inputs and compares every element (and what
/// waiting on it gave back) with the reference; the verdict is agreed by
/// all ranks (MIN).
fn check(
    pg: &dyn ProcessGroup,
    op: BenchOp,
    dtype: DType,
    count: usize,
    symmetric: bool,
    device: Device,
) -> tensorcomm::Result<bool> {
    let (rank, ranks) = (pg.rank(), pg.size());
    let buffers = ops::setup(op, (rank, ranks), dtype, count, symmetric.then_some(pg))?;
    let buffers = buffers.into_device(device)?;
    let reduce = ops::timed_reduce(op).unwrap_or(ReduceOp::Sum);
    let outcome = ops::launch(pg, op, &buffers, reduce)?.wait()?;
    settle(device)?;
    let ok = ops::verify(op, rank, ranks, dtype, count, &buffers, &outcome)?;
    let verdict = Tensor::from_vec(vec![i32::from(ok)], &[1])?;
    pg.all_reduce(&verdict, ReduceOp::Min, None)?.wait()?;
    Ok(verdict.to_vec::<i32>()?[0] == 1)
}

/// Mean time of one call of the op over `iters` (with `--median`, the
/// median call), the slowest rank's, in µs.
fn time(
    pg: &dyn ProcessGroup,
    op: BenchOp,
    args: &BenchArgs,
    dtype: DType,
    count: usize,
    device: Device,
) -> tensorcomm::Result<f64> {
    let symmetric = args.symmetric.then_some(pg);
    let buffers = ops::setup(op, (pg.rank(), pg.size()), dtype, count, symmetric)?;
    if ops::sums_in_place(op) {
        // Summed into themselves call after call, nonzero inputs would
        // overflow (f16 within a few calls): zeros stay finite.
        buffers.zero_inputs()?;
    }
    let buffers = buffers.into_device(device)?;
    // Ops that reduce nothing ignore it.
    let reduce = ops::timed_reduce(op).unwrap_or(ReduceOp::Sum);
    let once = || {
        ops::launch(pg, op, &buffers, reduce)?.wait()?;
        settle(device)
    };
    for _ in 0..args.warmup {
        once()?;
    }
    pg.barrier(None)?.wait()?;
    let us = |d: Duration| d.as_secs_f64() * 1e6;
    let mine = if args.median {
        let mut calls = Vec::with_capacity(args.iters);
        for _ in 0..args.iters {
            let started = Instant::now();
            once()?;
            calls.push(us(started.elapsed()));
        }
        nccl::median(calls)
    } else {
        let started = Instant::now();
        for _ in 0..args.iters {
            once()?;
        }
        us(started.elapsed() / args.iters as u32)
    };
    let slowest = Tensor::from_vec(vec![mine], &[1])?;
    pg.all_reduce(&slowest, ReduceOp::Max, None)?.wait()?;
    Ok(slowest.to_vec::<f64>()?[0])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_median_is_the_middle_call_or_the_mean_of_the_two_middle_ones() {
        assert_eq!(nccl::median(vec![9.0, 1.0, 5.0]), 5.0);
        assert_eq!(nccl::median(vec![100.0, 2.0, 4.0, 1.0]), 3.0);
        assert_eq!(nccl::median(vec![7.0]), 7.0);
    }

    #[test]
    fn sizes_parse_with_binary_suffixes() {
        assert_eq!(parse_size("8"), Ok(8));
        assert_eq!(parse_size("64K"), Ok(64 << 10));
        assert_eq!(parse_size("64m"), Ok(64 << 20));
        assert_eq!(parse_size("1G"), Ok(1 << 30));
        assert!(parse_size("12Q").is_err());
        assert!(parse_size("").is_err());
    }

    #[test]
    fn transports_parse_and_env_is_not_a_flag_value() {
        assert_eq!(parse_transport("shm"), Ok(TransportChoice::Shm));
        assert_eq!(parse_transport("TCP"), Ok(TransportChoice::Tcp));
        assert_eq!(parse_transport("auto"), Ok(TransportChoice::Auto));
        assert!(parse_transport("env")
            .unwrap_err()
            .contains("found \"env\""));
        assert!(parse_transport("udp").is_err());
    }

    #[test]
    fn sizes_step_by_the_factor_up_to_the_maximum() {
        use clap::Parser;
        #[derive(Parser)]
        struct Cli {
            #[command(flatten)]
            bench: BenchArgs,
        }
        let cli = Cli::parse_from(["x", "-b", "8", "-e", "100", "-f", "4"]);
        assert_eq!(sizes(&cli.bench), [8, 32]);
        assert_eq!(op_sizes(&cli.bench, BenchOp::SendRecv), [8, 32]);
        let cli = Cli::parse_from(["x", "-b", "1K", "-e", "1K"]);
        assert_eq!(sizes(&cli.bench), [1024]);
        let cli = Cli::parse_from(["x", "--sizes", "1K,1M,256M"]);
        assert_eq!(
            op_sizes(&cli.bench, BenchOp::AllReduceSparse),
            [1024, 1 << 20, 256 << 20]
        );
        // The barriers: one row of size 0, whatever the sizes asked.
        assert_eq!(op_sizes(&cli.bench, BenchOp::Barrier), [0]);
        let cli = Cli::parse_from(["x", "-b", "8", "-e", "1M"]);
        assert_eq!(op_sizes(&cli.bench, BenchOp::MonitoredBarrier), [0]);
    }

    #[test]
    fn the_cpu_backend_takes_one_collective() {
        use clap::Parser;
        #[derive(Parser)]
        struct Cli {
            #[command(flatten)]
            bench: BenchArgs,
        }
        let parse = |args: &[&str]| Cli::parse_from([&["x"], args].concat()).bench;
        assert_eq!(parse(&[]).cpu_op(), Ok(BenchOp::AllReduce));
        assert_eq!(parse(&["--op", "gather"]).cpu_op(), Ok(BenchOp::Gather));
        for op in BenchOp::ALL {
            assert_eq!(parse(&["--op", op.name()]).cpu_op(), Ok(op));
        }
        let err = parse(&["--op", "reduce_add"]).cpu_op().unwrap_err();
        assert!(err.contains("cuda-comm"), "{err}");
        let err = parse(&["--op", "gather,scatter"]).cpu_op().unwrap_err();
        assert!(err.contains("one op per run"), "{err}");
        let b = parse(&["--backend", "cuda-comm"]);
        assert_eq!(
            (b.backend, b.buffers.as_slice()),
            (BenchBackend::CudaComm, &[25 << 20, 1 << 20][..])
        );
    }
}
