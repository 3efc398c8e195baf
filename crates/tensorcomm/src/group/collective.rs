//! One call of a collective, validated on the calling rank: its arguments
//! as a [`Collective`] and what every rank must agree on as a
//! [`Fingerprint`]. Validation is the same for every backend; what a
//! backend can take (host tensors, CUDA tensors) it declares as
//! [`Capabilities`].
//!
//! Fingerprints cover the op, reduce op, dtype, root and sequence number
//! always, and the shapes wherever every rank must pass the same ones. For
//! uneven `all_to_all` (list form) and `all_to_all_single` with split
//! sizes, the per-rank sizes legitimately differ, so only the shape after
//! dim 0 (`all_to_all_single`) is covered; the backend then has the pairs
//! agree on their block sizes before data moves.

use std::time::Duration;

use super::fingerprint::{reduce_code, shape_hash, CollectiveKind, Fingerprint};
use super::sparse_work::SparseSlot;
use super::validate::{
    check_dense, check_dtype_of, check_gathered, check_like, check_not_empty, check_per_rank,
    check_root, split_rows,
};
pub(crate) use super::validate::{Capabilities, Scope};
use super::ReduceOp;
use crate::tensor::{DType, SparseTensor, Tensor};
use crate::{Error, Result};

/// The validated arguments of one collective call. Tensors are handles of
/// the caller's storage, written in place when the collective runs.
pub(crate) enum Collective {
    AllReduce {
        tensor: Tensor<'static>,
        op: ReduceOp,
    },
    AllReduceCoalesced {
        tensors: Vec<Tensor<'static>>,
        op: ReduceOp,
    },
    AllReduceSparse {
        tensor: SparseTensor,
        result: SparseSlot,
    },
    Broadcast {
        tensor: Tensor<'static>,
        root: usize,
    },
    Reduce {
        tensor: Tensor<'static>,
        root: usize,
        op: ReduceOp,
    },
    AllGather {
        outputs: Vec<Tensor<'static>>,
        input: Tensor<'static>,
    },
    AllGatherIntoTensor {
        output: Tensor<'static>,
        input: Tensor<'static>,
    },
    AllGatherCoalesced {
        outputs: Vec<Vec<Tensor<'static>>>,
        inputs: Vec<Tensor<'static>>,
    },
    AllGatherIntoTensorCoalesced {
        outputs: Vec<Tensor<'static>>,
        inputs: Vec<Tensor<'static>>,
    },
    /// `outputs`: the root's list; empty on the other ranks.
    Gather {
        input: Tensor<'static>,
        outputs: Vec<Tensor<'static>>,
        root: usize,
    },
    /// `inputs`: the root's list; empty on the other ranks.
    Scatter {
        output: Tensor<'static>,
        inputs: Vec<Tensor<'static>>,
        root: usize,
    },
    ReduceScatter {
        output: Tensor<'static>,
        inputs: Vec<Tensor<'static>>,
        op: ReduceOp,
    },
    ReduceScatterTensor {
        output: Tensor<'static>,
        input: Tensor<'static>,
        op: ReduceOp,
    },
    ReduceScatterTensorCoalesced {
        outputs: Vec<Tensor<'static>>,
        inputs: Vec<Tensor<'static>>,
        op: ReduceOp,
    },
    AllToAll {
        outputs: Vec<Tensor<'static>>,
        inputs: Vec<Tensor<'static>>,
    },
    /// `send_rows[p]` rows of `input` go to rank `p`, `recv_rows[p]` rows
    /// of `output` come from it; `uneven` when split sizes were given.
    AllToAllSingle {
        output: Tensor<'static>,
        input: Tensor<'static>,
        send_rows: Vec<usize>,
        recv_rows: Vec<usize>,
        uneven: bool,
    },
    Barrier,
    /// `wait`: how long rank 0 waits for the others (what errors report).
    MonitoredBarrier {
        wait_all: bool,
        wait: Duration,
    },
}

/// A validated call: the arguments and their fingerprint (its sequence
/// number is filled in when the call is queued).
pub(crate) struct Validated {
    pub(crate) fingerprint: Fingerprint,
    pub(crate) collective: Collective,
}

