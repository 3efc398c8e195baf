//! `all_to_all` (list form): `inputs[p]` of this rank into `outputs[r]` of
//! rank `p`, where `r` is this rank, pairwise ([`all_to_all_pairwise`]).
//! Tensors may differ in size per peer (uneven all-to-all), so the
//! fingerprint covers only the dtype, and each pair agrees on its block
//! sizes before data moves.

use super::staging::{read_all, write_all};
use super::{fingerprint, Planned};
use crate::cpu::algorithms::all_to_all_pairwise;
use crate::group::fingerprint::CollectiveKind;
use crate::group::validate::{check_dtype_of, check_per_rank};
use crate::tensor::Tensor;
use crate::{Error, Result};

pub(crate) fn plan(
    rank: usize,
    size: usize,
    outputs: &[Tensor<'static>],
    inputs: &[Tensor<'static>],
) -> Result<Planned> {
    const OP: &str = "all_to_all";
    check_per_rank(OP, "input_tensors", inputs.len(), size)?;
    check_per_rank(OP, "output_tensors", outputs.len(), size)?;
    let dtype = inputs[0].dtype();
    for (i, input) in inputs.iter().enumerate() {
        check_dtype_of(OP, &format!("input_tensors[{i}]"), input, dtype)?;
    }
    for (i, out) in outputs.iter().enumerate() {
        check_dtype_of(OP, &format!("output_tensors[{i}]"), out, dtype)?;
    }
    if outputs[rank].numel() != inputs[rank].numel() {
        return Err(Error::ShapeMismatch {
            context: format!(
                "{OP}: output_tensors[{rank}] receives input_tensors[{rank}] from this rank itself and must have as many elements"
            ),
            expected: inputs[rank].shape().to_vec(),
            found: outputs[rank].shape().to_vec(),
        });
    }
    let fp = fingerprint(CollectiveKind::AllToAll, None, dtype, 0, 0, &[]);
    let (outputs, inputs) = (outputs.to_vec(), inputs.to_vec());
    Ok(Planned {
        fingerprint: fp,
        body: Box::new(move |t, deadline| {
            let send = read_all(&inputs)?;
            let send_offsets = offsets(inputs.iter().map(Tensor::nbytes));
            let recv_offsets = offsets(outputs.iter().map(Tensor::nbytes));
            let mut recv = vec![0u8; recv_offsets[size]];
            all_to_all_pairwise(
                t,
                &send,
                &send_offsets,
                &mut recv,
                &recv_offsets,
                true,
                deadline,
            )?;
            write_all(&outputs, &recv)
        }),
    })
}

/// Running sums of `lens`, starting at 0.
pub(super) fn offsets(lens: impl Iterator<Item = usize>) -> Vec<usize> {
    let mut out = vec![0];
    let mut at = 0;
    for len in lens {
        at += len;
        out.push(at);
    }
    out
}
