//! Failure reports: how the root cause of a failed collective reaches every
//! rank of the group, not only the ranks that saw it.
//!
//! A rank whose collective fails (a fingerprint mismatch, a peer that closed
//! its connection or died, a peer that did not respond in time, ranks
//! missing from a monitored barrier) posts a [`FailureReport`] to the
//! group's store under `{key_prefix}/failure/{seq}` with `compare_set`, so
//! the first report of a sequence number is the one kept, and only then
//! closes its connections. A rank whose own failure is a closed or silent
//! peer may just be seeing such a close: it posts the same way, and when
//! the key already holds another rank's report (one naming a different
//! peer, or a mismatch) it reports that root cause instead, seen from its
//! side (its own fingerprint as `mine`).
//!
//! No rank has to wait for the key: a report is in the store before the
//! connections whose closing causes the secondary failures are closed, so a
//! rank that fails because of it finds it on its first look. Only failures
//! touch the store (collectives that succeed never do), and every store
//! call is bounded by [`STORE_PATIENCE`]: when the store is slow or gone,
//! a rank keeps its own error.
//!
//! Encoding (little-endian), a few dozen bytes: version, cause tag, op
//! code, 0, reporting rank (u32), sequence number (u64), then per cause:
//! mismatch: peer (u32), both sides (each a 32-byte fingerprint, or a text
//! for mismatches found by an algorithm, such as all_to_all's split sizes);
//! closed peer: peer (u32), reason (u16 length + UTF-8, at most 256 bytes);
//! silent peer: peer (u32), timeout in ms (u64); missing ranks: timeout in
//! ms (u64), count (u32), ranks (u32 each).
//!
//! Keys are per group (its key prefix) and per sequence number; a group is
//! never set up twice under one prefix of one store (its transport setup
//! keys would clash too), so a report never outlives its group's meaning.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use super::backend::is_aborted;
use super::fingerprint::{CollectiveKind, Fingerprint, FINGERPRINT_LEN};
use crate::store::tcp::reply_grace::background_on_this_thread;
use crate::store::{read_if_present, Store};
use crate::Error;

/// How long a failing rank waits on the store to post or read a report
/// before it gives up and keeps its own error.
pub(crate) const STORE_PATIENCE: Duration = Duration::from_secs(2);

const VERSION: u8 = 1;
const MAX_TEXT: usize = 256;

/// One side of a mismatch: an encoded fingerprint, or an algorithm's text.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Side {
    Fingerprint([u8; FINGERPRINT_LEN]),
    Text(String),
}

impl Side {
    fn describe(&self) -> String {
        match self {
            Side::Fingerprint(bytes) => match Fingerprint::decode(bytes) {
                Some(fp) => fp.to_string(),
                None => format!("unrecognised fingerprint bytes {bytes:?}"),
            },
            Side::Text(text) => text.clone(),
        }
    }
}

/// Why a collective failed, as the reporting rank saw it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Cause {
    /// The reporter (`mine`) and `peer` (`theirs`) disagreed on the collective.
    Mismatch {
        peer: usize,
        mine: Side,
        theirs: Side,
    },
    /// `peer` closed its connection or died.
    PeerClosed { peer: usize, reason: String },
    /// `peer` did not respond within `timeout`.
    PeerTimeout { peer: usize, timeout: Duration },
    /// A monitored barrier's missing ranks.
    RanksMissing {
        missing: Vec<usize>,
        timeout: Duration,
    },
}

/// The root cause of a failed collective, as posted to the group's store.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct FailureReport {
    pub(crate) op: CollectiveKind,
    pub(crate) seq: u64,
    pub(crate) reporter: usize,
    pub(crate) cause: Cause,
}

/// The store key of collective `seq`'s report in the group at `key_prefix`.
pub(crate) fn failure_key(key_prefix: &str, seq: u64) -> String {
    format!("{key_prefix}/failure/{seq}")
}

/// The store key where the group at `key_prefix` says which collective
/// failed first, for ranks whose own collective (a later one) failed only
/// because of it.
pub(crate) fn failed_seq_key(key_prefix: &str) -> String {
    format!("{key_prefix}/failure/first")
}

fn clip(text: &str) -> String {
    let mut end = text.len().min(MAX_TEXT);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    text[..end].to_string()
}

fn put_u32(out: &mut Vec<u8>, v: usize) {
    out.extend_from_slice(&u32::try_from(v).unwrap_or(u32::MAX).to_le_bytes());
}

fn put_millis(out: &mut Vec<u8>, d: Duration) {
    out.extend_from_slice(
        &u64::try_from(d.as_millis())
            .unwrap_or(u64::MAX)
            .to_le_bytes(),
    );
}

fn put_text(out: &mut Vec<u8>, text: &str) {
    let text = clip(text);
    out.extend_from_slice(&(text.len() as u16).to_le_bytes());
    out.extend_from_slice(text.as_bytes());
}

fn put_side(out: &mut Vec<u8>, side: &Side) {
    match side {
        Side::Fingerprint(bytes) => {
            out.push(0);
            out.extend_from_slice(bytes);
        }
        Side::Text(text) => {
            out.push(1);
            put_text(out, text);
        }
    }
}

/// Reads a report's fields in order; every read is `None` past the end.
struct Reader<'a> {
    bytes: &'a [u8],
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        if self.bytes.len() < n {
            return None;
        }
        let (head, rest) = self.bytes.split_at(n);
        self.bytes = rest;
        Some(head)
    }

    fn u8(&mut self) -> Option<u8> {
        self.take(1).map(|b| b[0])
    }

    fn u32(&mut self) -> Option<usize> {
        let b = self.take(4)?;
        Some(u32::from_le_bytes([b[0], b[1], b[2], b[3]]) as usize)
    }

    fn u64(&mut self) -> Option<u64> {
        let mut b = [0u8; 8];
        b.copy_from_slice(self.take(8)?);
        Some(u64::from_le_bytes(b))
    }

    fn millis(&mut self) -> Option<Duration> {
        self.u64().map(Duration::from_millis)
    }

    fn text(&mut self) -> Option<String> {
        let b = self.take(2)?;
        let len = usize::from(u16::from_le_bytes([b[0], b[1]]));
        String::from_utf8(self.take(len)?.to_vec()).ok()
    }

    fn side(&mut self) -> Option<Side> {
        match self.u8()? {
            0 => {
                let mut fp = [0u8; FINGERPRINT_LEN];
                fp.copy_from_slice(self.take(FINGERPRINT_LEN)?);
                Some(Side::Fingerprint(fp))
            }
            1 => Some(Side::Text(self.text()?)),
            _ => None,
        }
    }
}

