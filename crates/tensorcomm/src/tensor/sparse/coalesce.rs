//! Coalescing: sorting coordinates and summing the values of duplicates.

use std::ops::Range;
use std::sync::Arc;

use half::{bf16, f16};

use super::SparseTensor;
use crate::tensor::{DType, Tensor};
use crate::Result;

impl SparseTensor {
    /// The same tensor with coordinates sorted lexicographically and the
    /// values of repeated coordinates summed, in the order they were given.
    ///
    /// GPU values are coalesced on the host: they are copied to the host
    /// and the result's values back to their device.
    ///
    /// Sums follow PyTorch: floats add in their own type except `f16` and
    /// `bf16`, which accumulate in `f32` and round once; integers wrap on
    /// overflow; bools combine with OR.
    ///
    /// ```
    /// use half::f16;
    /// use tensorcomm::tensor::{SparseTensor, Tensor};
    ///
    /// // 2048 + 1 + 1 in f16 steps would stay 2048; accumulated in f32 it is 2050.
    /// let values: Vec<f16> = [2048.0, 1.0, 1.0].map(f16::from_f32).to_vec();
    /// let s = SparseTensor::new(vec![4, 4, 4], Tensor::from_vec(values, &[3])?, &[5])?;
    /// let c = s.coalesce()?;
    /// assert_eq!(c.values().to_vec::<f16>()?, [f16::from_f32(2050.0)]);
    /// assert!(c.is_coalesced());
    /// # Ok::<(), tensorcomm::Error>(())
    /// ```
    pub fn coalesce(&self) -> Result<SparseTensor> {
        #[cfg(feature = "cuda")]
        if self.device() != crate::tensor::Device::Cpu && !self.coalesced && self.nnz() >= 2 {
            return self
                .to_device(crate::tensor::Device::Cpu)?
                .coalesce()?
                .to_device(self.device());
        }
        let nnz = self.nnz();
        // Below, nnz >= 2, so a value row is `numel / nnz` elements.
        if self.coalesced || nnz < 2 {
            return Ok(SparseTensor {
                coalesced: true,
                ..self.clone()
            });
        }
        let sparse_dim = self.sparse_dim();
        let mut order: Vec<usize> = (0..nnz).collect();
        order.sort_by(|&a, &b| self.compare_entries(a, b)); // stable: keeps given order
        let mut groups: Vec<Range<usize>> = Vec::new();
        for (k, pair) in order.windows(2).enumerate() {
            if self.compare_entries(pair[0], pair[1]).is_ne() {
                let start = groups.last().map_or(0, |g| g.end);
                groups.push(start..k + 1);
            }
        }
        groups.push(groups.last().map_or(0, |g| g.end)..nnz);

        let unique = groups.len();
        let mut indices = vec![0i64; sparse_dim * unique];
        for (u, group) in groups.iter().enumerate() {
            let first = order[group.start];
            for d in 0..sparse_dim {
                indices[d * unique + u] = self.indices[d * nnz + first];
            }
        }
        let mut shape = self.values.shape().to_vec();
        shape[0] = unique;
        let row = self.values.numel() / nnz;
        let sums = Sums {
            values: &self.values,
            order: &order,
            groups: &groups,
            row,
        };
        let values = match self.dtype() {
            DType::F32 => Tensor::from_vec(sums.reduce(|x: f32| x, |a, b| a + b, |a| a)?, &shape)?,
            DType::F64 => Tensor::from_vec(sums.reduce(|x: f64| x, |a, b| a + b, |a| a)?, &shape)?,
            DType::F16 => Tensor::from_vec(
                sums.reduce(f16::to_f32, |a, b| a + b, f16::from_f32)?,
                &shape,
            )?,
            DType::BF16 => Tensor::from_vec(
                sums.reduce(bf16::to_f32, |a, b| a + b, bf16::from_f32)?,
                &shape,
            )?,
            DType::I8 => {
                Tensor::from_vec(sums.reduce(|x: i8| x, i8::wrapping_add, |a| a)?, &shape)?
            }
            DType::U8 => {
                Tensor::from_vec(sums.reduce(|x: u8| x, u8::wrapping_add, |a| a)?, &shape)?
            }
            DType::I32 => {
                Tensor::from_vec(sums.reduce(|x: i32| x, i32::wrapping_add, |a| a)?, &shape)?
            }
            DType::I64 => {
                Tensor::from_vec(sums.reduce(|x: i64| x, i64::wrapping_add, |a| a)?, &shape)?
            }
            DType::Bool => Tensor::from_bool_bytes(
                sums.reduce(|x: u8| x != 0, |a, b| a | b, u8::from)?,
                &shape,
            )?,
        };
        Ok(SparseTensor {
            indices: Arc::new(indices),
            values,
            sizes: self.sizes.clone(),
            coalesced: true,
        })
    }
}

