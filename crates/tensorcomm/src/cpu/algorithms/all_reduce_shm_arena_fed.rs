//! Shared-memory arena all-reduce whose bytes are copied straight into
//! and out of the arena's slots by a [`SlotFeed`]: a GPU's copy engine for
//! a staged CUDA tensor (`cuda/staged/arena_feed.rs`), `memcpy` for a host
//! tensor of a rank in the same call ([`HostFeed`]). Staging a CUDA tensor
//! through pinned memory and then through the arena
//! (`all_reduce_shm_arena`) moves every byte through host memory about
//! seven times per rank; here about three (the copy down, the reduction's
//! reads, the copy back), which matters where the host's memory bandwidth
//! sets the pace (ranks sharing a GPU, whose copies share its link too).
//!
//! The arena's slots, taken as one area, hold four phases of `N + 1`
//! buffers each (`N` ranks): one per rank for its bytes and one for the
//! results, so that each rank copies a step's results back in one piece.
//! The message is cut into steps of at most one buffer ([`fed_steps`]:
//! the first two and last two smaller, so the first reduction starts
//! early and little is left to copy back after the last). Step `k` uses
//! phase `g % 4` (`g` its global step number), and its bytes are cut into
//! one share per rank. For step `k`, rank `r`:
//! - fills: once every rank is done with step `k - 4`'s buffers (reduced
//!   and drained them), starts copying the step's bytes of its message
//!   into its buffer, and publishes `CopiedIn` once they landed;
//! - reduces: once every rank's step `k` landed, reduces share `r` of
//!   every rank's buffer into its own (in rank order, this rank first, as
//!   the arena all-reduce does), finishes it (AVG, PREMUL_SUM) and copies
//!   it into the results, then publishes `Reduced`; it splits the share
//!   between its helper threads;
//! - drains: once every rank reduced step `k`, starts copying the results
//!   into its message, and publishes `CopiedOut` once that copy is done.
//!
//! One thread drives the steps, doing whatever is ready and never
//! waiting behind something that is not (the copies of one rank may land
//! late while another step's bytes are ready to reduce): it publishes
//! finished copies out and in, starts copies in whose buffer every rank
//! is done with, starts copies out of steps every rank reduced, and
//! reduces a step every rank's bytes landed for. So while the host
//! reduces one step, later steps' copies in and earlier steps' copies out
//! run. The progress counters are the arena's, lane 0's; a rank with
//! nothing to do asks every few milliseconds whether its peers live, and
//! a call past its deadline names the rank it waits for (or its own
//! copies). A call opens with the arena's barrier (which checks that
//! every rank makes this kind of call) and returns once its own copies out
//! are done, so that nothing reads the slots when the next call starts.

use std::ops::Range;
use std::time::{Duration, Instant};

use super::arena_lanes::ArenaCall;
use super::block_offsets;
use super::ArenaThreads;
use crate::cpu::helper_threads::first_error;
use crate::cpu::reduce_kernels::ReduceOp;
use crate::cpu::transport::shm::{Backoff, Milestone, Progress, ShmArena};
use crate::cpu::transport::Transport;
use crate::tensor::DType;
use crate::{Error, Result};

/// Phases of buffers in the arena: step `k` reuses step `k - 4`'s.
const PHASES: u64 = 4;

/// Bytes of one buffer when an arena's slots, `area` bytes in all, hold
/// [`PHASES`] phases of `world + 1` buffers (one per rank, one for the
/// results): whole elements of `elem` bytes, whole pages where a buffer
/// holds one (copies of whole pages run faster).
fn buffer_bytes(area: usize, world: usize, elem: usize) -> usize {
    let raw = area / (PHASES as usize * (world + 1)) / elem * elem;
    if raw >= 4096 {
        raw / 4096 * 4096
    } else {
        raw
    }
}

/// Where a fed all-reduce's bytes come from and go to: copies that may
/// run asynchronously to the host, grouped by step.
pub(crate) trait SlotFeed {
    /// Starts copying bytes `from` of this rank's message to `to` (the
    /// step's buffer in this rank's slot).
    ///
    /// # Safety
    ///
    /// `to .. to + from.len()` lies in the arena's mapping, which nobody
    /// else reads or writes until [`filled`](Self::filled) for `step` says
    /// they landed.
    unsafe fn fill(&mut self, step: usize, from: Range<usize>, to: *mut u8) -> Result<()>;

