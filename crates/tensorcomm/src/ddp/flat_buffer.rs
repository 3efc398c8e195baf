//! Flat buffers: allocating one on a tensor's device, viewing a slice of it
//! as a tensor's shape, and element-wise float maths on it (scaling,
//! casting between float dtypes, zeroing) for the communication hooks.
//!
//! The maths runs on the host: a CUDA tensor's elements make a round trip
//! (copied to the host, computed there, copied back), so every hook gives
//! the same values on CUDA buckets as on host ones.

use half::{bf16, f16};

use crate::tensor::{DType, Device, Tensor};
use crate::{Error, Result};

/// A zeroed one-dimensional tensor of `numel` elements on `device`.
pub(crate) fn zeros_on(numel: usize, dtype: DType, device: Device) -> Result<Tensor<'static>> {
    match device {
        Device::Cpu => Tensor::zeros(&[numel], dtype),
        #[cfg(feature = "cuda")]
        Device::Cuda(_) => Tensor::zeros_on(&[numel], dtype, device),
        #[cfg(not(feature = "cuda"))]
        Device::Cuda(_) => Err(Error::NoCuda {
            reason: "tensorcomm was built without the `cuda` feature".into(),
        }),
    }
}

/// Sets every element of `t` to zero, on the host or on a GPU (through a
/// copy of host zeros: [`Tensor::fill_zeros`] reaches host memory only).
pub(crate) fn zero_fill(t: &Tensor<'_>) -> Result<()> {
    if t.device().is_cpu() {
        t.fill_zeros()
    } else {
        t.copy_from(&Tensor::zeros(t.shape(), t.dtype())?)
    }
}

/// Copies `src` into `dst`, unless `src` is `dst` itself (the same
/// storage, dtype and layout: a gradient written straight into its bucket
/// view). Then nothing is copied; for a CUDA tensor the host only waits,
/// as the copy would have, for the calling thread's work on its GPU (the
/// work that wrote it), so a GPU buffer is never copied onto itself.
/// A large host copy is split across up to `threads` threads (see
/// `Tensor::copy_from_split`).
pub(crate) fn copy_unless_same(dst: &Tensor<'_>, src: &Tensor<'_>, threads: usize) -> Result<()> {
    let same = dst.shares_storage(src)
        && dst.dtype() == src.dtype()
        && dst.device() == src.device()
        && dst.layout() == src.layout();
    if same {
        return settle(dst);
    }
    dst.copy_from_split(src, threads).map(|_| ())
}

/// The elements `offset..offset + numel(shape)` of the flat `buffer`,
/// viewed with `shape`.
pub(crate) fn view_of<'a>(
    buffer: &Tensor<'a>,
    offset: usize,
    shape: &[usize],
) -> Result<Tensor<'a>> {
    let numel = shape.iter().product();
    buffer.narrow(0, offset, numel)?.view(shape)
}

/// Blocks the host until the work queued on the calling thread's current
/// stream of `t`'s GPU is done; nothing for a host tensor. Inside a
/// [`WorkFuture::then`](crate::group::WorkFuture::then) callback that
/// includes the collective whose value the callback got (the callback
/// runs once the current stream waits for it), so the host may then read
/// the tensor: tensor copies run on the device's own stream, which is not
/// ordered after the current one.
pub(crate) fn settle(t: &Tensor<'_>) -> Result<()> {
    match t.device() {
        Device::Cpu => Ok(()),
        #[cfg(feature = "cuda")]
        Device::Cuda(gpu) => crate::cuda::runtime::current_stream(gpu)?.synchronize(),
        #[cfg(not(feature = "cuda"))]
        Device::Cuda(_) => Ok(()),
    }
}

/// The elements of a float tensor, widened to f64 (exactly). A CUDA
/// tensor is read after the calling thread's current stream is done (see
/// [`settle`]).
pub(crate) fn read_floats(t: &Tensor<'_>, context: &str) -> Result<Vec<f64>> {
    settle(t)?;
    Ok(match t.dtype() {
        DType::F64 => t.to_vec::<f64>()?,
        DType::F32 => t.to_vec::<f32>()?.into_iter().map(f64::from).collect(),
        DType::F16 => t.to_vec::<f16>()?.into_iter().map(f64::from).collect(),
        DType::BF16 => t.to_vec::<bf16>()?.into_iter().map(f64::from).collect(),
        other => return Err(not_float(context, other)),
    })
}

