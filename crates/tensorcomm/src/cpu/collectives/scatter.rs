//! `scatter`: `inputs[r]` of the root into `output` of rank `r`, directly
//! ([`scatter_direct`]) or through the shared-memory arena, straight from
//! and into the tensors ([`TensorBlocks`]). Only the root passes inputs.
//! Every rank's output has the same dtype and shape, so the fingerprint
//! covers both and the root.

use super::gather::root_list;
use super::tensor_blocks::TensorBlocks;
use super::{fingerprint, GroupArena, Planned};
use crate::cpu::algorithms::scatter_direct;
#[cfg(target_os = "linux")]
use crate::cpu::algorithms::{all_to_all_shm_arena, SHM_ARENA_BROADCAST_MIN_BYTES};
use crate::group::fingerprint::CollectiveKind;
use crate::group::validate::{check_dense_host, check_like, check_root};
use crate::tensor::Tensor;
use crate::Result;

pub(crate) fn plan(
    rank: usize,
    size: usize,
    output: &Tensor<'static>,
    inputs: Option<&[Tensor<'static>]>,
    root: usize,
    arena: GroupArena,
) -> Result<Planned> {
    const OP: &str = "scatter";
    check_dense_host(OP, output)?;
    check_root(OP, root, size)?;
    let inputs = root_list(OP, "scatter_list", rank, size, root, inputs)?;
    for (i, input) in inputs.iter().enumerate() {
        check_like(OP, &format!("scatter_list[{i}]"), input, output)?;
    }
    let fp = fingerprint(
        CollectiveKind::Scatter,
        None,
        output.dtype(),
        root,
        output.numel(),
        &[output.shape()],
    );
    let output = output.clone();
    Ok(Planned {
        fingerprint: fp,
        body: Box::new(move |t, deadline| {
            // The root sends every rank its block, each rank receives one.
            let sends: Vec<_> = if t.rank() == root {
                inputs.iter().map(Some).collect()
            } else {
                vec![None; size]
            };
            let mut recvs = vec![None; size];
            recvs[root] = Some(&output);
            let blocks = TensorBlocks::whole(&sends, &recvs)?;
            // Through the arena from the broadcast's size per block.
            #[cfg(target_os = "linux")]
            if let Some(arena) = arena.filter(|_| output.nbytes() >= SHM_ARENA_BROADCAST_MIN_BYTES)
            {
                all_to_all_shm_arena(t, &arena, &blocks, output.nbytes(), deadline)?;
                return blocks.finish();
            }
            scatter_direct(t, &blocks, root, deadline)?;
            blocks.finish()
        }),
    })
}
