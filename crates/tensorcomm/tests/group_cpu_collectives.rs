//! Every collective of the CPU process group between threads, over TCP on
//! loopback and over shared memory (every test runs once per transport, in
//! modules `tcp` and `shm`, and checks the routes): every op for every
//! reduce op a dtype supports, for f32, f64, f16, bf16, i8, i32, i64 and
//! bool, world sizes 1, 2, 3, 4 and 8, checked against references computed
//! here from the inputs; uneven all-to-all; argument errors (nothing sent,
//! the group still usable); mismatches.

mod common;

use std::sync::Arc;

use common::{groups_over, on_every_rank};
use half::{bf16, f16};
use tensorcomm::cpu::backend::ProcessGroupCpu;
use tensorcomm::cpu::transport::TransportChoice;
use tensorcomm::group::{ProcessGroup, ReduceOp};
use tensorcomm::store::HashStore;
use tensorcomm::tensor::{DType, Tensor};
use tensorcomm::Error;

over_transports!(
    every_collective_matches_references_for_every_dtype_op_and_world_size,
    permuted_tensors_travel_in_logical_order,
    reduce_combines_one_shape_held_in_different_layouts,
    large_tensors_cross_the_ring_in_several_segments,
    large_reduces_match_references_at_every_root,
    large_averages_are_finished_exactly_once,
    large_all_to_alls_in_every_form_match_references,
    large_gathers_and_scatters_match_references_at_every_root,
    invalid_arguments_are_refused_before_sending_and_the_group_stays_usable,
    different_roots_are_reported_with_both_fingerprints,
    uneven_all_to_all_sizes_that_disagree_fail_instead_of_hanging,
);

/// One group per rank over `choice`, routes checked.
fn groups(world: usize, choice: TransportChoice) -> Vec<ProcessGroupCpu> {
    groups_over(world, &Arc::new(HashStore::new()), "pg", choice)
}

const DTYPES: [DType; 8] = [
    DType::F32,
    DType::F64,
    DType::F16,
    DType::BF16,
    DType::I8,
    DType::I32,
    DType::I64,
    DType::Bool,
];

/// A tensor of `dtype` and `shape` holding `f(i)` at row-major index `i`.
fn make(dtype: DType, shape: &[usize], f: impl Fn(usize) -> f64) -> Tensor<'static> {
    let n: usize = shape.iter().product();
    match dtype {
        DType::F32 => Tensor::from_vec((0..n).map(|i| f(i) as f32).collect(), shape),
        DType::F64 => Tensor::from_vec((0..n).map(&f).collect(), shape),
        DType::F16 => Tensor::from_vec((0..n).map(|i| f16::from_f64(f(i))).collect(), shape),
        DType::I8 => Tensor::from_vec((0..n).map(|i| f(i) as i8).collect(), shape),
        DType::BF16 => Tensor::from_vec((0..n).map(|i| bf16::from_f64(f(i))).collect(), shape),
        DType::I32 => Tensor::from_vec((0..n).map(|i| f(i) as i32).collect(), shape),
        DType::I64 => Tensor::from_vec((0..n).map(|i| f(i) as i64).collect(), shape),
        DType::Bool => Tensor::from_bools(&(0..n).map(|i| f(i) != 0.0).collect::<Vec<_>>(), shape),
        other => unreachable!("{other}"),
    }
    .unwrap()
}

fn zeros(dtype: DType, shape: &[usize]) -> Tensor<'static> {
    Tensor::zeros(shape, dtype).unwrap()
}

fn decode(t: &Tensor<'_>) -> Vec<f64> {
    match t.dtype() {
        DType::F32 => t
            .to_vec::<f32>()
            .unwrap()
            .into_iter()
            .map(f64::from)
            .collect(),
        DType::F64 => t.to_vec::<f64>().unwrap(),
        DType::F16 => t
            .to_vec::<f16>()
            .unwrap()
            .into_iter()
            .map(f64::from)
            .collect(),
        DType::I8 => t
            .to_vec::<i8>()
            .unwrap()
            .into_iter()
            .map(f64::from)
            .collect(),
        DType::BF16 => t
            .to_vec::<bf16>()
            .unwrap()
            .into_iter()
            .map(f64::from)
            .collect(),
        DType::I32 => t
            .to_vec::<i32>()
            .unwrap()
            .into_iter()
            .map(f64::from)
            .collect(),
        DType::I64 => t
            .to_vec::<i64>()
            .unwrap()
            .into_iter()
            .map(|v| v as f64)
            .collect(),
        DType::Bool => t
            .to_vec_bool()
            .unwrap()
            .into_iter()
            .map(|b| f64::from(u8::from(b)))
            .collect(),
        other => unreachable!("{other}"),
    }
}

/// Rank `r`'s input at index `i` for `op` (small integers, exact in every
/// dtype; in {-1, 1, 2} for PRODUCT so products stay exact in bf16).
fn value(dtype: DType, op: Option<ReduceOp>, r: usize, i: usize) -> f64 {
    if dtype == DType::Bool {
        return f64::from(u8::from(!(r * 5 + i * 3).is_multiple_of(4)));
    }
    if op == Some(ReduceOp::Product) {
        return [-1.0, 1.0, 2.0][(r + 2 * i) % 3];
    }
    ((r * 31 + i * 7) % 11) as f64 - 5.0
}

