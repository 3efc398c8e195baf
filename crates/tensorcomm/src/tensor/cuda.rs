//! Tensors on GPUs: CUDA storage, zero-copy views of cudarc `CudaSlice<T>`,
//! and copies between host and devices and between devices.
//!
//! Every copy has finished when the call returns (the host may read or
//! free the memory at once). GPU memory comes from `cuMemAlloc` through
//! the runtime's per-device cache.

use std::marker::PhantomData;
use std::sync::Arc;

use cudarc::driver::{CudaSlice, DeviceRepr};

use super::data::same_dense_order;
use super::dense::{checked_numel, Tensor};
use super::layout::Layout;
use super::storage::{self, Memory, Storage};
use super::{DType, Device, Element};
use crate::cuda::kernels::{self, StridedArgs, MAX_DIMS};
use crate::cuda::runtime::{
    self, context, copy_dtod_async, copy_dtoh_sync, copy_htod_sync, Context, DeviceBuffer,
    DevicePtr, PinnedBuffer,
};
use crate::{Error, Result};

/// GPU memory behind a tensor.
pub(crate) enum CudaMemory<'a> {
    /// A buffer tensorcomm allocated.
    Owned(DeviceBuffer),
    /// A cudarc slice the tensor took over (kept alive, never copied).
    Slice {
        _keep: Box<dyn std::any::Any + Send + Sync>,
        ctx: Arc<Context>,
        ptr: DevicePtr,
        len: usize,
    },
    /// A cudarc slice borrowed from the caller for `'a`.
    Borrowed {
        ctx: Arc<Context>,
        ptr: DevicePtr,
        len: usize,
        _borrow: PhantomData<&'a mut [u8]>,
    },
}

impl CudaMemory<'_> {
    pub(crate) fn device(&self) -> usize {
        self.context().ordinal()
    }

    pub(crate) fn len(&self) -> usize {
        match self {
            CudaMemory::Owned(b) => b.len(),
            CudaMemory::Slice { len, .. } | CudaMemory::Borrowed { len, .. } => *len,
        }
    }

    pub(crate) fn context(&self) -> &Arc<Context> {
        match self {
            CudaMemory::Owned(b) => b.context(),
            CudaMemory::Slice { ctx, .. } | CudaMemory::Borrowed { ctx, .. } => ctx,
        }
    }

    pub(crate) fn ptr(&self) -> DevicePtr {
        match self {
            CudaMemory::Owned(b) => b.ptr(),
            CudaMemory::Slice { ptr, .. } | CudaMemory::Borrowed { ptr, .. } => *ptr,
        }
    }
}

impl<'a> Tensor<'a> {
    /// A zero-filled contiguous tensor on `device` (host or GPU).
    ///
    /// ```no_run
    /// use tensorcomm::tensor::{DType, Device, Tensor};
    /// let t = Tensor::zeros_on(&[2, 3], DType::F32, Device::Cuda(0))?;
    /// assert_eq!(t.device(), Device::Cuda(0));
    /// assert_eq!(t.to_vec::<f32>()?, [0.0; 6]);
    /// # Ok::<(), tensorcomm::Error>(())
    /// ```
    pub fn zeros_on(shape: &[usize], dtype: DType, device: Device) -> Result<Self> {
        Tensor::zeros_with_layout_on(Layout::contiguous(shape), dtype, device)
    }

    /// A zero-filled tensor on `device` with the same shape and dtype, and
    /// the same strides when `self` is non-overlapping and dense
    /// (channels-last stays channels-last).
    ///
    /// ```no_run
    /// use tensorcomm::tensor::{DType, Device, Tensor};
    /// let src = Tensor::zeros_channels_last(&[2, 3, 4, 4], DType::F16)?;
    /// let dst = src.empty_like_on(Device::Cuda(1))?;
    /// assert!(dst.is_channels_last() && dst.device() == Device::Cuda(1));
    /// # Ok::<(), tensorcomm::Error>(())
    /// ```
    pub fn empty_like_on<'b>(&self, device: Device) -> Result<Tensor<'b>> {
        Tensor::zeros_with_layout_on(preserved_layout(&self.layout)?, self.dtype, device)
    }

