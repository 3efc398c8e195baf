//! Collective algorithms, one per file, each a plain function over a
//! [`Transport`] working in place on a byte buffer of `dtype` elements.
//!
//! - [`all_reduce_direct`]: everyone sends everything to everyone, then
//!   reduces in rank order; fewest round trips, for small messages.
//! - [`all_reduce_halving_doubling`]: recursive halving reduce-scatter and
//!   recursive doubling all-gather (Rabenseifner), with the extra ranks of a
//!   non-power-of-two world folded in first; `2 log2 p` steps.
//! - [`all_reduce_ring`]: ring reduce-scatter then ring all-gather, each
//!   chunk moved in segments; bandwidth-optimal for large messages.
//! - [`broadcast_tree`]: binomial-tree broadcast from any root.
//! - [`reduce_tree`]: binomial-tree reduce to any root; for large
//!   messages [`reduce_ring_gather`] (ring reduce-scatter, then the root
//!   gathers the blocks), picked by [`reduce`].
//! - [`all_gather_ring`], [`reduce_scatter_ring`]: the two passes of the
//!   ring all-reduce on their own.
//! - [`gather_direct`], [`scatter_direct`]: straight to and from the root.
//! - [`all_to_all_pairwise`]: one pairwise exchange per step, blocks of any
//!   size per peer.
//! - `all_reduce_shm_arena` (Linux): for groups all on one host, reduces
//!   straight out of a shared-memory arena, its threads ordering their
//!   steps through counters in the arena and the transport carrying one
//!   opening barrier. `broadcast_shm_arena` likewise for broadcast,
//!   `reduce_to_root_shm_arena` for reduce and `all_to_all_shm_arena` for
//!   all-to-all, gather and scatter.
//!
//! Every rank ends with bit-identical results: each element is reduced once,
//! in an order fixed by the algorithm, then copied. Which algorithm runs
//! for which size and world is chosen in one place, `cpu/select.rs`;
//! [`all_reduce_with`] runs a named all-reduce.
//!
//! ```
//! use std::{sync::Arc, thread, time::{Duration, Instant}};
//! use tensorcomm::cpu::algorithms::{all_reduce_with, AllReduceAlgorithm};
//! use tensorcomm::cpu::reduce_kernels::ReduceOp;
//! use tensorcomm::cpu::transport::{TcpTransport, TcpTransportOptions};
//! use tensorcomm::store::HashStore;
//! use tensorcomm::tensor::DType;
//!
//! let store = Arc::new(HashStore::new());
//! let ranks: Vec<_> = (0..3).map(|rank| {
//!     let store = store.clone();
//!     thread::spawn(move || -> tensorcomm::Result<Vec<u8>> {
//!         let t = TcpTransport::connect(&*store, "doc", rank, 3, &TcpTransportOptions::default())?;
//!         let mut buf = vec![rank as u8 + 1; 4];
//!         let deadline = Instant::now() + Duration::from_secs(10);
//!         all_reduce_with(AllReduceAlgorithm::Ring, &t, &mut buf, DType::U8, ReduceOp::Sum, deadline)?;
//!         Ok(buf)
//!     })
//! }).collect();
//! for r in ranks {
//!     assert_eq!(r.join().unwrap()?, [6, 6, 6, 6]);
//! }
//! # Ok::<(), tensorcomm::Error>(())
//! ```

mod all_gather_ring;
mod all_reduce_direct;
mod all_reduce_halving_doubling;
mod all_reduce_ring;
#[cfg(target_os = "linux")]
mod all_reduce_shm_arena;
#[cfg(target_os = "linux")]
mod all_reduce_shm_symmetric;
mod all_to_all_pairwise;
#[cfg(target_os = "linux")]
mod all_to_all_shm_arena;
#[cfg(target_os = "linux")]
mod arena_lanes;
#[cfg(target_os = "linux")]
mod broadcast_shm_arena;
mod broadcast_tree;
mod exchange_blocks;
mod gather_direct;
mod reduce_ring_gather;
mod reduce_scatter_ring;
mod reduce_tree;
mod scatter_direct;
#[cfg(test)]
pub(crate) mod testing;

