//! tensorcomm's own kernels (`kernels.cu`) and their launchers: a
//! multi-tensor byte copy, a strided element copy and an element-wise sum
//! of up to eight inputs. Pointers may point into other GPUs' memory where
//! peer access is enabled ([`enable_peer_access`](crate::cuda::runtime::enable_peer_access)).

mod multi_copy;
mod reduce_add;
mod strided_copy;

use crate::cuda::runtime::{Context, Function, Program};
use crate::Result;

pub(crate) use multi_copy::{multi_copy, CopyDesc, MAX_COPY};
pub(crate) use reduce_add::{reduce_add, MAX_SRC};
pub(crate) use strided_copy::{strided_copy, StridedArgs, MAX_DIMS};

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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Error;

    #[test]
    fn every_declared_kernel_is_in_the_source() {
        for name in KERNELS {
            let signature = format!("extern \"C\" __global__ void {name}(");
            assert!(SOURCE.contains(&signature), "{name} is not in kernels.cu");
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
}
