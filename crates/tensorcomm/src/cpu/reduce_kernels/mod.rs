//! Reduction kernels: combining a received buffer into an accumulator,
//! element by element, for every [`ReduceOp`] and dtype.
//!
//! Buffers are raw bytes in the dtype's native layout (what transports
//! move). [`reduce_into`] is the step every algorithm repeats; [`finish`]
//! applies what comes once at the end (`AVG` divides by the world size,
//! `PREMUL_SUM` multiplies by its factor). Loops run over fixed-width
//! chunks (`chunked.rs`) so the compiler vectorises them.
//!
//! ```
//! use tensorcomm::cpu::reduce_kernels::{finish, reduce_into, ReduceOp};
//! use tensorcomm::tensor::DType;
//!
//! let bytes = |v: &[i32]| v.iter().flat_map(|x| x.to_ne_bytes()).collect::<Vec<u8>>();
//! let mut acc = bytes(&[3, 10]);
//! reduce_into(ReduceOp::Avg, DType::I32, &mut acc, &bytes(&[5, 1]))?;
//! finish(ReduceOp::Avg, DType::I32, &mut acc, 2)?;
//! assert_eq!(acc, bytes(&[4, 5]));
//! # Ok::<(), tensorcomm::Error>(())
//! ```

mod chunked;

use half::{bf16, f16};

pub use crate::group::ReduceOp;
use crate::tensor::DType;
use crate::{Error, Result};
use chunked::{combine, combine_half, map, map_half};

fn check_lengths(dtype: DType, acc: usize, other: Option<usize>) -> Result<()> {
    if !acc.is_multiple_of(dtype.size()) || other.is_some_and(|o| o != acc) {
        return Err(Error::InvalidArgument(format!(
            "reduce: expected two buffers of the same whole number of {dtype} elements, found {acc} and {} bytes",
            other.unwrap_or(acc)
        )));
    }
    Ok(())
}

macro_rules! float_combine {
    ($T:ty, $op:expr, $acc:expr, $other:expr) => {
        match $op {
            ReduceOp::Sum | ReduceOp::Avg | ReduceOp::PremulSum(_) => {
                combine::<$T, _>($acc, $other, |a, b| a + b)
            }
            ReduceOp::Product => combine::<$T, _>($acc, $other, |a, b| a * b),
            ReduceOp::Min => combine::<$T, _>($acc, $other, <$T>::min),
            ReduceOp::Max => combine::<$T, _>($acc, $other, <$T>::max),
            ReduceOp::Band | ReduceOp::Bor | ReduceOp::Bxor => unreachable_bitwise(),
        }
    };
}

macro_rules! half_combine {
    ($H:ty, $op:expr, $acc:expr, $other:expr) => {
        match $op {
            ReduceOp::Sum | ReduceOp::Avg | ReduceOp::PremulSum(_) => {
                combine_half::<$H, _>($acc, $other, |a, b| a + b)
            }
            ReduceOp::Product => combine_half::<$H, _>($acc, $other, |a, b| a * b),
            ReduceOp::Min => combine_half::<$H, _>($acc, $other, f32::min),
            ReduceOp::Max => combine_half::<$H, _>($acc, $other, f32::max),
            ReduceOp::Band | ReduceOp::Bor | ReduceOp::Bxor => unreachable_bitwise(),
        }
    };
}

macro_rules! int_combine {
    ($T:ty, $op:expr, $acc:expr, $other:expr) => {
        match $op {
            ReduceOp::Sum | ReduceOp::Avg | ReduceOp::PremulSum(_) => {
                combine::<$T, _>($acc, $other, <$T>::wrapping_add)
            }
            ReduceOp::Product => combine::<$T, _>($acc, $other, <$T>::wrapping_mul),
            ReduceOp::Min => combine::<$T, _>($acc, $other, std::cmp::min),
            ReduceOp::Max => combine::<$T, _>($acc, $other, std::cmp::max),
            ReduceOp::Band => combine::<$T, _>($acc, $other, |a, b| a & b),
            ReduceOp::Bor => combine::<$T, _>($acc, $other, |a, b| a | b),
            ReduceOp::Bxor => combine::<$T, _>($acc, $other, |a, b| a ^ b),
        }
    };
}

/// Bitwise ops on floats are refused by `check_dtype` before any kernel
/// runs; this keeps the match exhaustive without a panic path.
fn unreachable_bitwise() {}

/// Combines `other` into `acc` element-wise: `acc = acc (op) other`, where
/// `AVG` and `PREMUL_SUM` combine as `SUM` (see [`finish`]). Both buffers
/// hold the same number of `dtype` elements in native byte order and may be
/// unaligned. Errors for an op the dtype does not support
/// ([`ReduceOp::check_dtype`]) or buffers of different lengths.
///
/// ```
/// use tensorcomm::cpu::reduce_kernels::{reduce_into, ReduceOp};
/// use tensorcomm::tensor::DType;
/// let mut acc = vec![0b1100u8, 1];
/// reduce_into(ReduceOp::Bxor, DType::U8, &mut acc, &[0b1010, 1])?;
/// assert_eq!(acc, [0b0110, 0]);
/// assert!(reduce_into(ReduceOp::Bxor, DType::F32, &mut [0; 4], &[0; 4]).is_err());
/// # Ok::<(), tensorcomm::Error>(())
/// ```
pub fn reduce_into(op: ReduceOp, dtype: DType, acc: &mut [u8], other: &[u8]) -> Result<()> {
    op.check_dtype("reduce", dtype)?;
    check_lengths(dtype, acc.len(), Some(other.len()))?;
    #[cfg(target_arch = "x86_64")]
    if wide::available() {
        // SAFETY: the CPU has AVX2 (checked at run time just above).
        unsafe { wide::combine_avx2(op, dtype, acc, other) };
        return Ok(());
    }
    combine_any(op, dtype, acc, other);
    Ok(())
}

