//! `reduce_scatter_tensor`: one `input` of `world` times the output's size
//! (concatenated or stacked along dim 0) reduced with a [`ReduceOp`],
//! block `r` of the result into `output` of rank `r`, over the ring
//! ([`reduce_scatter_ring`]). The fingerprint covers op, dtype and the
//! output's shape.

use super::staging::{read_copy, write_from};
use super::{fingerprint, Planned};
use crate::cpu::algorithms::reduce_scatter_ring;
use crate::group::fingerprint::CollectiveKind;
use crate::group::validate::{check_dense_host, check_gathered};
use crate::group::ReduceOp;
use crate::tensor::Tensor;
use crate::Result;

pub(crate) fn plan(
    size: usize,
    output: &Tensor<'static>,
    input: &Tensor<'static>,
    op: ReduceOp,
) -> Result<Planned> {
    const OP: &str = "reduce_scatter_tensor";
    check_dense_host(OP, output)?;
    check_gathered(OP, "input", input, output, size)?;
    op.check_dtype(OP, output.dtype())?;
    let dtype = output.dtype();
    let fp = fingerprint(
        CollectiveKind::ReduceScatterTensor,
        Some(op),
        dtype,
        0,
        output.numel(),
        &[output.shape()],
    );
    let (output, input) = (output.clone(), input.clone());
    Ok(Planned {
        fingerprint: fp,
        body: Box::new(move |t, deadline| {
            let mut buf = read_copy(&input)?;
            reduce_scatter_ring(t, &mut buf, dtype, op, deadline)?;
            let n = output.nbytes();
            write_from(&output, &buf[t.rank() * n..(t.rank() + 1) * n])
        }),
    })
}
