//! The CPU process group: collectives on host tensors over a
//! [`RoutedTransport`] (shared memory with ranks on this host, TCP with the
//! others; [`CpuOptions::transport`] or `TENSORCOMM_TRANSPORT` can force
//! either), run in call order. A call queues its collective for the
//! group's own thread and returns at once; a caller that then waits on the
//! `Work` before that thread has picked the collective up runs it itself,
//! so the common call-then-wait path costs no thread hand-off.
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

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{channel, Sender};
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::time::{Duration, Instant};

use super::algorithms::{all_reduce, broadcast_tree};
#[cfg(target_os = "linux")]
use super::algorithms::{
    all_reduce_shm_arena, all_reduce_shm_symmetric, broadcast_shm_arena, reduce_to_root_shm_arena,
    shm_arena_all_reduce_min_bytes, shm_arena_threads, shm_symmetric_threads, ArenaThreads,
    SymmetricBytes, SHM_ARENA_BROADCAST_MIN_BYTES, SHM_ARENA_REDUCE_MIN_BYTES,
};
use super::collectives;
use super::fingerprinted::Fingerprinted;
use super::monitored_barrier::monitored_barrier;
use super::p2p::P2p;
use super::sparse_all_reduce::all_reduce_sparse;
#[cfg(target_os = "linux")]
use super::transport::shm::{arena_chunk, ShmArena, SymmetricRegistry};
use super::transport::{
    Route, RoutedTransport, RoutedTransportOptions, TcpTransportOptions, Transport, TransportChoice,
};
#[cfg(target_os = "linux")]
use super::HelperThreads;
use crate::group::failure_report::FailureBoard;
use crate::group::fingerprint::{reduce_code, shape_hash, CollectiveKind, Fingerprint};
use crate::group::turn::{Job, QueuedJob, Turn};
use crate::group::validate::{check_dense_host, check_peer_rank, check_root};
use crate::group::{check_group_ranks, subgroup_prefix, FlightRecorder, SparseSlot, SparseWork};
use crate::group::{Backend, ProcessGroup, ReduceOp, Work, DEFAULT_COLLECTIVE_TIMEOUT};
use crate::store::{PrefixStore, Store};
use crate::tensor::{DType, SparseTensor, Tensor};
#[cfg(target_os = "linux")]
use crate::tuning::env_count;
use crate::{Error, Result};

/// How a [`ProcessGroupCpu`] is set up.
#[derive(Clone, Debug)]
pub struct CpuOptions {
    /// Default per-collective timeout (also bounds setup).
    pub timeout: Duration,
    /// The address other ranks reach this one at (see
    /// [`TcpTransportOptions::advertise_host`]).
    pub advertise_host: String,
    /// Which transport connects which ranks; by default
    /// ([`TransportChoice::Env`]) whatever `TENSORCOMM_TRANSPORT` says
    /// (`auto`, `tcp` or `shm`), `auto` when it is unset.
    pub transport: TransportChoice,
    /// TCP connections per pair of ranks for collectives (see
    /// [`TcpTransportOptions::lanes`]); `None`: `TENSORCOMM_TCP_LANES`, or
    /// chosen from the host's cores.
    pub tcp_lanes: Option<usize>,
}

impl Default for CpuOptions {
    fn default() -> Self {
        CpuOptions {
            timeout: DEFAULT_COLLECTIVE_TIMEOUT,
            advertise_host: "127.0.0.1".into(),
            transport: TransportChoice::default(),
            tcp_lanes: None,
        }
    }
}

/// What the group's thread shares with the callers.
struct Shared {
    rank: usize,
    size: usize,
    transport: RoutedTransport,
    /// The collective whose failure broke the group, if any.
    broken: Mutex<Option<(String, u64)>>,
    recorder: FlightRecorder,
    turn: Turn,
    /// Where a failed collective posts its root cause before closing the
    /// connections (see `group/failure_report.rs`).
    failures: FailureBoard,
}

/// The next sequence number and the queue to the group's thread, under one
/// lock so that sequence order is queue order.
struct Queue {
    next_seq: u64,
    jobs: Sender<Arc<QueuedJob>>,
}

/// Ring capacity per direction of a point-to-point shared-memory link: a
/// quarter of a collective link's (larger messages stream through it), as
/// every group keeps a second mesh of links for point-to-point messages.
const P2P_SHM_CAPACITY: usize = 1 << 20;

