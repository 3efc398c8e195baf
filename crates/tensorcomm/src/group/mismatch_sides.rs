//! Both sides of a mismatch, in full: the in-band fingerprint is 32 bytes
//! (shapes only as a hash, no device), enough to find a mismatch but not
//! to show it. So on the failure path only, a rank whose collective failed
//! with [`Error::CollectiveMismatch`] posts its call's description
//! (`call_description.rs`) to the group's store under
//! `{key_prefix}/call/{seq}/{rank}`, after its failure report and after
//! its connections closed, and waits up to [`SIDE_PATIENCE`] for the
//! description the peer it names posts the same way; the error then shows
//! both. When the peer's never comes (it did not fail, or the store is
//! slow) the error keeps the peer's fingerprint fields; this rank's own
//! side is always in full. Collectives that succeed never touch the store.
//!
//! A side that an algorithm described in words (an all-to-all's split
//! sizes, an arena's setup) keeps those words, followed by the call.

use std::sync::mpsc;
use std::sync::Arc;
use std::time::Duration;

use super::fingerprint::{CollectiveKind, Fingerprint};
use crate::store::tcp::reply_grace::background_on_this_thread;
use crate::store::Store;
use crate::Error;

/// How long a failing rank waits for the peer's description.
pub(crate) const SIDE_PATIENCE: Duration = Duration::from_secs(1);

/// The store key of rank `rank`'s description of collective `seq` in the
/// group at `key_prefix`.
pub(crate) fn side_key(key_prefix: &str, seq: u64, rank: usize) -> String {
    format!("{key_prefix}/call/{seq}/{rank}")
}

/// Runs `f` (a store call) on a helper thread and waits for it at most
/// `patience`; `None` when it failed or took longer.
fn bounded<T: Send + 'static>(
    patience: Duration,
    f: impl FnOnce() -> crate::Result<T> + Send + 'static,
) -> Option<T> {
    let (tx, rx) = mpsc::channel();
    std::thread::Builder::new()
        .name("tensorcomm-mismatch-sides".into())
        .spawn(move || {
            // Given up on after `patience`; ends soon after, too.
            let _quick = background_on_this_thread(patience);
            let _ = tx.send(f());
        })
        .ok()?;
    match rx.recv_timeout(patience) {
        Ok(Ok(v)) => Some(v),
        Ok(Err(e)) => {
            tracing::debug!("mismatch description: store call failed: {e}");
            None
        }
        Err(_) => None,
    }
}

/// The length of the fingerprint description `text` starts with
/// (`all_reduce (seq 3, ...)`, as [`Fingerprint`]'s `Display` writes it),
/// if it starts with one.
fn fingerprint_prefix(text: &str) -> Option<usize> {
    let (name, rest) = text.split_once(" (seq ")?;
    (1..=u8::MAX)
        .filter_map(CollectiveKind::from_code)
        .any(|k| k.name() == name)
        .then_some(())?;
    let close = rest.find(')')?;
    if rest[..close].contains('(') {
        return None;
    }
    Some(name.len() + " (seq ".len() + close + 1)
}

/// `text` with the fingerprint description it starts with replaced by
/// `full`; an algorithm's own words are kept, followed by `full`.
fn in_full(text: String, full: &str) -> String {
    match fingerprint_prefix(&text) {
        Some(end) => format!("{full}{}", &text[end..]),
        None => format!("{text}, in {full}"),
    }
}

/// `err` with both sides of a mismatch in full (see the module docs):
/// posts `mine`, this rank's description of collective `fp`, and waits
/// for the named peer's. Other errors, and mismatches of a backend that
/// did not describe its call, come back as they are.
pub(crate) fn with_both_sides(
    store: &Arc<dyn Store>,
    key_prefix: &str,
    fp: &Fingerprint,
    err: Error,
    mine: Option<&str>,
) -> Error {
    let Some(full) = mine else {
        return err;
    };
    let Error::CollectiveMismatch {
        rank,
        peer,
        mine: my_side,
        theirs,
    } = err
    else {
        return err;
    };
    let full = full.to_string();
    {
        let (store, key, value) = (
            store.clone(),
            side_key(key_prefix, fp.seq, rank),
            full.clone(),
        );
        bounded(SIDE_PATIENCE, move || store.set(&key, value.as_bytes()));
    }
    let peer_full = {
        let (store, key) = (store.clone(), side_key(key_prefix, fp.seq, peer));
        bounded(SIDE_PATIENCE, move || {
            store.get_timeout(&key, SIDE_PATIENCE)
        })
        .and_then(|bytes| String::from_utf8(bytes).ok())
    };
    Error::CollectiveMismatch {
        rank,
        peer,
        mine: in_full(my_side, &full),
        theirs: match peer_full {
            Some(p) => in_full(theirs, &p),
            None => theirs,
        },
    }
}
