//! The dense tensor handle: constructors and accessors.

use std::fmt;
use std::sync::Arc;

use super::layout::Layout;
use super::storage::{self, SharedStorage, Storage};
use super::{DType, Device, Element};
use crate::{Error, Result};

/// A dense tensor: a dtype and a [`Layout`] over a shared storage.
///
/// `Tensor<'a>` is a handle. Views ([`narrow`](Tensor::narrow),
/// [`chunk`](Tensor::chunk), [`permute`](Tensor::permute),
/// [`view`](Tensor::view), and `clone()`) share the storage, so writes
/// through one are visible through the others. The lifetime `'a` is that of
/// borrowed user memory ([`from_slice_mut`](Tensor::from_slice_mut)); tensors
/// that own their memory can have any lifetime, `'static` included.
///
/// Storage sits behind a read-write lock: any number of threads may read at
/// once; writes ([`copy_from`](Tensor::copy_from),
/// [`with_bytes_mut`](Tensor::with_bytes_mut), [`fill`](Tensor::fill)) wait
/// for exclusive access. Do not call a method that writes a tensor from
/// inside a [`with_bytes`](Tensor::with_bytes) or `with_bytes_mut` closure on
/// a tensor sharing its storage: the lock is not re-entrant.
///
/// ```
/// use tensorcomm::tensor::{DType, Tensor};
///
/// let t = Tensor::from_vec(vec![1i64, 2, 3, 4, 5, 6], &[2, 3])?;
/// assert_eq!((t.dtype(), t.shape(), t.strides()), (DType::I64, &[2, 3][..], &[3, 1][..]));
///
/// let column = t.narrow(1, 2, 1)?; // a view, not a copy
/// column.fill(0i64)?;
/// assert_eq!(t.to_vec::<i64>()?, [1, 2, 0, 4, 5, 0]);
/// assert!(column.shares_storage(&t));
/// # Ok::<(), tensorcomm::Error>(())
/// ```
pub struct Tensor<'a> {
    pub(super) storage: SharedStorage<'a>,
    pub(super) dtype: DType,
    pub(super) device: Device,
    pub(super) layout: Layout,
}

impl<'a> Tensor<'a> {
    /// Builds a handle after checking that `layout` fits the storage.
    /// Also refuses layouts whose element count or byte count does not fit
    /// (possible with zero strides), so `numel()` and `nbytes()` are exact.
    pub(super) fn with_storage(storage: Storage<'a>, dtype: DType, layout: Layout) -> Result<Self> {
        let numel = checked_numel(layout.shape())?;
        if numel
            .checked_mul(dtype.size())
            .is_none_or(|b| b > isize::MAX as usize)
        {
            return Err(Error::InvalidArgument(format!(
                "shape {:?} has {numel} {dtype} elements, more bytes than memory can address",
                layout.shape()
            )));
        }
        layout.check_fits(storage.nbytes() / dtype.size())?;
        let device = storage.device();
        Ok(Tensor {
            storage: storage.shared(),
            dtype,
            device,
            layout,
        })
    }

    /// Another handle on the same storage with a different layout.
    pub(super) fn view_with_layout(&self, layout: Layout) -> Self {
        Tensor {
            storage: Arc::clone(&self.storage),
            dtype: self.dtype,
            device: self.device,
            layout,
        }
    }

    /// A tensor owning `data`, in row-major order with `shape`. No copy: the
    /// tensor keeps the `Vec`, and [`into_vec`](Tensor::into_vec) gives it
    /// back.
    ///
    /// ```
    /// use tensorcomm::tensor::Tensor;
    /// let t = Tensor::from_vec(vec![0.5f32; 6], &[3, 2])?;
    /// assert_eq!(t.numel(), 6);
    /// assert!(Tensor::from_vec(vec![0.5f32; 5], &[3, 2]).is_err());
    /// # Ok::<(), tensorcomm::Error>(())
    /// ```
    pub fn from_vec<T: Element>(data: Vec<T>, shape: &[usize]) -> Result<Self> {
        check_numel("Tensor::from_vec", shape, data.len())?;
        Self::with_storage(Storage::from_vec(data), T::DTYPE, Layout::contiguous(shape))
    }

