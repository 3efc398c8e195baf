//! [`ShmArena`]: one shared-memory segment for a whole group of ranks on
//! one host, in which collectives move data without going through the
//! per-pair byte rings.
//!
//! The segment starts with progress counters: for every rank and each of
//! up to [`ARENA_MAX_LANES`] lanes (threads) of it, how many steps it has
//! copied in, reduced and copied out ([`Progress`]), each on a cache line
//! of its own with the [`Signal`] its waiters sleep on; then a line with
//! the number of ranks whose waits sleep (see below); then two ballot
//! lines per rank, in which the ranks agree on a small vote without a
//! message ([`ShmArena::ballot`], `arena/ballot.rs`). Then come
//! `world_size` slots of `2 * chunk` bytes: each
//! rank's slot, split into two halves (parity 0 and 1) so that one chunk
//! of a message can be copied in while the previous one is still being
//! read. The algorithms using the arena (see
//! `cpu::algorithms::all_reduce_shm_arena`) order every write before
//! every read of the same bytes, by waiting on those counters
//! ([`ShmArena::wait_progress`]) or with barriers over the group's
//! transport, which also carries the collective's fingerprint and reports
//! a dead peer by name.
//!
//! # Waiting on the counters
//!
//! A rank that waits for a counter spins, then yields until ~2 ms, as a
//! link's calls do (`wait.rs`); with [`ShmWait::Spin`] it then takes
//! short plain sleeps. With [`ShmWait::Sleep`] (more of the group's ranks
//! than CPUs) it spins only ~5 µs before yielding, and then sleeps on the
//! counter's futex ([`Signal`]), which the counter's owner wakes when it
//! publishes. Waking costs the publisher a
//! fence and a look at the sleepers, so it does that only while some rank
//! of the arena waits by `Sleep`: each counts itself in the arena's
//! shared count of sleeping ranks when it takes that wait
//! ([`ShmArena::set_wait`]), and out again when it leaves it. No wake-up
//! is lost: a rank takes its wait outside any call (`set_wait` needs the
//! arena to itself), and every algorithm opens its calls with a barrier
//! in which every rank hears from every other, so each publisher of a call
//! sees the count that includes every sleeper of it. Past that, the
//! waiter announces itself on the signal, re-checks the counter and sleeps
//! only if it has not moved, while the publisher stores the counter and
//! then looks for sleepers, a fence on each side (`signal.rs`). Sleeps
//! still end after a timeout (up to 20 ms), which bounds how late a dead
//! peer or a failed lane of this rank is noticed.
//!
//! The segment is set up under `{key_prefix}/arena` by
//! `group_segment::connect_group_segment`: rank 0 creates it, the others
//! map it, and its name is unlinked once every rank has answered, so
//! nothing is left in `/dev/shm` afterwards (unless rank 0 dies in
//! between); it succeeds or fails on every rank together.

use std::ops::Range;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use super::group_segment::{connect_group_segment, Purpose};
use super::segment::Segment;
use super::signal::Signal;
use super::wait::{Backoff, ShmWait};
use crate::cpu::reduce_kernels::{reduce_into, ReduceOp};
use crate::store::Store;
use crate::tensor::DType;
use crate::{Error, Result};

/// A good chunk size: 1 MiB per slot half.
pub const DEFAULT_ARENA_CHUNK: usize = 1 << 20;

/// Lanes (threads per rank) the arena keeps progress counters for.
pub const ARENA_MAX_LANES: usize = 64;

/// What a lane of a rank reports having done, step by step, in the
/// arena's counters: each holds one more than the last global step done.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Progress {
    /// Staged its parts of the other ranks' shares in its slot.
    CopiedIn = 0,
    /// Reduced its part of its own share and published it in its slot.
    Reduced = 1,
    /// Copied its parts of the other ranks' reduced shares out.
    CopiedOut = 2,
}

impl Progress {
    fn verb(self) -> &'static str {
        match self {
            Progress::CopiedIn => "copy in",
            Progress::Reduced => "reduce",
            Progress::CopiedOut => "copy out",
        }
    }
}

/// A point in another rank's progress to wait for: lane `lane` of `rank`
/// having done `kind` for global step `step`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Milestone {
    pub rank: usize,
    pub lane: usize,
    pub kind: Progress,
    pub step: u64,
}

/// Bytes of one counter's cache line: the counter, then its [`Signal`].
const LINE: usize = 64;

