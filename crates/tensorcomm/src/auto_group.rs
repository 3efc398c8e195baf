//! [`Backend::Auto`]'s group (c10d's default `cpu:gloo,cuda:nccl`): one
//! group over two backends, above both. Host tensors go to the CPU
//! backend and CUDA tensors to the NCCL backend, call by call; a call that
//! mixes host and CUDA tensors is refused. The NCCL half exists when every
//! rank can run it (agreed through the CPU half at creation); without it,
//! CUDA tensors get an error that says why.

use std::sync::Arc;
use std::time::Duration;

use crate::group::{Backend, ProcessGroup, ReduceOp, SparseWork, Work};
use crate::tensor::{DType, Device, SparseTensor, Tensor};
use crate::{Error, Result};

/// See the module docs.
pub struct AutoGroup {
    cpu: Arc<dyn ProcessGroup>,
    cuda: std::result::Result<Arc<dyn ProcessGroup>, String>,
}

impl std::fmt::Debug for AutoGroup {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AutoGroup")
            .field("rank", &self.cpu.rank())
            .field("size", &self.cpu.size())
            .field("cuda", &self.cuda.is_ok())
            .finish()
    }
}

impl AutoGroup {
    /// A group routing host tensors to `cpu` and CUDA tensors to `cuda`
    /// (or, when it is `Err`, refusing them with that reason). Both halves
    /// have the same ranks.
    pub fn new(
        cpu: Arc<dyn ProcessGroup>,
        cuda: std::result::Result<Arc<dyn ProcessGroup>, String>,
    ) -> Self {
        AutoGroup { cpu, cuda }
    }

    /// The half that runs CUDA tensors, if there is one.
    pub fn cuda_group(&self) -> Option<&Arc<dyn ProcessGroup>> {
        self.cuda.as_ref().ok()
    }

    /// The half that runs `op` on `tensors`: the CPU one for host tensors,
    /// the NCCL one for CUDA tensors.
    fn route<'a>(
        &self,
        op: &str,
        tensors: impl IntoIterator<Item = &'a Tensor<'static>>,
    ) -> Result<&dyn ProcessGroup> {
        let cuda = self.cuda.as_ref().map(|_| ()).map_err(String::as_str);
        match pick(op, tensors.into_iter().map(Tensor::device), cuda)? {
            Half::Cpu => Ok(&*self.cpu),
            Half::Cuda => Ok(&**self.cuda.as_ref().expect("pick checked the CUDA half")),
        }
    }
}

/// Which half of an [`AutoGroup`] runs a call.
#[derive(Debug, PartialEq, Eq)]
enum Half {
    Cpu,
    Cuda,
}

/// The half for a call of `op` on tensors on `devices`; `cuda` says
/// whether the CUDA half exists, or why not.
fn pick(
    op: &str,
    devices: impl Iterator<Item = Device>,
    cuda: std::result::Result<(), &str>,
) -> Result<Half> {
    let (mut host, mut gpu) = (false, false);
    for d in devices {
        match d {
            Device::Cpu => host = true,
            Device::Cuda(_) => gpu = true,
        }
    }
    match (host, gpu, cuda) {
        (true, true, _) => Err(Error::InvalidCollective {
            op: op.into(),
            reason: "expected tensors on one kind of device (all host or all CUDA), found both"
                .into(),
        }),
        (false, true, Err(why)) => Err(Error::InvalidCollective {
            op: op.into(),
            reason: format!(
                "CUDA tensors need this group's NCCL half, which was not created: {why}"
            ),
        }),
        (false, true, Ok(())) => Ok(Half::Cuda),
        _ => Ok(Half::Cpu),
    }
}

impl ProcessGroup for AutoGroup {
    fn rank(&self) -> usize {
        self.cpu.rank()
    }

    fn size(&self) -> usize {
        self.cpu.size()
    }

    fn backend(&self) -> Backend {
        Backend::Auto
    }

    fn global_ranks(&self) -> Vec<usize> {
        self.cpu.global_ranks()
    }

    fn all_reduce(
        &self,
        tensor: &Tensor<'static>,
        op: ReduceOp,
        timeout: Option<Duration>,
    ) -> Result<Work> {
        self.route("all_reduce", [tensor])?
            .all_reduce(tensor, op, timeout)
    }

    fn broadcast(
        &self,
        tensor: &Tensor<'static>,
        root: usize,
        timeout: Option<Duration>,
    ) -> Result<Work> {
        self.route("broadcast", [tensor])?
            .broadcast(tensor, root, timeout)
    }

    fn reduce(
        &self,
        tensor: &Tensor<'static>,
        root: usize,
        op: ReduceOp,
        timeout: Option<Duration>,
    ) -> Result<Work> {
        self.route("reduce", [tensor])?
            .reduce(tensor, root, op, timeout)
    }

