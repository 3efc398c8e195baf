//! Starting one rank: its command line, environment, process group and pipes.
//!
//! Each rank runs in a process group of its own (its pid is the group id), so
//! a signal to the rank reaches every process it started: a `sh -c` wrapper
//! and the program under it stop together, and no helper keeps the output
//! pipes open after the rank is gone. The price is that the terminal's Ctrl-C
//! reaches only the launcher, which forwards it (so ranks get it exactly once),
//! and that ranks cannot read the terminal: their stdin is /dev/null.
//!
//! On Linux each rank also asks the kernel for SIGKILL when the launcher dies,
//! so even `kill -9` of the launcher leaves no rank running.

use std::ffi::OsString;
use std::fmt;
use std::io;
use std::os::unix::process::CommandExt;
use std::process::{Child, Command, Stdio};

use tensorcomm::env_vars::LAUNCH_EXITS;

use super::exits_file::ExitsFile;
use super::output::Stream;
use super::plan::JobPlan;
use super::pump::OutputPump;

/// A started rank.
pub struct RankProcess {
    /// Global rank (`RANK`).
    pub rank: usize,
    /// Process id, also the id of the rank's process group.
    pub pid: u32,
    /// The process; reaped only by the supervisor.
    pub child: Child,
}

/// A rank that could not be started.
#[derive(Debug)]
pub struct SpawnError {
    /// Global rank.
    pub rank: usize,
    /// The program that failed to start.
    pub program: OsString,
    /// Why.
    pub source: io::Error,
}

impl SpawnError {
    /// The shell's convention: 127 for a program that is not there, 126 for
    /// one that cannot be executed, 1 for anything else.
    pub fn exit_code(&self) -> u8 {
        match self.source.kind() {
            io::ErrorKind::NotFound => 127,
            io::ErrorKind::PermissionDenied => 126,
            _ => 1,
        }
    }
}

impl fmt::Display for SpawnError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let program = self.program.to_string_lossy();
        write!(f, "cannot start rank {}: ", self.rank)?;
        match self.source.kind() {
            io::ErrorKind::NotFound => write!(
                f,
                "program `{program}` not found (expected an executable file in PATH or a path to one)"
            ),
            io::ErrorKind::PermissionDenied => write!(
                f,
                "program `{program}` is not executable (permission denied)"
            ),
            _ => write!(f, "program `{program}`: {}", self.source),
        }
    }
}

/// Start local rank `local_rank` of `plan`. With prefixed output, its stdout
/// and stderr are handed to `pump` to be copied. `exits` is named to it
/// (without one, a value inherited from a launcher above is removed: its
/// ranks are another job's).
pub fn spawn_rank(
    plan: &JobPlan,
    local_rank: usize,
    pump: Option<&mut OutputPump>,
    exits: Option<&ExitsFile>,
) -> Result<RankProcess, SpawnError> {
    let rank = plan.global_rank(local_rank);
    let error = |source| SpawnError {
        rank,
        program: plan.program.clone(),
        source,
    };

    let mut command = Command::new(&plan.program);
    command
        .args(&plan.args)
        .envs(plan.extra_env.iter().map(|(k, v)| (k, v)))
        .envs(plan.rank_env(local_rank))
        .stdin(Stdio::null())
        .process_group(0);
    match exits.map(ExitsFile::env) {
        Some((name, path)) => command.env(name, path),
        None => command.env_remove(LAUNCH_EXITS.name),
    };
    if pump.is_some() {
        command.stdout(Stdio::piped()).stderr(Stdio::piped());
    }
    die_with_launcher(&mut command);

    let mut child = command.spawn().map_err(error)?;
    let pid = child.id();
    tracing::debug!(rank, pid, "started rank");

    let pipes = (child.stdout.take(), child.stderr.take());
    let copied = match pump {
        None => Ok(()),
        Some(pump) => (|| {
            if let Some(stdout) = pipes.0 {
                pump.add(rank, Stream::Stdout, stdout)?;
            }
            if let Some(stderr) = pipes.1 {
                pump.add(rank, Stream::Stderr, stderr)?;
            }
            Ok::<(), io::Error>(())
        })(),
    };
    let mut process = RankProcess { rank, pid, child };
    match copied {
        Ok(()) => Ok(process),
        Err(source) => {
            // Nothing reads its output: end the rank rather than let it
            // block on a full pipe.
            if let Err(e) = process.child.kill() {
                tracing::debug!(rank, pid, "could not kill rank: {e}");
            }
            let _ = process.child.wait();
            Err(error(io::Error::new(
                source.kind(),
                format!("could not have its output copied: {source}"),
            )))
        }
    }
}

/// Ask the kernel to SIGKILL the child when the thread that started it ends
/// (the launcher blocks in that thread until every rank has been reaped, so in
/// practice: when the launcher dies).
#[cfg(target_os = "linux")]
fn die_with_launcher(command: &mut Command) {
    let launcher = std::process::id();
    // SAFETY: the closure runs in the forked child before exec, where only
    // async-signal-safe calls are allowed. It makes two system calls (prctl,
    // getppid), allocates nothing, takes no lock and reads only a copied u32.
    unsafe {
        command.pre_exec(move || {
            if libc::prctl(
                libc::PR_SET_PDEATHSIG,
                libc::SIGKILL as libc::c_ulong,
                0 as libc::c_ulong,
                0 as libc::c_ulong,
                0 as libc::c_ulong,
            ) != 0
            {
                return Err(io::Error::last_os_error());
            }
            // The launcher died before prctl took effect: nothing will
            // deliver the signal, so do not start.
            if libc::getppid() as u32 != launcher {
                return Err(io::Error::from_raw_os_error(libc::ESRCH));
            }
            Ok(())
        });
    }
}

#[cfg(not(target_os = "linux"))]
fn die_with_launcher(_command: &mut Command) {}
