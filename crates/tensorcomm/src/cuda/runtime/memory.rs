//! Device buffers (`cuMemAlloc`, cached for reuse), pinned host buffers and
//! copies between them.

use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::{Arc, Mutex, PoisonError};

use cudarc::driver::{result, sys};

use super::context::{context, Context};
use super::driver::{check, check_raw, ensure_driver};
use super::stream::Stream;
use crate::{Error, Result};

/// A device address. Only `cuda::runtime` turns it into memory accesses;
/// the layers above pass it along with the buffer that keeps it alive.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct DevicePtr(pub(crate) u64);

impl DevicePtr {
    /// The address `bytes` further on.
    pub fn offset(self, bytes: usize) -> DevicePtr {
        DevicePtr(self.0.wrapping_add(bytes as u64))
    }

    /// The address as an integer (for alignment checks and messages).
    pub fn addr(self) -> u64 {
        self.0
    }
}

/// Freed `cuMemAlloc` blocks kept for reuse, by rounded size. Like PyTorch's
/// caching allocator, this makes the allocations of steady-state training
/// loops (same sizes every step) cost a map lookup instead of a
/// synchronising `cuMemAlloc`/`cuMemFree` pair.
#[derive(Default)]
pub(crate) struct Pool {
    free: Mutex<HashMap<usize, Vec<u64>>>,
}

/// The size class of a request: multiples of 512 bytes up to 1 MiB, of
/// 2 MiB above.
pub(crate) fn size_class(len: usize) -> usize {
    const SMALL: usize = 512;
    const LARGE: usize = 2 << 20;
    if len <= 1 << 20 {
        len.div_ceil(SMALL).max(1) * SMALL
    } else {
        len.div_ceil(LARGE).saturating_mul(LARGE)
    }
}

impl Pool {
    fn take(&self, class: usize) -> Option<u64> {
        let mut free = self.free.lock().unwrap_or_else(PoisonError::into_inner);
        free.get_mut(&class).and_then(Vec::pop)
    }

    fn put(&self, class: usize, ptr: u64) {
        let mut free = self.free.lock().unwrap_or_else(PoisonError::into_inner);
        free.entry(class).or_default().push(ptr);
    }

    pub(super) fn release_all(&self, ctx: &Context) -> Result<()> {
        let blocks: Vec<u64> = {
            let mut free = self.free.lock().unwrap_or_else(PoisonError::into_inner);
            free.drain().flat_map(|(_, v)| v).collect()
        };
        ctx.bind()?;
        for ptr in blocks {
            // SAFETY: `ptr` came from cuMemAlloc in this context and no
            // buffer refers to it any more (it was in the free list).
            check("cuMemFree", unsafe { result::free_sync(ptr) })?;
        }
        Ok(())
    }
}

/// Device memory from `cuMemAlloc` (not the stream-ordered pool, so it can
/// be shared with other processes through IPC), returned to a per-device
/// cache when dropped.
///
/// ```no_run
/// use tensorcomm::cuda::runtime::DeviceBuffer;
/// let buf = DeviceBuffer::zeros(0, 1024)?;
/// let mut back = vec![1u8; 1024];
/// buf.copy_to_host(&mut back)?;
/// assert!(back.iter().all(|&b| b == 0));
/// # Ok::<(), tensorcomm::Error>(())
/// ```
pub struct DeviceBuffer {
    ctx: Arc<Context>,
    ptr: u64,
    len: usize,
    class: usize,
}

impl std::fmt::Debug for DeviceBuffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "DeviceBuffer(cuda:{}, {} bytes)",
            self.ctx.ordinal(),
            self.len
        )
    }
}

impl DeviceBuffer {
    /// `len` zeroed bytes on GPU `device`.
    pub fn zeros(device: usize, len: usize) -> Result<DeviceBuffer> {
        let ctx = context(device)?;
        let buf = DeviceBuffer::uninit(&ctx, len)?;
        let stream = ctx.stream()?;
        memset_zero(&ctx, buf.ptr(), len, stream)?;
        stream.synchronize()?;
        Ok(buf)
    }

