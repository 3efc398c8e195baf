//! `tensorcomm bench --backend nccl`: the NCCL process group, one rank per
//! GPU (`LOCAL_RANK`), on CUDA tensors.
//!
//! For each size it checks one run against the reference (inputs filled
//! with rank + 1, outputs poisoned), then times `--iters` calls after
//! `--warmup`, each on a fresh input and a poisoned output: the host time
//! of the call and its `wait()` (what the caller's thread spends), and the
//! end-to-end time from an event on the caller's current stream before the
//! call to one after `wait()` (it includes the host's launch time). Rows give the median of each,
//! the slowest rank's; `--json` rows carry `host_us` beside `time_us`.

use std::time::Instant;

use half::{bf16, f16};
use tensorcomm::cuda::runtime::{current_stream, Event};
use tensorcomm::tensor::{DType, Device, Tensor};
use tensorcomm::{init_process_group, Backend, ProcessGroup, ReduceOp, Work};

use super::{progress, sizes, BenchArgs, BenchOp, Row};
use crate::stdout::Stdout;

/// The ops this bench times.
pub const OPS: [BenchOp; 7] = [
    BenchOp::AllReduce,
    BenchOp::Broadcast,
    BenchOp::Reduce,
    BenchOp::AllGatherIntoTensor,
    BenchOp::ReduceScatterTensor,
    BenchOp::AllToAllSingle,
    BenchOp::Barrier,
];

/// A GPU tensor of `dtype` with every element `v`.
fn filled(dtype: DType, n: usize, v: f64, device: usize) -> tensorcomm::Result<Tensor<'static>> {
    let host = match dtype {
        DType::F32 => Tensor::from_vec(vec![v as f32; n], &[n]),
        DType::F64 => Tensor::from_vec(vec![v; n], &[n]),
        DType::F16 => Tensor::from_vec(vec![f16::from_f64(v); n], &[n]),
        DType::BF16 => Tensor::from_vec(vec![bf16::from_f64(v); n], &[n]),
        DType::I32 => Tensor::from_vec(vec![v as i32; n], &[n]),
        DType::I64 => Tensor::from_vec(vec![v as i64; n], &[n]),
        other => {
            return Err(tensorcomm::Error::InvalidArgument(format!(
                "--backend nccl: expected --dtype f32, f64, f16, bf16, i32 or i64, found {other}"
            )))
        }
    }?;
    host.to_device(Device::Cuda(device))
}

fn as_f64(t: &Tensor<'_>) -> tensorcomm::Result<Vec<f64>> {
    Ok(match t.dtype() {
        DType::F32 => t.to_vec::<f32>()?.into_iter().map(f64::from).collect(),
        DType::F64 => t.to_vec::<f64>()?,
        DType::F16 => t.to_vec::<f16>()?.into_iter().map(f64::from).collect(),
        DType::BF16 => t.to_vec::<bf16>()?.into_iter().map(f64::from).collect(),
        DType::I32 => t.to_vec::<i32>()?.into_iter().map(f64::from).collect(),
        DType::I64 => t.to_vec::<i64>()?.into_iter().map(|v| v as f64).collect(),
        _ => Vec::new(),
    })
}

/// One size's buffers: the input, the output (the input itself for the
/// in-place ops), and the fresh and poison sources they are reset from.
struct Buffers {
    input: Tensor<'static>,
    output: Tensor<'static>,
    fresh: Tensor<'static>,
    poison: Tensor<'static>,
    in_place: bool,
}

impl Buffers {
    fn new(
        op: BenchOp,
        dtype: DType,
        count: usize,
        rank: usize,
        ranks: usize,
        device: usize,
    ) -> tensorcomm::Result<Self> {
        let (n_in, n_out, in_place) = match op {
            BenchOp::AllGatherIntoTensor => (count, count * ranks, false),
            BenchOp::ReduceScatterTensor => (count, count / ranks, false),
            BenchOp::AllToAllSingle => (count, count, false),
            _ => (count, count, true),
        };
        let fresh = filled(dtype, n_in, rank as f64 + 1.0, device)?;
        let input = filled(dtype, n_in, 0.0, device)?;
        let output = if in_place {
            input.clone()
        } else {
            filled(dtype, n_out, 0.0, device)?
        };
        let poison = filled(dtype, output.numel(), -7.0, device)?;
        Ok(Buffers {
            input,
            output,
            fresh,
            poison,
            in_place,
        })
    }

    /// A fresh input and a poisoned output, written before returning.
    fn reset(&self) -> tensorcomm::Result<()> {
        if !self.in_place {
            self.output.copy_from(&self.poison)?;
        }
        self.input.copy_from(&self.fresh)
    }

    fn call(&self, pg: &dyn ProcessGroup, op: BenchOp) -> tensorcomm::Result<Work> {
        let (i, o) = (&self.input, &self.output);
        match op {
            BenchOp::AllReduce => pg.all_reduce(i, ReduceOp::Sum, None),
            BenchOp::Broadcast => pg.broadcast(i, 0, None),
            BenchOp::Reduce => pg.reduce(i, 0, ReduceOp::Sum, None),
            BenchOp::AllGatherIntoTensor => pg.all_gather_into_tensor(o, i, None),
            BenchOp::ReduceScatterTensor => pg.reduce_scatter_tensor(o, i, ReduceOp::Sum, None),
            BenchOp::AllToAllSingle => pg.all_to_all_single(o, i, &[], &[], None),
            _ => pg.barrier(None),
        }
    }