/// Where a counter's [`Signal`] lies in its line.
const SIGNAL_AT: usize = 8;

const _: () = assert!(
    SIGNAL_AT >= std::mem::size_of::<AtomicU64>()
        && SIGNAL_AT.is_multiple_of(std::mem::align_of::<Signal>())
        && SIGNAL_AT + std::mem::size_of::<Signal>() <= LINE
);

/// Cache lines of counters in a `world_size`-rank arena.
fn counter_lines(world_size: usize) -> usize {
    world_size * ARENA_MAX_LANES * 3
}

/// Bytes of the control region at the start of a `world_size`-rank arena:
/// the counters, then the line of the count of sleeping ranks, then two
/// ballot lines per rank (`arena/ballot.rs`).
fn control_len(world_size: usize) -> usize {
    (counter_lines(world_size) + 1 + ballot::lines(world_size)) * LINE
}

/// How often a wait on a peer's counter asks whether the peer is alive.
const ALIVE_EVERY: Duration = Duration::from_millis(2);

/// A wait on a counter in the arena's control region
/// ([`ShmArena::wait_for`]): whose it is, the line, the value to pass, and
/// how its failures describe it.
struct Awaited<'a> {
    /// The rank that publishes the counter.
    peer: usize,
    counter: &'a AtomicU64,
    signal: &'a Signal,
    /// The wait ends once the counter holds more than this.
    past: u64,
    /// What this rank was doing, for a peer found dead meanwhile.
    closed: &'a dyn Fn() -> String,
    /// What it was waiting for, for a deadline that passed.
    timed_out: &'a dyn Fn() -> String,
}

/// A group's shared data area on one host (see the module docs).
///
/// ```
/// use std::{sync::Arc, thread, time::Duration};
/// use tensorcomm::cpu::transport::shm::{ShmArena, ShmWait};
/// use tensorcomm::store::HashStore;
///
/// let store = Arc::new(HashStore::new());
/// let ranks: Vec<_> = (0..2).map(|rank| {
///     let store = store.clone();
///     thread::spawn(move || -> tensorcomm::Result<usize> {
///         let mut arena = ShmArena::connect(&*store, "doc", rank, 2, 4096, Duration::from_secs(10))?;
///         // Waits on the other ranks' counters stop spinning soon.
///         arena.set_wait(ShmWait::Sleep);
///         assert_eq!(arena.wait(), ShmWait::Sleep);
///         Ok(arena.chunk())
///     })
/// }).collect();
/// for r in ranks {
///     assert_eq!(r.join().unwrap()?, 4096);
/// }
/// # Ok::<(), tensorcomm::Error>(())
/// ```
pub struct ShmArena {
    rank: usize,
    world_size: usize,
    chunk: usize,
    /// Steps staged so far: global step `g` uses half `g % 2`. Every rank
    /// runs the same steps in the same order, so the numbers agree, and
    /// progress counters hold them (one more than the last step done).
    steps: AtomicUsize,
    /// Set by an algorithm that leaves without a closing barrier, taken by
    /// one that relies on one (see [`ShmArena::take_unfenced`]).
    unfenced: AtomicBool,
    /// Ballots taken so far ([`ShmArena::ballot`]): ballot `b` uses the
    /// ballot lines of parity `b % 2`, whose rounds hold `b + 1`.
    ballots: AtomicU64,
    /// How waits on the counters go ([`ShmWait`]): with `Sleep` on the
    /// counters' signals, counted in the arena's sleeping ranks.
    wait: ShmWait,
    /// Tests only: a sleep on a counter's signal lasts this long unless
    /// woken, so that a lost wake-up stalls a test instead of costing
    /// one timeout of a few milliseconds; waits then sleep without
    /// yielding first, so that they sleep often.
    #[cfg(test)]
    test_sleep: Option<Duration>,
    segment: Segment,
}

impl std::fmt::Debug for ShmArena {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ShmArena")
            .field("rank", &self.rank)
            .field("world_size", &self.world_size)
            .field("chunk", &self.chunk)
            .finish()
    }
}

impl Drop for ShmArena {
    /// Counts this rank out of the arena's sleeping ranks: nobody need
    /// wake it any more.
    fn drop(&mut self) {
        self.set_wait(ShmWait::Spin);
    }
}

