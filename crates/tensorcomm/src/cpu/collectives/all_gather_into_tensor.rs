//! `all_gather_into_tensor`: every rank's `input` concatenated (or
//! stacked) along dim 0 into one `output` of `world` times its size, over
//! the ring ([`all_gather_ring`](crate::cpu::algorithms::all_gather_ring));
//! and its coalesced form (FSDP's), one such gather per pair of tensors in
//! one collective.

use super::all_gather::gather_bytes;
use super::staging::write_from;
use super::Ctx;
use crate::tensor::Tensor;
use crate::Result;

pub(super) fn run(ctx: &Ctx<'_>, output: &Tensor<'static>, input: &Tensor<'static>) -> Result<()> {
    let buf = gather_bytes(ctx.t, input, ctx.deadline)?;
    write_from(output, &buf)
}

/// `outputs[i]` gathers every rank's `inputs[i]`, one pair after another.
pub(super) fn run_coalesced(
    ctx: &Ctx<'_>,
    outputs: &[Tensor<'static>],
    inputs: &[Tensor<'static>],
) -> Result<()> {
    for (output, input) in outputs.iter().zip(inputs) {
        run(ctx, output, input)?;
    }
    Ok(())
}