    /// A tensor in pinned (page-locked) host memory, zero-filled: copies
    /// between it and GPUs are faster than from ordinary host memory.
    ///
    /// ```no_run
    /// use tensorcomm::tensor::{DType, Device, Tensor};
    /// let staging = Tensor::zeros_pinned(&[1024], DType::F32)?;
    /// assert_eq!(staging.device(), Device::Cpu);
    /// # Ok::<(), tensorcomm::Error>(())
    /// ```
    pub fn zeros_pinned(shape: &[usize], dtype: DType) -> Result<Tensor<'static>> {
        let numel = checked_numel(shape)?;
        let bytes = numel.checked_mul(dtype.size()).ok_or_else(|| {
            Error::InvalidArgument(format!("shape {shape:?} is too large to allocate"))
        })?;
        let storage = Storage::from_memory(Memory::Pinned(PinnedBuffer::zeros(bytes)?));
        Tensor::with_storage(storage, dtype, Layout::contiguous(shape))
    }

    pub(super) fn zeros_with_layout_on(
        layout: Layout,
        dtype: DType,
        device: Device,
    ) -> Result<Self> {
        match device {
            Device::Cpu => Tensor::zeros_with_layout(layout, dtype),
            Device::Cuda(ordinal) => {
                let len = storage_len(&layout, dtype)?;
                let buffer = DeviceBuffer::zeros(ordinal, len)?;
                Tensor::on_buffer(buffer, dtype, layout)
            }
        }
    }

    /// A GPU tensor whose memory is not initialised: only for outputs that
    /// an operation writes completely before anyone can read them.
    pub(crate) fn uninit_cuda<'b>(
        layout: Layout,
        dtype: DType,
        ctx: &Arc<Context>,
    ) -> Result<Tensor<'b>> {
        let len = storage_len(&layout, dtype)?;
        let buffer = DeviceBuffer::uninit(ctx, len)?;
        Tensor::on_buffer(buffer, dtype, layout)
    }

    /// A zero-filled host tensor with `layout` (at offset 0).
    pub(crate) fn zeros_like_layout<'b>(layout: Layout, dtype: DType) -> Result<Tensor<'b>> {
        Tensor::zeros_with_layout(layout, dtype)
    }

    fn on_buffer<'b>(buffer: DeviceBuffer, dtype: DType, layout: Layout) -> Result<Tensor<'b>> {
        let storage = Storage::from_memory(Memory::Cuda(CudaMemory::Owned(buffer)));
        Tensor::with_storage(storage, dtype, layout)
    }

    /// A tensor over a cudarc `CudaSlice<T>`, taking it over without a
    /// copy (row-major `shape`). Work queued on the slice's stream is
    /// waited for first.
    ///
    /// ```no_run
    /// use tensorcomm::tensor::{Device, Tensor};
    /// let ctx = cudarc::driver::CudaContext::new(0).unwrap();
    /// let slice = ctx.default_stream().clone_htod(&[1.0f32, 2.0, 3.0, 4.0]).unwrap();
    /// let t = Tensor::from_cuda_slice(slice, &[2, 2])?;
    /// assert_eq!(t.device(), Device::Cuda(0));
    /// assert_eq!(t.to_vec::<f32>()?, [1.0, 2.0, 3.0, 4.0]);
    /// # Ok::<(), tensorcomm::Error>(())
    /// ```
    pub fn from_cuda_slice<T: Element + DeviceRepr>(
        slice: CudaSlice<T>,
        shape: &[usize],
    ) -> Result<Tensor<'static>> {
        check_slice_len(shape, slice.len())?;
        let (ctx, ptr, len) = runtime::cudarc_slice_parts(&slice)?;
        let memory = CudaMemory::Slice {
            _keep: Box::new(slice),
            ctx,
            ptr,
            len,
        };
        Tensor::with_storage(
            Storage::from_memory(Memory::Cuda(memory)),
            T::DTYPE,
            Layout::contiguous(shape),
        )
    }

    /// A tensor viewing a cudarc `CudaSlice<T>` borrowed for `'a` (no
    /// copy): writes through the tensor land in the slice. Work queued on
    /// the slice's stream is waited for first.
    ///
    /// ```no_run
    /// use tensorcomm::tensor::Tensor;
    /// let ctx = cudarc::driver::CudaContext::new(0).unwrap();
    /// let stream = ctx.default_stream();
    /// let mut grads = stream.alloc_zeros::<f32>(4).unwrap();
    /// {
    ///     let t = Tensor::from_cuda_slice_mut(&mut grads, &[4])?;
    ///     t.copy_from(&Tensor::from_vec(vec![1.0f32; 4], &[4])?)?;
    /// }
    /// assert_eq!(stream.clone_dtoh(&grads).unwrap(), [1.0; 4]);
    /// # Ok::<(), tensorcomm::Error>(())
    /// ```
    pub fn from_cuda_slice_mut<T: Element + DeviceRepr>(
        slice: &'a mut CudaSlice<T>,
        shape: &[usize],
    ) -> Result<Tensor<'a>> {
        check_slice_len(shape, slice.len())?;
        let (ctx, ptr, len) = runtime::cudarc_slice_parts(slice)?;
        let memory = CudaMemory::Borrowed {
            ctx,
            ptr,
            len,
            _borrow: PhantomData,
        };
        Tensor::with_storage(
            Storage::from_memory(Memory::Cuda(memory)),
            T::DTYPE,
            Layout::contiguous(shape),
        )
    }

    /// A tensor viewing GPU memory that another library owns (a PyTorch,
    /// CuPy or JAX array), from its raw device address: `ptr` is the
    /// address of the element at offset 0 on GPU `device`, and `layout`
    /// places the elements from there (no copy; writes land in that
    /// memory). This is how the Python package hands PyTorch's CUDA
    /// tensors to a group.
    ///
    /// ```no_run
    /// use tensorcomm::tensor::{DType, Device, Layout, Tensor};
    /// let ctx = cudarc::driver::CudaContext::new(0).unwrap();
    /// let slice = ctx.default_stream().clone_htod(&[1.0f32, 2.0, 3.0, 4.0]).unwrap();
    /// let address = {
    ///     use cudarc::driver::DevicePtr;
    ///     slice.device_ptr(&ctx.default_stream()).0
    /// };
    /// // SAFETY: `slice` outlives `t` and holds 4 f32 at `address`.
    /// let t = unsafe { Tensor::from_cuda_raw_parts(0, address, DType::F32, Layout::contiguous(&[2, 2]))? };
    /// assert_eq!(t.device(), Device::Cuda(0));
    /// assert_eq!(t.to_vec::<f32>()?, [1.0, 2.0, 3.0, 4.0]);
    /// # Ok::<(), tensorcomm::Error>(())
    /// ```
    ///
    /// # Safety
    ///
    /// `ptr` must be the address of live memory in the primary context of
    /// GPU `device` (where the CUDA runtime, and so PyTorch, allocates),
    /// holding every element `layout` reaches, and that memory must stay
    /// allocated and unused by anything else that writes it for as long as
    /// the tensor (or any collective using it) lives.
    pub unsafe fn from_cuda_raw_parts(
        device: usize,
        ptr: u64,
        dtype: DType,
        layout: Layout,
    ) -> Result<Tensor<'static>> {
        let len = storage_len(&layout, dtype)?;
        if len > 0 && (ptr == 0 || !ptr.is_multiple_of(dtype.size() as u64)) {
            return Err(Error::InvalidArgument(format!(
                "expected a device address aligned to its {dtype} elements ({} bytes), found {ptr:#x}",
                dtype.size()
            )));
        }
        let memory = CudaMemory::Borrowed {
            ctx: context(device)?,
            ptr: DevicePtr(ptr),
            len,
            _borrow: PhantomData,
        };
        Tensor::with_storage(Storage::from_memory(Memory::Cuda(memory)), dtype, layout)
    }

    /// A copy on `device` that owns its memory, with the same strides when
    /// `self` is non-overlapping and dense (contiguous otherwise).
    ///
    /// ```no_run
    /// use tensorcomm::tensor::{Device, Tensor};
    /// let host = Tensor::from_vec(vec![1i64, 2, 3], &[3])?;
    /// let gpu = host.to_device(Device::Cuda(0))?;
    /// assert_eq!(gpu.to_device(Device::Cpu)?.to_vec::<i64>()?, [1, 2, 3]);
    /// # Ok::<(), tensorcomm::Error>(())
    /// ```
    pub fn to_device(&self, device: Device) -> Result<Tensor<'static>> {
        let layout = preserved_layout(&self.layout)?;
        let out = match device {
            Device::Cpu => Tensor::zeros_with_layout(layout, self.dtype)?,
            Device::Cuda(ordinal) => Tensor::uninit_cuda(layout, self.dtype, &context(ordinal)?)?,
        };
        out.copy_from(self)?;
        Ok(out)
    }

    /// Queues a copy of `src` into `self` on `stream` and returns without
    /// waiting: both must be contiguous CUDA tensors of the same shape and
    /// dtype (on any GPUs that `stream`'s GPU reaches). Keep both until the
    /// stream has run the copy, as for any stream-ordered operation.
    ///
    /// ```no_run
    /// use tensorcomm::cuda::runtime::Stream;
    /// use tensorcomm::tensor::{DType, Device, Tensor};
    /// let a = Tensor::from_vec(vec![1f32, 2.0], &[2])?.to_device(Device::Cuda(0))?;
    /// let b = Tensor::zeros_on(&[2], DType::F32, Device::Cuda(0))?;
    /// let s = Stream::new(0)?;
    /// b.copy_from_on(&a, &s)?;
    /// s.synchronize()?;
    /// assert_eq!(b.to_vec::<f32>()?, [1.0, 2.0]);
    /// # Ok::<(), tensorcomm::Error>(())
    /// ```
    pub fn copy_from_on(
        &self,
        src: &Tensor<'_>,
        stream: &crate::cuda::runtime::Stream,
    ) -> Result<()> {
        if self.shape() != src.shape() || self.dtype != src.dtype {
            return Err(Error::InvalidArgument(format!(
                "copy_from_on: expected a source of shape {:?} and dtype {}, found {:?} and {}",
                self.shape(),
                self.dtype,
                src.shape(),
                src.dtype
            )));
        }
        if !self.is_contiguous() || !src.is_contiguous() {
            return Err(Error::InvalidArgument(
                "copy_from_on: expected contiguous tensors, found a strided one".into(),
            ));
        }
        self.check_writable("copy_from_on")?;
        let (dst_ctx, dst) = self.cuda_ptr()?;
        let (src_ctx, from) = src.cuda_ptr()?;
        crate::cuda::runtime::copy_dtod_async(&dst_ctx, dst, &src_ctx, from, self.nbytes(), stream)
    }

    /// A view of the elements of `self` (a contiguous 1-D run) with
    /// `like`'s shape and the strides its copies get (see
    /// [`preserved_layout_of`]), starting at `self`'s first element.
    pub(crate) fn as_strided_like(&self, like: &Tensor<'_>) -> Result<Tensor<'a>> {
        let target = preserved_layout_of(like)?;
        if target.numel() != self.numel() || !self.is_contiguous() {
            return Err(Error::InvalidLayout(format!(
                "as_strided_like: expected a contiguous run of {} elements, found shape {:?} with strides {:?}",
                target.numel(),
                self.shape(),
                self.strides()
            )));
        }
        let layout = Layout::new(target.shape(), target.strides(), self.offset())?;
        layout.check_fits(self.storage_nbytes() / self.dtype.size())?;
        Ok(self.view_with_layout(layout))
    }

    /// The GPU context and address of the tensor's first element (its
    /// storage element `offset`), for GPU tensors.
    pub(crate) fn cuda_ptr(&self) -> Result<(Arc<Context>, DevicePtr)> {
        let guard = storage::read(&self.storage);
        let mem = guard.cuda().ok_or_else(|| {
            Error::InvalidArgument(format!(
                "expected a CUDA tensor, found one on {}",
                self.device
            ))
        })?;
        Ok((
            Arc::clone(mem.context()),
            mem.ptr().offset(self.offset() * self.dtype.size()),
        ))
    }
}

