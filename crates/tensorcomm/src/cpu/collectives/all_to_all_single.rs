//! `all_to_all_single`: rows of `input` (dim 0) split per peer and
//! exchanged into rows of `output`, pairwise ([`all_to_all_pairwise`]) or
//! through the shared-memory arena, straight from and into the tensors
//! ([`TensorBlocks`]).
//! With no split sizes, dim 0 is split equally; otherwise
//! `input_split_sizes[p]` rows go to rank `p` and `output_split_sizes[p]`
//! rows come from it (uneven). Both tensors have the same shape after dim
//! 0. The fingerprint covers dtype, that trailing shape and whether the
//! splits are uneven; equal splits also cover the element count, while
//! uneven ones have each pair agree on its block sizes before data moves.

#[cfg(target_os = "linux")]
use super::all_to_all::longest_block;
use super::all_to_all::offsets;
use super::tensor_blocks::TensorBlocks;
use super::{fingerprint, GroupArena, Planned};
use crate::cpu::algorithms::all_to_all_pairwise;
#[cfg(target_os = "linux")]
use crate::cpu::algorithms::{
    agree_block_sizes, all_to_all_shm_arena, SHM_ARENA_ALL_TO_ALL_MIN_BLOCK_BYTES,
};
use crate::group::fingerprint::CollectiveKind;
use crate::group::validate::{check_dense_host, check_dtype_of, split_rows};
use crate::tensor::Tensor;
use crate::{Error, Result};

pub(crate) fn plan(
    rank: usize,
    size: usize,
    output: &Tensor<'static>,
    input: &Tensor<'static>,
    output_split_sizes: &[usize],
    input_split_sizes: &[usize],
    arena: GroupArena,
) -> Result<Planned> {
    const OP: &str = "all_to_all_single";
    check_dense_host(OP, input)?;
    check_dtype_of(OP, "output", output, input.dtype())?;
    let (Some((&in_rows, row_shape)), Some((&out_rows, out_row_shape))) =
        (input.shape().split_first(), output.shape().split_first())
    else {
        return Err(Error::InvalidCollective {
            op: OP.into(),
            reason: format!(
                "expected input and output with at least one dimension, found shapes {:?} and {:?}",
                input.shape(),
                output.shape()
            ),
        });
    };
    if row_shape != out_row_shape {
        return Err(Error::ShapeMismatch {
            context: format!("{OP}: the output's shape after dim 0 must be the input's"),
            expected: row_shape.to_vec(),
            found: out_row_shape.to_vec(),
        });
    }
    let send_rows = split_rows(OP, "input", input_split_sizes, in_rows, size)?;
    let recv_rows = split_rows(OP, "output", output_split_sizes, out_rows, size)?;
    if send_rows[rank] != recv_rows[rank] {
        return Err(Error::InvalidCollective {
            op: OP.into(),
            reason: format!(
                "expected this rank ({rank}) to receive from itself the {} rows it sends itself, found {}",
                send_rows[rank], recv_rows[rank]
            ),
        });
    }
    let uneven = !(input_split_sizes.is_empty() && output_split_sizes.is_empty());
    let numel = if uneven { 0 } else { input.numel() };
    let fp = fingerprint(
        CollectiveKind::AllToAllSingle,
        None,
        input.dtype(),
        usize::from(uneven),
        numel,
        &[row_shape],
    );
    let row_bytes = row_shape.iter().product::<usize>() * input.dtype().size();
    let send_offsets = offsets(send_rows.iter().map(|r| r * row_bytes));
    let recv_offsets = offsets(recv_rows.iter().map(|r| r * row_bytes));
    let (output, input) = (output.clone(), input.clone());
    Ok(Planned {
        fingerprint: fp,
        body: Box::new(move |t, deadline| {
            let blocks = TensorBlocks::single(&input, &send_offsets, &output, &recv_offsets)?;
            let mut check_sizes = uneven;
            #[cfg(target_os = "linux")]
            if let Some(arena) = &arena {
                let lens = |o: &[usize]| o.windows(2).map(|w| w[1] - w[0]).collect::<Vec<_>>();
                let (send_lens, recv_lens) = (lens(&send_offsets), lens(&recv_offsets));
                // Even splits: every rank's blocks are the same known size.
                let longest = if uneven {
                    agree_block_sizes(t, &send_lens, &recv_lens, deadline)?;
                    longest_block(t, &send_lens, deadline)?
                } else {
                    send_lens.first().copied().unwrap_or(0)
                };
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
