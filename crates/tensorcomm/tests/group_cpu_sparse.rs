//! Sparse all-reduce of the CPU process group for world sizes 1, 2, 3, 4
//! and 8, over TCP and over shared memory (modules `tcp` and `shm`), against
//! a dense reference summed independently here: duplicate coordinates
//! within and across ranks, disjoint ones, dense dimensions, empty inputs,
//! and entries large enough to travel in several pieces.

mod common;

use std::sync::Arc;

use common::{groups_over as groups, on_every_rank};
use tensorcomm::cpu::transport::TransportChoice;
use tensorcomm::group::{ProcessGroup, ReduceOp};
use tensorcomm::store::HashStore;
use tensorcomm::tensor::{DType, SparseTensor, Tensor};
use tensorcomm::Error;

over_transports!(
    sums_match_a_dense_reference_for_world_sizes_1_to_8,
    two_sparse_dims_in_f32_with_duplicates_across_ranks,
    only_sum_is_accepted_and_mismatched_sizes_are_reported,
    entries_of_several_pieces_and_unequal_counts_arrive_whole,
);

/// Rank `rank`'s entries of a [10, 3] tensor (1 sparse, 1 dense dim):
/// row 0 on every rank, row 2 twice on every rank, row `5 + rank % 5`
/// (its own up to 5 ranks; ranks r and r + 5 of 8 share it), and none at
/// all on rank 1 of 3.
fn entries(rank: usize, world: usize) -> Vec<(usize, [i64; 3])> {
    if world == 3 && rank == 1 {
        return Vec::new();
    }
    let v = |k: i64| [k, 10 * k, -k];
    vec![
        (2, v(rank as i64 + 1)),
        (5 + rank % 5, v(7)),
        (0, v(100)),
        (2, v(3)),
    ]
}

fn sparse(entries: &[(usize, [i64; 3])]) -> SparseTensor {
    let indices = entries.iter().map(|(i, _)| *i as i64).collect();
    let values: Vec<i64> = entries.iter().flat_map(|(_, v)| *v).collect();
    let values = Tensor::from_vec(values, &[entries.len(), 3]).unwrap();
    SparseTensor::new(indices, values, &[10, 3]).unwrap()
}

fn sums_match_a_dense_reference_for_world_sizes_1_to_8(choice: TransportChoice) {
    for world in [1, 2, 3, 4, 8] {
        let pgs = groups(world, &Arc::new(HashStore::new()), "pg", choice);
        let results = on_every_rank(&pgs, |pg| {
            let input = sparse(&entries(pg.rank(), world));
            let sum = pg
                .all_reduce_sparse(&input, ReduceOp::Sum, None)
                .unwrap()
                .wait()
                .unwrap();
            (
                sum.indices().to_vec(),
                sum.values().to_vec::<i64>().unwrap(),
                sum.is_coalesced(),
                sum.sizes().to_vec(),
            )
        });
        let mut dense = [[0i64; 3]; 10];
        for rank in 0..world {
            for (i, v) in entries(rank, world) {
                for (d, x) in v.iter().enumerate() {
                    dense[i][d] += x;
                }
            }
        }
        let rows: Vec<usize> = (0..10).filter(|&i| dense[i] != [0; 3]).collect();
        let values: Vec<i64> = rows.iter().flat_map(|&i| dense[i]).collect();
        let indices: Vec<i64> = rows.iter().map(|&i| i as i64).collect();
        for (rank, (got_indices, got_values, coalesced, sizes)) in results.into_iter().enumerate() {
            assert_eq!(got_indices, indices, "world {world} rank {rank}");
            assert_eq!(got_values, values, "world {world} rank {rank}");
            assert!(coalesced);
            assert_eq!(sizes, [10, 3]);
        }
    }
}

