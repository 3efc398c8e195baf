//! Backend-agnostic process groups: the [`ProcessGroup`] trait, [`Work`]
//! handles, [`ReduceOp`], and [`init_process_group`].
//!
//! Every collective checks its arguments on the calling rank first (a
//! typed error, nothing sent, the group still usable), then takes the next
//! sequence number and returns a [`Work`]. Each collective carries a small
//! fingerprint (op, reduce op, dtype, element count, shape and strides
//! hash, root, sequence number) in front of the first message to each
//! peer; a receiver whose own fingerprint differs fails with
//! [`Error::CollectiveMismatch`] naming
//! both. A failed collective (a peer closed its connection, timed out, or
//! mismatched) fails with
//! [`Error::CollectiveFailed`] naming the op,
//! the sequence number and the peer ranks involved. Before closing its
//! connections (so that every other rank fails promptly too) the failing
//! rank posts the root cause to the group's store, first report of a
//! sequence number kept; a rank that then fails only because a peer gave
//! up and closed reports that root cause instead (a mismatch with both
//! fingerprints, or the rank that died or did not arrive), so every rank
//! names the same cause. Later calls fail with
//! [`Error::GroupBroken`].
//!
//! ```
//! use tensorcomm::{init_process_group, Backend, ReduceOp};
//! use tensorcomm::tensor::Tensor;
//!
//! let pg = init_process_group(Backend::Cpu, "tcp://127.0.0.1:0?rank=0&world_size=1")?;
//! let grads = Tensor::from_vec(vec![2.0f32; 4], &[4])?;
//! pg.all_reduce(&grads, ReduceOp::Avg, None)?.wait()?;
//! pg.broadcast(&grads, 0, None)?.wait()?;
//! pg.barrier(None)?.wait()?;
//! assert_eq!(grads.to_vec::<f32>()?, [2.0; 4]);
//! # Ok::<(), tensorcomm::Error>(())
//! ```

mod absent_ranks;
pub(crate) mod backend;
pub(crate) mod call_description;
mod caller_runs;
#[cfg(test)]
mod caller_runs_tests;
pub(crate) mod collective;
#[cfg(test)]
mod device_engine_tests;
pub(crate) mod engine;
mod failure_hooks;
pub(crate) mod failure_report;
pub(crate) mod fingerprint;
mod flight_recorder;
#[cfg(test)]
mod host_engine_tests;
mod idle_poll;
mod mismatch_sides;
mod new_group;
#[cfg(test)]
mod one_rank_engine;
mod progress;
mod reduce_op;
mod sparse_work;
mod stall_check;
mod store_worker;
// Used by the staging of CUDA tensors only.
#[cfg(feature = "cuda")]
pub(crate) mod tensor_roles;
pub(crate) mod turn;
pub(crate) mod validate;
mod watchdog;
mod work;

use std::sync::Arc;
use std::time::Duration;

pub use caller_runs::run_here;
pub use reduce_op::ReduceOp;
pub use work::{DeviceEvent, Work, WorkFuture};

pub(crate) use flight_recorder::FlightRecorder;
pub use flight_recorder::{
    DEFAULT_FLIGHT_RECORDER_SIZE, FLIGHT_RECORDER_DIR_ENV, FLIGHT_RECORDER_SIZE_ENV,
};
pub(crate) use new_group::{check_group_ranks, subgroup_prefix};
pub(crate) use sparse_work::SparseSlot;
pub use sparse_work::SparseWork;

use crate::tensor::{DType, SparseTensor, Tensor};
use crate::{Error, Result};

/// How long a collective may take unless the call says otherwise (c10d's
/// default).
pub const DEFAULT_COLLECTIVE_TIMEOUT: Duration = Duration::from_secs(30 * 60);

/// Which implementation runs the collectives.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backend {
    /// The CPU backend: host tensors over shared memory and TCP (c10d's
    /// `gloo`).
    Cpu,
    /// The NCCL backend: CUDA tensors, one GPU per rank (c10d's `nccl`).
    Nccl,
    /// Both, call by call: host tensors on the CPU backend, CUDA tensors
    /// on NCCL (c10d's default, `cpu:gloo,cuda:nccl`; see
    /// [`AutoGroup`](crate::auto_group::AutoGroup)).
    Auto,
}

