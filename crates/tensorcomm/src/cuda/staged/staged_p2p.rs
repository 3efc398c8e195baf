//! A point-to-point message of a CUDA tensor through the CPU group: a
//! send copies the tensor down at call time (after the caller's current
//! stream) and the sender thread waits for that copy before sending the
//! host copy; a receive lands in a host copy, then copies up to the GPU
//! (after the caller's current stream as it was at the call), and its
//! `Work` completes on the device. Sends copy on the staging's sends'
//! stream, receives on its receive streams (see `staging_device.rs` for
//! why not on the collectives' one).

use std::sync::Arc;

use super::receive_streams::ReceiveOrder;
use super::staged_event::StagedEvent;
use super::staging_device::StagingDevice;
use crate::group::DeviceEvent;
use crate::tensor::Tensor;
use crate::Result;

/// See the module docs.
pub(crate) struct StagedP2p {
    device: Arc<StagingDevice>,
    gpu: Tensor<'static>,
    host: Tensor<'static>,
    /// A send's copy down.
    down: Option<Arc<StagedEvent>>,
    /// What a receive's copy up waits for, taken at its call.
    order: Option<ReceiveOrder>,
}

impl StagedP2p {
    /// At call time, on the caller's thread: the host copy of `tensor`
    /// that a send reads, its copy down queued after the caller's current
    /// stream.
    pub(crate) fn send(device: Arc<StagingDevice>, tensor: &Tensor<'static>) -> Result<Self> {
        let span = device.span(tensor)?;
        let queued = (|| {
            device.p2p_after(&device.caller_point()?)?;
            let host = device.host_copy_of(tensor)?;
            device.copy_down_p2p(tensor, &host)?;
            Ok(host)
        })();
        if queued.is_err() {
            device.settle();
        }
        let host = queued?;
        let down = device.record_p2p(vec![tensor.clone(), host.clone()])?;
        device.note_send(span, &down);
        Ok(StagedP2p {
            device,
            gpu: tensor.clone(),
            host,
            down: Some(down),
            order: None,
        })
    }

    /// At call time, on the caller's thread: the host copy a receive
    /// lands in; its copy up will run after the work queued so far on the
    /// caller's current stream, after the copies down of the sends in
    /// flight whose tensors overlap `tensor`, and after earlier receives'
    /// copies (see `receive_streams.rs`).
    pub(crate) fn recv(device: Arc<StagingDevice>, tensor: &Tensor<'static>) -> Result<Self> {
        let order = device.order_receive(tensor)?;
        let host = device.host_copy_of(tensor)?;
        Ok(StagedP2p {
            device,
            gpu: tensor.clone(),
            host,
            down: None,
            order: Some(order),
        })
    }

    /// The host tensor the message is sent from or received into.
    pub(crate) fn host(&self) -> &Tensor<'static> {
        &self.host
    }

    /// A send's step before reading the host copy: blocks until its copy
    /// down is done.
    pub(crate) fn wait_copied_down(&self) -> Result<()> {
        match &self.down {
            Some(down) => down.synchronize(),
            None => Ok(()),
        }
    }

    /// A receive's step after the message landed in the host copy: queues
    /// the copy up and gives the event after which it is done.
    pub(crate) fn copy_up(self) -> Result<Arc<dyn DeviceEvent>> {
        let Some(order) = &self.order else {
            return Err(crate::Error::InvalidArgument(
                "a send's host copy was handed back as a received message".into(),
            ));
        };
        let event: Arc<dyn DeviceEvent> =
            self.device.copy_up_received(order, &self.host, &self.gpu)?;
        Ok(event)
    }
}
