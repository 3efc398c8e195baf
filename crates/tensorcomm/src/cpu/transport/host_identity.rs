//! Which ranks share a host: each rank publishes an identity of the
//! shared-memory world it lives in, and compares the others' with its own.
//!
//! The identity is the hostname, the kernel's boot id
//! (`/proc/sys/kernel/random/boot_id`, new at every boot) and the device
//! number of the `/dev/shm` file system. Two processes with equal
//! identities see the same `/dev/shm` mount of the same running kernel, so
//! a segment one creates the other can open; containers with private
//! `/dev/shm` mounts differ in the device number and fall back to TCP.

use std::time::Duration;

use crate::store::Store;
use crate::{Error, Result};

/// This process's host identity (see the module docs). Parts that cannot
/// be read are left empty, which still only matches the same empty part.
///
/// ```
/// let id = tensorcomm::cpu::transport::host_identity();
/// assert_eq!(id, tensorcomm::cpu::transport::host_identity());
/// assert!(id.contains("boot="));
/// ```
pub fn host_identity() -> String {
    let read = |path: &str| {
        std::fs::read_to_string(path)
            .map(|s| s.trim().to_string())
            .unwrap_or_default()
    };
    #[cfg(unix)]
    let shm_dev = {
        use std::os::unix::fs::MetadataExt;
        std::fs::metadata("/dev/shm").map_or(String::new(), |m| m.dev().to_string())
    };
    #[cfg(not(unix))]
    let shm_dev = String::new();
    format!(
        "host={} boot={} shm={shm_dev}",
        read("/proc/sys/kernel/hostname"),
        read("/proc/sys/kernel/random/boot_id"),
    )
}

/// Publishes `mine` under `{key_prefix}/{rank}` and returns every rank's
/// identity (index = rank), waiting at most `timeout` for the others.
pub(crate) fn exchange(
    store: &dyn Store,
    key_prefix: &str,
    rank: usize,
    world_size: usize,
    mine: &str,
    timeout: Duration,
) -> Result<Vec<String>> {
    store.set(&format!("{key_prefix}/{rank}"), mine.as_bytes())?;
    let keys: Vec<String> = (0..world_size)
        .map(|r| format!("{key_prefix}/{r}"))
        .collect();
    let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
    let values = store.multi_get_timeout(&keys, timeout)?;
    values
        .into_iter()
        .enumerate()
        .map(|(r, v)| {
            String::from_utf8(v).map_err(|e| Error::PeerProtocol {
                peer: r,
                expected: "a UTF-8 host identity".into(),
                found: format!("{:?}", String::from_utf8_lossy(e.as_bytes())),
            })
        })
        .collect()
}