impl ShmArena {
    /// Sets up the arena of rank `rank` of `world_size` ranks, all on this
    /// host, with slot halves of `chunk` bytes. Every rank calls it with
    /// the same `key_prefix` and `chunk`; waiting for the others ends
    /// after `timeout` with a store timeout.
    pub fn connect(
        store: &dyn Store,
        key_prefix: &str,
        rank: usize,
        world_size: usize,
        chunk: usize,
        timeout: Duration,
    ) -> Result<ShmArena> {
        let len = world_size
            .checked_mul(2)
            .and_then(|n| n.checked_mul(chunk))
            .and_then(|n| n.checked_add(control_len(world_size)))
            .filter(|&n| chunk > 0 && rank < world_size && n <= isize::MAX as usize)
            .ok_or_else(|| {
                Error::InvalidArgument(format!(
                    "ShmArena::connect expected rank < world size and a non-empty arena, found rank {rank}, world size {world_size}, chunk {chunk}"
                ))
            })?;
        let purpose = Purpose {
            tag: "arena",
            what: "shared-memory arena",
            asked: chunk,
            asked_means: &|n| format!("slot halves of {n} bytes"),
        };
        let key = format!("{key_prefix}/arena");
        let segment =
            connect_group_segment(store, &key, (rank, world_size), len, &purpose, timeout)?;
        let mut arena = ShmArena {
            rank,
            world_size,
            chunk,
            steps: AtomicUsize::new(0),
            unfenced: AtomicBool::new(false),
            ballots: AtomicU64::new(0),
            wait: ShmWait::Spin,
            #[cfg(test)]
            test_sleep: None,
            segment,
        };
        arena.set_wait(ShmWait::Auto);
        Ok(arena)
    }

    /// Sets how waits on the other ranks' counters go ([`ShmWait`]);
    /// `Auto` is resolved against this arena's ranks and the host's CPUs
    /// online, as [`connect`](Self::connect) does. A rank that takes or
    /// leaves `Sleep` counts itself in or out of the arena's sleeping
    /// ranks, whom publishers then wake; its peers see that count from
    /// the opening barrier of their next call on (see the module docs),
    /// so set it between calls, never while a peer may be in one.
    pub fn set_wait(&mut self, wait: ShmWait) {
        let wait = wait.resolve(self.world_size, crate::cpu::host_cpus_online());
        match (self.wait, wait) {
            (ShmWait::Sleep, ShmWait::Sleep) => {}
            (_, ShmWait::Sleep) => {
                self.sleeping_ranks().fetch_add(1, Ordering::SeqCst);
            }
            (ShmWait::Sleep, _) => {
                self.sleeping_ranks().fetch_sub(1, Ordering::SeqCst);
            }
            _ => {}
        }
        self.wait = wait;
    }

    /// How many ranks of the arena wait by [`ShmWait::Sleep`] (see the
    /// module docs).
    fn sleeping_ranks(&self) -> &AtomicU32 {
        let at = counter_lines(self.world_size) * LINE;
        // SAFETY: the line after the counters lies inside the control
        // region at the start of the mapping (which `connect` sized with
        // `control_len`), 64-byte aligned within a page-aligned mapping
        // that lives as long as self; only atomics touch it, and a new
        // segment's zeroed bytes are a count of 0.
        unsafe { &*self.segment.base().as_ptr().add(at).cast::<AtomicU32>() }
    }

    /// Whether some rank's counter waits may sleep on a counter's signal
    /// (in which case [`publish`](Self::publish) wakes them).
    #[cfg(test)]
    pub(crate) fn wakes_sleepers(&self) -> bool {
        self.sleeping_ranks().load(Ordering::Relaxed) != 0
    }

    /// How waits on the other ranks' counters go: [`ShmWait::Spin`] or
    /// [`ShmWait::Sleep`].
    pub fn wait(&self) -> ShmWait {
        self.wait
    }

    /// The global number of the next step staged through the arena (its
    /// half is the number's parity); every rank runs the same steps in the
    /// same order, so the numbers agree.
    pub fn next_step(&self) -> u64 {
        self.steps.fetch_add(1, Ordering::Relaxed) as u64
    }

    /// Records that the last algorithm left without a closing barrier:
    /// other ranks may still read this rank's slot.
    pub fn mark_unfenced(&self) {
        self.unfenced.store(true, Ordering::Relaxed);
    }

