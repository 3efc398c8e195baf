//! Argument checks every collective runs on the calling rank before
//! anything is sent or a sequence number is taken.

use crate::tensor::{DType, Device, Tensor};
use crate::{Error, Result};

/// Which tensors a backend takes. Validation refuses the others with an
/// error naming the device found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Capabilities {
    /// Host tensors (pageable or pinned).
    pub(crate) host: bool,
    /// CUDA tensors.
    pub(crate) cuda: bool,
}

impl Capabilities {
    /// A backend of host tensors only (the CPU backend built without
    /// CUDA).
    #[cfg_attr(
        all(feature = "cuda", not(test)),
        allow(
            dead_code,
            reason = "the CPU group takes CUDA tensors too where CUDA is built in"
        )
    )]
    pub(crate) const HOST: Capabilities = Capabilities {
        host: true,
        cuda: false,
    };

    /// A backend of host and CUDA tensors (the CPU backend, which stages
    /// CUDA tensors through host memory).
    #[cfg(feature = "cuda")]
    pub(crate) const HOST_AND_CUDA: Capabilities = Capabilities {
        host: true,
        cuda: true,
    };

    /// True if a tensor on `device` may be passed.
    pub(crate) fn accepts(&self, device: Device) -> bool {
        if device.is_cpu() {
            self.host
        } else {
            self.cuda
        }
    }

    /// What a refused tensor should have been, for error messages.
    pub(crate) fn expected(&self) -> &'static str {
        match (self.host, self.cuda) {
            (true, true) => "a host or CUDA tensor",
            (false, true) => "a CUDA tensor",
            _ => "a host tensor",
        }
    }
}

/// Where a call is validated: this rank, the group's size and what its
/// backend takes.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Scope {
    pub(crate) rank: usize,
    pub(crate) size: usize,
    pub(crate) caps: Capabilities,
}

/// The tensor must be on a device the backend takes (`caps`) and dense
/// (contiguous or a permutation of it, such as channels-last): its span of
/// bytes is what travels.
pub(crate) fn check_dense(op: &str, tensor: &Tensor<'_>, caps: Capabilities) -> Result<()> {
    if !caps.accepts(tensor.device()) {
        return Err(Error::InvalidCollective {
            op: op.into(),
            reason: format!(
                "expected {}, found one on {}",
                caps.expected(),
                tensor.device()
            ),
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

/// A list of tensors must not be empty.
pub(crate) fn check_not_empty(op: &str, what: &str, len: usize) -> Result<()> {
    if len == 0 {
        return Err(Error::InvalidCollective {
            op: op.into(),
            reason: format!("expected at least one tensor in {what}, found an empty list"),
        });
    }
    Ok(())
}

/// A list with one entry per rank must have `size` entries.
pub(crate) fn check_per_rank(op: &str, what: &str, len: usize, size: usize) -> Result<()> {
    if len != size {
        return Err(Error::InvalidCollective {
            op: op.into(),
            reason: format!("expected {size} tensors in {what} (one per rank), found {len}"),
        });
    }
    Ok(())
}

/// `tensor` (named `what`, such as `output_tensors[2]`) must be a dense
/// tensor of `dtype` on a device of `caps`.
pub(crate) fn check_dtype_of(
    op: &str,
    what: &str,
    tensor: &Tensor<'_>,
    dtype: DType,
    caps: Capabilities,
) -> Result<()> {
    check_dense(op, tensor, caps)?;
    if tensor.dtype() != dtype {
        return Err(Error::DTypeMismatch {
            context: format!("{op}: {what}"),
            expected: dtype,
            found: tensor.dtype(),
        });
    }
    Ok(())
}

/// `tensor` (named `what`) must be a dense host tensor of `like`'s dtype
/// and shape.
pub(crate) fn check_like(
    op: &str,
    what: &str,
    tensor: &Tensor<'_>,
    like: &Tensor<'_>,
    caps: Capabilities,
) -> Result<()> {
    check_dtype_of(op, what, tensor, like.dtype(), caps)?;
    if tensor.shape() != like.shape() {
        return Err(Error::ShapeMismatch {
            context: format!("{op}: {what}"),
            expected: like.shape().to_vec(),
            found: tensor.shape().to_vec(),
        });
    }
    Ok(())
}

/// `big` (named `what`) must hold `size` tensors of `small`'s shape, either
/// concatenated along dim 0 or stacked along a new dim 0 (the two forms
/// c10d accepts for `all_gather_into_tensor` and `reduce_scatter_tensor`),
/// with `small`'s dtype.
pub(crate) fn check_gathered(
    op: &str,
    what: &str,
    big: &Tensor<'_>,
    small: &Tensor<'_>,
    size: usize,
    caps: Capabilities,
) -> Result<()> {
    check_dtype_of(op, what, big, small.dtype(), caps)?;
    let stacked: Vec<usize> = std::iter::once(size)
        .chain(small.shape().iter().copied())
        .collect();
    let concatenated = small.shape().split_first().map(|(d0, rest)| {
        std::iter::once(d0 * size)
            .chain(rest.iter().copied())
            .collect::<Vec<_>>()
    });
    if big.shape() == stacked.as_slice() || concatenated.as_deref() == Some(big.shape()) {
        return Ok(());
    }
    Err(Error::ShapeMismatch {
        context: format!("{op}: {what} must hold {size} tensors of shape {:?} (concatenated along dim 0, or stacked)", small.shape()),
        expected: concatenated.unwrap_or(stacked),
        found: big.shape().to_vec(),
    })
}

/// The rows of dim 0 of a tensor (`what`, `dim0` rows) that go to or come
/// from each of `size` ranks: `splits` when given, which must have `size`
/// entries summing to `dim0`; equal shares otherwise, which needs `dim0`
/// divisible by `size`.
pub(crate) fn split_rows(
    op: &str,
    what: &str,
    splits: &[usize],
    dim0: usize,
    size: usize,
) -> Result<Vec<usize>> {
    if splits.is_empty() {
        if !dim0.is_multiple_of(size) {
            return Err(Error::InvalidCollective {
                op: op.into(),
                reason: format!(
                    "expected dim 0 of {what} to be divisible by the world size {size} for equal splits, found {dim0}"
                ),
            });
        }
        return Ok(vec![dim0 / size; size]);
    }
    if splits.len() != size {
        return Err(Error::InvalidCollective {
            op: op.into(),
            reason: format!(
                "expected {size} split sizes for {what} (one per rank), found {}",
                splits.len()
            ),
        });
    }
    let total = splits.iter().try_fold(0usize, |acc, &s| acc.checked_add(s));
    if total != Some(dim0) {
        return Err(Error::InvalidCollective {
            op: op.into(),
            reason: format!(
                "expected the split sizes of {what} to sum to its dim 0 ({dim0}), found {splits:?}"
            ),
        });
    }
    Ok(splits.to_vec())
}
