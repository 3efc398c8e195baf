//! Streams and events.

use std::sync::Arc;

use cudarc::driver::{sys, CudaEvent, CudaStream};

use super::context::{context, Context};
use super::driver::{check, check_raw};
use crate::Result;

/// A CUDA stream on one device: work queued on it runs in order.
///
/// Clones are handles on the same stream.
///
/// ```no_run
/// use tensorcomm::cuda::runtime::Stream;
/// let s = Stream::new(1)?; // a new stream on cuda:1
/// assert_eq!(s.device(), 1);
/// s.synchronize()?;
/// # Ok::<(), tensorcomm::Error>(())
/// ```
#[derive(Clone)]
pub struct Stream {
    inner: Arc<CudaStream>,
    ordinal: usize,
}

impl std::fmt::Debug for Stream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Stream(cuda:{})", self.ordinal)
    }
}

impl Stream {
    /// A new non-blocking stream on GPU `device`.
    pub fn new(device: usize) -> Result<Stream> {
        Stream::on(&*context(device)?)
    }

    pub(super) fn on(ctx: &Context) -> Result<Stream> {
        ctx.bind()?;
        let inner = check("cuStreamCreate", ctx.inner.new_stream())?;
        Ok(Stream {
            inner,
            ordinal: ctx.ordinal(),
        })
    }

    /// Wraps a cudarc stream (for example candle's or burn's) so tensorcomm
    /// work can be ordered on it.
    pub fn from_cudarc(stream: Arc<CudaStream>) -> Stream {
        let ordinal = stream.context().ordinal();
        Stream {
            inner: stream,
            ordinal,
        }
    }

    /// Wraps a stream another library owns on GPU `device` (PyTorch's
    /// `torch.cuda.current_stream(device).cuda_stream`), given as its raw
    /// `CUstream` address; 0 is the device's legacy default stream. The
    /// stream is never destroyed through this handle.
    ///
    /// ```no_run
    /// use tensorcomm::cuda::runtime::{set_current_stream, Stream};
    /// let mine = Stream::new(0)?;
    /// // SAFETY: `mine` outlives `same`.
    /// let same = unsafe { Stream::from_raw(0, mine.raw() as usize)? };
    /// let _guard = set_current_stream(&same); // tensorcomm work now follows `mine`
    /// # Ok::<(), tensorcomm::Error>(())
    /// ```
    ///
    /// # Safety
    ///
    /// `raw` must be 0 or a live stream of the primary context of GPU
    /// `device`, and stay alive while the returned handle (or a clone of
    /// it, such as one made current) is used.
    pub unsafe fn from_raw(device: usize, raw: usize) -> Result<Stream> {
        let ctx = context(device)?;
        // SAFETY: the caller vouches that `raw` is a live stream of this
        // (primary) context, or 0 (the legacy default stream), kept alive
        // while this handle is used; the wrapper never destroys it.
        let inner = unsafe { ctx.inner.wrap_borrowed_stream(raw as sys::CUstream) };
        Ok(Stream {
            inner,
            ordinal: device,
        })
    }

    /// The GPU this stream belongs to.
    pub fn device(&self) -> usize {
        self.ordinal
    }

