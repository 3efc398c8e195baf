//! scatter, scatter_out.

use crate::cuda::runtime::Stream;
use crate::tensor::{Device, Tensor};
use crate::{Error, Result};

use super::copy::{copy_pairs, output_like};
use super::{arg_error, check_devices, cuda_ordinal};

/// The sizes along `dim` of the pieces `scatter` cuts: `chunk_sizes` when
/// given (one per device, adding up to `size`), else PyTorch's `chunk`
/// sizes (`ceil(size / devices)` each, possibly fewer pieces than devices).
///
/// ```
/// use tensorcomm::cuda::comm::scatter_sizes;
/// assert_eq!(scatter_sizes(10, 3, None)?, [4, 4, 2]);
/// assert_eq!(scatter_sizes(5, 4, None)?, [2, 2, 1]);
/// assert_eq!(scatter_sizes(5, 2, Some(&[5, 0]))?, [5, 0]);
/// assert!(scatter_sizes(5, 2, Some(&[1, 2])).is_err());
/// # Ok::<(), tensorcomm::Error>(())
/// ```
pub fn scatter_sizes(
    size: usize,
    devices: usize,
    chunk_sizes: Option<&[usize]>,
) -> Result<Vec<usize>> {
    const OP: &str = "scatter";
    if devices == 0 {
        return Err(arg_error(
            OP,
            "devices",
            None,
            "at least one device",
            "an empty list",
        ));
    }
    match chunk_sizes {
        Some(sizes) => {
            if sizes.len() != devices {
                return Err(arg_error(
                    OP,
                    "chunk_sizes",
                    None,
                    format!("one chunk size per device ({devices})"),
                    format!("{} chunk sizes", sizes.len()),
                ));
            }
            let total = sizes.iter().try_fold(0usize, |a, &s| a.checked_add(s));
            if total != Some(size) {
                return Err(arg_error(
                    OP,
                    "chunk_sizes",
                    None,
                    format!("sizes adding up to {size}, the size of the scattered dimension"),
                    format!("{sizes:?}"),
                ));
            }
            Ok(sizes.to_vec())
        }
        None if size == 0 => Ok(vec![0; devices]),
        None => {
            let each = size.div_ceil(devices);
            Ok((0..size)
                .step_by(each)
                .map(|s| each.min(size - s))
                .collect())
        }
    }
}

fn check_streams(
    op: &'static str,
    devices: &[usize],
    streams: Option<&[Option<Stream>]>,
) -> Result<()> {
    for (i, s) in streams.unwrap_or(&[]).iter().enumerate() {
        if let (Some(s), Some(&d)) = (s, devices.get(i)) {
            if s.device() != d {
                return Err(arg_error(
                    op,
                    "stream",
                    Some(i),
                    format!("a stream on cuda:{d} (the device at that index)"),
                    format!("a stream on cuda:{}", s.device()),
                ));
            }
        }
    }
    Ok(())
}

/// Splits `tensor` along `dim` (negative counts from the end) and sends
/// piece `i` to `devices[i]`. Without `chunk_sizes` the pieces are even as
/// with `chunk` (so there may be fewer pieces than devices); with them,
/// there must be one size per device adding up to the dimension's size. A
/// piece for the tensor's own device is a view (no copy); the others keep
/// the piece's layout (channels-last stays channels-last). Copies to device
/// `i` run on `streams[i]` when given (it must be on that device).
///
/// ```no_run
/// use tensorcomm::cuda::comm::scatter;
/// use tensorcomm::tensor::{Device, Tensor};
/// let x = Tensor::from_vec((0..6i64).collect(), &[3, 2])?.to_device(Device::Cuda(0))?;
/// let parts = scatter(&x, &[0, 1], None, 0, None)?;
/// assert_eq!(parts[0].shape(), &[2, 2]);
/// assert!(parts[0].shares_storage(&x));
/// assert_eq!(parts[1].to_vec::<i64>()?, [4, 5]);
/// # Ok::<(), tensorcomm::Error>(())
/// ```
pub fn scatter<'a>(
    tensor: &Tensor<'a>,
    devices: &[i64],
    chunk_sizes: Option<&[usize]>,
    dim: i64,
    streams: Option<&[Option<Stream>]>,
) -> Result<Vec<Tensor<'a>>> {
    const OP: &str = "scatter";
    let devices = check_devices(OP, devices)?;
    let d = wrap(OP, dim, tensor.dim())?;
    let sizes = scatter_sizes(tensor.shape()[d], devices.len(), chunk_sizes)?;
    check_streams(OP, &devices, streams)?;
    let chunks = tensor.split_sizes(&sizes, d as i64)?;
    let mut outs = Vec::with_capacity(chunks.len());
    let mut copies = Vec::new();
    for (chunk, &dev) in chunks.iter().zip(&devices) {
        if tensor.device() == Device::Cuda(dev) {
            outs.push(chunk.clone());
        } else {
            let out = output_like(chunk, Device::Cuda(dev))?;
            copies.push((out.clone(), chunk.clone()));
            outs.push(out);
        }
    }
    let pairs: Vec<(&Tensor<'_>, &Tensor<'_>)> = copies.iter().map(|(o, c)| (o, c)).collect();
    copy_pairs(&pairs, &|dev| stream_for(&devices, streams, dev))?;
    Ok(outs)
}

