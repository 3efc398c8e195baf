//! Data-parallel training across ranks (threads, CPU backend):
//! broadcast_coalesced, the communication hooks' numerics, the Reducer's
//! parameter check, unused parameters, training equivalence with
//! single-process training, and PowerSGD.

mod common;

/// The `ddp_mlp` example, for its `train`.
#[path = "../examples/ddp_mlp.rs"]
mod ddp_mlp;

use std::sync::Arc;
use std::thread;

use half::{bf16, f16};
use tensorcomm::ddp::{
    broadcast_coalesced, AllReduceHook, CommHook, CompressHook, GradBucket, PowerSgdHook,
    PowerSgdOptions, QuantizePerTensorHook, Reducer, ReducerOptions, TensorSpec,
};
use tensorcomm::group::ProcessGroup;
use tensorcomm::store::HashStore;
use tensorcomm::tensor::{DType, Tensor};
use tensorcomm::Error;

/// One group per rank, as `Arc<dyn ProcessGroup>`.
fn ranks(world: usize, prefix: &str) -> Vec<Arc<dyn ProcessGroup>> {
    let store = Arc::new(HashStore::new());
    common::groups(world, &store, prefix)
        .into_iter()
        .map(|pg| Arc::new(pg) as Arc<dyn ProcessGroup>)
        .collect()
}

/// Runs `f` on every rank at once; results in rank order.
fn on_ranks<T: Send + 'static>(
    pgs: Vec<Arc<dyn ProcessGroup>>,
    f: impl Fn(Arc<dyn ProcessGroup>) -> T + Send + Sync + 'static,
) -> Vec<T> {
    let f = Arc::new(f);
    let handles: Vec<_> = pgs
        .into_iter()
        .map(|pg| {
            let f = f.clone();
            thread::spawn(move || f(pg))
        })
        .collect();
    handles.into_iter().map(|h| h.join().unwrap()).collect()
}

#[test]
fn broadcast_coalesced_copies_mixed_dtypes_from_the_root() {
    let results = on_ranks(ranks(3, "bc"), |pg| {
        let rank = pg.rank();
        let scale = if rank == 1 { 1.0 } else { 0.0 };
        let tensors = vec![
            Tensor::from_vec((0..5).map(|i| i as f32 * scale).collect(), &[5]).unwrap(),
            Tensor::from_vec(
                (0..3).map(|i| (i * 100) as i64 * scale as i64).collect(),
                &[3],
            )
            .unwrap(),
            Tensor::from_vec(
                (0..4).map(|i| f16::from_f32(i as f32 * scale)).collect(),
                &[2, 2],
            )
            .unwrap(),
            Tensor::zeros(&[0], DType::U8).unwrap(),
            Tensor::from_vec((0..7).map(|i| -(i as f32) * scale).collect(), &[7]).unwrap(),
            Tensor::from_vec(
                (0..3).map(|i| bf16::from_f32(i as f32 * scale)).collect(),
                &[3],
            )
            .unwrap(),
        ];
        // 16-byte buckets: several per dtype, more than two in flight.
        broadcast_coalesced(&*pg, &tensors, 16, 1).unwrap();
        (
            tensors[0].to_vec::<f32>().unwrap(),
            tensors[1].to_vec::<i64>().unwrap(),
            tensors[2].to_vec::<f16>().unwrap(),
            tensors[4].to_vec::<f32>().unwrap(),
            tensors[5].to_vec::<bf16>().unwrap(),
        )
    });
    for (f, i, h, neg, b) in results {
        assert_eq!(f, [0.0, 1.0, 2.0, 3.0, 4.0]);
        assert_eq!(i, [0, 100, 200]);
        assert_eq!(h, [0.0f32, 1.0, 2.0, 3.0].map(f16::from_f32));
        assert_eq!(neg, [0.0, -1.0, -2.0, -3.0, -4.0, -5.0, -6.0]);
        assert_eq!(b, [0.0f32, 1.0, 2.0].map(bf16::from_f32));
    }
}

