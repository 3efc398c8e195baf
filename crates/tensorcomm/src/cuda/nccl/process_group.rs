//! The NCCL process group: CUDA tensors on one GPU per rank, collectives
//! through NCCL, run by the group engine (validation, sequence numbers,
//! call order, the watchdog, failure reports, the flight recorder).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use super::communicator::Communicator;
use super::group_backend::NcclBackend;
use super::p2p::{self, Direction};
use super::types::check_reduce_op;
use crate::cuda::intranode::{IntraNodeComm, IntraNodeOptions};
use crate::cuda::runtime;
use crate::group::collective::{Capabilities, Collective, Scope, Validated};
use crate::group::engine::Engine;
use crate::group::validate::{check_dense, check_peer_rank};
use crate::group::{check_group_ranks, subgroup_prefix, FlightRecorder, SparseWork};
use crate::group::{Backend, ProcessGroup, ReduceOp, Work, DEFAULT_COLLECTIVE_TIMEOUT};
use crate::store::{PrefixStore, Store};
use crate::tensor::{Device, SparseTensor, Tensor};
use crate::{Error, Result};

/// How a [`ProcessGroupNccl`] is set up.
#[derive(Clone, Debug)]
pub struct NcclOptions {
    /// Default per-collective timeout (also bounds communicator set-up).
    pub timeout: Duration,
    /// The GPU of this rank; `None`: `LOCAL_RANK` modulo the GPU count,
    /// else the rank modulo the GPU count (c10d's choice).
    pub device: Option<usize>,
}

impl Default for NcclOptions {
    fn default() -> Self {
        NcclOptions {
            timeout: DEFAULT_COLLECTIVE_TIMEOUT,
            device: None,
        }
    }
}

/// The NCCL backend's [`ProcessGroup`] (see the module docs).
///
/// ```no_run
/// use std::sync::Arc;
/// use tensorcomm::cuda::nccl::{NcclOptions, ProcessGroupNccl};
/// use tensorcomm::group::{ProcessGroup, ReduceOp};
/// use tensorcomm::store::HashStore;
/// use tensorcomm::tensor::{DType, Device, Tensor};
///
/// let pg = ProcessGroupNccl::new(Arc::new(HashStore::new()), "pg", 0, 1, &NcclOptions::default())?;
/// let t = Tensor::zeros_on(&[1024], DType::F32, Device::Cuda(pg.device()))?;
/// pg.all_reduce(&t, ReduceOp::Sum, None)?.synchronize()?;
/// # Ok::<(), tensorcomm::Error>(())
/// ```
pub struct ProcessGroupNccl {
    _store: Arc<dyn Store>,
    scope: Scope,
    engine: Engine,
    backend: Arc<NcclBackend>,
    global_ranks: Vec<usize>,
    options: NcclOptions,
    /// This group's keys in `_store` (sub-groups' keys go under it).
    key_prefix: String,
    subgroups: AtomicU64,
}

impl std::fmt::Debug for ProcessGroupNccl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProcessGroupNccl")
            .field("rank", &self.scope.rank)
            .field("size", &self.scope.size)
            .field("device", &self.backend.comm.device)
            .finish_non_exhaustive()
    }
}

/// Sets up the group's peer-memory all-reduce (every rank calls this at
/// the same point of group creation), or says why it is not used.
fn peer_memory(
    store: &dyn Store,
    key_prefix: &str,
    comm: &Communicator,
    options: &NcclOptions,
) -> std::result::Result<IntraNodeComm, String> {
    if comm.size < 2 {
        return Err(format!(
            "a group of {}: nothing to reduce across",
            comm.size
        ));
    }
    let peer_options = IntraNodeOptions {
        timeout: options.timeout,
        // The group's watchdog aborts a stalled call; the kernel waits.
        kernel_timeout: None,
        ..IntraNodeOptions::default()
    };
    IntraNodeComm::new(
        store,
        key_prefix,
        comm.rank,
        comm.size,
        comm.device,
        &peer_options,
    )
    .map_err(|e| {
        let reason = match e {
            Error::IntraNodeUnavailable { reason } => reason,
            other => other.to_string(),
        };
        tracing::info!(rank = comm.rank, %reason, "NCCL group: peer-memory all-reduce not used");
        reason
    })
}

