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
//!   opening barrier; chosen above [`shm_arena_all_reduce_min_bytes`]
//!   ([`SHM_ARENA_BROADCAST_MIN_BYTES`] for broadcast). `broadcast_shm_arena`
//!   likewise for broadcast, `reduce_to_root_shm_arena` for reduce and
//!   `all_to_all_shm_arena` for all-to-all (from
//!   [`SHM_ARENA_ALL_TO_ALL_MIN_BLOCK_BYTES`] per block).
//!
//! Every rank ends with bit-identical results: each element is reduced once,
//! in an order fixed by the algorithm, then copied. [`select_all_reduce`]
//! picks an all-reduce by message size and world size.
//!
//! ```
//! use std::{sync::Arc, thread, time::{Duration, Instant}};
//! use tensorcomm::cpu::algorithms::all_reduce;
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
//!         all_reduce(&t, &mut buf, DType::U8, ReduceOp::Sum, Instant::now() + Duration::from_secs(10))?;
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

/// Messages up to this many bytes over 2 ranks use [`all_reduce_direct`].
///
/// Measured on a 2-core VM (shared with other jobs, so noisy), 2 ranks as
/// threads of one process, each algorithm forced through
/// [`all_reduce_with`] over a [`RoutedTransport`](super::transport::RoutedTransport),
/// f32 MAX, mean µs per call (a throwaway sweep program; `tensorcomm bench`
/// times the selected algorithm only):
///
/// ```text
///  bytes      tcp: direct   h-d    ring     shm: direct   h-d    ring
///  8                 20     36     32             0.8     (noise) (noise)
///  128               21     38     37             0.9     5.5    12.6
///  2K                34     43     48             11.6    10.3   (noise)
///  32K               39     59     62             95      189    173
///  128K              114    108    92             236     248    337
///  512K              368    274    260            428     428    402
/// ```
///
/// Direct wins up to 32 KiB on both transports and loses from 128 KiB on
/// TCP, so the crossover is set between them. On the 32-core GPU host
/// (bench/results/algorithms-small-h200x2.txt) 2 ranks over TCP took 19.7
/// µs direct and 23.7 halving-doubling at 8 KiB.
pub const DIRECT_MAX_BYTES: usize = 64 << 10;

/// Messages up to this many bytes over 3 to [`DIRECT_MAX_WORLD`] ranks use
/// [`all_reduce_direct`]. On the GPU host
/// (bench/results/algorithms-small-h200x2.txt), µs direct / best other at
/// 2 KiB and 8 KiB over TCP: 3 ranks 22.7 / 40.9 and 39.2 / 44.7, 4 ranks
/// 32.3 / 35.4 and 59.6 / 41.0, 6 ranks 51.9 / 79.0 and 104.8 / 80.4; over
/// shared memory 3 ranks 9.2 / 10.6 and 15.3 / 15.1, 4 ranks 11.9 / 12.2 and
/// 21.8 / 16.1, 6 ranks 17.9 / 14.9 and 35.3 / 23.1.
pub const DIRECT_MAX_BYTES_FROM_3_RANKS: usize = 2 << 10;

/// Largest world for which [`all_reduce_direct`] is chosen (its traffic and
/// memory grow with the world size). On the GPU host 8 ranks were faster
/// with halving-doubling at every size from 32 bytes, over TCP (52.5 µs
/// against 57.4 at 32 B, 65.8 against 136.9 at 8 KiB) and shared memory
/// (12.2 against 14.8 at 32 B); 7 ranks were not measured.
pub const DIRECT_MAX_WORLD: usize = 6;

/// Up to how many bytes an all-reduce over `world_size` ranks takes
/// [`all_reduce_direct`] (0: never).
///
/// ```
/// use tensorcomm::cpu::algorithms::direct_max_bytes;
/// assert_eq!(direct_max_bytes(2), 64 << 10);
/// assert_eq!(direct_max_bytes(4), 2 << 10);
/// assert_eq!(direct_max_bytes(8), 0);
/// ```
pub fn direct_max_bytes(world_size: usize) -> usize {
    match world_size {
        0..=2 => DIRECT_MAX_BYTES,
        w if w <= DIRECT_MAX_WORLD => DIRECT_MAX_BYTES_FROM_3_RANKS,
        _ => 0,
    }
}

