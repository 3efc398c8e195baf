//! Every `TENSORCOMM_*` environment variable tensorcomm reads, in one
//! registry: its name, default and what it does. Code reads a variable
//! through its entry here; the README's table is written from
//! [`markdown_table`] (a test keeps the two equal).
//!
//! Variables that choose how a process group's collectives run
//! ([`EnvVar::agreed`]) are read once, when the group is created, and
//! every rank must see the same value: a rank whose value differs gets
//! [`Error::TuningMismatch`](crate::Error::TuningMismatch) naming the
//! variable and both values at creation, and a value that does not parse
//! fails creation with [`Error::BadValue`](crate::Error::BadValue) naming
//! it.
//!
//! ```
//! use tensorcomm::env_vars::{VARIABLES, TRANSPORT};
//! assert!(VARIABLES.iter().any(|v| v.name == TRANSPORT.name));
//! assert_eq!(TRANSPORT.default, "auto");
//! assert!(tensorcomm::env_vars::markdown_table().contains("`TENSORCOMM_TRANSPORT`"));
//! ```

/// One environment variable.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EnvVar {
    /// Its name.
    pub name: &'static str,
    /// What applies when it is unset.
    pub default: &'static str,
    /// What it does.
    pub doc: &'static str,
    /// True if every rank of a process group must see the same value
    /// (checked at group creation).
    pub agreed: bool,
}

impl EnvVar {
    /// Its value, if set (and valid Unicode).
    ///
    /// ```
    /// assert_eq!(tensorcomm::env_vars::LAUNCHED.name, "TENSORCOMM_LAUNCHED");
    /// let _maybe = tensorcomm::env_vars::LAUNCHED.get();
    /// ```
    pub fn get(&self) -> Option<String> {
        std::env::var(self.name).ok()
    }

    /// Its value, if set; one that is not valid Unicode comes back
    /// converted lossily (U+FFFD for each bad sequence), so that its
    /// parser rejects it as a bad value instead of taking it for unset, as
    /// [`get`](Self::get) would.
    pub(crate) fn get_lossy(&self) -> Option<String> {
        lossy(std::env::var_os(self.name))
    }
}

/// `value` as a `String`, each sequence that is not valid Unicode
/// replaced by U+FFFD.
pub(crate) fn lossy(value: Option<std::ffi::OsString>) -> Option<String> {
    value.map(|v| {
        v.into_string()
            .unwrap_or_else(|v| v.to_string_lossy().into_owned())
    })
}

/// `TENSORCOMM_LOG`.
pub const LOG: EnvVar = EnvVar {
    name: "TENSORCOMM_LOG",
    default: "warn",
    doc: "log filter of the `tensorcomm` command (`debug` shows connections, algorithm choices and timings)",
    agreed: false,
};

/// `TENSORCOMM_TRANSPORT`.
pub const TRANSPORT: EnvVar = EnvVar {
    name: "TENSORCOMM_TRANSPORT",
    default: "auto",
    doc: "CPU groups: `auto` (shared memory between ranks of one host, TCP across hosts), `tcp` (TCP only) or `shm` (shared memory required)",
    agreed: true,
};

/// `TENSORCOMM_TCP_LANES`.
pub const TCP_LANES: EnvVar = EnvVar {
    name: "TENSORCOMM_TCP_LANES",
    default: "from the cores per rank, up to 4",
    doc: "TCP connections per pair of ranks (1 to 8; rank 0's value wins); messages from 256 KiB travel over them as parallel stripes",
    agreed: false,
};

/// `TENSORCOMM_SHM_ARENA_THREADS`.
pub const SHM_ARENA_THREADS: EnvVar = EnvVar {
    name: "TENSORCOMM_SHM_ARENA_THREADS",
    default: "by size, ranks and the fewest cores of any rank",
    doc: "threads per rank (1 to 64) of the shared-memory all-reduce and reduce",
    agreed: true,
};

/// `TENSORCOMM_SHM_ARENA_CHUNK`.
pub const SHM_ARENA_CHUNK: EnvVar = EnvVar {
    name: "TENSORCOMM_SHM_ARENA_CHUNK",
    default: "4M at 2 ranks, 2M at 3-4, 1M from 5",
    doc: "step buffer per rank of the shared-memory arena (4K to 64M)",
    agreed: true,
};

