//! How a blocked send or recv waits: spin, then yield, then sleep.
//!
//! A peer that answers within a few microseconds is caught while spinning,
//! so small round trips never enter the kernel. A peer that is busy for
//! longer gets the core back: first through `yield_now` (cheap, still
//! prompt), then through sleeps that grow to [`MAX_SLEEP`], so a rank that
//! waits for seconds costs almost nothing. A wait on one ring sleeps on the
//! ring's signal instead ([`Backoff::snooze_on`]): the peer's next write
//! (or read) wakes it at once, so those sleeps may grow longer, to
//! [`MAX_SIGNAL_SLEEP`], and an idle reader wakes a few dozen times a
//! second.
//!
//! That suits a host with a core for every rank. When a host runs more of
//! a group's ranks than it has CPUs online ([`ShmWait::Auto`]
//! resolving to [`ShmWait::Sleep`]), the peer being waited for is often not
//! running at all: it waits for the core this rank is spinning on, so
//! spinning for 50 µs only delays it (4 ranks on the 2-core VM took
//! 130-195 µs per 8-byte all-reduce that way). A sleeping wait
//! ([`ShmWait::Sleep`]) then spins only [`SLEEP_SPIN_FOR`] and yields, and
//! past [`YIELD_UNTIL`] it sleeps on a signal (a futex) that the peer
//! wakes: a ring's, which the peer's write wakes, or, in the arena, that
//! of the progress counter it waits for, which the counter's owner wakes
//! when it publishes (`arena.rs`). Waits without a signal (during set-up)
//! sleep in plain steps instead.
//!
//! Yielding, not sleeping, is what the short waits of a collective want
//! there: a yield hands the core to a runnable peer at the cost of a
//! context switch, while a futex sleep makes the peer pay for waking this
//! rank at each of its steps (a system call, and in a VM an interrupt to
//! another CPU). On the 2-core VM, sleeping after the 5 µs spin took 2
//! to 4 times as long per all-reduce among 4 or 8 ranks as yielding
//! first, and a yield phase shorter than 2 ms was no faster
//! (bench/results/oversubscription-vm-2core/README.md). The futex keeps
//! long waits (a peer busy elsewhere) from polling, and wakes them as
//! soon as the peer moves.
//!
//! `TENSORCOMM_SHM_WAIT` (`auto`, `spin` or `sleep`) overrides the choice
//! for a process group's links and arena, read when the group is created:
//! for a container whose CPU count misleads `auto`.
//! Each rank's waiting is its own (a peer's write wakes a sleeper whatever
//! the writer's own policy), so ranks may choose differently.

use std::fmt;
use std::str::FromStr;
use std::time::{Duration, Instant};

use crate::env_vars::{EnvVar, SHM_WAIT};
use crate::{Error, Result};

/// Spin on the ring counters for this long after the last progress.
pub(super) const SPIN_FOR: Duration = Duration::from_micros(50);
/// Then yield the core until this long after the last progress.
pub(super) const YIELD_UNTIL: Duration = Duration::from_millis(2);
/// The first sleep after yielding; each later one doubles, up to MAX_SLEEP.
const FIRST_SLEEP: Duration = Duration::from_micros(20);
/// The longest sleep, which bounds how late a waiter notices new data.
pub(super) const MAX_SLEEP: Duration = Duration::from_millis(1);
/// The longest sleep on a ring's signal, which bounds how late a waiter
/// notices a peer that died without a word (new data wakes it at once).
pub(super) const MAX_SIGNAL_SLEEP: Duration = Duration::from_millis(20);
/// With [`ShmWait::Sleep`]: spin this long before yielding, enough to
/// catch a peer that is running on another core and answers at once.
pub(super) const SLEEP_SPIN_FOR: Duration = Duration::from_micros(5);
/// With [`ShmWait::Sleep`]: the first sleep on a signal. The peer's move
/// wakes the sleeper; the timeout only bounds how late a dead peer is
/// noticed, so it need not start short (short ones wake for nothing and
/// take the core from the peers).
const SLEEP_FIRST_SIGNAL_SLEEP: Duration = Duration::from_micros(100);

