//! The CPU backend as the engine sees it ([`GroupBackend`]): the group's
//! transport, point-to-point links, algorithm choices and shared-memory
//! arena, and how one collective runs over them, with this rank's
//! fingerprint carried in front of its first message to each peer (and
//! checked both ways on every pair that talks), and the call described
//! in full when it fails. A call with CUDA tensors is staged through
//! pinned host memory (`cuda::staged`): prepared on the caller's thread,
//! run on the host copies, and finished on the device; in a group with
//! peer memory, an all_reduce that every rank votes able runs on the GPUs
//! instead (`cuda::staged::peer_path`).

use std::sync::Arc;

use super::collectives::{self, Ctx};
use super::fingerprinted::Fingerprinted;
#[cfg(target_os = "linux")]
use super::group_arena::GroupArena;
use super::monitored_barrier::monitored_barrier;
use super::p2p::P2p;
use super::select::Selection;
use super::transport::{RoutedTransport, Transport};
use crate::group::backend::{Call, GroupBackend};
use crate::group::call_description::describe;
use crate::group::collective::Collective;
use crate::group::DeviceEvent;
use crate::Result;

/// See the module docs.
pub(crate) struct CpuBackend {
    pub(crate) transport: RoutedTransport,
    pub(crate) p2p: Arc<P2p>,
    pub(crate) select: Selection,
    /// The group's arena when every rank is on this host and reached over
    /// shared memory.
    #[cfg(target_os = "linux")]
    pub(crate) arena: Option<Arc<GroupArena>>,
    /// This rank of the group.
    #[cfg(feature = "cuda")]
    pub(crate) rank: usize,
    /// Where CUDA tensors are staged through host memory.
    #[cfg(feature = "cuda")]
    pub(crate) staging: crate::cuda::staged::Staging,
    /// Peer memory for the device path, when asked for and eligible.
    #[cfg(feature = "cuda")]
    pub(crate) peer: Option<Arc<crate::cuda::intranode::IntraNodeComm>>,
    /// Why `peer` is absent (empty when present).
    #[cfg(feature = "cuda")]
    pub(crate) peer_reason: String,
    /// Large all_reduces vote to pipeline their staging: some rank's host
    /// has GPUs or asked for peer memory (`cpu/pipeline_choice.rs`, agreed
    /// at set-up, so the same on every rank).
    #[cfg(feature = "cuda")]
    pub(crate) pipelines: bool,
    /// All-reduces this rank ran in chunks.
    #[cfg(feature = "cuda")]
    pub(crate) chunked: std::sync::atomic::AtomicU64,
    /// See [`GroupBackend::idle_spin`]: [`IDLE_SPIN`] where the host has
    /// CPUs to spare for it (`PollRule` in `cpu/backend.rs`), else zero.
    pub(crate) idle_spin: std::time::Duration,
}

/// How long the group's thread and a waiting caller poll before they
/// sleep, on a host with cores to spare: longer than the gap between
/// back-to-back small collectives (a few µs to a few tens), short enough
/// that an idle group soon stops using a core.
pub(crate) const IDLE_SPIN: std::time::Duration = std::time::Duration::from_micros(50);

impl GroupBackend for CpuBackend {
    #[cfg(feature = "cuda")]
    fn prepare(&self, collective: &Collective) -> Result<Option<crate::group::backend::Prepared>> {
        use crate::cuda::staged::{gpu_of, StagedCall};
        let Some(gpu) = gpu_of("collective", collective)? else {
            return Ok(None);
        };
        let ordered = StagedCall::prepare(self.staging.device(gpu)?)?;
        Ok(Some(Box::new(ordered)))
    }