use std::ops::Range;
use std::time::Instant;

pub use all_gather_ring::all_gather_ring;
pub use all_reduce_direct::all_reduce_direct;
pub use all_reduce_halving_doubling::all_reduce_halving_doubling;
pub use all_reduce_ring::{all_reduce_ring, all_reduce_ring_segmented, RING_SEGMENT_BYTES};
#[cfg(target_os = "linux")]
pub use all_reduce_shm_arena::{all_reduce_shm_arena, reduce_to_root_shm_arena, ArenaThreads};
#[cfg(target_os = "linux")]
pub use all_reduce_shm_symmetric::{all_reduce_shm_symmetric, SymmetricBytes};
pub use all_to_all_pairwise::{agree_block_sizes, all_to_all_pairwise};
#[cfg(target_os = "linux")]
pub use all_to_all_shm_arena::all_to_all_shm_arena;
#[cfg(target_os = "linux")]
pub use broadcast_shm_arena::broadcast_shm_arena;
pub use broadcast_tree::broadcast_tree;
pub use exchange_blocks::ExchangeBlocks;
pub use gather_direct::gather_direct;
pub use reduce_ring_gather::reduce_ring_gather;
pub use reduce_scatter_ring::reduce_scatter_ring;
pub use reduce_tree::reduce_tree;
pub use scatter_direct::scatter_direct;

use super::reduce_kernels::ReduceOp;
use super::transport::Transport;
use crate::tensor::DType;
use crate::Result;

/// The all-reduce algorithms to choose from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AllReduceAlgorithm {
    Direct,
    HalvingDoubling,
    Ring,
}

impl std::str::FromStr for AllReduceAlgorithm {
    type Err = crate::Error;

    fn from_str(s: &str) -> Result<Self> {
        match s.trim() {
            "direct" => Ok(AllReduceAlgorithm::Direct),
            "halving_doubling" => Ok(AllReduceAlgorithm::HalvingDoubling),
            "ring" => Ok(AllReduceAlgorithm::Ring),
            other => Err(crate::Error::BadValue {
                name: crate::env_vars::CPU_ALL_REDUCE.name.into(),
                expected: "direct, halving_doubling or ring".into(),
                found: other.into(),
            }),
        }
    }
}

/// All-reduces `buf` in place with the given algorithm.
pub fn all_reduce_with(
    algorithm: AllReduceAlgorithm,
    t: &dyn Transport,
    buf: &mut [u8],
    dtype: DType,
    op: ReduceOp,
    deadline: Instant,
) -> Result<()> {
    tracing::trace!(?algorithm, bytes = buf.len(), "all_reduce");
    match algorithm {
        AllReduceAlgorithm::Direct => all_reduce_direct(t, buf, dtype, op, deadline),
        AllReduceAlgorithm::HalvingDoubling => {
            all_reduce_halving_doubling(t, buf, dtype, op, deadline)
        }
        AllReduceAlgorithm::Ring => all_reduce_ring(t, buf, dtype, op, deadline),
    }
}

/// Byte offsets splitting `nbytes` of `elem`-byte elements into `parts`
/// blocks of whole elements whose sizes differ by at most one element:
/// block `i` is `offsets[i]..offsets[i + 1]`.
pub(crate) fn block_offsets(nbytes: usize, elem: usize, parts: usize) -> Vec<usize> {
    let n = nbytes / elem;
    (0..=parts).map(|i| i * n / parts * elem).collect()
}

/// Two disjoint ranges of `buf`, one to read and one to write.
pub(crate) fn split_read_write(
    buf: &mut [u8],
    read: Range<usize>,
    write: Range<usize>,
) -> (&[u8], &mut [u8]) {
    if read.start >= write.end {
        let (head, tail) = buf.split_at_mut(read.start);
        (&tail[..read.len()], &mut head[write])
    } else {
        let (head, tail) = buf.split_at_mut(write.start);
        (&head[read], &mut tail[..write.len()])
    }
}
