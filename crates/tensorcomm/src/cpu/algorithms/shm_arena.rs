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
//! The steps are pipelined: phase `j` copies step `j` in, reduces step
//! `j - 1` and copies step `j - 2` out, and a barrier separates phases, so
//! `S` steps take `S + 1` barriers (two per step without the pipeline).
//! Two halves are enough, because every step of a call lays its shares
//! out in the same bytes of the slot half (the steps are made as equal as
//! whole elements allow; the last one's shares are the first one's, cut
//! at its length). In half `j % 2` of its slot, a rank writes the other
//! ranks' shares in phase `j` (copy in of step `j`), which they last read
//! in phase `j - 1` (their reduce of step `j - 2`) and which are not its
//! own share, read in phase `j` (their copy out of step `j - 2`); it
//! writes its own share in phase `j + 1` (reduce of step `j`), which they
//! last read in phase `j` (that copy out). A barrier lies between each
//! such read and write. The last copy out of a call follows its last
//! barrier, as before; the next call starts on the other half and copies
//! into this one only after its first barrier, so the argument carries
//! across calls.
//!
//! Per rank and byte of message, with `N` ranks: `3 - 1/N` bytes read and
//! `2` written (the copy in, reduction and copy out of the whole message
//! would be `3` and `2 + 1/N`).
//!
//! The barriers are dissemination barriers of 1-byte messages over the
//! group's transport, so the collective's fingerprint rides on them and a
//! dead peer fails them by name, as in every other algorithm.
//!
//! Pipelining, predicted and measured: on the GPU host (32 cores) the
//! unpipelined algorithm took 260-380 µs per step at 2-8 ranks, where the
//! bytes alone should take well under 100 µs per step at one thread's
//! copy bandwidth, so each of the two barriers (a gate of up to 8 threads,
//! then `log2 N` rounds of transport messages, gated by the slowest thread
//! of the slowest rank) looked like it cost tens of µs; halving their
//! number was predicted to cut 10-25% at 4 and 8 ranks. Outcome (same
//! host, bench/results/NOTES.md): 32 MiB 12%, 23% and 11% faster at 2, 4
//! and 8 ranks; 8 MiB 14% and 6% faster at 4 and 8 ranks; one-step
//! messages (2 MiB) unchanged within the run-to-run noise (~14%).
//!
//! A single core cannot saturate memory bandwidth, so with `threads > 1`
//! each rank splits every step's bytes between itself and `threads - 1`
//! [`HelperThreads`] (kept alive between calls): the calling thread
//! gathers them at a local gate after each phase, runs the barrier, and
//! releases them.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Mutex, PoisonError};
use std::time::Instant;

use super::{block_offsets, SHM_ARENA_MIN_STEP_BYTES, SHM_ARENA_STEP_BYTES_PER_THREAD};
use crate::cpu::reduce::{finish, ReduceOp};
use crate::cpu::transport::shm::ShmArena;
use crate::cpu::transport::Transport;
use crate::cpu::HelperThreads;
use crate::tensor::DType;
use crate::{Error, Result};

/// Waits until every rank of `t` has reached this call: `ceil(log2 N)`
/// rounds, in round `i` signalling rank `+2^i` and waiting on rank `-2^i`.
pub(super) fn barrier(t: &dyn Transport, deadline: Instant) -> Result<()> {
    let (rank, world) = (t.rank(), t.world_size());
    let mut distance = 1;
    while distance < world {
        let to = (rank + distance) % world;
        let from = (rank + world - distance) % world;
        t.send_recv(to, &[1], from, &mut [0u8], deadline)?;
        distance *= 2;
    }
    Ok(())
}

/// Where the threads of one rank meet between steps: each worker counts
/// itself in `arrived`, then waits for `released` to reach the step's
/// number; the leader waits for all arrivals, runs the group barrier and
/// releases the step (or sets `failed`, which also releases everyone).
struct Gate {
    workers: usize,
    arrived: AtomicUsize,
    released: AtomicUsize,
    failed: AtomicBool,
}

/// Spins briefly, then yields: waits here are a few microseconds when the
/// threads have cores of their own, and must not starve them when not.
fn pause(spins: &mut u32) {
    if *spins < 200 {
        std::hint::spin_loop();
        *spins += 1;
    } else {
        std::thread::yield_now();
    }
}

impl Gate {
    /// A worker's side of step `step` (1-based); false if the leader failed.
    fn worker_pass(&self, step: usize) -> bool {
        self.arrived.fetch_add(1, Ordering::AcqRel);
        let mut spins = 0;
        while self.released.load(Ordering::Acquire) < step {
            if self.failed.load(Ordering::Acquire) {
                return false;
            }
            pause(&mut spins);
        }
        !self.failed.load(Ordering::Acquire)
    }

