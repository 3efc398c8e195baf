//! One GPU's staging for one group: a stream of its own that every
//! collective's copies between that GPU's tensors and their pinned host
//! copies run on (and a second one for a pipelined call's copies back), a
//! third for sends' copies down, a few for receives' copies up, the pool
//! those host copies come from, and the copies still in flight.
//!
//! Sends copy down on a stream of their own because they are queued
//! outside the engine's call order (at call time), each after the
//! caller's stream as it was at its call: on the collectives' stream,
//! that wait would also hold back the copies an earlier collective still
//! had to queue (a pipelined all_reduce queues its chunks as it runs)
//! behind whatever the caller queued after that collective. Receives copy
//! up, when their message lands, on streams chosen so that, while fewer
//! than eight later receives are in flight, none waits for a later call's
//! point on the caller's stream (`receive_streams.rs`).
//!
//! Lifetimes: every queued copy is followed by a [`StagedEvent`] that
//! holds both ends of it (the caller's CUDA tensor and the host copy over
//! a pooled pinned buffer). The device keeps each event in its in-flight
//! list until the event has passed, whatever happens to the `Work`, so
//! neither the caller's GPU memory nor a pinned buffer is freed or reused
//! while a copy may still touch it. Dropping the device waits for its
//! streams first.

use std::sync::{Arc, Mutex, PoisonError, Weak};

use super::pinned_pool::PinnedPool;
use super::receive_streams::{ReceiveOrder, ReceiveStreams};
use super::staged_event::StagedEvent;
use crate::cuda::runtime::{
    context, copy_dtoh_async, copy_htod_async, current_stream, Context, Event, Stream,
};
use crate::tensor::{Device, Tensor};
use crate::{Error, Result};

/// See the module docs.
pub(crate) struct StagingDevice {
    ctx: Arc<Context>,
    stream: Stream,
    /// A second stream for the copies back of a pipelined call, so they
    /// run beside its copies down (the other direction of the link);
    /// joined into `stream` before the call's last event.
    up: Stream,
    /// Sends' copies down (see the module docs).
    p2p: Stream,
    /// Receives' copies up.
    receives: ReceiveStreams,
    /// The next receive's number in call order (taken with its points).
    receive_calls: Mutex<u64>,
    /// Sends' copies down by the device bytes they read, until done.
    sends: Mutex<Vec<(std::ops::Range<u64>, Weak<StagedEvent>)>>,
    pool: Arc<PinnedPool>,
    in_flight: Mutex<Vec<Arc<StagedEvent>>>,
}

impl StagingDevice {
    /// Staging for GPU `ordinal`, with new streams.
    pub(crate) fn new(ordinal: usize) -> Result<Self> {
        let ctx = context(ordinal)?;
        let stream = ctx.new_stream()?;
        let up = ctx.new_stream()?;
        let p2p = ctx.new_stream()?;
        Ok(StagingDevice {
            ctx,
            stream,
            up,
            p2p,
            receives: ReceiveStreams::default(),
            receive_calls: Mutex::new(0),
            sends: Mutex::default(),
            pool: Arc::new(PinnedPool::for_device(ordinal)),
            in_flight: Mutex::default(),
        })
    }

    /// The GPU's ordinal.
    pub(crate) fn ordinal(&self) -> usize {
        self.ctx.ordinal()
    }

    /// The GPU's context.
    pub(crate) fn context(&self) -> &Arc<Context> {
        &self.ctx
    }

    /// Makes the sends' stream wait for `point` (the caller's stream at a
    /// send's call, [`caller_point`](Self::caller_point)) before what is
    /// queued on it next.
    pub(crate) fn p2p_after(&self, point: &Event) -> Result<()> {
        self.ctx.bind()?;
        self.p2p.wait(point)
    }

    /// The point after the work queued so far on the calling thread's
    /// current stream of this GPU (call on the caller's thread, at call
    /// time), for [`wait_for`](Self::wait_for) once the call runs, or for
    /// [`p2p_after`](Self::p2p_after).
    pub(crate) fn caller_point(&self) -> Result<Event> {
        self.ctx.bind()?;
        let caller = current_stream(self.ordinal())?;
        // A fresh event per call: recording and waiting need no lock, and
        // destroying it with the wait still queued is allowed (CUDA frees
        // it once the wait is done).
        caller.record()
    }

    /// Makes the staging stream wait for `point` before what is queued on
    /// it next.
    pub(crate) fn wait_for(&self, point: &Event) -> Result<()> {
        self.ctx.bind()?;
        self.stream.wait(point)
    }

