//! Tensors of captured calls, registered once the capture has ended (as
//! vLLM's custom all-reduce does), so that replays reduce the ranks'
//! tensors in place with no copy through the buffers.
//!
//! During a capture begun by
//! [`IntraNodeComm::capture_registered`](super::IntraNodeComm::capture_registered),
//! each one-shot or two-shot call takes a slot of a device table and
//! captures the registered kernel, which reads from that slot, at replay,
//! where every rank's tensor lies. Once the capture has ended, each rank
//! posts its captured tensors (IPC handle and offset of each allocation)
//! through the store, opens its peers' (once per allocation) and writes
//! the slots. A rank whose tensor CUDA IPC cannot share (a stream-ordered
//! pool, a virtual-memory mapping), unless every rank is a thread of one
//! process on one GPU, "stages" that call: its slot points every rank at
//! its graph region, and its kernel copies the tensor in before and out
//! after. Registrations happen under the communicator's lock, so a
//! capture begun meanwhile waits for the registration under way.

use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::Duration;

use super::symmetric_memory::{SymmetricMemory, GRAPH_REGION};
use super::topology::{to_hex, unhex};
use crate::cuda::kernels::{PEER_MAX, REG_ALIGNED, REG_REGISTERED, REG_STAGED, REG_WORDS};
use crate::cuda::runtime::{self, export_address, DeviceBuffer, DevicePtr, IpcHandle, PeerMapping};
use crate::store::Store;
use crate::{Error, Result};

/// Registered captured calls a communicator holds in all: later captured
/// calls copy through the graph region, as unregistered ones do.
pub const GRAPH_INPUT_SLOTS: usize = 4096;

/// Bytes of one slot of the table.
const SLOT_BYTES: usize = REG_WORDS * 8;

/// A call captured on a registered tensor, waiting for registration.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Captured {
    /// Its slot of the table.
    pub(crate) slot: usize,
    /// The tensor's device address on this rank.
    pub(crate) addr: u64,
    /// The tensor's bytes.
    pub(crate) bytes: usize,
    /// What the call does, as one word: dtype and op (`bf16/Sum`), which
    /// every rank's call must match.
    pub(crate) what: String,
}

/// How a rank's tensor of one captured call is reached, as it posts it.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Reach {
    /// Through the allocation's IPC handle, at this offset.
    Ipc(IpcHandle, u64),
    /// Only at its address (it could not be exported, and every rank is a
    /// thread of one process on one GPU, sharing its context).
    Direct,
    /// Through the rank's graph region (it could not be exported).
    Staged,
}

/// One captured call as a rank posts it.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Posted {
    bytes: usize,
    what: String,
    addr: u64,
    reach: Reach,
}

/// The slots of one communicator and the calls captured since the last
/// registration.
#[derive(Default)]
pub(crate) struct GraphInputs {
    /// [`GRAPH_INPUT_SLOTS`] slots, allocated when the first registering
    /// capture begins (before its capture: allocating during one is not
    /// allowed).
    table: Option<DeviceBuffer>,
    /// The table's device address.
    base: Option<u64>,
    /// Slots taken so far.
    taken: usize,
    /// Slots taken when the registering capture under way began (a failed
    /// one gives its slots back, so that every rank's next capture takes
    /// the same slots as the others').
    taken_at_begin: usize,
    /// The stream of the registering capture under way (its raw handle):
    /// only calls queued on it take slots.
    capturing: Option<usize>,
    pending: Vec<Captured>,
    /// Registrations so far: names each one's store keys.
    generation: u64,
    /// Peers' allocations opened so far: kept until the communicator is
    /// dropped (the graphs read them).
    opened: Vec<Arc<PeerMapping>>,
}

/// Peers' allocations this process has opened, by GPU and handle: a
/// process opens each once, whichever communicators use it.
static OPENED: Mutex<Vec<(usize, IpcHandle, Weak<PeerMapping>)>> = Mutex::new(Vec::new());

/// What a registration needs of its communicator.
pub(crate) struct Registration<'a> {
    pub(crate) store: &'a dyn Store,
    pub(crate) prefix: &'a str,
    pub(crate) rank: usize,
    pub(crate) world: usize,
    pub(crate) device: usize,
    pub(crate) memory: &'a SymmetricMemory,
    pub(crate) timeout: Duration,
}

