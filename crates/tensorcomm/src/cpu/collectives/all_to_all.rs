//! `all_to_all` (list form): `inputs[p]` of this rank into `outputs[r]` of
//! rank `p`, where `r` is this rank, pairwise ([`all_to_all_pairwise`]) or
//! through the shared-memory arena, straight from and into the tensors
//! ([`TensorBlocks`]). Tensors may differ in size per peer (uneven
//! all-to-all), so each pair agrees on its block sizes before data moves.

use super::tensor_blocks::TensorBlocks;
use super::Ctx;
use crate::cpu::algorithms::all_to_all_pairwise;
#[cfg(target_os = "linux")]
use crate::cpu::algorithms::{agree_block_sizes, all_to_all_shm_arena};
#[cfg(target_os = "linux")]
use crate::group::ReduceOp;
#[cfg(target_os = "linux")]
use crate::tensor::DType;
use crate::tensor::Tensor;
use crate::Result;

pub(super) fn run(
    ctx: &Ctx<'_>,
    outputs: &[Tensor<'static>],
    inputs: &[Tensor<'static>],
) -> Result<()> {
    let (t, deadline) = (ctx.t, ctx.deadline);
    let blocks = TensorBlocks::lists(inputs, outputs)?;
    let mut check_sizes = true;
    #[cfg(target_os = "linux")]
    if let Some(arena) = ctx.arena {
        let send_lens: Vec<usize> = inputs.iter().map(Tensor::nbytes).collect();
        let recv_lens: Vec<usize> = outputs.iter().map(Tensor::nbytes).collect();
        agree_block_sizes(t, &send_lens, &recv_lens, deadline)?;
        let longest = longest_block(ctx, &send_lens)?;
        if ctx.select.all_to_all_takes_arena(longest) {
            all_to_all_shm_arena(t, &arena.shm, &blocks, longest, deadline)?;
            return blocks.finish();
        }
        check_sizes = false;
    }
    all_to_all_pairwise(t, &blocks, check_sizes, deadline)?;
    blocks.finish()
}

/// The longest block any rank of `t` sends another, given this rank's
/// block lengths (`send_lens[p]` for rank `p`): a small all-reduce.
#[cfg(target_os = "linux")]
pub(super) fn longest_block(ctx: &Ctx<'_>, send_lens: &[usize]) -> Result<usize> {
    let t = ctx.t;
    let mine = (0..t.world_size())
        .filter(|&p| p != t.rank())
        .map(|p| send_lens[p])
        .max()
        .unwrap_or(0);
    let mut word = (mine as i64).to_ne_bytes();
    ctx.select
        .all_reduce(t, &mut word, DType::I64, ReduceOp::Max, ctx.deadline)?;
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
