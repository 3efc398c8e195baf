//! The CPU backend's glue for every collective beyond `all_reduce`,
//! `broadcast` and `barrier`, one file per collective: check the arguments
//! on this rank (nothing sent on an error, no sequence number taken), say
//! what the collective's fingerprint covers, and build the body the
//! group's thread runs: stage the tensors' elements into byte buffers
//! (`staging.rs`), run an algorithm of [`algorithms`](super::algorithms),
//! write the results back.
//!
//! Where the group has a shared-memory arena, `reduce` (in the backend)
//! and large `all_to_all`, `all_to_all_single`, `gather` and `scatter` go
//! through it instead; the last four then read and write the tensors a
//! piece at a time (`tensor_blocks.rs`) rather than staging them whole.
//!
//! Tensors travel as their elements in logical (row-major) order, so
//! inputs and outputs may have any dense layout, and outputs may alias
//! inputs: inputs are read when the collective runs, outputs written after
//! all data has arrived.
//!
//! Fingerprints cover the op, reduce op, dtype, root and sequence number
//! always, and the shapes wherever every rank must pass the same ones. For
//! uneven `all_to_all` (list form) and `all_to_all_single` with split
//! sizes, the per-rank sizes legitimately differ, so only the shape after
//! dim 0 (`all_to_all_single`) is covered; the pairs then agree on their
//! block sizes before data moves (see
//! [`all_to_all_pairwise`](super::algorithms::all_to_all_pairwise)).

pub(crate) mod all_gather;
pub(crate) mod all_gather_coalesced;
pub(crate) mod all_gather_into_tensor;
pub(crate) mod all_reduce_coalesced;
pub(crate) mod all_to_all;
pub(crate) mod all_to_all_single;
pub(crate) mod gather;
pub(crate) mod reduce;
pub(crate) mod reduce_scatter;
pub(crate) mod reduce_scatter_tensor;
pub(crate) mod scatter;
mod tensor_blocks;

/// The group's shared-memory arena, for the collectives that can move
/// their data through it (all ranks on one host, shared memory on).
#[cfg(target_os = "linux")]
pub(crate) type GroupArena = Option<std::sync::Arc<crate::cpu::transport::shm::ShmArena>>;
/// No arena off Linux.
#[cfg(not(target_os = "linux"))]
pub(crate) type GroupArena = Option<std::convert::Infallible>;
mod scratch;
mod staging;

use std::time::Instant;

use super::transport::Transport;
use crate::group::fingerprint::{reduce_code, shape_hash, CollectiveKind, Fingerprint};
use crate::group::ReduceOp;
use crate::tensor::DType;
use crate::Result;

/// What the group's thread runs for one collective.
pub(crate) type Body = Box<dyn FnOnce(&dyn Transport, Instant) -> Result<()> + Send>;

/// A validated collective, ready for a sequence number.
pub(crate) struct Planned {
    pub(crate) fingerprint: Fingerprint,
    pub(crate) body: Body,
}

/// The fingerprint of a collective over tensors of `shapes` (hashed
/// together, in order) holding `numel` elements in all.
pub(crate) fn fingerprint(
    kind: CollectiveKind,
    op: Option<ReduceOp>,
    dtype: DType,
    root: usize,
    numel: usize,
    shapes: &[&[usize]],
) -> Fingerprint {
    let mut flat = Vec::new();
    for shape in shapes {
        flat.extend_from_slice(shape);
        flat.push(usize::MAX);
    }
    Fingerprint {
        kind,
        reduce_op: reduce_code(op),
        dtype: Some(dtype),
        root: root as u32,
        seq: 0,
        numel: numel as u64,
        shape_hash: shape_hash(&flat, &[]),
    }
}