/// The layout a copy of `layout` gets: its strides at offset 0 when it is
/// non-overlapping and dense, contiguous otherwise.
pub(crate) fn preserved_layout(layout: &Layout) -> Result<Layout> {
    if layout.is_non_overlapping_and_dense() {
        Layout::new(layout.shape(), layout.strides(), 0)
    } else {
        Ok(Layout::contiguous(layout.shape()))
    }
}

/// The layout PyTorch's `MemoryFormat::Preserve` gives a copy of `t`: the
/// same strides when it is non-overlapping and dense; else channels-last
/// when its strides are in channels-last order (a channel slice of an NHWC
/// tensor, say); else contiguous.
pub(crate) fn preserved_layout_of(t: &Tensor<'_>) -> Result<Layout> {
    let layout = &t.layout;
    if layout.is_non_overlapping_and_dense() {
        return preserved_layout(layout);
    }
    let order: &[usize] = match layout.ndim() {
        4 => &[1, 3, 2, 0],
        5 => &[1, 4, 3, 2, 0],
        _ => return Ok(Layout::contiguous(layout.shape())),
    };
    let strides: Vec<usize> = order
        .iter()
        .filter(|&&d| layout.shape()[d] > 1)
        .map(|&d| layout.strides()[d])
        .collect();
    if layout.shape()[1] > 1 && strides.windows(2).all(|w| w[0] < w[1]) {
        Layout::channels_last(layout.shape())
    } else {
        Ok(Layout::contiguous(layout.shape()))
    }
}

