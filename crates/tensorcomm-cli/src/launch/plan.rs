//! A validated job: what to start, how many ranks, and the torchrun
//! environment each rank gets.

use std::ffi::OsString;
use std::io;
use std::net::{Ipv4Addr, TcpListener};
use std::time::Duration;

/// `MASTER_ADDR` of a single-node job when none is given.
pub const LOCAL_MASTER_ADDR: &str = "127.0.0.1";
/// `MASTER_PORT` of a multi-node job when none is given (torchrun's default).
pub const DEFAULT_MULTI_NODE_PORT: u16 = 29500;
/// How long ranks get between SIGTERM and SIGKILL when none is given.
pub const DEFAULT_KILL_GRACE: Duration = Duration::from_secs(5);

/// Everything the launcher needs to start and supervise the ranks of one node.
#[derive(Debug, Clone)]
pub struct JobPlan {
    /// The program every rank runs.
    pub program: OsString,
    /// Its arguments.
    pub args: Vec<OsString>,
    /// Ranks on this node (`LOCAL_WORLD_SIZE`), at least 1.
    pub nproc_per_node: usize,
    /// Nodes in the job, at least 1.
    pub nnodes: usize,
    /// This node's index, below `nnodes` (`GROUP_RANK`).
    pub node_rank: usize,
    /// Where rank 0 serves the rendezvous store.
    pub master_addr: String,
    /// The port it serves it on.
    pub master_port: u16,
    /// Time between SIGTERM and SIGKILL when the job is stopped.
    pub kill_grace: Duration,
    /// Prefix each output line with `[rankN]: ` (else output is inherited).
    pub prefix_output: bool,
    /// Extra variables for every rank; the torchrun variables win over these.
    pub extra_env: Vec<(String, String)>,
}

impl JobPlan {
    /// Ranks in the whole job (`WORLD_SIZE`). Validation guarantees no overflow.
    pub fn world_size(&self) -> usize {
        self.nnodes * self.nproc_per_node
    }

    /// The global rank (`RANK`) of the process with `local_rank` on this node.
    pub fn global_rank(&self, local_rank: usize) -> usize {
        self.node_rank * self.nproc_per_node + local_rank
    }

    /// The torchrun environment contract for one local rank, plus
    /// `TENSORCOMM_LAUNCHED=1`.
    pub fn rank_env(&self, local_rank: usize) -> Vec<(&'static str, String)> {
        vec![
            ("MASTER_ADDR", self.master_addr.clone()),
            ("MASTER_PORT", self.master_port.to_string()),
            ("RANK", self.global_rank(local_rank).to_string()),
            ("WORLD_SIZE", self.world_size().to_string()),
            ("LOCAL_RANK", local_rank.to_string()),
            ("LOCAL_WORLD_SIZE", self.nproc_per_node.to_string()),
            ("GROUP_RANK", self.node_rank.to_string()),
            ("TENSORCOMM_LAUNCHED", "1".to_string()),
        ]
    }
}

/// A port on 127.0.0.1 that nothing listens on right now: bind port 0, read
/// what the kernel picked, release it. Another process could take it before
/// rank 0 binds it, as with torchrun; in practice the kernel hands out ports
/// round-robin, so that is rare.
pub fn free_local_port() -> io::Result<u16> {
    let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))?;
    Ok(listener.local_addr()?.port())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan(nproc_per_node: usize, nnodes: usize, node_rank: usize) -> JobPlan {
        JobPlan {
            program: "prog".into(),
            args: Vec::new(),
            nproc_per_node,
            nnodes,
            node_rank,
            master_addr: "10.0.0.1".into(),
            master_port: 1234,
            kill_grace: DEFAULT_KILL_GRACE,
            prefix_output: true,
            extra_env: Vec::new(),
        }
    }

    #[test]
    fn rank_env_follows_the_torchrun_contract() {
        let env = plan(4, 3, 2).rank_env(1);
        let get = |key: &str| {
            env.iter()
                .find(|(k, _)| *k == key)
                .map(|(_, v)| v.as_str())
                .unwrap_or_else(|| panic!("{key} missing from {env:?}"))
        };
        assert_eq!(get("RANK"), "9");
        assert_eq!(get("WORLD_SIZE"), "12");
        assert_eq!(get("LOCAL_RANK"), "1");
        assert_eq!(get("LOCAL_WORLD_SIZE"), "4");
        assert_eq!(get("GROUP_RANK"), "2");
        assert_eq!(get("MASTER_ADDR"), "10.0.0.1");
        assert_eq!(get("MASTER_PORT"), "1234");
        assert_eq!(get("TENSORCOMM_LAUNCHED"), "1");
    }

    #[test]
    fn free_local_port_is_bindable() {
        let port = free_local_port().expect("free port");
        assert_ne!(port, 0);
        TcpListener::bind((Ipv4Addr::LOCALHOST, port)).expect("the port it returned is free");
    }
}
