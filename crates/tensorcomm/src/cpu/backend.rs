//! The CPU process group: collectives on host tensors (and on CUDA
//! tensors, staged through pinned host memory by `cuda::staged`) over a
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
use std::sync::{Arc, OnceLock};
use std::time::Duration;

#[cfg(target_os = "linux")]
use super::group_arena::GroupArena;
use super::group_backend::CpuBackend;
use super::p2p::{AfterRecv, BeforeSend, P2p};
use super::select::Selection;
use super::setup_watch;
use super::transport::shm::ShmWait;
use super::transport::{
    Route, RoutedTransport, RoutedTransportOptions, TcpTransportOptions, TransportChoice,
};
use crate::env_vars::EnvVar;
use crate::group::collective::{Capabilities, Collective, Scope, Validated};
use crate::group::engine::Engine;
use crate::group::validate::{check_dense, check_peer_rank};
use crate::group::{check_group_ranks, subgroup_prefix, FlightRecorder, SparseSlot, SparseWork};
use crate::group::{Backend, ProcessGroup, ReduceOp, Work, DEFAULT_COLLECTIVE_TIMEOUT};
use crate::store::{PrefixStore, Store};
use crate::tensor::{DType, SparseTensor, Tensor};
use crate::{Error, Result};

/// How a [`ProcessGroupCpu`] is set up.
#[derive(Clone, Debug)]
pub struct CpuOptions {
    /// Default per-collective timeout (also bounds setup).
    pub timeout: Duration,
    /// The address other ranks reach this one at (see
    /// [`TcpTransportOptions::advertise_host`]).
    pub advertise_host: String,
    /// Listen on every interface (see [`TcpTransportOptions::bind_all`]);
    /// `None`: `TENSORCOMM_BIND_ALL`.
    pub bind_all: Option<bool>,
    /// The job's token that TCP connections between ranks prove (see
    /// [`TcpTransportOptions::token`]); by default
    /// `$TENSORCOMM_STORE_TOKEN` if set and not empty.
    pub token: Option<crate::job_token::JobToken>,
    /// Which transport connects which ranks; by default
    /// ([`TransportChoice::Env`]) whatever `TENSORCOMM_TRANSPORT` says
    /// (`auto`, `tcp` or `shm`), `auto` when it is unset.
    pub transport: TransportChoice,
    /// TCP connections per pair of ranks for collectives (see
    /// [`TcpTransportOptions::lanes`]); `None`: `TENSORCOMM_TCP_LANES`, or
    /// chosen from the host's cores.
    pub tcp_lanes: Option<usize>,
    /// The device path for CUDA tensors: with `Some`, the group sets up
    /// peer memory ([`cuda::intranode`](crate::cuda::intranode)) on this
    /// rank's GPU when it is created, and a dense SUM or AVG all_reduce
    /// whose every rank passes an eligible CUDA tensor then runs on the
    /// GPUs with no host staging (each all_reduce starts with a
    /// one-element vote of the ranks); other calls are staged through host
    /// memory. A group whose ranks cannot use peer memory is created
    /// without it ([`ProcessGroupCpu::intranode_reason`] says why).
    /// `None` (the default): every CUDA tensor is staged through host
    /// memory, and only all_reduces of 2 MiB or more vote, in groups one
    /// of whose ranks runs on a host with NVIDIA GPUs (or asked for peer
    /// memory): when some rank stages a contiguous CUDA tensor, they are
    /// staged in pipelined chunks
    /// ([`ProcessGroupCpu::pipelined_all_reduces`]), on shared GPUs too.
    #[cfg(feature = "cuda")]
    pub peer_memory: Option<PeerMemory>,
}

/// See [`CpuOptions::peer_memory`].
///
/// ```
/// use tensorcomm::cpu::backend::{CpuOptions, PeerMemory};
/// let options = CpuOptions {
///     peer_memory: Some(PeerMemory { device: 0, options: Default::default() }),
///     ..CpuOptions::default()
/// };
/// assert_eq!(options.peer_memory.unwrap().device, 0);
/// ```
#[cfg(feature = "cuda")]
#[derive(Clone, Debug)]
pub struct PeerMemory {
    /// This rank's GPU, where its CUDA tensors are.
    pub device: usize,
    /// How the peer memory is set up (which groups qualify, its buffer,
    /// how long a kernel waits for a peer).
    pub options: crate::cuda::intranode::IntraNodeOptions,
}

