//! `all_gather_into_tensor`: every rank's `input` concatenated (or
//! stacked) along dim 0 into one `output` of `world` times its size, over
//! the ring ([`all_gather_ring`](crate::cpu::algorithms::all_gather_ring)). The fingerprint covers dtype and the
//! input's shape.

use super::all_gather::gather_bytes;
use super::staging::write_from;
use super::{fingerprint, Planned};
use crate::group::fingerprint::CollectiveKind;
use crate::group::validate::{check_dense_host, check_gathered};
use crate::tensor::Tensor;
use crate::Result;

pub(crate) fn plan(
    size: usize,
    output: &Tensor<'static>,
    input: &Tensor<'static>,
) -> Result<Planned> {
    const OP: &str = "all_gather_into_tensor";
    check_dense_host(OP, input)?;
    check_gathered(OP, "output_tensor", output, input, size)?;
    let fp = fingerprint(
        CollectiveKind::AllGatherIntoTensor,
        None,
        input.dtype(),
        0,
        input.numel(),
        &[input.shape()],
    );
    let (output, input) = (output.clone(), input.clone());
    Ok(Planned {
        fingerprint: fp,
        body: Box::new(move |t, deadline| {
            let buf = gather_bytes(t, &input, size, deadline)?;
            write_from(&output, &buf)
        }),
    })
}
