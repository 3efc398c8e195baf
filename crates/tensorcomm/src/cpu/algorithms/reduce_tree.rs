//! Binomial-tree reduce: the mirror of [`broadcast_tree`](super::broadcast_tree).
//! Each rank receives from its children (smallest subtree first), reduces
//! what arrives into its buffer, then sends the partial result to its
//! parent; the root ends with the result after `ceil(log2 world)` rounds.
//! A parent announces itself to its children ([`Transport::announce`])
//! before it waits for the first, since it sends them nothing else.

use std::time::Instant;

use crate::cpu::reduce_kernels::{finish, reduce_into, ReduceOp};
use crate::cpu::transport::Transport;
use crate::tensor::DType;
use crate::{Error, Result};

/// Reduces `buf` over all ranks with `op` into `buf` of rank `root`. On
/// the other ranks `buf` is left holding a partial result.
pub fn reduce_tree(
    t: &dyn Transport,
    buf: &mut [u8],
    dtype: DType,
    op: ReduceOp,
    root: usize,
    deadline: Instant,
) -> Result<()> {
    let (rank, world) = (t.rank(), t.world_size());
    if root >= world {
        return Err(Error::InvalidArgument(format!(
            "reduce: expected a root in 0..{world}, found {root}"
        )));
    }
    let vrank = (rank + world - root) % world;
    let real = |v: usize| (v + root) % world;
    // The children only send: tell each this rank is here (see
    // `Transport::announce`) before waiting for any of them.
    let mut mask = 1;
    while mask < world && vrank & mask == 0 {
        if vrank + mask < world {
            t.announce(real(vrank + mask), deadline)?;
        }
        mask <<= 1;
    }
    let mut scratch = Vec::new();
    let mut mask = 1;
    while mask < world {
        if vrank & mask != 0 {
            return t.send(real(vrank - mask), buf, deadline);
        }
        if vrank + mask < world {
            scratch.resize(buf.len(), 0);
            t.recv(real(vrank + mask), &mut scratch, deadline)?;
            reduce_into(op, dtype, buf, &scratch)?;
        }
        mask <<= 1;
    }
    finish(op, dtype, buf, world)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpu::algorithms::testing::{deadline, run_ranks};

    #[test]
    fn the_root_gets_the_reduction_for_every_root_and_world_size() {
        for world in [1, 2, 3, 4, 8] {
            for root in 0..world {
                for op in [ReduceOp::Sum, ReduceOp::Min, ReduceOp::Product] {
                    let value = |r: usize, i: usize| ((r * 3 + i) % 4) as i32 - 1;
                    let results = run_ranks(world, |t| {
                        let mut buf: Vec<u8> = (0..29)
                            .flat_map(|i| value(t.rank(), i).to_ne_bytes())
                            .collect();
                        reduce_tree(t, &mut buf, DType::I32, op, root, deadline()).map(|()| buf)
                    });
                    let expected: Vec<u8> = (0..29)
                        .flat_map(|i| {
                            let all = (0..world).map(|r| value(r, i));
                            let v: i32 = match op {
                                ReduceOp::Sum => all.sum(),
                                ReduceOp::Min => all.min().unwrap_or(0),
                                _ => all.product(),
                            };
                            v.to_ne_bytes()
                        })
                        .collect();
                    let got = results.into_iter().nth(root).unwrap().unwrap();
                    assert_eq!(got, expected, "{op} world {world} root {root}");
                }
            }
        }
    }

    #[test]
    fn a_bad_root_is_refused() {
        for r in run_ranks(2, |t| {
            reduce_tree(t, &mut [0u8; 4], DType::I32, ReduceOp::Sum, 5, deadline())
        }) {
            assert!(matches!(r, Err(Error::InvalidArgument(_))));
        }
    }
}
