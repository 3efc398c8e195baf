//! `all_reduce_coalesced`: several tensors of one dtype all-reduced as one
//! buffer (one collective's latency instead of one per tensor), with the
//! all-reduce algorithm chosen for the total size.

use super::staging::{read_all, write_all};
use super::Ctx;
use crate::group::ReduceOp;
use crate::tensor::Tensor;
use crate::Result;

pub(super) fn run(ctx: &Ctx<'_>, tensors: &[Tensor<'static>], op: ReduceOp) -> Result<()> {
    let dtype = tensors[0].dtype();
    let mut buf = read_all(tensors)?;
    ctx.select
        .all_reduce(ctx.t, &mut buf, dtype, op, ctx.deadline)?;
    write_all(tensors, &buf)
}
