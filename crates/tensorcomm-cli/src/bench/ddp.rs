//! `tensorcomm bench --op ddp`: a simulated backward pass through the DDP
//! [`Reducer`].
//!
//! Each rank holds the gradients of a model (`--model mlp`: six 2048x2048
//! layers and a 2048x10 head, 25.2M parameters; `resnet50`: ResNet-50's
//! 161 parameter tensors, 25.6M; or a comma list of element counts, one
//! 1-D parameter per layer). A step walks the layers backwards: it spins
//! `--compute-us` µs (the layer's backward compute, on this rank's core),
//! then marks the layer's gradients ready, so the Reducer starts each
//! bucket's hook (`--hook`) as its last gradient arrives, then calls
//! `finish()`. Per step it measures the step time; the communication time
//! (`comm_us`: how long at least one bucket's hook was in flight, from its
//! start to its result's arrival, the union of those spans); the exposed
//! communication (`exposed_us`: the part of that union after the last
//! layer's compute ended, which the backward pass could not hide); and
//! the tail (`tail_us`: from the end of the last layer's compute to
//! `finish()` returning, which also holds marking that layer's gradients
//! ready and writing the averaged gradients back, as the no-op hook's
//! row shows). Ranks start
//! each step together (a barrier, untimed). The row gives each measure's
//! median over `--iters` steps after `--warmup` (the first step also
//! rebuilds the buckets), the slowest rank's.
//!
//! `--grad-as-bucket-view` runs the Reducer with `gradient_as_bucket_view`
//! and the backward writing into the buckets, as PyTorch DDP's
//! `gradient_as_bucket_view=True` does: at each step's start the rank
//! fetches every parameter's bucket view (`Reducer::gradient`); each
//! layer's backward writes its gradients' values there (the values the
//! copying mode hands over: a fill of 1.0 on the host, a device-to-device
//! copy on a GPU), which counts inside its `--compute-us` (it spins only
//! what is left of it, as a real backward's output write is part of its
//! compute; a write longer than that takes its own time), then marks them
//! ready with the views: no copy in, none back in `finish()`.
//!
//! `--device cuda` makes the gradients CUDA tensors on the rank's GPU
//! (`LOCAL_RANK` modulo the GPU count), so the buckets, the hooks'
//! messages and the write-back live there (the hooks' element-wise maths
//! makes a round trip through host memory): with `--backend cpu` the CPU
//! group stages them through pinned host memory (ranks may share a GPU),
//! with `--backend nccl` NCCL reduces them (one GPU per rank). `finish()`
//! blocks the host until the device work is done, so the step and tail
//! include it.
//!
//! `bench/compare_ddp.py` runs it beside PyTorch DDP over Gloo training
//! the real MLP (`bench/ddp_torch.py`), with the simulated compute set from
//! PyTorch's world-size-1 step.

use std::ffi::OsString;
use std::process::ExitCode;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use tensorcomm::cpu::transport::{TransportChoice, TRANSPORT_ENV};
use tensorcomm::ddp::{
    AllReduceHook, CommHook, CompressHook, GradBucket, NoOpHook, PowerSgdHook, PowerSgdOptions,
    Reducer, ReducerOptions, TensorSpec, DEFAULT_FIRST_BUCKET_BYTES,
};
use tensorcomm::group::WorkFuture;
use tensorcomm::tensor::{DType, Device, Tensor};
use tensorcomm::{init_process_group_with, Backend, InitOptions, ProcessGroup, ReduceOp};

use super::{BenchArgs, BenchBackend, BenchDevice};
use crate::stdout::Stdout;

/// The gradients of a model: layers (in forward order), each a list of
/// parameter shapes.
#[derive(Clone, Debug, PartialEq)]
pub(super) struct Model {
    pub name: String,
    pub layers: Vec<Vec<Vec<usize>>>,
}

