//! Which kernel runs an all-reduce of a given size: push for the smallest
//! messages (no barrier: each rank stores its input, flagged, into every
//! peer's inbox), one-shot for small ones (one barrier, every rank reads
//! everything), two-shot for medium ones beyond 2 ranks (two barriers,
//! each rank reads 1/n of every input twice), and beyond that the large
//! kernel (each rank stores its slices into their owners' buffers and
//! its reduced slice into every peer's, chunk by chunk, any size).
//!
//! The size limits depend on the world size ([`push_max`],
//! [`one_shot_max`], [`two_shot_max`]; each says where it was measured):
//! push's at 2, 3 and 4 ranks on four H200s, one-shot's at 2 ranks on two
//! H200s and at 4 ranks on four, two-shot's at 2, 3 and 4 ranks; other
//! world sizes take the nearest measured one's.
//! `TENSORCOMM_INTRANODE_ALGO` forces one algorithm.

use std::sync::atomic::{AtomicU64, Ordering};

use crate::cuda::kernels::PUSH_MAX_BYTES;
use crate::env_vars;
use crate::{Error, Result};

/// An all-reduce algorithm of [`IntraNodeComm`](super::IntraNodeComm), or
/// `None` when the call falls back to another path (NCCL, host staging).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum AllReduceAlgo {
    /// One kernel, no barrier: every rank stores its input, each word
    /// beside the call's flag, into every peer's inbox and reduces what
    /// arrives in its own, in rank order. By default for the smallest
    /// messages ([`push_max`]; the flags double the bytes moved), forced
    /// up to 256 KiB (its inbox).
    Push,
    /// One kernel, one barrier; every rank reduces the whole message.
    OneShot,
    /// One kernel, two barriers: reduce-scatter, then all-gather.
    TwoShot,
    /// One kernel, any size: each rank stores its slices into their
    /// owners' buffers and its reduced slice into every peer's, chunk by
    /// chunk, two barriers a chunk (after one at the start).
    Large,
    /// Not run on peer memory (see
    /// [`IntraNodeComm::why_not`](super::IntraNodeComm::why_not)).
    None,
}

impl AllReduceAlgo {
    /// The name `TENSORCOMM_INTRANODE_ALGO` takes.
    pub fn name(self) -> &'static str {
        match self {
            AllReduceAlgo::Push => "push",
            AllReduceAlgo::OneShot => "one_shot",
            AllReduceAlgo::TwoShot => "two_shot",
            AllReduceAlgo::Large => "large",
            AllReduceAlgo::None => "none",
        }
    }

    fn index(self) -> usize {
        self as usize
    }
}

/// Largest message (bytes) push takes by default in a group of `world`
/// ranks (never above 256 KiB, its inbox).
///
/// Measured on four H200s (NVLink, `bench/results/push-and-faults-h200x4`,
/// f32, eager calls): at 2 ranks push beat one-shot at every size up to
/// 128 KiB (8.5 against 9.5 µs there) and tied at 256 KiB; at 3 ranks it
/// tied at 64 KiB (9.9 against 9.7 µs) and lost at 128 KiB; at 4 ranks it
/// tied at 4 KiB (9.3 against 9.4 µs) and lost from 16 KiB (10.2 against
/// 9.7 µs), though in CUDA graphs it still won there. 5 to 8 ranks take
/// 4 ranks' limit, not yet measured.
///
/// ```
/// use tensorcomm::cuda::intranode::{one_shot_max, push_max};
/// assert!(push_max(2) <= one_shot_max(2));
/// ```
pub const fn push_max(world: usize) -> usize {
    match world {
        0..=2 => 128 << 10,
        3 => 64 << 10,
        _ => 4 << 10,
    }
}