/// How the ranks of a shared-memory transport wait for each other.
///
/// ```
/// use tensorcomm::cpu::transport::shm::ShmWait;
///
/// // 4 ranks on 2 cores: sleep soon; 2 ranks on 2 cores: spin first.
/// assert_eq!(ShmWait::Auto.resolve(4, 2), ShmWait::Sleep);
/// assert_eq!(ShmWait::Auto.resolve(2, 2), ShmWait::Spin);
/// // An explicit choice stays.
/// assert_eq!(ShmWait::Spin.resolve(8, 2), ShmWait::Spin);
/// // Written as `TENSORCOMM_SHM_WAIT` takes it.
/// assert_eq!(" Sleep ".parse::<ShmWait>()?, ShmWait::Sleep);
/// assert_eq!(ShmWait::Spin.to_string(), "spin");
/// # Ok::<(), tensorcomm::Error>(())
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ShmWait {
    /// [`Sleep`](Self::Sleep) when the host runs more of the group's ranks
    /// than it has CPUs online ([`host_cpus_online`](crate::cpu::host_cpus_online):
    /// not this process's share, which is one core for a rank pinned to
    /// one), [`Spin`](Self::Spin) otherwise.
    #[default]
    Auto,
    /// Spin ~50 µs, then yield until ~2 ms, then sleep: the lowest latency
    /// while every rank has a core of its own.
    Spin,
    /// Spin ~5 µs, then yield until ~2 ms, then sleep on a futex that the
    /// peer wakes: a ring's, or that of the arena counter waited for (a
    /// barrier polling several links sleeps on the ring of a peer it has
    /// not heard from yet). For more ranks than cores, where spinning
    /// takes the core a peer needs. Sleeps end after at most 20 ms even
    /// unwoken, which bounds how late a dead peer is noticed.
    Sleep,
}

impl ShmWait {
    /// The policy for `local_ranks` ranks of a group on a host with
    /// `cores` CPUs: `Spin` or `Sleep`, never `Auto`.
    pub fn resolve(self, local_ranks: usize, cores: usize) -> ShmWait {
        match self {
            ShmWait::Auto if local_ranks > cores => ShmWait::Sleep,
            ShmWait::Auto => ShmWait::Spin,
            chosen => chosen,
        }
    }

    /// What `TENSORCOMM_SHM_WAIT` asks for, as `var` finds it (an
    /// environment lookup, [`EnvVar::get_lossy`] for the process's own, so
    /// that a value that is not Unicode arrives with U+FFFD in it): unset
    /// or empty is `Auto`; anything but `auto`, `spin` or `sleep` (in any
    /// case, spaces around allowed), such a value included, is an
    /// [`Error::BadValue`] naming the variable.
    pub(crate) fn from_vars(var: &dyn Fn(&EnvVar) -> Option<String>) -> Result<ShmWait> {
        match var(&SHM_WAIT) {
            None => Ok(ShmWait::Auto),
            Some(raw) if raw.trim().is_empty() => Ok(ShmWait::Auto),
            Some(raw) => raw.parse().map_err(|_| Error::BadValue {
                name: SHM_WAIT.name.into(),
                expected: EXPECTED.into(),
                found: raw,
            }),
        }
    }
}

/// The values a [`ShmWait`] is written as.
const EXPECTED: &str = "auto, spin or sleep";

impl FromStr for ShmWait {
    type Err = Error;

    /// `auto`, `spin` or `sleep`, in any case, spaces around allowed.
    fn from_str(s: &str) -> Result<Self> {
        match s.trim().to_ascii_lowercase().as_str() {
            "auto" => Ok(ShmWait::Auto),
            "spin" => Ok(ShmWait::Spin),
            "sleep" => Ok(ShmWait::Sleep),
            _ => Err(Error::BadValue {
                name: "shared-memory wait".into(),
                expected: EXPECTED.into(),
                found: s.into(),
            }),
        }
    }
}

impl fmt::Display for ShmWait {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ShmWait::Auto => "auto",
            ShmWait::Spin => "spin",
            ShmWait::Sleep => "sleep",
        })
    }
}

/// The waiting state of one blocked call.
pub(crate) struct Backoff {
    wait: ShmWait,
    /// Spin this long after the last progress...
    spin_for: Duration,
    /// ...then yield until this long after it, then sleep.
    yield_until: Duration,
    since: Instant,
    /// Sleeps taken since the last progress (each doubles the next).
    slept: u32,
}

impl Backoff {
    /// Waiting as on a host with a core per rank ([`ShmWait::Spin`]).
    pub fn new() -> Backoff {
        Backoff::with(ShmWait::Spin)
    }

    /// Waiting by `wait` (`Auto` counts as `Spin`: resolve it first).
    pub fn with(wait: ShmWait) -> Backoff {
        let spin_for = match wait {
            ShmWait::Sleep => SLEEP_SPIN_FOR,
            _ => SPIN_FOR,
        };
        Backoff {
            wait,
            spin_for,
            yield_until: YIELD_UNTIL,
            since: Instant::now(),
            slept: 0,
        }
    }

