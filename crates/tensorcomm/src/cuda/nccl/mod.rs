//! The NCCL backend: a process group of CUDA tensors, one GPU per rank,
//! across processes and nodes, through NVIDIA's NCCL loaded at run time.
//!
//! - `library`: finding and loading NCCL, its C types and functions, and
//!   its results as typed errors ([`Error::NcclUnavailable`](crate::Error::NcclUnavailable),
//!   [`Error::Nccl`](crate::Error::Nccl)).
//! - `communicator`: one NCCL communicator: the unique id through the
//!   store, non-blocking creation within a timeout, split, abort.
//! - `aborts_in_flight`: the aborts running, which the process's exit
//!   waits for.
//! - `types`: dtypes and reduce ops as NCCL's.
//! - `plan`: a collective as the NCCL calls that run it, resolved before
//!   any is made.
//! - `group_backend`: the engine's backend: every collective queued on the
//!   group's stream after the caller's current stream, with its
//!   completion event.
//! - `p2p`: `send` and `recv`.
//! - [`ProcessGroupNccl`]: the [`ProcessGroup`](crate::group::ProcessGroup).
//!
//! The engine (`group/`) does the rest: validation, sequence numbers, call
//! order, the watchdog that fails a collective past its deadline (naming
//! each rank's progress), failure reports through the store and the flight
//! recorder.

mod aborts_in_flight;
mod communicator;
mod group_backend;
mod library;
mod p2p;
mod plan;
mod process_group;
mod types;

pub use process_group::{NcclOptions, ProcessGroupNccl};

/// The NCCL version this process loads (`2.28.9`), or why it cannot.
///
/// ```
/// match tensorcomm::cuda::nccl::version() {
///     Ok(v) => println!("NCCL {v}"),
///     Err(tensorcomm::Error::NcclUnavailable { library, .. }) => println!("no {library} here"),
///     Err(e) => return Err(e),
/// }
/// # Ok::<(), tensorcomm::Error>(())
/// ```
pub fn version() -> crate::Result<String> {
    library::nccl().map(|n| n.version_string())
}