fn two_sparse_dims_in_f32_with_duplicates_across_ranks(choice: TransportChoice) {
    let pgs = groups(3, &Arc::new(HashStore::new()), "pg", choice);
    let results = on_every_rank(&pgs, |pg| {
        let r = pg.rank() as i64;
        // (r, 1) is disjoint per rank; (2, 3) is shared; (0, 0) repeats.
        let indices = vec![r, 2, 0, 0, /* cols */ 1, 3, 0, 0];
        let values = Tensor::from_vec(vec![1.0f32 + r as f32, 0.5, 2.0, 0.25], &[4]).unwrap();
        let s = SparseTensor::new(indices, values, &[3, 4]).unwrap();
        let sum = pg
            .all_reduce_sparse(&s, ReduceOp::Sum, None)
            .unwrap()
            .wait()
            .unwrap();
        sum.to_dense().unwrap().to_vec::<f32>().unwrap()
    });
    let mut expected = vec![0.0f32; 12];
    for r in 0..3 {
        expected[r * 4 + 1] += 1.0 + r as f32;
        expected[2 * 4 + 3] += 0.5;
        expected[0] += 2.25;
    }
    for got in results {
        assert_eq!(got, expected);
    }
}

fn only_sum_is_accepted_and_mismatched_sizes_are_reported(choice: TransportChoice) {
    let pgs = groups(2, &Arc::new(HashStore::new()), "pg", choice);
    let s = sparse(&entries(0, 2));
    for op in [ReduceOp::Max, ReduceOp::Avg, ReduceOp::Product] {
        match pgs[0].all_reduce_sparse(&s, op, None) {
            Err(Error::UnsupportedReduceOp {
                op: o,
                reduce_op,
                what,
            }) => {
                assert_eq!(
                    (o.as_str(), reduce_op.as_str()),
                    ("all_reduce_sparse", op.name())
                );
                assert!(what.contains("sparse"), "{what}");
            }
            other => panic!("{other:?}"),
        }
    }
    // Nothing was sent; now the ranks disagree on the sizes.
    let errors = on_every_rank(&pgs, |pg| {
        let n = 4 + pg.rank();
        let values = Tensor::zeros(&[1], DType::F32).unwrap();
        let s = SparseTensor::new(vec![1], values, &[n]).unwrap();
        pg.all_reduce_sparse(&s, ReduceOp::Sum, None)
            .unwrap()
            .wait()
            .unwrap_err()
    });
    for (rank, err) in errors.into_iter().enumerate() {
        match err {
            Error::CollectiveFailed {
                op,
                seq: 0,
                ranks,
                source,
                ..
            } => {
                assert_eq!((op.as_str(), ranks), ("all_reduce_sparse", vec![1 - rank]));
                assert!(
                    matches!(*source, Error::CollectiveMismatch { .. }),
                    "{source:?}"
                );
            }
            other => panic!("{other:?}"),
        }
    }
}

/// The entries travel in pieces that double from 1 MiB: 0, 1 and 9 MiB of
/// entries on three ranks make pairs where one side sends more pieces than
/// it receives, and every receiver grows its buffer piece by piece.
fn entries_of_several_pieces_and_unequal_counts_arrive_whole(choice: TransportChoice) {
    const ROWS: usize = 1000;
    // 32 bytes an entry: one coordinate, three i64 values.
    let count = |rank: usize| [0, 1 << 15, 9 << 15][rank];
    let entry = |rank: usize, j: usize| ((j * 7 + rank) % ROWS, [j as i64, rank as i64, 1]);
    let pgs = groups(3, &Arc::new(HashStore::new()), "pg", choice);
    let results = on_every_rank(&pgs, |pg| {
        let r = pg.rank();
        let mine: Vec<_> = (0..count(r)).map(|j| entry(r, j)).collect();
        let indices = mine.iter().map(|(i, _)| *i as i64).collect();
        let values: Vec<i64> = mine.iter().flat_map(|(_, v)| *v).collect();
        let values = Tensor::from_vec(values, &[mine.len(), 3]).unwrap();
        let s = SparseTensor::new(indices, values, &[ROWS, 3]).unwrap();
        let sum = pg
            .all_reduce_sparse(&s, ReduceOp::Sum, None)
            .unwrap()
            .wait()
            .unwrap();
        sum.to_dense().unwrap().to_vec::<i64>().unwrap()
    });
    let mut expected = vec![0i64; ROWS * 3];
    for rank in 0..3 {
        for j in 0..count(rank) {
            let (i, v) = entry(rank, j);
            for (d, x) in v.iter().enumerate() {
                expected[i * 3 + d] += x;
            }
        }
    }
    for (rank, got) in results.into_iter().enumerate() {
        assert!(got == expected, "rank {rank} summed other values");
    }
}
