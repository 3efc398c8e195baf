//! CUDA graphs: the work queued on a stream between
//! [`Stream::begin_capture`] and [`Stream::end_capture`], recorded once and
//! replayed with one launch.

use std::sync::Arc;

use cudarc::driver::sys;

use super::context::{context, Context};
use super::driver::check_raw;
use super::stream::Stream;
use crate::Result;

/// A captured and instantiated graph, replayed with
/// [`launch`](CapturedGraph::launch).
///
/// ```no_run
/// use tensorcomm::cuda::runtime::Stream;
/// let s = Stream::new(0)?;
/// s.begin_capture()?;
/// // ... queue kernels on `s` ...
/// let graph = s.end_capture()?;
/// graph.launch(&s)?;
/// s.synchronize()?;
/// # Ok::<(), tensorcomm::Error>(())
/// ```
pub struct CapturedGraph {
    ctx: Arc<Context>,
    graph: sys::CUgraph,
    exec: sys::CUgraphExec,
}

// SAFETY: graph handles are context-wide and usable from any thread; the
// graph is never modified after instantiation.
unsafe impl Send for CapturedGraph {}
// SAFETY: as above.
unsafe impl Sync for CapturedGraph {}

impl Stream {
    /// Starts recording the work queued on this stream (by this thread)
    /// instead of running it.
    pub fn begin_capture(&self) -> Result<()> {
        self.bind()?;
        // SAFETY: the stream is live; thread-local mode only forbids
        // unsafe calls on this thread during the capture.
        check_raw("cuStreamBeginCapture", unsafe {
            sys::cuStreamBeginCapture_v2(
                self.cu_stream(),
                sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL,
            )
        })
    }

    /// True while the stream records instead of running.
    pub fn is_capturing(&self) -> Result<bool> {
        let mut status = sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE;
        // SAFETY: valid out-pointer, live stream.
        check_raw("cuStreamIsCapturing", unsafe {
            sys::cuStreamIsCapturing(self.cu_stream(), &mut status)
        })?;
        Ok(status != sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE)
    }

    /// Ends the capture begun with [`begin_capture`](Stream::begin_capture)
    /// and instantiates what it recorded.
    pub fn end_capture(&self) -> Result<CapturedGraph> {
        let ctx = context(self.device())?;
        self.bind()?;
        let mut graph: sys::CUgraph = std::ptr::null_mut();
        // SAFETY: valid out-pointer; fails cleanly without a capture.
        check_raw("cuStreamEndCapture", unsafe {
            sys::cuStreamEndCapture(self.cu_stream(), &mut graph)
        })?;
        let mut exec: sys::CUgraphExec = std::ptr::null_mut();
        // SAFETY: `graph` was just captured; `exec` a valid out-pointer.
        let made = check_raw("cuGraphInstantiate", unsafe {
            sys::cuGraphInstantiateWithFlags(&mut exec, graph, 0)
        });
        if let Err(e) = made {
            // SAFETY: destroyed once, never used again.
            let _ = unsafe { sys::cuGraphDestroy(graph) };
            return Err(e);
        }
        Ok(CapturedGraph { ctx, graph, exec })
    }
}

impl CapturedGraph {
    /// Queues one replay of the graph on `stream`.
    pub fn launch(&self, stream: &Stream) -> Result<()> {
        self.ctx.bind()?;
        // SAFETY: `exec` is a live instantiated graph of this context.
        check_raw("cuGraphLaunch", unsafe {
            sys::cuGraphLaunch(self.exec, stream.cu_stream())
        })
    }
}

impl Drop for CapturedGraph {
    fn drop(&mut self) {
        if self.ctx.bind().is_ok() {
            // SAFETY: both handles are live and destroyed once; replays
            // already queued keep running (the driver defers the release).
            unsafe {
                let _ = sys::cuGraphExecDestroy(self.exec);
                let _ = sys::cuGraphDestroy(self.graph);
            }
        }
    }
}
