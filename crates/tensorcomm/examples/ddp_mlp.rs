//! Trains a small MLP data-parallel with the DDP [`Reducer`]: every rank
//! starts from rank 0's parameters (`broadcast_coalesced`), computes
//! gradients on its own shard of a synthetic regression task, and hands
//! each gradient to the Reducer as the backward pass produces it (last
//! layer first), so the first bucket's all-reduce runs while the first
//! layer's gradients are computed. Rank 0 prints the loss averaged over
//! every rank's batch at each step; each rank prints a checksum of its
//! final parameters, which agree.
//!
//! ```text
//! cargo build --release -p tensorcomm --example ddp_mlp
//! cargo run --release -p tensorcomm-cli -- run --nproc-per-node 2 -- \
//!     target/release/examples/ddp_mlp [--steps 50] [--hook allreduce|fp16|powersgd] \
//!     [--device cpu|cuda] [--backend cpu|nccl]
//! ```
//!
//! `--device cuda` hands the Reducer CUDA tensors on the rank's GPU
//! (`LOCAL_RANK` modulo the GPU count): each gradient is copied to the GPU
//! before `mark_ready`, the buckets and their communication live there,
//! and the averaged gradients are copied back for the SGD step. With
//! `--backend cpu` (the default) the CPU group carries the CUDA tensors
//! (ranks may share one GPU); `--backend nccl` needs one GPU per rank on
//! each node. Either way the losses and checksums are those of the CPU run.
//!
//! The maths (a 8-32-1 tanh MLP, mean squared error, plain SGD) is plain
//! Rust on `Vec<f32>` on the host: the example is about the data-parallel
//! plumbing.

use std::sync::Arc;

use tensorcomm::ddp::{
    broadcast_coalesced, AllReduceHook, CommHook, CompressHook, PowerSgdHook, PowerSgdOptions,
    Reducer, ReducerOptions, TensorSpec,
};
use tensorcomm::tensor::{Device, Tensor};
use tensorcomm::{Backend, Error, InitOptions, ProcessGroup, ReduceOp, Result};

const INPUTS: usize = 8;
const HIDDEN: usize = 32;

/// What to train and how.
#[derive(Clone, Debug)]
pub struct Config {
    /// SGD steps.
    pub steps: usize,
    /// Samples per rank per step.
    pub batch: usize,
    /// Learning rate.
    pub lr: f32,
    /// Which communication hook averages the gradients.
    pub hook: HookChoice,
    /// Where the gradients handed to the Reducer (and the loss reduced
    /// across ranks) live; the maths stays on the host.
    pub device: Device,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            steps: 50,
            batch: 64,
            lr: 0.1,
            hook: HookChoice::AllReduce,
            device: Device::Cpu,
        }
    }
}

/// The communication hooks the example can use.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HookChoice {
    AllReduce,
    Fp16,
    PowerSgd,
}

impl HookChoice {
    fn build(self) -> Result<Arc<dyn CommHook>> {
        Ok(match self {
            HookChoice::AllReduce => Arc::new(AllReduceHook),
            HookChoice::Fp16 => Arc::new(CompressHook::fp16()),
            HookChoice::PowerSgd => Arc::new(PowerSgdHook::new(PowerSgdOptions {
                // W1 (32x8) is sent as 2 x (32 + 8) numbers instead of 256.
                matrix_approximation_rank: 2,
                start_power_sgd_iter: 5,
                ..PowerSgdOptions::default()
            })?),
        })
    }
}

/// What a run of [`train`] gives on one rank.
#[derive(Clone, Debug)]
pub struct Trained {
    /// The loss of each step, averaged over every rank's batch (before the
    /// step's update).
    pub losses: Vec<f32>,
    /// The final parameters, flattened in model order.
    pub params: Vec<f32>,
}

/// The model: `y = W2 tanh(W1 x + b1) + b2`.
struct Mlp {
    w1: Tensor<'static>,
    b1: Tensor<'static>,
    w2: Tensor<'static>,
    b2: Tensor<'static>,
}

