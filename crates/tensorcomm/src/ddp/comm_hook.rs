//! `CommHook`: how a bucket of gradients is communicated (c10d's
//! communication hooks), with the default all-reduce hook and a no-op hook.

use std::sync::Arc;

use super::flat_buffer::divide_in_place;
use super::GradBucket;
use crate::group::{ProcessGroup, ReduceOp, WorkFuture};
use crate::tensor::{DType, Tensor};
use crate::Result;

/// Communicates one bucket of gradients: starts the communication and
/// returns at once with a future whose value is the bucket's new flat
/// buffer (same number of elements and dtype as the buffer the
/// [`Reducer`](super::Reducer) handed in; it may be that buffer).
///
/// The [`Reducer`](super::Reducer) calls [`run`](CommHook::run) the moment
/// a bucket's last gradient arrives, so a hook's communication overlaps the
/// rest of the backward pass. Every rank calls a hook for the same buckets
/// in the same order, so a hook's collectives match across ranks.
///
/// ```
/// use std::sync::Arc;
/// use tensorcomm::ddp::{CommHook, GradBucket};
/// use tensorcomm::group::{ProcessGroup, ReduceOp, WorkFuture};
/// use tensorcomm::tensor::Tensor;
///
/// /// Sums gradients over the ranks without averaging.
/// struct SumHook;
///
/// impl CommHook for SumHook {
///     fn run(&self, group: &Arc<dyn ProcessGroup>, bucket: GradBucket)
///         -> tensorcomm::Result<WorkFuture<Tensor<'static>>> {
///         let buffer = bucket.buffer().clone();
///         let work = group.all_reduce(&buffer, ReduceOp::Sum, None)?;
///         Ok(work.get_future().then(move |done| done.map(|()| buffer)))
///     }
/// }
///
/// let pg = tensorcomm::init_process_group(tensorcomm::Backend::Cpu, "tcp://127.0.0.1:0?rank=0&world_size=1")?;
/// let bucket = GradBucket::new(0, 1, Tensor::from_vec(vec![3.0f32], &[1])?, vec![vec![1]], vec![0])?;
/// assert_eq!(SumHook.run(&pg, bucket)?.wait()?.to_vec::<f32>()?, [3.0]);
/// # Ok::<(), tensorcomm::Error>(())
/// ```
pub trait CommHook: Send + Sync {
    /// Starts communicating `bucket` over `group`.
    fn run(
        &self,
        group: &Arc<dyn ProcessGroup>,
        bucket: GradBucket,
    ) -> Result<WorkFuture<Tensor<'static>>>;
}

/// The default hook (c10d's `allreduce_hook`): divides the bucket by the
/// world size, then sums it over the ranks, so every rank gets the mean.
/// Dividing first keeps large sums of low-precision gradients in range.
///
/// ```
/// use tensorcomm::ddp::{AllReduceHook, CommHook, GradBucket};
/// use tensorcomm::tensor::Tensor;
///
/// let pg = tensorcomm::init_process_group(tensorcomm::Backend::Cpu, "tcp://127.0.0.1:0?rank=0&world_size=1")?;
/// let bucket = GradBucket::new(0, 1, Tensor::from_vec(vec![3.0f32, 1.5], &[2])?, vec![vec![2]], vec![0])?;
/// assert_eq!(AllReduceHook.run(&pg, bucket)?.wait()?.to_vec::<f32>()?, [3.0, 1.5]);
/// # Ok::<(), tensorcomm::Error>(())
/// ```
#[derive(Clone, Copy, Debug, Default)]
pub struct AllReduceHook;

impl CommHook for AllReduceHook {
    fn run(
        &self,
        group: &Arc<dyn ProcessGroup>,
        bucket: GradBucket,
    ) -> Result<WorkFuture<Tensor<'static>>> {
        all_reduce_mean(group, bucket.buffer().clone(), "AllReduceHook")
    }
}

/// Divides `buffer` by the world size, then starts summing it over
/// `group`; the future's value is `buffer`, holding the mean. An f32 or
/// f64 GPU buffer is scaled by the collective itself (a pre-multiplied sum
/// by 1/world size, on the device: each input is scaled before the sum,
/// as on the host; the same bits for a power-of-two world size, within
/// one rounding otherwise). An f32 or f64 host buffer in a power-of-two
/// world is summed, then scaled by 1/world size inside the collective, on
/// the group's thread rather than the caller's: scaling by a power of two
/// commutes with rounding, so these are the bits of dividing first unless
/// an input is subnormal or a sum overflows. Other host buffers, and half
/// precision, are divided here first.
pub(crate) fn all_reduce_mean(
    group: &Arc<dyn ProcessGroup>,
    buffer: Tensor<'static>,
    context: &str,
) -> Result<WorkFuture<Tensor<'static>>> {
    let size = group.size();
    let world = size as f64;
    let wide = matches!(buffer.dtype(), DType::F32 | DType::F64);
    let scaled_in_collective = wide && (!buffer.device().is_cpu() || size.is_power_of_two());
    let op = if scaled_in_collective {
        ReduceOp::PremulSum(1.0 / world)
    } else {
        divide_in_place(&buffer, world, context)?;
        ReduceOp::Sum
    };
    let work = group.all_reduce(&buffer, op, None)?;
    Ok(work.get_future().then(move |done| done.map(|()| buffer)))
}

/// A hook that communicates nothing and hands the bucket back unchanged
/// (c10d's `noop_hook`): for tests, and to measure a model's time without
/// communication.
///
/// ```
/// use tensorcomm::ddp::{CommHook, GradBucket, NoOpHook};
/// use tensorcomm::tensor::Tensor;
///
/// let pg = tensorcomm::init_process_group(tensorcomm::Backend::Cpu, "tcp://127.0.0.1:0?rank=0&world_size=1")?;
/// let bucket = GradBucket::new(0, 1, Tensor::from_vec(vec![3.0f32], &[1])?, vec![vec![1]], vec![0])?;
/// assert_eq!(NoOpHook.run(&pg, bucket)?.wait()?.to_vec::<f32>()?, [3.0]);
/// # Ok::<(), tensorcomm::Error>(())
/// ```
#[derive(Clone, Copy, Debug, Default)]
pub struct NoOpHook;

impl CommHook for NoOpHook {
    fn run(
        &self,
        _group: &Arc<dyn ProcessGroup>,
        bucket: GradBucket,
    ) -> Result<WorkFuture<Tensor<'static>>> {
        Ok(WorkFuture::ready(bucket.buffer().clone()))
    }
}