/// Largest message (bytes) one-shot takes by default in a group of
/// `world` ranks.
///
/// At 2 ranks (two H200s, NV18, `bench/results/intranode-large-h200x2`,
/// bf16) one-shot beat two-shot and the large kernel up to 4 MiB (23.4
/// against 25.2 and 24.5 µs there) and lost to the large kernel at 16 MiB
/// (67.1 against 63.6 µs). Beyond 2 ranks each rank reads (world - 1)
/// times the message: at 4 ranks (four H200s,
/// `bench/results/multi-gpu-h200x4`) one-shot was faster up to 256 KiB
/// (14.2 against 19.0 µs) and two-shot from 1 MiB (21.9 against 23.7 µs);
/// 3 and 5 to 8 ranks use the same 256 KiB, not yet measured.
///
/// ```
/// use tensorcomm::cuda::intranode::one_shot_max;
/// assert!(one_shot_max(2) > one_shot_max(8));
/// ```
pub const fn one_shot_max(world: usize) -> usize {
    if world <= 2 {
        4 << 20
    } else {
        256 << 10
    }
}

/// Largest message (bytes) two-shot takes by default in a group of
/// `world` ranks (when the buffer region holds it; larger ones take the
/// large kernel). At 2 ranks two-shot never beat both one-shot and the
/// large kernel (two H200s: 25.2 µs at 4 MiB, 68.6 µs at 16 MiB), so it
/// takes nothing: one-shot's limit. At 3 and 4 ranks (four H200s, f32,
/// eager, `bench/results/intranode-large-h200x4`) two-shot beat the large
/// kernel at 1 MiB (18.6 against 19.9 µs at 3 ranks, 20.5 against 21.6 at
/// 4), tied or won at 4 MiB (36.2 against 35.6, 36.8 against 39.9) and
/// lost at 16 MiB (107.9 against 103.8, 124.6 against 113.3); 5 to 8 ranks
/// take the same 4 MiB, not yet measured.
///
/// ```
/// use tensorcomm::cuda::intranode::{one_shot_max, two_shot_max};
/// assert!(two_shot_max(4) > one_shot_max(4));
/// assert_eq!(two_shot_max(2), one_shot_max(2));
/// ```
pub const fn two_shot_max(world: usize) -> usize {
    if world <= 2 {
        one_shot_max(world)
    } else {
        4 << 20
    }
}

/// Whether a group of `world` ranks whose other backend could take the
/// messages the large kernel would (NCCL's all_reduce) gives them to the
/// large kernel by default.
///
/// At 2 ranks (two H200s, NV18, bf16, `bench/results/intranode-large-h200x2`)
/// the large kernel beat PyTorch's NCCL all_reduce in the same call from
/// 16 MiB to 1 GiB (63.5 against 77.9 µs at 16 MiB, 209 against 249 µs at
/// 64 MiB, 3.0 against 3.25 ms at 1 GiB); inside the NCCL group one 16 MiB
/// row was unexplainedly slow (498 µs). At 3 and 4 ranks (four H200s, f32,
/// the NCCL group's all_reduce with the large kernel forced against
/// peer memory off, `bench/results/intranode-large-h200x4`) it beat the
/// group's NCCL path from 1 MiB to 256 MiB (4 ranks: 132 against 253 µs at
/// 16 MiB, 383 against 607 at 64 MiB, 1.25 against 1.48 ms at 256 MiB) and
/// was within 3% at 1 GiB (4.41 against 4.39 ms at 3 ranks, 4.87 against
/// 4.74 at 4). That NCCL path was itself slower than PyTorch's NCCL,
/// measured in another call on four H200s (607 µs for f32 against 323 µs
/// for bf16 of the same 64 MiB; not yet explained), which beat the large kernel from 16 MiB at 4
/// ranks in its call (98.8 against 114.6 µs); so the choice is the faster
/// of what this group has.
/// From 5 ranks the large kernel has not been measured, so NCCL keeps
/// those.
///
/// ```
/// use tensorcomm::cuda::intranode::large_beats_nccl;
/// assert!(large_beats_nccl(4) && !large_beats_nccl(8));
/// ```
pub const fn large_beats_nccl(world: usize) -> bool {
    world <= 4
}

