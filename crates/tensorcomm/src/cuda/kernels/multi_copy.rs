//! The multi-tensor byte copy: many (src, dst, bytes) ranges in one launch.

use super::kernel;
use crate::cuda::runtime::{Context, DevicePtr, KernelArg, Stream};
use crate::{Error, Result};

/// Ranges one `multi_copy` launch takes (`MAX_COPY` in kernels.cu).
pub(crate) const MAX_COPY: usize = 96;
/// Bytes of a range one block copies at a time, at most ...
const CHUNK_BYTES: u64 = 64 << 10;
/// ... and at least (512 threads x 16 bytes).
const MIN_CHUNK_BYTES: u64 = 8 << 10;

/// The chunk size for copying `total` bytes with up to `blocks` blocks:
/// small enough that every block gets a chunk (a 1 MiB copy in 64 KiB
/// chunks would keep 16 blocks busy and leave the rest idle), between
/// [`MIN_CHUNK_BYTES`] and [`CHUNK_BYTES`], a multiple of the former.
pub(crate) fn chunk_bytes(total: u64, blocks: u64) -> u64 {
    let per_block = total / blocks.max(1);
    (per_block / MIN_CHUNK_BYTES * MIN_CHUNK_BYTES).clamp(MIN_CHUNK_BYTES, CHUNK_BYTES)
}

/// One range of a multi-tensor copy.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct CopyDesc {
    pub src: u64,
    pub dst: u64,
    pub bytes: u64,
}

impl CopyDesc {
    pub(crate) fn new(src: DevicePtr, dst: DevicePtr, bytes: usize) -> Self {
        CopyDesc {
            src: src.0,
            dst: dst.0,
            bytes: bytes as u64,
        }
    }
}

#[repr(C)]
#[derive(Clone, Copy)]
struct CopyBatch {
    count: u64,
    chunk_start: [u64; MAX_COPY + 1],
    d: [CopyDesc; MAX_COPY],
}

/// Groups ranges into launches of at most [`MAX_COPY`], dropping empty
/// ones. Returns, per launch, the ranges and their chunk-start prefix sums.
pub(crate) fn plan_copy_batches(
    descs: &[CopyDesc],
    chunk_bytes: u64,
) -> Vec<(Vec<CopyDesc>, Vec<u64>)> {
    let non_empty: Vec<CopyDesc> = descs.iter().copied().filter(|d| d.bytes > 0).collect();
    non_empty
        .chunks(MAX_COPY)
        .map(|batch| {
            let mut starts = Vec::with_capacity(batch.len() + 1);
            let mut total = 0u64;
            starts.push(0);
            for d in batch {
                total += d.bytes.div_ceil(chunk_bytes);
                starts.push(total);
            }
            (batch.to_vec(), starts)
        })
        .collect()
}

/// Queues copies of many byte ranges, a launch per [`MAX_COPY`] ranges,
/// launch `i` on `streams[i % streams.len()]` (so launches on different
/// streams run side by side instead of one after the other). Every range
/// must lie in memory that the caller keeps alive until the streams have
/// run, on `ctx`'s GPU or on GPUs it has peer access to.
pub(crate) fn multi_copy(ctx: &Context, streams: &[&Stream], descs: &[CopyDesc]) -> Result<()> {
    if streams.is_empty() {
        return Err(Error::InvalidArgument(
            "multi_copy: expected at least one stream".into(),
        ));
    }
    let function = kernel(ctx, "multi_copy")?;
    let max_blocks = u64::from(ctx.sm_count()) * 4;
    let total_bytes: u64 = descs.iter().map(|d| d.bytes).sum();
    let chunk_size = chunk_bytes(total_bytes, max_blocks);
    for (i, (batch, starts)) in plan_copy_batches(descs, chunk_size).into_iter().enumerate() {
        let stream = streams[i % streams.len()];
        let mut args = CopyBatch {
            count: batch.len() as u64,
            chunk_start: [0; MAX_COPY + 1],
            d: [CopyDesc::default(); MAX_COPY],
        };
        args.chunk_start[..starts.len()].copy_from_slice(&starts);
        args.d[..batch.len()].copy_from_slice(&batch);
        let total = starts.last().copied().unwrap_or(0);
        let grid = total.min(max_blocks) as u32;
        function.launch(
            stream,
            grid,
            512,
            &[KernelArg::new(&args), KernelArg::new(&chunk_size)],
        )?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn d(bytes: u64) -> CopyDesc {
        CopyDesc {
            src: 0,
            dst: 0,
            bytes,
        }
    }

    #[test]
    fn copy_batches_drop_empty_ranges_and_split_at_the_limit() {
        let descs: Vec<CopyDesc> = (0..200u64).map(|i| d(i % 3 * 100_000)).collect();
        let batches = plan_copy_batches(&descs, 65536);
        let kept: usize = batches.iter().map(|(b, _)| b.len()).sum();
        assert_eq!(kept, descs.iter().filter(|x| x.bytes > 0).count());
        assert!(batches
            .iter()
            .all(|(b, s)| b.len() <= MAX_COPY && s.len() == b.len() + 1));
        let (first, starts) = &batches[0];
        // 100000 bytes is 2 chunks of 64 KiB, 200000 is 4.
        assert_eq!(first[0].bytes, 100_000);
        assert_eq!(&starts[..4], &[0, 2, 6, 8]);
    }

    #[test]
    fn chunks_shrink_so_small_copies_use_many_blocks() {
        // 132 SMs x 4 blocks.
        assert_eq!(chunk_bytes(1 << 30, 528), 64 << 10);
        assert_eq!(chunk_bytes(1 << 20, 528), 8 << 10);
        assert_eq!(chunk_bytes(1024, 528), 8 << 10);
        assert_eq!(chunk_bytes(16 << 20, 528), 24 << 10);
        assert_eq!(chunk_bytes(100, 0), 8 << 10);
    }

    #[test]
    fn the_param_structs_fit_the_launch_limit() {
        // cuLaunchKernel takes at most 4 KiB of parameters on every GPU.
        assert!(std::mem::size_of::<CopyBatch>() + 8 <= 4096);
        assert_eq!(std::mem::size_of::<CopyDesc>(), 24);
    }
}