/// `TENSORCOMM_SHM_ARENA_MIN`.
pub const SHM_ARENA_MIN: EnvVar = EnvVar {
    name: "TENSORCOMM_SHM_ARENA_MIN",
    default: "4K at 2-3 ranks, 2K at 4-7, 1K from 8",
    doc: "size above which an all-reduce takes the shared-memory arena",
    agreed: true,
};

/// `TENSORCOMM_SHM_WAIT`.
pub const SHM_WAIT: EnvVar = EnvVar {
    name: "TENSORCOMM_SHM_WAIT",
    default: "auto",
    doc: "how a CPU-group rank waits for its peers in shared memory (links and arena): `spin` (spin ~50 µs, then yield until ~2 ms, then sleep: the lowest latency while every rank has a CPU), `sleep` (spin ~5 µs, then yield until ~2 ms, then sleep on a futex until the peer wakes it by its write to the ring or its progress in the arena: for more ranks than CPUs) or `auto` (`sleep` when the host runs more of the group's ranks than it has CPUs online, else `spin`); `sleep` also keeps the group's thread and a caller waiting on it from polling ~50 µs after a short collective (with `spin` or `auto`, a group of two or more ranks polls when the host has two CPUs online for each rank on it and the process may use two); each rank's own choice, read when a group is created",
    agreed: false,
};

/// `TENSORCOMM_CPU_ALL_REDUCE`.
pub const CPU_ALL_REDUCE: EnvVar = EnvVar {
    name: "TENSORCOMM_CPU_ALL_REDUCE",
    default: "by size and ranks",
    doc: "forces the all-reduce over the transport: `direct`, `halving_doubling` or `ring`",
    agreed: true,
};

/// `TENSORCOMM_RING_SEGMENT`.
pub const RING_SEGMENT: EnvVar = EnvVar {
    name: "TENSORCOMM_RING_SEGMENT",
    default: "1M",
    doc: "segment of the ring all-reduce and reduce (4K to 64M)",
    agreed: true,
};

/// `TENSORCOMM_SENDER_CHECK`.
pub const SENDER_CHECK: EnvVar = EnvVar {
    name: "TENSORCOMM_SENDER_CHECK",
    default: "1",
    doc: "1: a CPU-group rank that only sends in a collective (a broadcast root, a reduce or gather leaf) learns its receivers' fingerprints, so a mismatch fails it at that call; 0: it learns at its next call, and rooted collectives of small messages run up to 2x faster back to back",
    agreed: true,
};

/// `TENSORCOMM_FLIGHT_RECORDER_SIZE`.
pub const FLIGHT_RECORDER_SIZE: EnvVar = EnvVar {
    name: "TENSORCOMM_FLIGHT_RECORDER_SIZE",
    default: "64",
    doc: "collectives each group's flight recorder keeps (0 turns it off)",
    agreed: false,
};

/// `TENSORCOMM_FLIGHT_RECORDER_DIR`.
pub const FLIGHT_RECORDER_DIR: EnvVar = EnvVar {
    name: "TENSORCOMM_FLIGHT_RECORDER_DIR",
    default: "unset: no file",
    doc: "folder where a failed collective's flight record is written",
    agreed: false,
};

/// `TENSORCOMM_STORE_TOKEN`.
pub const STORE_TOKEN: EnvVar = EnvVar {
    name: "TENSORCOMM_STORE_TOKEN",
    default: "unset: no secret",
    doc: "the job's shared secret: the TCP store's server asks it of every client, and CPU-group TCP connections prove it in their handshake (see the README's Security section)",
    agreed: false,
};

/// `TENSORCOMM_BIND_ALL`.
pub const BIND_ALL: EnvVar = EnvVar {
    name: "TENSORCOMM_BIND_ALL",
    default: "0",
    doc: "1: rank 0's TCP store and the CPU transport's TCP listeners listen on every interface; 0: only on the address peers are told (`MASTER_ADDR`'s interface for the store, the advertised address for the transport)",
    agreed: false,
};

/// `TENSORCOMM_CACHE_DIR`.
pub const CACHE_DIR: EnvVar = EnvVar {
    name: "TENSORCOMM_CACHE_DIR",
    default: "$XDG_CACHE_HOME/tensorcomm/kernels, else ~/.cache/tensorcomm/kernels",
    doc: "where compiled CUDA kernels are cached",
    agreed: false,
};