    fn run(&self, collective: &Collective, call: &Call) -> Result<Option<Arc<dyn DeviceEvent>>> {
        let prepared = call.take_prepared()?;
        #[cfg(feature = "cuda")]
        if let Some(staged) = prepared {
            let Ok(ordered) = staged.downcast::<crate::cuda::staged::Ordered>() else {
                return Err(crate::Error::InvalidArgument(
                    "the CPU backend was handed a call it did not prepare".into(),
                ));
            };
            if let Collective::AllReduce { tensor, op } = collective {
                match self.all_reduce_path(tensor, *op, collective, call)? {
                    AllReducePath::Peer(peer) => {
                        return ordered.peer_all_reduce(peer, tensor, *op).map(Some)
                    }
                    AllReducePath::Chunked => {
                        let whole = Some(tensor.nbytes());
                        let mut run_host =
                            |c: &Collective| self.run_part_on_host(c, collective, call, whole);
                        return ordered
                            .pipelined_all_reduce(tensor, *op, call.deadline, &mut run_host)
                            .inspect_err(|_| call.describe(describe(&call.fingerprint, collective)))
                            .map(Some);
                    }
                    AllReducePath::Whole => {}
                }
            }
            let staged = ordered.copy_down(collective, self.rank)?;
            let ran = staged
                .wait_copied_down_until(call.deadline)
                .and_then(|()| self.run_on_host(staged.host(), collective, call));
            if let Err(e) = ran {
                call.describe(describe(&call.fingerprint, collective));
                return Err(e);
            }
            return staged.copy_up().map(Some);
        }
        #[cfg(not(feature = "cuda"))]
        drop(prepared);
        #[cfg(feature = "cuda")]
        if let Collective::AllReduce { tensor, op } = collective {
            // A host tensor: it votes against the device path, so that
            // ranks with CUDA tensors stage theirs too, and cuts its
            // message into the same chunks when they pipeline theirs.
            if let AllReducePath::Chunked = self.all_reduce_path(tensor, *op, collective, call)? {
                let whole = Some(tensor.nbytes());
                let mut run_host =
                    |c: &Collective| self.run_part_on_host(c, collective, call, whole);
                return crate::cuda::staged::all_reduce_host_chunks(tensor, *op, &mut run_host)
                    .map(|()| None);
            }
        }
        self.run_on_host(collective, collective, call)
            .map(|()| None)
    }

    fn idle_spin(&self) -> std::time::Duration {
        self.idle_spin
    }

    fn abort(&self) {
        #[cfg(feature = "cuda")]
        if let Some(peer) = &self.peer {
            peer.abort();
        }
        self.transport.abort();
    }
}

/// How an all_reduce runs, as the ranks voted (see
/// [`CpuBackend::all_reduce_path`]).
#[cfg(feature = "cuda")]
enum AllReducePath<'a> {
    /// On peer memory: every rank passed an eligible CUDA tensor.
    Peer(&'a Arc<crate::cuda::intranode::IntraNodeComm>),
    /// In chunks (`cuda::staged::pipelined`): a large message that some
    /// rank stages, and every rank's tensor is contiguous.
    Chunked,
    /// Whole, staged or on the host.
    Whole,
}

impl CpuBackend {
    /// Closes this rank's host connections, collective and point-to-point,
    /// as a failed collective does (`close_at_exit.rs`): peers waiting on
    /// this rank fail at once naming it.
    pub(crate) fn close_connections(&self) {
        self.transport.abort();
        self.p2p.abort();
    }

