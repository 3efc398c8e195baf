//! Shared-memory arena all-to-all, for groups whose ranks all share one
//! host: one copy in and one copy out per byte, no byte streams and no
//! staging of the caller's tensors.
//!
//! Each step splits every rank's half of the [`ShmArena`] (halves
//! alternating, as in the broadcast) into one window per destination rank,
//! of `sub` bytes: rank `r` copies the next `sub` bytes of its block for
//! rank `q` into window `q` of its half, a barrier over the transport says
//! every rank has, and rank `q` copies window `q` of every other rank's
//! half into its blocks from them. Steps continue until the longest block
//! any rank sends is through, so every rank needs that length (the
//! caller's to agree on). The half a step writes was last read two steps
//! earlier, which every rank finished before the previous barrier; a call
//! after an all-reduce (which leaves without a closing barrier) passes one
//! first, and the call itself leaves the arena unfenced.
//!
//! The blocks are read and written through [`ExchangeBlocks`], one piece
//! at a time, so the caller's tensors need not be staged whole; the own
//! block is copied straight across ([`ExchangeBlocks::copy_own`]).

use std::time::Instant;

use super::arena_lanes::CallBarriers;
use super::ExchangeBlocks;
use crate::cpu::transport::shm::ShmArena;
use crate::cpu::transport::Transport;
use crate::{Error, Result};

/// Windows are multiples of a cache line where the arena allows.
const WINDOW_ALIGN: usize = 64;

/// Exchanges `blocks` between the ranks of `t` through `arena` (shared by
/// exactly those ranks). `longest` is the longest block any rank sends any
/// other, the same on every rank; the ranks' sizes must agree pairwise
/// (`agree_block_sizes` checks that).
pub fn all_to_all_shm_arena(
    t: &dyn Transport,
    arena: &ShmArena,
    blocks: &dyn ExchangeBlocks,
    longest: usize,
    deadline: Instant,
) -> Result<()> {
    let (rank, world) = (t.rank(), t.world_size());
    let window = arena.chunk() / world.max(1);
    let window = if window >= WINDOW_ALIGN {
        window / WINDOW_ALIGN * WINDOW_ALIGN
    } else {
        window
    };
    if arena.world_size() != world || window == 0 {
        return Err(Error::InvalidArgument(format!(
            "all_to_all_shm_arena: expected an arena for the transport's {world} ranks with at least {world} bytes per half, found one for {} ranks with {}",
            arena.world_size(),
            arena.chunk()
        )));
    }
    blocks.copy_own(rank)?;
    if world == 1 || longest == 0 {
        return Ok(());
    }
    // The first barrier hears from every peer: gather and scatter choose
    // the arena by each rank's own size (arena_lanes.rs says why that
    // matters).
    let mut barriers = CallBarriers::new(t, arena.wait(), deadline);
    if arena.take_unfenced() {
        // The call before left without a barrier: others may still read
        // this rank's halves.
        barriers.pass()?;
    }
    let piece = |len: usize, step: usize| step * window..len.min((step + 1) * window);
    for step in 0..longest.div_ceil(window) {
        let parity = arena.next_parity();
        for q in (0..world).filter(|&q| q != rank) {
            let range = piece(blocks.send_len(q), step);
            if !range.is_empty() {
                blocks.read(q, range, &mut |b| arena.copy_in(parity, q * window, b))?;
            }
        }
        barriers.pass()?;
        for p in (0..world).filter(|&p| p != rank) {
            let range = piece(blocks.recv_len(p), step);
            if !range.is_empty() {
                let from = rank * window..rank * window + range.len();
                blocks.write(p, range, &mut |b| {
                    arena.copy_out(p, parity, from.clone(), b)
                })?;
            }
        }
    }
    arena.mark_unfenced();
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpu::algorithms::testing::{
        deadline, run_ranks_with_store, test_arena, BlockBuffers,
    };

    /// Bytes rank `from` sends rank `to`: uneven, some empty, some of
    /// several steps (windows are 128 / world bytes here).
    fn len(from: usize, to: usize, scale: usize) -> usize {
        ((from * 3 + to * 5) % 7) * scale
    }

    fn byte(from: usize, to: usize, i: usize) -> u8 {
        (from * 50 + to * 7 + i * 3) as u8
    }

    #[test]
    fn uneven_blocks_of_many_steps_reach_every_peer_back_to_back() {
        for world in [1, 2, 3, 4, 8] {
            let results = run_ranks_with_store(world, |t, store| {
                let arena = test_arena(t, store, "a2a", 128);
                let r = t.rank();
                let mut out = Vec::new();
                // 0: nothing moves; 1: within one window; 40: many steps.
                for scale in [0, 1, 40] {
                    let blocks = BlockBuffers::new(
                        (0..world)
                            .map(|to| (0..len(r, to, scale)).map(|i| byte(r, to, i)).collect())
                            .collect(),
                        (0..world).map(|from| len(from, r, scale)),
                    );
                    let longest = (0..world)
                        .flat_map(|a| (0..world).filter(move |&b| b != a).map(move |b| (a, b)))
                        .map(|(a, b)| len(a, b, scale))
                        .max()
                        .unwrap_or(0);
                    all_to_all_shm_arena(t, &arena, &blocks, longest, deadline())
                        .expect("all_to_all");
                    out.push(blocks.received());
                }
                out
            });
            for (rank, got) in results.into_iter().enumerate() {
                for (k, scale) in [0, 1, 40].into_iter().enumerate() {
                    for (from, block) in got[k].iter().enumerate() {
                        let want: Vec<u8> = (0..len(from, rank, scale))
                            .map(|i| byte(from, rank, i))
                            .collect();
                        assert_eq!(
                            block, &want,
                            "world {world} scale {scale} rank {rank} from {from}"
                        );
                    }
                }
            }
        }
    }
}
