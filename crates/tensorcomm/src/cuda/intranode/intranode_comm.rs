//! [`IntraNodeComm`]: the all-reduce of the ranks of one host through
//! symmetric memory, one kernel per call (the large kernel loops over
//! chunks of the buffer), stream-ordered like any CUDA operation.

use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use super::algorithm::{AlgoChoice, AlgoUsage, AllReduceAlgo, UsageCounters};
use super::graph_inputs::{GraphInputs, Registration};
use super::registering_capture::RegisteringCapture;
use super::symmetric_memory::{Rendezvous, SymmetricMemory, GRAPH_REGION};
use super::topology::{settings_line, PeerPolicy};
use crate::cuda::kernels::{
    large_slot_bytes, peer_all_reduce, peer_dtype_supported, peer_max_blocks, push_grid, PeerArgs,
    PeerOp, Shot, PEER_STOPPED, PUSH_SLOT_BYTES, REG_UNREGISTERED,
};
use crate::cuda::runtime::{
    self, current_stream, CapturedGraph, Context, DevicePtr, Event, MappedWords, Stream,
};
use crate::group::ReduceOp;
use crate::store::Store;
use crate::tensor::{Device, Tensor};
use crate::{env_vars, Error, Result};

/// Host word the kernels poll: nonzero stops them.
const ABORT: usize = 0;
/// Host word a stopped kernel leaves: `code << 16 | peer` (1 the peer
/// did not arrive in time, 2 aborted, 4 a registered call whose slot was
/// never written, [`REG_UNREGISTERED`]); the host leaves [`NOT_QUEUED`]
/// (3).
const STATUS: usize = 1;
/// [`STATUS`] code of a communicator one of whose calls failed to queue
/// on this rank: the peers' kernels of that call wait for it, so this
/// rank's later calls would pair with the wrong ones.
const NOT_QUEUED: u32 = 3;

/// How an [`IntraNodeComm`] is set up.
#[derive(Clone, Debug)]
pub struct IntraNodeOptions {
    /// Which groups may use peer memory; `None`: `TENSORCOMM_INTRANODE`.
    pub policy: Option<PeerPolicy>,
    /// How algorithms are chosen; `None`: `TENSORCOMM_INTRANODE_ALGO`.
    pub algo: Option<AlgoChoice>,
    /// Bytes of each of the two buffer regions of every rank for eager
    /// calls (captured ones use a third, twice as large); `None`:
    /// `TENSORCOMM_INTRANODE_REGION`, else 16 MiB. The large kernel moves
    /// messages in chunks of a region, eager or captured.
    pub region_bytes: Option<usize>,
    /// How long set-up (and a registration of
    /// [`capture_registered`](IntraNodeComm::capture_registered)) waits
    /// for the other ranks, and how long a kernel
    /// waits for a peer before it stops with
    /// [`Error::IntraNodeFailed`]; `None` for the kernel: until
    /// [`IntraNodeComm::abort`].
    pub timeout: Duration,
    /// See [`timeout`](IntraNodeOptions::timeout).
    pub kernel_timeout: Option<Duration>,
    /// Whether kernels are launched as programmatic dependent launches
    /// (scheduled while the kernel before them on the stream still runs,
    /// waiting for it on the GPU), where the GPU has them (compute
    /// capability 9.0 and later) and each rank has a GPU of its own;
    /// `None`: `TENSORCOMM_INTRANODE_OVERLAP`, else yes. Such a kernel
    /// lets the next kernel on the stream be scheduled as it starts: a
    /// kernel of yours launched after it as a programmatic dependent
    /// launch must wait for it (`cudaGridDependencySynchronize`) before
    /// reading the result, as CUDA requires of every such launch.
    pub overlap_launches: Option<bool>,
}

impl Default for IntraNodeOptions {
    fn default() -> Self {
        IntraNodeOptions {
            policy: None,
            algo: None,
            region_bytes: None,
            timeout: Duration::from_secs(300),
            kernel_timeout: Some(Duration::from_secs(300)),
            overlap_launches: None,
        }
    }
}

/// Which stream the last call ran on, so a call on another stream is
/// ordered after it.
#[derive(Default)]
struct LastCall {
    stream: Option<Stream>,
    /// Eager calls so far: picks the region (they alternate).
    eager: u64,
    /// Where another rank is a thread of this process on this GPU: passes
    /// when this rank's last eager call has run (see `launch`).
    done: Option<Event>,
}

