//! Symmetric memory: one block per rank, laid out the same on every rank
//! (signal pad, the push kernel's inbox, then three buffer regions), mapped into every rank's
//! address space. Set up through the store in three rounds: every rank
//! publishes a [`RankInfo`]; every rank judges the group and, if it can
//! take part, allocates its block and publishes its IPC handle (or why
//! not); every rank maps the others' blocks and says whether that worked.
//! A rank that cannot take part makes set-up fail on every rank with its
//! reason, so no rank ever waits in a kernel for one that never comes.
//!
//! Ranks in one process use each other's addresses directly (a process
//! cannot open its own IPC handles) and share ownership of each other's
//! blocks, so a block is freed only once every rank of its process that
//! reads it is done (freeing waits for its own GPU only, not for a peer's
//! kernel reading it). Dropping unmaps the peers' blocks, then frees this
//! rank's (if no other rank of this process holds it).

use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::Duration;

use super::topology::{to_hex, unhex, why_not, PeerPolicy, RankInfo};
use crate::cuda::kernels::{push_inbox_bytes, PEER_MAX, PEER_PAD_BYTES};
use crate::cuda::runtime::{enable_peer_access, IpcHandle, PeerMapping, SharedAllocation};
use crate::store::Store;
use crate::{Error, Result};

/// Bytes before the first region (the signal pad, rounded up).
const PAD_AREA: usize = PEER_PAD_BYTES.div_ceil(4096) * 4096;

/// Regions of the block: two that eager calls alternate between, and one
/// for calls captured in CUDA graphs, last, twice their size (a captured
/// large call then moves the chunks an eager one does, which takes both
/// eager regions).
pub(crate) const REGIONS: usize = 3;

/// The region captured calls use.
pub(crate) const GRAPH_REGION: usize = 2;

/// Bytes of all the regions together, in eager regions of `region` bytes.
const REGION_UNITS: usize = 4;

/// How a peer's block is reached.
enum Peer {
    /// This rank's own block.
    Own,
    /// A rank of this process: its block, shared.
    SameProcess(Arc<SharedAllocation>),
    /// A rank of another process, mapped through IPC.
    Mapped(PeerMapping),
}

/// See the module docs.
pub(crate) struct SymmetricMemory {
    /// Dropped first: the peers' blocks are unmapped before ours is freed.
    peers: Vec<Peer>,
    mine: Option<Arc<SharedAllocation>>,
    region: usize,
    /// Bytes of the push kernel's inbox, between the pad and the regions.
    inbox: usize,
    /// The most ranks of the group on one GPU.
    ranks_per_gpu: usize,
    /// Whether another rank of the group is a thread of this process on
    /// this rank's GPU (they share a CUDA context).
    shares_context: bool,
}

impl Drop for SymmetricMemory {
    /// With ranks of this process among the peers, this rank may hold the
    /// last reference to another GPU's block, and freeing it waits for
    /// that GPU: for a kernel of that rank's next call, which may wait for
    /// this very thread. Such blocks are let go on a thread of their own.
    fn drop(&mut self) {
        let shared = self.peers.iter().any(|p| matches!(p, Peer::SameProcess(_)));
        if shared {
            let peers = std::mem::take(&mut self.peers);
            let mine = self.mine.take();
            let spawned = std::thread::Builder::new()
                .name("tensorcomm-free".into())
                .spawn(move || drop((peers, mine)));
            if let Err(e) = spawned {
                tracing::debug!(%e, "no thread to free peer-memory blocks on: freed here");
            }
        }
    }
}

/// The blocks of this process's ranks, for the other ranks of this process
/// to find by address (unique within a process while allocated).
/// (Addresses are compared before upgrading, so that no block is ever
/// freed while the list is locked.)
static LIVE_BLOCKS: Mutex<Vec<(u64, Weak<SharedAllocation>)>> = Mutex::new(Vec::new());

