//! Benchmark inputs and their independent reference: rank `r` holds
//! `value(r, i) = (r + i) % 5` at element `i` (exact in every dtype), so
//! the expected sum is computed by plain arithmetic, not by the library.

use half::{bf16, f16};
use tensorcomm::tensor::{DType, Tensor};

/// The input value of rank `rank` at element `i`.
pub fn value(rank: usize, i: usize) -> f64 {
    ((rank + i) % 5) as f64
}

/// A tensor of `count` elements of `dtype` holding `f(i)`.
pub fn make(
    dtype: DType,
    count: usize,
    f: impl Fn(usize) -> f64,
) -> tensorcomm::Result<Tensor<'static>> {
    let shape = [count];
    match dtype {
        DType::F32 => Tensor::from_vec((0..count).map(|i| f(i) as f32).collect(), &shape),
        DType::F64 => Tensor::from_vec((0..count).map(&f).collect(), &shape),
        DType::F16 => Tensor::from_vec((0..count).map(|i| f16::from_f64(f(i))).collect(), &shape),
        DType::BF16 => Tensor::from_vec((0..count).map(|i| bf16::from_f64(f(i))).collect(), &shape),
        DType::I8 => Tensor::from_vec((0..count).map(|i| f(i) as i8).collect(), &shape),
        DType::U8 => Tensor::from_vec((0..count).map(|i| f(i) as u8).collect(), &shape),
        DType::I32 => Tensor::from_vec((0..count).map(|i| f(i) as i32).collect(), &shape),
        DType::I64 => Tensor::from_vec((0..count).map(|i| f(i) as i64).collect(), &shape),
        DType::Bool => {
            let bools: Vec<bool> = (0..count).map(|i| f(i) != 0.0).collect();
            Tensor::from_bools(&bools, &shape)
        }
    }
}

/// The elements of a tensor as f64.
pub fn decode(t: &Tensor<'_>) -> tensorcomm::Result<Vec<f64>> {
    Ok(match t.dtype() {
        DType::F32 => t.to_vec::<f32>()?.into_iter().map(f64::from).collect(),
        DType::F64 => t.to_vec::<f64>()?,
        DType::F16 => t.to_vec::<f16>()?.into_iter().map(f64::from).collect(),
        DType::BF16 => t.to_vec::<bf16>()?.into_iter().map(f64::from).collect(),
        DType::I8 => t.to_vec::<i8>()?.into_iter().map(f64::from).collect(),
        DType::U8 => t.to_vec::<u8>()?.into_iter().map(f64::from).collect(),
        DType::I32 => t.to_vec::<i32>()?.into_iter().map(f64::from).collect(),
        DType::I64 => t.to_vec::<i64>()?.into_iter().map(|v| v as f64).collect(),
        DType::Bool => t
            .to_vec_bool()?
            .into_iter()
            .map(|b| f64::from(u8::from(b)))
            .collect(),
    })
}

/// What element `i` should be after a SUM all-reduce over `ranks` ranks
/// (OR for bool), wrapped like the dtype wraps.
pub fn all_reduce_sum(dtype: DType, ranks: usize, i: usize) -> f64 {
    wrap_sum(dtype, (0..ranks).map(|r| value(r, i)).sum())
}

/// A sum of inputs (each from [`value`], so never negative) as `dtype`
/// holds it: OR for bool (nonzero), wrapped for 8-bit integers, exact
/// otherwise (small integers).
pub fn wrap_sum(dtype: DType, total: f64) -> f64 {
    match dtype {
        DType::Bool => f64::from(u8::from(total != 0.0)),
        DType::I8 => f64::from(total as i64 as i8),
        DType::U8 => f64::from(total as i64 as u8),
        _ => total,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inputs_round_trip_and_the_reference_wraps_like_the_dtype() {
        for dtype in DType::ALL {
            let t = make(dtype, 7, |i| value(2, i)).unwrap();
            let expected: Vec<f64> = (0..7)
                .map(|i| value(2, i))
                .map(|v| {
                    if dtype == DType::Bool {
                        f64::from(u8::from(v != 0.0))
                    } else {
                        v
                    }
                })
                .collect();
            assert_eq!(decode(&t).unwrap(), expected, "{dtype}");
        }
        assert_eq!(all_reduce_sum(DType::F32, 3, 0), 3.0); // 0 + 1 + 2
        assert_eq!(all_reduce_sum(DType::Bool, 1, 0), 0.0);
        // 200 ranks: each residue 0..5 forty times, 400 in all, wrapping to -112.
        assert_eq!(all_reduce_sum(DType::I8, 200, 4), -112.0);
    }
}