impl std::str::FromStr for Backend {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        match s.to_ascii_lowercase().as_str() {
            "cpu" | "gloo" => Ok(Backend::Cpu),
            "nccl" => Ok(Backend::Nccl),
            "auto" | "cpu:gloo,cuda:nccl" | "cuda:nccl,cpu:gloo" => Ok(Backend::Auto),
            _ => Err(Error::BadValue {
                name: "backend".into(),
                expected: "cpu (or gloo), nccl, or auto (cpu:gloo,cuda:nccl)".into(),
                found: s.into(),
            }),
        }
    }
}

/// A group of ranks running collectives together.
///
/// A call queues its collective and returns a [`Work`] at once; a group's
/// collectives run in call order. Which thread runs one is up to the
/// backend: the CPU backend's own thread picks each up in turn, but a
/// caller that waits on a `Work` before that thread has reached it runs
/// the collective itself (see [`Work`]). Tensors are handles
/// (`Tensor<'static>`, so they can outlive the call) whose storage the
/// collective writes in place. `timeout` overrides the group's default for
/// one call.
pub trait ProcessGroup: Send + Sync {
    /// This rank in the group.
    fn rank(&self) -> usize;

    /// The number of ranks in the group.
    fn size(&self) -> usize;

    /// The backend running the collectives.
    fn backend(&self) -> Backend;

    /// The global rank (rank in the default group) of each rank of this
    /// group, in group-rank order.
    fn global_ranks(&self) -> Vec<usize>;

    /// The global rank of this group's rank `group_rank` (c10d's
    /// `get_global_rank`); an error naming the group's size when it has no
    /// such rank.
    ///
    /// ```
    /// use tensorcomm::{init_process_group, Backend};
    /// let pg = init_process_group(Backend::Cpu, "tcp://127.0.0.1:0?rank=0&world_size=1")?;
    /// assert_eq!(pg.get_global_rank(0)?, 0);
    /// assert!(pg.get_global_rank(1).is_err());
    /// # Ok::<(), tensorcomm::Error>(())
    /// ```
    fn get_global_rank(&self, group_rank: usize) -> Result<usize> {
        let ranks = self.global_ranks();
        ranks.get(group_rank).copied().ok_or_else(|| {
            Error::InvalidArgument(format!(
                "get_global_rank: expected a group rank in 0..{}, found {group_rank}",
                ranks.len()
            ))
        })
    }

    /// This group's rank of global rank `global_rank` (c10d's
    /// `get_group_rank`); an error when that rank is not in the group.
    ///
    /// ```
    /// use tensorcomm::{init_process_group, Backend};
    /// let pg = init_process_group(Backend::Cpu, "tcp://127.0.0.1:0?rank=0&world_size=1")?;
    /// assert_eq!(pg.get_group_rank(0)?, 0);
    /// assert!(pg.get_group_rank(3).is_err());
    /// # Ok::<(), tensorcomm::Error>(())
    /// ```
    fn get_group_rank(&self, global_rank: usize) -> Result<usize> {
        let ranks = self.global_ranks();
        ranks.iter().position(|&r| r == global_rank).ok_or_else(|| {
            Error::InvalidArgument(format!(
            "get_group_rank: expected a global rank of this group ({ranks:?}), found {global_rank}"
        ))
        })
    }

    /// Reduces `tensor` over all ranks with `op`; every rank gets the result
    /// in place.
    fn all_reduce(
        &self,
        tensor: &Tensor<'static>,
        op: ReduceOp,
        timeout: Option<Duration>,
    ) -> Result<Work>;

    /// Copies `tensor` of rank `root` into `tensor` of every rank.
    fn broadcast(
        &self,
        tensor: &Tensor<'static>,
        root: usize,
        timeout: Option<Duration>,
    ) -> Result<Work>;