/// All-reduce through memory every rank of one host maps: the seed's
/// IntraNodeComm. Set up collectively with [`new`](IntraNodeComm::new)
/// (every rank of the group calls it); then every rank calls
/// [`all_reduce`](IntraNodeComm::all_reduce) in the same order with
/// tensors of the same size. Calls are queued on the caller's current
/// stream and may be captured in a CUDA graph.
///
/// A call's kernel waits on the GPU for the other ranks' kernels of the
/// same call. Ranks that are threads of one process sharing a GPU must
/// each queue on their own stream, and need as many hardware queues as
/// ranks (set `CUDA_DEVICE_MAX_CONNECTIONS`, default 8, before CUDA starts):
/// two ranks' kernels in one queue would wait for each other. Such ranks
/// must also not call CUDA functions that wait for the whole device
/// (freeing device or pinned memory, `cuCtxSynchronize`) while a call is
/// queued: the device waits for that very rank. Each such rank queues an
/// eager call only once its last one has run (the call waits on the host
/// for it): with 1000 calls queued back to back by each of two such ranks
/// (on one and on two H200s), and with 100 by each of two or 20 by each of
/// four (on four H200s, 32 hardware queues, every launch having returned
/// at once), one rank's first kernel did not start while the other's
/// waited for it, most likely because a rank's second kernel, waiting in a
/// hardware queue behind its first, held up a peer's first kernel queued
/// behind it. So each such rank needs a host thread of its own (one thread
/// queuing for two ranks would wait for the first rank's call, which waits
/// for the second's). Graph replays by such ranks should also be one at a
/// time, and an eager call right after a replay is not made to wait for
/// it. Ranks that are processes have contexts of their own and queue
/// calls back to back.
///
/// ```no_run
/// use tensorcomm::cuda::intranode::{IntraNodeComm, IntraNodeOptions};
/// use tensorcomm::group::ReduceOp;
/// use tensorcomm::rendezvous::rendezvous;
/// use tensorcomm::tensor::{DType, Device, Tensor};
///
/// // Every rank of this host, one GPU each, under `tensorcomm run`.
/// let r = rendezvous("env://", std::time::Duration::from_secs(60))?;
/// let (rank, world) = (r.rank, r.world_size);
/// let comm = IntraNodeComm::new(&*r.store, "tp", rank, world, rank, &IntraNodeOptions::default())?;
/// let t = Tensor::zeros_on(&[4096], DType::BF16, Device::Cuda(rank))?;
/// let algo = comm.all_reduce(&t, ReduceOp::Sum)?; // queued on the current stream
/// comm.synchronize()?;
/// println!("ran {algo:?}; usage so far {:?}", comm.usage());
/// # Ok::<(), tensorcomm::Error>(())
/// ```
pub struct IntraNodeComm {
    rank: usize,
    world: usize,
    device: usize,
    ctx: std::sync::Arc<Context>,
    algo: AlgoChoice,
    kernel_timeout: Option<Duration>,
    /// Kernels go out as programmatic dependent launches (see
    /// [`IntraNodeOptions::overlap_launches`]).
    overlap_launches: bool,
    words: MappedWords,
    last: Mutex<LastCall>,
    usage: UsageCounters,
    /// The store keys' prefix, and how long a registration waits for the
    /// other ranks.
    prefix: String,
    timeout: Duration,
    /// Registered captured calls: their table and the peers' tensors
    /// mapped (dropped after the kernels using them have finished).
    graph_inputs: Mutex<GraphInputs>,
    /// Declared last: dropped after the kernels using it have finished.
    memory: SymmetricMemory,
}

impl std::fmt::Debug for IntraNodeComm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IntraNodeComm")
            .field("rank", &self.rank)
            .field("world", &self.world)
            .field("device", &self.device)
            .finish_non_exhaustive()
    }
}

