//! The CPU process group: collectives on host tensors over a
//! [`TcpTransport`], run in call order on the group's own thread.
//!
//! ```
//! use std::{sync::Arc, thread};
//! use tensorcomm::cpu::backend::{CpuOptions, ProcessGroupCpu};
//! use tensorcomm::group::{ProcessGroup, ReduceOp};
//! use tensorcomm::store::HashStore;
//! use tensorcomm::tensor::Tensor;
//!
//! let store = Arc::new(HashStore::new());
//! let ranks: Vec<_> = (0..2).map(|rank| {
//!     let store = store.clone();
//!     thread::spawn(move || -> tensorcomm::Result<Vec<i64>> {
//!         let pg = ProcessGroupCpu::new(store, "pg", rank, 2, &CpuOptions::default())?;
//!         let t = Tensor::from_vec(vec![rank as i64 + 1; 3], &[3])?;
//!         pg.all_reduce(&t, ReduceOp::Sum, None)?.wait()?;
//!         t.to_vec::<i64>()
//!     })
//! }).collect();
//! for r in ranks {
//!     assert_eq!(r.join().unwrap()?, [3, 3, 3]);
//! }
//! # Ok::<(), tensorcomm::Error>(())
//! ```

use std::sync::mpsc::{channel, Sender};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use super::algorithms::{all_reduce, all_reduce_direct, broadcast_tree};
use super::collectives;
use super::transport::{TcpTransport, TcpTransportOptions, Transport};
use crate::group::fingerprint::{
    reduce_code, shape_hash, CollectiveKind, Fingerprint, Fingerprinted,
};
use crate::group::validate::{check_dense_host, check_root};
use crate::group::{Backend, ProcessGroup, ReduceOp, Work, DEFAULT_COLLECTIVE_TIMEOUT};
use crate::store::Store;
use crate::tensor::{DType, Tensor};
use crate::{Error, Result};

/// How a [`ProcessGroupCpu`] is set up.
#[derive(Clone, Debug)]
pub struct CpuOptions {
    /// Default per-collective timeout (also bounds setup).
    pub timeout: Duration,
    /// The address other ranks reach this one at (see
    /// [`TcpTransportOptions::advertise_host`]).
    pub advertise_host: String,
}

impl Default for CpuOptions {
    fn default() -> Self {
        CpuOptions {
            timeout: DEFAULT_COLLECTIVE_TIMEOUT,
            advertise_host: "127.0.0.1".into(),
        }
    }
}

type Job = Box<dyn FnOnce() + Send>;

/// What the group's thread shares with the callers.
struct Shared {
    rank: usize,
    size: usize,
    transport: TcpTransport,
    /// The collective whose failure broke the group, if any.
    broken: Mutex<Option<(String, u64)>>,
}

/// The next sequence number and the queue to the group's thread, under one
/// lock so that sequence order is queue order.
struct Queue {
    next_seq: u64,
    jobs: Sender<Job>,
}

/// The CPU backend's [`ProcessGroup`].
pub struct ProcessGroupCpu {
    /// Kept for the group's lifetime: on rank 0 of a TCP rendezvous this
    /// is the store server, which slower ranks may still be reading.
    _store: Arc<dyn Store>,
    shared: Arc<Shared>,
    queue: Mutex<Queue>,
    timeout: Duration,
}

impl std::fmt::Debug for ProcessGroupCpu {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProcessGroupCpu")
            .field("rank", &self.shared.rank)
            .field("size", &self.shared.size)
            .finish_non_exhaustive()
    }
}

impl ProcessGroupCpu {
    /// Connects rank `rank` of `size` to the others through `store`, under
    /// keys starting with `key_prefix` (one prefix per group).
    pub fn new(
        store: Arc<dyn Store>,
        key_prefix: &str,
        rank: usize,
        size: usize,
        options: &CpuOptions,
    ) -> Result<Self> {
        let transport = TcpTransport::connect(
            &*store,
            &format!("{key_prefix}/tcp"),
            rank,
            size,
            &TcpTransportOptions {
                advertise_host: options.advertise_host.clone(),
                timeout: options.timeout,
            },
        )?;
        let (jobs, incoming) = channel::<Job>();
        std::thread::Builder::new()
            .name(format!("tensorcomm-pg-rank{rank}"))
            .spawn(move || {
                for job in incoming {
                    job();
                }
            })
            .map_err(|e| Error::io("starting the process group's thread", e))?;
        Ok(ProcessGroupCpu {
            _store: store,
            shared: Arc::new(Shared {
                rank,
                size,
                transport,
                broken: Mutex::new(None),
            }),
            queue: Mutex::new(Queue { next_seq: 0, jobs }),
            timeout: options.timeout,
        })
    }