/// Runs `hook` on a one-gradient bucket holding `values(rank)` on every
/// rank; the reduced f32 values of each rank.
fn run_hook(
    world: usize,
    prefix: &str,
    hook: Arc<dyn CommHook>,
    values: fn(usize) -> Vec<f32>,
) -> Vec<Vec<f32>> {
    on_ranks(ranks(world, prefix), move |pg| {
        let v = values(pg.rank());
        let n = v.len();
        let buffer = Tensor::from_vec(v, &[n]).unwrap();
        let bucket = GradBucket::new(0, 1, buffer.clone(), vec![vec![n]], vec![0]).unwrap();
        let out = hook.run(&pg, bucket).unwrap().wait().unwrap();
        assert_eq!(out.dtype(), DType::F32);
        // The result is written into the bucket's own buffer.
        assert_eq!(
            buffer.to_vec::<f32>().unwrap(),
            out.to_vec::<f32>().unwrap()
        );
        out.to_vec::<f32>().unwrap()
    })
}

#[test]
fn all_reduce_hook_divides_then_sums() {
    // Multiples of 3 divide exactly by 3, so the sum is exact in any order.
    let values = |r: usize| (0..6).map(|i| (3 * (i + 2 * r)) as f32).collect();
    let want: Vec<f32> = (0..6)
        .map(|i| (0..3).map(|r| (3 * (i + 2 * r)) as f32 / 3.0).sum())
        .collect();
    for got in run_hook(3, "hook-ar", Arc::new(AllReduceHook), values) {
        assert_eq!(got, want);
    }
}

/// What an f16/bf16 compression hook gives on two ranks: each value cast,
/// halved in the low precision, summed in the low precision (two terms:
/// any order gives the same rounding), cast back.
fn compressed_reference<T>(
    values: fn(usize) -> Vec<f32>,
    from: fn(f32) -> T,
    to: fn(T) -> f32,
) -> Vec<f32> {
    let (a, b) = (values(0), values(1));
    a.iter()
        .zip(&b)
        .map(|(&x, &y)| {
            let hx = to(from(to(from(x)) / 2.0));
            let hy = to(from(to(from(y)) / 2.0));
            to(from(hx + hy))
        })
        .collect()
}

fn thirds(r: usize) -> Vec<f32> {
    (0..8)
        .map(|i| (i as f32 + 1.0) / 3.0 + r as f32 * 0.1)
        .collect()
}

#[test]
fn fp16_and_bf16_hooks_reduce_in_low_precision_and_write_back() {
    let want16 = compressed_reference(thirds, f16::from_f32, f16::to_f32);
    for got in run_hook(2, "hook-f16", Arc::new(CompressHook::fp16()), thirds) {
        assert_eq!(got, want16);
    }
    let want_b = compressed_reference(thirds, bf16::from_f32, bf16::to_f32);
    for got in run_hook(2, "hook-bf16", Arc::new(CompressHook::bf16()), thirds) {
        assert_eq!(got, want_b);
    }
    // Not the full-precision mean: the compression is really applied.
    assert_ne!(
        want_b,
        thirds(0)
            .iter()
            .zip(thirds(1))
            .map(|(a, b)| a / 2.0 + b / 2.0)
            .collect::<Vec<_>>()
    );
    // The wrapper around the all-reduce hook is the same computation.
    let wrapped = CompressHook::wrap(DType::BF16, Arc::new(AllReduceHook)).unwrap();
    for got in run_hook(2, "hook-wrap", Arc::new(wrapped), thirds) {
        assert_eq!(got, want_b);
    }
    assert!(matches!(
        CompressHook::wrap(DType::F32, Arc::new(AllReduceHook)),
        Err(Error::BadValue { .. })
    ));
}

fn spread(r: usize) -> Vec<f32> {
    (0..10)
        .map(|i| (i as f32 - 3.0 - r as f32) * 0.37 + r as f32 * 0.05)
        .collect()
}

