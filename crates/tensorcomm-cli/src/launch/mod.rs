//! `tensorcomm run`: start the ranks of a job on this node, torchrun-style.
//!
//! - [`args`]: the command line and its validation into a [`plan::JobPlan`];
//! - [`plan`]: the job and the torchrun environment of each rank;
//! - [`limits`]: refusing a job the process limits have no room for;
//! - [`master_addr`]: refusing on node 0 a `--master-addr` that does not resolve;
//! - [`spawn`]: starting one rank (process group, pipes, death signal);
//! - [`output`]: `[rankN]: ` line prefixing, whole lines under one lock;
//! - [`pump`]: the one thread copying every rank's pipes;
//! - [`signals`]: catching, forwarding and naming signals;
//! - [`supervise`]: waiting, stopping the job when a rank fails, draining output;
//! - [`early_exit`]: saying so when a rank exits 0 while the others run on;
//! - [`exits_file`]: telling the ranks which of them have exited, so that
//!   their rendezvous fails at once instead of waiting for one that left;
//! - [`outcome`]: the exit code and the message about how the job ended.
//!
//! [`launch_local`] gives other subcommands the same machinery to start N
//! copies of a program (usually `std::env::current_exe()`) on this machine.

mod args;
mod early_exit;
mod exits_file;
mod guard;
mod limits;
mod master_addr;
mod outcome;
mod output;
mod plan;
mod pump;
mod signals;
mod spawn;
mod supervise;

use std::ffi::OsString;
use std::path::Path;
use std::process::ExitCode;

pub use args::RunArgs;
use plan::JobPlan;

/// `tensorcomm run`: validate, start the ranks, supervise them, report.
pub fn main(args: RunArgs) -> ExitCode {
    match args.into_plan() {
        Ok(plan) => launch(&plan),
        Err(message) => {
            eprintln!("tensorcomm run: error: {message}");
            ExitCode::from(2)
        }
    }
}

/// Start `nproc` copies of `program args...` on this machine as one job
/// (RANK 0..nproc, MASTER_ADDR 127.0.0.1, MASTER_PORT `master_port` or a free
/// port, plus `extra_env`), with prefixed output, wait for them and return
/// the job's exit code, exactly as `tensorcomm run --nproc-per-node nproc`
/// would. Blocks until every rank has been reaped; must run on a thread that
/// lives that long (any caller's thread does, since this blocks).
///
/// ```no_run
/// let exe = std::env::current_exe().expect("own path");
/// let code = launch::launch_local(&exe, &["demo".into(), "--worker".into()], 4, None, &[]);
/// ```
#[allow(
    dead_code,
    reason = "called by the `demo` and `bench` subcommands as they land"
)]
pub fn launch_local(
    program: &Path,
    args: &[OsString],
    nproc: usize,
    master_port: Option<u16>,
    extra_env: &[(String, String)],
) -> ExitCode {
    launch_local_with(program, args, nproc, master_port, extra_env, true)
}

/// [`launch_local`], choosing whether rank output gets the `[rankN]: `
/// prefix. Without it the ranks inherit this process's stdout and stderr
/// (so a rank can tell whether stderr is a terminal, and a program whose
/// rank 0 alone prints, like `bench --json`, produces clean output).
pub fn launch_local_with(
    program: &Path,
    args: &[OsString],
    nproc: usize,
    master_port: Option<u16>,
    extra_env: &[(String, String)],
    prefix_output: bool,
) -> ExitCode {
    if nproc == 0 || nproc > args::MAX_NPROC_PER_NODE {
        eprintln!(
            "tensorcomm: error: launch_local needs 1 to {} processes (found nproc = {nproc})",
            args::MAX_NPROC_PER_NODE
        );
        return ExitCode::from(2);
    }
    let master_port = match master_port.filter(|&p| p != 0) {
        Some(port) => port,
        None => match plan::free_local_port() {
            Ok(port) => port,
            Err(e) => {
                eprintln!("tensorcomm: error: could not find a free port on 127.0.0.1 for MASTER_PORT ({e})");
                return ExitCode::FAILURE;
            }
        },
    };
    launch(&JobPlan {
        program: program.as_os_str().to_owned(),
        args: args.to_vec(),
        nproc_per_node: nproc,
        nnodes: 1,
        node_rank: 0,
        master_addr: plan::LOCAL_MASTER_ADDR.to_string(),
        master_port,
        kill_grace: plan::DEFAULT_KILL_GRACE,
        prefix_output,
        extra_env: extra_env.to_vec(),
    })
}

