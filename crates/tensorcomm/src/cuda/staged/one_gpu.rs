//! Which GPU a call's CUDA tensors are on: staging runs each call's copies
//! on one GPU's stream, so a call may mix host tensors and CUDA tensors of
//! one GPU, not tensors of several GPUs.

use crate::group::collective::Collective;
use crate::tensor::Device;
use crate::{Error, Result};

/// The GPU of the CUDA tensors among `devices`, `None` if all are host
/// tensors; an error naming `op` if they are on several GPUs.
pub(crate) fn one_gpu(
    op: &str,
    devices: impl IntoIterator<Item = Device>,
) -> Result<Option<usize>> {
    let mut found = None;
    for device in devices {
        let Device::Cuda(ordinal) = device else {
            continue;
        };
        match found {
            None => found = Some(ordinal),
            Some(first) if first != ordinal => {
                return Err(Error::InvalidCollective {
                    op: op.into(),
                    reason: format!(
                        "expected the CUDA tensors of one call on one GPU (the CPU backend stages \
                         them through one stream), found tensors on cuda:{first} and cuda:{ordinal}"
                    ),
                })
            }
            Some(_) => {}
        }
    }
    Ok(found)
}

/// The GPU of `collective`'s CUDA tensors (see [`one_gpu`]).
pub(crate) fn gpu_of(op: &str, collective: &Collective) -> Result<Option<usize>> {
    let sparse = match collective {
        Collective::AllReduceSparse { tensor, .. } => Some(tensor.device()),
        _ => None,
    };
    one_gpu(op, collective.tensors().map(|t| t.device()).chain(sparse))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_tensors_need_no_gpu_and_one_gpu_is_found() {
        assert_eq!(one_gpu("x", [Device::Cpu, Device::Cpu]).unwrap(), None);
        assert_eq!(one_gpu("x", []).unwrap(), None);
        let mixed = [Device::Cpu, Device::Cuda(1), Device::Cpu, Device::Cuda(1)];
        assert_eq!(one_gpu("x", mixed).unwrap(), Some(1));
    }

    #[test]
    fn tensors_on_two_gpus_are_refused_naming_both() {
        let err = one_gpu(
            "all_gather",
            [Device::Cuda(0), Device::Cpu, Device::Cuda(2)],
        )
        .unwrap_err();
        let text = err.to_string();
        assert!(matches!(err, Error::InvalidCollective { .. }), "{text}");
        assert!(
            text.contains("all_gather") && text.contains("cuda:0") && text.contains("cuda:2"),
            "{text}"
        );
    }

    #[test]
    fn collectives_of_host_tensors_are_not_staged() {
        use crate::group::collective::{Capabilities, Scope};
        use crate::group::ReduceOp;
        use crate::tensor::{SparseTensor, Tensor};
        let scope = Scope {
            rank: 0,
            size: 1,
            caps: Capabilities::HOST,
        };
        let t = Tensor::from_vec(vec![1.0f32; 4], &[4]).unwrap();
        let call = Collective::all_reduce(&scope, &t, ReduceOp::Sum).unwrap();
        assert_eq!(gpu_of("all_reduce", &call.collective).unwrap(), None);
        let s =
            SparseTensor::new(vec![0], Tensor::from_vec(vec![1i32], &[1]).unwrap(), &[2]).unwrap();
        let call =
            Collective::all_reduce_sparse(&scope, &s, ReduceOp::Sum, Default::default()).unwrap();
        assert_eq!(gpu_of("all_reduce_sparse", &call.collective).unwrap(), None);
    }
}
