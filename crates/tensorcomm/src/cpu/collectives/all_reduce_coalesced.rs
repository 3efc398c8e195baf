//! `all_reduce_coalesced`: several tensors of one dtype all-reduced as one
//! buffer (one collective's latency instead of one per tensor), with the
//! all-reduce algorithm the selector picks for the total size. The
//! fingerprint covers op, dtype, the total element count and every shape.

use super::staging::{read_all, write_all};
use super::{fingerprint, Planned};
use crate::cpu::algorithms::all_reduce;
use crate::group::fingerprint::CollectiveKind;
use crate::group::validate::{check_dtype_of, check_not_empty};
use crate::group::ReduceOp;
use crate::tensor::Tensor;
use crate::Result;

pub(crate) fn plan(tensors: &[Tensor<'static>], op: ReduceOp) -> Result<Planned> {
    const OP: &str = "all_reduce_coalesced";
    check_not_empty(OP, "tensors", tensors.len())?;
    let dtype = tensors[0].dtype();
    for (i, tensor) in tensors.iter().enumerate() {
        check_dtype_of(OP, &format!("tensors[{i}]"), tensor, dtype)?;
    }
    op.check_dtype(OP, dtype)?;
    let shapes: Vec<&[usize]> = tensors.iter().map(Tensor::shape).collect();
    let numel = tensors.iter().map(Tensor::numel).sum();
    let fp = fingerprint(
        CollectiveKind::AllReduceCoalesced,
        Some(op),
        dtype,
        0,
        numel,
        &shapes,
    );
    let tensors = tensors.to_vec();
    Ok(Planned {
        fingerprint: fp,
        body: Box::new(move |t, deadline| {
            let mut buf = read_all(&tensors)?;
            all_reduce(t, &mut buf, dtype, op, deadline)?;
            write_all(&tensors, &buf)
        }),
    })
}