    fn all_gather(
        &self,
        outputs: &[Tensor<'static>],
        input: &Tensor<'static>,
        timeout: Option<Duration>,
    ) -> Result<Work> {
        self.route("all_gather", outputs.iter().chain([input]))?
            .all_gather(outputs, input, timeout)
    }

    fn all_gather_into_tensor(
        &self,
        output: &Tensor<'static>,
        input: &Tensor<'static>,
        timeout: Option<Duration>,
    ) -> Result<Work> {
        self.route("all_gather_into_tensor", [output, input])?
            .all_gather_into_tensor(output, input, timeout)
    }

    fn all_gather_coalesced(
        &self,
        outputs: &[Vec<Tensor<'static>>],
        inputs: &[Tensor<'static>],
        timeout: Option<Duration>,
    ) -> Result<Work> {
        self.route(
            "all_gather_coalesced",
            outputs.iter().flatten().chain(inputs),
        )?
        .all_gather_coalesced(outputs, inputs, timeout)
    }

    fn all_gather_into_tensor_coalesced(
        &self,
        outputs: &[Tensor<'static>],
        inputs: &[Tensor<'static>],
        timeout: Option<Duration>,
    ) -> Result<Work> {
        self.route(
            "all_gather_into_tensor_coalesced",
            outputs.iter().chain(inputs),
        )?
        .all_gather_into_tensor_coalesced(outputs, inputs, timeout)
    }

    fn gather(
        &self,
        input: &Tensor<'static>,
        outputs: Option<&[Tensor<'static>]>,
        root: usize,
        timeout: Option<Duration>,
    ) -> Result<Work> {
        self.route("gather", outputs.unwrap_or(&[]).iter().chain([input]))?
            .gather(input, outputs, root, timeout)
    }

    fn scatter(
        &self,
        output: &Tensor<'static>,
        inputs: Option<&[Tensor<'static>]>,
        root: usize,
        timeout: Option<Duration>,
    ) -> Result<Work> {
        self.route("scatter", inputs.unwrap_or(&[]).iter().chain([output]))?
            .scatter(output, inputs, root, timeout)
    }

    fn reduce_scatter(
        &self,
        output: &Tensor<'static>,
        inputs: &[Tensor<'static>],
        op: ReduceOp,
        timeout: Option<Duration>,
    ) -> Result<Work> {
        self.route("reduce_scatter", inputs.iter().chain([output]))?
            .reduce_scatter(output, inputs, op, timeout)
    }

    fn reduce_scatter_tensor(
        &self,
        output: &Tensor<'static>,
        input: &Tensor<'static>,
        op: ReduceOp,
        timeout: Option<Duration>,
    ) -> Result<Work> {
        self.route("reduce_scatter_tensor", [output, input])?
            .reduce_scatter_tensor(output, input, op, timeout)
    }

    fn reduce_scatter_tensor_coalesced(
        &self,
        outputs: &[Tensor<'static>],
        inputs: &[Tensor<'static>],
        op: ReduceOp,
        timeout: Option<Duration>,
    ) -> Result<Work> {
        self.route(
            "reduce_scatter_tensor_coalesced",
            outputs.iter().chain(inputs),
        )?
        .reduce_scatter_tensor_coalesced(outputs, inputs, op, timeout)
    }

    fn all_to_all(
        &self,
        outputs: &[Tensor<'static>],
        inputs: &[Tensor<'static>],
        timeout: Option<Duration>,
    ) -> Result<Work> {
        self.route("all_to_all", outputs.iter().chain(inputs))?
            .all_to_all(outputs, inputs, timeout)
    }

    fn all_to_all_single(
        &self,
        output: &Tensor<'static>,
        input: &Tensor<'static>,
        output_split_sizes: &[usize],
        input_split_sizes: &[usize],
        timeout: Option<Duration>,
    ) -> Result<Work> {
        self.route("all_to_all_single", [output, input])?
            .all_to_all_single(
                output,
                input,
                output_split_sizes,
                input_split_sizes,
                timeout,
            )
    }

    fn all_reduce_coalesced(
        &self,
        tensors: &[Tensor<'static>],
        op: ReduceOp,
        timeout: Option<Duration>,
    ) -> Result<Work> {
        self.route("all_reduce_coalesced", tensors)?
            .all_reduce_coalesced(tensors, op, timeout)
    }

    /// The CPU half's barrier.
    fn barrier(&self, timeout: Option<Duration>) -> Result<Work> {
        self.cpu.barrier(timeout)
    }

    fn send(
        &self,
        tensor: &Tensor<'static>,
        dst: usize,
        tag: u64,
        timeout: Option<Duration>,
    ) -> Result<Work> {
        self.route("send", [tensor])?
            .send(tensor, dst, tag, timeout)
    }

    fn recv(
        &self,
        tensor: &Tensor<'static>,
        src: usize,
        tag: u64,
        timeout: Option<Duration>,
    ) -> Result<Work> {
        self.route("recv", [tensor])?
            .recv(tensor, src, tag, timeout)
    }

    fn recv_any_source(
        &self,
        tensor: &Tensor<'static>,
        tag: u64,
        timeout: Option<Duration>,
    ) -> Result<Work> {
        self.route("recv_any_source", [tensor])?
            .recv_any_source(tensor, tag, timeout)
    }

    fn monitored_barrier(&self, timeout: Option<Duration>, wait_all: bool) -> Result<Work> {
        self.cpu.monitored_barrier(timeout, wait_all)
    }

    /// Sub-groups of both halves, as one group of the same kind.
    fn new_group(&self, ranks: &[usize]) -> Result<Option<Arc<dyn ProcessGroup>>> {
        let cpu = self.cpu.new_group(ranks)?;
        let cuda = match &self.cuda {
            Ok(pg) => pg.new_group(ranks)?.ok_or_else(String::new),
            Err(why) => Err(why.clone()),
        };
        Ok(cpu.map(|cpu| Arc::new(AutoGroup::new(cpu, cuda)) as Arc<dyn ProcessGroup>))
    }

    fn all_reduce_sparse(
        &self,
        tensor: &SparseTensor,
        op: ReduceOp,
        timeout: Option<Duration>,
    ) -> Result<SparseWork> {
        self.cpu.all_reduce_sparse(tensor, op, timeout)
    }

    fn symmetric_zeros(&self, shape: &[usize], dtype: DType) -> Result<Tensor<'static>> {
        self.cpu.symmetric_zeros(shape, dtype)
    }

    /// Both halves' records: `{"cpu": ..., "cuda": ...}`.
    fn flight_recorder_json(&self) -> String {
        let cuda = self
            .cuda
            .as_ref()
            .map_or_else(|_| "null".to_string(), |pg| pg.flight_recorder_json());
        format!(
            "{{\"cpu\":{},\"cuda\":{cuda}}}",
            self.cpu.flight_recorder_json()
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpu::backend::{CpuOptions, ProcessGroupCpu};
    use crate::store::HashStore;

    fn one_rank(cuda: std::result::Result<Arc<dyn ProcessGroup>, String>) -> AutoGroup {
        let cpu = ProcessGroupCpu::new(
            Arc::new(HashStore::new()),
            "pg",
            0,
            1,
            &CpuOptions::default(),
        )
        .unwrap();
        AutoGroup::new(Arc::new(cpu), cuda)
    }

    #[test]
    fn host_tensors_run_on_the_cpu_half() {
        let pg = one_rank(Err("no GPU here".into()));
        assert_eq!(pg.backend(), Backend::Auto);
        let t = Tensor::from_vec(vec![1.5f32, 2.0], &[2]).unwrap();
        pg.all_reduce(&t, ReduceOp::PremulSum(2.0), None)
            .unwrap()
            .wait()
            .unwrap();
        assert_eq!(t.to_vec::<f32>().unwrap(), [3.0, 4.0]);
        pg.barrier(None).unwrap().wait().unwrap();
        assert!(pg.flight_recorder_json().starts_with("{\"cpu\":{"));
    }

    #[test]
    fn init_builds_an_auto_group_whose_host_half_always_works() {
        let pg = crate::init_process_group(
            "cpu:gloo,cuda:nccl".parse().unwrap(),
            "tcp://127.0.0.1:0?rank=0&world_size=1",
        )
        .unwrap();
        assert_eq!(pg.backend(), Backend::Auto);
        let t = Tensor::from_vec(vec![4i64, 5], &[2]).unwrap();
        pg.all_reduce(&t, ReduceOp::Max, None)
            .unwrap()
            .wait()
            .unwrap();
        assert_eq!(t.to_vec::<i64>().unwrap(), [4, 5]);
    }

    #[test]
    fn calls_go_to_the_half_of_their_tensors_devices() {
        let (cpu, gpu) = (Device::Cpu, Device::Cuda(0));
        assert_eq!(
            pick("x", [cpu, cpu].into_iter(), Ok(())).unwrap(),
            Half::Cpu
        );
        assert_eq!(
            pick("x", [gpu, gpu].into_iter(), Ok(())).unwrap(),
            Half::Cuda
        );
        assert_eq!(
            pick("barrier", std::iter::empty(), Err("-")).unwrap(),
            Half::Cpu
        );
        let e = pick("all_gather", [cpu, gpu].into_iter(), Ok(())).unwrap_err();
        assert!(
            e.to_string().contains("all_gather") && e.to_string().contains("found both"),
            "{e}"
        );
        let why = "NCCL is not available (libnccl.so.2): not found";
        let e = pick("all_reduce", [gpu].into_iter(), Err(why)).unwrap_err();
        assert!(e.to_string().contains("libnccl.so.2"), "{e}");
    }
}