/// Messages of at least this many bytes over 2 or 4 ranks use
/// [`all_reduce_ring`]; below it (and above the direct threshold),
/// [`all_reduce_halving_doubling`]. See [`ring_min_bytes`] for the
/// measurements behind this and the other worlds' thresholds.
pub const RING_MIN_BYTES: usize = 4 << 20;

/// [`RING_MIN_BYTES`] for 8 to 15 ranks.
pub const RING_MIN_BYTES_FROM_8_RANKS: usize = 256 << 10;

/// [`RING_MIN_BYTES`] for 5 to 7 ranks, where halving-doubling first folds
/// the ranks beyond a power of two in (a whole extra message each way).
pub const RING_MIN_BYTES_NON_POWER_OF_TWO: usize = 128 << 10;

/// [`RING_MIN_BYTES`] for 16 ranks or more.
pub const RING_MIN_BYTES_FROM_16_RANKS: usize = 4 << 20;

/// From how many bytes an all-reduce over `world_size` ranks takes the
/// ring rather than halving-doubling (below it and above
/// [`direct_max_bytes`]).
///
/// Measured over TCP (one `tensorcomm bench` run per cell, forcing each
/// algorithm with `TENSORCOMM_CPU_ALL_REDUCE`, f32 sum, 20 iterations, the
/// default connections per pair) on the 32-core GPU host, µs
/// halving-doubling / ring (bench/results/tcp-algorithms-h200x2.txt):
///
/// ```text
/// bytes   2 ranks        4 ranks        8 ranks
/// 256K     95 / 104      155 / 179      282 / 231
/// 1M      256 / 260      414 / 607      794 / 692
/// 2M      510 / 492      869 / 979     1437 / 1367
/// 4M     1111 / 932     1465 / 1577    3010 / 2379
/// 8M     2209 / 1803    3452 / 2836    6064 / 5011
/// 32M    6241 / 5490   15463 / 10844  32993 / 15960
/// ```
///
/// That ring moved 512 KiB segments; with 1 MiB ones
/// ([`RING_SEGMENT_BYTES`] now, bench/results/tcp-ring-segments-h200x2.txt)
/// 4 ranks took 1146, 1244 and 2173 µs at 2, 4 and 8 MiB, so their ring
/// starts at 4 MiB (halving-doubling's 869 µs still wins at 2 MiB).
/// Other worlds (bench/results/algorithms-other-worlds-h200x2.txt, TCP,
/// halving-doubling / ring): 3 ranks 44.7 / 44.7 at 8 KiB, 60.0 / 46.9 at
/// 32 KiB, 124.6 / 72.5 at 128 KiB, so the ring from where direct stops;
/// 6 ranks 107.5 / 125.7 at 32 KiB and 190.0 / 164.4 at 128 KiB; 16 ranks
/// 501 / 522 at 512 KiB and 1729 / 1994 at 2 MiB (larger not measured).
///
/// ```
/// use tensorcomm::cpu::algorithms::ring_min_bytes;
/// assert_eq!(ring_min_bytes(2), 4 << 20);
/// assert_eq!(ring_min_bytes(3), 0);
/// assert_eq!(ring_min_bytes(4), 4 << 20);
/// assert_eq!(ring_min_bytes(6), 128 << 10);
/// assert_eq!(ring_min_bytes(8), 256 << 10);
/// assert_eq!(ring_min_bytes(16), 4 << 20);
/// ```
pub fn ring_min_bytes(world_size: usize) -> usize {
    match world_size {
        0..=2 | 4 => RING_MIN_BYTES,
        3 => 0,
        5..=7 => RING_MIN_BYTES_NON_POWER_OF_TWO,
        8..=15 => RING_MIN_BYTES_FROM_8_RANKS,
        _ => RING_MIN_BYTES_FROM_16_RANKS,
    }
}