impl FailureReport {
    /// The report of `err`, which failed collective `fp` on `rank`;
    /// `mismatched` is the peer and fingerprint bytes that failed this
    /// rank's fingerprint check, if one did. `None` for errors that are not
    /// about the group (nothing worth telling the other ranks).
    pub(crate) fn from_error(
        fp: &Fingerprint,
        rank: usize,
        err: &Error,
        mismatched: Option<(usize, [u8; FINGERPRINT_LEN])>,
    ) -> Option<Self> {
        let cause = match err {
            Error::CollectiveMismatch {
                peer, mine, theirs, ..
            } => match mismatched {
                Some((p, bytes)) if p == *peer => Cause::Mismatch {
                    peer: *peer,
                    mine: Side::Fingerprint(fp.encode()),
                    theirs: Side::Fingerprint(bytes),
                },
                _ => Cause::Mismatch {
                    peer: *peer,
                    mine: Side::Text(mine.clone()),
                    theirs: Side::Text(theirs.clone()),
                },
            },
            Error::PeerClosed { peer, reason, .. } => Cause::PeerClosed {
                peer: *peer,
                reason: reason.clone(),
            },
            Error::PeerIo { peer, source, .. } => Cause::PeerClosed {
                peer: *peer,
                reason: source.to_string(),
            },
            Error::PeerTimeout { peer, timeout, .. } => Cause::PeerTimeout {
                peer: *peer,
                timeout: *timeout,
            },
            Error::RanksMissing { missing, timeout } => Cause::RanksMissing {
                missing: missing.clone(),
                timeout: *timeout,
            },
            _ => return None,
        };
        Some(FailureReport {
            op: fp.kind,
            seq: fp.seq,
            reporter: rank,
            cause,
        })
    }

    pub(crate) fn encode(&self) -> Vec<u8> {
        let tag = match self.cause {
            Cause::Mismatch { .. } => 1,
            Cause::PeerClosed { .. } => 2,
            Cause::PeerTimeout { .. } => 3,
            Cause::RanksMissing { .. } => 4,
        };
        let mut out = vec![VERSION, tag, self.op as u8, 0];
        put_u32(&mut out, self.reporter);
        out.extend_from_slice(&self.seq.to_le_bytes());
        match &self.cause {
            Cause::Mismatch { peer, mine, theirs } => {
                put_u32(&mut out, *peer);
                put_side(&mut out, mine);
                put_side(&mut out, theirs);
            }
            Cause::PeerClosed { peer, reason } => {
                put_u32(&mut out, *peer);
                put_text(&mut out, reason);
            }
            Cause::PeerTimeout { peer, timeout } => {
                put_u32(&mut out, *peer);
                put_millis(&mut out, *timeout);
            }
            Cause::RanksMissing { missing, timeout } => {
                put_millis(&mut out, *timeout);
                put_u32(&mut out, missing.len());
                for &r in missing {
                    put_u32(&mut out, r);
                }
            }
        }
        out
    }

    /// Decodes a stored report; `None` when the bytes are not one.
    pub(crate) fn decode(bytes: &[u8]) -> Option<Self> {
        let mut r = Reader { bytes };
        let (version, tag, op, pad) = (r.u8()?, r.u8()?, r.u8()?, r.u8()?);
        if version != VERSION || pad != 0 {
            return None;
        }
        let op = CollectiveKind::from_code(op)?;
        let (reporter, seq) = (r.u32()?, r.u64()?);
        let cause = match tag {
            1 => Cause::Mismatch {
                peer: r.u32()?,
                mine: r.side()?,
                theirs: r.side()?,
            },
            2 => Cause::PeerClosed {
                peer: r.u32()?,
                reason: r.text()?,
            },
            3 => Cause::PeerTimeout {
                peer: r.u32()?,
                timeout: r.millis()?,
            },
            4 => {
                let timeout = r.millis()?;
                let n = r.u32()?;
                if n > r.bytes.len() / 4 {
                    return None;
                }
                let missing = (0..n).map(|_| r.u32()).collect::<Option<Vec<_>>>()?;
                Cause::RanksMissing { missing, timeout }
            }
            _ => return None,
        };
        r.bytes.is_empty().then_some(FailureReport {
            op,
            seq,
            reporter,
            cause,
        })
    }

    /// The root cause as rank `rank`, which ran `mine`, reports it: a
    /// mismatch names the rank whose fingerprint differs from `mine`, with
    /// both fingerprints; a closed or silent peer is named as the reporter
    /// found it.
    pub(crate) fn to_error(&self, mine: &Fingerprint, rank: usize) -> Error {
        let reporter = self.reporter;
        let during = format!(
            "{} (sequence number {}), as rank {reporter} found and reported through the store",
            self.op.name(),
            self.seq
        );
        match &self.cause {
            Cause::Mismatch {
                peer,
                mine: theirs_mine,
                theirs,
            } => {
                let (peer, theirs) = match (theirs_mine, theirs) {
                    // This rank agrees with the reporter: the peer is the odd one.
                    (Side::Fingerprint(m), _) if *m == mine.encode() && *peer != rank => {
                        (*peer, theirs.describe())
                    }
                    (Side::Fingerprint(_), _) => (reporter, theirs_mine.describe()),
                    // The reporter found this rank the odd one: name the
                    // reporter and what it ran.
                    (Side::Text(_), _) if *peer == rank => (
                        reporter,
                        format!(
                            "{} (and found this rank running {})",
                            theirs_mine.describe(),
                            theirs.describe()
                        ),
                    ),
                    (Side::Text(_), _) => (
                        *peer,
                        format!(
                            "{}, as rank {reporter} found (it ran {})",
                            theirs.describe(),
                            theirs_mine.describe()
                        ),
                    ),
                };
                Error::CollectiveMismatch {
                    rank,
                    peer,
                    mine: mine.to_string(),
                    theirs,
                }
            }
            Cause::PeerClosed { peer, reason } => Error::PeerClosed {
                peer: *peer,
                during,
                reason: reason.clone(),
            },
            Cause::PeerTimeout { peer, timeout } => Error::PeerTimeout {
                peer: *peer,
                during,
                timeout: *timeout,
            },
            Cause::RanksMissing { missing, timeout } => Error::RanksMissing {
                missing: missing.clone(),
                timeout: *timeout,
            },
        }
    }

    /// True when this report names the same closed or silent peer as
    /// `err` (then `err` is as good a root cause as the report).
    fn same_peer_as(&self, err: &Error) -> bool {
        let named = match &self.cause {
            Cause::PeerClosed { peer, .. } | Cause::PeerTimeout { peer, .. } => *peer,
            _ => return false,
        };
        matches!(err,
            Error::PeerClosed { peer, .. } | Error::PeerTimeout { peer, .. } | Error::PeerIo { peer, .. }
            if *peer == named)
    }
}

/// True for errors that a rank also sees when another rank gave up and
/// closed its connections (so the root cause may be elsewhere).
fn may_be_secondary(err: &Error) -> bool {
    matches!(
        err,
        Error::PeerClosed { .. }
            | Error::PeerTimeout { .. }
            | Error::PeerIo { .. }
            | Error::LinkShutDownHere { .. }
    )
}

