//! broadcast, broadcast_out, broadcast_coalesced.

use crate::cuda::kernels;
use crate::cuda::runtime::{self, DevicePtr};
use crate::tensor::{Device, Tensor};
use crate::Result;

use super::chain;
use super::copy::{byte_copyable, copy_pairs, output_like, span, Queue};
use super::group::{take_kinds, Kind};
use super::sparse::CommTensor;
#[cfg(doc)]
use super::take_tensors;
use super::{arg_error, check_devices, cuda_ordinal};

/// The default bucket size of [`broadcast_coalesced`] and
/// [`reduce_add_coalesced`](super::reduce_add_coalesced): 10 MiB, as in PyTorch.
pub const DEFAULT_BUFFER_SIZE: usize = 10 << 20;

/// [`broadcast_coalesced`] queues its copies in groups of at least this
/// many bytes (or [`kernels::MAX_COPY`] ranges), whatever the bucket size.
const GROUP_BYTES: usize = 16 << 20;

/// Copies `tensor` to every device in `devices`. The output for the
/// tensor's own device is `tensor` itself (same storage, no copy); the
/// others are new tensors with the same strides when `tensor` is dense. The
/// source may be a host tensor. Negative device indices are errors.
///
/// ```no_run
/// use tensorcomm::cuda::comm::broadcast;
/// use tensorcomm::tensor::{Device, Tensor};
/// let x = Tensor::from_vec(vec![1.0f32, 2.0], &[2])?.to_device(Device::Cuda(0))?;
/// let out = broadcast(&x, &[0, 1])?;
/// assert!(out[0].shares_storage(&x));
/// assert_eq!(out[1].device(), Device::Cuda(1));
/// assert_eq!(out[1].to_vec::<f32>()?, [1.0, 2.0]);
/// # Ok::<(), tensorcomm::Error>(())
/// ```
pub fn broadcast<'a>(tensor: &Tensor<'a>, devices: &[i64]) -> Result<Vec<Tensor<'a>>> {
    let devices = check_devices("broadcast", devices)?;
    let mut outs = Vec::with_capacity(devices.len());
    let mut fresh = Vec::new();
    for &d in &devices {
        if tensor.device() == Device::Cuda(d) {
            outs.push(None);
        } else {
            let t = output_like(tensor, Device::Cuda(d))?;
            fresh.push(t.clone());
            outs.push(Some(t));
        }
    }
    let targets: Vec<&Tensor<'_>> = fresh.iter().collect();
    if !chain::try_broadcast(tensor, &targets)? {
        let pairs: Vec<(&Tensor<'_>, &Tensor<'_>)> = fresh.iter().map(|o| (o, tensor)).collect();
        copy_pairs(&pairs, &|_| None)?;
    }
    Ok(outs
        .into_iter()
        .map(|o| o.unwrap_or_else(|| tensor.clone()))
        .collect())
}

/// Copies `tensor` into every tensor of `outs`, which must be CUDA tensors
/// of the source's shape and dtype (any layout). Nothing is written when a
/// check fails.
///
/// ```no_run
/// use tensorcomm::cuda::comm::broadcast_out;
/// use tensorcomm::tensor::{DType, Device, Tensor};
/// let x = Tensor::from_vec(vec![7i32; 4], &[2, 2])?;
/// let outs = [Tensor::zeros_on(&[2, 2], DType::I32, Device::Cuda(0))?, Tensor::zeros_on(&[2, 2], DType::I32, Device::Cuda(1))?];
/// broadcast_out(&x, &outs)?;
/// assert_eq!(outs[1].to_vec::<i32>()?, [7; 4]);
/// # Ok::<(), tensorcomm::Error>(())
/// ```
pub fn broadcast_out(tensor: &Tensor<'_>, outs: &[Tensor<'_>]) -> Result<()> {
    const OP: &str = "broadcast_out";
    for (i, out) in outs.iter().enumerate() {
        cuda_ordinal(OP, "output tensor", i, out)?;
        if out.shape() != tensor.shape() {
            return Err(arg_error(
                OP,
                "output tensor",
                Some(i),
                format!("shape {:?} (the source's)", tensor.shape()),
                format!("shape {:?}", out.shape()),
            ));
        }
        if out.dtype() != tensor.dtype() {
            return Err(arg_error(
                OP,
                "output tensor",
                Some(i),
                format!("dtype {} (the source's)", tensor.dtype()),
                format!("dtype {}", out.dtype()),
            ));
        }
    }
    let targets: Vec<&Tensor<'_>> = outs.iter().collect();
    if chain::try_broadcast(tensor, &targets)? {
        return Ok(());
    }
    let pairs: Vec<(&Tensor<'_>, &Tensor<'_>)> = outs.iter().map(|o| (o, tensor)).collect();
    copy_pairs(&pairs, &|_| None)
}