    /// Tests only: sleeps right after the spin, without yielding first,
    /// so that a test's waits exercise sleeping and waking.
    #[cfg(test)]
    pub fn without_yield(mut self) -> Backoff {
        self.yield_until = self.spin_for;
        self
    }

    /// Called after progress: the next wait spins again.
    pub fn reset(&mut self) {
        self.since = Instant::now();
        self.slept = 0;
    }

    /// Waits a little, more the longer nothing has happened.
    pub fn snooze(&mut self) {
        self.snooze_with(std::thread::sleep, false);
    }

    /// [`snooze`](Self::snooze), but a sleep is `sleep(duration)`, which
    /// returns early when what the caller waits for happens (a ring's
    /// signal), so sleeps grow to [`MAX_SIGNAL_SLEEP`].
    pub fn snooze_on(&mut self, sleep: impl FnOnce(Duration)) {
        self.snooze_with(sleep, true);
    }

    /// What the next snooze does, `idle` after the last progress.
    fn phase(&self, idle: Duration, on_signal: bool) -> Phase {
        if idle < self.spin_for {
            return Phase::Spin;
        }
        if idle < self.yield_until {
            return Phase::Yield;
        }
        let (first, longest) = match (self.wait, on_signal) {
            (ShmWait::Sleep, true) => (SLEEP_FIRST_SIGNAL_SLEEP, MAX_SIGNAL_SLEEP),
            (_, true) => (FIRST_SLEEP, MAX_SIGNAL_SLEEP),
            (_, false) => (FIRST_SLEEP, MAX_SLEEP),
        };
        let doubled = first.saturating_mul(1u32 << self.slept.min(16));
        Phase::Sleep(doubled.min(longest))
    }

    fn snooze_with(&mut self, sleep: impl FnOnce(Duration), on_signal: bool) {
        match self.phase(self.since.elapsed(), on_signal) {
            Phase::Spin => {
                for _ in 0..32 {
                    std::hint::spin_loop();
                }
            }
            Phase::Yield => std::thread::yield_now(),
            Phase::Sleep(d) => {
                sleep(d);
                self.slept = self.slept.saturating_add(1);
            }
        }
    }
}

