//! The CPU backend's collectives, one file per collective, each a `run`
//! over a [`Ctx`]: stage the tensors' elements into byte buffers
//! (`staging.rs`) or read and write them a piece at a time
//! (`tensor_blocks.rs`), run the algorithm [`Selection`] chooses (from
//! [`algorithms`](super::algorithms), through the group's shared-memory
//! arena where it has one and the size calls for it), write the results
//! back. Arguments arrive validated by `group/` ([`Collective`]).
//!
//! Tensors travel as their elements in logical (row-major) order, so
//! inputs and outputs may have any dense layout, and outputs may alias
//! inputs: inputs are read when the collective runs, outputs written after
//! all data has arrived.

mod all_gather;
mod all_gather_coalesced;
mod all_gather_into_tensor;
mod all_reduce;
mod all_reduce_coalesced;
mod all_reduce_sparse;
mod all_to_all;
mod all_to_all_single;
mod barrier;
mod broadcast;
mod gather;
mod reduce;
mod reduce_scatter;
mod reduce_scatter_tensor;
mod scatter;
mod scratch;
mod staging;
mod tensor_blocks;

use std::time::Instant;

#[cfg(target_os = "linux")]
use super::group_arena::GroupArena;
use super::select::Selection;
use super::transport::Transport;
use crate::group::collective::Collective;
use crate::Result;

/// No arena off Linux.
#[cfg(not(target_os = "linux"))]
pub(crate) enum GroupArena {}

/// What a collective runs with: the transport (fingerprints checked), its
/// deadline, the group's choices and its arena, if it has one.
pub(crate) struct Ctx<'a> {
    pub(crate) t: &'a dyn Transport,
    pub(crate) deadline: Instant,
    pub(crate) select: &'a Selection,
    pub(crate) arena: Option<&'a GroupArena>,
    /// For one chunk of a larger all_reduce (a pipelined staged call),
    /// the whole message's bytes: the arena takes as many threads as it
    /// would for the whole, so the chunks are reduced as fast. The same on
    /// every rank, as the arena needs.
    pub(crate) part_of: Option<usize>,
}

/// Runs `collective` (every kind but the monitored barrier, which the
/// backend runs over its point-to-point links).
pub(crate) fn run(ctx: &Ctx<'_>, collective: &Collective) -> Result<()> {
    match collective {
        Collective::AllReduce { tensor, op } => all_reduce::run(ctx, tensor, *op),
        Collective::AllReduceCoalesced { tensors, op } => {
            all_reduce_coalesced::run(ctx, tensors, *op)
        }
        Collective::AllReduceSparse { tensor, result } => {
            all_reduce_sparse::run(ctx, tensor, result)
        }
        Collective::Broadcast { tensor, root } => broadcast::run(ctx, tensor, *root),
        Collective::Reduce { tensor, root, op } => reduce::run(ctx, tensor, *root, *op),
        Collective::AllGather { outputs, input } => all_gather::run(ctx, outputs, input),
        Collective::AllGatherIntoTensor { output, input } => {
            all_gather_into_tensor::run(ctx, output, input)
        }
        Collective::AllGatherCoalesced { outputs, inputs } => {
            all_gather_coalesced::run(ctx, outputs, inputs)
        }
        Collective::AllGatherIntoTensorCoalesced { outputs, inputs } => {
            all_gather_into_tensor::run_coalesced(ctx, outputs, inputs)
        }
        Collective::Gather {
            input,
            outputs,
            root,
        } => gather::run(ctx, input, outputs, *root),
        Collective::Scatter {
            output,
            inputs,
            root,
        } => scatter::run(ctx, output, inputs, *root),
        Collective::ReduceScatter { output, inputs, op } => {
            reduce_scatter::run(ctx, output, inputs, *op)
        }
        Collective::ReduceScatterTensor { output, input, op } => {
            reduce_scatter_tensor::run(ctx, output, input, *op)
        }
        Collective::ReduceScatterTensorCoalesced {
            outputs,
            inputs,
            op,
        } => reduce_scatter_tensor::run_coalesced(ctx, outputs, inputs, *op),
        Collective::AllToAll { outputs, inputs } => all_to_all::run(ctx, outputs, inputs),
        Collective::AllToAllSingle {
            output,
            input,
            send_rows,
            recv_rows,
            uneven,
        } => all_to_all_single::run(ctx, output, input, send_rows, recv_rows, *uneven),
        Collective::Barrier => barrier::run(ctx),
        Collective::MonitoredBarrier { .. } => Err(crate::Error::InvalidCollective {
            op: "monitored_barrier".into(),
            reason: "expected the backend to run it over its point-to-point links".into(),
        }),
    }
}