/// The GPU c10d would give this rank.
fn default_device(rank: usize) -> Result<usize> {
    let count = runtime::device_count()?;
    if count == 0 {
        return Err(Error::NoCuda {
            reason: "the NCCL backend needs a GPU and this machine has none".into(),
        });
    }
    let local = std::env::var("LOCAL_RANK")
        .ok()
        .and_then(|v| v.trim().parse::<usize>().ok());
    Ok(local.unwrap_or(rank) % count)
}

impl ProcessGroupNccl {
    /// Creates rank `rank` of `size`, meeting the others through `store`
    /// under keys starting with `key_prefix`: rank 0 creates NCCL's unique
    /// id and posts it there, and every rank's communicator must be ready
    /// within `options.timeout` ([`Error::NcclInitTimeout`] otherwise).
    pub fn new(
        store: Arc<dyn Store>,
        key_prefix: &str,
        rank: usize,
        size: usize,
        options: &NcclOptions,
    ) -> Result<Self> {
        // Every store call of the set-up is bounded by its timeout, so a
        // store host stopped meanwhile fails it in time, naming the host
        // (see `store/tcp/reply_grace.rs`).
        let _set_up = crate::store::tcp::reply_grace::set_up_on_this_thread(options.timeout);
        let device = match options.device {
            Some(d) => d,
            None => default_device(rank)?,
        };
        let comm = Communicator::init(
            &*store,
            &format!("{key_prefix}/nccl"),
            (rank, size),
            device,
            options.timeout,
        )?;
        Self::over(store, key_prefix, comm, (0..size).collect(), options)
    }

    fn over(
        store: Arc<dyn Store>,
        key_prefix: &str,
        comm: Communicator,
        global_ranks: Vec<usize>,
        options: &NcclOptions,
    ) -> Result<Self> {
        let (rank, size) = (comm.rank, comm.size);
        let recorder = FlightRecorder::from_env(rank, size, key_prefix)?;
        let intranode = peer_memory(&*store, key_prefix, &comm, options);
        let backend = Arc::new(NcclBackend::new(comm, intranode)?);
        let engine = Engine::start(
            backend.clone(),
            store.clone(),
            key_prefix,
            (rank, size),
            recorder,
            options.timeout,
        )?;
        Ok(ProcessGroupNccl {
            _store: store,
            scope: Scope {
                rank,
                size,
                caps: Capabilities {
                    host: false,
                    cuda: true,
                },
            },
            engine,
            backend,
            global_ranks,
            options: options.clone(),
            key_prefix: key_prefix.into(),
            subgroups: AtomicU64::new(0),
        })
    }

    /// The group's peer-memory all-reduce, when its ranks qualify (see
    /// [`cuda::intranode`](crate::cuda::intranode)): eligible all_reduce
    /// calls on CUDA tensors run there instead of in NCCL.
    pub fn intranode(&self) -> Option<&IntraNodeComm> {
        self.backend.intranode.as_ref()
    }

    /// Why [`intranode`](ProcessGroupNccl::intranode) is `None` (empty
    /// when it is not).
    pub fn intranode_reason(&self) -> &str {
        &self.backend.intranode_reason
    }

    /// The GPU this rank's collectives run on.
    pub fn device(&self) -> usize {
        self.backend.comm.device
    }

    /// The NCCL version in use, e.g. `2.28.9`.
    pub fn nccl_version(&self) -> String {
        self.backend.comm.nccl.version_string()
    }

