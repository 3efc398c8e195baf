//! tensorcomm's own kernels (`kernels.cu`) and their launchers: a
//! multi-tensor byte copy, a strided element copy and an element-wise sum
//! of up to eight inputs. Pointers may point into other GPUs' memory where
//! peer access is enabled ([`enable_peer_access`](crate::cuda::runtime::enable_peer_access)).

use crate::cuda::runtime::{Context, DevicePtr, Function, KernelArg, Program, Stream};
use crate::tensor::DType;
use crate::{Error, Result};

/// The CUDA C source of the kernels.
const SOURCE: &str = include_str!("kernels.cu");

/// The kernels `SOURCE` defines.
const KERNELS: &[&str] = &[
    "multi_copy",
    "strided_copy",
    "reduce_add_f32",
    "reduce_add_f64",
    "reduce_add_f16",
    "reduce_add_bf16",
    "reduce_add_i8",
    "reduce_add_u8",
    "reduce_add_i32",
    "reduce_add_i64",
    "reduce_add_bool",
];

/// The kernels' program, built once per device on first use.
static PROGRAM: Program = Program::new("tensorcomm", SOURCE, KERNELS);

/// The kernel `name` of [`PROGRAM`] on `ctx`'s GPU.
fn kernel(ctx: &Context, name: &str) -> Result<Function> {
    PROGRAM.module(ctx)?.kernel(name)
}

/// Ranges one `multi_copy` launch takes (`MAX_COPY` in kernels.cu).
pub(crate) const MAX_COPY: usize = 96;
/// Dimensions the strided copy handles (`MAX_DIMS`).
pub(crate) const MAX_DIMS: usize = 8;
/// Inputs one sum launch reads (`MAX_SRC`).
pub(crate) const MAX_SRC: usize = 8;
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

#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct StridedArgs {
    pub src: u64,
    pub dst: u64,
    pub numel: u64,
    pub ndim: i64,
    pub elem_size: i64,
    pub sizes: [i64; MAX_DIMS],
    pub src_strides: [i64; MAX_DIMS],
    pub dst_strides: [i64; MAX_DIMS],
}

#[repr(C)]
#[derive(Clone, Copy)]
struct ReduceArgs {
    dst: u64,
    src: [u64; MAX_SRC],
    nsrc: u64,
    numel: u64,
    vector: u64,
}

/// The sum kernel for `dtype`.
fn reduce_add_name(dtype: DType) -> &'static str {
    match dtype {
        DType::F32 => "reduce_add_f32",
        DType::F64 => "reduce_add_f64",
        DType::F16 => "reduce_add_f16",
        DType::BF16 => "reduce_add_bf16",
        DType::I8 => "reduce_add_i8",
        DType::U8 => "reduce_add_u8",
        DType::I32 => "reduce_add_i32",
        DType::I64 => "reduce_add_i64",
        DType::Bool => "reduce_add_bool",
    }
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

/// Queues an element copy between two strided layouts of `numel` elements
/// (see [`StridedArgs`]); same preconditions as [`multi_copy`].
pub(crate) fn strided_copy(ctx: &Context, stream: &Stream, args: StridedArgs) -> Result<()> {
    if args.numel == 0 {
        return Ok(());
    }
    let function = kernel(ctx, "strided_copy")?;
    let grid = args.numel.div_ceil(256).min(u64::from(ctx.sm_count()) * 8) as u32;
    function.launch(stream, grid, 256, &[KernelArg::new(&args)])
}

/// Queues `dst = sum(srcs)` element-wise over `numel` elements of `dtype`
/// (at most [`MAX_SRC`] inputs; `dst` may be one of them). Same
/// preconditions as [`multi_copy`].
pub(crate) fn reduce_add(
    ctx: &Context,
    stream: &Stream,
    dtype: DType,
    dst: DevicePtr,
    srcs: &[DevicePtr],
    numel: usize,
) -> Result<()> {
    if srcs.is_empty() || srcs.len() > MAX_SRC {
        return Err(Error::InvalidArgument(format!(
            "reduce_add kernel: expected 1 to {MAX_SRC} inputs, found {}",
            srcs.len()
        )));
    }
    if numel == 0 {
        return Ok(());
    }
    let function = kernel(ctx, reduce_add_name(dtype))?;
    let mut args = ReduceArgs {
        dst: dst.0,
        src: [0; MAX_SRC],
        nsrc: srcs.len() as u64,
        numel: numel as u64,
        vector: 0,
    };
    for (slot, p) in args.src.iter_mut().zip(srcs) {
        *slot = p.0;
    }
    let aligned = std::iter::once(dst)
        .chain(srcs.iter().copied())
        .all(|p| p.0 % 16 == 0);
    args.vector = u64::from(aligned);
    let per_thread = if aligned {
        (16 / dtype.size()) as u64
    } else {
        1
    };
    let threads = (numel as u64).div_ceil(per_thread);
    let grid = threads.div_ceil(256).min(u64::from(ctx.sm_count()) * 8) as u32;
    function.launch(stream, grid, 256, &[KernelArg::new(&args)])
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
    fn every_declared_kernel_is_in_the_source_and_every_dtype_has_a_sum() {
        for name in KERNELS {
            let signature = format!("extern \"C\" __global__ void {name}(");
            assert!(SOURCE.contains(&signature), "{name} is not in kernels.cu");
        }
        for dtype in DType::ALL {
            assert!(KERNELS.contains(&reduce_add_name(dtype)), "{dtype}");
        }
    }

    #[test]
    fn the_source_compiles_where_nvrtc_is_present() {
        match PROGRAM.compile("sm_90") {
            Ok(bin) => assert!(bin.starts_with(b"\x7fELF"), "a CUBIN is an ELF image"),
            Err(Error::NoCuda { reason }) => println!("skipped: {reason}"),
            Err(e) => panic!("{e}"),
        }
    }

    #[test]
    fn the_param_structs_fit_the_launch_limit() {
        // cuLaunchKernel takes at most 4 KiB of parameters on every GPU.
        assert!(std::mem::size_of::<CopyBatch>() + 8 <= 4096);
        assert!(std::mem::size_of::<StridedArgs>() <= 4096);
        assert_eq!(std::mem::size_of::<CopyDesc>(), 24);
    }
}