    /// Whether step `step`'s copies in have landed; with `block`, waits
    /// until they have (failing at `deadline`).
    fn filled(&mut self, step: usize, block: bool, deadline: Instant) -> Result<bool>;

    /// Starts copying each `(from, to)`: `to.len()` bytes at `from` (a
    /// rank's reduced share in the arena) into bytes `to` of this rank's
    /// message.
    ///
    /// # Safety
    ///
    /// Each `from .. from + to.len()` lies in the arena's mapping, which
    /// nobody writes until [`drained`](Self::drained) for `step` says so.
    unsafe fn drain(&mut self, step: usize, pieces: &[(*const u8, Range<usize>)]) -> Result<()>;

    /// Whether step `step`'s copies out are done reading the arena;
    /// with `block`, waits until they are (failing at `deadline`).
    fn drained(&mut self, step: usize, block: bool, deadline: Instant) -> Result<bool>;
}

/// A [`SlotFeed`] for a host message: plain copies, done when started.
pub(crate) struct HostFeed<'a> {
    pub(crate) message: &'a mut [u8],
}

impl SlotFeed for HostFeed<'_> {
    unsafe fn fill(&mut self, _: usize, from: Range<usize>, to: *mut u8) -> Result<()> {
        let src = &self.message[from];
        // SAFETY: the caller gives `to` for `src.len()` bytes of the arena,
        // which is not the message, and nobody else touches it meanwhile.
        unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), to, src.len()) };
        Ok(())
    }

    fn filled(&mut self, _: usize, _: bool, _: Instant) -> Result<bool> {
        Ok(true)
    }

    unsafe fn drain(&mut self, _: usize, pieces: &[(*const u8, Range<usize>)]) -> Result<()> {
        for (from, to) in pieces {
            let dst = &mut self.message[to.clone()];
            // SAFETY: the caller gives `from` for `dst.len()` bytes of the
            // arena, which nobody writes meanwhile.
            unsafe { std::ptr::copy_nonoverlapping(*from, dst.as_mut_ptr(), dst.len()) };
        }
        Ok(())
    }

    fn drained(&mut self, _: usize, _: bool, _: Instant) -> Result<bool> {
        Ok(true)
    }
}

/// The steps a message of `len` bytes (elements of `elem` bytes) is cut
/// into for buffers of `cap` bytes: as equal as whole elements allow, at
/// most `cap` each; where there are at least three such steps, the first
/// two and the last two are a quarter and a half of one (in that order,
/// and reversed at the end), so the first reduction starts sooner and
/// less is left to copy back after the last. The same on every rank for
/// the same arguments.
pub(crate) fn fed_steps(len: usize, elem: usize, cap: usize) -> Vec<Range<usize>> {
    let elems = len / elem;
    let cap_elems = (cap / elem).max(1);
    if elems == 0 {
        return Vec::new();
    }
    let quarter = (cap_elems / 4).max(1);
    let half = (cap_elems / 2).max(1);
    let ramp = 2 * (quarter + half);
    let (head, tail): (&[usize], &[usize]) = if elems >= ramp + 3 * cap_elems {
        (&[quarter, half], &[half, quarter])
    } else {
        (&[], &[])
    };
    let middle = elems - head.iter().chain(tail).sum::<usize>();
    let n = middle.div_ceil(cap_elems);
    let even: Vec<usize> = (0..n)
        .map(|i| (i + 1) * middle / n - i * middle / n)
        .collect();
    let mut at = 0;
    head.iter()
        .chain(&even)
        .chain(tail)
        .map(|&e| {
            at += e * elem;
            at - e * elem..at
        })
        .collect()
}

