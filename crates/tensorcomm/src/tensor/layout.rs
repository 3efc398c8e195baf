//! Shape, strides and offset: how logical indices map to storage elements.

use crate::{Error, Result};

/// How a tensor's logical elements sit in its storage.
///
/// Element `[i0, i1, ..]` lives at storage element
/// `offset + i0 * strides[0] + i1 * strides[1] + ..`. Strides and offset
/// count elements, not bytes, and are never negative.
///
/// ```
/// use tensorcomm::tensor::Layout;
///
/// let nchw = Layout::contiguous(&[2, 3, 4, 5]);
/// assert_eq!(nchw.strides(), &[60, 20, 5, 1]);
/// assert!(nchw.is_contiguous());
///
/// let nhwc = Layout::channels_last(&[2, 3, 4, 5])?;
/// assert_eq!(nhwc.strides(), &[60, 1, 15, 3]);
/// assert!(nhwc.is_channels_last() && !nhwc.is_contiguous());
/// assert!(nhwc.is_non_overlapping_and_dense());
/// # Ok::<(), tensorcomm::Error>(())
/// ```
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Layout {
    shape: Vec<usize>,
    strides: Vec<usize>,
    offset: usize,
}

impl Layout {
    /// A layout from its parts; `shape` and `strides` must have the same
    /// length.
    ///
    /// ```
    /// use tensorcomm::tensor::Layout;
    ///
    /// let transposed = Layout::new(&[3, 2], &[1, 3], 0)?;
    /// assert!(!transposed.is_contiguous());
    /// assert!(Layout::new(&[3, 2], &[1], 0).is_err());
    /// # Ok::<(), tensorcomm::Error>(())
    /// ```
    pub fn new(shape: &[usize], strides: &[usize], offset: usize) -> Result<Self> {
        if shape.len() != strides.len() {
            return Err(Error::InvalidLayout(format!(
                "strides {strides:?} have {} entries, expected one per dimension of shape {shape:?} ({})",
                strides.len(),
                shape.len()
            )));
        }
        Ok(Layout {
            shape: shape.to_vec(),
            strides: strides.to_vec(),
            offset,
        })
    }

    /// The row-major (C order) layout of `shape` at offset 0.
    ///
    /// ```
    /// use tensorcomm::tensor::Layout;
    /// assert_eq!(Layout::contiguous(&[2, 3]).strides(), &[3, 1]);
    /// ```
    pub fn contiguous(shape: &[usize]) -> Self {
        Layout {
            shape: shape.to_vec(),
            strides: contiguous_strides(shape),
            offset: 0,
        }
    }

    /// The channels-last layout of a 4-D (NCHW) or 5-D (NCDHW) logical
    /// shape: memory order NHWC or NDHWC, at offset 0.
    ///
    /// ```
    /// use tensorcomm::tensor::Layout;
    /// assert_eq!(Layout::channels_last(&[1, 2, 2, 2, 3])?.strides(), &[24, 1, 12, 6, 2]);
    /// assert!(Layout::channels_last(&[2, 3]).is_err());
    /// # Ok::<(), tensorcomm::Error>(())
    /// ```
    pub fn channels_last(shape: &[usize]) -> Result<Self> {
        Ok(Layout {
            shape: shape.to_vec(),
            strides: channels_last_strides(shape)?,
            offset: 0,
        })
    }

    /// Size of each dimension.
    pub fn shape(&self) -> &[usize] {
        &self.shape
    }

    /// Step, in elements, between neighbours along each dimension.
    pub fn strides(&self) -> &[usize] {
        &self.strides
    }

    /// Storage element of the first logical element.
    pub fn offset(&self) -> usize {
        self.offset
    }

    /// Number of dimensions.
    pub fn ndim(&self) -> usize {
        self.shape.len()
    }