    /// `len` bytes whose contents are whatever the block held before. Only
    /// for buffers that are completely written before anyone reads them.
    pub(crate) fn uninit(ctx: &Arc<Context>, len: usize) -> Result<DeviceBuffer> {
        if len == 0 {
            return Ok(DeviceBuffer {
                ctx: Arc::clone(ctx),
                ptr: 0,
                len: 0,
                class: 0,
            });
        }
        let class = size_class(len);
        let ptr = match ctx.pool.take(class) {
            Some(ptr) => ptr,
            None => {
                ctx.bind()?;
                // SAFETY: allocating has no preconditions beyond a current
                // context, bound just above.
                match unsafe { result::malloc_sync(class) } {
                    Ok(ptr) => ptr,
                    Err(e) if e.0 == sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY => {
                        ctx.pool.release_all(ctx)?;
                        // SAFETY: as above.
                        check("cuMemAlloc", unsafe { result::malloc_sync(class) })?
                    }
                    Err(e) => return Err(super::driver::cuda_error("cuMemAlloc", e)),
                }
            }
        };
        Ok(DeviceBuffer {
            ctx: Arc::clone(ctx),
            ptr,
            len,
            class,
        })
    }

    /// The GPU holding the buffer.
    pub fn device(&self) -> usize {
        self.ctx.ordinal()
    }

    /// The context of that GPU.
    pub fn context(&self) -> &Arc<Context> {
        &self.ctx
    }

    /// Size in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True for a zero-byte buffer.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The start address.
    pub fn ptr(&self) -> DevicePtr {
        DevicePtr(self.ptr)
    }

    /// Copies the whole buffer into `dst` (which must have the buffer's
    /// length) and waits for the copy.
    pub fn copy_to_host(&self, dst: &mut [u8]) -> Result<()> {
        if dst.len() != self.len {
            return Err(Error::InvalidArgument(format!(
                "copy_to_host: expected a host slice of {} bytes, found {}",
                self.len,
                dst.len()
            )));
        }
        copy_dtoh_sync(&self.ctx, dst, self.ptr())
    }
}

impl Drop for DeviceBuffer {
    fn drop(&mut self) {
        if self.len > 0 {
            self.ctx.pool.put(self.class, self.ptr);
        }
    }
}

/// Page-locked host memory (`cuMemHostAlloc`, portable to every context):
/// copies to and from it run asynchronously at full bus speed.
///
/// ```no_run
/// use tensorcomm::cuda::runtime::PinnedBuffer;
/// let mut p = PinnedBuffer::zeros(4096)?;
/// p.as_mut_slice()[0] = 7;
/// assert_eq!(p.as_slice()[0], 7);
/// # Ok::<(), tensorcomm::Error>(())
/// ```
pub struct PinnedBuffer {
    ptr: *mut u8,
    len: usize,
}

// SAFETY: the buffer is plain host memory owned by this value; access goes
// through `&self`/`&mut self`, so Rust's borrow rules order it.
unsafe impl Send for PinnedBuffer {}
// SAFETY: shared access only reads (`as_slice`).
unsafe impl Sync for PinnedBuffer {}

impl PinnedBuffer {
    /// `len` zeroed bytes of pinned host memory.
    pub fn zeros(len: usize) -> Result<PinnedBuffer> {
        ensure_driver()?;
        if len == 0 {
            return Ok(PinnedBuffer {
                ptr: std::ptr::NonNull::dangling().as_ptr(),
                len: 0,
            });
        }
        // Pinned allocations need a current context.
        context(0)?.bind()?;
        let mut raw: *mut c_void = std::ptr::null_mut();
        // SAFETY: `raw` is a valid out-pointer; PORTABLE makes the memory
        // usable from every context.
        check_raw("cuMemHostAlloc", unsafe {
            sys::cuMemHostAlloc(&mut raw, len, sys::CU_MEMHOSTALLOC_PORTABLE)
        })?;
        let ptr = raw.cast::<u8>();
        // SAFETY: cuMemHostAlloc returned `len` writable bytes at `ptr`.
        unsafe { std::ptr::write_bytes(ptr, 0, len) };
        Ok(PinnedBuffer { ptr, len })
    }