impl Mlp {
    /// Random initial values that differ between ranks (seeded by rank):
    /// broadcasting makes rank 0's the common start.
    fn new(rank: usize) -> Result<Mlp> {
        let mut rng = Lcg(0x5eed + rank as u64);
        let mut init = |n: usize, scale: f32| -> Vec<f32> {
            (0..n)
                .map(|_| (rng.uniform() * 2.0 - 1.0) * scale)
                .collect()
        };
        Ok(Mlp {
            w1: Tensor::from_vec(init(HIDDEN * INPUTS, 0.5), &[HIDDEN, INPUTS])?,
            b1: Tensor::from_vec(init(HIDDEN, 0.1), &[HIDDEN])?,
            w2: Tensor::from_vec(init(HIDDEN, 0.3), &[1, HIDDEN])?,
            b2: Tensor::from_vec(vec![0.0f32], &[1])?,
        })
    }

    fn tensors(&self) -> [&Tensor<'static>; 4] {
        [&self.w1, &self.b1, &self.w2, &self.b2]
    }
}

/// A small deterministic generator, so that every run sees the same data.
struct Lcg(u64);

impl Lcg {
    fn uniform(&mut self) -> f32 {
        self.0 = self
            .0
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        (self.0 >> 40) as f32 / (1u64 << 24) as f32
    }
}

/// The task: `t = sin(x · a) + 0.5 x0 x1` for inputs uniform in [-1, 1].
fn sample(rng: &mut Lcg) -> ([f32; INPUTS], f32) {
    let mut x = [0.0f32; INPUTS];
    x.iter_mut().for_each(|v| *v = rng.uniform() * 2.0 - 1.0);
    let dot: f32 = x
        .iter()
        .enumerate()
        .map(|(i, v)| v * (0.3 + 0.1 * i as f32))
        .sum();
    (x, dot.sin() + 0.5 * x[0] * x[1])
}

/// Trains on `group`: rank r draws its batches from its own stream.
pub fn train(group: Arc<dyn ProcessGroup>, config: &Config) -> Result<Trained> {
    let rank = group.rank();
    let device = config.device;
    let model = Mlp::new(rank)?;
    let tensors: Vec<Tensor<'static>> = model.tensors().into_iter().cloned().collect();
    // Rank 0's parameters to every rank, through copies on `device` (the
    // host tensors themselves on the host).
    let shared = tensors
        .iter()
        .map(|t| t.clone().into_device(device))
        .collect::<Result<Vec<_>>>()?;
    broadcast_coalesced(&*group, &shared, 1 << 20, 0)?;
    if device.is_cuda() {
        for (t, s) in tensors.iter().zip(&shared) {
            t.copy_from(s)?;
        }
    }
    let specs = tensors
        .iter()
        .map(|t| TensorSpec::of(t).on(device))
        .collect();
    let options = ReducerOptions {
        // W1 in a bucket of its own, the rest in a first, small one.
        first_bucket_bytes: 512,
        bucket_cap_bytes: 512,
        ..ReducerOptions::default()
    };
    let mut reducer = Reducer::new(group.clone(), specs, config.hook.build()?, options)?;
    let mut data = Lcg(1_000 + rank as u64);
    let mut losses = Vec::with_capacity(config.steps);
    for _ in 0..config.steps {
        let batch: Vec<_> = (0..config.batch).map(|_| sample(&mut data)).collect();
        let loss = step(&model, &batch, &mut reducer, device)?;
        // The loss over every rank's batch.
        let global =
            Tensor::from_vec(vec![loss / group.size() as f32], &[1])?.into_device(device)?;
        group
            .all_reduce(&global, ReduceOp::Sum, None)?
            .synchronize()?;
        losses.push(global.to_vec::<f32>()?[0]);
        // SGD on the host, on the averaged gradients the Reducer left in
        // its buckets (copied back from the GPU with `--device cuda`).
        for (p, param) in tensors.iter().enumerate() {
            let grad = reducer.gradient(p)?.to_vec::<f32>()?;
            let updated: Vec<f32> = param
                .to_vec::<f32>()?
                .iter()
                .zip(&grad)
                .map(|(w, g)| w - config.lr * g)
                .collect();
            param.copy_from(&Tensor::from_vec(updated, param.shape())?)?;
        }
    }
    let mut params = Vec::new();
    for t in &tensors {
        params.extend(t.to_vec::<f32>()?);
    }
    Ok(Trained { losses, params })
}