#[test]
fn quantize_per_tensor_hook_averages_dequantized_uint8_codes() {
    // Direct computation: PyTorch's MinMaxObserver parameters per rank,
    // quantize, dequantize, sum in rank order, divide by the world size.
    let world = 3;
    let mut sum = [0.0f32; 10];
    for r in 0..world {
        let v = spread(r);
        let min = v.iter().copied().fold(0.0f32, f32::min);
        let max = v.iter().copied().fold(0.0f32, f32::max);
        let scale = ((max - min) / 255.0).max(f32::EPSILON);
        let zero = (-(min / scale).round_ties_even()).clamp(0.0, 255.0);
        for (acc, x) in sum.iter_mut().zip(v) {
            let q = ((x / scale).round_ties_even() + zero).clamp(0.0, 255.0);
            *acc += (q - zero) * scale;
        }
    }
    let want: Vec<f32> = sum.iter().map(|s| s / world as f32).collect();
    let exact: Vec<f32> = (0..10)
        .map(|i| (0..world).map(|r| spread(r)[i]).sum::<f32>() / 3.0)
        .collect();
    for got in run_hook(world, "hook-q", Arc::new(QuantizePerTensorHook), spread) {
        assert_eq!(got, want);
        // Within half a step of the largest scale (about 0.017) of the mean.
        assert!(max_diff(&got, &exact) <= 0.01, "{got:?} vs {exact:?}");
    }
}

#[test]
fn ranks_with_different_parameters_fail_at_construction() {
    let results = on_ranks(ranks(2, "mismatch"), |pg| {
        let last = if pg.rank() == 0 { [4] } else { [5] };
        let params = vec![
            TensorSpec::new(&[2, 2], DType::F32),
            TensorSpec::new(&last, DType::F32),
        ];
        Reducer::new(
            pg,
            params,
            Arc::new(AllReduceHook),
            ReducerOptions::default(),
        )
        .err()
    });
    for (rank, e) in results.into_iter().enumerate() {
        match e {
            Some(Error::ParamsMismatch {
                rank: r,
                peer,
                mine,
                theirs,
            }) => {
                assert_eq!((r, peer), (rank, 1 - rank));
                assert_ne!(mine, theirs);
                assert!(mine.starts_with("2 parameters"), "{mine}");
            }
            other => panic!("rank {rank}: expected ParamsMismatch, found {other:?}"),
        }
    }
}

#[test]
fn a_parameter_one_rank_skipped_gets_the_other_ranks_gradient() {
    let results = on_ranks(ranks(2, "unused"), |pg| {
        let rank = pg.rank();
        let params = vec![TensorSpec::new(&[2], DType::F32); 4];
        let options = ReducerOptions {
            find_unused_parameters: true,
            ..ReducerOptions::default()
        };
        let mut reducer = Reducer::new(pg, params, Arc::new(AllReduceHook), options).unwrap();
        // Rank 0 uses parameters 0..3, rank 1 only 0 and 1; nobody uses 3.
        let unused: &[usize] = if rank == 0 { &[3] } else { &[2, 3] };
        reducer.prepare_for_backward(unused).unwrap();
        let grads: Vec<_> = (0..3)
            .map(|p| Tensor::from_vec(vec![(4 * p + 2 * rank) as f32; 2], &[2]).unwrap())
            .collect();
        for p in (0..3).rev() {
            if !unused.contains(&p) {
                reducer.mark_ready(p, &grads[p]).unwrap();
            }
        }
        reducer.finish().unwrap();
        let views: Vec<Vec<f32>> = (0..3)
            .map(|p| reducer.gradient(p).unwrap().to_vec().unwrap())
            .collect();
        (
            reducer.globally_unused().to_vec(),
            grads[2].to_vec::<f32>().unwrap(),
            views,
        )
    });
    for (rank, (unused, grad2, views)) in results.into_iter().enumerate() {
        assert_eq!(unused, [3], "rank {rank}");
        assert_eq!(views[0], [1.0; 2]); // (0 + 2) / 2
        assert_eq!(views[1], [5.0; 2]); // (4 + 6) / 2
        assert_eq!(views[2], [4.0; 2]); // (8 + 0) / 2: rank 1 counts as zero
        if rank == 0 {
            assert_eq!(grad2, [4.0; 2]);
        }
    }
}

/// A linear model `y = W x + b` (W: 2x3, b: 2) with loss
/// `mean over the batch of 0.5 * |y - t|^2`; its gradients over `samples`.
/// One training sample: an input and its target.
type Sample = ([f32; 3], [f32; 2]);

