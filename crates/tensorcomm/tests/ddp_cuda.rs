//! Data-parallel training on CUDA gradients through the CPU group (staged
//! through pinned host memory): the Reducer with every built-in hook, and
//! the `ddp_mlp` example, give exactly the values they give on host
//! gradients. Ranks are threads of this process sharing cuda:0 (two ranks,
//! so every sum has two terms and its rounding does not depend on the
//! order). Each GPU test prints a line and returns when the machine has no
//! GPU; one test checks the error a machine without one gives.
#![cfg(feature = "cuda")]

mod common;
mod skip;

/// The `ddp_mlp` example, for its `train`.
#[path = "../examples/ddp_mlp.rs"]
mod ddp_mlp;

use std::sync::Arc;
use std::thread;

use tensorcomm::ddp::{
    AllReduceHook, CommHook, CompressHook, PowerSgdHook, PowerSgdOptions, QuantizePerTensorHook,
    Reducer, ReducerOptions, TensorSpec,
};
use tensorcomm::group::ProcessGroup;
use tensorcomm::store::HashStore;
use tensorcomm::tensor::{DType, Device, Tensor};
use tensorcomm::Error;

use skip::has_gpu;

const GPU: Device = Device::Cuda(0);

/// Runs `f` on each of two ranks (threads, CPU groups named `prefix`) at
/// once; results in rank order.
fn on_two_ranks<T: Send + 'static>(
    prefix: &str,
    f: impl Fn(Arc<dyn ProcessGroup>) -> T + Send + Sync + 'static,
) -> Vec<T> {
    let store = Arc::new(HashStore::new());
    let f = Arc::new(f);
    let handles: Vec<_> = common::groups(2, &store, prefix)
        .into_iter()
        .map(|pg| {
            let f = f.clone();
            thread::spawn(move || f(Arc::new(pg) as Arc<dyn ProcessGroup>))
        })
        .collect();
    handles.into_iter().map(|h| h.join().unwrap()).collect()
}

/// Builds a fresh hook (PowerSGD keeps state).
type MakeHook = fn() -> Arc<dyn CommHook>;

/// The hooks the tests compare, by name.
fn hooks() -> Vec<(&'static str, MakeHook)> {
    vec![
        ("allreduce", || Arc::new(AllReduceHook)),
        ("fp16", || Arc::new(CompressHook::fp16())),
        ("bf16", || Arc::new(CompressHook::bf16())),
        ("quantize", || Arc::new(QuantizePerTensorHook)),
        ("powersgd", || {
            Arc::new(
                PowerSgdHook::new(PowerSgdOptions {
                    matrix_approximation_rank: 1,
                    // Compressing from the second iteration on (without
                    // state carried across iterations, which needs 2).
                    start_power_sgd_iter: 1,
                    use_error_feedback: false,
                    warm_start: false,
                    min_compression_rate: 1.0,
                    ..PowerSgdOptions::default()
                })
                .unwrap(),
            )
        }),
    ]
}

/// Parameter shapes: a matrix PowerSGD compresses, a vector, another
/// matrix.
const SHAPES: [&[usize]; 3] = [&[6, 4], &[5], &[3, 8]];

/// Rank `rank`'s gradient of parameter `p` at iteration `it`: values that
/// differ between ranks, parameters and iterations, none exact in f16.
fn gradient(rank: usize, p: usize, it: usize) -> Vec<f32> {
    let n: usize = SHAPES[p].iter().product();
    (0..n)
        .map(|i| ((i * 7 + p * 13 + it * 3 + rank * 5) % 17) as f32 / 3.0 - 2.5)
        .collect()
}

/// Three iterations of a Reducer over `device` gradients with `hook` on
/// this rank; the last iteration leaves parameter 1 unused on rank 1.
/// Returns, per iteration, what `finish` wrote back into each gradient
/// given (read back on the host), and what the Reducer's bucket slots
/// hold.
type Seen = Vec<(Vec<f32>, Vec<f32>)>;

