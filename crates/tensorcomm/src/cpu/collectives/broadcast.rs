//! `broadcast`: the root's tensor into every rank's, through the group's
//! shared-memory arena for large messages, else down a binomial tree
//! ([`broadcast_tree`]).

use super::Ctx;
#[cfg(target_os = "linux")]
use crate::cpu::algorithms::broadcast_shm_arena;
use crate::cpu::algorithms::broadcast_tree;
use crate::tensor::Tensor;
use crate::Result;

pub(super) fn run(ctx: &Ctx<'_>, tensor: &Tensor<'static>, root: usize) -> Result<()> {
    let (t, deadline) = (ctx.t, ctx.deadline);
    #[cfg(target_os = "linux")]
    let arena = ctx
        .arena
        .filter(|_| ctx.select.broadcast_takes_arena(tensor.nbytes()));
    tensor.with_bytes_mut(|bytes| {
        #[cfg(target_os = "linux")]
        if let Some(arena) = arena {
            return broadcast_shm_arena(t, &arena.shm, bytes, root, deadline);
        }
        broadcast_tree(t, bytes, root, deadline)
    })?
}