/// The reference reduction of `vals` (one per rank) in `dtype`.
fn reduce_ref(op: ReduceOp, dtype: DType, vals: &[f64]) -> f64 {
    let n = vals.len() as f64;
    let bits =
        |f: fn(i64, i64) -> i64| vals.iter().map(|&v| v as i64).reduce(f).unwrap_or(0) as f64;
    if dtype == DType::Bool {
        let any = vals.iter().any(|&v| v != 0.0);
        let all = vals.iter().all(|&v| v != 0.0);
        let parity = vals.iter().filter(|&&v| v != 0.0).count() % 2 == 1;
        return f64::from(u8::from(match op {
            ReduceOp::Sum | ReduceOp::Max | ReduceOp::Bor => any,
            ReduceOp::Product | ReduceOp::Min | ReduceOp::Band => all,
            ReduceOp::Bxor => parity,
            other => unreachable!("{other}"),
        }));
    }
    let sum: f64 = vals.iter().sum();
    match op {
        ReduceOp::Sum => sum,
        ReduceOp::Product => vals.iter().product(),
        ReduceOp::Min => vals.iter().copied().fold(f64::INFINITY, f64::min),
        ReduceOp::Max => vals.iter().copied().fold(f64::NEG_INFINITY, f64::max),
        ReduceOp::Avg if dtype.is_floating_point() => sum / n,
        ReduceOp::Avg => (sum / n).trunc(),
        ReduceOp::PremulSum(f) => sum * f,
        ReduceOp::Band => bits(|a, b| a & b),
        ReduceOp::Bor => bits(|a, b| a | b),
        ReduceOp::Bxor => bits(|a, b| a ^ b),
    }
}

fn assert_close(dtype: DType, got: &[f64], want: &[f64], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    let tol = match dtype {
        DType::F32 => 1e-6,
        DType::F64 => 1e-12,
        DType::F16 => 1e-3,
        DType::BF16 => 1e-2,
        _ => 0.0,
    };
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!(
            (g - w).abs() <= tol * w.abs().max(1.0),
            "{what}: element {i}: got {g}, expected {w}"
        );
    }
}

/// Every reduce op `dtype` supports.
fn reduce_ops(dtype: DType) -> Vec<ReduceOp> {
    ReduceOp::ALL
        .into_iter()
        .filter(|op| op.check_dtype("test", dtype).is_ok())
        .collect()
}

/// The reducing collectives for one dtype and op on one rank.
fn check_reducing(pg: &ProcessGroupCpu, dtype: DType, op: ReduceOp, n: usize) {
    let (rank, world) = (pg.rank(), pg.size());
    let v = |r: usize, i: usize| value(dtype, Some(op), r, i);
    let reduced =
        |i: usize| reduce_ref(op, dtype, &(0..world).map(|r| v(r, i)).collect::<Vec<_>>());
    let what = |name: &str| format!("{name} {op} {dtype} world {world} rank {rank}");

    let t = make(dtype, &[n], |i| v(rank, i));
    pg.all_reduce(&t, op, None).unwrap().wait().unwrap();
    let want: Vec<f64> = (0..n).map(reduced).collect();
    assert_close(dtype, &decode(&t), &want, &what("all_reduce"));

    for root in [0, world - 1] {
        let t = make(dtype, &[n], |i| v(rank, i));
        pg.reduce(&t, root, op, None).unwrap().wait().unwrap();
        let want: Vec<f64> = if rank == root {
            (0..n).map(reduced).collect()
        } else {
            (0..n)
                .map(|i| decode(&make(dtype, &[1], |_| v(rank, i)))[0])
                .collect()
        };
        assert_close(
            dtype,
            &decode(&t),
            &want,
            &what(&format!("reduce root {root}")),
        );
    }

    let own: Vec<f64> = (0..n).map(|i| reduced(rank * n + i)).collect();
    let inputs: Vec<_> = (0..world)
        .map(|j| make(dtype, &[n], |i| v(rank, j * n + i)))
        .collect();
    let out = zeros(dtype, &[n]);
    pg.reduce_scatter(&out, &inputs, op, None)
        .unwrap()
        .wait()
        .unwrap();
    assert_close(dtype, &decode(&out), &own, &what("reduce_scatter"));

    let input = make(dtype, &[world * n], |i| v(rank, i));
    let out = zeros(dtype, &[n]);
    pg.reduce_scatter_tensor(&out, &input, op, None)
        .unwrap()
        .wait()
        .unwrap();
    assert_close(dtype, &decode(&out), &own, &what("reduce_scatter_tensor"));

    let a = make(dtype, &[3], |i| v(rank, i));
    let b = make(dtype, &[2, 2], |i| v(rank, 3 + i));
    pg.all_reduce_coalesced(&[a.clone(), b.clone()], op, None)
        .unwrap()
        .wait()
        .unwrap();
    let got: Vec<f64> = decode(&a).into_iter().chain(decode(&b)).collect();
    let want: Vec<f64> = (0..7).map(reduced).collect();
    assert_close(dtype, &got, &want, &what("all_reduce_coalesced"));
}