/// Makes `block` findable by [`find_block`].
fn register_block(block: &Arc<SharedAllocation>) {
    let mut live = LIVE_BLOCKS.lock().unwrap_or_else(PoisonError::into_inner);
    live.retain(|(_, w)| w.strong_count() > 0);
    live.push((block.ptr().addr(), Arc::downgrade(block)));
}

/// The live block of this process that starts at `addr` on `device`.
fn find_block(addr: u64, device: usize) -> Option<Arc<SharedAllocation>> {
    let live = LIVE_BLOCKS.lock().unwrap_or_else(PoisonError::into_inner);
    let found = live
        .iter()
        .filter(|(a, _)| *a == addr)
        .find_map(|(_, w)| w.upgrade());
    drop(live);
    found.filter(|b| b.device() == device)
}

/// What set-up needs to know.
pub(crate) struct Rendezvous<'a> {
    pub(crate) store: &'a dyn Store,
    pub(crate) prefix: &'a str,
    pub(crate) rank: usize,
    pub(crate) world: usize,
    pub(crate) device: usize,
    pub(crate) policy: PeerPolicy,
    pub(crate) settings: String,
    pub(crate) region: usize,
    pub(crate) timeout: Duration,
}

/// The store key of rank `rank`'s answer in `round`.
fn round_key(prefix: &str, round: &str, rank: usize) -> String {
    format!("{prefix}/{round}/{rank}")
}

