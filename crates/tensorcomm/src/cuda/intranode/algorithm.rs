//! Which kernel runs an all-reduce of a given size: one-shot for small
//! messages (one barrier, every rank reads everything), two-shot up to the
//! buffer (two barriers, each rank reads 1/n of every input twice), and
//! beyond that the large path (two-shot over buffer-sized chunks).
//!
//! The size limits are PyTorch IntraNodeComm's (one-shot up to 256 KiB,
//! two-shot up to 10 MiB) until they are measured per world size over
//! NVLink; `TENSORCOMM_INTRANODE_ALGO` forces one algorithm.

use std::sync::atomic::{AtomicU64, Ordering};

use crate::env_vars;
use crate::{Error, Result};

/// An all-reduce algorithm of [`IntraNodeComm`](super::IntraNodeComm), or
/// `None` when the call falls back to another path (NCCL, host staging).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum AllReduceAlgo {
    /// One kernel, one barrier; every rank reduces the whole message.
    OneShot,
    /// One kernel, two barriers: reduce-scatter, then all-gather.
    TwoShot,
    /// Two-shot over chunks the size of the buffer, for messages larger
    /// than it.
    Large,
    /// Not run on peer memory (see
    /// [`IntraNodeComm::why_not`](super::IntraNodeComm::why_not)).
    None,
}

impl AllReduceAlgo {
    /// The name `TENSORCOMM_INTRANODE_ALGO` takes.
    pub fn name(self) -> &'static str {
        match self {
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

/// Largest message (bytes) one-shot takes by default.
pub const ONE_SHOT_MAX: usize = 256 << 10;
/// Largest message (bytes) two-shot takes by default (when the buffer
/// holds it).
pub const TWO_SHOT_MAX: usize = 10 << 20;

/// How algorithms are chosen: by size, or one forced.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AlgoChoice {
    /// By size ([`ONE_SHOT_MAX`], [`TWO_SHOT_MAX`], the buffer).
    Auto,
    /// Always this algorithm where the message fits the buffer (large
    /// messages still take [`AllReduceAlgo::Large`]).
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
            "one_shot" => AlgoChoice::Force(AllReduceAlgo::OneShot),
            "two_shot" => AlgoChoice::Force(AllReduceAlgo::TwoShot),
            "large" => AlgoChoice::Force(AllReduceAlgo::Large),
            other => {
                return Err(Error::BadValue {
                    name: env_vars::INTRANODE_ALGO.name.into(),
                    expected: "auto, one_shot, two_shot or large".into(),
                    found: other.into(),
                })
            }
        })
    }

    /// From the environment (`auto` when unset).
    pub fn from_env() -> Result<AlgoChoice> {
        AlgoChoice::parse(&env_vars::INTRANODE_ALGO.get().unwrap_or_default())
    }

    /// The algorithm for a message of `bytes` when the buffer region holds
    /// `region` bytes.
    pub fn pick(self, bytes: usize, region: usize) -> AllReduceAlgo {
        if bytes > region {
            return AllReduceAlgo::Large;
        }
        match self {
            AlgoChoice::Force(algo) => algo,
            AlgoChoice::Auto if bytes <= ONE_SHOT_MAX => AllReduceAlgo::OneShot,
            AlgoChoice::Auto if bytes <= TWO_SHOT_MAX => AllReduceAlgo::TwoShot,
            AlgoChoice::Auto => AllReduceAlgo::Large,
        }
    }
}

/// How many all-reduces each algorithm ran (and how many fell back),
/// for tests and logs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AlgoUsage {
    /// Calls run by one-shot.
    pub one_shot: u64,
    /// Calls run by two-shot.
    pub two_shot: u64,
    /// Calls run by the large path.
    pub large: u64,
    /// Calls that fell back (counted by callers that fall back).
    pub none: u64,
}

/// The counters behind [`AlgoUsage`].
#[derive(Default)]
pub(crate) struct UsageCounters([AtomicU64; 4]);

impl UsageCounters {
    pub(crate) fn count(&self, algo: AllReduceAlgo) {
        self.0[algo.index()].fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn snapshot(&self) -> AlgoUsage {
        let get = |a: AllReduceAlgo| self.0[a.index()].load(Ordering::Relaxed);
        AlgoUsage {
            one_shot: get(AllReduceAlgo::OneShot),
            two_shot: get(AllReduceAlgo::TwoShot),
            large: get(AllReduceAlgo::Large),
            none: get(AllReduceAlgo::None),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn auto_picks_by_size_and_the_buffer_bounds_every_choice() {
        let region = 16 << 20;
        let auto = AlgoChoice::Auto;
        assert_eq!(auto.pick(8, region), AllReduceAlgo::OneShot);
        assert_eq!(auto.pick(ONE_SHOT_MAX, region), AllReduceAlgo::OneShot);
        assert_eq!(auto.pick(ONE_SHOT_MAX + 4, region), AllReduceAlgo::TwoShot);
        assert_eq!(auto.pick(TWO_SHOT_MAX, region), AllReduceAlgo::TwoShot);
        assert_eq!(auto.pick(TWO_SHOT_MAX + 4, region), AllReduceAlgo::Large);
        // A small buffer sends what does not fit to the large path.
        assert_eq!(auto.pick(ONE_SHOT_MAX, 1 << 10), AllReduceAlgo::Large);
        let forced = AlgoChoice::Force(AllReduceAlgo::OneShot);
        assert_eq!(forced.pick(4 << 20, region), AllReduceAlgo::OneShot);
        assert_eq!(forced.pick(region + 4, region), AllReduceAlgo::Large);
    }

    #[test]
    fn parsing_names_the_variable_and_the_choices() {
        assert_eq!(AlgoChoice::parse("auto").unwrap(), AlgoChoice::Auto);
        assert_eq!(AlgoChoice::parse("").unwrap(), AlgoChoice::Auto);
        assert_eq!(
            AlgoChoice::parse(" large ").unwrap(),
            AlgoChoice::Force(AllReduceAlgo::Large)
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
        assert_eq!(
            c.snapshot(),
            AlgoUsage {
                two_shot: 2,
                none: 1,
                ..AlgoUsage::default()
            }
        );
    }
}
