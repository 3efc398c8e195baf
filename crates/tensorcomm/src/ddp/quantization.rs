//! Per-tensor uint8 quantization hook: each rank sends its bucket as
//! 8-bit codes with its own scale and zero point (c10d's
//! `quantization_pertensor_hook`).

use std::sync::Arc;

use super::flat_buffer::{read_floats, settle, write_floats, zeros_on};
use super::{CommHook, GradBucket};
use crate::group::{ProcessGroup, WorkFuture};
use crate::tensor::{DType, Tensor};
use crate::Result;

/// Averages each bucket over the ranks through uint8 codes: every rank
/// computes a scale and zero point from its bucket's range (PyTorch's
/// `MinMaxObserver` for `quint8`: the range widened to include 0, scale
/// `(max - min) / 255` at least f32 epsilon, zero point `-round(min /
/// scale)`), quantizes (`clamp(round(x / scale) + zero_point, 0, 255)`,
/// ties to even), and all-gathers the scales and zero points and the codes
/// (two collectives started at once). Each rank then dequantizes every
/// rank's codes (`(q - zero_point) * scale`, in f32), sums them in rank
/// order and divides by the world size. Sends a quarter of an f32 bucket's
/// bytes; the error per element is up to half a rank's scale.
///
/// ```
/// use tensorcomm::ddp::{CommHook, GradBucket, QuantizePerTensorHook};
/// use tensorcomm::tensor::Tensor;
///
/// let pg = tensorcomm::init_process_group(tensorcomm::Backend::Cpu, "tcp://127.0.0.1:0?rank=0&world_size=1")?;
/// let bucket = GradBucket::new(0, 1, Tensor::from_vec(vec![0.0f32, 2.55, 1.0], &[3])?, vec![vec![3]], vec![0])?;
/// let out = QuantizePerTensorHook.run(&pg, bucket)?.wait()?.to_vec::<f32>()?;
/// assert!(out.iter().zip([0.0, 2.55, 1.0]).all(|(a, b)| (a - b).abs() <= 0.005 + 1e-6));
/// # Ok::<(), tensorcomm::Error>(())
/// ```
#[derive(Clone, Copy, Debug, Default)]
pub struct QuantizePerTensorHook;

/// PyTorch's `quint8` range.
const QMAX: f32 = 255.0;

/// The scale and zero point of `values` (PyTorch's `MinMaxObserver`).
pub(crate) fn qparams(values: &[f32]) -> (f32, f32) {
    let min = values.iter().copied().fold(0.0f32, f32::min);
    let max = values.iter().copied().fold(0.0f32, f32::max);
    let scale = ((max - min) / QMAX).max(f32::EPSILON);
    let zero_point = (-(min / scale).round_ties_even()).clamp(0.0, QMAX);
    (scale, zero_point)
}

/// `clamp(round(x / scale) + zero_point, 0, 255)` as a byte.
pub(crate) fn quantize(x: f32, scale: f32, zero_point: f32) -> u8 {
    ((x / scale).round_ties_even() + zero_point).clamp(0.0, QMAX) as u8
}

/// `(q - zero_point) * scale`.
pub(crate) fn dequantize(q: u8, scale: f32, zero_point: f32) -> f32 {
    (f32::from(q) - zero_point) * scale
}

impl CommHook for QuantizePerTensorHook {
    fn run(
        &self,
        group: &Arc<dyn ProcessGroup>,
        bucket: GradBucket,
    ) -> Result<WorkFuture<Tensor<'static>>> {
        let context = "QuantizePerTensorHook";
        let buffer = bucket.buffer().clone();
        let values: Vec<f32> = read_floats(&buffer, context)?
            .into_iter()
            .map(|v| v as f32)
            .collect();
        let (scale, zero_point) = qparams(&values);
        let codes: Vec<u8> = values
            .iter()
            .map(|&x| quantize(x, scale, zero_point))
            .collect();
        let (world, n) = (group.size(), values.len());
        // The messages live where the bucket does (a NCCL group takes only
        // CUDA tensors); the maths stays on the host.
        let device = buffer.device();
        let my_params = Tensor::from_vec(vec![scale, zero_point], &[2])?.into_device(device)?;
        let all_params = zeros_on(2 * world, DType::F32, device)?;
        let my_codes = Tensor::from_vec(codes, &[n])?.into_device(device)?;
        let all_codes = zeros_on(world * n, DType::U8, device)?;
        let params_work = group.all_gather_into_tensor(&all_params, &my_params, None)?;
        let codes_work = group.all_gather_into_tensor(&all_codes, &my_codes, None)?;
        Ok(codes_work.get_future().then(move |done| {
            done?;
            // Collectives of a group finish in call order: this returns at
            // once on the host; on a GPU it waits for both gathers' copies.
            params_work.synchronize()?;
            settle(&all_codes)?;
            let params = all_params.to_vec::<f32>()?;
            let codes = all_codes.to_vec::<u8>()?;
            let mut sum = vec![0.0f32; n];
            for (r, rank_codes) in codes.chunks(n.max(1)).take(world).enumerate() {
                let (s, z) = (params[2 * r], params[2 * r + 1]);
                for (acc, &q) in sum.iter_mut().zip(rank_codes) {
                    *acc += dequantize(q, s, z);
                }
            }
            let mean: Vec<f64> = sum.iter().map(|&v| f64::from(v / world as f32)).collect();
            write_floats(&buffer, &mean, context)?;
            Ok(buffer)
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn qparams_follow_min_max_observer() {
        // Range widened to include 0: [0, 2.55] gives scale 0.01, zero point 0.
        let (s, z) = qparams(&[0.5, 2.55]);
        assert_eq!((s, z), (2.55 / 255.0, 0.0));
        // [-1, 1]: scale 2/255 (rounded up in f32), so 1 / scale is just
        // below 127.5 and the zero point is 127, as in f32 PyTorch.
        let (s, z) = qparams(&[-1.0, 1.0]);
        assert_eq!((s, z), (2.0 / 255.0, 127.0));
        assert_eq!(quantize(1.0, s, z), 254);
        assert_eq!(quantize(-1.0, s, z), 0);
        assert_eq!(quantize(5.0, s, z), 255); // clamped
        assert!((dequantize(quantize(0.3, s, z), s, z) - 0.3).abs() <= s / 2.0);
        // All zeros: scale is epsilon, not zero.
        assert_eq!(qparams(&[0.0, 0.0]), (f32::EPSILON, 0.0));
    }
}
