//! The strided element copy: one tensor between two strided layouts.

use super::kernel;
use crate::cuda::runtime::{Context, KernelArg, Stream};
use crate::Result;

/// Dimensions the strided copy handles (`MAX_DIMS`).
pub(crate) const MAX_DIMS: usize = 8;

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

/// Queues an element copy between two strided layouts of `numel` elements
/// (see [`StridedArgs`]); same preconditions as
/// [`multi_copy`](super::multi_copy()).
pub(crate) fn strided_copy(ctx: &Context, stream: &Stream, args: StridedArgs) -> Result<()> {
    if args.numel == 0 {
        return Ok(());
    }
    let function = kernel(ctx, "strided_copy")?;
    let grid = args.numel.div_ceil(256).min(u64::from(ctx.sm_count()) * 8) as u32;
    function.launch(stream, grid, 256, &[KernelArg::new(&args)])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_args_fit_the_launch_limit() {
        // cuLaunchKernel takes at most 4 KiB of parameters on every GPU.
        assert!(std::mem::size_of::<StridedArgs>() <= 4096);
    }
}