impl Rendezvous<'_> {
    fn key(&self, round: &str, rank: usize) -> String {
        round_key(self.prefix, round, rank)
    }

    /// Posts `error` as rank `rank`'s first-round answer under `prefix`,
    /// for a rank that fails before it can take part: the others then
    /// fail at once, naming it (see [`RankInfo::decode`]).
    pub(crate) fn post_failure(store: &dyn Store, prefix: &str, rank: usize, error: &Error) {
        let key = round_key(prefix, "info", rank);
        if let Err(e) = store.set(&key, format!("error: {error}").as_bytes()) {
            tracing::debug!(rank, %e, "could not post the intra-node set-up failure");
        }
    }

    /// Posts this rank's value for `round` and returns every rank's.
    fn round(&self, round: &str, mine: &[u8]) -> Result<Vec<Vec<u8>>> {
        self.store.set(&self.key(round, self.rank), mine)?;
        let keys: Vec<String> = (0..self.world).map(|r| self.key(round, r)).collect();
        let refs: Vec<&str> = keys.iter().map(String::as_str).collect();
        self.store.multi_get_timeout(&refs, self.timeout)
    }

    /// `Ok(())` when every rank posted `ok...` in `answers`, else the
    /// first refusal as [`Error::IntraNodeUnavailable`].
    fn agreed(answers: &[Vec<u8>]) -> Result<()> {
        for (r, a) in answers.iter().enumerate() {
            let text = String::from_utf8_lossy(a);
            if let Some(reason) = text.strip_prefix("no ") {
                return Err(Error::IntraNodeUnavailable {
                    reason: format!("rank {r}: {reason}"),
                });
            }
        }
        Ok(())
    }

    /// Runs the three rounds of the module docs.
    pub(crate) fn run(&self) -> Result<SymmetricMemory> {
        if self.world > PEER_MAX || self.rank >= self.world {
            return Err(Error::IntraNodeUnavailable {
                reason: format!(
                    "rank {} of {} ranks: peer memory serves 2 to {PEER_MAX}",
                    self.rank, self.world
                ),
            });
        }
        // Posted even when this rank cannot describe itself, so that the
        // others fail at once (naming it) instead of waiting for it.
        let info = RankInfo::mine(self.device, self.settings.clone());
        let posted = match &info {
            Ok(i) => i.encode(),
            Err(e) => format!("error: {e}").into_bytes(),
        };
        let infos = self.round("info", &posted)?;
        info?;
        let infos = infos
            .iter()
            .enumerate()
            .map(|(r, b)| RankInfo::decode(r, b))
            .collect::<Result<Vec<_>>>()?;

        // Round 2: the verdict, and the block when this rank can take part.
        let judged = why_not(self.rank, self.device, &infos, self.policy);
        let block = match &judged {
            Ok(None) => Some(
                SharedAllocation::zeroed(
                    self.device,
                    PAD_AREA + push_inbox_bytes(self.world) + REGION_UNITS * self.region,
                )
                .and_then(|a| a.ipc_handle().map(|h| (Arc::new(a), h)))
                .inspect(|(a, _)| register_block(a)),
            ),
            _ => None,
        };
        let answer = match (&judged, &block) {
            (Err(e), _) => format!("no {e}"),
            (Ok(Some(reason)), _) => format!("no {reason}"),
            (Ok(None), Some(Ok((a, h)))) => format!("ok {} {}", to_hex(&h.0), a.ptr().addr()),
            (Ok(None), Some(Err(e))) => format!("no allocating the buffer failed: {e}"),
            (Ok(None), None) => unreachable!("a block is allocated whenever the verdict is yes"),
        };
        let answers = self.round("block", answer.as_bytes())?;
        judged?;
        Self::agreed(&answers)?;
        let (mine, _) = block.expect("every rank said yes, this one included")?;

        // Round 3: map the peers' blocks.
        let mapped = self.map_peers(&infos, &answers);
        let answer = match &mapped {
            Ok(_) => "ok".to_string(),
            Err(e) => format!("no mapping the peers' buffers failed: {e}"),
        };
        let answers = self.round("mapped", answer.as_bytes())?;
        let peers = mapped?;
        Self::agreed(&answers)?;
        let me = &infos[self.rank];
        Ok(SymmetricMemory {
            peers,
            mine: Some(mine),
            region: self.region,
            inbox: push_inbox_bytes(self.world),
            ranks_per_gpu: infos
                .iter()
                .map(|i| infos.iter().filter(|o| o.uuid == i.uuid).count())
                .max()
                .unwrap_or(1),
            shares_context: infos.iter().enumerate().any(|(r, other)| {
                r != self.rank && other.process == me.process && other.uuid == me.uuid
            }),
        })
    }

    fn map_peers(&self, infos: &[RankInfo], answers: &[Vec<u8>]) -> Result<Vec<Peer>> {
        let me = &infos[self.rank];
        let mut peers = Vec::with_capacity(self.world);
        for (r, answer) in answers.iter().enumerate() {
            if r == self.rank {
                peers.push(Peer::Own);
                continue;
            }
            let bad = || Error::PeerProtocol {
                peer: r,
                expected: "`ok <IPC handle> <address>` for its intra-node buffer".into(),
                found: format!("{:?}", String::from_utf8_lossy(answer)),
            };
            let text = std::str::from_utf8(answer).map_err(|_| bad())?;
            let mut words = text.split(' ').skip(1);
            let handle = words.next().and_then(unhex::<64>).ok_or_else(bad)?;
            let addr: u64 = words.next().and_then(|w| w.parse().ok()).ok_or_else(bad)?;
            if infos[r].process == me.process {
                // Another rank of this process: reach its GPU directly.
                let mut peer_device = None;
                for d in 0..crate::cuda::runtime::device_count()? {
                    if crate::cuda::runtime::device_uuid(d)? == infos[r].uuid {
                        peer_device = Some(d);
                    }
                }
                let d = peer_device.ok_or_else(|| Error::PeerProtocol {
                    peer: r,
                    expected: "the UUID of a GPU this process sees".into(),
                    found: to_hex(&infos[r].uuid),
                })?;
                if !enable_peer_access(self.device, d)? {
                    return Err(Error::IntraNodeUnavailable {
                        reason: format!(
                            "rank {} (cuda:{}) cannot reach the memory of rank {r} (cuda:{d}) in the same process: peer access could not be enabled",
                            self.rank, self.device
                        ),
                    });
                }
                let block = find_block(addr, d).ok_or_else(|| Error::PeerProtocol {
                    peer: r,
                    expected: format!("a live buffer of this process at {addr:#x} on cuda:{d}"),
                    found: "none (the rank posted an address no rank of this process holds)".into(),
                })?;
                peers.push(Peer::SameProcess(block));
            } else {
                peers.push(Peer::Mapped(PeerMapping::open(
                    self.device,
                    &IpcHandle(handle),
                )?));
            }
        }
        Ok(peers)
    }
}