    /// Whether the last algorithm left without a closing barrier (and
    /// clears it): the next one must pass a barrier before it writes.
    pub fn take_unfenced(&self) -> bool {
        self.unfenced.swap(false, Ordering::Relaxed)
    }

    /// The byte offset of the line of the counter of `kind` for lane
    /// `lane` of `rank`.
    fn line(&self, rank: usize, lane: usize, kind: Progress) -> usize {
        assert!(
            rank < self.world_size && lane < ARENA_MAX_LANES,
            "arena counter out of bounds: rank {rank} lane {lane}"
        );
        ((rank * ARENA_MAX_LANES + lane) * 3 + kind as usize) * LINE
    }

    /// The counter of `kind` for lane `lane` of `rank`.
    fn progress(&self, rank: usize, lane: usize, kind: Progress) -> &AtomicU64 {
        let at = self.line(rank, lane, kind);
        // SAFETY: `at` lies in the counter region at the start of the
        // mapping (`line` checked), 64-byte aligned within a page-aligned
        // mapping that lives as long as self; only atomics touch it.
        unsafe { &*self.segment.base().as_ptr().add(at).cast::<AtomicU64>() }
    }

    /// The signal the waiters on the counter of `kind` for lane `lane` of
    /// `rank` sleep on.
    fn signal(&self, rank: usize, lane: usize, kind: Progress) -> &Signal {
        let at = self.line(rank, lane, kind) + SIGNAL_AT;
        // SAFETY: `at` lies in the counter's line (`line` checked it, the
        // assertion on SIGNAL_AT that the signal fits after the counter),
        // aligned for a Signal, in a mapping that lives as long as self;
        // a Signal is two atomics (repr(C)), and a new segment's zeroed
        // bytes are its default.
        unsafe { &*self.segment.base().as_ptr().add(at).cast::<Signal>() }
    }

    /// Publishes that lane `lane` of this rank has done `kind` for every
    /// step up to global step `step`, and wakes the ranks sleeping on it
    /// if any rank of the arena may sleep (see the module docs): while
    /// every rank spins this is one store and one load of a line nobody
    /// writes.
    pub(crate) fn publish(&self, lane: usize, kind: Progress, step: u64) {
        self.progress(self.rank, lane, kind)
            .store(step + 1, Ordering::Release);
        if self.sleeping_ranks().load(Ordering::Relaxed) != 0 {
            self.signal(self.rank, lane, kind).notify();
        }
    }

    /// Waits until another rank has reached `milestone`: `Ok(true)` then;
    /// `Ok(false)` if `stopped()` said to give up (asked now and then);
    /// `Err` if `alive()` (asked every few milliseconds) fails or the
    /// deadline of the call `(started, deadline)` passes first, naming
    /// that rank and the call's timeout.
    pub(crate) fn wait_progress(
        &self,
        milestone: Milestone,
        call: (Instant, Instant),
        stopped: &dyn Fn() -> bool,
        alive: &dyn Fn() -> Result<()>,
    ) -> Result<bool> {
        let Milestone {
            rank,
            lane,
            kind,
            step,
        } = milestone;
        let awaited = Awaited {
            peer: rank,
            counter: self.progress(rank, lane, kind),
            signal: self.signal(rank, lane, kind),
            past: step,
            closed: &|| {
                format!(
                    "rank {} waited in shared memory for lane {lane} of rank {rank} to {} step {step}",
                    self.rank,
                    kind.verb()
                )
            },
            timed_out: &|| {
                format!(
                    "waiting in shared memory for it to {} step {step} (lane {lane})",
                    kind.verb()
                )
            },
        };
        self.wait_for(awaited, call, stopped, alive)
    }