fn reduce_on(pg: Arc<dyn ProcessGroup>, device: Device, hook: Arc<dyn CommHook>) -> Seen {
    let rank = pg.rank();
    let specs = SHAPES
        .iter()
        .map(|s| TensorSpec::new(s, DType::F32).on(device))
        .collect();
    let options = ReducerOptions {
        // Parameter 2 alone, then 1 and 0 together.
        first_bucket_bytes: 96,
        bucket_cap_bytes: 200,
        find_unused_parameters: true,
        ..ReducerOptions::default()
    };
    let mut reducer = Reducer::new(pg, specs, hook, options).unwrap();
    let mut seen = Vec::new();
    for it in 0..3 {
        let unused = it == 2 && rank == 1;
        reducer
            .prepare_for_backward(if unused { &[1] } else { &[] })
            .unwrap();
        let mut grads = Vec::new();
        for p in (0..SHAPES.len()).rev() {
            if unused && p == 1 {
                continue;
            }
            let g = Tensor::from_vec(gradient(rank, p, it), SHAPES[p])
                .unwrap()
                .to_device(device)
                .unwrap();
            assert_eq!(g.device(), device);
            reducer.mark_ready(p, &g).unwrap();
            grads.push(g);
        }
        reducer.finish().unwrap();
        let mut written = Vec::new();
        for g in &grads {
            written.extend(g.to_vec::<f32>().unwrap());
        }
        let mut slots = Vec::new();
        for p in 0..SHAPES.len() {
            let slot = reducer.gradient(p).unwrap();
            assert_eq!(slot.device(), device, "parameter {p}'s bucket");
            slots.extend(slot.to_vec::<f32>().unwrap());
        }
        seen.push((written, slots));
    }
    seen
}

#[test]
fn the_reducer_gives_on_cuda_gradients_what_it_gives_on_host_gradients() {
    let name = "the_reducer_gives_on_cuda_gradients_what_it_gives_on_host_gradients";
    if !has_gpu(name) {
        return;
    }
    for (hook_name, hook) in hooks() {
        let host = on_two_ranks(&format!("host-{hook_name}"), move |pg| {
            reduce_on(pg, Device::Cpu, hook())
        });
        let cuda = on_two_ranks(&format!("cuda-{hook_name}"), move |pg| {
            reduce_on(pg, GPU, hook())
        });
        assert_eq!(cuda, host, "{hook_name} hook");
        // The hook averaged: the two ranks' gradients differ, their
        // averages agree, and the written-back gradients are the averages.
        for (it, (mine, theirs)) in cuda[0].iter().zip(&cuda[1]).enumerate() {
            assert_eq!(
                mine.1, theirs.1,
                "{hook_name}: ranks disagree at iteration {it}"
            );
        }
        let (written, slots) = &cuda[0][0];
        let own = gradient(0, 0, 0);
        assert_ne!(slots[..own.len()], own[..], "{hook_name}: not reduced");
        // Rank 0 gave parameters 2, 1, 0: the slots hold 0, 1, 2.
        let n2: usize = SHAPES[2].iter().product();
        assert_eq!(written[..n2], slots[slots.len() - n2..], "{hook_name}");
    }
}

#[test]
fn the_ddp_mlp_example_gives_the_host_run_s_losses_and_parameters_on_cuda() {
    let name = "the_ddp_mlp_example_gives_the_host_run_s_losses_and_parameters_on_cuda";
    if !has_gpu(name) {
        return;
    }
    for hook in [
        ddp_mlp::HookChoice::AllReduce,
        ddp_mlp::HookChoice::Fp16,
        ddp_mlp::HookChoice::PowerSgd,
    ] {
        let run = |device: Device| {
            let config = ddp_mlp::Config {
                steps: 12,
                batch: 16,
                hook,
                device,
                ..ddp_mlp::Config::default()
            };
            on_two_ranks(&format!("mlp-{hook:?}-{device}"), move |pg| {
                ddp_mlp::train(pg, &config).unwrap()
            })
        };
        let (host, cuda) = (run(Device::Cpu), run(GPU));
        for (h, c) in host.iter().zip(&cuda) {
            assert_eq!(c.losses, h.losses, "{hook:?}");
            assert_eq!(c.params, h.params, "{hook:?}");
        }
        assert!(
            cuda[0].losses[11] < cuda[0].losses[0],
            "{hook:?}: loss {:?}",
            cuda[0].losses
        );
    }
}

#[test]
fn without_a_gpu_a_reducer_over_cuda_parameters_is_refused_with_an_error() {
    if tensorcomm::cuda::runtime::device_count().is_ok_and(|n| n > 0) {
        skip::skipped(
            "without_a_gpu_a_reducer_over_cuda_parameters_is_refused_with_an_error",
            "this machine has a GPU",
        );
        return;
    }
    let results = on_two_ranks("no-gpu", |pg| {
        let specs = vec![TensorSpec::new(&[4], DType::F32).on(GPU)];
        Reducer::new(
            pg,
            specs,
            Arc::new(AllReduceHook),
            ReducerOptions::default(),
        )
        .err()
    });
    for err in results {
        let err = err.expect("a Reducer over CUDA parameters on a machine without a GPU");
        assert!(
            matches!(err, Error::NoCuda { .. } | Error::Cuda { .. }),
            "{err:?}"
        );
    }
}
