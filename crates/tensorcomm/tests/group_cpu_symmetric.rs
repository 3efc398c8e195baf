//! Tensors in symmetric memory (`ProcessGroup::symmetric_zeros`) on the
//! CPU backend, between threads: all-reduces of them (whole and as views)
//! match references for several dtypes, ops and world sizes, back to back
//! with staged all-reduces and broadcasts, and with each rank scribbling
//! over its region as soon as a call returns; ranks that disagree (sizes,
//! a private tensor on one rank, other offsets) fail by name on every
//! rank; over TCP the tensor is an ordinary one.

mod common;

use std::sync::Arc;

use common::{groups_over, on_every_rank};
use tensorcomm::cpu::backend::ProcessGroupCpu;
use tensorcomm::cpu::transport::TransportChoice;
use tensorcomm::group::{ProcessGroup, ReduceOp};
use tensorcomm::store::HashStore;
use tensorcomm::tensor::{DType, Tensor};
use tensorcomm::Error;

fn groups(world: usize, choice: TransportChoice) -> Vec<ProcessGroupCpu> {
    groups_over(world, &Arc::new(HashStore::new()), "sym", choice)
}

/// Rank `rank`'s input at index `i`: small integers, exact in every dtype
/// and under every op used here (products of 1s and 2s).
fn input(op: ReduceOp, rank: usize, i: usize) -> f64 {
    match op {
        ReduceOp::Product => ((i + rank) % 2 + 1) as f64,
        _ => ((i * 7 + rank * 3) % 5 + 1) as f64,
    }
}

fn reference(op: ReduceOp, world: usize, i: usize) -> f64 {
    let vals: Vec<f64> = (0..world).map(|r| input(op, r, i)).collect();
    match op {
        ReduceOp::Sum => vals.iter().sum(),
        ReduceOp::Avg => vals.iter().sum::<f64>() / world as f64,
        ReduceOp::Product => vals.iter().product(),
        ReduceOp::Max => vals.iter().copied().fold(f64::MIN, f64::max),
        ReduceOp::Min => vals.iter().copied().fold(f64::MAX, f64::min),
        ReduceOp::Bxor => vals.iter().fold(0, |a, &v| a ^ v as i64) as f64,
        other => unreachable!("{other:?}"),
    }
}

fn values(dtype: DType, n: usize, f: impl Fn(usize) -> f64) -> Tensor<'static> {
    match dtype {
        DType::F32 => Tensor::from_vec((0..n).map(|i| f(i) as f32).collect(), &[n]),
        DType::F64 => Tensor::from_vec((0..n).map(&f).collect(), &[n]),
        DType::BF16 => Tensor::from_vec((0..n).map(|i| half::bf16::from_f64(f(i))).collect(), &[n]),
        DType::I32 => Tensor::from_vec((0..n).map(|i| f(i) as i32).collect(), &[n]),
        DType::I64 => Tensor::from_vec((0..n).map(|i| f(i) as i64).collect(), &[n]),
        other => unreachable!("{other}"),
    }
    .unwrap()
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
        DType::BF16 => t
            .to_vec::<half::bf16>()
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
        other => unreachable!("{other}"),
    }
}

/// The error a collective's `Work` ends with, unwrapped to its source.
fn source(err: Error) -> Error {
    match err {
        Error::CollectiveFailed { source, .. } => *source,
        other => other,
    }
}

#[test]
fn all_reduces_of_symmetric_tensors_match_references() {
    // 12289 elements: past the arena's threshold for every dtype here,
    // shares and lanes of uneven sizes.
    let n = 12289;
    for world in [2, 3, 4, 8] {
        let pgs = groups(world, TransportChoice::Shm);
        let mut cases = vec![
            (DType::F32, ReduceOp::Sum),
            (DType::F64, ReduceOp::Max),
            (DType::BF16, ReduceOp::Sum),
            (DType::I32, ReduceOp::Bxor),
            (DType::I64, ReduceOp::Min),
            (DType::F64, ReduceOp::Product),
        ];
        if world.is_power_of_two() {
            cases.push((DType::F32, ReduceOp::Avg)); // exact divisions
        }
        for (dtype, op) in cases {
            let results = on_every_rank(&pgs, |pg| {
                let t = pg.symmetric_zeros(&[n], dtype).unwrap();
                assert!(decode(&t).iter().all(|&v| v == 0.0), "not zero-filled");
                t.copy_from(&values(dtype, n, |i| input(op, pg.rank(), i)))
                    .unwrap();
                pg.all_reduce(&t, op, None).unwrap().wait().unwrap();
                decode(&t)
            });
            let want: Vec<f64> = (0..n).map(|i| reference(op, world, i)).collect();
            for (rank, got) in results.iter().enumerate() {
                assert_eq!(got, &want, "world {world} {dtype} {op:?} rank {rank}");
            }
        }
    }
}