    /// Reduces `tensor` over all ranks with `op` into `tensor` of rank
    /// `root`; the other ranks' tensors are left unchanged.
    ///
    /// This example runs the collectives that follow on two ranks
    /// (threads):
    ///
    /// ```
    /// use std::{sync::Arc, thread};
    /// use tensorcomm::cpu::backend::{CpuOptions, ProcessGroupCpu};
    /// use tensorcomm::group::{ProcessGroup, ReduceOp};
    /// use tensorcomm::store::HashStore;
    /// use tensorcomm::tensor::{DType, Tensor};
    ///
    /// let store = Arc::new(HashStore::new());
    /// let ranks: Vec<_> = (0..2).map(|rank| {
    ///     let store = store.clone();
    ///     thread::spawn(move || -> tensorcomm::Result<()> {
    ///         let pg = ProcessGroupCpu::new(store, "pg", rank, 2, &CpuOptions::default())?;
    ///         let r = rank as i32;
    ///         let t = Tensor::from_vec(vec![r + 1; 2], &[2])?;
    ///         pg.reduce(&t, 0, ReduceOp::Sum, None)?.wait()?;
    ///         assert_eq!(t.to_vec::<i32>()?, if rank == 0 { [3, 3] } else { [2, 2] });
    ///
    ///         let all = Tensor::zeros(&[4], DType::I32)?;
    ///         pg.all_gather_into_tensor(&all, &Tensor::from_vec(vec![r, r], &[2])?, None)?.wait()?;
    ///         assert_eq!(all.to_vec::<i32>()?, [0, 0, 1, 1]);
    ///
    ///         let mine = Tensor::zeros(&[2], DType::I32)?;
    ///         pg.reduce_scatter_tensor(&mine, &Tensor::from_vec(vec![1, 2, 3, 4], &[4])?, ReduceOp::Sum, None)?.wait()?;
    ///         assert_eq!(mine.to_vec::<i32>()?, if rank == 0 { [2, 4] } else { [6, 8] });
    ///
    ///         // Uneven all-to-all: rank 0 sends 1 row to rank 1, rank 1 sends 2 rows to rank 0.
    ///         let (send, recv) = if rank == 0 { ([1, 1], [1, 2]) } else { ([2, 2], [1, 2]) };
    ///         let input = Tensor::from_vec(vec![r * 10; send.iter().sum::<usize>()], &[send.iter().sum()])?;
    ///         let output = Tensor::zeros(&[recv.iter().sum()], DType::I32)?;
    ///         pg.all_to_all_single(&output, &input, &recv, &send, None)?.wait()?;
    ///         assert_eq!(output.to_vec::<i32>()?, [0, 10, 10]); // 1 element from rank 0, 2 from rank 1
    ///
    ///         let pieces: Vec<_> = (0..2).map(|_| Tensor::zeros(&[1], DType::I32).unwrap()).collect();
    ///         let root_list = (rank == 1).then_some(pieces.as_slice());
    ///         pg.gather(&Tensor::from_vec(vec![r + 5], &[1])?, root_list, 1, None)?.wait()?;
    ///         if rank == 1 {
    ///             assert_eq!(pieces[0].to_vec::<i32>()?, [5]);
    ///             assert_eq!(pieces[1].to_vec::<i32>()?, [6]);
    ///         }
    ///         Ok(())
    ///     })
    /// }).collect();
    /// for r in ranks {
    ///     r.join().unwrap()?;
    /// }
    /// # Ok::<(), tensorcomm::Error>(())
    /// ```
    fn reduce(
        &self,
        tensor: &Tensor<'static>,
        root: usize,
        op: ReduceOp,
        timeout: Option<Duration>,
    ) -> Result<Work>;