    /// Takes the next sequence number and queues `body` to run under it
    /// with the fingerprint `fp` (its `seq` is filled in here).
    fn submit(
        &self,
        mut fp: Fingerprint,
        timeout: Option<Duration>,
        body: impl FnOnce(&dyn Transport, Instant) -> Result<()> + Send + 'static,
    ) -> Result<Work> {
        let deadline = Instant::now() + timeout.unwrap_or(self.timeout);
        let (work, completion) = Work::new();
        let mut queue = self.queue.lock().unwrap_or_else(PoisonError::into_inner);
        fp.seq = queue.next_seq;
        let shared = self.shared.clone();
        let job: Job = Box::new(move || completion.complete(run(&shared, fp, deadline, body)));
        if queue.jobs.send(job).is_err() {
            return Ok(Work::done(Err(Error::GroupBroken {
                op: fp.kind.name().into(),
                seq: fp.seq,
            })));
        }
        queue.next_seq += 1;
        Ok(work)
    }
}

/// Runs one collective on the group's thread: refuses to run on a broken
/// group, checks fingerprints through [`Fingerprinted`], and on failure
/// names the op, sequence number and peers, then closes the connections so
/// the other ranks fail promptly too.
fn run(
    shared: &Shared,
    fp: Fingerprint,
    deadline: Instant,
    body: impl FnOnce(&dyn Transport, Instant) -> Result<()>,
) -> Result<()> {
    let op = fp.kind.name();
    if let Some((op, seq)) = shared
        .broken
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .clone()
    {
        return Err(Error::GroupBroken { op, seq });
    }
    let transport = Fingerprinted::new(&shared.transport, fp);
    let started = Instant::now();
    let outcome = body(&transport, deadline);
    tracing::debug!(
        op,
        seq = fp.seq,
        elapsed_us = started.elapsed().as_micros() as u64,
        ok = outcome.is_ok(),
        "collective"
    );
    outcome.map_err(|source| {
        *shared.broken.lock().unwrap_or_else(PoisonError::into_inner) = Some((op.into(), fp.seq));
        shared.transport.abort();
        let ranks = match &source {
            Error::PeerClosed { peer, .. }
            | Error::PeerTimeout { peer, .. }
            | Error::PeerIo { peer, .. }
            | Error::PeerProtocol { peer, .. }
            | Error::CollectiveMismatch { peer, .. } => vec![*peer],
            _ => Vec::new(),
        };
        Error::CollectiveFailed {
            op: op.into(),
            seq: fp.seq,
            rank: shared.rank,
            ranks,
            source: Box::new(source),
        }
    })
}

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

impl ProcessGroup for ProcessGroupCpu {
    fn rank(&self) -> usize {
        self.shared.rank
    }

    fn size(&self) -> usize {
        self.shared.size
    }

    fn backend(&self) -> Backend {
        Backend::Cpu
    }

    fn all_reduce(
        &self,
        tensor: &Tensor<'static>,
        op: ReduceOp,
        timeout: Option<Duration>,
    ) -> Result<Work> {
        check_dense_host("all_reduce", tensor)?;
        op.check_dtype("all_reduce", tensor.dtype())?;
        let fp = tensor_fingerprint(CollectiveKind::AllReduce, tensor, Some(op), 0);
        let tensor = tensor.clone();
        self.submit(fp, timeout, move |t, deadline| {
            let dtype = tensor.dtype();
            tensor.with_bytes_mut(|bytes| all_reduce(t, bytes, dtype, op, deadline))?
        })
    }

    fn broadcast(
        &self,
        tensor: &Tensor<'static>,
        root: usize,
        timeout: Option<Duration>,
    ) -> Result<Work> {
        check_dense_host("broadcast", tensor)?;
        check_root("broadcast", root, self.size())?;
        let fp = tensor_fingerprint(CollectiveKind::Broadcast, tensor, None, root);
        let tensor = tensor.clone();
        self.submit(fp, timeout, move |t, deadline| {
            tensor.with_bytes_mut(|bytes| broadcast_tree(t, bytes, root, deadline))?
        })
    }