/// The data-moving collectives for one dtype on one rank.
fn check_moving(pg: &ProcessGroupCpu, dtype: DType, n: usize) {
    let (rank, world) = (pg.rank(), pg.size());
    let v = |r: usize, i: usize| value(dtype, None, r, i);
    let enc = |x: f64| decode(&make(dtype, &[1], |_| x))[0];
    let block = |r: usize| (0..n).map(|i| enc(v(r, i))).collect::<Vec<f64>>();
    let everyone: Vec<f64> = (0..world).flat_map(block).collect();
    let what = |name: &str| format!("{name} {dtype} world {world} rank {rank}");
    let input = make(dtype, &[n], |i| v(rank, i));

    for root in [0, world - 1] {
        let t = make(dtype, &[2, n], |i| v(rank * 3 + root, i));
        pg.broadcast(&t, root, None).unwrap().wait().unwrap();
        // The root's tensor holds v(root * 3 + root, i).
        let want: Vec<f64> = (0..2 * n).map(|i| enc(v(root * 4, i))).collect();
        assert_eq!(
            decode(&t),
            want,
            "{}",
            what(&format!("broadcast root {root}"))
        );
    }
    pg.barrier(None).unwrap().wait().unwrap();

    let outs: Vec<_> = (0..world).map(|_| zeros(dtype, &[n])).collect();
    pg.all_gather(&outs, &input, None).unwrap().wait().unwrap();
    for (r, out) in outs.iter().enumerate() {
        assert_eq!(
            decode(out),
            block(r),
            "{}",
            what(&format!("all_gather from {r}"))
        );
    }

    for shape in [vec![world * n], vec![world, n]] {
        let out = zeros(dtype, &shape);
        pg.all_gather_into_tensor(&out, &input, None)
            .unwrap()
            .wait()
            .unwrap();
        assert_eq!(
            decode(&out),
            everyone,
            "{}",
            what(&format!("all_gather_into_tensor {shape:?}"))
        );
    }

    let second = make(dtype, &[2, 1], |i| v(rank, 100 + i));
    let lists: Vec<Vec<_>> = (0..world)
        .map(|_| vec![zeros(dtype, &[n]), zeros(dtype, &[2, 1])])
        .collect();
    pg.all_gather_coalesced(&lists, &[input.clone(), second], None)
        .unwrap()
        .wait()
        .unwrap();
    for (r, list) in lists.iter().enumerate() {
        assert_eq!(
            decode(&list[0]),
            block(r),
            "{}",
            what("all_gather_coalesced")
        );
        assert_eq!(
            decode(&list[1]),
            [enc(v(r, 100)), enc(v(r, 101))],
            "{}",
            what("all_gather_coalesced")
        );
    }

    for root in [0, world / 2] {
        let outs: Vec<_> = (0..world).map(|_| zeros(dtype, &[n])).collect();
        let list = (rank == root).then_some(outs.as_slice());
        pg.gather(&input, list, root, None).unwrap().wait().unwrap();
        if rank == root {
            for (r, out) in outs.iter().enumerate() {
                assert_eq!(decode(out), block(r), "{}", what("gather"));
            }
        }

        let sources: Vec<_> = (0..world)
            .map(|r| make(dtype, &[n], |i| v(root * 7 + r, i)))
            .collect();
        let list = (rank == root).then_some(sources.as_slice());
        let out = zeros(dtype, &[n]);
        pg.scatter(&out, list, root, None).unwrap().wait().unwrap();
        assert_eq!(decode(&out), block(root * 7 + rank), "{}", what("scatter"));
    }

    // Uneven list all_to_all: rank `p` sends `(p + q) % 3` elements to `q`.
    let len = |from: usize, to: usize| (from + to) % 3;
    let elem = |from: usize, to: usize, i: usize| v(from * 10 + to, i);
    let inputs: Vec<_> = (0..world)
        .map(|to| make(dtype, &[len(rank, to)], |i| elem(rank, to, i)))
        .collect();
    let outputs: Vec<_> = (0..world)
        .map(|from| zeros(dtype, &[len(from, rank)]))
        .collect();
    pg.all_to_all(&outputs, &inputs, None)
        .unwrap()
        .wait()
        .unwrap();
    for (from, out) in outputs.iter().enumerate() {
        let want: Vec<f64> = (0..len(from, rank))
            .map(|i| enc(elem(from, rank, i)))
            .collect();
        assert_eq!(
            decode(out),
            want,
            "{}",
            what(&format!("all_to_all from {from}"))
        );
    }

    // all_to_all_single, equal splits of [world * 2, 3]: rows 2q..2q+2 go to q.
    let row = |from: usize, to: usize, k: usize, c: usize| v(from * 10 + to, k * 3 + c);
    let input = make(dtype, &[world * 2, 3], |i| {
        row(rank, i / 6, (i / 3) % 2, i % 3)
    });
    let out = zeros(dtype, &[world * 2, 3]);
    pg.all_to_all_single(&out, &input, &[], &[], None)
        .unwrap()
        .wait()
        .unwrap();
    let want: Vec<f64> = (0..world * 6)
        .map(|i| enc(row(i / 6, rank, (i / 3) % 2, i % 3)))
        .collect();
    assert_eq!(decode(&out), want, "{}", what("all_to_all_single equal"));

    // Uneven splits: `len(p, q)` rows from p to q.
    let send_splits: Vec<usize> = (0..world).map(|to| len(rank, to)).collect();
    let recv_splits: Vec<usize> = (0..world).map(|from| len(from, rank)).collect();
    let mut rows_in = Vec::new();
    for (to, &k) in send_splits.iter().enumerate() {
        for kk in 0..k {
            rows_in.extend((0..3).map(|c| row(rank, to, kk, c)));
        }
    }
    let input = make(dtype, &[send_splits.iter().sum(), 3], |i| rows_in[i]);
    let out = zeros(dtype, &[recv_splits.iter().sum(), 3]);
    pg.all_to_all_single(&out, &input, &recv_splits, &send_splits, None)
        .unwrap()
        .wait()
        .unwrap();
    let mut want = Vec::new();
    for (from, &k) in recv_splits.iter().enumerate() {
        for kk in 0..k {
            want.extend((0..3).map(|c| enc(row(from, rank, kk, c))));
        }
    }
    assert_eq!(decode(&out), want, "{}", what("all_to_all_single uneven"));
}

fn every_collective_matches_references_for_every_dtype_op_and_world_size(choice: TransportChoice) {
    for world in [1, 2, 3, 4, 8] {
        let pgs = groups(world, choice);
        on_every_rank(&pgs, |pg| {
            for dtype in DTYPES {
                for op in reduce_ops(dtype) {
                    check_reducing(pg, dtype, op, 3);
                }
                check_moving(pg, dtype, 3);
            }
        });
    }
}

