//! Where the CPU backend chooses its algorithms: every size, world and
//! transport threshold, and every `TENSORCOMM_*` override of them, read
//! once when a group is created ([`Selection::agreed_from_env`]) and agreed
//! across its ranks ([`agree`]): a rank with another value
//! fails creation naming the variable and both values, instead of taking
//! another path later and hanging. The measurements behind each threshold
//! are in `bench/results/`, named where the threshold is.

use std::time::{Duration, Instant};

use super::algorithms::{
    all_reduce_ring_segmented, all_reduce_with, reduce_ring_gather, reduce_tree,
    AllReduceAlgorithm, RING_SEGMENT_BYTES,
};
use super::reduce_kernels::ReduceOp;
use super::transport::{Transport, TransportChoice};
use crate::env_vars::{
    EnvVar, CPU_ALL_REDUCE, RING_SEGMENT, SENDER_CHECK, SHM_ARENA_CHUNK, SHM_ARENA_MIN,
    SHM_ARENA_THREADS, TRANSPORT,
};
use crate::store::Store;
use crate::tensor::DType;
use crate::tuning::parse_size;
use crate::{Error, Result};

/// Messages up to this many bytes over 2 ranks use [`all_reduce_direct`](algorithms::all_reduce_direct).
///
/// Measured on a 2-core VM (shared with other jobs, so noisy), 2 ranks as
/// threads of one process, each algorithm forced through
/// [`all_reduce_with`](algorithms::all_reduce_with) over a [`RoutedTransport`](crate::cpu::transport::RoutedTransport),
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
pub(crate) const DIRECT_MAX_BYTES: usize = 64 << 10;

/// Messages up to this many bytes over 3 to [`DIRECT_MAX_WORLD`] ranks use
/// [`all_reduce_direct`](algorithms::all_reduce_direct). On the GPU host
/// (bench/results/algorithms-small-h200x2.txt), µs direct / best other at
/// 2 KiB and 8 KiB over TCP: 3 ranks 22.7 / 40.9 and 39.2 / 44.7, 4 ranks
/// 32.3 / 35.4 and 59.6 / 41.0, 6 ranks 51.9 / 79.0 and 104.8 / 80.4; over
/// shared memory 3 ranks 9.2 / 10.6 and 15.3 / 15.1, 4 ranks 11.9 / 12.2 and
/// 21.8 / 16.1, 6 ranks 17.9 / 14.9 and 35.3 / 23.1.
pub(crate) const DIRECT_MAX_BYTES_FROM_3_RANKS: usize = 2 << 10;

/// Largest world for which [`all_reduce_direct`](algorithms::all_reduce_direct) is chosen (its traffic and
/// memory grow with the world size). On the GPU host 8 ranks were faster
/// with halving-doubling at every size from 32 bytes, over TCP (52.5 µs
/// against 57.4 at 32 B, 65.8 against 136.9 at 8 KiB) and shared memory
/// (12.2 against 14.8 at 32 B); 7 ranks were not measured.
pub(crate) const DIRECT_MAX_WORLD: usize = 6;

/// Up to how many bytes an all-reduce over `world_size` ranks takes
/// [`all_reduce_direct`](algorithms::all_reduce_direct) (0: never).
pub(crate) fn direct_max_bytes(world_size: usize) -> usize {
    match world_size {
        0..=2 => DIRECT_MAX_BYTES,
        w if w <= DIRECT_MAX_WORLD => DIRECT_MAX_BYTES_FROM_3_RANKS,
        _ => 0,
    }
}

/// Messages of at least this many bytes over 2 or 4 ranks use
/// [`all_reduce_ring`](algorithms::all_reduce_ring); below it (and above the direct threshold),
/// [`all_reduce_halving_doubling`](algorithms::all_reduce_halving_doubling). See [`ring_min_bytes`] for the
/// measurements behind this and the other worlds' thresholds.
pub(crate) const RING_MIN_BYTES: usize = 4 << 20;

/// [`RING_MIN_BYTES`] for 8 to 15 ranks.
pub(crate) const RING_MIN_BYTES_FROM_8_RANKS: usize = 256 << 10;

/// [`RING_MIN_BYTES`] for 5 to 7 ranks, where halving-doubling first folds
/// the ranks beyond a power of two in (a whole extra message each way).
pub(crate) const RING_MIN_BYTES_NON_POWER_OF_TWO: usize = 128 << 10;

