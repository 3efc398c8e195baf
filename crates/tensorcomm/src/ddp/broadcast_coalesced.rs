//! `broadcast_coalesced`: broadcasting many tensors from one rank as a few
//! flat buckets (c10d's `broadcast_coalesced`, which DDP uses to make every
//! rank start from rank 0's parameters and buffers).

use std::collections::VecDeque;

use super::flat_buffer::{view_of, zeros_on};
use super::{compute_bucket_assignment_by_size, TensorSpec};
use crate::group::{ProcessGroup, Work};
use crate::tensor::Tensor;
use crate::Result;

/// How many bucket broadcasts may be in flight at once (c10d's limit):
/// bounds the memory held by flat copies.
const MAX_IN_FLIGHT: usize = 2;

/// Copies every tensor of rank `root` into the same tensor of every rank.
///
/// The tensors are grouped into buckets of at most about `buffer_size`
/// bytes by [`compute_bucket_assignment_by_size`] (one dtype and device per
/// bucket); each bucket is flattened into one buffer and broadcast as one
/// collective, at most two in flight, and copied back into its tensors.
/// Tensors without elements are skipped. Every rank passes tensors of the
/// same shapes and dtypes in the same order.
///
/// ```
/// use tensorcomm::{init_process_group, Backend};
/// use tensorcomm::ddp::broadcast_coalesced;
/// use tensorcomm::tensor::Tensor;
///
/// let pg = init_process_group(Backend::Cpu, "tcp://127.0.0.1:0?rank=0&world_size=1")?;
/// let a = Tensor::from_vec(vec![1.0f32, 2.0], &[2])?;
/// let b = Tensor::from_vec(vec![7i64], &[1])?;
/// broadcast_coalesced(&*pg, &[a.clone(), b.clone()], 1 << 20, 0)?;
/// assert_eq!(a.to_vec::<f32>()?, [1.0, 2.0]);
/// # Ok::<(), tensorcomm::Error>(())
/// ```
pub fn broadcast_coalesced(
    group: &dyn ProcessGroup,
    tensors: &[Tensor<'static>],
    buffer_size: usize,
    root: usize,
) -> Result<()> {
    let nonempty: Vec<&Tensor<'static>> = tensors.iter().filter(|t| t.numel() > 0).collect();
    if nonempty.is_empty() {
        return Ok(());
    }
    let specs: Vec<TensorSpec> = nonempty.iter().map(|t| TensorSpec::of(t)).collect();
    let assignment = compute_bucket_assignment_by_size(&specs, &[buffer_size.max(1)], &[], &[])?;
    let mut in_flight: VecDeque<BucketBroadcast> = VecDeque::new();
    for bucket in assignment.buckets {
        if in_flight.len() >= MAX_IN_FLIGHT {
            if let Some(oldest) = in_flight.pop_front() {
                oldest.finish()?;
            }
        }
        let members: Vec<Tensor<'static>> = bucket.iter().map(|&i| nonempty[i].clone()).collect();
        in_flight.push_back(BucketBroadcast::start(group, members, root)?);
    }
    while let Some(oldest) = in_flight.pop_front() {
        oldest.finish()?;
    }
    Ok(())
}

/// One bucket's broadcast in flight: its flat buffer and its tensors.
struct BucketBroadcast {
    flat: Tensor<'static>,
    tensors: Vec<Tensor<'static>>,
    work: Work,
}

impl BucketBroadcast {
    /// Flattens `tensors` (one dtype and device) and starts broadcasting.
    fn start(group: &dyn ProcessGroup, tensors: Vec<Tensor<'static>>, root: usize) -> Result<Self> {
        let first = &tensors[0];
        let numel = tensors.iter().map(Tensor::numel).sum();
        let flat = zeros_on(numel, first.dtype(), first.device())?;
        let mut offset = 0;
        for t in &tensors {
            view_of(&flat, offset, t.shape())?.copy_from(t)?;
            offset += t.numel();
        }
        let work = group.broadcast(&flat, root, None)?;
        Ok(BucketBroadcast {
            flat,
            tensors,
            work,
        })
    }

    /// Waits for the broadcast and copies the buffer back into the tensors.
    fn finish(self) -> Result<()> {
        self.work.synchronize()?;
        let mut offset = 0;
        for t in &self.tensors {
            t.copy_from(&view_of(&self.flat, offset, t.shape())?)?;
            offset += t.numel();
        }
        Ok(())
    }
}
