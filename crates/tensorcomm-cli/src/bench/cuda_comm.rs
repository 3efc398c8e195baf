//! `tensorcomm bench --backend cuda-comm`: times `cuda::comm` on GPUs 0 to
//! `-n` - 1 (default 2) of this process, checks every result against the
//! inputs (read back to the host, compared element by element), and, given
//! PyTorch's timings of the same cases (`bench/cuda_comm_torch.py --json
//! FILE`, passed as `--torch FILE`), prints PyTorch's time and the ratio.
//!
//! Each row is the median wall time of `--iters` calls after `--warmup`
//! (every `cuda::comm` call has finished its GPU work when it returns;
//! sizes from 256 MiB use at most 10 iterations, as the PyTorch script
//! does). Rows: `peer_copy` (one `Tensor::copy_from` cuda:0 -> cuda:1, the
//! link's reference), then `broadcast` from cuda:0 to every GPU,
//! `scatter` from cuda:0, `gather` and `reduce_add` of one input per GPU
//! onto cuda:0, per size, then
//! `broadcast_coalesced/<N>MiB` of the model-shaped set per `--buffers`.

use std::cell::Cell;
use std::collections::HashMap;
use std::process::ExitCode;
use std::time::Instant;

use tensorcomm::cuda::comm;
use tensorcomm::tensor::{DType, Device, Tensor};
use tensorcomm::{Error, Result};

use super::{BenchArgs, Row};
use crate::stdout::Stdout;

/// The ops of the cuda-comm backend, in the order they are run.
pub const OPS: [&str; 6] = [
    "peer_copy",
    "broadcast",
    "scatter",
    "gather",
    "reduce_add",
    "broadcast_coalesced",
];

/// The ops `--op` asks for (all of [`OPS`] when empty), or the name that
/// is not one of them.
pub fn selected_ops(asked: &[String]) -> std::result::Result<Vec<&'static str>, String> {
    if asked.is_empty() {
        return Ok(OPS.to_vec());
    }
    let mut ops = Vec::new();
    for a in asked {
        match OPS.iter().find(|o| **o == a.as_str()) {
            Some(o) => ops.push(*o),
            None => {
                return Err(format!(
                    "--op {a:?} is not a cuda-comm op (expected one of {})",
                    OPS.join(", ")
                ))
            }
        }
    }
    Ok(ops)
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