    /// Copies `input` of every rank `r` into `outputs[r]` of every rank:
    /// one output per rank, each of the input's dtype and shape.
    fn all_gather(
        &self,
        outputs: &[Tensor<'static>],
        input: &Tensor<'static>,
        timeout: Option<Duration>,
    ) -> Result<Work>;

    /// [`all_gather`](ProcessGroup::all_gather) into one `output` holding
    /// the inputs of ranks `0..size` concatenated along dim 0 (shape
    /// `[size * d0, ..]`) or stacked (shape `[size, d0, ..]`).
    fn all_gather_into_tensor(
        &self,
        output: &Tensor<'static>,
        input: &Tensor<'static>,
        timeout: Option<Duration>,
    ) -> Result<Work>;

    /// [`all_gather`](ProcessGroup::all_gather) of several inputs (one
    /// dtype) at once: `outputs[r][i]` receives `inputs[i]` of rank `r`.
    fn all_gather_coalesced(
        &self,
        outputs: &[Vec<Tensor<'static>>],
        inputs: &[Tensor<'static>],
        timeout: Option<Duration>,
    ) -> Result<Work>;

    /// [`all_gather_into_tensor`](ProcessGroup::all_gather_into_tensor) of
    /// several pairs (one dtype) as one collective: `outputs[i]` receives
    /// every rank's `inputs[i]` (FSDP's form).
    fn all_gather_into_tensor_coalesced(
        &self,
        outputs: &[Tensor<'static>],
        inputs: &[Tensor<'static>],
        timeout: Option<Duration>,
    ) -> Result<Work>;

    /// Copies `input` of every rank `r` into `outputs[r]` of rank `root`.
    /// Only the root passes `outputs` (one per rank, each of the input's
    /// dtype and shape); the others pass `None`.
    fn gather(
        &self,
        input: &Tensor<'static>,
        outputs: Option<&[Tensor<'static>]>,
        root: usize,
        timeout: Option<Duration>,
    ) -> Result<Work>;

    /// Copies `inputs[r]` of rank `root` into `output` of every rank `r`.
    /// Only the root passes `inputs` (one per rank, each of the output's
    /// dtype and shape); the others pass `None`.
    fn scatter(
        &self,
        output: &Tensor<'static>,
        inputs: Option<&[Tensor<'static>]>,
        root: usize,
        timeout: Option<Duration>,
    ) -> Result<Work>;

    /// Reduces `inputs[r]` over all ranks with `op` into `output` of rank
    /// `r`: one input per rank, each of the output's dtype and shape.
    fn reduce_scatter(
        &self,
        output: &Tensor<'static>,
        inputs: &[Tensor<'static>],
        op: ReduceOp,
        timeout: Option<Duration>,
    ) -> Result<Work>;

    /// [`reduce_scatter`](ProcessGroup::reduce_scatter) from one `input`
    /// holding the per-rank inputs concatenated along dim 0 (shape
    /// `[size * d0, ..]`) or stacked (shape `[size, d0, ..]`).
    fn reduce_scatter_tensor(
        &self,
        output: &Tensor<'static>,
        input: &Tensor<'static>,
        op: ReduceOp,
        timeout: Option<Duration>,
    ) -> Result<Work>;

    /// [`reduce_scatter_tensor`](ProcessGroup::reduce_scatter_tensor) of
    /// several pairs (one dtype) as one collective: `outputs[i]` receives
    /// this rank's block of every rank's `inputs[i]` reduced (FSDP's form).
    fn reduce_scatter_tensor_coalesced(
        &self,
        outputs: &[Tensor<'static>],
        inputs: &[Tensor<'static>],
        op: ReduceOp,
        timeout: Option<Duration>,
    ) -> Result<Work>;

    /// Copies `inputs[p]` of this rank into `outputs[r]` of rank `p` (`r`
    /// being this rank), for every pair: one tensor per rank in each list,
    /// all of one dtype, sizes free per peer (uneven all-to-all) as long
    /// as each pair agrees.
    fn all_to_all(
        &self,
        outputs: &[Tensor<'static>],
        inputs: &[Tensor<'static>],
        timeout: Option<Duration>,
    ) -> Result<Work>;

    /// All-to-all over rows (dim 0) of one `input` and one `output` with
    /// the same shape after dim 0: `input_split_sizes[p]` rows go to rank
    /// `p` and `output_split_sizes[p]` rows come from it; an empty list
    /// splits that tensor's dim 0 equally.
    fn all_to_all_single(
        &self,
        output: &Tensor<'static>,
        input: &Tensor<'static>,
        output_split_sizes: &[usize],
        input_split_sizes: &[usize],
        timeout: Option<Duration>,
    ) -> Result<Work>;

    /// [`all_reduce`](ProcessGroup::all_reduce) of several tensors of one
    /// dtype as one collective.
    fn all_reduce_coalesced(
        &self,
        tensors: &[Tensor<'static>],
        op: ReduceOp,
        timeout: Option<Duration>,
    ) -> Result<Work>;

    /// Completes once every rank has called it.
    fn barrier(&self, timeout: Option<Duration>) -> Result<Work>;

    /// Sends the bytes of `tensor` to rank `dst`, to be received by a
    /// [`recv`](ProcessGroup::recv) (or
    /// [`recv_any_source`](ProcessGroup::recv_any_source)) with the same
    /// `tag` into a tensor of the same size. The `Work` completes once the
    /// message is handed to the connection; the receiver buffers messages
    /// that arrive before their receive is posted. Point-to-point calls take
    /// no sequence number of the group's collectives.
    fn send(
        &self,
        tensor: &Tensor<'static>,
        dst: usize,
        tag: u64,
        timeout: Option<Duration>,
    ) -> Result<Work>;

    /// Receives the message rank `src` sent with `tag` into `tensor`.
    /// Messages of one sender and tag are received in the order sent. A
    /// message whose size differs from `tensor`'s fails the receive with
    /// [`Error::MessageSizeMismatch`] naming both sizes.
    fn recv(
        &self,
        tensor: &Tensor<'static>,
        src: usize,
        tag: u64,
        timeout: Option<Duration>,
    ) -> Result<Work>;

    /// Receives the first message any rank sent with `tag` into `tensor`;
    /// [`Work::source_rank`] says which rank sent it.
    fn recv_any_source(
        &self,
        tensor: &Tensor<'static>,
        tag: u64,
        timeout: Option<Duration>,
    ) -> Result<Work>;

    /// A barrier that names the ranks that did not come: every rank reports
    /// to rank 0, which waits at most `timeout` for them and then releases
    /// everyone. On timeout every rank that took part fails with
    /// [`Error::RanksMissing`] naming every missing rank (`wait_all`) or the
    /// lowest one. The other ranks wait up to twice `timeout` for rank 0's
    /// verdict (it may arrive up to one timeout after them) and name rank 0
    /// when it does not come.
    fn monitored_barrier(&self, timeout: Option<Duration>, wait_all: bool) -> Result<Work>;

    /// A sub-group of the ranks `ranks` of this group (sorted: sub-group
    /// rank `i` is the `i`-th smallest of them), with its own connections
    /// and sequence numbers. Every rank of this group must call it, for
    /// every sub-group and in the same order; ranks not in `ranks` get
    /// `None`.
    fn new_group(&self, ranks: &[usize]) -> Result<Option<Arc<dyn ProcessGroup>>>;

    /// Sums a sparse COO tensor over all ranks (only [`ReduceOp::Sum`]);
    /// every rank gets the coalesced result from [`SparseWork::wait`].
    fn all_reduce_sparse(
        &self,
        tensor: &SparseTensor,
        op: ReduceOp,
        timeout: Option<Duration>,
    ) -> Result<SparseWork>;

    /// A zero-filled host tensor of `shape` and `dtype` that the other
    /// ranks can read where they can reach this rank's memory, so that
    /// collectives on it need not stage it (PyTorch's symmetric memory, on
    /// the host). Every rank calls it, in the same order, with the same
    /// shape and dtype; when they set up shared memory, one rank asking
    /// another size fails every rank with
    /// [`Error::CollectiveMismatch`]
    /// naming it.
    ///
    /// On the CPU backend, when every rank of the group is on one host and
    /// they use shared memory, the tensor lives in one shared-memory
    /// segment of the group, and an `all_reduce` of it (or of a view at
    /// the same offset on every rank) reduces straight out of the other
    /// ranks' copies. It does so when every rank passes the same
    /// allocation and offset; ranks passing different ones get a correct
    /// result through the ordinary path for small tensors (below the
    /// shared-memory arena's threshold) and a `CollectiveMismatch` naming
    /// both for larger ones. Elsewhere (across hosts, TCP forced, other
    /// backends: this default) it is an ordinary tensor, and nothing is
    /// exchanged.
    ///
    /// ```
    /// use std::{sync::Arc, thread};
    /// use tensorcomm::cpu::backend::{CpuOptions, ProcessGroupCpu};
    /// use tensorcomm::group::{ProcessGroup, ReduceOp};
    /// use tensorcomm::store::HashStore;
    /// use tensorcomm::tensor::DType;
    ///
    /// let store = Arc::new(HashStore::new());
    /// let ranks: Vec<_> = (0..2).map(|rank| {
    ///     let store = store.clone();
    ///     thread::spawn(move || -> tensorcomm::Result<Vec<f32>> {
    ///         let pg = ProcessGroupCpu::new(store, "sym", rank, 2, &CpuOptions::default())?;
    ///         let grads = pg.symmetric_zeros(&[4096], DType::F32)?;
    ///         grads.fill(rank as f32 + 1.0)?;
    ///         pg.all_reduce(&grads, ReduceOp::Sum, None)?.wait()?;
    ///         grads.to_vec::<f32>()
    ///     })
    /// }).collect();
    /// for r in ranks {
    ///     assert!(r.join().unwrap()?.iter().all(|&x| x == 3.0));
    /// }
    /// # Ok::<(), tensorcomm::Error>(())
    /// ```
    fn symmetric_zeros(&self, shape: &[usize], dtype: DType) -> Result<Tensor<'static>> {
        Tensor::zeros(shape, dtype)
    }

    /// The flight recorder's last collectives of this group, as JSON (see
    /// [`DEFAULT_FLIGHT_RECORDER_SIZE`] and the environment variables beside
    /// it).
    fn flight_recorder_json(&self) -> String;
}
