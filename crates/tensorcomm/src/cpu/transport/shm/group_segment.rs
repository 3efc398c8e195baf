//! [`connect_group_segment`]: one shared-memory segment mapped by every
//! rank of a group on one host, set up through the group's store and
//! unlinked as soon as every rank has mapped it (nothing is left in
//! `/dev/shm`, however the ranks end).
//!
//! Rank 0 creates the segment (reserving its pages, so a full `/dev/shm`
//! is an error here rather than a `SIGBUS` later) and publishes its name
//! and the size it was asked for under `{key}`. Every other rank maps it
//! and answers under `{key}/mapped/{rank}` with the size it was asked for,
//! even when that differs (so rank 0 never waits for a rank that gave up);
//! rank 0 waits for every answer, removes the keys, unlinks the name, and
//! fails if any rank was asked for another size, as does that rank.

use std::time::Duration;

use super::segment::{self, Segment};
use crate::store::Store;
use crate::{Error, Result};

/// A name no other segment of this host uses now.
fn unique_name(kind: &str) -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::time::{SystemTime, UNIX_EPOCH};
    static SEQ: AtomicU64 = AtomicU64::new(0);
    let seq = SEQ.fetch_add(1, Ordering::Relaxed);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    format!("/tc{kind}.{}.{seq}.{nanos:08x}", std::process::id())
}

/// What a group segment is for, in errors and in its name.
pub(super) struct Purpose<'a> {
    /// A short tag for the segment's name (`arena`, `sym`).
    pub tag: &'a str,
    /// What the segment is, for messages: "shared-memory arena".
    pub what: &'a str,
    /// The size every rank must be asked for (per rank, or a chunk: what
    /// the caller's users chose), compared across ranks.
    pub asked: usize,
    /// What `asked` means, for a mismatch: "slot halves of 1048576 bytes".
    pub asked_means: &'a dyn Fn(usize) -> String,
}

/// Maps the `len`-byte segment of the group whose ranks meet under `key`
/// (see the module docs); every rank passes the same `key`, and should be
/// asked for the same size (`purpose.asked`, from which `len` follows).
/// Waiting for the others ends after `timeout`.
pub(super) fn connect_group_segment(
    store: &dyn Store,
    key: &str,
    (rank, world_size): (usize, usize),
    len: usize,
    purpose: &Purpose<'_>,
    timeout: Duration,
) -> Result<Segment> {
    let mapped_key = |r: usize| format!("{key}/mapped/{r}");
    let asked = purpose.asked;
    let mismatch = |peer: usize, theirs: &str| Error::CollectiveMismatch {
        rank,
        peer,
        mine: format!("a {} with {}", purpose.what, (purpose.asked_means)(asked)),
        theirs: match theirs.parse::<usize>() {
            Ok(n) => format!("a {} with {}", purpose.what, (purpose.asked_means)(n)),
            Err(_) => format!("an answer {theirs:?}"),
        },
    };
    if rank != 0 {
        let raw = store.get_timeout(key, timeout)?;
        let published = String::from_utf8_lossy(&raw).into_owned();
        let (theirs, name) = published.split_once(' ').unwrap_or(("", &published));
        if theirs != asked.to_string() {
            store.set(&mapped_key(rank), asked.to_string().as_bytes())?;
            return Err(mismatch(0, theirs));
        }
        let opened = Segment::open(name);
        // Answered only once mapped (rank 0 then unlinks the name), but
        // answered whatever happened, so that rank 0 does not wait.
        store.set(&mapped_key(rank), asked.to_string().as_bytes())?;
        let segment =
            opened.map_err(|e| Error::io(format!("opening {} {name}", purpose.what), e))?;
        if segment.len() != len {
            return Err(Error::ShmBadHeader {
                segment: name.to_string(),
                field: "size".to_string(),
                expected: format!("{len} bytes"),
                found: format!("{} bytes", segment.len()),
            });
        }
        return Ok(segment);
    }
    let (name, segment) = loop {
        let name = unique_name(purpose.tag);
        match Segment::create(&name, len) {
            Ok(segment) => break (name, segment),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
            Err(e) => {
                let what = format!("creating {} {name} of {len} bytes", purpose.what);
                return Err(Error::io(what, e));
            }
        }
    };
    let answers = (|| {
        store.set(key, format!("{asked} {name}").as_bytes())?;
        let keys: Vec<String> = (1..world_size).map(mapped_key).collect();
        let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
        store.wait_timeout(&keys, timeout)?;
        let mut answers = Vec::with_capacity(keys.len());
        for k in &keys {
            answers.push(store.get(k)?);
        }
        store.delete_key(key)?;
        for k in keys {
            store.delete_key(k)?;
        }
        Ok(answers)
    })();
    let unlinked = segment::unlink(&name);
    let answers = answers?;
    unlinked.map_err(|e| Error::io(format!("unlinking {} {name}", purpose.what), e))?;
    for (peer, answer) in (1..world_size).zip(answers) {
        let theirs = String::from_utf8_lossy(&answer).into_owned();
        if theirs != asked.to_string() {
            return Err(mismatch(peer, &theirs));
        }
    }
    Ok(segment)
}
