//! `all_gather_coalesced`: several inputs gathered at once,
//! `outputs[r][i]` receiving rank `r`'s `inputs[i]`. The inputs are packed
//! into one block per rank and gathered in one ring pass
//! ([`all_gather_ring`]). Every tensor has one dtype; the fingerprint
//! covers it, the total element count and every input's shape.

use super::scratch;
use super::staging::{read_all, write_all};
use super::{fingerprint, Planned};
use crate::cpu::algorithms::all_gather_ring;
use crate::group::fingerprint::CollectiveKind;
use crate::group::validate::{check_dtype_of, check_like, check_not_empty, check_per_rank};
use crate::tensor::Tensor;
use crate::{Error, Result};

pub(crate) fn plan(
    size: usize,
    outputs: &[Vec<Tensor<'static>>],
    inputs: &[Tensor<'static>],
) -> Result<Planned> {
    const OP: &str = "all_gather_coalesced";
    check_not_empty(OP, "input_tensors", inputs.len())?;
    let dtype = inputs[0].dtype();
    for (i, input) in inputs.iter().enumerate() {
        check_dtype_of(OP, &format!("input_tensors[{i}]"), input, dtype)?;
    }
    check_per_rank(OP, "output_tensor_lists", outputs.len(), size)?;
    for (r, list) in outputs.iter().enumerate() {
        if list.len() != inputs.len() {
            return Err(Error::InvalidCollective {
                op: OP.into(),
                reason: format!(
                    "expected {} tensors in output_tensor_lists[{r}] (one per input), found {}",
                    inputs.len(),
                    list.len()
                ),
            });
        }
        for (i, (out, input)) in list.iter().zip(inputs).enumerate() {
            check_like(OP, &format!("output_tensor_lists[{r}][{i}]"), out, input)?;
        }
    }
    let shapes: Vec<&[usize]> = inputs.iter().map(Tensor::shape).collect();
    let numel = inputs.iter().map(Tensor::numel).sum();
    let fp = fingerprint(
        CollectiveKind::AllGatherCoalesced,
        None,
        dtype,
        0,
        numel,
        &shapes,
    );
    let (outputs, inputs) = (outputs.to_vec(), inputs.to_vec());
    Ok(Planned {
        fingerprint: fp,
        body: Box::new(move |t, deadline| {
            let own = read_all(&inputs)?;
            let n = own.len();
            let mut buf = scratch::zeroed(n * size);
            buf[t.rank() * n..(t.rank() + 1) * n].copy_from_slice(&own);
            all_gather_ring(t, &mut buf, deadline)?;
            for (r, list) in outputs.iter().enumerate() {
                write_all(list, &buf[r * n..(r + 1) * n])?;
            }
            Ok(())
        }),
    })
}
