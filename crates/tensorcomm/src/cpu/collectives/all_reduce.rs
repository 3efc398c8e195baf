//! `all_reduce`: every rank's tensor combined with a [`ReduceOp`], the
//! result in every rank's tensor. Through the group's shared-memory arena
//! above its threshold (straight out of the other ranks' copies when the
//! tensor is in symmetric memory), else over the transport with the
//! algorithm [`Selection`](super::Selection) picks for the size.

use super::Ctx;
#[cfg(target_os = "linux")]
use crate::cpu::algorithms::{
    all_reduce_shm_arena, all_reduce_shm_symmetric, ArenaThreads, SymmetricBytes,
};
use crate::group::ReduceOp;
use crate::tensor::Tensor;
use crate::Result;

pub(super) fn run(ctx: &Ctx<'_>, tensor: &Tensor<'static>, op: ReduceOp) -> Result<()> {
    let (t, deadline, dtype) = (ctx.t, ctx.deadline, tensor.dtype());
    #[cfg(target_os = "linux")]
    let arena = ctx
        .arena
        .filter(|_| ctx.select.all_reduce_takes_arena(tensor.nbytes()));
    tensor.with_bytes_mut(|bytes| {
        #[cfg(target_os = "linux")]
        if let Some(arena) = arena {
            let symmetric = arena.symmetric.find(bytes);
            // A whole message is its own only part.
            let count = ctx.select.arena_threads_for_part(
                bytes.len(),
                ctx.part_of.unwrap_or(bytes.len()),
                arena.cores,
                symmetric.is_some(),
            );
            let threads = ArenaThreads {
                helpers: &arena.helpers,
                count,
            };
            if let Some((memory, _)) = symmetric {
                let tensor = SymmetricBytes {
                    memory: &memory,
                    bytes,
                };
                return all_reduce_shm_symmetric(
                    t, &arena.shm, tensor, threads, dtype, op, deadline,
                );
            }
            return all_reduce_shm_arena(t, &arena.shm, threads, bytes, dtype, op, deadline);
        }
        ctx.select.all_reduce(t, bytes, dtype, op, deadline)
    })?
}