    fn reduce(
        &self,
        tensor: &Tensor<'static>,
        root: usize,
        op: ReduceOp,
        timeout: Option<Duration>,
    ) -> Result<Work> {
        let plan = collectives::reduce::plan(self.size(), tensor, root, op)?;
        self.submit(plan.fingerprint, timeout, plan.body)
    }

    fn all_gather(
        &self,
        outputs: &[Tensor<'static>],
        input: &Tensor<'static>,
        timeout: Option<Duration>,
    ) -> Result<Work> {
        let plan = collectives::all_gather::plan(self.size(), outputs, input)?;
        self.submit(plan.fingerprint, timeout, plan.body)
    }

    fn all_gather_into_tensor(
        &self,
        output: &Tensor<'static>,
        input: &Tensor<'static>,
        timeout: Option<Duration>,
    ) -> Result<Work> {
        let plan = collectives::all_gather_into_tensor::plan(self.size(), output, input)?;
        self.submit(plan.fingerprint, timeout, plan.body)
    }

    fn all_gather_coalesced(
        &self,
        outputs: &[Vec<Tensor<'static>>],
        inputs: &[Tensor<'static>],
        timeout: Option<Duration>,
    ) -> Result<Work> {
        let plan = collectives::all_gather_coalesced::plan(self.size(), outputs, inputs)?;
        self.submit(plan.fingerprint, timeout, plan.body)
    }

    fn gather(
        &self,
        input: &Tensor<'static>,
        outputs: Option<&[Tensor<'static>]>,
        root: usize,
        timeout: Option<Duration>,
    ) -> Result<Work> {
        let plan = collectives::gather::plan(self.rank(), self.size(), input, outputs, root)?;
        self.submit(plan.fingerprint, timeout, plan.body)
    }

    fn scatter(
        &self,
        output: &Tensor<'static>,
        inputs: Option<&[Tensor<'static>]>,
        root: usize,
        timeout: Option<Duration>,
    ) -> Result<Work> {
        let plan = collectives::scatter::plan(self.rank(), self.size(), output, inputs, root)?;
        self.submit(plan.fingerprint, timeout, plan.body)
    }

    fn reduce_scatter(
        &self,
        output: &Tensor<'static>,
        inputs: &[Tensor<'static>],
        op: ReduceOp,
        timeout: Option<Duration>,
    ) -> Result<Work> {
        let plan = collectives::reduce_scatter::plan(self.size(), output, inputs, op)?;
        self.submit(plan.fingerprint, timeout, plan.body)
    }

    fn reduce_scatter_tensor(
        &self,
        output: &Tensor<'static>,
        input: &Tensor<'static>,
        op: ReduceOp,
        timeout: Option<Duration>,
    ) -> Result<Work> {
        let plan = collectives::reduce_scatter_tensor::plan(self.size(), output, input, op)?;
        self.submit(plan.fingerprint, timeout, plan.body)
    }

    fn all_to_all(
        &self,
        outputs: &[Tensor<'static>],
        inputs: &[Tensor<'static>],
        timeout: Option<Duration>,
    ) -> Result<Work> {
        let plan = collectives::all_to_all::plan(self.rank(), self.size(), outputs, inputs)?;
        self.submit(plan.fingerprint, timeout, plan.body)
    }

    fn all_to_all_single(
        &self,
        output: &Tensor<'static>,
        input: &Tensor<'static>,
        output_split_sizes: &[usize],
        input_split_sizes: &[usize],
        timeout: Option<Duration>,
    ) -> Result<Work> {
        let (rank, size) = (self.rank(), self.size());
        let plan = collectives::all_to_all_single::plan(
            rank,
            size,
            output,
            input,
            output_split_sizes,
            input_split_sizes,
        )?;
        self.submit(plan.fingerprint, timeout, plan.body)
    }

    fn all_reduce_coalesced(
        &self,
        tensors: &[Tensor<'static>],
        op: ReduceOp,
        timeout: Option<Duration>,
    ) -> Result<Work> {
        let plan = collectives::all_reduce_coalesced::plan(tensors, op)?;
        self.submit(plan.fingerprint, timeout, plan.body)
    }

    fn barrier(&self, timeout: Option<Duration>) -> Result<Work> {
        let fp = Fingerprint {
            kind: CollectiveKind::Barrier,
            reduce_op: 0,
            dtype: None,
            root: 0,
            seq: 0,
            numel: 0,
            shape_hash: 0,
        };
        self.submit(fp, timeout, |t, deadline| {
            all_reduce_direct(t, &mut [0u8], DType::U8, ReduceOp::Max, deadline)
        })
    }
}