    /// The bytes.
    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: `ptr` points at `len` initialised bytes owned by `self`
        // (or is dangling with len 0, which from_raw_parts allows).
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }

    /// The writable bytes.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as in `as_slice`, and `&mut self` makes the access unique.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }

    /// Size in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True for a zero-byte buffer.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl Drop for PinnedBuffer {
    fn drop(&mut self) {
        if self.len > 0 {
            // SAFETY: `ptr` came from cuMemHostAlloc and is freed once.
            let _ = unsafe { result::free_host(self.ptr.cast()) };
        }
    }
}

/// Queues zeroing of `len` bytes at `dst` on `stream`.
pub(crate) fn memset_zero(
    ctx: &Context,
    dst: DevicePtr,
    len: usize,
    stream: &Stream,
) -> Result<()> {
    if len == 0 {
        return Ok(());
    }
    ctx.bind()?;
    // SAFETY: the caller holds the buffer that `dst .. dst + len` lies in.
    check_raw("cuMemsetD8Async", unsafe {
        sys::cuMemsetD8Async(dst.0, 0, len, stream.cu_stream())
    })
}

/// Copies host bytes to the device and waits for the copy.
pub(crate) fn copy_htod_sync(ctx: &Context, dst: DevicePtr, src: &[u8]) -> Result<()> {
    if src.is_empty() {
        return Ok(());
    }
    ctx.bind()?;
    let stream = ctx.stream()?;
    // SAFETY: `dst .. dst + src.len()` lies in a live buffer of the caller;
    // `src` outlives the call because we synchronise before returning.
    check_raw("cuMemcpyHtoDAsync", unsafe {
        sys::cuMemcpyHtoDAsync_v2(dst.0, src.as_ptr().cast(), src.len(), stream.cu_stream())
    })?;
    stream.synchronize()
}

/// Copies device bytes to the host and waits for the copy.
pub(crate) fn copy_dtoh_sync(ctx: &Context, dst: &mut [u8], src: DevicePtr) -> Result<()> {
    if dst.is_empty() {
        return Ok(());
    }
    ctx.bind()?;
    let stream = ctx.stream()?;
    // SAFETY: `src .. src + dst.len()` lies in a live buffer of the caller;
    // `dst` is borrowed mutably until after the synchronisation below.
    check_raw("cuMemcpyDtoHAsync", unsafe {
        sys::cuMemcpyDtoHAsync_v2(
            dst.as_mut_ptr().cast(),
            src.0,
            dst.len(),
            stream.cu_stream(),
        )
    })?;
    stream.synchronize()
}

/// Queues a copy of `len` bytes from the device to host memory at `dst`
/// on `stream`, and returns without waiting for it (the copy runs
/// asynchronously to the host only from pinned memory).
///
/// # Safety
///
/// `dst .. dst + len` must be pinned host memory ([`PinnedBuffer`]) that
/// stays allocated, and that the host neither reads nor writes, until
/// `stream` has run the copy; `src .. src + len` must lie in device memory
/// of `ctx` that stays allocated until then.
pub(crate) unsafe fn copy_dtoh_async(
    ctx: &Context,
    dst: *mut u8,
    src: DevicePtr,
    len: usize,
    stream: &Stream,
) -> Result<()> {
    if len == 0 {
        return Ok(());
    }
    ctx.bind()?;
    // SAFETY: the caller upholds the contract above.
    check_raw("cuMemcpyDtoHAsync", unsafe {
        sys::cuMemcpyDtoHAsync_v2(dst.cast(), src.0, len, stream.cu_stream())
    })
}