    /// Waits until `awaited.counter` passes `awaited.past`, as
    /// [`wait_progress`](Self::wait_progress) describes.
    fn wait_for(
        &self,
        awaited: Awaited<'_>,
        (call_started, deadline): (Instant, Instant),
        stopped: &dyn Fn() -> bool,
        alive: &dyn Fn() -> Result<()>,
    ) -> Result<bool> {
        let Awaited {
            peer: rank,
            counter,
            signal,
            past: step,
            closed,
            timed_out,
        } = awaited;
        if counter.load(Ordering::Acquire) > step {
            return Ok(true);
        }
        let started = Instant::now();
        let backoff = Backoff::with(self.wait);
        #[cfg(test)]
        let backoff = match self.test_sleep {
            Some(_) => backoff.without_yield(),
            None => backoff,
        };
        let mut backoff = backoff;
        let mut asked = started;
        loop {
            if counter.load(Ordering::Acquire) > step {
                return Ok(true);
            }
            if stopped() {
                return Ok(false);
            }
            let now = Instant::now();
            if now - asked >= ALIVE_EVERY {
                // A dead peer is reported as met during this wait.
                alive().map_err(|e| match e {
                    Error::PeerClosed { peer, reason, .. } => Error::PeerClosed {
                        peer,
                        during: closed(),
                        reason,
                    },
                    other => other,
                })?;
                asked = now;
            }
            if now >= deadline {
                return Err(Error::PeerTimeout {
                    peer: rank,
                    during: timed_out(),
                    timeout: deadline.saturating_duration_since(call_started),
                });
            }
            match self.wait {
                // Woken by the counter's owner when it publishes (or by a
                // timeout of at most 20 ms, after which the loop asks
                // whether the peer is alive and this rank's lanes going).
                ShmWait::Sleep => backoff.snooze_on(|d| {
                    let d = d.min(deadline.saturating_duration_since(now));
                    #[cfg(test)]
                    let d = self.test_sleep.unwrap_or(d);
                    let ready = || counter.load(Ordering::Acquire) > step || stopped();
                    signal.sleep_unless(ready, d);
                }),
                _ => backoff.snooze(),
            }
        }
    }

    /// Bytes per slot half: the most one step of an algorithm can stage.
    pub fn chunk(&self) -> usize {
        self.chunk
    }

    /// The half (0 or 1) the next chunk staged through the arena uses
    /// (the parity of [`next_step`](Self::next_step)).
    pub fn next_parity(&self) -> usize {
        (self.next_step() % 2) as usize
    }

    /// The number of ranks sharing the arena.
    pub fn world_size(&self) -> usize {
        self.world_size
    }

    /// Byte offset of `range` within the half `parity` of `rank`'s slot,
    /// checked against the slot's bounds.
    fn offset(&self, rank: usize, parity: usize, range: &Range<usize>) -> usize {
        assert!(
            rank < self.world_size
                && parity < 2
                && range.start <= range.end
                && range.end <= self.chunk,
            "arena access out of bounds: rank {rank} parity {parity} range {range:?} chunk {}",
            self.chunk
        );
        control_len(self.world_size) + (rank * 2 + parity) * self.chunk + range.start
    }

    /// Copies `data` to byte `offset` of this rank's half `parity`.
    ///
    /// The caller's protocol must make sure no other rank reads those
    /// bytes meanwhile.
    pub(crate) fn copy_in(&self, parity: usize, offset: usize, data: &[u8]) {
        let at = self.offset(self.rank, parity, &(offset..offset + data.len()));
        // SAFETY: `offset` checked that the destination lies inside the
        // mapping, which lives as long as self; `data` is ordinary memory
        // and cannot overlap the mapping's slot being written.
        unsafe {
            std::ptr::copy_nonoverlapping(
                data.as_ptr(),
                self.segment.base().as_ptr().add(at),
                data.len(),
            );
        }
    }

    /// Copies `range` of `rank`'s half `parity` into `out`
    /// (`out.len() == range.len()`).
    ///
    /// The caller's protocol must make sure no rank writes those bytes
    /// meanwhile.
    pub(crate) fn copy_out(&self, rank: usize, parity: usize, range: Range<usize>, out: &mut [u8]) {
        assert_eq!(out.len(), range.len(), "copy_out length");
        let at = self.offset(rank, parity, &range);
        // SAFETY: as in `copy_in`, with the source inside the mapping.
        unsafe {
            std::ptr::copy_nonoverlapping(
                self.segment.base().as_ptr().add(at),
                out.as_mut_ptr(),
                out.len(),
            );
        }
    }

