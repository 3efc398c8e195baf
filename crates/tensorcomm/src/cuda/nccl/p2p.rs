//! Point-to-point `send` and `recv` of the NCCL group: queued on the
//! communication stream after the caller's current stream, outside the
//! collectives' sequence (only two ranks take part), and bounded by their
//! timeout: querying or synchronizing a transfer past its deadline aborts
//! the communicator and fails with [`Error::PeerTimeout`].

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::group_backend::NcclBackend;
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
    if backend.comm.is_aborted() {
        return Err(Error::GroupBroken {
            op: name.into(),
            seq: 0,
        });
    }
    let event = {
        let _launch = backend
            .launch
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        backend.order_after_caller()?;
        let mut g = backend.group(name)?;
        match direction {
            Direction::Send => g.send(tensor, 0, None, peer)?,
            Direction::Recv => g.recv(tensor, 0, None, peer)?,
        }
        g.finish()?;
        backend.completion(Box::new(tensor.clone()))?
    };
    let (work, completion) = Work::new();
    let bounded = Arc::new(Bounded {
        inner: event,
        backend: backend.clone(),
        deadline: Instant::now() + timeout,
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