impl GraphInputs {
    /// Begins a registering capture on the stream whose raw handle is
    /// `stream` (refused while another one captures).
    pub(crate) fn begin(&mut self, stream: usize) -> Result<()> {
        if self.capturing.is_some() {
            return Err(Error::InvalidArgument(
                "capture_registered: expected no other registering capture on this communicator, found one under way"
                    .into(),
            ));
        }
        self.capturing = Some(stream);
        self.taken_at_begin = self.taken;
        self.pending.clear();
        Ok(())
    }

    /// Allocates the table on GPU `device`, the first time (before the
    /// capture: allocating during one is not allowed).
    pub(crate) fn ensure_table(&mut self, device: usize) -> Result<()> {
        if self.table.is_none() {
            let table = DeviceBuffer::zeros(device, GRAPH_INPUT_SLOTS * SLOT_BYTES)?;
            self.base = Some(table.ptr().addr());
            self.table = Some(table);
        }
        Ok(())
    }

    /// During a registering capture, for a call queued on its stream
    /// (`stream`, a raw handle), the device address of a new slot for the
    /// call (`what`) on the `bytes` at `addr`; `None` otherwise or when
    /// every slot is taken (every rank captures the same calls and gives
    /// back the slots of failed captures, so all of them run out at the
    /// same call).
    pub(crate) fn take(
        &mut self,
        addr: u64,
        bytes: usize,
        what: String,
        stream: usize,
    ) -> Option<u64> {
        let base = self.base?;
        if self.capturing != Some(stream) || self.taken == GRAPH_INPUT_SLOTS {
            return None;
        }
        let slot = self.taken;
        self.taken += 1;
        self.pending.push(Captured {
            slot,
            addr,
            bytes,
            what,
        });
        Some(base + (slot * SLOT_BYTES) as u64)
    }

    /// Ends the registering capture: the calls it captured.
    pub(crate) fn end(&mut self) -> Vec<Captured> {
        self.capturing = None;
        std::mem::take(&mut self.pending)
    }

    /// Gives back the slots of the last capture, which failed (its graph
    /// is gone: nothing reads them).
    pub(crate) fn give_back(&mut self) {
        self.taken = self.taken_at_begin;
    }

    /// The number of the next registration (its store keys).
    fn next_generation(&mut self) -> u64 {
        self.generation += 1;
        self.generation - 1
    }

    /// Registers `captured` with every rank (each calls this with its own
    /// calls of the same capture), or, with `failed`, tells them this rank
    /// could not capture. Two rounds through the store: every rank posts
    /// its calls; then, once it has written its slots (or failed to),
    /// every rank posts whether it did, so that no rank keeps a graph
    /// whose peers could not register theirs. `inputs` is locked only to
    /// write the slots, not while the store waits for the peers. Returns
    /// how many calls were registered.
    pub(crate) fn register(
        inputs: &Mutex<GraphInputs>,
        r: &Registration<'_>,
        captured: &[Captured],
        failed: Option<&Error>,
    ) -> Result<usize> {
        let lock = || inputs.lock().unwrap_or_else(PoisonError::into_inner);
        let generation = lock().next_generation();
        // Whether every rank shares this rank's CUDA context (threads of
        // one process on one GPU): only then can a tensor that cannot be
        // exported be reached at its address (pool memory follows no
        // peer access between GPUs).
        let one_context =
            r.memory.ranks_per_gpu() == r.world && (0..r.world).all(|p| r.memory.same_process(p));
        let mine: Vec<Posted> = captured
            .iter()
            .map(|c| Posted {
                bytes: c.bytes,
                what: c.what.clone(),
                addr: c.addr,
                reach: match export_address(r.device, DevicePtr(c.addr)) {
                    Ok((handle, offset)) => Reach::Ipc(handle, offset),
                    Err(_) if one_context => Reach::Direct,
                    Err(e) => {
                        tracing::debug!(rank = r.rank, %e, "a captured tensor cannot be shared: its calls stage through the graph region");
                        Reach::Staged
                    }
                },
            })
            .collect();
        let text = match failed {
            Some(e) => format!("failed {e}"),
            None => encode(&mine),
        };
        let round = Rounds {
            store: r.store,
            prefix: format!("{}/graph/{generation}", r.prefix),
            rank: r.rank,
            world: r.world,
            timeout: r.timeout,
        };
        round.exchange(&text, |answers| match failed {
            Some(e) => Err(Error::GraphRegistration {
                rank: r.rank,
                reason: format!("this rank could not capture: {e}"),
            }),
            None => lock().write_slots(r, captured, &mine, answers),
        })?;
        Ok(captured.len())
    }

