//! Checking at construction that every rank built its Reducer from the
//! same parameters: each rank's count and digest, gathered from all ranks.

use std::sync::Arc;

use crate::ddp::TensorSpec;
use crate::group::ProcessGroup;
use crate::tensor::{DType, Tensor};
use crate::{Error, Result};

/// Gathers every rank's parameter count and digest and fails with
/// [`Error::ParamsMismatch`] naming the first rank whose differ.
pub(super) fn check_same_params(
    group: &Arc<dyn ProcessGroup>,
    params: &[TensorSpec],
) -> Result<()> {
    let mine = [params.len() as i64, digest(params) as i64];
    let input = Tensor::from_vec(mine.to_vec(), &[2])?;
    let all = Tensor::zeros(&[2 * group.size()], DType::I64)?;
    group.all_gather_into_tensor(&all, &input, None)?.wait()?;
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
        "{count} parameters (shapes, dtypes and devices digest {:016x})",
        digest as u64
    )
}

/// FNV-1a over each parameter's description: the same on every process
/// and build, unlike `std`'s hasher.
fn digest(params: &[TensorSpec]) -> u64 {
    let mut hash = 0xcbf2_9ce4_8422_2325u64;
    for spec in params {
        for byte in format!("{spec};").bytes() {
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
        assert_ne!(base, digest(&[c, b]));
    }
}