impl Default for CpuOptions {
    fn default() -> Self {
        CpuOptions {
            timeout: DEFAULT_COLLECTIVE_TIMEOUT,
            advertise_host: "127.0.0.1".into(),
            bind_all: None,
            token: crate::job_token::JobToken::from_env(),
            transport: TransportChoice::default(),
            tcp_lanes: None,
            #[cfg(feature = "cuda")]
            peer_memory: None,
        }
    }
}

/// What decides whether a group polls when idle: its size, this rank's
/// `TENSORCOMM_SHM_WAIT`, the ranks on this host (the group's own there,
/// all of them when TCP is forced and the routes do not say, or the
/// launcher's `LOCAL_WORLD_SIZE` when larger: a sub-group's ranks share
/// the host with the rest of the job), the host's CPUs online and the
/// CPUs this process may use.
#[derive(Clone, Copy, Debug)]
struct PollRule {
    size: usize,
    wait: ShmWait,
    local_ranks: usize,
    cpus_online: usize,
    cores: usize,
}

impl PollRule {
    /// How long the group polls when idle
    /// ([`GroupBackend::idle_spin`](crate::group::backend::GroupBackend::idle_spin)):
    /// [`IDLE_SPIN`](super::group_backend::IDLE_SPIN) when the group has
    /// peers to hand calls to, its rank does not wait by `sleep`, the host
    /// has two CPUs online for each of its ranks (a caller and a group
    /// thread each) and this process may use two (a rank pinned to one
    /// core would only delay itself); zero otherwise.
    fn idle_spin(self) -> Duration {
        let polls = self.size > 1
            && self.wait != ShmWait::Sleep
            && self.local_ranks.saturating_mul(2) <= self.cpus_online
            && self.cores >= 2;
        if polls {
            super::group_backend::IDLE_SPIN
        } else {
            Duration::ZERO
        }
    }
}

/// The launcher's `LOCAL_WORLD_SIZE` (torchrun's too), if set to a number.
fn launcher_local_ranks() -> Option<usize> {
    std::env::var("LOCAL_WORLD_SIZE").ok()?.trim().parse().ok()
}

/// Sets up the device path's peer memory when `options` ask for it (every
/// rank of the group calls this at the same point of its creation).
#[cfg(feature = "cuda")]
fn peer_memory(
    store: &dyn Store,
    key_prefix: &str,
    (rank, size): (usize, usize),
    options: &CpuOptions,
) -> Result<(Option<Arc<crate::cuda::intranode::IntraNodeComm>>, String)> {
    use crate::cuda::intranode::IntraNodeComm;
    let Some(asked) = &options.peer_memory else {
        return Ok((None, "not asked for (CpuOptions::peer_memory)".into()));
    };
    match IntraNodeComm::new(store, key_prefix, rank, size, asked.device, &asked.options) {
        Ok(comm) => Ok((Some(Arc::new(comm)), String::new())),
        Err(crate::Error::IntraNodeUnavailable { reason }) => {
            tracing::info!(rank, %reason, "CPU group: no device path for CUDA tensors");
            Ok((None, reason))
        }
        Err(e) => Err(e),
    }
}

/// How old a shared-memory name of an ended process must be before a new
/// group removes it (a set-up in progress keeps its names far shorter).
#[cfg(target_os = "linux")]
const ORPHAN_AGE: Duration = Duration::from_secs(60);

/// Ring capacity per direction of a point-to-point shared-memory link: a
/// quarter of a collective link's (larger messages stream through it), as
/// every group keeps a second mesh of links for point-to-point messages.
const P2P_SHM_CAPACITY: usize = 1 << 20;

/// What the CPU group takes: host tensors, and CUDA tensors where CUDA is
/// built in (staged through pinned host memory, see `cuda::staged`).
#[cfg(feature = "cuda")]
const GROUP_CAPS: Capabilities = Capabilities::HOST_AND_CUDA;
#[cfg(not(feature = "cuda"))]
const GROUP_CAPS: Capabilities = Capabilities::HOST;

