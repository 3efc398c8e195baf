//! The NCCL process group on several GPUs: one rank per GPU (world size =
//! the GPU count, at most 4), each rank a thread of this process, the ranks
//! meeting through one shared `HashStore`. Every collective against a
//! reference computed on the host (in f64) from every rank's input, for
//! every dtype and reduce op; uneven all-to-all; an all_reduce whose
//! element count differs between ranks, reported as a mismatch on every
//! rank; sub-groups split from the group. Each test prints a line and
//! returns (a pass) where the machine has no GPU, no NCCL or fewer than 2
//! GPUs. The tests of this file take turns: each uses every GPU.
#![cfg(feature = "cuda")]

mod nccl_data;
mod skip;

use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use tensorcomm::cuda::nccl::{self, NcclOptions, ProcessGroupNccl};
use tensorcomm::cuda::runtime;
use tensorcomm::group::{ProcessGroup, ReduceOp, Work};
use tensorcomm::store::{HashStore, Store};
use tensorcomm::tensor::DType;
use tensorcomm::Error;

use nccl_data::{data, gpu, ops_for, poisoned, read, DTYPES};

/// The most ranks (GPUs) a test uses.
const MAX_WORLD: usize = 4;

/// The odd element count most checks use.
const N: usize = 37;

/// Where a coalesced call's first tensor ends (the second has the rest).
const CUT: usize = 8;

/// The world size these tests run with, or `None` (having said why) where
/// there is no GPU, no NCCL or only one GPU.
fn world_for(test: &str) -> Option<usize> {
    if !skip::has_gpu(test) {
        return None;
    }
    if let Err(e) = nccl::version() {
        skip::skipped(test, e);
        return None;
    }
    match runtime::device_count() {
        Ok(n) if n >= 2 => Some(n.min(MAX_WORLD)),
        Ok(n) => {
            skip::skipped(test, format!("{n} GPU; these tests need at least 2"));
            None
        }
        Err(e) => {
            skip::skipped(test, e);
            None
        }
    }
}

/// One test at a time: each holds every GPU, and one test's communicators
/// must not compete with another's (nor its timings).
fn take_turn() -> MutexGuard<'static, ()> {
    static TURN: Mutex<()> = Mutex::new(());
    TURN.lock().unwrap_or_else(PoisonError::into_inner)
}

fn panic_text(e: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = e.downcast_ref::<String>() {
        s.clone()
    } else if let Some(s) = e.downcast_ref::<&str>() {
        (*s).to_string()
    } else {
        "a panic without a message".into()
    }
}

