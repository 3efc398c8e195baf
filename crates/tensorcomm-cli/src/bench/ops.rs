//! Per-op buffers, launch and independent correctness check for `tensorcomm
//! bench`.
//!
//! A row's `count` is the elements of the op's largest buffer, as in
//! nccl-tests: the whole tensor for all_reduce, broadcast and reduce; the
//! gathered output for the all_gather family and gather; the full input for
//! the reduce_scatter family and scatter; each rank's whole send buffer for
//! all_to_all; the buffer each rank sends (and receives) for send_recv and
//! send_recv_any; each rank's nonzeros for all_reduce_sparse. Ops that
//! split their buffer over the ranks round `count` down to a multiple of
//! the rank count ([`row_count`]); each rank's piece is `count / ranks`
//! elements. Barriers move no data: their row has count 0. Inputs come
//! from [`value`] and the expected outputs are computed here from it (in
//! `sparse.rs` for the sparse all-reduce), never by the library. Rooted
//! ops use root 0; reducing ops check with SUM.
//!
//! send_recv and send_recv_any are nccl-tests' sendrecv: every rank `r` of
//! `n` sends its buffer to `(r + 1) % n` and receives one from
//! `(r - 1 + n) % n`, both posted before either is waited on (with
//! `recv_any_source` for send_recv_any); the check wants the previous
//! rank's values and the previous rank as the reported source. They need
//! 2 ranks or more. The barriers' check is that every call completed
//! without error.

use tensorcomm::group::{ProcessGroup, ReduceOp};
use tensorcomm::tensor::{DType, Device, SparseTensor, Tensor};

use super::data::{all_reduce_sum, decode, make, value};
use super::pending::{Outcome, Pending};
use super::{sparse, BenchOp};

/// The tag of the ring's messages (send_recv, send_recv_any).
const RING_TAG: u64 = 0;

/// The tensors one rank passes to one op.
pub struct Buffers {
    inputs: Vec<Tensor<'static>>,
    outputs: Vec<Tensor<'static>>,
    /// The sparse all-reduce's input.
    sparse: Option<SparseTensor>,
}

impl Buffers {
    /// Sets every dense input to zero (see [`sums_in_place`]).
    pub fn zero_inputs(&self) -> tensorcomm::Result<()> {
        self.inputs.iter().try_for_each(|t| t.fill_zeros())
    }

    /// The same buffers with every tensor copied to `device` (a sparse
    /// input's values too).
    pub fn into_device(self, device: Device) -> tensorcomm::Result<Buffers> {
        let move_all = |ts: Vec<Tensor<'static>>| {
            ts.iter()
                .map(|t| t.to_device(device))
                .collect::<tensorcomm::Result<Vec<_>>>()
        };
        Ok(Buffers {
            inputs: move_all(self.inputs)?,
            outputs: move_all(self.outputs)?,
            sparse: self.sparse.map(|s| s.to_device(device)).transpose()?,
        })
    }
}

/// True for ops whose buffer is split into one piece per rank.
fn split_per_rank(op: BenchOp) -> bool {
    !matches!(
        op,
        BenchOp::AllReduce
            | BenchOp::Broadcast
            | BenchOp::Reduce
            | BenchOp::AllReduceCoalesced
            | BenchOp::SendRecv
            | BenchOp::SendRecvAny
            | BenchOp::AllReduceSparse
    )
}

/// True for ops that move no data (the barriers): a run prints one row,
/// of size and count 0, whatever sizes it was asked for.
pub fn sizeless(op: BenchOp) -> bool {
    matches!(op, BenchOp::Barrier | BenchOp::MonitoredBarrier)
}

/// True for the ring ops (send_recv, send_recv_any).
fn ring(op: BenchOp) -> bool {
    matches!(op, BenchOp::SendRecv | BenchOp::SendRecvAny)
}

