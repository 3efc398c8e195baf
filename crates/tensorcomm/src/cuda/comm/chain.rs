//! Pipelined chains over three or more GPUs: a large broadcast flows down
//! a chain of GPUs and a large reduce_add flows up one, in chunks, so each
//! GPU's links carry the message about once instead of the source (or the
//! destination) carrying it once per peer.
//!
//! Hop `h` of a broadcast copies chunk `c` from GPU `h` to GPU `h + 1`
//! after hop `h - 1` has delivered it (an event between the two GPUs'
//! streams), so all hops run at once on different chunks. A reduction runs
//! the other way: GPU `k` adds its input's chunk to GPU `k + 1`'s partial
//! sum (read over NVLink) into a small ring of chunk slots, and the
//! destination adds the last partial into the output.

use std::sync::Arc;

use crate::cuda::kernels::{self, CopyDesc};
use crate::cuda::runtime::{self, Context, DevicePtr, Event, Stream};
use crate::tensor::{DType, Layout, Tensor};
use crate::Result;

use super::copy::{Method, Tuning};

/// The internal stream each GPU runs its hop on: the last copy stream,
/// apart from the fan-out path's kernel and first copy-engine streams.
const CHAIN_STREAM: usize = runtime::COPY_STREAMS - 1;

/// Chunk slots each middle GPU of a reduction holds partial sums in.
const SLOTS: usize = 4;

/// Chunks are multiples of this (keeps 16-byte vector access aligned).
const ALIGN: usize = 64 << 10;

/// One tensor's bytes on every GPU of a chain: `ptrs[k]` on GPU `k`.
pub(crate) struct Item {
    pub ptrs: Vec<DevicePtr>,
    pub bytes: usize,
}

/// The chunk a chain moving `bytes` in all uses: the tuning's, else about
/// a 16th of the message (the pipeline's fill and drain cost a few hops'
/// chunks), between 8 MiB (smaller chunks leave the GPUs waiting for the
/// host to queue them: 2 MiB chunks were slower than no chain on four
/// H200s) and 32 MiB.
/// Never more than the message (rounded up to [`ALIGN`]), so a reduction's
/// slots hold no more than the message needs.
pub(crate) fn chunk_bytes(bytes: usize, tuning: &Tuning) -> usize {
    tuning
        .chain_chunk
        .unwrap_or((bytes / 16).clamp(8 << 20, 32 << 20))
        .min(bytes.max(1))
        .next_multiple_of(ALIGN)
}

/// True when a call moving `bytes` to or from `others` other GPUs takes a
/// chain: at least two others (with one, the chain is the direct copy)
/// and at least the tuning's minimum.
pub(crate) fn worth_it(bytes: usize, others: usize, tuning: &Tuning) -> bool {
    others >= 2 && bytes >= tuning.chain_min_bytes
}

/// True when each GPU of `chain` can reach the next one's memory.
pub(crate) fn linked(chain: &[Arc<Context>]) -> Result<bool> {
    for pair in chain.windows(2) {
        if !runtime::enable_peer_access(pair[0].ordinal(), pair[1].ordinal())?
            || !runtime::enable_peer_access(pair[1].ordinal(), pair[0].ordinal())?
        {
            return Ok(false);
        }
    }
    Ok(true)
}

/// GPUs `ordinals` as a chain, when they are distinct and each reaches the
/// next one's memory; else `None`.
pub(crate) fn gpus(ordinals: &[usize]) -> Result<Option<Vec<Arc<Context>>>> {
    for (i, d) in ordinals.iter().enumerate() {
        if ordinals[..i].contains(d) {
            return Ok(None);
        }
    }
    let chain = ordinals
        .iter()
        .map(|&d| runtime::context(d))
        .collect::<Result<Vec<_>>>()?;
    Ok(if linked(&chain)? { Some(chain) } else { None })
}

/// The GPUs of a chain and one tensor's address on each.
type Placed = (Vec<Arc<Context>>, Vec<DevicePtr>);

/// The chain through the GPUs of `places` (each a CUDA tensor's GPU and
/// address, in order) with the addresses, when [`gpus`] makes them one;
/// else `None`.
fn chain_of(places: Vec<(Arc<Context>, DevicePtr)>) -> Result<Option<Placed>> {
    let ordinals: Vec<usize> = places.iter().map(|(ctx, _)| ctx.ordinal()).collect();
    Ok(gpus(&ordinals)?.map(|chain| (chain, places.into_iter().map(|(_, p)| p).collect())))
}

