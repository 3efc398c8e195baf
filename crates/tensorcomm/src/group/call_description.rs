//! A call's full description, in words, for the error of a mismatched
//! collective: op, sequence number, reduce op, then the tensors the
//! fingerprint covers (dtype, shapes, strides where they are not
//! contiguous, element count, device), root and split sizes. The 32-byte
//! fingerprint carries a hash of the shapes only; this is what a failing
//! rank posts for its peers on the failure path (`mismatch_sides.rs`), so
//! that both sides of a mismatch read as what the user passed, e.g.
//! `broadcast (seq 3, f32 tensor of shape [20, 2], 40 elements, on cpu,
//! root 0)`. Lists are summarised (`3 f32 tensors of shapes [4], [2, 2],
//! [8]`), the shapes cut after [`MAX_SHAPES`]. The text is built from the
//! validated [`Collective`], so it is the same whatever algorithm or
//! transport runs the call.

use std::fmt::Write;

use super::collective::Collective;
use super::fingerprint::{reduce_name, CollectiveKind, Fingerprint};
use crate::tensor::Tensor;

/// Shapes a list names before it says how many more there are.
pub(crate) const MAX_SHAPES: usize = 6;

/// `[20, 2]`.
fn dims(dims: &[usize]) -> String {
    let inner: Vec<String> = dims.iter().map(usize::to_string).collect();
    format!("[{}]", inner.join(", "))
}

/// One tensor: `f32 tensor of shape [20, 2], 40 elements, on cpu` (with
/// its strides when it is not contiguous).
fn one(t: &Tensor<'_>) -> String {
    let mut out = format!("{} tensor of shape {}", t.dtype(), dims(t.shape()));
    if !t.is_contiguous() {
        let _ = write!(out, " and strides {}", dims(t.strides()));
    }
    let _ = write!(out, ", {} elements, on {}", t.numel(), t.device());
    out
}

