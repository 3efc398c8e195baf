//! `ReduceOp`: how a reducing collective combines the ranks' tensors.

use std::fmt;

use crate::tensor::DType;
use crate::{Error, Result};

/// How [`all_reduce`](super::ProcessGroup), `reduce` and `reduce_scatter`
/// combine the ranks' elements, as c10d's `ReduceOp`.
///
/// - `Sum`, `Product`, `Min`, `Max`: every dtype. Integers wrap on overflow;
///   `Min`/`Max` of floats ignore a NaN when the other value is a number
///   (IEEE minNum/maxNum); on `bool` `Sum`/`Max` are OR and
///   `Product`/`Min` are AND.
/// - `Avg`: sum, then divide by the world size (integers truncate); not for
///   `bool`.
/// - `Band`, `Bor`, `Bxor`: integer and bool dtypes only.
/// - `PremulSum(factor)`: the sum multiplied by `factor` (what NCCL's
///   `ncclRedOpCreatePreMulSum` computes, up to rounding); floating dtypes
///   only.
///
/// f16 and bf16 are combined in f32 and rounded once per step.
///
/// ```
/// use tensorcomm::group::ReduceOp;
/// use tensorcomm::tensor::DType;
///
/// assert!(ReduceOp::Bxor.check_dtype("all_reduce", DType::I32).is_ok());
/// let err = ReduceOp::Bxor.check_dtype("all_reduce", DType::F32).unwrap_err();
/// assert!(err.to_string().contains("BXOR"));
/// assert_eq!(ReduceOp::PremulSum(0.5).to_string(), "PREMUL_SUM(0.5)");
/// ```
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum ReduceOp {
    Sum,
    Avg,
    Product,
    Min,
    Max,
    Band,
    Bor,
    Bxor,
    PremulSum(f64),
}

impl ReduceOp {
    /// Every op without a parameter, and `PremulSum(2.5)`: handy for tests
    /// and benchmarks.
    pub const ALL: [ReduceOp; 9] = [
        ReduceOp::Sum,
        ReduceOp::Avg,
        ReduceOp::Product,
        ReduceOp::Min,
        ReduceOp::Max,
        ReduceOp::Band,
        ReduceOp::Bor,
        ReduceOp::Bxor,
        ReduceOp::PremulSum(2.5),
    ];

    /// The c10d name: `SUM`, `AVG`, `PRODUCT`, `MIN`, `MAX`, `BAND`, `BOR`,
    /// `BXOR`, `PREMUL_SUM`.
    pub const fn name(self) -> &'static str {
        match self {
            ReduceOp::Sum => "SUM",
            ReduceOp::Avg => "AVG",
            ReduceOp::Product => "PRODUCT",
            ReduceOp::Min => "MIN",
            ReduceOp::Max => "MAX",
            ReduceOp::Band => "BAND",
            ReduceOp::Bor => "BOR",
            ReduceOp::Bxor => "BXOR",
            ReduceOp::PremulSum(_) => "PREMUL_SUM",
        }
    }

    /// True for `Band`, `Bor` and `Bxor`.
    pub const fn is_bitwise(self) -> bool {
        matches!(self, ReduceOp::Band | ReduceOp::Bor | ReduceOp::Bxor)
    }

    /// Errors with [`Error::UnsupportedReduceOp`] when this op is not
    /// defined for `dtype` (see the type's documentation); `op` names the
    /// collective in the message.
    pub fn check_dtype(self, op: &str, dtype: DType) -> Result<()> {
        let unsupported = match self {
            ReduceOp::Band | ReduceOp::Bor | ReduceOp::Bxor => dtype.is_floating_point(),
            ReduceOp::Avg => dtype == DType::Bool,
            ReduceOp::PremulSum(_) => !dtype.is_floating_point(),
            ReduceOp::Sum | ReduceOp::Product | ReduceOp::Min | ReduceOp::Max => false,
        };
        if unsupported {
            let expected = match self {
                ReduceOp::Avg => "expected a numeric dtype",
                ReduceOp::PremulSum(_) => "expected a floating-point dtype",
                _ => "expected an integer or bool dtype",
            };
            return Err(Error::UnsupportedReduceOp {
                op: op.into(),
                reduce_op: self.name().into(),
                what: format!("dtype {dtype} ({expected})"),
            });
        }
        Ok(())
    }
}

impl fmt::Display for ReduceOp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ReduceOp::PremulSum(factor) => write!(f, "PREMUL_SUM({factor})"),
            other => f.write_str(other.name()),
        }
    }
}

impl std::str::FromStr for ReduceOp {
    type Err = Error;

    /// Parses `sum`, `avg`, `product`/`prod`, `min`, `max`, `band`, `bor`,
    /// `bxor` (any case).
    fn from_str(s: &str) -> Result<Self> {
        Ok(match s.to_ascii_lowercase().as_str() {
            "sum" => ReduceOp::Sum,
            "avg" => ReduceOp::Avg,
            "product" | "prod" => ReduceOp::Product,
            "min" => ReduceOp::Min,
            "max" => ReduceOp::Max,
            "band" => ReduceOp::Band,
            "bor" => ReduceOp::Bor,
            "bxor" => ReduceOp::Bxor,
            _ => {
                return Err(Error::BadValue {
                    name: "reduce op".into(),
                    expected: "one of sum, avg, product, min, max, band, bor, bxor".into(),
                    found: s.into(),
                })
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dtype_support_follows_the_documented_table() {
        for op in ReduceOp::ALL {
            for dtype in DType::ALL {
                let ok = op.check_dtype("t", dtype).is_ok();
                let expected = match op {
                    ReduceOp::Band | ReduceOp::Bor | ReduceOp::Bxor => !dtype.is_floating_point(),
                    ReduceOp::Avg => dtype != DType::Bool,
                    ReduceOp::PremulSum(_) => dtype.is_floating_point(),
                    _ => true,
                };
                assert_eq!(ok, expected, "{op} on {dtype}");
            }
        }
        assert_eq!("PROD".parse::<ReduceOp>().unwrap(), ReduceOp::Product);
        assert!("mean".parse::<ReduceOp>().is_err());
    }
}