    /// How this all_reduce of `tensor` runs. In groups with peer memory
    /// every all_reduce starts with a vote; in groups that may stage CUDA
    /// tensors (`pipelines`) so do those of `PIPELINE_MIN_BYTES` or more.
    /// The vote ([`vote`](Self::vote)) is a two-element MIN over the
    /// ranks, as part of `call` (`described` on failure): what every rank
    /// can take (0: neither path, 1: chunks, 2: also peer memory), and
    /// whether any rank stages a CUDA tensor. Ranks decide from what every
    /// rank knows (the group, the size), so they all vote or none does.
    #[cfg(feature = "cuda")]
    fn all_reduce_path(
        &self,
        tensor: &crate::tensor::Tensor<'static>,
        op: crate::group::ReduceOp,
        described: &Collective,
        call: &Call,
    ) -> Result<AllReducePath<'_>> {
        use crate::cuda::staged::{peer_path_eligible, PIPELINE_MIN_BYTES};
        let large = tensor.nbytes() >= PIPELINE_MIN_BYTES;
        if self.peer.is_none() && !(self.pipelines && large) {
            return Ok(AllReducePath::Whole);
        }
        let on_gpu = tensor.device().is_cuda();
        let can = match &self.peer {
            _ if !tensor.is_contiguous() => 0,
            Some(peer) if on_gpu && peer_path_eligible(peer, tensor, op) => 2,
            _ => 1,
        };
        let [all_can, least] = self.vote([can, -i32::from(on_gpu)], described, call)?;
        let someone_stages = least < 0;
        if let (2, Some(peer)) = (all_can, &self.peer) {
            return Ok(AllReducePath::Peer(peer));
        }
        if let Some(peer) = &self.peer {
            peer.count_fallback();
        }
        if all_can >= 1 && someone_stages && large && self.pipelines {
            self.chunked
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            tracing::debug!(
                rank = self.rank,
                bytes = tensor.nbytes(),
                "all_reduce staged in chunks"
            );
            return Ok(AllReducePath::Chunked);
        }
        Ok(AllReducePath::Whole)
    }

    /// The element-wise minimum of every rank's `votes`, as part of `call`
    /// (`described` on failure). In a group with an arena, through its
    /// ballot lines (`cpu/transport/shm/arena/ballot.rs`), tagged with the
    /// call's fingerprint: a peer in another call is found there, or by
    /// the message it sent this rank over the links (every collective's
    /// first message to a peer carries its fingerprint, and one-way pairs
    /// announce theirs), and fails the call as
    /// [`Error::CollectiveMismatch`](crate::Error::CollectiveMismatch).
    /// Otherwise a two-element MIN all_reduce over the links.
    #[cfg(feature = "cuda")]
    pub(super) fn vote(
        &self,
        votes: [i32; 2],
        described: &Collective,
        call: &Call,
    ) -> Result<[i32; 2]> {
        #[cfg(target_os = "linux")]
        if let Some(arena) = &self.arena {
            let ended = self.ballot(&arena.shm, votes, call);
            if ended.is_err() {
                call.describe(describe(&call.fingerprint, described));
            }
            return ended;
        }
        let ballot = crate::tensor::Tensor::from_vec(votes.to_vec(), &[2])?;
        let vote = Collective::AllReduce {
            tensor: ballot.clone(),
            op: crate::group::ReduceOp::Min,
        };
        self.run_on_host(&vote, described, call)?;
        match ballot.to_vec::<i32>()?[..] {
            [a, b] => Ok([a, b]),
            _ => Ok([0, 0]),
        }
    }

    /// [`vote`](Self::vote) through the arena's ballot lines.
    #[cfg(all(feature = "cuda", target_os = "linux"))]
    fn ballot(
        &self,
        arena: &super::transport::shm::ShmArena,
        votes: [i32; 2],
        call: &Call,
    ) -> Result<[i32; 2]> {
        use super::transport::shm::BallotEnd;
        const _: () = assert!(
            super::transport::shm::BALLOT_TAG_LEN == crate::group::fingerprint::FINGERPRINT_LEN
        );
        let tag = call.fingerprint.encode();
        // A peer that sent this rank something is in another call: one
        // still voting has sent nothing, and one done voting posted first.
        let elsewhere = |p: usize| self.transport.has_data(p).unwrap_or(false);
        let alive = |p: usize| self.transport.check_alive(p);
        let within = (std::time::Instant::now(), call.deadline);
        match arena.ballot(&tag, votes, within, &elsewhere, &alive)? {
            BallotEnd::Agreed(least) => Ok(least),
            BallotEnd::Mismatched { peer, theirs } => {
                call.report_mismatch(peer, theirs);
                Err(super::fingerprinted::mismatch(
                    self.transport.rank(),
                    peer,
                    &call.fingerprint,
                    &theirs,
                ))
            }
            BallotEnd::Elsewhere { peer } => {
                let t = Fingerprinted::new(
                    &self.transport,
                    call.fingerprint,
                    self.select.sender_check(),
                );
                let read = t.expect_fingerprint(peer, call.deadline);
                if let Some((peer, theirs)) = t.mismatched() {
                    call.report_mismatch(peer, theirs);
                }
                read?;
                Err(crate::Error::PeerProtocol {
                    peer,
                    expected: format!("a ballot on how call {} runs", call.fingerprint.seq),
                    found: "a message of that call over the links, before the ballot".into(),
                })
            }
        }
    }

    /// Runs `collective` to its end on this thread; on failure describes
    /// the call as `described` (the caller's collective, of which
    /// `collective` may be the host copy).
    fn run_on_host(
        &self,
        collective: &Collective,
        described: &Collective,
        call: &Call,
    ) -> Result<()> {
        self.run_part_on_host(collective, described, call, None)
    }

    /// [`run_on_host`](Self::run_on_host) for one chunk of an all_reduce
    /// of `part_of` bytes cut into chunks (see `Ctx::part_of`), or `None`.
    fn run_part_on_host(
        &self,
        collective: &Collective,
        described: &Collective,
        call: &Call,
        part_of: Option<usize>,
    ) -> Result<()> {
        if let Collective::MonitoredBarrier { wait_all, wait } = *collective {
            // Over the point-to-point links, tagged with the sequence
            // number (the same on every rank).
            return monitored_barrier(&self.p2p, call.fingerprint.seq, wait_all, wait);
        }
        let t = Fingerprinted::new(
            &self.transport,
            call.fingerprint,
            self.select.sender_check(),
        );
        let ctx = Ctx {
            t: &t,
            deadline: call.deadline,
            select: &self.select,
            #[cfg(target_os = "linux")]
            arena: self.arena.as_deref(),
            #[cfg(not(target_os = "linux"))]
            arena: None,
            part_of,
        };
        // Then the pairs where data flowed one way check the other way
        // too (see `fingerprinted.rs`), so a rank that only sent fails here
        // rather than at its next call.
        let outcome = collectives::run(&ctx, collective).and_then(|()| t.close_call(call.deadline));
        if outcome.is_err() {
            if let Some((peer, theirs)) = t.mismatched() {
                call.report_mismatch(peer, theirs);
            }
            call.describe(describe(&call.fingerprint, described));
        }
        outcome
    }
}
