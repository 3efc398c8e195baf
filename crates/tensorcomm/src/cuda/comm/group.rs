//! Grouping tensors into buckets (PyTorch's `take_tensors`).

use crate::tensor::{DType, Tensor};

/// Splits tensor indices into buckets of one dtype, in the order PyTorch's
/// `torch::utils::take_tensors` (not fine-grained) emits them: a dtype's
/// bucket is closed as soon as its size reaches `buffer_size` bytes (so it
/// may exceed it by its last tensor); the open buckets are emitted at the
/// end in PyTorch's dtype order (its `ScalarType` numbering: u8, i8, i32,
/// i64, f16, f32, f64, bool, bf16). Within a bucket, indices keep input
/// order.
///
/// ```
/// use tensorcomm::cuda::comm::take_tensors;
/// use tensorcomm::tensor::{DType, Tensor};
/// let ts = vec![
///     Tensor::zeros(&[4], DType::F32)?,  // 16 bytes
///     Tensor::zeros(&[4], DType::F64)?,  // 32 bytes: reaches 20 at once
///     Tensor::zeros(&[2], DType::F32)?,  //  8 bytes: f32 bucket reaches 24 >= 20
///     Tensor::zeros(&[1], DType::F32)?,
/// ];
/// // The f64 tensor fills its bucket first, then the f32 bucket closes.
/// assert_eq!(take_tensors(&ts, 20), vec![vec![1], vec![0, 2], vec![3]]);
/// # Ok::<(), tensorcomm::Error>(())
/// ```
pub fn take_tensors(tensors: &[Tensor<'_>], buffer_size: usize) -> Vec<Vec<usize>> {
    let specs: Vec<(DType, usize)> = tensors.iter().map(|t| (t.dtype(), t.nbytes())).collect();
    take_specs(&specs, buffer_size)
}

/// What a bucket holds: tensors of one dtype, all dense or all sparse
/// (PyTorch groups by tensor type, which tells the two apart).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Kind {
    pub sparse: bool,
    pub dtype: DType,
}

impl Kind {
    pub(crate) fn dense(dtype: DType) -> Kind {
        Kind {
            sparse: false,
            dtype,
        }
    }
}

/// The number of `dtype` in PyTorch's `ScalarType` enum: `take_tensors`
/// keeps its open buckets in a map keyed by backend and this number, and
/// emits them in that order (u8, i8, i32, i64, f16, f32, f64, bool, bf16).
fn torch_scalar_type(dtype: DType) -> u8 {
    match dtype {
        DType::U8 => 0,
        DType::I8 => 1,
        DType::I32 => 3,
        DType::I64 => 4,
        DType::F16 => 5,
        DType::F32 => 6,
        DType::F64 => 7,
        DType::Bool => 11,
        DType::BF16 => 15,
    }
}

/// [`take_tensors`] over (dtype, bytes) pairs of dense tensors.
pub(crate) fn take_specs(specs: &[(DType, usize)], buffer_size: usize) -> Vec<Vec<usize>> {
    let kinds: Vec<(Kind, usize)> = specs.iter().map(|&(d, b)| (Kind::dense(d), b)).collect();
    take_kinds(&kinds, buffer_size)
}

