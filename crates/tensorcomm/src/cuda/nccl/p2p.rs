//! Point-to-point `send` and `recv` of the NCCL group: queued on the
//! communication stream after the caller's current stream, outside the
//! collectives' sequence (only two ranks take part), and bounded by their
//! timeout: querying or synchronizing a transfer past its deadline aborts
//! the communicator and fails with [`Error::PeerTimeout`].

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::group_backend::NcclBackend;
use crate::group::collective::Collective;
use crate::group::{DeviceEvent, Work};
use crate::tensor::Tensor;
use crate::{Error, Result};

/// Which way a transfer goes.
#[derive(Clone, Copy)]
pub(crate) enum Direction {
    Send,
    Recv,
}

/// Queues a transfer of `tensor` to or from `peer` and returns its `Work`.
pub(crate) fn transfer(
    backend: &Arc<NcclBackend>,
    direction: Direction,
    tensor: &Tensor<'static>,
    peer: usize,
    timeout: Duration,
) -> Result<Work> {
    let (name, during) = match direction {
        Direction::Send => ("send", format!("sending to rank {peer}")),
        Direction::Recv => ("recv", format!("receiving from rank {peer}")),
    };
    let deadline = Instant::now() + timeout;
    let event = {
        let _launch = backend
            .launch
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        backend.order_after_caller()?;
        let collective = match direction {
            // A send is a gather with one input and no outputs on a rank
            // that is not its root; a receive a scatter's non-root part.
            Direction::Send => Collective::Gather {
                input: tensor.clone(),
                outputs: Vec::new(),
                root: peer,
            },
            Direction::Recv => Collective::Scatter {
                output: tensor.clone(),
                inputs: Vec::new(),
                root: peer,
            },
        };
        backend.queue(&collective, name, deadline)?;
        backend.completion(Box::new(collective))?
    };
    let (work, completion) = Work::new();
    let bounded = Arc::new(Bounded {
        inner: event,
        backend: backend.clone(),
        deadline,
        timeout,
        peer,
        during,
    });
    completion.complete_on_device(Ok(()), bounded);
    Ok(work)
}

/// A transfer's event with its deadline (see the module docs).
struct Bounded {
    inner: Arc<dyn DeviceEvent>,
    backend: Arc<NcclBackend>,
    deadline: Instant,
    timeout: Duration,
    peer: usize,
    during: String,
}

impl DeviceEvent for Bounded {
    fn query(&self) -> Result<bool> {
        // Aborted work looks complete: the abort's cause comes first.
        self.backend.comm.refuse_if_aborted()?;
        if self.inner.query()? {
            return Ok(true);
        }
        if Instant::now() < self.deadline {
            return Ok(false);
        }
        self.backend.comm.abort();
        Err(Error::PeerTimeout {
            peer: self.peer,
            during: self.during.clone(),
            timeout: self.timeout,
        })
    }

    fn synchronize(&self) -> Result<()> {
        while !self.query()? {
            std::thread::sleep(Duration::from_micros(20));
        }
        Ok(())
    }

    fn wait_on_current_stream(&self) -> Result<()> {
        self.inner.wait_on_current_stream()
    }
}
