//! Reading and writing elements by logical index: `to_vec`, `copy_from`,
//! `contiguous`, `fill`.

use super::dense::Tensor;
use super::layout::Layout;
use super::storage;
use super::{DType, Element};
use crate::{Error, Result};

impl<'a> Tensor<'a> {
    /// The elements in logical row-major order, whatever the layout.
    /// `T` must be the tensor's dtype.
    ///
    /// ```
    /// use tensorcomm::tensor::Tensor;
    /// let t = Tensor::from_vec(vec![1.0f32, 2.0, 3.0, 4.0], &[2, 2])?;
    /// assert_eq!(t.permute(&[1, 0])?.to_vec::<f32>()?, [1.0, 3.0, 2.0, 4.0]);
    /// assert!(t.to_vec::<f64>().is_err());
    /// # Ok::<(), tensorcomm::Error>(())
    /// ```
    pub fn to_vec<T: Element>(&self) -> Result<Vec<T>> {
        self.check_dtype(T::DTYPE, "to_vec")?;
        #[cfg(feature = "cuda")]
        if self.device.is_cuda() {
            return self.to_device(super::Device::Cpu)?.to_vec();
        }
        let mut out = vec![<T as bytemuck::Zeroable>::zeroed(); self.numel()];
        let guard = storage::read(&self.storage);
        copy_elements(
            bytemuck::cast_slice_mut(&mut out),
            &Layout::contiguous(self.shape()),
            guard.bytes()?,
            &self.layout,
            self.dtype.size(),
        );
        Ok(out)
    }

    /// The elements of a [`DType::Bool`] tensor in logical row-major order.
    ///
    /// ```
    /// use tensorcomm::tensor::Tensor;
    /// let t = Tensor::from_bools(&[true, false, false, true], &[2, 2])?;
    /// assert_eq!(t.permute(&[1, 0])?.to_vec_bool()?, [true, false, false, true]);
    /// # Ok::<(), tensorcomm::Error>(())
    /// ```
    pub fn to_vec_bool(&self) -> Result<Vec<bool>> {
        self.check_dtype(DType::Bool, "to_vec_bool")?;
        #[cfg(feature = "cuda")]
        if self.device.is_cuda() {
            return self.to_device(super::Device::Cpu)?.to_vec_bool();
        }
        let mut bytes = vec![0u8; self.numel()];
        let guard = storage::read(&self.storage);
        copy_elements(
            &mut bytes,
            &Layout::contiguous(self.shape()),
            guard.bytes()?,
            &self.layout,
            1,
        );
        Ok(bytes.into_iter().map(|b| b != 0).collect())
    }

    /// Copies `src` into `self` element by element (by logical index): same
    /// shape and dtype, any layouts. When both are dense in the same order
    /// (identical strides), the span is copied as one block. `src` may share
    /// storage with `self`, even overlap it.
    ///
    /// ```
    /// use tensorcomm::tensor::{DType, Tensor};
    /// let src = Tensor::from_vec((0..24u8).collect(), &[1, 2, 3, 4])?;
    /// let dst = Tensor::zeros_channels_last(&[1, 2, 3, 4], DType::U8)?;
    /// dst.copy_from(&src)?;
    /// assert_eq!(dst.to_vec::<u8>()?, src.to_vec::<u8>()?);
    /// assert!(dst.is_channels_last());
    /// # Ok::<(), tensorcomm::Error>(())
    /// ```
    pub fn copy_from(&self, src: &Tensor<'_>) -> Result<()> {
        if self.shape() != src.shape() {
            return Err(Error::ShapeMismatch {
                context: "copy_from: the source must have the destination's shape".into(),
                expected: self.shape().to_vec(),
                found: src.shape().to_vec(),
            });
        }
        if src.dtype != self.dtype {
            return Err(Error::DTypeMismatch {
                context: "copy_from: the source must have the destination's dtype".into(),
                expected: self.dtype,
                found: src.dtype,
            });
        }
        self.check_writable("copy_from")?;
        if self.numel() == 0 {
            return Ok(());
        }
        #[cfg(feature = "cuda")]
        if self.device.is_cuda() || src.device.is_cuda() {
            return super::cuda::copy_between(self, src);
        }
        let size = self.dtype.size();
        if self.shares_storage(src) {
            if self.layout == src.layout {
                return Ok(());
            }
            // Gather first so that overlapping source and destination work.
            let mut guard = storage::write(&self.storage);
            let mut staged = vec![0u8; self.nbytes()];
            let staged_layout = Layout::contiguous(self.shape());
            copy_elements(
                &mut staged,
                &staged_layout,
                guard.bytes()?,
                &src.layout,
                size,
            );
            copy_elements(
                guard.bytes_mut()?,
                &self.layout,
                &staged,
                &staged_layout,
                size,
            );
            return Ok(());
        }
        let (mut dst_guard, src_guard) = storage::write_and_read(&self.storage, &src.storage);
        copy_elements(
            dst_guard.bytes_mut()?,
            &self.layout,
            src_guard.bytes()?,
            &src.layout,
            size,
        );
        Ok(())
    }

