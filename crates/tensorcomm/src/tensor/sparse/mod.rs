//! Sparse COO tensors: coordinates and values, for the sparse all-reduce
//! and `cuda::comm`.

mod coalesce;

use std::cmp::Ordering;
use std::sync::Arc;

use super::{contiguous_strides, DType, Device, Tensor};
use crate::{Error, Result};

/// A sparse tensor in coordinate (COO) format, like PyTorch's
/// `torch.sparse_coo_tensor`.
///
/// The full shape is `sizes = sparse dims ++ dense dims`. Entry `j` has
/// coordinates `indices[d][j]` for each sparse dimension `d` (stored as a
/// row-major `[sparse_dim, nnz]` array of `i64`) and value `values[j]`, a
/// dense block of shape `[dense dims]`, so `values` has shape
/// `[nnz, dense dims...]`. Entries may repeat coordinates until
/// [`coalesce`](SparseTensor::coalesce) sums them.
///
/// Where the parts live: the values may be on a GPU (`Device::Cuda(i)`, see
/// [`to_device`](SparseTensor::to_device)); the indices always stay in host
/// memory, shared (not copied) between a tensor and its copies on other
/// devices. PyTorch keeps both on the device; here host indices keep
/// [`new`](SparseTensor::new)'s range checks and the sparse all-reduce on
/// the host, and `cuda::comm` moves only the values between GPUs. The
/// host algorithms ([`coalesce`](SparseTensor::coalesce),
/// [`to_dense`](SparseTensor::to_dense)) copy GPU values to the host
/// explicitly and put their result back on the values' device.
///
/// ```
/// use tensorcomm::tensor::{SparseTensor, Tensor};
///
/// // A 2 x 3 matrix with entries at (0, 2) and (1, 0), given twice.
/// let indices = vec![0, 1, 1, /* row */ 2, 0, 0 /* column */];
/// let values = Tensor::from_vec(vec![1.0f32, 2.0, 3.0], &[3])?;
/// let sparse = SparseTensor::new(indices, values, &[2, 3])?;
/// assert_eq!((sparse.sparse_dim(), sparse.dense_dim(), sparse.nnz()), (2, 0, 3));
/// assert!(!sparse.is_coalesced());
///
/// let c = sparse.coalesce()?;
/// assert_eq!((c.nnz(), c.indices()), (2, &[0, 1, 2, 0][..]));
/// assert_eq!(c.values().to_vec::<f32>()?, [1.0, 5.0]);
/// assert_eq!(sparse.to_dense()?.to_vec::<f32>()?, [0.0, 0.0, 1.0, 5.0, 0.0, 0.0]);
/// # Ok::<(), tensorcomm::Error>(())
/// ```
#[derive(Clone, Debug)]
pub struct SparseTensor {
    indices: Arc<Vec<i64>>,
    values: Tensor<'static>,
    sizes: Vec<usize>,
    coalesced: bool,
}

impl SparseTensor {
    /// Builds a sparse tensor after checking that the parts agree.
    ///
    /// `indices` is the row-major `[sparse_dim, nnz]` coordinate array,
    /// `values` has shape `[nnz, dense dims...]` and `sizes` is the full
    /// shape; `sparse_dim` is `sizes.len() - (values.dim() - 1)`. Every
    /// coordinate must be in `0..sizes[d]`. Values that are not contiguous
    /// are copied into a contiguous tensor on their own device.
    ///
    /// ```
    /// use tensorcomm::{Error, tensor::{SparseTensor, Tensor}};
    ///
    /// let values = Tensor::from_vec(vec![1i64, 2], &[2])?;
    /// let err = SparseTensor::new(vec![0, 3], values, &[3]).unwrap_err();
    /// assert!(matches!(err, Error::InvalidSparse(_)));
    /// assert!(err.to_string().contains("index 3 at indices[0][1]"));
    /// # Ok::<(), tensorcomm::Error>(())
    /// ```
    pub fn new(indices: Vec<i64>, values: Tensor<'static>, sizes: &[usize]) -> Result<Self> {
        if values.dim() == 0 {
            return Err(Error::InvalidSparse(
                "values must have shape [nnz, dense dims...], found a 0-dimensional tensor".into(),
            ));
        }
        let dense_dim = values.dim() - 1;
        if dense_dim > sizes.len() {
            return Err(Error::InvalidSparse(format!(
                "values of shape {:?} have {dense_dim} dense dimensions, more than the {} of sizes {sizes:?}",
                values.shape(),
                sizes.len()
            )));
        }
        let sparse_dim = sizes.len() - dense_dim;
        if values.shape()[1..] != sizes[sparse_dim..] {
            return Err(Error::InvalidSparse(format!(
                "values of shape {:?} must have shape [nnz, {:?}...] to match the dense dimensions \
                 of sizes {sizes:?}",
                values.shape(),
                &sizes[sparse_dim..]
            )));
        }
        let nnz = values.shape()[0];
        if sparse_dim.checked_mul(nnz) != Some(indices.len()) {
            return Err(Error::InvalidSparse(format!(
                "expected {sparse_dim} x {nnz} indices (sparse_dim x nnz, nnz from values of shape \
                 {:?}), found {}",
                values.shape(),
                indices.len()
            )));
        }
        for d in 0..sparse_dim {
            for j in 0..nnz {
                let index = indices[d * nnz + j];
                if !matches!(usize::try_from(index), Ok(i) if i < sizes[d]) {
                    return Err(Error::InvalidSparse(format!(
                        "index {index} at indices[{d}][{j}] is out of range for dimension {d} of \
                         size {}",
                        sizes[d]
                    )));
                }
            }
        }
        let values = if values.is_contiguous() && values.offset() == 0 {
            values
        } else {
            contiguous_on_its_device(&values)?
        };
        let mut sparse = SparseTensor {
            indices: Arc::new(indices),
            values,
            sizes: sizes.to_vec(),
            coalesced: false,
        };
        sparse.coalesced = (1..nnz).all(|j| sparse.compare_entries(j - 1, j) == Ordering::Less);
        Ok(sparse)
    }

