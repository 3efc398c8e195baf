//! Copying many tensors at once: dense same-layout pairs become byte
//! ranges for the multi-tensor copy kernel (or the copy engines); anything
//! else goes through `Tensor::copy_from`.

use std::sync::{Arc, OnceLock};

use crate::cuda::kernels::{self, CopyDesc};
use crate::cuda::runtime::{self, Context, DevicePtr, Stream};
use crate::tensor::{Device, Tensor};
use crate::{Error, Result};

/// Which copy method `TENSORCOMM_CUDA_COPY` asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Strategy {
    /// Per range: the copy engines for large ranges between two GPUs, the
    /// multi-tensor kernel for everything else (the default).
    Auto,
    /// Always the multi-tensor copy kernel (where peer access allows).
    Kernel,
    /// Always the copy engines.
    CopyEngine,
}

/// How one range moves.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Method {
    /// The multi-tensor copy kernel on the source GPU, writing to peers.
    Kernel,
    /// `cuMemcpyPeerAsync` (the copy engines), possibly cut into pieces on
    /// several streams.
    CopyEngine,
}

/// The copy tuning, read once from the environment:
/// `TENSORCOMM_CUDA_COPY` (`auto`, `kernel`, `ce`; default auto),
/// `TENSORCOMM_CUDA_CE_MIN` (bytes, suffixes K/M/G: the smallest range
/// between two GPUs that `auto` gives the copy engines), `TENSORCOMM_CUDA_CE_STREAMS`
/// (streams a copy-engine range is spread over, 1 to 4) and
/// `TENSORCOMM_CUDA_ONE_LAUNCH_MAX` (calls moving at most this many bytes
/// by kernel use a single launch on one GPU that reaches every buffer),
/// `TENSORCOMM_CUDA_CHAIN_MIN` (the smallest broadcast or reduce_add over
/// three or more GPUs that moves along a chain of GPUs; `off` never) and
/// `TENSORCOMM_CUDA_CHAIN_CHUNK` (the chain's chunk; default by size).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Tuning {
    pub strategy: Strategy,
    pub ce_min_bytes: usize,
    pub ce_streams: usize,
    pub one_launch_max: usize,
    pub chain_min_bytes: usize,
    pub chain_chunk: Option<usize>,
}

/// Internal streams used for kernel launches (0 and 1); copy-engine pieces
/// use the ones after them, so the two never queue behind each other.
const KERNEL_STREAMS: usize = 2;
/// Copy-engine pieces are at least this large.
const CE_MIN_PIECE: usize = 8 << 20;

impl Default for Tuning {
    fn default() -> Self {
        Tuning {
            strategy: Strategy::Auto,
            ce_min_bytes: 4 << 20,
            ce_streams: 1,
            one_launch_max: 4 << 20,
            chain_min_bytes: 8 << 20,
            chain_chunk: None,
        }
    }
}

impl Tuning {
    /// The tuning described by `var` (an environment lookup); a value
    /// that does not parse is an [`Error::BadValue`] naming the variable,
    /// as for every other `TENSORCOMM_*` variable.
    pub(crate) fn from_vars(var: &dyn Fn(&str) -> Option<String>) -> Result<Tuning> {
        let mut t = Tuning::default();
        let bad = |name: &str, expected: &str, found: String| Error::BadValue {
            name: name.into(),
            expected: expected.into(),
            found,
        };
        match var("TENSORCOMM_CUDA_COPY") {
            None => {}
            Some(v) => match v.trim() {
                "auto" => {}
                "ce" => t.strategy = Strategy::CopyEngine,
                "kernel" => t.strategy = Strategy::Kernel,
                _ => return Err(bad("TENSORCOMM_CUDA_COPY", "auto, kernel or ce", v)),
            },
        }
        let bytes = |name: &str| -> Result<Option<usize>> {
            match var(name) {
                None => Ok(None),
                Some(v) => crate::tuning::parse_size(&v)
                    .map(Some)
                    .ok_or_else(|| bad(name, "a size such as 4M (suffixes K, M, G)", v)),
            }
        };
        if let Some(b) = bytes("TENSORCOMM_CUDA_CE_MIN")? {
            t.ce_min_bytes = b;
        }
        if let Some(n) = bytes("TENSORCOMM_CUDA_CE_STREAMS")? {
            t.ce_streams = n.clamp(1, runtime::COPY_STREAMS - KERNEL_STREAMS);
        }
        if let Some(b) = bytes("TENSORCOMM_CUDA_ONE_LAUNCH_MAX")? {
            t.one_launch_max = b;
        }
        if var("TENSORCOMM_CUDA_CHAIN_MIN").is_some_and(|v| v.trim() == "off") {
            t.chain_min_bytes = usize::MAX;
        } else if let Some(b) = bytes("TENSORCOMM_CUDA_CHAIN_MIN")? {
            t.chain_min_bytes = b;
        }
        match bytes("TENSORCOMM_CUDA_CHAIN_CHUNK")? {
            Some(0) => {
                return Err(bad(
                    "TENSORCOMM_CUDA_CHAIN_CHUNK",
                    "a positive size such as 8M",
                    "0".into(),
                ))
            }
            chunk => t.chain_chunk = chunk.or(t.chain_chunk),
        }
        Ok(t)
    }