/// Broadcasts above this many bytes use `broadcast_shm_arena` when the
/// group has a shared-memory arena (every rank on one host, shared memory
/// not turned off); below it [`broadcast_tree`] over the transport.
pub const SHM_ARENA_BROADCAST_MIN_BYTES: usize = 64 << 10;

/// A reduce on a group with a shared-memory arena goes through it
/// (`reduce_to_root_shm_arena`) from this many bytes; smaller ones over the
/// transport ([`reduce`]). Measured on a 16-core host, f32, µs, binomial
/// tree over shared-memory links against the arena
/// (bench/results/reduce-all-to-all-16core-h200.txt): 8 KiB at 8 ranks
/// 10.4 / 19.6 and at 4 ranks 8.4 / 13.3; 128 KiB at 8 ranks 72.1 / 56.7,
/// at 4 ranks 54.6 / 37.7, at 2 ranks 39.2 / 29.2.
pub const SHM_ARENA_REDUCE_MIN_BYTES: usize = 64 << 10;

/// An all-to-all on a group with a shared-memory arena goes through it
/// ([`all_to_all_shm_arena`]) when some rank sends another a block of at
/// least this many bytes; smaller ones go pairwise over the transport.
pub const SHM_ARENA_ALL_TO_ALL_MIN_BLOCK_BYTES: usize = 16 << 10;

/// All-reduces over 2 or 3 ranks above this many bytes use
/// `all_reduce_shm_arena` when the group has a shared-memory arena; below
/// it the transport-based algorithms above. See
/// [`shm_arena_all_reduce_min_bytes`] for the measurements.
pub const SHM_ARENA_MIN_BYTES: usize = 4 << 10;

/// [`SHM_ARENA_MIN_BYTES`] for 4 to 7 ranks.
pub const SHM_ARENA_MIN_BYTES_FROM_4_RANKS: usize = 2 << 10;

/// [`SHM_ARENA_MIN_BYTES`] for 8 ranks or more.
pub const SHM_ARENA_MIN_BYTES_FROM_8_RANKS: usize = 1 << 10;

/// Above how many bytes an all-reduce over `world_size` ranks sharing an
/// arena uses `all_reduce_shm_arena`.
///
/// Measured on the 32-core GPU host (bench/results/arena-threshold-h200x2.txt,
/// two runs, `TENSORCOMM_SHM_ARENA_MIN` forcing the arena or the transport
/// algorithms, µs arena / transport): 2 ranks 6.9-8.0 / 6.9 at 2 KiB,
/// 9.1-10.0 / 10.5-11.4 at 8 KiB, 15.0-15.4 / 24.0-26.9 at 32 KiB; 4 ranks
/// 9.9-10.7 / 11.4-13.1 at 2 KiB, 10.9-11.2 / 12.5-13.2 at 4 KiB; 8 ranks
/// 13.4-14.5 / 16.3-16.9 at 1 KiB and ahead at every larger size.
///
/// ```
/// use tensorcomm::cpu::algorithms::shm_arena_all_reduce_min_bytes;
/// assert_eq!(shm_arena_all_reduce_min_bytes(2), 4 << 10);
/// assert_eq!(shm_arena_all_reduce_min_bytes(4), 2 << 10);
/// assert_eq!(shm_arena_all_reduce_min_bytes(8), 1 << 10);
/// ```
pub fn shm_arena_all_reduce_min_bytes(world_size: usize) -> usize {
    match world_size {
        0..=3 => SHM_ARENA_MIN_BYTES,
        4..=7 => SHM_ARENA_MIN_BYTES_FROM_4_RANKS,
        _ => SHM_ARENA_MIN_BYTES_FROM_8_RANKS,
    }
}

/// Most threads per rank for an arena all-reduce (fewer when the host has
/// fewer than this many cores per rank): one core's copies and reductions
/// reach only a fraction of the memory bandwidth.
pub const SHM_ARENA_MAX_THREADS: usize = 8;

/// Each thread of an arena all-reduce gets at least this many bytes of the
/// message.
pub const SHM_ARENA_MIN_BYTES_PER_THREAD: usize = 64 << 10;