#[test]
fn views_mixed_with_staged_all_reduces_and_broadcasts_stay_exact() {
    let world = 3;
    let pgs = groups(world, TransportChoice::Shm);
    let n = 40_000;
    let results = on_every_rank(&pgs, |pg| {
        let r = pg.rank() as i64;
        let sym = pg.symmetric_zeros(&[n], DType::I64).unwrap();
        let private = Tensor::zeros(&[n], DType::I64).unwrap();
        let mut seen = Vec::new();
        for k in 0..6i64 {
            // A view from byte 8 * (1000 + k): the same offset on every rank.
            let view = sym.narrow(0, 1000 + k as usize, 30_000).unwrap();
            sym.fill(-1i64).unwrap();
            view.fill(r + k).unwrap();
            pg.all_reduce(&view, ReduceOp::Sum, None)
                .unwrap()
                .wait()
                .unwrap();
            seen.push(sym.to_vec::<i64>().unwrap());
            private.fill(r * k).unwrap();
            pg.all_reduce(&private, ReduceOp::Sum, None)
                .unwrap()
                .wait()
                .unwrap();
            seen.push(private.to_vec::<i64>().unwrap());
            if k % 2 == 0 {
                if pg.rank() == 1 {
                    sym.fill(k + 100).unwrap();
                }
                pg.broadcast(&sym, 1, None).unwrap().wait().unwrap();
                seen.push(sym.to_vec::<i64>().unwrap());
            }
        }
        seen
    });
    let total: i64 = (0..world as i64).sum();
    let mut want = Vec::new();
    for k in 0..6i64 {
        let mut v = vec![-1i64; n];
        let from = 1000 + k as usize;
        v[from..from + 30_000].fill(total + world as i64 * k);
        want.push(v);
        want.push(vec![total * k; n]);
        if k % 2 == 0 {
            want.push(vec![k + 100; n]);
        }
    }
    for (rank, got) in results.iter().enumerate() {
        assert!(got == &want, "rank {rank}");
    }
}

#[test]
fn back_to_back_calls_survive_scribbles_right_after_each_return() {
    // Each rank overwrites its whole region the moment a call returns. A
    // rank still reading a peer's region then (the copy-out of that peer's
    // share) would sum the scribble in: every result is checked, on every
    // rank, for many calls, with staged all-reduces and broadcasts between.
    let world = 4;
    let pgs = groups(world, TransportChoice::Shm);
    let n = 20_011;
    let calls = 150;
    let results = on_every_rank(&pgs, |pg| {
        let r = pg.rank() as i32;
        let sym = pg.symmetric_zeros(&[n], DType::I32).unwrap();
        let private = Tensor::zeros(&[n], DType::I32).unwrap();
        let mut wrong = Vec::new();
        for k in 0..calls {
            sym.fill(r + k).unwrap();
            pg.all_reduce(&sym, ReduceOp::Sum, None)
                .unwrap()
                .wait()
                .unwrap();
            let got = sym.to_vec::<i32>().unwrap();
            sym.fill(-1_000_000i32).unwrap();
            let want = (0..world as i32).sum::<i32>() + world as i32 * k;
            if got.iter().any(|&v| v != want) {
                wrong.push(format!("call {k}: all_reduce"));
            }
            match k % 3 {
                0 => {
                    private.fill(r).unwrap();
                    pg.all_reduce(&private, ReduceOp::Max, None)
                        .unwrap()
                        .wait()
                        .unwrap();
                    if private
                        .to_vec::<i32>()
                        .unwrap()
                        .iter()
                        .any(|&v| v != world as i32 - 1)
                    {
                        wrong.push(format!("call {k}: staged all_reduce"));
                    }
                }
                1 => {
                    if r == 2 {
                        sym.fill(k * 10).unwrap();
                    }
                    pg.broadcast(&sym, 2, None).unwrap().wait().unwrap();
                    let got = sym.to_vec::<i32>().unwrap();
                    sym.fill(-7i32).unwrap();
                    if got.iter().any(|&v| v != k * 10) {
                        wrong.push(format!("call {k}: broadcast"));
                    }
                }
                _ => {}
            }
        }
        wrong
    });
    for (rank, wrong) in results.iter().enumerate() {
        assert!(wrong.is_empty(), "rank {rank}: {wrong:?}");
    }
}