fn launch(plan: &JobPlan) -> ExitCode {
    match limits::Limits::current() {
        Ok(limits) => {
            if let Err(message) = limits.check(plan.nproc_per_node, plan.prefix_output) {
                output::launcher_line(&format!("error: {message}"));
                return ExitCode::from(2);
            }
        }
        Err(e) => tracing::warn!("cannot read the process limits, not checking them: {e}"),
    }
    let resolve = master_addr::check(
        &plan.master_addr,
        plan.master_port,
        plan.node_rank,
        master_addr::GRACE,
        &master_addr::system_resolve,
    );
    match resolve {
        Ok(None) => {}
        Ok(Some(warning)) => output::launcher_line(&format!("warning: {warning}")),
        Err(message) => {
            output::launcher_line(&format!("error: {message}"));
            return ExitCode::from(2);
        }
    }
    let outcome = supervise::run_job(plan);
    if let Some(report) = outcome.report() {
        output::launcher_line(&report);
    }
    ExitCode::from(outcome.exit_code())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sh(script: &str) -> Vec<OsString> {
        vec!["-c".into(), script.into()]
    }

    #[test]
    fn launch_local_runs_every_rank_with_the_extra_env() {
        let script = r#"[ "$WORLD_SIZE" = 3 ] && [ "$LOCAL_RANK" = "$RANK" ] && [ "$MASTER_PORT" = 29999 ] && [ "$EXTRA" = yes ]"#;
        let extra = [("EXTRA".to_string(), "yes".to_string())];
        let code = launch_local(Path::new("/bin/sh"), &sh(script), 3, Some(29999), &extra);
        assert_eq!(code, ExitCode::SUCCESS);
    }

    #[test]
    fn launch_local_returns_the_failing_rank_status() {
        let script = r#"if [ "$RANK" = 1 ]; then exit 7; fi; exec sleep 60"#;
        let start = std::time::Instant::now();
        let code = launch_local(Path::new("/bin/sh"), &sh(script), 2, None, &[]);
        assert_eq!(code, ExitCode::from(7));
        assert!(start.elapsed() < std::time::Duration::from_secs(20));
    }

    #[test]
    fn unprefixed_ranks_inherit_the_launchers_output() {
        // The ranks' stdout is this test's stdout, not a pipe the launcher
        // reads: a pipe would show up as a FIFO in /proc/self/fd/1.
        let script = r#"[ "$(readlink /proc/$$/fd/1)" = "$EXPECTED" ]"#;
        let mine = std::fs::read_link("/proc/self/fd/1").expect("own stdout");
        let extra = [("EXPECTED".to_string(), mine.display().to_string())];
        let code = launch_local_with(Path::new("/bin/sh"), &sh(script), 2, None, &extra, false);
        assert_eq!(code, ExitCode::SUCCESS);
        let code = launch_local_with(Path::new("/bin/sh"), &sh(script), 1, None, &extra, true);
        assert_ne!(
            code,
            ExitCode::SUCCESS,
            "prefixed output goes through a pipe"
        );
    }

    #[test]
    fn launch_local_rejects_zero_processes() {
        let code = launch_local(Path::new("/bin/sh"), &sh("true"), 0, None, &[]);
        assert_eq!(code, ExitCode::from(2));
    }
}