    /// Checks every rank's posted calls (`answers`) against this rank's
    /// (`mine`, of `captured`) and writes their slots.
    fn write_slots(
        &mut self,
        r: &Registration<'_>,
        captured: &[Captured],
        mine: &[Posted],
        answers: &[Vec<u8>],
    ) -> Result<()> {
        let mut every: Vec<Vec<Posted>> = Vec::with_capacity(r.world);
        for (p, answer) in answers.iter().enumerate() {
            let posted = if p == r.rank {
                mine.to_vec()
            } else {
                decode(p, answer).map_err(|e| match e {
                    Error::GraphRegistration { reason, .. } => Error::GraphRegistration {
                        rank: r.rank,
                        reason,
                    },
                    other => other,
                })?
            };
            if posted.len() != mine.len() {
                return Err(Error::GraphRegistration {
                    rank: r.rank,
                    reason: format!(
                        "expected every rank to have captured {} one-shot or two-shot calls (as this rank did), found {} on rank {p}",
                        mine.len(),
                        posted.len()
                    ),
                });
            }
            for (i, (theirs, ours)) in posted.iter().zip(mine).enumerate() {
                if (theirs.bytes, &theirs.what) != (ours.bytes, &ours.what) {
                    return Err(Error::GraphRegistration {
                        rank: r.rank,
                        reason: format!(
                            "registered call {i}: expected {} bytes, {} on every rank (as on this one), found {} bytes, {} on rank {p}",
                            ours.bytes, ours.what, theirs.bytes, theirs.what
                        ),
                    });
                }
            }
            every.push(posted);
        }
        let graph_regions = r.memory.regions(GRAPH_REGION);
        let mut words = vec![0u64; captured.len() * REG_WORDS];
        for (i, c) in captured.iter().enumerate() {
            let slot = &mut words[i * REG_WORDS..(i + 1) * REG_WORDS];
            let mut flags = REG_REGISTERED;
            for (p, posted) in every.iter().enumerate() {
                let call = &posted[i];
                slot[p] = if call.reach == Reach::Staged {
                    graph_regions[p]
                } else if p == r.rank || r.memory.same_process(p) {
                    call.addr
                } else if let Reach::Ipc(handle, offset) = &call.reach {
                    self.open(p, handle, r.device)? + offset
                } else {
                    return Err(Error::PeerProtocol {
                        peer: p,
                        expected: "an IPC handle for a tensor of another process".into(),
                        found: "none (it could only be reached in its own process)".into(),
                    });
                };
            }
            if every[r.rank][i].reach == Reach::Staged {
                flags |= REG_STAGED;
            }
            if slot[..r.world].iter().all(|a| a % 16 == 0) && c.addr % 16 == 0 {
                flags |= REG_ALIGNED;
            }
            slot[PEER_MAX] = flags;
        }
        if let (Some(first), Some(table)) = (captured.first(), &self.table) {
            // Consecutive slots (one registering capture at a time).
            let bytes: Vec<u8> = words.iter().flat_map(|w| w.to_ne_bytes()).collect();
            let at = table.ptr().offset(first.slot * SLOT_BYTES);
            runtime::copy_htod_sync(table.context(), at, &bytes)?;
        }
        Ok(())
    }