/// Runs `f(rank)` for every rank of `world` at once, a thread each, and
/// fails with every rank's panic.
fn on_ranks(world: usize, f: impl Fn(usize) + Sync) {
    let failures: Vec<String> = std::thread::scope(|s| {
        let f = &f;
        let handles: Vec<_> = (0..world)
            .map(|rank| {
                std::thread::Builder::new()
                    .name(format!("rank{rank}"))
                    .spawn_scoped(s, move || f(rank))
                    .expect("starting a rank's thread")
            })
            .collect();
        handles
            .into_iter()
            .enumerate()
            .filter_map(|(rank, h)| {
                h.join()
                    .err()
                    .map(|e| format!("rank {rank} failed: {}", panic_text(&*e)))
            })
            .collect()
    });
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// Rank `rank` of a group of `world` on GPU `rank`, meeting the others
/// under `prefix` in `store`.
fn group(store: &Arc<dyn Store>, prefix: &str, rank: usize, world: usize) -> ProcessGroupNccl {
    let options = NcclOptions {
        timeout: Duration::from_secs(60),
        device: Some(rank),
    };
    let pg = ProcessGroupNccl::new(store.clone(), prefix, rank, world, &options)
        .unwrap_or_else(|e| panic!("rank {rank}: creating group {prefix:?}: {e}"));
    assert_eq!(
        (pg.rank(), pg.size(), pg.device()),
        (rank, world, rank),
        "rank {rank}: group {prefix:?}: rank, size and GPU"
    );
    pg
}

/// Inputs of 1 to 3, for PRODUCT: 3^4 = 81 is exact in every dtype.
fn small(n: usize, seed: usize) -> Vec<f64> {
    (0..n).map(|i| ((i * 5 + seed) % 3) as f64 + 1.0).collect()
}

/// `per_rank` (one list per rank, element by element) reduced with `op`,
/// in f64: AVG divides the sum by the world size, truncating for integer
/// dtypes (as `ReduceOp` documents; every input here is positive).
fn reference(dtype: DType, op: ReduceOp, per_rank: &[Vec<f64>]) -> Vec<f64> {
    let world = per_rank.len() as f64;
    (0..per_rank[0].len())
        .map(|i| {
            let column = || per_rank.iter().map(move |v| v[i]);
            let sum: f64 = column().sum();
            match op {
                ReduceOp::Sum => sum,
                ReduceOp::Avg if dtype.is_floating_point() => sum / world,
                ReduceOp::Avg => (sum / world).trunc(),
                ReduceOp::Product => column().product(),
                ReduceOp::Min => column().fold(f64::INFINITY, f64::min),
                ReduceOp::Max => column().fold(f64::NEG_INFINITY, f64::max),
                ReduceOp::PremulSum(factor) => factor * sum,
                other => panic!("no reference for {other}"),
            }
        })
        .collect()
}

/// How far a result of `dtype` may be from the reference, relative to it
/// (at least 1): exact for integers; for floats, a few roundings of the
/// dtype (NCCL computes AVG as a sum of inputs pre-multiplied by 1/world,
/// rounded in the dtype at each step).
fn tolerance(dtype: DType) -> f64 {
    match dtype {
        DType::F64 => 1e-12,
        DType::F32 => 1e-5,
        DType::F16 => 4e-3,
        DType::BF16 => 2e-2,
        _ => 0.0,
    }
}

fn close(dtype: DType, got: &[f64], want: &[f64], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    let tol = tolerance(dtype);
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!(
            (g - w).abs() <= tol * w.abs().max(1.0),
            "{what}: element {i}: got {g}, want {w}"
        );
    }
}

/// Waits until the call's work is done on the device; fails naming `what`.
fn finish(work: tensorcomm::Result<Work>, what: &str) {
    work.and_then(Work::synchronize)
        .unwrap_or_else(|e| panic!("{what}: {e}"));
}

/// Block `b` of `len` elements of `v`.
fn block(v: &[f64], b: usize, len: usize) -> &[f64] {
    &v[b * len..(b + 1) * len]
}

