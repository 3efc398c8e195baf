//! A large all_reduce of a contiguous CUDA tensor, staged in chunks so
//! that the copies overlap the host reduction (PyTorch's Gloo stages the
//! whole message each way). Chunk by chunk the host waits for its copy
//! down, all-reduces it with the other ranks, and queues its copy back on
//! a second stream (so copies in both directions run at once); chunk i+1
//! is copied down and chunk i-1 copied up while chunk i is reduced.
//!
//! - Copies down are queued one chunk ahead of the one being reduced,
//!   not all at once: ranks sharing one GPU share its link, and short
//!   queues keep them copying the same chunk at the same time
//!   (with every copy queued at once, one rank's first chunk could wait
//!   1.5 ms behind the others' whole messages).
//! - The first and last chunks are smaller ([`chunks`]): the host starts
//!   reducing sooner, and less is left to copy back after the last
//!   reduction.
//!
//! Every rank must cut the message into the same chunks, so the ranks
//! agree to take this path with a vote (see `cpu/group_backend.rs`): a
//! rank with a host tensor all-reduces the same chunks of it.

use std::ops::Range;
use std::sync::Arc;
use std::time::Instant;

use super::staged_call::{wait_until, Ordered};
use super::staged_event::StagedEvent;
use crate::group::collective::Collective;
use crate::group::{DeviceEvent, ReduceOp};
use crate::tensor::Tensor;
use crate::Result;

/// All-reduces of at least this many bytes take the chunked path (when
/// every rank votes for it). At 1 MiB chunks gained nothing over the whole
/// message (2 and 4 ranks sharing an H200), while the vote costs a host
/// all_reduce its few microseconds.
pub(crate) const PIPELINE_MIN_BYTES: usize = 2 << 20;

/// The byte ranges, element-aligned, that a message of `nbytes` (elements
/// of `elem` bytes) is cut into: a quarter of it per chunk, from 512 KiB
/// to 4 MiB (smaller chunks pay the host collective's fixed cost more
/// often; larger ones overlap less); where the message holds two and a
/// half such chunks, the first two are a quarter and a half of one, and
/// so are the last two in reverse. A remainder under a quarter chunk joins
/// the chunk before it.
pub(crate) fn chunks(nbytes: usize, elem: usize) -> Vec<Range<usize>> {
    let whole = |n: usize| (n / elem).max(1) * elem;
    let step = whole((nbytes / 4).clamp(512 << 10, 4 << 20));
    let edges = [whole(step / 4), whole(step / 2)];
    let edge_bytes = 2 * (edges[0] + edges[1]);
    let (head, tail): (&[usize], &[usize]) = if nbytes >= edge_bytes + step {
        (&edges, &[edges[1], edges[0]])
    } else {
        (&[], &[])
    };
    let middle = nbytes - head.iter().chain(tail).sum::<usize>();
    // Whole steps; a remainder under a quarter step joins the last one
    // (a chunk of a few bytes would cost a host round of its own).
    let mut steps = vec![step; middle / step];
    match (middle % step, steps.last_mut()) {
        (0, _) => {}
        (rest, Some(last)) if rest < step / 4 => *last += rest,
        (rest, _) => steps.push(rest),
    }
    let mut at = 0;
    head.iter()
        .copied()
        .chain(steps)
        .chain(tail.iter().copied())
        .map(|len| {
            at += len;
            at - len..at
        })
        .collect()
}