    /// The coordinates, a row-major `[sparse_dim, nnz]` array: entry `j`'s
    /// coordinate along sparse dimension `d` is `indices()[d * nnz + j]`.
    pub fn indices(&self) -> &[i64] {
        &self.indices
    }

    /// The values, shape `[nnz, dense dims...]`, contiguous.
    pub fn values(&self) -> &Tensor<'static> {
        &self.values
    }

    /// The full shape: sparse dimensions then dense dimensions.
    pub fn sizes(&self) -> &[usize] {
        &self.sizes
    }

    /// Number of stored entries (duplicates included).
    pub fn nnz(&self) -> usize {
        self.values.shape()[0]
    }

    /// Number of dimensions addressed by `indices`.
    pub fn sparse_dim(&self) -> usize {
        self.sizes.len() - self.dense_dim()
    }

    /// Number of trailing dimensions stored densely in each value.
    pub fn dense_dim(&self) -> usize {
        self.values.dim() - 1
    }

    /// The element type of the values.
    pub fn dtype(&self) -> DType {
        self.values.dtype()
    }

    /// The device holding the values.
    pub fn device(&self) -> Device {
        self.values.device()
    }

    /// True when the coordinates are strictly increasing in lexicographic
    /// order, hence sorted and free of duplicates.
    pub fn is_coalesced(&self) -> bool {
        self.coalesced
    }

    /// The parts: `(indices, values, sizes)`.
    ///
    /// ```
    /// use tensorcomm::tensor::{SparseTensor, Tensor};
    /// let s = SparseTensor::new(vec![1], Tensor::from_vec(vec![4u8], &[1])?, &[2])?;
    /// let (indices, values, sizes) = s.into_parts();
    /// assert_eq!((indices, values.to_vec::<u8>()?, sizes), (vec![1], vec![4], vec![2]));
    /// # Ok::<(), tensorcomm::Error>(())
    /// ```
    pub fn into_parts(self) -> (Vec<i64>, Tensor<'static>, Vec<usize>) {
        let indices = Arc::try_unwrap(self.indices).unwrap_or_else(|shared| (*shared).clone());
        (indices, self.values, self.sizes)
    }

    /// True when `self` and `other` hold the same index array (not a copy
    /// of it), as a tensor and its copies on other devices do.
    ///
    /// ```
    /// use tensorcomm::tensor::{SparseTensor, Tensor};
    /// let s = SparseTensor::new(vec![1], Tensor::from_vec(vec![4u8], &[1])?, &[2])?;
    /// assert!(s.clone().shares_indices(&s));
    /// let t = SparseTensor::new(vec![1], Tensor::from_vec(vec![4u8], &[1])?, &[2])?;
    /// assert!(!t.shares_indices(&s));
    /// # Ok::<(), tensorcomm::Error>(())
    /// ```
    pub fn shares_indices(&self, other: &SparseTensor) -> bool {
        Arc::ptr_eq(&self.indices, &other.indices)
    }

    /// The same tensor with its values copied to `device` (the indices stay
    /// on the host and are shared, not copied). On the values' own device
    /// this is `self` (same values storage).
    ///
    /// ```no_run
    /// use tensorcomm::tensor::{Device, SparseTensor, Tensor};
    /// let s = SparseTensor::new(vec![0, 0], Tensor::from_vec(vec![1.0f32, 2.0], &[2])?, &[3])?;
    /// let g = s.to_device(Device::Cuda(0))?;
    /// assert_eq!(g.device(), Device::Cuda(0));
    /// assert!(g.shares_indices(&s));
    /// // Host algorithms copy the values over and back explicitly.
    /// assert_eq!(g.to_dense()?.device(), Device::Cuda(0));
    /// assert_eq!(g.coalesce()?.values().to_vec::<f32>()?, [3.0]);
    /// # Ok::<(), tensorcomm::Error>(())
    /// ```
    #[cfg(feature = "cuda")]
    pub fn to_device(&self, device: Device) -> Result<SparseTensor> {
        if self.device() == device {
            return Ok(self.clone());
        }
        Ok(self.with_values(self.values.to_device(device)?))
    }

    /// The same indices (shared), sizes and coalesced flag with other
    /// values of the same shape and dtype, contiguous at offset 0 (values
    /// copied to another device).
    #[cfg(feature = "cuda")]
    pub(crate) fn with_values(&self, values: Tensor<'static>) -> SparseTensor {
        debug_assert_eq!(values.shape(), self.values.shape());
        debug_assert!(values.is_contiguous() && values.offset() == 0);
        SparseTensor {
            indices: Arc::clone(&self.indices),
            values,
            sizes: self.sizes.clone(),
            coalesced: self.coalesced,
        }
    }

    /// The dense tensor this describes, with duplicate entries summed (as
    /// [`coalesce`](SparseTensor::coalesce) sums them), on the values'
    /// device. For GPU values this is computed on the host: the values are
    /// copied to the host and the result back to the GPU.
    pub fn to_dense(&self) -> Result<Tensor<'static>> {
        #[cfg(feature = "cuda")]
        if self.device() != Device::Cpu {
            return self
                .to_device(Device::Cpu)?
                .to_dense()?
                .to_device(self.device());
        }
        let coalesced;
        let source = if self.coalesced {
            self
        } else {
            coalesced = self.coalesce()?;
            &coalesced
        };
        let dense = Tensor::zeros(&self.sizes, self.dtype())?;
        let sparse_dim = self.sparse_dim();
        let strides = contiguous_strides(&self.sizes);
        let nnz = source.nnz();
        // Each value row is one dense block (values are contiguous).
        let row_bytes = source.values.nbytes().checked_div(nnz).unwrap_or(0);
        dense.with_bytes_mut(|out| {
            source.values.with_bytes(|rows| {
                // A dense dimension of size 0: the rows are empty and the
                // strides (which count a size 0 as 1) point past the end.
                if row_bytes == 0 {
                    return;
                }
                for j in 0..nnz {
                    // Coordinates were checked to be in range, so they are
                    // non-negative and the element offset fits the tensor.
                    let start: usize = (0..sparse_dim)
                        .map(|d| source.indices[d * nnz + j] as usize * strides[d])
                        .sum::<usize>()
                        * self.dtype().size();
                    out[start..start + row_bytes]
                        .copy_from_slice(&rows[j * row_bytes..(j + 1) * row_bytes]);
                }
            })
        })??;
        Ok(dense)
    }

    /// Lexicographic order of the coordinates of entries `a` and `b`.
    fn compare_entries(&self, a: usize, b: usize) -> Ordering {
        let nnz = self.nnz();
        (0..self.sparse_dim())
            .map(|d| self.indices[d * nnz + a].cmp(&self.indices[d * nnz + b]))
            .find(|o| o.is_ne())
            .unwrap_or(Ordering::Equal)
    }
}

