//! Shared-memory arena broadcast, for groups whose ranks all share one
//! host: the root copies each chunk of the message into its slot of the
//! [`ShmArena`] (halves alternating), a barrier over the transport says it
//! is there, and every other rank copies it out. One copy in, one copy out
//! per rank, no byte streams; the half a chunk goes to was last read two
//! chunks earlier, which every rank finished before the previous barrier
//! (the same argument as the arena all-reduce, with which it shares the
//! arena's half counter). After an all-reduce, which leaves without a
//! closing barrier, it passes one before its first copy in. The call's
//! first barrier hears from every peer (`CallBarriers`).

use std::time::Instant;

use super::arena_lanes::CallBarriers;
use crate::cpu::transport::shm::ShmArena;
use crate::cpu::transport::Transport;
use crate::{Error, Result};

/// Broadcasts `buf` from `root` to every rank of `t` in place through
/// `arena`, which must be shared by exactly the ranks of `t`.
pub fn broadcast_shm_arena(
    t: &dyn Transport,
    arena: &ShmArena,
    buf: &mut [u8],
    root: usize,
    deadline: Instant,
) -> Result<()> {
    let (rank, world) = (t.rank(), t.world_size());
    if arena.world_size() != world || root >= world {
        return Err(Error::InvalidArgument(format!(
            "broadcast_shm_arena: expected an arena for the transport's {world} ranks and a root below {world}, found an arena for {} and root {root}",
            arena.world_size()
        )));
    }
    if world == 1 {
        return Ok(());
    }
    // The first barrier hears from every peer: the ranks chose the arena
    // by their own sizes (arena_lanes.rs says why that matters).
    let mut barriers = CallBarriers::new(t, arena.wait(), deadline);
    if arena.take_unfenced() {
        // The all-reduce before left without a barrier: others may still
        // read this rank's slot.
        barriers.pass()?;
    }
    for piece in buf.chunks_mut(arena.chunk()) {
        let parity = arena.next_parity();
        if rank == root {
            arena.copy_in(parity, 0, piece);
        }
        barriers.pass()?;
        if rank != root {
            let len = piece.len();
            arena.copy_out(root, parity, 0..len, piece);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpu::algorithms::testing::{deadline, run_ranks_with_store, test_arena};

    #[test]
    fn every_rank_gets_the_roots_bytes_for_every_root_and_length() {
        for world in [1, 2, 3, 4, 8] {
            let results = run_ranks_with_store(world, |t, store| {
                // 16-byte chunks: messages of 0, 1, exactly 2 and 3+ chunks.
                let arena = test_arena(t, store, "bcast", 16);
                let mut out = Vec::new();
                for root in 0..world {
                    for len in [0usize, 5, 32, 77] {
                        let mut buf: Vec<u8> = if t.rank() == root {
                            (0..len).map(|i| (i * 7 + root * 31) as u8).collect()
                        } else {
                            vec![0xEE; len]
                        };
                        broadcast_shm_arena(t, &arena, &mut buf, root, deadline())
                            .expect("broadcast");
                        out.push(buf);
                    }
                }
                out
            });
            for (rank, got) in results.into_iter().enumerate() {
                let mut k = 0;
                for root in 0..world {
                    for len in [0usize, 5, 32, 77] {
                        let expected: Vec<u8> =
                            (0..len).map(|i| (i * 7 + root * 31) as u8).collect();
                        assert_eq!(
                            got[k], expected,
                            "world {world} root {root} rank {rank} len {len}"
                        );
                        k += 1;
                    }
                }
            }
        }
    }
}