/// A list: `3 f32 tensors of shapes [4], [2, 2], [8], 16 elements, on
/// cpu`, the shapes cut after [`MAX_SHAPES`].
fn list(tensors: &[Tensor<'_>]) -> String {
    let Some(first) = tensors.first() else {
        return "no tensors".into();
    };
    let mut shapes: Vec<String> = tensors
        .iter()
        .take(MAX_SHAPES)
        .map(|t| dims(t.shape()))
        .collect();
    if tensors.len() > MAX_SHAPES {
        shapes.push(format!("and {} more", tensors.len() - MAX_SHAPES));
    }
    let numel: usize = tensors.iter().map(Tensor::numel).sum();
    let noun = if tensors.len() == 1 {
        "tensor of shape"
    } else {
        "tensors of shapes"
    };
    format!(
        "{} {} {noun} {}, {numel} elements, on {}",
        tensors.len(),
        first.dtype(),
        shapes.join(", "),
        first.device()
    )
}

/// Split sizes in rows: `[1, 3]`, or `even` when none were given.
fn splits(rows: &[usize], uneven: bool) -> String {
    if uneven {
        dims(rows)
    } else {
        "even".into()
    }
}

/// What `collective` passes, in words (the part the fingerprint hashes).
fn tensors(collective: &Collective) -> Option<String> {
    Some(match collective {
        Collective::AllReduce { tensor, .. }
        | Collective::Broadcast { tensor, .. }
        | Collective::Reduce { tensor, .. } => one(tensor),
        Collective::AllReduceCoalesced { tensors, .. } => list(tensors),
        Collective::AllReduceSparse { tensor, .. } => format!(
            "sparse {} tensor of sizes {} ({} sparse dims), {} nonzeros, on {}",
            tensor.dtype(),
            dims(tensor.sizes()),
            tensor.sparse_dim(),
            tensor.nnz(),
            tensor.device()
        ),
        Collective::AllGather { input, .. }
        | Collective::AllGatherIntoTensor { input, .. }
        | Collective::Gather { input, .. } => format!("input {}", one(input)),
        Collective::AllGatherCoalesced { inputs, .. }
        | Collective::AllGatherIntoTensorCoalesced { inputs, .. } => {
            format!("inputs {}", list(inputs))
        }
        Collective::Scatter { output, .. }
        | Collective::ReduceScatter { output, .. }
        | Collective::ReduceScatterTensor { output, .. } => format!("output {}", one(output)),
        Collective::ReduceScatterTensorCoalesced { outputs, .. } => {
            format!("outputs {}", list(outputs))
        }
        Collective::AllToAll { inputs, .. } => format!("inputs {}", list(inputs)),
        Collective::AllToAllSingle {
            input,
            send_rows,
            recv_rows,
            uneven,
            ..
        } => format!(
            "input {}, rows sent {}, received {}",
            one(input),
            splits(send_rows, *uneven),
            splits(recv_rows, *uneven)
        ),
        Collective::Barrier | Collective::MonitoredBarrier { .. } => return None,
    })
}

/// The description of `collective`, whose fingerprint (sequence number
/// filled in) is `fp`; see the module docs.
pub(crate) fn describe(fp: &Fingerprint, collective: &Collective) -> String {
    let mut out = format!("{} (seq {}", fp.kind.name(), fp.seq);
    if let Some(op) = reduce_name(fp.reduce_op) {
        let _ = write!(out, ", {op}");
    }
    if let Some(tensors) = tensors(collective) {
        let _ = write!(out, ", {tensors}");
    }
    if matches!(
        fp.kind,
        CollectiveKind::Broadcast
            | CollectiveKind::Reduce
            | CollectiveKind::Gather
            | CollectiveKind::Scatter
    ) {
        let _ = write!(out, ", root {}", fp.root);
    }
    out.push(')');
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::group::collective::Scope;
    use crate::group::validate::Capabilities;
    use crate::group::ReduceOp;
    use crate::tensor::DType;

    fn scope() -> Scope {
        Scope {
            rank: 0,
            size: 2,
            caps: Capabilities::HOST,
        }
    }

    #[test]
    fn one_tensor_names_dtype_shape_elements_device_and_root() {
        let t = Tensor::zeros(&[20, 2], DType::F32).unwrap();
        let v = Collective::broadcast(&scope(), &t, 1).unwrap();
        let mut fp = v.fingerprint;
        fp.seq = 3;
        assert_eq!(
            describe(&fp, &v.collective),
            "broadcast (seq 3, f32 tensor of shape [20, 2], 40 elements, on cpu, root 1)"
        );
        let v = Collective::all_reduce(&scope(), &t, ReduceOp::Max).unwrap();
        assert_eq!(
            describe(&v.fingerprint, &v.collective),
            "all_reduce (seq 0, MAX, f32 tensor of shape [20, 2], 40 elements, on cpu)"
        );
    }

    #[test]
    fn lists_are_summarised_and_cut() {
        let shapes: [&[usize]; 3] = [&[4], &[2, 2], &[8]];
        let ts: Vec<_> = shapes
            .iter()
            .map(|s| Tensor::zeros(s, DType::I64).unwrap())
            .collect();
        let v = Collective::all_reduce_coalesced(&scope(), &ts, ReduceOp::Sum).unwrap();
        assert_eq!(
            describe(&v.fingerprint, &v.collective),
            "all_reduce_coalesced (seq 0, SUM, 3 i64 tensors of shapes [4], [2, 2], [8], 16 elements, on cpu)"
        );
        let many: Vec<_> = (0..9)
            .map(|_| Tensor::zeros(&[1], DType::I64).unwrap())
            .collect();
        let v = Collective::all_reduce_coalesced(&scope(), &many, ReduceOp::Sum).unwrap();
        let text = describe(&v.fingerprint, &v.collective);
        assert!(
            text.contains("9 i64 tensors of shapes [1], [1], [1], [1], [1], [1], and 3 more"),
            "{text}"
        );
    }

    #[test]
    fn strided_tensors_show_their_strides_and_barriers_have_no_tensors() {
        let t = Tensor::zeros(&[3, 2], DType::F64)
            .unwrap()
            .permute(&[1, 0])
            .unwrap();
        let v = Collective::all_reduce(&scope(), &t, ReduceOp::Sum).unwrap();
        let text = describe(&v.fingerprint, &v.collective);
        assert!(
            text.contains("f64 tensor of shape [2, 3] and strides [1, 2]"),
            "{text}"
        );
        let v = Collective::barrier();
        assert_eq!(describe(&v.fingerprint, &v.collective), "barrier (seq 0)");
    }
}