/// How algorithms are chosen: by size, or one forced.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AlgoChoice {
    /// By size ([`push_max`], [`one_shot_max`], [`two_shot_max`], the
    /// buffer).
    Auto,
    /// Always this algorithm where the message fits its buffer (large
    /// messages still take [`AllReduceAlgo::Large`]; push beyond its
    /// inbox takes one-shot).
    Force(AllReduceAlgo),
}

impl AlgoChoice {
    /// Parses `TENSORCOMM_INTRANODE_ALGO`'s value.
    ///
    /// ```
    /// use tensorcomm::cuda::intranode::{AlgoChoice, AllReduceAlgo};
    /// assert_eq!(AlgoChoice::parse("two_shot")?, AlgoChoice::Force(AllReduceAlgo::TwoShot));
    /// assert!(AlgoChoice::parse("fast").is_err());
    /// # Ok::<(), tensorcomm::Error>(())
    /// ```
    pub fn parse(value: &str) -> Result<AlgoChoice> {
        Ok(match value.trim() {
            "" | "auto" => AlgoChoice::Auto,
            "push" => AlgoChoice::Force(AllReduceAlgo::Push),
            "one_shot" => AlgoChoice::Force(AllReduceAlgo::OneShot),
            "two_shot" => AlgoChoice::Force(AllReduceAlgo::TwoShot),
            "large" => AlgoChoice::Force(AllReduceAlgo::Large),
            other => {
                return Err(Error::BadValue {
                    name: env_vars::INTRANODE_ALGO.name.into(),
                    expected: "auto, push, one_shot, two_shot or large".into(),
                    found: other.into(),
                })
            }
        })
    }

    /// From the environment (`auto` when unset).
    pub fn from_env() -> Result<AlgoChoice> {
        AlgoChoice::parse(&env_vars::INTRANODE_ALGO.get().unwrap_or_default())
    }

    /// The algorithm for a message of `bytes` in a group of `world` ranks
    /// when the buffer region holds `region` bytes.
    pub fn pick(self, bytes: usize, region: usize, world: usize) -> AllReduceAlgo {
        if bytes > region {
            return AllReduceAlgo::Large;
        }
        match self {
            AlgoChoice::Force(AllReduceAlgo::Push) if bytes > PUSH_MAX_BYTES => {
                AllReduceAlgo::OneShot
            }
            AlgoChoice::Force(algo) => algo,
            AlgoChoice::Auto if bytes <= push_max(world).min(PUSH_MAX_BYTES) => AllReduceAlgo::Push,
            AlgoChoice::Auto if bytes <= one_shot_max(world) => AllReduceAlgo::OneShot,
            AlgoChoice::Auto if bytes <= two_shot_max(world) => AllReduceAlgo::TwoShot,
            AlgoChoice::Auto => AllReduceAlgo::Large,
        }
    }
}

/// How many all-reduces each algorithm ran (and how many fell back),
/// for tests and logs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AlgoUsage {
    /// Calls run by push.
    pub push: u64,
    /// Calls run by one-shot.
    pub one_shot: u64,
    /// Calls run by two-shot.
    pub two_shot: u64,
    /// Calls run by the large path.
    pub large: u64,
    /// Calls that fell back (counted by callers that fall back).
    pub none: u64,
    /// Of the one-shot and two-shot calls, those captured on tensors
    /// registered with every rank ([`IntraNodeComm::capture_registered`](super::IntraNodeComm::capture_registered)).
    pub registered: u64,
}

/// The counters behind [`AlgoUsage`].
#[derive(Default)]
pub(crate) struct UsageCounters([AtomicU64; 5], AtomicU64);