/// One forward and backward pass over `batch`; hands the gradients to the
/// Reducer (as tensors on `device`) as they are produced and waits for the
/// averages. Returns this rank's mean loss.
fn step(
    model: &Mlp,
    batch: &[([f32; INPUTS], f32)],
    reducer: &mut Reducer,
    device: Device,
) -> Result<f32> {
    let grad =
        |values: Vec<f32>, shape: &[usize]| Tensor::from_vec(values, shape)?.into_device(device);
    let (w1, b1) = (model.w1.to_vec::<f32>()?, model.b1.to_vec::<f32>()?);
    let (w2, b2) = (model.w2.to_vec::<f32>()?, model.b2.to_vec::<f32>()?[0]);
    let n = batch.len() as f32;
    let mut hidden = Vec::with_capacity(batch.len());
    let mut residuals = Vec::with_capacity(batch.len());
    let mut loss = 0.0f32;
    for (x, t) in batch {
        let h: Vec<f32> = (0..HIDDEN)
            .map(|j| {
                let z: f32 = (0..INPUTS).map(|i| w1[j * INPUTS + i] * x[i]).sum();
                (z + b1[j]).tanh()
            })
            .collect();
        let y: f32 = h.iter().zip(&w2).map(|(h, w)| h * w).sum::<f32>() + b2;
        loss += 0.5 * (y - t) * (y - t) / n;
        residuals.push((y - t) / n);
        hidden.push(h);
    }
    // Backward, last layer first: its bucket starts reducing at once.
    let mut gw2 = vec![0.0f32; HIDDEN];
    let gb2: f32 = residuals.iter().sum();
    for (h, r) in hidden.iter().zip(&residuals) {
        gw2.iter_mut().zip(h).for_each(|(g, h)| *g += r * h);
    }
    reducer.mark_ready(3, &grad(vec![gb2], &[1])?)?;
    reducer.mark_ready(2, &grad(gw2, &[1, HIDDEN])?)?;
    let mut gw1 = vec![0.0f32; HIDDEN * INPUTS];
    let mut gb1 = vec![0.0f32; HIDDEN];
    for ((x, _), (h, r)) in batch.iter().zip(hidden.iter().zip(&residuals)) {
        for j in 0..HIDDEN {
            let dz = r * w2[j] * (1.0 - h[j] * h[j]);
            gb1[j] += dz;
            for i in 0..INPUTS {
                gw1[j * INPUTS + i] += dz * x[i];
            }
        }
    }
    reducer.mark_ready(1, &grad(gb1, &[HIDDEN])?)?;
    reducer.mark_ready(0, &grad(gw1, &[HIDDEN, INPUTS])?)?;
    reducer.finish()?;
    Ok(loss)
}

/// Where the gradients go, as `--device` names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum DeviceChoice {
    Cpu,
    Cuda,
}

/// The command line: the training [`Config`] (its device still the host),
/// `--device` and `--backend`.
struct Args {
    config: Config,
    device: DeviceChoice,
    backend: Backend,
}