fn permuted_tensors_travel_in_logical_order(choice: TransportChoice) {
    let pgs = groups(3, choice);
    on_every_rank(&pgs, |pg| {
        let rank = pg.rank();
        // A [2, 3] input seen through a permutation, gathered into a
        // channels-last-like permuted output.
        let base =
            Tensor::from_vec((0..6).map(|i| (rank * 10 + i) as i32).collect(), &[3, 2]).unwrap();
        let input = base.permute(&[1, 0]).unwrap();
        let out_base = Tensor::zeros(&[3, 3, 2], DType::I32).unwrap();
        let out = out_base.permute(&[0, 2, 1]).unwrap(); // [3, 2, 3], not contiguous
        pg.all_gather_into_tensor(&out, &input, None)
            .unwrap()
            .wait()
            .unwrap();
        let want: Vec<i32> = (0..3i32)
            .flat_map(|r| {
                let t = Tensor::from_vec((0..6).map(|i| r * 10 + i).collect(), &[3, 2]).unwrap();
                t.permute(&[1, 0]).unwrap().to_vec::<i32>().unwrap()
            })
            .collect();
        assert_eq!(out.to_vec::<i32>().unwrap(), want);
    });
}

/// reduce's fingerprint covers the shape, not the layout: ranks may hold
/// the same [rows, cols] tensor row-major or as a transposed view, and
/// the root gets the element-wise result in its own layout (small and
/// large sizes: the tree, and the shared-memory arena from 64 KiB).
fn reduce_combines_one_shape_held_in_different_layouts(choice: TransportChoice) {
    for (rows, cols) in [(6usize, 4usize), (256, 128)] {
        let pgs = groups(3, choice);
        let v = |r: usize, i: usize| ((r * 1000 + i) % 4093) as f32;
        for root in [0, 1] {
            let results = on_every_rank(&pgs, |pg| {
                let rank = pg.rank();
                let t = if rank == 1 {
                    // Storage [cols, rows]: element (i, j) at j * rows + i.
                    let mut st = vec![0f32; rows * cols];
                    for i in 0..rows {
                        for j in 0..cols {
                            st[j * rows + i] = v(rank, i * cols + j);
                        }
                    }
                    Tensor::from_vec(st, &[cols, rows])
                        .unwrap()
                        .permute(&[1, 0])
                        .unwrap()
                } else {
                    Tensor::from_vec(
                        (0..rows * cols).map(|i| v(rank, i)).collect(),
                        &[rows, cols],
                    )
                    .unwrap()
                };
                pg.reduce(&t, root, ReduceOp::Sum, None)
                    .unwrap()
                    .wait()
                    .unwrap();
                t.to_vec::<f32>().unwrap()
            });
            for (rank, got) in results.iter().enumerate() {
                let want: Vec<f32> = (0..rows * cols)
                    .map(|i| {
                        if rank == root {
                            (0..3).map(|r| v(r, i)).sum()
                        } else {
                            v(rank, i)
                        }
                    })
                    .collect();
                let wrong = got.iter().zip(&want).filter(|(g, w)| g != w).count();
                assert_eq!(
                    wrong, 0,
                    "{rows}x{cols}, root {root}, rank {rank}: {wrong} elements wrong"
                );
            }
        }
    }
}

fn large_tensors_cross_the_ring_in_several_segments(choice: TransportChoice) {
    // 600k f32 per block: more than one 1 MiB ring segment per chunk.
    for world in [2, 3] {
        let pgs = groups(world, choice);
        on_every_rank(&pgs, |pg| {
            let (rank, n) = (pg.rank(), 600_000usize);
            let v = |r: usize, i: usize| ((r * 7 + i) % 13) as f32;
            let input = Tensor::from_vec((0..n).map(|i| v(rank, i)).collect(), &[n]).unwrap();
            let out = Tensor::zeros(&[world * n], DType::F32).unwrap();
            pg.all_gather_into_tensor(&out, &input, None)
                .unwrap()
                .wait()
                .unwrap();
            let got = out.to_vec::<f32>().unwrap();
            assert!(
                (0..world * n).all(|i| got[i] == v(i / n, i % n)),
                "all_gather_into_tensor"
            );

            let big = Tensor::from_vec((0..world * n).map(|i| v(rank, i)).collect(), &[world * n])
                .unwrap();
            let out = Tensor::zeros(&[n], DType::F32).unwrap();
            pg.reduce_scatter_tensor(&out, &big, ReduceOp::Sum, None)
                .unwrap()
                .wait()
                .unwrap();
            let got = out.to_vec::<f32>().unwrap();
            let want = |i: usize| (0..world).map(|r| v(r, rank * n + i)).sum::<f32>();
            assert!((0..n).all(|i| got[i] == want(i)), "reduce_scatter_tensor");

            // Uneven: rank p sends (p + q + 1) * 100k elements to q.
            let len = |p: usize, q: usize| (p + q + 1) * 100_000;
            let send: Vec<usize> = (0..world).map(|q| len(rank, q)).collect();
            let recv: Vec<usize> = (0..world).map(|p| len(p, rank)).collect();
            let data: Vec<f32> = (0..world)
                .flat_map(|q| (0..len(rank, q)).map(move |i| v(rank * 3 + q, i)))
                .collect();
            let input = Tensor::from_vec(data, &[send.iter().sum()]).unwrap();
            let out = Tensor::zeros(&[recv.iter().sum()], DType::F32).unwrap();
            pg.all_to_all_single(&out, &input, &recv, &send, None)
                .unwrap()
                .wait()
                .unwrap();
            let want: Vec<f32> = (0..world)
                .flat_map(|p| (0..len(p, rank)).map(move |i| v(p * 3 + rank, i)))
                .collect();
            assert!(
                out.to_vec::<f32>().unwrap() == want,
                "all_to_all_single uneven"
            );
        });
    }
}