/// Broadcasts many tensors, all on `devices[0]`, to every device in
/// `devices`, in buckets of at most about `buffer_size` bytes of one dtype
/// ([`take_tensors`]). `result[0]` holds the inputs themselves; `result[k]`
/// holds, in input order, new tensors on `devices[k]`, each with its own
/// storage and the input's strides when dense. Zero-element tensors keep
/// their shape. Dense tensors are copied straight into the other devices'
/// outputs by the multi-tensor kernel on `devices[0]` (tensors of 4 MiB
/// and more by the copy engines), in groups queued while the next outputs
/// are allocated, with one wait at the end: there are no flat buffers, so
/// `buffer_size` only orders the copies. Lists with sparse tensors go
/// through [`broadcast_coalesced_mixed`].
///
/// ```no_run
/// use tensorcomm::cuda::comm::{broadcast_coalesced, DEFAULT_BUFFER_SIZE};
/// use tensorcomm::tensor::{DType, Device, Tensor};
/// let params = vec![
///     Tensor::zeros_on(&[64, 3, 7, 7], DType::F32, Device::Cuda(0))?,
///     Tensor::zeros_on(&[1000], DType::BF16, Device::Cuda(0))?,
/// ];
/// let copies = broadcast_coalesced(&params, &[0, 1], DEFAULT_BUFFER_SIZE)?;
/// assert_eq!(copies[1][1].device(), Device::Cuda(1));
/// assert_eq!(copies[1][1].shape(), &[1000]);
/// # Ok::<(), tensorcomm::Error>(())
/// ```
pub fn broadcast_coalesced<'a>(
    tensors: &[Tensor<'a>],
    devices: &[i64],
    buffer_size: usize,
) -> Result<Vec<Vec<Tensor<'a>>>> {
    let items: Vec<CommTensor<'a>> = tensors.iter().cloned().map(CommTensor::Dense).collect();
    broadcast_items("broadcast_coalesced", &items, devices, buffer_size)?
        .into_iter()
        .map(|outs| outs.into_iter().map(CommTensor::into_dense).collect())
        .collect()
}

/// [`broadcast_coalesced`] of a list mixing dense and sparse tensors, as
/// PyTorch's takes them: every tensor (a sparse tensor's values) on
/// `devices[0]`. Buckets hold one dtype and one kind, dense or sparse
/// ([`take_tensors`]; a sparse tensor counts its indices and values). A
/// sparse tensor's copy on `devices[k]` has its values copied to that GPU,
/// with the dense tensors' copies, and shares the input's host indices
/// (see [`SparseTensor`](crate::tensor::SparseTensor)). `result[0]` holds
/// the inputs themselves; every list keeps input order and kinds.
///
/// ```no_run
/// use tensorcomm::cuda::comm::{broadcast_coalesced_mixed, CommTensor, DEFAULT_BUFFER_SIZE};
/// use tensorcomm::tensor::{DType, Device, SparseTensor, Tensor};
/// let grad = SparseTensor::new(vec![3, 1], Tensor::from_vec(vec![1.0f32, 2.0], &[2])?, &[8])?;
/// let items: Vec<CommTensor<'static>> = vec![
///     Tensor::zeros_on(&[16], DType::F32, Device::Cuda(0))?.into(),
///     grad.to_device(Device::Cuda(0))?.into(),
/// ];
/// let copies = broadcast_coalesced_mixed(&items, &[0, 1], DEFAULT_BUFFER_SIZE)?;
/// let on1 = copies[1][1].as_sparse().expect("input order and kinds are kept");
/// assert_eq!(on1.device(), Device::Cuda(1));
/// assert_eq!(on1.to_dense()?.to_vec::<f32>()?, grad.to_dense()?.to_vec::<f32>()?);
/// # Ok::<(), tensorcomm::Error>(())
/// ```
pub fn broadcast_coalesced_mixed<'a>(
    tensors: &[CommTensor<'a>],
    devices: &[i64],
    buffer_size: usize,
) -> Result<Vec<Vec<CommTensor<'a>>>> {
    broadcast_items("broadcast_coalesced", tensors, devices, buffer_size)
}