impl IntraNodeComm {
    /// Sets up rank `rank` of `world` on GPU `device`, meeting the others
    /// through `store` under `key_prefix`. Fails on every rank with
    /// [`Error::IntraNodeUnavailable`] naming the reason when the group
    /// cannot use peer memory (see [`PeerPolicy`]). A rank that fails
    /// before meeting the others (bad options, no GPU, kernels that do not
    /// load) posts its failure, so that the others fail at once naming it
    /// instead of waiting for it.
    pub fn new(
        store: &dyn Store,
        key_prefix: &str,
        rank: usize,
        world: usize,
        device: usize,
        options: &IntraNodeOptions,
    ) -> Result<IntraNodeComm> {
        // A set-up: its store calls are bounded by its timeout.
        let _set_up = crate::store::tcp::reply_grace::set_up_on_this_thread(options.timeout);
        let prefix = format!("{key_prefix}/intranode");
        let Prepared {
            policy,
            algo,
            region,
            overlap,
            ctx,
            words,
        } = match prepare(device, options) {
            Ok(p) => p,
            Err(e) => {
                Rendezvous::post_failure(store, &prefix, rank, &e);
                return Err(e);
            }
        };
        let memory = Rendezvous {
            store,
            prefix: &prefix,
            rank,
            world,
            device,
            policy,
            settings: settings_line(policy, &format!("{algo:?}"), region),
            region,
            timeout: options.timeout,
        }
        .run()?;
        // Ranks sharing a GPU need every rank's kernel resident at once;
        // a next kernel scheduled early would hold resources they count on.
        let overlap_launches = overlap && ctx.capability().0 >= 9 && memory.ranks_per_gpu() == 1;
        Ok(IntraNodeComm {
            rank,
            world,
            device,
            ctx,
            algo,
            kernel_timeout: options.kernel_timeout,
            overlap_launches,
            words,
            last: Mutex::default(),
            usage: UsageCounters::default(),
            prefix,
            timeout: options.timeout,
            graph_inputs: Mutex::default(),
            memory,
        })
    }

    /// This rank.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// The number of ranks.
    pub fn world(&self) -> usize {
        self.world
    }

    /// This rank's GPU.
    pub fn device(&self) -> usize {
        self.device
    }

    /// Whether this rank's kernels go out as programmatic dependent
    /// launches (see [`IntraNodeOptions::overlap_launches`]): asked for,
    /// on a GPU of compute capability 9.0 or later, and every rank on a
    /// GPU of its own.
    pub fn overlaps_launches(&self) -> bool {
        self.overlap_launches
    }

    /// How the algorithm is chosen (by size, or forced).
    pub fn algo_choice(&self) -> AlgoChoice {
        self.algo
    }

    /// How many calls each algorithm ran.
    pub fn usage(&self) -> AlgoUsage {
        self.usage.snapshot()
    }

    /// Counts `calls` registered captured calls.
    pub(super) fn count_registered(&self, calls: u64) {
        self.usage.count_registered(calls);
    }

    /// Counts a call its caller sent elsewhere (shows as `none` in
    /// [`usage`](IntraNodeComm::usage)).
    pub(crate) fn count_fallback(&self) {
        self.usage.count(AllReduceAlgo::None);
    }

    /// Why `tensor` cannot be all-reduced with `op` here, or `None`.
    pub fn why_not(&self, tensor: &Tensor<'_>, op: ReduceOp) -> Option<String> {
        if tensor.device() != Device::Cuda(self.device) {
            return Some(format!(
                "expected a tensor on cuda:{}, found one on {}",
                self.device,
                tensor.device()
            ));
        }
        if !peer_dtype_supported(tensor.dtype()) {
            return Some(format!(
                "expected f32, f16 or bf16, found {}",
                tensor.dtype()
            ));
        }
        if peer_op(op).is_none() {
            return Some(format!("expected SUM, AVG, MIN or MAX, found {op:?}"));
        }
        if !tensor.is_contiguous() {
            return Some(format!(
                "expected a contiguous tensor, found shape {:?} with strides {:?}",
                tensor.shape(),
                tensor.strides()
            ));
        }
        // The seed's rule, on the size only: the kernels take any address
        // (element by element where it is not 16-byte aligned), and a
        // rule on addresses, which differ between ranks, could send the
        // ranks of one call down different paths (and hang them).
        if !tensor.nbytes().is_multiple_of(4) {
            return Some(format!(
                "expected a size that is a multiple of 4 bytes, found {} bytes",
                tensor.nbytes()
            ));
        }
        None
    }

    /// The algorithm [`all_reduce`](IntraNodeComm::all_reduce) would run
    /// for `tensor` and `op`, or [`AllReduceAlgo::None`] when it would
    /// refuse them (see [`why_not`](IntraNodeComm::why_not)).
    pub fn select_all_reduce_algo(&self, tensor: &Tensor<'_>, op: ReduceOp) -> AllReduceAlgo {
        if self.why_not(tensor, op).is_some() {
            return AllReduceAlgo::None;
        }
        self.algo
            .pick(tensor.nbytes(), self.memory.region_bytes(), self.world)
    }