/// This rank's part of checking every reducing collective on `n`
/// elements of `dtype` with each of `ops`, then every other collective,
/// against the reference. Rank `r`'s inputs are `data(len, seed + r)`
/// (`small` for PRODUCT), so every rank can compute every rank's input.
fn check_collectives(pg: &ProcessGroupNccl, dtype: DType, n: usize, ops: &[ReduceOp]) {
    let (rank, world) = (pg.rank(), pg.size());
    let root = world - 1;
    let on = |values: fn(usize, usize) -> Vec<f64>, len: usize, seed: usize| -> Vec<Vec<f64>> {
        (0..world).map(|r| values(len, seed + r)).collect()
    };
    let t = |values: &[f64], shape: &[usize]| gpu(dtype, values, shape, rank);
    let empty = |shape: &[usize]| poisoned(dtype, shape, rank);
    // Every rank's block `rank` of `inputs` (of `len` elements each).
    let my_blocks = |inputs: &[Vec<f64>], len: usize| -> Vec<Vec<f64>> {
        inputs
            .iter()
            .map(|v| block(v, rank, len).to_vec())
            .collect()
    };

    for &op in ops {
        let what =
            |call: &str| format!("rank {rank} of {world}: {call} {dtype} {op}, {n} elements");
        let values = if op == ReduceOp::Product { small } else { data };
        let xs = on(values, n, 0);
        let want = reference(dtype, op, &xs);

        let x = t(&xs[rank], &[n]);
        finish(pg.all_reduce(&x, op, None), &what("all_reduce"));
        close(dtype, &read(&x), &want, &what("all_reduce"));

        // Two dimensions, the same elements.
        let x = t(&xs[rank], &[1, n]);
        finish(pg.all_reduce(&x, op, None), &what("all_reduce [1, n]"));
        close(dtype, &read(&x), &want, &what("all_reduce [1, n]"));

        let x = t(&xs[rank], &[n]);
        let call = format!("reduce to rank {root}");
        finish(pg.reduce(&x, root, op, None), &what(&call));
        // The other ranks' tensors are left unchanged (as documented).
        let expected = if rank == root { &want } else { &xs[rank] };
        close(dtype, &read(&x), expected, &what(&call));

        let (a, b) = (t(&xs[rank][..CUT], &[CUT]), t(&xs[rank][CUT..], &[n - CUT]));
        finish(
            pg.all_reduce_coalesced(&[a.clone(), b.clone()], op, None),
            &what("all_reduce_coalesced"),
        );
        close(
            dtype,
            &read(&a),
            &want[..CUT],
            &what("all_reduce_coalesced [0]"),
        );
        close(
            dtype,
            &read(&b),
            &want[CUT..],
            &what("all_reduce_coalesced [1]"),
        );

        // Rank r's input of world * n elements: block d goes to rank d.
        let big = on(values, world * n, 7);
        let want_mine = reference(dtype, op, &my_blocks(&big, n));

        let input = t(&big[rank], &[world * n]);
        let out = empty(&[n]);
        finish(
            pg.reduce_scatter_tensor(&out, &input, op, None),
            &what("reduce_scatter_tensor"),
        );
        close(
            dtype,
            &read(&out),
            &want_mine,
            &what("reduce_scatter_tensor"),
        );

        // The stacked form: [world, n].
        let input = t(&big[rank], &[world, n]);
        let out = empty(&[n]);
        finish(
            pg.reduce_scatter_tensor(&out, &input, op, None),
            &what("reduce_scatter_tensor stacked"),
        );
        close(
            dtype,
            &read(&out),
            &want_mine,
            &what("reduce_scatter_tensor stacked"),
        );

        let inputs: Vec<_> = (0..world)
            .map(|d| t(block(&big[rank], d, n), &[n]))
            .collect();
        let out = empty(&[n]);
        finish(
            pg.reduce_scatter(&out, &inputs, op, None),
            &what("reduce_scatter"),
        );
        close(dtype, &read(&out), &want_mine, &what("reduce_scatter"));

        let (first, second) = (
            on(values, world * CUT, 11),
            on(values, world * (n - CUT), 13),
        );
        let outs = [empty(&[CUT]), empty(&[n - CUT])];
        let ins = [
            t(&first[rank], &[world * CUT]),
            t(&second[rank], &[world * (n - CUT)]),
        ];
        finish(
            pg.reduce_scatter_tensor_coalesced(&outs, &ins, op, None),
            &what("reduce_scatter_tensor_coalesced"),
        );
        close(
            dtype,
            &read(&outs[0]),
            &reference(dtype, op, &my_blocks(&first, CUT)),
            &what("reduce_scatter_tensor_coalesced [0]"),
        );
        close(
            dtype,
            &read(&outs[1]),
            &reference(dtype, op, &my_blocks(&second, n - CUT)),
            &what("reduce_scatter_tensor_coalesced [1]"),
        );
    }

    let what = |call: &str| format!("rank {rank} of {world}: {call} {dtype}, {n} elements");
    let xs = on(data, n, 3);
    let big = on(data, world * n, 9);

    let x = t(&xs[rank], &[n]);
    let call = format!("broadcast from rank {root}");
    finish(pg.broadcast(&x, root, None), &what(&call));
    close(dtype, &read(&x), &xs[root], &what(&call));

    let input = t(&xs[rank], &[n]);
    let outs: Vec<_> = (0..world).map(|_| empty(&[n])).collect();
    finish(pg.all_gather(&outs, &input, None), &what("all_gather"));
    for (q, out) in outs.iter().enumerate() {
        close(
            dtype,
            &read(out),
            &xs[q],
            &what(&format!("all_gather [{q}]")),
        );
    }

    // Concatenated along dim 0, then stacked.
    for shape in [vec![world * n], vec![world, n]] {
        let call = format!("all_gather_into_tensor {shape:?}");
        let out = empty(&shape);
        finish(pg.all_gather_into_tensor(&out, &input, None), &what(&call));
        close(dtype, &read(&out), &xs.concat(), &what(&call));
    }

    let head = t(&xs[rank][..CUT], &[CUT]);
    let outs: Vec<Vec<_>> = (0..world)
        .map(|_| vec![empty(&[n]), empty(&[CUT])])
        .collect();
    finish(
        pg.all_gather_coalesced(&outs, &[input.clone(), head.clone()], None),
        &what("all_gather_coalesced"),
    );
    for (q, pair) in outs.iter().enumerate() {
        let call = format!("all_gather_coalesced from rank {q}");
        close(dtype, &read(&pair[0]), &xs[q], &what(&call));
        close(dtype, &read(&pair[1]), &xs[q][..CUT], &what(&call));
    }

    let outs = [empty(&[world * n]), empty(&[world * CUT])];
    finish(
        pg.all_gather_into_tensor_coalesced(&outs, &[input.clone(), head.clone()], None),
        &what("all_gather_into_tensor_coalesced"),
    );
    let heads: Vec<f64> = xs.iter().flat_map(|x| x[..CUT].to_vec()).collect();
    close(
        dtype,
        &read(&outs[0]),
        &xs.concat(),
        &what("all_gather_into_tensor_coalesced [0]"),
    );
    close(
        dtype,
        &read(&outs[1]),
        &heads,
        &what("all_gather_into_tensor_coalesced [1]"),
    );

    let call = format!("gather to rank {root}");
    let outs: Vec<_> = if rank == root {
        (0..world).map(|_| empty(&[n])).collect()
    } else {
        Vec::new()
    };
    let list = (rank == root).then_some(outs.as_slice());
    finish(pg.gather(&input, list, root, None), &what(&call));
    for (q, out) in outs.iter().enumerate() {
        close(dtype, &read(out), &xs[q], &what(&format!("{call} [{q}]")));
    }

    let call = format!("scatter from rank {root}");
    let ins: Vec<_> = if rank == root {
        (0..world)
            .map(|d| t(block(&big[root], d, n), &[n]))
            .collect()
    } else {
        Vec::new()
    };
    let list = (rank == root).then_some(ins.as_slice());
    let out = empty(&[n]);
    finish(pg.scatter(&out, list, root, None), &what(&call));
    close(dtype, &read(&out), block(&big[root], rank, n), &what(&call));

    // Block q of the output: what rank q sent this rank.
    let received: Vec<f64> = big
        .iter()
        .flat_map(|v| block(v, rank, n).to_vec())
        .collect();

    let ins: Vec<_> = (0..world)
        .map(|d| t(block(&big[rank], d, n), &[n]))
        .collect();
    let outs: Vec<_> = (0..world).map(|_| empty(&[n])).collect();
    finish(pg.all_to_all(&outs, &ins, None), &what("all_to_all"));
    for (q, out) in outs.iter().enumerate() {
        close(
            dtype,
            &read(out),
            block(&received, q, n),
            &what(&format!("all_to_all from rank {q}")),
        );
    }

    // Rows of one element, then rows of n.
    for shape in [vec![world * n], vec![world, n]] {
        let call = format!("all_to_all_single (even) {shape:?}");
        let input = t(&big[rank], &shape);
        let out = empty(&shape);
        finish(
            pg.all_to_all_single(&out, &input, &[], &[], None),
            &what(&call),
        );
        close(dtype, &read(&out), &received, &what(&call));
    }

    pg.barrier(None)
        .and_then(Work::wait)
        .unwrap_or_else(|e| panic!("{}", what(&format!("barrier: {e}"))));
}

