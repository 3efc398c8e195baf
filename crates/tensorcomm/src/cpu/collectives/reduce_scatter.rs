//! `reduce_scatter`: `inputs[r]` of every rank combined with a
//! [`ReduceOp`] into `output` of rank `r`, over the ring
//! ([`reduce_scatter_ring`]). Every input has the output's dtype and shape;
//! the fingerprint covers op, dtype and shape.

use super::staging::{read_all, write_from};
use super::{fingerprint, Planned};
use crate::cpu::algorithms::reduce_scatter_ring;
use crate::group::fingerprint::CollectiveKind;
use crate::group::validate::{check_dense_host, check_like, check_per_rank};
use crate::group::ReduceOp;
use crate::tensor::Tensor;
use crate::Result;

pub(crate) fn plan(
    size: usize,
    output: &Tensor<'static>,
    inputs: &[Tensor<'static>],
    op: ReduceOp,
) -> Result<Planned> {
    const OP: &str = "reduce_scatter";
    check_dense_host(OP, output)?;
    check_per_rank(OP, "input_tensors", inputs.len(), size)?;
    for (i, input) in inputs.iter().enumerate() {
        check_like(OP, &format!("input_tensors[{i}]"), input, output)?;
    }
    op.check_dtype(OP, output.dtype())?;
    let dtype = output.dtype();
    let fp = fingerprint(
        CollectiveKind::ReduceScatter,
        Some(op),
        dtype,
        0,
        output.numel(),
        &[output.shape()],
    );
    let (output, inputs) = (output.clone(), inputs.to_vec());
    Ok(Planned {
        fingerprint: fp,
        body: Box::new(move |t, deadline| {
            let mut buf = read_all(&inputs)?;
            reduce_scatter_ring(t, &mut buf, dtype, op, deadline)?;
            let n = output.nbytes();
            write_from(&output, &buf[t.rank() * n..(t.rank() + 1) * n])
        }),
    })
}