    /// A contiguous tensor of `shape` over host memory another layer of the
    /// crate manages (`buffer` must hold exactly its bytes).
    pub(crate) fn from_host_buffer(
        buffer: Box<dyn super::HostBuffer>,
        dtype: DType,
        shape: &[usize],
    ) -> Result<Tensor<'static>> {
        Tensor::with_storage(
            Storage::from_host_buffer(buffer),
            dtype,
            Layout::contiguous(shape),
        )
    }

    /// A tensor owning `data` laid out as `layout` (for example
    /// channels-last data). No copy.
    ///
    /// ```
    /// use tensorcomm::tensor::{Layout, Tensor};
    /// // Logical [1, 2, 1, 2] (NCHW) stored as NHWC: memory is w0c0 w0c1 w1c0 w1c1.
    /// let layout = Layout::channels_last(&[1, 2, 1, 2])?;
    /// let t = Tensor::from_vec_with_layout(vec![1u8, 10, 2, 20], layout)?;
    /// assert_eq!(t.to_vec::<u8>()?, [1, 2, 10, 20]);
    /// # Ok::<(), tensorcomm::Error>(())
    /// ```
    pub fn from_vec_with_layout<T: Element>(data: Vec<T>, layout: Layout) -> Result<Self> {
        Self::with_storage(Storage::from_vec(data), T::DTYPE, layout)
    }

    /// A tensor viewing the caller's memory for `'a`, in row-major order with
    /// `shape`. No copy: writes through the tensor land in `data`.
    ///
    /// ```
    /// use tensorcomm::tensor::Tensor;
    /// let mut grads = [0.0f64; 4];
    /// {
    ///     let t = Tensor::from_slice_mut(&mut grads, &[2, 2])?;
    ///     t.narrow(0, 1, 1)?.fill(1.5f64)?;
    /// }
    /// assert_eq!(grads, [0.0, 0.0, 1.5, 1.5]);
    /// # Ok::<(), tensorcomm::Error>(())
    /// ```
    pub fn from_slice_mut<T: Element>(data: &'a mut [T], shape: &[usize]) -> Result<Self> {
        check_numel("Tensor::from_slice_mut", shape, data.len())?;
        let bytes: &'a mut [u8] = bytemuck::cast_slice_mut(data);
        Self::with_storage(
            Storage::borrowed(bytes),
            T::DTYPE,
            Layout::contiguous(shape),
        )
    }

    /// A tensor owning a copy of `data`, in row-major order with `shape`.
    ///
    /// ```
    /// use tensorcomm::tensor::Tensor;
    /// let t = Tensor::from_slice(&[1i32, 2, 3], &[3])?;
    /// assert_eq!(t.to_vec::<i32>()?, [1, 2, 3]);
    /// # Ok::<(), tensorcomm::Error>(())
    /// ```
    pub fn from_slice<T: Element>(data: &[T], shape: &[usize]) -> Result<Self> {
        Self::from_vec(data.to_vec(), shape)
    }

    /// A [`DType::Bool`] tensor holding a copy of `data` (stored as bytes 0
    /// and 1).
    ///
    /// ```
    /// use tensorcomm::tensor::{DType, Tensor};
    /// let mask = Tensor::from_bools(&[true, false, true], &[3])?;
    /// assert_eq!(mask.dtype(), DType::Bool);
    /// assert_eq!(mask.to_vec_bool()?, [true, false, true]);
    /// # Ok::<(), tensorcomm::Error>(())
    /// ```
    pub fn from_bools(data: &[bool], shape: &[usize]) -> Result<Self> {
        check_numel("Tensor::from_bools", shape, data.len())?;
        let bytes: Vec<u8> = data.iter().map(|&b| u8::from(b)).collect();
        Self::with_storage(
            Storage::from_vec(bytes),
            DType::Bool,
            Layout::contiguous(shape),
        )
    }

    /// A [`DType::Bool`] tensor owning `bytes`, each of which must be 0 or 1,
    /// without copying; [`into_bool_bytes`](Tensor::into_bool_bytes) gives
    /// the `Vec` back.
    ///
    /// ```
    /// use tensorcomm::tensor::Tensor;
    /// let mask = Tensor::from_bool_bytes(vec![0, 1, 1], &[3])?;
    /// assert_eq!(mask.to_vec_bool()?, [false, true, true]);
    /// assert!(Tensor::from_bool_bytes(vec![0, 2], &[2]).is_err());
    /// # Ok::<(), tensorcomm::Error>(())
    /// ```
    pub fn from_bool_bytes(bytes: Vec<u8>, shape: &[usize]) -> Result<Self> {
        check_numel("Tensor::from_bool_bytes", shape, bytes.len())?;
        check_bool_bytes(&bytes)?;
        Self::with_storage(
            Storage::from_vec(bytes),
            DType::Bool,
            Layout::contiguous(shape),
        )
    }

    /// A [`DType::Bool`] tensor viewing the caller's bytes (each 0 or 1) for
    /// `'a`. No copy.
    ///
    /// ```
    /// use tensorcomm::tensor::Tensor;
    /// let mut mask = [0u8; 2];
    /// Tensor::from_bool_bytes_mut(&mut mask, &[2])?.copy_from(&Tensor::from_bools(&[true, false], &[2])?)?;
    /// assert_eq!(mask, [1, 0]);
    /// # Ok::<(), tensorcomm::Error>(())
    /// ```
    pub fn from_bool_bytes_mut(bytes: &'a mut [u8], shape: &[usize]) -> Result<Self> {
        check_numel("Tensor::from_bool_bytes_mut", shape, bytes.len())?;
        check_bool_bytes(bytes)?;
        Self::with_storage(
            Storage::borrowed(bytes),
            DType::Bool,
            Layout::contiguous(shape),
        )
    }

    /// A zero-filled contiguous tensor (`false` for bool).
    ///
    /// ```
    /// use tensorcomm::tensor::{DType, Tensor};
    /// let t = Tensor::zeros(&[2, 3], DType::BF16)?;
    /// assert_eq!(t.to_vec::<half::bf16>()?, vec![half::bf16::ZERO; 6]);
    /// # Ok::<(), tensorcomm::Error>(())
    /// ```
    pub fn zeros(shape: &[usize], dtype: DType) -> Result<Self> {
        Self::zeros_with_layout(Layout::contiguous(shape), dtype)
    }

    /// A zero-filled tensor with the given strides, over a storage just large
    /// enough for them (PyTorch's `empty_strided`, but zeroed: this crate
    /// never hands out uninitialised memory).
    ///
    /// ```
    /// use tensorcomm::tensor::{DType, Tensor};
    /// let t = Tensor::empty_with_strides(&[2, 3], &[1, 2], DType::F32)?;
    /// assert!(t.is_non_overlapping_and_dense() && !t.is_contiguous());
    /// assert_eq!(t.storage_nbytes(), 24);
    /// # Ok::<(), tensorcomm::Error>(())
    /// ```
    pub fn empty_with_strides(shape: &[usize], strides: &[usize], dtype: DType) -> Result<Self> {
        Self::zeros_with_layout(Layout::new(shape, strides, 0)?, dtype)
    }

    /// A zero-filled 4-D (NCHW) or 5-D (NCDHW) tensor stored channels-last.
    ///
    /// ```
    /// use tensorcomm::tensor::{DType, Tensor};
    /// let t = Tensor::zeros_channels_last(&[8, 3, 32, 32], DType::F16)?;
    /// assert!(t.is_channels_last());
    /// assert_eq!(t.strides(), &[3072, 1, 96, 3]);
    /// # Ok::<(), tensorcomm::Error>(())
    /// ```
    pub fn zeros_channels_last(shape: &[usize], dtype: DType) -> Result<Self> {
        Self::zeros_with_layout(Layout::channels_last(shape)?, dtype)
    }

    /// A zero-filled tensor with `layout` over a fresh storage that ends at
    /// the layout's last reachable element.
    pub(super) fn zeros_with_layout(layout: Layout, dtype: DType) -> Result<Self> {
        checked_numel(layout.shape())?;
        let len = match layout.numel() {
            0 => 0,
            _ => layout.span().map(|s| s.end).ok_or_else(|| {
                Error::InvalidLayout(format!(
                    "shape {:?} with strides {:?} and offset {} reaches beyond usize::MAX elements",
                    layout.shape(),
                    layout.strides(),
                    layout.offset()
                ))
            })?,
        };
        if len
            .checked_mul(dtype.size())
            .is_none_or(|b| b > isize::MAX as usize)
        {
            return Err(Error::InvalidArgument(format!(
                "a storage of {len} {dtype} elements is larger than memory can address"
            )));
        }
        Self::with_storage(Storage::zeros(dtype, len), dtype, layout)
    }

    /// A zero-filled tensor of the same shape, dtype and device. When `self`
    /// is non-overlapping and dense (contiguous or permuted, such as
    /// channels-last) it has the same strides, so raw bytes copy between the
    /// two; otherwise it is contiguous. PyTorch's `empty_like` with
    /// `preserve_format`, zeroed.
    ///
    /// ```
    /// use tensorcomm::tensor::{DType, Tensor};
    /// let src = Tensor::zeros_channels_last(&[2, 3, 4, 4], DType::F32)?;
    /// let dst = src.empty_like_preserving_layout()?;
    /// assert_eq!(dst.strides(), src.strides());
    /// assert!(!dst.shares_storage(&src));
    /// # Ok::<(), tensorcomm::Error>(())
    /// ```
    pub fn empty_like_preserving_layout<'b>(&self) -> Result<Tensor<'b>> {
        let layout = if self.layout.is_non_overlapping_and_dense() {
            Layout::new(self.shape(), self.strides(), 0)?
        } else {
            Layout::contiguous(self.shape())
        };
        Tensor::zeros_with_layout(layout, self.dtype)
    }

    /// The element type.
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// The device holding the storage.
    pub fn device(&self) -> Device {
        self.device
    }

    /// The shape, strides and offset.
    pub fn layout(&self) -> &Layout {
        &self.layout
    }

    /// Size of each dimension.
    pub fn shape(&self) -> &[usize] {
        self.layout.shape()
    }

    /// Step, in elements, between neighbours along each dimension.
    pub fn strides(&self) -> &[usize] {
        self.layout.strides()
    }

    /// Storage element of the first logical element.
    pub fn offset(&self) -> usize {
        self.layout.offset()
    }

    /// Number of dimensions.
    pub fn dim(&self) -> usize {
        self.layout.ndim()
    }

    /// Number of elements.
    pub fn numel(&self) -> usize {
        self.layout.numel()
    }

    /// Bytes of the elements: `numel() * dtype().size()`.
    pub fn nbytes(&self) -> usize {
        self.numel() * self.dtype.size()
    }

    /// Bytes of the whole storage this tensor views (at least the bytes it
    /// can reach).
    pub fn storage_nbytes(&self) -> usize {
        storage::read(&self.storage).nbytes()
    }

    /// See [`Layout::is_contiguous`].
    pub fn is_contiguous(&self) -> bool {
        self.layout.is_contiguous()
    }

    /// See [`Layout::is_channels_last`].
    pub fn is_channels_last(&self) -> bool {
        self.layout.is_channels_last()
    }

    /// See [`Layout::is_non_overlapping_and_dense`].
    pub fn is_non_overlapping_and_dense(&self) -> bool {
        self.layout.is_non_overlapping_and_dense()
    }

    /// True when both handles view the same storage (they may still view
    /// different elements of it).
    ///
    /// ```
    /// use tensorcomm::tensor::{DType, Tensor};
    /// let a = Tensor::zeros(&[4], DType::U8)?;
    /// let b = Tensor::zeros(&[4], DType::U8)?;
    /// assert!(a.narrow(0, 2, 2)?.shares_storage(&a));
    /// assert!(!a.shares_storage(&b));
    /// # Ok::<(), tensorcomm::Error>(())
    /// ```
    pub fn shares_storage(&self, other: &Tensor<'_>) -> bool {
        std::ptr::addr_eq(Arc::as_ptr(&self.storage), Arc::as_ptr(&other.storage))
    }

    /// Number of handles (this one included) sharing this tensor's storage.
    pub fn storage_handle_count(&self) -> usize {
        Arc::strong_count(&self.storage)
    }
}