/// The fingerprint of a collective over tensors of `shapes` (hashed
/// together, in order) holding `numel` elements in all.
pub(crate) fn fingerprint(
    kind: CollectiveKind,
    op: Option<ReduceOp>,
    dtype: DType,
    root: usize,
    numel: usize,
    shapes: &[&[usize]],
) -> Fingerprint {
    let mut flat = Vec::new();
    for shape in shapes {
        flat.extend_from_slice(shape);
        flat.push(usize::MAX);
    }
    Fingerprint {
        kind,
        reduce_op: reduce_code(op),
        dtype: Some(dtype),
        root: root as u32,
        seq: 0,
        numel: numel as u64,
        shape_hash: shape_hash(&flat, &[]),
    }
}

/// The fingerprint of a collective on one tensor, covering its shape and
/// strides.
fn tensor_fingerprint(
    kind: CollectiveKind,
    tensor: &Tensor<'_>,
    op: Option<ReduceOp>,
    root: usize,
) -> Fingerprint {
    Fingerprint {
        kind,
        reduce_op: reduce_code(op),
        dtype: Some(tensor.dtype()),
        root: root as u32,
        seq: 0,
        numel: tensor.numel() as u64,
        shape_hash: shape_hash(tensor.shape(), tensor.strides()),
    }
}

/// The fingerprint of a collective without tensors.
fn bare_fingerprint(kind: CollectiveKind) -> Fingerprint {
    Fingerprint {
        kind,
        reduce_op: 0,
        dtype: None,
        root: 0,
        seq: 0,
        numel: 0,
        shape_hash: 0,
    }
}

fn validated(fingerprint: Fingerprint, collective: Collective) -> Result<Validated> {
    Ok(Validated {
        fingerprint,
        collective,
    })
}

