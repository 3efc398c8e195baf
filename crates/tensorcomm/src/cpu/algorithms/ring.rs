//! Ring all-reduce: a reduce-scatter around the ring (each rank sends one
//! chunk to the next rank and reduces the chunk arriving from the previous
//! one, `world - 1` times), then an all-gather around the ring (the fully
//! reduced chunks travel on, `world - 1` times). Each rank moves
//! `2 (world - 1) / world` of the buffer: bandwidth-optimal.
//!
//! Chunks move in segments of at most [`RING_SEGMENT_BYTES`], so the scratch
//! buffer stays small and each segment is reduced while still in cache.
//! Overlap between moving one segment and reducing the previous comes from
//! the sockets' buffers (the peer keeps sending while this rank reduces).

use std::time::Instant;

use super::{block_offsets, split_read_write};
use crate::cpu::reduce::{finish, reduce_into, ReduceOp};
use crate::cpu::transport::Transport;
use crate::tensor::DType;
use crate::Result;

/// Largest segment the ring moves at once. Provisional: to be tuned with
/// `tensorcomm bench`.
pub const RING_SEGMENT_BYTES: usize = 512 << 10;

/// All-reduces `buf` in place around the ring, in segments of
/// [`RING_SEGMENT_BYTES`].
pub fn all_reduce_ring(
    t: &dyn Transport,
    buf: &mut [u8],
    dtype: DType,
    op: ReduceOp,
    deadline: Instant,
) -> Result<()> {
    all_reduce_ring_segmented(t, buf, dtype, op, deadline, RING_SEGMENT_BYTES)
}

/// [`all_reduce_ring`] with segments of at most `segment_bytes` (rounded
/// to whole elements, at least one element). Every rank must pass the same
/// value.
pub fn all_reduce_ring_segmented(
    t: &dyn Transport,
    buf: &mut [u8],
    dtype: DType,
    op: ReduceOp,
    deadline: Instant,
    segment_bytes: usize,
) -> Result<()> {
    let (rank, world) = (t.rank(), t.world_size());
    if world == 1 {
        return finish(op, dtype, buf, world);
    }
    let elem = dtype.size();
    let chunks = block_offsets(buf.len(), elem, world);
    let chunk = |c: usize| chunks[c]..chunks[c + 1];
    let largest = (0..world).map(|c| chunk(c).len()).max().unwrap_or(0);
    let segments = largest.div_ceil(segment_bytes.max(elem)).max(1);
    // Segment `j` of chunk `c`, in bytes of `buf`.
    let segment = |c: usize, j: usize| {
        let r = chunk(c);
        let offs = block_offsets(r.len(), elem, segments);
        r.start + offs[j]..r.start + offs[j + 1]
    };
    let next = (rank + 1) % world;
    let prev = (rank + world - 1) % world;
    let mut scratch = vec![0u8; largest.div_ceil(segments).next_multiple_of(elem)];

    for step in 0..world - 1 {
        let send_c = (rank + world - step) % world;
        let recv_c = (rank + 2 * world - step - 1) % world;
        for j in 0..segments {
            let (out, inp) = (segment(send_c, j), segment(recv_c, j));
            let len = inp.len();
            t.send_recv(next, &buf[out], prev, &mut scratch[..len], deadline)?;
            reduce_into(op, dtype, &mut buf[inp], &scratch[..len])?;
        }
    }
    let owned = (rank + 1) % world;
    finish(op, dtype, &mut buf[chunk(owned)], world)?;
    for step in 0..world - 1 {
        let send_c = (rank + 1 + world - step) % world;
        let recv_c = (rank + world - step) % world;
        for j in 0..segments {
            let (out, into) = split_read_write(buf, segment(send_c, j), segment(recv_c, j));
            t.send_recv(next, out, prev, into, deadline)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpu::algorithms::testing::check_all_reduce;

    #[test]
    fn matches_the_reference_for_world_sizes_1_to_8() {
        check_all_reduce(&[1, 2, 3, 4, 8], &[0, 1, 5, 100, 999], all_reduce_ring);
    }

    #[test]
    fn small_segments_match_the_reference() {
        // 24-byte segments: many segments per chunk, uneven last ones.
        check_all_reduce(&[2, 3, 5], &[7, 250], |t, buf, dtype, op, deadline| {
            all_reduce_ring_segmented(t, buf, dtype, op, deadline, 24)
        });
    }
}
