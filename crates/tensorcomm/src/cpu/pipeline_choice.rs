//! Whether a CPU group's large all_reduces vote on staging CUDA tensors in
//! pipelined chunks (`cuda::staged::pipelined`): in a group asked for peer
//! memory, and in any group one of whose ranks runs on a host with NVIDIA
//! GPUs, so may pass CUDA tensors. A group whose hosts have no GPU never
//! votes, so its host all_reduces cost what they did. At set-up every rank
//! posts its answer and reads every other rank's, so all ranks decide
//! alike. A rank built without CUDA cannot take part in the vote: it posts
//! so, and then no rank votes (the group works, staging whole).

use std::time::Duration;

use super::backend::CpuOptions;
use crate::store::Store;
use crate::{Error, Result};

/// True if this host has NVIDIA GPUs the driver serves (its control device
/// exists), found without loading or initialising CUDA: a CPU job on a GPU
/// host does not pay for starting the driver.
#[cfg(feature = "cuda")]
fn host_has_nvidia_gpus() -> bool {
    #[cfg(test)]
    if PRETEND_GPU_HOST.get() {
        return true;
    }
    std::path::Path::new("/dev/nvidiactl").exists()
}

#[cfg(all(test, feature = "cuda"))]
thread_local! {
    /// Tests only: groups set up on this thread answer as on a host with
    /// GPUs, so that their large all_reduces vote on a host without one.
    pub(crate) static PRETEND_GPU_HOST: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// What a rank posts: whether it may stage CUDA tensors.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum MayStage {
    /// Built without CUDA: it cannot vote, so no rank of its group does.
    BuiltWithoutCuda,
    No,
    Yes,
}

impl MayStage {
    /// This rank's answer in a group created with `options`: yes when it
    /// asked for peer memory or its host has GPUs.
    pub(crate) fn of_this_rank(options: &CpuOptions) -> MayStage {
        #[cfg(feature = "cuda")]
        return if options.peer_memory.is_some() || host_has_nvidia_gpus() {
            MayStage::Yes
        } else {
            MayStage::No
        };
        #[cfg(not(feature = "cuda"))]
        {
            let _ = options;
            MayStage::BuiltWithoutCuda
        }
    }

    fn posted(self) -> &'static [u8] {
        match self {
            MayStage::BuiltWithoutCuda => b"x",
            MayStage::No => b"0",
            MayStage::Yes => b"1",
        }
    }
}

/// Whether the group's `size` ranks vote: this rank's `mine`, posted under
/// `{key_prefix}/may_stage/{rank}`, and every other rank's (waited for up
/// to `timeout`): some rank may stage and every rank was built with CUDA.
/// A peer's answer that is none of `0`, `1`, `x` is
/// [`Error::PeerProtocol`] naming it.
pub(crate) fn group_votes(
    store: &dyn Store,
    key_prefix: &str,
    (rank, size): (usize, usize),
    timeout: Duration,
    mine: MayStage,
) -> Result<bool> {
    let key = |r: usize| format!("{key_prefix}/may_stage/{r}");
    store.set(&key(rank), mine.posted())?;
    // One request for every other rank's answer (not one each).
    let peers: Vec<usize> = (0..size).filter(|&r| r != rank).collect();
    let keys: Vec<String> = peers.iter().map(|&r| key(r)).collect();
    let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
    let answers = store.multi_get_timeout(&keys, timeout)?;
    let mut all = vec![mine];
    for (&peer, answer) in peers.iter().zip(&answers) {
        all.push(match &answer[..] {
            b"1" => MayStage::Yes,
            b"0" => MayStage::No,
            b"x" => MayStage::BuiltWithoutCuda,
            found => {
                return Err(Error::PeerProtocol {
                    peer,
                    expected: format!("0, 1 or x under {}", key(peer)),
                    found: format!("{:?}", String::from_utf8_lossy(found)),
                })
            }
        });
    }
    Ok(all.contains(&MayStage::Yes) && !all.contains(&MayStage::BuiltWithoutCuda))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::HashStore;
    use std::sync::Arc;

    /// Every rank's answer, each rank run on a thread of its own.
    fn agree(hosts: &[MayStage]) -> Vec<bool> {
        let store = Arc::new(HashStore::new());
        let size = hosts.len();
        let threads: Vec<_> = hosts
            .iter()
            .enumerate()
            .map(|(rank, &mine)| {
                let store = store.clone();
                std::thread::spawn(move || {
                    group_votes(&*store, "g", (rank, size), Duration::from_secs(10), mine).unwrap()
                })
            })
            .collect();
        threads.into_iter().map(|t| t.join().unwrap()).collect()
    }

    use MayStage::{BuiltWithoutCuda as Without, No, Yes};

    #[test]
    fn one_rank_with_gpus_makes_every_rank_vote() {
        assert_eq!(agree(&[No, No, Yes]), [true, true, true]);
        assert_eq!(agree(&[Yes, No]), [true, true]);
        assert_eq!(agree(&[Yes]), [true]);
    }

    #[test]
    fn ranks_without_gpus_never_vote() {
        assert_eq!(agree(&[No, No, No, No]), [false; 4]);
        assert_eq!(agree(&[No]), [false]);
    }

    #[test]
    fn a_rank_built_without_cuda_keeps_every_rank_from_voting() {
        assert_eq!(agree(&[Yes, Without, Yes]), [false; 3]);
        assert_eq!(agree(&[Without, No]), [false; 2]);
    }

    #[test]
    fn a_peer_posting_something_else_is_named() {
        let store = HashStore::new();
        store.set("g/may_stage/1", b"yes").unwrap();
        let err = group_votes(&store, "g", (0, 2), Duration::from_secs(1), No).unwrap_err();
        let text = err.to_string();
        assert!(matches!(err, Error::PeerProtocol { peer: 1, .. }), "{text}");
        assert!(text.contains("0, 1 or x") && text.contains("yes"), "{text}");
    }
}