#[test]
fn every_collective_on_every_rank_gives_the_reference_result() {
    const TEST: &str = "every_collective_on_every_rank_gives_the_reference_result";
    let Some(world) = world_for(TEST) else {
        return;
    };
    let _turn = take_turn();
    let store: Arc<dyn Store> = Arc::new(HashStore::new());
    on_ranks(world, |rank| {
        let pg = group(&store, "pg", rank, world);
        for dtype in DTYPES {
            check_collectives(&pg, dtype, N, &ops_for(dtype));
        }
        // A larger count: several blocks' worth for NCCL, and the larger
        // sizes of the peer-memory all-reduce.
        check_collectives(&pg, DType::F32, 4099, &[ReduceOp::Sum]);
        let recorded = pg.flight_recorder_json();
        assert!(
            recorded.contains("all_to_all_single"),
            "rank {rank}: {recorded}"
        );
    });
}

/// The elements rank `from` sends rank `to` in the uneven all-to-alls:
/// `2 * from + to + 1` rows of `width`, every value naming both ranks and
/// its place (at most 120, exact in every dtype).
fn uneven_block(from: usize, to: usize, width: usize) -> Vec<f64> {
    let rows = 2 * from + to + 1;
    (0..rows * width)
        .map(|k| ((from * 41 + to * 13 + k * 3) % 120 + 1) as f64)
        .collect()
}