    /// A host tensor over a pooled pinned buffer with `t`'s shape, dtype
    /// and strides (`t` dense): its bytes are `t`'s span, byte for byte.
    /// Its contents are whatever the buffer held.
    pub(crate) fn host_copy_of(&self, t: &Tensor<'static>) -> Result<Tensor<'static>> {
        let lease = self.pool.lend(t.nbytes())?;
        let flat = Tensor::from_host_buffer(Box::new(lease), t.dtype(), &[t.numel()])?;
        flat.as_strided_like(t)
    }

    /// Queues the copy of CUDA tensor `device`'s bytes into `host` (from
    /// [`host_copy_of`](Self::host_copy_of) it).
    pub(crate) fn copy_down(&self, device: &Tensor<'static>, host: &Tensor<'static>) -> Result<()> {
        self.copy_down_on(device, host, &self.stream)
    }

    /// [`copy_down`](Self::copy_down) on the sends' stream.
    pub(crate) fn copy_down_p2p(
        &self,
        device: &Tensor<'static>,
        host: &Tensor<'static>,
    ) -> Result<()> {
        self.copy_down_on(device, host, &self.p2p)
    }

    fn copy_down_on(
        &self,
        device: &Tensor<'static>,
        host: &Tensor<'static>,
        stream: &Stream,
    ) -> Result<()> {
        let (ctx, src) = self.cuda_ptr(device)?;
        let len = device.nbytes();
        let dst = host.with_bytes_mut(|b| {
            (b.len() == len)
                .then_some(b.as_mut_ptr())
                .ok_or_else(|| size_error(len, b.len()))
        })??;
        // SAFETY: `dst` is the span of `host`, a pooled pinned buffer that
        // nothing else uses until the copy's event (`record`) has passed:
        // the event and the in-flight list hold `host` and `device` (whose
        // span `src .. src + len` is) until then.
        unsafe { copy_dtoh_async(&ctx, dst, src, len, stream) }
    }

    /// Queues the copy of `host`'s bytes into CUDA tensor `device`.
    pub(crate) fn copy_up(&self, host: &Tensor<'static>, device: &Tensor<'static>) -> Result<()> {
        self.copy_up_on(host, device, &self.stream)
    }

    /// Notes a send's copy down of the device bytes `span`, whose event
    /// is `down`, for the receives called after it
    /// ([`order_receive`](Self::order_receive)).
    pub(crate) fn note_send(&self, span: std::ops::Range<u64>, down: &Arc<StagedEvent>) {
        if span.is_empty() {
            return;
        }
        let mut sends = self.sends.lock().unwrap_or_else(PoisonError::into_inner);
        sends.retain(|(_, e)| e.upgrade().is_some_and(|e| !e.is_done()));
        sends.push((span, Arc::downgrade(down)));
    }

    /// What a receive into `tensor` called now (on the caller's thread)
    /// waits for (see `receive_streams.rs`): its number, the caller's
    /// stream, and the sends in flight whose tensors overlap `tensor`,
    /// taken together so that numbers follow the order of the points.
    pub(crate) fn order_receive(&self, tensor: &Tensor<'static>) -> Result<ReceiveOrder> {
        let span = self.span(tensor)?;
        let mut next = self
            .receive_calls
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let caller = self.caller_point()?;
        let mut sends = self.sends.lock().unwrap_or_else(PoisonError::into_inner);
        sends.retain(|(_, e)| e.upgrade().is_some_and(|e| !e.is_done()));
        let sends = sends
            .iter()
            .filter(|(s, _)| !span.is_empty() && s.start < span.end && span.start < s.end)
            .map(|(_, e)| e.clone())
            .collect();
        let call = *next;
        *next += 1;
        Ok(ReceiveOrder {
            call,
            caller,
            sends,
        })
    }

    /// Queues receive `order`'s copy of `host` into CUDA tensor `device`
    /// on a receive stream (`receive_streams.rs`); the event after it
    /// holds both.
    pub(crate) fn copy_up_received(
        &self,
        order: &ReceiveOrder,
        host: &Tensor<'static>,
        device: &Tensor<'static>,
    ) -> Result<Arc<StagedEvent>> {
        let mut keep = Some(vec![device.clone(), host.clone()]);
        let queued = self.ctx.bind().and_then(|()| {
            self.receives.queue(
                &self.ctx,
                order,
                |stream| self.copy_up_on(host, device, stream),
                |stream| self.record_unsettled(stream, &mut keep),
            )
        });
        // On failure `queue` has waited for the stream it used (or queued
        // nothing), so `keep` may go.
        drop(keep);
        queued
    }

    /// [`copy_up`](Self::copy_up) on the second stream, for a chunk whose
    /// copy down the host has seen finish: it runs beside the copies down
    /// still queued. Call [`join_up`](Self::join_up) before recording the
    /// event that covers it.
    pub(crate) fn copy_up_beside(
        &self,
        host: &Tensor<'static>,
        device: &Tensor<'static>,
    ) -> Result<()> {
        self.copy_up_on(host, device, &self.up)
    }

    /// Makes the staging stream wait for the copies queued so far on the
    /// second stream.
    pub(crate) fn join_up(&self) -> Result<()> {
        self.ctx.bind()?;
        let point = self.up.record()?;
        self.stream.wait(&point)
    }

    fn copy_up_on(
        &self,
        host: &Tensor<'static>,
        device: &Tensor<'static>,
        stream: &Stream,
    ) -> Result<()> {
        let (ctx, dst) = self.cuda_ptr(device)?;
        let len = device.nbytes();
        let src = host.with_bytes(|b| {
            (b.len() == len)
                .then_some(b.as_ptr())
                .ok_or_else(|| size_error(len, b.len()))
        })??;
        // SAFETY: as in `copy_down`: both ends are held until the copy's
        // event has passed, and `host` is pinned.
        unsafe { copy_htod_async(&ctx, dst, src, len, stream) }
    }

    /// The staging stream (ordered after each call's caller stream by
    /// `wait_for` when the call runs).
    pub(crate) fn stream(&self) -> &crate::cuda::runtime::Stream {
        &self.stream
    }

    /// Records the point after every copy queued so far on the staging
    /// stream, holding `keep` (both ends of those copies) until it has
    /// passed; also lets go of earlier points that have.
    pub(crate) fn record(&self, keep: Vec<Tensor<'static>>) -> Result<Arc<StagedEvent>> {
        self.record_on(&self.stream, keep)
    }

    /// [`record`](Self::record) on the sends' stream.
    pub(crate) fn record_p2p(&self, keep: Vec<Tensor<'static>>) -> Result<Arc<StagedEvent>> {
        self.record_on(&self.p2p, keep)
    }

    fn record_on(&self, stream: &Stream, keep: Vec<Tensor<'static>>) -> Result<Arc<StagedEvent>> {
        let mut keep = Some(keep);
        self.record_unsettled(stream, &mut keep).inspect_err(|_| {
            // Without an event nothing tells when the queued copies end:
            // wait for them before `keep` lets their memory go.
            self.settle();
            drop(keep.take());
        })
    }

    /// [`record_on`](Self::record_on) without settling: on failure `keep`
    /// is left where it is (the caller settles before dropping it).
    fn record_unsettled(
        &self,
        stream: &Stream,
        keep: &mut Option<Vec<Tensor<'static>>>,
    ) -> Result<Arc<StagedEvent>> {
        let recorded = self.ctx.bind().and_then(|()| stream.record())?;
        let event = Arc::new(StagedEvent::new(
            recorded,
            self.ordinal(),
            keep.take().unwrap_or_default(),
        ));
        let mut in_flight = self
            .in_flight
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        in_flight.retain(|e| !e.is_done());
        in_flight.push(event.clone());
        Ok(event)
    }

    /// After a failure between queuing copies and recording their event:
    /// waits for the staging streams, so that the tensors dropped with the
    /// failed call are no longer in use.
    pub(crate) fn settle(&self) {
        if self.ctx.bind().is_ok() {
            let _ = self.up.synchronize();
            let _ = self.stream.synchronize();
            let _ = self.p2p.synchronize();
            self.receives.synchronize();
        }
    }

    /// The device bytes of CUDA tensor `t` (on this GPU) that its copies
    /// touch.
    pub(crate) fn span(&self, t: &Tensor<'static>) -> Result<std::ops::Range<u64>> {
        let (_, ptr) = self.cuda_ptr(t)?;
        Ok(ptr.0..ptr.0 + t.nbytes() as u64)
    }

    /// The context and address of CUDA tensor `t`, which must be on this
    /// GPU.
    fn cuda_ptr(
        &self,
        t: &Tensor<'static>,
    ) -> Result<(Arc<Context>, crate::cuda::runtime::DevicePtr)> {
        if t.device() != Device::Cuda(self.ordinal()) {
            return Err(Error::InvalidArgument(format!(
                "staging for cuda:{} was handed a tensor on {}",
                self.ordinal(),
                t.device()
            )));
        }
        t.cuda_ptr()
    }
}

fn size_error(expected: usize, found: usize) -> Error {
    Error::InvalidArgument(format!(
        "staging: expected a host copy of {expected} bytes, found {found}"
    ))
}

impl Drop for StagingDevice {
    fn drop(&mut self) {
        // Copies may still be queued (a Work dropped without waiting):
        // let them finish before their tensors and buffers go.
        self.settle();
        self.in_flight
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clear();
    }
}
