//! Shared-memory arena all-reduce, for groups whose ranks all share one
//! host: no byte streams; each byte of another rank's share is copied into
//! shared memory once, each share is reduced once by the rank that owns
//! it, and copied out once per rank.
//!
//! The message goes through the [`ShmArena`] one step at a time (up to the
//! arena's chunk; bigger with more threads, see
//! `SHM_ARENA_STEP_BYTES_PER_THREAD`). Step `k` uses slot half `k % 2`
//! (alternating), with the step split into one share per rank:
//! - copy in: every rank copies the other ranks' shares of its step into
//!   its own slot's half (its own share stays in its buffer);
//! - reduce: every rank reduces its own share: its input, in its buffer,
//!   combined with that share of every other slot, in place; then it
//!   copies the result into its own slot (reduce-scatter);
//! - copy out: every rank copies each other rank's reduced share out of
//!   that rank's slot (all-gather).
//!
//! A reduce to one root ([`reduce_to_root_shm_arena`]) runs the same steps,
//! with only the root copying out.
//!
//! Per rank and byte of message, with `N` ranks: `3 - 1/N` bytes read and
//! `2` written (the copy in, reduction and copy out of the whole message
//! would be `3` and `2 + 1/N`).
//!
//! # Lanes and counters instead of barriers
//!
//! Each rank splits every share of every step into `threads` parts, and
//! its thread ("lane") `i` does everything for part `i` of every share:
//! copies it in, reduces it (for its own share), copies it out. So lane `i`
//! of one rank only ever meets lane `i` of the others, and they order
//! their work through the arena's progress counters ([`Progress`]) rather
//! than barriers: before each action a lane waits, in shared memory, for
//! exactly the lanes whose work it needs, and after it publishes its own.
//! For step `k` (global step `g`), in half `k % 2`, lane `i` of rank `r`:
//! - copies in its parts of the others' shares, once every other rank's
//!   lane `i` has reduced step `k - 2` (which read those bytes last);
//! - reduces its part of share `r`, once every other rank's lane `i` has
//!   copied step `k` in, and has copied step `k - 2` out (which read the
//!   bytes of share `r` it then overwrites with the result);
//! - copies out its parts of the others' reduced shares, once each has
//!   reduced step `k`.
//!
//! A lane's order is copy in `k`, reduce `k - 1`, copy out `k - 2`, so
//! each wait is for work the others did a round earlier: a rank slowed for
//! a moment (the host's other tenants, a descheduled thread) delays only
//! the lanes that need it, when they need it. Lanes own the same bytes of
//! every step (the last, shorter step cuts each part at its length), so
//! the per-lane ordering covers every byte of a call. Across calls, which
//! may split the work differently, every call starts with one barrier
//! over the group's transport: it carries the collective's fingerprint,
//! and nobody passes it before every rank has finished the previous call.
//! A call ends without a barrier (nobody reads a rank's buffer, only its
//! slot), so it marks the arena unfenced for a broadcast that follows.
//!
//! While it waits, a lane asks the transport every few milliseconds
//! whether the peer it waits for is alive, so a dead peer fails the call
//! by name; the call's deadline bounds the wait.
//!
//! Measured before this design (bench/results/NOTES.md): with one barrier
//! per pipelined step, 8 ranks of 4 threads on the 32-core GPU host spent
//! about as long in barriers and at the gate between their threads as
//! copying and reducing (32 MiB: 10.2 ms per call, 4.9 ms of it work per
//! lane, 4.4 ms in the leader's 33 barriers).

use std::sync::atomic::AtomicBool;
use std::time::Instant;

use super::arena_lanes::{run_lanes, ArenaCall, LaneWaiter};
use super::block_offsets;

/// An arena all-reduce moves the message in steps of at most this many
/// bytes per thread of a rank (within [`SHM_ARENA_MIN_STEP_BYTES`] and the
/// arena's chunk): every step costs a barrier over the group (the steps
/// are pipelined), so many threads get bigger steps.
const SHM_ARENA_STEP_BYTES_PER_THREAD: usize = 512 << 10;

/// The smallest step of an arena all-reduce (unless the arena's chunk is
/// smaller): 1 MiB, the step size measured in bench/results/gloo-h200x2.txt.
const SHM_ARENA_MIN_STEP_BYTES: usize = 1 << 20;

