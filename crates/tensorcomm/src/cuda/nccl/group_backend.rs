//! The NCCL backend as the engine sees it ([`GroupBackend`]): each
//! collective is queued on the group's communication stream, after the
//! work already queued on the caller's current stream, and returns with
//! the event after which it is done. The tensors it reads and writes are
//! kept alive by that event until the device has passed it.

use std::any::Any;
use std::ffi::c_void;
use std::sync::{Arc, Mutex, PoisonError};

use super::communicator::Communicator;
use super::library::{Nccl, RawComm, RawDType, RawStream, IN_PROGRESS};
use super::types::{nccl_dtype, RedOp};
use crate::cuda::runtime::{self, context, current_stream, DeviceBuffer, Event, Stream};
use crate::group::backend::{Call, GroupBackend};
use crate::group::collective::Collective;
use crate::group::{DeviceEvent, ReduceOp};
use crate::tensor::{DType, Tensor};
use crate::{Error, Result};

/// See the module docs.
pub(crate) struct NcclBackend {
    pub(crate) comm: Communicator,
    /// The group's communication stream.
    pub(crate) stream: Stream,
    /// Recorded on the caller's stream and waited for by `stream` before
    /// each call (calls are serialized by `launch`).
    order: Event,
    events: Arc<EventPool>,
    /// One element that barriers all-reduce.
    barrier: DeviceBuffer,
    /// Serializes the calls that queue work on `comm`.
    pub(crate) launch: Mutex<()>,
}

impl NcclBackend {
    pub(crate) fn new(comm: Communicator) -> Result<NcclBackend> {
        let device = comm.device;
        let ctx = context(device)?;
        Ok(NcclBackend {
            stream: ctx.new_stream()?,
            order: Event::new(device)?,
            events: Arc::new(EventPool {
                device,
                free: Mutex::default(),
            }),
            barrier: DeviceBuffer::zeros(device, 4)?,
            launch: Mutex::default(),
            comm,
        })
    }

    /// Orders the communication stream after the work queued so far on
    /// the caller's current stream.
    pub(crate) fn order_after_caller(&self) -> Result<()> {
        let caller = current_stream(self.comm.device)?;
        caller.record_into(&self.order)?;
        self.stream.wait(&self.order)
    }

    /// An event recorded now on the communication stream that keeps `keep`
    /// alive until it is dropped.
    pub(crate) fn completion(&self, keep: Box<dyn Any + Send>) -> Result<Arc<dyn DeviceEvent>> {
        let event = self.events.take()?;
        self.stream.record_into(&event)?;
        Ok(Arc::new(NcclEvent {
            event: Some(event),
            pool: self.events.clone(),
            _keep: Mutex::new(Some(keep)),
        }))
    }

