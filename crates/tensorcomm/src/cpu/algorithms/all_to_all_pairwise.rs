//! Pairwise all-to-all: in step `k` (1 to `world - 1`) rank `r` sends its
//! block for rank `r + k` while receiving the block from rank `r - k`, both
//! at once through [`Transport::send_recv`], so no pair can deadlock
//! whatever the block sizes. Blocks may differ in size per peer (uneven
//! all-to-all). They are sent from and received into where they live
//! ([`ExchangeBlocks`]): nothing is staged.
//!
//! When the sizes are not known to agree (uneven splits), a first round of
//! the same steps exchanges 16 bytes per pair: how much each side sends
//! and how much it expects. A disagreement fails on both ranks of the pair
//! with [`Error::CollectiveMismatch`] before any data moves, instead of one
//! side waiting for bytes that never come.

use std::time::Instant;

use super::ExchangeBlocks;
use crate::cpu::transport::Transport;
use crate::{Error, Result};

/// Sends block `p` of `blocks` to every rank `p` and receives rank `p`'s
/// block for this rank into block `p` of `blocks`; this rank's own block
/// is copied. With `check_sizes`, the pairs first agree on the block sizes
/// (see the module documentation); every rank must pass the same
/// `check_sizes`.
pub fn all_to_all_pairwise(
    t: &dyn Transport,
    blocks: &dyn ExchangeBlocks,
    check_sizes: bool,
    deadline: Instant,
) -> Result<()> {
    let (rank, world) = (t.rank(), t.world_size());
    blocks.copy_own(rank)?;
    if check_sizes {
        let send_lens: Vec<usize> = (0..world).map(|p| blocks.send_len(p)).collect();
        let recv_lens: Vec<usize> = (0..world).map(|p| blocks.recv_len(p)).collect();
        agree_block_sizes(t, &send_lens, &recv_lens, deadline)?;
    }
    for k in 1..world {
        let (to, from) = ((rank + k) % world, (rank + world - k) % world);
        let (out, into) = (blocks.send_len(to), blocks.recv_len(from));
        let mut moved = Ok(());
        blocks.read(to, 0..out, &mut |src| {
            let mut exchanged = Ok(());
            let written = blocks.write(from, 0..into, &mut |dst| {
                exchanged = t.send_recv(to, src, from, dst, deadline);
            });
            moved = written.and(exchanged);
        })?;
        moved?;
    }
    Ok(())
}

/// The size check of the module docs on its own: this rank sends
/// `send_lens[p]` bytes to rank `p` and expects `recv_lens[p]` from it;
/// every pair compares, and a disagreement fails both ranks of the pair
/// with [`Error::CollectiveMismatch`] naming both views.
pub fn agree_block_sizes(
    t: &dyn Transport,
    send_lens: &[usize],
    recv_lens: &[usize],
    deadline: Instant,
) -> Result<()> {
    let (rank, world) = (t.rank(), t.world_size());
    if send_lens.len() != world || recv_lens.len() != world {
        return Err(Error::InvalidArgument(format!(
            "all_to_all: expected {world} send and receive sizes, found {} and {}",
            send_lens.len(),
            recv_lens.len()
        )));
    }
    // The whole round runs before failing, so both ranks of a
    // disagreeing pair see the disagreement.
    let mut mismatch = None;
    for k in 1..world {
        let (to, from) = ((rank + k) % world, (rank + world - k) % world);
        let mut mine = [0u8; 16];
        mine[..8].copy_from_slice(&(send_lens[to] as u64).to_le_bytes());
        mine[8..].copy_from_slice(&(recv_lens[to] as u64).to_le_bytes());
        let mut theirs = [0u8; 16];
        t.send_recv(to, &mine, from, &mut theirs, deadline)?;
        let word = |b: &[u8]| u64::from_le_bytes(b.try_into().unwrap_or([0; 8]));
        let (they_send, they_expect) = (word(&theirs[..8]), word(&theirs[8..]));
        let (i_expect, i_send) = (recv_lens[from] as u64, send_lens[from] as u64);
        if (they_send != i_expect || they_expect != i_send) && mismatch.is_none() {
            mismatch = Some(Error::CollectiveMismatch {
                rank,
                peer: from,
                mine: format!(
                    "all_to_all sending {i_send} bytes to rank {from} and expecting {i_expect} from it"
                ),
                theirs: format!(
                    "all_to_all sending {they_send} bytes to rank {rank} and expecting {they_expect} from it"
                ),
            });
        }
    }
    mismatch.map_or(Ok(()), Err)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpu::algorithms::testing::{deadline, run_ranks, BlockBuffers};

    /// Bytes rank `from` sends rank `to`: uneven, some empty.
    fn len(from: usize, to: usize) -> usize {
        (from * 3 + to * 5) % 7
    }

    fn byte(from: usize, to: usize, i: usize) -> u8 {
        (from * 50 + to * 7 + i) as u8
    }

    #[test]
    fn uneven_blocks_reach_every_peer_for_world_sizes_1_to_8() {
        for world in [1, 2, 3, 4, 8] {
            for check_sizes in [false, true] {
                let results = run_ranks(world, |t| {
                    let r = t.rank();
                    let blocks = BlockBuffers::new(
                        (0..world)
                            .map(|to| (0..len(r, to)).map(|i| byte(r, to, i)).collect())
                            .collect(),
                        (0..world).map(|from| len(from, r)),
                    );
                    all_to_all_pairwise(t, &blocks, check_sizes, deadline())
                        .map(|()| blocks.received())
                });
                for (rank, got) in results.into_iter().enumerate() {
                    let expected: Vec<Vec<u8>> = (0..world)
                        .map(|from| (0..len(from, rank)).map(|i| byte(from, rank, i)).collect())
                        .collect();
                    assert_eq!(got.unwrap(), expected, "world {world} rank {rank}");
                }
            }
        }
    }

    #[test]
    fn disagreeing_sizes_fail_both_ranks_of_the_pair_before_data_moves() {
        let results = run_ranks(3, |t| {
            // Rank 0 sends 4 bytes to rank 1, which expects 6.
            let r = t.rank();
            let send_lens = [[2, 4, 2], [2, 2, 2], [2, 2, 2]][r];
            let recv_lens = [[2, 2, 2], [6, 2, 2], [2, 2, 2]][r];
            let blocks = BlockBuffers::new(
                send_lens.iter().map(|&n| vec![r as u8; n]).collect(),
                recv_lens.into_iter(),
            );
            all_to_all_pairwise(t, &blocks, true, deadline())
        });
        for (rank, r) in results.into_iter().enumerate() {
            match (rank, r) {
                (
                    0 | 1,
                    Err(Error::CollectiveMismatch {
                        peer, mine, theirs, ..
                    }),
                ) => {
                    assert_eq!(peer, 1 - rank);
                    assert!(
                        mine.contains("bytes") && theirs.contains("bytes"),
                        "{mine} / {theirs}"
                    );
                }
                // Rank 2 agreed with both, then lost them when they failed.
                (2, Err(Error::PeerClosed { .. } | Error::PeerIo { .. })) => {}
                (rank, other) => panic!("rank {rank}: {other:?}"),
            }
        }
    }
}