/// This rank's part of the uneven all_to_all_single and all_to_all of
/// `dtype` with rows of `width`: rank r sends `2r + d + 1` rows to rank
/// d, so no rank's input and output split sizes are the same list.
fn check_uneven(pg: &ProcessGroupNccl, dtype: DType, width: usize) {
    let (rank, world) = (pg.rank(), pg.size());
    let what = |call: &str| format!("rank {rank} of {world}: {call} {dtype}, rows of {width}");
    let send: Vec<usize> = (0..world).map(|d| 2 * rank + d + 1).collect();
    let recv: Vec<usize> = (0..world).map(|q| 2 * q + rank + 1).collect();
    let sent: Vec<f64> = (0..world)
        .flat_map(|d| uneven_block(rank, d, width))
        .collect();
    let want: Vec<f64> = (0..world)
        .flat_map(|q| uneven_block(q, rank, width))
        .collect();

    let shape = |rows: usize| {
        if width == 1 {
            vec![rows]
        } else {
            vec![rows, width]
        }
    };
    let input = gpu(dtype, &sent, &shape(send.iter().sum()), rank);
    let out = poisoned(dtype, &shape(recv.iter().sum()), rank);
    let call = format!("all_to_all_single sending {send:?} rows, receiving {recv:?}");
    finish(
        pg.all_to_all_single(&out, &input, &recv, &send, None),
        &what(&call),
    );
    close(dtype, &read(&out), &want, &what(&call));

    let ins: Vec<_> = (0..world)
        .map(|d| gpu(dtype, &uneven_block(rank, d, width), &shape(send[d]), rank))
        .collect();
    let outs: Vec<_> = (0..world)
        .map(|q| poisoned(dtype, &shape(recv[q]), rank))
        .collect();
    finish(
        pg.all_to_all(&outs, &ins, None),
        &what("all_to_all (uneven)"),
    );
    for (q, out) in outs.iter().enumerate() {
        close(
            dtype,
            &read(out),
            &uneven_block(q, rank, width),
            &what(&format!("all_to_all (uneven) from rank {q}")),
        );
    }
}

#[test]
fn uneven_all_to_all_moves_each_block_to_its_rank() {
    const TEST: &str = "uneven_all_to_all_moves_each_block_to_its_rank";
    let Some(world) = world_for(TEST) else {
        return;
    };
    let _turn = take_turn();
    let store: Arc<dyn Store> = Arc::new(HashStore::new());
    on_ranks(world, |rank| {
        let pg = group(&store, "pg", rank, world);
        for dtype in DTYPES {
            check_uneven(&pg, dtype, 1);
        }
        check_uneven(&pg, DType::F32, 3);
        pg.barrier(None)
            .and_then(Work::wait)
            .unwrap_or_else(|e| panic!("rank {rank}: barrier: {e}"));
    });
}