    /// How a range of `bytes` moves; `peer` says whether kernels on the
    /// source GPU can write the destination.
    pub(crate) fn method(&self, bytes: usize, same_device: bool, peer: bool) -> Method {
        match self.strategy {
            _ if !peer => Method::CopyEngine,
            Strategy::Kernel => Method::Kernel,
            Strategy::CopyEngine => Method::CopyEngine,
            Strategy::Auto if !same_device && bytes >= self.ce_min_bytes => Method::CopyEngine,
            Strategy::Auto => Method::Kernel,
        }
    }

    /// The (offset, length) pieces a copy-engine range is cut into: up to
    /// `ce_streams` pieces of at least [`CE_MIN_PIECE`] bytes, on 64 KiB
    /// boundaries.
    pub(crate) fn ce_pieces(&self, bytes: usize) -> Vec<(usize, usize)> {
        let n = (bytes / CE_MIN_PIECE).clamp(1, self.ce_streams.max(1));
        let each = bytes.div_ceil(n).next_multiple_of(64 << 10);
        (0..bytes)
            .step_by(each.max(1))
            .map(|at| (at, each.min(bytes - at)))
            .collect()
    }
}

/// The process's tuning (environment read on first use), or the error of
/// its bad value (every call reports it).
pub(crate) fn tuning() -> Result<&'static Tuning> {
    static TUNING: OnceLock<Result<Tuning>> = OnceLock::new();
    TUNING
        .get_or_init(|| Tuning::from_vars(&|name| std::env::var(name).ok()))
        .as_ref()
        .map_err(Clone::clone)
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

/// Queues the spans and waits for them. Each span moves by the method
/// [`Tuning::method`] picks. Kernel spans are one launch per source GPU
/// (per [`kernels::MAX_COPY`] ranges, spread over two streams), or a single
/// launch on one GPU when the call is small and that GPU reaches every
/// buffer (one launch and one synchronisation instead of one per GPU).
/// Copy-engine spans are cut into pieces on their own streams of the
/// destination GPU. `stream_for(d)`, when it gives a stream, is where the
/// work run by GPU `d` is queued instead.
pub(crate) fn run_spans(
    spans: &[Span],
    stream_for: &dyn Fn(usize) -> Option<Stream>,
) -> Result<()> {
    let mut queue = Queue::default();
    queue.push(spans, stream_for)?;
    queue.finish()
}

/// Spans queued on the GPUs and not yet waited for: each
/// [`push`](Queue::push) queues a group of spans at once (as
/// [`run_spans`] describes) and returns, so the host can prepare the next
/// group while the GPUs copy; [`finish`](Queue::finish) waits for all of
/// them. Consecutive groups' kernel launches alternate between two streams,
/// so one group's tail overlaps the next group's start.
#[derive(Default)]
pub(crate) struct Queue {
    used: Vec<Stream>,
    /// Next copy-engine stream per destination GPU.
    ce_next: Vec<(usize, usize)>,
    /// Kernel launches so far (picks the stream of the next one).
    launches: usize,
}