    /// Starts an NCCL group of calls on the communication stream.
    pub(crate) fn group(&self, call: &'static str) -> Result<Launch<'_>> {
        let nccl = self.comm.nccl;
        // SAFETY: no arguments.
        nccl.check("ncclGroupStart", unsafe { (nccl.group_start)() }, None)?;
        Ok(Launch {
            nccl,
            communicator: &self.comm,
            comm: self.comm.raw(),
            stream: self.stream.raw() as RawStream,
            device: self.comm.device,
            call,
            open: true,
        })
    }

    fn run_collective(&self, collective: &Collective, call: &'static str) -> Result<()> {
        let me = self.comm.rank;
        let mut g = self.group(call)?;
        match collective {
            Collective::AllReduce { tensor, op } => g.all_reduce(tensor, *op)?,
            Collective::AllReduceCoalesced { tensors, op } => {
                for t in tensors {
                    g.all_reduce(t, *op)?;
                }
            }
            Collective::Broadcast { tensor, root } => g.broadcast(tensor, tensor, *root)?,
            Collective::Reduce { tensor, root, op } => g.reduce(tensor, tensor, *root, *op)?,
            Collective::AllGather { outputs, input } => {
                for (r, out) in outputs.iter().enumerate() {
                    g.broadcast(input, out, r)?;
                }
            }
            Collective::AllGatherIntoTensor { output, input } => g.all_gather(input, output)?,
            Collective::AllGatherCoalesced { outputs, inputs } => {
                // outputs[r][i]: input i of rank r.
                for (r, outs) in outputs.iter().enumerate() {
                    for (input, out) in inputs.iter().zip(outs) {
                        g.broadcast(input, out, r)?;
                    }
                }
            }
            Collective::AllGatherIntoTensorCoalesced { outputs, inputs } => {
                for (input, output) in inputs.iter().zip(outputs) {
                    g.all_gather(input, output)?;
                }
            }
            Collective::Gather {
                input,
                outputs,
                root,
            } => {
                if me == *root {
                    for (r, out) in outputs.iter().enumerate() {
                        if r == me {
                            g.copy(input, out, &self.stream)?;
                        } else {
                            g.recv(out, 0, None, r)?;
                        }
                    }
                } else {
                    g.send(input, 0, None, *root)?;
                }
            }
            Collective::Scatter {
                output,
                inputs,
                root,
            } => {
                if me == *root {
                    for (r, input) in inputs.iter().enumerate() {
                        if r == me {
                            g.copy(input, output, &self.stream)?;
                        } else {
                            g.send(input, 0, None, r)?;
                        }
                    }
                } else {
                    g.recv(output, 0, None, *root)?;
                }
            }
            Collective::ReduceScatter { output, inputs, op } => {
                for (r, input) in inputs.iter().enumerate() {
                    g.reduce(input, output, r, *op)?;
                }
            }
            Collective::ReduceScatterTensor { output, input, op } => {
                g.reduce_scatter(input, output, *op)?
            }
            Collective::ReduceScatterTensorCoalesced {
                outputs,
                inputs,
                op,
            } => {
                for (input, output) in inputs.iter().zip(outputs) {
                    g.reduce_scatter(input, output, *op)?;
                }
            }
            Collective::AllToAll { outputs, inputs } => {
                for (r, (input, output)) in inputs.iter().zip(outputs).enumerate() {
                    g.send(input, 0, None, r)?;
                    g.recv(output, 0, None, r)?;
                }
            }
            Collective::AllToAllSingle {
                output,
                input,
                send_rows,
                recv_rows,
                ..
            } => {
                let row = |t: &Tensor<'_>| match t.shape().first() {
                    Some(&rows) if rows > 0 => t.numel() / rows,
                    _ => 0,
                };
                let (send_row, recv_row) = (row(input), row(output));
                let (mut sent, mut got) = (0, 0);
                for r in 0..send_rows.len() {
                    let n_send = send_rows[r] * send_row;
                    let n_recv = recv_rows[r] * recv_row;
                    g.send(input, sent, Some(n_send), r)?;
                    g.recv(output, got, Some(n_recv), r)?;
                    sent += n_send;
                    got += n_recv;
                }
            }
            Collective::Barrier => {
                g.raw_all_reduce(self.barrier.ptr().addr(), 1, nccl_dtype(DType::F32))?;
            }
            Collective::AllReduceSparse { .. } | Collective::MonitoredBarrier { .. } => {
                return Err(Error::InvalidCollective {
                    op: call.into(),
                    reason: "not supported by the NCCL backend".into(),
                })
            }
        }
        g.finish()
    }
}

impl GroupBackend for NcclBackend {
    fn run(&self, collective: &Collective, call: &Call) -> Result<Option<Arc<dyn DeviceEvent>>> {
        let name = call.fingerprint.kind.name();
        let _launch = self.launch.lock().unwrap_or_else(PoisonError::into_inner);
        self.order_after_caller()?;
        self.run_collective(collective, name)?;
        // The engine keeps the collective's tensors until the event passes.
        self.completion(Box::new(())).map(Some)
    }

    fn abort(&self) {
        self.comm.abort();
    }

    fn runs_inline(&self) -> bool {
        true
    }

    fn health(&self) -> Result<()> {
        self.comm.health()
    }
}

/// One NCCL group of calls (`ncclGroupStart` .. `ncclGroupEnd`) on the
/// communication stream; dropped unfinished, it still ends the group.
pub(crate) struct Launch<'a> {
    nccl: &'a Nccl,
    communicator: &'a Communicator,
    comm: RawComm,
    stream: RawStream,
    device: usize,
    call: &'static str,
    open: bool,
}