    /// A copy of the elements in a fresh contiguous tensor that owns its
    /// memory (so it can have any lifetime, `'static` included).
    ///
    /// ```
    /// use tensorcomm::tensor::Tensor;
    /// let t = Tensor::from_vec((0..6i32).collect(), &[2, 3])?;
    /// let c = t.permute(&[1, 0])?.contiguous()?;
    /// assert!(c.is_contiguous() && !c.shares_storage(&t));
    /// assert_eq!(c.into_vec::<i32>()?, [0, 3, 1, 4, 2, 5]);
    /// # Ok::<(), tensorcomm::Error>(())
    /// ```
    pub fn contiguous<'b>(&self) -> Result<Tensor<'b>> {
        let out = Tensor::zeros(self.shape(), self.dtype)?;
        out.copy_from(self)?;
        Ok(out)
    }

    /// Sets every element to `value`; `T` must be the tensor's dtype.
    ///
    /// ```
    /// use tensorcomm::tensor::{DType, Tensor};
    /// let t = Tensor::zeros(&[3], DType::F16)?;
    /// t.fill(half::f16::ONE)?;
    /// assert_eq!(t.to_vec::<half::f16>()?, vec![half::f16::ONE; 3]);
    /// assert!(t.fill(1.0f32).is_err());
    /// # Ok::<(), tensorcomm::Error>(())
    /// ```
    pub fn fill<T: Element>(&self, value: T) -> Result<()> {
        self.check_dtype(T::DTYPE, "fill")?;
        self.fill_element(bytemuck::bytes_of(&value))
    }

    /// Sets every element of a [`DType::Bool`] tensor to `value`.
    ///
    /// ```
    /// use tensorcomm::tensor::{DType, Tensor};
    /// let t = Tensor::zeros(&[2], DType::Bool)?;
    /// t.fill_bool(true)?;
    /// assert_eq!(t.to_vec_bool()?, [true, true]);
    /// # Ok::<(), tensorcomm::Error>(())
    /// ```
    pub fn fill_bool(&self, value: bool) -> Result<()> {
        self.check_dtype(DType::Bool, "fill_bool")?;
        self.fill_element(&[u8::from(value)])
    }

    /// Sets every element to zero (`false` for bool), whatever the dtype.
    ///
    /// ```
    /// use tensorcomm::tensor::Tensor;
    /// let t = Tensor::from_vec(vec![1i64, 2], &[2])?;
    /// t.fill_zeros()?;
    /// assert_eq!(t.to_vec::<i64>()?, [0, 0]);
    /// # Ok::<(), tensorcomm::Error>(())
    /// ```
    pub fn fill_zeros(&self) -> Result<()> {
        self.fill_element(&vec![0u8; self.dtype.size()])
    }

    /// Writes the `dtype.size()` bytes of `element` at every element.
    fn fill_element(&self, element: &[u8]) -> Result<()> {
        let size = element.len();
        let mut guard = storage::write(&self.storage);
        let bytes = guard.bytes_mut()?;
        match self.layout.span() {
            Some(span) if self.layout.is_non_overlapping_and_dense() => {
                fill_repeating(&mut bytes[span.start * size..span.end * size], element);
            }
            _ => {
                for offset in self.layout.offsets() {
                    bytes[offset * size..(offset + 1) * size].copy_from_slice(element);
                }
            }
        }
        Ok(())
    }

    /// Errors unless the tensor's dtype is `expected`.
    pub(super) fn check_dtype(&self, expected: DType, op: &str) -> Result<()> {
        if self.dtype != expected {
            return Err(Error::DTypeMismatch {
                context: format!("{op} on a tensor of shape {:?}", self.shape()),
                expected,
                found: self.dtype,
            });
        }
        Ok(())
    }

    /// Errors when writing would store to one element through several
    /// logical indices (a stride of 0 on a dimension of size > 1).
    pub(super) fn check_writable(&self, op: &str) -> Result<()> {
        if self.layout.has_zero_stride_overlap() {
            return Err(Error::InvalidLayout(format!(
                "{op}: the destination (shape {:?}, strides {:?}) has several elements at one \
                 memory location; expected a layout without zero strides",
                self.shape(),
                self.strides()
            )));
        }
        Ok(())
    }
}

