//! Ring reduce-scatter: the first pass of the ring all-reduce
//! ([`ring_reduce_scatter_pass`]) arranged so that rank `r` ends owning
//! block `r`. `world - 1` steps, each sending one block to the next rank
//! and reducing the block arriving from the previous one; bandwidth-optimal.

use std::time::Instant;

use super::all_reduce_ring::{ring_reduce_scatter_pass, RingChunks, RING_SEGMENT_BYTES};
use crate::cpu::reduce_kernels::{finish, ReduceOp};
use crate::cpu::transport::Transport;
use crate::tensor::DType;
use crate::{Error, Result};

/// Reduces `buf` (`world` equal blocks of `dtype` elements) over all ranks
/// with `op`, leaving block `rank` of this rank's `buf` holding the result
/// for that block (the other blocks hold partial results). Every rank
/// reduces each element in the same order, so results are deterministic.
pub fn reduce_scatter_ring(
    t: &dyn Transport,
    buf: &mut [u8],
    dtype: DType,
    op: ReduceOp,
    deadline: Instant,
) -> Result<()> {
    let (rank, world) = (t.rank(), t.world_size());
    if !buf.len().is_multiple_of(world * dtype.size()) {
        return Err(Error::InvalidArgument(format!(
            "reduce_scatter: expected a buffer of {world} equal blocks of {dtype} elements, found {} bytes",
            buf.len()
        )));
    }
    let block = buf.len() / world;
    if world > 1 {
        let offsets = (0..=world).map(|i| i * block).collect();
        let chunks = RingChunks::new(offsets, dtype.size(), RING_SEGMENT_BYTES);
        ring_reduce_scatter_pass(t, buf, &chunks, dtype, op, 0, deadline)?;
    }
    finish(op, dtype, &mut buf[rank * block..(rank + 1) * block], world)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpu::algorithms::testing::{deadline, run_ranks};

    fn value(r: usize, i: usize) -> i64 {
        ((r * 13 + i * 5) % 23) as i64 - 11
    }

    #[test]
    fn each_rank_gets_its_reduced_block_for_world_sizes_1_to_8() {
        for world in [1, 2, 3, 4, 8] {
            for block in [0usize, 1, 7, 300] {
                for op in [ReduceOp::Sum, ReduceOp::Max, ReduceOp::Avg] {
                    let results = run_ranks(world, |t| {
                        let mut buf: Vec<u8> = (0..world * block)
                            .flat_map(|i| value(t.rank(), i).to_ne_bytes())
                            .collect();
                        reduce_scatter_ring(t, &mut buf, DType::I64, op, deadline()).map(|()| {
                            buf[t.rank() * block * 8..(t.rank() + 1) * block * 8].to_vec()
                        })
                    });
                    for (rank, got) in results.into_iter().enumerate() {
                        let expected: Vec<u8> = (rank * block..(rank + 1) * block)
                            .flat_map(|i| {
                                let all = (0..world).map(|r| value(r, i));
                                let v = match op {
                                    ReduceOp::Sum => all.sum(),
                                    ReduceOp::Max => all.max().unwrap_or(0),
                                    _ => all.sum::<i64>() / world as i64,
                                };
                                v.to_ne_bytes()
                            })
                            .collect();
                        assert_eq!(
                            got.unwrap(),
                            expected,
                            "{op} world {world} block {block} rank {rank}"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn a_buffer_that_does_not_split_into_whole_elements_is_refused() {
        for r in run_ranks(2, |t| {
            reduce_scatter_ring(t, &mut [0u8; 12], DType::I64, ReduceOp::Sum, deadline())
        }) {
            assert!(matches!(r, Err(Error::InvalidArgument(_))));
        }
    }
}
