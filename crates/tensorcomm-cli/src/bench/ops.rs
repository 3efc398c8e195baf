//! Per-op buffers, launch and independent correctness check for `tensorcomm
//! bench`.
//!
//! A row's `count` is the elements of the op's largest buffer, as in
//! nccl-tests: the whole tensor for all_reduce, broadcast and reduce; the
//! gathered output for the all_gather family and gather; the full input for
//! the reduce_scatter family and scatter; each rank's whole send buffer for
//! all_to_all. Ops that split their buffer over the ranks round `count`
//! down to a multiple of the rank count ([`row_count`]); each rank's piece
//! is `count / ranks` elements. Inputs come from [`value`] and the
//! expected outputs are computed here from it, never by the library.
//! Rooted ops use root 0; reducing ops check with SUM.

use tensorcomm::group::{ProcessGroup, ReduceOp, Work};
use tensorcomm::tensor::{DType, Tensor};

use super::data::{all_reduce_sum, decode, make, value};
use super::BenchOp;

/// The tensors one rank passes to one op.
pub struct Buffers {
    inputs: Vec<Tensor<'static>>,
    outputs: Vec<Tensor<'static>>,
}

/// True for ops whose buffer is split into one piece per rank.
fn split_per_rank(op: BenchOp) -> bool {
    !matches!(
        op,
        BenchOp::AllReduce | BenchOp::Broadcast | BenchOp::Reduce | BenchOp::AllReduceCoalesced
    )
}

/// The element count of a row of `count` requested elements: a multiple
/// of `ranks` (at least `ranks`) for ops that split their buffer.
pub fn row_count(op: BenchOp, count: usize, ranks: usize) -> usize {
    if split_per_rank(op) {
        (count / ranks).max(1) * ranks
    } else {
        count.max(1)
    }
}

/// Rank `rank`'s input element `i`, decoded as the dtype stores it.
fn expected(dtype: DType, rank: usize, i: usize) -> f64 {
    let v = value(rank, i);
    if dtype == DType::Bool {
        f64::from(u8::from(v != 0.0))
    } else {
        v
    }
}

/// Whether `op` allocates the same buffers on every rank, as tensors in
/// symmetric memory must be (gather and scatter fill lists on the root
/// only).
pub fn symmetric_allowed(op: BenchOp) -> bool {
    !matches!(op, BenchOp::Gather | BenchOp::Scatter)
}

/// Fresh buffers for `op` on `rank` of `ranks`, for a row of `count`
/// elements (see [`row_count`]); in the symmetric memory of `symmetric`
/// when given (the rank's group; for ops [`symmetric_allowed`] only).
pub fn setup(
    op: BenchOp,
    (rank, ranks): (usize, usize),
    dtype: DType,
    count: usize,
    symmetric: Option<&dyn ProcessGroup>,
) -> tensorcomm::Result<Buffers> {
    let piece = count / ranks;
    let zeros = |n: usize| match symmetric {
        Some(pg) => pg.symmetric_zeros(&[n], dtype),
        None => Tensor::zeros(&[n], dtype),
    };
    let own = |n: usize, offset: usize| {
        let values = make(dtype, n, |i| value(rank, offset + i))?;
        if symmetric.is_none() {
            return Ok(values);
        }
        let t = zeros(n)?;
        t.copy_from(&values)?;
        Ok(t)
    };
    let per_rank = |f: &dyn Fn(usize) -> tensorcomm::Result<Tensor<'static>>| {
        (0..ranks).map(f).collect::<tensorcomm::Result<Vec<_>>>()
    };
    let (inputs, outputs) = match op {
        BenchOp::AllReduce | BenchOp::Broadcast | BenchOp::Reduce => (vec![own(count, 0)?], vec![]),
        BenchOp::AllReduceCoalesced => {
            let half = count / 2;
            (vec![own(half, 0)?, own(count - half, half)?], vec![])
        }
        BenchOp::AllGather | BenchOp::AllGatherCoalesced => {
            (vec![own(piece, 0)?], per_rank(&|_| zeros(piece))?)
        }
        BenchOp::AllGatherIntoTensor => (vec![own(piece, 0)?], vec![zeros(count)?]),
        BenchOp::Gather => {
            let outputs = if rank == 0 {
                per_rank(&|_| zeros(piece))?
            } else {
                vec![]
            };
            (vec![own(piece, 0)?], outputs)
        }
        BenchOp::Scatter => {
            let inputs = if rank == 0 {
                per_rank(&|r| own(piece, r * piece))?
            } else {
                vec![]
            };
            (inputs, vec![zeros(piece)?])
        }
        BenchOp::ReduceScatter => (per_rank(&|r| own(piece, r * piece))?, vec![zeros(piece)?]),
        BenchOp::AllToAll => (
            per_rank(&|r| own(piece, r * piece))?,
            per_rank(&|_| zeros(piece))?,
        ),
        BenchOp::ReduceScatterTensor | BenchOp::AllToAllSingle => {
            let out = if op == BenchOp::AllToAllSingle {
                count
            } else {
                piece
            };
            (vec![own(count, 0)?], vec![zeros(out)?])
        }
    };
    Ok(Buffers { inputs, outputs })
}