impl Model {
    /// `mlp`, `resnet50`, or a comma list of element counts (suffixes K,
    /// M, G: binary).
    pub fn parse(s: &str) -> Result<Model, String> {
        match s {
            "mlp" => Ok(Model::mlp()),
            "resnet50" => Ok(Model::resnet50()),
            list => {
                let layers = list
                    .split(',')
                    .map(|n| match tensorcomm::tuning::parse_size(n.trim()) {
                        Some(n) if n > 0 => Ok(vec![vec![n]]),
                        _ => Err(format!(
                            "--model: expected mlp, resnet50 or a comma list of element counts above 0 (such as 1M,4K), found {s:?}"
                        )),
                    })
                    .collect::<Result<Vec<_>, String>>()?;
                Ok(Model {
                    name: "custom".into(),
                    layers,
                })
            }
        }
    }

    /// Six 2048x2048 linear layers and a 2048x10 head, with biases.
    fn mlp() -> Model {
        let mut layers: Vec<Vec<Vec<usize>>> =
            (0..6).map(|_| vec![vec![2048, 2048], vec![2048]]).collect();
        layers.push(vec![vec![10, 2048], vec![10]]);
        Model {
            name: "mlp".into(),
            layers,
        }
    }

    /// ResNet-50 (torchvision): each convolution with its batch norm's
    /// weight and bias is a layer, and the final fully connected layer.
    fn resnet50() -> Model {
        fn conv_bn(out: usize, inp: usize, k: usize) -> Vec<Vec<usize>> {
            vec![vec![out, inp, k, k], vec![out], vec![out]]
        }
        let mut layers = vec![conv_bn(64, 3, 7)];
        let mut inp = 64;
        for (width, blocks) in [(64, 3), (128, 4), (256, 6), (512, 3)] {
            for b in 0..blocks {
                layers.push(conv_bn(width, inp, 1));
                layers.push(conv_bn(width, width, 3));
                layers.push(conv_bn(4 * width, width, 1));
                if b == 0 {
                    layers.push(conv_bn(4 * width, inp, 1)); // downsample
                }
                inp = 4 * width;
            }
        }
        layers.push(vec![vec![1000, 2048], vec![1000]]);
        Model {
            name: "resnet50".into(),
            layers,
        }
    }

    /// Every parameter's shape, in model order.
    pub fn shapes(&self) -> Vec<Vec<usize>> {
        self.layers.iter().flatten().cloned().collect()
    }

    pub fn numel(&self) -> usize {
        self.shapes()
            .iter()
            .map(|s| s.iter().product::<usize>())
            .sum()
    }
}

/// The backends and devices `--op ddp` runs on: `--backend cpu` with
/// `--device cpu` or `cuda`, `--backend nccl` with `--device cuda`.
fn check_placement(args: &BenchArgs) -> Result<(), String> {
    match (args.backend, args.device) {
        _ if args.symmetric => Err("--op ddp: expected no --symmetric".into()),
        (BenchBackend::Cpu, _) | (BenchBackend::Nccl, BenchDevice::Cuda) => Ok(()),
        (BenchBackend::Nccl, BenchDevice::Cpu) => Err(
            "--op ddp --backend nccl: expected --device cuda (NCCL takes only CUDA tensors)"
                .into(),
        ),
        _ => Err(
            "--op ddp: expected --backend cpu (with --device cpu or cuda) or --backend nccl --device cuda"
                .into(),
        ),
    }
}

/// Before starting ranks here: `--device cuda` needs a GPU, and
/// `--backend nccl` one per rank (`-n`).
fn gpus_for_ranks(args: &BenchArgs) -> Result<(), String> {
    if args.device != BenchDevice::Cuda {
        return Ok(());
    }
    let gpus =
        tensorcomm::cuda::runtime::device_count().map_err(|e| format!("--device cuda: {e}"))?;
    if gpus == 0 {
        return Err("--device cuda: this machine has no GPU".into());
    }
    if args.backend == BenchBackend::Nccl && args.nproc > gpus {
        return Err(format!(
            "--op ddp --backend nccl: expected one GPU per rank, found -n {} and {gpus} GPU(s); use -n {gpus} or less, or --backend cpu (its ranks may share a GPU)",
            args.nproc
        ));
    }
    Ok(())
}