/// Copies the elements of `src` (viewed through `src_layout`) into `dst`
/// (through `dst_layout`), pairing them by logical index. Both layouts have
/// the same shape and fit their buffers.
pub(super) fn copy_elements(
    dst: &mut [u8],
    dst_layout: &Layout,
    src: &[u8],
    src_layout: &Layout,
    size: usize,
) {
    if let (Some(dst_span), Some(src_span)) = (dst_layout.span(), src_layout.span()) {
        if same_dense_order(dst_layout, src_layout) {
            dst[dst_span.start * size..dst_span.end * size]
                .copy_from_slice(&src[src_span.start * size..src_span.end * size]);
            return;
        }
    }
    for (d, s) in dst_layout.offsets().zip(src_layout.offsets()) {
        dst[d * size..(d + 1) * size].copy_from_slice(&src[s * size..(s + 1) * size]);
    }
}

/// True when both layouts are non-overlapping and dense with the same
/// strides on every dimension that has more than one element, so their
/// spans hold the elements in the same order.
pub(super) fn same_dense_order(a: &Layout, b: &Layout) -> bool {
    a.is_non_overlapping_and_dense()
        && b.is_non_overlapping_and_dense()
        && a.shape() == b.shape()
        && a.shape()
            .iter()
            .zip(a.strides().iter().zip(b.strides()))
            .all(|(&size, (sa, sb))| size < 2 || sa == sb)
}

/// Writes `element` over and over into `dst` (a whole number of
/// elements): a block of it repeated, copied block by block, so that
/// large fills run at memory speed rather than one element at a time.
fn fill_repeating(dst: &mut [u8], element: &[u8]) {
    const BLOCK_BYTES: usize = 4096;
    let block = element.repeat((BLOCK_BYTES / element.len()).max(1));
    let mut chunks = dst.chunks_exact_mut(block.len());
    for chunk in &mut chunks {
        chunk.copy_from_slice(&block);
    }
    let rest = chunks.into_remainder();
    rest.copy_from_slice(&block[..rest.len()]);
}

#[cfg(test)]
mod tests {
    use half::{bf16, f16};

    use super::*;

    #[test]
    fn to_vec_of_permuted_layouts_is_in_logical_order() {
        // NHWC memory for logical [1, 2, 2, 3] (N, C, H, W).
        let nhwc: Vec<i32> = (0..12).collect();
        let t = Tensor::from_vec_with_layout(nhwc, Layout::channels_last(&[1, 2, 2, 3]).unwrap())
            .unwrap();
        // Element (0, c, h, w) sits at h*6 + w*2 + c.
        let expected: Vec<i32> = (0..2)
            .flat_map(|c| (0..2).flat_map(move |h| (0..3).map(move |w| h * 6 + w * 2 + c)))
            .collect();
        assert_eq!(t.to_vec::<i32>().unwrap(), expected);
        let c = t.contiguous().unwrap();
        assert!(c.is_contiguous());
        assert_eq!(c.to_vec::<i32>().unwrap(), expected);
    }

    #[test]
    fn to_vec_and_fill_check_the_dtype() {
        let t = Tensor::zeros(&[2], DType::I32).unwrap();
        match t.to_vec::<i64>() {
            Err(Error::DTypeMismatch {
                expected, found, ..
            }) => {
                assert_eq!((expected, found), (DType::I64, DType::I32));
            }
            other => panic!("{other:?}"),
        }
        assert!(matches!(t.to_vec_bool(), Err(Error::DTypeMismatch { .. })));
        assert!(matches!(t.fill(1u8), Err(Error::DTypeMismatch { .. })));
        assert!(matches!(
            t.fill_bool(true),
            Err(Error::DTypeMismatch { .. })
        ));
        let b = Tensor::zeros(&[2], DType::Bool).unwrap();
        assert!(matches!(
            b.to_vec::<u8>(),
            Err(Error::DTypeMismatch {
                expected: DType::U8,
                found: DType::Bool,
                ..
            })
        ));
    }

    #[test]
    fn copy_from_checks_shape_dtype_and_overlap() {
        let dst = Tensor::zeros(&[2, 3], DType::F32).unwrap();
        match dst.copy_from(&Tensor::zeros(&[3, 2], DType::F32).unwrap()) {
            Err(Error::ShapeMismatch {
                expected, found, ..
            }) => {
                assert_eq!((expected, found), (vec![2, 3], vec![3, 2]));
            }
            other => panic!("{other:?}"),
        }
        match dst.copy_from(&Tensor::zeros(&[2, 3], DType::F64).unwrap()) {
            Err(Error::DTypeMismatch {
                expected, found, ..
            }) => {
                assert_eq!((expected, found), (DType::F32, DType::F64));
            }
            other => panic!("{other:?}"),
        }
        let broadcast = Tensor::empty_with_strides(&[2, 3], &[0, 1], DType::F32).unwrap();
        assert!(matches!(
            broadcast.copy_from(&dst),
            Err(Error::InvalidLayout(_))
        ));
        // Reading from an overlapping layout is fine.
        let src = Tensor::from_vec_with_layout(
            vec![1.0f32, 2.0, 3.0],
            Layout::new(&[2, 3], &[0, 1], 0).unwrap(),
        )
        .unwrap();
        dst.copy_from(&src).unwrap();
        assert_eq!(dst.to_vec::<f32>().unwrap(), [1.0, 2.0, 3.0, 1.0, 2.0, 3.0]);
    }