    /// Fails with [`Error::IntraNodeFailed`] once a kernel has stopped
    /// (a peer did not arrive in time, or [`abort`](IntraNodeComm::abort)),
    /// or a call failed to queue on this rank.
    pub fn check(&self) -> Result<()> {
        let status = self.words.load(STATUS);
        if status != 0 {
            let peer = status & 0xffff;
            let reason = match status >> 16 {
                1 => format!(
                    "peer rank {peer} did not arrive (reach the barrier or send its data) within {:?}",
                    self.kernel_timeout.unwrap_or_default()
                ),
                NOT_QUEUED => {
                    "a call failed to queue on this rank, so its peers may wait for it".into()
                }
                REG_UNREGISTERED => "a registered call ran whose tensors were never registered".into(),
                _ => format!("aborted while waiting for peer rank {peer}"),
            };
            return Err(Error::IntraNodeFailed {
                rank: self.rank,
                reason,
            });
        }
        if self.words.load(ABORT) != 0 {
            return Err(Error::IntraNodeFailed {
                rank: self.rank,
                reason: "aborted".into(),
            });
        }
        Ok(())
    }

    /// Stops every kernel of this rank that waits for a peer, now and
    /// later: the communicator is unusable afterwards.
    pub fn abort(&self) {
        self.words.store(ABORT, 1);
    }

    /// Waits for the calls queued so far, then [`check`](IntraNodeComm::check)s.
    pub fn synchronize(&self) -> Result<()> {
        let stream = self
            .last
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .stream
            .clone();
        if let Some(s) = stream {
            s.synchronize()?;
        }
        self.check()
    }

    /// Captures into a CUDA graph what `queue` queues on `stream`, where
    /// this communicator's one-shot and two-shot all-reduces read and
    /// write the ranks' tensors themselves at replay, with no copy through
    /// the buffers (as vLLM's registered graph buffers do). Collective:
    /// every rank calls it and captures the same calls in the same order;
    /// once the capture has ended the ranks exchange their captured
    /// tensors through `store` (the one the communicator was set up with)
    /// and map each other's. Push calls (the smallest messages) and the
    /// large kernel are captured as [`Stream::begin_capture`] would; so is
    /// every call beyond the first [`GRAPH_INPUT_SLOTS`](super::GRAPH_INPUT_SLOTS)
    /// registered ones of a communicator. The captured tensors must stay
    /// allocated until every rank's communicator is dropped (the peers keep
    /// them mapped: a process maps each peer allocation once, for all its
    /// communicators). A rank whose tensor CUDA IPC cannot share (a
    /// stream-ordered pool) copies it through its graph region instead,
    /// unless every rank is a thread of one process on one GPU. A rank
    /// that fails to capture or to register, or whose registered calls
    /// differ from the others' (their number, or a call's bytes, dtype or
    /// op), makes every rank fail with its reason (the others with
    /// [`Error::GraphRegistration`]), and no rank keeps its graph; its
    /// slots are given back. (Only a store that fails between
    /// the two rounds of a registration can leave ranks disagreeing: a
    /// rank that kept its graph then stops its replays at the kernel
    /// timeout.) One registering capture at a time per communicator:
    /// another begun while one captures is refused at once; one begun
    /// while one registers waits for it. Only calls queued on `stream`
    /// register (calls on streams forked into the capture are captured as
    /// usual).
    ///
    /// ```no_run
    /// # use tensorcomm::cuda::intranode::{IntraNodeComm, IntraNodeOptions};
    /// # use tensorcomm::cuda::runtime::Stream;
    /// # use tensorcomm::group::ReduceOp;
    /// # use tensorcomm::tensor::{DType, Device, Tensor};
    /// # fn f(comm: &IntraNodeComm, store: &dyn tensorcomm::store::Store) -> tensorcomm::Result<()> {
    /// // 2 MiB: one-shot or two-shot at 2 to 8 ranks (push calls do not register).
    /// let t = Tensor::zeros_on(&[1 << 20], DType::BF16, Device::Cuda(comm.device()))?;
    /// let s = Stream::new(comm.device())?;
    /// let graph = comm.capture_registered(store, &s, |s| {
    ///     comm.all_reduce_on(&t, ReduceOp::Sum, s).map(|_| ())
    /// })?;
    /// // ... write the next input into `t`, then:
    /// graph.launch(&s)?;
    /// s.synchronize()?;
    /// comm.check()?;
    /// assert_eq!(comm.usage().registered, 1);
    /// # Ok(()) }
    /// ```
    pub fn capture_registered(
        &self,
        store: &dyn Store,
        stream: &Stream,
        queue: impl FnOnce(&Stream) -> Result<()>,
    ) -> Result<CapturedGraph> {
        // Refused at once, on this rank alone: the capture under way will
        // register with the peers.
        self.inputs().begin(stream.raw_id())?;
        let mut capture = RegisteringCapture::new(self, store, stream);
        let graph = capture.run(queue);
        let registered = capture.register(graph.as_ref().err());
        let graph = graph?;
        registered?;
        Ok(graph)
    }

