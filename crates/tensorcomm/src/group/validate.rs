//! Argument checks every collective runs on the calling rank before
//! anything is sent or a sequence number is taken.

use crate::tensor::Tensor;
use crate::{Error, Result};

/// The tensor must be on the host and dense (contiguous or a permutation
/// of it, such as channels-last): its span of bytes is what travels.
pub(crate) fn check_dense_host(op: &str, tensor: &Tensor<'_>) -> Result<()> {
    if !tensor.device().is_cpu() {
        return Err(Error::InvalidCollective {
            op: op.into(),
            reason: format!("expected a host tensor, found one on {}", tensor.device()),
        });
    }
    if !tensor.is_non_overlapping_and_dense() {
        return Err(Error::InvalidCollective {
            op: op.into(),
            reason: format!(
                "expected a dense tensor (contiguous or permuted), found shape {:?} with strides {:?}",
                tensor.shape(),
                tensor.strides()
            ),
        });
    }
    Ok(())
}

/// `root` must be a rank of the group.
pub(crate) fn check_root(op: &str, root: usize, size: usize) -> Result<()> {
    if root >= size {
        return Err(Error::InvalidCollective {
            op: op.into(),
            reason: format!("expected a root rank in 0..{size}, found {root}"),
        });
    }
    Ok(())
}

/// `peer` must be another rank of the group (point-to-point calls).
pub(crate) fn check_peer_rank(op: &str, peer: usize, rank: usize, size: usize) -> Result<()> {
    if peer >= size || peer == rank {
        return Err(Error::InvalidCollective {
            op: op.into(),
            reason: format!(
                "expected a peer rank in 0..{size} other than this rank {rank}, found {peer}"
            ),
        });
    }
    Ok(())
}