/// Queues a copy of `len` bytes of host memory at `src` to the device on
/// `stream`, and returns without waiting for it.
///
/// # Safety
///
/// `src .. src + len` must be pinned host memory ([`PinnedBuffer`]) that
/// stays allocated, and that the host does not write, until `stream` has
/// run the copy; `dst .. dst + len` must lie in device memory of `ctx`
/// that stays allocated until then.
pub(crate) unsafe fn copy_htod_async(
    ctx: &Context,
    dst: DevicePtr,
    src: *const u8,
    len: usize,
    stream: &Stream,
) -> Result<()> {
    if len == 0 {
        return Ok(());
    }
    ctx.bind()?;
    if (2..SMALL_HTOD_BYTES).contains(&len) {
        // See `SMALL_HTOD_BYTES`: the same bytes as copies of two rows.
        for (offset, width) in two_row_copies(len) {
            let copy = sys::CUDA_MEMCPY2D {
                srcXInBytes: 0,
                srcY: 0,
                srcMemoryType: sys::CUmemorytype::CU_MEMORYTYPE_HOST,
                srcHost: src.wrapping_add(offset).cast(),
                srcDevice: 0,
                srcArray: std::ptr::null_mut(),
                srcPitch: width,
                dstXInBytes: 0,
                dstY: 0,
                dstMemoryType: sys::CUmemorytype::CU_MEMORYTYPE_DEVICE,
                dstHost: std::ptr::null_mut(),
                dstDevice: dst.0 + offset as u64,
                dstArray: std::ptr::null_mut(),
                dstPitch: width,
                WidthInBytes: width,
                Height: 2,
            };
            // SAFETY: the caller upholds the contract above; the two rows
            // lie within `src .. src + len` and `dst .. dst + len`.
            check_raw("cuMemcpy2DAsync", unsafe {
                sys::cuMemcpy2DAsync_v2(&copy, stream.cu_stream())
            })?;
        }
        return Ok(());
    }
    // SAFETY: the caller upholds the contract above.
    check_raw("cuMemcpyHtoDAsync", unsafe {
        sys::cuMemcpyHtoDAsync_v2(dst.0, src.cast(), len, stream.cu_stream())
    })
}

/// Below this many bytes, a plain host-to-device copy does not run on a
/// copy engine: the driver passes its bytes through the GPU's command
/// stream, which processes sharing one GPU take turns on, so each such
/// copy waits for the other processes' turn. Measured on an H200 with two
/// processes copying at once (`bench/shared_gpu_copies.py`,
/// `bench/results/shared-gpu-copies-h200/`): 271 µs per 8-byte or 4 KiB
/// copy, 12 µs from 32 KiB; the same bytes as a copy of several rows
/// (`cuMemcpy2DAsync`) run on a copy engine: 12.6 µs at 8 bytes. Rows
/// cost more the more there are, so these copies use two (an odd length
/// adds a second copy of its last two bytes).
const SMALL_HTOD_BYTES: usize = 32 << 10;

/// The two-row copies that carry `len` bytes (at least 2): (offset,
/// row width). An even length is one copy of its two halves; an odd one
/// also copies its last two bytes as two one-byte rows, the byte they
/// share with the first copy written twice with the same value.
fn two_row_copies(len: usize) -> Vec<(usize, usize)> {
    let mut copies = vec![(0, len / 2)];
    if len % 2 == 1 {
        copies.push((len - 2, 1));
    }
    copies
}