/// Copies `src` into every tensor of `outs` along a chain when that pays
/// ([`worth_it`]) and each is on a GPU of its own in the same dense layout;
/// returns false, having done nothing, when the caller should copy
/// directly instead.
pub(crate) fn try_broadcast(src: &Tensor<'_>, outs: &[&Tensor<'_>]) -> Result<bool> {
    let tuning = super::copy::tuning()?;
    if !worth_it(src.nbytes(), outs.len(), tuning)
        || !outs.iter().all(|o| super::copy::byte_copyable(o, src))
    {
        return Ok(false);
    }
    // byte_copyable: every tensor is a CUDA tensor.
    let places = std::iter::once(src.cuda_ptr())
        .chain(outs.iter().map(|o| o.cuda_ptr()))
        .collect::<Result<Vec<_>>>()?;
    let Some((chain, ptrs)) = chain_of(places)? else {
        return Ok(false);
    };
    let item = Item {
        ptrs,
        bytes: src.nbytes(),
    };
    broadcast(&chain, &[item], tuning)?;
    Ok(true)
}

/// Sums `inputs` into `out` (on the GPU of `inputs[root]`) along a chain
/// when that pays ([`worth_it`]) and every input is on a GPU of its own in
/// `out`'s dense layout; returns false, having done nothing, when the
/// caller should sum directly instead.
pub(crate) fn try_reduce_add(
    out: &Tensor<'_>,
    inputs: &[&Tensor<'_>],
    root: usize,
) -> Result<bool> {
    let tuning = super::copy::tuning()?;
    if !worth_it(out.nbytes(), inputs.len() - 1, tuning)
        || !inputs.iter().all(|t| super::copy::byte_copyable(out, t))
    {
        return Ok(false);
    }
    // The destination first; byte_copyable: every input is a CUDA tensor.
    let others = inputs.iter().enumerate().filter(|&(i, _)| i != root);
    let places = std::iter::once(inputs[root].cuda_ptr())
        .chain(others.map(|(_, t)| t.cuda_ptr()))
        .collect::<Result<Vec<_>>>()?;
    let Some((chain, ptrs)) = chain_of(places)? else {
        return Ok(false);
    };
    reduce_add(
        &chain,
        &ptrs,
        out.cuda_ptr()?.1,
        out.dtype(),
        out.numel(),
        tuning,
    )?;
    Ok(true)
}

/// The steps of a broadcast of `items`: each a list of (item, offset,
/// length) pieces of at most `chunk` bytes in all (a multiple of
/// [`ALIGN`]), in order. Items that do not fit the rest of a step are cut
/// at an [`ALIGN`] boundary of the item (so every piece keeps the item's
/// alignment), or start the next step.
fn steps(items: &[Item], chunk: usize) -> Vec<Vec<(usize, usize, usize)>> {
    let mut steps = Vec::new();
    let mut step = Vec::new();
    let mut filled = 0;
    for (i, item) in items.iter().enumerate() {
        let mut at = 0;
        while at < item.bytes {
            let rest = item.bytes - at;
            let room = chunk - filled;
            let len = if rest <= room {
                rest
            } else {
                room / ALIGN * ALIGN
            };
            if len > 0 {
                step.push((i, at, len));
                filled += len;
                at += len;
            }
            if len == 0 || filled >= chunk {
                steps.push(std::mem::take(&mut step));
                filled = 0;
            }
        }
    }
    if !step.is_empty() {
        steps.push(step);
    }
    steps
}

/// The streams a chain queued work on; waits for them when dropped, so no
/// buffer is freed while a hop may still touch it (also on an error).
struct Hops(Vec<Stream>);

impl Hops {
    fn on(chain: &[Arc<Context>]) -> Result<Hops> {
        Ok(Hops(
            chain
                .iter()
                .map(|c| c.copy_stream(CHAIN_STREAM).cloned())
                .collect::<Result<_>>()?,
        ))
    }

    /// Waits for every stream (all of them, also after one failed) and
    /// gives the first error.
    fn finish(mut self) -> Result<()> {
        let mut result = Ok(());
        for s in std::mem::take(&mut self.0) {
            let synced = s.synchronize();
            if result.is_ok() {
                result = synced;
            }
        }
        result
    }
}

impl Drop for Hops {
    fn drop(&mut self) {
        for s in self.0.drain(..) {
            let _ = s.synchronize();
        }
    }
}

/// Copies every item from `chain[0]` to every other GPU of `chain` (each
/// item's `ptrs[k]` on `chain[k]`) and waits. Each hop runs on its source
/// GPU: pieces the tuning gives the copy engines move by
/// `cuMemcpyPeerAsync`, the rest of a step by one multi-tensor copy launch
/// writing into the next GPU. Needs peer access along the chain
/// ([`linked`]).
pub(crate) fn broadcast(chain: &[Arc<Context>], items: &[Item], tuning: &Tuning) -> Result<()> {
    let total: usize = items.iter().map(|i| i.bytes).sum();
    let hops = Hops::on(chain)?;
    // `arrived[h]`: the event of the last step hop h delivered.
    let mut arrived: Vec<Option<Event>> = (0..chain.len()).map(|_| None).collect();
    for step in steps(items, chunk_bytes(total, tuning)) {
        for h in 0..chain.len() - 1 {
            let (from, to) = (&chain[h], &chain[h + 1]);
            let stream = &hops.0[h];
            if let Some(ev) = h.checked_sub(1).and_then(|p| arrived[p].as_ref()) {
                stream.wait(ev)?;
            }
            let mut descs = Vec::new();
            for &(i, at, len) in &step {
                let (src, dst) = (items[i].ptrs[h].offset(at), items[i].ptrs[h + 1].offset(at));
                if tuning.method(len, false, true) == Method::CopyEngine {
                    runtime::copy_dtod_async(to, dst, from, src, len, stream)?;
                } else {
                    descs.push(CopyDesc::new(src, dst, len));
                }
            }
            if !descs.is_empty() {
                kernels::multi_copy(from, &[stream], &descs)?;
            }
            if h + 2 < chain.len() {
                arrived[h] = Some(stream.record()?);
            }
        }
    }
    hops.finish()
}

/// `out = inputs[0] + inputs[1] + ...` of `numel` elements of `dtype`,
/// `inputs[k]` and `out` dense on `chain[k]` (`out` on `chain[0]`), summed
/// as `inputs[0] + (inputs[1] + (... + inputs[last]))`; waits.
///
/// Partial sums flow towards `chain[0]` by stores into the next GPU's
/// memory: for each chunk the last GPU copies its input into a slot of
/// GPU `last - 1`, and each GPU `k` in between adds its input to what
/// arrived in its own slot and writes the sum into a slot of GPU `k - 1`
/// (remote stores over NVLink; only local memory is read); `chain[0]` adds
/// its input to its slot into `out`. Each GPU holds a ring of up to
/// [`SLOTS`] chunk slots. Each partial sum is rounded to `dtype` at every
/// hop (f16 and bf16 round `n - 1` times, where the direct sum of
/// [`super::reduce_add`] accumulates in f32 and rounds once), so results
/// may differ in the last bits from the direct sum below the chain's
/// minimum.
pub(crate) fn reduce_add(
    chain: &[Arc<Context>],
    inputs: &[DevicePtr],
    out: DevicePtr,
    dtype: DType,
    numel: usize,
    tuning: &Tuning,
) -> Result<()> {
    let size = dtype.size();
    let last = chain.len() - 1;
    let chunk = (chunk_bytes(numel * size, tuning) / size).max(1);
    let steps = numel.div_ceil(chunk);
    let ring = SLOTS.min(steps);
    // `arrive[k]` on GPU k < last: where GPU k + 1's partial sums land.
    let arrive = chain[..last]
        .iter()
        .map(|ctx| Tensor::uninit_cuda(Layout::contiguous(&[ring * chunk]), dtype, ctx))
        .collect::<Result<Vec<_>>>()?;
    let slot = |k: usize, c: usize| -> Result<DevicePtr> {
        Ok(arrive[k].cuda_ptr()?.1.offset((c % ring) * chunk * size))
    };
    let hops = Hops::on(chain)?;
    // `done[k][c]`: GPU k has handled chunk c (read its slot, written on).
    let mut done: Vec<Vec<Event>> = (0..chain.len())
        .map(|_| Vec::with_capacity(steps))
        .collect();
    for c in 0..steps {
        let at = c * chunk;
        let n = chunk.min(numel - at);
        let own = |k: usize| inputs[k].offset(at * size);
        for k in (0..=last).rev() {
            let stream = &hops.0[k];
            if k < last {
                // GPU k + 1 has written this chunk's partial into the slot.
                stream.wait(&done[k + 1][c])?;
            }
            if k > 0 && c >= ring {
                // GPU k - 1 has read the slot this chunk's sum goes to.
                stream.wait(&done[k - 1][c - ring])?;
            }
            if k == last {
                runtime::copy_dtod_async(
                    &chain[k - 1],
                    slot(k - 1, c)?,
                    &chain[k],
                    own(k),
                    n * size,
                    stream,
                )?;
            } else {
                let dst = if k == 0 {
                    out.offset(at * size)
                } else {
                    slot(k - 1, c)?
                };
                kernels::reduce_add(&chain[k], stream, dtype, dst, &[own(k), slot(k, c)?], n)?;
            }
            done[k].push(stream.record()?);
        }
    }
    let result = hops.finish();
    drop(arrive);
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    fn item(bytes: usize) -> Item {
        Item {
            ptrs: Vec::new(),
            bytes,
        }
    }

    #[test]
    fn steps_cover_every_byte_once_in_order_and_cut_items_at_aligned_offsets() {
        let a = ALIGN;
        let items = [
            item(5),
            item(0),
            item(3 * a + 23),
            item(1),
            item(2 * a + 9),
            item(a),
        ];
        for chunk in [a, 2 * a, 4 * a, 64 * a] {
            let steps = steps(&items, chunk);
            let mut seen: Vec<(usize, usize)> = Vec::new();
            for step in &steps {
                let bytes: usize = step.iter().map(|p| p.2).sum();
                assert!(bytes <= chunk && bytes > 0, "chunk {chunk}: {steps:?}");
                for &(i, at, len) in step {
                    assert!(len > 0);
                    assert_eq!(at % ALIGN, 0, "chunk {chunk}: piece of item {i} at {at}");
                    match seen.last_mut() {
                        Some((j, end)) if *j == i => {
                            assert_eq!(*end, at);
                            *end += len;
                        }
                        _ => {
                            assert_eq!(at, 0, "item {i} starts at 0");
                            seen.push((i, len));
                        }
                    }
                }
            }
            let want = [(0, 5), (2, 3 * a + 23), (3, 1), (4, 2 * a + 9), (5, a)];
            assert_eq!(seen, want, "chunk {chunk}");
        }
        // One large item is cut into full chunks.
        let one = steps(&[item(10 * a + 1)], 4 * a);
        assert_eq!(one.len(), 3);
        assert_eq!(one[0], [(0, 0, 4 * a)]);
        assert_eq!(one[2], [(0, 8 * a, 2 * a + 1)]);
    }

    #[test]
    fn chunks_grow_with_the_message_within_bounds() {
        let t = Tuning::default();
        // Never more than the message, rounded up to ALIGN.
        assert_eq!(chunk_bytes(1 << 20, &t), 1 << 20);
        assert_eq!(chunk_bytes(12 << 20, &t), 8 << 20);
        assert_eq!(chunk_bytes(1, &t), ALIGN);
        assert_eq!(chunk_bytes(64 << 20, &t), 8 << 20);
        assert_eq!(chunk_bytes(256 << 20, &t), 16 << 20);
        assert_eq!(chunk_bytes(4 << 30, &t), 32 << 20);
        assert_eq!(chunk_bytes(100_000_003, &t) % ALIGN, 0);
        let fixed = Tuning {
            chain_chunk: Some(3 << 20),
            ..t
        };
        assert_eq!(chunk_bytes(1 << 30, &fixed), 3 << 20);
        assert_eq!(chunk_bytes(1 << 20, &fixed), 1 << 20);
    }

    #[test]
    fn only_large_calls_to_two_or_more_other_gpus_chain() {
        let t = Tuning::default();
        let min = t.chain_min_bytes;
        assert!(worth_it(min, 2, &t) && worth_it(min * 64, 7, &t));
        assert!(!worth_it(min - 1, 3, &t));
        assert!(!worth_it(min * 64, 1, &t), "one other GPU: the direct copy");
        let off = Tuning {
            chain_min_bytes: usize::MAX,
            ..t
        };
        assert!(!worth_it(1 << 40, 7, &off));
    }
}