/// A new handle on the same storage (like `Arc::clone`), not a copy of the
/// elements; use [`Tensor::contiguous`] for a copy.
impl Clone for Tensor<'_> {
    fn clone(&self) -> Self {
        self.view_with_layout(self.layout.clone())
    }
}

impl fmt::Debug for Tensor<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Tensor")
            .field("dtype", &self.dtype)
            .field("device", &self.device)
            .field("shape", &self.shape())
            .field("strides", &self.strides())
            .field("offset", &self.offset())
            .finish()
    }
}

/// The product of `shape`, or an error when it does not fit in `usize`.
pub(super) fn checked_numel(shape: &[usize]) -> Result<usize> {
    shape
        .iter()
        .try_fold(1usize, |n, &s| n.checked_mul(s))
        .ok_or_else(|| {
            Error::InvalidArgument(format!(
                "shape {shape:?} has more elements than fit in usize"
            ))
        })
}

/// Checks that `shape` has exactly `len` elements.
fn check_numel(context: &str, shape: &[usize], len: usize) -> Result<()> {
    if checked_numel(shape)? != len {
        return Err(Error::ShapeMismatch {
            context: format!("{context}: shape {shape:?} needs as many elements as the data has"),
            expected: shape.to_vec(),
            found: vec![len],
        });
    }
    Ok(())
}