/// Why a bounded store call (see [`bounded`]) gave no answer.
enum Unanswered {
    /// The store failed the call: with [`Error::StoreConnectionLost`], its
    /// host is gone (or, for [`bounded`]'s calls, did not answer within
    /// [`STORE_PATIENCE`], which the call's client then says so).
    Failed(Error),
    /// No answer within the wait.
    Silent,
    /// No thread to ask it on.
    NoThread,
}

/// `f` (store calls) on a helper thread, waited on for at most
/// [`STORE_PATIENCE`]. `what` names the calls in the debug log.
fn bounded<T: Send + 'static>(
    what: &str,
    f: impl FnOnce() -> crate::Result<T> + Send + 'static,
) -> Result<T, Unanswered> {
    bounded_for(what, STORE_PATIENCE, f)
}

/// [`bounded`], waited on for at most `wait` (at most [`STORE_PATIENCE`]).
/// The call itself keeps the store client's background grace of
/// [`STORE_PATIENCE`] for each of its steps (see
/// `store/tcp/reply_grace.rs`), so a shorter wait gives up on a slow store
/// (`Silent`) before the client could take its slowness for a lost
/// connection; the helper thread then ends within that grace.
fn bounded_for<T: Send + 'static>(
    what: &str,
    wait: Duration,
    f: impl FnOnce() -> crate::Result<T> + Send + 'static,
) -> Result<T, Unanswered> {
    let (tx, rx) = mpsc::channel();
    let spawned = std::thread::Builder::new()
        .name("tensorcomm-failure-report".into())
        .spawn(move || {
            let _quick = background_on_this_thread(STORE_PATIENCE);
            let _ = tx.send(f());
        });
    if spawned.is_err() {
        return Err(Unanswered::NoThread);
    }
    match rx.recv_timeout(wait) {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e)) => {
            tracing::debug!("could not {what}: {e}");
            Err(Unanswered::Failed(e))
        }
        Err(_) => {
            tracing::debug!("the store did not answer ({what}) within {wait:?}");
            Err(Unanswered::Silent)
        }
    }
}

/// How long a group set-up that lost a peer waits for the store to say
/// whether it is gone too. A live store answers in well under a
/// millisecond on its host; one whose host process died fails at once
/// (its connection reset or refused), as long as the host machine's
/// kernel still answers.
const SET_UP_PROBE: Duration = Duration::from_millis(250);

/// The peer `err` lost and what this rank was doing, when `err` is a
/// peer gone or silent.
fn lost_peer(err: &Error) -> Option<(usize, String)> {
    match err {
        Error::PeerClosed { peer, during, .. }
        | Error::PeerTimeout { peer, during, .. }
        | Error::PeerIo { peer, during, .. } => Some((*peer, during.clone())),
        _ => None,
    }
}

/// The error rank `rank`'s failed group set-up reports for `err`, where
/// rank `host` hosts the store. When `err` is a peer other than `host`
/// gone or silent, `rank` is not `host`, and one call to the store finds
/// its connection lost within [`SET_UP_PROBE`], the store's host is gone:
/// it is named, with the peer's loss in the reason. (A rank that finds the
/// store gone leaves at once, and its connections close on the ranks still
/// setting up, which would otherwise name that rank, not the host.) A
/// store that answers, or does not within the probe (slow, or its host
/// stopped), leaves `err` as it is.
pub(crate) fn set_up_error(store: &Arc<dyn Store>, rank: usize, host: usize, err: Error) -> Error {
    let Some((peer, during)) = lost_peer(&err) else {
        return err;
    };
    if peer == host || rank == host {
        return err;
    }
    let store = store.clone();
    let probe = bounded_for(
        "see whether the store is gone after a set-up lost a peer",
        SET_UP_PROBE,
        move || store.num_keys(),
    );
    match probe {
        Err(Unanswered::Failed(Error::StoreConnectionLost { addr, reason })) => {
            host_and_store_gone(host, peer, during, &format!("{addr}: {reason}"), &err)
        }
        _ => err,
    }
}

/// `host`, whose store is gone (`lost` says why), named for `err`, a loss
/// of `peer` during `during`.
fn host_and_store_gone(host: usize, peer: usize, during: String, lost: &str, err: &Error) -> Error {
    Error::PeerClosed {
        peer: host,
        during,
        reason: format!(
            "the store it hosts is gone ({lost}); this rank lost rank {peer} too: {err}"
        ),
    }
}

/// `store.compare_set(key, "", value)`, bounded (see [`bounded`]).
fn post_first(store: &Arc<dyn Store>, key: String, value: Vec<u8>) -> Result<Vec<u8>, Unanswered> {
    let store = store.clone();
    bounded("post a failure report", move || {
        store.compare_set(&key, b"", &value)
    })
}

/// Where a group's failed collectives leave their reports: its store and
/// key prefix.
///
/// Once a store call of the failure path fails or runs out of patience,
/// the store counts as unreachable and the failure path does not call it
/// again: a store that is gone (its host died, often the very rank whose
/// death failed the collective) would have each later call dial it again
/// until the store's timeout, while the rank's links stay open and its
/// peers wait on it.
pub(crate) struct FailureBoard {
    store: Arc<dyn Store>,
    key_prefix: String,
    unreachable: AtomicBool,
    /// The rank of the group whose process hosts the store, if one does.
    store_host: OnceLock<usize>,
    /// Why the store's connection was lost, once a call found it so.
    lost: OnceLock<String>,
    /// Set once a call found the store silent: connected, no answer
    /// within [`STORE_PATIENCE`] (its host stopped or hung).
    silent: AtomicBool,
    /// The first mismatch this rank settled itself, kept here too: a call
    /// that this rank's own abort failed tells it when the store cannot
    /// (slow or gone).
    own_first: OnceLock<FailureReport>,
}

/// NCCL failures that name no rank and often come from another rank's
/// doing: system and remote errors (not, say, invalid usage or memory).
fn names_no_rank_and_may_be_a_peers(err: &Error) -> bool {
    matches!(err, Error::Nccl { code, .. } if code == "ncclSystemError" || code == "ncclRemoteError")
}

/// How long a rank whose device backend failed without naming a rank
/// waits for another rank to post the cause (on four H200s a rank of a
/// mismatched NCCL call failed 1 ms before its peer posted the mismatch,
/// and 0.5 s before another did).
const SECONDARY_PATIENCE: Duration = Duration::from_secs(2);

impl FailureBoard {
    pub(crate) fn new(store: Arc<dyn Store>, key_prefix: &str) -> Self {
        FailureBoard {
            store,
            key_prefix: key_prefix.into(),
            unreachable: AtomicBool::new(false),
            store_host: OnceLock::new(),
            lost: OnceLock::new(),
            silent: AtomicBool::new(false),
            own_first: OnceLock::new(),
        }
    }