/// `--steps N`, `--hook allreduce|fp16|powersgd`, `--device cpu|cuda`,
/// `--backend cpu|nccl`.
fn parse_args() -> Result<Args> {
    let mut parsed = Args {
        config: Config::default(),
        device: DeviceChoice::Cpu,
        backend: Backend::Cpu,
    };
    let mut args = std::env::args().skip(1);
    let bad = |name: &str, expected: &str, found: String| Error::BadValue {
        name: name.into(),
        expected: expected.into(),
        found,
    };
    while let Some(arg) = args.next() {
        let value = args.next().unwrap_or_default();
        match arg.as_str() {
            "--steps" => {
                parsed.config.steps = value
                    .parse()
                    .map_err(|_| bad("--steps", "a number of steps", value))?
            }
            "--hook" => {
                parsed.config.hook = match value.as_str() {
                    "allreduce" => HookChoice::AllReduce,
                    "fp16" => HookChoice::Fp16,
                    "powersgd" => HookChoice::PowerSgd,
                    _ => return Err(bad("--hook", "allreduce, fp16 or powersgd", value)),
                }
            }
            "--device" => {
                parsed.device = match value.as_str() {
                    "cpu" => DeviceChoice::Cpu,
                    "cuda" => DeviceChoice::Cuda,
                    _ => return Err(bad("--device", "cpu or cuda", value)),
                }
            }
            "--backend" => {
                parsed.backend = match value.as_str() {
                    "cpu" => Backend::Cpu,
                    "nccl" => Backend::Nccl,
                    _ => return Err(bad("--backend", "cpu or nccl", value)),
                }
            }
            _ => {
                return Err(bad(
                    "argument",
                    "--steps N, --hook NAME, --device cpu|cuda or --backend cpu|nccl",
                    arg,
                ))
            }
        }
    }
    if parsed.backend == Backend::Nccl && parsed.device != DeviceChoice::Cuda {
        return Err(bad(
            "--backend",
            "cpu, or nccl together with --device cuda (NCCL takes only CUDA tensors)",
            "nccl".into(),
        ));
    }
    Ok(parsed)
}

/// A launcher variable as a number, `default` when unset.
fn env_number(name: &str, default: usize) -> Result<usize> {
    match std::env::var(name) {
        Err(_) => Ok(default),
        Ok(v) => v.parse().map_err(|_| Error::BadValue {
            name: name.into(),
            expected: "a number".into(),
            found: v,
        }),
    }
}

/// This rank's GPU for `--device cuda`: `LOCAL_RANK` modulo the GPU count.
/// With NCCL every rank of the node needs its own (NCCL refuses two ranks
/// on one GPU): an error when `LOCAL_WORLD_SIZE` exceeds the GPU count.
#[cfg(feature = "cuda")]
fn rank_gpu(backend: Backend) -> Result<usize> {
    let gpus = tensorcomm::cuda::runtime::device_count()?;
    if gpus == 0 {
        return Err(Error::NoCuda {
            reason: "--device cuda: this machine has no GPU".into(),
        });
    }
    let local_ranks = env_number("LOCAL_WORLD_SIZE", 1)?;
    if backend == Backend::Nccl && local_ranks > gpus {
        return Err(Error::InvalidArgument(format!(
            "--backend nccl: expected one GPU per rank, found {local_ranks} ranks on this node and {gpus} GPU(s); \
             start at most {gpus} ranks per node, or use --backend cpu (its ranks may share a GPU)"
        )));
    }
    Ok(env_number("LOCAL_RANK", 0)? % gpus)
}

#[cfg(not(feature = "cuda"))]
fn rank_gpu(_backend: Backend) -> Result<usize> {
    Err(Error::NoCuda {
        reason: "--device cuda: tensorcomm was built without its `cuda` feature".into(),
    })
}

#[allow(dead_code)] // the ddp tests include this file for `train`
fn main() -> std::process::ExitCode {
    match run() {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("ddp_mlp: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}

#[allow(dead_code)]
fn run() -> Result<()> {
    let Args {
        mut config,
        device,
        backend,
    } = parse_args()?;
    let mut options = InitOptions::default();
    if device == DeviceChoice::Cuda {
        let gpu = rank_gpu(backend)?;
        config.device = Device::Cuda(gpu);
        options.device = Some(gpu);
    }
    let group = tensorcomm::init_process_group_with(backend, "env://", &options)?;
    let rank = group.rank();
    if rank == 0 {
        println!(
            "# ddp_mlp: {} ranks, {} backend, gradients on {}, {:?} hook",
            group.size(),
            if backend == Backend::Nccl {
                "nccl"
            } else {
                "cpu"
            },
            config.device,
            config.hook
        );
    }
    let trained = train(group, &config)?;
    if rank == 0 {
        for (s, loss) in trained.losses.iter().enumerate() {
            println!("step {s:3} loss {loss:.6}");
        }
    }
    let checksum: f64 = trained.params.iter().map(|&p| f64::from(p)).sum();
    println!("rank {rank}: final parameter checksum {checksum:.9}");
    Ok(())
}