/// The same kernels compiled for AVX2, picked at run time: the crate is
/// built for baseline x86-64 (SSE2), so its loops otherwise use 128-bit
/// vectors. Every element gets the same operation either way (element-wise
/// IEEE arithmetic, no reassociation), so results are bit-identical.
#[cfg(target_arch = "x86_64")]
mod wide {
    use super::*;

    /// Whether this CPU has AVX2 (detected once).
    pub(super) fn available() -> bool {
        static AVX2: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
        *AVX2.get_or_init(|| std::arch::is_x86_feature_detected!("avx2"))
    }

    /// [`combine_any`] with AVX2 enabled.
    ///
    /// # Safety
    /// The CPU must support AVX2.
    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn combine_avx2(op: ReduceOp, dtype: DType, acc: &mut [u8], other: &[u8]) {
        combine_any(op, dtype, acc, other)
    }
}

/// The element-wise combine of [`reduce_into`], after its checks; inlined
/// into each instruction-set variant.
#[inline(always)]
fn combine_any(op: ReduceOp, dtype: DType, acc: &mut [u8], other: &[u8]) {
    match dtype {
        DType::F32 => float_combine!(f32, op, acc, other),
        DType::F64 => float_combine!(f64, op, acc, other),
        DType::F16 => half_combine!(f16, op, acc, other),
        DType::BF16 => half_combine!(bf16, op, acc, other),
        DType::I8 => int_combine!(i8, op, acc, other),
        DType::U8 => int_combine!(u8, op, acc, other),
        DType::I32 => int_combine!(i32, op, acc, other),
        DType::I64 => int_combine!(i64, op, acc, other),
        DType::Bool => match op {
            ReduceOp::Sum | ReduceOp::Max | ReduceOp::Bor => {
                combine::<u8, _>(acc, other, |a, b| u8::from((a | b) != 0))
            }
            ReduceOp::Product | ReduceOp::Min | ReduceOp::Band => {
                combine::<u8, _>(acc, other, |a, b| u8::from(a != 0 && b != 0))
            }
            ReduceOp::Bxor => combine::<u8, _>(acc, other, |a, b| u8::from((a != 0) != (b != 0))),
            ReduceOp::Avg | ReduceOp::PremulSum(_) => {}
        },
    }
}

/// Applies the final step of `op` to a fully combined buffer of
/// `world_size` contributions: `AVG` divides by `world_size` (integers
/// truncate toward zero), `PREMUL_SUM(f)` multiplies by `f`; other ops
/// leave the buffer as it is.
///
/// ```
/// use tensorcomm::cpu::reduce_kernels::{finish, ReduceOp};
/// use tensorcomm::tensor::DType;
/// let mut buf = 3.0f64.to_ne_bytes().to_vec();
/// finish(ReduceOp::PremulSum(0.5), DType::F64, &mut buf, 4)?;
/// assert_eq!(buf, 1.5f64.to_ne_bytes());
/// # Ok::<(), tensorcomm::Error>(())
/// ```
pub fn finish(op: ReduceOp, dtype: DType, buf: &mut [u8], world_size: usize) -> Result<()> {
    op.check_dtype("reduce", dtype)?;
    check_lengths(dtype, buf.len(), None)?;
    match op {
        ReduceOp::Avg => {
            let n = world_size.max(1);
            match dtype {
                DType::F32 => map::<f32, _>(buf, |x| x / n as f32),
                DType::F64 => map::<f64, _>(buf, |x| x / n as f64),
                DType::F16 => map_half::<f16, _>(buf, |x| x / n as f32),
                DType::BF16 => map_half::<bf16, _>(buf, |x| x / n as f32),
                DType::I8 => map::<i8, _>(buf, |x| (i64::from(x) / n as i64) as i8),
                DType::U8 => map::<u8, _>(buf, |x| (u64::from(x) / n as u64) as u8),
                DType::I32 => map::<i32, _>(buf, |x| (i64::from(x) / n as i64) as i32),
                DType::I64 => map::<i64, _>(buf, |x| x / n as i64),
                DType::Bool => {}
            }
        }
        ReduceOp::PremulSum(factor) => match dtype {
            DType::F32 => map::<f32, _>(buf, |x| x * factor as f32),
            DType::F64 => map::<f64, _>(buf, |x| x * factor),
            DType::F16 => map_half::<f16, _>(buf, |x| x * factor as f32),
            DType::BF16 => map_half::<bf16, _>(buf, |x| x * factor as f32),
            _ => {}
        },
        _ => {}
    }
    Ok(())
}

#[cfg(test)]
mod tests;
