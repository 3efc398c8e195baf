//! A few 32-bit words of pinned host memory mapped into the GPUs' address
//! space: flags the host raises for a kernel that is running (stop now),
//! and status words a kernel leaves for the host (why it stopped).

use std::ffi::c_void;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

use cudarc::driver::{result, sys};

use super::context::{context, Context};
use super::driver::{check_raw, ensure_driver};
use super::memory::DevicePtr;
use crate::{Error, Result};

/// See the module docs. Host reads and writes are atomic; kernels access
/// the words through [`device_ptr`](MappedWords::device_ptr) with volatile
/// or system-scope atomic operations.
///
/// ```no_run
/// use tensorcomm::cuda::runtime::MappedWords;
/// let w = MappedWords::new(0, 2)?;
/// w.store(0, 1); // a kernel polling word 0 sees 1
/// assert_eq!(w.load(1), 0);
/// # Ok::<(), tensorcomm::Error>(())
/// ```
pub struct MappedWords {
    /// The context the words were allocated through, bound to free them.
    ctx: Arc<Context>,
    host: *mut u32,
    device: u64,
    len: usize,
}

// SAFETY: the words are only accessed atomically (host) or by kernels.
unsafe impl Send for MappedWords {}
// SAFETY: as above.
unsafe impl Sync for MappedWords {}

impl std::fmt::Debug for MappedWords {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "MappedWords({})", self.len)
    }
}

impl MappedWords {
    /// `len` (at least one) zeroed words, allocated through GPU
    /// `device`'s context (kernels of every GPU can use them).
    pub fn new(device: usize, len: usize) -> Result<MappedWords> {
        ensure_driver()?;
        if len == 0 {
            return Err(Error::InvalidArgument(
                "MappedWords: expected at least one word, found 0".into(),
            ));
        }
        let ctx = context(device)?;
        ctx.bind()?;
        let bytes = len * 4;
        let mut raw: *mut c_void = std::ptr::null_mut();
        // SAFETY: `raw` is a valid out-pointer; PORTABLE and DEVICEMAP make
        // the memory usable by every context and mapped for kernels.
        check_raw("cuMemHostAlloc", unsafe {
            sys::cuMemHostAlloc(
                &mut raw,
                bytes,
                sys::CU_MEMHOSTALLOC_PORTABLE | sys::CU_MEMHOSTALLOC_DEVICEMAP,
            )
        })?;
        let host = raw.cast::<u32>();
        // SAFETY: cuMemHostAlloc returned `bytes` writable bytes.
        unsafe { std::ptr::write_bytes(host, 0, len) };
        let mut device = 0u64;
        // SAFETY: `host` is a mapped pinned allocation; `device` a valid
        // out-pointer.
        let mapped = check_raw("cuMemHostGetDevicePointer", unsafe {
            sys::cuMemHostGetDevicePointer_v2(&mut device, raw, 0)
        });
        if let Err(e) = mapped {
            // SAFETY: freed once, never used again.
            let _ = unsafe { result::free_host(raw) };
            return Err(e);
        }
        Ok(MappedWords {
            ctx,
            host,
            device,
            len,
        })
    }

    fn word(&self, i: usize) -> &AtomicU32 {
        assert!(i < self.len, "word {i} of {}", self.len);
        // SAFETY: `host .. host + len` is live, 4-byte aligned pinned
        // memory owned by `self`; AtomicU32 has u32's layout.
        unsafe { &*self.host.add(i).cast::<AtomicU32>() }
    }

    /// Word `i` as the host sees it now.
    pub fn load(&self, i: usize) -> u32 {
        self.word(i).load(Ordering::SeqCst)
    }

    /// Sets word `i`.
    pub fn store(&self, i: usize, value: u32) {
        self.word(i).store(value, Ordering::SeqCst)
    }

    /// Sets word `i` to `new` if it holds `current` (as the kernels'
    /// `atomicCAS_system` does); true if it did.
    pub fn compare_exchange(&self, i: usize, current: u32, new: u32) -> bool {
        self.word(i)
            .compare_exchange(current, new, Ordering::SeqCst, Ordering::SeqCst)
            .is_ok()
    }

    /// The address kernels use for word `i`.
    pub fn device_ptr(&self, i: usize) -> DevicePtr {
        assert!(i < self.len, "word {i} of {}", self.len);
        DevicePtr(self.device + 4 * i as u64)
    }
}

impl super::stream::Stream {
    /// Makes later work on this stream wait until word `i` of `words` is
    /// at least `value` (set from the host with [`MappedWords::store`]):
    /// a gate that lets a stream be filled before any of it runs.
    ///
    /// ```no_run
    /// use tensorcomm::cuda::runtime::{MappedWords, Stream};
    /// let (s, gate) = (Stream::new(0)?, MappedWords::new(0, 1)?);
    /// s.wait_word(&gate, 0, 1)?;
    /// // ... queue work on `s`: none of it runs yet ...
    /// gate.store(0, 1);
    /// s.synchronize()?;
    /// # Ok::<(), tensorcomm::Error>(())
    /// ```
    pub fn wait_word(&self, words: &MappedWords, i: usize, value: u32) -> Result<()> {
        let addr = words.device_ptr(i).addr();
        self.bind()?;
        // SAFETY: `addr` is a mapped word owned by `words`, which the
        // caller keeps until the stream has passed the wait.
        check_raw("cuStreamWaitValue32", unsafe {
            sys::cuStreamWaitValue32_v2(
                self.cu_stream(),
                addr,
                value,
                sys::CUstreamWaitValue_flags::CU_STREAM_WAIT_VALUE_GEQ as u32,
            )
        })
    }
}

impl Drop for MappedWords {
    fn drop(&mut self) {
        // Freed through the context it was allocated through (a thread
        // that never bound one has no current context).
        if self.ctx.bind().is_ok() {
            // SAFETY: allocated by cuMemHostAlloc and freed once; owners
            // synchronise the kernels that use it before dropping.
            let _ = unsafe { result::free_host(self.host.cast()) };
        }
    }
}
