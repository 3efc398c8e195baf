//! A collective as the NCCL calls that run it, with every device address,
//! count, dtype and reduce op resolved before the first call is made: an
//! error found while planning leaves nothing half-queued (a group of NCCL
//! calls ended early would launch on this rank alone and hang the others).
//!
//! How each collective maps to NCCL: all_reduce, broadcast, reduce,
//! all_gather_into_tensor and reduce_scatter_tensor (and their coalesced
//! forms) are NCCL's own; all_gather into a list is one broadcast per
//! rank; reduce_scatter from a list is one reduce per rank; gather,
//! scatter and all_to_all are sends and receives (this rank's own part a
//! copy); barrier all-reduces one element.

use std::ffi::c_void;

use super::library::Nccl;
use super::library::{RawComm, RawDType};
use super::types::{nccl_dtype, RedOp};
use crate::cuda::runtime::DevicePtr;
use crate::group::collective::Collective;
use crate::group::ReduceOp;
use crate::tensor::{DType, Tensor};
use crate::{Error, Result};

/// A device buffer: its address, element count and NCCL dtype.
#[derive(Clone, Copy)]
pub(crate) struct Buf {
    pub(crate) ptr: *mut c_void,
    pub(crate) count: usize,
    pub(crate) dtype: RawDType,
}

/// One NCCL call (or, for `Copy`, one device copy made before them).
pub(crate) enum Step {
    AllReduce {
        buf: Buf,
        op: usize,
    },
    Broadcast {
        src: Buf,
        dst: Buf,
        root: usize,
    },
    Reduce {
        src: Buf,
        dst: Buf,
        op: usize,
        root: usize,
    },
    AllGather {
        src: Buf,
        dst: Buf,
    },
    ReduceScatter {
        src: Buf,
        dst: Buf,
        op: usize,
    },
    Send {
        buf: Buf,
        peer: usize,
    },
    Recv {
        buf: Buf,
        peer: usize,
    },
    Copy {
        dst: DevicePtr,
        src: DevicePtr,
        bytes: usize,
    },
}

/// The steps of one collective and the reduce ops they use (`op` indexes
/// `ops`; an op NCCL created for the call is destroyed with the plan).
pub(crate) struct Plan<'a> {
    pub(crate) steps: Vec<Step>,
    pub(crate) ops: Vec<RedOp<'a>>,
}

impl Plan<'_> {
    /// True if dropping the plan calls NCCL (it destroys ops it created).
    pub(crate) fn owns_ops(&self) -> bool {
        self.ops.iter().any(RedOp::is_created)
    }

    /// True if the plan sends or receives (NCCL connects each pair of
    /// ranks for those at their first transfer).
    pub(crate) fn has_p2p(&self) -> bool {
        self.steps
            .iter()
            .any(|s| matches!(s, Step::Send { .. } | Step::Recv { .. }))
    }
}

/// What planning needs: NCCL, the (entered) communicator, this rank and
/// its GPU, the collective's name for errors, and the barrier's element.
pub(crate) struct Planner<'a> {
    pub(crate) nccl: &'a Nccl,
    pub(crate) comm: RawComm,
    pub(crate) rank: usize,
    pub(crate) device: usize,
    pub(crate) call: &'static str,
    pub(crate) barrier: DevicePtr,
}

impl<'a> Planner<'a> {
    /// `count` elements of `t` from element `skip` (the rest when `None`).
    fn buf(&self, t: &Tensor<'_>, skip: usize, count: Option<usize>) -> Result<Buf> {
        let (ctx, ptr) = t.cuda_ptr()?;
        if ctx.ordinal() != self.device {
            return Err(Error::InvalidCollective {
                op: self.call.into(),
                reason: format!(
                    "expected tensors on cuda:{} (the group's GPU), found one on cuda:{}",
                    self.device,
                    ctx.ordinal()
                ),
            });
        }
        let count = count.unwrap_or(t.numel().saturating_sub(skip));
        let addr = ptr.offset(skip * t.dtype().size()).addr();
        Ok(Buf {
            ptr: addr as *mut c_void,
            count,
            dtype: nccl_dtype(t.dtype()),
        })
    }

    fn whole(&self, t: &Tensor<'_>) -> Result<Buf> {
        self.buf(t, 0, None)
    }

    fn op(&self, ops: &mut Vec<RedOp<'a>>, op: ReduceOp, dtype: DType) -> Result<usize> {
        ops.push(RedOp::new(self.nccl, self.comm, self.call, op, dtype)?);
        Ok(ops.len() - 1)
    }

    fn copy(&self, input: &Tensor<'_>, output: &Tensor<'_>) -> Result<Step> {
        let (_, src) = input.cuda_ptr()?;
        let (_, dst) = output.cuda_ptr()?;
        Ok(Step::Copy {
            dst,
            src,
            bytes: input.nbytes(),
        })
    }

