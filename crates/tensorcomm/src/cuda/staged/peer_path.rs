//! The CPU group's device path (PyTorch Gloo's
//! `AsyncAllreduceCUDADeviceWork`): a dense SUM or AVG all_reduce whose
//! every rank passes an eligible CUDA tensor runs on peer memory
//! (`cuda::intranode`) on the GPU's staging stream, with no host copies.
//! The ranks decide together, call by call, with a one-element vote over
//! the host transport (see `cpu/group_backend.rs`), so ranks that mix
//! host and CUDA tensors, or pass a tensor peer memory refuses, all take
//! the staged path instead.

use std::sync::Arc;

use super::staged_call::Ordered;
use super::staged_event::StagedEvent;
use crate::cuda::intranode::{AllReduceAlgo, IntraNodeComm};
use crate::group::{DeviceEvent, ReduceOp};
use crate::tensor::Tensor;
use crate::Result;

/// Whether this rank can take the device path for an all_reduce of
/// `tensor` with `op` (its vote).
pub(crate) fn peer_path_eligible(comm: &IntraNodeComm, tensor: &Tensor<'_>, op: ReduceOp) -> bool {
    matches!(op, ReduceOp::Sum | ReduceOp::Avg)
        && comm.select_all_reduce_algo(tensor, op) != AllReduceAlgo::None
}

impl Ordered {
    /// Runs the all_reduce on peer memory, on the staging stream, once it
    /// waits for the caller's stream as it was at the call; the event
    /// holds `tensor` until the kernel is done and reports a kernel that
    /// stopped early (a peer did not arrive) when waited for on the host.
    pub(crate) fn peer_all_reduce(
        self,
        comm: &Arc<IntraNodeComm>,
        tensor: &Tensor<'static>,
        op: ReduceOp,
    ) -> Result<Arc<dyn DeviceEvent>> {
        let device = self.into_device()?;
        comm.all_reduce_on(tensor, op, device.stream())?;
        let event = device.record(vec![tensor.clone()])?;
        Ok(Arc::new(PeerEvent {
            event,
            comm: comm.clone(),
        }))
    }
}

/// A device-path call's completion: the staging event, then the
/// communicator's verdict.
struct PeerEvent {
    event: Arc<StagedEvent>,
    comm: Arc<IntraNodeComm>,
}

impl DeviceEvent for PeerEvent {
    fn query(&self) -> Result<bool> {
        let done = self.event.query()?;
        if done {
            self.comm.check()?;
        }
        Ok(done)
    }

    fn synchronize(&self) -> Result<()> {
        self.event.synchronize()?;
        self.comm.check()
    }

    fn wait_on_current_stream(&self) -> Result<()> {
        self.comm.check()?;
        self.event.wait_on_current_stream()
    }
}
