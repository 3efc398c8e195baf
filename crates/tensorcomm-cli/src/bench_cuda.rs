//! `tensorcomm bench-cuda`: times `cuda::comm` on two GPUs with
//! nccl-tests-style columns, checks every result, and prints the ratio to
//! PyTorch's `torch.cuda.comm` when given its timings
//! (`bench/cuda_comm_torch.py --json FILE`, same shapes).

use std::collections::HashMap;
use std::process::ExitCode;
use std::time::Instant;

use clap::Args;
use tensorcomm::cuda::comm;
use tensorcomm::tensor::{DType, Device, Tensor};
use tensorcomm::{Error, Result};

/// Options of `tensorcomm bench-cuda`.
#[derive(Args, Debug, Clone)]
pub struct BenchCudaArgs {
    /// Timed repetitions per case (the median is reported).
    #[arg(long, default_value_t = 20)]
    pub iters: usize,
    /// Untimed repetitions first.
    #[arg(long, default_value_t = 3)]
    pub warmup: usize,
    /// Message sizes in bytes for broadcast/scatter/gather/reduce_add/peer_copy.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "1024,1048576,268435456,1073741824"
    )]
    pub sizes: Vec<usize>,
    /// PyTorch timings (JSON lines {"op", "bytes", "time_us"}) to compare with.
    #[arg(long)]
    pub torch: Option<std::path::PathBuf>,
    /// A label printed with the table (e.g. the copy strategy).
    #[arg(long, default_value = "")]
    pub label: String,
}

/// One measured case.
#[derive(Debug, Clone)]
pub struct Row {
    pub op: String,
    pub bytes: usize,
    pub count: usize,
    pub dtype: DType,
    pub time_us: f64,
    /// Bytes that cross between GPUs per call.
    pub bus_bytes: usize,
    pub correct: bool,
    pub torch_us: Option<f64>,
}

/// The model-shaped parameter set: 64x3x7x7, 40 of 256x256x3x3, 100 of 256,
/// 4 of 1000x2048 (f32), about 127 MB.
pub fn model_shapes() -> Vec<Vec<usize>> {
    let mut shapes = vec![vec![64, 3, 7, 7]];
    shapes.extend(std::iter::repeat_n(vec![256, 256, 3, 3], 40));
    shapes.extend(std::iter::repeat_n(vec![256], 100));
    shapes.extend(std::iter::repeat_n(vec![1000, 2048], 4));
    shapes
}

fn filled(numel: usize, shape: &[usize], seed: u32, device: usize) -> Result<Tensor<'static>> {
    // Small integers: exact in f32, so sums compare exactly.
    let host = Tensor::from_vec(
        (0..numel as u32)
            .map(|i| ((i.wrapping_mul(2654435761).wrapping_add(seed)) >> 24) as f32)
            .collect(),
        shape,
    )?;
    host.to_device(Device::Cuda(device))
}

fn median_us(mut f: impl FnMut() -> Result<()>, warmup: usize, iters: usize) -> Result<f64> {
    for _ in 0..warmup {
        f()?;
    }
    let mut times = Vec::with_capacity(iters);
    for _ in 0..iters.max(1) {
        let t = Instant::now();
        f()?;
        times.push(t.elapsed().as_secs_f64() * 1e6);
    }
    times.sort_by(f64::total_cmp);
    Ok(times[times.len() / 2])
}

fn same(a: &Tensor<'_>, b: &Tensor<'_>) -> Result<bool> {
    Ok(a.to_vec::<f32>()? == b.to_vec::<f32>()?)
}

