//! Shared-memory arena all-reduce, for groups whose ranks all share one
//! host: no byte streams, each byte is copied into shared memory once,
//! reduced once by the rank that owns it, and copied out once per rank.
//!
//! The message goes through the [`ShmArena`] one chunk at a time. For chunk
//! `k` (slot half `p`, alternating):
//! 1. every rank copies its chunk into its own slot's half `p`;
//! 2. barrier;
//! 3. every rank reduces its 1/N share of the chunk from all slots into
//!    its own slot (reduce-scatter in place);
//! 4. barrier;
//! 5. every rank copies each rank's reduced share out of that rank's slot
//!    (all-gather).
//!
//! Chunk `k + 1` goes to the other half, so no third barrier is needed:
//! everyone has finished copying chunk `k - 1` out of that half before
//! anyone passes the first barrier of chunk `k`. The barriers are
//! dissemination barriers of 1-byte messages over the group's transport,
//! so the collective's fingerprint rides on them and a dead peer fails
//! them by name, as in every other algorithm.

use std::time::Instant;

use super::block_offsets;
use crate::cpu::reduce::{finish, ReduceOp};
use crate::cpu::transport::shm::ShmArena;
use crate::cpu::transport::Transport;
use crate::tensor::DType;
use crate::{Error, Result};

/// Waits until every rank of `t` has reached this call: `ceil(log2 N)`
/// rounds, in round `i` signalling rank `+2^i` and waiting on rank `-2^i`.
fn barrier(t: &dyn Transport, deadline: Instant) -> Result<()> {
    let (rank, world) = (t.rank(), t.world_size());
    let mut distance = 1;
    while distance < world {
        let to = (rank + distance) % world;
        let from = (rank + world - distance) % world;
        t.send_recv(to, &[1], from, &mut [0u8], deadline)?;
        distance *= 2;
    }
    Ok(())
}

/// All-reduces `buf` (elements of `dtype`) in place through `arena`, which
/// must be shared by exactly the ranks of `t`. Every rank gets
/// bit-identical results (each element is reduced by one rank only).
pub fn all_reduce_shm_arena(
    t: &dyn Transport,
    arena: &ShmArena,
    buf: &mut [u8],
    dtype: DType,
    op: ReduceOp,
    deadline: Instant,
) -> Result<()> {
    let (rank, world) = (t.rank(), t.world_size());
    if arena.world_size() != world {
        return Err(Error::InvalidArgument(format!(
            "all_reduce_shm_arena: expected an arena shared by the transport's {world} ranks, found one for {}",
            arena.world_size()
        )));
    }
    let elem = dtype.size();
    let chunk = arena.chunk() / elem * elem;
    if world > 1 && !buf.is_empty() {
        if chunk == 0 {
            return Err(Error::InvalidArgument(format!(
                "all_reduce_shm_arena: expected arena chunks of at least one {dtype} element, found {} bytes",
                arena.chunk()
            )));
        }
        for piece in buf.chunks_mut(chunk) {
            let parity = arena.next_parity();
            arena.copy_in(parity, piece);
            barrier(t, deadline)?;
            let shares = block_offsets(piece.len(), elem, world);
            arena.reduce_share(parity, shares[rank]..shares[rank + 1], dtype, op)?;
            barrier(t, deadline)?;
            for (r, share) in shares.windows(2).enumerate() {
                let range = share[0]..share[1];
                arena.copy_out(r, parity, range.clone(), &mut piece[range]);
            }
        }
    }
    finish(op, dtype, buf, world)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::cpu::algorithms::testing::check_all_reduce_with;

    #[test]
    fn matches_the_reference_for_world_sizes_1_to_8_with_small_odd_chunks() {
        // 24-byte chunks: several chunks per message, chunk ends that cut
        // through no element, shares of 0..3 elements per rank.
        check_all_reduce_with(
            &[1, 2, 3, 4, 8],
            &[0, 1, 7, 100],
            |t, store| {
                ShmArena::connect(
                    store,
                    "arena",
                    t.rank(),
                    t.world_size(),
                    24,
                    Duration::from_secs(30),
                )
                .expect("arena setup")
            },
            all_reduce_shm_arena,
        );
    }

    #[test]
    fn one_chunk_per_call_alternates_halves_across_calls() {
        // Whole messages within one 1 KiB chunk: consecutive calls must not
        // reuse the half a slower rank may still be copying out of.
        check_all_reduce_with(
            &[3],
            &[5, 37],
            |t, store| {
                ShmArena::connect(store, "a1", t.rank(), 3, 1024, Duration::from_secs(30))
                    .expect("arena setup")
            },
            all_reduce_shm_arena,
        );
    }
}
