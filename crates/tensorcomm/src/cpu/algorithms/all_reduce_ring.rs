//! Ring all-reduce: a reduce-scatter around the ring (each rank sends one
//! chunk to the next rank and reduces the chunk arriving from the previous
//! one, `world - 1` times), then an all-gather around the ring (the fully
//! reduced chunks travel on, `world - 1` times). Each rank moves
//! `2 (world - 1) / world` of the buffer: bandwidth-optimal.
//!
//! The two passes are also the ring reduce-scatter
//! ([`reduce_scatter_ring`](super::reduce_scatter_ring)) and ring
//! all-gather ([`all_gather_ring`](super::all_gather_ring)) on their own:
//! [`ring_reduce_scatter_pass`] and [`ring_all_gather_pass`] work over any
//! split of the buffer into `world` chunks ([`RingChunks`]) and leave each
//! rank owning the chunk its caller chooses.
//!
//! Chunks move in segments of at most [`RING_SEGMENT_BYTES`], so the scratch
//! buffer stays small and each segment is reduced while still in cache.
//! Overlap between moving one segment and reducing the previous comes from
//! the sockets' buffers (the peer keeps sending while this rank reduces).

use std::ops::Range;
use std::time::Instant;

use super::{block_offsets, split_read_write};
use crate::cpu::reduce_kernels::{finish, reduce_into, ReduceOp};
use crate::cpu::transport::Transport;
use crate::tensor::DType;
use crate::Result;

/// Largest segment the ring all-reduce moves at once. Over TCP on the
/// 32-core GPU host (bench/results/tcp-ring-segments-h200x2.txt), 8 ranks
/// all-reduced 8 MiB in 5529, 3930, 3341 and 3395 µs with segments of
/// 256 KiB, 512 KiB, 1 MiB and 2 MiB, and 16 MiB in 8918, 7342, 6266 and
/// 7405 µs; 4 ranks 8 MiB in 5283 µs with 256 KiB and 2173 with 1 MiB.
pub const RING_SEGMENT_BYTES: usize = 1 << 20;

/// A buffer split into `world` chunks (chunk `c` is bytes
/// `offsets[c]..offsets[c + 1]`), each moved in the same number of
/// segments of whole `elem`-byte elements.
pub(crate) struct RingChunks {
    offsets: Vec<usize>,
    elem: usize,
    segments: usize,
}

impl RingChunks {
    /// `offsets` has `world + 1` non-decreasing entries, each a multiple of
    /// `elem`; segments are at most `segment_bytes` (at least one element).
    pub(crate) fn new(offsets: Vec<usize>, elem: usize, segment_bytes: usize) -> Self {
        let largest = offsets.windows(2).map(|w| w[1] - w[0]).max().unwrap_or(0);
        let segments = largest.div_ceil(segment_bytes.max(elem)).max(1);
        RingChunks {
            offsets,
            elem,
            segments,
        }
    }

    fn chunk(&self, c: usize) -> Range<usize> {
        self.offsets[c]..self.offsets[c + 1]
    }

    /// Segment `j` of chunk `c`, in bytes of the buffer.
    fn segment(&self, c: usize, j: usize) -> Range<usize> {
        let r = self.chunk(c);
        let n = r.len() / self.elem;
        let at = |k: usize| r.start + k * n / self.segments * self.elem;
        at(j)..at(j + 1)
    }

    fn largest_segment(&self) -> usize {
        (0..self.offsets.len() - 1)
            .flat_map(|c| (0..self.segments).map(move |j| (c, j)))
            .map(|(c, j)| self.segment(c, j).len())
            .max()
            .unwrap_or(0)
    }
}

/// The ring's reduce-scatter pass over `chunks` of `buf`: afterwards rank
/// `r` holds chunk `(r + shift) % world` combined over every rank (before
/// [`finish`]); the other chunks hold partial results.
pub(crate) fn ring_reduce_scatter_pass(
    t: &dyn Transport,
    buf: &mut [u8],
    chunks: &RingChunks,
    dtype: DType,
    op: ReduceOp,
    shift: usize,
    deadline: Instant,
) -> Result<()> {
    let (rank, world) = (t.rank(), t.world_size());
    let next = (rank + 1) % world;
    let prev = (rank + world - 1) % world;
    let mut scratch = vec![0u8; chunks.largest_segment()];
    for step in 0..world - 1 {
        let send_c = (rank + shift + 2 * world - 1 - step) % world;
        let recv_c = (rank + shift + 2 * world - 2 - step) % world;
        for j in 0..chunks.segments {
            let (out, inp) = (chunks.segment(send_c, j), chunks.segment(recv_c, j));
            let len = inp.len();
            t.send_recv(next, &buf[out], prev, &mut scratch[..len], deadline)?;
            reduce_into(op, dtype, &mut buf[inp], &scratch[..len])?;
        }
    }
    Ok(())
}

/// The ring's all-gather pass over `chunks` of `buf`: rank `r` starts
/// owning chunk `(r + shift) % world` and ends with every chunk.
pub(crate) fn ring_all_gather_pass(
    t: &dyn Transport,
    buf: &mut [u8],
    chunks: &RingChunks,
    shift: usize,
    deadline: Instant,
) -> Result<()> {
    let (rank, world) = (t.rank(), t.world_size());
    let next = (rank + 1) % world;
    let prev = (rank + world - 1) % world;
    for step in 0..world - 1 {
        let send_c = (rank + shift + world - step) % world;
        let recv_c = (rank + shift + 2 * world - 1 - step) % world;
        for j in 0..chunks.segments {
            let (out, into) =
                split_read_write(buf, chunks.segment(send_c, j), chunks.segment(recv_c, j));
            t.send_recv(next, out, prev, into, deadline)?;
        }
    }
    Ok(())
}

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
    let chunks = RingChunks::new(block_offsets(buf.len(), elem, world), elem, segment_bytes);
    ring_reduce_scatter_pass(t, buf, &chunks, dtype, op, 1, deadline)?;
    let owned = (rank + 1) % world;
    finish(op, dtype, &mut buf[chunks.chunk(owned)], world)?;
    ring_all_gather_pass(t, buf, &chunks, 1, deadline)
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
