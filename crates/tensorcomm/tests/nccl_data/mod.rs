//! Test data for the NCCL group's tests: tensors of every dtype the NCCL
//! group takes, built from and read back as f64, on a given GPU.

use half::{bf16, f16};
use tensorcomm::group::ReduceOp;
use tensorcomm::tensor::{DType, Device, Tensor};

pub const DTYPES: [DType; 8] = [
    DType::F32,
    DType::F64,
    DType::F16,
    DType::BF16,
    DType::I8,
    DType::U8,
    DType::I32,
    DType::I64,
];

/// A tensor of `dtype` holding `values` on GPU `device`.
pub fn gpu(dtype: DType, values: &[f64], shape: &[usize], device: usize) -> Tensor<'static> {
    let host = match dtype {
        DType::F32 => Tensor::from_vec(values.iter().map(|&v| v as f32).collect(), shape),
        DType::F64 => Tensor::from_vec(values.to_vec(), shape),
        DType::I8 => Tensor::from_vec(values.iter().map(|&v| v as i8).collect(), shape),
        DType::U8 => Tensor::from_vec(values.iter().map(|&v| v as u8).collect(), shape),
        DType::F16 => Tensor::from_vec(values.iter().map(|&v| f16::from_f64(v)).collect(), shape),
        DType::BF16 => Tensor::from_vec(values.iter().map(|&v| bf16::from_f64(v)).collect(), shape),
        DType::I32 => Tensor::from_vec(values.iter().map(|&v| v as i32).collect(), shape),
        DType::I64 => Tensor::from_vec(values.iter().map(|&v| v as i64).collect(), shape),
        other => panic!("no test data for {other}"),
    };
    host.unwrap()
        .to_device(Device::Cuda(device))
        .unwrap_or_else(|e| panic!("a {dtype} tensor on cuda:{device}: {e}"))
}

/// A tensor of `dtype` on GPU `device` filled with a value no result has
/// (-77; 0 in u8, which no test input or result holds either).
pub fn poisoned(dtype: DType, shape: &[usize], device: usize) -> Tensor<'static> {
    let n = shape.iter().product();
    gpu(dtype, &vec![-77.0; n], shape, device)
}

/// The elements of `t`, as f64.
pub fn read(t: &Tensor<'_>) -> Vec<f64> {
    fn all<T: tensorcomm::tensor::Element>(t: &Tensor<'_>, f: impl Fn(T) -> f64) -> Vec<f64> {
        t.to_vec::<T>().unwrap().into_iter().map(f).collect()
    }
    match t.dtype() {
        DType::F32 => all::<f32>(t, f64::from),
        DType::F64 => all::<f64>(t, |v| v),
        DType::F16 => all::<f16>(t, f64::from),
        DType::BF16 => all::<bf16>(t, f64::from),
        DType::I8 => all::<i8>(t, f64::from),
        DType::U8 => all::<u8>(t, f64::from),
        DType::I32 => all::<i32>(t, f64::from),
        DType::I64 => all::<i64>(t, |v| v as f64),
        other => panic!("no test data for {other}"),
    }
}

/// Inputs of 1 to 17: sums over 4 ranks fit i8, PREMUL_SUM(2.5) of them
/// stays within a step of bf16 rounding.
pub fn data(n: usize, seed: usize) -> Vec<f64> {
    (0..n).map(|i| ((i * 3 + seed) % 17) as f64 + 1.0).collect()
}

pub fn ops_for(dtype: DType) -> Vec<ReduceOp> {
    let mut ops = vec![
        ReduceOp::Sum,
        ReduceOp::Avg,
        ReduceOp::Product,
        ReduceOp::Min,
        ReduceOp::Max,
    ];
    if dtype.is_floating_point() {
        ops.push(ReduceOp::PremulSum(2.5));
    }
    ops
}