fn broadcast_items<'a>(
    op: &'static str,
    tensors: &[CommTensor<'a>],
    devices: &[i64],
    buffer_size: usize,
) -> Result<Vec<Vec<CommTensor<'a>>>> {
    let devices = check_devices(op, devices)?;
    let Some(&root) = devices.first() else {
        return Err(arg_error(
            op,
            "devices",
            None,
            "at least one device",
            "an empty list",
        ));
    };
    for (i, t) in tensors.iter().enumerate() {
        if t.device() != Device::Cuda(root) {
            let whose = if t.is_sparse() {
                "a sparse tensor with values"
            } else {
                "a tensor"
            };
            return Err(arg_error(
                op,
                "tensor",
                Some(i),
                format!("{whose} on devices[0] = cuda:{root}"),
                format!("{whose} on {}", t.device()),
            ));
        }
    }
    if buffer_size == 0 {
        return Err(arg_error(
            op,
            "buffer_size",
            None,
            "a positive number of bytes",
            "0",
        ));
    }
    // PyTorch flattens each bucket into a buffer of `buffer_size` bytes
    // (a sparse bucket into one buffer of indices and one of values),
    // broadcasts it and unflattens it. Here every dense tensor and every
    // sparse tensor's values are copied straight into their outputs, so no
    // buffer needs bounding and no bucket needs its own synchronisation.
    // The outputs are allocated bucket by bucket, and as soon as
    // [`GROUP_BYTES`] of copies are ready they are queued, so the GPUs copy
    // while the host prepares the next tensors; one wait at the end.
    for &d in &devices[1..] {
        if d != root {
            runtime::context(d)?;
        }
    }
    let mut fresh: Vec<Vec<Option<CommTensor<'a>>>> = devices[1..]
        .iter()
        .map(|_| vec![None; tensors.len()])
        .collect();
    let specs: Vec<(Kind, usize)> = tensors.iter().map(|t| (t.kind(), t.nbytes())).collect();
    // Three or more GPUs and enough bytes: the copies flow down a chain of
    // the GPUs instead of all leaving the root (`chained[i]`: tensor i's
    // address on each GPU of the chain so far).
    let tuning = super::copy::tuning()?;
    let total: usize = specs.iter().map(|s| s.1).sum();
    let chain = if chain::worth_it(total, devices.len() - 1, tuning) {
        chain::gpus(&devices)?
    } else {
        None
    };
    let mut chained: Vec<Vec<DevicePtr>> = vec![Vec::new(); tensors.len()];
    let mut queue = Queue::default();
    let mut spans = Vec::new();
    let mut ready = 0usize;
    let mut strided = Vec::new();
    for bucket in take_kinds(&specs, buffer_size) {
        for (k, &d) in devices[1..].iter().enumerate() {
            if d == root {
                continue;
            }
            for &i in &bucket {
                let out = match &tensors[i] {
                    CommTensor::Dense(src) => {
                        let dst = output_like(src, Device::Cuda(d))?;
                        if dst.numel() > 0 {
                            if byte_copyable(&dst, src) {
                                if chain.is_some() {
                                    link(&mut chained[i], src, &dst)?;
                                } else {
                                    ready += src.nbytes();
                                    spans.push(span(&dst, src)?);
                                }
                            } else {
                                strided.push((k, i));
                            }
                        }
                        CommTensor::Dense(dst)
                    }
                    CommTensor::Sparse(src) => {
                        // Values are contiguous: always one byte range.
                        let values = output_like(src.values(), Device::Cuda(d))?;
                        if values.numel() > 0 {
                            if chain.is_some() {
                                link(&mut chained[i], src.values(), &values)?;
                            } else {
                                ready += values.nbytes();
                                spans.push(span(&values, src.values())?);
                            }
                        }
                        CommTensor::Sparse(src.with_values(values))
                    }
                };
                fresh[k][i] = Some(out);
            }
        }
        if ready >= GROUP_BYTES || spans.len() >= kernels::MAX_COPY {
            queue.push(&spans, &|_| None)?;
            spans.clear();
            ready = 0;
        }
    }
    queue.push(&spans, &|_| None)?;
    queue.finish()?;
    if let Some(chain) = &chain {
        let items: Vec<chain::Item> = chained
            .into_iter()
            .zip(tensors)
            .filter(|(ptrs, _)| !ptrs.is_empty())
            .map(|(ptrs, t)| chain::Item {
                ptrs,
                bytes: t.as_dense().map_or_else(
                    || t.as_sparse().map_or(0, |s| s.values().nbytes()),
                    Tensor::nbytes,
                ),
            })
            .collect();
        chain::broadcast(chain, &items, tuning)?;
    }
    let mut outputs: Vec<Vec<CommTensor<'a>>> = Vec::with_capacity(devices.len());
    outputs.push(tensors.to_vec());
    for outs in fresh {
        outputs.push(
            outs.into_iter()
                .zip(tensors)
                .map(|(o, t)| o.unwrap_or_else(|| t.clone()))
                .collect(),
        );
    }
    // Only dense tensors are ever strided.
    let pairs: Vec<(&Tensor<'_>, &Tensor<'_>)> = strided
        .iter()
        .filter_map(|&(k, i)| Some((outputs[k + 1][i].as_dense()?, tensors[i].as_dense()?)))
        .collect();
    copy_pairs(&pairs, &|_| None)?;
    Ok(outputs)
}

