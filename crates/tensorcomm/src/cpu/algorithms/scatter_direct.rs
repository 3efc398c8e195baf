//! Direct scatter: the root sends its block for rank `r` straight to rank
//! `r`, in rank order; every other rank receives once, into its place.
//!
//! Before any data moves the root and every other rank exchange an empty
//! message. Over a fingerprinting transport that message carries each
//! side's fingerprint, so ranks that disagree about the root (each of them
//! would then only send) are caught here rather than at their next
//! collective. It costs about one hop, as every rank sends it at once.

use std::time::Instant;

use super::exchange_blocks::{recv_block, send_block};
use super::ExchangeBlocks;
use crate::cpu::transport::Transport;
use crate::{Error, Result};

/// Sends the root's block for each rank `r` (the same length for every
/// rank) into rank `r`'s block from the root, straight from and into where
/// they live. Only the root sends.
pub fn scatter_direct(
    t: &dyn Transport,
    blocks: &dyn ExchangeBlocks,
    root: usize,
    deadline: Instant,
) -> Result<()> {
    let (rank, world) = (t.rank(), t.world_size());
    if root >= world {
        return Err(Error::InvalidArgument(format!(
            "scatter: expected a root in 0..{world}, found {root}"
        )));
    }
    if rank != root {
        t.send_recv(root, &[], root, &mut [], deadline)?;
        return recv_block(t, blocks, root, deadline);
    }
    for from in (0..world).filter(|&r| r != rank) {
        t.send_recv(from, &[], from, &mut [], deadline)?;
    }
    for to in 0..world {
        if to == rank {
            blocks.copy_own(rank)?;
            continue;
        }
        send_block(t, blocks, to, deadline)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpu::algorithms::testing::{deadline, run_ranks, BlockBuffers};

    #[test]
    fn every_rank_gets_its_block_of_the_roots_buffer() {
        for world in [1, 2, 3, 4, 8] {
            for root in 0..world {
                for n in [0usize, 6, 3000] {
                    let pattern = |r: usize, i: usize| (r * 29 + i * 5 + root) as u8;
                    let results = run_ranks(world, |t| {
                        let r = t.rank();
                        let send: Vec<Vec<u8>> = (0..world)
                            .map(|to| {
                                if r == root {
                                    (0..n).map(|i| pattern(to, i)).collect()
                                } else if to == r {
                                    vec![0; n]
                                } else {
                                    Vec::new()
                                }
                            })
                            .collect();
                        let recv_len = |p: usize| if p == root || p == r { n } else { 0 };
                        let blocks = BlockBuffers::new(send, (0..world).map(recv_len));
                        scatter_direct(t, &blocks, root, deadline())
                            .map(|()| blocks.received().swap_remove(root))
                    });
                    for (rank, got) in results.into_iter().enumerate() {
                        let expected: Vec<u8> = (0..n).map(|i| pattern(rank, i)).collect();
                        assert_eq!(
                            got.unwrap(),
                            expected,
                            "world {world} root {root} n {n} rank {rank}"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn a_root_out_of_range_is_refused() {
        let results = run_ranks(1, |t| {
            let blocks = BlockBuffers::new(vec![vec![1, 2]], [2].into_iter());
            scatter_direct(t, &blocks, 1, deadline())
        });
        assert!(matches!(results[0], Err(Error::InvalidArgument(_))));
    }
}
