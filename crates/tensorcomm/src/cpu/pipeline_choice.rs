//! Whether a CPU group's large all_reduces vote on staging CUDA tensors in
//! pipelined chunks (`cuda::staged::pipelined`): in a group asked for peer
//! memory, and in any group one of whose ranks runs on a host with NVIDIA
//! GPUs, so may pass CUDA tensors. A group whose hosts have no GPU never
//! votes, so its host all_reduces cost what they did. At set-up every rank
//! posts whether its host has GPUs and reads every other rank's answer, so
//! all ranks decide alike; ranks built without CUDA post theirs too (no),
//! so they can share a group with ranks built with it.

use std::time::Duration;

use crate::store::Store;
use crate::{Error, Result};

/// True if this host has NVIDIA GPUs the driver serves (its control device
/// exists), found without loading or initialising CUDA: a CPU job on a GPU
/// host does not pay for starting the driver.
#[cfg(feature = "cuda")]
pub(crate) fn host_has_nvidia_gpus() -> bool {
    std::path::Path::new("/dev/nvidiactl").exists()
}

/// Whether any of the group's `size` ranks may stage CUDA tensors: this
/// rank's `mine`, posted under `{key_prefix}/may_stage/{rank}`, or'ed with
/// every other rank's (each waited for up to `timeout`). A peer's answer
/// that is neither `0` nor `1` is [`Error::PeerProtocol`] naming it.
pub(crate) fn any_rank_may_stage(
    store: &dyn Store,
    key_prefix: &str,
    (rank, size): (usize, usize),
    timeout: Duration,
    mine: bool,
) -> Result<bool> {
    let key = |r: usize| format!("{key_prefix}/may_stage/{r}");
    store.set(&key(rank), if mine { b"1" } else { b"0" })?;
    // One request for every other rank's answer (not one each).
    let peers: Vec<usize> = (0..size).filter(|&r| r != rank).collect();
    let keys: Vec<String> = peers.iter().map(|&r| key(r)).collect();
    let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
    let answers = store.multi_get_timeout(&keys, timeout)?;
    let mut any = mine;
    for (&peer, answer) in peers.iter().zip(&answers) {
        match &answer[..] {
            b"1" => any = true,
            b"0" => {}
            found => {
                return Err(Error::PeerProtocol {
                    peer,
                    expected: format!("0 or 1 under {}", key(peer)),
                    found: format!("{:?}", String::from_utf8_lossy(found)),
                })
            }
        }
    }
    Ok(any)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::HashStore;
    use std::sync::Arc;

    /// Every rank's answer, each rank run on a thread of its own.
    fn agree(hosts: &[bool]) -> Vec<bool> {
        let store = Arc::new(HashStore::new());
        let size = hosts.len();
        let threads: Vec<_> = hosts
            .iter()
            .enumerate()
            .map(|(rank, &mine)| {
                let store = store.clone();
                std::thread::spawn(move || {
                    any_rank_may_stage(&*store, "g", (rank, size), Duration::from_secs(10), mine)
                        .unwrap()
                })
            })
            .collect();
        threads.into_iter().map(|t| t.join().unwrap()).collect()
    }

    #[test]
    fn one_rank_with_gpus_makes_every_rank_vote() {
        assert_eq!(agree(&[false, false, true]), [true, true, true]);
        assert_eq!(agree(&[true, false]), [true, true]);
        assert_eq!(agree(&[true]), [true]);
    }

    #[test]
    fn ranks_without_gpus_never_vote() {
        assert_eq!(agree(&[false, false, false, false]), [false; 4]);
        assert_eq!(agree(&[false]), [false]);
    }

    #[test]
    fn a_peer_posting_something_else_is_named() {
        let store = HashStore::new();
        store.set("g/may_stage/1", b"yes").unwrap();
        let err =
            any_rank_may_stage(&store, "g", (0, 2), Duration::from_secs(1), false).unwrap_err();
        let text = err.to_string();
        assert!(matches!(err, Error::PeerProtocol { peer: 1, .. }), "{text}");
        assert!(text.contains("0 or 1") && text.contains("yes"), "{text}");
    }
}
