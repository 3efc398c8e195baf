//! Grouping tensors into size-limited buckets: c10d's
//! `compute_bucket_assignment_by_size`.

use std::collections::HashMap;

use super::TensorSpec;
use crate::tensor::{DType, Device};
use crate::{Error, Result};

/// DDP's limit for the first bucket (c10d's `_DEFAULT_FIRST_BUCKET_BYTES`):
/// small, so that communication starts early in the backward pass.
pub const DEFAULT_FIRST_BUCKET_BYTES: usize = 1024 * 1024;

/// DDP's limit for every later bucket (`bucket_cap_mb=25`).
pub const DEFAULT_BUCKET_BYTES: usize = 25 * 1024 * 1024;

/// Buckets of tensor indices and the size limit each was filled against,
/// from [`compute_bucket_assignment_by_size`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BucketAssignment {
    /// Each bucket's tensor indices, in the order the tensors were visited.
    pub buckets: Vec<Vec<usize>>,
    /// The byte limit each bucket was filled against (0 for a bucket of
    /// its own given to a tensor that expects a sparse gradient).
    pub size_limits: Vec<usize>,
}

/// Groups `tensors` into buckets, with the semantics of c10d's
/// `compute_bucket_assignment_by_size`.
///
/// - Tensors go into buckets by (dtype, device): a bucket only holds one
///   kind.
/// - Each (dtype, device) walks through `size_limits` on its own: a bucket
///   closes as soon as its bytes reach the current limit, and that kind
///   moves to the next limit; the last limit repeats. The last, unfilled
///   bucket of each kind closes at the end (in the order the kinds were
///   first seen).
/// - A tensor whose `expect_sparse_gradient` entry is true gets a bucket of
///   its own (reported limit 0). `expect_sparse_gradient` is empty or has
///   one entry per tensor index.
/// - `tensor_indices` empty: tensor `i` has index `i`, and the buckets are
///   sorted by their smallest index. Otherwise `tensors[i]` has index
///   `tensor_indices[i]` and the buckets keep the order they closed in
///   (the given order is the order gradients become ready).
///
/// ```
/// use tensorcomm::ddp::{compute_bucket_assignment_by_size, TensorSpec};
/// use tensorcomm::tensor::DType;
///
/// // Four f32 tensors of 40 bytes, limits 50 then 100 bytes.
/// let tensors = vec![TensorSpec::new(&[10], DType::F32); 4];
/// let a = compute_bucket_assignment_by_size(&tensors, &[50, 100], &[], &[])?;
/// assert_eq!(a.buckets, [vec![0, 1], vec![2, 3]]);
/// assert_eq!(a.size_limits, [50, 100]);
/// # Ok::<(), tensorcomm::Error>(())
/// ```
pub fn compute_bucket_assignment_by_size(
    tensors: &[TensorSpec],
    size_limits: &[usize],
    expect_sparse_gradient: &[bool],
    tensor_indices: &[usize],
) -> Result<BucketAssignment> {
    check_arguments(tensors, size_limits, expect_sparse_gradient, tensor_indices)?;
    let mut closed: Vec<(Vec<usize>, usize)> = Vec::new();
    let mut open: HashMap<(DType, Device), Open> = HashMap::new();
    let mut kinds: Vec<(DType, Device)> = Vec::new();
    for (i, tensor) in tensors.iter().enumerate() {
        let index = tensor_indices.get(i).copied().unwrap_or(i);
        if expect_sparse_gradient.get(index).copied().unwrap_or(false) {
            closed.push((vec![index], 0));
            continue;
        }
        let key = (tensor.dtype, tensor.device);
        let bucket = open.entry(key).or_insert_with(|| {
            kinds.push(key);
            Open::default()
        });
        bucket.indices.push(index);
        bucket.bytes += tensor.nbytes();
        let limit = size_limits[bucket.limit.min(size_limits.len() - 1)];
        if bucket.bytes >= limit {
            closed.push((std::mem::take(&mut bucket.indices), limit));
            bucket.bytes = 0;
            bucket.limit += 1;
        }
    }
    for key in kinds {
        let bucket = &open[&key];
        if !bucket.indices.is_empty() {
            let limit = size_limits[bucket.limit.min(size_limits.len() - 1)];
            closed.push((bucket.indices.clone(), limit));
        }
    }
    if tensor_indices.is_empty() {
        // Every bucket is non-empty, so each has a smallest index.
        closed.sort_by_key(|(indices, _)| indices.iter().min().copied());
    }
    let (buckets, size_limits) = closed.into_iter().unzip();
    Ok(BucketAssignment {
        buckets,
        size_limits,
    })
}

/// The bucket of one (dtype, device) being filled.
#[derive(Default)]
struct Open {
    indices: Vec<usize>,
    bytes: usize,
    /// Position in the size limits (the last one repeats).
    limit: usize,
}