/// When the threads of every rank together would take every core of the
/// host, each rank runs half as many below this many bytes per thread...
pub const SHM_ARENA_FULL_HOST_MIN_BYTES_PER_THREAD: usize = 512 << 10;

/// ...and three quarters as many below this many bytes per thread.
pub const SHM_ARENA_FULL_HOST_ALL_THREADS_MIN_BYTES_PER_THREAD: usize = 4 << 20;

/// Threads per rank for an arena all-reduce of `nbytes` over `world_size`
/// ranks on a host of `cores` cores: as many as give every rank cores of
/// its own (`own`, at most [`SHM_ARENA_MAX_THREADS`]); when that takes
/// every core, half of `own` below `own` x
/// [`SHM_ARENA_FULL_HOST_MIN_BYTES_PER_THREAD`] and three quarters below
/// `own` x [`SHM_ARENA_FULL_HOST_ALL_THREADS_MIN_BYTES_PER_THREAD`]; never
/// more than one per [`SHM_ARENA_MIN_BYTES_PER_THREAD`].
///
/// Measured on the 32-core GPU host, f32 sum, forcing the count
/// (bench/results/arena-threads-h200x2.txt, µs, two runs each): 2 ranks
/// were fastest with 8 threads from 512 KiB (2 MiB: 66.5 µs, 120.4 with
/// 4, an earlier build); 4 ranks with 4 threads up to 2 MiB, 6 from 4 to
/// 16 MiB (8 MiB: 594 / 632 against 948 / 775 with 8 and 917 / 849 with
/// 4) and 8 at 32 MiB (2204 / 2194 against 2496 / 2504 with 6); 8 ranks
/// with 2 or 3 up to 2 MiB, 3 at 4 and 8 MiB (8 MiB: 1558 / 1380 against
/// 1868 / 1511 with 4), 3 and 4 alike at 16 MiB, and 4 at 32 MiB (5730 /
/// 5003 against 6318 / 6708 with 3). The host's other tenants make single
/// runs vary by 20% or more.
///
/// ```
/// use tensorcomm::cpu::algorithms::shm_arena_threads;
/// assert_eq!(shm_arena_threads(256 << 10, 2, 32), 4);
/// assert_eq!(shm_arena_threads(2 << 20, 2, 32), 8);
/// assert_eq!(shm_arena_threads(2 << 20, 4, 32), 4);
/// assert_eq!(shm_arena_threads(8 << 20, 4, 32), 6);
/// assert_eq!(shm_arena_threads(32 << 20, 4, 32), 8);
/// assert_eq!(shm_arena_threads(1 << 20, 8, 32), 2);
/// assert_eq!(shm_arena_threads(8 << 20, 8, 32), 3);
/// assert_eq!(shm_arena_threads(16 << 20, 8, 32), 4);
/// assert_eq!(shm_arena_threads(64 << 20, 4, 2), 1);
/// ```
pub fn shm_arena_threads(nbytes: usize, world_size: usize, cores: usize) -> usize {
    let world = world_size.max(1);
    let own = (cores / world).clamp(1, SHM_ARENA_MAX_THREADS);
    let threads = if world * own < cores {
        own
    } else if nbytes < own * SHM_ARENA_FULL_HOST_MIN_BYTES_PER_THREAD {
        own / 2
    } else if nbytes < own * SHM_ARENA_FULL_HOST_ALL_THREADS_MIN_BYTES_PER_THREAD {
        own * 3 / 4
    } else {
        own
    };
    threads
        .max(1)
        .min((nbytes / SHM_ARENA_MIN_BYTES_PER_THREAD).max(1))
}