    /// The leader's side of step `step`: waits for the workers, then runs
    /// `between` (the group barrier) before releasing them.
    fn leader_pass(&self, step: usize, between: impl FnOnce() -> Result<()>) -> Result<()> {
        let mut spins = 0;
        while self.arrived.load(Ordering::Acquire) < self.workers * step {
            if self.failed.load(Ordering::Acquire) {
                // A worker failed and returns its own error when joined.
                return Ok(());
            }
            pause(&mut spins);
        }
        match between() {
            Ok(()) => {
                self.released.store(step, Ordering::Release);
                Ok(())
            }
            Err(e) => {
                self.failed.store(true, Ordering::Release);
                Err(e)
            }
        }
    }
}

/// Sets the gate's failure flag if dropped while its thread panics, so no
/// lane waits for one that will never arrive.
struct ReleaseOnPanic<'a>(&'a Gate);

impl Drop for ReleaseOnPanic<'_> {
    fn drop(&mut self) {
        if std::thread::panicking() {
            self.0.failed.store(true, Ordering::Release);
        }
    }
}

/// Part `i` of `parts` of `range`, split at whole `elem`-byte elements.
fn part(
    range: &std::ops::Range<usize>,
    elem: usize,
    parts: usize,
    i: usize,
) -> std::ops::Range<usize> {
    let offsets = block_offsets(range.len(), elem, parts);
    range.start + offsets[i]..range.start + offsets[i + 1]
}

/// What one thread of a rank does for one chunk, between the gates.
///
/// Thread `me` of `threads` owns part `me` of every rank's share of the
/// chunk (`parts[r]`, bytes of the rank's own buffer), so the thread that
/// reduces a part of this rank's share also holds this rank's input for
/// it and reduces straight into it.
struct ChunkWork<'a> {
    arena: &'a ShmArena,
    parity: usize,
    /// For each rank `r`: the chunk's byte offset of this thread's part of
    /// `r`'s share, and those bytes of this rank's buffer.
    parts: Vec<(usize, &'a mut [u8])>,
}

impl ChunkWork<'_> {
    /// Stages this thread's parts of the other ranks' shares in this
    /// rank's slot (its own share is read straight from its buffer).
    fn copy_in(&self, rank: usize) {
        for (r, (offset, bytes)) in self.parts.iter().enumerate() {
            if r != rank {
                self.arena.copy_in(self.parity, *offset, bytes);
            }
        }
    }

    /// Reduces this thread's part of this rank's share: this rank's input
    /// in its buffer, combined with the other ranks' slots in rank order,
    /// then published in this rank's slot for the others to copy out.
    fn reduce(&mut self, rank: usize, dtype: DType, op: ReduceOp) -> Result<()> {
        let (offset, acc) = &mut self.parts[rank];
        let range = *offset..*offset + acc.len();
        self.arena
            .reduce_share_into(self.parity, range, acc, dtype, op)?;
        self.arena.copy_in(self.parity, *offset, acc);
        Ok(())
    }

    /// Copies this thread's parts of the other ranks' reduced shares out
    /// of their slots.
    fn copy_out(&mut self, rank: usize) {
        for (r, (offset, bytes)) in self.parts.iter_mut().enumerate() {
            if r != rank {
                let range = *offset..*offset + bytes.len();
                self.arena.copy_out(r, self.parity, range, bytes);
            }
        }
    }
}