/// The element count of a row of `count` requested elements: a multiple
/// of `ranks` (at least `ranks`) for ops that split their buffer, 0 for
/// [`sizeless`] ones.
pub fn row_count(op: BenchOp, count: usize, ranks: usize) -> usize {
    if sizeless(op) {
        0
    } else if split_per_rank(op) {
        (count / ranks).max(1) * ranks
    } else {
        count.max(1)
    }
}

/// The reduce op of every run, checked and timed: SUM, the op
/// gloo_bench.py, nccl-tests and PyTorch users time. `None` for ops that
/// reduce nothing.
pub fn timed_reduce(op: BenchOp) -> Option<ReduceOp> {
    match op {
        BenchOp::AllReduce
        | BenchOp::Reduce
        | BenchOp::AllReduceCoalesced
        | BenchOp::ReduceScatter
        | BenchOp::ReduceScatterTensor
        | BenchOp::AllReduceSparse => Some(ReduceOp::Sum),
        _ => None,
    }
}

/// True for ops whose timed calls sum into their own inputs (all_reduce,
/// reduce on the root, all_reduce_coalesced): `iters` SUMs over `n` ranks
/// multiply the inputs by up to `n^iters`, past f16's range within a few
/// calls, so their timed inputs are zeros ([`Buffers::zero_inputs`]),
/// which every sum keeps finite (and exact) and which cost a float adder
/// what any normal number does. The other ops read inputs they never write.
pub fn sums_in_place(op: BenchOp) -> bool {
    matches!(
        op,
        BenchOp::AllReduce | BenchOp::Reduce | BenchOp::AllReduceCoalesced
    )
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

/// Why `op` cannot place its tensors in symmetric memory, which needs
/// every rank to allocate the same dense tensors; `None` when it can (the
/// barriers, which allocate nothing, included).
pub fn symmetric_refused(op: BenchOp) -> Option<&'static str> {
    match op {
        BenchOp::Gather | BenchOp::Scatter => {
            Some("its list of tensors lives on the root only, so the ranks allocate differently")
        }
        BenchOp::AllReduceSparse => Some(
            "its input is a sparse tensor (host indices and values) and its result a new one, \
             neither in symmetric memory",
        ),
        _ => None,
    }
}

/// Whether `op` can run on `ranks` ranks: the ring ops need 2 or more
/// (on one rank the next and the previous rank are itself).
pub fn check_ranks(op: BenchOp, ranks: usize) -> tensorcomm::Result<()> {
    if ring(op) && ranks < 2 {
        return Err(tensorcomm::Error::InvalidArgument(format!(
            "{} needs at least 2 ranks (rank r sends to rank (r + 1) % n and receives from \
             rank (r - 1 + n) % n, both itself on one rank), found {ranks}",
            op.name()
        )));
    }
    Ok(())
}

/// Fresh buffers for `op` on `rank` of `ranks`, for a row of `count`
/// elements (see [`row_count`]); in the symmetric memory of `symmetric`
/// when given (the rank's group; refused for ops with a
/// [`symmetric_refused`] reason). The ring ops need 2 ranks or more
/// ([`check_ranks`]).
pub fn setup(
    op: BenchOp,
    (rank, ranks): (usize, usize),
    dtype: DType,
    count: usize,
    symmetric: Option<&dyn ProcessGroup>,
) -> tensorcomm::Result<Buffers> {
    if let (Some(_), Some(why)) = (symmetric, symmetric_refused(op)) {
        return Err(tensorcomm::Error::InvalidArgument(format!(
            "--symmetric: {} cannot use symmetric memory: {why}",
            op.name()
        )));
    }
    check_ranks(op, ranks)?;
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
        BenchOp::SendRecv | BenchOp::SendRecvAny => (vec![own(count, 0)?], vec![zeros(count)?]),
        BenchOp::Barrier | BenchOp::MonitoredBarrier => (vec![], vec![]),
        BenchOp::AllReduceSparse => {
            let input = sparse::input((rank, ranks), dtype, count)?;
            return Ok(Buffers {
                inputs: vec![],
                outputs: vec![],
                sparse: Some(input),
            });
        }
    };
    Ok(Buffers {
        inputs,
        outputs,
        sparse: None,
    })
}