/// All-reduces a message of `len` bytes (elements of `dtype`) through
/// `arena`, shared by exactly the ranks of `t`, with `feed` copying this
/// rank's bytes in and the results out (see the module docs); `threads`
/// reduce this rank's shares. Every rank gets bit-identical results. The
/// caller must let `feed`'s copies finish (or wait for them) before it
/// drops what they touch, also when this fails.
#[allow(clippy::too_many_arguments)]
pub(crate) fn all_reduce_shm_arena_fed(
    t: &dyn Transport,
    arena: &ShmArena,
    threads: ArenaThreads<'_>,
    len: usize,
    dtype: DType,
    op: ReduceOp,
    feed: &mut dyn SlotFeed,
    deadline: Instant,
) -> Result<()> {
    let world = t.world_size();
    if arena.world_size() != world {
        return Err(Error::InvalidArgument(format!(
            "all_reduce_shm_arena_fed: expected an arena shared by the transport's {world} ranks, found one for {}",
            arena.world_size()
        )));
    }
    let elem = dtype.size();
    let cap = buffer_bytes(arena.area_len(), world, elem);
    if cap == 0 {
        return Err(Error::InvalidArgument(format!(
            "all_reduce_shm_arena_fed: expected an arena of at least {} {dtype} elements, found {} bytes",
            PHASES as usize * (world + 1),
            arena.area_len()
        )));
    }
    if !len.is_multiple_of(elem) {
        return Err(Error::InvalidArgument(format!(
            "all_reduce_shm_arena_fed: expected whole {dtype} elements, found {len} bytes"
        )));
    }
    let call = ArenaCall {
        threads: 1,
        symmetric: None,
        fed: true,
    };
    call.open(t, arena.wait(), deadline)?;
    let steps = fed_steps(len, elem, cap);
    let first = arena.next_step();
    for _ in 1..steps.len() {
        arena.next_step();
    }
    let mut run = FedCall {
        t,
        arena,
        threads,
        steps: &steps,
        first,
        cap,
        elem,
        feed,
        started: Instant::now(),
        deadline,
        fills: 0,
        landed: 0,
        reduced: 0,
        drains: 0,
        drained: 0,
    };
    let outcome = run.run(dtype, op);
    arena.mark_unfenced();
    outcome
}

/// How often a fed call with nothing to do asks whether its peers live.
const ALIVE_EVERY: Duration = Duration::from_millis(2);

/// One rank's state in one fed call: how far each kind of work got.
struct FedCall<'a, 'b> {
    t: &'b dyn Transport,
    arena: &'b ShmArena,
    threads: ArenaThreads<'b>,
    steps: &'b [Range<usize>],
    /// The global number of the call's first step.
    first: u64,
    /// Bytes of a phase buffer.
    cap: usize,
    elem: usize,
    feed: &'b mut (dyn SlotFeed + 'a),
    started: Instant,
    deadline: Instant,
    /// Steps whose copies in were started.
    fills: usize,
    /// Steps whose copies in landed (and were published).
    landed: usize,
    /// Steps this rank reduced (and published).
    reduced: usize,
    /// Steps whose copies out were started.
    drains: usize,
    /// Steps whose copies out are done (and were published).
    drained: usize,
}

/// What a fed call waits for when it has nothing to do: a kind of
/// progress of another rank for a step, or its own copies.
enum Blocked {
    Peer(usize, Progress, u64),
    Copies,
}

impl FedCall<'_, '_> {
    /// Does whatever is ready, in this order, until every step is drained:
    /// publishes finished copies out and in, starts copies in whose buffer
    /// every rank is done with, starts copies out of steps every rank
    /// reduced, and reduces a step every rank's bytes landed for. Nothing
    /// waits behind something else that is not ready.
    fn run(&mut self, dtype: DType, op: ReduceOp) -> Result<()> {
        let n = self.steps.len();
        let mut backoff = Backoff::with(self.arena.wait());
        let mut asked = Instant::now();
        while self.drained < n {
            let mut progressed = false;
            while self.drained < self.drains
                && self.feed.drained(self.drained, false, self.deadline)?
            {
                self.publish(Progress::CopiedOut, self.drained);
                self.drained += 1;
                progressed = true;
            }
            while self.fills < n && self.buffer_free(self.fills).is_none() {
                self.fill(self.fills)?;
                self.fills += 1;
                progressed = true;
            }
            while self.landed < self.fills && self.feed.filled(self.landed, false, self.deadline)? {
                self.publish(Progress::CopiedIn, self.landed);
                self.landed += 1;
                progressed = true;
            }
            while self.drains < self.reduced
                && self.behind(Progress::Reduced, self.drains).is_none()
            {
                self.drain(self.drains)?;
                self.drains += 1;
                progressed = true;
            }
            if self.reduced < self.landed && self.behind(Progress::CopiedIn, self.reduced).is_none()
            {
                self.reduce(self.reduced, dtype, op)?;
                self.publish(Progress::Reduced, self.reduced);
                self.reduced += 1;
                progressed = true;
            }
            if progressed {
                backoff.reset();
                continue;
            }
            let now = Instant::now();
            if now - asked >= ALIVE_EVERY {
                let rank = self.t.rank();
                (0..self.t.world_size())
                    .filter(|&q| q != rank)
                    .try_for_each(|q| self.t.check_alive(q))?;
                asked = now;
            }
            if now >= self.deadline {
                return Err(self.timed_out());
            }
            backoff.snooze();
        }
        Ok(())
    }