fn check_arguments(
    tensors: &[TensorSpec],
    size_limits: &[usize],
    expect_sparse_gradient: &[bool],
    tensor_indices: &[usize],
) -> Result<()> {
    let bad = |what: &str| {
        Err(Error::InvalidArgument(format!(
            "compute_bucket_assignment_by_size: {what}"
        )))
    };
    if size_limits.is_empty() {
        return bad("expected at least one bucket size limit, found none");
    }
    if !tensor_indices.is_empty() {
        if tensor_indices.len() != tensors.len() {
            return bad(&format!(
                "expected one tensor index per tensor ({}), found {}",
                tensors.len(),
                tensor_indices.len()
            ));
        }
        let mut seen = vec![false; tensors.len()];
        for &index in tensor_indices {
            if index >= tensors.len() || std::mem::replace(&mut seen[index], true) {
                return bad(&format!(
                    "expected tensor_indices to be a permutation of 0..{}, found {tensor_indices:?}",
                    tensors.len()
                ));
            }
        }
    }
    if !expect_sparse_gradient.is_empty() && expect_sparse_gradient.len() != tensors.len() {
        return bad(&format!(
            "expected expect_sparse_gradient to be empty or have one entry per tensor ({}), found {}",
            tensors.len(),
            expect_sparse_gradient.len()
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f32s(numels: &[usize]) -> Vec<TensorSpec> {
        numels
            .iter()
            .map(|&n| TensorSpec::new(&[n], DType::F32))
            .collect()
    }

    #[test]
    fn one_limit_closes_when_reached() {
        // 16, 16, 32, 8, 8 bytes against 32: [0,1] reaches 32, [2] is 32
        // alone, [3,4] is left open at 16.
        let a =
            compute_bucket_assignment_by_size(&f32s(&[4, 4, 8, 2, 2]), &[32], &[], &[]).unwrap();
        assert_eq!(a.buckets, [vec![0, 1], vec![2], vec![3, 4]]);
        assert_eq!(a.size_limits, [32, 32, 32]);
    }

    #[test]
    fn limits_advance_per_kind_and_the_last_repeats() {
        // f32 tensors of 8 bytes and f64 tensors of 16 bytes interleaved,
        // limits 8, 24 (repeating). f32: [0] (8 >= 8), then [2,4,6] (24),
        // then [8] open. f64: [1] (16 >= 8), then [3,5] (32 >= 24), [7] open.
        let mut tensors = Vec::new();
        for i in 0..9 {
            if i % 2 == 0 {
                tensors.push(TensorSpec::new(&[2], DType::F32));
            } else {
                tensors.push(TensorSpec::new(&[2], DType::F64));
            }
        }
        let a = compute_bucket_assignment_by_size(&tensors, &[8, 24], &[], &[]).unwrap();
        assert_eq!(
            a.buckets,
            [
                vec![0],
                vec![1],
                vec![2, 4, 6],
                vec![3, 5],
                vec![7],
                vec![8]
            ]
        );
        assert_eq!(a.size_limits, [8, 8, 24, 24, 24, 24]);
    }

    #[test]
    fn devices_are_separate_kinds() {
        let tensors = vec![
            TensorSpec::new(&[4], DType::F32),
            TensorSpec::new(&[4], DType::F32).on(Device::Cuda(0)),
            TensorSpec::new(&[4], DType::F32),
        ];
        let a = compute_bucket_assignment_by_size(&tensors, &[1000], &[], &[]).unwrap();
        assert_eq!(a.buckets, [vec![0, 2], vec![1]]);
        assert_eq!(a.size_limits, [1000, 1000]);
    }

    #[test]
    fn sparse_expectations_get_their_own_bucket() {
        let a = compute_bucket_assignment_by_size(
            &f32s(&[1, 1, 1, 1]),
            &[1000],
            &[false, true, false, true],
            &[],
        )
        .unwrap();
        assert_eq!(a.buckets, [vec![0, 2], vec![1], vec![3]]);
        assert_eq!(a.size_limits, [1000, 0, 0]);
    }

    #[test]
    fn explicit_order_keeps_closing_order() {
        // tensors[i] has index tensor_indices[i]: sizes by index are
        // 0:16 1:8 2:8 3:16 bytes; visited as 3, 2, 1, 0 against 24.
        // Index 3 (16) + 2 (8) = 24 closes; 1 (8) + 0 (16) = 24 closes.
        let tensors = f32s(&[4, 2, 2, 4]); // tensors in the given order
        let a = compute_bucket_assignment_by_size(&tensors, &[24], &[], &[3, 2, 1, 0]).unwrap();
        assert_eq!(a.buckets, [vec![3, 2], vec![1, 0]]);
        // The sparse expectation is looked up by tensor index, not position.
        let a = compute_bucket_assignment_by_size(
            &tensors,
            &[24],
            &[false, false, false, true],
            &[3, 2, 1, 0],
        )
        .unwrap();
        assert_eq!(a.buckets, [vec![3], vec![2, 1, 0]]);
        assert_eq!(a.size_limits, [0, 24]);
    }

    #[test]
    fn ddp_defaults_put_one_mib_first() {
        // 64 tensors of 256 KiB: 4 fill the first MiB, then 100 per 25 MiB.
        let tensors = f32s(&[64 * 1024; 64]);
        let a = compute_bucket_assignment_by_size(
            &tensors,
            &[DEFAULT_FIRST_BUCKET_BYTES, DEFAULT_BUCKET_BYTES],
            &[],
            &[],
        )
        .unwrap();
        assert_eq!(a.buckets[0], [0, 1, 2, 3]);
        assert_eq!(a.buckets[1], (4..64).collect::<Vec<_>>());
        assert_eq!(
            a.size_limits,
            [DEFAULT_FIRST_BUCKET_BYTES, DEFAULT_BUCKET_BYTES]
        );
    }

    #[test]
    fn bad_arguments_are_named() {
        let t = f32s(&[1, 1]);
        let e = compute_bucket_assignment_by_size(&t, &[], &[], &[]).unwrap_err();
        assert!(
            e.to_string().contains("at least one bucket size limit"),
            "{e}"
        );
        let e = compute_bucket_assignment_by_size(&t, &[8], &[true], &[]).unwrap_err();
        assert!(
            e.to_string().contains("one entry per tensor (2), found 1"),
            "{e}"
        );
        let e = compute_bucket_assignment_by_size(&t, &[8], &[], &[1, 1]).unwrap_err();
        assert!(e.to_string().contains("permutation of 0..2"), "{e}");
    }
}
