//! A group's shared-memory arena (every rank on this host, reached over
//! shared memory), with the helper threads its collectives split their
//! work with, the group's symmetric allocations and the fewest cores of
//! any rank (so that every rank picks the same thread count).

use std::sync::Arc;
use std::time::Duration;

use super::transport::shm::{ShmArena, ShmWait, SymmetricRegistry};
use super::HelperThreads;
use crate::store::Store;
use crate::{Error, Result};

/// See the module docs.
pub(crate) struct GroupArena {
    pub(crate) shm: Arc<ShmArena>,
    pub(crate) helpers: HelperThreads,
    /// The group's symmetric allocations (`symmetric_zeros`).
    pub(crate) symmetric: SymmetricRegistry,
    /// The fewest cores any rank of the group may use.
    pub(crate) cores: usize,
}

impl GroupArena {
    /// Maps the arena of rank `rank` of `size` (slot halves of `chunk`
    /// bytes, waits on the other ranks by `wait`) through `store` under
    /// `key_prefix`.
    pub(crate) fn connect(
        store: &dyn Store,
        key_prefix: &str,
        (rank, size): (usize, usize),
        chunk: usize,
        wait: ShmWait,
        timeout: Duration,
    ) -> Result<Self> {
        let mut shm = ShmArena::connect(store, key_prefix, rank, size, chunk, timeout)?;
        shm.set_wait(wait);
        Ok(GroupArena {
            shm: Arc::new(shm),
            helpers: HelperThreads::new(&format!("arena-rank{rank}")),
            symmetric: SymmetricRegistry::default(),
            cores: fewest_cores(store, key_prefix, rank, size, timeout)?,
        })
    }
}

/// The fewest cores any of the `size` ranks may use ([`super::host_cores`],
/// which a container's CPU quota can make differ between ranks of one
/// host), exchanged through the store under `{key_prefix}/arena/cores`.
fn fewest_cores(
    store: &dyn Store,
    key_prefix: &str,
    rank: usize,
    size: usize,
    timeout: Duration,
) -> Result<usize> {
    let key = |r: usize| format!("{key_prefix}/arena/cores/{r}");
    store.set(&key(rank), super::host_cores().to_string().as_bytes())?;
    let mut fewest = super::host_cores();
    for r in (0..size).filter(|&r| r != rank) {
        let raw = store.get_timeout(&key(r), timeout)?;
        let text = String::from_utf8_lossy(&raw).into_owned();
        let cores = text.parse::<usize>().map_err(|_| Error::BadValue {
            name: key(r),
            expected: "a number of cores".into(),
            found: text.clone(),
        })?;
        fewest = fewest.min(cores.max(1));
    }
    Ok(fewest)
}