    /// Global step number of the call's step `k`.
    fn global(&self, k: usize) -> u64 {
        self.first + k as u64
    }

    fn publish(&self, kind: Progress, k: usize) {
        self.arena.publish(0, kind, self.global(k));
    }

    /// The first other rank that has not done `kind` for step `k`.
    fn behind(&self, kind: Progress, k: usize) -> Option<usize> {
        let (rank, step) = (self.t.rank(), self.global(k));
        (0..self.t.world_size()).filter(|&q| q != rank).find(|&q| {
            !self.arena.reached(Milestone {
                rank: q,
                lane: 0,
                kind,
                step,
            })
        })
    }

    /// What keeps step `k` from its buffer, `None` once every rank is done
    /// with the step that used it last (reduced it and copied it out).
    fn buffer_free(&self, k: usize) -> Option<Blocked> {
        let old = k.checked_sub(PHASES as usize)?;
        if self.drained <= old {
            return Some(Blocked::Copies);
        }
        for kind in [Progress::Reduced, Progress::CopiedOut] {
            if let Some(q) = self.behind(kind, old) {
                return Some(Blocked::Peer(q, kind, self.global(old)));
            }
        }
        None
    }

    /// The error of a call past its deadline, naming what it waited for.
    fn timed_out(&self) -> Error {
        let n = self.steps.len();
        let peer = |kind, k| {
            self.behind(kind, k)
                .map(|q| Blocked::Peer(q, kind, self.global(k)))
        };
        let blocked = (self.reduced < self.landed)
            .then(|| peer(Progress::CopiedIn, self.reduced))
            .flatten()
            .or_else(|| {
                (self.drains < self.reduced)
                    .then(|| peer(Progress::Reduced, self.drains))
                    .flatten()
            })
            .or_else(|| {
                (self.fills < n)
                    .then(|| self.buffer_free(self.fills))
                    .flatten()
            })
            .unwrap_or(Blocked::Copies);
        match blocked {
            Blocked::Peer(q, kind, step) => Error::PeerTimeout {
                peer: q,
                during: format!(
                    "waiting in shared memory for it to {} step {step} of an all_reduce copied straight into the arena",
                    kind.verb()
                ),
                timeout: self.deadline.saturating_duration_since(self.started),
            },
            Blocked::Copies => Error::Cuda {
                call: "copying an all_reduce's bytes into or out of shared memory".into(),
                code: "timeout".into(),
                message: format!(
                    "this rank's copies had not run after {:?}: they wait for the work queued before the call on the caller's current stream, which had not finished",
                    self.started.elapsed()
                ),
            },
        }
    }

    /// The area offset of buffer `b` of step `k`'s phase: rank `b`'s
    /// bytes, or for `b` = the world size, the results.
    fn buffer(&self, k: usize, b: usize) -> usize {
        let phase = (self.global(k) % PHASES) as usize;
        (phase * (self.t.world_size() + 1) + b) * self.cap
    }

    /// Byte offsets, within step `k`, of each rank's share.
    fn shares(&self, k: usize) -> Vec<usize> {
        block_offsets(self.steps[k].len(), self.elem, self.t.world_size())
    }

    /// Starts copying step `k` into this rank's buffer (which every rank
    /// is done with).
    fn fill(&mut self, k: usize) -> Result<()> {
        let at = self.buffer(k, self.t.rank());
        let range = self.steps[k].clone();
        let to = self.arena.area_ptr(at..at + range.len());
        // SAFETY: `to` is this rank's buffer of this step, which every
        // rank is done with (`buffer_free`), and which nobody touches
        // until this rank publishes that it is filled.
        unsafe { self.feed.fill(k, range, to) }
    }