/// [`RING_MIN_BYTES`] for 16 ranks or more.
pub(crate) const RING_MIN_BYTES_FROM_16_RANKS: usize = 4 << 20;

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
/// ([`RING_SEGMENT_BYTES`](algorithms::RING_SEGMENT_BYTES) now, bench/results/tcp-ring-segments-h200x2.txt)
/// 4 ranks took 1146, 1244 and 2173 µs at 2, 4 and 8 MiB, so their ring
/// starts at 4 MiB (halving-doubling's 869 µs still wins at 2 MiB).
/// Other worlds (bench/results/algorithms-other-worlds-h200x2.txt, TCP,
/// halving-doubling / ring): 3 ranks 44.7 / 44.7 at 8 KiB, 60.0 / 46.9 at
/// 32 KiB, 124.6 / 72.5 at 128 KiB, so the ring from where direct stops;
/// 6 ranks 107.5 / 125.7 at 32 KiB and 190.0 / 164.4 at 128 KiB; 16 ranks
/// 501 / 522 at 512 KiB and 1729 / 1994 at 2 MiB (larger not measured).
pub(crate) fn ring_min_bytes(world_size: usize) -> usize {
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
/// not turned off); below it [`broadcast_tree`](algorithms::broadcast_tree) over the transport.
pub(crate) const SHM_ARENA_BROADCAST_MIN_BYTES: usize = 64 << 10;

/// A reduce on a group with a shared-memory arena goes through it
/// (`reduce_to_root_shm_arena`) from this many bytes; smaller ones over the
/// transport ([`Selection::reduce`]). Measured on a 16-core host, f32, µs, binomial
/// tree over shared-memory links against the arena
/// (bench/results/reduce-all-to-all-16core-h200.txt): 8 KiB at 8 ranks
/// 10.4 / 19.6 and at 4 ranks 8.4 / 13.3; 128 KiB at 8 ranks 72.1 / 56.7,
/// at 4 ranks 54.6 / 37.7, at 2 ranks 39.2 / 29.2.
pub(crate) const SHM_ARENA_REDUCE_MIN_BYTES: usize = 64 << 10;

/// An all-to-all on a group with a shared-memory arena goes through it
/// ([`all_to_all_shm_arena`](algorithms::all_to_all_shm_arena)) when some rank sends another a block of at
/// least this many bytes; smaller ones go pairwise over the transport.
pub(crate) const SHM_ARENA_ALL_TO_ALL_MIN_BLOCK_BYTES: usize = 16 << 10;

/// All-reduces over 2 or 3 ranks above this many bytes use
/// `all_reduce_shm_arena` when the group has a shared-memory arena; below
/// it the transport-based algorithms above. See
/// [`shm_arena_all_reduce_min_bytes`] for the measurements.
pub(crate) const SHM_ARENA_MIN_BYTES: usize = 4 << 10;

/// [`SHM_ARENA_MIN_BYTES`] for 4 to 7 ranks.
pub(crate) const SHM_ARENA_MIN_BYTES_FROM_4_RANKS: usize = 2 << 10;

/// [`SHM_ARENA_MIN_BYTES`] for 8 ranks or more.
pub(crate) const SHM_ARENA_MIN_BYTES_FROM_8_RANKS: usize = 1 << 10;

/// Above how many bytes an all-reduce over `world_size` ranks sharing an
/// arena uses `all_reduce_shm_arena`.
///
/// Measured on the 32-core GPU host (bench/results/arena-threshold-h200x2.txt,
/// two runs, `TENSORCOMM_SHM_ARENA_MIN` forcing the arena or the transport
/// algorithms, µs arena / transport): 2 ranks 6.9-8.0 / 6.9 at 2 KiB,
/// 9.1-10.0 / 10.5-11.4 at 8 KiB, 15.0-15.4 / 24.0-26.9 at 32 KiB; 4 ranks
/// 9.9-10.7 / 11.4-13.1 at 2 KiB, 10.9-11.2 / 12.5-13.2 at 4 KiB; 8 ranks
/// 13.4-14.5 / 16.3-16.9 at 1 KiB and ahead at every larger size.
pub(crate) fn shm_arena_all_reduce_min_bytes(world_size: usize) -> usize {
    match world_size {
        0..=3 => SHM_ARENA_MIN_BYTES,
        4..=7 => SHM_ARENA_MIN_BYTES_FROM_4_RANKS,
        _ => SHM_ARENA_MIN_BYTES_FROM_8_RANKS,
    }
}

/// Most threads per rank for an arena all-reduce (fewer when the host has
/// fewer than this many cores per rank): one core's copies and reductions
/// reach only a fraction of the memory bandwidth.
pub(crate) const SHM_ARENA_MAX_THREADS: usize = 8;

/// Each thread of an arena all-reduce gets at least this many bytes of the
/// message.
pub(crate) const SHM_ARENA_MIN_BYTES_PER_THREAD: usize = 64 << 10;

/// When the threads of every rank together would take every core of the
/// host, each rank runs half as many below this many bytes per thread...
pub(crate) const SHM_ARENA_FULL_HOST_MIN_BYTES_PER_THREAD: usize = 512 << 10;

/// ...and three quarters as many below this many bytes per thread.
pub(crate) const SHM_ARENA_FULL_HOST_ALL_THREADS_MIN_BYTES_PER_THREAD: usize = 4 << 20;

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
pub(crate) fn shm_arena_threads(nbytes: usize, world_size: usize, cores: usize) -> usize {
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
pub(crate) fn shm_symmetric_threads(nbytes: usize, world_size: usize, cores: usize) -> usize {
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

/// Picks the all-reduce algorithm for a message of `nbytes` over
/// `world_size` ranks, from the thresholds above.
pub(crate) fn select_all_reduce(nbytes: usize, world_size: usize) -> AllReduceAlgorithm {
    if nbytes <= direct_max_bytes(world_size) {
        AllReduceAlgorithm::Direct
    } else if nbytes >= ring_min_bytes(world_size) {
        AllReduceAlgorithm::Ring
    } else {
        AllReduceAlgorithm::HalvingDoubling
    }
}
/// The raw values of the variables every rank must share, by name.
pub(crate) type RawValues = Vec<(&'static str, Option<String>)>;

/// The CPU backend's choices for one group (see the module docs).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Selection {
    world: usize,
    /// `TENSORCOMM_CPU_ALL_REDUCE`.
    forced_all_reduce: Option<AllReduceAlgorithm>,
    /// `TENSORCOMM_RING_SEGMENT`, or [`RING_SEGMENT_BYTES`].
    ring_segment: usize,
    /// `TENSORCOMM_SHM_ARENA_MIN`, or [`shm_arena_all_reduce_min_bytes`].
    arena_all_reduce_min: usize,
    /// `TENSORCOMM_SHM_ARENA_THREADS`.
    arena_threads: Option<usize>,
    /// `TENSORCOMM_SHM_ARENA_CHUNK`, or the arena's default for the world.
    arena_chunk: usize,
    /// `TENSORCOMM_SENDER_CHECK`: whether send-only ranks check their
    /// receivers' fingerprints before a call ends.
    sender_check: bool,
}

/// A size in `var` within `range`, or a [`Error::BadValue`] naming it.
fn size_in(var: &EnvVar, raw: &str, range: std::ops::RangeInclusive<usize>) -> Result<usize> {
    parse_size(raw)
        .filter(|n| range.contains(n))
        .ok_or_else(|| Error::BadValue {
            name: var.name.into(),
            expected: format!(
                "a size from {} to {} bytes (suffixes K, M, G)",
                range.start(),
                range.end()
            ),
            found: raw.into(),
        })
}

impl Selection {
    /// The choices for a group of `world` ranks, with the overrides `var`
    /// finds (an environment lookup); a value that does not parse is a
    /// [`Error::BadValue`] naming the variable.
    #[cfg(test)]
    fn from_vars(world: usize, var: &dyn Fn(&EnvVar) -> Option<String>) -> Result<Self> {
        Selection::parse(world, Selection::raw_from_vars(var))
    }

    /// The raw values of the agreed variables, as `var` finds them.
    pub(crate) fn raw_from_vars(var: &dyn Fn(&EnvVar) -> Option<String>) -> RawValues {
        [
            CPU_ALL_REDUCE,
            RING_SEGMENT,
            SHM_ARENA_MIN,
            SHM_ARENA_THREADS,
            SHM_ARENA_CHUNK,
            SENDER_CHECK,
        ]
        .iter()
        .map(|v| (v.name, var(v)))
        .collect()
    }

    /// The choices `raw` asks for; a value that does not parse is a
    /// [`Error::BadValue`] naming the variable.
    pub(crate) fn parse(world: usize, raw: RawValues) -> Result<Self> {
        let get = |v: &EnvVar| {
            raw.iter()
                .find(|(n, _)| *n == v.name)
                .and_then(|(_, r)| r.clone())
        };
        let forced_all_reduce = get(&CPU_ALL_REDUCE)
            .map(|r| r.parse::<AllReduceAlgorithm>())
            .transpose()?;
        let ring_segment = match get(&RING_SEGMENT) {
            Some(r) => size_in(&RING_SEGMENT, &r, 4 << 10..=64 << 20)?,
            None => RING_SEGMENT_BYTES,
        };
        let arena_all_reduce_min = match get(&SHM_ARENA_MIN) {
            Some(r) => size_in(&SHM_ARENA_MIN, &r, 0..=usize::MAX)?,
            None => shm_arena_all_reduce_min_bytes(world),
        };
        let arena_threads = get(&SHM_ARENA_THREADS)
            .map(|r| {
                r.trim()
                    .parse::<usize>()
                    .ok()
                    .filter(|n| (1..=64).contains(n))
                    .ok_or_else(|| Error::BadValue {
                        name: SHM_ARENA_THREADS.name.into(),
                        expected: "a number from 1 to 64".into(),
                        found: r.clone(),
                    })
            })
            .transpose()?;
        let arena_chunk = match get(&SHM_ARENA_CHUNK) {
            Some(r) => size_in(&SHM_ARENA_CHUNK, &r, 4 << 10..=64 << 20)?,
            None => default_arena_chunk(world),
        };
        let sender_check = match get(&SENDER_CHECK).as_deref().map(str::trim) {
            None | Some("1") => true,
            Some("0") => false,
            Some(other) => {
                return Err(Error::BadValue {
                    name: SENDER_CHECK.name.into(),
                    expected: "0 or 1".into(),
                    found: other.into(),
                })
            }
        };
        Ok(Selection {
            world,
            forced_all_reduce,
            ring_segment,
            arena_all_reduce_min,
            arena_threads,
            arena_chunk,
            sender_check,
        })
    }

    /// The choices for a group of `world` ranks from this process's
    /// environment, once every one of the `size` ranks has posted its raw
    /// values through `store` and found them equal ([`agree`]): a rank
    /// with a value that does not parse fails after posting it, so the
    /// others fail promptly too (naming the difference) instead of waiting
    /// for its post.
    ///
    /// The transport is agreed alongside, under `TENSORCOMM_TRANSPORT`'s
    /// name: `transport` resolved ([`TransportChoice::resolve`]: the
    /// options' choice, or the environment's for
    /// [`TransportChoice::Env`]), so ranks that would connect differently
    /// (one over TCP, one waiting for shared memory) fail here instead of
    /// waiting out their timeout. Returns the resolved transport.
    pub(crate) fn agreed_from_env(
        store: &dyn Store,
        key_prefix: &str,
        (rank, size): (usize, usize),
        timeout: Duration,
        transport: TransportChoice,
    ) -> Result<(Self, TransportChoice)> {
        let mut raw = Selection::raw_from_vars(&|v| v.get());
        let resolved = transport.resolve();
        let posted = match &resolved {
            // `auto` and `shm` connect ranks of one host the same way (and
            // ranks of different hosts cannot use `shm`): only TCP against
            // either of them waits forever.
            Ok(TransportChoice::Tcp) => "tcp".to_string(),
            Ok(_) => "auto or shm".to_string(),
            // Not a transport: posted as found, so the others fail too.
            Err(_) => TRANSPORT.get().unwrap_or_default(),
        };
        raw.push((TRANSPORT.name, Some(posted)));
        agree(&raw, store, key_prefix, rank, size, timeout)?;
        let transport = resolved?;
        Ok((Selection::parse(size, raw)?, transport))
    }

    /// Whether send-only ranks check their receivers' fingerprints before
    /// a call ends (`TENSORCOMM_SENDER_CHECK`).
    pub(crate) fn sender_check(&self) -> bool {
        self.sender_check
    }

    /// The all-reduce over the transport for `nbytes`.
    pub(crate) fn all_reduce_algorithm(&self, nbytes: usize) -> AllReduceAlgorithm {
        self.forced_all_reduce
            .unwrap_or_else(|| select_all_reduce(nbytes, self.world))
    }

    /// All-reduces `buf` (elements of `dtype`) in place over the transport
    /// with the algorithm chosen for its size.
    pub(crate) fn all_reduce(
        &self,
        t: &dyn Transport,
        buf: &mut [u8],
        dtype: DType,
        op: ReduceOp,
        deadline: Instant,
    ) -> Result<()> {
        match self.all_reduce_algorithm(buf.len()) {
            AllReduceAlgorithm::Ring => {
                all_reduce_ring_segmented(t, buf, dtype, op, deadline, self.ring_segment)
            }
            algorithm => all_reduce_with(algorithm, t, buf, dtype, op, deadline),
        }
    }

    /// Reduces every rank's `buf` into `root`'s over the transport: the
    /// binomial tree for messages the all-reduce would not send around the
    /// ring, else ring reduce-scatter and gather (the same crossover, as
    /// both trade latency for bandwidth alike). The other ranks' `buf` end
    /// up holding partial results.
    pub(crate) fn reduce(
        &self,
        t: &dyn Transport,
        buf: &mut [u8],
        dtype: DType,
        op: ReduceOp,
        root: usize,
        deadline: Instant,
    ) -> Result<()> {
        if select_all_reduce(buf.len(), t.world_size()) == AllReduceAlgorithm::Ring {
            reduce_ring_gather(t, buf, dtype, op, root, self.ring_segment, deadline)
        } else {
            reduce_tree(t, buf, dtype, op, root, deadline)
        }
    }

    /// True if an all-reduce of `nbytes` takes the group's arena.
    pub(crate) fn all_reduce_takes_arena(&self, nbytes: usize) -> bool {
        nbytes > self.arena_all_reduce_min
    }

    /// True if a broadcast of `nbytes` takes the group's arena.
    pub(crate) fn broadcast_takes_arena(&self, nbytes: usize) -> bool {
        nbytes > SHM_ARENA_BROADCAST_MIN_BYTES
    }

    /// True if a gather or scatter of `nbytes` per rank takes the group's
    /// arena (from the broadcast's size).
    pub(crate) fn gather_takes_arena(&self, nbytes: usize) -> bool {
        nbytes >= SHM_ARENA_BROADCAST_MIN_BYTES
    }

    /// True if a reduce of `nbytes` takes the group's arena.
    pub(crate) fn reduce_takes_arena(&self, nbytes: usize) -> bool {
        nbytes >= SHM_ARENA_REDUCE_MIN_BYTES
    }

    /// True if an all-to-all whose longest block is `longest` bytes takes
    /// the group's arena.
    pub(crate) fn all_to_all_takes_arena(&self, longest: usize) -> bool {
        longest >= SHM_ARENA_ALL_TO_ALL_MIN_BLOCK_BYTES
    }

    /// Threads per rank for an arena all-reduce or reduce of `nbytes`
    /// when the group's fewest cores are `cores` (`symmetric`: the tensor
    /// is in symmetric memory).
    pub(crate) fn arena_threads(&self, nbytes: usize, cores: usize, symmetric: bool) -> usize {
        if let Some(n) = self.arena_threads {
            return n;
        }
        if symmetric {
            shm_symmetric_threads(nbytes, self.world, cores)
        } else {
            shm_arena_threads(nbytes, self.world, cores)
        }
    }

    /// Threads per rank for a part of `part` bytes of an all-reduce of
    /// `whole` bytes cut into parts: as many as for the whole message
    /// ([`arena_threads`](Self::arena_threads)), but never more than one per
    /// [`SHM_ARENA_MIN_BYTES_PER_THREAD`] of the part (an override stands).
    /// A whole message (`part == whole`) gets its
    /// [`arena_threads`](Self::arena_threads), which caps the same way.
    pub(crate) fn arena_threads_for_part(
        &self,
        part: usize,
        whole: usize,
        cores: usize,
        symmetric: bool,
    ) -> usize {
        if let Some(n) = self.arena_threads {
            return n;
        }
        self.arena_threads(whole.max(part), cores, symmetric)
            .min((part / SHM_ARENA_MIN_BYTES_PER_THREAD).max(1))
    }

    /// The slot-half size of the group's arena.
    pub(crate) fn arena_chunk(&self) -> usize {
        self.arena_chunk
    }
}

/// Checks that every one of the `size` ranks read the same overrides:
/// each rank posts its raw values under `{key_prefix}/selection/{rank}`
/// and reads every other's; the first difference fails every rank that
/// sees it with [`Error::TuningMismatch`].
pub(crate) fn agree(
    raw: &RawValues,
    store: &dyn Store,
    key_prefix: &str,
    rank: usize,
    size: usize,
    timeout: Duration,
) -> Result<()> {
    if size < 2 {
        return Ok(());
    }
    let key = |r: usize| format!("{key_prefix}/selection/{r}");
    let mine = encode(raw);
    store.set(&key(rank), mine.as_bytes())?;
    for peer in (0..size).filter(|&r| r != rank) {
        let theirs = String::from_utf8_lossy(&store.get_timeout(&key(peer), timeout)?).into_owned();
        if theirs == mine {
            continue;
        }
        let theirs_of = |name: &str| {
            theirs
                .lines()
                .find_map(|l| l.strip_prefix(name).and_then(|v| v.strip_prefix('=')))
                .map(str::to_string)
        };
        for (name, value) in raw {
            let mine_v = value.clone().unwrap_or_else(|| "unset".into());
            let theirs_v = theirs_of(name).unwrap_or_else(|| "missing".into());
            if mine_v != theirs_v {
                return Err(Error::TuningMismatch {
                    variable: (*name).into(),
                    rank,
                    mine: mine_v,
                    peer,
                    theirs: theirs_v,
                });
            }
        }
    }
    Ok(())
}

fn encode(raw: &RawValues) -> String {
    raw.iter()
        .map(|(n, v)| format!("{n}={}\n", v.as_deref().unwrap_or("unset")))
        .collect()
}

/// The arena's slot half for `world` ranks, unless overridden.
fn default_arena_chunk(world: usize) -> usize {
    #[cfg(target_os = "linux")]
    return super::transport::shm::arena_chunk(world);
    #[cfg(not(target_os = "linux"))]
    {
        let _ = world;
        1 << 20
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::HashStore;

    #[test]
    fn thresholds_by_world() {
        assert_eq!(direct_max_bytes(2), 64 << 10);
        assert_eq!(direct_max_bytes(4), 2 << 10);
        assert_eq!(direct_max_bytes(8), 0);
        assert_eq!(ring_min_bytes(2), 4 << 20);
        assert_eq!(ring_min_bytes(3), 0);
        assert_eq!(ring_min_bytes(4), 4 << 20);
        assert_eq!(ring_min_bytes(6), 128 << 10);
        assert_eq!(ring_min_bytes(8), 256 << 10);
        assert_eq!(ring_min_bytes(16), 4 << 20);
        assert_eq!(shm_arena_all_reduce_min_bytes(2), 4 << 10);
        assert_eq!(shm_arena_all_reduce_min_bytes(4), 2 << 10);
        assert_eq!(shm_arena_all_reduce_min_bytes(8), 1 << 10);
        assert_eq!(select_all_reduce(8, 2), AllReduceAlgorithm::Direct);
        assert_eq!(
            select_all_reduce(1 << 20, 2),
            AllReduceAlgorithm::HalvingDoubling
        );
        assert_eq!(select_all_reduce(8 << 20, 2), AllReduceAlgorithm::Ring);
    }

    #[test]
    fn a_part_of_a_message_takes_the_whole_messages_threads_within_its_size() {
        let select = Selection::parse(4, Vec::new()).unwrap();
        // 4 ranks on 16 cores: a 1 MiB message alone takes 2 threads, a
        // 4 MiB one 3; its 1 MiB parts take 3 too.
        assert_eq!(select.arena_threads(1 << 20, 16, false), 2);
        assert_eq!(select.arena_threads(4 << 20, 16, false), 3);
        assert_eq!(
            select.arena_threads_for_part(1 << 20, 4 << 20, 16, false),
            3
        );
        // A 128 KiB part: at most one thread per 64 KiB.
        assert_eq!(
            select.arena_threads_for_part(128 << 10, 4 << 20, 16, false),
            2
        );
        // A part never takes fewer threads than it would alone.
        assert_eq!(
            select.arena_threads_for_part(4 << 20, 1 << 20, 16, false),
            3
        );
    }

    #[test]
    fn arena_threads_follow_cores_size_and_ranks() {
        // Ranks that leave cores free use their share, capped by size.
        assert_eq!(shm_arena_threads(64 << 20, 2, 16), 8);
        assert_eq!(shm_arena_threads(64 << 10, 2, 16), 1);
        // A full host: half the share for small messages.
        assert_eq!(shm_arena_threads(1 << 20, 8, 16), 1);
        assert_eq!(shm_arena_threads(64 << 20, 8, 16), 2);
        assert_eq!(shm_symmetric_threads(64 << 20, 8, 16), 2);
    }

    fn vars<'a>(
        pairs: &'a [(&'static str, &'static str)],
    ) -> impl Fn(&EnvVar) -> Option<String> + 'a {
        move |v| {
            pairs
                .iter()
                .find(|(n, _)| *n == v.name)
                .map(|(_, x)| x.to_string())
        }
    }

    #[test]
    fn overrides_are_read_and_bad_values_named() {
        let s = Selection::from_vars(
            4,
            &vars(&[
                ("TENSORCOMM_CPU_ALL_REDUCE", "ring"),
                ("TENSORCOMM_SHM_ARENA_THREADS", "3"),
                ("TENSORCOMM_SHM_ARENA_MIN", "1M"),
            ]),
        )
        .unwrap();
        assert_eq!(s.all_reduce_algorithm(8), AllReduceAlgorithm::Ring);
        assert_eq!(s.arena_threads(64 << 20, 16, false), 3);
        assert!(!s.all_reduce_takes_arena(1 << 20));
        assert!(s.all_reduce_takes_arena((1 << 20) + 1));
        let defaults = Selection::from_vars(4, &vars(&[])).unwrap();
        assert!(defaults.all_reduce_takes_arena((2 << 10) + 1));
        assert!(defaults.sender_check());
        let unchecked = Selection::from_vars(4, &vars(&[("TENSORCOMM_SENDER_CHECK", "0")]));
        assert!(!unchecked.unwrap().sender_check());
        for (name, bad) in [
            ("TENSORCOMM_SHM_ARENA_THREADS", "0"),
            ("TENSORCOMM_SHM_ARENA_CHUNK", "1K"),
            ("TENSORCOMM_RING_SEGMENT", "lots"),
            ("TENSORCOMM_SENDER_CHECK", "yes"),
            ("TENSORCOMM_CPU_ALL_REDUCE", "bcube"),
        ] {
            match Selection::from_vars(4, &vars(&[(name, bad)])) {
                Err(Error::BadValue { name: n, found, .. }) => {
                    assert_eq!((n.as_str(), found.as_str()), (name, bad));
                }
                other => panic!("{name}={bad}: expected BadValue, found {other:?}"),
            }
        }
    }

    #[test]
    fn ranks_with_other_overrides_are_named_at_creation() {
        let store = HashStore::new();
        let t = Duration::from_secs(5);
        let a = Selection::raw_from_vars(&vars(&[("TENSORCOMM_SHM_ARENA_THREADS", "2")]));
        let b = Selection::raw_from_vars(&vars(&[]));
        store.set("g/selection/1", encode(&b).as_bytes()).unwrap();
        match agree(&a, &store, "g", 0, 2, t) {
            Err(Error::TuningMismatch {
                variable,
                rank,
                mine,
                peer,
                theirs,
            }) => {
                assert_eq!(variable, "TENSORCOMM_SHM_ARENA_THREADS");
                assert_eq!((rank, peer), (0, 1));
                assert_eq!((mine.as_str(), theirs.as_str()), ("2", "unset"));
            }
            other => panic!("expected TuningMismatch, found {other:?}"),
        }
        let store = HashStore::new();
        store.set("g/selection/1", encode(&b).as_bytes()).unwrap();
        agree(&b, &store, "g", 0, 2, t).unwrap();
    }
}