/// `TENSORCOMM_CUDA_COPY`.
pub const CUDA_COPY: EnvVar = EnvVar {
    name: "TENSORCOMM_CUDA_COPY",
    default: "auto",
    doc: "`cuda::comm` copies between GPUs with `kernel`, copy engines (`ce`) or either by size (`auto`)",
    agreed: false,
};

/// `TENSORCOMM_CUDA_CE_MIN`.
pub const CUDA_CE_MIN: EnvVar = EnvVar {
    name: "TENSORCOMM_CUDA_CE_MIN",
    default: "4M",
    doc: "smallest range between two GPUs that `auto` gives the copy engines",
    agreed: false,
};

/// `TENSORCOMM_CUDA_CE_STREAMS`.
pub const CUDA_CE_STREAMS: EnvVar = EnvVar {
    name: "TENSORCOMM_CUDA_CE_STREAMS",
    default: "1",
    doc: "streams a copy-engine copy is spread over",
    agreed: false,
};

/// `TENSORCOMM_CUDA_ONE_LAUNCH_MAX`.
pub const CUDA_ONE_LAUNCH_MAX: EnvVar = EnvVar {
    name: "TENSORCOMM_CUDA_ONE_LAUNCH_MAX",
    default: "4M",
    doc: "`cuda::comm` calls moving at most this many bytes copy in one kernel launch",
    agreed: false,
};

/// `TENSORCOMM_CUDA_CHAIN_MIN`.
pub const CUDA_CHAIN_MIN: EnvVar = EnvVar {
    name: "TENSORCOMM_CUDA_CHAIN_MIN",
    default: "8M",
    doc: "smallest `cuda::comm` broadcast (`broadcast_out`, `broadcast_coalesced` in all) or reduce_add over three or more GPUs that moves along a pipelined chain of the GPUs; `off`: never (every copy leaves the source, every input is read by the destination)",
    agreed: false,
};

/// `TENSORCOMM_CUDA_CHAIN_CHUNK`.
pub const CUDA_CHAIN_CHUNK: EnvVar = EnvVar {
    name: "TENSORCOMM_CUDA_CHAIN_CHUNK",
    default: "a 16th of the message, 8M-32M",
    doc: "the chain's chunk (smaller chunks leave the GPUs waiting for the host: 2M chunks were slower than no chain)",
    agreed: false,
};

/// `TENSORCOMM_NCCL_LIBRARY`.
pub const NCCL_LIBRARY: EnvVar = EnvVar {
    name: "TENSORCOMM_NCCL_LIBRARY",
    default: "`libnccl.so.2`, then `libnccl.so`, from the loader's path",
    doc: "the NCCL library the NCCL backend loads (a file name or path)",
    agreed: false,
};

/// `TENSORCOMM_NCCL_LAUNCH`.
pub const NCCL_LAUNCH: EnvVar = EnvVar {
    name: "TENSORCOMM_NCCL_LAUNCH",
    default: "nonblocking",
    doc: "how NCCL collectives are queued: `nonblocking` (NCCL queues each call from a thread of its own, 70-200 µs of host time a call) or `blocking` (the caller's thread queues them: 5-8x less host time a call; it needs `NCCL_RUNTIME_CONNECT=0` on every rank, so that NCCL connects the collectives' peers while the group is created (without it rank 0 launches non-blocking, with a warning), and sends, receives and sub-group splits go through a non-blocking communicator; with ranks as threads of one process, a collective after a dropped sub-group hung on two H200s); rank 0's value applies to the group",
    agreed: false,
};

/// `TENSORCOMM_INTRANODE`.
pub const INTRANODE: EnvVar = EnvVar {
    name: "TENSORCOMM_INTRANODE",
    default: "auto",
    doc: "peer-memory all-reduce (`cuda::intranode`): `auto` (ranks of one host, in separate processes, on distinct NVLink-connected GPUs), `shared` (also ranks sharing a GPU or PCIe peers), `off`",
    agreed: true,
};

