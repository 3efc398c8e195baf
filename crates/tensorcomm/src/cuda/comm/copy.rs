//! Copying many tensors at once: dense same-layout pairs become byte
//! ranges for the multi-tensor copy kernel (or the copy engines); anything
//! else goes through `Tensor::copy_from`.

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::cuda::runtime::kernels::{self, CopyDesc};
use crate::cuda::runtime::{self, Context, DevicePtr, Stream};
use crate::tensor::{Device, Tensor};
use crate::Result;

/// How dense GPU-to-GPU ranges move.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Strategy {
    /// The multi-tensor copy kernel on the source GPU, writing to peers.
    Kernel,
    /// The copy engines, one `cuMemcpyPeerAsync` per range.
    CopyEngine,
}

/// The strategy from `TENSORCOMM_CUDA_COPY` (`ce` or `kernel`, default kernel).
pub(crate) fn strategy() -> Strategy {
    match std::env::var("TENSORCOMM_CUDA_COPY").as_deref() {
        Ok("ce") => Strategy::CopyEngine,
        _ => Strategy::Kernel,
    }
}

/// One dense range between two GPUs.
pub(crate) struct Span {
    pub src_ctx: Arc<Context>,
    pub src: DevicePtr,
    pub dst_ctx: Arc<Context>,
    pub dst: DevicePtr,
    pub bytes: usize,
}

/// True when `dst` can receive `src` as raw bytes (same dense order).
pub(crate) fn byte_copyable(dst: &Tensor<'_>, src: &Tensor<'_>) -> bool {
    dst.device().is_cuda()
        && src.device().is_cuda()
        && dst.shape() == src.shape()
        && dst.dtype() == src.dtype()
        && dst.is_non_overlapping_and_dense()
        && src.is_non_overlapping_and_dense()
        && dst
            .shape()
            .iter()
            .zip(dst.strides().iter().zip(src.strides()))
            .all(|(&n, (a, b))| n < 2 || a == b)
}

/// The span of a byte-copyable pair.
pub(crate) fn span(dst: &Tensor<'_>, src: &Tensor<'_>) -> Result<Span> {
    let (src_ctx, src_ptr) = src.cuda_ptr()?;
    let (dst_ctx, dst_ptr) = dst.cuda_ptr()?;
    Ok(Span {
        src_ctx,
        src: src_ptr,
        dst_ctx,
        dst: dst_ptr,
        bytes: src.nbytes(),
    })
}

/// Copies every pair `dst <- src` and waits. Dense same-layout GPU pairs
/// are batched (one kernel launch per source GPU and [`kernels::MAX_COPY`]
/// ranges); the rest go through `copy_from`. `streams[i]`, when given, is
/// where copies to device `i`... are queued instead of the internal stream.
pub(crate) fn copy_pairs(
    pairs: &[(&Tensor<'_>, &Tensor<'_>)],
    stream_for: &dyn Fn(usize) -> Option<Stream>,
) -> Result<()> {
    let mut spans = Vec::new();
    for (dst, src) in pairs {
        if dst.numel() == 0 || (dst.shares_storage(src) && dst.layout() == src.layout()) {
            continue;
        }
        if byte_copyable(dst, src) {
            spans.push(span(dst, src)?);
        } else {
            dst.copy_from(src)?;
        }
    }
    run_spans(&spans, stream_for)
}

/// Queues the spans and waits for them.
pub(crate) fn run_spans(
    spans: &[Span],
    stream_for: &dyn Fn(usize) -> Option<Stream>,
) -> Result<()> {
    if spans.is_empty() {
        return Ok(());
    }
    let strategy = strategy();
    // Kernel copies grouped by the GPU that runs them.
    let mut launches: BTreeMap<usize, (Arc<Context>, Vec<CopyDesc>)> = BTreeMap::new();
    let mut used: Vec<Stream> = Vec::new();
    for s in spans {
        let (from, to) = (s.src_ctx.ordinal(), s.dst_ctx.ordinal());
        let runner = if strategy == Strategy::Kernel && runtime::enable_peer_access(from, to)? {
            Some(&s.src_ctx)
        } else {
            None
        };
        match runner {
            Some(ctx) => {
                launches
                    .entry(ctx.ordinal())
                    .or_insert_with(|| (Arc::clone(ctx), Vec::new()))
                    .1
                    .push(CopyDesc::new(s.src, s.dst, s.bytes));
            }
            None => {
                let stream = match stream_for(to) {
                    Some(st) => st,
                    None => s.dst_ctx.stream()?.clone(),
                };
                runtime::copy_dtod_async(&s.dst_ctx, s.dst, &s.src_ctx, s.src, s.bytes, &stream)?;
                used.push(stream);
            }
        }
    }
    for (ordinal, (ctx, descs)) in &launches {
        let stream = match stream_for(*ordinal) {
            Some(st) => st,
            None => ctx.stream()?.clone(),
        };
        kernels::multi_copy(ctx, &stream, descs)?;
        used.push(stream);
    }
    for stream in used {
        stream.synchronize()?;
    }
    Ok(())
}

/// A fresh tensor on `device` laid out like `like` (same strides when
/// dense), whose contents the caller overwrites completely.
pub(crate) fn output_like<'b>(like: &Tensor<'_>, device: Device) -> Result<Tensor<'b>> {
    let layout = crate::tensor::preserved_layout_of(like)?;
    match device {
        Device::Cpu => Tensor::zeros_like_layout(layout, like.dtype()),
        Device::Cuda(d) => Tensor::uninit_cuda(layout, like.dtype(), &runtime::context(d)?),
    }
}