fn linear_grads(w: &[f32], b: &[f32], samples: &[Sample]) -> (Vec<f32>, Vec<f32>) {
    let mut gw = [0.0f32; 6];
    let mut gb = [0.0f32; 2];
    for (x, t) in samples {
        for o in 0..2 {
            let y: f32 = (0..3).map(|i| w[3 * o + i] * x[i]).sum::<f32>() + b[o];
            let r = y - t[o];
            for i in 0..3 {
                gw[3 * o + i] += r * x[i];
            }
            gb[o] += r;
        }
    }
    let n = samples.len() as f32;
    (
        gw.iter().map(|g| g / n).collect(),
        gb.iter().map(|g| g / n).collect(),
    )
}

fn dataset() -> Vec<Sample> {
    (0..12)
        .map(|k| {
            let k = k as f32;
            let x = [(k * 0.37).sin(), (k * 0.11).cos(), k / 12.0 - 0.5];
            let t = [0.3 * x[0] - 1.2 * x[1] + 0.5, 0.8 * x[2] + 0.1 * x[0] - 0.2];
            (x, t)
        })
        .collect()
}

const STEPS: usize = 20;
const LR: f32 = 0.3;

fn train_single_process() -> (Vec<f32>, Vec<f32>) {
    let data = dataset();
    let (mut w, mut b) = (vec![0.1f32; 6], vec![0.0f32; 2]);
    for _ in 0..STEPS {
        let (gw, gb) = linear_grads(&w, &b, &data);
        w.iter_mut().zip(&gw).for_each(|(p, g)| *p -= LR * g);
        b.iter_mut().zip(&gb).for_each(|(p, g)| *p -= LR * g);
    }
    (w, b)
}

/// Rank `pg.rank()`'s share of the data set and its parameters W and b,
/// broadcast from rank 0 (only rank 0 starts from the right values).
fn rank_start(
    pg: &Arc<dyn ProcessGroup>,
    world: usize,
) -> (Vec<Sample>, Tensor<'static>, Tensor<'static>) {
    let rank = pg.rank();
    let data = dataset();
    let per_rank = data.len() / world;
    let mine = data[rank * per_rank..(rank + 1) * per_rank].to_vec();
    let init: f32 = if rank == 0 { 0.1 } else { 7.0 };
    let w = Tensor::from_vec(vec![init; 6], &[2, 3]).unwrap();
    let b = Tensor::from_vec(vec![init - 0.1; 2], &[2]).unwrap();
    broadcast_coalesced(&**pg, &[w.clone(), b.clone()], 1 << 20, 0).unwrap();
    (mine, w, b)
}

/// One SGD step of parameter `p` with gradient `g`.
fn sgd(p: &Tensor<'static>, g: &Tensor<'static>) {
    let v: Vec<f32> = p
        .to_vec::<f32>()
        .unwrap()
        .iter()
        .zip(g.to_vec::<f32>().unwrap())
        .map(|(p, g)| p - LR * g)
        .collect();
    p.copy_from(&Tensor::from_vec(v, p.shape()).unwrap())
        .unwrap();
}

fn train_data_parallel(
    world: usize,
    hook: Arc<dyn CommHook>,
    prefix: &str,
) -> Vec<(Vec<f32>, Vec<f32>)> {
    on_ranks(ranks(world, prefix), move |pg| {
        let (mine, w, b) = rank_start(&pg, world);
        let params = vec![TensorSpec::of(&w), TensorSpec::of(&b)];
        // 8-byte buckets: b and W in buckets of their own.
        let options = ReducerOptions {
            bucket_cap_bytes: 8,
            first_bucket_bytes: 8,
            ..ReducerOptions::default()
        };
        let mut reducer = Reducer::new(pg, params, hook.clone(), options).unwrap();
        for _ in 0..STEPS {
            let (wv, bv) = (w.to_vec::<f32>().unwrap(), b.to_vec::<f32>().unwrap());
            let (gw, gb) = linear_grads(&wv, &bv, &mine);
            let (gw, gb) = (
                Tensor::from_vec(gw, &[2, 3]).unwrap(),
                Tensor::from_vec(gb, &[2]).unwrap(),
            );
            reducer.mark_ready(1, &gb).unwrap(); // backward: the bias first
            reducer.mark_ready(0, &gw).unwrap();
            reducer.finish().unwrap();
            sgd(&w, &gw);
            sgd(&b, &gb);
        }
        (w.to_vec::<f32>().unwrap(), b.to_vec::<f32>().unwrap())
    })
}