impl Launch<'_> {
    /// The device address of `t`'s element `skip` and how many elements
    /// follow (`count`, else the rest).
    fn buffer(
        &self,
        t: &Tensor<'_>,
        skip: usize,
        count: Option<usize>,
    ) -> Result<(*mut c_void, usize)> {
        let (ctx, ptr) = t.cuda_ptr()?;
        if ctx.ordinal() != self.device {
            return Err(Error::InvalidCollective {
                op: self.call.into(),
                reason: format!(
                    "expected tensors on cuda:{} (the group's GPU), found one on cuda:{}",
                    self.device,
                    ctx.ordinal()
                ),
            });
        }
        let n = count.unwrap_or(t.numel().saturating_sub(skip));
        let addr = ptr.offset(skip * t.dtype().size()).addr();
        Ok((addr as *mut c_void, n))
    }

    fn check(&self, call: &str, code: i32) -> Result<()> {
        self.nccl.check(call, code, Some(self.comm))
    }

    fn all_reduce(&mut self, t: &Tensor<'_>, op: ReduceOp) -> Result<()> {
        let (p, n) = self.buffer(t, 0, None)?;
        let red = RedOp::new(self.nccl, self.comm, self.call, op, t.dtype())?;
        // SAFETY: in-place on a live device buffer of `n` elements.
        let code = unsafe {
            (self.nccl.all_reduce)(
                p,
                p,
                n,
                nccl_dtype(t.dtype()),
                red.raw,
                self.comm,
                self.stream,
            )
        };
        self.check("ncclAllReduce", code)
    }

    fn raw_all_reduce(&mut self, addr: u64, n: usize, dtype: RawDType) -> Result<()> {
        let p = addr as *mut c_void;
        // SAFETY: in-place on a live device buffer of `n` elements.
        let code = unsafe { (self.nccl.all_reduce)(p, p, n, dtype, 0, self.comm, self.stream) };
        self.check("ncclAllReduce", code)
    }

    fn broadcast(&mut self, input: &Tensor<'_>, output: &Tensor<'_>, root: usize) -> Result<()> {
        let (src, _) = self.buffer(input, 0, None)?;
        let (dst, n) = self.buffer(output, 0, None)?;
        // SAFETY: live device buffers of `n` elements.
        let code = unsafe {
            (self.nccl.broadcast)(
                src,
                dst,
                n,
                nccl_dtype(output.dtype()),
                root as i32,
                self.comm,
                self.stream,
            )
        };
        self.check("ncclBroadcast", code)
    }

    fn reduce(
        &mut self,
        input: &Tensor<'_>,
        output: &Tensor<'_>,
        root: usize,
        op: ReduceOp,
    ) -> Result<()> {
        let (src, n) = self.buffer(input, 0, None)?;
        let (dst, _) = self.buffer(output, 0, None)?;
        let red = RedOp::new(self.nccl, self.comm, self.call, op, input.dtype())?;
        // SAFETY: live device buffers of `n` elements.
        let code = unsafe {
            (self.nccl.reduce)(
                src,
                dst,
                n,
                nccl_dtype(input.dtype()),
                red.raw,
                root as i32,
                self.comm,
                self.stream,
            )
        };
        self.check("ncclReduce", code)
    }

    fn all_gather(&mut self, input: &Tensor<'_>, output: &Tensor<'_>) -> Result<()> {
        let (src, n) = self.buffer(input, 0, None)?;
        let (dst, _) = self.buffer(output, 0, None)?;
        // SAFETY: `output` holds the group's size times `n` elements
        // (validated).
        let code = unsafe {
            (self.nccl.all_gather)(
                src,
                dst,
                n,
                nccl_dtype(input.dtype()),
                self.comm,
                self.stream,
            )
        };
        self.check("ncclAllGather", code)
    }

    fn reduce_scatter(
        &mut self,
        input: &Tensor<'_>,
        output: &Tensor<'_>,
        op: ReduceOp,
    ) -> Result<()> {
        let (src, _) = self.buffer(input, 0, None)?;
        let (dst, n) = self.buffer(output, 0, None)?;
        let red = RedOp::new(self.nccl, self.comm, self.call, op, input.dtype())?;
        // SAFETY: `input` holds the group's size times `n` elements
        // (validated).
        let code = unsafe {
            (self.nccl.reduce_scatter)(
                src,
                dst,
                n,
                nccl_dtype(input.dtype()),
                red.raw,
                self.comm,
                self.stream,
            )
        };
        self.check("ncclReduceScatter", code)
    }

    /// Sends `count` elements of `t` from element `skip` (all of it when
    /// `count` is `None`) to `peer`.
    pub(crate) fn send(
        &mut self,
        t: &Tensor<'_>,
        skip: usize,
        count: Option<usize>,
        peer: usize,
    ) -> Result<()> {
        let (p, n) = self.buffer(t, skip, count)?;
        // SAFETY: a live device buffer of `n` elements.
        let code = unsafe {
            (self.nccl.send)(
                p,
                n,
                nccl_dtype(t.dtype()),
                peer as i32,
                self.comm,
                self.stream,
            )
        };
        self.check("ncclSend", code)
    }

    /// Receives into `count` elements of `t` from element `skip`.
    pub(crate) fn recv(
        &mut self,
        t: &Tensor<'_>,
        skip: usize,
        count: Option<usize>,
        peer: usize,
    ) -> Result<()> {
        let (p, n) = self.buffer(t, skip, count)?;
        // SAFETY: a live device buffer of `n` elements.
        let code = unsafe {
            (self.nccl.recv)(
                p,
                n,
                nccl_dtype(t.dtype()),
                peer as i32,
                self.comm,
                self.stream,
            )
        };
        self.check("ncclRecv", code)
    }

    /// Copies `input` into `output` on `stream` (this rank's own part of a
    /// gather or scatter).
    fn copy(&mut self, input: &Tensor<'_>, output: &Tensor<'_>, stream: &Stream) -> Result<()> {
        let (ctx, src) = input.cuda_ptr()?;
        let (_, dst) = output.cuda_ptr()?;
        runtime::copy_dtod_async(&ctx, dst, &ctx, src, input.nbytes(), stream)
    }

    /// Ends the group: NCCL queues its calls. A non-blocking
    /// communicator may still be connecting (the first transfer between
    /// two ranks); the next call must wait until it is done.
    pub(crate) fn finish(mut self) -> Result<()> {
        self.open = false;
        // SAFETY: ends the group this launch started.
        let code = unsafe { (self.nccl.group_end)() };
        self.check("ncclGroupEnd", code)?;
        if code == IN_PROGRESS {
            self.communicator.wait_queued("ncclGroupEnd")?;
        }
        Ok(())
    }
}