/// The group's watchdog finds a mismatched collective when it stalls on
/// the device (`stall_check.rs`): rank 0 all-reduces a few elements, the
/// others a million, so their NCCL kernels (different protocols) wait for
/// each other. Both sizes run once on every rank first, so NCCL has
/// connected what either size needs (a connection made at the first use
/// of an algorithm would wait on the host for ranks that never make it).
#[test]
fn mismatched_shapes_are_refused_or_reported() {
    const TEST: &str = "mismatched_shapes_are_refused_or_reported";
    const FEW: usize = 3;
    const MANY: usize = 1 << 20;
    /// The mismatched call's sequence number (after the two that match).
    const SEQ: u64 = 2;
    let Some(world) = world_for(TEST) else {
        return;
    };
    let _turn = take_turn();
    let store: Arc<dyn Store> = Arc::new(HashStore::new());
    on_ranks(world, |rank| {
        let pg = group(&store, "pg", rank, world);
        for (seq, count) in [FEW, MANY].into_iter().enumerate() {
            let what = format!("rank {rank}: matching all_reduce (seq {seq}) of {count} i32");
            let x = gpu(DType::I32, &data(count, rank), &[count], rank);
            finish(pg.all_reduce(&x, ReduceOp::Sum, None), &what);
            let all: Vec<_> = (0..world).map(|r| data(count, r)).collect();
            close(
                DType::I32,
                &read(&x),
                &reference(DType::I32, ReduceOp::Sum, &all),
                &what,
            );
        }

        let count = if rank == 0 { FEW } else { MANY };
        let x = gpu(DType::I32, &data(count, rank), &[count], rank);
        let started = Instant::now();
        // A rank whose kernel ended with garbage meets the mismatch at the
        // barrier after it.
        let outcome = pg
            .all_reduce(&x, ReduceOp::Sum, None)
            .and_then(Work::synchronize)
            .and_then(|()| pg.barrier(None))
            .and_then(Work::wait);
        let took = started.elapsed();
        let err = match outcome {
            Ok(()) => panic!(
                "rank {rank}: an all_reduce of {count} elements while another rank passed a different count, and the barrier after it, both succeeded"
            ),
            Err(e) => e,
        };
        let text = err.to_string();
        match &err {
            Error::CollectiveFailed {
                op,
                seq,
                rank: failed_on,
                source,
                ..
            } if op == "all_reduce" && *seq == SEQ && *failed_on == rank => match &**source {
                Error::CollectiveMismatch {
                    rank: mine, peer, ..
                } => {
                    assert_eq!(*mine, rank, "rank {rank}: {text}");
                    // Ranks 1.. agree with each other; rank 0 is the odd one.
                    if rank == 0 {
                        assert!(*peer != 0 && *peer < world, "rank {rank}: {text}");
                    } else {
                        assert_eq!(*peer, 0, "rank {rank}: {text}");
                    }
                }
                other => panic!(
                    "rank {rank}: expected a CollectiveMismatch behind the failure, got {other:?}: {text}"
                ),
            },
            other => panic!(
                "rank {rank}: expected all_reduce seq {SEQ} to fail on rank {rank} with a mismatch, got {other:?}: {text}"
            ),
        }
        assert!(
            text.contains(&format!(" {count} elements")),
            "rank {rank}: the error names this rank's call: {text}"
        );
        assert!(
            took < Duration::from_secs(30),
            "rank {rank}: the mismatch took {took:?} to report (the group's timeout is 60 s): {text}"
        );

        // The group is broken; later calls say so at once.
        let later = pg.all_reduce(&x, ReduceOp::Sum, None).and_then(Work::wait);
        assert!(
            matches!(later, Err(Error::GroupBroken { .. })),
            "rank {rank}: a call after the mismatch: {later:?}"
        );
        drop(pg);

        // The process stays usable: a new group of the same ranks works.
        let pg = group(&store, "pg-after", rank, world);
        let what = format!("rank {rank}: all_reduce on a new group after the mismatch");
        let x = gpu(DType::I32, &data(N, rank), &[N], rank);
        finish(pg.all_reduce(&x, ReduceOp::Sum, None), &what);
        let all: Vec<_> = (0..world).map(|r| data(N, r)).collect();
        close(
            DType::I32,
            &read(&x),
            &reference(DType::I32, ReduceOp::Sum, &all),
            &what,
        );
    });
}

