//! `torch.cuda.comm` for Rust: moving tensors between the GPUs of one
//! process.
//!
//! | function | PyTorch |
//! | --- | --- |
//! | [`broadcast`], [`broadcast_out`] | `torch.cuda.comm.broadcast` |
//! | [`broadcast_coalesced`], [`broadcast_coalesced_mixed`] | `torch.cuda.comm.broadcast_coalesced` |
//! | [`scatter`], [`scatter_out`] | `torch.cuda.comm.scatter` |
//! | [`gather`], [`gather_out`] | `torch.cuda.comm.gather` |
//! | [`reduce_add`], [`reduce_add_sparse`], [`reduce_add_mixed`] | `torch.cuda.comm.reduce_add` |
//! | [`reduce_add_coalesced`] | `torch.cuda.comm.reduce_add_coalesced` |
//!
//! Semantics follow `torch/csrc/cuda/comm.cpp`: outputs on the source's own
//! device are the inputs themselves (same storage), dense layouts such as
//! channels-last are preserved, and every argument is checked before
//! anything is written — errors ([`Error::CommArgument`])
//! name the offending tensor index, what was expected and what was found.
//! Differences: dtypes must match (PyTorch would convert), and every call
//! has finished its GPU work when it returns.
//!
//! Sparse tensors: a [`SparseTensor`](crate::tensor::SparseTensor) whose
//! values are on a GPU (its indices stay on the host) takes part in
//! [`broadcast_coalesced_mixed`] and [`reduce_add_sparse`] /
//! [`reduce_add_mixed`], which take dense and sparse tensors in one list of
//! [`CommTensor`] as PyTorch does. Sparse sums are uncoalesced
//! concatenations, as PyTorch's sparse add; `reduce_add` of a list mixing
//! dense and sparse tensors is an error (PyTorch would densify), and
//! `reduce_add_coalesced` takes dense tensors only.
//!
//! How the bytes move: the copy method is picked per range. Ranges between
//! two GPUs of at least 4 MiB go to the copy engines (`cuMemcpyPeerAsync`
//! on a stream of their own, beside the kernels); all other dense ranges of
//! a call are copied by one multi-tensor copy kernel (many tensors, one
//! launch), run on the source GPU and writing into the peers' memory over
//! NVLink, or, for calls of at most 4 MiB, by a single launch on one GPU
//! that reaches every buffer. Where peer access is not available the copy engines move
//! everything. `TENSORCOMM_CUDA_COPY=kernel` or `=ce` forces one method;
//! `TENSORCOMM_CUDA_CE_MIN`, `TENSORCOMM_CUDA_CE_STREAMS` and
//! `TENSORCOMM_CUDA_ONE_LAUNCH_MAX` move the thresholds (measurements in
//! `bench/results/NOTES.md`). `reduce_add` sums
//! with one kernel on the destination that reads the other GPUs' inputs
//! directly (16-byte loads).
//!
//! Over three or more GPUs, a broadcast (`broadcast`, `broadcast_out`, or
//! a `broadcast_coalesced` list in all) or a `reduce_add` of at least
//! `TENSORCOMM_CUDA_CHAIN_MIN` (8 MiB) moves along a pipelined chain of the
//! GPUs in chunks (`TENSORCOMM_CUDA_CHAIN_CHUNK`): copies hop from GPU to
//! GPU, and partial sums flow towards the destination, each GPU adding its
//! input, so every link carries the message about once. The chain's sum
//! order is `inputs[dest] + (next + (... + last))`.
//!
//! ```no_run
//! use tensorcomm::cuda::comm;
//! use tensorcomm::tensor::{Device, Tensor};
//!
//! let x = Tensor::from_vec((0..8).map(|i| i as f32).collect(), &[4, 2])?.to_device(Device::Cuda(0))?;
//! let copies = comm::broadcast(&x, &[0, 1])?;
//! assert!(copies[0].shares_storage(&x)); // the source device gets the input itself
//! let parts = comm::scatter(&x, &[0, 1], None, 0, None)?;
//! let back = comm::gather(&parts, 0, Device::Cpu)?;
//! assert_eq!(back.to_vec::<f32>()?, x.to_vec::<f32>()?);
//! let sum = comm::reduce_add(&copies, 0)?;
//! assert_eq!(sum.to_vec::<f32>()?[1], 2.0);
//! # Ok::<(), tensorcomm::Error>(())
//! ```

mod broadcast;
mod chain;
mod copy;
mod gather;
mod group;
mod reduce;
mod scatter;
mod sparse;

pub use broadcast::{
    broadcast, broadcast_coalesced, broadcast_coalesced_mixed, broadcast_out, DEFAULT_BUFFER_SIZE,
};
pub use gather::{gather, gather_out};
pub use group::take_tensors;
pub use reduce::{reduce_add, reduce_add_coalesced};
pub use scatter::{scatter, scatter_out, scatter_sizes};
pub use sparse::{reduce_add_mixed, reduce_add_sparse, CommTensor};

use crate::tensor::{Device, Tensor};
use crate::{Error, Result};

/// An [`Error::CommArgument`].
pub(crate) fn arg_error(
    op: &'static str,
    what: impl Into<String>,
    index: Option<usize>,
    expected: impl Into<String>,
    found: impl Into<String>,
) -> Error {
    Error::CommArgument {
        op,
        what: what.into(),
        index,
        expected: expected.into(),
        found: found.into(),
    }
}

/// Checks a device index list: non-negative entries (PyTorch's rule).
pub(crate) fn check_devices(op: &'static str, devices: &[i64]) -> Result<Vec<usize>> {
    devices
        .iter()
        .enumerate()
        .map(|(i, &d)| {
            usize::try_from(d).map_err(|_| {
                arg_error(
                    op,
                    "device",
                    Some(i),
                    "a non-negative device index",
                    d.to_string(),
                )
            })
        })
        .collect()
}

/// Checks that `t` is a CUDA tensor; gives its ordinal.
pub(crate) fn cuda_ordinal(
    op: &'static str,
    what: &str,
    index: usize,
    t: &Tensor<'_>,
) -> Result<usize> {
    match t.device() {
        Device::Cuda(d) => Ok(d),
        other => Err(arg_error(
            op,
            what,
            Some(index),
            "a CUDA tensor",
            format!("a tensor on {other}"),
        )),
    }
}