fn large_averages_are_finished_exactly_once(choice: TransportChoice) {
    // Several pipelined arena steps over shared memory (where each share
    // is finished by the rank that reduced it) and ring segments over TCP:
    // AVG and PREMUL_SUM must divide or scale every element once, to the
    // bits of the exact sum then one rounding (the inputs are small
    // integers, so every partial sum is exact).
    let n = 700_000usize;
    let v = |r: usize, i: usize| ((r * 5 + i * 3) % 17) as f32 - 8.0;
    for world in [2, 3] {
        let pgs = groups(world, choice);
        on_every_rank(&pgs, |pg| {
            let rank = pg.rank();
            let sum = |i: usize| (0..world).map(|r| v(r, i)).sum::<f32>();
            for (op, want) in [
                (
                    ReduceOp::Avg,
                    Box::new(move |s: f32| s / world as f32) as Box<dyn Fn(f32) -> f32>,
                ),
                (ReduceOp::PremulSum(0.25), Box::new(|s: f32| s * 0.25)),
            ] {
                let t = Tensor::from_vec((0..n).map(|i| v(rank, i)).collect(), &[n]).unwrap();
                pg.all_reduce(&t, op, None).unwrap().wait().unwrap();
                let got = t.to_vec::<f32>().unwrap();
                let bad = (0..n).find(|&i| got[i].to_bits() != want(sum(i)).to_bits());
                assert_eq!(bad, None, "all_reduce {op} on {world} ranks");

                let t = Tensor::from_vec((0..n).map(|i| v(rank, i)).collect(), &[n]).unwrap();
                pg.reduce(&t, world - 1, op, None).unwrap().wait().unwrap();
                if rank == world - 1 {
                    let got = t.to_vec::<f32>().unwrap();
                    let bad = (0..n).find(|&i| got[i].to_bits() != want(sum(i)).to_bits());
                    assert_eq!(bad, None, "reduce {op} on {world} ranks");
                }
            }
        });
    }
}

fn large_reduces_match_references_at_every_root(choice: TransportChoice) {
    // Above the shared-memory arena's threshold (64 KiB) for every dtype
    // (over shm only the root copies the result out), and for f32 several
    // pipelined steps; the other ranks' tensors must come back untouched.
    for world in [2, 3, 4, 8] {
        let pgs = groups(world, choice);
        on_every_rank(&pgs, |pg| {
            let rank = pg.rank();
            let mut cases: Vec<(DType, ReduceOp, usize)> = DTYPES
                .iter()
                .flat_map(|&dtype| {
                    reduce_ops(dtype)
                        .into_iter()
                        .map(move |op| (dtype, op, 66_001))
                })
                .collect();
            cases.push((DType::F32, ReduceOp::Sum, 700_001));
            for (dtype, op, n) in cases {
                let v = |r: usize, i: usize| value(dtype, Some(op), r, i);
                for root in [0, world - 1, world / 2] {
                    let t = make(dtype, &[n], |i| v(rank, i));
                    let before = decode(&t);
                    pg.reduce(&t, root, op, None).unwrap().wait().unwrap();
                    let what =
                        format!("reduce {op} {dtype} n {n} world {world} root {root} rank {rank}");
                    if rank == root {
                        let want: Vec<f64> = (0..n)
                            .map(|i| {
                                reduce_ref(
                                    op,
                                    dtype,
                                    &(0..world).map(|r| v(r, i)).collect::<Vec<_>>(),
                                )
                            })
                            .collect();
                        assert_close(dtype, &decode(&t), &want, &what);
                    } else {
                        assert_eq!(decode(&t), before, "{what}: not the root, changed");
                    }
                }
            }
        });
    }
}