use crate::cpu::reduce_kernels::{finish, ReduceOp};
use crate::cpu::transport::shm::{Progress, ShmArena, ARENA_MAX_LANES};
use crate::cpu::transport::Transport;
use crate::cpu::HelperThreads;
use crate::tensor::DType;
use crate::{Error, Result};

/// What one lane of a rank does for one step.
///
/// Lane `i` of `threads` owns part `i` of every rank's share of the step
/// (`parts[r]`, bytes of the rank's own buffer), so the lane that reduces
/// a part of this rank's share also holds this rank's input for it and
/// reduces straight into it.
struct ChunkWork<'a> {
    /// The global step number (its parity is the slot half).
    step: u64,
    /// For each rank `r`: the step's byte offset of this lane's part of
    /// `r`'s share, and those bytes of this rank's buffer.
    parts: Vec<(usize, &'a mut [u8])>,
}

/// One lane of one rank in one call: its steps, and how it waits.
struct Lane<'a, 'b> {
    t: &'b dyn Transport,
    arena: &'b ShmArena,
    steps: Vec<ChunkWork<'a>>,
    waiter: LaneWaiter<'b>,
    /// Whether this rank wants the result (every rank of an all-reduce,
    /// the root of a reduce): the others leave their buffer as it was,
    /// reducing in `scratch`, and skip the copy out.
    copies_out: bool,
    scratch: Vec<u8>,
}

impl Lane<'_, '_> {
    fn parity(step: u64) -> usize {
        (step % 2) as usize
    }

    fn wait_all(&self, kind: Progress, step: u64) -> Result<bool> {
        self.waiter.wait_all(kind, step)
    }

    /// Stages step `k`'s parts of the other ranks' shares in this rank's
    /// slot (its own share is read straight from its buffer).
    fn copy_in(&self, k: usize) -> Result<bool> {
        let work = &self.steps[k];
        if k >= 2 && !self.wait_all(Progress::Reduced, self.steps[k - 2].step)? {
            return Ok(false);
        }
        let rank = self.t.rank();
        for (r, (offset, bytes)) in work.parts.iter().enumerate() {
            if r != rank {
                self.arena.copy_in(Self::parity(work.step), *offset, bytes);
            }
        }
        self.waiter.publish(Progress::CopiedIn, work.step);
        Ok(true)
    }

    /// Reduces step `k`'s part of this rank's share: its input in its
    /// buffer, combined with the other ranks' slots in rank order and
    /// finished (AVG, PREMUL_SUM), then published in this rank's slot for
    /// the others to copy out.
    fn reduce(&mut self, k: usize, dtype: DType, op: ReduceOp) -> Result<bool> {
        let step = self.steps[k].step;
        if !self.wait_all(Progress::CopiedIn, step)? {
            return Ok(false);
        }
        if k >= 2 && !self.wait_all(Progress::CopiedOut, self.steps[k - 2].step)? {
            return Ok(false);
        }
        let rank = self.t.rank();
        let parity = Self::parity(step);
        let (offset, acc) = &mut self.steps[k].parts[rank];
        let range = *offset..*offset + acc.len();
        let acc: &mut [u8] = if self.copies_out {
            acc
        } else {
            // Leaves this rank's input as it is (it is not the root).
            self.scratch.resize(acc.len(), 0);
            self.scratch.copy_from_slice(acc);
            &mut self.scratch
        };
        self.arena
            .reduce_share_into(parity, range, acc, dtype, op)?;
        // AVG's division and PREMUL_SUM's factor while the part is in
        // cache, rather than in one more pass over the whole message.
        finish(op, dtype, acc, self.t.world_size())?;
        self.arena.copy_in(parity, *offset, acc);
        self.waiter.publish(Progress::Reduced, step);
        Ok(true)
    }