/// This rank's device and group: the CPU group, or a NCCL group on its
/// GPU, refusing more ranks on this node than GPUs (NCCL cannot put two
/// ranks on one GPU).
fn device_and_group(args: &BenchArgs) -> tensorcomm::Result<(Device, Arc<dyn ProcessGroup>)> {
    let device = super::bench_device(args.device)?;
    let mut options = InitOptions::default();
    let backend = match args.backend {
        BenchBackend::Nccl => {
            let gpus = tensorcomm::cuda::runtime::device_count()?;
            let local_ranks = std::env::var("LOCAL_WORLD_SIZE")
                .ok()
                .and_then(|v| v.parse::<usize>().ok())
                .unwrap_or(1);
            if local_ranks > gpus {
                return Err(tensorcomm::Error::InvalidArgument(format!(
                    "--op ddp --backend nccl: expected one GPU per rank, found {local_ranks} ranks on this node and {gpus} GPU(s); use -n {gpus} or less, or --backend cpu (its ranks may share a GPU)"
                )));
            }
            Backend::Nccl
        }
        _ => Backend::Cpu,
    };
    if let Device::Cuda(gpu) = device {
        options.device = Some(gpu);
    }
    Ok((
        device,
        init_process_group_with(backend, "env://", &options)?,
    ))
}

/// The hooks `--hook` names.
pub(super) fn build_hook(name: &str, powersgd_rank: usize) -> Result<Arc<dyn CommHook>, String> {
    Ok(match name {
        "allreduce" => Arc::new(AllReduceHook),
        "fp16" => Arc::new(CompressHook::fp16()),
        "bf16" => Arc::new(CompressHook::bf16()),
        "noop" => Arc::new(NoOpHook),
        "powersgd" => Arc::new(
            PowerSgdHook::new(PowerSgdOptions {
                matrix_approximation_rank: powersgd_rank,
                start_power_sgd_iter: 2,
                ..PowerSgdOptions::default()
            })
            .map_err(|e| e.to_string())?,
        ),
        other => {
            return Err(format!(
                "--hook: expected allreduce, fp16, bf16, powersgd or noop, found {other:?}"
            ))
        }
    })
}

pub(super) fn main(args: &BenchArgs) -> ExitCode {
    let checked = Model::parse(&args.model).and_then(|_| {
        build_hook(&args.hook, args.powersgd_rank)?;
        check_placement(args)?;
        if args.iters == 0 {
            return Err("expected --iters >= 1".into());
        }
        Ok(())
    });
    if let Err(msg) = checked {
        eprintln!("tensorcomm bench: {msg}");
        return ExitCode::from(2);
    }
    if std::env::var_os("RANK").is_none() {
        if let Err(msg) = gpus_for_ranks(args) {
            eprintln!("tensorcomm bench: {msg}");
            return ExitCode::from(2);
        }
        return launch_self(args);
    }
    match run_rank(args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            let rank = std::env::var("RANK").unwrap_or_default();
            eprintln!("tensorcomm bench failed on rank {rank}: {err}");
            ExitCode::FAILURE
        }
    }
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
        "--op=ddp".into(),
        format!("--model={}", args.model),
        format!("--hook={}", args.hook),
        format!("--compute-us={}", args.compute_us),
        format!("--bucket-cap={}", args.bucket_cap),
        format!("--powersgd-rank={}", args.powersgd_rank),
        format!("--iters={}", args.iters),
        format!("--warmup={}", args.warmup),
    ];
    if args.grad_as_bucket_view {
        rank_args.push("--grad-as-bucket-view".into());
    }
    if let Some(threads) = args.copy_threads {
        rank_args.push(format!("--copy-threads={threads}"));
    }
    if args.backend == BenchBackend::Nccl {
        rank_args.push("--backend=nccl".into());
    }
    if args.device == BenchDevice::Cuda {
        rank_args.push("--device=cuda".into());
    }
    if args.json {
        rank_args.push("--json".into());
    }
    if let Some(transport) = args.transport {
        rank_args.push(format!("--transport={transport}"));
    }
    let rank_args: Vec<OsString> = rank_args.into_iter().map(OsString::from).collect();
    crate::launch::launch_local_with(&exe, &rank_args, args.nproc, None, &[], false)
}

/// When each bucket's hook started and when its result was known, in one
/// step.
#[derive(Default)]
struct Timeline {
    /// Per bucket index: the hook's start and its result's arrival.
    spans: Vec<(Instant, Option<Instant>)>,
}

