//! `reduce_scatter_tensor`: one `input` of `world` times the output's size
//! (concatenated or stacked along dim 0) reduced with a [`ReduceOp`],
//! block `r` of the result into `output` of rank `r`, over the ring
//! ([`reduce_scatter_ring`]); and its coalesced form (FSDP's), one such
//! reduce-scatter per pair of tensors in one collective.

use super::staging::{read_copy, write_from};
use super::Ctx;
use crate::cpu::algorithms::reduce_scatter_ring;
use crate::group::ReduceOp;
use crate::tensor::Tensor;
use crate::Result;

pub(super) fn run(
    ctx: &Ctx<'_>,
    output: &Tensor<'static>,
    input: &Tensor<'static>,
    op: ReduceOp,
) -> Result<()> {
    let t = ctx.t;
    let mut buf = read_copy(input)?;
    reduce_scatter_ring(t, &mut buf, output.dtype(), op, ctx.deadline)?;
    let n = output.nbytes();
    write_from(output, &buf[t.rank() * n..(t.rank() + 1) * n])
}

/// `outputs[i]` gets this rank's block of every rank's `inputs[i]`
/// reduced, one pair after another.
pub(super) fn run_coalesced(
    ctx: &Ctx<'_>,
    outputs: &[Tensor<'static>],
    inputs: &[Tensor<'static>],
    op: ReduceOp,
) -> Result<()> {
    for (output, input) in outputs.iter().zip(inputs) {
        run(ctx, output, input, op)?;
    }
    Ok(())
}