/// Starts one `op` on `buffers`; reducing ops combine with `reduce`.
pub fn launch(
    pg: &dyn ProcessGroup,
    op: BenchOp,
    buffers: &Buffers,
    reduce: ReduceOp,
) -> tensorcomm::Result<Work> {
    let (ins, outs) = (&buffers.inputs, &buffers.outputs);
    match op {
        BenchOp::AllReduce => pg.all_reduce(&ins[0], reduce, None),
        BenchOp::Broadcast => pg.broadcast(&ins[0], 0, None),
        BenchOp::Reduce => pg.reduce(&ins[0], 0, reduce, None),
        BenchOp::AllReduceCoalesced => pg.all_reduce_coalesced(ins, reduce, None),
        BenchOp::AllGather => pg.all_gather(outs, &ins[0], None),
        BenchOp::AllGatherIntoTensor => pg.all_gather_into_tensor(&outs[0], &ins[0], None),
        BenchOp::AllGatherCoalesced => {
            let lists: Vec<Vec<Tensor<'static>>> = outs.iter().map(|t| vec![t.clone()]).collect();
            pg.all_gather_coalesced(&lists, &ins[..1], None)
        }
        BenchOp::Gather => {
            let list = (pg.rank() == 0).then_some(outs.as_slice());
            pg.gather(&ins[0], list, 0, None)
        }
        BenchOp::Scatter => {
            let list = (pg.rank() == 0).then_some(ins.as_slice());
            pg.scatter(&outs[0], list, 0, None)
        }
        BenchOp::ReduceScatter => pg.reduce_scatter(&outs[0], ins, reduce, None),
        BenchOp::ReduceScatterTensor => pg.reduce_scatter_tensor(&outs[0], &ins[0], reduce, None),
        BenchOp::AllToAll => pg.all_to_all(outs, ins, None),
        BenchOp::AllToAllSingle => pg.all_to_all_single(&outs[0], &ins[0], &[], &[], None),
    }
}