/// One round of a [`Backoff`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    Spin,
    Yield,
    Sleep(Duration),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sleeps_grow_to_max_sleep_and_progress_starts_over() {
        let mut b = Backoff::new();
        b.snooze(); // spinning: no sleep taken yet
        assert_eq!(b.slept, 0);
        std::thread::sleep(YIELD_UNTIL);
        for _ in 0..8 {
            b.snooze();
        }
        assert_eq!(b.phase(YIELD_UNTIL, false), Phase::Sleep(MAX_SLEEP));
        let t = Instant::now();
        b.snooze();
        assert!(t.elapsed() >= MAX_SLEEP);
        b.reset();
        assert_eq!(b.slept, 0);
        assert_eq!(b.phase(YIELD_UNTIL, false), Phase::Sleep(FIRST_SLEEP));
    }

    #[test]
    fn spin_spins_then_yields_before_any_sleep() {
        let b = Backoff::with(ShmWait::Spin);
        for on_signal in [false, true] {
            assert_eq!(b.phase(Duration::ZERO, on_signal), Phase::Spin);
            assert_eq!(b.phase(SLEEP_SPIN_FOR * 2, on_signal), Phase::Spin);
            assert_eq!(b.phase(SPIN_FOR, on_signal), Phase::Yield);
        }
        assert_eq!(b.phase(YIELD_UNTIL, true), Phase::Sleep(FIRST_SLEEP));
    }

    #[test]
    fn sleep_spins_briefly_then_yields_then_sleeps() {
        let b = Backoff::with(ShmWait::Sleep);
        for on_signal in [false, true] {
            assert_eq!(b.phase(Duration::ZERO, on_signal), Phase::Spin);
            assert_eq!(b.phase(SLEEP_SPIN_FOR, on_signal), Phase::Yield);
            assert_eq!(b.phase(SPIN_FOR, on_signal), Phase::Yield);
        }
        assert_eq!(
            b.phase(YIELD_UNTIL, true),
            Phase::Sleep(SLEEP_FIRST_SIGNAL_SLEEP)
        );
        assert_eq!(b.phase(YIELD_UNTIL, false), Phase::Sleep(FIRST_SLEEP));
        // Tests may skip the yield, to exercise sleeping and waking.
        let b = Backoff::with(ShmWait::Sleep).without_yield();
        assert_eq!(
            b.phase(SLEEP_SPIN_FOR, true),
            Phase::Sleep(SLEEP_FIRST_SIGNAL_SLEEP)
        );
    }

    #[test]
    fn a_sleeping_wait_calls_the_signal_sleep_once_it_has_yielded() {
        let mut b = Backoff::with(ShmWait::Sleep);
        let started = Instant::now();
        let mut asked = None;
        while asked.is_none() {
            b.snooze_on(|d| asked = Some(d));
            assert!(started.elapsed() < Duration::from_secs(5), "never slept");
        }
        assert!(started.elapsed() >= YIELD_UNTIL);
        assert_eq!(asked, Some(SLEEP_FIRST_SIGNAL_SLEEP));
        // Later sleeps double up to the signal's longest.
        for _ in 0..20 {
            b.snooze_on(|d| asked = Some(d));
        }
        assert_eq!(asked, Some(MAX_SIGNAL_SLEEP));
    }

    #[test]
    fn auto_sleeps_only_with_more_ranks_than_cores() {
        assert_eq!(ShmWait::Auto.resolve(2, 2), ShmWait::Spin);
        assert_eq!(ShmWait::Auto.resolve(3, 2), ShmWait::Sleep);
        assert_eq!(ShmWait::Auto.resolve(8, 32), ShmWait::Spin);
        assert_eq!(ShmWait::Sleep.resolve(2, 32), ShmWait::Sleep);
        assert_eq!(ShmWait::Spin.resolve(64, 1), ShmWait::Spin);
    }

    /// A lookup that finds `value` for `TENSORCOMM_SHM_WAIT` only.
    fn shm_wait_is(value: Option<&'static str>) -> impl Fn(&EnvVar) -> Option<String> {
        move |v| (v.name == "TENSORCOMM_SHM_WAIT").then_some(value?.to_string())
    }

    #[test]
    fn the_environment_variable_parses_auto_spin_and_sleep() {
        for (raw, want) in [
            (None, ShmWait::Auto),
            (Some(""), ShmWait::Auto),
            (Some("  "), ShmWait::Auto),
            (Some("auto"), ShmWait::Auto),
            (Some("spin"), ShmWait::Spin),
            (Some("sleep"), ShmWait::Sleep),
            (Some(" sleep\n"), ShmWait::Sleep),
            (Some("\tSPIN "), ShmWait::Spin),
            (Some("Auto"), ShmWait::Auto),
        ] {
            assert_eq!(
                ShmWait::from_vars(&shm_wait_is(raw)).unwrap(),
                want,
                "{raw:?}"
            );
        }
        // Other variables are not its business.
        let others = |v: &EnvVar| (v.name != "TENSORCOMM_SHM_WAIT").then(|| "sleep".to_string());
        assert_eq!(ShmWait::from_vars(&others).unwrap(), ShmWait::Auto);
        // Written back as it is read.
        for w in [ShmWait::Auto, ShmWait::Spin, ShmWait::Sleep] {
            assert_eq!(w.to_string().parse::<ShmWait>().unwrap(), w);
        }
    }

    #[test]
    fn a_value_that_is_not_unicode_is_a_bad_value_not_auto() {
        use std::os::unix::ffi::OsStringExt;
        // "sleep" with a byte that is not UTF-8: EnvVar::get would find
        // nothing (so `auto`); the process's lookup finds it lossily.
        let raw = std::ffi::OsString::from_vec(b"sle\xffep".to_vec());
        let found = crate::env_vars::lossy(Some(raw));
        assert_eq!(found.as_deref(), Some("sle\u{FFFD}ep"));
        match ShmWait::from_vars(&|v| (v.name == "TENSORCOMM_SHM_WAIT").then(|| found.clone())?) {
            Err(Error::BadValue { name, found, .. }) => {
                assert_eq!(name, "TENSORCOMM_SHM_WAIT");
                assert_eq!(found, "sle\u{FFFD}ep");
            }
            other => panic!("expected BadValue, found {other:?}"),
        }
    }

    #[test]
    fn a_bad_value_is_named_with_what_was_expected() {
        for bad in ["yield", "spinning", "1", "sleep spin"] {
            match ShmWait::from_vars(&shm_wait_is(Some(bad))) {
                Err(Error::BadValue {
                    name,
                    expected,
                    found,
                }) => {
                    assert_eq!(name, "TENSORCOMM_SHM_WAIT");
                    assert_eq!(expected, "auto, spin or sleep");
                    assert_eq!(found, bad);
                }
                other => panic!("{bad:?}: expected BadValue, found {other:?}"),
            }
        }
    }
}