/// `TENSORCOMM_INTRANODE_ALGO`.
pub const INTRANODE_ALGO: EnvVar = EnvVar {
    name: "TENSORCOMM_INTRANODE_ALGO",
    default: "auto",
    doc: "peer-memory all-reduce algorithm: `auto` (by size), `push`, `one_shot`, `two_shot` or `large` (where the message fits the algorithm's buffer)",
    agreed: true,
};

/// `TENSORCOMM_INTRANODE_REGION`.
pub const INTRANODE_REGION: EnvVar = EnvVar {
    name: "TENSORCOMM_INTRANODE_REGION",
    default: "16M",
    doc: "bytes of each of the two eager peer-memory buffer regions a rank maps, beside a graph region twice as large (4K to 1024G, suffixes K, M, G); the large kernel moves a message in chunks of a region, eager or in a CUDA graph, so larger regions mean fewer barriers per byte",
    agreed: true,
};

/// `TENSORCOMM_INTRANODE_OVERLAP`.
pub const INTRANODE_OVERLAP: EnvVar = EnvVar {
    name: "TENSORCOMM_INTRANODE_OVERLAP",
    default: "1",
    doc: "1: on GPUs of compute capability 9.0 and later, with one rank per GPU, peer-memory all-reduce kernels are launched as programmatic dependent launches, so that a call's kernel can be scheduled while the kernel before it on the stream still runs (it waits for that kernel on the GPU before it reads anything); 0: usual launches",
    agreed: false,
};

/// `TENSORCOMM_LAUNCHED`.
pub const LAUNCHED: EnvVar = EnvVar {
    name: "TENSORCOMM_LAUNCHED",
    default: "unset",
    doc: "set to 1 by `tensorcomm run` for the ranks it starts",
    agreed: false,
};

/// `TENSORCOMM_LAUNCH_EXITS`.
pub const LAUNCH_EXITS: EnvVar = EnvVar {
    name: "TENSORCOMM_LAUNCH_EXITS",
    default: "unset",
    doc: "set by `tensorcomm run`: a file where it writes each of its ranks' exits (`rank 2 exited with status 0`), which a rendezvous of its ranks (the `RANK` and `WORLD_SIZE` it set) reads to fail at once, naming the rank, when a rank it waits for exited before joining (only the ranks of the launcher's own node are listed)",
    agreed: false,
};

/// Every variable, in the README's order.
pub const VARIABLES: &[EnvVar] = &[
    LOG,
    TRANSPORT,
    TCP_LANES,
    SHM_ARENA_THREADS,
    SHM_ARENA_CHUNK,
    SHM_ARENA_MIN,
    SHM_WAIT,
    CPU_ALL_REDUCE,
    RING_SEGMENT,
    SENDER_CHECK,
    FLIGHT_RECORDER_SIZE,
    FLIGHT_RECORDER_DIR,
    STORE_TOKEN,
    BIND_ALL,
    CACHE_DIR,
    CUDA_COPY,
    CUDA_CE_MIN,
    CUDA_CE_STREAMS,
    CUDA_ONE_LAUNCH_MAX,
    CUDA_CHAIN_MIN,
    CUDA_CHAIN_CHUNK,
    NCCL_LIBRARY,
    NCCL_LAUNCH,
    INTRANODE,
    INTRANODE_ALGO,
    INTRANODE_OVERLAP,
    INTRANODE_REGION,
    LAUNCHED,
    LAUNCH_EXITS,
];

/// The README's table of [`VARIABLES`] (Markdown).
pub fn markdown_table() -> String {
    let mut out = String::from(
        "| variable | default | what it does | every rank the same |\n| --- | --- | --- | --- |\n",
    );
    for v in VARIABLES {
        let agreed = if v.agreed { "yes" } else { "" };
        out.push_str(&format!(
            "| `{}` | {} | {} | {} |\n",
            v.name, v.default, v.doc, agreed
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_name_is_unique_and_prefixed() {
        let mut names: Vec<_> = VARIABLES.iter().map(|v| v.name).collect();
        assert!(names.iter().all(|n| n.starts_with("TENSORCOMM_")));
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), VARIABLES.len());
    }

    #[test]
    fn the_readme_table_is_the_registrys() {
        let readme = include_str!("../../../README.md");
        let table = markdown_table();
        assert!(
            readme.contains(&table),
            "README.md's environment table differs from the registry; it should read:\n{table}"
        );
    }
}