impl Drop for Launch<'_> {
    fn drop(&mut self) {
        if self.open {
            // SAFETY: ends the group this launch started.
            unsafe { (self.nccl.group_end)() };
        }
    }
}

/// Completion events for reuse: creating one costs more than a call.
struct EventPool {
    device: usize,
    free: Mutex<Vec<Event>>,
}

impl EventPool {
    fn take(&self) -> Result<Event> {
        let reused = self
            .free
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .pop();
        match reused {
            Some(e) => Ok(e),
            None => Event::new(self.device),
        }
    }
}

/// A collective's completion on the communication stream, holding its
/// tensors until dropped.
struct NcclEvent {
    event: Option<Event>,
    pool: Arc<EventPool>,
    _keep: Mutex<Option<Box<dyn Any + Send>>>,
}

impl NcclEvent {
    fn event(&self) -> &Event {
        self.event
            .as_ref()
            .expect("the event is present until drop")
    }
}

impl DeviceEvent for NcclEvent {
    fn query(&self) -> Result<bool> {
        self.event().query()
    }

    fn synchronize(&self) -> Result<()> {
        self.event().synchronize()
    }

    fn wait_on_current_stream(&self) -> Result<()> {
        current_stream(self.pool.device)?.wait(self.event())
    }
}

impl Drop for NcclEvent {
    fn drop(&mut self) {
        if let Some(e) = self.event.take() {
            self.pool
                .free
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .push(e);
        }
    }
}