/// Whether this rank's buffers hold what one SUM run of `op` must leave
/// there, computed from [`value`].
pub fn verify(
    op: BenchOp,
    rank: usize,
    ranks: usize,
    dtype: DType,
    count: usize,
    buffers: &Buffers,
) -> tensorcomm::Result<bool> {
    let piece = count / ranks;
    let got = |ts: &[Tensor<'static>]| -> tensorcomm::Result<Vec<f64>> {
        let mut all = Vec::new();
        for t in ts {
            all.extend(decode(t)?);
        }
        Ok(all)
    };
    let sum = |i: usize| all_reduce_sum(dtype, ranks, i);
    // Element `j` of everyone's pieces concatenated in rank order.
    let gathered = |j: usize| expected(dtype, j / piece.max(1), j % piece.max(1));
    let (found, want): (Vec<f64>, Vec<f64>) = match op {
        BenchOp::AllReduce | BenchOp::AllReduceCoalesced => {
            (got(&buffers.inputs)?, (0..count).map(sum).collect())
        }
        BenchOp::Broadcast => (
            got(&buffers.inputs)?,
            (0..count).map(|i| expected(dtype, 0, i)).collect(),
        ),
        BenchOp::Reduce if rank == 0 => (got(&buffers.inputs)?, (0..count).map(sum).collect()),
        BenchOp::Reduce => (
            got(&buffers.inputs)?,
            (0..count).map(|i| expected(dtype, rank, i)).collect(),
        ),
        BenchOp::AllGather | BenchOp::AllGatherIntoTensor | BenchOp::AllGatherCoalesced => {
            (got(&buffers.outputs)?, (0..count).map(gathered).collect())
        }
        BenchOp::Gather if rank == 0 => {
            (got(&buffers.outputs)?, (0..count).map(gathered).collect())
        }
        BenchOp::Gather => (vec![], vec![]),
        BenchOp::Scatter => (
            got(&buffers.outputs)?,
            (0..piece)
                .map(|i| expected(dtype, 0, rank * piece + i))
                .collect(),
        ),
        BenchOp::ReduceScatter | BenchOp::ReduceScatterTensor => (
            got(&buffers.outputs)?,
            (0..piece).map(|i| sum(rank * piece + i)).collect(),
        ),
        BenchOp::AllToAll | BenchOp::AllToAllSingle => (
            got(&buffers.outputs)?,
            (0..count)
                .map(|j| expected(dtype, j / piece.max(1), rank * piece + j % piece.max(1)))
                .collect(),
        ),
    };
    Ok(found == want)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_ops_round_rows_to_whole_pieces_per_rank() {
        assert_eq!(row_count(BenchOp::AllGather, 10, 4), 8);
        assert_eq!(row_count(BenchOp::AllToAll, 1, 4), 4);
        assert_eq!(row_count(BenchOp::AllReduce, 10, 4), 10);
    }

    #[test]
    fn every_op_passes_its_check_on_three_ranks_for_every_dtype() {
        use std::sync::Arc;
        use tensorcomm::cpu::backend::{CpuOptions, ProcessGroupCpu};
        use tensorcomm::store::HashStore;

        let store = Arc::new(HashStore::new());
        let ranks = 3;
        std::thread::scope(|s| {
            for rank in 0..ranks {
                let store = store.clone();
                s.spawn(move || {
                    let pg =
                        ProcessGroupCpu::new(store, "bench", rank, ranks, &CpuOptions::default())
                            .unwrap();
                    for op in BenchOp::ALL {
                        for dtype in DType::ALL {
                            let count = row_count(op, 10, ranks);
                            let b = setup(op, (rank, ranks), dtype, count, None).unwrap();
                            launch(&pg, op, &b, ReduceOp::Sum).unwrap().wait().unwrap();
                            let ok = verify(op, rank, ranks, dtype, count, &b).unwrap();
                            assert!(ok, "{op:?} {dtype} rank {rank}");
                        }
                    }
                });
            }
        });
    }

    #[test]
    fn untouched_buffers_fail_the_check_for_every_op() {
        // One rank of two whose collective never ran: outputs still zero,
        // inputs still its own values, so every check must say WRONG on
        // at least one rank (rank 1 for gather, whose rank 0 alone checks).
        for op in BenchOp::ALL {
            let wrong = (0..2).any(|rank| {
                let count = row_count(op, 6, 2);
                let b = setup(op, (rank, 2), DType::F32, count, None).unwrap();
                !verify(op, rank, 2, DType::F32, count, &b).unwrap()
            });
            assert!(wrong || op == BenchOp::Broadcast, "{op:?}");
        }
    }
}