    /// Copies step `k`'s parts of the other ranks' reduced shares out of
    /// their slots, each once its owner has published it.
    fn copy_out(&mut self, k: usize) -> Result<bool> {
        let step = self.steps[k].step;
        if !self.copies_out {
            // Reads nothing: the owners may overwrite their slots at once.
            self.waiter.publish(Progress::CopiedOut, step);
            return Ok(true);
        }
        if !self.wait_all(Progress::Reduced, step)? {
            return Ok(false);
        }
        let rank = self.t.rank();
        let parity = Self::parity(step);
        for (r, (offset, bytes)) in self.steps[k].parts.iter_mut().enumerate() {
            if r != rank {
                let range = *offset..*offset + bytes.len();
                self.arena.copy_out(r, parity, range, bytes);
            }
        }
        self.waiter.publish(Progress::CopiedOut, step);
        Ok(true)
    }

    /// Every step of the call: round `j` copies step `j` in, reduces step
    /// `j - 1` and copies step `j - 2` out, each where it exists.
    fn run(&mut self, dtype: DType, op: ReduceOp) -> Result<()> {
        let n = self.steps.len();
        for j in 0..n + 2 {
            let going = (j >= n || self.copy_in(j)?)
                && (j == 0 || j > n || self.reduce(j - 1, dtype, op)?)
                && (j < 2 || self.copy_out(j - 2)?);
            if !going {
                // Another lane of this rank failed and reports why.
                return Ok(());
            }
        }
        Ok(())
    }
}

/// The threads one rank puts on an arena all-reduce: the calling thread
/// and `count - 1` of `helpers`.
#[derive(Clone, Copy, Debug)]
pub struct ArenaThreads<'a> {
    pub helpers: &'a HelperThreads,
    /// The step size depends on it, so every rank passes the same count.
    pub count: usize,
}

/// All-reduces `buf` (elements of `dtype`) in place through `arena`, which
/// must be shared by exactly the ranks of `t`, with `threads` on this rank
/// (at most [`ARENA_MAX_LANES`]). Every rank gets bit-identical results
/// (each element is reduced by one rank only).
pub fn all_reduce_shm_arena(
    t: &dyn Transport,
    arena: &ShmArena,
    threads: ArenaThreads<'_>,
    buf: &mut [u8],
    dtype: DType,
    op: ReduceOp,
    deadline: Instant,
) -> Result<()> {
    reduce_shm_arena(t, arena, threads, buf, dtype, op, None, deadline)
}

/// Reduces every rank's `buf` into `root`'s, as [`all_reduce_shm_arena`]
/// does but with only the root copying the result out (the others skip
/// that third of the work). The other ranks' `buf` are left as they were
/// (each reduces its share in a buffer of one part per lane).
#[allow(clippy::too_many_arguments)]
pub fn reduce_to_root_shm_arena(
    t: &dyn Transport,
    arena: &ShmArena,
    threads: ArenaThreads<'_>,
    buf: &mut [u8],
    dtype: DType,
    op: ReduceOp,
    root: usize,
    deadline: Instant,
) -> Result<()> {
    reduce_shm_arena(t, arena, threads, buf, dtype, op, Some(root), deadline)
}