    /// Reduces `range` of every other rank's half `parity` into `acc`
    /// (`acc.len() == range.len()`), which holds this rank's contribution
    /// for those bytes: the others are combined in rank order.
    ///
    /// The caller's protocol must make sure nobody writes `range` of the
    /// other ranks' halves meanwhile.
    pub(crate) fn reduce_share_into(
        &self,
        parity: usize,
        range: Range<usize>,
        acc: &mut [u8],
        dtype: DType,
        op: ReduceOp,
    ) -> Result<()> {
        assert_eq!(acc.len(), range.len(), "reduce_share_into length");
        let base = self.segment.base().as_ptr();
        for other in (0..self.world_size).filter(|&r| r != self.rank) {
            let at = self.offset(other, parity, &range);
            // SAFETY: `offset` checked the range lies inside the mapping,
            // which lives as long as self; `acc` is ordinary memory, so
            // disjoint from it; by the caller's protocol nobody writes it now.
            let src = unsafe { std::slice::from_raw_parts(base.add(at), range.len()) };
            reduce_into(op, dtype, acc, src)?;
        }
        Ok(())
    }
}

/// Slot-half size for a group of `world_size` ranks: 8 MiB split between
/// the ranks, within 1 and 4 MiB, so the whole arena (two halves per rank)
/// stays at or under 16 MiB of shared memory (containers often give
/// `/dev/shm` only 64 MiB) while few ranks get steps big enough for many
/// threads each.
///
/// ```
/// use tensorcomm::cpu::transport::shm::arena_chunk;
/// assert_eq!(arena_chunk(2), 4 << 20);
/// assert_eq!(arena_chunk(4), 2 << 20);
/// assert_eq!(arena_chunk(8), 1 << 20);
/// assert_eq!(arena_chunk(64), 1 << 20);
/// ```
pub fn arena_chunk(world_size: usize) -> usize {
    ((8 << 20) / world_size.max(1)).clamp(DEFAULT_ARENA_CHUNK, 4 << 20)
}

mod ballot;

#[cfg(feature = "cuda")]
pub(crate) use ballot::{BallotEnd, BALLOT_TAG_LEN};

#[cfg(test)]
mod wait_tests;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::HashStore;
    use std::sync::Arc;

    #[test]
    fn ranks_see_each_others_slots_and_the_keys_are_cleaned_up() {
        let store = Arc::new(HashStore::new());
        let arenas: Vec<ShmArena> = std::thread::scope(|s| {
            let hs: Vec<_> = (0..3)
                .map(|rank| {
                    let store = store.clone();
                    s.spawn(move || {
                        ShmArena::connect(&*store, "t", rank, 3, 64, Duration::from_secs(10))
                            .unwrap()
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        assert_eq!(store.num_keys().unwrap(), 0);
        for (rank, arena) in arenas.iter().enumerate() {
            arena.copy_in(rank % 2, 0, &[rank as u8 + 1; 10]);
        }
        let mut out = [0u8; 4];
        arenas[0].copy_out(2, 0, 3..7, &mut out);
        assert_eq!(out, [3; 4]);
        arenas[2].copy_out(1, 1, 6..10, &mut out);
        assert_eq!(out, [2; 4]);
    }

    #[test]
    fn the_wait_is_resolved_when_set() {
        let store = HashStore::new();
        let mut arena = ShmArena::connect(&store, "w", 0, 1, 64, Duration::from_secs(10)).unwrap();
        // One rank never outnumbers the CPUs.
        assert_eq!(arena.wait(), ShmWait::Spin);
        arena.set_wait(ShmWait::Sleep);
        assert_eq!(arena.wait(), ShmWait::Sleep);
        arena.set_wait(ShmWait::Auto);
        assert_eq!(arena.wait(), ShmWait::Spin);
    }

    #[test]
    fn a_mismatched_chunk_size_is_named_on_both_ranks() {
        let store = Arc::new(HashStore::new());
        let (a, b) = std::thread::scope(|s| {
            let a = {
                let store = store.clone();
                s.spawn(move || ShmArena::connect(&*store, "m", 0, 2, 64, Duration::from_secs(10)))
            };
            let b = ShmArena::connect(&*store, "m", 1, 2, 128, Duration::from_secs(10));
            (a.join().unwrap(), b)
        });
        for (rank, outcome, chunk) in [(0, a, 64), (1, b, 128)] {
            match outcome {
                Err(Error::CollectiveMismatch { mine, theirs, .. }) => assert!(
                    mine.contains(&format!("slot halves of {chunk} bytes"))
                        && theirs.contains(&format!("slot halves of {} bytes", 192 - chunk)),
                    "rank {rank}: {mine} / {theirs}"
                ),
                other => panic!("rank {rank}: expected a size mismatch, found {other:?}"),
            }
        }
        assert_eq!(store.num_keys().unwrap(), 0);
    }
}