    /// Says that rank `rank` of the group hosts the store (`env://` and
    /// `tcp://` groups: rank 0), so that a store found gone names it.
    pub(crate) fn set_store_host(&self, rank: usize) {
        let _ = self.store_host.set(rank);
    }

    /// Posts the report of `err` (collective `fp` failed on `rank`; see
    /// [`FailureReport::from_error`] for `mismatched`) unless one is there
    /// already, and returns the error this rank reports: its own, or the
    /// root cause another rank posted first when its own is a closed or
    /// silent peer that the report does not name. Call it before closing
    /// this rank's connections.
    pub(crate) fn settle(
        &self,
        fp: &Fingerprint,
        rank: usize,
        err: Error,
        mismatched: Option<(usize, [u8; FINGERPRINT_LEN])>,
    ) -> Error {
        if crate::process_exit::exiting() {
            // This process closed its own connections on its way out: the
            // peer this call lost is not the cause, and the store this
            // process keeps serving must not say it is.
            return err;
        }
        let Some(report) = FailureReport::from_error(fp, rank, &err, mismatched) else {
            // A device backend aborted by this group's own failure handling
            // (its stall monitor found a mismatch while the call was stuck
            // queuing, and posted it) fails the call with the abort: the
            // posted cause is the one to tell. A backend's own failure
            // that names no rank (NCCL's "unhandled system error" when a
            // peer ran another collective) is most often another rank's
            // doing, which that rank is about to post: it is waited for a
            // little.
            //
            // A link this rank's own side shut down (its abort after a
            // failure, or its sockets shut under it) is no peer's doing
            // either: nothing is posted, and the cause another rank (or
            // this one, before its abort) settled for this collective, if
            // any, is the one to tell. An earlier collective's cause is
            // `earlier_cause`'s, told with that collective's fingerprint.
            if matches!(err, Error::LinkShutDownHere { .. }) {
                if let Some(first) = self.posted_up_to(fp.seq).filter(|f| f.seq == fp.seq) {
                    return first.to_error(fp, rank);
                }
                if let Some(own) = self.own_first.get().filter(|own| own.seq == fp.seq) {
                    return own.to_error(fp, rank);
                }
                return err;
            }
            if is_aborted(&err) {
                if let Some(first) = self.posted_up_to(fp.seq) {
                    return first.to_error(fp, rank);
                }
                // The store did not say: the cause this rank settled itself
                // (its stall monitor's mismatch, say), if it covers `fp`.
                if let Some(own) = self.own_first.get().filter(|own| own.seq <= fp.seq) {
                    return own.to_error(fp, rank);
                }
                return err;
            }
            if !names_no_rank_and_may_be_a_peers(&err) {
                return err;
            }
            let deadline = Instant::now() + SECONDARY_PATIENCE;
            loop {
                match self.posted_up_to(fp.seq) {
                    Some(first) if first.seq == fp.seq => {
                        tracing::debug!(
                            seq = fp.seq,
                            "reporting the cause rank {} posted instead of: {err}",
                            first.reporter
                        );
                        return first.to_error(fp, rank);
                    }
                    // An earlier collective failed: not this one's cause
                    // to tell (and waiting would not change that).
                    Some(_) => return err,
                    None if Instant::now() >= deadline => return err,
                    None => std::thread::sleep(Duration::from_millis(50)),
                }
            }
        };
        let own_earlier = self.own_first.get().cloned();
        if matches!(report.cause, Cause::Mismatch { .. }) {
            // Only a mismatch this rank found is kept: a lost link is
            // often another's doing, told as the store has it.
            let _ = self.own_first.set(report.clone());
        }
        let encoded = report.encode();
        let key = failure_key(&self.key_prefix, fp.seq);
        let Some(stored) = self.reachable(|store| post_first(store, key, encoded.clone())) else {
            // A lost link after this rank settled a cause itself (its stall
            // monitor's mismatch, whose abort closed the links): that
            // cause, as the store would have told it.
            if let Some(own) = own_earlier.filter(|own| own.seq == fp.seq) {
                if may_be_secondary(&err) && !own.same_peer_as(&err) {
                    return own.to_error(fp, rank);
                }
            }
            return self.store_host_gone(err);
        };
        // A report is there now: ranks that fail later because of it can
        // find it (see `earlier_cause`).
        self.mark_failed(fp.seq);
        if stored == encoded || !may_be_secondary(&err) {
            return err;
        }
        match FailureReport::decode(&stored) {
            Some(first) if first.seq == fp.seq && !first.same_peer_as(&err) => {
                tracing::debug!(
                    seq = fp.seq,
                    reporter = first.reporter,
                    "reporting the root cause another rank posted instead of: {err}"
                );
                first.to_error(fp, rank)
            }
            _ => err,
        }
    }
}

impl FailureBoard {
    /// The report of the first collective that failed in this group, if
    /// one is posted and it is collective `seq` or an earlier one; else
    /// the report posted for `seq`, if any (read within the store's
    /// patience).
    fn posted_up_to(&self, seq: u64) -> Option<FailureReport> {
        self.ask(
            "read the failure posted for a collective",
            move |store, prefix| {
                let read = |key: &str| -> crate::Result<Option<FailureReport>> {
                    Ok(read_if_present(store, key)?.and_then(|v| FailureReport::decode(&v)))
                };
                let first = failed_seq_key(prefix);
                if let Some(text) = read_if_present(store, &first)? {
                    let text = String::from_utf8_lossy(&text).into_owned();
                    if let Ok(failed) = text.trim().parse::<u64>() {
                        if failed <= seq {
                            if let Some(report) = read(&failure_key(prefix, failed))? {
                                return Ok(Some(report));
                            }
                        }
                    }
                }
                read(&failure_key(prefix, seq))
            },
        )
        .flatten()
    }