    /// Whether the output is the reference for `op` on `ranks` ranks.
    fn correct(&self, op: BenchOp, rank: usize, ranks: usize) -> tensorcomm::Result<bool> {
        let got = as_f64(&self.output)?;
        let sum = (ranks * (ranks + 1) / 2) as f64;
        let per = got.len() / ranks.max(1);
        Ok(got.iter().enumerate().all(|(k, &g)| {
            let want = match op {
                BenchOp::AllReduce | BenchOp::ReduceScatterTensor => sum,
                BenchOp::Reduce if rank == 0 => sum,
                BenchOp::Reduce => rank as f64 + 1.0,
                BenchOp::Broadcast => 1.0,
                BenchOp::AllGatherIntoTensor | BenchOp::AllToAllSingle => {
                    (k / per.max(1)) as f64 + 1.0
                }
                _ => g,
            };
            (g - want).abs() <= 1e-3 * want.abs().max(1.0)
        }))
    }
}

/// The median (the mean of the two middle values for an even count, as
/// Python's `statistics.median`, which bench/nccl_torch.py uses).
pub(super) fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => 0.0,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

/// Runs every size on this rank; rank 0 prints. True when all rows were
/// correct.
pub fn run_rank(args: &BenchArgs, op: BenchOp) -> tensorcomm::Result<bool> {
    if !OPS.contains(&op) {
        let names: Vec<_> = OPS.iter().map(|o| o.name()).collect();
        return Err(tensorcomm::Error::InvalidArgument(format!(
            "--backend nccl times {}, found {}",
            names.join(", "),
            op.name()
        )));
    }
    let pg = init_process_group(Backend::Nccl, "env://")?;
    let (rank, ranks) = (pg.rank(), pg.size());
    let device = local_device();
    let dtype = args.dtype;
    // Rank 0's stdout, until a write to it fails (`bench | head`).
    let mut stdout = Stdout::new(rank == 0);
    if rank == 0 && !args.json {
        stdout.line(format_args!(
            "# tensorcomm bench: {} {dtype} on {} (NCCL backend), {} iterations after {} warm-up; host = the caller's time per call, time = device time per call (medians)",
            op.name(),
            super::rank_count(ranks),
            args.iters,
            args.warmup
        ));
        stdout.line(format_args!("{} {:>10}", Row::header(), "host(us)"));
    }
    let sizes = if op == BenchOp::Barrier {
        vec![0]
    } else {
        sizes(args)
    };
    let mut progress = progress::Progress::on_terminal(rank == 0, sizes.len());
    let stream = current_stream(device)?;
    let mut all_correct = true;
    for size in sizes {
        if !stdout.agree_open(&*pg, Device::Cuda(device))? {
            // Nobody reads the rows any more: every rank stops here.
            break;
        }
        let mut count = (size / dtype.size()).max(1);
        if matches!(op, BenchOp::ReduceScatterTensor | BenchOp::AllToAllSingle) {
            count = count.div_ceil(ranks) * ranks;
        }
        progress.show(count * dtype.size());
        let b = Buffers::new(op, dtype, count, rank, ranks, device)?;
        b.reset()?;
        b.call(&*pg, op)?.synchronize()?;
        let correct = op == BenchOp::Barrier || b.correct(op, rank, ranks)?;
        let (mut host, mut dev) = (Vec::new(), Vec::new());
        for i in 0..args.warmup + args.iters {
            b.reset()?;
            let start = stream.record_timed()?;
            let t0 = Instant::now();
            b.call(&*pg, op)?.wait()?;
            let host_us = t0.elapsed().as_secs_f64() * 1e6;
            let end: Event = stream.record_timed()?;
            end.synchronize()?;
            if i >= args.warmup {
                host.push(host_us);
                dev.push(f64::from(start.elapsed_ms(&end)?) * 1e3);
            }
        }
        // The slowest rank's medians and everyone's verdict.
        let agreed = filled(DType::F64, 3, 0.0, device)?;
        agreed.copy_from(&Tensor::from_vec(
            vec![median(host), median(dev), if correct { 0.0 } else { 1.0 }],
            &[3],
        )?)?;
        pg.all_reduce(&agreed, ReduceOp::Max, None)?.synchronize()?;
        let v = agreed.to_vec::<f64>()?;
        let row_correct = v[2] == 0.0;
        all_correct &= row_correct;
        progress.clear();
        if rank == 0 {
            let bytes = if op == BenchOp::Barrier {
                0
            } else {
                count * dtype.size()
            };
            let n = if op == BenchOp::Barrier { 0 } else { count };
            let row = Row::new(bytes, n, dtype.name(), op.name(), ranks, v[1], row_correct);
            if args.json {
                stdout.line(format_args!(
                    "{}",
                    row.json_with(&[("host_us", serde_json::json!(v[0]))])
                ));
            } else {
                stdout.line(format_args!("{} {:>10.2}", row.text(), v[0]));
            }
        }
    }
    pg.barrier(None)?.wait()?;
    Ok(all_correct)
}

/// This rank's GPU, as the NCCL group picks it.
fn local_device() -> usize {
    let count = tensorcomm::cuda::runtime::device_count()
        .unwrap_or(1)
        .max(1);
    std::env::var("LOCAL_RANK")
        .ok()
        .and_then(|v| v.parse::<usize>().ok())
        .unwrap_or(0)
        % count
}