/// Threads per rank for an all-reduce of `nbytes` in symmetric memory
/// (`all_reduce_shm_symmetric`): [`shm_arena_threads`] while the ranks'
/// threads leave cores free. When they would take every core (`own` each),
/// half of `own` below `own` x [`SHM_ARENA_FULL_HOST_MIN_BYTES_PER_THREAD`]
/// and three quarters of it, rounded up, from there: with less traffic per
/// byte than the staged arena, big messages do best with fewer threads
/// than the whole of `own` (which the staged arena takes), but more than
/// its rounded-down three quarters on small hosts.
///
/// Measured, f32 sum, forcing the count (µs):
/// - 32-core host, 8 ranks (own 4; bench/results/symmetric-threads-h200x2.txt,
///   two runs): 3 threads fastest or within the noise from 2 to 32 MiB
///   (8 MiB: 994 / 1101 against 1274 / 1446 with 4 and 1406 / 1450 with 2;
///   32 MiB: 4500 / 4832 against 5132 / 5265 with 4).
/// - 16-core host, 8 ranks (own 2; bench/results/threads-16core-h200.txt):
///   2 threads against 1 at 2, 8, 32 MiB: 479 / 1589 / 6918 against
///   578 / 1745 / 13713; 1 thread at 512 KiB: 185 against 389.
/// - 16-core host, 4 ranks (own 4): 3 threads at 2 and 8 MiB: 188 / 709
///   against 276 / 904 with 2 and 203 / 876 with 4.
///
/// ```
/// use tensorcomm::cpu::algorithms::shm_symmetric_threads;
/// assert_eq!(shm_symmetric_threads(32 << 20, 8, 32), 3);
/// assert_eq!(shm_symmetric_threads(1 << 20, 8, 32), 2);
/// assert_eq!(shm_symmetric_threads(32 << 20, 2, 32), 8);
/// assert_eq!(shm_symmetric_threads(2 << 20, 8, 16), 2);
/// assert_eq!(shm_symmetric_threads(512 << 10, 8, 16), 1);
/// ```
pub fn shm_symmetric_threads(nbytes: usize, world_size: usize, cores: usize) -> usize {
    let world = world_size.max(1);
    let own = (cores / world).clamp(1, SHM_ARENA_MAX_THREADS);
    if world * own < cores {
        return shm_arena_threads(nbytes, world_size, cores);
    }
    let threads = if nbytes < own * SHM_ARENA_FULL_HOST_MIN_BYTES_PER_THREAD {
        own / 2
    } else {
        (own * 3).div_ceil(4)
    };
    threads
        .max(1)
        .min((nbytes / SHM_ARENA_MIN_BYTES_PER_THREAD).max(1))
}

/// An arena all-reduce moves the message in steps of at most this many
/// bytes per thread of a rank (within [`SHM_ARENA_MIN_STEP_BYTES`] and the
/// arena's chunk): every step costs a barrier over the group (the steps
/// are pipelined), so many threads get bigger steps.
pub const SHM_ARENA_STEP_BYTES_PER_THREAD: usize = 512 << 10;

/// The smallest step of an arena all-reduce (unless the arena's chunk is
/// smaller): 1 MiB, the step size measured in bench/results/gloo-h200x2.txt.
pub const SHM_ARENA_MIN_STEP_BYTES: usize = 1 << 20;

/// The all-reduce algorithms to choose from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AllReduceAlgorithm {
    Direct,
    HalvingDoubling,
    Ring,
}

/// Picks the all-reduce algorithm for a message of `nbytes` over
/// `world_size` ranks, from the thresholds above.
///
/// ```
/// use tensorcomm::cpu::algorithms::{select_all_reduce, AllReduceAlgorithm};
/// assert_eq!(select_all_reduce(8, 4), AllReduceAlgorithm::Direct);
/// assert_eq!(select_all_reduce(8, 8), AllReduceAlgorithm::HalvingDoubling);
/// assert_eq!(select_all_reduce(1 << 20, 4), AllReduceAlgorithm::HalvingDoubling);
/// assert_eq!(select_all_reduce(1 << 20, 3), AllReduceAlgorithm::Ring);
/// assert_eq!(select_all_reduce(1 << 20, 8), AllReduceAlgorithm::Ring);
/// assert_eq!(select_all_reduce(64 << 20, 4), AllReduceAlgorithm::Ring);
/// ```
pub fn select_all_reduce(nbytes: usize, world_size: usize) -> AllReduceAlgorithm {
    if nbytes <= direct_max_bytes(world_size) {
        AllReduceAlgorithm::Direct
    } else if nbytes >= ring_min_bytes(world_size) {
        AllReduceAlgorithm::Ring
    } else {
        AllReduceAlgorithm::HalvingDoubling
    }
}