fn storage_len(layout: &Layout, dtype: DType) -> Result<usize> {
    checked_numel(layout.shape())?;
    let elements = match layout.span() {
        _ if layout.numel() == 0 => 0,
        Some(span) => span.end,
        None => {
            return Err(Error::InvalidLayout(format!(
                "shape {:?} with strides {:?} reaches beyond usize::MAX elements",
                layout.shape(),
                layout.strides()
            )))
        }
    };
    elements
        .checked_mul(dtype.size())
        .filter(|&b| b <= isize::MAX as usize)
        .ok_or_else(|| {
            Error::InvalidArgument(format!(
                "a storage of {elements} {dtype} elements is too large"
            ))
        })
}

fn check_slice_len(shape: &[usize], len: usize) -> Result<()> {
    if checked_numel(shape)? != len {
        return Err(Error::ShapeMismatch {
            context: format!(
                "a CudaSlice of {len} elements must have as many elements as the shape"
            ),
            expected: vec![len],
            found: shape.to_vec(),
        });
    }
    Ok(())
}

/// Merges dimensions that are contiguous with each other in both layouts
/// and drops size-1 dimensions, so a strided copy needs as few index
/// computations as possible. Returns (sizes, dst strides, src strides).
pub(crate) fn coalesce_dims(
    shape: &[usize],
    dst: &[usize],
    src: &[usize],
) -> (Vec<usize>, Vec<usize>, Vec<usize>) {
    let mut out: (Vec<usize>, Vec<usize>, Vec<usize>) = (Vec::new(), Vec::new(), Vec::new());
    for d in 0..shape.len() {
        if shape[d] == 1 {
            continue;
        }
        if let (Some(&size), Some(&ds), Some(&ss)) = (out.0.last(), out.1.last(), out.2.last()) {
            if ds == dst[d] * shape[d] && ss == src[d] * shape[d] {
                let n = out.0.len() - 1;
                out.0[n] = size * shape[d];
                out.1[n] = dst[d];
                out.2[n] = src[d];
                continue;
            }
        }
        out.0.push(shape[d]);
        out.1.push(dst[d]);
        out.2.push(src[d]);
    }
    out
}