    #[test]
    fn copy_between_layouts_and_dtypes_keeps_values() {
        let values: Vec<bf16> = (0..24).map(|i| bf16::from_f32(i as f32 * 0.5)).collect();
        let src = Tensor::from_vec(values.clone(), &[2, 3, 2, 2]).unwrap();
        let cl = Tensor::zeros_channels_last(&[2, 3, 2, 2], DType::BF16).unwrap();
        cl.copy_from(&src).unwrap();
        let back = Tensor::zeros(&[2, 3, 2, 2], DType::BF16).unwrap();
        back.copy_from(&cl).unwrap();
        assert_eq!(back.to_vec::<bf16>().unwrap(), values);
        // Fast path: identical dense strides copy the span.
        let cl2 = cl.empty_like_preserving_layout().unwrap();
        cl2.copy_from(&cl).unwrap();
        assert_eq!(cl2.to_vec::<bf16>().unwrap(), values);
        cl2.with_bytes(|b2| cl.with_bytes(|b1| assert_eq!(b1, b2)).unwrap())
            .unwrap();
    }

    #[test]
    fn copy_within_one_storage_handles_overlap() {
        let t = Tensor::from_vec((0..6i64).collect(), &[6]).unwrap();
        let head = t.narrow(0, 0, 4).unwrap();
        let tail = t.narrow(0, 2, 4).unwrap();
        tail.copy_from(&head).unwrap();
        assert_eq!(t.to_vec::<i64>().unwrap(), [0, 1, 0, 1, 2, 3]);
        let m = Tensor::from_vec((0..4i64).collect(), &[2, 2]).unwrap();
        m.copy_from(&m.permute(&[1, 0]).unwrap()).unwrap();
        assert_eq!(m.to_vec::<i64>().unwrap(), [0, 2, 1, 3]);
        m.copy_from(&m.clone()).unwrap();
        assert_eq!(m.to_vec::<i64>().unwrap(), [0, 2, 1, 3]);
    }

    #[test]
    fn concurrent_opposite_copies_do_not_deadlock() {
        let a = Tensor::from_vec(vec![1u8; 1024], &[1024]).unwrap();
        let b = Tensor::from_vec(vec![2u8; 1024], &[1024]).unwrap();
        std::thread::scope(|s| {
            s.spawn(|| (0..200).for_each(|_| a.copy_from(&b).unwrap()));
            s.spawn(|| (0..200).for_each(|_| b.copy_from(&a).unwrap()));
        });
        assert_eq!(a.to_vec::<u8>().unwrap(), b.to_vec::<u8>().unwrap());
    }

    #[test]
    fn large_dense_fills_write_every_element_of_the_view_and_no_other() {
        // Several 4 KiB blocks and a remainder, at an offset: f32 and a
        // 2-byte dtype whose elements are not all one byte.
        let t = Tensor::zeros(&[5000], DType::F32).unwrap();
        t.narrow(0, 3, 4321).unwrap().fill(1.5f32).unwrap();
        let got = t.to_vec::<f32>().unwrap();
        assert!(got[..3].iter().all(|&v| v == 0.0));
        assert!(got[3..4324].iter().all(|&v| v == 1.5));
        assert!(got[4324..].iter().all(|&v| v == 0.0));
        let h = Tensor::zeros(&[3001], DType::F16).unwrap();
        h.fill(f16::from_f32(-2.25)).unwrap();
        assert!(h
            .to_vec::<f16>()
            .unwrap()
            .iter()
            .all(|v| v.to_f32() == -2.25));
    }

    #[test]
    fn fill_writes_only_the_view() {
        let t = Tensor::zeros(&[3, 3], DType::F16).unwrap();
        t.permute(&[1, 0])
            .unwrap()
            .narrow(0, 1, 1)
            .unwrap()
            .fill(f16::from_f32(2.0))
            .unwrap();
        let got: Vec<f32> = t
            .to_vec::<f16>()
            .unwrap()
            .into_iter()
            .map(f16::to_f32)
            .collect();
        assert_eq!(got, [0.0, 2.0, 0.0, 0.0, 2.0, 0.0, 0.0, 2.0, 0.0]);
        t.narrow(0, 0, 1).unwrap().fill_zeros().unwrap();
        t.fill_zeros().unwrap();
        assert!(t.to_vec::<f16>().unwrap().iter().all(|v| v.to_f32() == 0.0));
    }
}
