//! Ring all-gather: every rank's block travels once around the ring,
//! `world - 1` steps each moving one block to the next rank while one
//! arrives from the previous. Each rank sends and receives
//! `(world - 1) / world` of the result: bandwidth-optimal. It is the second
//! pass of the ring all-reduce ([`ring_all_gather_pass`]).

use std::time::Instant;

use super::all_reduce_ring::{ring_all_gather_pass, RingChunks, RING_SEGMENT_BYTES};
use crate::cpu::transport::Transport;
use crate::{Error, Result};

/// Fills `buf` (`world` equal blocks, this rank's own already in block
/// `rank`) with every rank's block. Every rank passes the same length.
pub fn all_gather_ring(t: &dyn Transport, buf: &mut [u8], deadline: Instant) -> Result<()> {
    let world = t.world_size();
    if !buf.len().is_multiple_of(world) {
        return Err(Error::InvalidArgument(format!(
            "all_gather: expected a buffer of {world} equal blocks, found {} bytes",
            buf.len()
        )));
    }
    if world == 1 {
        return Ok(());
    }
    let block = buf.len() / world;
    let offsets = (0..=world).map(|i| i * block).collect();
    let chunks = RingChunks::new(offsets, 1, RING_SEGMENT_BYTES);
    ring_all_gather_pass(t, buf, &chunks, 0, deadline)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpu::algorithms::testing::{deadline, run_ranks};

    #[test]
    fn every_rank_gets_every_block_for_world_sizes_1_to_8() {
        for world in [1, 2, 3, 4, 8] {
            for block in [0usize, 1, 13, 1000] {
                let pattern = |r: usize, i: usize| (r * 41 + i * 7 + 1) as u8;
                let results = run_ranks(world, |t| {
                    let mut buf = vec![0xEEu8; world * block];
                    let own = t.rank() * block;
                    for i in 0..block {
                        buf[own + i] = pattern(t.rank(), i);
                    }
                    all_gather_ring(t, &mut buf, deadline()).map(|()| buf)
                });
                let expected: Vec<u8> = (0..world)
                    .flat_map(|r| (0..block).map(move |i| pattern(r, i)))
                    .collect();
                for (rank, got) in results.into_iter().enumerate() {
                    assert_eq!(
                        got.unwrap(),
                        expected,
                        "world {world} block {block} rank {rank}"
                    );
                }
            }
        }
    }

    #[test]
    fn a_buffer_that_does_not_split_evenly_is_refused() {
        for r in run_ranks(2, |t| all_gather_ring(t, &mut [0u8; 3], deadline())) {
            assert!(matches!(r, Err(Error::InvalidArgument(_))));
        }
    }
}