    /// Reduces this rank's share of step `k` (every rank's bytes of it
    /// landed) with this rank's threads.
    fn reduce(&mut self, k: usize, dtype: DType, op: ReduceOp) -> Result<()> {
        let shares = self.shares(k);
        let (rank, world) = (self.t.rank(), self.t.world_size());
        let share = shares[rank]..shares[rank + 1];
        let acc = self.buffer(k, rank) + share.start;
        let out = self.buffer(k, world) + share.start;
        let others: Vec<usize> = (0..world)
            .filter(|&q| q != rank)
            .map(|q| self.buffer(k, q) + share.start)
            .collect();
        let lanes = self
            .threads
            .count
            .clamp(1, (share.len() / self.elem).max(1));
        let cuts = block_offsets(share.len(), self.elem, lanes);
        let arena = self.arena;
        let outcomes = self.threads.helpers.run(lanes, |i| {
            let (from, len) = (cuts[i], cuts[i + 1] - cuts[i]);
            let others: Vec<usize> = others.iter().map(|o| o + from).collect();
            arena.reduce_in_area(acc + from, &others, len, out + from, (dtype, op))
        });
        first_error(outcomes, "all_reduce_shm_arena_fed")
    }

    /// Starts copying step `k`'s results into the message (every rank
    /// reduced its share).
    fn drain(&mut self, k: usize) -> Result<()> {
        let at = self.buffer(k, self.t.world_size());
        let range = self.steps[k].clone();
        let pieces = [(
            self.arena.area_ptr(at..at + range.len()).cast_const(),
            range,
        )];
        // SAFETY: the piece is this step's results, which nobody writes
        // until every rank has published that its copies out of them are
        // done (`buffer_free` of step `k + 4`).
        unsafe { self.feed.drain(k, &pieces) }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::cpu::algorithms::testing::{deadline, run_ranks_with_store, test_arena};
    use crate::cpu::HelperThreads;

    #[test]
    fn steps_cover_the_message_within_the_buffer_with_smaller_ends() {
        let kib = 1usize << 10;
        for (len, elem, cap) in [
            (0, 4, 64),
            (4, 4, 64),
            (100, 4, 64),
            (3 * kib + 12, 4, kib),
            (16 << 20, 4, 1 << 20),
            (7 * 3, 3, 8),
        ] {
            let s = fed_steps(len, elem, cap);
            assert_eq!(s.first().map_or(0, |r| r.start), 0);
            assert_eq!(s.last().map_or(0, |r| r.end), len);
            assert!(s.windows(2).all(|w| w[0].end == w[1].start));
            assert!(s.iter().all(|r| !r.is_empty() && r.len() <= cap.max(elem)));
            assert!(s.iter().all(|r| r.start % elem == 0 && r.len() % elem == 0));
        }
        let mib = 1usize << 20;
        let lens: Vec<usize> = fed_steps(16 * mib, 4, mib)
            .iter()
            .map(|r| r.len() >> 10)
            .collect();
        assert_eq!(&lens[..2], [256, 512]);
        assert_eq!(&lens[lens.len() - 2..], [512, 256]);
        assert!(lens[2..lens.len() - 2]
            .iter()
            .all(|&l| (900..=1024).contains(&l)));
        // Too short for the smaller ends: two equal steps.
        assert_eq!(fed_steps(2 * mib, 4, mib).len(), 2);
    }

    /// A feed over a host message whose copies in and out are done only
    /// once asked after twice: the algorithm must wait for both.
    struct LateFeed {
        message: Vec<u8>,
        /// Step, bytes of the message, address in the arena, times asked
        /// whether landed.
        fills: Vec<(usize, Range<usize>, usize, u32)>,
        drains: Vec<LateDrain>,
    }

    /// Step, (address in the arena, bytes of the message) per piece,
    /// times asked whether done.
    type LateDrain = (usize, Vec<(usize, Range<usize>)>, u32);

    impl SlotFeed for LateFeed {
        unsafe fn fill(&mut self, step: usize, from: Range<usize>, to: *mut u8) -> Result<()> {
            self.fills.push((step, from, to as usize, 0));
            Ok(())
        }

        fn filled(&mut self, step: usize, block: bool, _: Instant) -> Result<bool> {
            let Some(f) = self.fills.iter_mut().find(|f| f.0 == step) else {
                return Ok(false);
            };
            f.3 += 1;
            if f.3 < 2 && !block {
                return Ok(false);
            }
            let src = &self.message[f.1.clone()];
            // SAFETY: the algorithm handed `to` for this step.
            unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), f.2 as *mut u8, src.len()) };
            Ok(true)
        }

        unsafe fn drain(
            &mut self,
            step: usize,
            pieces: &[(*const u8, Range<usize>)],
        ) -> Result<()> {
            let pieces = pieces.iter().map(|(p, r)| (*p as usize, r.clone()));
            self.drains.push((step, pieces.collect(), 0));
            Ok(())
        }

        fn drained(&mut self, step: usize, block: bool, _: Instant) -> Result<bool> {
            let Some(d) = self.drains.iter_mut().find(|d| d.0 == step) else {
                return Ok(false);
            };
            d.2 += 1;
            if d.2 < 2 && !block {
                return Ok(false);
            }
            for (from, to) in &d.1 {
                let dst = &mut self.message[to.clone()];
                // SAFETY: the algorithm handed `from` for this step.
                unsafe {
                    std::ptr::copy_nonoverlapping(*from as *const u8, dst.as_mut_ptr(), dst.len())
                };
            }
            d.1.clear();
            Ok(true)
        }
    }

    fn input(rank: usize, call: usize, n: usize) -> Vec<f32> {
        (0..n)
            .map(|i| ((i * 7 + rank * 13 + call * 5) % 61) as f32 - 30.0)
            .collect()
    }

    /// Ranks alternate host and late feeds over calls of many lengths
    /// (steps of every phase, the ramped ends, shares of no element),
    /// with an ordinary arena all-reduce between them.
    #[test]
    fn fed_calls_match_a_direct_sum_back_to_back_with_host_and_late_feeds() {
        use crate::cpu::algorithms::all_reduce_shm_arena;
        for world in [2, 3, 4] {
            let lengths = [1usize, 3, 40, 257, 1000, 4099];
            let results = run_ranks_with_store(world, |t, store| {
                // 64-byte halves: 32-byte (8-element) buffers.
                let arena = test_arena(t, store, "fed", 64);
                let helpers = HelperThreads::new("test");
                let mut out = Vec::new();
                for (call, &n) in lengths.iter().enumerate() {
                    let threads = ArenaThreads {
                        helpers: &helpers,
                        count: 1 + (call + t.rank()) % 3,
                    };
                    let mut bytes: Vec<u8> =
                        bytemuck::cast_slice(&input(t.rank(), call, n)).to_vec();
                    let len = bytes.len();
                    if (call + t.rank()) % 2 == 0 {
                        let mut feed = HostFeed {
                            message: &mut bytes,
                        };
                        all_reduce_shm_arena_fed(
                            t,
                            &arena,
                            threads,
                            len,
                            DType::F32,
                            ReduceOp::Sum,
                            &mut feed,
                            deadline(),
                        )
                        .expect("fed");
                    } else {
                        let mut feed = LateFeed {
                            message: bytes,
                            fills: Vec::new(),
                            drains: Vec::new(),
                        };
                        all_reduce_shm_arena_fed(
                            t,
                            &arena,
                            threads,
                            len,
                            DType::F32,
                            ReduceOp::Sum,
                            &mut feed,
                            deadline(),
                        )
                        .expect("fed");
                        bytes = feed.message;
                    }
                    out.push(bytemuck::cast_slice::<u8, f32>(&bytes).to_vec());
                    let mut plain = vec![t.rank() as u8; 33];
                    // The plain arena needs the same threads on every rank.
                    let threads = ArenaThreads {
                        helpers: &helpers,
                        count: 1 + call % 2,
                    };
                    all_reduce_shm_arena(
                        t,
                        &arena,
                        threads,
                        &mut plain,
                        DType::U8,
                        ReduceOp::Sum,
                        deadline(),
                    )
                    .expect("arena");
                    assert!(plain.iter().all(|&b| b as usize == world * (world - 1) / 2));
                }
                out
            });
            for (call, &n) in lengths.iter().enumerate() {
                let expected: Vec<f32> = (0..n)
                    .map(|i| (0..world).map(|r| input(r, call, n)[i]).sum())
                    .collect();
                for (rank, got) in results.iter().enumerate() {
                    assert_eq!(got[call], expected, "world {world} rank {rank} call {call}");
                }
            }
        }
    }

    #[test]
    fn avg_is_finished_once_and_ranks_agree_bitwise() {
        let world = 3;
        let results = run_ranks_with_store(world, |t, store| {
            let arena = test_arena(t, store, "avg", 256);
            let helpers = HelperThreads::new("test");
            let threads = ArenaThreads {
                helpers: &helpers,
                count: 2,
            };
            let mut bytes: Vec<u8> = bytemuck::cast_slice(&input(t.rank(), 1, 999)).to_vec();
            let len = bytes.len();
            let mut feed = HostFeed {
                message: &mut bytes,
            };
            all_reduce_shm_arena_fed(
                t,
                &arena,
                threads,
                len,
                DType::F32,
                ReduceOp::Avg,
                &mut feed,
                deadline(),
            )
            .expect("fed");
            bytes
        });
        let got: &[f32] = bytemuck::cast_slice(&results[0]);
        for (i, v) in got.iter().enumerate() {
            let sum: f32 = (0..world).map(|r| input(r, 1, 999)[i]).sum();
            assert!((v - sum / world as f32).abs() < 1e-5, "{i}: {v}");
        }
        assert!(results.iter().all(|r| r == &results[0]));
    }

    #[test]
    fn a_rank_making_a_plain_arena_call_is_named_as_a_mismatch() {
        use crate::cpu::algorithms::all_reduce_shm_arena;
        let results = run_ranks_with_store(2, |t, store| {
            let arena = test_arena(t, store, "mix", 64);
            let helpers = HelperThreads::new("test");
            let threads = ArenaThreads {
                helpers: &helpers,
                count: 1,
            };
            let mut bytes = vec![1u8; 100];
            if t.rank() == 0 {
                let mut feed = HostFeed {
                    message: &mut bytes,
                };
                all_reduce_shm_arena_fed(
                    t,
                    &arena,
                    threads,
                    100,
                    DType::U8,
                    ReduceOp::Sum,
                    &mut feed,
                    deadline(),
                )
            } else {
                all_reduce_shm_arena(
                    t,
                    &arena,
                    threads,
                    &mut bytes,
                    DType::U8,
                    ReduceOp::Sum,
                    deadline(),
                )
            }
        });
        for (rank, r) in results.iter().enumerate() {
            match r {
                Err(Error::CollectiveMismatch { mine, theirs, .. }) => {
                    let fed = if rank == 0 { mine } else { theirs };
                    assert!(fed.contains("straight into and out of"), "{fed}");
                }
                other => panic!("rank {rank}: expected a mismatch, found {other:?}"),
            }
        }
    }

    #[test]
    fn a_rank_whose_copies_never_land_times_out_and_is_named() {
        struct Stuck;
        impl SlotFeed for Stuck {
            unsafe fn fill(&mut self, _: usize, _: Range<usize>, _: *mut u8) -> Result<()> {
                Ok(())
            }
            fn filled(&mut self, _: usize, _: bool, _: Instant) -> Result<bool> {
                Ok(false)
            }
            unsafe fn drain(&mut self, _: usize, _: &[(*const u8, Range<usize>)]) -> Result<()> {
                Ok(())
            }
            fn drained(&mut self, _: usize, _: bool, _: Instant) -> Result<bool> {
                Ok(true)
            }
        }
        let results = run_ranks_with_store(2, |t, store| {
            let arena = test_arena(t, store, "stuck", 64);
            let helpers = HelperThreads::new("test");
            let threads = ArenaThreads {
                helpers: &helpers,
                count: 1,
            };
            let soon = Instant::now() + Duration::from_millis(400);
            if t.rank() == 1 {
                let sooner = soon - Duration::from_millis(150);
                let outcome = all_reduce_shm_arena_fed(
                    t,
                    &arena,
                    threads,
                    100,
                    DType::U8,
                    ReduceOp::Sum,
                    &mut Stuck,
                    sooner,
                );
                // Stays (its links open) until rank 0 has timed out too.
                std::thread::sleep(Duration::from_millis(500));
                return outcome;
            }
            let mut bytes = vec![1u8; 100];
            let mut feed = HostFeed {
                message: &mut bytes,
            };
            all_reduce_shm_arena_fed(
                t,
                &arena,
                threads,
                100,
                DType::U8,
                ReduceOp::Sum,
                &mut feed,
                soon,
            )
        });
        // Rank 1 blames its own copies; rank 0 names rank 1, whose bytes
        // never arrived.
        assert!(
            matches!(&results[1], Err(Error::Cuda { code, message, .. })
                if code == "timeout" && message.contains("this rank's copies")),
            "{:?}",
            results[1]
        );
        match &results[0] {
            Err(Error::PeerTimeout {
                peer: 1, during, ..
            }) => {
                assert!(during.contains("copy in step 0"), "{during}")
            }
            other => panic!("expected a timeout naming rank 1, found {other:?}"),
        }
    }
}