    /// The plan of `collective`.
    pub(crate) fn plan(&self, collective: &Collective) -> Result<Plan<'a>> {
        let me = self.rank;
        let mut ops = Vec::new();
        let mut steps = Vec::new();
        match collective {
            Collective::AllReduce { tensor, op } => {
                let op = self.op(&mut ops, *op, tensor.dtype())?;
                steps.push(Step::AllReduce {
                    buf: self.whole(tensor)?,
                    op,
                });
            }
            Collective::AllReduceCoalesced { tensors, op } => {
                for t in tensors {
                    let op = self.op(&mut ops, *op, t.dtype())?;
                    steps.push(Step::AllReduce {
                        buf: self.whole(t)?,
                        op,
                    });
                }
            }
            Collective::Broadcast { tensor, root } => {
                let b = self.whole(tensor)?;
                steps.push(Step::Broadcast {
                    src: b,
                    dst: b,
                    root: *root,
                });
            }
            Collective::Reduce { tensor, root, op } => {
                let b = self.whole(tensor)?;
                let op = self.op(&mut ops, *op, tensor.dtype())?;
                steps.push(Step::Reduce {
                    src: b,
                    dst: b,
                    op,
                    root: *root,
                });
            }
            Collective::AllGather { outputs, input } => {
                let src = self.whole(input)?;
                for (r, out) in outputs.iter().enumerate() {
                    steps.push(Step::Broadcast {
                        src,
                        dst: self.whole(out)?,
                        root: r,
                    });
                }
            }
            Collective::AllGatherIntoTensor { output, input } => steps.push(Step::AllGather {
                src: self.whole(input)?,
                dst: self.whole(output)?,
            }),
            Collective::AllGatherCoalesced { outputs, inputs } => {
                // outputs[r][i]: input i of rank r.
                for (r, outs) in outputs.iter().enumerate() {
                    for (input, out) in inputs.iter().zip(outs) {
                        steps.push(Step::Broadcast {
                            src: self.whole(input)?,
                            dst: self.whole(out)?,
                            root: r,
                        });
                    }
                }
            }
            Collective::AllGatherIntoTensorCoalesced { outputs, inputs } => {
                for (input, output) in inputs.iter().zip(outputs) {
                    steps.push(Step::AllGather {
                        src: self.whole(input)?,
                        dst: self.whole(output)?,
                    });
                }
            }
            Collective::Gather {
                input,
                outputs,
                root,
            } => {
                if me == *root {
                    for (r, out) in outputs.iter().enumerate() {
                        steps.push(if r == me {
                            self.copy(input, out)?
                        } else {
                            Step::Recv {
                                buf: self.whole(out)?,
                                peer: r,
                            }
                        });
                    }
                } else {
                    steps.push(Step::Send {
                        buf: self.whole(input)?,
                        peer: *root,
                    });
                }
            }
            Collective::Scatter {
                output,
                inputs,
                root,
            } => {
                if me == *root {
                    for (r, input) in inputs.iter().enumerate() {
                        steps.push(if r == me {
                            self.copy(input, output)?
                        } else {
                            Step::Send {
                                buf: self.whole(input)?,
                                peer: r,
                            }
                        });
                    }
                } else {
                    steps.push(Step::Recv {
                        buf: self.whole(output)?,
                        peer: *root,
                    });
                }
            }
            Collective::ReduceScatter { output, inputs, op } => {
                let dst = self.whole(output)?;
                for (r, input) in inputs.iter().enumerate() {
                    let op = self.op(&mut ops, *op, input.dtype())?;
                    steps.push(Step::Reduce {
                        src: self.whole(input)?,
                        dst,
                        op,
                        root: r,
                    });
                }
            }
            Collective::ReduceScatterTensor { output, input, op } => {
                let op = self.op(&mut ops, *op, input.dtype())?;
                steps.push(Step::ReduceScatter {
                    src: self.whole(input)?,
                    dst: self.whole(output)?,
                    op,
                });
            }
            Collective::ReduceScatterTensorCoalesced {
                outputs,
                inputs,
                op,
            } => {
                for (input, output) in inputs.iter().zip(outputs) {
                    let op = self.op(&mut ops, *op, input.dtype())?;
                    steps.push(Step::ReduceScatter {
                        src: self.whole(input)?,
                        dst: self.whole(output)?,
                        op,
                    });
                }
            }
            Collective::AllToAll { outputs, inputs } => {
                for (r, (input, output)) in inputs.iter().zip(outputs).enumerate() {
                    steps.push(Step::Send {
                        buf: self.whole(input)?,
                        peer: r,
                    });
                    steps.push(Step::Recv {
                        buf: self.whole(output)?,
                        peer: r,
                    });
                }
            }
            Collective::AllToAllSingle {
                output,
                input,
                send_rows,
                recv_rows,
                ..
            } => {
                let row = |t: &Tensor<'_>| match t.shape().first() {
                    Some(&rows) if rows > 0 => t.numel() / rows,
                    _ => 0,
                };
                let (send_row, recv_row) = (row(input), row(output));
                let (mut sent, mut got) = (0, 0);
                for r in 0..send_rows.len() {
                    let (n_send, n_recv) = (send_rows[r] * send_row, recv_rows[r] * recv_row);
                    steps.push(Step::Send {
                        buf: self.buf(input, sent, Some(n_send))?,
                        peer: r,
                    });
                    steps.push(Step::Recv {
                        buf: self.buf(output, got, Some(n_recv))?,
                        peer: r,
                    });
                    sent += n_send;
                    got += n_recv;
                }
            }
            Collective::Barrier => {
                let op = self.op(&mut ops, ReduceOp::Sum, DType::F32)?;
                steps.push(Step::AllReduce {
                    buf: Buf {
                        ptr: self.barrier.addr() as *mut c_void,
                        count: 1,
                        dtype: nccl_dtype(DType::F32),
                    },
                    op,
                });
            }
            Collective::AllReduceSparse { .. } | Collective::MonitoredBarrier { .. } => {
                return Err(Error::InvalidCollective {
                    op: self.call.into(),
                    reason: "not supported by the NCCL backend".into(),
                })
            }
        }
        Ok(Plan { steps, ops })
    }
}
