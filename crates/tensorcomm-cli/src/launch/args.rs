//! The command line of `tensorcomm run` and its validation into a [`JobPlan`].

use std::ffi::OsString;
use std::time::Duration;

use super::plan::{self, JobPlan};

/// Start the ranks of a job on this node (torchrun-style).
#[derive(clap::Args, Debug)]
#[command(
    after_help = "Each rank gets the torchrun environment: MASTER_ADDR, MASTER_PORT, \
RANK (= node-rank * nproc-per-node + LOCAL_RANK), WORLD_SIZE (= nnodes * nproc-per-node), \
LOCAL_RANK, LOCAL_WORLD_SIZE, GROUP_RANK (= node-rank) and TENSORCOMM_LAUNCHED=1.\n\
When a rank fails, the others get SIGTERM (and SIGCONT, so stopped ranks act on it), then SIGKILL after --kill-grace-secs, and the \
launcher exits with the failing rank's status (128 + signal when killed by one).\n\n\
Example: tensorcomm run --nproc-per-node 4 -- ./train --epochs 3"
)]
pub struct RunArgs {
    /// Ranks (processes) to start on this node.
    #[arg(long, value_name = "N", default_value_t = 1)]
    pub nproc_per_node: usize,

    /// Nodes in the job; run one launcher per node.
    #[arg(long, value_name = "M", default_value_t = 1)]
    pub nnodes: usize,

    /// This node's index, 0..M.
    #[arg(long, value_name = "K", default_value_t = 0)]
    pub node_rank: usize,

    /// Address of node 0, where rank 0 serves the rendezvous store
    /// [default: 127.0.0.1 on one node; required with --nnodes > 1].
    #[arg(long, value_name = "ADDR")]
    pub master_addr: Option<String>,

    /// Port of the rendezvous store [default: a free port on one node, 29500 on several].
    #[arg(long, value_name = "PORT", value_parser = clap::value_parser!(u16).range(1..))]
    pub master_port: Option<u16>,

    /// Seconds ranks get to exit after SIGTERM before they get SIGKILL.
    #[arg(
        long,
        value_name = "SECS",
        allow_negative_numbers = true,
        default_value_t = plan::DEFAULT_KILL_GRACE.as_secs_f64()
    )]
    pub kill_grace_secs: f64,

    /// Pass the ranks' output through unchanged instead of prefixing lines with `[rankN]: `.
    #[arg(long)]
    pub no_prefix: bool,

    /// The program every rank runs, then its arguments.
    #[arg(
        value_name = "PROGRAM",
        required = true,
        trailing_var_arg = true,
        allow_hyphen_values = true
    )]
    pub command: Vec<OsString>,
}

/// The most ranks one launcher starts: each is a process with two pipes
/// open here (two descriptors of the launcher per rank), the guardian that
/// ends the ranks' trees when the launcher is killed tracks this many, and a
/// host cannot usefully run more.
pub const MAX_NPROC_PER_NODE: usize = 4096;