impl Queue {
    /// Queues `spans` (their memory must stay alive until [`finish`](Queue::finish)).
    pub(crate) fn push(
        &mut self,
        spans: &[Span],
        stream_for: &dyn Fn(usize) -> Option<Stream>,
    ) -> Result<()> {
        if spans.is_empty() {
            return Ok(());
        }
        let tuning = tuning()?;
        let mut kernel_spans: Vec<&Span> = Vec::with_capacity(spans.len());
        for s in spans {
            let (from, to) = (s.src_ctx.ordinal(), s.dst_ctx.ordinal());
            let peer = runtime::enable_peer_access(from, to)?;
            if tuning.method(s.bytes, from == to, peer) == Method::Kernel {
                kernel_spans.push(s);
                continue;
            }
            if let Some(stream) = stream_for(to) {
                runtime::copy_dtod_async(&s.dst_ctx, s.dst, &s.src_ctx, s.src, s.bytes, &stream)?;
                note(&mut self.used, &stream);
                continue;
            }
            for (at, len) in tuning.ce_pieces(s.bytes) {
                let next = match self.ce_next.iter_mut().find(|(d, _)| *d == to) {
                    Some((_, n)) => n,
                    None => {
                        self.ce_next.push((to, 0));
                        &mut self.ce_next.last_mut().expect("just pushed").1
                    }
                };
                let stream = s
                    .dst_ctx
                    .copy_stream(KERNEL_STREAMS + *next % tuning.ce_streams)?;
                *next += 1;
                runtime::copy_dtod_async(
                    &s.dst_ctx,
                    s.dst.offset(at),
                    &s.src_ctx,
                    s.src.offset(at),
                    len,
                    stream,
                )?;
                note(&mut self.used, stream);
            }
        }
        for (ctx, descs) in kernel_launches(&kernel_spans, tuning)? {
            let own: Vec<Stream> = match stream_for(ctx.ordinal()) {
                Some(st) => vec![st],
                None => {
                    let batches = descs
                        .len()
                        .div_ceil(kernels::MAX_COPY)
                        .clamp(1, KERNEL_STREAMS);
                    (0..batches)
                        .map(|i| {
                            ctx.copy_stream((self.launches + i) % KERNEL_STREAMS)
                                .cloned()
                        })
                        .collect::<Result<_>>()?
                }
            };
            self.launches += 1;
            let refs: Vec<&Stream> = own.iter().collect();
            kernels::multi_copy(&ctx, &refs, &descs)?;
            for st in &own {
                note(&mut self.used, st);
            }
        }
        Ok(())
    }

    /// Waits for everything queued.
    pub(crate) fn finish(mut self) -> Result<()> {
        for stream in std::mem::take(&mut self.used) {
            stream.synchronize()?;
        }
        Ok(())
    }
}

impl Drop for Queue {
    /// A queue dropped unfinished (an error on the way) still waits, so no
    /// buffer goes back to the pool while a copy may write to it.
    fn drop(&mut self) {
        for stream in self.used.drain(..) {
            let _ = stream.synchronize();
        }
    }
}

/// Remembers `stream` for the final synchronisation, once.
fn note(used: &mut Vec<Stream>, stream: &Stream) {
    if !used.iter().any(|u| u.same_as(stream)) {
        used.push(stream.clone());
    }
}