/// Every tensor of `tensors` (named `what[i]`) has `tensors[0]`'s dtype;
/// returns it.
fn one_dtype(s: &Scope, op: &str, what: &str, tensors: &[Tensor<'static>]) -> Result<DType> {
    check_not_empty(op, what, tensors.len())?;
    let dtype = tensors[0].dtype();
    for (i, tensor) in tensors.iter().enumerate() {
        check_dtype_of(op, &format!("{what}[{i}]"), tensor, dtype, s.caps)?;
    }
    Ok(dtype)
}

impl Collective {
    pub(crate) fn all_reduce(
        s: &Scope,
        tensor: &Tensor<'static>,
        op: ReduceOp,
    ) -> Result<Validated> {
        const OP: &str = "all_reduce";
        check_dense(OP, tensor, s.caps)?;
        op.check_dtype(OP, tensor.dtype())?;
        let fp = tensor_fingerprint(CollectiveKind::AllReduce, tensor, Some(op), 0);
        let tensor = tensor.clone();
        validated(fp, Collective::AllReduce { tensor, op })
    }

    pub(crate) fn all_reduce_coalesced(
        s: &Scope,
        tensors: &[Tensor<'static>],
        op: ReduceOp,
    ) -> Result<Validated> {
        const OP: &str = "all_reduce_coalesced";
        let dtype = one_dtype(s, OP, "tensors", tensors)?;
        op.check_dtype(OP, dtype)?;
        let shapes: Vec<&[usize]> = tensors.iter().map(Tensor::shape).collect();
        let numel = tensors.iter().map(Tensor::numel).sum();
        let kind = CollectiveKind::AllReduceCoalesced;
        let fp = fingerprint(kind, Some(op), dtype, 0, numel, &shapes);
        let tensors = tensors.to_vec();
        validated(fp, Collective::AllReduceCoalesced { tensors, op })
    }

    pub(crate) fn all_reduce_sparse(
        s: &Scope,
        tensor: &SparseTensor,
        op: ReduceOp,
        result: SparseSlot,
    ) -> Result<Validated> {
        const OP: &str = "all_reduce_sparse";
        if op != ReduceOp::Sum {
            return Err(Error::UnsupportedReduceOp {
                op: OP.into(),
                reduce_op: op.name().into(),
                what: "sparse tensors (only SUM is)".into(),
            });
        }
        if !s.caps.accepts(tensor.device()) {
            return Err(Error::InvalidCollective {
                op: OP.into(),
                reason: format!(
                    "expected {}, found one on {}",
                    s.caps.expected(),
                    tensor.device()
                ),
            });
        }
        let fp = Fingerprint {
            kind: CollectiveKind::AllReduceSparse,
            reduce_op: reduce_code(Some(op)),
            dtype: Some(tensor.dtype()),
            root: 0,
            seq: 0,
            numel: tensor
                .sizes()
                .iter()
                .fold(1u64, |n, &s| n.saturating_mul(s as u64)),
            shape_hash: shape_hash(tensor.sizes(), &[tensor.sparse_dim()]),
        };
        let tensor = tensor.clone();
        validated(fp, Collective::AllReduceSparse { tensor, result })
    }

    pub(crate) fn broadcast(s: &Scope, tensor: &Tensor<'static>, root: usize) -> Result<Validated> {
        const OP: &str = "broadcast";
        check_dense(OP, tensor, s.caps)?;
        check_root(OP, root, s.size)?;
        let fp = tensor_fingerprint(CollectiveKind::Broadcast, tensor, None, root);
        let tensor = tensor.clone();
        validated(fp, Collective::Broadcast { tensor, root })
    }

    pub(crate) fn reduce(
        s: &Scope,
        tensor: &Tensor<'static>,
        root: usize,
        op: ReduceOp,
    ) -> Result<Validated> {
        const OP: &str = "reduce";
        check_dense(OP, tensor, s.caps)?;
        check_root(OP, root, s.size)?;
        op.check_dtype(OP, tensor.dtype())?;
        let shape = [tensor.shape()];
        let fp = fingerprint(
            CollectiveKind::Reduce,
            Some(op),
            tensor.dtype(),
            root,
            tensor.numel(),
            &shape,
        );
        let tensor = tensor.clone();
        validated(fp, Collective::Reduce { tensor, root, op })
    }

    pub(crate) fn all_gather(
        s: &Scope,
        outputs: &[Tensor<'static>],
        input: &Tensor<'static>,
    ) -> Result<Validated> {
        const OP: &str = "all_gather";
        check_dense(OP, input, s.caps)?;
        check_per_rank(OP, "output_tensors", outputs.len(), s.size)?;
        for (i, out) in outputs.iter().enumerate() {
            check_like(OP, &format!("output_tensors[{i}]"), out, input, s.caps)?;
        }
        let kind = CollectiveKind::AllGather;
        let fp = fingerprint(
            kind,
            None,
            input.dtype(),
            0,
            input.numel(),
            &[input.shape()],
        );
        let (outputs, input) = (outputs.to_vec(), input.clone());
        validated(fp, Collective::AllGather { outputs, input })
    }

    pub(crate) fn all_gather_into_tensor(
        s: &Scope,
        output: &Tensor<'static>,
        input: &Tensor<'static>,
    ) -> Result<Validated> {
        const OP: &str = "all_gather_into_tensor";
        check_dense(OP, input, s.caps)?;
        check_gathered(OP, "output_tensor", output, input, s.size, s.caps)?;
        let kind = CollectiveKind::AllGatherIntoTensor;
        let fp = fingerprint(
            kind,
            None,
            input.dtype(),
            0,
            input.numel(),
            &[input.shape()],
        );
        let (output, input) = (output.clone(), input.clone());
        validated(fp, Collective::AllGatherIntoTensor { output, input })
    }

    pub(crate) fn all_gather_coalesced(
        s: &Scope,
        outputs: &[Vec<Tensor<'static>>],
        inputs: &[Tensor<'static>],
    ) -> Result<Validated> {
        const OP: &str = "all_gather_coalesced";
        let dtype = one_dtype(s, OP, "input_tensors", inputs)?;
        check_per_rank(OP, "output_tensor_lists", outputs.len(), s.size)?;
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
                check_like(
                    OP,
                    &format!("output_tensor_lists[{r}][{i}]"),
                    out,
                    input,
                    s.caps,
                )?;
            }
        }
        let shapes: Vec<&[usize]> = inputs.iter().map(Tensor::shape).collect();
        let numel = inputs.iter().map(Tensor::numel).sum();
        let kind = CollectiveKind::AllGatherCoalesced;
        let fp = fingerprint(kind, None, dtype, 0, numel, &shapes);
        let (outputs, inputs) = (outputs.to_vec(), inputs.to_vec());
        validated(fp, Collective::AllGatherCoalesced { outputs, inputs })
    }

    /// `outputs[i]` receives every rank's `inputs[i]`, concatenated or
    /// stacked along dim 0 (FSDP's form).
    pub(crate) fn all_gather_into_tensor_coalesced(
        s: &Scope,
        outputs: &[Tensor<'static>],
        inputs: &[Tensor<'static>],
    ) -> Result<Validated> {
        const OP: &str = "all_gather_into_tensor_coalesced";
        let dtype = one_dtype(s, OP, "inputs", inputs)?;
        check_pairs(OP, outputs.len(), inputs.len())?;
        for (i, (out, input)) in outputs.iter().zip(inputs).enumerate() {
            check_gathered(OP, &format!("outputs[{i}]"), out, input, s.size, s.caps)?;
        }
        let shapes: Vec<&[usize]> = inputs.iter().map(Tensor::shape).collect();
        let numel = inputs.iter().map(Tensor::numel).sum();
        let kind = CollectiveKind::AllGatherIntoTensorCoalesced;
        let fp = fingerprint(kind, None, dtype, 0, numel, &shapes);
        let (outputs, inputs) = (outputs.to_vec(), inputs.to_vec());
        validated(
            fp,
            Collective::AllGatherIntoTensorCoalesced { outputs, inputs },
        )
    }

    pub(crate) fn gather(
        s: &Scope,
        input: &Tensor<'static>,
        outputs: Option<&[Tensor<'static>]>,
        root: usize,
    ) -> Result<Validated> {
        const OP: &str = "gather";
        check_dense(OP, input, s.caps)?;
        check_root(OP, root, s.size)?;
        let outputs = root_list(OP, "gather_list", s, root, outputs)?;
        for (i, out) in outputs.iter().enumerate() {
            check_like(OP, &format!("gather_list[{i}]"), out, input, s.caps)?;
        }
        let kind = CollectiveKind::Gather;
        let fp = fingerprint(
            kind,
            None,
            input.dtype(),
            root,
            input.numel(),
            &[input.shape()],
        );
        let input = input.clone();
        validated(
            fp,
            Collective::Gather {
                input,
                outputs,
                root,
            },
        )
    }

    pub(crate) fn scatter(
        s: &Scope,
        output: &Tensor<'static>,
        inputs: Option<&[Tensor<'static>]>,
        root: usize,
    ) -> Result<Validated> {
        const OP: &str = "scatter";
        check_dense(OP, output, s.caps)?;
        check_root(OP, root, s.size)?;
        let inputs = root_list(OP, "scatter_list", s, root, inputs)?;
        for (i, input) in inputs.iter().enumerate() {
            check_like(OP, &format!("scatter_list[{i}]"), input, output, s.caps)?;
        }
        let kind = CollectiveKind::Scatter;
        let (dtype, numel) = (output.dtype(), output.numel());
        let fp = fingerprint(kind, None, dtype, root, numel, &[output.shape()]);
        let output = output.clone();
        validated(
            fp,
            Collective::Scatter {
                output,
                inputs,
                root,
            },
        )
    }

    pub(crate) fn reduce_scatter(
        s: &Scope,
        output: &Tensor<'static>,
        inputs: &[Tensor<'static>],
        op: ReduceOp,
    ) -> Result<Validated> {
        const OP: &str = "reduce_scatter";
        check_dense(OP, output, s.caps)?;
        check_per_rank(OP, "input_tensors", inputs.len(), s.size)?;
        for (i, input) in inputs.iter().enumerate() {
            check_like(OP, &format!("input_tensors[{i}]"), input, output, s.caps)?;
        }
        op.check_dtype(OP, output.dtype())?;
        let kind = CollectiveKind::ReduceScatter;
        let (dtype, numel) = (output.dtype(), output.numel());
        let fp = fingerprint(kind, Some(op), dtype, 0, numel, &[output.shape()]);
        let (output, inputs) = (output.clone(), inputs.to_vec());
        validated(fp, Collective::ReduceScatter { output, inputs, op })
    }

    pub(crate) fn reduce_scatter_tensor(
        s: &Scope,
        output: &Tensor<'static>,
        input: &Tensor<'static>,
        op: ReduceOp,
    ) -> Result<Validated> {
        const OP: &str = "reduce_scatter_tensor";
        check_dense(OP, output, s.caps)?;
        check_gathered(OP, "input", input, output, s.size, s.caps)?;
        op.check_dtype(OP, output.dtype())?;
        let kind = CollectiveKind::ReduceScatterTensor;
        let (dtype, numel) = (output.dtype(), output.numel());
        let fp = fingerprint(kind, Some(op), dtype, 0, numel, &[output.shape()]);
        let (output, input) = (output.clone(), input.clone());
        validated(fp, Collective::ReduceScatterTensor { output, input, op })
    }

    /// `outputs[i]` receives this rank's block of the reduction of every
    /// rank's `inputs[i]` (FSDP's form).
    pub(crate) fn reduce_scatter_tensor_coalesced(
        s: &Scope,
        outputs: &[Tensor<'static>],
        inputs: &[Tensor<'static>],
        op: ReduceOp,
    ) -> Result<Validated> {
        const OP: &str = "reduce_scatter_tensor_coalesced";
        let dtype = one_dtype(s, OP, "outputs", outputs)?;
        check_pairs(OP, outputs.len(), inputs.len())?;
        for (i, (out, input)) in outputs.iter().zip(inputs).enumerate() {
            check_gathered(OP, &format!("inputs[{i}]"), input, out, s.size, s.caps)?;
        }
        op.check_dtype(OP, dtype)?;
        let shapes: Vec<&[usize]> = outputs.iter().map(Tensor::shape).collect();
        let numel = outputs.iter().map(Tensor::numel).sum();
        let kind = CollectiveKind::ReduceScatterTensorCoalesced;
        let fp = fingerprint(kind, Some(op), dtype, 0, numel, &shapes);
        let (outputs, inputs) = (outputs.to_vec(), inputs.to_vec());
        validated(
            fp,
            Collective::ReduceScatterTensorCoalesced {
                outputs,
                inputs,
                op,
            },
        )
    }

    pub(crate) fn all_to_all(
        s: &Scope,
        outputs: &[Tensor<'static>],
        inputs: &[Tensor<'static>],
    ) -> Result<Validated> {
        const OP: &str = "all_to_all";
        check_per_rank(OP, "input_tensors", inputs.len(), s.size)?;
        check_per_rank(OP, "output_tensors", outputs.len(), s.size)?;
        let dtype = inputs[0].dtype();
        for (i, input) in inputs.iter().enumerate() {
            check_dtype_of(OP, &format!("input_tensors[{i}]"), input, dtype, s.caps)?;
        }
        for (i, out) in outputs.iter().enumerate() {
            check_dtype_of(OP, &format!("output_tensors[{i}]"), out, dtype, s.caps)?;
        }
        let rank = s.rank;
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
        validated(fp, Collective::AllToAll { outputs, inputs })
    }

    pub(crate) fn all_to_all_single(
        s: &Scope,
        output: &Tensor<'static>,
        input: &Tensor<'static>,
        output_split_sizes: &[usize],
        input_split_sizes: &[usize],
    ) -> Result<Validated> {
        const OP: &str = "all_to_all_single";
        check_dense(OP, input, s.caps)?;
        check_dtype_of(OP, "output", output, input.dtype(), s.caps)?;
        let (Some((&in_rows, row_shape)), Some((&out_rows, out_row_shape))) =
            (input.shape().split_first(), output.shape().split_first())
        else {
            return Err(Error::InvalidCollective {
                op: OP.into(),
                reason: format!(
                    "expected input and output with at least one dimension, found shapes {:?} and {:?}",
                    input.shape(),
                    output.shape()
                ),
            });
        };
        if row_shape != out_row_shape {
            return Err(Error::ShapeMismatch {
                context: format!("{OP}: the output's shape after dim 0 must be the input's"),
                expected: row_shape.to_vec(),
                found: out_row_shape.to_vec(),
            });
        }
        let send_rows = split_rows(OP, "input", input_split_sizes, in_rows, s.size)?;
        let recv_rows = split_rows(OP, "output", output_split_sizes, out_rows, s.size)?;
        let rank = s.rank;
        if send_rows[rank] != recv_rows[rank] {
            return Err(Error::InvalidCollective {
                op: OP.into(),
                reason: format!(
                    "expected this rank ({rank}) to receive from itself the {} rows it sends itself, found {}",
                    send_rows[rank], recv_rows[rank]
                ),
            });
        }
        let uneven = !(input_split_sizes.is_empty() && output_split_sizes.is_empty());
        let numel = if uneven { 0 } else { input.numel() };
        let fp = fingerprint(
            CollectiveKind::AllToAllSingle,
            None,
            input.dtype(),
            usize::from(uneven),
            numel,
            &[row_shape],
        );
        let (output, input) = (output.clone(), input.clone());
        validated(
            fp,
            Collective::AllToAllSingle {
                output,
                input,
                send_rows,
                recv_rows,
                uneven,
            },
        )
    }

    /// Every dense tensor the collective reads or writes.
    #[cfg_attr(
        not(feature = "cuda"),
        allow(dead_code, reason = "used by the CUDA paths")
    )]
    pub(crate) fn tensors(&self) -> Box<dyn Iterator<Item = &Tensor<'static>> + '_> {
        use std::iter::once;
        match self {
            Collective::AllReduce { tensor, .. }
            | Collective::Broadcast { tensor, .. }
            | Collective::Reduce { tensor, .. } => Box::new(once(tensor)),
            Collective::AllReduceCoalesced { tensors, .. } => Box::new(tensors.iter()),
            Collective::AllGather { outputs, input } => Box::new(outputs.iter().chain(once(input))),
            Collective::AllGatherIntoTensor { output, input }
            | Collective::ReduceScatterTensor { output, input, .. }
            | Collective::AllToAllSingle { output, input, .. } => {
                Box::new([output, input].into_iter())
            }
            Collective::AllGatherCoalesced { outputs, inputs } => {
                Box::new(outputs.iter().flatten().chain(inputs))
            }
            Collective::AllGatherIntoTensorCoalesced { outputs, inputs }
            | Collective::ReduceScatterTensorCoalesced {
                outputs, inputs, ..
            }
            | Collective::AllToAll { outputs, inputs } => Box::new(outputs.iter().chain(inputs)),
            Collective::Gather { input, outputs, .. } => {
                Box::new(outputs.iter().chain(once(input)))
            }
            Collective::Scatter { output, inputs, .. }
            | Collective::ReduceScatter { output, inputs, .. } => {
                Box::new(inputs.iter().chain(once(output)))
            }
            Collective::AllReduceSparse { .. }
            | Collective::Barrier
            | Collective::MonitoredBarrier { .. } => Box::new(std::iter::empty()),
        }
    }

    pub(crate) fn barrier() -> Validated {
        Validated {
            fingerprint: bare_fingerprint(CollectiveKind::Barrier),
            collective: Collective::Barrier,
        }
    }

    pub(crate) fn monitored_barrier(wait_all: bool, wait: Duration) -> Validated {
        Validated {
            fingerprint: bare_fingerprint(CollectiveKind::MonitoredBarrier),
            collective: Collective::MonitoredBarrier { wait_all, wait },
        }
    }
}

/// Two lists that pair up must be as long as each other.
fn check_pairs(op: &str, outputs: usize, inputs: usize) -> Result<()> {
    if outputs != inputs {
        return Err(Error::InvalidCollective {
            op: op.into(),
            reason: format!("expected one output per input ({inputs}), found {outputs} outputs"),
        });
    }
    Ok(())
}

/// The root's per-rank list (`size` tensors); nothing (or an empty list)
/// elsewhere.
fn root_list(
    op: &str,
    what: &str,
    s: &Scope,
    root: usize,
    list: Option<&[Tensor<'static>]>,
) -> Result<Vec<Tensor<'static>>> {
    let (rank, size) = (s.rank, s.size);
    match list {
        Some(list) if rank == root => {
            check_per_rank(op, what, list.len(), size)?;
            Ok(list.to_vec())
        }
        None if rank == root => Err(Error::InvalidCollective {
            op: op.into(),
            reason: format!("expected {what} with {size} tensors on the root (rank {root}), found none"),
        }),
        Some(list) if !list.is_empty() => Err(Error::InvalidCollective {
            op: op.into(),
            reason: format!(
                "expected no {what} on rank {rank}, which is not the root (rank {root}), found {} tensors",
                list.len()
            ),
        }),
        _ => Ok(Vec::new()),
    }
}