impl RunArgs {
    /// Check the arguments and fill in defaults. The error says which flag is
    /// wrong, what was expected and what was found.
    pub fn into_plan(self) -> Result<JobPlan, String> {
        if self.nproc_per_node == 0 {
            return Err("--nproc-per-node must be at least 1 (found 0)".into());
        }
        if self.nproc_per_node > MAX_NPROC_PER_NODE {
            return Err(format!(
                "--nproc-per-node must be at most {MAX_NPROC_PER_NODE} (each rank is a process with two pipes open in the launcher), found {}",
                self.nproc_per_node
            ));
        }
        if self.nnodes == 0 {
            return Err("--nnodes must be at least 1 (found 0)".into());
        }
        if self.node_rank >= self.nnodes {
            return Err(format!(
                "--node-rank must be less than --nnodes {} (expected 0..={}, found {})",
                self.nnodes,
                self.nnodes - 1,
                self.node_rank
            ));
        }
        if self.nnodes.checked_mul(self.nproc_per_node).is_none() {
            return Err(format!(
                "--nnodes {} times --nproc-per-node {} overflows the world size",
                self.nnodes, self.nproc_per_node
            ));
        }
        let kill_grace = Duration::try_from_secs_f64(self.kill_grace_secs).map_err(|_| {
            format!(
                "--kill-grace-secs must be a finite number of seconds >= 0 (found {})",
                self.kill_grace_secs
            )
        })?;

        let mut command = self.command.into_iter();
        let program = match command.next() {
            Some(program) if !program.is_empty() => program,
            _ => {
                return Err("missing the program to run (expected `tensorcomm run [OPTIONS] -- PROGRAM [ARGS...]`, found an empty program name)".into())
            }
        };

        let master_addr = match self.master_addr {
            Some(addr) if addr.is_empty() => {
                return Err("--master-addr must not be empty (expected a host name or IP address of node 0)".into())
            }
            Some(addr) => addr,
            None if self.nnodes > 1 => {
                return Err(format!(
                    "--nnodes {} needs --master-addr: the address of node 0, where rank 0 serves the rendezvous store (found none)",
                    self.nnodes
                ))
            }
            None => plan::LOCAL_MASTER_ADDR.to_string(),
        };
        let master_port = match self.master_port {
            Some(port) => port,
            None if self.nnodes > 1 => plan::DEFAULT_MULTI_NODE_PORT,
            None => plan::free_local_port().map_err(|e| {
                format!("could not find a free port on 127.0.0.1 for MASTER_PORT ({e}); pass --master-port")
            })?,
        };

        Ok(JobPlan {
            program,
            args: command.collect(),
            nproc_per_node: self.nproc_per_node,
            nnodes: self.nnodes,
            node_rank: self.node_rank,
            master_addr,
            master_port,
            kill_grace,
            prefix_output: !self.no_prefix,
            extra_env: Vec::new(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Wrapper {
        #[command(flatten)]
        run: RunArgs,
    }

    fn parse(args: &[&str]) -> Result<JobPlan, String> {
        let argv = std::iter::once("run").chain(args.iter().copied());
        Wrapper::try_parse_from(argv)
            .map_err(|e| e.to_string())?
            .run
            .into_plan()
    }

    #[test]
    fn program_and_its_flags_are_kept_verbatim() {
        let plan = parse(&[
            "--nproc-per-node",
            "2",
            "--",
            "prog",
            "--nproc-per-node",
            "-x",
        ])
        .expect("valid");
        assert_eq!(plan.program, "prog");
        assert_eq!(plan.args, ["--nproc-per-node", "-x"]);
        assert_eq!(plan.nproc_per_node, 2);
        assert_eq!(plan.master_addr, "127.0.0.1");
        assert_ne!(plan.master_port, 0);
        assert!(plan.prefix_output);
    }

    #[test]
    fn multi_node_defaults_to_port_29500() {
        let plan = parse(&[
            "--nnodes",
            "2",
            "--node-rank",
            "1",
            "--master-addr",
            "h0",
            "p",
        ])
        .expect("valid");
        assert_eq!(plan.master_port, 29500);
        assert_eq!(plan.global_rank(0), 1);
    }

    #[test]
    fn bad_values_are_named() {
        let err = parse(&["--nproc-per-node", "100000", "p"]).unwrap_err();
        assert!(
            err.contains("at most 4096") && err.contains("found 100000"),
            "{err}"
        );
        assert!(parse(&["--nproc-per-node", "4096", "p"]).is_ok());
        let err = parse(&["--nproc-per-node", "0", "p"]).unwrap_err();
        assert!(
            err.contains("--nproc-per-node") && err.contains("found 0"),
            "{err}"
        );
        let err = parse(&[
            "--nnodes",
            "2",
            "--node-rank",
            "2",
            "--master-addr",
            "h",
            "p",
        ])
        .unwrap_err();
        assert!(
            err.contains("--node-rank") && err.contains("found 2"),
            "{err}"
        );
        let err = parse(&["--nnodes", "2", "p"]).unwrap_err();
        assert!(err.contains("--master-addr"), "{err}");
        let err = parse(&["--kill-grace-secs", "-1", "p"]).unwrap_err();
        assert!(err.contains("--kill-grace-secs"), "{err}");
        let err = parse(&["--master-port", "0", "p"]).unwrap_err();
        assert!(err.contains("--master-port"), "{err}");
        let err = parse(&[""]).unwrap_err();
        assert!(err.contains("missing the program"), "{err}");
    }
}
