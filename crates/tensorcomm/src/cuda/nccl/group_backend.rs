//! The NCCL backend as the engine sees it ([`GroupBackend`]): each
//! collective is planned (`plan.rs`), then queued on the group's
//! communication stream after the work already queued on the caller's
//! current stream, and returns with the event after which it is done (the
//! engine keeps its tensors until then). An all_reduce that the group's
//! [`IntraNodeComm`] takes runs on peer memory instead, on the same stream.

use std::any::Any;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Instant;

use super::communicator::Communicator;
use super::library::{RawComm, RawStream, IN_PROGRESS};
use super::plan::{Plan, Planner, Step};
use crate::cuda::intranode::{large_beats_nccl, AlgoChoice, AllReduceAlgo, IntraNodeComm};
use crate::cuda::runtime::{self, context, current_stream, DeviceBuffer, Event, Stream};
use crate::group::backend::{Call, GroupBackend};
use crate::group::collective::Collective;
use crate::group::DeviceEvent;
use crate::Result;

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
    /// All-reduce on peer memory, when the group's ranks qualify.
    pub(crate) intranode: Option<IntraNodeComm>,
    /// Why `intranode` is absent (empty when present).
    pub(crate) intranode_reason: String,
}

impl NcclBackend {
    pub(crate) fn new(
        comm: Communicator,
        intranode: std::result::Result<IntraNodeComm, String>,
    ) -> Result<NcclBackend> {
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
            intranode_reason: intranode.as_ref().err().cloned().unwrap_or_default(),
            intranode: intranode.ok(),
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

    /// Queues `collective` on the communication stream: plans it (every
    /// address and op resolved), makes this rank's own copies, then issues
    /// its NCCL calls as one group. `deadline` bounds waiting for a group
    /// that NCCL reports still in progress (ranks connecting).
    pub(crate) fn queue<'c>(
        &'c self,
        collective: &Collective,
        call: &'static str,
        deadline: Instant,
    ) -> Result<()> {
        // Collectives on the group's communicator; sends and receives on
        // its point-to-point one (the same unless launches block).
        let p2p = self.comm.p2p();
        let plan_on = |comm: &'c Communicator| -> Result<Option<(Plan<'c>, i32)>> {
            let entered = comm.enter()?;
            let planner = Planner {
                nccl: comm.nccl,
                comm: entered.raw(),
                rank: comm.rank,
                device: comm.device,
                call,
                barrier: self.barrier.ptr(),
            };
            let plan = planner.plan(collective)?;
            if plan.has_p2p() && !std::ptr::eq(comm, p2p) {
                return Ok(None);
            }
            match self.issue(&plan, entered.raw()) {
                Ok(ended) => Ok(Some((plan, ended))),
                Err(e) => {
                    // NCCL may still be queuing what was issued before the
                    // error, with the plan's ops; the engine aborts the
                    // communicator next, which frees them.
                    std::mem::forget(plan);
                    Err(e)
                }
            }
        };
        let (comm, plan, ended) = match plan_on(&self.comm)? {
            Some((plan, ended)) => (&self.comm, plan, ended),
            None => {
                let (plan, ended) =
                    plan_on(p2p)?.expect("planned on the point-to-point communicator");
                (p2p, plan, ended)
            }
        };
        // A non-blocking communicator may still be queuing the group's
        // calls on NCCL's own thread, and they use the plan's reduce ops
        // (a PremulSum op NCCL created for this call): destroying one then
        // crashed a rank. So the plan goes only once NCCL is done queuing,
        // inside the communicator's gate; where it never got done (a
        // timeout, a broken communicator) its ops are left to NCCL.
        if ended == IN_PROGRESS {
            if let Err(e) = comm.wait_queued("ncclGroupEnd", deadline) {
                std::mem::forget(plan);
                return Err(e);
            }
        }
        if !plan.owns_ops() {
            // Dropping it calls nothing of NCCL's.
            return Ok(());
        }
        match comm.enter() {
            Ok(entered) => {
                drop(plan);
                drop(entered);
            }
            // Aborted meanwhile: the ops went with the communicator.
            Err(_) => std::mem::forget(plan),
        }
        Ok(())
    }

    /// Issues `plan`'s copies, then its NCCL calls between
    /// `ncclGroupStart` and `ncclGroupEnd`; gives `ncclGroupEnd`'s result.
    fn issue(&self, plan: &Plan<'_>, comm: RawComm) -> Result<i32> {
        let nccl = self.comm.nccl;
        let ctx = self.comm.context();
        for step in &plan.steps {
            if let Step::Copy { dst, src, bytes } = *step {
                runtime::copy_dtod_async(ctx, dst, ctx, src, bytes, &self.stream)?;
            }
        }
        let stream = self.stream.raw() as RawStream;
        // SAFETY: no arguments.
        nccl.check(
            "ncclGroupStart",
            unsafe { (nccl.group_start)() },
            Some(comm),
        )?;
        let mut first_error = None;
        for step in &plan.steps {
            // SAFETY: every buffer is a live device allocation of the
            // group's GPU holding `count` elements (validated and planned),
            // kept alive by the engine until the device is done; `comm` is
            // entered.
            let (name, code) = unsafe {
                match *step {
                    Step::AllReduce { buf, op } => (
                        "ncclAllReduce",
                        (nccl.all_reduce)(
                            buf.ptr,
                            buf.ptr,
                            buf.count,
                            buf.dtype,
                            plan.ops[op].raw,
                            comm,
                            stream,
                        ),
                    ),
                    Step::Broadcast { src, dst, root } => (
                        "ncclBroadcast",
                        (nccl.broadcast)(
                            src.ptr,
                            dst.ptr,
                            dst.count,
                            dst.dtype,
                            root as i32,
                            comm,
                            stream,
                        ),
                    ),
                    Step::Reduce { src, dst, op, root } => (
                        "ncclReduce",
                        (nccl.reduce)(
                            src.ptr,
                            dst.ptr,
                            src.count,
                            src.dtype,
                            plan.ops[op].raw,
                            root as i32,
                            comm,
                            stream,
                        ),
                    ),
                    Step::AllGather { src, dst } => (
                        "ncclAllGather",
                        (nccl.all_gather)(src.ptr, dst.ptr, src.count, src.dtype, comm, stream),
                    ),
                    Step::ReduceScatter { src, dst, op } => (
                        "ncclReduceScatter",
                        (nccl.reduce_scatter)(
                            src.ptr,
                            dst.ptr,
                            dst.count,
                            src.dtype,
                            plan.ops[op].raw,
                            comm,
                            stream,
                        ),
                    ),
                    Step::Send { buf, peer } => (
                        "ncclSend",
                        (nccl.send)(buf.ptr, buf.count, buf.dtype, peer as i32, comm, stream),
                    ),
                    Step::Recv { buf, peer } => (
                        "ncclRecv",
                        (nccl.recv)(buf.ptr, buf.count, buf.dtype, peer as i32, comm, stream),
                    ),
                    Step::Copy { .. } => continue,
                }
            };
            if let Err(e) = nccl.check(name, code, Some(comm)) {
                first_error = Some(e);
                break;
            }
        }
        // SAFETY: ends the group started above (also after an error, which
        // the engine follows with an abort).
        let ended = unsafe { (nccl.group_end)() };
        if let Some(e) = first_error {
            return Err(e);
        }
        nccl.check("ncclGroupEnd", ended, Some(comm))?;
        Ok(ended)
    }
}

