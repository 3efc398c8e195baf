//! The CPU backend's machinery: transports that move bytes between the
//! ranks of a group, reduction kernels, and collective algorithms written
//! over the [`Transport`](transport::Transport) trait.
//!
//! ```
//! use tensorcomm::cpu::reduce_kernels::{reduce_into, ReduceOp};
//! use tensorcomm::tensor::DType;
//!
//! let mut acc: Vec<u8> = [1.0f32, 2.0].iter().flat_map(|v| v.to_ne_bytes()).collect();
//! let other: Vec<u8> = [3.0f32, -5.0].iter().flat_map(|v| v.to_ne_bytes()).collect();
//! reduce_into(ReduceOp::Max, DType::F32, &mut acc, &other)?;
//! assert_eq!(acc[4..8], 2.0f32.to_ne_bytes());
//! # Ok::<(), tensorcomm::Error>(())
//! ```

pub mod algorithms;
pub mod backend;
mod close_at_exit;
mod collectives;
mod fingerprinted;
#[cfg(target_os = "linux")]
mod group_arena;
mod group_backend;
mod helper_threads;
pub mod reduce_kernels;
pub(crate) mod select;
pub(crate) mod setup_watch;
pub mod transport;

mod monitored_barrier;
pub(crate) mod p2p;
mod pipeline_choice;
pub(crate) mod sparse_all_reduce;

pub use helper_threads::HelperThreads;

/// The cores this process may use, read once: asking the system costs
/// tens of microseconds (it reads the cgroup's CPU quota), too much to
/// repeat for every collective.
///
/// ```
/// assert!(tensorcomm::cpu::host_cores() >= 1);
/// ```
pub fn host_cores() -> usize {
    static CORES: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *CORES.get_or_init(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
}

/// The CPUs online on this host, read once: what ranks of one host share,
/// whichever CPUs each of them is pinned to (a rank pinned to one core
/// sees one in [`host_cores`], though its peers have cores of their own).
/// Shared-memory waits sleep sooner when a host's ranks outnumber them.
///
/// ```
/// assert!(tensorcomm::cpu::host_cpus_online() >= 1);
/// ```
pub fn host_cpus_online() -> usize {
    static ONLINE: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *ONLINE.get_or_init(|| {
        // SAFETY: sysconf reads a system value; no pointers.
        let online = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_ONLN) };
        usize::try_from(online)
            .ok()
            .filter(|&n| n > 0)
            .unwrap_or_else(host_cores)
            .max(host_cores())
    })
}