/// Phase `phase` of one thread's steps (`lane`, in order): reduces step
/// `phase - 1`, copies step `phase - 2` out and step `phase` in, each
/// where it exists. Between two phases every rank passes a barrier, so
/// everything a phase reads was written before the previous barrier.
fn run_phase(
    lane: &mut [ChunkWork<'_>],
    phase: usize,
    rank: usize,
    dtype: DType,
    op: ReduceOp,
) -> Result<()> {
    if let Some(work) = phase.checked_sub(1).and_then(|k| lane.get_mut(k)) {
        work.reduce(rank, dtype, op)?;
    }
    if let Some(work) = phase.checked_sub(2).and_then(|k| lane.get_mut(k)) {
        work.copy_out(rank);
    }
    if let Some(work) = lane.get(phase) {
        work.copy_in(rank);
    }
    Ok(())
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
/// must be shared by exactly the ranks of `t`, with `threads` on this rank. Every rank gets
/// bit-identical results (each element is reduced by one rank only).
pub fn all_reduce_shm_arena(
    t: &dyn Transport,
    arena: &ShmArena,
    threads: ArenaThreads<'_>,
    buf: &mut [u8],
    dtype: DType,
    op: ReduceOp,
    deadline: Instant,
) -> Result<()> {
    let ArenaThreads {
        helpers,
        count: threads,
    } = threads;
    let (rank, world) = (t.rank(), t.world_size());
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
        let threads = threads.clamp(1, 64);
        // Steps of up to SHM_ARENA_STEP_BYTES_PER_THREAD per thread (at
        // least SHM_ARENA_MIN_STEP_BYTES): fewer barriers when many threads
        // share a step, never more than a slot half holds.
        let step = (threads * SHM_ARENA_STEP_BYTES_PER_THREAD).max(SHM_ARENA_MIN_STEP_BYTES);
        let step = chunk.min(step / elem * elem);
        // Steps as equal as whole elements allow (the last may be up to one
        // element per step shorter), every step's shares laid out where the
        // first step's are: the pipeline relies on each rank's share of
        // every step lying in the same bytes of its slot half.
        let steps = buf.len().div_ceil(step);
        let step = ((buf.len() / elem).div_ceil(steps) * elem).max(elem);
        let layout = block_offsets(step, elem, world);
        // Each thread's parts of every chunk, decided up front so that the
        // threads own disjoint parts of `buf`: thread `i` gets part `i` of
        // every rank's share (in buffer order: share by share, part by part).
        let mut per_thread: Vec<Vec<ChunkWork<'_>>> = (0..threads).map(|_| Vec::new()).collect();
        for piece in buf.chunks_mut(step) {
            let parity = arena.next_parity();
            let shares: Vec<usize> = layout.iter().map(|&o| o.min(piece.len())).collect();
            for work in per_thread.iter_mut() {
                work.push(ChunkWork {
                    arena,
                    parity,
                    parts: Vec::with_capacity(world),
                });
            }
            let mut rest = piece;
            for share in shares.windows(2) {
                for (i, work) in per_thread.iter_mut().enumerate() {
                    let mine = part(&(share[0]..share[1]), elem, threads, i);
                    let (bytes, tail) = std::mem::take(&mut rest).split_at_mut(mine.len());
                    rest = tail;
                    if let Some(w) = work.last_mut() {
                        w.parts.push((mine.start, bytes));
                    }
                }
            }
        }
        let gate = Gate {
            workers: threads - 1,
            arrived: AtomicUsize::new(0),
            released: AtomicUsize::new(0),
            failed: AtomicBool::new(false),
        };
        // The steps run as a pipeline, one barrier per phase: phase `j`
        // reduces step `j - 1`, copies step `j - 2` out and step `j` in.
        let phases = per_thread.first().map_or(0, Vec::len) + 1;
        let lanes: Vec<Mutex<Vec<ChunkWork<'_>>>> =
            per_thread.into_iter().map(Mutex::new).collect();
        let outcomes = helpers.run(threads, |i| -> Result<()> {
            let gate = &gate;
            // A lane that panics must not leave the others at the gate.
            let _release = ReleaseOnPanic(gate);
            let mut lane = lanes[i].lock().unwrap_or_else(PoisonError::into_inner);
            if i > 0 {
                for phase in 0..phases {
                    if let Err(e) = run_phase(&mut lane, phase, rank, dtype, op) {
                        gate.failed.store(true, Ordering::Release);
                        return Err(e);
                    }
                    if !gate.worker_pass(phase + 1) {
                        return Ok(());
                    }
                }
                return run_phase(&mut lane, phases, rank, dtype, op);
            }
            for phase in 0..phases {
                let done = run_phase(&mut lane, phase, rank, dtype, op);
                gate.leader_pass(phase + 1, || done.and_then(|()| barrier(t, deadline)))?;
                if gate.failed.load(Ordering::Acquire) {
                    // A helper failed: its own error is returned below.
                    return Ok(());
                }
            }
            run_phase(&mut lane, phases, rank, dtype, op)
        });
        let mut outcome = Ok(());
        for lane in outcomes {
            let lane = lane.unwrap_or_else(|_| {
                Err(Error::InvalidArgument(
                    "all_reduce_shm_arena: a lane panicked".into(),
                ))
            });
            outcome = outcome.and(lane);
        }
        outcome?;
    }
    finish(op, dtype, buf, world)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::cpu::algorithms::testing::check_all_reduce_with;

    fn check(worlds: &[usize], lengths: &[usize], chunk: usize, threads: usize) {
        check_all_reduce_with(
            worlds,
            lengths,
            |t, store| {
                let arena = ShmArena::connect(
                    store,
                    "arena",
                    t.rank(),
                    t.world_size(),
                    chunk,
                    Duration::from_secs(30),
                )
                .expect("arena setup");
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
            let arena = ShmArena::connect(store, "gone", t.rank(), 3, 64, Duration::from_secs(30))
                .expect("arena setup");
            if t.rank() == 2 {
                return None; // leaves: its transport closes
            }
            let mut buf = vec![1u8; 1000];
            Some(all_reduce_shm_arena(
                t,
                &arena,
                ArenaThreads {
                    helpers: &HelperThreads::new("test"),
                    count: 3,
                },
                &mut buf,
                DType::U8,
                ReduceOp::Sum,
                deadline(),
            ))
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