impl Timeline {
    /// How long, from `from` on, at least one bucket's communication was
    /// in flight (the union of the hooks' spans, clipped to start at
    /// `from`). A span still open counts up to `until`.
    fn busy_after(&self, from: Instant, until: Instant) -> Duration {
        let mut spans: Vec<(Instant, Instant)> = self
            .spans
            .iter()
            .map(|&(a, b)| (a.max(from), b.unwrap_or(until).max(from)))
            .collect();
        spans.sort();
        let (mut total, mut reach) = (Duration::ZERO, from);
        for (a, b) in spans {
            let a = a.max(reach);
            if b > a {
                total += b - a;
                reach = b;
            }
        }
        total
    }
}

/// Runs the inner hook and notes when each bucket's hook starts and when
/// its result is known.
struct TimedHook {
    inner: Arc<dyn CommHook>,
    timeline: Arc<Mutex<Timeline>>,
}

impl CommHook for TimedHook {
    fn run(
        &self,
        group: &Arc<dyn ProcessGroup>,
        bucket: GradBucket,
    ) -> tensorcomm::Result<WorkFuture<Tensor<'static>>> {
        let slot = {
            let mut t = self.timeline.lock().unwrap_or_else(PoisonError::into_inner);
            t.spans.push((Instant::now(), None));
            t.spans.len() - 1
        };
        let timeline = self.timeline.clone();
        Ok(self.inner.run(group, bucket)?.then(move |value| {
            let now = Instant::now();
            let mut t = timeline.lock().unwrap_or_else(PoisonError::into_inner);
            t.spans[slot].1 = Some(now);
            value
        }))
    }
}

/// Busy-waits `us` µs: backward compute occupying this rank's core.
fn spin(us: u64) {
    let end = Instant::now() + Duration::from_micros(us);
    while Instant::now() < end {
        std::hint::spin_loop();
    }
}

/// Writes a gradient's values into its bucket view `view`, as a backward
/// pass writes its output: on the host a fill with the copying mode's
/// value (1.0), on a GPU a device-to-device copy of `values`.
fn write_gradient(view: &Tensor<'static>, values: &Tensor<'static>) -> tensorcomm::Result<()> {
    match view.device() {
        Device::Cpu => view.fill(1.0f32),
        Device::Cuda(_) => view.copy_from(values),
    }
}

fn median(values: &mut [f64]) -> f64 {
    values.sort_by(f64::total_cmp);
    let n = values.len();
    if n % 2 == 1 {
        values[n / 2]
    } else {
        (values[n / 2 - 1] + values[n / 2]) / 2.0
    }
}

