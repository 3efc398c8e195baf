//! tensorcomm's own CUDA C kernels (`kernels.cu`) and their launchers,
//! one file each:
//!
//! - `multi_copy`: many byte ranges copied in one launch (`cuda::comm`'s
//!   broadcast, scatter and gather of many tensors),
//! - `strided_copy`: one tensor copied between two strided layouts
//!   ([`Tensor::copy_from`](crate::tensor::Tensor::copy_from) on a GPU),
//! - `reduce_add`: the element-wise sum of up to eight inputs, one kernel
//!   per dtype ([`cuda::comm::reduce_add`](crate::cuda::comm::reduce_add)),
//! - `peer_all_reduce` (`peer_all_reduce.cu`): push, one-shot, two-shot
//!   and large all-reduce over buffers every rank maps, with barriers on
//!   signal pads ([`cuda::intranode`](crate::cuda::intranode)).
//!
//! Pointers may point into other GPUs' memory where peer access is enabled
//! ([`enable_peer_access`](crate::cuda::runtime::enable_peer_access)). The
//! source is compiled with NVRTC once per GPU architecture (and cached on
//! disk, see [`cache_dir`](crate::cuda::runtime::cache_dir)) and loaded once
//! per device, on first use or ahead of time with [`load`]. The launchers
//! are crate-internal: they take raw device addresses.
//!
//! ```
//! use tensorcomm::cuda::{kernels, runtime};
//! // Build the kernels at start-up, so that the first copy or sum does not
//! // wait for NVRTC.
//! match runtime::device_count() {
//!     Ok(n) => {
//!         for i in 0..n {
//!             match kernels::load(i) {
//!                 Ok(()) => println!("cuda:{i}: kernels loaded"),
//!                 Err(tensorcomm::Error::NoCuda { reason }) => println!("no NVRTC: {reason}"),
//!                 Err(e) => return Err(e),
//!             }
//!         }
//!     }
//!     Err(tensorcomm::Error::NoCuda { reason }) => println!("no GPU here: {reason}"),
//!     Err(e) => return Err(e),
//! }
//! # Ok::<(), tensorcomm::Error>(())
//! ```

mod multi_copy;
mod peer_all_reduce;
mod reduce_add;
mod strided_copy;

use crate::cuda::runtime::{self, Context, Function, Program};
use crate::Result;

pub(crate) use multi_copy::{multi_copy, CopyDesc, MAX_COPY};
pub(crate) use peer_all_reduce::{
    large_slot_bytes, peer_all_reduce, peer_dtype_supported, peer_max_blocks, push_grid,
    push_inbox_bytes, PeerArgs, PeerOp, Shot, PEER_MAX, PEER_PAD_BYTES, PEER_STOPPED,
    PUSH_MAX_BYTES, PUSH_SLOT_BYTES, REG_ALIGNED, REG_REGISTERED, REG_STAGED, REG_UNREGISTERED,
    REG_WORDS,
};
pub(crate) use reduce_add::{reduce_add, MAX_SRC};
pub(crate) use strided_copy::{strided_copy, StridedArgs, MAX_DIMS};

/// The CUDA C source of the kernels.
const SOURCE: &str = concat!(
    include_str!("kernels.cu"),
    include_str!("peer_all_reduce.cu")
);

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
    "peer_one_shot_f32",
    "peer_one_shot_f16",
    "peer_one_shot_bf16",
    "peer_two_shot_f32",
    "peer_two_shot_f16",
    "peer_two_shot_bf16",
    "peer_push_f32",
    "peer_push_f16",
    "peer_push_bf16",
    "peer_large_f32",
    "peer_large_f16",
    "peer_large_bf16",
    "peer_registered_f32",
    "peer_registered_f16",
    "peer_registered_bf16",
];

/// The kernels' program, built once per device on first use.
static PROGRAM: Program = Program::new("tensorcomm", SOURCE, KERNELS);

/// Compiles tensorcomm's kernels for GPU `device` (or reads them from the
/// disk cache) and loads them, if that has not happened yet; otherwise
/// they are built by the first operation that needs them. Without a
/// driver, such a GPU or NVRTC this is [`Error::NoCuda`](crate::Error::NoCuda);
/// a source that does not compile is [`Error::Nvrtc`](crate::Error::Nvrtc).
///
/// ```
/// match tensorcomm::cuda::kernels::load(0) {
///     Ok(()) => println!("cuda:0 is ready"),
///     Err(tensorcomm::Error::NoCuda { reason }) => println!("no CUDA: {reason}"),
///     Err(e) => return Err(e),
/// }
/// # Ok::<(), tensorcomm::Error>(())
/// ```
pub fn load(device: usize) -> Result<()> {
    PROGRAM.module(&*runtime::context(device)?).map(|_| ())
}

/// The kernel `name` of [`PROGRAM`] on `ctx`'s GPU.
fn kernel(ctx: &Context, name: &str) -> Result<Function> {
    PROGRAM.module(ctx)?.kernel(name)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Error;

    #[test]
    fn every_declared_kernel_is_in_the_source() {
        for name in KERNELS {
            // `extern "C" __global__ void [__launch_bounds__(..)] name(`
            let declared = SOURCE.lines().any(|line| {
                line.starts_with("extern \"C\" __global__ void ")
                    && line.contains(&format!(" {name}("))
            });
            assert!(declared, "{name} is not in the kernels' source");
        }
    }

    #[test]
    fn the_source_compiles_where_nvrtc_is_present() {
        match PROGRAM.compile("sm_90") {
            Ok(bin) => assert!(bin.starts_with(b"\x7fELF"), "a CUBIN is an ELF image"),
            Err(Error::NoCuda { reason }) => crate::test_skipped(reason),
            Err(e) => panic!("{e}"),
        }
    }
}
