//! Views: new handles on the same storage with a different layout.

use super::dense::{checked_numel, Tensor};
use super::layout::{wrap_dim, Layout};
use crate::{Error, Result};

impl<'a> Tensor<'a> {
    /// The elements `start .. start + len` along `dim` (negative `dim`
    /// counts from the end), sharing storage with `self`.
    ///
    /// ```
    /// use tensorcomm::tensor::Tensor;
    /// let t = Tensor::from_vec((0..12i32).collect(), &[3, 4])?;
    /// let middle = t.narrow(-1, 1, 2)?;
    /// assert_eq!(middle.shape(), &[3, 2]);
    /// assert_eq!(middle.to_vec::<i32>()?, [1, 2, 5, 6, 9, 10]);
    /// assert!(t.narrow(0, 2, 2).is_err()); // rows 2..4 of 3
    /// # Ok::<(), tensorcomm::Error>(())
    /// ```
    pub fn narrow(&self, dim: i64, start: usize, len: usize) -> Result<Tensor<'a>> {
        let d = wrap_dim(dim, self.dim())?;
        let size = self.shape()[d];
        if start.checked_add(len).is_none_or(|end| end > size) {
            return Err(Error::InvalidArgument(format!(
                "narrow: start {start} + length {len} exceeds size {size} of dimension {dim} (shape {:?})",
                self.shape()
            )));
        }
        Ok(self.view_with_layout(self.layout.narrowed(d, start, len)))
    }

    /// Splits `dim` into pieces of `split_size` elements (the last may be
    /// smaller), as views. PyTorch's `split(int)`.
    ///
    /// ```
    /// use tensorcomm::tensor::{DType, Tensor};
    /// let t = Tensor::zeros(&[7, 2], DType::F32)?;
    /// let sizes: Vec<usize> = t.split(3, 0)?.iter().map(|p| p.shape()[0]).collect();
    /// assert_eq!(sizes, [3, 3, 1]);
    /// # Ok::<(), tensorcomm::Error>(())
    /// ```
    pub fn split(&self, split_size: usize, dim: i64) -> Result<Vec<Tensor<'a>>> {
        let d = wrap_dim(dim, self.dim())?;
        let size = self.shape()[d];
        if split_size == 0 {
            if size == 0 {
                return Ok(vec![self.clone()]);
            }
            return Err(Error::InvalidArgument(format!(
                "split: split size 0 cannot split dimension {dim} of size {size}"
            )));
        }
        let sizes: Vec<usize> = (0..size)
            .step_by(split_size)
            .map(|start| split_size.min(size - start))
            .collect();
        self.split_sizes(&sizes, dim)
    }

    /// Splits `dim` into pieces of the given sizes, which must add up to the
    /// dimension's size, as views. PyTorch's `split_with_sizes`.
    ///
    /// ```
    /// use tensorcomm::tensor::Tensor;
    /// let t = Tensor::from_vec((0..6u8).collect(), &[6])?;
    /// let parts = t.split_sizes(&[1, 0, 5], 0)?;
    /// assert_eq!(parts[2].to_vec::<u8>()?, [1, 2, 3, 4, 5]);
    /// assert!(t.split_sizes(&[1, 2], 0).is_err());
    /// # Ok::<(), tensorcomm::Error>(())
    /// ```
    pub fn split_sizes(&self, sizes: &[usize], dim: i64) -> Result<Vec<Tensor<'a>>> {
        let d = wrap_dim(dim, self.dim())?;
        let size = self.shape()[d];
        let total = sizes.iter().try_fold(0usize, |sum, &s| sum.checked_add(s));
        if total != Some(size) {
            return Err(Error::InvalidArgument(format!(
                "split_sizes: sizes {sizes:?} must add up to {size}, the size of dimension {dim}, \
                 found {}",
                total.map_or_else(|| "more than usize::MAX".to_string(), |t| t.to_string())
            )));
        }
        let mut start = 0;
        let mut pieces = Vec::with_capacity(sizes.len());
        for &len in sizes {
            pieces.push(self.view_with_layout(self.layout.narrowed(d, start, len)));
            start += len;
        }
        Ok(pieces)
    }

    /// Splits `dim` into at most `chunks` views of `ceil(size / chunks)`
    /// elements (the last may be smaller, and there may be fewer than
    /// `chunks`), as PyTorch's `chunk`. An empty dimension gives `chunks`
    /// empty views.
    ///
    /// ```
    /// use tensorcomm::tensor::{DType, Tensor};
    /// let sizes = |n: usize, chunks: usize| -> Vec<usize> {
    ///     let t = Tensor::zeros(&[n], DType::U8).unwrap();
    ///     t.chunk(chunks, 0).unwrap().iter().map(|c| c.numel()).collect()
    /// };
    /// assert_eq!(sizes(10, 3), [4, 4, 2]);
    /// assert_eq!(sizes(5, 4), [2, 2, 1]);
    /// # Ok::<(), tensorcomm::Error>(())
    /// ```
    pub fn chunk(&self, chunks: usize, dim: i64) -> Result<Vec<Tensor<'a>>> {
        let d = wrap_dim(dim, self.dim())?;
        if chunks == 0 {
            return Err(Error::InvalidArgument(
                "chunk: the number of chunks must be at least 1, found 0".into(),
            ));
        }
        let size = self.shape()[d];
        if size == 0 {
            return self.split_sizes(&vec![0; chunks], dim);
        }
        self.split(size.div_ceil(chunks), dim)
    }

    /// The same elements with dimensions reordered: dimension `i` of the
    /// result is dimension `dims[i]` of `self`. A view.
    ///
    /// ```
    /// use tensorcomm::tensor::Tensor;
    /// let t = Tensor::from_vec((0..6i64).collect(), &[2, 3])?;
    /// let tt = t.permute(&[1, 0])?;
    /// assert_eq!((tt.shape(), tt.strides()), (&[3, 2][..], &[1, 3][..]));
    /// assert_eq!(tt.to_vec::<i64>()?, [0, 3, 1, 4, 2, 5]);
    /// # Ok::<(), tensorcomm::Error>(())
    /// ```
    pub fn permute(&self, dims: &[usize]) -> Result<Tensor<'a>> {
        let ndim = self.dim();
        let mut seen = vec![false; ndim];
        let is_permutation = dims.len() == ndim
            && dims
                .iter()
                .all(|&d| d < ndim && !std::mem::replace(&mut seen[d], true));
        if !is_permutation {
            return Err(Error::InvalidArgument(format!(
                "permute: expected a permutation of 0..{ndim}, found {dims:?}"
            )));
        }
        Ok(self.view_with_layout(self.layout.permuted(dims)))
    }

    /// The same elements with a new shape of the same element count. Needs a
    /// contiguous tensor (use [`reshape`](Tensor::reshape) otherwise). A view.
    ///
    /// ```
    /// use tensorcomm::tensor::Tensor;
    /// let t = Tensor::from_vec((0..6u8).collect(), &[2, 3])?;
    /// assert_eq!(t.view(&[3, 2])?.shape(), &[3, 2]);
    /// assert!(t.view(&[4]).is_err());
    /// assert!(t.permute(&[1, 0])?.view(&[6]).is_err());
    /// # Ok::<(), tensorcomm::Error>(())
    /// ```
    pub fn view(&self, shape: &[usize]) -> Result<Tensor<'a>> {
        self.check_reshape("view", shape)?;
        if !self.is_contiguous() {
            return Err(Error::InvalidLayout(format!(
                "view needs a contiguous tensor, found shape {:?} with strides {:?} \
                 (use reshape, which copies)",
                self.shape(),
                self.strides()
            )));
        }
        let layout = Layout::new(shape, &super::contiguous_strides(shape), self.offset())?;
        Ok(self.view_with_layout(layout))
    }

    /// Like [`view`](Tensor::view), but copies into a fresh contiguous
    /// tensor when `self` is not contiguous.
    ///
    /// ```
    /// use tensorcomm::tensor::Tensor;
    /// let t = Tensor::from_vec((0..6u8).collect(), &[2, 3])?;
    /// let flat = t.permute(&[1, 0])?.reshape(&[6])?;
    /// assert_eq!(flat.to_vec::<u8>()?, [0, 3, 1, 4, 2, 5]);
    /// assert!(!flat.shares_storage(&t));
    /// # Ok::<(), tensorcomm::Error>(())
    /// ```
    pub fn reshape(&self, shape: &[usize]) -> Result<Tensor<'a>> {
        self.check_reshape("reshape", shape)?;
        if self.is_contiguous() {
            self.view(shape)
        } else {
            self.contiguous()?.view(shape)
        }
    }

    fn check_reshape(&self, op: &str, shape: &[usize]) -> Result<()> {
        if checked_numel(shape)? != self.numel() {
            return Err(Error::ShapeMismatch {
                context: format!(
                    "{op}: the new shape must have the {} elements of shape {:?}",
                    self.numel(),
                    self.shape()
                ),
                expected: self.shape().to_vec(),
                found: shape.to_vec(),
            });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use crate::tensor::DType;
    use crate::Error;

    use super::*;

    fn arange(n: i32, shape: &[usize]) -> Tensor<'static> {
        Tensor::from_vec((0..n).collect(), shape).unwrap()
    }

    #[test]
    fn views_share_storage_and_see_each_others_writes() {
        let t = arange(12, &[3, 4]);
        let row = t.narrow(0, 1, 1).unwrap();
        let col = t.narrow(1, 2, 1).unwrap();
        assert!(row.shares_storage(&t) && col.shares_storage(&row));
        row.fill(-1i32).unwrap();
        assert_eq!(col.to_vec::<i32>().unwrap(), [2, -1, 10]);
        let tt = t.permute(&[1, 0]).unwrap();
        tt.narrow(0, 0, 1).unwrap().fill(7i32).unwrap();
        assert_eq!(
            t.to_vec::<i32>().unwrap(),
            [7, 1, 2, 3, 7, -1, -1, -1, 7, 9, 10, 11]
        );
        let flat = t.view(&[12]).unwrap();
        flat.narrow(0, 11, 1).unwrap().fill(100i32).unwrap();
        assert_eq!(t.to_vec::<i32>().unwrap()[11], 100);
    }

    #[test]
    fn narrow_errors_name_the_problem() {
        let t = arange(6, &[2, 3]);
        assert!(matches!(
            t.narrow(2, 0, 1),
            Err(Error::DimOutOfRange { dim: 2, ndim: 2 })
        ));
        assert!(matches!(
            t.narrow(-3, 0, 1),
            Err(Error::DimOutOfRange { dim: -3, ndim: 2 })
        ));
        match t.narrow(1, 2, 2) {
            Err(Error::InvalidArgument(msg)) => {
                assert!(msg.contains("start 2 + length 2 exceeds size 3"), "{msg}")
            }
            other => panic!("{other:?}"),
        }
        assert!(matches!(
            t.narrow(1, usize::MAX, 2),
            Err(Error::InvalidArgument(_))
        ));
        let empty = t.narrow(1, 3, 0).unwrap();
        assert_eq!((empty.shape(), empty.numel()), (&[2, 0][..], 0));
        assert!(empty.to_vec::<i32>().unwrap().is_empty());
    }

    #[test]
    fn chunk_follows_pytorch_sizes() {
        let sizes = |n: usize, chunks: usize| -> Vec<usize> {
            let t = Tensor::zeros(&[2, n], DType::U8).unwrap();
            t.chunk(chunks, 1)
                .unwrap()
                .iter()
                .map(|c| c.shape()[1])
                .collect()
        };
        assert_eq!(sizes(10, 3), [4, 4, 2]);
        assert_eq!(sizes(5, 4), [2, 2, 1]);
        assert_eq!(sizes(4, 4), [1, 1, 1, 1]);
        assert_eq!(sizes(2, 5), [1, 1]);
        assert_eq!(sizes(0, 3), [0, 0, 0]);
        let t = arange(10, &[10]);
        let chunks = t.chunk(3, -1).unwrap();
        assert_eq!(chunks[2].to_vec::<i32>().unwrap(), [8, 9]);
        assert_eq!(chunks[1].offset(), 4);
        assert!(chunks.iter().all(|c| c.shares_storage(&t)));
        assert!(matches!(t.chunk(0, 0), Err(Error::InvalidArgument(_))));
        assert!(matches!(t.chunk(2, 1), Err(Error::DimOutOfRange { .. })));
    }

    #[test]
    fn split_and_split_sizes_check_their_arguments() {
        let t = arange(10, &[10]);
        let sizes: Vec<usize> = t.split(4, 0).unwrap().iter().map(|p| p.numel()).collect();
        assert_eq!(sizes, [4, 4, 2]);
        assert!(matches!(t.split(0, 0), Err(Error::InvalidArgument(_))));
        match t.split_sizes(&[3, 3], 0) {
            Err(Error::InvalidArgument(msg)) => assert!(
                msg.contains("add up to 10") && msg.contains("found 6"),
                "{msg}"
            ),
            other => panic!("{other:?}"),
        }
        assert!(matches!(
            t.split_sizes(&[usize::MAX, 2], 0),
            Err(Error::InvalidArgument(_))
        ));
        let parts = t.split_sizes(&[2, 8], 0).unwrap();
        assert_eq!(parts[0].to_vec::<i32>().unwrap(), [0, 1]);
    }

    #[test]
    fn permute_rejects_non_permutations() {
        let t = arange(6, &[1, 2, 3]);
        for bad in [&[0, 1][..], &[0, 1, 1], &[0, 1, 3], &[0, 1, 2, 3]] {
            assert!(
                matches!(t.permute(bad), Err(Error::InvalidArgument(_))),
                "{bad:?}"
            );
        }
        let p = t.permute(&[2, 0, 1]).unwrap();
        assert_eq!((p.shape(), p.strides()), (&[3, 1, 2][..], &[1, 6, 3][..]));
    }

    #[test]
    fn view_and_reshape_check_element_counts_and_layouts() {
        let t = arange(6, &[2, 3]);
        assert!(matches!(t.view(&[5]), Err(Error::ShapeMismatch { .. })));
        assert!(matches!(t.reshape(&[7]), Err(Error::ShapeMismatch { .. })));
        let tt = t.permute(&[1, 0]).unwrap();
        assert!(matches!(tt.view(&[6]), Err(Error::InvalidLayout(_))));
        let r = t.reshape(&[3, 2]).unwrap();
        assert!(r.shares_storage(&t));
        let narrowed = t.narrow(0, 1, 1).unwrap().view(&[3]).unwrap();
        assert_eq!(narrowed.offset(), 3);
        assert_eq!(narrowed.to_vec::<i32>().unwrap(), [3, 4, 5]);
    }
}
