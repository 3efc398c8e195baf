//! `StagedEvent`: the point on one of a GPU's staging streams after which
//! the copies of one call are done, holding every tensor those copies read or
//! write (the caller's CUDA tensors and their pinned host copies) until
//! it is dropped.

use crate::cuda::runtime::{current_stream, Event};
use crate::group::DeviceEvent;
use crate::tensor::Tensor;
use crate::Result;

/// See the module docs.
pub(crate) struct StagedEvent {
    event: Event,
    device: usize,
    _keep: Vec<Tensor<'static>>,
}

impl StagedEvent {
    /// `event` (recorded on one of GPU `device`'s staging streams) keeping
    /// `keep` alive.
    pub(crate) fn new(event: Event, device: usize, keep: Vec<Tensor<'static>>) -> Self {
        StagedEvent {
            event,
            device,
            _keep: keep,
        }
    }

    /// The CUDA event, for another stream to wait for.
    pub(crate) fn event(&self) -> &Event {
        &self.event
    }

    /// True once the copies before the event are done (an error counts as
    /// not done: the tensors stay held).
    pub(crate) fn is_done(&self) -> bool {
        matches!(self.event.query(), Ok(true))
    }
}

impl DeviceEvent for StagedEvent {
    fn query(&self) -> Result<bool> {
        self.event.query()
    }

    fn synchronize(&self) -> Result<()> {
        self.event.synchronize()
    }

    fn wait_on_current_stream(&self) -> Result<()> {
        current_stream(self.device)?.wait(&self.event)
    }
}
