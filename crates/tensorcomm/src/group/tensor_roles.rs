//! What a collective does with each of its dense tensors on one rank
//! (reads it, writes it, or both), and the same collective over other
//! tensors: what a backend that runs a collective on copies of its
//! tensors (the CPU backend's host copies of CUDA tensors) needs to know
//! which copies to fill first and which to copy back.

use super::collective::Collective;
use crate::tensor::Tensor;
use crate::Result;

/// How a collective uses one tensor on this rank.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Role {
    /// Read only: its elements go to other ranks (or into an output).
    Read,
    /// Written only, every element of it: its old contents do not matter.
    Written,
    /// Read, then overwritten with the result.
    ReadWritten,
}

impl Role {
    /// True if the collective reads the tensor.
    pub(crate) fn is_read(self) -> bool {
        matches!(self, Role::Read | Role::ReadWritten)
    }

    /// True if the collective writes the tensor.
    pub(crate) fn is_written(self) -> bool {
        matches!(self, Role::Written | Role::ReadWritten)
    }
}

/// Maps one tensor of a collective to the tensor the copy runs on.
pub(crate) type MapTensor<'f> = dyn FnMut(&Tensor<'static>, Role) -> Result<Tensor<'static>> + 'f;

impl Collective {
    /// The same collective, as rank `rank` runs it, with every dense
    /// tensor `t` replaced by `f(t, role)` (each tensor is passed once, in
    /// the order of [`Collective::tensors`]' kinds: inputs before outputs
    /// of a list). A sparse all-reduce keeps its tensor and result slot
    /// (it has no dense tensors); barriers stay as they are.
    pub(crate) fn map_tensors(&self, rank: usize, f: &mut MapTensor<'_>) -> Result<Collective> {
        let mut all = |ts: &[Tensor<'static>], role: Role| -> Result<Vec<Tensor<'static>>> {
            ts.iter().map(|t| f(t, role)).collect()
        };
        use Role::{Read, ReadWritten, Written};
        Ok(match self {
            Collective::AllReduce { tensor, op } => Collective::AllReduce {
                tensor: all(std::slice::from_ref(tensor), ReadWritten)?.remove(0),
                op: *op,
            },
            Collective::AllReduceCoalesced { tensors, op } => Collective::AllReduceCoalesced {
                tensors: all(tensors, ReadWritten)?,
                op: *op,
            },
            Collective::AllReduceSparse { tensor, result } => Collective::AllReduceSparse {
                tensor: tensor.clone(),
                result: result.clone(),
            },
            Collective::Broadcast { tensor, root } => {
                let role = if rank == *root { Read } else { Written };
                Collective::Broadcast {
                    tensor: all(std::slice::from_ref(tensor), role)?.remove(0),
                    root: *root,
                }
            }
            Collective::Reduce { tensor, root, op } => {
                let role = if rank == *root { ReadWritten } else { Read };
                Collective::Reduce {
                    tensor: all(std::slice::from_ref(tensor), role)?.remove(0),
                    root: *root,
                    op: *op,
                }
            }
            Collective::AllGather { outputs, input } => {
                let input = all(std::slice::from_ref(input), Read)?.remove(0);
                Collective::AllGather {
                    outputs: all(outputs, Written)?,
                    input,
                }
            }
            Collective::AllGatherIntoTensor { output, input } => {
                let input = all(std::slice::from_ref(input), Read)?.remove(0);
                Collective::AllGatherIntoTensor {
                    output: all(std::slice::from_ref(output), Written)?.remove(0),
                    input,
                }
            }
            Collective::AllGatherCoalesced { outputs, inputs } => {
                let inputs = all(inputs, Read)?;
                let outputs = outputs
                    .iter()
                    .map(|list| all(list, Written))
                    .collect::<Result<_>>()?;
                Collective::AllGatherCoalesced { outputs, inputs }
            }
            Collective::AllGatherIntoTensorCoalesced { outputs, inputs } => {
                let inputs = all(inputs, Read)?;
                Collective::AllGatherIntoTensorCoalesced {
                    outputs: all(outputs, Written)?,
                    inputs,
                }
            }
            Collective::Gather {
                input,
                outputs,
                root,
            } => {
                let input = all(std::slice::from_ref(input), Read)?.remove(0);
                Collective::Gather {
                    input,
                    outputs: all(outputs, Written)?,
                    root: *root,
                }
            }
            Collective::Scatter {
                output,
                inputs,
                root,
            } => {
                let inputs = all(inputs, Read)?;
                Collective::Scatter {
                    output: all(std::slice::from_ref(output), Written)?.remove(0),
                    inputs,
                    root: *root,
                }
            }
            Collective::ReduceScatter { output, inputs, op } => {
                let inputs = all(inputs, Read)?;
                Collective::ReduceScatter {
                    output: all(std::slice::from_ref(output), Written)?.remove(0),
                    inputs,
                    op: *op,
                }
            }
            Collective::ReduceScatterTensor { output, input, op } => {
                let input = all(std::slice::from_ref(input), Read)?.remove(0);
                Collective::ReduceScatterTensor {
                    output: all(std::slice::from_ref(output), Written)?.remove(0),
                    input,
                    op: *op,
                }
            }
            Collective::ReduceScatterTensorCoalesced {
                outputs,
                inputs,
                op,
            } => {
                let inputs = all(inputs, Read)?;
                Collective::ReduceScatterTensorCoalesced {
                    outputs: all(outputs, Written)?,
                    inputs,
                    op: *op,
                }
            }
            Collective::AllToAll { outputs, inputs } => {
                let inputs = all(inputs, Read)?;
                Collective::AllToAll {
                    outputs: all(outputs, Written)?,
                    inputs,
                }
            }
            Collective::AllToAllSingle {
                output,
                input,
                send_rows,
                recv_rows,
                uneven,
            } => {
                let input = all(std::slice::from_ref(input), Read)?.remove(0);
                Collective::AllToAllSingle {
                    output: all(std::slice::from_ref(output), Written)?.remove(0),
                    input,
                    send_rows: send_rows.clone(),
                    recv_rows: recv_rows.clone(),
                    uneven: *uneven,
                }
            }
            Collective::Barrier => Collective::Barrier,
            Collective::MonitoredBarrier { wait_all, wait } => Collective::MonitoredBarrier {
                wait_all: *wait_all,
                wait: *wait,
            },
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::group::collective::{Capabilities, Scope};
    use crate::group::ReduceOp;

    fn scope(rank: usize) -> Scope {
        Scope {
            rank,
            size: 2,
            caps: Capabilities::HOST,
        }
    }

    /// The roles `map_tensors` hands out, with each tensor's first element.
    fn roles(c: &Collective, rank: usize) -> Vec<(i32, Role)> {
        let mut seen = Vec::new();
        let mapped = c
            .map_tensors(rank, &mut |t, role| {
                seen.push((t.to_vec::<i32>()?[0], role));
                Tensor::zeros(t.shape(), t.dtype())
            })
            .unwrap();
        // The copy runs on the new tensors.
        assert!(mapped.tensors().all(|t| t.to_vec::<i32>().unwrap()[0] == 0));
        seen
    }

    fn t(v: i32, n: usize) -> Tensor<'static> {
        Tensor::from_vec(vec![v; n], &[n]).unwrap()
    }

    #[test]
    fn roles_follow_what_each_rank_reads_and_writes() {
        use Role::{Read, ReadWritten, Written};
        let ar = Collective::all_reduce(&scope(0), &t(1, 2), ReduceOp::Sum).unwrap();
        assert_eq!(roles(&ar.collective, 0), [(1, ReadWritten)]);
        let b = Collective::broadcast(&scope(1), &t(1, 2), 0).unwrap();
        assert_eq!(roles(&b.collective, 0), [(1, Read)]);
        assert_eq!(roles(&b.collective, 1), [(1, Written)]);
        let r = Collective::reduce(&scope(0), &t(1, 2), 0, ReduceOp::Max).unwrap();
        assert_eq!(roles(&r.collective, 0), [(1, ReadWritten)]);
        assert_eq!(roles(&r.collective, 1), [(1, Read)]);
        let ag = Collective::all_gather(&scope(0), &[t(7, 2), t(8, 2)], &t(1, 2)).unwrap();
        assert_eq!(
            roles(&ag.collective, 0),
            [(1, Read), (7, Written), (8, Written)]
        );
        let sc = Collective::scatter(&scope(0), &t(1, 2), Some(&[t(7, 2), t(8, 2)]), 0).unwrap();
        assert_eq!(
            roles(&sc.collective, 0),
            [(7, Read), (8, Read), (1, Written)]
        );
        let single =
            Collective::all_to_all_single(&scope(0), &t(2, 4), &t(3, 4), &[], &[]).unwrap();
        assert_eq!(roles(&single.collective, 0), [(3, Read), (2, Written)]);
        let sparse_free = Collective::barrier();
        assert!(roles(&sparse_free.collective, 0).is_empty());
        assert!(Role::ReadWritten.is_read() && Role::ReadWritten.is_written());
        assert!(!Role::Read.is_written() && !Role::Written.is_read());
    }
}
