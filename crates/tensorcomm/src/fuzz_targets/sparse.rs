//! Sparse COO metadata: sizes, a values shape, and coordinates drawn from
//! the input go to `SparseTensor::new`; a tensor it accepts is coalesced
//! and densified. Checked: no panic, and coalescing keeps the dense value.
//!
//! The sparse all-reduce reading a peer's metadata and entries is its own
//! target, `sparse_all_reduce.rs`.

use super::input::Input;
use crate::tensor::{SparseTensor, Tensor};

/// Elements a dense copy may have (bounds what the body allocates itself).
const MAX_DENSE: usize = 1 << 12;

pub fn sparse(data: &[u8]) {
    let mut input = Input(data);
    let ndim = usize::from(input.u8() % 5);
    let sizes: Vec<usize> = (0..ndim)
        .map(|_| match input.u8() {
            b if b >= 0xf0 => input.u64() as usize,
            b => usize::from(b % 6),
        })
        .collect();
    let dense_dim = usize::from(input.u8()) % (ndim + 2);
    let nnz = usize::from(input.u8() % 8);
    let mut shape = vec![nnz];
    shape.extend(
        sizes
            .iter()
            .skip(ndim.saturating_sub(dense_dim))
            .map(|&s| s % 6),
    );
    let numel: usize = shape.iter().product();
    let sparse_dim = ndim.saturating_sub(dense_dim);
    let indices: Vec<i64> = (0..sparse_dim * nnz)
        .map(|_| i64::from(input.u8() as i8))
        .collect();
    let values: Vec<i64> = (1..=numel as i64).collect();
    let Ok(values) = Tensor::from_vec(values, &shape) else {
        return;
    };
    let Ok(tensor) = SparseTensor::new(indices, values, &sizes) else {
        return;
    };
    let coalesced = tensor.coalesce().expect("coalescing a valid sparse tensor");
    assert!(coalesced.is_coalesced());
    assert!(coalesced.nnz() <= tensor.nnz());
    let dense = sizes
        .iter()
        .try_fold(1usize, |n, &s| n.checked_mul(s))
        .is_some_and(|n| n <= MAX_DENSE);
    if dense {
        let a = tensor.to_dense().and_then(|t| t.to_vec::<i64>());
        let b = coalesced.to_dense().and_then(|t| t.to_vec::<i64>());
        assert_eq!(a.ok(), b.ok(), "coalescing changed the dense value");
    }
}