impl GroupBackend for NcclBackend {
    fn run(&self, collective: &Collective, call: &Call) -> Result<Option<Arc<dyn DeviceEvent>>> {
        let name = call.fingerprint.kind.name();
        let _launch = self.launch.lock().unwrap_or_else(PoisonError::into_inner);
        self.order_after_caller()?;
        match (&self.intranode, collective) {
            // Unless forced, messages for the large kernel go to NCCL where
            // the large kernel is not measured to beat it (see
            // `large_beats_nccl`).
            (Some(peer), Collective::AllReduce { tensor, op })
                if match peer.select_all_reduce_algo(tensor, *op) {
                    AllReduceAlgo::None => false,
                    AllReduceAlgo::Large => {
                        peer.algo_choice() != AlgoChoice::Auto || large_beats_nccl(peer.world())
                    }
                    _ => true,
                } =>
            {
                peer.all_reduce_on(tensor, *op, &self.stream)?;
            }
            (peer, _) => {
                if let (Some(peer), Collective::AllReduce { .. }) = (peer, collective) {
                    peer.count_fallback();
                }
                self.queue(collective, name, call.deadline)?;
            }
        }
        // The engine keeps the collective's tensors until the event passes.
        self.completion(Box::new(())).map(Some)
    }

    fn abort(&self) {
        if let Some(peer) = &self.intranode {
            peer.abort();
        }
        self.comm.abort();
    }

    fn runs_inline(&self) -> bool {
        true
    }

    fn health(&self) -> Result<()> {
        if let Some(peer) = &self.intranode {
            peer.check()?;
        }
        self.comm.health()
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