/// This rank's part of checking sub-group `members` (`sub`: what
/// `new_subgroup` gave this rank): members get a group of their own that
/// reduces, broadcasts and gathers over the members only (sub-group rank
/// i being the i-th smallest member); the others get none and take no
/// part.
fn check_subgroup(rank: usize, members: &[usize], sub: Option<ProcessGroupNccl>) {
    let position = members.iter().position(|&r| r == rank);
    let Some(sub) = sub else {
        assert!(
            position.is_none(),
            "rank {rank}: no sub-group {members:?}, though it is a member"
        );
        return;
    };
    let me = position
        .unwrap_or_else(|| panic!("rank {rank}: given sub-group {members:?}, not being in it"));
    let size = members.len();
    assert_eq!(
        (sub.rank(), sub.size(), sub.device()),
        (me, size, rank),
        "rank {rank}: sub-group {members:?}: rank, size and GPU"
    );
    assert_eq!(sub.global_ranks(), members, "rank {rank}: sub-group ranks");
    let what = |call: &str, dtype: DType| {
        format!("rank {rank} (sub-group rank {me} of {members:?}): {call} {dtype}")
    };
    for dtype in [DType::F32, DType::BF16, DType::I64] {
        for op in [ReduceOp::Sum, ReduceOp::Max] {
            let call = format!("all_reduce {op}");
            let x = gpu(dtype, &data(N, 20 + rank), &[N], rank);
            finish(sub.all_reduce(&x, op, None), &what(&call, dtype));
            let inputs: Vec<_> = members.iter().map(|&g| data(N, 20 + g)).collect();
            close(
                dtype,
                &read(&x),
                &reference(dtype, op, &inputs),
                &what(&call, dtype),
            );
        }
    }
    let dtype = DType::I32;
    let last = size - 1;
    let x = gpu(dtype, &data(N, 40 + rank), &[N], rank);
    let call = format!("broadcast from sub-group rank {last}");
    finish(sub.broadcast(&x, last, None), &what(&call, dtype));
    close(
        dtype,
        &read(&x),
        &data(N, 40 + members[last]),
        &what(&call, dtype),
    );

    let input = gpu(dtype, &data(N, 60 + rank), &[N], rank);
    let out = poisoned(dtype, &[size * N], rank);
    finish(
        sub.all_gather_into_tensor(&out, &input, None),
        &what("all_gather_into_tensor", dtype),
    );
    let want: Vec<f64> = members.iter().flat_map(|&g| data(N, 60 + g)).collect();
    close(
        dtype,
        &read(&out),
        &want,
        &what("all_gather_into_tensor", dtype),
    );
    sub.barrier(None)
        .and_then(Work::wait)
        .unwrap_or_else(|e| panic!("{}: {e}", what("barrier", dtype)));
}

#[test]
fn a_subgroup_of_some_ranks_runs_its_own_collectives() {
    const TEST: &str = "a_subgroup_of_some_ranks_runs_its_own_collectives";
    let Some(world) = world_for(TEST) else {
        return;
    };
    let _turn = take_turn();
    let store: Arc<dyn Store> = Arc::new(HashStore::new());
    let pair = [0, 1];
    // With 3 or more GPUs, a sub-group of 3: the last three ranks (all of
    // them at 3 GPUs; without rank 0 at 4).
    let odd: Vec<usize> = (world.saturating_sub(3)..world).collect();
    on_ranks(world, |rank| {
        let pg = group(&store, "pg", rank, world);
        // Every rank of the group splits every sub-group, in one order.
        let split = |members: &[usize]| {
            pg.new_subgroup(members)
                .unwrap_or_else(|e| panic!("rank {rank}: new_subgroup({members:?}): {e}"))
        };
        let first = split(&pair);
        let second = (world >= 3).then(|| split(&odd));
        check_subgroup(rank, &pair, first);
        if let Some(sub) = second {
            check_subgroup(rank, &odd, sub);
        }

        // The group itself still works, on every rank.
        let what = format!("rank {rank}: all_reduce on the whole group after the sub-groups");
        let x = gpu(DType::F32, &data(N, 80 + rank), &[N], rank);
        finish(pg.all_reduce(&x, ReduceOp::Sum, None), &what);
        let all: Vec<_> = (0..world).map(|r| data(N, 80 + r)).collect();
        close(
            DType::F32,
            &read(&x),
            &reference(DType::F32, ReduceOp::Sum, &all),
            &what,
        );
    });
}