/// Adds `dst`'s address to a chained tensor's list (the source's first).
fn link(ptrs: &mut Vec<DevicePtr>, src: &Tensor<'_>, dst: &Tensor<'_>) -> Result<()> {
    if ptrs.is_empty() {
        ptrs.push(src.cuda_ptr()?.1);
    }
    ptrs.push(dst.cuda_ptr()?.1);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tensor::DType;
    use crate::Error;

    #[test]
    fn arguments_are_checked_before_any_gpu_work() {
        let host = Tensor::zeros(&[2], DType::F32).unwrap();
        match broadcast(&host, &[0, -1]) {
            Err(Error::CommArgument {
                op,
                index,
                expected,
                found,
                ..
            }) => {
                assert_eq!((op, index, found.as_str()), ("broadcast", Some(1), "-1"));
                assert!(expected.contains("non-negative"));
            }
            other => panic!("{other:?}"),
        }
        match broadcast_coalesced(std::slice::from_ref(&host), &[0, 1], 1024) {
            Err(e @ Error::CommArgument { index: Some(0), .. }) => {
                let msg = e.to_string();
                assert!(
                    msg.contains("cuda:0") && msg.contains("found a tensor on cpu"),
                    "{msg}"
                );
            }
            other => panic!("{other:?}"),
        }
        assert!(matches!(
            broadcast_coalesced(&[], &[], 1024),
            Err(Error::CommArgument { what, .. }) if what == "devices"
        ));
        match broadcast_out(&host, std::slice::from_ref(&host)) {
            Err(e @ Error::CommArgument { index: Some(0), .. }) => {
                assert!(e.to_string().contains("a CUDA tensor"), "{e}")
            }
            other => panic!("{other:?}"),
        }
    }
}
