//! CUDA tensors through the CPU backend: each call's CUDA tensors are
//! copied into pinned host memory on a stream of their GPU, ordered after
//! the caller's current stream; the CPU collective runs on the host
//! copies; the results are copied back on that GPU's staging streams
//! (point-to-point messages on streams of their own), and the call's
//! `Work` completes on the device (`wait()` makes the caller's current
//! stream wait, `synchronize()` blocks the host). This is what PyTorch's
//! Gloo backend does with CUDA tensors (`AsyncAllreduceCUDAHostWork` and
//! its siblings), for every collective of the CPU group, sparse
//! all-reduce and point-to-point messages included.
//!
//! Ranks may mix placements: some pass host tensors, others CUDA tensors
//! of the same shape and dtype. Fingerprints carry no device, so they
//! agree, and the bytes that travel are the same.
//!
//! - [`Staging`]: a group's staging, one [`StagingDevice`] per GPU it has
//!   seen (stream, pinned buffer pool, copies in flight).
//! - [`StagedCall`]: one collective's copies down and up.
//! - [`StagedP2p`]: a send's copy down, a receive's copy up
//!   (`receive_streams`: which stream a receive copies up on).
//! - `peer_path`: the device path, a dense SUM/AVG all_reduce on peer
//!   memory when every rank can take it (groups created with
//!   `CpuOptions::peer_memory`).
//!
//! - `pipelined`: a large all_reduce of a contiguous CUDA tensor in
//!   chunks, chunk i+1 copied down and chunk i-1 copied up while chunk i
//!   is reduced (groups with a rank on a GPU host or with peer memory,
//!   where the ranks vote on it); other calls copy everything down,
//!   reduce, then copy everything up.

mod one_gpu;
mod peer_path;
mod pinned_pool;
mod pipelined;
mod receive_streams;
mod staged_call;
mod staged_event;
mod staged_p2p;
mod staging_device;

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

pub(crate) use one_gpu::gpu_of;
pub(crate) use peer_path::peer_path_eligible;
pub(crate) use pipelined::{all_reduce_host_chunks, PIPELINE_MIN_BYTES};
pub(crate) use staged_call::{Ordered, StagedCall};
pub(crate) use staged_p2p::StagedP2p;
pub(crate) use staging_device::StagingDevice;

use crate::Result;

/// One group's staging: a [`StagingDevice`] per GPU, made on first use.
#[derive(Default)]
pub(crate) struct Staging {
    devices: Mutex<HashMap<usize, Arc<StagingDevice>>>,
}

impl Staging {
    /// The staging of GPU `ordinal`.
    pub(crate) fn device(&self, ordinal: usize) -> Result<Arc<StagingDevice>> {
        let mut devices = self.devices.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(d) = devices.get(&ordinal) {
            return Ok(d.clone());
        }
        let d = Arc::new(StagingDevice::new(ordinal)?);
        devices.insert(ordinal, d.clone());
        Ok(d)
    }
}