    /// Number of elements (1 for a 0-dimensional layout).
    ///
    /// Saturates at `usize::MAX`; layouts built by [`Tensor`](super::Tensor)
    /// never get that large because their storage could not exist.
    pub fn numel(&self) -> usize {
        self.shape
            .iter()
            .try_fold(1usize, |n, &s| n.checked_mul(s))
            .unwrap_or(usize::MAX)
    }

    /// True when the elements are in row-major order with no gaps: PyTorch's
    /// `is_contiguous()`. Strides of size-1 dimensions do not matter, and an
    /// empty layout is contiguous.
    ///
    /// ```
    /// use tensorcomm::tensor::Layout;
    /// assert!(Layout::new(&[2, 1, 3], &[3, 99, 1], 5)?.is_contiguous());
    /// assert!(!Layout::new(&[2, 3], &[1, 2], 0)?.is_contiguous());
    /// # Ok::<(), tensorcomm::Error>(())
    /// ```
    pub fn is_contiguous(&self) -> bool {
        self.numel() == 0 || dense_in_order(&self.shape, &self.strides, (0..self.ndim()).rev())
    }

    /// True when a 4-D or 5-D layout is dense in channels-last order (PyTorch's
    /// `is_contiguous(memory_format=torch.channels_last)`): channels vary
    /// fastest, then width, height (depth), and batch slowest.
    ///
    /// A layout can be both contiguous and channels-last when the channel
    /// dimension or the spatial dimensions have size 1.
    pub fn is_channels_last(&self) -> bool {
        let order: &[usize] = match self.ndim() {
            4 => &[1, 3, 2, 0],
            5 => &[1, 4, 3, 2, 0],
            _ => return false,
        };
        self.numel() == 0 || dense_in_order(&self.shape, &self.strides, order.iter().copied())
    }

    /// True when some permutation of the dimensions makes the layout
    /// contiguous (PyTorch's `is_non_overlapping_and_dense()`): the
    /// elements fill `offset .. offset + numel` exactly once each.
    ///
    /// An empty layout counts as dense whatever its strides (it is
    /// contiguous, as in PyTorch, so a permutation makes it contiguous);
    /// PyTorch's own check can say false for some empty layouts, which would
    /// only stop empty chunks from travelling as (zero) raw bytes.
    ///
    /// ```
    /// use tensorcomm::tensor::Layout;
    /// assert!(Layout::new(&[2, 3], &[1, 2], 0)?.is_non_overlapping_and_dense());
    /// assert!(!Layout::new(&[2, 3], &[4, 1], 0)?.is_non_overlapping_and_dense()); // gaps
    /// assert!(!Layout::new(&[2, 3], &[0, 1], 0)?.is_non_overlapping_and_dense()); // overlap
    /// # Ok::<(), tensorcomm::Error>(())
    /// ```
    pub fn is_non_overlapping_and_dense(&self) -> bool {
        if self.numel() == 0 {
            return true;
        }
        if self.ndim() == 1 {
            return self.shape[0] < 2 || self.strides[0] == 1;
        }
        // Dimensions of size 0 or 1 go last; the rest by increasing stride.
        let mut perm: Vec<usize> = (0..self.ndim()).collect();
        perm.sort_by_key(|&d| (self.shape[d] < 2, self.strides[d]));
        let mut required = 1usize;
        for d in perm {
            let size = self.shape[d];
            if size < 2 {
                return true;
            }
            if self.strides[d] != required {
                return false;
            }
            required = required.saturating_mul(size);
        }
        true
    }

    /// The storage elements `start .. end` spanned by the layout, from its
    /// lowest to one past its highest reachable element; `None` when the
    /// layout has no elements or the span does not fit in `usize`.
    ///
    /// ```
    /// use tensorcomm::tensor::Layout;
    /// assert_eq!(Layout::new(&[2, 3], &[10, 2], 4)?.span(), Some(4..19));
    /// assert_eq!(Layout::contiguous(&[0, 3]).span(), None);
    /// # Ok::<(), tensorcomm::Error>(())
    /// ```
    pub fn span(&self) -> Option<std::ops::Range<usize>> {
        if self.numel() == 0 {
            return None;
        }
        let mut last = self.offset;
        for (&size, &stride) in self.shape.iter().zip(&self.strides) {
            last = last.checked_add((size - 1).checked_mul(stride)?)?;
        }
        Some(self.offset..last.checked_add(1)?)
    }