/// [`take_tensors`] over (kind, bytes) pairs: dense and sparse tensors of
/// one dtype never share a bucket; the open buckets are emitted at the end,
/// dense before sparse, each in PyTorch's dtype order.
pub(crate) fn take_kinds(specs: &[(Kind, usize)], buffer_size: usize) -> Vec<Vec<usize>> {
    let mut results = Vec::new();
    let mut open: Vec<(Kind, Vec<usize>, usize)> = Vec::new();
    for (i, &(kind, bytes)) in specs.iter().enumerate() {
        let slot = match open.iter().position(|(k, _, _)| *k == kind) {
            Some(p) => p,
            None => {
                open.push((kind, Vec::new(), 0));
                open.len() - 1
            }
        };
        let bucket = &mut open[slot];
        bucket.1.push(i);
        bucket.2 += bytes;
        if bucket.2 >= buffer_size {
            results.push(std::mem::take(&mut bucket.1));
            bucket.2 = 0;
        }
    }
    open.sort_by_key(|(k, _, _)| (k.sparse, torch_scalar_type(k.dtype)));
    results.extend(
        open.into_iter()
            .map(|(_, b, _)| b)
            .filter(|b| !b.is_empty()),
    );
    results
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_close_when_they_reach_the_limit() {
        let f = DType::F32;
        let specs = [(f, 4), (f, 4), (f, 4), (f, 1), (f, 10)];
        assert_eq!(take_specs(&specs, 8), vec![vec![0, 1], vec![2, 3, 4]]);
        // One tensor larger than the limit gets a bucket of its own.
        assert_eq!(take_specs(&[(f, 100), (f, 1)], 8), vec![vec![0], vec![1]]);
        assert!(take_specs(&[], 8).is_empty());
    }

    #[test]
    fn dtypes_never_share_a_bucket_and_every_index_appears_once() {
        let specs: Vec<(DType, usize)> = (0..50)
            .map(|i| (DType::ALL[i % 3], (i * 37) % 11))
            .collect();
        let buckets = take_specs(&specs, 16);
        let mut seen: Vec<usize> = buckets.iter().flatten().copied().collect();
        seen.sort_unstable();
        assert_eq!(seen, (0..50).collect::<Vec<_>>());
        for b in &buckets {
            assert!(
                b.windows(2).all(|w| w[0] < w[1]),
                "input order inside a bucket"
            );
            assert!(
                b.iter().all(|&i| specs[i].0 == specs[b[0]].0),
                "one dtype per bucket"
            );
        }
    }

    #[test]
    fn dense_and_sparse_of_one_dtype_are_bucketed_apart() {
        let dense = Kind::dense(DType::F32);
        let sparse = Kind {
            sparse: true,
            dtype: DType::F32,
        };
        let specs = [
            (sparse, 4),
            (dense, 4),
            (sparse, 4),
            (dense, 4),
            (Kind::dense(DType::I64), 8),
            (sparse, 1),
        ];
        // The sparse bucket fills first (4 + 4 >= 8), then the dense one and
        // the i64 one; the last sparse tensor is left open and comes last.
        assert_eq!(
            take_kinds(&specs, 8),
            vec![vec![0, 2], vec![1, 3], vec![4], vec![5]]
        );
        // With a large buffer: dense buckets first, in PyTorch's order
        // (i64 is ScalarType 4, f32 is 6).
        let buckets = take_kinds(&specs, 1 << 20);
        assert_eq!(buckets, vec![vec![4], vec![1, 3], vec![0, 2, 5]]);
        for b in &buckets {
            assert!(b.iter().all(|&i| specs[i].0 == specs[b[0]].0));
        }
    }

    #[test]
    fn open_buckets_come_out_in_pytorchs_scalar_type_order() {
        // One tensor of each dtype, in an order unlike PyTorch's.
        let order = [
            DType::BF16,
            DType::Bool,
            DType::F64,
            DType::F32,
            DType::F16,
            DType::I64,
            DType::I32,
            DType::I8,
            DType::U8,
        ];
        let specs: Vec<(DType, usize)> = order.iter().map(|&d| (d, 4)).collect();
        let emitted: Vec<DType> = take_specs(&specs, 1 << 20)
            .iter()
            .map(|b| specs[b[0]].0)
            .collect();
        let pytorch = [
            DType::U8,
            DType::I8,
            DType::I32,
            DType::I64,
            DType::F16,
            DType::F32,
            DType::F64,
            DType::Bool,
            DType::BF16,
        ];
        assert_eq!(emitted, pytorch);
    }

    #[test]
    fn zero_sized_tensors_join_buckets_without_filling_them() {
        let specs = [(DType::I64, 0), (DType::I64, 0), (DType::I64, 8)];
        assert_eq!(take_specs(&specs, 8), vec![vec![0, 1, 2]]);
    }

    #[test]
    fn the_model_shaped_set_splits_like_pytorch() {
        // 64x3x7x7, 40 x 256x256x3x3, 100 x 256, 4 x 1000x2048 (f32).
        let mut specs = vec![(DType::F32, 64 * 3 * 7 * 7 * 4)];
        specs.extend(std::iter::repeat_n((DType::F32, 256 * 256 * 9 * 4), 40));
        specs.extend(std::iter::repeat_n((DType::F32, 256 * 4), 100));
        specs.extend(std::iter::repeat_n((DType::F32, 1000 * 2048 * 4), 4));
        let buckets = take_specs(&specs, 25 << 20);
        // The stem and 11 weights (25 989 888 bytes) stay under 25 MiB; the
        // 12th weight passes it and closes the bucket.
        assert_eq!(buckets[0].len(), 13);
        let total: usize = specs.iter().map(|s| s.1).sum();
        assert!(total > 120_000_000 && total < 130_000_000, "{total}");
        assert_eq!(buckets.iter().map(Vec::len).sum::<usize>(), 145);
    }
}
