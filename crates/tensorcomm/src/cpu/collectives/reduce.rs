//! `reduce`: every rank's tensor combined with a [`ReduceOp`] into the
//! root's tensor. Through the group's shared-memory arena from its
//! threshold (the all-reduce's steps with only the root copying out), else
//! over the transport ([`Selection::reduce`](super::Selection::reduce): a
//! binomial tree, or ring and gather for large messages). Other ranks'
//! tensors are left unchanged.

use super::staging::{read_copy, write_from};
use super::Ctx;
#[cfg(target_os = "linux")]
use crate::cpu::algorithms::{reduce_to_root_shm_arena, ArenaThreads};
use crate::group::ReduceOp;
use crate::tensor::Tensor;
use crate::Result;

pub(super) fn run(
    ctx: &Ctx<'_>,
    tensor: &Tensor<'static>,
    root: usize,
    op: ReduceOp,
) -> Result<()> {
    let (t, deadline, dtype) = (ctx.t, ctx.deadline, tensor.dtype());
    #[cfg(target_os = "linux")]
    if let Some(arena) = ctx
        .arena
        .filter(|_| ctx.select.reduce_takes_arena(tensor.nbytes()))
    {
        let count = ctx
            .select
            .arena_threads(tensor.nbytes(), arena.cores, false);
        let threads = ArenaThreads {
            helpers: &arena.helpers,
            count,
        };
        let reduce = |bytes: &mut [u8]| {
            reduce_to_root_shm_arena(t, &arena.shm, threads, bytes, dtype, op, root, deadline)
        };
        if tensor.is_contiguous() {
            return tensor.with_bytes_mut(reduce)?;
        }
        // Elements in logical order: another rank may hold the same shape
        // in another layout.
        let staged = tensor.contiguous()?;
        staged.with_bytes_mut(reduce)??;
        if t.rank() == root {
            tensor.copy_from(&staged)?;
        }
        return Ok(());
    }
    if t.rank() == root && tensor.is_contiguous() {
        // The root's tensor ends as the result, whatever the algorithm
        // leaves in it on the way: no copy.
        return tensor
            .with_bytes_mut(|buf| ctx.select.reduce(t, buf, dtype, op, root, deadline))?;
    }
    // Other ranks keep their tensor as it is.
    let mut buf = read_copy(tensor)?;
    ctx.select.reduce(t, &mut buf, dtype, op, root, deadline)?;
    if t.rank() == root {
        write_from(tensor, &buf)?;
    }
    Ok(())
}