    /// Refuses a stream of another GPU than this rank's.
    pub(super) fn check_stream(&self, stream: &Stream, op: &str) -> Result<()> {
        if stream.device() != self.device {
            return Err(Error::InvalidCollective {
                op: op.into(),
                reason: format!(
                    "expected a stream on cuda:{}, found one on cuda:{}",
                    self.device,
                    stream.device()
                ),
            });
        }
        Ok(())
    }

    /// The registered calls' state, locked.
    pub(super) fn inputs(&self) -> std::sync::MutexGuard<'_, GraphInputs> {
        self.graph_inputs
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// The registered calls' state.
    pub(super) fn graph_inputs(&self) -> &Mutex<GraphInputs> {
        &self.graph_inputs
    }

    /// What [`capture_registered`](IntraNodeComm::capture_registered)
    /// registers with the peers.
    pub(super) fn registration<'a>(&'a self, store: &'a dyn Store) -> Registration<'a> {
        Registration {
            store,
            prefix: &self.prefix,
            rank: self.rank,
            world: self.world,
            device: self.device,
            memory: &self.memory,
            timeout: self.timeout,
        }
    }

    /// All-reduces `tensor` in place with `op` across the ranks, queued on
    /// the caller's current stream of the tensor's GPU. Every rank must
    /// call it with the same number of elements, dtype and op.
    pub fn all_reduce(&self, tensor: &Tensor<'_>, op: ReduceOp) -> Result<AllReduceAlgo> {
        let stream = current_stream(self.device)?;
        self.all_reduce_on(tensor, op, &stream)
    }

    /// [`all_reduce`](IntraNodeComm::all_reduce) queued on `stream`.
    pub fn all_reduce_on(
        &self,
        tensor: &Tensor<'_>,
        op: ReduceOp,
        stream: &Stream,
    ) -> Result<AllReduceAlgo> {
        self.check()?;
        if let Some(reason) = self.why_not(tensor, op) {
            return Err(Error::InvalidCollective {
                op: "intra-node all_reduce".into(),
                reason,
            });
        }
        self.check_stream(stream, "intra-node all_reduce")?;
        // Eligible (checked just above): the size alone picks.
        let algo = self
            .algo
            .pick(tensor.nbytes(), self.memory.region_bytes(), self.world);
        if tensor.numel() == 0 {
            return Ok(algo);
        }
        let (_, ptr) = tensor.cuda_ptr()?;
        let peer_op = peer_op(op).expect("checked by why_not");
        if let Err(e) = self.launch(stream, algo, tensor, ptr.addr(), peer_op) {
            self.refuse_later_calls(&e);
            return Err(e);
        }
        // Registered calls are counted once registered too (see
        // `RegisteringCapture::register`).
        self.usage.count(algo);
        Ok(algo)
    }

    /// After a call failed to queue on this rank (the peers may have
    /// queued it and wait for it): the host refuses every later call (a
    /// kernel's own reason, when one stopped first, is kept), and the
    /// device stop word makes kernels already queued or captured in graphs
    /// end at entry, so that none of this rank's later kernels arrives
    /// where the peers wait for the failed call.
    fn refuse_later_calls(&self, why: &Error) {
        self.words
            .compare_exchange(STATUS, 0, NOT_QUEUED << 16 | self.rank as u32);
        let word = self.memory.pads()[self.rank] + (4 * PEER_STOPPED) as u64;
        if let Err(e) = runtime::copy_htod_sync(&self.ctx, DevicePtr(word), &1u32.to_ne_bytes()) {
            tracing::warn!(rank = self.rank, %why, %e, "could not stop this rank's queued peer-memory kernels");
        }
    }

