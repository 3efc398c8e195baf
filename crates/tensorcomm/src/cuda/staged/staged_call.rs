//! One collective of the CPU group over CUDA tensors, staged through
//! pinned host memory (PyTorch's `ProcessGroupGloo` CUDA work):
//!
//! 1. at call time, on the caller's thread ([`StagedCall::prepare`]): an
//!    event marks the work queued so far on the caller's current stream;
//! 2. when the collective's turn comes ([`Ordered::copy_down`]): the GPU's
//!    staging stream waits for that event (not for work the caller queued
//!    after the call, which a later call's order would bring in), then the
//!    copies down of every CUDA tensor the collective reads are queued on
//!    it, after the copies up of every earlier collective (so a
//!    tensor written by an earlier collective is read as it left it, even
//!    when the caller did not wait in between; point-to-point copies run on
//!    streams of their own), followed by an event; the
//!    host waits for it ([`StagedCall::wait_copied_down_until`]), then the
//!    CPU collective runs on the host copies ([`StagedCall::host`]);
//! 3. the copies up of every CUDA tensor it writes are queued on the
//!    staging stream, followed by the event the `Work` completes on
//!    ([`StagedCall::copy_up`]): `wait()` makes the caller's current
//!    stream wait for it, `synchronize()` blocks on it.
//!
//! Host tensors of the same call are used as they are. A sparse
//! all-reduce stages its values the same way; its result (whose size is
//! only known at the end) gets new GPU memory for its values.

use std::sync::{Arc, PoisonError};

use super::staged_event::StagedEvent;
use super::staging_device::StagingDevice;
use crate::cuda::runtime::Event;
use crate::group::collective::Collective;
use crate::group::{DeviceEvent, SparseSlot};
use crate::tensor::{Layout, SparseTensor, Tensor};
use crate::{Error, Result};

/// See the module docs.
pub(crate) struct StagedCall {
    device: Arc<StagingDevice>,
    /// The collective over the host copies.
    host: Collective,
    /// What is copied back.
    results: Results,
    /// Passed once the copies down are done.
    down: Arc<StagedEvent>,
}

/// What a staged call copies back to its GPU.
enum Results {
    /// Each CUDA tensor the collective writes, with its host copy.
    Dense(Vec<(Tensor<'static>, Tensor<'static>)>),
    /// The caller's result slot of a sparse all-reduce; the host
    /// collective leaves its result in its own slot.
    Sparse {
        caller: SparseSlot,
        host: SparseSlot,
    },
}

/// A staged call ordered after the caller's stream, its copies not yet
/// queued (step 1 done).
pub(crate) struct Ordered {
    device: Arc<StagingDevice>,
    /// The caller's stream when the call was made.
    caller: Event,
}

impl Ordered {
    /// The staging device, its stream now waiting for the caller's stream
    /// as it was when the call was made (and after every earlier call's
    /// copies): what is queued next on it runs in call order.
    pub(super) fn into_device(self) -> Result<Arc<StagingDevice>> {
        self.device.wait_for(&self.caller)?;
        Ok(self.device)
    }

    /// Step 2's first half for rank `rank`'s `collective` (see the module
    /// docs): queues the copies down, in call order.
    pub(crate) fn copy_down(self, collective: &Collective, rank: usize) -> Result<StagedCall> {
        let device = self.into_device()?;
        let staged = StagedCall::queue_copies_down(&device, collective, rank);
        if staged.is_err() {
            device.settle();
        }
        let (host, results, keep) = staged?;
        let down = device.record(keep)?;
        Ok(StagedCall {
            device,
            host,
            results,
            down,
        })
    }
}

impl StagedCall {
    /// Step 1 (see the module docs), on the caller's thread at call time,
    /// for a collective whose CUDA tensors are all on `device`'s GPU.
    pub(crate) fn prepare(device: Arc<StagingDevice>) -> Result<Ordered> {
        let caller = device.caller_point()?;
        Ok(Ordered { device, caller })
    }