/// Writes `values` into the float tensor `t`, each rounded once to its
/// dtype (round to nearest even).
pub(crate) fn write_floats(t: &Tensor<'_>, values: &[f64], context: &str) -> Result<()> {
    let shape = t.shape().to_vec();
    let src = match t.dtype() {
        DType::F64 => Tensor::from_vec(values.to_vec(), &shape)?,
        DType::F32 => Tensor::from_vec(values.iter().map(|&v| v as f32).collect(), &shape)?,
        DType::F16 => Tensor::from_vec(values.iter().map(|&v| f16::from_f64(v)).collect(), &shape)?,
        DType::BF16 => {
            Tensor::from_vec(values.iter().map(|&v| bf16::from_f64(v)).collect(), &shape)?
        }
        other => return Err(not_float(context, other)),
    };
    if t.device().is_cpu() {
        t.copy_from(&src)
    } else {
        copy_from_host(t, &src)
    }
}

#[cfg(feature = "cuda")]
fn copy_from_host(t: &Tensor<'_>, src: &Tensor<'_>) -> Result<()> {
    t.copy_from(&src.to_device(t.device())?)
}

#[cfg(not(feature = "cuda"))]
fn copy_from_host(t: &Tensor<'_>, src: &Tensor<'_>) -> Result<()> {
    t.copy_from(src)
}

/// Divides every element of the float tensor `t` by `divisor` in place,
/// correctly rounded in `t`'s dtype (f64 division then one rounding is
/// exact for every float dtype here: f64 has more than twice their
/// precision plus two bits).
pub(crate) fn divide_in_place(t: &Tensor<'_>, divisor: f64, context: &str) -> Result<()> {
    // Dense host f32/f64 (the usual bucket): one pass in place over the
    // elements in memory order, the same arithmetic as below (f64 division,
    // one rounding).
    if t.device().is_cpu() && t.is_non_overlapping_and_dense() {
        match t.dtype() {
            // A divisor an f32 holds exactly (a world size): f32 division
            // rounds to the same bits as f64 division then rounding (f64
            // has more than 2 x 24 + 2 bits) and vectorizes, where f64
            // division per element took ~3x the memory's time.
            DType::F32 if f64::from(divisor as f32) == divisor => {
                let d = divisor as f32;
                return t.with_bytes_mut(|bytes| map_in_place::<f32>(bytes, |v| v / d));
            }
            DType::F32 => {
                return t.with_bytes_mut(|bytes| {
                    map_in_place::<f32>(bytes, |v| (f64::from(v) / divisor) as f32)
                })
            }
            DType::F64 => {
                return t.with_bytes_mut(|bytes| map_in_place::<f64>(bytes, |v| v / divisor))
            }
            _ => {}
        }
    }
    let values: Vec<f64> = read_floats(t, context)?
        .into_iter()
        .map(|v| v / divisor)
        .collect();
    write_floats(t, &values, context)
}

/// Applies `f` to every native-endian `T` in `bytes`, in place: as a
/// slice of `T` when the bytes are aligned for it (so the loop
/// vectorizes), else element by element.
fn map_in_place<T: bytemuck::Pod>(bytes: &mut [u8], f: impl Fn(T) -> T) {
    if let Ok(values) = bytemuck::try_cast_slice_mut::<u8, T>(bytes) {
        values.iter_mut().for_each(|v| *v = f(*v));
        return;
    }
    for c in bytes.chunks_exact_mut(std::mem::size_of::<T>()) {
        let v: T = bytemuck::pod_read_unaligned(c);
        c.copy_from_slice(bytemuck::bytes_of(&f(v)));
    }
}

/// Copies the float tensor `src` into the float tensor `dst` of the same
/// shape, converting between their dtypes (rounding to nearest even),
/// after the calling thread's current stream is done (see [`settle`]).
pub(crate) fn cast_into(dst: &Tensor<'_>, src: &Tensor<'_>, context: &str) -> Result<()> {
    settle(src)?;
    if dst.dtype() == src.dtype() {
        return dst.copy_from(src);
    }
    write_floats(dst, &read_floats(src, context)?, context)
}