    /// Peer `peer`'s allocation `handle`, mapped on `device` (once per
    /// process).
    fn open(&mut self, peer: usize, handle: &IpcHandle, device: usize) -> Result<u64> {
        let mut opened = OPENED.lock().unwrap_or_else(PoisonError::into_inner);
        opened.retain(|(_, _, m)| m.strong_count() > 0);
        let found = opened
            .iter()
            .filter(|(d, h, _)| *d == device && h == handle)
            .find_map(|(_, _, m)| m.upgrade());
        let mapping = match found {
            Some(m) => m,
            None => {
                let m = Arc::new(PeerMapping::open(device, handle).map_err(|e| {
                    Error::PeerProtocol {
                        peer,
                        expected: "the IPC handle of a captured tensor this process can open"
                            .into(),
                        found: format!("one that failed to open: {e}"),
                    }
                })?);
                opened.push((device, *handle, Arc::downgrade(&m)));
                m
            }
        };
        drop(opened);
        let addr = mapping.ptr().addr();
        if !self.opened.iter().any(|m| Arc::ptr_eq(m, &mapping)) {
            self.opened.push(mapping);
        }
        Ok(addr)
    }

    /// What must outlive every kernel of the communicator: given to the
    /// caller to drop where freeing cannot wait on a peer.
    pub(crate) fn take_memory(&mut self) -> (Option<DeviceBuffer>, Vec<Arc<PeerMapping>>) {
        self.base = None;
        (self.table.take(), std::mem::take(&mut self.opened))
    }
}

/// The two store rounds of one registration.
struct Rounds<'a> {
    store: &'a dyn Store,
    /// This registration's keys.
    prefix: String,
    rank: usize,
    world: usize,
    timeout: Duration,
}

impl Rounds<'_> {
    fn keys(&self, round: &str) -> Vec<String> {
        (0..self.world)
            .map(|p| format!("{}/{round}/{p}", self.prefix))
            .collect()
    }

    /// Posts `mine` and gives every rank's posts to `write`; then posts
    /// whether `write` succeeded and fails unless every rank's did, so
    /// that no rank keeps a graph whose peers could not register theirs.
    /// Every rank posts both rounds whatever happens to it between them
    /// (only a store that fails can leave the peers waiting, for the
    /// timeout).
    fn exchange(&self, mine: &str, write: impl FnOnce(&[Vec<u8>]) -> Result<()>) -> Result<()> {
        let calls = self.keys("calls");
        self.store.set(&calls[self.rank], mine.as_bytes())?;
        let refs: Vec<&str> = calls.iter().map(String::as_str).collect();
        let written = self
            .store
            .multi_get_timeout(&refs, self.timeout)
            .and_then(|answers| write(&answers));
        let verdict = match &written {
            Ok(()) => "ok".to_string(),
            Err(e) => format!("failed {e}"),
        };
        let done = self.keys("done");
        self.store.set(&done[self.rank], verdict.as_bytes())?;
        written?;
        let refs: Vec<&str> = done.iter().map(String::as_str).collect();
        let verdicts = self.store.multi_get_timeout(&refs, self.timeout)?;
        for (p, v) in verdicts.iter().enumerate() {
            if let Some(reason) = String::from_utf8_lossy(v).strip_prefix("failed ") {
                return Err(Error::GraphRegistration {
                    rank: self.rank,
                    reason: format!("rank {p} could not register its tensors: {reason}"),
                });
            }
        }
        Ok(())
    }
}

/// A rank's captured calls as it posts them: `ok <n>`, then a line a call,
/// `<bytes> <what> <addr> ipc <handle> <offset>`, `<bytes> <what> <addr>
/// direct` or `<bytes> <what> <addr> staged`.
fn encode(calls: &[Posted]) -> String {
    let mut out = format!("ok {}", calls.len());
    for c in calls {
        out.push('\n');
        out.push_str(&format!("{} {} {} ", c.bytes, c.what, c.addr));
        match &c.reach {
            Reach::Ipc(h, offset) => out.push_str(&format!("ipc {} {offset}", to_hex(&h.0))),
            Reach::Direct => out.push_str("direct"),
            Reach::Staged => out.push_str("staged"),
        }
    }
    out
}

