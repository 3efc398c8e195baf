//! `all_to_all` (list form): `inputs[p]` of this rank into `outputs[r]` of
//! rank `p`, where `r` is this rank, pairwise ([`all_to_all_pairwise`]) or
//! through the shared-memory arena, straight from and into the tensors
//! ([`TensorBlocks`]).
//! Tensors may differ in size per peer (uneven all-to-all), so the
//! fingerprint covers only the dtype, and each pair agrees on its block
//! sizes before data moves.

#[cfg(target_os = "linux")]
use std::time::Instant;

use super::tensor_blocks::TensorBlocks;
use super::{fingerprint, GroupArena, Planned};
use crate::cpu::algorithms::all_to_all_pairwise;
#[cfg(target_os = "linux")]
use crate::cpu::algorithms::{
    self, agree_block_sizes, all_to_all_shm_arena, SHM_ARENA_ALL_TO_ALL_MIN_BLOCK_BYTES,
};
#[cfg(target_os = "linux")]
use crate::cpu::transport::Transport;
use crate::group::fingerprint::CollectiveKind;
use crate::group::validate::{check_dtype_of, check_per_rank};
#[cfg(target_os = "linux")]
use crate::group::ReduceOp;
#[cfg(target_os = "linux")]
use crate::tensor::DType;
use crate::tensor::Tensor;
use crate::{Error, Result};

/// `arena`: the group's, through which blocks from
/// [`SHM_ARENA_ALL_TO_ALL_MIN_BLOCK_BYTES`] travel (once the pairs have
/// agreed on their sizes and the ranks on the longest block).
pub(crate) fn plan(
    rank: usize,
    size: usize,
    outputs: &[Tensor<'static>],
    inputs: &[Tensor<'static>],
    arena: GroupArena,
) -> Result<Planned> {
    const OP: &str = "all_to_all";
    check_per_rank(OP, "input_tensors", inputs.len(), size)?;
    check_per_rank(OP, "output_tensors", outputs.len(), size)?;
    let dtype = inputs[0].dtype();
    for (i, input) in inputs.iter().enumerate() {
        check_dtype_of(OP, &format!("input_tensors[{i}]"), input, dtype)?;
    }
    for (i, out) in outputs.iter().enumerate() {
        check_dtype_of(OP, &format!("output_tensors[{i}]"), out, dtype)?;
    }
    if outputs[rank].numel() != inputs[rank].numel() {
        return Err(Error::ShapeMismatch {
            context: format!(
                "{OP}: output_tensors[{rank}] receives input_tensors[{rank}] from this rank itself and must have as many elements"
            ),
            expected: inputs[rank].shape().to_vec(),
            found: outputs[rank].shape().to_vec(),
        });
    }
    let fp = fingerprint(CollectiveKind::AllToAll, None, dtype, 0, 0, &[]);
    let (outputs, inputs) = (outputs.to_vec(), inputs.to_vec());
    Ok(Planned {
        fingerprint: fp,
        body: Box::new(move |t, deadline| {
            let blocks = TensorBlocks::lists(&inputs, &outputs)?;
            let mut check_sizes = true;
            #[cfg(target_os = "linux")]
            if let Some(arena) = &arena {
                let send_lens: Vec<usize> = inputs.iter().map(Tensor::nbytes).collect();
                let recv_lens: Vec<usize> = outputs.iter().map(Tensor::nbytes).collect();
                agree_block_sizes(t, &send_lens, &recv_lens, deadline)?;
                let longest = longest_block(t, &send_lens, deadline)?;
                if longest >= SHM_ARENA_ALL_TO_ALL_MIN_BLOCK_BYTES {
                    all_to_all_shm_arena(t, arena, &blocks, longest, deadline)?;
                    return blocks.finish();
                }
                check_sizes = false;
            }
            all_to_all_pairwise(t, &blocks, check_sizes, deadline)?;
            blocks.finish()
        }),
    })
}

/// The longest block any rank of `t` sends another, given this rank's
/// block lengths (`send_lens[p]` for rank `p`): a small all-reduce.
#[cfg(target_os = "linux")]
pub(super) fn longest_block(
    t: &dyn Transport,
    send_lens: &[usize],
    deadline: Instant,
) -> Result<usize> {
    let mine = (0..t.world_size())
        .filter(|&p| p != t.rank())
        .map(|p| send_lens[p])
        .max()
        .unwrap_or(0);
    let mut word = (mine as i64).to_ne_bytes();
    algorithms::all_reduce(t, &mut word, DType::I64, ReduceOp::Max, deadline)?;
    Ok(i64::from_ne_bytes(word).max(0) as usize)
}

/// Running sums of `lens`, starting at 0.
pub(super) fn offsets(lens: impl Iterator<Item = usize>) -> Vec<usize> {
    let mut out = vec![0];
    let mut at = 0;
    for len in lens {
        at += len;
        out.push(at);
    }
    out
}