    /// True when both handles are the same stream.
    pub fn same_as(&self, other: &Stream) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
    }

    /// Waits until all work queued on the stream has finished.
    pub fn synchronize(&self) -> Result<()> {
        check("cuStreamSynchronize", self.inner.synchronize())
    }

    /// Records an event on the stream (see [`Event`]).
    pub fn record(&self) -> Result<Event> {
        let event = check(
            "cuEventCreate",
            self.inner
                .context()
                .new_event(Some(sys::CUevent_flags::CU_EVENT_DISABLE_TIMING)),
        )?;
        check("cuEventRecord", event.record(&self.inner))?;
        Ok(Event { inner: event })
    }

    /// Records a timing event on the stream (for [`Event::elapsed_ms`]).
    pub fn record_timed(&self) -> Result<Event> {
        let event = check(
            "cuEventCreate",
            self.inner
                .context()
                .new_event(Some(sys::CUevent_flags::CU_EVENT_DEFAULT)),
        )?;
        check("cuEventRecord", event.record(&self.inner))?;
        Ok(Event { inner: event })
    }

    /// Records `event` (again) at this point of the stream's work.
    pub fn record_into(&self, event: &Event) -> Result<()> {
        check("cuEventRecord", event.inner.record(&self.inner))
    }

    /// The raw `CUstream`, for libraries that take one (NCCL).
    pub fn raw(&self) -> sys::CUstream {
        self.inner.cu_stream()
    }

    /// Makes later work on this stream wait for `event` (which may belong to
    /// another device).
    pub fn wait(&self, event: &Event) -> Result<()> {
        check("cuStreamWaitEvent", self.inner.wait(&event.inner))
    }

    /// The cudarc stream.
    pub fn cudarc(&self) -> &Arc<CudaStream> {
        &self.inner
    }

    /// Makes the stream's context current on the calling thread.
    pub(super) fn bind(&self) -> Result<()> {
        check("cuCtxSetCurrent", self.inner.context().bind_to_thread())
    }

    pub(super) fn cu_stream(&self) -> sys::CUstream {
        self.inner.cu_stream()
    }

    /// The driver's handle as a number: equal for every `Stream` of one
    /// CUDA stream.
    pub(crate) fn raw_id(&self) -> usize {
        self.cu_stream() as usize
    }
}

/// A point in a stream's work, for ordering other streams after it or for
/// timing.
pub struct Event {
    inner: CudaEvent,
}

impl Event {
    /// A new event on GPU `device` (no timing), not yet recorded: record
    /// it with [`Stream::record_into`], as often as needed.
    ///
    /// ```no_run
    /// use tensorcomm::cuda::runtime::{Event, Stream};
    /// let s = Stream::new(0)?;
    /// let e = Event::new(0)?;
    /// s.record_into(&e)?;
    /// e.synchronize()?;
    /// assert!(e.query()?);
    /// # Ok::<(), tensorcomm::Error>(())
    /// ```
    pub fn new(device: usize) -> Result<Event> {
        let ctx = context(device)?;
        ctx.bind()?;
        let inner = check(
            "cuEventCreate",
            ctx.inner
                .new_event(Some(sys::CUevent_flags::CU_EVENT_DISABLE_TIMING)),
        )?;
        Ok(Event { inner })
    }

    /// True once the work before the event (as last recorded) has
    /// finished, or if it was never recorded; never blocks.
    pub fn query(&self) -> Result<bool> {
        check("cuEventQuery", self.inner.try_is_complete())
    }

    /// Blocks until the work before the event has finished.
    pub fn synchronize(&self) -> Result<()> {
        check("cuEventSynchronize", self.inner.synchronize())
    }

    /// [`synchronize`](Event::synchronize), allowed also while another
    /// thread of the process captures a stream in global mode (PyTorch's
    /// default), where a plain wait is an error: this thread's capture mode
    /// is relaxed for the wait.
    pub(crate) fn synchronize_during_captures(&self) -> Result<()> {
        let mut mode = sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED;
        // SAFETY: a valid in/out pointer; swaps this thread's mode.
        check_raw("cuThreadExchangeStreamCaptureMode", unsafe {
            sys::cuThreadExchangeStreamCaptureMode(&mut mode)
        })?;
        let waited = self.synchronize();
        // SAFETY: as above; puts the thread's previous mode back.
        let restored = check_raw("cuThreadExchangeStreamCaptureMode", unsafe {
            sys::cuThreadExchangeStreamCaptureMode(&mut mode)
        });
        waited.and(restored)
    }

    /// Milliseconds between `self` and the later event `end` (both recorded
    /// with [`Stream::record_timed`]).
    pub fn elapsed_ms(&self, end: &Event) -> Result<f32> {
        check("cuEventElapsedTime", self.inner.elapsed_ms(&end.inner))
    }
}
