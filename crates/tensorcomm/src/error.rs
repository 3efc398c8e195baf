//! The one error type of tensorcomm.
//!
//! Every variant carries what a user needs to act on it: the key, the
//! address, the timeout, what was expected and what was found. Messages
//! read as "expected X, found Y".

mod clone;
mod report;

pub use report::Report;

use std::time::Duration;

use crate::tensor::DType;

/// Result alias used throughout tensorcomm.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong in tensorcomm.
///
/// ```
/// use tensorcomm::{Error, store::{HashStore, Store}};
/// use std::time::Duration;
///
/// let store = HashStore::new();
/// let err = store.get_timeout("missing", Duration::from_millis(10)).unwrap_err();
/// assert!(matches!(err, Error::StoreTimeout { .. }));
/// assert!(err.to_string().contains("missing"));
/// ```
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    // ---- tensor model -------------------------------------------------
    /// A shape did not have the number of elements or dimensions required.
    #[error("shape mismatch in {context}: expected {expected:?}, found {found:?}")]
    ShapeMismatch {
        context: String,
        expected: Vec<usize>,
        found: Vec<usize>,
    },
    /// A dtype was not the one required.
    #[error("dtype mismatch in {context}: expected {expected}, found {found}")]
    DTypeMismatch {
        context: String,
        expected: DType,
        found: DType,
    },
    /// A dimension index was out of range for a tensor of `ndim` dimensions.
    #[error("dimension {dim} out of range for a tensor with {ndim} dimensions (expected {} to {})", -(*ndim as i64), *ndim as i64 - 1)]
    DimOutOfRange { dim: i64, ndim: usize },
    /// The layout (strides, offset) does not fit the storage or is not dense.
    #[error("invalid layout: {0}")]
    InvalidLayout(String),
    /// An argument that is not about shapes or dtypes was wrong.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// A sparse tensor's indices or values do not describe a valid tensor.
    #[error("invalid sparse tensor: {0}")]
    InvalidSparse(String),

    // ---- stores -------------------------------------------------------
    /// A file store path names something that is not a regular file.
    #[error("file store {path} must be a regular file, found {found}")]
    StoreFileNotRegular { path: String, found: String },
    /// `get`/`wait`/`queue_pop` ran out of time before the keys existed.
    #[error("timed out after {timeout:?} waiting for keys {keys:?} in the store")]
    StoreTimeout {
        keys: Vec<String>,
        timeout: Duration,
    },
    /// A non-blocking read found no such key.
    #[error("key {key:?} not found in the store")]
    KeyNotFound { key: String },
    /// A counter key held something that is not an ASCII decimal integer.
    #[error("key {key:?} holds {found:?}, expected an ASCII decimal integer for add()")]
    NotACounter { key: String, found: String },
    /// `add` would take a counter past the range of an i64.
    #[error("add({delta}) on counter {key:?} overflows: it holds {current}, expected a sum within {} to {}", i64::MIN, i64::MAX)]
    CounterOverflow {
        key: String,
        current: i64,
        delta: i64,
    },
    /// The store server could not bind its address.
    #[error("address {addr} is already in use (is another store or job running there?)")]
    AddressInUse { addr: String },
    /// A listener (rank 0's store server, a CPU transport's listener)
    /// cannot listen where peers are told to reach it; `reason` says why
    /// and what to set instead.
    #[error("cannot listen for {what} on {addr}: {reason}")]
    ListenAddress {
        what: String,
        addr: String,
        reason: String,
    },
    /// The server hosting rank waited for its clients and not all came.
    #[error(
        "timed out after {timeout:?} waiting for store clients: {joined}/{expected} clients joined"
    )]
    ClientsTimeout {
        joined: usize,
        expected: usize,
        timeout: Duration,
    },
    /// A client could not reach the store server in time.
    #[error("could not connect to the store at {addr} within {timeout:?}: {reason}")]
    StoreConnect {
        addr: String,
        timeout: Duration,
        reason: String,
    },
    /// The store server is gone or hung: a connection broke while a
    /// request was in flight, a reply did not come within the request's
    /// timeout and its grace, or a server that had answered this client
    /// before refused or left unanswered a new connection.
    #[error("connection lost to the store at {addr}: {reason}")]
    StoreConnectionLost { addr: String, reason: String },
    /// The server refused this client (wrong token, wrong protocol version).
    #[error("the store at {addr} refused the connection: {reason}")]
    StoreRefused { addr: String, reason: String },
    /// A peer or the server sent bytes that are not valid protocol.
    #[error("store protocol error: expected {expected}, found {found}")]
    Protocol { expected: String, found: String },
    /// A message was larger than the configured maximum.
    #[error("message of {size} bytes exceeds the maximum of {max} bytes")]
    MessageTooLarge { size: u64, max: u64 },
    /// The server answered a request with an error.
    #[error("the store at {addr} rejected the request: {reason}")]
    StoreServer { addr: String, reason: String },
    /// More ranks arrived at a store barrier than its world size.
    #[error("barrier {key:?} expected {expected} ranks, found {found} (key reused?)")]
    BarrierOverflow {
        key: String,
        expected: usize,
        found: i64,
    },
    /// A barrier timed out before everyone arrived.
    #[error("barrier {key:?} timed out after {timeout:?}: {arrived}/{expected} ranks arrived")]
    BarrierTimeout {
        key: String,
        arrived: usize,
        expected: usize,
        timeout: Duration,
    },

    // ---- rendezvous ---------------------------------------------------
    /// An environment variable needed by `env://` is missing.
    #[error("environment variable {name} is not set (needed by {context})")]
    MissingEnv { name: String, context: String },
    /// An environment variable or URL parameter does not parse, or an
    /// option is out of range (a hook's settings, for example).
    #[error("{name} must be {expected}, found {found:?}")]
    BadValue {
        name: String,
        expected: String,
        found: String,
    },
    /// A URL parameter needed by `tcp://` or `file://` is missing.
    #[error("init method {url:?} is missing parameter {name:?}")]
    MissingParam { url: String, name: String },
    /// The init method's scheme is not one tensorcomm knows.
    #[error("unsupported init method {found:?}: expected env://, tcp://host:port?rank=R&world_size=W or file:///path?rank=R&world_size=W")]
    UnsupportedInitMethod { found: String },

    // ---- shared memory ------------------------------------------------
    /// A shared-memory segment does not have the header this build expects.
    #[error("shared-memory segment {segment:?} has a bad header: expected {field} {expected}, found {found}")]
    ShmBadHeader {
        segment: String,
        field: String,
        expected: String,
        found: String,
    },
    /// Shared memory was required (`TENSORCOMM_TRANSPORT=shm`) but a peer
    /// is on another host (or sees another `/dev/shm`).
    #[error("shared memory was required but rank {peer} is not on this host: expected host identity {expected:?}, found {found:?}")]
    ShmPeerNotLocal {
        peer: usize,
        expected: String,
        found: String,
    },
    // ---- transports and process groups --------------------------------
    /// A peer closed its end of a transport (TCP connection or
    /// shared-memory link), or its process exited, while this rank still
    /// needed it; `reason` says which and how it was noticed.
    #[error("peer rank {peer} is gone while {during}: {reason}")]
    PeerClosed {
        peer: usize,
        during: String,
        reason: String,
    },
    /// This rank's own side of its connection to `peer` was shut down (by
    /// this process: its group's abort after an earlier failure, or its
    /// sockets closed under it), so the transfer failed here, not because
    /// the peer left. The TCP state says which side closed first.
    #[error("this rank's connection to rank {peer} was shut down on this rank's side, not by the peer, while {during}")]
    LinkShutDownHere { peer: usize, during: String },
    /// A peer did not send or accept bytes before the deadline; `timeout`
    /// is how long this rank waited.
    #[error("peer rank {peer} did not respond within {timeout:?} while {during}")]
    PeerTimeout {
        peer: usize,
        during: String,
        timeout: Duration,
    },
    /// A transfer with a peer failed with an operating-system error.
    #[error("transfer with rank {peer} failed while {during}: {source}")]
    PeerIo {
        peer: usize,
        during: String,
        #[source]
        source: std::io::Error,
    },
    /// A peer's transport refused this rank's connection; `reason` says
    /// why (another job or group, a missing or different token).
    #[error("rank {peer}'s transport at {addr} refused this rank's connection: {reason}")]
    PeerRefused {
        peer: usize,
        addr: String,
        reason: String,
    },
    /// A peer sent bytes that are not what the protocol expects.
    #[error("rank {peer} broke the protocol: expected {expected}, found {found}")]
    PeerProtocol {
        peer: usize,
        expected: String,
        found: String,
    },
    /// A collective queued on a device did not finish within `timeout`;
    /// `progress` says which ranks had and had not reached it (each rank's
    /// last started and completed sequence number) and `lagging` lists the
    /// ranks furthest behind (others behind them may be waiting on them).
    #[error("{what} did not finish on the device within {timeout:?}; {progress}")]
    CollectiveTimeout {
        what: String,
        timeout: Duration,
        progress: String,
        lagging: Vec<usize>,
    },
    /// A collective's arguments were refused on this rank; nothing was sent.
    #[error("{op}: invalid arguments: {reason}")]
    InvalidCollective { op: String, reason: String },
    /// A reduce op is not defined for a dtype (bitwise ops on floats) or a
    /// tensor kind (only SUM for sparse tensors).
    #[error("{op}: reduce op {reduce_op} is not supported for {what}")]
    UnsupportedReduceOp {
        op: String,
        reduce_op: String,
        what: String,
    },
    /// Ranks called different collectives (or the same one with different
    /// dtypes, shapes or roots) at the same sequence number.
    #[error("collective mismatch detected by rank {rank}: this rank ran {mine}, rank {peer} ran {theirs}")]
    CollectiveMismatch {
        rank: usize,
        peer: usize,
        mine: String,
        theirs: String,
    },
    /// Ranks of one group read different values of a variable that every
    /// rank must share (see [`crate::env_vars`]), found when the group is
    /// created.
    #[error("{variable} differs between ranks of the group: rank {rank} has {mine:?}, rank {peer} has {theirs:?}; every rank must set the same value")]
    TuningMismatch {
        variable: String,
        rank: usize,
        mine: String,
        peer: usize,
        theirs: String,
    },
    /// A collective failed on this rank; `ranks` are the peers that did not
    /// arrive or whose connection failed.
    #[error("{op} (sequence number {seq}) failed on rank {rank}; ranks {ranks:?} did not arrive: {source}")]
    CollectiveFailed {
        op: String,
        seq: u64,
        rank: usize,
        ranks: Vec<usize>,
        #[source]
        source: Box<Error>,
    },
    /// Setting up something every rank of a group shares (a shared-memory
    /// segment) failed on rank `failed`, so it failed on every rank; `rank`
    /// is the rank reporting it.
    #[error("setting up the {what} failed on rank {failed} (reported on rank {rank}): {reason}")]
    GroupSetupFailed {
        what: String,
        rank: usize,
        failed: usize,
        reason: String,
    },
    /// A process group was used after a failure broke its connections.
    #[error("the process group is unusable after {op} (sequence number {seq}) failed; create a new group")]
    GroupBroken { op: String, seq: u64 },
    /// A point-to-point message was not the size of the tensor receiving it.
    #[error("recv on rank {rank}: rank {peer} sent {found} bytes with tag {tag}, expected {expected} bytes (the size of the receiving tensor)")]
    MessageSizeMismatch {
        rank: usize,
        peer: usize,
        tag: u64,
        expected: usize,
        found: usize,
    },
    /// `recv_any_source` got no message with its tag: none came in time, or
    /// every peer closed its connection.
    #[error("recv_any_source on rank {rank} with tag {tag} got no message: {reason}")]
    NoMessage {
        rank: usize,
        tag: u64,
        reason: String,
    },
    /// A [`WorkFuture`](crate::group::WorkFuture) got no value: a `then`
    /// callback panicked, or the work was dropped before it finished.
    #[error("Work future failed: {reason}")]
    FutureFailed { reason: String },
    /// `monitored_barrier`: ranks that did not reach rank 0 in time.
    #[error("monitored_barrier: ranks {missing:?} did not arrive at rank 0 within {timeout:?}")]
    RanksMissing {
        missing: Vec<usize>,
        timeout: Duration,
    },

    // ---- cuda ---------------------------------------------------------
    /// No usable CUDA driver (or NVRTC) on this machine, or no such GPU.
    #[error("CUDA is not available: {reason}")]
    NoCuda { reason: String },
    /// A CUDA driver call failed.
    #[error("CUDA call {call} failed with {code}: {message}")]
    Cuda {
        call: String,
        code: String,
        message: String,
    },
    /// NCCL could not be loaded: the library was not found or lacks a
    /// function tensorcomm needs.
    #[error("NCCL is not available ({library}): {reason}")]
    NcclUnavailable { library: String, reason: String },
    /// An NCCL call failed; `code` is NCCL's result name and `message`
    /// NCCL's own description (its last error, where it gave one).
    #[error("NCCL call {call} failed with {code}: {message}")]
    Nccl {
        call: String,
        code: String,
        message: String,
    },
    /// An NCCL communicator was not ready within the group's timeout:
    /// only `joined` of `size` ranks had started creating it.
    #[error("NCCL communicator of rank {rank} of {size} on cuda:{device} was not ready within {timeout:?}: {joined} of {size} ranks had joined")]
    NcclInitTimeout {
        rank: usize,
        size: usize,
        device: usize,
        timeout: Duration,
        joined: usize,
    },
    /// The group's ranks cannot all-reduce through peer memory
    /// (`cuda::intranode`); `reason` names the first rank that said why.
    #[error("peer-memory all-reduce is not available: {reason}")]
    IntraNodeUnavailable { reason: String },
    /// A peer-memory all-reduce stopped on rank `rank` (a peer did not
    /// arrive in time, the communicator was aborted, or a call failed to
    /// queue on this rank); the communicator refuses every later call.
    #[error("the peer-memory communicator of rank {rank} is unusable: {reason}")]
    IntraNodeFailed { rank: usize, reason: String },
    /// Registering the tensors of a graph captured with
    /// `IntraNodeComm::capture_registered` failed, as rank `rank` reports
    /// (a rank could not capture or register, or the ranks' captured
    /// calls differ): no rank keeps that graph; other calls are
    /// unaffected.
    #[error(
        "registering the tensors of a captured graph failed (as rank {rank} reports): {reason}"
    )]
    GraphRegistration { rank: usize, reason: String },
    /// NVRTC could not compile a kernel.
    #[error("NVRTC could not compile {kernel} for {arch}: {log}")]
    Nvrtc {
        kernel: String,
        arch: String,
        log: String,
    },
    /// An argument of a `cuda::comm` operation was wrong; names the
    /// offending tensor (or device) index, what was expected and what was found.
    #[error("{op}: {what}{}: expected {expected}, found {found}", index.map(|i| format!(" at index {i}")).unwrap_or_default())]
    CommArgument {
        op: &'static str,
        what: String,
        index: Option<usize>,
        expected: String,
        found: String,
    },

    // ---- data-parallel training ------------------------------------------
    /// Ranks built a DDP [`Reducer`](crate::ddp::Reducer) from different
    /// parameter lists (count, shapes, dtypes or devices).
    #[error("DDP parameters differ between ranks: rank {rank} has {mine}, rank {peer} has {theirs}; every rank must build the Reducer from the same parameters in the same order")]
    ParamsMismatch {
        rank: usize,
        peer: usize,
        mine: String,
        theirs: String,
    },
    /// A DDP [`Reducer`](crate::ddp::Reducer) was used out of order: a
    /// gradient marked twice, `finish` before every gradient arrived, a new
    /// iteration before the last one finished.
    #[error("DDP reducer, iteration {iteration}: expected {expected}, found {found}")]
    ReducerMisuse {
        iteration: u64,
        expected: String,
        found: String,
    },

    // ---- system -------------------------------------------------------
    /// An operating-system call failed.
    #[error("{context}: {source}")]
    Io {
        context: String,
        #[source]
        source: std::io::Error,
    },
}

impl Error {
    /// Wraps an `io::Error` with a sentence saying what was being done.
    pub fn io(context: impl Into<String>, source: std::io::Error) -> Self {
        Error::Io {
            context: context.into(),
            source,
        }
    }
}