/// Runs the selected cases on GPUs 0 to `-n` - 1, handing each row to
/// `emit` as it is measured, until `emit` says nobody reads them any more
/// (returns false); needs `-n` GPUs (at least 2).
pub fn run(args: &BenchArgs, ops: &[&str], emit: &mut dyn FnMut(Row) -> bool) -> Result<()> {
    let found = tensorcomm::cuda::runtime::device_count()?;
    let gpus = args.nproc;
    if gpus < 2 || found < gpus {
        return Err(Error::NoCuda {
            reason: format!(
                "the cuda-comm bench with -n {gpus} needs {} GPUs, found {found}",
                gpus.max(2)
            ),
        });
    }
    let devices: Vec<i64> = (0..gpus as i64).collect();
    let (w, it) = (args.warmup, args.iters);
    // Whether the rows are still read (`bench | head`).
    let reading = Cell::new(true);
    let mut push = |op: &str, bytes: usize, count: usize, time_us: f64, correct: bool| {
        reading.set(emit(Row::new(
            bytes, count, "f32", op, gpus, time_us, correct,
        )));
    };
    // An op is run while asked for and its rows are read.
    let has = |op: &str| ops.contains(&op) && reading.get();
    for bytes in super::sizes(args) {
        if !reading.get() {
            return Ok(());
        }
        let numel = (bytes / 4).max(gpus);
        let bytes = numel * 4;
        // One input per GPU; `x` is GPU 0's.
        let ys = (0..gpus)
            .map(|d| filled(numel, &[numel], d as u32 + 1, d))
            .collect::<Result<Vec<_>>>()?;
        let x = &ys[0];
        let iters = if bytes >= 1 << 28 { it.min(10) } else { it };
        // Element ranges of `numel` cut into `gpus` parts as scatter and
        // torch.chunk cut them (the last parts may be shorter).
        let each = numel.div_ceil(gpus);
        let part = |k: usize| (k * each).min(numel)..((k + 1) * each).min(numel);

        if has("peer_copy") {
            let dst = Tensor::zeros_on(&[numel], DType::F32, Device::Cuda(1))?;
            let t = median_us(|| dst.copy_from(x), w, iters)?;
            push("peer_copy", bytes, numel, t, same(&dst, x)?);
        }
        if has("broadcast") {
            let mut out = Vec::new();
            let t = median_us(
                || {
                    out = comm::broadcast(x, &devices)?;
                    Ok(())
                },
                w,
                iters,
            )?;
            let mut ok = out.len() == gpus && out[0].shares_storage(x);
            for (k, o) in out.iter().enumerate().skip(1) {
                ok &= o.device() == Device::Cuda(k) && same(o, x)?;
            }
            push("broadcast", bytes, numel, t, ok);
        }
        if has("scatter") {
            let mut out = Vec::new();
            let t = median_us(
                || {
                    out = comm::scatter(x, &devices, None, 0, None)?;
                    Ok(())
                },
                w,
                iters,
            )?;
            // torch.chunk's parts: fewer than the GPUs when they run out.
            let parts = numel.div_ceil(each);
            let mut ok = out.len() == parts && out[0].shares_storage(x);
            for (k, o) in out.iter().enumerate().skip(1) {
                let r = part(k);
                ok &= o.device() == Device::Cuda(k) && same(o, &x.narrow(0, r.start, r.len())?)?;
            }
            push("scatter", bytes, numel, t, ok);
        }
        if has("gather") {
            let parts = (0..gpus)
                .map(|k| ys[k].narrow(0, part(k).start, part(k).len()))
                .collect::<Result<Vec<_>>>()?;
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
                    let mut ok = v.len() == numel;
                    for (k, p) in parts.iter().enumerate() {
                        ok &= v[part(k)] == p.to_vec::<f32>()?[..];
                    }
                    ok
                }
                None => false,
            };
            push("gather", bytes, numel, t, ok);
        }
        if has("reduce_add") {
            let mut s = None;
            let t = median_us(
                || {
                    s = Some(comm::reduce_add(&ys, 0)?);
                    Ok(())
                },
                w,
                iters,
            )?;
            let ok = match &s {
                Some(s) => {
                    let mut want = vec![0f32; numel];
                    for y in &ys {
                        for (w, v) in want.iter_mut().zip(y.to_vec::<f32>()?) {
                            *w += v;
                        }
                    }
                    s.to_vec::<f32>()? == want
                }
                None => false,
            };
            push("reduce_add", bytes, numel, t, ok);
        }
    }
    if !has("broadcast_coalesced") {
        return Ok(());
    }
    let shapes = model_shapes();
    let params = shapes
        .iter()
        .enumerate()
        .map(|(i, s)| filled(s.iter().product(), s, i as u32, 0))
        .collect::<Result<Vec<_>>>()?;
    let total: usize = params.iter().map(Tensor::nbytes).sum();
    for &buffer in &args.buffers {
        if !reading.get() {
            break;
        }
        let mut out = Vec::new();
        let t = median_us(
            || {
                out = comm::broadcast_coalesced(&params, &devices, buffer)?;
                Ok(())
            },
            w,
            it,
        )?;
        let mut ok =
            out.len() == gpus && out[0].iter().zip(&params).all(|(o, p)| o.shares_storage(p));
        for (k, copies) in out.iter().enumerate().skip(1) {
            for (p, o) in params.iter().zip(copies) {
                ok &= o.device() == Device::Cuda(k) && !o.shares_storage(p) && same(o, p)?;
            }
        }
        push(&coalesced_name(buffer), total, params.len(), t, ok);
    }
    Ok(())
}

/// The row name of a broadcast_coalesced bucket size, as the PyTorch
/// script writes it: `broadcast_coalesced/25MiB` (KiB or B below 1 MiB).
pub fn coalesced_name(buffer: usize) -> String {
    if buffer >= 1 << 20 && buffer.is_multiple_of(1 << 20) {
        format!("broadcast_coalesced/{}MiB", buffer >> 20)
    } else if buffer >= 1 << 10 && buffer.is_multiple_of(1 << 10) {
        format!("broadcast_coalesced/{}KiB", buffer >> 10)
    } else {
        format!("broadcast_coalesced/{buffer}B")
    }
}

/// PyTorch's times by (op, bytes), timed on `gpus` GPUs: a row timed on
/// another count (its `gpus`; rows without one are from 2 GPUs) is a
/// [`Error::BadValue`], not a ratio against the wrong baseline.
pub fn read_torch(path: &std::path::Path, gpus: usize) -> Result<HashMap<(String, usize), f64>> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| Error::io(format!("reading {}", path.display()), e))?;
    let mut out = HashMap::new();
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        let v: serde_json::Value = serde_json::from_str(line).map_err(|e| Error::BadValue {
            name: "torch timings".into(),
            expected: "JSON lines {\"op\", \"bytes\", \"time_us\"}".into(),
            found: format!("{line:?} ({e})"),
        })?;
        let timed_on = v["gpus"].as_u64().unwrap_or(2) as usize;
        if timed_on != gpus {
            return Err(Error::BadValue {
                name: format!("torch timings {}", path.display()),
                expected: format!(
                    "rows timed on {gpus} GPUs (cuda_comm_torch.py --gpus {gpus}), as -n {gpus}"
                ),
                found: format!("a row timed on {timed_on} GPUs: {line}"),
            });
        }
        if let (Some(op), Some(bytes), Some(t)) =
            (v["op"].as_str(), v["bytes"].as_u64(), v["time_us"].as_f64())
        {
            out.insert((op.to_string(), bytes as usize), t);
        }
    }
    Ok(out)
}