    /// The group's communication stream: collectives run on it, after the
    /// work queued before the call on the caller's current stream.
    pub fn stream(&self) -> &runtime::Stream {
        &self.backend.stream
    }

    /// Refuses tensors on another GPU than the group's, then queues the
    /// call.
    fn submit(&self, call: Validated, timeout: Option<Duration>) -> Result<Work> {
        let device = Device::Cuda(self.device());
        let op = call.fingerprint.kind.name();
        for t in call.collective.tensors() {
            if t.device() != device {
                return Err(Error::InvalidCollective {
                    op: op.into(),
                    reason: format!(
                        "expected tensors on {device} (this group's GPU), found one on {}",
                        t.device()
                    ),
                });
            }
            if !t.is_contiguous() {
                return Err(Error::InvalidCollective {
                    op: op.into(),
                    reason: format!(
                        "expected contiguous tensors (the NCCL backend sends elements in memory order), found shape {:?} with strides {:?}; pass a contiguous copy",
                        t.shape(),
                        t.strides()
                    ),
                });
            }
        }
        self.engine.submit(call, timeout)
    }

    /// `op`, unless NCCL lacks it.
    fn reduce_op(&self, call: &str, op: ReduceOp) -> Result<ReduceOp> {
        check_reduce_op(call, op).map(|()| op)
    }

    fn unsupported(op: &str, instead: &str) -> Error {
        Error::InvalidCollective {
            op: op.into(),
            reason: format!("not supported by the NCCL backend; {instead}"),
        }
    }

    /// A sub-group of `ranks` (sorted), split from this group's
    /// communicator with `ncclCommSplit`; `None` on ranks not in it. Every
    /// rank of this group calls it for every sub-group, in the same order.
    pub fn new_subgroup(&self, ranks: &[usize]) -> Result<Option<ProcessGroupNccl>> {
        let members = check_group_ranks(ranks, self.size())?;
        let _set_up = crate::store::tcp::reply_grace::set_up_on_this_thread(self.options.timeout);
        let n = self.subgroups.fetch_add(1, Ordering::Relaxed);
        let position = members.iter().position(|&r| r == self.rank());
        let color = position.map(|_| 0);
        let comm = {
            let _launch = self
                .backend
                .launch
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            self.backend
                .comm
                .split(color, position.unwrap_or(0), self.options.timeout)?
        };
        let Some(comm) = comm else {
            return Ok(None);
        };
        let store: Arc<dyn Store> = Arc::new(PrefixStore::new(
            subgroup_prefix(&self.key_prefix, n),
            self._store.clone(),
        ));
        let global_ranks = members.iter().map(|&r| self.global_ranks[r]).collect();
        Self::over(store, "pg", comm, global_ranks, &self.options).map(Some)
    }
}

impl Drop for ProcessGroupNccl {
    /// Waits until the device is done with the collectives queued so far
    /// (the engine, dropped next, lets go of their tensors); a collective
    /// that never finishes is failed by the watchdog at its deadline, which
    /// aborts the communicator and so ends this wait.
    fn drop(&mut self) {
        let Ok(done) = self.backend.stream.record() else {
            return;
        };
        loop {
            match done.query() {
                Ok(false) if !self.backend.comm.is_aborted() => {
                    std::thread::sleep(Duration::from_micros(100));
                }
                _ => break,
            }
        }
        let _ = done.synchronize();
    }
}

impl ProcessGroup for ProcessGroupNccl {
    fn rank(&self) -> usize {
        self.scope.rank
    }

    fn size(&self) -> usize {
        self.scope.size
    }

    fn backend(&self) -> Backend {
        Backend::Nccl
    }

    fn global_ranks(&self) -> Vec<usize> {
        self.global_ranks.clone()
    }

