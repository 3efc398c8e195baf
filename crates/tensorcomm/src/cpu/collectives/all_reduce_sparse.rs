//! `all_reduce_sparse`: the sum of every rank's sparse COO tensor, left
//! coalesced in the call's result slot (see
//! [`all_reduce_sparse`](crate::cpu::sparse_all_reduce::all_reduce_sparse)).

use std::sync::PoisonError;

use super::Ctx;
use crate::cpu::sparse_all_reduce::all_reduce_sparse;
use crate::group::SparseSlot;
use crate::tensor::SparseTensor;
use crate::Result;

pub(super) fn run(ctx: &Ctx<'_>, tensor: &SparseTensor, result: &SparseSlot) -> Result<()> {
    let sum = all_reduce_sparse(ctx.t, tensor, ctx.deadline)?;
    *result.lock().unwrap_or_else(PoisonError::into_inner) = Some(sum);
    Ok(())
}