/// A contiguous copy of `values` on the device holding them.
fn contiguous_on_its_device(values: &Tensor<'static>) -> Result<Tensor<'static>> {
    match values.device() {
        Device::Cpu => values.contiguous(),
        #[cfg(feature = "cuda")]
        device @ Device::Cuda(_) => {
            let out = Tensor::zeros_on(values.shape(), values.dtype(), device)?;
            out.copy_from(values)?;
            Ok(out)
        }
        #[cfg(not(feature = "cuda"))]
        other => Err(Error::InvalidSparse(format!(
            "values on {other} need the `cuda` feature"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f32s(values: &[f32], shape: &[usize]) -> Tensor<'static> {
        Tensor::from_vec(values.to_vec(), shape).unwrap()
    }

    fn message(result: Result<SparseTensor>) -> String {
        match result {
            Err(Error::InvalidSparse(msg)) => msg,
            other => panic!("expected InvalidSparse, found {other:?}"),
        }
    }

    #[test]
    fn invalid_inputs_name_what_is_wrong() {
        let msg = message(SparseTensor::new(
            vec![0, 1, 2],
            f32s(&[1.0, 2.0], &[2]),
            &[3],
        ));
        assert!(
            msg.contains("expected 1 x 2 indices") && msg.contains("found 3"),
            "{msg}"
        );
        let msg = message(SparseTensor::new(
            vec![0, -1],
            f32s(&[1.0, 2.0], &[2]),
            &[3],
        ));
        assert!(
            msg.contains("index -1 at indices[0][1]") && msg.contains("size 3"),
            "{msg}"
        );
        let msg = message(SparseTensor::new(
            vec![0, 0, 0, 5],
            f32s(&[1.0, 2.0], &[2]),
            &[3, 4],
        ));
        assert!(
            msg.contains("index 5 at indices[1][1]") && msg.contains("dimension 1 of size 4"),
            "{msg}"
        );
        let msg = message(SparseTensor::new(
            vec![0],
            f32s(&[1.0, 2.0], &[1, 2]),
            &[3, 3],
        ));
        assert!(msg.contains("[nnz, [3]...]"), "{msg}");
        let msg = message(SparseTensor::new(
            vec![],
            f32s(&[1.0; 8], &[1, 2, 2, 2]),
            &[2, 2],
        ));
        assert!(msg.contains("3 dense dimensions"), "{msg}");
        let msg = message(SparseTensor::new(vec![], f32s(&[1.0], &[]), &[2]));
        assert!(msg.contains("0-dimensional"), "{msg}");
    }

    #[test]
    fn coalesced_is_sorted_and_unique() {
        let s =
            |indices: Vec<i64>| SparseTensor::new(indices, f32s(&[1.0; 3], &[3]), &[4, 4]).unwrap();
        assert!(s(vec![0, 0, 1, 0, 3, 0]).is_coalesced());
        assert!(!s(vec![0, 1, 0, 0, 0, 3]).is_coalesced()); // unsorted
        assert!(!s(vec![0, 1, 1, 0, 2, 2]).is_coalesced()); // duplicate (1, 2)
        let empty = SparseTensor::new(vec![], f32s(&[], &[0, 2]), &[4, 2]).unwrap();
        assert!(empty.is_coalesced());
        assert_eq!(
            (empty.nnz(), empty.sparse_dim(), empty.dense_dim()),
            (0, 1, 1)
        );
        assert_eq!(empty.to_dense().unwrap().to_vec::<f32>().unwrap(), [0.0; 8]);
    }

    #[test]
    fn non_contiguous_values_are_made_contiguous() {
        let values = f32s(&[1.0, 2.0, 3.0, 4.0], &[2, 2])
            .permute(&[1, 0])
            .unwrap();
        let s = SparseTensor::new(vec![0, 2], values, &[3, 2]).unwrap();
        assert!(s.values().is_contiguous());
        assert_eq!(s.values().to_vec::<f32>().unwrap(), [1.0, 3.0, 2.0, 4.0]);
        assert_eq!(
            s.to_dense().unwrap().to_vec::<f32>().unwrap(),
            [1.0, 3.0, 0.0, 0.0, 2.0, 4.0]
        );
    }

    #[test]
    fn to_dense_places_dense_blocks_and_sums_duplicates() {
        // sizes [2, 3, 2]: sparse dims (2, 3), dense dim 2.
        let indices = vec![1, 0, 1, /* */ 2, 0, 2];
        let values = Tensor::from_vec(vec![1i32, 2, 10, 20, 100, 200], &[3, 2]).unwrap();
        let s = SparseTensor::new(indices, values, &[2, 3, 2]).unwrap();
        assert_eq!(
            (s.sparse_dim(), s.dense_dim(), s.sizes()),
            (2, 1, &[2, 3, 2][..])
        );
        let dense = s.to_dense().unwrap();
        assert_eq!(dense.shape(), &[2, 3, 2]);
        assert_eq!(
            dense.to_vec::<i32>().unwrap(),
            [10, 20, 0, 0, 0, 0, 0, 0, 0, 0, 101, 202]
        );
    }

    #[test]
    fn zero_sparse_dims_sum_every_entry() {
        let values = Tensor::from_vec(vec![1i64, 2, 3, 4], &[2, 2]).unwrap();
        let s = SparseTensor::new(vec![], values, &[2]).unwrap();
        assert_eq!((s.sparse_dim(), s.nnz(), s.is_coalesced()), (0, 2, false));
        assert_eq!(s.to_dense().unwrap().to_vec::<i64>().unwrap(), [4, 6]);
    }

    #[test]
    fn an_empty_dense_dimension_gives_an_empty_dense_tensor() {
        // Found by fuzzing: entry (0, 2) of sizes [5, 3, 0] indexed past
        // the end of the empty dense tensor.
        let values = Tensor::from_vec(Vec::<i64>::new(), &[1, 0]).unwrap();
        let s = SparseTensor::new(vec![0, 2], values, &[5, 3, 0]).unwrap();
        let dense = s.to_dense().unwrap();
        assert_eq!(dense.shape(), [5, 3, 0]);
        assert!(dense.to_vec::<i64>().unwrap().is_empty());
    }
}