/// The arena reduction: to every rank (`root` None) or to `root`.
#[allow(clippy::too_many_arguments)]
fn reduce_shm_arena(
    t: &dyn Transport,
    arena: &ShmArena,
    threads: ArenaThreads<'_>,
    buf: &mut [u8],
    dtype: DType,
    op: ReduceOp,
    root: Option<usize>,
    deadline: Instant,
) -> Result<()> {
    let ArenaThreads {
        helpers,
        count: threads,
    } = threads;
    let started = Instant::now();
    let world = t.world_size();
    if arena.world_size() != world {
        return Err(Error::InvalidArgument(format!(
            "all_reduce_shm_arena: expected an arena shared by the transport's {world} ranks, found one for {}",
            arena.world_size()
        )));
    }
    let elem = dtype.size();
    let chunk = arena.chunk() / elem * elem;
    if world > 1 && !buf.is_empty() {
        if chunk == 0 {
            return Err(Error::InvalidArgument(format!(
                "all_reduce_shm_arena: expected arena chunks of at least one {dtype} element, found {} bytes",
                arena.chunk()
            )));
        }
        // At most 64: the opening barrier carries the count in one byte.
        let threads = threads.clamp(1, ARENA_MAX_LANES);
        // Steps of up to SHM_ARENA_STEP_BYTES_PER_THREAD per thread (at
        // least SHM_ARENA_MIN_STEP_BYTES), never more than a slot half.
        let step = (threads * SHM_ARENA_STEP_BYTES_PER_THREAD).max(SHM_ARENA_MIN_STEP_BYTES);
        let step = chunk.min(step / elem * elem);
        // Steps as equal as whole elements allow (the last may be up to one
        // element per step shorter), every step's shares laid out where the
        // first step's are, and every lane's parts where the first step's
        // are (cut at a shorter step's end): a lane's waits cover exactly
        // the bytes it touches.
        let steps = buf.len().div_ceil(step);
        let step = ((buf.len() / elem).div_ceil(steps) * elem).max(elem);
        let layout = block_offsets(step, elem, world);
        // Lane `i`'s part of share `q` of a full step: the same bytes in
        // every step (cut at a shorter step's end).
        let lane_parts: Vec<Vec<std::ops::Range<usize>>> = layout
            .windows(2)
            .map(|share| {
                let cuts = block_offsets(share[1] - share[0], elem, threads);
                cuts.windows(2)
                    .map(|c| share[0] + c[0]..share[0] + c[1])
                    .collect()
            })
            .collect();
        let mut per_lane: Vec<Vec<ChunkWork<'_>>> = (0..threads).map(|_| Vec::new()).collect();
        // Every rank starts here (and has finished the previous call), with
        // the same number of lanes: the layout above depends on it.
        let call = ArenaCall {
            threads: threads as u8,
            symmetric: None,
        };
        call.open(t, arena.wait(), deadline)?;
        for piece in buf.chunks_mut(step) {
            let global = arena.next_step();
            for work in per_lane.iter_mut() {
                work.push(ChunkWork {
                    step: global,
                    parts: Vec::with_capacity(world),
                });
            }
            let len = piece.len();
            let mut rest = piece;
            for parts in &lane_parts {
                for (work, full) in per_lane.iter_mut().zip(parts) {
                    let mine = full.start.min(len)..full.end.min(len);
                    let (bytes, tail) = std::mem::take(&mut rest).split_at_mut(mine.len());
                    rest = tail;
                    if let Some(w) = work.last_mut() {
                        w.parts.push((mine.start, bytes));
                    }
                }
            }
        }
        let failed = AtomicBool::new(false);
        let lanes: Vec<Lane<'_, '_>> = per_lane
            .into_iter()
            .enumerate()
            .map(|(lane, steps)| Lane {
                t,
                arena,
                steps,
                waiter: LaneWaiter {
                    t,
                    arena,
                    lane,
                    started,
                    deadline,
                    failed: &failed,
                },
                copies_out: root.is_none_or(|r| r == t.rank()),
                scratch: Vec::new(),
            })
            .collect();
        let outcome = run_lanes(
            helpers,
            lanes,
            &failed,
            |lane| lane.run(dtype, op),
            "all_reduce_shm_arena",
        );
        arena.mark_unfenced();
        // Every share was finished by the rank that reduced it.
        return outcome;
    }
    if root.is_some_and(|r| r != t.rank()) {
        return Ok(());
    }
    finish(op, dtype, buf, world)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::cpu::algorithms::testing::{check_all_reduce_with, test_arena};

    /// Sums `len` bytes of ones over `arena` with `lanes` fresh helper
    /// threads: the call the failure tests make.
    fn sum_ones(
        t: &dyn Transport,
        arena: &ShmArena,
        len: usize,
        lanes: usize,
        deadline: Instant,
    ) -> Result<()> {
        let threads = ArenaThreads {
            helpers: &HelperThreads::new("test"),
            count: lanes,
        };
        all_reduce_shm_arena(
            t,
            arena,
            threads,
            &mut vec![1u8; len],
            DType::U8,
            ReduceOp::Sum,
            deadline,
        )
    }

    fn check(worlds: &[usize], lengths: &[usize], chunk: usize, threads: usize) {
        check_all_reduce_with(
            worlds,
            lengths,
            |t, store| {
                let arena = test_arena(t, store, "arena", chunk);
                (arena, HelperThreads::new("test"))
            },
            |t, (arena, helpers), buf, dtype, op, deadline| {
                let threads = ArenaThreads {
                    helpers,
                    count: threads,
                };
                all_reduce_shm_arena(t, arena, threads, buf, dtype, op, deadline)
            },
        );
    }

    #[test]
    fn matches_the_reference_for_world_sizes_1_to_8_with_small_odd_chunks() {
        // 24-byte chunks: several chunks per message, chunk ends that cut
        // through no element, shares of 0..3 elements per rank.
        check(&[1, 2, 3, 4, 8], &[0, 1, 7, 100], 24, 1);
    }

    #[test]
    fn one_chunk_per_call_alternates_halves_across_calls() {
        // Whole messages within one 1 KiB chunk: consecutive calls must not
        // reuse the half a slower rank may still be copying out of.
        check(&[3], &[5, 37], 1024, 1);
    }

    #[test]
    fn a_rank_that_leaves_fails_the_others_promptly_with_helpers_running() {
        use crate::cpu::algorithms::testing::{deadline, run_ranks_with_store};
        let started = Instant::now();
        let results = run_ranks_with_store(3, |t, store| {
            let arena = test_arena(t, store, "gone", 64);
            if t.rank() == 2 {
                return None; // leaves: its transport closes
            }
            Some(sum_ones(t, &arena, 1000, 3, deadline()))
        });
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "{:?}",
            started.elapsed()
        );
        for (rank, outcome) in results.into_iter().take(2).enumerate() {
            match outcome {
                Some(Err(Error::PeerClosed { peer, .. })) => {
                    assert!(peer == 2 || peer == 1 - rank, "rank {rank} named {peer}")
                }
                other => panic!("rank {rank}: expected a closed peer, found {other:?}"),
            }
        }
    }

    #[test]
    fn a_rank_that_dies_after_the_first_barrier_is_named_by_the_waiting_lanes() {
        use crate::cpu::algorithms::testing::{deadline, run_ranks_with_store};
        let started = Instant::now();
        let results = run_ranks_with_store(3, |t, store| {
            let arena = test_arena(t, store, "dies", 64);
            if t.rank() == 2 {
                // Enters the call (its opening barrier), then is gone: its
                // transport closes with its links, its counters never move.
                let call = ArenaCall {
                    threads: 2,
                    symmetric: None,
                };
                call.open(t, arena.wait(), deadline())
                    .expect("opening barrier");
                return None;
            }
            Some(sum_ones(t, &arena, 1000, 2, deadline()))
        });
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "{:?}",
            started.elapsed()
        );
        for (rank, outcome) in results.into_iter().take(2).enumerate() {
            match outcome {
                Some(Err(Error::PeerClosed {
                    peer: 2, during, ..
                })) => {
                    assert!(during.contains("shared memory"), "rank {rank}: {during}")
                }
                other => panic!("rank {rank}: expected rank 2 named as gone, found {other:?}"),
            }
        }
    }

    #[test]
    fn a_silent_peer_times_out_by_name_at_the_deadline() {
        use crate::cpu::algorithms::testing::run_ranks_with_store;
        let results = run_ranks_with_store(2, |t, store| {
            let arena = test_arena(t, store, "silent", 64);
            let soon = Instant::now() + Duration::from_millis(300);
            if t.rank() == 1 {
                // Enters the call, then stays alive but never works.
                let call = ArenaCall {
                    threads: 1,
                    symmetric: None,
                };
                call.open(t, arena.wait(), soon).expect("opening barrier");
                std::thread::sleep(Duration::from_millis(600));
                return None;
            }
            Some(sum_ones(t, &arena, 100, 1, soon))
        });
        match &results[0] {
            Some(Err(Error::PeerTimeout {
                peer: 1,
                during,
                timeout,
            })) => {
                assert!(during.contains("waiting in shared memory"), "{during}");
                // The call's timeout, not just the last wait's.
                assert!(*timeout >= Duration::from_millis(250), "{timeout:?}");
            }
            other => panic!("expected a timeout naming rank 1, found {other:?}"),
        }
    }

    #[test]
    fn ranks_with_different_thread_counts_are_refused_by_name() {
        use crate::cpu::algorithms::testing::{deadline, run_ranks_with_store};
        let results = run_ranks_with_store(2, |t, store| {
            let arena = test_arena(t, store, "counts", 64);
            sum_ones(t, &arena, 200, 1 + 3 * t.rank(), deadline())
        });
        for (rank, outcome) in results.into_iter().enumerate() {
            match outcome {
                Err(Error::CollectiveMismatch {
                    peer, mine, theirs, ..
                }) => {
                    assert_eq!(peer, 1 - rank);
                    let (a, b) = if rank == 0 {
                        ("with 1 threads", "with 4 threads")
                    } else {
                        ("with 4 threads", "with 1 threads")
                    };
                    assert!(mine.contains(a) && theirs.contains(b), "{mine} / {theirs}");
                }
                other => panic!("rank {rank}: expected a mismatch, found {other:?}"),
            }
        }
    }

    #[test]
    fn calls_with_different_thread_counts_and_broadcasts_between_them_stay_exact() {
        use crate::cpu::algorithms::broadcast_shm_arena;
        use crate::cpu::algorithms::testing::{deadline, run_ranks_with_store};
        // One arena, back-to-back calls that split the bytes between 1 to
        // 4 lanes and lengths of 1 to 4 steps of a 48-byte chunk, with a
        // broadcast (which follows an all-reduce without its barrier)
        // after every other one: every call must see only its own bytes.
        let world = 3;
        let plan: Vec<(usize, usize)> = (0..24).map(|k| (1 + k % 4, 1 + (k * 7) % 37)).collect();
        let results = run_ranks_with_store(world, |t, store| {
            let arena = test_arena(t, store, "mixed", 48);
            let helpers = HelperThreads::new("test");
            let mut out = Vec::new();
            for (k, &(lanes, n)) in plan.iter().enumerate() {
                let mut buf: Vec<u8> = (0..n * 4).map(|i| (i + t.rank() * 3 + k) as u8).collect();
                let threads = ArenaThreads {
                    helpers: &helpers,
                    count: lanes,
                };
                all_reduce_shm_arena(
                    t,
                    &arena,
                    threads,
                    &mut buf,
                    DType::U8,
                    ReduceOp::Sum,
                    deadline(),
                )
                .expect("all_reduce");
                out.push(buf);
                if k % 2 == 0 {
                    let root = k % world;
                    let mut b: Vec<u8> = if t.rank() == root {
                        (0..n * 5).map(|i| (i * 11 + k) as u8).collect()
                    } else {
                        vec![0; n * 5]
                    };
                    broadcast_shm_arena(t, &arena, &mut b, root, deadline()).expect("broadcast");
                    out.push(b);
                }
            }
            out
        });
        let mut expected = Vec::new();
        for (k, &(_, n)) in plan.iter().enumerate() {
            expected.push(
                (0..n * 4)
                    .map(|i| {
                        (0..world)
                            .map(|r| (i + r * 3 + k) as u8)
                            .fold(0u8, u8::wrapping_add)
                    })
                    .collect::<Vec<u8>>(),
            );
            if k % 2 == 0 {
                expected.push((0..n * 5).map(|i| (i * 11 + k) as u8).collect());
            }
        }
        for (rank, got) in results.iter().enumerate() {
            assert_eq!(got, &expected, "rank {rank}");
        }
    }

    #[test]
    fn steps_smaller_than_the_arenas_chunk_match_the_reference() {
        // A 3 MiB + 8 B chunk, 3 threads: 1.5 MiB steps, so a 1.6 MB
        // message (I64) takes a step of 1.5 MiB and an uneven tail.
        check(&[2, 3], &[200_001], (3 << 20) + 8, 3);
    }

    #[test]
    fn pipelined_steps_with_odd_and_even_step_counts_across_calls_match_the_reference() {
        // 16-byte chunks, 2 threads, 4 ranks: calls of 1 to 40 steps back
        // to back, so every phase of the pipeline (a step copied in while
        // the one before is reduced and the one before that copied out)
        // and every way a call can end and the next begin is exercised.
        check(&[4], &[1, 5, 23, 40], 16, 2);
    }

    #[test]
    fn helper_threads_split_every_step_and_match_the_reference() {
        // 3 threads per rank over 40-byte chunks: threads with no bytes at
        // all in some steps, parts that straddle two ranks' shares.
        check(&[2, 3], &[1, 7, 100], 40, 3);
    }
}