impl SymmetricMemory {
    /// The start of rank `rank`'s block in this process.
    fn base(&self, rank: usize) -> u64 {
        match &self.peers[rank] {
            Peer::Own => self
                .mine
                .as_ref()
                .expect("present until dropped")
                .ptr()
                .addr(),
            Peer::SameProcess(block) => block.ptr().addr(),
            Peer::Mapped(m) => m.ptr().addr(),
        }
    }

    /// Every rank's signal pad, as the kernels take them.
    pub(crate) fn pads(&self) -> [u64; PEER_MAX] {
        let mut out = [0; PEER_MAX];
        for (r, o) in out.iter_mut().enumerate().take(self.peers.len()) {
            *o = self.base(r);
        }
        out
    }

    /// Every rank's push inbox, as the push kernel takes them.
    pub(crate) fn inboxes(&self) -> [u64; PEER_MAX] {
        let mut out = [0; PEER_MAX];
        for (r, o) in out.iter_mut().enumerate().take(self.peers.len()) {
            *o = self.base(r) + PAD_AREA as u64;
        }
        out
    }

    /// Every rank's region `k` (0 to [`REGIONS`] - 1); region `k + 1`
    /// follows region `k`. Eager regions hold [`region_bytes`](Self::region_bytes),
    /// the graph region twice that ([`graph_region_bytes`](Self::graph_region_bytes)).
    pub(crate) fn regions(&self, k: usize) -> [u64; PEER_MAX] {
        assert!(k < REGIONS);
        let mut out = [0; PEER_MAX];
        for (r, o) in out.iter_mut().enumerate().take(self.peers.len()) {
            *o = self.base(r) + (PAD_AREA + self.inbox + k * self.region) as u64;
        }
        out
    }

    /// Bytes of one eager region.
    pub(crate) fn region_bytes(&self) -> usize {
        self.region
    }

    /// Bytes of the graph region ([`GRAPH_REGION`]).
    pub(crate) fn graph_region_bytes(&self) -> usize {
        2 * self.region
    }

    /// The most ranks of the group that share one GPU (1: every rank has
    /// its own).
    pub(crate) fn ranks_per_gpu(&self) -> usize {
        self.ranks_per_gpu
    }

    /// Whether rank `rank` is this rank or a thread of this process (its
    /// addresses are this process's).
    pub(crate) fn same_process(&self, rank: usize) -> bool {
        matches!(self.peers.get(rank), Some(Peer::Own | Peer::SameProcess(_)))
    }

    /// Whether another rank is a thread of this process on this rank's GPU.
    pub(crate) fn shares_context(&self) -> bool {
        self.shares_context
    }
}

const _: () = assert!(PEER_PAD_BYTES <= PAD_AREA);

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::HashStore;

    #[test]
    fn a_failure_posted_before_set_up_is_the_first_round_answer_naming_the_rank() {
        let store = HashStore::new();
        let e = Error::InvalidArgument("region_bytes: expected 4096 to 2^40, found 1".into());
        Rendezvous::post_failure(&store, "tp/intranode", 1, &e);
        let posted = store.get(&round_key("tp/intranode", "info", 1)).unwrap();
        let got = RankInfo::decode(1, &posted).unwrap_err().to_string();
        assert!(
            got.contains("rank 1") && got.contains("expected 4096 to 2^40"),
            "{got}"
        );
    }
}