/// Queues a copy of `len` bytes between device buffers, possibly on two
/// GPUs (the copy engines move it over NVLink or PCIe). Runs on `stream`.
pub(crate) fn copy_dtod_async(
    dst_ctx: &Context,
    dst: DevicePtr,
    src_ctx: &Context,
    src: DevicePtr,
    len: usize,
    stream: &Stream,
) -> Result<()> {
    if len == 0 {
        return Ok(());
    }
    let ctx = if stream.device() == dst_ctx.ordinal() {
        dst_ctx
    } else {
        src_ctx
    };
    ctx.bind()?;
    if dst_ctx.ordinal() == src_ctx.ordinal() {
        // SAFETY: both ranges lie in live buffers held by the caller until
        // the stream has run the copy.
        check_raw("cuMemcpyDtoDAsync", unsafe {
            sys::cuMemcpyDtoDAsync_v2(dst.0, src.0, len, stream.cu_stream())
        })
    } else {
        // SAFETY: as above.
        check("cuMemcpyPeerAsync", unsafe {
            result::memcpy_peer_async(
                dst_ctx.cu_ctx(),
                dst.0,
                src_ctx.cu_ctx(),
                src.0,
                len,
                stream.cu_stream(),
            )
        })
    }
}

static PEERS: Mutex<Option<HashMap<(usize, usize), bool>>> = Mutex::new(None);

/// True when kernels on GPU `from` can read and write memory of GPU `to`
/// (NVLink or PCIe peer access); enables that access on first use. A GPU
/// always reaches its own memory.
///
/// ```no_run
/// let direct = tensorcomm::cuda::runtime::enable_peer_access(0, 1)?;
/// println!("cuda:0 -> cuda:1 peer access: {direct}");
/// # Ok::<(), tensorcomm::Error>(())
/// ```
pub fn enable_peer_access(from: usize, to: usize) -> Result<bool> {
    if from == to {
        context(from)?;
        return Ok(true);
    }
    let mut peers = PEERS.lock().unwrap_or_else(PoisonError::into_inner);
    let map = peers.get_or_insert_with(HashMap::new);
    if let Some(&known) = map.get(&(from, to)) {
        return Ok(known);
    }
    let from_ctx = context(from)?;
    let to_ctx = context(to)?;
    let mut can: i32 = 0;
    // SAFETY: `can` is a valid out-pointer; the devices exist.
    check_raw("cuDeviceCanAccessPeer", unsafe {
        sys::cuDeviceCanAccessPeer(
            &mut can,
            from_ctx.inner.cu_device(),
            to_ctx.inner.cu_device(),
        )
    })?;
    let enabled = if can != 0 {
        from_ctx.bind()?;
        // SAFETY: both contexts are live primary contexts.
        let r = unsafe { sys::cuCtxEnablePeerAccess(to_ctx.cu_ctx(), 0) };
        match r {
            sys::CUresult::CUDA_SUCCESS | sys::CUresult::CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED => {
                true
            }
            other => {
                tracing::debug!(from, to, ?other, "enabling peer access failed");
                false
            }
        }
    } else {
        false
    };
    map.insert((from, to), enabled);
    Ok(enabled)
}

/// The context, address and size in bytes of a cudarc slice, after the
/// work queued on its stream has finished.
pub(crate) fn cudarc_slice_parts<T>(
    slice: &cudarc::driver::CudaSlice<T>,
) -> Result<(Arc<Context>, DevicePtr, usize)> {
    use cudarc::driver::DevicePtr as _;
    ensure_driver()?;
    let ctx = context(slice.ordinal())?;
    check("cuStreamSynchronize", slice.stream().synchronize())?;
    let (ptr, _record) = slice.device_ptr(slice.stream());
    Ok((ctx, DevicePtr(ptr), slice.num_bytes()))
}

#[cfg(test)]
mod tests {
    use super::two_row_copies;

    #[test]
    fn small_copies_cover_every_byte_in_rows_of_half_the_length() {
        for len in [2usize, 3, 4, 7, 8, 4093, 4096, 32767] {
            let copies = two_row_copies(len);
            let mut written = vec![0u32; len];
            for &(offset, width) in &copies {
                assert!(offset + 2 * width <= len, "{len}: {copies:?}");
                for b in &mut written[offset..offset + 2 * width] {
                    *b += 1;
                }
            }
            assert!(written.iter().all(|&n| n >= 1), "{len}: {copies:?}");
            assert_eq!(copies[0], (0, len / 2), "{len}");
            assert_eq!(copies.len(), 1 + len % 2, "{len}");
        }
    }
}