/// Runs every case; needs two GPUs.
pub fn run(args: &BenchCudaArgs) -> Result<Vec<Row>> {
    let n = tensorcomm::cuda::runtime::device_count()?;
    if n < 2 {
        return Err(Error::NoCuda {
            reason: format!("bench-cuda needs 2 GPUs, found {n}"),
        });
    }
    let (w, it) = (args.warmup, args.iters);
    let mut rows = Vec::new();
    let mut push =
        |op: &str, bytes: usize, count: usize, bus: usize, time_us: f64, correct: bool| {
            rows.push(Row {
                op: op.into(),
                bytes,
                count,
                dtype: DType::F32,
                time_us,
                bus_bytes: bus,
                correct,
                torch_us: None,
            });
        };
    for &bytes in &args.sizes {
        let numel = bytes / 4;
        let x = filled(numel, &[numel], 1, 0)?;
        let y = filled(numel, &[numel], 2, 1)?;
        let iters = if bytes >= 1 << 28 { it.min(10) } else { it };

        let dst = Tensor::zeros_on(&[numel], DType::F32, Device::Cuda(1))?;
        let t = median_us(|| dst.copy_from(&x), w, iters)?;
        push("peer_copy", bytes, numel, bytes, t, same(&dst, &x)?);

        let mut out = Vec::new();
        let t = median_us(
            || {
                out = comm::broadcast(&x, &[0, 1])?;
                Ok(())
            },
            w,
            iters,
        )?;
        push(
            "broadcast",
            bytes,
            numel,
            bytes,
            t,
            out[0].shares_storage(&x) && same(&out[1], &x)?,
        );

        let t = median_us(
            || {
                out = comm::scatter(&x, &[0, 1], None, 0, None)?;
                Ok(())
            },
            w,
            iters,
        )?;
        let ok = out[1].to_vec::<f32>()?
            == x.narrow(0, numel.div_ceil(2), numel - numel.div_ceil(2))?
                .to_vec::<f32>()?;
        push("scatter", bytes, numel, bytes / 2, t, ok);

        let half = numel / 2;
        let parts = [x.narrow(0, 0, half)?, y.narrow(0, 0, numel - half)?];
        let mut g = None;
        let t = median_us(
            || {
                g = Some(comm::gather(&parts, 0, Device::Cuda(0))?);
                Ok(())
            },
            w,
            iters,
        )?;
        let ok = match &g {
            Some(g) => {
                let v = g.to_vec::<f32>()?;
                v[..half] == parts[0].to_vec::<f32>()?[..]
                    && v[half..] == parts[1].to_vec::<f32>()?[..]
            }
            None => false,
        };
        push("gather", bytes, numel, bytes / 2, t, ok);

        let mut s = None;
        let inputs = [x.clone(), y.clone()];
        let t = median_us(
            || {
                s = Some(comm::reduce_add(&inputs, 0)?);
                Ok(())
            },
            w,
            iters,
        )?;
        let ok = match &s {
            Some(s) => {
                let (a, b, r) = (x.to_vec::<f32>()?, y.to_vec::<f32>()?, s.to_vec::<f32>()?);
                a.iter().zip(&b).zip(&r).all(|((a, b), r)| a + b == *r)
            }
            None => false,
        };
        push("reduce_add", bytes, numel, bytes, t, ok);
    }
    let shapes = model_shapes();
    let params = shapes
        .iter()
        .enumerate()
        .map(|(i, s)| filled(s.iter().product(), s, i as u32, 0))
        .collect::<Result<Vec<_>>>()?;
    let total: usize = params.iter().map(Tensor::nbytes).sum();
    for buffer in [25usize << 20, 1 << 20] {
        let mut out = Vec::new();
        let t = median_us(
            || {
                out = comm::broadcast_coalesced(&params, &[0, 1], buffer)?;
                Ok(())
            },
            w,
            it,
        )?;
        let mut ok = out.len() == 2;
        for (p, o) in params.iter().zip(&out[1]) {
            ok &= o.device() == Device::Cuda(1) && same(o, p)?;
        }
        let op = format!("broadcast_coalesced/{}MiB", buffer >> 20);
        push(&op, total, params.len(), total, t, ok);
    }
    if let Some(path) = &args.torch {
        let torch = read_torch(path)?;
        for row in &mut rows {
            row.torch_us = torch.get(&(row.op.clone(), row.bytes)).copied();
        }
    }
    Ok(rows)
}

fn read_torch(path: &std::path::Path) -> Result<HashMap<(String, usize), f64>> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| Error::io(format!("reading {}", path.display()), e))?;
    let mut out = HashMap::new();
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        let v: serde_json::Value = serde_json::from_str(line).map_err(|e| Error::BadValue {
            name: "torch timings".into(),
            expected: "JSON lines {\"op\", \"bytes\", \"time_us\"}".into(),
            found: format!("{line:?} ({e})"),
        })?;
        if let (Some(op), Some(bytes), Some(t)) =
            (v["op"].as_str(), v["bytes"].as_u64(), v["time_us"].as_f64())
        {
            out.insert((op.to_string(), bytes as usize), t);
        }
    }
    Ok(out)
}

/// Prints the rows as a table (nccl-tests columns plus the PyTorch ratio).
pub fn print(rows: &[Row], label: &str) {
    println!("# tensorcomm bench-cuda {label}");
    println!(
        "{:>12} {:>10} {:>5} {:>26} {:>11} {:>9} {:>9} {:>7} {:>11} {:>7}",
        "size(B)",
        "count",
        "type",
        "op",
        "time(us)",
        "algbw",
        "busbw",
        "correct",
        "torch(us)",
        "ratio"
    );
    for r in rows {
        let algbw = r.bytes as f64 / r.time_us / 1e3;
        let busbw = r.bus_bytes as f64 / r.time_us / 1e3;
        let (torch, ratio) = match r.torch_us {
            Some(t) => (format!("{t:.1}"), format!("{:.2}x", r.time_us / t)),
            None => ("-".into(), "-".into()),
        };
        println!(
            "{:>12} {:>10} {:>5} {:>26} {:>11.1} {:>9.2} {:>9.2} {:>7} {:>11} {:>7}",
            r.bytes,
            r.count,
            r.dtype,
            r.op,
            r.time_us,
            algbw,
            busbw,
            if r.correct { "OK" } else { "WRONG" },
            torch,
            ratio
        );
    }
    println!("# algbw, busbw in GB/s; ratio = tensorcomm time / PyTorch time (lower is better)");
}

/// `tensorcomm bench-cuda`.
pub fn main(args: BenchCudaArgs) -> ExitCode {
    match run(&args) {
        Ok(rows) => {
            print(&rows, &args.label);
            if rows.iter().all(|r| r.correct) {
                ExitCode::SUCCESS
            } else {
                eprintln!("tensorcomm bench-cuda: some results were WRONG");
                ExitCode::FAILURE
            }
        }
        Err(e) => {
            eprintln!("tensorcomm bench-cuda: {e}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_model_set_has_the_issue_shapes() {
        let shapes = model_shapes();
        assert_eq!(shapes.len(), 145);
        let bytes: usize = shapes.iter().map(|s| s.iter().product::<usize>() * 4).sum();
        assert_eq!(bytes, 127_279_872);
    }

    #[test]
    fn torch_timings_are_read_by_op_and_size() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("t.json");
        std::fs::write(
            &p,
            "{\"op\": \"broadcast\", \"bytes\": 1024, \"time_us\": 33.5}\n\n",
        )
        .unwrap();
        let t = read_torch(&p).unwrap();
        assert_eq!(t.get(&("broadcast".to_string(), 1024)), Some(&33.5));
        std::fs::write(&p, "not json\n").unwrap();
        assert!(matches!(read_torch(&p), Err(Error::BadValue { .. })));
    }
}