fn run_rank(args: &BenchArgs) -> tensorcomm::Result<()> {
    if let Some(transport) = args.transport {
        std::env::set_var(TRANSPORT_ENV, transport.to_string());
    }
    let transport = match args.backend {
        BenchBackend::Nccl => "nccl".to_string(),
        _ => TransportChoice::Env.resolve()?.to_string(),
    };
    let model = Model::parse(&args.model).map_err(tensorcomm::Error::InvalidArgument)?;
    let hook =
        build_hook(&args.hook, args.powersgd_rank).map_err(tensorcomm::Error::InvalidArgument)?;
    let (device, pg) = device_and_group(args)?;
    let (rank, ranks) = (pg.rank(), pg.size());
    let shapes = model.shapes();
    let grads: Vec<Tensor<'static>> = shapes
        .iter()
        .map(|s| Tensor::from_vec(vec![1.0f32; s.iter().product()], s)?.into_device(device))
        .collect::<tensorcomm::Result<_>>()?;
    let timeline = Arc::new(Mutex::new(Timeline::default()));
    let timed = Arc::new(TimedHook {
        inner: hook,
        timeline: timeline.clone(),
    });
    let options = ReducerOptions {
        bucket_cap_bytes: args.bucket_cap,
        first_bucket_bytes: DEFAULT_FIRST_BUCKET_BYTES.min(args.bucket_cap),
        gradient_as_bucket_view: args.grad_as_bucket_view,
        copy_threads: args
            .copy_threads
            .unwrap_or_else(tensorcomm::ddp::default_copy_threads)
            .max(1),
        ..ReducerOptions::default()
    };
    let copy_threads = options.copy_threads;
    let specs = shapes
        .iter()
        .map(|s| TensorSpec::new(s, DType::F32).on(device))
        .collect();
    let mut reducer = Reducer::new(pg.clone(), specs, timed, options)?;
    // Each layer's parameter indices.
    let mut first = 0;
    let layers: Vec<Vec<usize>> = model
        .layers
        .iter()
        .map(|l| {
            let ids = (first..first + l.len()).collect();
            first += l.len();
            ids
        })
        .collect();
    let (mut steps, mut comms, mut exposed, mut tails) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for it in 0..args.warmup + args.iters {
        pg.barrier(None)?.wait()?;
        *timeline.lock().unwrap_or_else(PoisonError::into_inner) = Timeline::default();
        let start = Instant::now();
        // When the last layer's compute ended (the tail starts there).
        let mut ready = start;
        if args.grad_as_bucket_view {
            // Before the backward pass: where each gradient goes (the
            // first finish() rebuilds the buckets, so every step).
            let views = (0..shapes.len())
                .map(|p| reducer.gradient(p))
                .collect::<tensorcomm::Result<Vec<_>>>()?;
            for layer in layers.iter().rev() {
                let began = Instant::now();
                for &p in layer.iter().rev() {
                    write_gradient(&views[p], &grads[p])?;
                }
                let written = began.elapsed().as_micros() as u64;
                spin(args.compute_us.saturating_sub(written));
                // The backward's compute ends here; what marking the
                // last layer ready costs is the Reducer's, so exposed.
                ready = Instant::now();
                for &p in layer.iter().rev() {
                    reducer.mark_ready(p, &views[p])?;
                }
            }
        } else {
            for layer in layers.iter().rev() {
                spin(args.compute_us);
                ready = Instant::now();
                for &p in layer.iter().rev() {
                    reducer.mark_ready(p, &grads[p])?;
                }
            }
        }
        reducer.finish()?;
        let end = Instant::now();
        if it >= args.warmup {
            let t = timeline.lock().unwrap_or_else(PoisonError::into_inner);
            let us = |d: Duration| d.as_secs_f64() * 1e6;
            steps.push(us(end - start));
            comms.push(us(t.busy_after(start, end)));
            exposed.push(us(t.busy_after(ready, end)));
            tails.push(us(end - ready));
        }
    }
    let slowest = Tensor::from_vec(
        vec![
            median(&mut steps),
            median(&mut comms),
            median(&mut exposed),
            median(&mut tails),
        ],
        &[4],
    )?
    .into_device(device)?;
    pg.all_reduce(&slowest, ReduceOp::Max, None)?
        .synchronize()?;
    let [step_us, comm_us, exposed_us, tail_us]: [f64; 4] = slowest
        .to_vec::<f64>()?
        .try_into()
        .map_err(|_| tensorcomm::Error::InvalidArgument("four medians".into()))?;
    // What the CPU run says is unchanged; a CUDA run says where.
    let on_transport = format!(" on {transport} transport");
    let (placement, json_placement) = match (args.backend, device) {
        (_, Device::Cpu) => (on_transport, String::new()),
        (BenchBackend::Nccl, Device::Cuda(_)) => (
            " over NCCL, CUDA gradients (one GPU per rank)".to_string(),
            ",\"backend\":\"nccl\",\"device\":\"cuda\"".to_string(),
        ),
        (_, Device::Cuda(gpu)) => (
            format!("{on_transport}, CUDA gradients (rank 0's on cuda:{gpu}) staged through the CPU group"),
            ",\"backend\":\"cpu\",\"device\":\"cuda\"".to_string(),
        ),
    };
    let (views_text, views_json) = if args.grad_as_bucket_view {
        (
            ", gradients written into their bucket views".to_string(),
            ",\"grad_as_bucket_view\":true".to_string(),
        )
    } else if device.is_cpu() {
        (
            format!(", gradients copied in and out on {copy_threads} thread(s) per rank"),
            format!(",\"copy_threads\":{copy_threads}"),
        )
    } else {
        (String::new(), String::new())
    };
    // Rank 0's stdout, until a write to it fails (`bench | head`). Its
    // lines come after every collective but the final barrier, so the
    // other ranks need not be told.
    let mut stdout = Stdout::new(rank == 0);
    if rank == 0 {
        let numel = model.numel();
        let buckets = reducer.bucket_indices().len();
        let compute_us = args.compute_us * layers.len() as u64;
        if args.json {
            stdout.line(format_args!(
                "{{\"op\":\"ddp\",\"model\":\"{}\",\"params\":{numel},\"tensors\":{},\"layers\":{},\"buckets\":{buckets},\"ranks\":{ranks},\"hook\":\"{}\",\"transport\":\"{transport}\",\"bucket_cap_bytes\":{},\"compute_us_per_layer\":{},\"compute_us\":{compute_us},\"iters\":{},\"step_us\":{step_us:.1},\"comm_us\":{comm_us:.1},\"exposed_us\":{exposed_us:.1},\"tail_us\":{tail_us:.1}{json_placement}{views_json}}}",
                model.name,
                shapes.len(),
                layers.len(),
                args.hook,
                args.bucket_cap,
                args.compute_us,
                args.iters,
            ));
        } else {
            stdout.line(format_args!(
                "# tensorcomm bench: ddp, model {} ({numel} f32 parameters in {} tensors, {} layers, {buckets} buckets of at most {} bytes), {} hook, {}{placement}{views_text}, {} µs compute per layer, medians of {} steps after {} warm-up, the slowest rank's",
                model.name,
                shapes.len(),
                layers.len(),
                args.bucket_cap,
                args.hook,
                super::rank_count(ranks),
                args.compute_us,
                args.iters,
                args.warmup
            ));
            stdout.line(format_args!(
                "{:>10} {:>12} {:>12} {:>12} {:>12} {:>12}",
                "params", "compute_us", "step_us", "comm_us", "exposed_us", "tail_us"
            ));
            stdout.line(format_args!(
                "{numel:>10} {compute_us:>12} {step_us:>12.1} {comm_us:>12.1} {exposed_us:>12.1} {tail_us:>12.1}"
            ));
        }
    }
    pg.barrier(None)?.wait()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn communication_time_is_the_union_of_the_hooks_spans_and_exposed_is_its_part_after_ready() {
        let t0 = Instant::now();
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        // Two overlapping spans (10-30, 20-40), one apart (50-60), one
        // still open at the end (70-).
        let timeline = Timeline {
            spans: vec![
                (at(20), Some(at(40))),
                (at(10), Some(at(30))),
                (at(50), Some(at(60))),
                (at(70), None),
            ],
        };
        let ms = |d: Duration| d.as_millis();
        assert_eq!(ms(timeline.busy_after(t0, at(80))), 30 + 10 + 10);
        // Ready at 35: 35-40, 50-60, 70-80.
        assert_eq!(ms(timeline.busy_after(at(35), at(80))), 5 + 10 + 10);
        assert_eq!(ms(timeline.busy_after(at(90), at(90))), 0);
        assert_eq!(ms(Timeline::default().busy_after(t0, at(80))), 0);
    }

    #[test]
    fn models_have_their_published_parameter_counts() {
        let mlp = Model::parse("mlp").unwrap();
        assert_eq!(mlp.numel(), 6 * (2048 * 2048 + 2048) + 2048 * 10 + 10);
        assert_eq!(mlp.numel(), 25_198_602);
        let resnet = Model::parse("resnet50").unwrap();
        // torchvision's resnet50: 25,557,032 parameters in 161 tensors.
        assert_eq!(resnet.numel(), 25_557_032);
        assert_eq!(resnet.shapes().len(), 161);
        let custom = Model::parse("1K,3").unwrap();
        assert_eq!(custom.shapes(), [vec![1024], vec![3]]);
        assert!(Model::parse("1K,0").unwrap_err().contains("comma list"));
        assert!(Model::parse("vgg").is_err());
    }

    #[test]
    fn medians_and_hooks() {
        assert_eq!(median(&mut [3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&mut [4.0, 1.0, 2.0, 3.0]), 2.5);
        for name in ["allreduce", "fp16", "bf16", "powersgd", "noop"] {
            assert!(build_hook(name, 1).is_ok(), "{name}");
        }
        let err = |name: &str, rank: usize| build_hook(name, rank).err().unwrap();
        assert!(err("powersgd", 0).contains("matrix_approximation_rank"));
        assert!(err("gzip", 1).contains("--hook"));
    }
}
