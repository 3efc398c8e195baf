//! tensorcomm's dtypes and reduce ops as NCCL's: every dtype has an NCCL
//! type (bool travels as bytes); SUM, AVG, PRODUCT, MIN, MAX map to NCCL's
//! ops (on bool, SUM and PRODUCT become logical or and and, as in c10d),
//! PREMUL_SUM becomes an op created for the call, and the bitwise ops are
//! refused with a named error.

use std::ffi::c_void;

use half::{bf16, f16};

use super::library::{Nccl, RawComm, RawDType, RawRedOp};
use crate::group::ReduceOp;
use crate::tensor::DType;
use crate::{Error, Result};

/// `ncclDataType_t` of `dtype`.
pub(crate) fn nccl_dtype(dtype: DType) -> RawDType {
    match dtype {
        DType::I8 => 0,
        DType::U8 | DType::Bool => 1,
        DType::I32 => 2,
        DType::I64 => 4,
        DType::F16 => 6,
        DType::F32 => 7,
        DType::F64 => 8,
        DType::BF16 => 9,
    }
}

/// `ncclSum`, `ncclProd`, `ncclMax`, `ncclMin`, `ncclAvg`.
const SUM: RawRedOp = 0;
const PROD: RawRedOp = 1;
const MAX: RawRedOp = 2;
const MIN: RawRedOp = 3;
const AVG: RawRedOp = 4;
/// `ncclScalarHostImmediate`: the pre-multiplier is read at creation.
const SCALAR_HOST_IMMEDIATE: i32 = 1;

/// Refuses the ops NCCL lacks (the bitwise ones), before anything is
/// queued.
pub(crate) fn check_reduce_op(call: &str, op: ReduceOp) -> Result<()> {
    match op {
        ReduceOp::Band | ReduceOp::Bor | ReduceOp::Bxor => Err(Error::UnsupportedReduceOp {
            op: call.into(),
            reduce_op: op.name().into(),
            what: "the NCCL backend (NCCL has no bitwise reductions; use a CPU group)".into(),
        }),
        _ => Ok(()),
    }
}

/// A reduce op for one call; a PREMUL_SUM op NCCL created for it is
/// destroyed when this is dropped (NCCL allows that once the calls that use
/// it have been queued).
pub(crate) struct RedOp<'a> {
    pub(crate) raw: RawRedOp,
    created: Option<(&'a Nccl, RawComm)>,
}

impl<'a> RedOp<'a> {
    /// True for an op NCCL created for the call (destroyed with it).
    pub(crate) fn is_created(&self) -> bool {
        self.created.is_some()
    }

    /// NCCL's op for `op` on `dtype` in `comm` (`call` names the
    /// collective in errors).
    pub(crate) fn new(
        nccl: &'a Nccl,
        comm: RawComm,
        call: &str,
        op: ReduceOp,
        dtype: DType,
    ) -> Result<RedOp<'a>> {
        let plain = |raw| Ok(RedOp { raw, created: None });
        let is_bool = dtype == DType::Bool;
        match op {
            ReduceOp::Sum if is_bool => plain(MAX),
            ReduceOp::Product if is_bool => plain(MIN),
            ReduceOp::Sum => plain(SUM),
            ReduceOp::Product => plain(PROD),
            ReduceOp::Min => plain(MIN),
            ReduceOp::Max => plain(MAX),
            ReduceOp::Avg => plain(AVG),
            ReduceOp::Band | ReduceOp::Bor | ReduceOp::Bxor => {
                check_reduce_op(call, op).map(|()| unreachable!("bitwise ops are refused"))
            }
            ReduceOp::PremulSum(factor) => {
                let mut scalar = [0u8; 8];
                let bytes: &[u8] = match dtype {
                    DType::F32 => &(factor as f32).to_ne_bytes(),
                    DType::F64 => &factor.to_ne_bytes(),
                    DType::F16 => &f16::from_f64(factor).to_bits().to_ne_bytes(),
                    DType::BF16 => &bf16::from_f64(factor).to_bits().to_ne_bytes(),
                    other => {
                        return Err(Error::UnsupportedReduceOp {
                            op: call.into(),
                            reduce_op: op.name().into(),
                            what: format!("dtype {other} (expected a floating-point dtype)"),
                        })
                    }
                };
                scalar[..bytes.len()].copy_from_slice(bytes);
                let mut raw = 0;
                // SAFETY: a host scalar of `dtype`, read during the call.
                let code = unsafe {
                    (nccl.red_op_create_pre_mul_sum)(
                        &mut raw,
                        scalar.as_mut_ptr().cast::<c_void>(),
                        nccl_dtype(dtype),
                        SCALAR_HOST_IMMEDIATE,
                        comm,
                    )
                };
                nccl.check("ncclRedOpCreatePreMulSum", code, Some(comm))?;
                Ok(RedOp {
                    raw,
                    created: Some((nccl, comm)),
                })
            }
        }
    }
}

impl Drop for RedOp<'_> {
    fn drop(&mut self) {
        if let Some((nccl, comm)) = self.created {
            // SAFETY: an op created above for `comm`, whose calls are queued.
            unsafe { (nccl.red_op_destroy)(self.raw, comm) };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_dtype_has_its_nccl_type() {
        let codes: Vec<_> = DType::ALL.iter().map(|&d| nccl_dtype(d)).collect();
        // f32 f64 f16 bf16 i8 u8 i32 i64 bool
        assert_eq!(codes, [7, 8, 6, 9, 0, 1, 2, 4, 1]);
    }

    #[test]
    fn bitwise_ops_are_refused_by_name_and_the_others_pass() {
        for op in ReduceOp::ALL {
            let got = check_reduce_op("all_reduce", op);
            match op {
                ReduceOp::Band | ReduceOp::Bor | ReduceOp::Bxor => {
                    let e = got.unwrap_err().to_string();
                    assert!(e.contains(op.name()) && e.contains("NCCL"), "{e}");
                }
                _ => got.unwrap(),
            }
        }
    }
}