    /// Checks that every reachable element lies inside a storage of
    /// `storage_len` elements.
    ///
    /// ```
    /// use tensorcomm::tensor::Layout;
    /// let layout = Layout::new(&[2, 3], &[3, 1], 2)?;
    /// assert!(layout.check_fits(8).is_ok());
    /// assert!(layout.check_fits(7).is_err());
    /// # Ok::<(), tensorcomm::Error>(())
    /// ```
    pub fn check_fits(&self, storage_len: usize) -> Result<()> {
        if self.numel() == 0 {
            return Ok(());
        }
        match self.span() {
            Some(span) if span.end <= storage_len => Ok(()),
            span => Err(Error::InvalidLayout(format!(
                "shape {:?} with strides {:?} and offset {} reaches element {}, \
                 but the storage holds {storage_len} elements",
                self.shape,
                self.strides,
                self.offset,
                span.map_or_else(
                    || "beyond usize::MAX".to_string(),
                    |s| (s.end - 1).to_string()
                ),
            ))),
        }
    }

    /// The storage element of each logical element, in row-major logical
    /// order.
    ///
    /// ```
    /// use tensorcomm::tensor::Layout;
    /// let transposed = Layout::new(&[3, 2], &[1, 3], 0)?;
    /// assert_eq!(transposed.offsets().collect::<Vec<_>>(), [0, 3, 1, 4, 2, 5]);
    /// # Ok::<(), tensorcomm::Error>(())
    /// ```
    pub fn offsets(&self) -> Offsets<'_> {
        Offsets {
            layout: self,
            index: vec![0; self.ndim()],
            next: self.offset,
            remaining: self.numel(),
        }
    }

    /// The same layout with the dimensions reordered: dimension `i` of the
    /// result is dimension `dims[i]` of `self`.
    pub(crate) fn permuted(&self, dims: &[usize]) -> Layout {
        Layout {
            shape: dims.iter().map(|&d| self.shape[d]).collect(),
            strides: dims.iter().map(|&d| self.strides[d]).collect(),
            offset: self.offset,
        }
    }

    /// The same layout restricted to `start .. start + len` along `dim`.
    pub(crate) fn narrowed(&self, dim: usize, start: usize, len: usize) -> Layout {
        let mut out = self.clone();
        out.shape[dim] = len;
        if len > 0 {
            out.offset += start * self.strides[dim];
        }
        out
    }

    /// True when some dimension of size > 1 has stride 0, so that writing
    /// through the layout would write one element several times (PyTorch's
    /// `has_internal_overlap() == YES`).
    pub(crate) fn has_zero_stride_overlap(&self) -> bool {
        self.shape
            .iter()
            .zip(&self.strides)
            .any(|(&size, &stride)| size > 1 && stride == 0)
    }
}

/// Iterator over the storage elements of a [`Layout`], in logical row-major
/// order. Made by [`Layout::offsets`].
#[derive(Debug, Clone)]
pub struct Offsets<'l> {
    layout: &'l Layout,
    index: Vec<usize>,
    next: usize,
    remaining: usize,
}

impl Iterator for Offsets<'_> {
    type Item = usize;

    fn next(&mut self) -> Option<usize> {
        if self.remaining == 0 {
            return None;
        }
        self.remaining -= 1;
        let current = self.next;
        // Advance the multi-index like an odometer, last dimension fastest.
        for d in (0..self.index.len()).rev() {
            // Wrapping: after the last element the odometer rolls over and
            // the value is never used; every yielded value is exact.
            self.index[d] += 1;
            self.next = self.next.wrapping_add(self.layout.strides[d]);
            if self.index[d] < self.layout.shape[d] {
                break;
            }
            let rollback = self.layout.strides[d].wrapping_mul(self.layout.shape[d]);
            self.next = self.next.wrapping_sub(rollback);
            self.index[d] = 0;
        }
        Some(current)
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        (self.remaining, Some(self.remaining))
    }
}