    /// Queues the kernels of one call (a registered one inside a
    /// registering capture, see
    /// [`capture_registered`](IntraNodeComm::capture_registered)).
    fn launch(
        &self,
        stream: &Stream,
        algo: AllReduceAlgo,
        tensor: &Tensor<'_>,
        addr: u64,
        op: PeerOp,
    ) -> Result<()> {
        let capturing = stream.is_capturing()?;
        let mut last = self.last.lock().unwrap_or_else(PoisonError::into_inner);
        let one_at_a_time = !capturing && self.memory.shares_context();
        if one_at_a_time {
            // Ranks that are threads of one process on one GPU share its
            // hardware queues: a rank's second kernel, waiting in a queue
            // behind its first, can hold up a peer's first kernel queued
            // behind it, which the first waits for (seen on H200s with 20
            // to 1000 calls queued per rank). So such a rank queues a call
            // only once its last one has run.
            match &last.done {
                Some(done) => {
                    done.synchronize_during_captures()?;
                    // The last call may have given up meanwhile: this one
                    // is refused then, not queued to end at entry.
                    self.check()?;
                }
                // Made before the kernel is queued: a failure after that
                // would leave peers waiting for a call said not queued.
                None => last.done = Some(Event::new(self.device)?),
            }
        }
        if !capturing {
            if let Some(prev) = &last.stream {
                if !prev.same_as(stream) {
                    // Order after the calls queued on the previous stream.
                    let event = Event::new(self.device)?;
                    prev.record_into(&event)?;
                    stream.wait(&event)?;
                }
            }
        }
        let dtype = tensor.dtype();
        // One kernel a call, whatever the size: large calls loop over
        // chunks of the region inside the kernel.
        // Inside a registering capture, one-shot and two-shot calls take
        // a slot of the graph-input table.
        let table = match algo {
            AllReduceAlgo::OneShot | AllReduceAlgo::TwoShot if capturing => self.inputs().take(
                addr,
                tensor.nbytes(),
                format!("{}/{op:?}", tensor.dtype()),
                stream.raw_id(),
            ),
            _ => None,
        };
        let shot = match algo {
            _ if table.is_some() => Shot::Registered,
            AllReduceAlgo::Push => Shot::Push {
                blocks: push_grid(self.memory.ranks_per_gpu()),
            },
            AllReduceAlgo::OneShot => Shot::One,
            AllReduceAlgo::TwoShot => Shot::Two,
            _ => Shot::Large,
        };
        let region = self.memory.region_bytes();
        let (buf, slot, next_eager) = match shot {
            // The inboxes: no region, and no end barrier in graphs.
            Shot::Push { .. } => (self.memory.inboxes(), PUSH_SLOT_BYTES, last.eager),
            // The ranks' tensors; the graph regions for ranks that stage.
            Shot::Registered => (self.memory.regions(GRAPH_REGION), 0, last.eager),
            // Captured calls: the graph region (as large as both eager
            // regions: the same chunks), and an end barrier.
            _ if capturing => (
                self.memory.regions(GRAPH_REGION),
                large_slot_bytes(self.memory.graph_region_bytes(), self.world),
                last.eager,
            ),
            // Eager large calls begin with a barrier (every rank has
            // finished its previous call), so they take both eager regions
            // (adjacent) and leave the alternation as it was.
            Shot::Large => (
                self.memory.regions(0),
                large_slot_bytes(2 * region, self.world),
                last.eager,
            ),
            // Other eager calls alternate between the two eager regions.
            _ => (
                self.memory.regions((last.eager % 2) as usize),
                0,
                last.eager + 1,
            ),
        };
        let timeout_ns = self.kernel_timeout.map_or(u64::MAX, |t| {
            u64::try_from(t.as_nanos()).unwrap_or(u64::MAX)
        });
        let args = PeerArgs {
            buf,
            pad: self.memory.pads(),
            input: addr,
            output: addr,
            numel: tensor.numel() as u64,
            abort_flag: self.words.device_ptr(ABORT).addr(),
            status: self.words.device_ptr(STATUS).addr(),
            timeout_ns,
            table: table.unwrap_or(0),
            rank: self.rank as u32,
            world: self.world as u32,
            op: op as u32,
            end_barrier: u32::from(capturing),
            io_aligned: u32::from(addr.is_multiple_of(16)),
            slot: slot as u32,
            overlap: u32::from(self.overlap_launches),
        };
        let max_blocks = peer_max_blocks(self.memory.ranks_per_gpu());
        peer_all_reduce(&self.ctx, stream, shot, dtype, &args, max_blocks)?;
        last.eager = next_eager;
        if !capturing {
            last.stream = Some(stream.clone());
        }
        if one_at_a_time {
            // The kernel is queued: a failure to mark its end only loses
            // the wait before the next call.
            let recorded = last.done.as_ref().map(|done| stream.record_into(done));
            if let Some(Err(e)) = recorded {
                tracing::warn!(rank = self.rank, %e, "could not record the end of an intra-node call; the next call will not wait for it");
                last.done = None;
            }
        }
        Ok(())
    }
}

