//! reduce_add, reduce_add_coalesced.

use crate::cuda::kernels;
use crate::cuda::runtime::{self, DevicePtr};
use crate::tensor::{Device, Layout, Tensor};
use crate::Result;

use super::copy::{byte_copyable, copy_pairs, output_like, run_spans, span};
use super::group::take_tensors;
use super::{arg_error, cuda_ordinal};

/// Checks the inputs of one reduction; gives the index of the input on
/// `destination`.
fn check_inputs(
    op: &'static str,
    inputs: &[&Tensor<'_>],
    destination: usize,
    what: &str,
) -> Result<usize> {
    let Some(first) = inputs.first() else {
        return Err(arg_error(
            op,
            "inputs",
            None,
            "at least one input tensor",
            "an empty list",
        ));
    };
    let mut root = None;
    for (i, t) in inputs.iter().enumerate() {
        let dev = cuda_ordinal(op, what, i, t)?;
        if dev == destination && root.is_none() {
            root = Some(i);
        }
        if t.shape() != first.shape() {
            return Err(arg_error(
                op,
                what,
                Some(i),
                format!("shape {:?} (like input 0)", first.shape()),
                format!("shape {:?}", t.shape()),
            ));
        }
        if t.dtype() != first.dtype() {
            return Err(arg_error(
                op,
                what,
                Some(i),
                format!("dtype {} (like input 0)", first.dtype()),
                format!("dtype {}", t.dtype()),
            ));
        }
    }
    root.ok_or_else(|| {
        let devices: Vec<String> = inputs.iter().map(|t| t.device().to_string()).collect();
        arg_error(
            op,
            "destination",
            None,
            format!("the device of one of the inputs ({})", devices.join(", ")),
            format!("cuda:{destination}"),
        )
    })
}

/// Sums `inputs` (CUDA tensors of one shape and dtype) element-wise onto
/// GPU `destination`, which must hold one of them. The result is a new
/// tensor laid out like that input (with one input, the input itself). One
/// kernel on `destination` reads the other GPUs' inputs directly over
/// NVLink; where peer access is missing, they are copied over first.
///
/// ```no_run
/// use tensorcomm::cuda::comm::reduce_add;
/// use tensorcomm::tensor::{Device, Tensor};
/// let a = Tensor::from_vec(vec![1.0f32, 2.0], &[2])?.to_device(Device::Cuda(0))?;
/// let b = Tensor::from_vec(vec![10.0f32, 20.0], &[2])?.to_device(Device::Cuda(1))?;
/// let s = reduce_add(&[a, b], 0)?;
/// assert_eq!(s.to_vec::<f32>()?, [11.0, 22.0]);
/// # Ok::<(), tensorcomm::Error>(())
/// ```
pub fn reduce_add<'a>(inputs: &[Tensor<'a>], destination: usize) -> Result<Tensor<'a>> {
    let refs: Vec<&Tensor<'a>> = inputs.iter().collect();
    let root = check_inputs("reduce_add", &refs, destination, "input tensor")?;
    if inputs.len() == 1 {
        return Ok(inputs[0].clone());
    }
    let out = output_like(&inputs[root], Device::Cuda(destination))?;
    if !super::chain::try_reduce_add(&out, &refs, root)? {
        sum_into(&out, &refs)?;
    }
    Ok(out)
}

/// `out = sum(inputs)`, `out` on a GPU holding a dense layout.
fn sum_into(out: &Tensor<'_>, inputs: &[&Tensor<'_>]) -> Result<()> {
    let (ctx, dst) = out.cuda_ptr()?;
    let dest = ctx.ordinal();
    // Inputs the kernel can read as they are; the rest are copied to `dest`
    // in `out`'s layout first.
    let mut staged = Vec::new();
    let mut srcs: Vec<DevicePtr> = Vec::with_capacity(inputs.len());
    for t in inputs {
        let dev = match t.device() {
            Device::Cuda(d) => d,
            Device::Cpu => dest,
        };
        if byte_copyable(out, t) && runtime::enable_peer_access(dest, dev)? {
            srcs.push(t.cuda_ptr()?.1);
        } else {
            let local = Tensor::uninit_cuda(
                Layout::new(out.shape(), out.strides(), 0)?,
                out.dtype(),
                &ctx,
            )?;
            copy_pairs(&[(&local, t)], &|_| None)?;
            srcs.push(local.cuda_ptr()?.1);
            staged.push(local);
        }
    }
    let stream = ctx.stream()?;
    let numel = out.numel();
    let mut first = true;
    for group in srcs.chunks(kernels::MAX_SRC - 1) {
        let mut ptrs: Vec<DevicePtr> = Vec::with_capacity(kernels::MAX_SRC);
        if !first {
            ptrs.push(dst);
        }
        ptrs.extend_from_slice(group);
        kernels::reduce_add(&ctx, stream, out.dtype(), dst, &ptrs, numel)?;
        first = false;
    }
    stream.synchronize()?;
    drop(staged);
    Ok(())
}