    /// Waits up to `patience` for a report of a collective before `seq`
    /// (polling the store within its patience); true once there is one.
    /// For a rank that timed out in `seq` on a peer stalled in an earlier
    /// collective: that peer's own timeout, which began first, is about to
    /// post the cause, which [`earlier_cause`](Self::earlier_cause) then
    /// finds.
    ///
    /// Its store calls do not mark the store unreachable: a slow answer
    /// here only ends the wait.
    pub(crate) fn await_earlier_failure(&self, seq: u64, patience: Duration) -> bool {
        let deadline = Instant::now() + patience;
        while !self.unreachable.load(Ordering::Relaxed) {
            let store = self.store.clone();
            let key = failed_seq_key(&self.key_prefix);
            let found = bounded("look for an earlier failure", move || {
                let Some(text) = read_if_present(&*store, &key)? else {
                    return Ok(false);
                };
                let text = String::from_utf8_lossy(&text).into_owned();
                Ok(text.trim().parse::<u64>().is_ok_and(|failed| failed < seq))
            });
            match found {
                Ok(true) => return true,
                Ok(false) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(100));
                }
                _ => return false,
            }
        }
        false
    }

    /// Says, for ranks that fail later, that collective `seq` failed (the
    /// first such post counts).
    fn mark_failed(&self, seq: u64) {
        let key = failed_seq_key(&self.key_prefix);
        let _ = self.reachable(|store| post_first(store, key, seq.to_string().into_bytes()));
    }

    /// `f(store, key_prefix)` on a helper thread, bounded by
    /// [`STORE_PATIENCE`], unless the store is unreachable (see the type's
    /// docs); `None` when it failed, took longer or was not tried. `what`
    /// names the calls in the debug log.
    pub(crate) fn ask<T: Send + 'static>(
        &self,
        what: &str,
        f: impl FnOnce(&dyn Store, &str) -> crate::Result<T> + Send + 'static,
    ) -> Option<T> {
        let prefix = self.key_prefix.clone();
        self.reachable(|store| {
            let store = store.clone();
            bounded(what, move || f(&*store, &prefix))
        })
    }

    /// `call(store)` unless the store is unreachable (see the type's docs);
    /// no answer from it makes the store unreachable, and a lost
    /// connection is remembered (see [`store_host_gone`](Self::store_host_gone)).
    fn reachable<T>(
        &self,
        call: impl FnOnce(&Arc<dyn Store>) -> Result<T, Unanswered>,
    ) -> Option<T> {
        if self.unreachable.load(Ordering::Relaxed) {
            return None;
        }
        match call(&self.store) {
            Ok(v) => Some(v),
            Err(why) => {
                self.unanswered(why);
                None
            }
        }
    }

    /// A failure-path call got no answer: the store counts as unreachable
    /// from now on, and a lost connection or a silent store is remembered.
    /// (A silence counts from any call, also the read of every rank's
    /// ring, whose round trips grow with the group: in a group of
    /// thousands of ranks a live but slow store could be taken for a
    /// silent one, and its host named.)
    fn unanswered(&self, why: Unanswered) {
        self.unreachable.store(true, Ordering::Relaxed);
        match why {
            Unanswered::Failed(Error::StoreConnectionLost { addr, reason }) => {
                let _ = self.lost.set(format!("{addr}: {reason}"));
            }
            Unanswered::Silent => self.silent.store(true, Ordering::Relaxed),
            Unanswered::Failed(_) | Unanswered::NoThread => {}
        }
    }

    /// `err`, a closed or silent peer that this rank could not report
    /// because the store's connection was lost, as the loss of the rank
    /// hosting the store, when that is another rank. With the store gone no
    /// report travels, and the peers that closed on this rank may only have
    /// given up first on the dead host (it would otherwise name the first
    /// survivor to close, not the rank that died).
    ///
    /// A store that is there but silent (no answer within
    /// [`STORE_PATIENCE`]) says the same of a host that stopped or hung,
    /// whose peers give up on each other in turn: its host is named too,
    /// as not responding.
    fn store_host_gone(&self, err: Error) -> Error {
        let Some(&host) = self.store_host.get() else {
            return err;
        };
        let Some((peer, during)) = lost_peer(&err) else {
            return err;
        };
        if peer == host {
            return err;
        }
        if let Some(lost) = self.lost.get() {
            return host_and_store_gone(host, peer, during, lost, &err);
        }
        if self.silent.load(Ordering::Relaxed) {
            let timeout = match &err {
                Error::PeerTimeout { timeout, .. } => *timeout,
                _ => STORE_PATIENCE,
            };
            return Error::PeerTimeout {
                peer: host,
                during: format!(
                    "{during}; it hosts the store, which did not answer within {STORE_PATIENCE:?} either, and this rank lost rank {peer} too"
                ),
                timeout,
            };
        }
        err
    }

    /// The root cause of a failure of collective `seq` on this rank (`err`,
    /// which only says a peer went away) when an earlier collective failed
    /// first: that collective's report, told from this rank's side with
    /// `mine`, its fingerprint of that collective, when it still has it,
    /// and that collective's sequence number (`None`: `err` as it was).
    pub(crate) fn earlier_cause(
        &self,
        seq: u64,
        rank: usize,
        err: Error,
        mine: impl Fn(u64) -> Option<Fingerprint>,
    ) -> (Error, Option<u64>) {
        if !may_be_secondary(&err) {
            return (err, None);
        }
        // Only keys that are there are read: a plain get would wait for
        // a missing one until the store's timeout. `Some(None)`: the store
        // answered, there is no earlier failure.
        let reads = {
            let prefix = self.key_prefix.clone();
            move |store: &Arc<dyn Store>| {
                let store = store.clone();
                bounded("read an earlier failure", move || {
                    let read = |key: &str| read_if_present(&*store, key);
                    let Some(failed) = read(&failed_seq_key(&prefix))? else {
                        return Ok(None);
                    };
                    let failed: Option<u64> = String::from_utf8(failed)
                        .ok()
                        .and_then(|f| f.trim().parse().ok());
                    let Some(failed) = failed.filter(|&f| f < seq) else {
                        return Ok(None);
                    };
                    Ok(read(&failure_key(&prefix, failed))?.map(|report| (failed, report)))
                })
            }
        };
        let first = || -> Option<(Error, u64)> {
            let (failed, report) = self.reachable(reads)??;
            let report = FailureReport::decode(&report)?;
            Some((report.to_error(&mine(failed)?, rank), failed))
        };
        match first() {
            Some((cause, failed)) => (cause, Some(failed)),
            None => (err, None),
        }
    }

    /// `err` with both sides of a mismatch in full, exchanged through the
    /// group's store (see `mismatch_sides.rs`); `mine` is this rank's
    /// description of collective `fp`. Call it after closing this rank's
    /// connections.
    pub(crate) fn with_both_sides(
        &self,
        fp: &Fingerprint,
        err: Error,
        mine: Option<&str>,
    ) -> Error {
        if self.unreachable.load(Ordering::Relaxed) {
            return err;
        }
        super::mismatch_sides::with_both_sides(&self.store, &self.key_prefix, fp, err, mine)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::HashStore;
    use crate::tensor::DType;

    fn fp(numel: u64, seq: u64) -> Fingerprint {
        Fingerprint {
            kind: CollectiveKind::AllReduce,
            reduce_op: 1,
            dtype: Some(DType::I32),
            root: 0,
            seq,
            numel,
            shape_hash: 7,
        }
    }

    fn report(cause: Cause) -> FailureReport {
        FailureReport {
            op: CollectiveKind::AllReduce,
            seq: 5,
            reporter: 2,
            cause,
        }
    }

    fn closed(peer: usize) -> Error {
        Error::PeerClosed {
            peer,
            during: "receiving".into(),
            reason: "connection closed".into(),
        }
    }

    #[test]
    fn every_cause_survives_encoding_and_truncation_is_refused() {
        let causes = [
            Cause::Mismatch {
                peer: 3,
                mine: Side::Fingerprint(fp(8, 5).encode()),
                theirs: Side::Fingerprint(fp(9, 5).encode()),
            },
            Cause::Mismatch {
                peer: 1,
                mine: Side::Text("sending 4 bytes".into()),
                theirs: Side::Text("expecting 6 bytes".into()),
            },
            Cause::PeerClosed {
                peer: 7,
                reason: "é".repeat(200),
            },
            Cause::PeerTimeout {
                peer: 0,
                timeout: Duration::from_millis(1500),
            },
            Cause::RanksMissing {
                missing: vec![1, 3],
                timeout: Duration::from_secs(2),
            },
        ];
        for cause in causes {
            let r = report(cause);
            let bytes = r.encode();
            let back = FailureReport::decode(&bytes).unwrap();
            match (&back.cause, &r.cause) {
                // Long reasons are clipped to 256 bytes on a char boundary.
                (Cause::PeerClosed { reason: got, .. }, Cause::PeerClosed { reason, .. }) => {
                    assert_eq!(got.len(), 256);
                    assert!(reason.starts_with(got.as_str()));
                }
                _ => assert_eq!(back, r),
            }
            for cut in 0..bytes.len() {
                assert_eq!(FailureReport::decode(&bytes[..cut]), None, "cut {cut}");
            }
            let mut longer = bytes.clone();
            longer.push(0);
            assert_eq!(FailureReport::decode(&longer), None);
        }
        assert_eq!(FailureReport::decode(b"not a report at all"), None);
    }

    #[test]
    fn an_unnamed_nccl_failure_adopts_the_cause_a_peer_posts_soon_after() {
        let store: Arc<dyn Store> = Arc::new(HashStore::new());
        let board = Arc::new(FailureBoard::new(store.clone(), "g"));
        let nccl = || Error::Nccl {
            call: "ncclGroupEnd".into(),
            code: "ncclSystemError".into(),
            message: "unhandled system error".into(),
        };
        // Rank 3 finds rank 2's call different 300 ms after rank 1's NCCL
        // call failed.
        let poster = {
            let board = board.clone();
            std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(300));
                let mismatch = Error::CollectiveMismatch {
                    rank: 3,
                    peer: 2,
                    mine: fp(8, 0).to_string(),
                    theirs: fp(9, 0).to_string(),
                };
                board.settle(&fp(8, 0), 3, mismatch, Some((2, fp(9, 0).encode())))
            })
        };
        let started = Instant::now();
        match board.settle(&fp(8, 0), 1, nccl(), None) {
            Error::CollectiveMismatch {
                rank: 1, peer: 2, ..
            } => {}
            other => panic!("{other:?}"),
        }
        assert!(
            started.elapsed() < SECONDARY_PATIENCE,
            "{:?}",
            started.elapsed()
        );
        poster.join().unwrap();
        // A later collective's failure is not blamed on that cause (it
        // names another collective), and does not wait for one.
        let started = Instant::now();
        assert!(matches!(
            board.settle(&fp(8, 1), 1, nccl(), None),
            Error::Nccl { .. }
        ));
        assert!(started.elapsed() < SECONDARY_PATIENCE);
        // Nor does an NCCL failure of this rank's own kind.
        let usage = Error::Nccl {
            call: "ncclAllReduce".into(),
            code: "ncclInvalidUsage".into(),
            message: "invalid usage".into(),
        };
        let started = Instant::now();
        assert!(matches!(
            board.settle(&fp(8, 2), 1, usage, None),
            Error::Nccl { .. }
        ));
        assert!(started.elapsed() < SECONDARY_PATIENCE);
        // With nothing posted (another group) the rank's own error comes
        // back, after the patience and no longer.
        let quiet = FailureBoard::new(store, "h");
        let started = Instant::now();
        assert!(matches!(
            quiet.settle(&fp(8, 0), 1, nccl(), None),
            Error::Nccl { .. }
        ));
        let took = started.elapsed();
        assert!(
            took >= SECONDARY_PATIENCE && took < SECONDARY_PATIENCE * 3,
            "{took:?}"
        );
    }

    #[test]
    fn a_mismatch_is_reported_from_each_ranks_side_with_both_fingerprints() {
        // Rank 2 (8 elements) found rank 3 (9 elements) different.
        let r = report(Cause::Mismatch {
            peer: 3,
            mine: Side::Fingerprint(fp(8, 5).encode()),
            theirs: Side::Fingerprint(fp(9, 5).encode()),
        });
        let (normal, odd) = (fp(8, 5).to_string(), fp(9, 5).to_string());
        match r.to_error(&fp(8, 5), 0) {
            Error::CollectiveMismatch {
                rank: 0,
                peer: 3,
                mine,
                theirs,
            } => assert_eq!((mine, theirs), (normal.clone(), odd.clone())),
            other => panic!("{other:?}"),
        }
        match r.to_error(&fp(9, 5), 3) {
            Error::CollectiveMismatch {
                rank: 3,
                peer: 2,
                mine,
                theirs,
            } => assert_eq!((mine, theirs), (odd, normal.clone())),
            other => panic!("{other:?}"),
        }
        // A third view (10 elements) differs from the reporter's.
        match r.to_error(&fp(10, 5), 1) {
            Error::CollectiveMismatch {
                peer: 2, theirs, ..
            } => assert_eq!(theirs, normal),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_text_mismatch_names_the_reporters_call_to_the_odd_rank() {
        // Rank 2 found rank 3's setup different, in words.
        let r = report(Cause::Mismatch {
            peer: 3,
            mine: Side::Text("an arena of 64 bytes".into()),
            theirs: Side::Text("an arena of 128 bytes".into()),
        });
        match r.to_error(&fp(8, 5), 3) {
            Error::CollectiveMismatch {
                rank: 3,
                peer: 2,
                theirs,
                ..
            } => assert!(
                theirs.starts_with("an arena of 64 bytes")
                    && theirs.contains("this rank running an arena of 128 bytes"),
                "{theirs}"
            ),
            other => panic!("{other:?}"),
        }
        match r.to_error(&fp(8, 5), 0) {
            Error::CollectiveMismatch {
                rank: 0,
                peer: 3,
                theirs,
                ..
            } => assert!(
                theirs.starts_with("an arena of 128 bytes, as rank 2 found"),
                "{theirs}"
            ),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn the_first_report_wins_and_a_closed_link_adopts_it() {
        let store: Arc<dyn Store> = Arc::new(HashStore::new());
        let board = FailureBoard::new(store.clone(), "g");
        let mismatch = Error::CollectiveMismatch {
            rank: 3,
            peer: 2,
            mine: fp(9, 5).to_string(),
            theirs: fp(8, 5).to_string(),
        };
        // Rank 3 found the mismatch first and keeps its own error.
        let got = board.settle(&fp(9, 5), 3, mismatch, Some((2, fp(8, 5).encode())));
        assert!(matches!(got, Error::CollectiveMismatch { peer: 2, .. }));
        let stored = store.get("g/failure/5").unwrap();
        assert_eq!(
            FailureReport::decode(&stored).unwrap().cause,
            Cause::Mismatch {
                peer: 2,
                mine: Side::Fingerprint(fp(9, 5).encode()),
                theirs: Side::Fingerprint(fp(8, 5).encode()),
            }
        );
        // Rank 0 lost its link to rank 3, which gave up: it reports the mismatch.
        match board.settle(&fp(8, 5), 0, closed(3), None) {
            Error::CollectiveMismatch {
                rank: 0,
                peer: 3,
                mine,
                theirs,
            } => assert_eq!((mine, theirs), (fp(8, 5).to_string(), fp(9, 5).to_string())),
            other => panic!("{other:?}"),
        }
        assert_eq!(store.get("g/failure/5").unwrap(), stored, "first kept");
        // Another sequence number has its own key.
        assert!(matches!(
            board.settle(&fp(8, 6), 0, closed(3), None),
            Error::PeerClosed { peer: 3, .. }
        ));
    }

    #[test]
    fn a_dead_peer_is_named_by_ranks_that_lost_another_link() {
        let store: Arc<dyn Store> = Arc::new(HashStore::new());
        let board = FailureBoard::new(store, "g");
        // Rank 1 saw rank 2 die; rank 0, waiting on rank 1, then lost it.
        assert!(matches!(
            board.settle(&fp(8, 0), 1, closed(2), None),
            Error::PeerClosed { peer: 2, .. }
        ));
        match board.settle(&fp(8, 0), 0, closed(1), None) {
            Error::PeerClosed {
                peer: 2,
                during,
                reason,
            } => {
                assert!(during.contains("rank 1 found"), "{during}");
                assert_eq!(reason, "connection closed");
            }
            other => panic!("{other:?}"),
        }
        // A rank that saw rank 2 die itself keeps its own error.
        match board.settle(&fp(8, 0), 3, closed(2), None) {
            Error::PeerClosed { during, .. } => assert_eq!(during, "receiving"),
            other => panic!("{other:?}"),
        }
        // Errors about this rank's own arguments are not posted.
        let own = Error::InvalidArgument("x".into());
        assert!(matches!(
            board.settle(&fp(8, 1), 0, own, None),
            Error::InvalidArgument(_)
        ));
    }

    /// A store whose host died: the call on the connection it had fails at
    /// once (reset), every later call dials it again, which takes `redial`
    /// (until the store's timeout) before it fails too.
    struct GoneStore {
        calls: std::sync::atomic::AtomicUsize,
        redial: Duration,
    }

    impl GoneStore {
        /// Its first call fails at once, later ones after `redial`.
        fn gone(redial: Duration) -> Arc<GoneStore> {
            Arc::new(GoneStore {
                calls: Default::default(),
                redial,
            })
        }

        /// Every call waits `redial`, then fails.
        fn silent(redial: Duration) -> Arc<GoneStore> {
            Arc::new(GoneStore {
                calls: 1.into(),
                redial,
            })
        }

        fn fail<T>(&self) -> crate::Result<T> {
            let first = self.calls.fetch_add(1, Ordering::SeqCst) == 0;
            if !first {
                std::thread::sleep(self.redial);
            }
            Err(Error::StoreConnectionLost {
                addr: "127.0.0.1:1".into(),
                reason: "connection reset by peer".into(),
            })
        }
    }

    impl Store for GoneStore {
        fn set(&self, _: &str, _: &[u8]) -> crate::Result<()> {
            self.fail()
        }
        fn get_timeout(&self, _: &str, _: Duration) -> crate::Result<Vec<u8>> {
            self.fail()
        }
        fn add(&self, _: &str, _: i64) -> crate::Result<i64> {
            self.fail()
        }
        fn compare_set(&self, _: &str, _: &[u8], _: &[u8]) -> crate::Result<Vec<u8>> {
            self.fail()
        }
        fn wait_timeout(&self, _: &[&str], _: Duration) -> crate::Result<()> {
            self.fail()
        }
        fn check(&self, _: &[&str]) -> crate::Result<bool> {
            self.fail()
        }
        fn delete_key(&self, _: &str) -> crate::Result<bool> {
            self.fail()
        }
        fn num_keys(&self) -> crate::Result<usize> {
            self.fail()
        }
        fn append(&self, _: &str, _: &[u8]) -> crate::Result<()> {
            self.fail()
        }
        fn multi_get_timeout(&self, _: &[&str], _: Duration) -> crate::Result<Vec<Vec<u8>>> {
            self.fail()
        }
        fn multi_set(&self, _: &[&str], _: &[&[u8]]) -> crate::Result<()> {
            self.fail()
        }
        fn list_keys(&self) -> crate::Result<Vec<String>> {
            self.fail()
        }
        fn queue_push(&self, _: &str, _: &[u8]) -> crate::Result<()> {
            self.fail()
        }
        fn queue_pop_timeout(&self, _: &str, _: Duration) -> crate::Result<Vec<u8>> {
            self.fail()
        }
        fn queue_len(&self, _: &str) -> crate::Result<usize> {
            self.fail()
        }
        fn timeout(&self) -> Duration {
            self.redial
        }
        fn set_timeout(&self, _: Duration) {}
    }

    #[test]
    fn a_set_up_that_lost_a_peer_names_the_store_host_only_when_the_store_is_gone() {
        let gone = || -> Arc<dyn Store> { GoneStore::gone(Duration::from_millis(1)) };
        match set_up_error(&gone(), 3, 0, closed(2)) {
            Error::PeerClosed {
                peer: 0, reason, ..
            } => {
                assert!(reason.contains("the store it hosts is gone"), "{reason}");
                assert!(reason.contains("lost rank 2 too"), "{reason}");
            }
            other => panic!("expected rank 0 named, found {other:?}"),
        }
        // The host itself lost, this rank the host, or an error that is not
        // a lost peer: as it was.
        let untouched = |e: Error| matches!(e, Error::PeerClosed { peer: 2, reason, .. } if reason == "connection closed");
        assert!(untouched(set_up_error(&gone(), 3, 2, closed(2))));
        assert!(untouched(set_up_error(&gone(), 0, 0, closed(2))));
        let other = Error::InvalidArgument("x".into());
        assert!(matches!(
            set_up_error(&gone(), 3, 0, other),
            Error::InvalidArgument(_)
        ));
        // A store that answers: the peer is the one to name.
        let live: Arc<dyn Store> = Arc::new(crate::store::HashStore::new());
        assert!(untouched(set_up_error(&live, 3, 0, closed(2))));
        // One slower than the probe (its answer would take 5 s): the peer
        // too, once the probe's wait is over.
        let slow: Arc<dyn Store> = GoneStore::silent(Duration::from_secs(5));
        let started = Instant::now();
        assert!(untouched(set_up_error(&slow, 3, 0, closed(2))));
        assert!(
            started.elapsed() < Duration::from_secs(1),
            "{:?}",
            started.elapsed()
        );
    }

    #[test]
    fn a_set_up_whose_tcp_store_server_went_away_names_its_host() {
        use crate::store::{TcpStore, TcpStoreOptions, TcpStoreServer};
        let options = TcpStoreOptions {
            timeout: Duration::from_secs(5),
            ..Default::default()
        };
        let server = TcpStoreServer::bind("127.0.0.1:0", &options).unwrap();
        let client = TcpStore::connect(&server.local_addr().to_string(), &options).unwrap();
        client.set("k", b"v").unwrap();
        let client: Arc<dyn Store> = Arc::new(client);
        assert!(matches!(
            set_up_error(&client, 3, 0, closed(2)),
            Error::PeerClosed { peer: 2, .. }
        ));
        drop(server);
        let started = Instant::now();
        assert!(matches!(
            set_up_error(&client, 3, 0, closed(2)),
            Error::PeerClosed { peer: 0, .. }
        ));
        assert!(started.elapsed() < SET_UP_PROBE, "{:?}", started.elapsed());
    }

    #[test]
    fn with_the_store_unreachable_a_rank_tells_the_mismatch_it_settled_itself() {
        // Rank 3's stall monitor found a mismatch with rank 2 and settled
        // it (the store did not take it), then aborted; the collective
        // then fails on a closed link, and the mismatch is its cause.
        let gone = GoneStore::gone(Duration::from_millis(1));
        let board = FailureBoard::new(gone, "g");
        let mismatch = Error::CollectiveMismatch {
            rank: 3,
            peer: 2,
            mine: fp(9, 5).to_string(),
            theirs: fp(8, 5).to_string(),
        };
        let settled = board.settle(&fp(9, 5), 3, mismatch, Some((2, fp(8, 5).encode())));
        assert!(matches!(settled, Error::CollectiveMismatch { peer: 2, .. }));
        assert!(matches!(
            board.settle(&fp(9, 5), 3, closed(1), None),
            Error::CollectiveMismatch { peer: 2, .. }
        ));
        // Not for another collective.
        assert!(matches!(
            board.settle(&fp(9, 6), 3, closed(1), None),
            Error::PeerClosed { peer: 1, .. }
        ));
        // A lost link it settled first is not kept as a cause: another
        // lost link in that collective is told as it is.
        let gone = GoneStore::gone(Duration::from_millis(1));
        let board = FailureBoard::new(gone, "g");
        board.settle(&fp(9, 7), 3, closed(1), None);
        assert!(matches!(
            board.settle(&fp(9, 7), 3, closed(2), None),
            Error::PeerClosed { peer: 2, .. }
        ));
    }

    #[test]
    fn with_the_store_gone_a_lost_survivor_is_blamed_on_the_store_host() {
        // Rank 0 hosted the store and died; rank 2 saw it, could not post,
        // and closed its links. Rank 3 only sees rank 2 close: the store
        // being gone says rank 0 is gone too, and that is the cause.
        let gone = GoneStore::gone(Duration::from_millis(1));
        let board = FailureBoard::new(gone.clone(), "g");
        board.set_store_host(0);
        match board.settle(&fp(8, 5), 3, closed(2), None) {
            Error::PeerClosed {
                peer: 0, reason, ..
            } => {
                assert!(reason.contains("store"), "{reason}");
                assert!(reason.contains("rank 2"), "{reason}");
            }
            other => panic!("expected rank 0 (the store's host) named, got {other:?}"),
        }
        // The store's host itself, and a group whose store no rank hosts,
        // keep the error as it was.
        assert!(matches!(
            board.settle(&fp(8, 6), 3, closed(0), None),
            Error::PeerClosed { peer: 0, .. }
        ));
        let unhosted = FailureBoard::new(gone, "g");
        assert!(matches!(
            unhosted.settle(&fp(8, 5), 3, closed(2), None),
            Error::PeerClosed { peer: 2, .. }
        ));
    }

    #[test]
    fn with_the_store_silent_a_timed_out_survivor_blames_the_store_host() {
        // Rank 0 hosts the store and was stopped: its store keeps the
        // connections but answers nothing. Rank 3 timed out on rank 2,
        // which had itself been waiting on rank 0; no report can travel,
        // and the silent store points at its host.
        let silent = GoneStore::silent(STORE_PATIENCE + Duration::from_secs(1));
        let board = FailureBoard::new(silent.clone(), "g");
        board.set_store_host(0);
        let timed_out = Error::PeerTimeout {
            peer: 2,
            during: "receiving 4 bytes from it".into(),
            timeout: Duration::from_secs(2),
        };
        match board.settle(&fp(8, 5), 3, timed_out.clone(), None) {
            Error::PeerTimeout {
                peer: 0, during, ..
            } => {
                assert!(during.contains("did not answer"), "{during}");
                assert!(during.contains("lost rank 2"), "{during}");
            }
            other => panic!("{other:?}"),
        }
        // Without a rank hosting the store, rank 2 stays the one named.
        let unhosted = FailureBoard::new(silent, "g");
        assert!(matches!(
            unhosted.settle(&fp(8, 5), 3, timed_out, None),
            Error::PeerTimeout { peer: 2, .. }
        ));
    }

    #[test]
    fn a_dead_store_is_called_once_on_the_failure_path() {
        // The failure path of a rank whose peer (and the store's host)
        // died: settle, then look for an earlier failure, then (for a
        // mismatch) exchange both sides. Once the store failed, none of
        // them may dial it again (each dial would take the store's whole
        // timeout while this rank's links stay open).
        for err in [
            closed(0),
            Error::CollectiveMismatch {
                rank: 1,
                peer: 0,
                mine: "mine".into(),
                theirs: "theirs".into(),
            },
        ] {
            let gone = GoneStore::gone(Duration::from_secs(3));
            let board = FailureBoard::new(gone.clone(), "g");
            let started = std::time::Instant::now();
            let err = board.settle(&fp(8, 5), 1, err.clone(), None);
            let (err, earlier) = board.earlier_cause(5, 1, err, |seq| Some(fp(8, seq)));
            let _ = board.with_both_sides(&fp(8, 5), err, Some("all_reduce (seq 5)"));
            assert_eq!(earlier, None);
            assert_eq!(gone.calls.load(Ordering::SeqCst), 1);
            assert!(
                started.elapsed() < Duration::from_secs(1),
                "the failure path took {:?} on a dead store",
                started.elapsed()
            );
        }
    }
}