impl IntraNodeComm {
    /// Waits (at most `limit`) for the calls this rank queued outside
    /// graphs, then raises the abort word if they are not done (their
    /// kernels then stop waiting for peers), then waits for them to end.
    /// True when they finished on their own.
    fn drain(&mut self, limit: Duration) -> bool {
        let stream = self
            .last
            .get_mut()
            .unwrap_or_else(PoisonError::into_inner)
            .stream
            .take();
        let Some(s) = stream else {
            return true;
        };
        let Ok(event) = s.record() else {
            // Cannot tell when they end: stop them, then wait.
            self.abort();
            let _ = s.synchronize();
            return false;
        };
        let deadline = Instant::now() + limit;
        while !event.query().unwrap_or(true) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(1));
        }
        let on_time = event.query().unwrap_or(true);
        if !on_time {
            self.abort();
        }
        let _ = event.synchronize();
        on_time
    }
}

/// How long dropping a communicator waits for this rank's queued calls
/// before it stops them.
const DRAIN_LIMIT: Duration = Duration::from_secs(1);

impl Drop for IntraNodeComm {
    /// Lets this rank's queued calls finish ([`DRAIN_LIMIT`] at most), then
    /// stops whatever still waits for a peer, so that no kernel of this
    /// rank uses the memory freed next. The other ranks' kernels are not
    /// waited for: every rank must be done with its calls before any
    /// drops its communicator.
    fn drop(&mut self) {
        if !self.drain(DRAIN_LIMIT) {
            tracing::debug!(
                rank = self.rank,
                "intra-node calls still queued when the communicator was dropped were aborted"
            );
        }
        // Unmapping peers' tensors (ranks in other processes) may wait for
        // the device, which a rank of this process sharing it may keep
        // busy waiting for this one.
        let graph_memory = self
            .graph_inputs
            .get_mut()
            .unwrap_or_else(PoisonError::into_inner)
            .take_memory();
        if self.memory.shares_context() && !graph_memory.1.is_empty() {
            let spawned = std::thread::Builder::new()
                .name("tensorcomm-free".into())
                .spawn(move || drop(graph_memory));
            if let Err(e) = spawned {
                tracing::debug!(%e, "no thread to unmap registered tensors on: unmapped here");
            }
        }
    }
}

/// What [`IntraNodeComm::new`] settles on this rank alone, before meeting
/// the others.
struct Prepared {
    policy: PeerPolicy,
    algo: AlgoChoice,
    /// Bytes of one region, a multiple of 4096.
    region: usize,
    /// Programmatic dependent launches asked for (the GPU and the ranks
    /// per GPU decide too).
    overlap: bool,
    ctx: std::sync::Arc<Context>,
    words: MappedWords,
}