/// The kernel arguments of an element copy between two layouts of one
/// shape whose first elements are at `dst` and `src`.
pub(crate) fn strided_args(
    dst: DevicePtr,
    dst_layout: &Layout,
    src: DevicePtr,
    src_layout: &Layout,
    dtype: DType,
) -> Result<StridedArgs> {
    let (sizes, ds, ss) = coalesce_dims(
        src_layout.shape(),
        dst_layout.strides(),
        src_layout.strides(),
    );
    if sizes.len() > MAX_DIMS {
        return Err(Error::InvalidLayout(format!(
            "a strided GPU copy handles at most {MAX_DIMS} non-mergeable dimensions, found {} \
             (shape {:?}, strides {:?} -> {:?})",
            sizes.len(),
            src_layout.shape(),
            src_layout.strides(),
            dst_layout.strides()
        )));
    }
    let mut args = StridedArgs {
        src: src.addr(),
        dst: dst.addr(),
        numel: src_layout.numel() as u64,
        ndim: sizes.len() as i64,
        elem_size: dtype.size() as i64,
        ..StridedArgs::default()
    };
    for (k, ((&n, &d), &s)) in sizes.iter().zip(&ds).zip(&ss).enumerate() {
        args.sizes[k] = n as i64;
        args.dst_strides[k] = d as i64;
        args.src_strides[k] = s as i64;
    }
    Ok(args)
}