fn not_float(context: &str, found: DType) -> Error {
    Error::DTypeMismatch {
        context: format!("{context}: expected a floating-point tensor (f32, f64, f16, bf16)"),
        expected: DType::F32,
        found,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn casts_round_to_nearest_and_divide_exactly() {
        let t = Tensor::from_vec(vec![1.0f32, 3.0, 1.0 / 3.0, 65520.0], &[4]).unwrap();
        let h = zeros_on(4, DType::F16, Device::Cpu).unwrap();
        cast_into(&h, &t, "test").unwrap();
        let expect: Vec<f16> = [1.0f32, 3.0, 1.0 / 3.0, 65520.0]
            .iter()
            .map(|&v| f16::from_f32(v))
            .collect();
        assert_eq!(h.to_vec::<f16>().unwrap(), expect);
        divide_in_place(&t, 3.0, "test").unwrap();
        assert_eq!(
            t.to_vec::<f32>().unwrap(),
            [1.0f32 / 3.0, 1.0, (1.0f32 / 3.0) / 3.0, 65520.0f32 / 3.0]
        );
        let ints = Tensor::from_vec(vec![1i32], &[1]).unwrap();
        let e = divide_in_place(&ints, 2.0, "all_reduce hook").unwrap_err();
        assert!(e.to_string().contains("all_reduce hook"), "{e}");
    }

    #[test]
    fn f32_division_gives_the_bits_of_f64_division_then_rounding() {
        // Values across the range (subnormals, huge, negative, specials)
        // and divisors that take each path: powers of two (multiplied by
        // the reciprocal), other world sizes (f32 division), and one an
        // f32 cannot hold (f64 division).
        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        let mut values: Vec<f32> = (0..4099)
            .map(|_| {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                f32::from_bits(state as u32)
            })
            .filter(|v| !v.is_nan())
            .collect();
        values.extend([
            0.0,
            -0.0,
            f32::MIN_POSITIVE,
            1e-45,
            f32::MAX,
            f32::INFINITY,
            1.0,
            3.0,
        ]);
        for divisor in [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 64.0, 0.1, -2.0] {
            let t = Tensor::from_vec(values.clone(), &[values.len()]).unwrap();
            divide_in_place(&t, divisor, "test").unwrap();
            let expect: Vec<u32> = values
                .iter()
                .map(|&v| ((f64::from(v) / divisor) as f32).to_bits())
                .collect();
            let got: Vec<u32> = t
                .to_vec::<f32>()
                .unwrap()
                .iter()
                .map(|v| v.to_bits())
                .collect();
            assert_eq!(got, expect, "divisor {divisor}");
        }
    }

    #[test]
    fn dividing_a_view_in_place_leaves_its_neighbours_alone() {
        for dtype in [DType::F32, DType::F64, DType::BF16] {
            let t = zeros_on(6, dtype, Device::Cpu).unwrap();
            write_floats(&t, &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0], "test").unwrap();
            let middle = t.narrow(0, 2, 3).unwrap();
            divide_in_place(&middle, 4.0, "test").unwrap();
            assert_eq!(
                read_floats(&t, "test").unwrap(),
                [1.0, 2.0, 0.75, 1.0, 1.25, 6.0],
                "{dtype}"
            );
        }
    }

    #[test]
    fn zeroing_and_moving_host_tensors_stay_on_the_host() {
        let t = Tensor::from_vec(vec![1.0f32, 2.0, 3.0, 4.0], &[4]).unwrap();
        zero_fill(&t.narrow(0, 1, 2).unwrap()).unwrap();
        assert_eq!(t.to_vec::<f32>().unwrap(), [1.0, 0.0, 0.0, 4.0]);
        let same = t.clone().into_device(Device::Cpu).unwrap();
        assert!(same.shares_storage(&t));
    }

    #[test]
    fn views_are_slices_of_the_buffer() {
        let buffer = Tensor::from_vec((0..10).map(|v| v as f32).collect(), &[10]).unwrap();
        let v = view_of(&buffer, 4, &[2, 3]).unwrap();
        assert_eq!(v.shape(), [2, 3]);
        assert_eq!(v.to_vec::<f32>().unwrap(), [4.0, 5.0, 6.0, 7.0, 8.0, 9.0]);
        v.fill(0.0f32).unwrap();
        assert_eq!(buffer.to_vec::<f32>().unwrap()[4..], [0.0; 6]);
    }
}
