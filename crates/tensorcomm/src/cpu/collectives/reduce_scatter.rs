//! `reduce_scatter`: `inputs[r]` of every rank combined with a
//! [`ReduceOp`] into `output` of rank `r`, over the ring
//! ([`reduce_scatter_ring`]).

use super::staging::{read_all, write_from};
use super::Ctx;
use crate::cpu::algorithms::reduce_scatter_ring;
use crate::group::ReduceOp;
use crate::tensor::Tensor;
use crate::Result;

pub(super) fn run(
    ctx: &Ctx<'_>,
    output: &Tensor<'static>,
    inputs: &[Tensor<'static>],
    op: ReduceOp,
) -> Result<()> {
    let t = ctx.t;
    let mut buf = read_all(inputs)?;
    reduce_scatter_ring(t, &mut buf, output.dtype(), op, ctx.deadline)?;
    let n = output.nbytes();
    write_from(output, &buf[t.rank() * n..(t.rank() + 1) * n])
}