    fn all_reduce(
        &self,
        tensor: &Tensor<'static>,
        op: ReduceOp,
        timeout: Option<Duration>,
    ) -> Result<Work> {
        let op = self.reduce_op("all_reduce", op)?;
        self.submit(Collective::all_reduce(&self.scope, tensor, op)?, timeout)
    }

    fn broadcast(
        &self,
        tensor: &Tensor<'static>,
        root: usize,
        timeout: Option<Duration>,
    ) -> Result<Work> {
        self.submit(Collective::broadcast(&self.scope, tensor, root)?, timeout)
    }

    fn reduce(
        &self,
        tensor: &Tensor<'static>,
        root: usize,
        op: ReduceOp,
        timeout: Option<Duration>,
    ) -> Result<Work> {
        let op = self.reduce_op("reduce", op)?;
        self.submit(Collective::reduce(&self.scope, tensor, root, op)?, timeout)
    }

    fn all_gather(
        &self,
        outputs: &[Tensor<'static>],
        input: &Tensor<'static>,
        timeout: Option<Duration>,
    ) -> Result<Work> {
        self.submit(
            Collective::all_gather(&self.scope, outputs, input)?,
            timeout,
        )
    }

    fn all_gather_into_tensor(
        &self,
        output: &Tensor<'static>,
        input: &Tensor<'static>,
        timeout: Option<Duration>,
    ) -> Result<Work> {
        let call = Collective::all_gather_into_tensor(&self.scope, output, input)?;
        self.submit(call, timeout)
    }

    fn all_gather_coalesced(
        &self,
        outputs: &[Vec<Tensor<'static>>],
        inputs: &[Tensor<'static>],
        timeout: Option<Duration>,
    ) -> Result<Work> {
        let call = Collective::all_gather_coalesced(&self.scope, outputs, inputs)?;
        self.submit(call, timeout)
    }

    fn all_gather_into_tensor_coalesced(
        &self,
        outputs: &[Tensor<'static>],
        inputs: &[Tensor<'static>],
        timeout: Option<Duration>,
    ) -> Result<Work> {
        let call = Collective::all_gather_into_tensor_coalesced(&self.scope, outputs, inputs)?;
        self.submit(call, timeout)
    }

    fn gather(
        &self,
        input: &Tensor<'static>,
        outputs: Option<&[Tensor<'static>]>,
        root: usize,
        timeout: Option<Duration>,
    ) -> Result<Work> {
        self.submit(
            Collective::gather(&self.scope, input, outputs, root)?,
            timeout,
        )
    }

    fn scatter(
        &self,
        output: &Tensor<'static>,
        inputs: Option<&[Tensor<'static>]>,
        root: usize,
        timeout: Option<Duration>,
    ) -> Result<Work> {
        self.submit(
            Collective::scatter(&self.scope, output, inputs, root)?,
            timeout,
        )
    }

    fn reduce_scatter(
        &self,
        output: &Tensor<'static>,
        inputs: &[Tensor<'static>],
        op: ReduceOp,
        timeout: Option<Duration>,
    ) -> Result<Work> {
        let op = self.reduce_op("reduce_scatter", op)?;
        let call = Collective::reduce_scatter(&self.scope, output, inputs, op)?;
        self.submit(call, timeout)
    }

    fn reduce_scatter_tensor(
        &self,
        output: &Tensor<'static>,
        input: &Tensor<'static>,
        op: ReduceOp,
        timeout: Option<Duration>,
    ) -> Result<Work> {
        let op = self.reduce_op("reduce_scatter_tensor", op)?;
        let call = Collective::reduce_scatter_tensor(&self.scope, output, input, op)?;
        self.submit(call, timeout)
    }

    fn reduce_scatter_tensor_coalesced(
        &self,
        outputs: &[Tensor<'static>],
        inputs: &[Tensor<'static>],
        op: ReduceOp,
        timeout: Option<Duration>,
    ) -> Result<Work> {
        let op = self.reduce_op("reduce_scatter_tensor_coalesced", op)?;
        let call = Collective::reduce_scatter_tensor_coalesced(&self.scope, outputs, inputs, op)?;
        self.submit(call, timeout)
    }

    fn all_to_all(
        &self,
        outputs: &[Tensor<'static>],
        inputs: &[Tensor<'static>],
        timeout: Option<Duration>,
    ) -> Result<Work> {
        self.submit(
            Collective::all_to_all(&self.scope, outputs, inputs)?,
            timeout,
        )
    }

    fn all_to_all_single(
        &self,
        output: &Tensor<'static>,
        input: &Tensor<'static>,
        output_split_sizes: &[usize],
        input_split_sizes: &[usize],
        timeout: Option<Duration>,
    ) -> Result<Work> {
        let call = Collective::all_to_all_single(
            &self.scope,
            output,
            input,
            output_split_sizes,
            input_split_sizes,
        )?;
        self.submit(call, timeout)
    }

    fn all_reduce_coalesced(
        &self,
        tensors: &[Tensor<'static>],
        op: ReduceOp,
        timeout: Option<Duration>,
    ) -> Result<Work> {
        let op = self.reduce_op("all_reduce_coalesced", op)?;
        let call = Collective::all_reduce_coalesced(&self.scope, tensors, op)?;
        self.submit(call, timeout)
    }

    /// c10d's NCCL barrier: an all-reduce of one element that the host
    /// waits for; the returned `Work` is already complete.
    fn barrier(&self, timeout: Option<Duration>) -> Result<Work> {
        let work = self.engine.submit(Collective::barrier(), timeout)?;
        Ok(Work::done(work.synchronize()))
    }

    fn send(
        &self,
        tensor: &Tensor<'static>,
        dst: usize,
        _tag: u64,
        timeout: Option<Duration>,
    ) -> Result<Work> {
        check_dense("send", tensor, self.scope.caps)?;
        check_peer_rank("send", dst, self.rank(), self.size())?;
        let timeout = timeout.unwrap_or(self.engine.default_timeout());
        p2p::transfer(&self.backend, Direction::Send, tensor, dst, timeout)
    }

    fn recv(
        &self,
        tensor: &Tensor<'static>,
        src: usize,
        _tag: u64,
        timeout: Option<Duration>,
    ) -> Result<Work> {
        check_dense("recv", tensor, self.scope.caps)?;
        check_peer_rank("recv", src, self.rank(), self.size())?;
        let timeout = timeout.unwrap_or(self.engine.default_timeout());
        p2p::transfer(&self.backend, Direction::Recv, tensor, src, timeout)
    }

    fn recv_any_source(
        &self,
        _tensor: &Tensor<'static>,
        _tag: u64,
        _timeout: Option<Duration>,
    ) -> Result<Work> {
        Err(Self::unsupported(
            "recv_any_source",
            "NCCL receives only from a named rank (c10d's NCCL backend refuses it too)",
        ))
    }

    fn monitored_barrier(&self, _timeout: Option<Duration>, _wait_all: bool) -> Result<Work> {
        Err(Self::unsupported(
            "monitored_barrier",
            "use it on a CPU group, as c10d does with Gloo",
        ))
    }

    fn new_group(&self, ranks: &[usize]) -> Result<Option<Arc<dyn ProcessGroup>>> {
        let group = self.new_subgroup(ranks)?;
        Ok(group.map(|g| Arc::new(g) as Arc<dyn ProcessGroup>))
    }

    fn all_reduce_sparse(
        &self,
        _tensor: &SparseTensor,
        _op: ReduceOp,
        _timeout: Option<Duration>,
    ) -> Result<SparseWork> {
        Err(Self::unsupported(
            "all_reduce_sparse",
            "sparse all-reduce runs on a CPU group (CUDA tensors through the CPU group)",
        ))
    }

    fn flight_recorder_json(&self) -> String {
        self.engine.flight_recorder_json()
    }
}