/// The CPU backend's [`ProcessGroup`].
pub struct ProcessGroupCpu {
    /// Kept for the group's lifetime: on rank 0 of a TCP rendezvous this
    /// is the store server, which slower ranks may still be reading.
    _store: Arc<dyn Store>,
    shared: Arc<Shared>,
    queue: Mutex<Queue>,
    timeout: Duration,
    p2p: Arc<P2p>,
    /// The group's shared-memory arena when every rank is on this host and
    /// reached over shared memory.
    #[cfg(target_os = "linux")]
    arena: Option<Arc<Arena>>,
    /// What `new_group` needs to set up sub-groups.
    origin: Origin,
}

/// A group's shared-memory arena and the helper threads its all-reduces
/// split their work with.
#[cfg(target_os = "linux")]
struct Arena {
    shm: Arc<ShmArena>,
    helpers: HelperThreads,
    /// The group's symmetric allocations (`symmetric_zeros`).
    symmetric: SymmetricRegistry,
    /// The fewest cores any rank of the group may use: every rank picks
    /// its thread count from it, so all pick the same.
    cores: usize,
}

/// Where a group's sub-groups meet: the parent's store and key prefix,
/// its options, and how many sub-groups it has created.
struct Origin {
    store: Arc<dyn Store>,
    key_prefix: String,
    options: CpuOptions,
    subgroups: AtomicU64,
    monitored_barriers: AtomicU64,
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
        let recorder = FlightRecorder::from_env(rank, size, key_prefix)?;
        let transport = RoutedTransport::connect(
            &*store,
            key_prefix,
            rank,
            size,
            &RoutedTransportOptions {
                choice: options.transport,
                tcp: TcpTransportOptions {
                    advertise_host: options.advertise_host.clone(),
                    timeout: options.timeout,
                    lanes: options.tcp_lanes,
                },
                shm_capacity: None,
                host_identity: None,
            },
        )?;
        let p2p = P2p::connect(
            &*store,
            &format!("{key_prefix}/p2p"),
            rank,
            size,
            &RoutedTransportOptions {
                choice: options.transport,
                tcp: TcpTransportOptions {
                    advertise_host: options.advertise_host.clone(),
                    timeout: options.timeout,
                    // A reader thread per peer waits on each connection: one.
                    lanes: Some(1),
                },
                shm_capacity: Some(P2P_SHM_CAPACITY),
                host_identity: None,
            },
        )?;
        #[cfg(target_os = "linux")]
        let arena = if size > 1 && (0..size).all(|p| p == rank || transport.route(p) == Route::Shm)
        {
            Some(Arc::new(Arena {
                shm: Arc::new(ShmArena::connect(
                    &*store,
                    key_prefix,
                    rank,
                    size,
                    arena_chunk_for(size)?,
                    options.timeout,
                )?),
                helpers: HelperThreads::new(&format!("arena-rank{rank}")),
                symmetric: SymmetricRegistry::default(),
                cores: fewest_cores(&*store, key_prefix, rank, size, options.timeout)?,
            }))
        } else {
            None
        };
        let (jobs, incoming) = channel::<Arc<QueuedJob>>();
        std::thread::Builder::new()
            .name(format!("tensorcomm-pg-rank{rank}"))
            .spawn(move || {
                for job in incoming {
                    job.run_once();
                }
            })
            .map_err(|e| Error::io("starting the process group's thread", e))?;
        let failures = FailureBoard::new(store.clone(), key_prefix);
        Ok(ProcessGroupCpu {
            origin: Origin {
                store: store.clone(),
                key_prefix: key_prefix.into(),
                options: options.clone(),
                subgroups: AtomicU64::new(0),
                monitored_barriers: AtomicU64::new(0),
            },
            p2p: Arc::new(p2p),
            #[cfg(target_os = "linux")]
            arena,
            _store: store,
            shared: Arc::new(Shared {
                rank,
                size,
                transport,
                broken: Mutex::new(None),
                recorder,
                turn: Turn::default(),
                failures,
            }),
            queue: Mutex::new(Queue { next_seq: 0, jobs }),
            timeout: options.timeout,
        })
    }

    /// The transport carrying this rank's traffic to `peer` (shared memory
    /// or TCP; [`Route::Local`] for this rank itself).
    ///
    /// ```
    /// use std::sync::Arc;
    /// use tensorcomm::cpu::backend::{CpuOptions, ProcessGroupCpu};
    /// use tensorcomm::cpu::transport::Route;
    /// use tensorcomm::store::HashStore;
    ///
    /// let pg = ProcessGroupCpu::new(Arc::new(HashStore::new()), "one", 0, 1, &CpuOptions::default())?;
    /// assert_eq!(pg.route(0), Route::Local);
    /// # Ok::<(), tensorcomm::Error>(())
    /// ```
    pub fn route(&self, peer: usize) -> Route {
        self.shared.transport.route(peer)
    }

    /// How this rank's point-to-point messages (`send`, `recv`, the
    /// monitored barrier) reach `peer`: they have links of their own,
    /// chosen like the collectives'.
    ///
    /// ```
    /// use std::sync::Arc;
    /// use tensorcomm::cpu::backend::{CpuOptions, ProcessGroupCpu};
    /// use tensorcomm::cpu::transport::Route;
    /// use tensorcomm::store::HashStore;
    ///
    /// let pg = ProcessGroupCpu::new(Arc::new(HashStore::new()), "one", 0, 1, &CpuOptions::default())?;
    /// assert_eq!(pg.p2p_route(0), Route::Local);
    /// # Ok::<(), tensorcomm::Error>(())
    /// ```
    pub fn p2p_route(&self, peer: usize) -> Route {
        self.p2p.route(peer)
    }

    /// The group's shared-memory arena, for collectives that take it.
    fn group_arena(&self) -> collectives::GroupArena {
        #[cfg(target_os = "linux")]
        return self.arena.as_ref().map(|a| a.shm.clone());
        #[cfg(not(target_os = "linux"))]
        None
    }

    /// Takes the next sequence number and queues `body` to run under it
    /// with the fingerprint `fp` (its `seq` is filled in here), on the
    /// group's thread or on a thread that waits on the returned `Work`
    /// first; either way after every earlier collective of the group.
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
        self.shared.recorder.queued(&fp);
        let shared = self.shared.clone();
        let job: Job = Box::new(move || {
            let outcome = {
                let _turn = shared.turn.wait_for(fp.seq);
                let outcome = run(&shared, fp, deadline, body);
                shared.recorder.finished(fp.seq, &outcome);
                outcome
            };
            completion.complete(outcome)
        });
        let job = Arc::new(QueuedJob {
            job: Mutex::new(Some(job)),
        });
        let runner = job.clone();
        let work = work.with_runner(Box::new(move || runner.run_once()));
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