/// The chunks of `t` (flat, contiguous) as views.
fn pieces(t: &Tensor<'static>, ranges: &[Range<usize>]) -> Result<Vec<Tensor<'static>>> {
    let elem = t.dtype().size();
    let flat = t.reshape(&[t.numel()])?;
    ranges
        .iter()
        .map(|r| flat.narrow(0, r.start / elem, r.len() / elem))
        .collect()
}

/// Runs `op`'s all_reduce of `parts` one by one through `run_host`, each
/// on the host.
pub(crate) fn all_reduce_host_chunks(
    tensor: &Tensor<'static>,
    op: ReduceOp,
    run_host: &mut dyn FnMut(&Collective) -> Result<()>,
) -> Result<()> {
    let ranges = chunks(tensor.nbytes(), tensor.dtype().size());
    for part in pieces(tensor, &ranges)? {
        run_host(&Collective::AllReduce { tensor: part, op })?;
    }
    Ok(())
}

impl Ordered {
    /// The chunked all_reduce of contiguous CUDA tensor `tensor` (see the
    /// module docs); `run_host` all-reduces one host chunk with the other
    /// ranks. The event completes once every chunk is back on the GPU.
    pub(crate) fn pipelined_all_reduce(
        self,
        tensor: &Tensor<'static>,
        op: ReduceOp,
        deadline: Instant,
        run_host: &mut dyn FnMut(&Collective) -> Result<()>,
    ) -> Result<Arc<dyn DeviceEvent>> {
        let device = self.into_device()?;
        let flat = tensor.reshape(&[tensor.numel()])?;
        let host = device.host_copy_of(&flat)?;
        let ranges = chunks(tensor.nbytes(), tensor.dtype().size());
        let (gpu_parts, host_parts) = (pieces(&flat, &ranges)?, pieces(&host, &ranges)?);
        let keep = || vec![tensor.clone(), host.clone()];
        // Queues chunk `i`'s copy down, followed by its event.
        let copy_down = |i: usize| -> Result<Arc<StagedEvent>> {
            let queued = device.copy_down(&gpu_parts[i], &host_parts[i]);
            if queued.is_err() {
                device.settle();
            }
            queued?;
            device.record(keep())
        };
        let mut reduce_all = || -> Result<()> {
            // Chunk i+1's copy down is queued before the host waits for
            // chunk i's, so one chunk is always on its way down.
            let mut down = copy_down(0)?;
            for (i, (gpu, cpu)) in gpu_parts.iter().zip(&host_parts).enumerate() {
                let next = if i + 1 < ranges.len() {
                    Some(copy_down(i + 1)?)
                } else {
                    None
                };
                wait_until(&down, deadline)?;
                run_host(&Collective::AllReduce {
                    tensor: cpu.clone(),
                    op,
                })?;
                device.copy_up_beside(cpu, gpu)?;
                if let Some(n) = next {
                    down = n;
                }
            }
            Ok(())
        };
        let reduced = reduce_all();
        // Also after a failure: the copies back queued so far hold both
        // ends until they are done (a failed join waits for them).
        let done = match device.join_up() {
            Ok(()) => device.record(keep()),
            Err(e) => {
                device.settle();
                Err(e)
            }
        };
        reduced?;
        let done: Arc<dyn DeviceEvent> = done?;
        Ok(done)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lengths_kib(nbytes: usize, elem: usize) -> Vec<usize> {
        chunks(nbytes, elem).iter().map(|r| r.len() >> 10).collect()
    }

    #[test]
    fn chunks_cover_the_message_in_element_aligned_pieces_within_bounds() {
        let mib = 1usize << 20;
        // f64 and a 3-byte element keep whole elements.
        for (nbytes, elem) in [
            (mib, 4),
            (2 * mib, 4),
            (16 * mib, 4),
            (64 * mib, 8),
            (3 * mib + 3, 3),
            (5 * mib + 7 * 4, 4),
            (18 * mib + 4, 4),
            (18 * mib + 6, 2),
        ] {
            let c = chunks(nbytes, elem);
            assert_eq!(c.first().map(|r| r.start), Some(0));
            assert_eq!(c.last().map(|r| r.end), Some(nbytes));
            assert!(c.windows(2).all(|w| w[0].end == w[1].start));
            assert!(c.iter().all(|r| r.start % elem == 0 && r.len() % elem == 0));
            // A step, with at most a quarter of one joined to it.
            assert!(c.iter().all(|r| r.len() <= 5 << 20), "{nbytes}: {c:?}");
            assert!(c.iter().all(|r| !r.is_empty()), "{nbytes}: {c:?}");
        }
    }

    #[test]
    fn chunks_are_quarters_of_the_message_with_smaller_ones_at_both_ends() {
        let mib = 1usize << 20;
        // Too short for the smaller ends: two 512 KiB chunks.
        assert_eq!(lengths_kib(mib, 4), [512, 512]);
        // 512 KiB steps, ends of 128 and 256 KiB.
        assert_eq!(lengths_kib(2 * mib, 4), [128, 256, 512, 512, 256, 256, 128]);
        // 4 MiB steps, ends of 1 and 2 MiB.
        assert_eq!(
            lengths_kib(16 * mib, 4),
            [1024, 2048, 4096, 4096, 2048, 2048, 1024]
        );
        // 58 MiB between the ends: fourteen 4 MiB steps and 2 MiB.
        let big = lengths_kib(64 * mib, 8);
        assert_eq!(big.len(), 19);
        assert!(big[2..16].iter().all(|&l| l == 4096), "{big:?}");
        assert_eq!(big[16], 2048);
        // 4 bytes past whole steps join the last step, not a chunk alone.
        let ragged = chunks(18 * mib + 4, 4);
        let lens: Vec<usize> = ragged.iter().map(|r| r.len()).collect();
        assert_eq!(
            lens,
            [mib, 2 * mib, 4 * mib, 4 * mib, 4 * mib + 4, 2 * mib, mib]
        );
        assert_eq!(big[..2], [1024, 2048]);
        assert_eq!(big[big.len() - 2..], [2048, 1024]);
    }
}