/// The kernel launches for `spans`: one GPU running all of them when they
/// add up to at most `one_launch_max` bytes and one of the first span's
/// GPUs reaches every buffer; else one group per source GPU.
fn kernel_launches(spans: &[&Span], tuning: &Tuning) -> Result<Vec<(Arc<Context>, Vec<CopyDesc>)>> {
    let Some(first) = spans.first() else {
        return Ok(Vec::new());
    };
    let desc = |s: &Span| CopyDesc::new(s.src, s.dst, s.bytes);
    let total: usize = spans.iter().map(|s| s.bytes).sum();
    if spans.len() > 1 && total <= tuning.one_launch_max {
        for runner in [&first.src_ctx, &first.dst_ctx] {
            let r = runner.ordinal();
            let mut reaches = true;
            for s in spans {
                reaches &= runtime::enable_peer_access(r, s.src_ctx.ordinal())?
                    && runtime::enable_peer_access(r, s.dst_ctx.ordinal())?;
            }
            if reaches {
                return Ok(vec![(
                    Arc::clone(runner),
                    spans.iter().map(|s| desc(s)).collect(),
                )]);
            }
        }
    }
    let mut groups: Vec<(Arc<Context>, Vec<CopyDesc>)> = Vec::new();
    for s in spans {
        let o = s.src_ctx.ordinal();
        match groups.iter_mut().find(|(c, _)| c.ordinal() == o) {
            Some((_, descs)) => descs.push(desc(s)),
            None => groups.push((Arc::clone(&s.src_ctx), vec![desc(s)])),
        }
    }
    Ok(groups)
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

#[cfg(test)]
mod tests {
    use super::*;

    fn vars(pairs: &'static [(&'static str, &'static str)]) -> impl Fn(&str) -> Option<String> {
        move |name| {
            pairs
                .iter()
                .find(|(k, _)| *k == name)
                .map(|(_, v)| v.to_string())
        }
    }

    #[test]
    fn the_environment_sets_the_tuning_and_bad_values_are_named() {
        assert_eq!(Tuning::from_vars(&vars(&[])).unwrap(), Tuning::default());
        let t = Tuning::from_vars(&vars(&[
            ("TENSORCOMM_CUDA_COPY", "ce"),
            ("TENSORCOMM_CUDA_CE_MIN", "4M"),
            ("TENSORCOMM_CUDA_CE_STREAMS", "9"),
            ("TENSORCOMM_CUDA_ONE_LAUNCH_MAX", "64k"),
            ("TENSORCOMM_CUDA_CHAIN_MIN", "16M"),
            ("TENSORCOMM_CUDA_CHAIN_CHUNK", "2M"),
        ]))
        .unwrap();
        assert_eq!(
            (t.chain_min_bytes, t.chain_chunk),
            (16 << 20, Some(2 << 20))
        );
        let off = Tuning::from_vars(&vars(&[("TENSORCOMM_CUDA_CHAIN_MIN", "off")])).unwrap();
        assert_eq!(off.chain_min_bytes, usize::MAX);
        assert_eq!(t.strategy, Strategy::CopyEngine);
        assert_eq!(t.ce_min_bytes, 4 << 20);
        assert_eq!(t.ce_streams, runtime::COPY_STREAMS - KERNEL_STREAMS);
        assert_eq!(t.one_launch_max, 64 << 10);
        const BAD: [(&str, &str); 4] = [
            ("TENSORCOMM_CUDA_COPY", "fast"),
            ("TENSORCOMM_CUDA_CE_MIN", "lots"),
            ("TENSORCOMM_CUDA_CHAIN_MIN", "never"),
            ("TENSORCOMM_CUDA_CHAIN_CHUNK", "0"),
        ];
        for (i, &(name, value)) in BAD.iter().enumerate() {
            match Tuning::from_vars(&vars(&BAD[i..=i])) {
                Err(Error::BadValue { name: n, found, .. }) => {
                    assert_eq!((n.as_str(), found.as_str()), (name, value));
                }
                other => panic!("{name}={value}: expected BadValue, got {other:?}"),
            }
        }
    }

    #[test]
    fn auto_gives_large_ranges_between_gpus_to_the_copy_engines() {
        let t = Tuning::default();
        let big = t.ce_min_bytes;
        assert_eq!(t.method(big, false, true), Method::CopyEngine);
        assert_eq!(t.method(big - 1, false, true), Method::Kernel);
        // Copies inside one GPU and small ranges stay on the kernel.
        assert_eq!(t.method(big * 4, true, true), Method::Kernel);
        // Without peer access only the copy engines can move it.
        assert_eq!(t.method(16, false, false), Method::CopyEngine);
        let forced = Tuning {
            strategy: Strategy::Kernel,
            ..t
        };
        assert_eq!(forced.method(big * 4, false, true), Method::Kernel);
        let forced = Tuning {
            strategy: Strategy::CopyEngine,
            ..t
        };
        assert_eq!(forced.method(16, true, true), Method::CopyEngine);
    }

    #[test]
    fn copy_engine_pieces_cover_the_range_once() {
        let t = Tuning::default();
        for (bytes, streams) in [1usize, 4 << 20, (16 << 20) + 3, 512 << 20, (1 << 30) - 5]
            .into_iter()
            .flat_map(|b| [(b, 1), (b, 2), (b, 4)])
        {
            let t = Tuning {
                ce_streams: streams,
                ..Tuning::default()
            };
            let pieces = t.ce_pieces(bytes);
            assert!(pieces.len() <= t.ce_streams, "{bytes}: {pieces:?}");
            let mut at = 0;
            for &(off, len) in &pieces {
                assert_eq!(off, at, "{bytes}: {pieces:?}");
                assert!(len > 0 && off % (64 << 10) == 0);
                at += len;
            }
            assert_eq!(at, bytes);
        }
        assert_eq!(
            t.ce_pieces(512 << 20),
            [(0, 512 << 20)],
            "one stream by default"
        );
        let two = Tuning { ce_streams: 2, ..t };
        assert_eq!(two.ce_pieces(4 << 20).len(), 1, "small ranges stay whole");
        assert_eq!(
            two.ce_pieces(512 << 20),
            [(0, 256 << 20), (256 << 20, 256 << 20)]
        );
    }
}