/// `dst.copy_from(src)` when either is on a GPU (shapes and dtypes already
/// checked, at least one element). Finished when it returns.
pub(super) fn copy_between(dst: &Tensor<'_>, src: &Tensor<'_>) -> Result<()> {
    let same_order = same_dense_order(&dst.layout, &src.layout);
    let nbytes = dst.nbytes();
    match (src.device, dst.device) {
        (Device::Cpu, Device::Cuda(d)) => {
            // A copy of the calling thread: after the caller's work on the
            // GPU (which may still read the destination).
            runtime::current_stream(d)?.synchronize()?;
            let (ctx, dptr) = dst.cuda_ptr()?;
            if same_order {
                return src.with_bytes(|bytes| copy_htod_sync(&ctx, dptr, bytes))?;
            }
            // Lay the host elements out like the destination, then one copy.
            let staged = Tensor::zeros_with_layout(preserved_layout(&dst.layout)?, dst.dtype)?;
            staged.copy_from(src)?;
            let gpu = Tensor::uninit_cuda(staged.layout.clone(), dst.dtype, &ctx)?;
            let (_, gptr) = gpu.cuda_ptr()?;
            staged.with_bytes(|bytes| copy_htod_sync(&ctx, gptr, bytes))??;
            copy_between(dst, &gpu)
        }
        (Device::Cuda(g), Device::Cpu) => {
            // After the caller's work on the GPU (which may write the
            // source).
            runtime::current_stream(g)?.synchronize()?;
            let (ctx, sptr) = src.cuda_ptr()?;
            if same_order {
                return dst.with_bytes_mut(|bytes| copy_dtoh_sync(&ctx, bytes, sptr))?;
            }
            let staged = Tensor::zeros_with_layout(preserved_layout(&src.layout)?, src.dtype)?;
            if src.is_non_overlapping_and_dense() {
                staged.with_bytes_mut(|bytes| copy_dtoh_sync(&ctx, bytes, sptr))??;
            } else {
                let dense = Tensor::uninit_cuda(staged.layout.clone(), src.dtype, &ctx)?;
                copy_between(&dense, src)?;
                let (_, dptr) = dense.cuda_ptr()?;
                staged.with_bytes_mut(|bytes| copy_dtoh_sync(&ctx, bytes, dptr))??;
            }
            dst.copy_from(&staged)
        }
        (Device::Cuda(s), Device::Cuda(d)) => {
            let (sctx, sptr) = src.cuda_ptr()?;
            let (dctx, dptr) = dst.cuda_ptr()?;
            let stream = dctx.stream()?;
            // After the caller's work on both GPUs (what wrote the source,
            // what still reads the destination), as PyTorch's `copy_` is.
            let gpus: &[usize] = if s == d { &[d] } else { &[s, d] };
            for &gpu in gpus {
                let caller = runtime::current_stream(gpu)?;
                if !caller.same_as(stream) {
                    stream.wait(&caller.record()?)?;
                }
            }
            if same_order {
                copy_dtod_async(&dctx, dptr, &sctx, sptr, nbytes, stream)?;
                return stream.synchronize();
            }
            if dst.layout.has_zero_stride_overlap() {
                return Err(Error::InvalidLayout(format!(
                    "copy_from: the destination (strides {:?}) has several elements at one address",
                    dst.strides()
                )));
            }
            if s == d || runtime::enable_peer_access(d, s)? {
                let args = strided_args(dptr, &dst.layout, sptr, &src.layout, dst.dtype)?;
                if dst.shares_storage(src) {
                    // Overlapping element copies need a staging copy.
                    let tmp =
                        Tensor::uninit_cuda(Layout::contiguous(dst.shape()), dst.dtype, &dctx)?;
                    copy_between(&tmp, src)?;
                    return copy_between(dst, &tmp);
                }
                kernels::strided_copy(&dctx, stream, args)?;
                return stream.synchronize();
            }
            // No peer access: make the source dense on its GPU, copy the
            // bytes across, then lay them out on the destination GPU.
            let dense_src = Tensor::uninit_cuda(preserved_layout(&src.layout)?, src.dtype, &sctx)?;
            copy_between(&dense_src, src)?;
            let moved = Tensor::uninit_cuda(dense_src.layout.clone(), src.dtype, &dctx)?;
            copy_between(&moved, &dense_src)?;
            copy_between(dst, &moved)
        }
        (Device::Cpu, Device::Cpu) => dst.copy_from(src),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn coalescing_merges_runs_contiguous_in_both_layouts() {
        // Contiguous to contiguous: one dimension.
        assert_eq!(
            coalesce_dims(&[2, 3, 4], &[12, 4, 1], &[12, 4, 1]),
            (vec![24], vec![1], vec![1])
        );
        // A column slice of a [4, 6] source into a contiguous [4, 3] output.
        assert_eq!(
            coalesce_dims(&[4, 3], &[3, 1], &[6, 1]),
            (vec![4, 3], vec![3, 1], vec![6, 1])
        );
        // Size-1 dimensions vanish; channels-last to contiguous stays 3-D.
        let cl = crate::tensor::channels_last_strides(&[2, 3, 1, 5]).unwrap();
        let (sizes, _, _) = coalesce_dims(&[2, 3, 1, 5], &[15, 5, 5, 1], &cl);
        assert_eq!(sizes, [2, 3, 5]);
        assert_eq!(
            coalesce_dims(&[1, 1], &[1, 1], &[1, 1]).0,
            Vec::<usize>::new()
        );
    }

    #[test]
    fn strided_args_refuse_too_many_dimensions() {
        let shape = [2usize; 9];
        let src = Layout::contiguous(&shape);
        // Reversed strides: nothing merges.
        let rev: Vec<usize> = (0..9).map(|i| 1usize << i).collect();
        let dst = Layout::new(&shape, &rev, 0).unwrap();
        assert!(matches!(
            strided_args(DevicePtr(0), &dst, DevicePtr(0), &src, DType::F32),
            Err(Error::InvalidLayout(m)) if m.contains("at most 8")
        ));
        let ok = strided_args(DevicePtr(64), &src, DevicePtr(128), &src, DType::F16).unwrap();
        assert_eq!(
            (ok.ndim, ok.numel, ok.elem_size, ok.dst, ok.src),
            (1, 512, 2, 64, 128)
        );
    }

    #[test]
    fn gpu_tensors_without_a_driver_are_no_cuda_errors() {
        if crate::cuda::runtime::device_count().is_ok() {
            crate::test_skipped(
                "this machine has a CUDA driver (the test is for machines without one)",
            );
            return;
        }
        assert!(matches!(
            Tensor::zeros_on(&[2], DType::F32, Device::Cuda(0)),
            Err(Error::NoCuda { .. })
        ));
        let host = Tensor::from_vec(vec![1.0f32], &[1]).unwrap();
        assert!(matches!(
            host.to_device(Device::Cuda(0)),
            Err(Error::NoCuda { .. })
        ));
        assert!(matches!(
            Tensor::zeros_pinned(&[2], DType::U8),
            Err(Error::NoCuda { .. })
        ));
        // Host tensors keep working.
        assert_eq!(
            host.to_device(Device::Cpu)
                .unwrap()
                .to_vec::<f32>()
                .unwrap(),
            [1.0]
        );
    }
}