impl ExactSizeIterator for Offsets<'_> {}

/// Row-major strides of `shape` (size-0 dimensions count as size 1, as in
/// PyTorch).
///
/// ```
/// use tensorcomm::tensor::contiguous_strides;
/// assert_eq!(contiguous_strides(&[4, 0, 5]), [5, 5, 1]);
/// ```
pub fn contiguous_strides(shape: &[usize]) -> Vec<usize> {
    let mut strides = vec![1usize; shape.len()];
    for d in (0..shape.len().saturating_sub(1)).rev() {
        strides[d] = strides[d + 1].saturating_mul(shape[d + 1].max(1));
    }
    strides
}

/// Channels-last strides of a 4-D (NCHW → NHWC memory order) or 5-D
/// (NCDHW → NDHWC) shape.
///
/// ```
/// use tensorcomm::tensor::channels_last_strides;
/// assert_eq!(channels_last_strides(&[2, 3, 4, 5])?, [60, 1, 15, 3]);
/// # Ok::<(), tensorcomm::Error>(())
/// ```
pub fn channels_last_strides(shape: &[usize]) -> Result<Vec<usize>> {
    let order: &[usize] = match shape.len() {
        4 => &[1, 3, 2, 0],
        5 => &[1, 4, 3, 2, 0],
        n => {
            return Err(Error::InvalidLayout(format!(
                "channels-last needs a 4-D or 5-D shape, found {n}-D shape {shape:?}"
            )))
        }
    };
    let mut strides = vec![0usize; shape.len()];
    let mut next = 1usize;
    for &d in order {
        strides[d] = next;
        next = next.saturating_mul(shape[d].max(1));
    }
    Ok(strides)
}

/// Turns a possibly negative dimension index into `0..ndim`.
pub(crate) fn wrap_dim(dim: i64, ndim: usize) -> Result<usize> {
    let n = ndim as i64;
    let wrapped = if dim < 0 { dim + n } else { dim };
    if (0..n).contains(&wrapped) {
        Ok(wrapped as usize)
    } else {
        Err(Error::DimOutOfRange { dim, ndim })
    }
}