/// Names `TENSORCOMM_CPU_ALL_REDUCE` accepts: `direct`,
/// `halving_doubling`, `ring`.
impl std::str::FromStr for AllReduceAlgorithm {
    type Err = crate::Error;

    fn from_str(s: &str) -> Result<Self> {
        match s.trim() {
            "direct" => Ok(AllReduceAlgorithm::Direct),
            "halving_doubling" => Ok(AllReduceAlgorithm::HalvingDoubling),
            "ring" => Ok(AllReduceAlgorithm::Ring),
            other => Err(crate::Error::BadValue {
                name: ALL_REDUCE_ALGORITHM_ENV.into(),
                expected: "direct, halving_doubling or ring".into(),
                found: other.into(),
            }),
        }
    }
}

/// The environment variable that forces one all-reduce algorithm over the
/// transport (not the shared-memory arena), for tuning the thresholds
/// above; every rank must see the same value.
pub const ALL_REDUCE_ALGORITHM_ENV: &str = "TENSORCOMM_CPU_ALL_REDUCE";

/// The algorithm `TENSORCOMM_CPU_ALL_REDUCE` forces, if set; an unknown
/// name is reported once and ignored.
fn forced_all_reduce() -> Option<AllReduceAlgorithm> {
    static FORCED: std::sync::OnceLock<Option<AllReduceAlgorithm>> = std::sync::OnceLock::new();
    *FORCED.get_or_init(|| {
        let raw = std::env::var(ALL_REDUCE_ALGORITHM_ENV).ok()?;
        raw.parse().map_err(|e| tracing::warn!(%e, "ignored")).ok()
    })
}

/// The ring all-reduce's segment: [`RING_SEGMENT_BYTES`], or the bytes in
/// `TENSORCOMM_RING_SEGMENT` (suffixes K and M, 4 KiB to 64 MiB) where
/// set, for tuning (see [`crate::tuning`]); every rank must see the same
/// value.
fn ring_segment_bytes() -> usize {
    static SEGMENT: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *SEGMENT.get_or_init(|| {
        crate::tuning::env_size("TENSORCOMM_RING_SEGMENT", 4 << 10..=64 << 20)
            .unwrap_or(RING_SEGMENT_BYTES)
    })
}

/// All-reduces `buf` (elements of `dtype`) in place with the algorithm
/// [`select_all_reduce`] picks (or `TENSORCOMM_CPU_ALL_REDUCE` forces).
pub fn all_reduce(
    t: &dyn Transport,
    buf: &mut [u8],
    dtype: DType,
    op: ReduceOp,
    deadline: Instant,
) -> Result<()> {
    let algorithm =
        forced_all_reduce().unwrap_or_else(|| select_all_reduce(buf.len(), t.world_size()));
    all_reduce_with(algorithm, t, buf, dtype, op, deadline)
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
        AllReduceAlgorithm::Ring => {
            all_reduce_ring_segmented(t, buf, dtype, op, deadline, ring_segment_bytes())
        }
    }
}

/// Reduces every rank's `buf` into `root`'s: over the binomial tree for
/// messages the all-reduce would not send around the ring, else ring
/// reduce-scatter and gather ([`reduce_ring_gather`]; the same crossover,
/// [`select_all_reduce`], as both trade latency for bandwidth alike). The
/// other ranks' `buf` end up holding partial results.
pub fn reduce(
    t: &dyn Transport,
    buf: &mut [u8],
    dtype: DType,
    op: ReduceOp,
    root: usize,
    deadline: Instant,
) -> Result<()> {
    if select_all_reduce(buf.len(), t.world_size()) == AllReduceAlgorithm::Ring {
        reduce_ring_gather(t, buf, dtype, op, root, ring_segment_bytes(), deadline)
    } else {
        reduce_tree(t, buf, dtype, op, root, deadline)
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