/// Checks that every byte is 0 or 1, naming the first one that is not.
pub(super) fn check_bool_bytes(bytes: &[u8]) -> Result<()> {
    match bytes.iter().position(|&b| b > 1) {
        None => Ok(()),
        Some(i) => Err(Error::InvalidArgument(format!(
            "bool tensors hold bytes 0 or 1, found {} at position {i}",
            bytes[i]
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn constructors_check_element_counts() {
        match Tensor::from_vec(vec![1u8; 5], &[2, 3]) {
            Err(Error::ShapeMismatch {
                expected, found, ..
            }) => {
                assert_eq!(expected, [2, 3]);
                assert_eq!(found, [5]);
            }
            other => panic!("{other:?}"),
        }
        let mut data = [0i32; 3];
        assert!(matches!(
            Tensor::from_slice_mut(&mut data, &[4]),
            Err(Error::ShapeMismatch { .. })
        ));
        assert!(matches!(
            Tensor::from_bools(&[true], &[2]),
            Err(Error::ShapeMismatch { .. })
        ));
        assert!(matches!(
            Tensor::from_vec(vec![0u8; 0], &[usize::MAX, 2]),
            Err(Error::InvalidArgument(m)) if m.contains("more elements")
        ));
    }

    #[test]
    fn bool_bytes_other_than_0_and_1_are_rejected_with_position() {
        match Tensor::from_bool_bytes(vec![0, 1, 7], &[3]) {
            Err(Error::InvalidArgument(msg)) => {
                assert!(msg.contains("found 7 at position 2"), "{msg}")
            }
            other => panic!("{other:?}"),
        }
        let mut bytes = [3u8];
        assert!(matches!(
            Tensor::from_bool_bytes_mut(&mut bytes, &[1]),
            Err(Error::InvalidArgument(_))
        ));
    }

    #[test]
    fn layouts_that_do_not_fit_the_storage_are_rejected() {
        let layout = Layout::new(&[2, 2], &[3, 1], 0).unwrap();
        assert!(matches!(
            Tensor::from_vec_with_layout(vec![0f32; 4], layout.clone()),
            Err(Error::InvalidLayout(_))
        ));
        assert!(Tensor::from_vec_with_layout(vec![0f32; 5], layout).is_ok());
        assert!(matches!(
            Tensor::empty_with_strides(&[2, 2], &[1], DType::F32),
            Err(Error::InvalidLayout(_))
        ));
        assert!(matches!(
            Tensor::empty_with_strides(&[3], &[usize::MAX], DType::F32),
            Err(Error::InvalidLayout(_))
        ));
        assert!(matches!(
            Tensor::zeros(&[usize::MAX / 2], DType::F64),
            Err(Error::InvalidArgument(_))
        ));
        // Zero strides make a small storage look huge: still refused.
        let broadcast = Layout::new(&[usize::MAX, 2], &[0, 0], 0).unwrap();
        assert!(matches!(
            Tensor::from_vec_with_layout(vec![1u8], broadcast),
            Err(Error::InvalidArgument(m)) if m.contains("more elements")
        ));
        let broadcast = Layout::new(&[usize::MAX / 4], &[0], 0).unwrap();
        assert!(matches!(
            Tensor::from_vec_with_layout(vec![1i64], broadcast),
            Err(Error::InvalidArgument(m)) if m.contains("more bytes")
        ));
    }

    #[test]
    fn accessors_describe_the_tensor() {
        let t = Tensor::zeros_channels_last(&[2, 3, 4, 5], DType::I32).unwrap();
        assert_eq!(t.dtype(), DType::I32);
        assert_eq!(t.device(), Device::Cpu);
        assert_eq!(t.shape(), &[2, 3, 4, 5]);
        assert_eq!(t.strides(), &[60, 1, 15, 3]);
        assert_eq!(
            (t.offset(), t.dim(), t.numel(), t.nbytes()),
            (0, 4, 120, 480)
        );
        assert_eq!(t.storage_nbytes(), 480);
        assert!(t.is_channels_last() && !t.is_contiguous() && t.is_non_overlapping_and_dense());
        let scalar = Tensor::from_vec(vec![3i64], &[]).unwrap();
        assert_eq!((scalar.dim(), scalar.numel()), (0, 1));
        assert!(format!("{t:?}").contains("strides: [60, 1, 15, 3]"));
    }

    #[test]
    fn empty_like_preserves_dense_strides_and_falls_back_to_contiguous() {
        let permuted = Tensor::empty_with_strides(&[2, 3, 4], &[1, 8, 2], DType::U8).unwrap();
        let like = permuted.empty_like_preserving_layout().unwrap();
        assert_eq!(like.strides(), &[1, 8, 2]);
        assert_eq!(like.storage_nbytes(), 24);
        let gappy = Tensor::empty_with_strides(&[2, 3], &[8, 2], DType::U8).unwrap();
        let like = gappy.empty_like_preserving_layout().unwrap();
        assert_eq!(like.strides(), &[3, 1]);
        // An offset view keeps its strides but starts at 0 in the new storage.
        let view = Tensor::zeros(&[4, 3], DType::F64)
            .unwrap()
            .narrow(0, 2, 2)
            .unwrap();
        let like = view.empty_like_preserving_layout().unwrap();
        assert_eq!((like.offset(), like.storage_nbytes()), (0, 48));
    }

    #[test]
    fn tensors_can_cross_threads() {
        fn send_sync<T: Send + Sync>() {}
        send_sync::<Tensor<'static>>();
        send_sync::<Tensor<'_>>();
        send_sync::<crate::tensor::SparseTensor>();
    }

    #[test]
    fn clone_is_a_handle_not_a_copy() {
        let t = Tensor::zeros(&[3], DType::I8).unwrap();
        let c = t.clone();
        assert!(c.shares_storage(&t));
        assert_eq!(t.storage_handle_count(), 2);
        c.fill(5i8).unwrap();
        assert_eq!(t.to_vec::<i8>().unwrap(), [5, 5, 5]);
    }
}