/// The CPU backend's [`ProcessGroup`].
pub struct ProcessGroupCpu {
    /// Kept for the group's lifetime: on rank 0 of a TCP rendezvous this
    /// is the store server, which slower ranks may still be reading.
    _store: Arc<dyn Store>,
    scope: Scope,
    engine: Engine,
    backend: Arc<CpuBackend>,
    /// The global rank of each rank of this group.
    global_ranks: Vec<usize>,
    /// What `new_group` needs to set up sub-groups.
    origin: Origin,
}

/// Where a group's sub-groups meet: the parent's store and key prefix,
/// its options, and how many sub-groups it has created.
struct Origin {
    store: Arc<dyn Store>,
    key_prefix: String,
    options: CpuOptions,
    subgroups: AtomicU64,
    /// The global rank whose process hosts the store, if one does.
    store_host: OnceLock<usize>,
    /// The store of the group that has no parent, where rendezvous posts
    /// each rank's process record (see `setup_watch`).
    records: Arc<dyn Store>,
}

impl std::fmt::Debug for ProcessGroupCpu {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProcessGroupCpu")
            .field("rank", &self.scope.rank)
            .field("size", &self.scope.size)
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
        let global_ranks = (0..size).collect();
        Self::connect(
            (store.clone(), store),
            key_prefix,
            (rank, size),
            options,
            global_ranks,
            &EnvVar::get_lossy,
        )
    }

    /// Sets up the group. `env` looks up `TENSORCOMM_SHM_WAIT`, the only
    /// variable read through it (the others are read from the process's
    /// environment where they are used): the process's environment too
    /// ([`EnvVar::get_lossy`], so a value that is not Unicode fails as a
    /// bad value) but in tests.
    fn connect(
        (store, records): (Arc<dyn Store>, Arc<dyn Store>),
        key_prefix: &str,
        (rank, size): (usize, usize),
        options: &CpuOptions,
        global_ranks: Vec<usize>,
        env: &dyn Fn(&EnvVar) -> Option<String>,
    ) -> Result<Self> {
        let recorder = FlightRecorder::from_env(rank, size, key_prefix)?;
        // How this rank waits in shared memory, on its links and in the
        // arena: its own business, so not agreed; read before anything is
        // posted, so a bad value fails nothing but this rank's set-up.
        let shm_wait = ShmWait::from_vars(env)?;
        // Set-up waits say what they wait for and fail at once when a
        // peer's process is gone (see `setup_watch`).
        let _watch = setup_watch::enter(records.clone(), key_prefix, rank, &global_ranks);
        // A store host that stops answering fails the set-up within the
        // group's timeout, naming the host (see `store/tcp/reply_grace.rs`).
        let _grace = crate::store::tcp::reply_grace::set_up_on_this_thread(options.timeout);
        let setup_store = setup_watch::setup_store(&*store);
        // Names a crashed set-up left in /dev/shm (older than a set-up takes).
        #[cfg(target_os = "linux")]
        crate::cpu::transport::shm::reclaim_orphans(ORPHAN_AGE);
        let (select, choice) = Selection::agreed_from_env(
            &setup_store,
            key_prefix,
            (rank, size),
            options.timeout,
            options.transport,
        )?;
        let routed = |lanes, shm_capacity| RoutedTransportOptions {
            choice,
            tcp: TcpTransportOptions {
                advertise_host: options.advertise_host.clone(),
                bind_all: options.bind_all,
                token: options.token.clone(),
                timeout: options.timeout,
                lanes,
            },
            shm_capacity,
            shm_wait,
            host_identity: None,
        };
        let transport = RoutedTransport::connect(
            &setup_store,
            key_prefix,
            rank,
            size,
            &routed(options.tcp_lanes, None),
        )?;
        // A reader thread per peer waits on each point-to-point
        // connection: one lane.
        let p2p = P2p::connect(
            &setup_store,
            &format!("{key_prefix}/p2p"),
            rank,
            size,
            &routed(Some(1), Some(P2P_SHM_CAPACITY)),
        )?;
        #[cfg(target_os = "linux")]
        let arena = if size > 1 && (0..size).all(|p| p == rank || transport.route(p) == Route::Shm)
        {
            Some(Arc::new(GroupArena::connect(
                &setup_store,
                key_prefix,
                (rank, size),
                select.arena_chunk(),
                shm_wait,
                options.timeout,
            )?))
        } else {
            None
        };
        #[cfg(feature = "cuda")]
        let (peer, peer_reason) = peer_memory(&setup_store, key_prefix, (rank, size), options)?;
        // Posted by every rank, with CUDA built in or not (see
        // `pipeline_choice`); used where it is.
        use super::pipeline_choice::{group_votes, MayStage};
        let pipelines = group_votes(
            &setup_store,
            key_prefix,
            (rank, size),
            options.timeout,
            MayStage::of_this_rank(options),
        )?;
        #[cfg(not(feature = "cuda"))]
        let _ = pipelines;
        // Over TCP forced (or off Linux) the routes do not say which peers
        // share this host: count them all.
        let routes_tell_hosts = cfg!(target_os = "linux") && choice != TransportChoice::Tcp;
        let on_this_host = if routes_tell_hosts {
            (0..size)
                .filter(|&p| p == rank || transport.route(p) == Route::Shm)
                .count()
        } else {
            size
        };
        let idle_spin = PollRule {
            size,
            wait: shm_wait,
            local_ranks: on_this_host.max(launcher_local_ranks().unwrap_or(0)),
            cpus_online: super::host_cpus_online(),
            cores: super::host_cores(),
        }
        .idle_spin();
        let backend = Arc::new(CpuBackend {
            transport,
            p2p: Arc::new(p2p),
            select,
            #[cfg(target_os = "linux")]
            arena,
            #[cfg(feature = "cuda")]
            rank,
            #[cfg(feature = "cuda")]
            staging: Default::default(),
            #[cfg(feature = "cuda")]
            peer,
            #[cfg(feature = "cuda")]
            peer_reason,
            #[cfg(feature = "cuda")]
            pipelines,
            #[cfg(feature = "cuda")]
            chunked: Default::default(),
            idle_spin,
        });
        super::close_at_exit::register(&backend);
        let engine = Engine::start(
            backend.clone(),
            store.clone(),
            key_prefix,
            (rank, size),
            recorder,
            options.timeout,
        )?;
        Ok(ProcessGroupCpu {
            origin: Origin {
                store: store.clone(),
                key_prefix: key_prefix.into(),
                options: options.clone(),
                subgroups: AtomicU64::new(0),
                store_host: OnceLock::new(),
                records,
            },
            _store: store,
            scope: Scope {
                rank,
                size,
                caps: GROUP_CAPS,
            },
            engine,
            backend,
            global_ranks,
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
        self.backend.transport.route(peer)
    }

    /// The group's peer memory for the device path, when it was asked for
    /// ([`CpuOptions::peer_memory`]) and the ranks qualify.
    #[cfg(feature = "cuda")]
    pub fn intranode(&self) -> Option<&crate::cuda::intranode::IntraNodeComm> {
        self.backend.peer.as_deref()
    }

    /// How many all_reduces this rank ran in pipelined chunks: in a group
    /// one of whose ranks runs on a host with NVIDIA GPUs (or created with
    /// [`CpuOptions::peer_memory`]), an all_reduce of 2 MiB or more that
    /// some rank passes a CUDA tensor to, every rank's tensor contiguous,
    /// and not on peer memory, is staged chunk by chunk, its copies
    /// overlapping the host reduction (ranks with host tensors cut theirs
    /// the same way).
    ///
    /// ```
    /// use tensorcomm::cpu::backend::{CpuOptions, ProcessGroupCpu};
    /// use tensorcomm::store::HashStore;
    /// let pg = ProcessGroupCpu::new(std::sync::Arc::new(HashStore::new()), "doc", 0, 1, &CpuOptions::default())?;
    /// assert_eq!(pg.pipelined_all_reduces(), 0);
    /// # Ok::<(), tensorcomm::Error>(())
    /// ```
    #[cfg(feature = "cuda")]
    pub fn pipelined_all_reduces(&self) -> u64 {
        self.backend
            .chunked
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Why [`intranode`](ProcessGroupCpu::intranode) is `None` (empty when
    /// it is not).
    #[cfg(feature = "cuda")]
    pub fn intranode_reason(&self) -> &str {
        &self.backend.peer_reason
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
        self.backend.p2p.route(peer)
    }

    /// Queues a validated call. A call's CUDA tensors must be on one GPU
    /// (checked here, on the calling rank, before anything is sent).
    fn submit(&self, call: Validated, timeout: Option<Duration>) -> Result<Work> {
        #[cfg(feature = "cuda")]
        crate::cuda::staged::gpu_of(call.fingerprint.kind.name(), &call.collective)?;
        self.engine.submit(call, timeout)
    }

    /// What a send of `tensor` sends from, and what it waits for first:
    /// the tensor itself, or for a CUDA tensor its host copy, whose copy
    /// down is queued now (after the caller's current stream).
    fn send_source(
        &self,
        tensor: &Tensor<'static>,
    ) -> Result<(Tensor<'static>, Option<BeforeSend>)> {
        #[cfg(feature = "cuda")]
        if let crate::tensor::Device::Cuda(gpu) = tensor.device() {
            let staged =
                crate::cuda::staged::StagedP2p::send(self.backend.staging.device(gpu)?, tensor)?;
            let host = staged.host().clone();
            return Ok((host, Some(Box::new(move || staged.wait_copied_down()))));
        }
        Ok((tensor.clone(), None))
    }

    /// What a receive into `tensor` receives into, and what it does once
    /// the message has landed: the tensor itself, or for a CUDA tensor a
    /// host copy that is then copied up (after the work queued so far on
    /// the caller's current stream).
    fn recv_target(
        &self,
        tensor: &Tensor<'static>,
    ) -> Result<(Tensor<'static>, Option<AfterRecv>)> {
        #[cfg(feature = "cuda")]
        if let crate::tensor::Device::Cuda(gpu) = tensor.device() {
            let staged =
                crate::cuda::staged::StagedP2p::recv(self.backend.staging.device(gpu)?, tensor)?;
            let host = staged.host().clone();
            return Ok((host, Some(Box::new(move || staged.copy_up()))));
        }
        Ok((tensor.clone(), None))
    }
}

impl ProcessGroup for ProcessGroupCpu {
    fn rank(&self) -> usize {
        self.scope.rank
    }

    fn size(&self) -> usize {
        self.scope.size
    }

    fn backend(&self) -> Backend {
        Backend::Cpu
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
        let call = Collective::all_reduce(&self.scope, tensor, op)?;
        self.submit(call, timeout)
    }

    fn symmetric_zeros(&self, shape: &[usize], dtype: DType) -> Result<Tensor<'static>> {
        #[cfg(target_os = "linux")]
        if let Some(arena) = &self.backend.arena {
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
                self.engine.default_timeout(),
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
        let call = Collective::broadcast(&self.scope, tensor, root)?;
        self.submit(call, timeout)
    }

    fn reduce(
        &self,
        tensor: &Tensor<'static>,
        root: usize,
        op: ReduceOp,
        timeout: Option<Duration>,
    ) -> Result<Work> {
        let call = Collective::reduce(&self.scope, tensor, root, op)?;
        self.submit(call, timeout)
    }

    fn all_gather(
        &self,
        outputs: &[Tensor<'static>],
        input: &Tensor<'static>,
        timeout: Option<Duration>,
    ) -> Result<Work> {
        let call = Collective::all_gather(&self.scope, outputs, input)?;
        self.submit(call, timeout)
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
        let call = Collective::gather(&self.scope, input, outputs, root)?;
        self.submit(call, timeout)
    }

    fn scatter(
        &self,
        output: &Tensor<'static>,
        inputs: Option<&[Tensor<'static>]>,
        root: usize,
        timeout: Option<Duration>,
    ) -> Result<Work> {
        let call = Collective::scatter(&self.scope, output, inputs, root)?;
        self.submit(call, timeout)
    }

    fn reduce_scatter(
        &self,
        output: &Tensor<'static>,
        inputs: &[Tensor<'static>],
        op: ReduceOp,
        timeout: Option<Duration>,
    ) -> Result<Work> {
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
        let call = Collective::reduce_scatter_tensor_coalesced(&self.scope, outputs, inputs, op)?;
        self.submit(call, timeout)
    }

    fn all_to_all(
        &self,
        outputs: &[Tensor<'static>],
        inputs: &[Tensor<'static>],
        timeout: Option<Duration>,
    ) -> Result<Work> {
        let call = Collective::all_to_all(&self.scope, outputs, inputs)?;
        self.submit(call, timeout)
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
        let call = Collective::all_reduce_coalesced(&self.scope, tensors, op)?;
        self.submit(call, timeout)
    }

    fn barrier(&self, timeout: Option<Duration>) -> Result<Work> {
        self.engine.submit(Collective::barrier(), timeout)
    }

    fn send(
        &self,
        tensor: &Tensor<'static>,
        dst: usize,
        tag: u64,
        timeout: Option<Duration>,
    ) -> Result<Work> {
        check_dense("send", tensor, self.scope.caps)?;
        check_peer_rank("send", dst, self.rank(), self.size())?;
        let timeout = timeout.unwrap_or(self.engine.default_timeout());
        let (source, before) = self.send_source(tensor)?;
        Ok(self.backend.p2p.send(source, dst, tag, timeout, before))
    }

    fn recv(
        &self,
        tensor: &Tensor<'static>,
        src: usize,
        tag: u64,
        timeout: Option<Duration>,
    ) -> Result<Work> {
        check_dense("recv", tensor, self.scope.caps)?;
        check_peer_rank("recv", src, self.rank(), self.size())?;
        let timeout = timeout.unwrap_or(self.engine.default_timeout());
        let (target, after) = self.recv_target(tensor)?;
        Ok(self
            .backend
            .p2p
            .recv(target, Some(src), tag, timeout, after))
    }

    fn recv_any_source(
        &self,
        tensor: &Tensor<'static>,
        tag: u64,
        timeout: Option<Duration>,
    ) -> Result<Work> {
        check_dense("recv_any_source", tensor, self.scope.caps)?;
        if self.size() < 2 {
            return Err(Error::InvalidCollective {
                op: "recv_any_source".into(),
                reason: "expected a group with another rank to receive from, found a group of 1"
                    .into(),
            });
        }
        let timeout = timeout.unwrap_or(self.engine.default_timeout());
        let (target, after) = self.recv_target(tensor)?;
        Ok(self.backend.p2p.recv(target, None, tag, timeout, after))
    }

    fn monitored_barrier(&self, timeout: Option<Duration>, wait_all: bool) -> Result<Work> {
        let wait = timeout.unwrap_or(self.engine.default_timeout());
        self.engine
            .submit(Collective::monitored_barrier(wait_all, wait), timeout)
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
        let slot: SparseSlot = Arc::default();
        let call = Collective::all_reduce_sparse(&self.scope, tensor, op, slot.clone())?;
        let work = self.submit(call, timeout)?;
        Ok(SparseWork::new(work, slot))
    }

    fn flight_recorder_json(&self) -> String {
        self.engine.flight_recorder_json()
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
        let global_ranks = members.iter().map(|&r| self.global_ranks[r]).collect();
        let group = ProcessGroupCpu::connect(
            (store, self.origin.records.clone()),
            "pg",
            (rank, members.len()),
            &self.origin.options,
            global_ranks,
            &EnvVar::get_lossy,
        )?;
        if let Some(&host) = self.origin.store_host.get() {
            group.set_store_host(host);
        }
        Ok(Some(group))
    }

    /// Says that global rank `host` hosts the store (`env://` and `tcp://`:
    /// rank 0), so that a failure that finds the store gone names it (see
    /// `group/failure_report.rs`); sub-groups created later inherit it.
    pub(crate) fn set_store_host(&self, host: usize) {
        let _ = self.origin.store_host.set(host);
        if let Some(rank) = self.global_ranks.iter().position(|&g| g == host) {
            self.engine.set_store_host(rank);
        }
    }
}

#[cfg(all(test, target_os = "linux"))]
mod tests;

#[cfg(all(test, feature = "cuda", target_os = "linux"))]
mod vote_tests;