/// Runs one collective (on the group's thread or a waiting caller's): refuses to run on a broken
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
    shared.recorder.started(fp.seq);
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
        // The report goes out before the connections close, so a rank that
        // fails because they closed finds it.
        let source = shared
            .failures
            .settle(&fp, shared.rank, source, transport.mismatched());
        shared.transport.abort();
        let ranks = match &source {
            Error::PeerClosed { peer, .. }
            | Error::PeerTimeout { peer, .. }
            | Error::PeerIo { peer, .. }
            | Error::PeerProtocol { peer, .. }
            | Error::CollectiveMismatch { peer, .. } => vec![*peer],
            Error::RanksMissing { missing, .. } => missing.clone(),
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

/// Slot-half size of a group's arena: [`arena_chunk`], or the bytes in
/// `TENSORCOMM_SHM_ARENA_CHUNK` (suffixes K and M, 4 KiB to 64 MiB) where
/// set, for tuning. Every rank must see the same value: a rank with
/// another one fails setup with an error naming both arena sizes.
#[cfg(target_os = "linux")]
fn arena_chunk_for(size: usize) -> Result<usize> {
    const VAR: &str = "TENSORCOMM_SHM_ARENA_CHUNK";
    let Ok(raw) = std::env::var(VAR) else {
        return Ok(arena_chunk(size));
    };
    crate::tuning::parse_size(&raw)
        .filter(|n| (4 << 10..=64 << 20).contains(n))
        .ok_or_else(|| Error::BadValue {
            name: VAR.into(),
            expected: "a size from 4K to 64M (suffixes K, M)".into(),
            found: raw.clone(),
        })
}

/// Above how many bytes an all-reduce takes the arena: from
/// [`shm_arena_all_reduce_min_bytes`], or `TENSORCOMM_SHM_ARENA_MIN` (a
/// size) where set, for tuning; every rank must see the same value.
#[cfg(target_os = "linux")]
fn arena_all_reduce_min_bytes(world: usize) -> usize {
    static FORCED: std::sync::OnceLock<Option<usize>> = std::sync::OnceLock::new();
    FORCED
        .get_or_init(|| crate::tuning::env_size("TENSORCOMM_SHM_ARENA_MIN", 0..=usize::MAX))
        .unwrap_or_else(|| shm_arena_all_reduce_min_bytes(world))
}

/// The fewest cores any of the `size` ranks may use ([`super::host_cores`],
/// which a container's CPU quota can make differ between ranks of one
/// host), exchanged through the store under `{key_prefix}/arena/cores`.
#[cfg(target_os = "linux")]
fn fewest_cores(
    store: &dyn Store,
    key_prefix: &str,
    rank: usize,
    size: usize,
    timeout: Duration,
) -> Result<usize> {
    let key = |r: usize| format!("{key_prefix}/arena/cores/{r}");
    store.set(&key(rank), super::host_cores().to_string().as_bytes())?;
    let mut fewest = super::host_cores();
    for r in (0..size).filter(|&r| r != rank) {
        let raw = store.get_timeout(&key(r), timeout)?;
        let text = String::from_utf8_lossy(&raw).into_owned();
        let cores = text.parse::<usize>().map_err(|_| Error::BadValue {
            name: key(r),
            expected: "a number of cores".into(),
            found: text.clone(),
        })?;
        fewest = fewest.min(cores.max(1));
    }
    Ok(fewest)
}

/// Threads per rank for an arena all-reduce of `nbytes` over `world`
/// ranks whose fewest cores are `cores` (see [`shm_arena_threads`], and
/// [`shm_symmetric_threads`] for a tensor in symmetric memory), or
/// the number in `TENSORCOMM_SHM_ARENA_THREADS` (1 to 64) where set, for
/// tuning (see [`crate::tuning`]). Every rank must see the same value
/// (the launcher passes its environment on); the all-reduce checks it.
#[cfg(target_os = "linux")]
fn arena_threads(nbytes: usize, world: usize, cores: usize, symmetric: bool) -> usize {
    static FORCED: std::sync::OnceLock<Option<usize>> = std::sync::OnceLock::new();
    let forced = FORCED.get_or_init(|| env_count("TENSORCOMM_SHM_ARENA_THREADS", 1..=64));
    if let Some(n) = forced {
        return *n;
    }
    if symmetric {
        shm_symmetric_threads(nbytes, world, cores)
    } else {
        shm_arena_threads(nbytes, world, cores)
    }
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
        #[cfg(target_os = "linux")]
        let arena = self.arena.clone().filter(|a| {
            tensor.numel() * tensor.dtype().size() > arena_all_reduce_min_bytes(a.shm.world_size())
        });
        self.submit(fp, timeout, move |t, deadline| {
            let dtype = tensor.dtype();
            tensor.with_bytes_mut(|bytes| {
                #[cfg(target_os = "linux")]
                if let Some(arena) = &arena {
                    let symmetric = arena.symmetric.find(bytes);
                    let count = arena_threads(
                        bytes.len(),
                        t.world_size(),
                        arena.cores,
                        symmetric.is_some(),
                    );
                    let threads = ArenaThreads {
                        helpers: &arena.helpers,
                        count,
                    };
                    if let Some((memory, _)) = symmetric {
                        let tensor = SymmetricBytes {
                            memory: &memory,
                            bytes,
                        };
                        return all_reduce_shm_symmetric(
                            t, &arena.shm, tensor, threads, dtype, op, deadline,
                        );
                    }
                    return all_reduce_shm_arena(
                        t, &arena.shm, threads, bytes, dtype, op, deadline,
                    );
                }
                all_reduce(t, bytes, dtype, op, deadline)
            })?
        })
    }

    fn symmetric_zeros(&self, shape: &[usize], dtype: DType) -> Result<Tensor<'static>> {
        #[cfg(target_os = "linux")]
        if let Some(arena) = &self.arena {
            let nbytes = shape
                .iter()
                .try_fold(dtype.size(), |n, &d| n.checked_mul(d))
                .ok_or_else(|| {
                    Error::InvalidArgument(format!(
                        "symmetric_zeros: shape {shape:?} of {dtype} has more bytes than memory can address"
                    ))
                })?;
            let buffer = arena.symmetric.allocate(
                &*self.origin.store,
                &self.origin.key_prefix,
                (self.rank(), self.size()),
                nbytes,
                self.timeout,
            )?;
            return Tensor::from_host_buffer(buffer, dtype, shape);
        }
        Tensor::zeros(shape, dtype)
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
        #[cfg(target_os = "linux")]
        let arena = self
            .arena
            .clone()
            .filter(|_| tensor.numel() * tensor.dtype().size() > SHM_ARENA_BROADCAST_MIN_BYTES);
        self.submit(fp, timeout, move |t, deadline| {
            tensor.with_bytes_mut(|bytes| {
                #[cfg(target_os = "linux")]
                if let Some(arena) = &arena {
                    return broadcast_shm_arena(t, &arena.shm, bytes, root, deadline);
                }
                broadcast_tree(t, bytes, root, deadline)
            })?
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
        #[cfg(target_os = "linux")]
        if let Some(arena) = self
            .arena
            .clone()
            .filter(|_| tensor.nbytes() >= SHM_ARENA_REDUCE_MIN_BYTES)
        {
            // As the arena all-reduce, with only the root copying out (and
            // changing its tensor).
            let tensor = tensor.clone();
            return self.submit(plan.fingerprint, timeout, move |t, deadline| {
                let dtype = tensor.dtype();
                let count = arena_threads(tensor.nbytes(), t.world_size(), arena.cores, false);
                let threads = ArenaThreads {
                    helpers: &arena.helpers,
                    count,
                };
                let reduce = |bytes: &mut [u8]| {
                    reduce_to_root_shm_arena(
                        t, &arena.shm, threads, bytes, dtype, op, root, deadline,
                    )
                };
                if tensor.is_contiguous() {
                    return tensor.with_bytes_mut(reduce)?;
                }
                // Elements in logical order: another rank may hold the same
                // shape in another layout.
                let staged = tensor.contiguous()?;
                staged.with_bytes_mut(reduce)??;
                if t.rank() == root {
                    tensor.copy_from(&staged)?;
                }
                Ok(())
            });
        }
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
        let plan = collectives::gather::plan(
            self.rank(),
            self.size(),
            input,
            outputs,
            root,
            self.group_arena(),
        )?;
        self.submit(plan.fingerprint, timeout, plan.body)
    }

    fn scatter(
        &self,
        output: &Tensor<'static>,
        inputs: Option<&[Tensor<'static>]>,
        root: usize,
        timeout: Option<Duration>,
    ) -> Result<Work> {
        let plan = collectives::scatter::plan(
            self.rank(),
            self.size(),
            output,
            inputs,
            root,
            self.group_arena(),
        )?;
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
        let plan = collectives::all_to_all::plan(
            self.rank(),
            self.size(),
            outputs,
            inputs,
            self.group_arena(),
        )?;
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
            self.group_arena(),
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
        // A one-byte all-reduce: every rank hears from every other, by
        // whichever algorithm is fastest for one byte over this world.
        self.submit(fp, timeout, |t, deadline| {
            all_reduce(t, &mut [0u8], DType::U8, ReduceOp::Max, deadline)
        })
    }

    fn send(
        &self,
        tensor: &Tensor<'static>,
        dst: usize,
        tag: u64,
        timeout: Option<Duration>,
    ) -> Result<Work> {
        check_dense_host("send", tensor)?;
        check_peer_rank("send", dst, self.rank(), self.size())?;
        let timeout = timeout.unwrap_or(self.timeout);
        Ok(self.p2p.send(tensor.clone(), dst, tag, timeout))
    }

    fn recv(
        &self,
        tensor: &Tensor<'static>,
        src: usize,
        tag: u64,
        timeout: Option<Duration>,
    ) -> Result<Work> {
        check_dense_host("recv", tensor)?;
        check_peer_rank("recv", src, self.rank(), self.size())?;
        let timeout = timeout.unwrap_or(self.timeout);
        Ok(self.p2p.recv(tensor.clone(), Some(src), tag, timeout))
    }

    fn recv_any_source(
        &self,
        tensor: &Tensor<'static>,
        tag: u64,
        timeout: Option<Duration>,
    ) -> Result<Work> {
        check_dense_host("recv_any_source", tensor)?;
        if self.size() < 2 {
            return Err(Error::InvalidCollective {
                op: "recv_any_source".into(),
                reason: "expected a group with another rank to receive from, found a group of 1"
                    .into(),
            });
        }
        let timeout = timeout.unwrap_or(self.timeout);
        Ok(self.p2p.recv(tensor.clone(), None, tag, timeout))
    }

    fn monitored_barrier(&self, timeout: Option<Duration>, wait_all: bool) -> Result<Work> {
        let fp = Fingerprint {
            kind: CollectiveKind::MonitoredBarrier,
            reduce_op: 0,
            dtype: None,
            root: 0,
            seq: 0,
            numel: 0,
            shape_hash: 0,
        };
        let tag = self
            .origin
            .monitored_barriers
            .fetch_add(1, Ordering::Relaxed);
        let wait = timeout.unwrap_or(self.timeout);
        let p2p = self.p2p.clone();
        self.submit(fp, timeout, move |_, _| {
            monitored_barrier(&p2p, tag, wait_all, wait)
        })
    }

    fn new_group(&self, ranks: &[usize]) -> Result<Option<Arc<dyn ProcessGroup>>> {
        let group = self.new_subgroup(ranks)?;
        Ok(group.map(|g| Arc::new(g) as Arc<dyn ProcessGroup>))
    }

    fn all_reduce_sparse(
        &self,
        tensor: &SparseTensor,
        op: ReduceOp,
        timeout: Option<Duration>,
    ) -> Result<SparseWork> {
        if op != ReduceOp::Sum {
            return Err(Error::UnsupportedReduceOp {
                op: "all_reduce_sparse".into(),
                reduce_op: op.name().into(),
                what: "sparse tensors (only SUM is)".into(),
            });
        }
        if !tensor.device().is_cpu() {
            return Err(Error::InvalidCollective {
                op: "all_reduce_sparse".into(),
                reason: format!("expected a host tensor, found one on {}", tensor.device()),
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
        let slot: SparseSlot = Arc::default();
        let (input, out) = (tensor.clone(), slot.clone());
        let work = self.submit(fp, timeout, move |t, deadline| {
            let sum = all_reduce_sparse(t, &input, deadline)?;
            *out.lock().unwrap_or_else(PoisonError::into_inner) = Some(sum);
            Ok(())
        })?;
        Ok(SparseWork::new(work, slot))
    }

    fn flight_recorder_json(&self) -> String {
        self.shared.recorder.to_json()
    }
}

impl ProcessGroupCpu {
    /// [`ProcessGroup::new_group`] as a concrete group: a sub-group of the
    /// ranks `ranks` (sorted) with its own store namespace, connections and
    /// sequence numbers; `None` on ranks not in it. Every rank of this
    /// group calls it for every sub-group, in the same order.
    ///
    /// ```
    /// use std::{sync::Arc, thread};
    /// use tensorcomm::cpu::backend::{CpuOptions, ProcessGroupCpu};
    /// use tensorcomm::group::{ProcessGroup, ReduceOp};
    /// use tensorcomm::store::HashStore;
    /// use tensorcomm::tensor::Tensor;
    ///
    /// let store = Arc::new(HashStore::new());
    /// let ranks: Vec<_> = (0..3).map(|rank| {
    ///     let store = store.clone();
    ///     thread::spawn(move || -> tensorcomm::Result<Option<(usize, i32)>> {
    ///         let pg = ProcessGroupCpu::new(store, "pg", rank, 3, &CpuOptions::default())?;
    ///         let Some(odd_out) = pg.new_subgroup(&[2, 0])? else { return Ok(None) };
    ///         let t = Tensor::from_vec(vec![rank as i32], &[1])?;
    ///         odd_out.all_reduce(&t, ReduceOp::Sum, None)?.wait()?;
    ///         Ok(Some((odd_out.rank(), t.to_vec::<i32>()?[0])))
    ///     })
    /// }).collect();
    /// let got: Vec<_> = ranks.into_iter().map(|h| h.join().unwrap()).collect::<Result<_, _>>()?;
    /// assert_eq!(got, [Some((0, 2)), None, Some((1, 2))]);
    /// # Ok::<(), tensorcomm::Error>(())
    /// ```
    pub fn new_subgroup(&self, ranks: &[usize]) -> Result<Option<ProcessGroupCpu>> {
        let members = check_group_ranks(ranks, self.size())?;
        let n = self.origin.subgroups.fetch_add(1, Ordering::Relaxed);
        let Some(rank) = members.iter().position(|&r| r == self.rank()) else {
            return Ok(None);
        };
        let store: Arc<dyn Store> = Arc::new(PrefixStore::new(
            subgroup_prefix(&self.origin.key_prefix, n),
            self.origin.store.clone(),
        ));
        let group = ProcessGroupCpu::new(store, "pg", rank, members.len(), &self.origin.options)?;
        Ok(Some(group))
    }
}
