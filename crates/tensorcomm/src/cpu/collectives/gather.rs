//! `gather`: every rank's `input` into `outputs[r]` of the root, directly
//! ([`gather_direct`]) or through the shared-memory arena, straight from
//! and into the tensors ([`TensorBlocks`]). Only the root has outputs.

use super::tensor_blocks::TensorBlocks;
use super::Ctx;
#[cfg(target_os = "linux")]
use crate::cpu::algorithms::all_to_all_shm_arena;
use crate::cpu::algorithms::gather_direct;
use crate::tensor::Tensor;
use crate::Result;

pub(super) fn run(
    ctx: &Ctx<'_>,
    input: &Tensor<'static>,
    outputs: &[Tensor<'static>],
    root: usize,
) -> Result<()> {
    let (t, deadline, size) = (ctx.t, ctx.deadline, ctx.t.world_size());
    // Every rank sends its input to the root, which receives them all,
    // each into its output.
    let mut sends = vec![None; size];
    sends[root] = Some(input);
    let recvs: Vec<_> = if t.rank() == root {
        outputs.iter().map(Some).collect()
    } else {
        vec![None; size]
    };
    let blocks = TensorBlocks::whole(&sends, &recvs)?;
    #[cfg(target_os = "linux")]
    if let Some(arena) = ctx
        .arena
        .filter(|_| ctx.select.gather_takes_arena(input.nbytes()))
    {
        all_to_all_shm_arena(t, &arena.shm, &blocks, input.nbytes(), deadline)?;
        return blocks.finish();
    }
    gather_direct(t, &blocks, root, deadline)?;
    blocks.finish()
}