/// Everything of [`IntraNodeComm::new`] that can fail on this rank alone:
/// the policy, the algorithm choice, the region size, the GPU's context,
/// the kernels (loaded now, so that neither a first call nor a capture
/// compiles them) and the host words.
fn prepare(device: usize, options: &IntraNodeOptions) -> Result<Prepared> {
    let policy = match options.policy {
        Some(p) => p,
        None => PeerPolicy::from_env()?,
    };
    let algo = match options.algo {
        Some(AlgoChoice::Force(AllReduceAlgo::None)) => {
            return Err(Error::InvalidArgument(
                "IntraNodeOptions::algo: expected Auto or Force(Push, OneShot, TwoShot or Large), found Force(None)"
                    .into(),
            ))
        }
        Some(a) => a,
        None => AlgoChoice::from_env()?,
    };
    let region = match options.region_bytes {
        Some(bytes) if !(MIN_REGION..=MAX_REGION).contains(&bytes) => {
            return Err(Error::InvalidArgument(format!(
                "IntraNodeOptions::region_bytes: expected 4096 to 2^40, found {bytes}"
            )))
        }
        Some(bytes) => bytes,
        None => region_from_env()?,
    };
    let region = region.div_ceil(4096) * 4096;
    let overlap = match options.overlap_launches {
        Some(on) => on,
        None => parse_overlap(env_vars::INTRANODE_OVERLAP.get_lossy())?,
    };
    let ctx = runtime::context(device)?;
    if policy != PeerPolicy::Off {
        // Off: set-up fails on every rank (see `topology::why_not`) and no
        // kernel ever runs.
        crate::cuda::kernels::load(device)?;
    }
    let words = MappedWords::new(device, 2)?;
    Ok(Prepared {
        policy,
        algo,
        region,
        overlap,
        ctx,
        words,
    })
}

/// Bounds of a region's bytes.
const MIN_REGION: usize = 4096;
const MAX_REGION: usize = 1 << 40;

/// `TENSORCOMM_INTRANODE_REGION`, or 16 MiB when unset; a value that does
/// not parse or lies outside 4 KiB to 1 TiB is [`Error::BadValue`].
fn region_from_env() -> Result<usize> {
    parse_region(env_vars::INTRANODE_REGION.get_lossy())
}

fn parse_region(raw: Option<String>) -> Result<usize> {
    let Some(raw) = raw else {
        return Ok(16 << 20);
    };
    crate::tuning::parse_size(&raw)
        .filter(|b| (MIN_REGION..=MAX_REGION).contains(b))
        .ok_or_else(|| Error::BadValue {
            name: env_vars::INTRANODE_REGION.name.into(),
            expected: "a size from 4K to 1024G (suffixes K, M, G)".into(),
            found: raw,
        })
}

/// `TENSORCOMM_INTRANODE_OVERLAP`'s value: `1` (also when unset) or `0`;
/// anything else is [`Error::BadValue`].
fn parse_overlap(raw: Option<String>) -> Result<bool> {
    match raw.as_deref().map(str::trim) {
        None | Some("1") => Ok(true),
        Some("0") => Ok(false),
        Some(other) => Err(Error::BadValue {
            name: env_vars::INTRANODE_OVERLAP.name.into(),
            expected: "0 or 1".into(),
            found: other.into(),
        }),
    }
}

/// The kernels' op for `op`, if they have it.
fn peer_op(op: ReduceOp) -> Option<PeerOp> {
    match op {
        ReduceOp::Sum => Some(PeerOp::Sum),
        ReduceOp::Avg => Some(PeerOp::Avg),
        ReduceOp::Min => Some(PeerOp::Min),
        ReduceOp::Max => Some(PeerOp::Max),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::{parse_overlap, parse_region};

    #[test]
    fn the_overlap_variable_takes_0_or_1_and_names_itself_otherwise() {
        assert!(parse_overlap(None).unwrap());
        assert!(parse_overlap(Some("1".into())).unwrap());
        assert!(!parse_overlap(Some(" 0 ".into())).unwrap());
        for bad in ["yes", "2", ""] {
            let e = parse_overlap(Some(bad.into())).unwrap_err().to_string();
            assert!(
                e.contains("TENSORCOMM_INTRANODE_OVERLAP")
                    && e.contains("0 or 1")
                    && e.contains(bad),
                "{bad}: {e}"
            );
        }
    }

    #[test]
    fn the_region_variable_takes_sizes_from_4k_to_1024g_and_names_itself_otherwise() {
        assert_eq!(parse_region(None).unwrap(), 16 << 20);
        assert_eq!(parse_region(Some("32M".into())).unwrap(), 32 << 20);
        assert_eq!(parse_region(Some("4K".into())).unwrap(), 4096);
        assert_eq!(parse_region(Some("1024G".into())).unwrap(), 1 << 40);
        for bad in ["2K", "1025G", "1T", "lots", ""] {
            let e = parse_region(Some(bad.into())).unwrap_err().to_string();
            assert!(
                e.contains("TENSORCOMM_INTRANODE_REGION") && e.contains("4K to 1024G"),
                "{bad}: {e}"
            );
        }
    }
}
