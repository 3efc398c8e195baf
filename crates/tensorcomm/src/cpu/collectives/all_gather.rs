//! `all_gather`: every rank's `input` into `outputs[r]` of every rank,
//! over the ring ([`all_gather_ring`]).

use std::time::Instant;

use super::scratch;
use super::staging::{read_into, write_from};
use super::Ctx;
use crate::cpu::algorithms::all_gather_ring;
use crate::cpu::transport::Transport;
use crate::tensor::Tensor;
use crate::Result;

pub(super) fn run(
    ctx: &Ctx<'_>,
    outputs: &[Tensor<'static>],
    input: &Tensor<'static>,
) -> Result<()> {
    let n = input.nbytes();
    let buf = gather_bytes(ctx.t, input, ctx.deadline)?;
    for (out, block) in outputs.iter().zip(buf.chunks_exact(n.max(1))) {
        write_from(out, block)?;
    }
    Ok(())
}

/// Every rank's `input` bytes, in rank order: this rank's staged into its
/// block of one buffer, the rest filled by the ring.
pub(super) fn gather_bytes(
    t: &dyn Transport,
    input: &Tensor<'static>,
    deadline: Instant,
) -> Result<scratch::Scratch> {
    let (n, size) = (input.nbytes(), t.world_size());
    let mut buf = scratch::zeroed(n * size);
    read_into(input, &mut buf[t.rank() * n..(t.rank() + 1) * n])?;
    all_gather_ring(t, &mut buf, deadline)?;
    Ok(buf)
}
