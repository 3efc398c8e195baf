//! gather, gather_out.

use crate::tensor::{Device, Layout, Tensor};
use crate::Result;

use super::arg_error;
use super::copy::copy_pairs;
use super::cuda_ordinal;

/// Checks the inputs; gives the wrapped dim and the output shape.
fn check_inputs(op: &'static str, tensors: &[Tensor<'_>], dim: i64) -> Result<(usize, Vec<usize>)> {
    let Some(first) = tensors.first() else {
        return Err(arg_error(
            op,
            "tensors",
            None,
            "at least one tensor to gather",
            "an empty list",
        ));
    };
    let ndim = first.dim();
    let n = ndim as i64;
    let w = if dim < 0 { dim + n } else { dim };
    if !(0..n).contains(&w) {
        return Err(arg_error(
            op,
            "dim",
            None,
            format!("a dimension in {} ..= {}", -n, n - 1),
            dim.to_string(),
        ));
    }
    let d = w as usize;
    let mut expected = first.shape().to_vec();
    let mut total = 0usize;
    for (i, t) in tensors.iter().enumerate() {
        cuda_ordinal(op, "input tensor", i, t)?;
        if t.dim() != ndim {
            return Err(arg_error(
                op,
                "input tensor",
                Some(i),
                format!("{ndim} dimensions (like tensor 0)"),
                format!("{} dimensions", t.dim()),
            ));
        }
        expected[d] = t.shape()[d];
        if t.shape() != expected.as_slice() {
            return Err(arg_error(
                op,
                "input tensor",
                Some(i),
                format!("shape {expected:?}"),
                format!("shape {:?}", t.shape()),
            ));
        }
        if t.dtype() != first.dtype() {
            return Err(arg_error(
                op,
                "input tensor",
                Some(i),
                format!("dtype {} (like tensor 0)", first.dtype()),
                format!("dtype {}", t.dtype()),
            ));
        }
        total += t.shape()[d];
    }
    expected[d] = total;
    Ok((d, expected))
}

/// Concatenates `tensors` (CUDA tensors with the same number of dimensions
/// and the same sizes except along `dim`) along `dim` onto `destination`, a
/// GPU or [`Device::Cpu`]. The result is channels-last only when every
/// input is.
///
/// ```no_run
/// use tensorcomm::cuda::comm::gather;
/// use tensorcomm::tensor::{Device, Tensor};
/// let a = Tensor::from_vec(vec![1u8, 2], &[1, 2])?.to_device(Device::Cuda(0))?;
/// let b = Tensor::from_vec(vec![3u8, 4], &[1, 2])?.to_device(Device::Cuda(1))?;
/// let g = gather(&[a, b], 0, Device::Cuda(0))?;
/// assert_eq!(g.shape(), &[2, 2]);
/// assert_eq!(g.to_vec::<u8>()?, [1, 2, 3, 4]);
/// # Ok::<(), tensorcomm::Error>(())
/// ```
pub fn gather(tensors: &[Tensor<'_>], dim: i64, destination: Device) -> Result<Tensor<'static>> {
    const OP: &str = "gather";
    let (d, shape) = check_inputs(OP, tensors, dim)?;
    let channels_last =
        tensors.iter().all(|t| t.is_channels_last() && t.dim() >= 4) && shape.len() >= 4;
    let layout = if channels_last {
        Layout::channels_last(&shape)?
    } else {
        Layout::contiguous(&shape)
    };
    let dtype = tensors[0].dtype();
    let out = match destination {
        Device::Cpu => Tensor::zeros_like_layout(layout, dtype)?,
        Device::Cuda(dev) => {
            Tensor::uninit_cuda(layout, dtype, &crate::cuda::runtime::context(dev)?)?
        }
    };
    write_chunks(tensors, &out, d)?;
    Ok(out)
}

/// Like [`gather`], into `out`, which must have the concatenated shape
/// and the inputs' dtype (any device, any layout).
///
/// ```no_run
/// use tensorcomm::cuda::comm::gather_out;
/// use tensorcomm::tensor::{DType, Device, Tensor};
/// let parts = [Tensor::zeros_on(&[2], DType::F64, Device::Cuda(0))?, Tensor::zeros_on(&[3], DType::F64, Device::Cuda(1))?];
/// let out = Tensor::zeros(&[5], DType::F64)?;
/// gather_out(&parts, &out, 0)?;
/// # Ok::<(), tensorcomm::Error>(())
/// ```
pub fn gather_out(tensors: &[Tensor<'_>], out: &Tensor<'_>, dim: i64) -> Result<()> {
    const OP: &str = "gather_out";
    let (d, shape) = check_inputs(OP, tensors, dim)?;
    if out.shape() != shape.as_slice() {
        return Err(arg_error(
            OP,
            "out",
            None,
            format!("shape {shape:?}"),
            format!("shape {:?}", out.shape()),
        ));
    }
    if out.dtype() != tensors[0].dtype() {
        return Err(arg_error(
            OP,
            "out",
            None,
            format!("dtype {}", tensors[0].dtype()),
            format!("dtype {}", out.dtype()),
        ));
    }
    write_chunks(tensors, out, d)
}

fn write_chunks(tensors: &[Tensor<'_>], out: &Tensor<'_>, d: usize) -> Result<()> {
    let sizes: Vec<usize> = tensors.iter().map(|t| t.shape()[d]).collect();
    let chunks = out.split_sizes(&sizes, d as i64)?;
    let pairs: Vec<(&Tensor<'_>, &Tensor<'_>)> = chunks.iter().zip(tensors).collect();
    copy_pairs(&pairs, &|_| None)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tensor::DType;
    use crate::Error;

    #[test]
    fn gather_checks_its_inputs_without_a_gpu() {
        assert!(
            matches!(gather(&[], 0, Device::Cpu), Err(Error::CommArgument { what, .. }) if what == "tensors")
        );
        let host = Tensor::zeros(&[2, 2], DType::F32).unwrap();
        match gather(&[host], 0, Device::Cpu) {
            Err(e @ Error::CommArgument { index: Some(0), .. }) => {
                assert!(
                    e.to_string()
                        .contains("expected a CUDA tensor, found a tensor on cpu"),
                    "{e}"
                )
            }
            other => panic!("{other:?}"),
        }
    }
}
