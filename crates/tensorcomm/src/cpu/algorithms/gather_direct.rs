//! Direct gather: every rank sends its block straight to the root, which
//! receives them in rank order, each into its place. One step per non-root
//! rank; the root's link carries everything, as in any gather. The root
//! first announces itself to every other rank ([`Transport::announce`]),
//! since it sends them nothing else.

use std::time::Instant;

use super::exchange_blocks::{recv_block, send_block};
use super::ExchangeBlocks;
use crate::cpu::transport::Transport;
use crate::{Error, Result};

/// Collects every rank's block for `root` (`blocks.send_len(root)` bytes,
/// the same on every rank) into the root's block from that rank, straight
/// from and into where they live. Only the root receives.
pub fn gather_direct(
    t: &dyn Transport,
    blocks: &dyn ExchangeBlocks,
    root: usize,
    deadline: Instant,
) -> Result<()> {
    let (rank, world) = (t.rank(), t.world_size());
    if root >= world {
        return Err(Error::InvalidArgument(format!(
            "gather: expected a root in 0..{world}, found {root}"
        )));
    }
    if rank != root {
        return send_block(t, blocks, root, deadline);
    }
    // The other ranks only send: tell them this rank is here (see
    // `Transport::announce`) before waiting for their blocks.
    for peer in (0..world).filter(|&p| p != rank) {
        t.announce(peer, deadline)?;
    }
    for from in 0..world {
        if from == rank {
            blocks.copy_own(rank)?;
            continue;
        }
        recv_block(t, blocks, from, deadline)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpu::algorithms::testing::{deadline, run_ranks, BlockBuffers};

    #[test]
    fn the_root_gets_every_block_in_rank_order() {
        for world in [1, 2, 3, 4, 8] {
            for root in 0..world {
                for n in [0usize, 5, 3000] {
                    let pattern = |r: usize, i: usize| (r * 17 + i * 3 + root) as u8;
                    let results = run_ranks(world, |t| {
                        let r = t.rank();
                        let mut send = vec![Vec::new(); world];
                        send[root] = (0..n).map(|i| pattern(r, i)).collect();
                        let recv_len = |p: usize| if r == root || p == r { n } else { 0 };
                        let blocks = BlockBuffers::new(send, (0..world).map(recv_len));
                        gather_direct(t, &blocks, root, deadline()).map(|()| blocks.received())
                    });
                    for (rank, got) in results.into_iter().enumerate() {
                        let got = got.unwrap();
                        if rank == root {
                            let expected: Vec<Vec<u8>> = (0..world)
                                .map(|r| (0..n).map(|i| pattern(r, i)).collect())
                                .collect();
                            assert_eq!(got, expected, "world {world} root {root} n {n}");
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn a_root_out_of_range_is_refused() {
        let results = run_ranks(1, |t| {
            let blocks = BlockBuffers::new(vec![vec![1, 2]], [2].into_iter());
            gather_direct(t, &blocks, 1, deadline())
        });
        assert!(matches!(results[0], Err(Error::InvalidArgument(_))));
    }
}