#[test]
fn a_rank_passing_a_private_tensor_fails_every_rank_naming_both() {
    let pgs = groups(3, TransportChoice::Shm);
    let errors = on_every_rank(&pgs, |pg| {
        let sym = pg.symmetric_zeros(&[8192], DType::F32).unwrap();
        let t = if pg.rank() == 2 {
            Tensor::zeros(&[8192], DType::F32).unwrap()
        } else {
            sym
        };
        source(
            pg.all_reduce(&t, ReduceOp::Sum, None)
                .unwrap()
                .wait()
                .unwrap_err(),
        )
    });
    for (rank, err) in errors.into_iter().enumerate() {
        match err {
            Error::CollectiveMismatch { mine, theirs, .. } => {
                let both = format!("{mine} / {theirs}");
                assert!(
                    both.contains("symmetric allocation 0") && both.contains("private tensor"),
                    "rank {rank}: {both}"
                );
            }
            other => panic!("rank {rank}: expected a mismatch, found {other:?}"),
        }
    }
}

#[test]
fn views_at_different_offsets_fail_naming_both_offsets() {
    let pgs = groups(2, TransportChoice::Shm);
    let errors = on_every_rank(&pgs, |pg| {
        let sym = pg.symmetric_zeros(&[10_000], DType::F32).unwrap();
        let view = sym.narrow(0, pg.rank() * 100, 5000).unwrap();
        source(
            pg.all_reduce(&view, ReduceOp::Sum, None)
                .unwrap()
                .wait()
                .unwrap_err(),
        )
    });
    for (rank, err) in errors.into_iter().enumerate() {
        match err {
            Error::CollectiveMismatch { mine, theirs, .. } => {
                let (a, b) = if rank == 0 { (0, 400) } else { (400, 0) };
                assert!(
                    mine.contains(&format!("at byte {a} "))
                        && theirs.contains(&format!("at byte {b} ")),
                    "rank {rank}: {mine} / {theirs}"
                );
            }
            other => panic!("rank {rank}: expected a mismatch, found {other:?}"),
        }
    }
}

#[test]
fn ranks_asking_different_shapes_fail_and_the_group_stays_usable() {
    let pgs = groups(2, TransportChoice::Shm);
    let outcomes = on_every_rank(&pgs, |pg| {
        let err = pg
            .symmetric_zeros(&[1000 * (pg.rank() + 1)], DType::F32)
            .unwrap_err();
        // Nothing was sent between the ranks: the group still works.
        let t = pg.symmetric_zeros(&[3000], DType::F32).unwrap();
        t.fill(1.0f32).unwrap();
        pg.all_reduce(&t, ReduceOp::Sum, None)
            .unwrap()
            .wait()
            .unwrap();
        (err, t.to_vec::<f32>().unwrap())
    });
    for (rank, (err, sums)) in outcomes.into_iter().enumerate() {
        match err {
            Error::CollectiveMismatch { mine, theirs, .. } => assert!(
                mine.contains(&format!("{} bytes per rank", 4000 * (rank + 1)))
                    && theirs.contains(&format!("{} bytes per rank", 4000 * (2 - rank))),
                "rank {rank}: {mine} / {theirs}"
            ),
            other => panic!("rank {rank}: expected a size mismatch, found {other:?}"),
        }
        assert!(sums.iter().all(|&v| v == 2.0), "rank {rank}");
    }
}

#[test]
fn a_symmetric_tensor_cannot_be_taken_as_a_vec() {
    let pgs = groups(2, TransportChoice::Shm);
    let errors = on_every_rank(&pgs, |pg| {
        let t = pg.symmetric_zeros(&[16], DType::F32).unwrap();
        t.into_vec::<f32>().unwrap_err().to_string()
    });
    for e in errors {
        assert!(e.contains("symmetric shared memory"), "{e}");
    }
}

#[test]
fn over_tcp_symmetric_zeros_gives_an_ordinary_tensor() {
    let pgs = groups(3, TransportChoice::Tcp);
    // Repeated: the group's thread once still held the tensor for a moment
    // after `wait` returned, and `into_vec` found its storage shared.
    let results = on_every_rank(&pgs, |pg| {
        (0..50)
            .map(|_| {
                let t = pg.symmetric_zeros(&[5000], DType::I32).unwrap();
                t.fill(pg.rank() as i32 + 1).unwrap();
                pg.all_reduce(&t, ReduceOp::Sum, None)
                    .unwrap()
                    .wait()
                    .unwrap();
                t.into_vec::<i32>().unwrap()
            })
            .collect::<Vec<_>>()
    });
    for got in results.into_iter().flatten() {
        assert_eq!(got, vec![6; 5000]);
    }
}
