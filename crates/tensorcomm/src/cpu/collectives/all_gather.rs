//! `all_gather`: every rank's `input` into `outputs[r]` of every rank,
//! over the ring ([`all_gather_ring`]). Every output has the input's dtype
//! and shape; the fingerprint covers dtype and shape.

use super::scratch;
use super::staging::{read_into, write_from};
use super::{fingerprint, Planned};
use std::time::Instant;

use crate::cpu::algorithms::all_gather_ring;
use crate::cpu::transport::Transport;
use crate::group::fingerprint::CollectiveKind;
use crate::group::validate::{check_dense_host, check_like, check_per_rank};
use crate::tensor::Tensor;
use crate::Result;

pub(crate) fn plan(
    size: usize,
    outputs: &[Tensor<'static>],
    input: &Tensor<'static>,
) -> Result<Planned> {
    const OP: &str = "all_gather";
    check_dense_host(OP, input)?;
    check_per_rank(OP, "output_tensors", outputs.len(), size)?;
    for (i, out) in outputs.iter().enumerate() {
        check_like(OP, &format!("output_tensors[{i}]"), out, input)?;
    }
    let fp = fingerprint(
        CollectiveKind::AllGather,
        None,
        input.dtype(),
        0,
        input.numel(),
        &[input.shape()],
    );
    let (outputs, input) = (outputs.to_vec(), input.clone());
    Ok(Planned {
        fingerprint: fp,
        body: Box::new(move |t, deadline| {
            let n = input.nbytes();
            let buf = gather_bytes(t, &input, size, deadline)?;
            for (out, block) in outputs.iter().zip(buf.chunks_exact(n.max(1))) {
                write_from(out, block)?;
            }
            Ok(())
        }),
    })
}

/// Every rank's `input` bytes, in rank order: this rank's staged into its
/// block of one buffer, the rest filled by the ring.
pub(super) fn gather_bytes(
    t: &dyn Transport,
    input: &Tensor<'static>,
    size: usize,
    deadline: Instant,
) -> Result<scratch::Scratch> {
    let n = input.nbytes();
    let mut buf = scratch::zeroed(n * size);
    read_into(input, &mut buf[t.rank() * n..(t.rank() + 1) * n])?;
    all_gather_ring(t, &mut buf, deadline)?;
    Ok(buf)
}