/// True when walking `order` (fastest dimension first) finds each stride
/// equal to the product of the sizes before it, skipping size-1 dimensions.
fn dense_in_order(shape: &[usize], strides: &[usize], order: impl Iterator<Item = usize>) -> bool {
    let mut expected = 1usize;
    for d in order {
        if shape[d] == 1 {
            continue;
        }
        if strides[d] != expected {
            return false;
        }
        expected = expected.saturating_mul(shape[d]);
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn contiguous_layouts_are_recognised() {
        assert!(Layout::contiguous(&[]).is_contiguous());
        assert!(Layout::contiguous(&[3, 4]).is_contiguous());
        assert!(Layout::new(&[3, 0], &[7, 7], 0).unwrap().is_contiguous());
        assert!(!Layout::new(&[3, 4], &[4, 2], 0).unwrap().is_contiguous());
    }

    #[test]
    fn channels_last_is_detected_for_4d_and_5d_only() {
        let cl = Layout::channels_last(&[2, 3, 4, 5]).unwrap();
        assert!(cl.is_channels_last());
        assert!(!cl.is_contiguous());
        assert!(!Layout::contiguous(&[2, 3, 4, 5]).is_channels_last());
        // One channel: both orders agree.
        let one_channel = Layout::contiguous(&[2, 1, 4, 5]);
        assert!(one_channel.is_contiguous() && one_channel.is_channels_last());
        let cl3d = Layout::channels_last(&[2, 3, 4, 5, 6]).unwrap();
        assert_eq!(cl3d.strides(), &[360, 1, 90, 18, 3]);
        assert!(cl3d.is_channels_last() && !cl3d.is_contiguous());
        assert!(!Layout::contiguous(&[2, 3, 4]).is_channels_last());
        assert!(matches!(
            Layout::channels_last(&[2, 3, 4]),
            Err(Error::InvalidLayout(msg)) if msg.contains("3-D")
        ));
    }

    #[test]
    fn non_overlapping_and_dense_matches_pytorch() {
        let noad = |shape: &[usize], strides: &[usize]| {
            Layout::new(shape, strides, 0)
                .unwrap()
                .is_non_overlapping_and_dense()
        };
        assert!(noad(&[], &[]));
        assert!(noad(&[5], &[1]));
        assert!(noad(&[1], &[9]));
        assert!(!noad(&[5], &[2]));
        assert!(noad(&[2, 3, 4], &[1, 8, 2])); // a permutation of contiguous
        assert!(noad(&[2, 1, 3], &[3, 100, 1])); // size-1 stride is free
        assert!(noad(&[2, 0, 3], &[0, 0, 0])); // empty
        assert!(!noad(&[2, 3], &[3, 2])); // overlapping
        assert!(!noad(&[2, 3], &[6, 1])); // gaps
        assert!(!noad(&[4, 4], &[0, 1])); // broadcast
    }

    #[test]
    fn span_and_fit_name_the_sizes() {
        let layout = Layout::new(&[2, 3], &[1, 2], 1).unwrap();
        assert_eq!(layout.span(), Some(1..7));
        assert!(layout.check_fits(7).is_ok());
        match layout.check_fits(6) {
            Err(Error::InvalidLayout(msg)) => {
                assert!(msg.contains("element 6"), "{msg}");
                assert!(msg.contains("holds 6 elements"), "{msg}");
            }
            other => panic!("{other:?}"),
        }
        let empty = Layout::new(&[0, 3], &[1000, 1000], 1000).unwrap();
        assert!(empty.check_fits(0).is_ok());
        let huge = Layout::new(&[3], &[usize::MAX], 0).unwrap();
        assert!(
            matches!(huge.check_fits(10), Err(Error::InvalidLayout(m)) if m.contains("usize::MAX"))
        );
    }

    #[test]
    fn offsets_walk_logical_order() {
        let layout = Layout::channels_last(&[1, 2, 2, 2]).unwrap();
        // NCHW logical order over NHWC memory.
        assert_eq!(
            layout.offsets().collect::<Vec<_>>(),
            [0, 2, 4, 6, 1, 3, 5, 7]
        );
        assert_eq!(Layout::contiguous(&[]).offsets().collect::<Vec<_>>(), [0]);
        assert_eq!(Layout::contiguous(&[2, 0]).offsets().count(), 0);
        let narrowed = Layout::contiguous(&[3, 4]).narrowed(1, 1, 2);
        assert_eq!(narrowed.offsets().collect::<Vec<_>>(), [1, 2, 5, 6, 9, 10]);
    }

    #[test]
    fn wrap_dim_accepts_negative_and_rejects_out_of_range() {
        assert_eq!(wrap_dim(-1, 3).unwrap(), 2);
        assert_eq!(wrap_dim(0, 3).unwrap(), 0);
        assert!(matches!(
            wrap_dim(3, 3),
            Err(Error::DimOutOfRange { dim: 3, ndim: 3 })
        ));
        assert!(matches!(
            wrap_dim(-4, 3),
            Err(Error::DimOutOfRange { dim: -4, ndim: 3 })
        ));
        assert!(matches!(wrap_dim(0, 0), Err(Error::DimOutOfRange { .. })));
    }

    #[test]
    fn mismatched_strides_are_rejected() {
        assert!(matches!(
            Layout::new(&[2, 2], &[1], 0),
            Err(Error::InvalidLayout(_))
        ));
    }
}