fn large_all_to_alls_in_every_form_match_references(choice: TransportChoice) {
    // Blocks above the shared-memory arena's threshold (over shm they go
    // through the arena, in many steps): even and uneven splits, in place,
    // into a permuted output, with broadcasts and all-reduces between.
    for world in [2, 3, 8] {
        let pgs = groups(world, choice);
        on_every_rank(&pgs, |pg| {
            let rank = pg.rank();
            let cell = |from: usize, to: usize, row: usize, c: usize| {
                (from * 1_000_000 + to * 10_000 + row * 3 + c) as f64
            };
            let f64s = |t: &Tensor<'_>| t.to_vec::<f64>().unwrap();
            for round in 0..2 {
                // Even: 700 rows of 3 f64 per block (16.8 KB).
                let rows = 700;
                let input = Tensor::from_vec(
                    (0..world * rows * 3)
                        .map(|i| cell(rank, i / (rows * 3), i % (rows * 3) / 3, i % 3))
                        .collect::<Vec<f64>>(),
                    &[world * rows, 3],
                )
                .unwrap();
                let want: Vec<f64> = (0..world * rows * 3)
                    .map(|i| cell(i / (rows * 3), rank, i % (rows * 3) / 3, i % 3))
                    .collect();
                let out = Tensor::zeros(&[world * rows, 3], DType::F64).unwrap();
                pg.all_to_all_single(&out, &input, &[], &[], None)
                    .unwrap()
                    .wait()
                    .unwrap();
                assert_eq!(f64s(&out), want, "even, round {round}");
                // In place: the output is the input.
                pg.all_to_all_single(&input, &input, &[], &[], None)
                    .unwrap()
                    .wait()
                    .unwrap();
                assert_eq!(f64s(&input), want, "in place, round {round}");

                // In place with uneven splits: rank r sends rank q
                // ((r - q) mod world + 1) x 1000 rows and receives
                // ((p - r) mod world + 1) x 1000 from rank p (the same
                // total, cut elsewhere).
                if world > 2 {
                    let split = |p: usize, q: usize| ((p + world - q) % world + 1) * 1000;
                    let send: Vec<usize> = (0..world).map(|q| split(rank, q)).collect();
                    let recv: Vec<usize> = (0..world).map(|p| split(p, rank)).collect();
                    let t = Tensor::from_vec(
                        (0..world)
                            .flat_map(|q| {
                                (0..send[q] * 3).map(move |i| cell(rank, q, i / 3, i % 3))
                            })
                            .collect::<Vec<f64>>(),
                        &[send.iter().sum(), 3],
                    )
                    .unwrap();
                    pg.all_to_all_single(&t, &t, &recv, &send, None)
                        .unwrap()
                        .wait()
                        .unwrap();
                    let want: Vec<f64> = (0..world)
                        .flat_map(|p| (0..recv[p] * 3).map(move |i| cell(p, rank, i / 3, i % 3)))
                        .collect();
                    assert_eq!(f64s(&t), want, "uneven in place, round {round}");
                }

                // Uneven lists: rank p sends rank q len(p, q) rows (some
                // empty); the block from rank 1 lands in a permuted view.
                let len = |p: usize, q: usize| ((p * 5 + q * 3 + round) % 4) * 900;
                let inputs: Vec<Tensor<'static>> = (0..world)
                    .map(|q| {
                        let n = len(rank, q);
                        Tensor::from_vec(
                            (0..n * 3)
                                .map(|i| cell(rank, q, i / 3, i % 3))
                                .collect::<Vec<f64>>(),
                            &[n, 3],
                        )
                        .unwrap()
                    })
                    .collect();
                let outputs: Vec<Tensor<'static>> = (0..world)
                    .map(|p| {
                        let n = len(p, rank);
                        if p == 1 {
                            Tensor::zeros(&[3, n], DType::F64)
                                .unwrap()
                                .permute(&[1, 0])
                                .unwrap()
                        } else {
                            Tensor::zeros(&[n, 3], DType::F64).unwrap()
                        }
                    })
                    .collect();
                pg.all_to_all(&outputs, &inputs, None)
                    .unwrap()
                    .wait()
                    .unwrap();
                for (p, out) in outputs.iter().enumerate() {
                    let want: Vec<f64> = (0..len(p, rank) * 3)
                        .map(|i| cell(p, rank, i / 3, i % 3))
                        .collect();
                    assert_eq!(f64s(out), want, "uneven from {p}, round {round}");
                }

                // The arena's other users, right after.
                let b = Tensor::from_vec(vec![(rank + round) as f64; 20_000], &[20_000]).unwrap();
                pg.broadcast(&b, world - 1, None).unwrap().wait().unwrap();
                assert!(f64s(&b).iter().all(|&v| v == (world - 1 + round) as f64));
                let r = Tensor::from_vec(vec![1.0f64; 20_000], &[20_000]).unwrap();
                pg.all_reduce(&r, ReduceOp::Sum, None)
                    .unwrap()
                    .wait()
                    .unwrap();
                assert!(f64s(&r).iter().all(|&v| v == world as f64));
            }
        });
    }
}

fn large_gathers_and_scatters_match_references_at_every_root(choice: TransportChoice) {
    // Blocks above the arena's threshold (over shm, through the arena),
    // several steps long, with the root's own block aliasing (gather into
    // a list holding the input itself, scatter from a list holding the
    // output) and a permuted block on the root.
    for world in [2, 3, 8] {
        let pgs = groups(world, choice);
        on_every_rank(&pgs, |pg| {
            let rank = pg.rank();
            let rows = 50_000 / world;
            let cell =
                |from: usize, to: usize, i: usize| (from * 1_000_000 + to * 100_000 + i) as i64;
            let block = |from: usize, to: usize| {
                Tensor::from_vec(
                    (0..rows * 2)
                        .map(|i| cell(from, to, i))
                        .collect::<Vec<i64>>(),
                    &[rows, 2],
                )
                .unwrap()
            };
            for root in [0, world - 1] {
                // gather: rank r's block (r, root) lands in list[r] on the root.
                let input = block(rank, root);
                let list: Vec<Tensor<'static>> = (0..world)
                    .map(|p| match p {
                        p if p == root => input.clone(),
                        1 => Tensor::zeros(&[2, rows], DType::I64)
                            .unwrap()
                            .permute(&[1, 0])
                            .unwrap(),
                        _ => Tensor::zeros(&[rows, 2], DType::I64).unwrap(),
                    })
                    .collect();
                let outs = (rank == root).then_some(list.as_slice());
                pg.gather(&input, outs, root, None).unwrap().wait().unwrap();
                if rank == root {
                    for (p, t) in list.iter().enumerate() {
                        let want: Vec<i64> = (0..rows * 2).map(|i| cell(p, root, i)).collect();
                        assert_eq!(
                            t.to_vec::<i64>().unwrap(),
                            want,
                            "gather from {p} root {root}"
                        );
                    }
                } else {
                    let want: Vec<i64> = (0..rows * 2).map(|i| cell(rank, root, i)).collect();
                    assert_eq!(input.to_vec::<i64>().unwrap(), want, "gather input changed");
                }

                // scatter: the root's block (root, q) lands on rank q.
                let output = Tensor::zeros(&[rows, 2], DType::I64).unwrap();
                let list: Vec<Tensor<'static>> = (0..world)
                    .map(|q| {
                        if q == root {
                            output.clone()
                        } else {
                            block(root, q)
                        }
                    })
                    .collect();
                if rank == root {
                    output.copy_from(&block(root, root)).unwrap();
                }
                let ins = (rank == root).then_some(list.as_slice());
                pg.scatter(&output, ins, root, None)
                    .unwrap()
                    .wait()
                    .unwrap();
                let want: Vec<i64> = (0..rows * 2).map(|i| cell(root, rank, i)).collect();
                assert_eq!(
                    output.to_vec::<i64>().unwrap(),
                    want,
                    "scatter to {rank} root {root}"
                );
            }
        });
    }
}

