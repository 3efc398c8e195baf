//! Devices and their (primary) contexts.

use std::sync::{Arc, Mutex, OnceLock, PoisonError};

use cudarc::driver::{sys, CudaContext};

use super::driver::{check, ensure_driver};
use super::memory::Pool;
use super::stream::Stream;
use crate::{Error, Result};

/// One GPU: its primary context, properties, internal streams and buffer
/// pool. Obtained from [`context`]; shared by everything
/// that runs on the device.
pub struct Context {
    pub(super) inner: Arc<CudaContext>,
    ordinal: usize,
    name: String,
    capability: (i32, i32),
    sm_count: u32,
    stream: OnceLock<Stream>,
    copy_streams: [OnceLock<Stream>; COPY_STREAMS],
    pub(super) pool: Pool,
}

impl std::fmt::Debug for Context {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Context")
            .field("ordinal", &self.ordinal)
            .field("name", &self.name)
            .field("capability", &self.capability)
            .finish()
    }
}

/// Internal streams per device that independent copies are spread over
/// (see [`Context::copy_stream`]).
pub const COPY_STREAMS: usize = 6;

static CONTEXTS: OnceLock<Mutex<Vec<Option<Arc<Context>>>>> = OnceLock::new();

/// The number of CUDA GPUs, or [`Error::NoCuda`] without a driver.
///
/// ```
/// match tensorcomm::cuda::runtime::device_count() {
///     Ok(n) => println!("{n} GPUs"),
///     Err(tensorcomm::Error::NoCuda { reason }) => println!("no CUDA: {reason}"),
///     Err(e) => return Err(e),
/// }
/// # Ok::<(), tensorcomm::Error>(())
/// ```
pub fn device_count() -> Result<usize> {
    ensure_driver()
}

/// The context of GPU `ordinal`, created on first use (the device's primary
/// context, shared with cudarc, candle and PyTorch in the same process).
///
/// ```
/// use tensorcomm::cuda::runtime;
/// match runtime::context(0) {
///     Ok(ctx) => println!("{} is sm_{}{}", ctx.name(), ctx.capability().0, ctx.capability().1),
///     Err(tensorcomm::Error::NoCuda { .. }) => {} // no driver or no GPU 0
///     Err(e) => return Err(e),
/// }
/// # Ok::<(), tensorcomm::Error>(())
/// ```
pub fn context(ordinal: usize) -> Result<Arc<Context>> {
    let count = ensure_driver()?;
    if ordinal >= count {
        return Err(Error::NoCuda {
            reason: format!("no GPU cuda:{ordinal}: this machine has {count} GPUs"),
        });
    }
    let registry = CONTEXTS.get_or_init(|| Mutex::new(Vec::new()));
    let mut slots = registry.lock().unwrap_or_else(PoisonError::into_inner);
    if slots.len() < count {
        slots.resize(count, None);
    }
    if let Some(ctx) = &slots[ordinal] {
        return Ok(Arc::clone(ctx));
    }
    let ctx = Arc::new(Context::create(ordinal)?);
    slots[ordinal] = Some(Arc::clone(&ctx));
    Ok(ctx)
}

impl Context {
    fn create(ordinal: usize) -> Result<Self> {
        let inner = check("cuDevicePrimaryCtxRetain", CudaContext::new(ordinal))?;
        let name = check("cuDeviceGetName", inner.name())?;
        let capability = check("cuDeviceGetAttribute", inner.compute_capability())?;
        let sm_count = check(
            "cuDeviceGetAttribute",
            inner.attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT),
        )?;
        Ok(Context {
            inner,
            ordinal,
            name,
            capability,
            sm_count: u32::try_from(sm_count).unwrap_or(1).max(1),
            stream: OnceLock::new(),
            copy_streams: Default::default(),
            pool: Pool::default(),
        })
    }

    /// The GPU's ordinal (`cuda:N`).
    pub fn ordinal(&self) -> usize {
        self.ordinal
    }

    /// The GPU's marketing name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Compute capability (major, minor), e.g. (9, 0) for H100/H200.
    pub fn capability(&self) -> (i32, i32) {
        self.capability
    }

    /// The NVRTC architecture name, e.g. `sm_90`.
    pub fn arch(&self) -> String {
        format!("sm_{}{}", self.capability.0, self.capability.1)
    }

    /// Number of streaming multiprocessors.
    pub fn sm_count(&self) -> u32 {
        self.sm_count
    }

    /// Makes this context current on the calling thread.
    pub fn bind(&self) -> Result<()> {
        check("cuCtxSetCurrent", self.inner.bind_to_thread())
    }

    /// Waits for all work on the device to finish.
    pub fn synchronize(&self) -> Result<()> {
        self.bind()?;
        check("cuCtxSynchronize", self.inner.synchronize())
    }

    /// The device's internal (non-blocking) stream, used by operations
    /// that are not given one.
    pub fn stream(&self) -> Result<&Stream> {
        if let Some(s) = self.stream.get() {
            return Ok(s);
        }
        let s = Stream::on(self)?;
        Ok(self.stream.get_or_init(|| s))
    }

    /// Internal stream `i % COPY_STREAMS` for independent copies: 0 is
    /// [`stream`](Context::stream), the others are created on first use.
    /// Spreading copies over them lets the device run them concurrently
    /// (several copy engines, or kernels side by side).
    pub fn copy_stream(&self, i: usize) -> Result<&Stream> {
        let i = i % COPY_STREAMS;
        if i == 0 {
            return self.stream();
        }
        let slot = &self.copy_streams[i];
        if let Some(s) = slot.get() {
            return Ok(s);
        }
        let s = Stream::on(self)?;
        Ok(slot.get_or_init(|| s))
    }

    /// A new non-blocking stream on this device.
    pub fn new_stream(&self) -> Result<Stream> {
        Stream::on(self)
    }

    /// Frees the device buffers cached for reuse (see [`DeviceBuffer`](super::DeviceBuffer)).
    pub fn empty_cache(&self) -> Result<()> {
        self.pool.release_all(self)
    }

    /// The cudarc context, for users mixing tensorcomm with cudarc.
    pub fn cudarc(&self) -> &Arc<CudaContext> {
        &self.inner
    }

    pub(super) fn cu_ctx(&self) -> sys::CUcontext {
        self.inner.cu_ctx()
    }
}
