//! Symmetric-memory all-reduce: for a tensor that lies at the same offset
//! of the same [`SymmetricMemory`] allocation on every rank, so every rank
//! can read every other rank's copy of it. Nothing is staged:
//! - reduce: every rank reduces its own share in place, reading the other
//!   ranks' inputs for it straight out of their regions;
//! - copy out: every rank copies each other rank's reduced share straight
//!   out of that rank's region into its own.
//!
//! Per rank and byte of message, with `N` ranks: about `2 - 1/N` bytes
//! read and `1` written, against `3 - 1/N` and `2` for the arena's staged
//! copy (`all_reduce_shm_arena.rs`).
//!
//! As in the staged arena, lane `i` of every rank owns part `i` of every
//! share, and lanes order their work with the arena's progress counters
//! (one step per call), not barriers:
//! - the call's opening barrier ([`ArenaCall`]) checks that every rank
//!   passes the same allocation, offset and thread count, and that every
//!   rank's input is in place (each has entered the call);
//! - lane `i` of rank `r` reduces its part of share `r` (rank `q` writes
//!   its copy of share `r` only after this, in its copy out), then
//!   publishes it;
//! - it copies out its part of share `q` once rank `q`'s lane `i` has
//!   published it (which also means rank `q` has read this rank's input
//!   for share `q`, now overwritten);
//! - before it returns, it waits until every other rank's lane `i` has
//!   copied out, so no one still reads this rank's region when the caller
//!   writes its next input there.

use std::sync::atomic::AtomicBool;
use std::time::Instant;

use super::arena_lanes::{run_lanes, ArenaCall, LaneWaiter};
use super::{block_offsets, ArenaThreads};
use crate::cpu::reduce_kernels::{finish, reduce_into, ReduceOp};
use crate::cpu::transport::shm::{Progress, ShmArena, SymmetricMemory, ARENA_MAX_LANES};
use crate::cpu::transport::Transport;
use crate::tensor::DType;
use crate::{Error, Result};

/// Bytes of a lane's share reduced at a time, each block combined with
/// every other rank's before the next: the accumulator stays in cache.
const REDUCE_BLOCK_BYTES: usize = 64 << 10;

/// This rank's copy of a tensor in symmetric memory: the allocation, and
/// the tensor's bytes in this rank's region (at the same offset on every
/// rank).
#[derive(Debug)]
pub struct SymmetricBytes<'a> {
    pub memory: &'a SymmetricMemory,
    pub bytes: &'a mut [u8],
}

/// The allocation and the tensor's offset in it, for the lanes.
#[derive(Clone, Copy)]
struct Place<'a> {
    memory: &'a SymmetricMemory,
    offset: usize,
}

