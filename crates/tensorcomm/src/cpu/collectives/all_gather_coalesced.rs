//! `all_gather_coalesced`: several inputs gathered at once,
//! `outputs[r][i]` receiving rank `r`'s `inputs[i]`. The inputs are packed
//! into one block per rank and gathered in one ring pass
//! ([`all_gather_ring`]).

use super::scratch;
use super::staging::{read_all, write_all};
use super::Ctx;
use crate::cpu::algorithms::all_gather_ring;
use crate::tensor::Tensor;
use crate::Result;

pub(super) fn run(
    ctx: &Ctx<'_>,
    outputs: &[Vec<Tensor<'static>>],
    inputs: &[Tensor<'static>],
) -> Result<()> {
    let t = ctx.t;
    let own = read_all(inputs)?;
    let n = own.len();
    let mut buf = scratch::zeroed(n * t.world_size());
    buf[t.rank() * n..(t.rank() + 1) * n].copy_from_slice(&own);
    all_gather_ring(t, &mut buf, ctx.deadline)?;
    for (r, list) in outputs.iter().enumerate() {
        write_all(list, &buf[r * n..(r + 1) * n])?;
    }
    Ok(())
}