/// Starts one `op` on `buffers`; reducing ops combine with `reduce` (the
/// sparse all-reduce takes only [`ReduceOp::Sum`]).
pub fn launch(
    pg: &dyn ProcessGroup,
    op: BenchOp,
    buffers: &Buffers,
    reduce: ReduceOp,
) -> tensorcomm::Result<Pending> {
    let (ins, outs) = (&buffers.inputs, &buffers.outputs);
    let (rank, ranks) = (pg.rank(), pg.size());
    let work = match op {
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
            let list = (rank == 0).then_some(outs.as_slice());
            pg.gather(&ins[0], list, 0, None)
        }
        BenchOp::Scatter => {
            let list = (rank == 0).then_some(ins.as_slice());
            pg.scatter(&outs[0], list, 0, None)
        }
        BenchOp::ReduceScatter => pg.reduce_scatter(&outs[0], ins, reduce, None),
        BenchOp::ReduceScatterTensor => pg.reduce_scatter_tensor(&outs[0], &ins[0], reduce, None),
        BenchOp::AllToAll => pg.all_to_all(outs, ins, None),
        BenchOp::AllToAllSingle => pg.all_to_all_single(&outs[0], &ins[0], &[], &[], None),
        BenchOp::Barrier => pg.barrier(None),
        BenchOp::MonitoredBarrier => pg.monitored_barrier(None, false),
        BenchOp::SendRecv | BenchOp::SendRecvAny => {
            let send = pg.send(&ins[0], (rank + 1) % ranks, RING_TAG, None)?;
            let recv = if op == BenchOp::SendRecvAny {
                pg.recv_any_source(&outs[0], RING_TAG, None)?
            } else {
                pg.recv(&outs[0], (rank + ranks - 1) % ranks, RING_TAG, None)?
            };
            return Ok(Pending::Ring { send, recv });
        }
        BenchOp::AllReduceSparse => {
            let input = buffers.sparse.as_ref().ok_or_else(|| {
                tensorcomm::Error::InvalidArgument(
                    "all_reduce_sparse: expected buffers set up for it, found no sparse input"
                        .into(),
                )
            })?;
            return Ok(Pending::Sparse(pg.all_reduce_sparse(input, reduce, None)?));
        }
    };
    Ok(Pending::Work(work?))
}