/// Like [`scatter`], into existing CUDA tensors: piece `i` of `tensor`
/// along `dim` (sized like `outs[i]`) is copied into `outs[i]`. The outputs
/// must match the tensor's shape except along `dim`, where their sizes must
/// add up to the tensor's.
///
/// ```no_run
/// use tensorcomm::cuda::comm::scatter_out;
/// use tensorcomm::tensor::{DType, Device, Tensor};
/// let x = Tensor::from_vec((0..6i32).collect(), &[6])?;
/// let outs = [Tensor::zeros_on(&[4], DType::I32, Device::Cuda(0))?, Tensor::zeros_on(&[2], DType::I32, Device::Cuda(1))?];
/// scatter_out(&x, &outs, 0, None)?;
/// assert_eq!(outs[1].to_vec::<i32>()?, [4, 5]);
/// # Ok::<(), tensorcomm::Error>(())
/// ```
pub fn scatter_out(
    tensor: &Tensor<'_>,
    outs: &[Tensor<'_>],
    dim: i64,
    streams: Option<&[Option<Stream>]>,
) -> Result<()> {
    const OP: &str = "scatter_out";
    if outs.is_empty() {
        return Err(arg_error(
            OP,
            "outs",
            None,
            "at least one output tensor",
            "an empty list",
        ));
    }
    let d = wrap(OP, dim, tensor.dim())?;
    let mut devices = Vec::with_capacity(outs.len());
    let mut sizes = Vec::with_capacity(outs.len());
    let mut total = 0usize;
    for (i, out) in outs.iter().enumerate() {
        devices.push(cuda_ordinal(OP, "output tensor", i, out)?);
        let mut expected = tensor.shape().to_vec();
        if out.dim() == expected.len() {
            expected[d] = out.shape()[d];
        }
        if out.shape() != expected.as_slice() {
            return Err(arg_error(
                OP,
                "output tensor",
                Some(i),
                format!("shape {expected:?} (the source's except along dim {d})"),
                format!("shape {:?}", out.shape()),
            ));
        }
        if out.dtype() != tensor.dtype() {
            return Err(arg_error(
                OP,
                "output tensor",
                Some(i),
                format!("dtype {}", tensor.dtype()),
                format!("dtype {}", out.dtype()),
            ));
        }
        sizes.push(out.shape()[d]);
        total += out.shape()[d];
    }
    if total != tensor.shape()[d] {
        return Err(arg_error(
            OP,
            "outs",
            None,
            format!("sizes along dim {d} adding up to {}", tensor.shape()[d]),
            format!("{sizes:?} (total {total})"),
        ));
    }
    check_streams(OP, &devices, streams)?;
    let chunks = tensor.split_sizes(&sizes, d as i64)?;
    let pairs: Vec<(&Tensor<'_>, &Tensor<'_>)> = outs.iter().zip(&chunks).collect();
    copy_pairs(&pairs, &|dev| stream_for(&devices, streams, dev))
}

/// The user's stream for copies to device `dev`, if one was given.
fn stream_for(devices: &[usize], streams: Option<&[Option<Stream>]>, dev: usize) -> Option<Stream> {
    let streams = streams?;
    devices
        .iter()
        .zip(streams)
        .find(|(d, s)| **d == dev && s.is_some())
        .and_then(|(_, s)| s.clone())
}

fn wrap(op: &'static str, dim: i64, ndim: usize) -> Result<usize> {
    let n = ndim as i64;
    let w = if dim < 0 { dim + n } else { dim };
    if (0..n).contains(&w) {
        Ok(w as usize)
    } else {
        Err(Error::CommArgument {
            op,
            what: "dim".into(),
            index: None,
            expected: format!("a dimension in {} ..= {}", -n, n - 1),
            found: dim.to_string(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tensor::DType;

    #[test]
    fn chunk_sizes_follow_pytorch() {
        assert_eq!(scatter_sizes(10, 3, None).unwrap(), [4, 4, 2]);
        assert_eq!(scatter_sizes(4, 4, None).unwrap(), [1, 1, 1, 1]);
        assert_eq!(scatter_sizes(2, 5, None).unwrap(), [1, 1]);
        assert_eq!(scatter_sizes(0, 3, None).unwrap(), [0, 0, 0]);
        assert_eq!(scatter_sizes(7, 2, Some(&[0, 7])).unwrap(), [0, 7]);
        match scatter_sizes(7, 2, Some(&[1, 2, 4])) {
            Err(e) => assert!(
                e.to_string().contains("one chunk size per device (2)")
                    && e.to_string().contains("found 3 chunk sizes"),
                "{e}"
            ),
            Ok(v) => panic!("{v:?}"),
        }
        match scatter_sizes(7, 2, Some(&[3, 3])) {
            Err(e) => assert!(
                e.to_string().contains("adding up to 7") && e.to_string().contains("[3, 3]"),
                "{e}"
            ),
            Ok(v) => panic!("{v:?}"),
        }
        assert!(scatter_sizes(7, 0, None).is_err());
        assert!(scatter_sizes(usize::MAX, 2, Some(&[usize::MAX, 1])).is_err());
    }

    #[test]
    fn scatter_checks_dim_devices_and_sizes_without_a_gpu() {
        let t = Tensor::zeros(&[4, 2], DType::F32).unwrap();
        assert!(
            matches!(scatter(&t, &[0, 1], None, 2, None), Err(Error::CommArgument { what, .. }) if what == "dim")
        );
        assert!(matches!(
            scatter(&t, &[0, -3], None, 0, None),
            Err(Error::CommArgument { index: Some(1), .. })
        ));
        assert!(
            matches!(scatter(&t, &[0, 1], Some(&[1, 1]), -2, None), Err(Error::CommArgument { what, .. }) if what == "chunk_sizes")
        );
        let host_out = Tensor::zeros(&[2, 2], DType::F32).unwrap();
        assert!(matches!(
            scatter_out(&t, &[host_out], 0, None),
            Err(Error::CommArgument { index: Some(0), .. })
        ));
    }
}