impl UsageCounters {
    pub(crate) fn count(&self, algo: AllReduceAlgo) {
        self.0[algo.index()].fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn count_registered(&self, calls: u64) {
        self.1.fetch_add(calls, Ordering::Relaxed);
    }

    pub(crate) fn snapshot(&self) -> AlgoUsage {
        let get = |a: AllReduceAlgo| self.0[a.index()].load(Ordering::Relaxed);
        AlgoUsage {
            push: get(AllReduceAlgo::Push),
            one_shot: get(AllReduceAlgo::OneShot),
            two_shot: get(AllReduceAlgo::TwoShot),
            large: get(AllReduceAlgo::Large),
            none: get(AllReduceAlgo::None),
            registered: self.1.load(Ordering::Relaxed),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn auto_picks_by_size_and_the_buffer_bounds_every_choice() {
        let region = 128 << 20;
        let auto = AlgoChoice::Auto;
        for world in [2, 3, 4, 8] {
            let (push, one, two) = (push_max(world), one_shot_max(world), two_shot_max(world));
            assert!(push < one && one <= two && two < region, "{world} ranks");
            assert!(push <= PUSH_MAX_BYTES);
            assert_eq!(auto.pick(8, region, world), AllReduceAlgo::Push);
            assert_eq!(auto.pick(push, region, world), AllReduceAlgo::Push);
            assert_eq!(auto.pick(push + 4, region, world), AllReduceAlgo::OneShot);
            assert_eq!(auto.pick(one, region, world), AllReduceAlgo::OneShot);
            if two > one {
                assert_eq!(auto.pick(one + 4, region, world), AllReduceAlgo::TwoShot);
                assert_eq!(auto.pick(two, region, world), AllReduceAlgo::TwoShot);
            }
            assert_eq!(auto.pick(two + 4, region, world), AllReduceAlgo::Large);
            // A small buffer sends what does not fit to the large path.
            assert_eq!(auto.pick(one, 1 << 10, world), AllReduceAlgo::Large);
        }
        // One-shot's range shrinks as the ranks grow (it reads world - 1
        // copies of the message).
        assert_eq!(one_shot_max(2), 4 << 20);
        assert_eq!(one_shot_max(4), 256 << 10);
        let forced = AlgoChoice::Force(AllReduceAlgo::OneShot);
        assert_eq!(forced.pick(4 << 20, region, 8), AllReduceAlgo::OneShot);
        assert_eq!(forced.pick(region + 4, region, 2), AllReduceAlgo::Large);
        // Push beyond its inbox runs one-shot.
        let push = AlgoChoice::Force(AllReduceAlgo::Push);
        assert_eq!(push.pick(PUSH_MAX_BYTES, region, 8), AllReduceAlgo::Push);
        assert_eq!(
            push.pick(PUSH_MAX_BYTES + 4, region, 8),
            AllReduceAlgo::OneShot
        );
        assert_eq!(push.pick(region + 4, region, 8), AllReduceAlgo::Large);
    }

    #[test]
    fn parsing_names_the_variable_and_the_choices() {
        assert_eq!(AlgoChoice::parse("auto").unwrap(), AlgoChoice::Auto);
        assert_eq!(AlgoChoice::parse("").unwrap(), AlgoChoice::Auto);
        assert_eq!(
            AlgoChoice::parse(" large ").unwrap(),
            AlgoChoice::Force(AllReduceAlgo::Large)
        );
        assert_eq!(
            AlgoChoice::parse("push").unwrap(),
            AlgoChoice::Force(AllReduceAlgo::Push)
        );
        let e = AlgoChoice::parse("none").unwrap_err().to_string();
        assert!(
            e.contains("TENSORCOMM_INTRANODE_ALGO") && e.contains("one_shot"),
            "{e}"
        );
    }

    #[test]
    fn usage_counts_each_algorithm_apart() {
        let c = UsageCounters::default();
        c.count(AllReduceAlgo::TwoShot);
        c.count(AllReduceAlgo::TwoShot);
        c.count(AllReduceAlgo::None);
        c.count_registered(1);
        assert_eq!(
            c.snapshot(),
            AlgoUsage {
                two_shot: 2,
                none: 1,
                registered: 1,
                ..AlgoUsage::default()
            }
        );
    }
}