/// Whether this rank's buffers and the `outcome` of waiting on the op
/// hold what one SUM run of `op` must leave there, computed from
/// [`value`]: the ring's receive also reports the previous rank as its
/// source, the sparse all-reduce returns the sum [`sparse::verify`]
/// expects, and the barriers completed.
pub fn verify(
    op: BenchOp,
    rank: usize,
    ranks: usize,
    dtype: DType,
    count: usize,
    buffers: &Buffers,
    outcome: &Outcome,
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
        BenchOp::SendRecv | BenchOp::SendRecvAny => {
            let from = (rank + ranks - 1) % ranks;
            if outcome.source != Some(from) {
                return Ok(false);
            }
            (
                got(&buffers.outputs)?,
                (0..count).map(|i| expected(dtype, from, i)).collect(),
            )
        }
        BenchOp::Barrier | BenchOp::MonitoredBarrier => return Ok(outcome.completed),
        BenchOp::AllReduceSparse => {
            return match &outcome.sparse {
                Some(sum) => sparse::verify(sum, ranks, dtype, count),
                None => Ok(false),
            };
        }
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
        assert_eq!(row_count(BenchOp::SendRecv, 10, 4), 10);
        assert_eq!(row_count(BenchOp::AllReduceSparse, 10, 4), 10);
        assert_eq!(row_count(BenchOp::Barrier, 10, 4), 0);
        assert_eq!(row_count(BenchOp::MonitoredBarrier, 1 << 20, 4), 0);
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
                            let done = launch(&pg, op, &b, ReduceOp::Sum).unwrap().wait().unwrap();
                            let ok = verify(op, rank, ranks, dtype, count, &b, &done).unwrap();
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
        // inputs still its own values, no outcome (no source, no sparse
        // sum, not completed), so every check must say WRONG on at least
        // one rank (rank 1 for gather, whose rank 0 alone checks).
        for op in BenchOp::ALL {
            let wrong = (0..2).any(|rank| {
                let count = row_count(op, 6, 2);
                let b = setup(op, (rank, 2), DType::F32, count, None).unwrap();
                !verify(op, rank, 2, DType::F32, count, &b, &Outcome::default()).unwrap()
            });
            assert!(wrong || op == BenchOp::Broadcast, "{op:?}");
        }
    }

    #[test]
    fn a_ring_receive_from_the_wrong_rank_fails_the_check() {
        // Rank 1 of 3 must hold rank 0's values and name rank 0.
        let (ranks, count) = (3, 7);
        for op in [BenchOp::SendRecv, BenchOp::SendRecvAny] {
            let holding = |sender: usize| {
                let b = setup(op, (1, ranks), DType::I32, count, None).unwrap();
                let values = make(DType::I32, count, |i| value(sender, i)).unwrap();
                b.outputs[0].copy_from(&values).unwrap();
                b
            };
            let from = |source: usize| Outcome {
                completed: true,
                source: Some(source),
                sparse: None,
            };
            let check =
                |b: &Buffers, o: &Outcome| verify(op, 1, ranks, DType::I32, count, b, o).unwrap();
            assert!(check(&holding(0), &from(0)), "{op:?}");
            assert!(!check(&holding(2), &from(0)), "{op:?}: rank 2's values");
            assert!(!check(&holding(0), &from(2)), "{op:?}: rank 2 as source");
            assert!(
                !check(&holding(0), &Outcome::default()),
                "{op:?}: no source"
            );
        }
    }

    #[test]
    fn barriers_pass_only_once_completed() {
        for op in [BenchOp::Barrier, BenchOp::MonitoredBarrier] {
            let b = setup(op, (0, 2), DType::F32, 0, None).unwrap();
            let done = Outcome {
                completed: true,
                ..Outcome::default()
            };
            assert!(verify(op, 0, 2, DType::F32, 0, &b, &done).unwrap());
            assert!(!verify(op, 0, 2, DType::F32, 0, &b, &Outcome::default()).unwrap());
        }
    }

    #[test]
    fn one_rank_rings_and_symmetric_sparse_inputs_are_refused() {
        use std::sync::Arc;
        use tensorcomm::cpu::backend::{CpuOptions, ProcessGroupCpu};
        use tensorcomm::store::HashStore;

        for op in [BenchOp::SendRecv, BenchOp::SendRecvAny] {
            let err = setup(op, (0, 1), DType::F32, 4, None).err().unwrap();
            let msg = err.to_string();
            assert!(
                msg.contains(op.name())
                    && msg.contains("at least 2 ranks")
                    && msg.contains("found 1"),
                "{msg}"
            );
        }
        let pg = ProcessGroupCpu::new(
            Arc::new(HashStore::new()),
            "bench",
            0,
            1,
            &CpuOptions::default(),
        )
        .unwrap();
        let err = setup(BenchOp::AllReduceSparse, (0, 1), DType::F32, 4, Some(&pg))
            .err()
            .unwrap();
        let msg = err.to_string();
        assert!(
            msg.contains("--symmetric") && msg.contains("all_reduce_sparse"),
            "{msg}"
        );
        assert!(symmetric_refused(BenchOp::Barrier).is_none());
        assert!(symmetric_refused(BenchOp::SendRecv).is_none());
        assert!(symmetric_refused(BenchOp::Gather).is_some());
    }
}