fn max_diff(a: &[f32], b: &[f32]) -> f32 {
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

#[test]
fn data_parallel_training_matches_single_process_training() {
    let (w, b) = train_single_process();
    for world in [2, 3] {
        let results = train_data_parallel(world, Arc::new(AllReduceHook), &format!("train{world}"));
        for (rank, (rw, rb)) in results.iter().enumerate() {
            // Every rank holds bitwise the same parameters.
            assert_eq!(
                (rw, rb),
                (&results[0].0, &results[0].1),
                "rank {rank} of {world}"
            );
            // Single-process training sums the batch in another order:
            // equal within f32 rounding, not bitwise.
            let diff = max_diff(rw, &w).max(max_diff(rb, &b));
            assert!(
                diff <= 1e-5,
                "world {world} rank {rank}: max difference {diff}"
            );
        }
        // The training really moved the parameters.
        assert!(max_diff(&results[0].0, &[0.1; 6]) > 0.1);
    }
}

/// [`train_data_parallel`] with the backward pass writing each gradient
/// straight into its bucket view (`Reducer::gradient`, fetched before
/// every backward pass) and the SGD step reading the averages there
/// (`gradient_as_bucket_view`: nothing is copied in or back).
fn train_in_bucket_views(world: usize, prefix: &str) -> Vec<(Vec<f32>, Vec<f32>)> {
    on_ranks(ranks(world, prefix), move |pg| {
        let (mine, w, b) = rank_start(&pg, world);
        let params = vec![TensorSpec::of(&w), TensorSpec::of(&b)];
        let options = ReducerOptions {
            bucket_cap_bytes: 8,
            first_bucket_bytes: 8,
            gradient_as_bucket_view: true,
            ..ReducerOptions::default()
        };
        let mut reducer = Reducer::new(pg, params, Arc::new(AllReduceHook), options).unwrap();
        let mut first_views = None;
        for step in 0..STEPS {
            let (gw_view, gb_view) = (reducer.gradient(0).unwrap(), reducer.gradient(1).unwrap());
            let (wv, bv) = (w.to_vec::<f32>().unwrap(), b.to_vec::<f32>().unwrap());
            let (gw, gb) = linear_grads(&wv, &bv, &mine);
            gb_view
                .copy_from(&Tensor::from_vec(gb, &[2]).unwrap())
                .unwrap();
            reducer.mark_ready(1, &gb_view).unwrap(); // backward: the bias first
            gw_view
                .copy_from(&Tensor::from_vec(gw, &[2, 3]).unwrap())
                .unwrap();
            reducer.mark_ready(0, &gw_view).unwrap();
            reducer.finish().unwrap();
            sgd(&w, &gw_view);
            sgd(&b, &gb_view);
            if step == 0 {
                first_views = Some(gw_view);
            }
        }
        // The first finish() rebuilt the buckets: the first iteration's
        // views are not where the gradients live now, hence fetching the
        // views before every backward pass.
        let stale = first_views.unwrap();
        assert!(!stale.shares_storage(&reducer.gradient(0).unwrap()));
        (w.to_vec::<f32>().unwrap(), b.to_vec::<f32>().unwrap())
    })
}

#[test]
fn training_in_bucket_views_matches_training_with_copies() {
    let copying = train_data_parallel(2, Arc::new(AllReduceHook), "train-copy");
    let in_views = train_in_bucket_views(2, "train-view");
    // The same sums in the same order: bitwise the same parameters.
    assert_eq!(in_views, copying);
    // The ranks trained on different halves of the data and agree, so
    // the gradients in the views were averaged.
    assert_eq!(in_views[0], in_views[1]);
    assert!(max_diff(&in_views[0].0, &[0.1; 6]) > 0.1);
}

#[test]
fn fp16_compressed_training_stays_close_to_single_process_training() {
    let (w, b) = train_single_process();
    let results = train_data_parallel(2, Arc::new(CompressHook::fp16()), "train-f16");
    for (rw, rb) in &results {
        assert_eq!((rw, rb), (&results[0].0, &results[0].1));
        let diff = max_diff(rw, &w).max(max_diff(rb, &b));
        assert!(diff <= 1e-3, "max difference {diff}");
    }
}

// ---- PowerSGD ---------------------------------------------------------

/// A PowerSGD hook that compresses from iteration `start`.
fn power_sgd(rank: usize, start: u64, error_feedback: bool, warm_start: bool) -> PowerSgdHook {
    PowerSgdHook::new(PowerSgdOptions {
        matrix_approximation_rank: rank,
        start_power_sgd_iter: start,
        use_error_feedback: error_feedback,
        warm_start,
        random_seed: 11,
        ..PowerSgdOptions::default()
    })
    .unwrap()
}

/// Runs `hook` on one bucket of gradients of `shapes` holding `values` on
/// this rank; the bucket's values afterwards.
fn run_bucket(
    pg: &Arc<dyn ProcessGroup>,
    hook: &dyn CommHook,
    shapes: &[Vec<usize>],
    values: Vec<f32>,
) -> Vec<f32> {
    let n = values.len();
    let buffer = Tensor::from_vec(values, &[n]).unwrap();
    let ids = (0..shapes.len()).collect();
    let bucket = GradBucket::new(0, 1, buffer.clone(), shapes.to_vec(), ids).unwrap();
    let out = hook.run(pg, bucket).unwrap().wait().unwrap();
    assert_eq!(
        out.to_vec::<f32>().unwrap(),
        buffer.to_vec::<f32>().unwrap()
    );
    buffer.to_vec().unwrap()
}

/// `u vᵀ` summed over the pairs, row-major `n × m`.
fn outer_sum(pairs: &[(Vec<f32>, Vec<f32>)]) -> Vec<f32> {
    let (n, m) = (pairs[0].0.len(), pairs[0].1.len());
    (0..n * m)
        .map(|k| pairs.iter().map(|(u, v)| u[k / m] * v[k % m]).sum())
        .collect()
}

/// Rank `r`'s bucket: a 10x8 gradient `U V_rᵀ` of rank 2 whose column
/// space U is the same on every rank (compressed at rank 2), a bias of 5
/// and a 3x2 matrix (too small to compress), both multiples of 3.
fn low_rank_bucket(r: usize) -> Vec<f32> {
    let u1: Vec<f32> = (0..10).map(|i| (i as f32 * 0.7).sin() + 1.0).collect();
    let u2: Vec<f32> = (0..10)
        .map(|i| (i as f32 * 0.3).cos() - 0.5 * i as f32 / 10.0)
        .collect();
    let v1: Vec<f32> = (0..8)
        .map(|j| (j as f32 - 3.0) * 0.25 + r as f32 * 0.4)
        .collect();
    let v2: Vec<f32> = (0..8).map(|j| ((j + r) as f32 * 1.3).sin()).collect();
    let mut values = outer_sum(&[(u1, v1), (u2, v2)]);
    values.extend((0..5).map(|i| (3 * (i + 2 * r)) as f32));
    values.extend((0..6).map(|i| (3 * (i * r + 1)) as f32));
    values
}

const LOW_RANK_SHAPES: [&[usize]; 3] = [&[10, 8], &[5], &[3, 2]];

#[test]
fn power_sgd_is_all_reduce_before_its_start_then_exact_on_shared_low_rank_gradients() {
    let world = 3;
    let results = on_ranks(ranks(world, "psgd-exact"), move |pg| {
        let shapes: Vec<Vec<usize>> = LOW_RANK_SHAPES.iter().map(|s| s.to_vec()).collect();
        let hook = power_sgd(2, 2, true, true);
        let mine = low_rank_bucket(pg.rank());
        // Iterations 0 and 1: the plain all-reduce hook, bitwise.
        let mut vanilla = Vec::new();
        for _ in 0..2 {
            let got = run_bucket(&pg, &hook, &shapes, mine.clone());
            let plain = run_bucket(&pg, &AllReduceHook, &shapes, mine.clone());
            assert_eq!(got, plain);
            vanilla.push(got);
        }
        assert_eq!(hook.stats().numel_before_compression, 0);
        let compressed: Vec<Vec<f32>> = (0..3)
            .map(|_| run_bucket(&pg, &hook, &shapes, mine.clone()))
            .collect();
        (vanilla, compressed, hook.stats())
    });
    let mean: Vec<f32> = (0..91)
        .map(|k| (0..world).map(|r| low_rank_bucket(r)[k]).sum::<f32>() / world as f32)
        .collect();
    for (rank, (vanilla, compressed, stats)) in results.iter().enumerate() {
        assert!(max_diff(&vanilla[0], &mean) < 1e-5);
        for (it, got) in compressed.iter().enumerate() {
            // Every rank computes bitwise the same result.
            assert_eq!(got, &results[0].1[it], "rank {rank} iteration {it}");
            // The rank-2 approximation of a rank-2 mean is the mean.
            let diff = max_diff(&got[..80], &mean[..80]);
            assert!(diff < 1e-4, "iteration {it}: max difference {diff}");
            // The small tensors are averaged exactly (multiples of 3).
            assert_eq!(got[80..], mean[80..], "iteration {it}");
        }
        // Three compressed iterations: 80 elements sent as (10 + 8) * 2.
        assert_eq!(stats.iteration, 5);
        assert_eq!(stats.numel_before_compression, 3 * 91);
        assert_eq!(stats.numel_after_compression, 3 * (36 + 11));
    }
}

/// An 8x6 gradient of rank 2: `2 a1 b1ᵀ + a2 b2ᵀ`, plus `c a1 b1ᵀ`.
fn rank_two(c: f32) -> Vec<f32> {
    let a1: Vec<f32> = (0..8).map(|i| (i as f32 * 0.9).sin()).collect();
    let a2: Vec<f32> = (0..8).map(|i| (i as f32 * 0.4).cos()).collect();
    let b1: Vec<f32> = (0..6).map(|j| 1.0 - j as f32 * 0.3).collect();
    let b2: Vec<f32> = (0..6).map(|j| (j as f32 * 1.1).cos()).collect();
    let a1c: Vec<f32> = a1.iter().map(|x| x * (2.0 + c)).collect();
    outer_sum(&[(a1c, b1), (a2, b2)])
}

#[test]
fn power_sgd_error_feedback_sends_the_residual_in_the_next_iteration() {
    // Ranks hold rank_two(+0.5) and rank_two(-0.5): their mean G is
    // rank_two(0), of rank 2, compressed at rank 1. The first compressed
    // iteration gives O1 != G; each rank keeps its input minus O1. With
    // zero gradients next, the input is that error, whose mean G - O1 has
    // rank 1 (G's column space minus O1's direction): sent exactly, so
    // O1 + O2 = G. Without error feedback O2 is zero.
    let shapes = vec![vec![8, 6]];
    let g = rank_two(0.0);
    for warm_start in [true, false] {
        let shapes = shapes.clone();
        let results = on_ranks(ranks(2, &format!("psgd-ef-{warm_start}")), move |pg| {
            let mine = rank_two(if pg.rank() == 0 { 0.5 } else { -0.5 });
            let with_ef = power_sgd(1, 2, true, warm_start);
            let without = power_sgd(1, 2, false, false);
            let mut outs = Vec::new();
            for hook in [&with_ef, &without] {
                for _ in 0..2 {
                    run_bucket(&pg, hook, &shapes, mine.clone());
                }
                let o1 = run_bucket(&pg, hook, &shapes, mine.clone());
                let o2 = run_bucket(&pg, hook, &shapes, vec![0.0; 48]);
                outs.push((o1, o2));
            }
            outs
        });
        for outs in &results {
            let (o1, o2) = &outs[0];
            assert!(max_diff(o1, &g) > 0.05, "the rank-1 step is lossy");
            let total: Vec<f32> = o1.iter().zip(o2).map(|(a, b)| a + b).collect();
            let diff = max_diff(&total, &g);
            assert!(
                diff < 1e-4,
                "warm start {warm_start}: O1 + O2 is off G by {diff}"
            );
            // Without error feedback: the same first step (same seed), then nothing.
            let (p1, p2) = &outs[1];
            assert!(max_diff(p1, o1) < 1e-6);
            assert_eq!(p2, &vec![0.0; 48]);
        }
    }
}

#[test]
fn power_sgd_options_are_checked() {
    let bad = |options: PowerSgdOptions, field: &str| {
        let e = PowerSgdHook::new(options).err().unwrap();
        match &e {
            Error::BadValue { name, .. } => assert!(name.contains(field), "{e}"),
            other => panic!("expected BadValue for {field}, found {other:?}"),
        }
    };
    let base = PowerSgdOptions::default();
    bad(
        PowerSgdOptions {
            matrix_approximation_rank: 0,
            ..base.clone()
        },
        "matrix_approximation_rank",
    );
    for (ef, warm) in [(true, false), (false, true)] {
        bad(
            PowerSgdOptions {
                start_power_sgd_iter: 1,
                use_error_feedback: ef,
                warm_start: warm,
                ..base.clone()
            },
            "start_power_sgd_iter",
        );
    }
    bad(
        PowerSgdOptions {
            min_compression_rate: -1.0,
            ..base.clone()
        },
        "min_compression_rate",
    );
    bad(
        PowerSgdOptions {
            orthogonalization_epsilon: f32::NAN,
            ..base.clone()
        },
        "orthogonalization_epsilon",
    );
    let plain = PowerSgdOptions {
        start_power_sgd_iter: 0,
        use_error_feedback: false,
        warm_start: false,
        ..base
    };
    assert!(PowerSgdHook::new(plain).is_ok());
}

#[test]
fn a_reducer_with_power_sgd_averages_low_rank_gradients_across_rebuilt_buckets() {
    let results = on_ranks(ranks(2, "psgd-reducer"), |pg| {
        let rank = pg.rank();
        let params = vec![
            TensorSpec::new(&[10, 8], DType::F32),
            TensorSpec::new(&[5], DType::F32),
            TensorSpec::new(&[3, 2], DType::F32),
        ];
        // Small buckets: one parameter each, so three buckets.
        let options = ReducerOptions {
            bucket_cap_bytes: 8,
            first_bucket_bytes: 8,
            ..ReducerOptions::default()
        };
        let hook = Arc::new(power_sgd(2, 2, true, true));
        let mut reducer = Reducer::new(pg, params, hook.clone(), options).unwrap();
        let mut outs = Vec::new();
        for it in 0..4 {
            let values = low_rank_bucket(rank + it);
            let grads = [
                Tensor::from_vec(values[..80].to_vec(), &[10, 8]).unwrap(),
                Tensor::from_vec(values[80..85].to_vec(), &[5]).unwrap(),
                Tensor::from_vec(values[85..].to_vec(), &[3, 2]).unwrap(),
            ];
            for p in (0..3).rev() {
                reducer.mark_ready(p, &grads[p]).unwrap();
            }
            reducer.finish().unwrap();
            let got: Vec<f32> = grads
                .iter()
                .flat_map(|g| g.to_vec::<f32>().unwrap())
                .collect();
            outs.push(got);
        }
        (outs, hook.stats().iteration)
    });
    for (outs, iterations) in &results {
        assert_eq!(*iterations, 4);
        assert_eq!(outs, &results[0].0);
        for (it, got) in outs.iter().enumerate() {
            let mean: Vec<f32> = (0..91)
                .map(|k| (low_rank_bucket(it)[k] + low_rank_bucket(it + 1)[k]) / 2.0)
                .collect();
            let diff = max_diff(got, &mean);
            assert!(diff < 1e-4, "iteration {it}: max difference {diff}");
        }
    }
}

#[test]
fn the_ddp_mlp_example_trains_and_its_ranks_agree() {
    for hook in [
        ddp_mlp::HookChoice::AllReduce,
        ddp_mlp::HookChoice::PowerSgd,
    ] {
        let config = ddp_mlp::Config {
            steps: 30,
            batch: 32,
            hook,
            ..ddp_mlp::Config::default()
        };
        let results = on_ranks(ranks(2, &format!("mlp-{hook:?}")), move |pg| {
            ddp_mlp::train(pg, &config).unwrap()
        });
        let (first, last) = (results[0].losses[0], results[0].losses[29]);
        assert!(last < 0.5 * first, "{hook:?}: loss {first} -> {last}");
        for trained in &results {
            // Every rank sees the same global loss and holds the same parameters.
            assert_eq!(trained.losses, results[0].losses);
            assert_eq!(trained.params, results[0].params);
        }
    }
}
