//! Checking at construction that every rank built its Reducer from the
//! same parameters: each rank's count and digest, gathered from all ranks.

use std::sync::Arc;

use crate::ddp::flat_buffer::zeros_on;
use crate::ddp::TensorSpec;
use crate::group::ProcessGroup;
use crate::tensor::{DType, Device, Tensor};
use crate::{Error, Result};

/// Gathers every rank's parameter count and digest and fails with
/// [`Error::ParamsMismatch`] naming the first rank whose differ. The
/// messages are tensors on `device`.
pub(super) fn check_same_params(
    group: &Arc<dyn ProcessGroup>,
    params: &[TensorSpec],
    device: Device,
) -> Result<()> {
    let mine = [params.len() as i64, digest(params) as i64];
    let input = Tensor::from_vec(mine.to_vec(), &[2])?.into_device(device)?;
    let all = zeros_on(2 * group.size(), DType::I64, device)?;
    group
        .all_gather_into_tensor(&all, &input, None)?
        .synchronize()?;
    let all = all.to_vec::<i64>()?;
    for (peer, theirs) in all.chunks(2).enumerate() {
        if theirs != mine {
            return Err(Error::ParamsMismatch {
                rank: group.rank(),
                peer,
                mine: describe(mine),
                theirs: describe([theirs[0], theirs[1]]),
            });
        }
    }
    Ok(())
}

fn describe([count, digest]: [i64; 2]) -> String {
    format!(
        "{count} parameters (shapes, dtypes and device kinds digest {:016x})",
        digest as u64
    )
}

/// FNV-1a over each parameter's shape, dtype and device kind (host or
/// CUDA: ranks of a NCCL group each have their own GPU, so the ordinal may
/// differ): the same on every process and build, unlike `std`'s hasher.
fn digest(params: &[TensorSpec]) -> u64 {
    let mut hash = 0xcbf2_9ce4_8422_2325u64;
    for spec in params {
        let kind = if spec.device.is_cpu() { "cpu" } else { "cuda" };
        for byte in format!("{}{:?} on {kind};", spec.dtype, spec.shape).bytes() {
            hash ^= u64::from(byte);
            hash = hash.wrapping_mul(0x0100_0000_01b3);
        }
    }
    hash
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn digest_sees_shape_dtype_and_order() {
        let a = TensorSpec::new(&[2, 3], DType::F32);
        let b = TensorSpec::new(&[3, 2], DType::F32);
        let c = TensorSpec::new(&[2, 3], DType::F64);
        let base = digest(&[a.clone(), b.clone()]);
        assert_eq!(base, digest(&[a.clone(), b.clone()]));
        assert_ne!(base, digest(&[b.clone(), a.clone()]));
        assert_ne!(base, digest(&[c, b.clone()]));
        // The device kind counts, the GPU ordinal does not.
        let on = |d: usize| vec![a.clone().on(Device::Cuda(d)), b.clone().on(Device::Cuda(d))];
        assert_ne!(base, digest(&on(0)));
        assert_eq!(digest(&on(0)), digest(&on(1)));
    }
}