/// The reason of an `InvalidCollective` for `op`, or a panic.
fn invalid(result: tensorcomm::Result<tensorcomm::group::Work>, op: &str) -> String {
    match result {
        Err(Error::InvalidCollective { op: o, reason }) if o == op => reason,
        other => panic!("expected InvalidCollective from {op}, got {other:?}"),
    }
}

fn shape_mismatch(
    result: tensorcomm::Result<tensorcomm::group::Work>,
) -> (String, Vec<usize>, Vec<usize>) {
    match result {
        Err(Error::ShapeMismatch {
            context,
            expected,
            found,
        }) => (context, expected, found),
        other => panic!("expected ShapeMismatch, got {other:?}"),
    }
}

fn dtype_mismatch(result: tensorcomm::Result<tensorcomm::group::Work>) -> (String, DType, DType) {
    match result {
        Err(Error::DTypeMismatch {
            context,
            expected,
            found,
        }) => (context, expected, found),
        other => panic!("expected DTypeMismatch, got {other:?}"),
    }
}

fn invalid_arguments_are_refused_before_sending_and_the_group_stays_usable(
    choice: TransportChoice,
) {
    let pgs = groups(2, choice);
    let f = |shape: &[usize]| Tensor::zeros(shape, DType::F32).unwrap();
    let i = |shape: &[usize]| Tensor::zeros(shape, DType::I32).unwrap();
    let pg = &pgs[0];

    // Wrong list lengths, naming expected and found.
    let reason = invalid(pg.all_gather(&[f(&[2])], &f(&[2]), None), "all_gather");
    assert!(
        reason.contains("expected 2") && reason.contains("found 1"),
        "{reason}"
    );
    let reason = invalid(
        pg.reduce_scatter(&f(&[2]), &[f(&[2]), f(&[2]), f(&[2])], ReduceOp::Sum, None),
        "reduce_scatter",
    );
    assert!(
        reason.contains("expected 2") && reason.contains("found 3"),
        "{reason}"
    );
    let reason = invalid(
        pg.all_to_all(&[f(&[1]), f(&[1])], &[f(&[1])], None),
        "all_to_all",
    );
    assert!(
        reason.contains("input_tensors") && reason.contains("found 1"),
        "{reason}"
    );
    let reason = invalid(pg.scatter(&f(&[2]), Some(&[f(&[2])]), 0, None), "scatter");
    assert!(
        reason.contains("scatter_list") && reason.contains("found 1"),
        "{reason}"
    );
    let reason = invalid(pg.gather(&f(&[2]), None, 0, None), "gather");
    assert!(reason.contains("root"), "{reason}");
    let reason = invalid(
        pgs[1].gather(&f(&[2]), Some(&[f(&[2]), f(&[2])]), 0, None),
        "gather",
    );
    assert!(
        reason.contains("not the root") && reason.contains("found 2"),
        "{reason}"
    );
    let reason = invalid(
        pg.all_gather_coalesced(&[vec![f(&[1])], vec![]], &[f(&[1])], None),
        "all_gather_coalesced",
    );
    assert!(
        reason.contains("output_tensor_lists[1]") && reason.contains("found 0"),
        "{reason}"
    );

    // Empty lists.
    let reason = invalid(
        pg.all_reduce_coalesced(&[], ReduceOp::Sum, None),
        "all_reduce_coalesced",
    );
    assert!(reason.contains("empty"), "{reason}");
    let reason = invalid(
        pg.all_gather_coalesced(&[vec![], vec![]], &[], None),
        "all_gather_coalesced",
    );
    assert!(reason.contains("empty"), "{reason}");

    // Mixed dtypes, naming the index.
    let (context, expected, found) =
        dtype_mismatch(pg.all_gather(&[f(&[2]), i(&[2])], &f(&[2]), None));
    assert!(context.contains("output_tensors[1]"), "{context}");
    assert_eq!((expected, found), (DType::F32, DType::I32));
    let (context, ..) =
        dtype_mismatch(pg.all_reduce_coalesced(&[f(&[2]), i(&[1])], ReduceOp::Sum, None));
    assert!(context.contains("tensors[1]"), "{context}");
    let (context, ..) =
        dtype_mismatch(pg.all_to_all(&[f(&[1]), i(&[1])], &[f(&[1]), f(&[1])], None));
    assert!(context.contains("output_tensors[1]"), "{context}");
    let (context, ..) = dtype_mismatch(pg.all_to_all_single(&i(&[2]), &f(&[2]), &[], &[], None));
    assert!(context.contains("output"), "{context}");

    // Wrong sizes and shapes.
    let (context, expected, found) =
        shape_mismatch(pg.all_gather(&[f(&[2]), f(&[3])], &f(&[2]), None));
    assert!(context.contains("output_tensors[1]"), "{context}");
    assert_eq!((expected, found), (vec![2], vec![3]));
    let (_, expected, found) =
        shape_mismatch(pg.all_gather_into_tensor(&f(&[5, 3]), &f(&[2, 3]), None));
    assert_eq!((expected, found), (vec![4, 3], vec![5, 3]));
    let (_, expected, found) =
        shape_mismatch(pg.reduce_scatter_tensor(&f(&[2]), &f(&[3]), ReduceOp::Sum, None));
    assert_eq!((expected, found), (vec![4], vec![3]));
    let (context, ..) = shape_mismatch(pg.scatter(&f(&[2]), Some(&[f(&[2]), f(&[1])]), 0, None));
    assert!(context.contains("scatter_list[1]"), "{context}");
    let (context, ..) =
        shape_mismatch(pg.reduce_scatter(&f(&[2]), &[f(&[2]), f(&[2, 1])], ReduceOp::Sum, None));
    assert!(context.contains("input_tensors[1]"), "{context}");
    let (_, expected, found) =
        shape_mismatch(pg.all_to_all_single(&f(&[2, 4]), &f(&[2, 3]), &[], &[], None));
    assert_eq!((expected, found), (vec![3], vec![4]));
    shape_mismatch(pg.all_to_all(&[f(&[3]), f(&[1])], &[f(&[2]), f(&[1])], None));

    // Split sizes.
    let reason = invalid(
        pg.all_to_all_single(&f(&[4]), &f(&[4]), &[], &[1, 2], None),
        "all_to_all_single",
    );
    assert!(
        reason.contains("sum to its dim 0 (4)") && reason.contains("[1, 2]"),
        "{reason}"
    );
    let reason = invalid(
        pg.all_to_all_single(&f(&[4]), &f(&[4]), &[4], &[], None),
        "all_to_all_single",
    );
    assert!(
        reason.contains("expected 2 split sizes") && reason.contains("found 1"),
        "{reason}"
    );
    let reason = invalid(
        pg.all_to_all_single(&f(&[3]), &f(&[3]), &[], &[], None),
        "all_to_all_single",
    );
    assert!(
        reason.contains("divisible") && reason.contains("found 3"),
        "{reason}"
    );
    let reason = invalid(
        pg.all_to_all_single(&f(&[]), &f(&[]), &[], &[], None),
        "all_to_all_single",
    );
    assert!(reason.contains("at least one dimension"), "{reason}");
    let reason = invalid(
        pg.all_to_all_single(&f(&[3]), &f(&[3]), &[1, 2], &[2, 1], None),
        "all_to_all_single",
    );
    assert!(reason.contains("rows"), "{reason}");

    // Roots and reduce ops.
    let reason = invalid(pg.reduce(&f(&[2]), 2, ReduceOp::Sum, None), "reduce");
    assert!(
        reason.contains("0..2") && reason.contains("found 2"),
        "{reason}"
    );
    invalid(pg.gather(&f(&[2]), None, 7, None), "gather");
    invalid(pg.scatter(&f(&[2]), None, 2, None), "scatter");
    for result in [
        pg.reduce(&f(&[2]), 0, ReduceOp::Band, None),
        pg.reduce_scatter_tensor(&f(&[1]), &f(&[2]), ReduceOp::Bxor, None),
        pg.all_reduce_coalesced(&[f(&[1])], ReduceOp::Bor, None),
        pg.all_reduce(&i(&[2]), ReduceOp::PremulSum(0.5), None),
        pg.reduce_scatter(
            &i(&[1]),
            &[i(&[1]), i(&[1])],
            ReduceOp::PremulSum(2.0),
            None,
        ),
    ] {
        assert!(
            matches!(result, Err(Error::UnsupportedReduceOp { .. })),
            "{result:?}"
        );
    }

    // Nothing was sent and no sequence number taken: the ranks still agree.
    on_every_rank(&pgs, |pg| {
        let input = Tensor::from_vec(vec![pg.rank() as i64 + 1; 2], &[2]).unwrap();
        let out = Tensor::zeros(&[4], DType::I64).unwrap();
        pg.all_gather_into_tensor(&out, &input, None)
            .unwrap()
            .wait()
            .unwrap();
        assert_eq!(out.to_vec::<i64>().unwrap(), [1, 1, 2, 2]);
    });
}