/// `tensorcomm bench --backend cuda-comm`.
pub fn main(args: &BenchArgs) -> ExitCode {
    let ops = match selected_ops(&args.op) {
        Ok(ops) => ops,
        Err(msg) => {
            eprintln!("tensorcomm bench: {msg}");
            return ExitCode::from(2);
        }
    };
    let torch = match args
        .torch
        .as_deref()
        .map(|p| read_torch(p, args.nproc))
        .transpose()
    {
        Ok(t) => t,
        Err(e) => {
            eprintln!("tensorcomm bench: {e}");
            return ExitCode::FAILURE;
        }
    };
    let mut header = !args.json;
    let mut all_correct = true;
    // Until a write to it fails (`bench | head`).
    let mut stdout = Stdout::new(true);
    let mut emit = |row: Row| {
        if header {
            header = false;
            let copy = std::env::var("TENSORCOMM_CUDA_COPY").unwrap_or_else(|_| "auto".into());
            stdout.line(format_args!(
                "# tensorcomm bench: cuda-comm on cuda:0 to cuda:{} {}(TENSORCOMM_CUDA_COPY={copy}), median of {} iterations after {} warm-up",
                args.nproc.saturating_sub(1),
                if args.label.is_empty() { String::new() } else { format!("{} ", args.label) },
                args.iters,
                args.warmup
            ));
            stdout.line(format_args!("{}", Row::header_vs("torch")));
        }
        all_correct &= row.correct;
        let base = torch
            .as_ref()
            .and_then(|t| t.get(&(row.op.clone(), row.size)).copied());
        if args.json {
            stdout.line(format_args!("{}", row.json_vs(base)));
        } else {
            stdout.line(format_args!("{}", row.text_vs(base)));
        }
        stdout.is_open()
    };
    let result = run(args, &ops, &mut emit);
    if !header && !args.json {
        stdout.line(format_args!(
            "# algbw, busbw in GB/s; ratio = tensorcomm time / PyTorch time (lower is better)"
        ));
    }
    match result {
        Ok(()) if all_correct => ExitCode::SUCCESS,
        Ok(()) => {
            eprintln!("tensorcomm bench: some results were WRONG");
            ExitCode::FAILURE
        }
        Err(e) => {
            eprintln!("tensorcomm bench: {e}");
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
    fn ops_are_checked_by_name() {
        assert_eq!(selected_ops(&[]).unwrap(), OPS);
        let asked = ["gather".to_string(), "peer_copy".to_string()];
        assert_eq!(selected_ops(&asked).unwrap(), ["gather", "peer_copy"]);
        let err = selected_ops(&["all_reduce".to_string()]).unwrap_err();
        assert!(err.contains("not a cuda-comm op"), "{err}");
    }

    #[test]
    fn coalesced_rows_are_named_like_the_torch_script() {
        assert_eq!(coalesced_name(25 << 20), "broadcast_coalesced/25MiB");
        assert_eq!(coalesced_name(1 << 20), "broadcast_coalesced/1MiB");
        assert_eq!(coalesced_name(512 << 10), "broadcast_coalesced/512KiB");
        assert_eq!(coalesced_name(1000), "broadcast_coalesced/1000B");
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
        let t = read_torch(&p, 2).unwrap();
        assert_eq!(t.get(&("broadcast".to_string(), 1024)), Some(&33.5));
        // Rows say how many GPUs they were timed on; another count is refused.
        std::fs::write(
            &p,
            "{\"op\": \"broadcast\", \"bytes\": 1024, \"time_us\": 40.0, \"gpus\": 4}\n",
        )
        .unwrap();
        assert_eq!(read_torch(&p, 4).unwrap().len(), 1);
        match read_torch(&p, 2) {
            Err(e @ Error::BadValue { .. }) => {
                assert!(e.to_string().contains("timed on 4 GPUs"), "{e}")
            }
            other => panic!("{other:?}"),
        }
        assert!(read_torch(&p, 8).is_err());
        std::fs::write(&p, "not json\n").unwrap();
        assert!(matches!(read_torch(&p, 2), Err(Error::BadValue { .. })));
    }
}
