//! A large all_reduce of a contiguous CUDA tensor, staged in chunks so
//! that the copies overlap the host reduction (PyTorch's Gloo stages the
//! whole message each way): every chunk's copy down is queued at once,
//! each followed by an event; then chunk by chunk the host waits for its
//! copy, all-reduces it with the other ranks, and queues its copy back on
//! a second stream (so copies in both directions run at once), so chunk
//! i+1 is copied down and chunk i-1 copied up while chunk i is reduced. Every rank must cut the message into the same chunks, so the
//! ranks agree to take this path with a vote (see `cpu/group_backend.rs`):
//! a rank with a host tensor all-reduces the same chunks of it.

use std::ops::Range;
use std::sync::Arc;
use std::time::Instant;

use super::staged_call::{wait_until, Ordered};
use crate::group::collective::Collective;
use crate::group::{DeviceEvent, ReduceOp};
use crate::tensor::Tensor;
use crate::Result;

/// All-reduces of at least this many bytes take the chunked path (when
/// every rank votes for it).
pub(crate) const PIPELINE_MIN_BYTES: usize = 2 << 20;

/// The byte ranges, element-aligned, that a message of `nbytes` (elements
/// of `elem` bytes) is cut into: a quarter of it per chunk, from 512 KiB
/// to 4 MiB (smaller chunks pay the host collective's fixed cost more
/// often; larger ones overlap less).
pub(crate) fn chunks(nbytes: usize, elem: usize) -> Vec<Range<usize>> {
    let target = (nbytes / 4).clamp(512 << 10, 4 << 20);
    let step = (target / elem).max(1) * elem;
    (0..nbytes)
        .step_by(step)
        .map(|a| a..(a + step).min(nbytes))
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
        let device = self.into_device();
        let flat = tensor.reshape(&[tensor.numel()])?;
        let host = device.host_copy_of(&flat)?;
        let ranges = chunks(tensor.nbytes(), tensor.dtype().size());
        let (gpu_parts, host_parts) = (pieces(&flat, &ranges)?, pieces(&host, &ranges)?);
        let keep = || vec![tensor.clone(), host.clone()];
        let mut downs = Vec::with_capacity(ranges.len());
        for (gpu, cpu) in gpu_parts.iter().zip(&host_parts) {
            let queued = device.copy_down(gpu, cpu);
            if queued.is_err() {
                device.settle();
            }
            queued?;
            downs.push(device.record(keep())?);
        }
        let mut reduce_all = || -> Result<()> {
            for ((gpu, cpu), down) in gpu_parts.iter().zip(&host_parts).zip(&downs) {
                wait_until(down, deadline)?;
                run_host(&Collective::AllReduce {
                    tensor: cpu.clone(),
                    op,
                })?;
                device.copy_up_beside(cpu, gpu)?;
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

    #[test]
    fn chunks_cover_the_message_in_element_aligned_quarters_within_bounds() {
        let mib = 1usize << 20;
        // 2 MiB: four 512 KiB chunks; 64 MiB: 4 MiB chunks; f64 and a
        // 3-byte element keep whole elements.
        for (nbytes, elem) in [(2 * mib, 4), (16 * mib, 4), (64 * mib, 8), (3 * mib + 3, 3)] {
            let c = chunks(nbytes, elem);
            assert_eq!(c.first().map(|r| r.start), Some(0));
            assert_eq!(c.last().map(|r| r.end), Some(nbytes));
            assert!(c.windows(2).all(|w| w[0].end == w[1].start));
            assert!(c.iter().all(|r| r.start % elem == 0 && r.len() % elem == 0));
            assert!(
                c[0].len() >= 512 << 10 && c[0].len() <= 4 << 20,
                "{nbytes}: {:?}",
                c[0]
            );
        }
        assert_eq!(chunks(2 * mib, 4).len(), 4);
        assert_eq!(chunks(16 * mib, 4).len(), 4);
        assert_eq!(chunks(64 * mib, 8).len(), 16);
    }
}
