//! The shared-memory transport: a byte pipe between two ranks of one host.
//!
//! [`ShmLink::connect`] maps one POSIX shared-memory segment per pair of
//! ranks (layout in `layout.rs`): a one-page header, then two
//! single-producer single-consumer byte rings, one per direction. A byte
//! goes through exactly two copies: the sender's buffer into the ring, the
//! ring into the receiver's buffer. The rings' counters are monotonic
//! `AtomicU64`s on their own cache lines, published with Release and read
//! with Acquire (`ring.rs`).
//!
//! A blocked call spins on the counters for ~50 µs, then yields until
//! ~2 ms, then sleeps (`wait.rs`); on a host running more of the group's
//! ranks than it has cores it spins only ~5 µs before yielding, and its
//! sleeps are on a futex that the peer's next write wakes ([`ShmWait`],
//! `signal.rs`). While it waits it
//! watches the peer's `closed` flag (set when the peer drops its link) and,
//! every 5 ms, asks the kernel whether the peer's process still holds its
//! lock on the segment (`segment.rs` says why a lock and not `kill(pid, 0)`).
//! So a dead peer is noticed within a few milliseconds, and the error names
//! its rank.
//!
//! [`ShmTransport`] (`mesh.rs`) is the [`Transport`](super::Transport)
//! trait over one link per peer.
//!
//! The segment's name is unlinked as soon as both ranks have mapped it, so
//! only a process that dies during set-up can leave a name behind in
//! `/dev/shm`; `reclaim.rs` removes such names when a later group is
//! created, and the launcher removes its ended ranks' names.
//!
//! [`ShmArena`] (`arena.rs`) is one segment shared by a whole group on
//! one host, for algorithms that reduce straight out of each other's
//! memory instead of streaming through the rings. Its waits on the
//! ranks' progress counters follow the same [`ShmWait`], sleeping on a
//! futex beside each counter.
//!
//! Linux only (open-file-description locks); on other systems this module
//! is empty.
#![cfg(target_os = "linux")]

mod arena;
mod group_segment;
mod layout;
mod link;
mod mesh;
mod reclaim;
mod ring;
mod segment;
mod signal;
mod symmetric;
mod wait;

pub use arena::{arena_chunk, Milestone, Progress, ShmArena, ARENA_MAX_LANES, DEFAULT_ARENA_CHUNK};
#[cfg(feature = "cuda")]
pub(crate) use arena::{BallotEnd, BALLOT_TAG_LEN};
pub use link::ShmLink;
pub use mesh::{ShmTransport, ShmTransportOptions};
pub use reclaim::{reclaim_orphans, remove_segments_of};
pub use symmetric::{SymmetricMemory, SymmetricRegistry};
pub(crate) use wait::Backoff;
pub use wait::ShmWait;

/// A good ring capacity per direction: 4 MiB, enough to stream large
/// messages without the two sides waiting on each other.
pub const DEFAULT_CAPACITY: usize = 4 << 20;
