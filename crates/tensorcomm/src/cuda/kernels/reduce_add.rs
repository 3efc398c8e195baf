//! The element-wise sum of up to eight inputs, one kernel per dtype.

use super::kernel;
use crate::cuda::runtime::{Context, DevicePtr, KernelArg, Stream};
use crate::tensor::DType;
use crate::{Error, Result};

/// Inputs one sum launch reads (`MAX_SRC`).
pub(crate) const MAX_SRC: usize = 8;

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

/// Queues `dst = sum(srcs)` element-wise over `numel` elements of `dtype`
/// (at most [`MAX_SRC`] inputs; `dst` may be one of them). Same
/// preconditions as [`multi_copy`](super::multi_copy()).
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

    #[test]
    fn every_dtype_has_a_declared_sum_kernel() {
        for dtype in DType::ALL {
            assert!(
                super::super::KERNELS.contains(&reduce_add_name(dtype)),
                "{dtype}"
            );
        }
    }
}
