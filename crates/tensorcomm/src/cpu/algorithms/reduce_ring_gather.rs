//! Reduce for large messages: a ring reduce-scatter leaves each rank its
//! block of the result, then the root gathers the blocks. The root receives
//! `(N - 1) / N` of the message and every rank reduces `(N - 1) / N` of it,
//! where a binomial tree ([`super::reduce_tree`]) has the root receive and
//! reduce `log2 N` whole messages.

use std::time::Instant;

use super::all_reduce_ring::{ring_reduce_scatter_pass, RingChunks};
use super::block_offsets;
use crate::cpu::reduce_kernels::{finish, ReduceOp};
use crate::cpu::transport::Transport;
use crate::tensor::DType;
use crate::{Error, Result};

/// Reduces every rank's `buf` (elements of `dtype`) into `root`'s with
/// `op`, the ring's pieces cut at `segment_bytes`. The other ranks' `buf`
/// end up holding partial results: pass scratch copies there.
pub fn reduce_ring_gather(
    t: &dyn Transport,
    buf: &mut [u8],
    dtype: DType,
    op: ReduceOp,
    root: usize,
    segment_bytes: usize,
    deadline: Instant,
) -> Result<()> {
    let (rank, world) = (t.rank(), t.world_size());
    if root >= world {
        return Err(Error::InvalidArgument(format!(
            "reduce: expected a root in 0..{world}, found {root}"
        )));
    }
    let elem = dtype.size();
    if !buf.len().is_multiple_of(elem) {
        return Err(Error::InvalidArgument(format!(
            "reduce: expected whole {dtype} elements, found {} bytes",
            buf.len()
        )));
    }
    let offsets = block_offsets(buf.len(), elem, world);
    let block = |r: usize| offsets[r]..offsets[r + 1];
    if world > 1 {
        let chunks = RingChunks::new(offsets.clone(), elem, segment_bytes);
        // With shift 0, rank r ends holding block r reduced.
        ring_reduce_scatter_pass(t, buf, &chunks, dtype, op, 0, deadline)?;
    }
    finish(op, dtype, &mut buf[block(rank)], world)?;
    if rank == root {
        for from in (0..world).filter(|&r| r != root) {
            t.recv(from, &mut buf[block(from)], deadline)?;
        }
    } else {
        t.send(root, &buf[block(rank)], deadline)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpu::algorithms::testing::{deadline, run_ranks};

    fn value(r: usize, i: usize) -> i64 {
        ((r * 13 + i * 5) % 23) as i64 - 11
    }

    #[test]
    fn the_root_gets_the_reduction_for_every_world_root_and_length() {
        for world in [1, 2, 3, 4, 8] {
            // Lengths that do and do not split evenly, below and above a
            // (small, 64-byte) segment.
            for n in [0usize, 1, 7, 301] {
                for op in [ReduceOp::Sum, ReduceOp::Max, ReduceOp::Avg] {
                    for root in [0, world - 1, world / 2] {
                        let results = run_ranks(world, |t| {
                            let mut buf: Vec<u8> = (0..n)
                                .flat_map(|i| value(t.rank(), i).to_ne_bytes())
                                .collect();
                            reduce_ring_gather(t, &mut buf, DType::I64, op, root, 64, deadline())
                                .map(|()| buf)
                        });
                        let expected: Vec<u8> = (0..n)
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
                        let got = results.into_iter().nth(root).unwrap().unwrap();
                        assert_eq!(got, expected, "{op} world {world} n {n} root {root}");
                    }
                }
            }
        }
    }
}