/// Sums lists of tensors element-wise: `inputs[g]` is GPU `g`'s list, all
/// lists have the same length, and tensor `j` has one shape and dtype on
/// every GPU. Works in buckets of about `buffer_size` bytes of one dtype
/// ([`take_tensors`]): each GPU packs its bucket into one flat buffer (one
/// kernel), one sum kernel on `destination` reads the flat buffers, and one
/// kernel unpacks the sums. The results, in input order, are new tensors on
/// `destination` laid out like the destination's inputs.
///
/// ```no_run
/// use tensorcomm::cuda::comm::{reduce_add_coalesced, DEFAULT_BUFFER_SIZE};
/// use tensorcomm::tensor::{DType, Device, Tensor};
/// let on = |d| -> tensorcomm::Result<Vec<Tensor<'static>>> {
///     Ok(vec![Tensor::zeros_on(&[4], DType::F32, Device::Cuda(d))?, Tensor::zeros_on(&[2, 2], DType::I64, Device::Cuda(d))?])
/// };
/// let sums = reduce_add_coalesced(&[on(0)?, on(1)?], 0, DEFAULT_BUFFER_SIZE)?;
/// assert_eq!(sums[1].shape(), &[2, 2]);
/// # Ok::<(), tensorcomm::Error>(())
/// ```
pub fn reduce_add_coalesced(
    inputs: &[Vec<Tensor<'_>>],
    destination: usize,
    buffer_size: usize,
) -> Result<Vec<Tensor<'static>>> {
    const OP: &str = "reduce_add_coalesced";
    let Some(first) = inputs.first() else {
        return Err(arg_error(
            OP,
            "inputs",
            None,
            "one list of tensors per GPU",
            "an empty list",
        ));
    };
    if buffer_size == 0 {
        return Err(arg_error(
            OP,
            "buffer_size",
            None,
            "a positive number of bytes",
            "0",
        ));
    }
    for (g, list) in inputs.iter().enumerate() {
        if list.len() != first.len() {
            return Err(arg_error(
                OP,
                "tensor list",
                Some(g),
                format!("{} tensors (like list 0)", first.len()),
                format!("{} tensors", list.len()),
            ));
        }
    }
    let mut roots = Vec::with_capacity(first.len());
    for j in 0..first.len() {
        let column: Vec<&Tensor<'_>> = inputs.iter().map(|list| &list[j]).collect();
        let what = format!("tensor {j} of the list");
        // Errors name the GPU list index; the tensor index is in `what`.
        let root = check_inputs(OP, &column, destination, &what)?;
        roots.push(root);
    }
    let Some(&root) = roots.first() else {
        return Ok(Vec::new());
    };
    if roots.iter().any(|&r| r != root) {
        return Err(arg_error(
            OP,
            "inputs",
            None,
            "one list per GPU (all tensors of a list on one device)",
            "lists mixing devices",
        ));
    }
    let outs = inputs[root]
        .iter()
        .map(|t| output_like(t, Device::Cuda(destination)))
        .collect::<Result<Vec<_>>>()?;
    if inputs.len() == 1 {
        let pairs: Vec<(&Tensor<'_>, &Tensor<'_>)> = outs.iter().zip(&inputs[0]).collect();
        copy_pairs(&pairs, &|_| None)?;
        return Ok(outs);
    }
    for bucket in take_tensors(first, buffer_size) {
        let dtype = first[bucket[0]].dtype();
        let elems: usize = bucket.iter().map(|&j| outs[j].numel()).sum();
        if elems == 0 {
            continue;
        }
        // Pack: GPU g's tensors of the bucket, in the output's memory order,
        // into one flat tensor on GPU g.
        let mut flats = Vec::with_capacity(inputs.len());
        for list in inputs {
            let ctx = list[bucket[0]].cuda_ptr()?.0;
            let flat = Tensor::uninit_cuda(Layout::contiguous(&[elems]), dtype, &ctx)?;
            let mut spans = Vec::new();
            let mut pairs = Vec::new();
            let mut segs = Vec::new();
            let mut at = 0;
            for &j in &bucket {
                let n = outs[j].numel();
                let seg = flat.narrow(0, at, n)?.as_strided_like(&outs[j])?;
                at += n;
                segs.push(seg);
            }
            for (seg, &j) in segs.iter().zip(&bucket) {
                if byte_copyable(seg, &list[j]) {
                    spans.push(span(seg, &list[j])?);
                } else {
                    pairs.push((seg, &list[j]));
                }
            }
            run_spans(&spans, &|_| None)?;
            copy_pairs(&pairs, &|_| None)?;
            flats.push(flat);
        }
        let flat_refs: Vec<&Tensor<'_>> = flats.iter().collect();
        let flat_out = output_like(&flats[root], Device::Cuda(destination))?;
        sum_into(&flat_out, &flat_refs)?;
        // Unpack into the outputs.
        let mut spans = Vec::new();
        let mut at = 0;
        for &j in &bucket {
            let n = outs[j].numel();
            let seg = flat_out.narrow(0, at, n)?.as_strided_like(&outs[j])?;
            at += n;
            if n > 0 {
                spans.push(span(&outs[j], &seg)?);
            }
        }
        run_spans(&spans, &|_| None)?;
    }
    Ok(outs)
}