fn mismatch_source(err: Error) -> (String, String) {
    match err {
        Error::CollectiveFailed { source, .. } => match *source {
            Error::CollectiveMismatch { mine, theirs, .. } => (mine, theirs),
            other => panic!("expected a CollectiveMismatch, got {other:?}"),
        },
        other => panic!("expected CollectiveFailed, got {other:?}"),
    }
}

fn different_roots_are_reported_with_both_fingerprints(choice: TransportChoice) {
    let pgs = groups(2, choice);
    let errors = on_every_rank(&pgs, |pg| {
        let out = Tensor::zeros(&[2], DType::F32).unwrap();
        let root = pg.rank(); // each rank believes it is the root
        let list = [out.clone(), out.clone()];
        pg.scatter(&out, Some(&list), root, None)
            .unwrap()
            .wait()
            .unwrap_err()
    });
    for (rank, err) in errors.into_iter().enumerate() {
        let (mine, theirs) = mismatch_source(err);
        assert!(mine.contains(&format!("root {rank}")), "{mine}");
        assert!(theirs.contains(&format!("root {}", 1 - rank)), "{theirs}");
    }
}

fn uneven_all_to_all_sizes_that_disagree_fail_instead_of_hanging(choice: TransportChoice) {
    let pgs = groups(2, choice);
    let errors = on_every_rank(&pgs, |pg| {
        // Rank 0 sends 3 elements to rank 1, which expects 2.
        let (send, recv) = if pg.rank() == 0 {
            ([1, 3], [1, 1])
        } else {
            ([1, 1], [2, 1])
        };
        let input = Tensor::zeros(&[send.iter().sum()], DType::I32).unwrap();
        let out = Tensor::zeros(&[recv.iter().sum()], DType::I32).unwrap();
        pg.all_to_all_single(&out, &input, &recv, &send, None)
            .unwrap()
            .wait()
            .unwrap_err()
    });
    for err in errors {
        let (mine, theirs) = mismatch_source(err);
        assert!(
            mine.contains("bytes") && theirs.contains("bytes"),
            "{mine} / {theirs}"
        );
    }
}