    /// The host collective, what it copies back, and every tensor the
    /// queued copies touch.
    fn queue_copies_down(
        device: &StagingDevice,
        collective: &Collective,
        rank: usize,
    ) -> Result<(Collective, Results, Vec<Tensor<'static>>)> {
        let mut keep = Vec::new();
        if let Collective::AllReduceSparse { tensor, result } = collective {
            let values = tensor.values();
            let host_values = device.host_copy_of(values)?;
            device.copy_down(values, &host_values)?;
            keep.extend([values.clone(), host_values.clone()]);
            let host_slot = SparseSlot::default();
            let host = Collective::AllReduceSparse {
                tensor: tensor.with_values(host_values),
                result: host_slot.clone(),
            };
            let results = Results::Sparse {
                caller: result.clone(),
                host: host_slot,
            };
            return Ok((host, results, keep));
        }
        let mut written = Vec::new();
        let host = collective.map_tensors(rank, &mut |t, role| {
            if t.device().is_cpu() {
                return Ok(t.clone());
            }
            let copy = device.host_copy_of(t)?;
            if role.is_read() {
                device.copy_down(t, &copy)?;
            }
            if role.is_written() {
                written.push((t.clone(), copy.clone()));
            }
            keep.extend([t.clone(), copy.clone()]);
            Ok(copy)
        })?;
        Ok((host, Results::Dense(written), keep))
    }

    /// The collective to run on the host: the caller's, over host copies.
    pub(crate) fn host(&self) -> &Collective {
        &self.host
    }

    /// Step 2, bounded by the call's `deadline`: the copies wait for the
    /// caller's stream, and a stream that does not get there in time is
    /// this rank's problem, said as such (not a peer's timeout).
    pub(crate) fn wait_copied_down_until(&self, deadline: std::time::Instant) -> Result<()> {
        wait_until(&self.down, deadline)
    }

    /// Step 3, after the host collective succeeded: queues the copies up
    /// and gives the event after which they are done.
    pub(crate) fn copy_up(self) -> Result<Arc<dyn DeviceEvent>> {
        let device = &self.device;
        let queued = self.queue_copies_up();
        if queued.is_err() {
            device.settle();
        }
        let event: Arc<dyn DeviceEvent> = device.record(queued?)?;
        Ok(event)
    }

    /// Queues the copies up; gives every tensor they touch.
    fn queue_copies_up(&self) -> Result<Vec<Tensor<'static>>> {
        let device = &self.device;
        match &self.results {
            Results::Dense(written) => {
                let mut keep = Vec::with_capacity(2 * written.len());
                for (gpu, host) in written {
                    device.copy_up(host, gpu)?;
                    keep.extend([gpu.clone(), host.clone()]);
                }
                Ok(keep)
            }
            Results::Sparse { caller, host } => {
                let sum = host
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .take()
                    .ok_or_else(|| {
                        Error::InvalidArgument(
                            "all_reduce_sparse finished on the host without a result".into(),
                        )
                    })?;
                let values = sum.values();
                // Pinned, so the copy up runs asynchronously.
                let pinned = device.host_copy_of(values)?;
                pinned.copy_from(values)?;
                let layout = Layout::contiguous(values.shape());
                let gpu = Tensor::uninit_cuda(layout, values.dtype(), device.context())?;
                device.copy_up(&pinned, &gpu)?;
                let on_gpu: SparseTensor = sum.with_values(gpu.clone());
                *caller.lock().unwrap_or_else(PoisonError::into_inner) = Some(on_gpu);
                Ok(vec![gpu, pinned])
            }
        }
    }
}

/// Waits for the copies down before `down`, up to `deadline` (they wait
/// for the caller's stream: a stream that does not get there in time is
/// this rank's problem, said as such, not a peer's timeout).
pub(crate) fn wait_until(down: &StagedEvent, deadline: std::time::Instant) -> Result<()> {
    let started = std::time::Instant::now();
    while !down.query()? {
        if std::time::Instant::now() >= deadline {
            return Err(crate::Error::Cuda {
                call: "copying CUDA tensors to pinned host memory".into(),
                code: "timeout".into(),
                message: format!(
                    "the copies had not run after {:?}: they wait for the work queued before the call on the caller's current stream, which had not finished",
                    started.elapsed()
                ),
            });
        }
        if started.elapsed() < std::time::Duration::from_micros(200) {
            std::hint::spin_loop();
        } else {
            std::thread::sleep(std::time::Duration::from_micros(20));
        }
    }
    Ok(())
}
