//! `reduce`: every rank's tensor combined with a [`ReduceOp`] into the
//! root's tensor, over the transport ([`algorithms::reduce`]: a binomial
//! tree, or ring and gather for large messages; the backend takes the
//! shared-memory arena instead where it has one). Other ranks' tensors are
//! left unchanged. The fingerprint covers op, dtype, shape and
//! root.

use super::staging::{read_copy, write_from};
use super::{fingerprint, Planned};
use crate::cpu::algorithms;
use crate::group::fingerprint::CollectiveKind;
use crate::group::validate::{check_dense_host, check_root};
use crate::group::ReduceOp;
use crate::tensor::Tensor;
use crate::Result;

pub(crate) fn plan(
    size: usize,
    tensor: &Tensor<'static>,
    root: usize,
    op: ReduceOp,
) -> Result<Planned> {
    const OP: &str = "reduce";
    check_dense_host(OP, tensor)?;
    check_root(OP, root, size)?;
    op.check_dtype(OP, tensor.dtype())?;
    let dtype = tensor.dtype();
    let fp = fingerprint(
        CollectiveKind::Reduce,
        Some(op),
        dtype,
        root,
        tensor.numel(),
        &[tensor.shape()],
    );
    let tensor = tensor.clone();
    Ok(Planned {
        fingerprint: fp,
        body: Box::new(move |t, deadline| {
            if t.rank() == root && tensor.is_contiguous() {
                // The root's tensor ends as the result, whatever the
                // algorithm leaves in it on the way: no copy.
                return tensor
                    .with_bytes_mut(|buf| algorithms::reduce(t, buf, dtype, op, root, deadline))?;
            }
            // Other ranks keep their tensor as it is.
            let mut buf = read_copy(&tensor)?;
            algorithms::reduce(t, &mut buf, dtype, op, root, deadline)?;
            if t.rank() == root {
                write_from(&tensor, &buf)?;
            }
            Ok(())
        }),
    })
}