/// Rank `peer`'s posted calls; its failure to capture as
/// [`Error::GraphRegistration`], anything unreadable as
/// [`Error::PeerProtocol`].
fn decode(peer: usize, raw: &[u8]) -> Result<Vec<Posted>> {
    let bad = |what: &str| {
        Error::PeerProtocol {
        peer,
        expected: "`ok <n>` and a line `<bytes> <what> <addr> ipc <handle> <offset>`, `... direct` or `... staged` per captured call".into(),
        found: format!("{what} in {:?}", String::from_utf8_lossy(raw)),
    }
    };
    let text = std::str::from_utf8(raw).map_err(|_| bad("bytes that are not UTF-8"))?;
    if let Some(reason) = text.strip_prefix("failed ") {
        return Err(Error::GraphRegistration {
            rank: peer,
            reason: format!("rank {peer} could not capture: {reason}"),
        });
    }
    let mut lines = text.lines();
    let count: usize = lines
        .next()
        .and_then(|l| l.strip_prefix("ok "))
        .and_then(|n| n.parse().ok())
        .ok_or_else(|| bad("no `ok <n>` line"))?;
    let calls: Vec<Posted> = lines
        .map(|line| {
            let w: Vec<&str> = line.split(' ').collect();
            let bytes = w.first().and_then(|v| v.parse().ok());
            let what = w.get(1).filter(|v| !v.is_empty()).map(|v| v.to_string());
            let addr = w.get(2).and_then(|v| v.parse().ok());
            let reach = match w.get(3..) {
                Some(["ipc", handle, offset]) => unhex::<64>(handle)
                    .zip(offset.parse().ok())
                    .map(|(h, o)| Reach::Ipc(IpcHandle(h), o)),
                Some(["direct"]) => Some(Reach::Direct),
                Some(["staged"]) => Some(Reach::Staged),
                _ => None,
            };
            match (bytes, what, addr, reach) {
                (Some(bytes), Some(what), Some(addr), Some(reach)) => Ok(Posted {
                    bytes,
                    what,
                    addr,
                    reach,
                }),
                _ => Err(bad(&format!("the line {line:?}"))),
            }
        })
        .collect::<Result<_>>()?;
    if calls.len() != count {
        return Err(bad(&format!("{} call lines for `ok {count}`", calls.len())));
    }
    Ok(calls)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn calls() -> Vec<Posted> {
        vec![
            Posted {
                bytes: 4096,
                what: "bf16/Sum".into(),
                addr: 0x7f00_0000_1000,
                reach: Reach::Ipc(IpcHandle([7; 64]), 512),
            },
            Posted {
                bytes: 12,
                what: "f32/Max".into(),
                addr: 0x7f00_0000_2004,
                reach: Reach::Staged,
            },
            Posted {
                bytes: 8,
                what: "f16/Avg".into(),
                addr: 16,
                reach: Reach::Direct,
            },
        ]
    }

    /// Runs `exchange` on `world` threads over one store; rank `bad`'s
    /// write fails.
    fn exchange_with_one_failing_write(world: usize, bad: usize) -> Vec<Result<()>> {
        let store = crate::store::HashStore::new();
        std::thread::scope(|s| {
            let handles: Vec<_> = (0..world)
                .map(|rank| {
                    let store = &store;
                    s.spawn(move || {
                        let rounds = Rounds {
                            store,
                            prefix: "t/graph/0".into(),
                            rank,
                            world,
                            timeout: Duration::from_secs(20),
                        };
                        rounds.exchange(&format!("ok {rank}"), |answers| {
                            let seen: Vec<String> = answers
                                .iter()
                                .map(|a| String::from_utf8_lossy(a).into_owned())
                                .collect();
                            assert_eq!(
                                seen,
                                (0..world).map(|p| format!("ok {p}")).collect::<Vec<_>>()
                            );
                            if rank == bad {
                                Err(Error::InvalidArgument(
                                    "the slots could not be written".into(),
                                ))
                            } else {
                                Ok(())
                            }
                        })
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        })
    }

    #[test]
    fn a_rank_that_fails_after_the_first_round_fails_every_rank_by_name_without_waiting() {
        let started = std::time::Instant::now();
        let results = exchange_with_one_failing_write(3, 2);
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "{:?}",
            started.elapsed()
        );
        for (rank, r) in results.iter().enumerate() {
            let e = r.as_ref().unwrap_err().to_string();
            if rank == 2 {
                assert!(e.contains("the slots could not be written"), "{e}");
            } else {
                assert!(
                    e.contains("rank 2 could not register its tensors")
                        && e.contains("the slots could not be written"),
                    "rank {rank}: {e}"
                );
            }
        }
        // And when every write succeeds, every rank does.
        let results = exchange_with_one_failing_write(3, 99);
        assert!(results.iter().all(Result::is_ok), "{results:?}");
    }

    #[test]
    fn posted_calls_read_back_as_they_were() {
        assert_eq!(decode(1, encode(&calls()).as_bytes()).unwrap(), calls());
        assert_eq!(decode(1, encode(&[]).as_bytes()).unwrap(), vec![]);
    }

    #[test]
    fn a_peer_that_could_not_capture_is_named_and_garbage_is_refused() {
        let e = decode(3, b"failed the stream was not capturing").unwrap_err();
        match e {
            Error::GraphRegistration { rank, reason } => {
                assert_eq!(rank, 3);
                assert!(
                    reason.contains("rank 3 could not capture: the stream"),
                    "{reason}"
                );
            }
            other => panic!("{other}"),
        }
        let mut text = encode(&calls());
        text = text.replace("ok 3", "ok 4");
        for raw in [
            text.as_bytes().to_vec(),
            b"ok 1\n12 f32/Sum 34 ipc nothex 5".to_vec(),
            b"ok 1\n12 f32/Sum 34 teleport".to_vec(),
            b"ok 1\n12 34 staged".to_vec(),
            b"ok x".to_vec(),
            b"\xff\xfe".to_vec(),
            b"".to_vec(),
        ] {
            let e = decode(2, &raw).unwrap_err();
            assert!(
                matches!(&e, Error::PeerProtocol { peer: 2, .. }),
                "{:?}: {e}",
                String::from_utf8_lossy(&raw)
            );
            assert!(e.to_string().contains("<bytes> <what> <addr>"), "{e}");
        }
    }

    #[test]
    fn slots_are_taken_only_on_the_capturing_stream_until_the_table_is_full() {
        const S: usize = 0xabc; // the capturing stream's handle
        let w = || "f32/Sum".to_string();
        // No table yet (`ensure_table` allocates it on a GPU): nothing.
        let mut g = GraphInputs::default();
        g.begin(S).unwrap();
        assert_eq!(g.take(0x100, 4, w(), S), None);
        g.end();
        g.base = Some(0x10_0000);
        assert_eq!(g.take(0x100, 4, w(), S), None, "outside a capture");
        g.begin(S).unwrap();
        let e = g.begin(S).unwrap_err().to_string();
        assert!(e.contains("found one under way"), "{e}");
        // Calls queued on another stream take nothing.
        assert_eq!(g.take(0x100, 4, w(), 0xdef), None);
        assert_eq!(g.take(0x100, 4, w(), S), Some(0x10_0000));
        assert_eq!(
            g.take(0x200, 8, "bf16/Avg".into(), S),
            Some(0x10_0000 + SLOT_BYTES as u64)
        );
        let first = g.end();
        assert_eq!(
            first,
            vec![
                Captured {
                    slot: 0,
                    addr: 0x100,
                    bytes: 4,
                    what: w(),
                },
                Captured {
                    slot: 1,
                    addr: 0x200,
                    bytes: 8,
                    what: "bf16/Avg".into(),
                },
            ]
        );
        assert!(g.capturing.is_none());
        // A failed capture gives its slots back.
        g.begin(S).unwrap();
        assert_eq!(
            g.take(0x900, 4, w(), S),
            Some(0x10_0000 + 2 * SLOT_BYTES as u64)
        );
        g.end();
        g.give_back();
        // A second capture goes on after the first one's slots; the last
        // slot is the table's end, and then every later call is refused
        // (on every rank at the same call: they capture the same calls).
        g.begin(S).unwrap();
        for k in 2..GRAPH_INPUT_SLOTS {
            assert_eq!(
                g.take(k as u64, 4, w(), S),
                Some(0x10_0000 + (k * SLOT_BYTES) as u64)
            );
        }
        assert_eq!(g.take(0x300, 4, w(), S), None);
        let second = g.end();
        assert_eq!(second.len(), GRAPH_INPUT_SLOTS - 2);
        assert_eq!(second[0].slot, 2);
    }
}
