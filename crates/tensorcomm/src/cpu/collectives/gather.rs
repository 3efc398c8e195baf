//! `gather`: every rank's `input` into `outputs[r]` of the root, directly
//! ([`gather_direct`]) or through the shared-memory arena, straight from
//! and into the tensors ([`TensorBlocks`]). Only the root passes outputs.
//! Every rank's input has the same dtype and shape, so the fingerprint
//! covers both and the root.

use super::tensor_blocks::TensorBlocks;
use super::{fingerprint, GroupArena, Planned};
use crate::cpu::algorithms::gather_direct;
#[cfg(target_os = "linux")]
use crate::cpu::algorithms::{all_to_all_shm_arena, SHM_ARENA_BROADCAST_MIN_BYTES};
use crate::group::fingerprint::CollectiveKind;
use crate::group::validate::{check_dense_host, check_like, check_per_rank, check_root};
use crate::tensor::Tensor;
use crate::{Error, Result};

pub(crate) fn plan(
    rank: usize,
    size: usize,
    input: &Tensor<'static>,
    outputs: Option<&[Tensor<'static>]>,
    root: usize,
    arena: GroupArena,
) -> Result<Planned> {
    const OP: &str = "gather";
    check_dense_host(OP, input)?;
    check_root(OP, root, size)?;
    let outputs = root_list(OP, "gather_list", rank, size, root, outputs)?;
    for (i, out) in outputs.iter().enumerate() {
        check_like(OP, &format!("gather_list[{i}]"), out, input)?;
    }
    let fp = fingerprint(
        CollectiveKind::Gather,
        None,
        input.dtype(),
        root,
        input.numel(),
        &[input.shape()],
    );
    let input = input.clone();
    Ok(Planned {
        fingerprint: fp,
        body: Box::new(move |t, deadline| {
            // Every rank sends its input to the root, which receives them
            // all, each into its output.
            let mut sends = vec![None; size];
            sends[root] = Some(&input);
            let recvs: Vec<_> = if t.rank() == root {
                outputs.iter().map(Some).collect()
            } else {
                vec![None; size]
            };
            let blocks = TensorBlocks::whole(&sends, &recvs)?;
            // Through the arena from the broadcast's size per block.
            #[cfg(target_os = "linux")]
            if let Some(arena) = arena.filter(|_| input.nbytes() >= SHM_ARENA_BROADCAST_MIN_BYTES) {
                all_to_all_shm_arena(t, &arena, &blocks, input.nbytes(), deadline)?;
                return blocks.finish();
            }
            gather_direct(t, &blocks, root, deadline)?;
            blocks.finish()
        }),
    })
}

/// The root's per-rank list (`size` tensors); nothing (or an empty list)
/// elsewhere.
pub(super) fn root_list(
    op: &str,
    what: &str,
    rank: usize,
    size: usize,
    root: usize,
    list: Option<&[Tensor<'static>]>,
) -> Result<Vec<Tensor<'static>>> {
    match list {
        Some(list) if rank == root => {
            check_per_rank(op, what, list.len(), size)?;
            Ok(list.to_vec())
        }
        None if rank == root => Err(Error::InvalidCollective {
            op: op.into(),
            reason: format!("expected {what} with {size} tensors on the root (rank {root}), found none"),
        }),
        Some(list) if !list.is_empty() => Err(Error::InvalidCollective {
            op: op.into(),
            reason: format!(
                "expected no {what} on rank {rank}, which is not the root (rank {root}), found {} tensors",
                list.len()
            ),
        }),
        _ => Ok(Vec::new()),
    }
}