/// The values of a sparse tensor, grouped by coordinates: group `g` sums the
/// rows `order[groups[g]]`, each `row` elements long.
struct Sums<'s> {
    values: &'s Tensor<'static>,
    order: &'s [usize],
    groups: &'s [Range<usize>],
    row: usize,
}

impl Sums<'_> {
    /// One summed row per group: each element is lifted into the
    /// accumulator type `A`, added in group order and lowered back.
    fn reduce<T: bytemuck::Pod, A: Copy>(
        &self,
        lift: impl Fn(T) -> A,
        add: impl Fn(A, A) -> A,
        lower: impl Fn(A) -> T,
    ) -> Result<Vec<T>> {
        let mut input = vec![T::zeroed(); self.values.numel()];
        self.values.with_bytes(|bytes| {
            bytemuck::cast_slice_mut::<T, u8>(&mut input).copy_from_slice(bytes)
        })?;
        let row = self.row;
        let mut out = Vec::with_capacity(self.groups.len() * row);
        let mut acc: Vec<A> = Vec::with_capacity(row);
        for group in self.groups {
            let members = &self.order[group.clone()];
            let first = members[0] * row;
            acc.clear();
            acc.extend(input[first..first + row].iter().map(|&x| lift(x)));
            for &m in &members[1..] {
                for (a, &x) in acc.iter_mut().zip(&input[m * row..(m + 1) * row]) {
                    *a = add(*a, lift(x));
                }
            }
            out.extend(acc.iter().map(|&a| lower(a)));
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Error;

    fn sparse<T: crate::tensor::Element>(
        indices: Vec<i64>,
        values: Vec<T>,
        values_shape: &[usize],
        sizes: &[usize],
    ) -> SparseTensor {
        SparseTensor::new(
            indices,
            Tensor::from_vec(values, values_shape).unwrap(),
            sizes,
        )
        .unwrap()
    }

    #[test]
    fn duplicates_are_summed_and_coordinates_sorted() {
        // Coordinates (1, 2), (0, 1), (1, 2), (0, 0), (0, 1).
        let s = sparse(
            vec![1, 0, 1, 0, 0, 2, 1, 2, 0, 1],
            vec![1.0f32, 2.0, 3.0, 4.0, 5.0],
            &[5],
            &[2, 3],
        );
        assert!(!s.is_coalesced());
        let c = s.coalesce().unwrap();
        assert!(c.is_coalesced());
        assert_eq!(c.nnz(), 3);
        assert_eq!(c.indices(), &[0, 0, 1, /* */ 0, 1, 2]);
        assert_eq!(c.values().to_vec::<f32>().unwrap(), [4.0, 7.0, 4.0]);
        assert_eq!(c.sizes(), s.sizes());
        assert_eq!(
            c.to_dense().unwrap().to_vec::<f32>().unwrap(),
            s.to_dense().unwrap().to_vec::<f32>().unwrap()
        );
        // Coalescing again changes nothing.
        let again = c.coalesce().unwrap();
        assert_eq!(again.indices(), c.indices());
    }

    #[test]
    fn dense_dims_are_summed_row_by_row() {
        // sizes [3, 2, 2]: one sparse dim, values are 2 x 2 blocks.
        let values: Vec<i64> = (1..=12).collect();
        let s = sparse(vec![2, 0, 2], values, &[3, 2, 2], &[3, 2, 2]);
        let c = s.coalesce().unwrap();
        assert_eq!(c.indices(), &[0, 2]);
        assert_eq!(c.values().shape(), &[2, 2, 2]);
        assert_eq!(
            c.values().to_vec::<i64>().unwrap(),
            [5, 6, 7, 8, 1 + 9, 2 + 10, 3 + 11, 4 + 12]
        );
        assert_eq!((c.sparse_dim(), c.dense_dim()), (1, 2));
    }

    #[test]
    fn half_precision_accumulates_in_f32() {
        let halves: Vec<f16> = [2048.0f32, 1.0, 1.0].map(f16::from_f32).to_vec();
        let c = sparse(vec![0, 0, 0], halves, &[3], &[1])
            .coalesce()
            .unwrap();
        assert_eq!(c.values().to_vec::<f16>().unwrap(), [f16::from_f32(2050.0)]);
        // bf16 has 8 bits of mantissa: 256 + 1 + 1 step by step stays 256.
        let bhalves: Vec<bf16> = [256.0f32, 1.0, 1.0, 0.5].map(bf16::from_f32).to_vec();
        let c = sparse(vec![1, 1, 1, 0], bhalves, &[4], &[2])
            .coalesce()
            .unwrap();
        assert_eq!(
            c.values().to_vec::<bf16>().unwrap(),
            [bf16::from_f32(0.5), bf16::from_f32(258.0)]
        );
    }

    #[test]
    fn integers_wrap_and_bools_or() {
        let c = sparse(vec![0, 0], vec![100i8, 100], &[2], &[1])
            .coalesce()
            .unwrap();
        assert_eq!(c.values().to_vec::<i8>().unwrap(), [-56]);
        let c = sparse(vec![0, 0], vec![200u8, 100], &[2], &[1])
            .coalesce()
            .unwrap();
        assert_eq!(c.values().to_vec::<u8>().unwrap(), [44]);
        let c = sparse(vec![3, 3], vec![i64::MAX, 1], &[2], &[4])
            .coalesce()
            .unwrap();
        assert_eq!(c.values().to_vec::<i64>().unwrap(), [i64::MIN]);
        let c = sparse(vec![1, 1], vec![i32::MAX, 2], &[2], &[2])
            .coalesce()
            .unwrap();
        assert_eq!(c.values().to_vec::<i32>().unwrap(), [i32::MIN + 1]);
        let c = sparse(
            vec![0, 1, 0, 1, 2],
            vec![1.5f64, 1.0, 2.5, 0.0, -1.0],
            &[5],
            &[3],
        )
        .coalesce()
        .unwrap();
        assert_eq!(c.values().to_vec::<f64>().unwrap(), [4.0, 1.0, -1.0]);

        let flags = Tensor::from_bools(&[true, false, false, false, true], &[5]).unwrap();
        let s = SparseTensor::new(vec![0, 0, 1, 1, 2], flags, &[3]).unwrap();
        let c = s.coalesce().unwrap();
        assert_eq!(c.dtype(), DType::Bool);
        assert_eq!(c.values().to_vec_bool().unwrap(), [true, false, true]);
        assert_eq!(
            s.to_dense().unwrap().to_vec_bool().unwrap(),
            [true, false, true]
        );
    }

    #[test]
    fn empty_and_zero_width_values_coalesce() {
        let empty =
            SparseTensor::new(vec![], Tensor::zeros(&[0], DType::F32).unwrap(), &[4]).unwrap();
        let c = empty.coalesce().unwrap();
        assert_eq!((c.nnz(), c.indices().len()), (0, 0));
        // Dense dim of size 0: rows are empty but coordinates still merge.
        let s = SparseTensor::new(
            vec![1, 1],
            Tensor::zeros(&[2, 0], DType::I32).unwrap(),
            &[2, 0],
        )
        .unwrap();
        let c = s.coalesce().unwrap();
        assert_eq!((c.nnz(), c.indices()), (1, &[1][..]));
        assert!(matches!(
            SparseTensor::new(vec![2], Tensor::zeros(&[1], DType::I32).unwrap(), &[2]),
            Err(Error::InvalidSparse(_))
        ));
    }
}
