//! `scatter`: `inputs[r]` of the root into `output` of rank `r`, directly
//! ([`scatter_direct`]) or through the shared-memory arena, straight from
//! and into the tensors ([`TensorBlocks`]). Only the root has inputs.

use super::tensor_blocks::TensorBlocks;
use super::Ctx;
#[cfg(target_os = "linux")]
use crate::cpu::algorithms::all_to_all_shm_arena;
use crate::cpu::algorithms::scatter_direct;
use crate::tensor::Tensor;
use crate::Result;

pub(super) fn run(
    ctx: &Ctx<'_>,
    output: &Tensor<'static>,
    inputs: &[Tensor<'static>],
    root: usize,
) -> Result<()> {
    let (t, deadline, size) = (ctx.t, ctx.deadline, ctx.t.world_size());
    // The root sends every rank its block, each rank receives one.
    let sends: Vec<_> = if t.rank() == root {
        inputs.iter().map(Some).collect()
    } else {
        vec![None; size]
    };
    let mut recvs = vec![None; size];
    recvs[root] = Some(output);
    let blocks = TensorBlocks::whole(&sends, &recvs)?;
    #[cfg(target_os = "linux")]
    if let Some(arena) = ctx
        .arena
        .filter(|_| ctx.select.gather_takes_arena(output.nbytes()))
    {
        all_to_all_shm_arena(t, &arena.shm, &blocks, output.nbytes(), deadline)?;
        return blocks.finish();
    }
    scatter_direct(t, &blocks, root, deadline)?;
    blocks.finish()
}