/// One lane of one rank in one call.
struct Lane<'a, 'b> {
    place: Place<'b>,
    /// The call's one step in the arena's counters.
    step: u64,
    /// For each rank `q`: where this lane's part of share `q` starts in
    /// the tensor, and this rank's bytes of it.
    parts: Vec<(usize, &'a mut [u8])>,
    waiter: LaneWaiter<'b>,
}

impl Lane<'_, '_> {
    fn run(&mut self, dtype: DType, op: ReduceOp) -> Result<()> {
        let rank = self.waiter.t.rank();
        let world = self.parts.len();
        let Place { memory, offset } = self.place;
        let (start, acc) = &mut self.parts[rank];
        let block = (REDUCE_BLOCK_BYTES / dtype.size()).max(1) * dtype.size();
        let mut done = 0;
        while done < acc.len() {
            let end = (done + block).min(acc.len());
            let at = offset + *start;
            for q in (0..world).filter(|&q| q != rank) {
                // SAFETY: rank `q` writes its copy of share `rank` only in
                // its copy out, after this lane publishes `Reduced`.
                let theirs = unsafe { memory.peer_bytes(q, at + done..at + end) };
                reduce_into(op, dtype, &mut acc[done..end], theirs)?;
            }
            done = end;
        }
        self.waiter.publish(Progress::Reduced, self.step);
        for (q, (start, mine)) in self.parts.iter_mut().enumerate() {
            if q == rank || mine.is_empty() {
                continue;
            }
            if !self.waiter.wait_for(q, Progress::Reduced, self.step)? {
                return Ok(()); // another lane of this rank failed
            }
            let at = offset + *start;
            // SAFETY: rank `q` has published its reduced share and writes
            // it again only in a later call, after the opening barrier.
            let theirs = unsafe { memory.peer_bytes(q, at..at + mine.len()) };
            mine.copy_from_slice(theirs);
        }
        self.waiter.publish(Progress::CopiedOut, self.step);
        self.waiter.wait_all(Progress::CopiedOut, self.step)?;
        Ok(())
    }
}

/// All-reduces `tensor` (elements of `dtype`) in place: this rank's copy
/// of a tensor in symmetric memory shared by exactly the ranks of `t`, at
/// the same offset on every rank (the opening barrier checks), with
/// `threads` on this rank; `arena` only provides the progress counters.
/// Every rank gets bit-identical results (each element is reduced by one
/// rank only, combining the ranks' inputs in the same order as the staged
/// arena: its own first, then the others by rank).
pub fn all_reduce_shm_symmetric(
    t: &dyn Transport,
    arena: &ShmArena,
    tensor: SymmetricBytes<'_>,
    threads: ArenaThreads<'_>,
    dtype: DType,
    op: ReduceOp,
    deadline: Instant,
) -> Result<()> {
    let started = Instant::now();
    let world = t.world_size();
    let SymmetricBytes { memory, bytes: buf } = tensor;
    if arena.world_size() != world || memory.world_size() != world {
        return Err(Error::InvalidArgument(format!(
            "all_reduce_shm_symmetric: expected an arena and symmetric memory shared by the transport's {world} ranks, found {} and {}",
            arena.world_size(),
            memory.world_size()
        )));
    }
    let Some(offset) = memory.offset_of(buf) else {
        return Err(Error::InvalidArgument(format!(
            "all_reduce_shm_symmetric: expected a tensor inside this rank's region of symmetric allocation {} ({} bytes), found {} bytes outside it",
            memory.id(),
            memory.len(),
            buf.len()
        )));
    };
    let place = Place { memory, offset };
    if world > 1 && !buf.is_empty() {
        let elem = dtype.size();
        let lanes = threads.count.clamp(1, ARENA_MAX_LANES);
        let call = ArenaCall {
            threads: lanes as u8,
            symmetric: Some((memory.id(), offset as u64)),
        };
        call.open(t, arena.wait(), deadline)?;
        let step = arena.next_step();
        let mut per_lane: Vec<Vec<(usize, &mut [u8])>> =
            (0..lanes).map(|_| Vec::with_capacity(world)).collect();
        let shares = block_offsets(buf.len(), elem, world);
        let mut rest = &mut *buf;
        for share in shares.windows(2) {
            let cuts = block_offsets(share[1] - share[0], elem, lanes);
            for (parts, cut) in per_lane.iter_mut().zip(cuts.windows(2)) {
                let (bytes, tail) = std::mem::take(&mut rest).split_at_mut(cut[1] - cut[0]);
                rest = tail;
                parts.push((share[0] + cut[0], bytes));
            }
        }
        let failed = AtomicBool::new(false);
        let lanes: Vec<Lane<'_, '_>> = per_lane
            .into_iter()
            .enumerate()
            .map(|(lane, parts)| Lane {
                place,
                step,
                parts,
                waiter: LaneWaiter {
                    t,
                    arena,
                    lane,
                    started,
                    deadline,
                    failed: &failed,
                },
            })
            .collect();
        run_lanes(
            threads.helpers,
            lanes,
            &failed,
            |lane| lane.run(dtype, op),
            "all_reduce_shm_symmetric",
        )?;
    }
    finish(op, dtype, buf, world)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::cpu::algorithms::testing::{deadline, run_ranks_with_store, test_arena};
    use crate::cpu::transport::shm::SymmetricRegistry;
    use crate::cpu::HelperThreads;
    use crate::store::HashStore;

    /// Sums `len` bytes (rank `r` contributes `r + i`) in symmetric memory
    /// with `lanes` threads; `leave` ranks open the call and are gone.
    fn sum(
        t: &dyn Transport,
        store: &HashStore,
        len: usize,
        lanes: usize,
        leave: Option<usize>,
    ) -> Option<Result<Vec<u8>>> {
        let (rank, world) = (t.rank(), t.world_size());
        let timeout = Duration::from_secs(30);
        let arena = test_arena(t, store, "a", 64);
        let registry = SymmetricRegistry::default();
        let mut region = registry
            .allocate(store, "s", (rank, world), len, timeout)
            .expect("symmetric memory");
        let bytes = region.bytes_mut();
        for (i, b) in bytes.iter_mut().enumerate() {
            *b = (rank + i) as u8;
        }
        let (memory, offset) = registry.find(bytes).expect("found");
        if leave == Some(rank) {
            let call = ArenaCall {
                threads: lanes as u8,
                symmetric: Some((memory.id(), offset as u64)),
            };
            call.open(t, arena.wait(), deadline())
                .expect("opening barrier");
            return None; // gone: its transport closes, its counters stay
        }
        let helpers = HelperThreads::new("test");
        let threads = ArenaThreads {
            helpers: &helpers,
            count: lanes,
        };
        let tensor = SymmetricBytes {
            memory: &memory,
            bytes: &mut *bytes,
        };
        let outcome = all_reduce_shm_symmetric(
            t,
            &arena,
            tensor,
            threads,
            DType::U8,
            ReduceOp::Sum,
            deadline(),
        );
        Some(outcome.map(|()| bytes.to_vec()))
    }

    #[test]
    fn uneven_lanes_and_shares_match_the_reference() {
        for (world, len, lanes) in [(2, 1, 1), (3, 1001, 5), (4, 37, 3), (5, 4099, 2)] {
            let results = run_ranks_with_store(world, |t, store| sum(t, store, len, lanes, None));
            let want: Vec<u8> = (0..len)
                .map(|i| (0..world).map(|r| (r + i) as u8).fold(0, u8::wrapping_add))
                .collect();
            for (rank, got) in results.into_iter().enumerate() {
                let got = got.expect("took part").expect("all_reduce");
                assert_eq!(
                    got, want,
                    "world {world} len {len} lanes {lanes} rank {rank}"
                );
            }
        }
    }

    #[test]
    fn a_rank_that_leaves_after_the_opening_barrier_is_named_promptly() {
        let started = Instant::now();
        let results = run_ranks_with_store(3, |t, store| sum(t, store, 3000, 2, Some(2)));
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "{:?}",
            started.elapsed()
        );
        for (rank, outcome) in results.into_iter().take(2).enumerate() {
            match outcome {
                Some(Err(Error::PeerClosed { peer: 2, .. })) => {}
                other => panic!("rank {rank}: expected rank 2 named as gone, found {other:?}"),
            }
        }
    }

    #[test]
    fn a_tensor_outside_the_allocation_is_refused() {
        let results = run_ranks_with_store(2, |t, store| {
            let timeout = Duration::from_secs(30);
            let arena = test_arena(t, store, "a", 64);
            let registry = SymmetricRegistry::default();
            let region = registry
                .allocate(store, "s", (t.rank(), 2), 100, timeout)
                .expect("symmetric memory");
            let (memory, _) = registry.find(&region.bytes()[..10]).expect("found");
            let helpers = HelperThreads::new("test");
            let threads = ArenaThreads {
                helpers: &helpers,
                count: 1,
            };
            let mut private = vec![0u8; 10];
            let tensor = SymmetricBytes {
                memory: &memory,
                bytes: &mut private,
            };
            all_reduce_shm_symmetric(
                t,
                &arena,
                tensor,
                threads,
                DType::U8,
                ReduceOp::Sum,
                deadline(),
            )
        });
        for outcome in results {
            match outcome {
                Err(Error::InvalidArgument(m)) => {
                    assert!(
                        m.contains("inside this rank's region of symmetric allocation 0"),
                        "{m}"
                    )
                }
                other => panic!("expected a refusal, found {other:?}"),
            }
        }
    }
}
