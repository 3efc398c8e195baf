//! `all_to_all_single`: rows of `input` (dim 0) split per peer and
//! exchanged into rows of `output`, pairwise ([`all_to_all_pairwise`]) or
//! through the shared-memory arena, straight from and into the tensors
//! ([`TensorBlocks`]). `send_rows[p]` rows go to rank `p` and
//! `recv_rows[p]` rows come from it; with uneven splits each pair agrees
//! on its block sizes before data moves.

#[cfg(target_os = "linux")]
use super::all_to_all::longest_block;
use super::all_to_all::offsets;
use super::tensor_blocks::TensorBlocks;
use super::Ctx;
use crate::cpu::algorithms::all_to_all_pairwise;
#[cfg(target_os = "linux")]
use crate::cpu::algorithms::{agree_block_sizes, all_to_all_shm_arena};
use crate::tensor::Tensor;
use crate::Result;

pub(super) fn run(
    ctx: &Ctx<'_>,
    output: &Tensor<'static>,
    input: &Tensor<'static>,
    send_rows: &[usize],
    recv_rows: &[usize],
    uneven: bool,
) -> Result<()> {
    let (t, deadline) = (ctx.t, ctx.deadline);
    let row_shape = &input.shape()[1..];
    let row_bytes = row_shape.iter().product::<usize>() * input.dtype().size();
    let send_offsets = offsets(send_rows.iter().map(|r| r * row_bytes));
    let recv_offsets = offsets(recv_rows.iter().map(|r| r * row_bytes));
    let blocks = TensorBlocks::single(input, &send_offsets, output, &recv_offsets)?;
    let mut check_sizes = uneven;
    #[cfg(target_os = "linux")]
    if let Some(arena) = ctx.arena {
        let lens = |o: &[usize]| o.windows(2).map(|w| w[1] - w[0]).collect::<Vec<_>>();
        let (send_lens, recv_lens) = (lens(&send_offsets), lens(&recv_offsets));
        // Even splits: every rank's blocks are the same known size.
        let longest = if uneven {
            agree_block_sizes(t, &send_lens, &recv_lens, deadline)?;
            longest_block(ctx, &send_lens)?
        } else {
            send_lens.first().copied().unwrap_or(0)
        };
        if ctx.select.all_to_all_takes_arena(longest) {
            all_to_all_shm_arena(t, &arena.shm, &blocks, longest, deadline)?;
            return blocks.finish();
        }
        check_sizes = false;
    }
    all_to_all_pairwise(t, &blocks, check_sizes, deadline)?;
    blocks.finish()
}
