//! Running a job: start the ranks, wait for them, tell the ranks which of
//! them have exited (see [`super::exits_file`]), stop them all when one
//! fails or when the launcher gets a signal, say so when one exits 0 while
//! the others keep running (see [`super::early_exit`]), and drain their
//! output.
//!
//! The loop polls every [`POLL`] (`try_wait` on each rank, then a look at the
//! caught signals) instead of blocking in `waitpid(-1)`, which could reap
//! children that are not ranks when the launcher runs inside a larger
//! program. Ranks are reaped only here, so a pid that is signalled always
//! still belongs to its rank. The same loop starts the ranks, one per turn,
//! looking at signals and ranks every [`POLL`] meanwhile: a rank that exits
//! while others are still starting is reaped (and a failure stops the
//! start-up) without waiting for the last one to start.

use std::io;
use std::thread;
use std::time::{Duration, Instant};

use libc::c_int;

use super::early_exit::EarlyExitNotice;
use super::exits_file::ExitsFile;
use super::guard::TreeGuard;
use super::outcome::{Outcome, RankExit, StopCause};
use super::output;
use super::plan::JobPlan;
use super::pump::OutputPump;
use super::signals::{self, SignalWatch};
use super::spawn::{self, RankProcess, SpawnError};

/// How often the supervisor looks at ranks and signals.
const POLL: Duration = Duration::from_millis(20);
/// How long a rank's failure waits, before it is blamed, for a peer that a
/// signal is still taking down.
const SETTLE: Duration = Duration::from_millis(100);
/// The shortest time to wait for output still arriving after the last rank
/// exited.
const MIN_DRAIN_STALL: Duration = Duration::from_secs(1);

/// Run `plan` to its end and say how it ended. Prints nothing of its own
/// but what [`OutputPump::drain`] says of pipes left open; see
/// [`Outcome::report`].
pub fn run_job(plan: &JobPlan) -> Outcome {
    let mut pump = match plan.prefix_output.then(OutputPump::start).transpose() {
        Ok(pump) => pump,
        Err(source) => {
            let error = SpawnError {
                rank: plan.global_rank(0),
                program: plan.program.clone(),
                source: io::Error::new(
                    source.kind(),
                    format!("could not start the thread that copies the ranks' output: {source}"),
                ),
            };
            return Outcome {
                cause: Some(StopCause::SpawnFailed { error, started: 0 }),
                killed: Vec::new(),
                killed_on: None,
                grace: plan.kill_grace,
            };
        }
    };
    let watch = match SignalWatch::install() {
        Ok(watch) => Some(watch),
        Err(e) => {
            tracing::warn!("cannot catch SIGINT/SIGTERM/SIGHUP, they will not be forwarded: {e}");
            None
        }
    };
    let take_signal = || watch.as_ref().and_then(SignalWatch::take);

    let exits = match ExitsFile::create() {
        Ok(file) => Some(file),
        Err(e) => {
            tracing::warn!("cannot create the file that tells the ranks which of them exited; a rank that exits before joining leaves the others waiting until their timeout: {e}");
            None
        }
    };
    // Kills the ranks' process trees if this process dies hard, and
    // removes the exits file then.
    let mut guard = match TreeGuard::start(exits.as_ref().map(ExitsFile::path)) {
        Ok(guard) => Some(guard),
        Err(e) => {
            tracing::warn!("cannot start the guardian, a kill -9 of the launcher will leave what the ranks started running: {e}");
            None
        }
    };
    let mut job = Supervisor::new(plan.kill_grace, exits);
    let mut cause = None;
    // The next local rank to start.
    let mut next = 0;
    let mut last_look = Instant::now();
    let mut early_exit = EarlyExitNotice::new();
    let mut killed_on = None;
    loop {
        let starting = next < plan.nproc_per_node && !job.stopping();
        if starting {
            match spawn::spawn_rank(plan, next, pump.as_mut(), job.exits.as_ref()) {
                Ok(rank) => {
                    if let Some(guard) = guard.as_mut() {
                        guard.watch(rank.pid);
                    }
                    job.ranks.push(Rank {
                        process: rank,
                        exit: None,
                        killed: false,
                    });
                    next += 1;
                }
                Err(error) => {
                    let started = job.stop(libc::SIGTERM);
                    cause = Some(StopCause::SpawnFailed { error, started });
                }
            }
            // While starting, look at signals and ranks every POLL too, so
            // that a failure stops the start-up and exited ranks are reaped.
            if last_look.elapsed() < POLL {
                continue;
            }
        }
        last_look = Instant::now();
        if let Some(signal) = take_signal() {
            if job.stopping() {
                // A second signal: the user does not want to wait.
                killed_on.get_or_insert(signal);
                job.kill_running();
            } else {
                let ranks = job.stop(signal);
                cause.get_or_insert(StopCause::Signal { signal, ranks });
            }
        }
        let reaped = job.reap();
        if !job.stopping() {
            let exits: Vec<(usize, RankExit)> = reaped
                .iter()
                .map(|&i| (i, job.ranks[i].exit.clone().unwrap_or(RankExit::Code(0))))
                .collect();
            if let Some(mut index) = first_failure(&exits) {
                if !matches!(job.ranks[index].exit, Some(RankExit::Signal(_))) {
                    // A rank killed from outside may still be ending while
                    // a peer it failed has already exited: look once more.
                    thread::sleep(SETTLE);
                    let later: Vec<(usize, RankExit)> = job
                        .reap()
                        .iter()
                        .map(|&i| (i, job.ranks[i].exit.clone().unwrap_or(RankExit::Code(0))))
                        .collect();
                    if let Some((i, _)) =
                        later.iter().find(|(_, e)| matches!(e, RankExit::Signal(_)))
                    {
                        index = *i;
                    }
                }
                let rank = &job.ranks[index];
                let (rank, pid) = (rank.process.rank, rank.process.pid);
                let exit = job.ranks[index].exit.clone().unwrap_or(RankExit::Code(0));
                let others = job.stop(libc::SIGTERM);
                let finished = job
                    .ranks
                    .iter()
                    .filter(|r| r.exit.as_ref().is_some_and(RankExit::success))
                    .map(|r| r.process.rank)
                    .collect();
                cause = Some(StopCause::RankFailed {
                    rank,
                    pid,
                    exit,
                    others,
                    finished,
                });
            }
        }
        if !job.stopping() {
            let exited_ok: Vec<usize> = reaped
                .iter()
                .filter(|&&i| job.ranks[i].exit.as_ref().is_some_and(RankExit::success))
                .map(|&i| job.ranks[i].process.rank)
                .collect();
            let running = job.running().count();
            if let Some(line) = early_exit.look(Instant::now(), &exited_ok, running) {
                output::launcher_line(&line);
            }
        }
        let started_all = next == plan.nproc_per_node || job.stopping();
        if started_all && job.all_exited() {
            break;
        }
        if job.grace_expired() {
            job.kill_running();
        }
        if started_all {
            thread::sleep(POLL);
        }
    }
    drop(watch);
    // Every rank has been reaped: no one reads it any more.
    job.exits.take();
    if let Some(guard) = guard {
        guard.done();
    }

    if let Some(pump) = pump {
        pump.drain(plan.kill_grace.max(MIN_DRAIN_STALL));
    }
    // Every rank has ended: shared-memory names one of them left behind
    // (killed during a group's set-up) have no one left to remove them.
    let pids: Vec<u32> = job.ranks.iter().map(|r| r.process.pid).collect();
    let removed = tensorcomm::cpu::transport::shm::remove_segments_of(&pids);
    if !removed.is_empty() {
        tracing::info!(names = ?removed, "removed shared-memory names the ranks left");
    }
    Outcome {
        cause,
        killed: job.killed,
        killed_on,
        grace: plan.kill_grace,
    }
}

struct Rank {
    process: RankProcess,
    /// Set once reaped.
    exit: Option<RankExit>,
    /// Sent SIGKILL.
    killed: bool,
}

/// The started ranks and where stopping them stands.
struct Supervisor {
    ranks: Vec<Rank>,
    grace: Duration,
    /// When the running ranks get SIGKILL; set by the first stop.
    kill_at: Option<Instant>,
    /// Ranks sent SIGKILL.
    killed: Vec<usize>,
    /// Where each reaped rank's exit is written for the others.
    exits: Option<ExitsFile>,
}

impl Supervisor {
    fn new(grace: Duration, exits: Option<ExitsFile>) -> Self {
        Supervisor {
            ranks: Vec::new(),
            grace,
            kill_at: None,
            killed: Vec::new(),
            exits,
        }
    }

    fn running(&self) -> impl Iterator<Item = &Rank> {
        self.ranks.iter().filter(|r| r.exit.is_none())
    }

    fn stopping(&self) -> bool {
        self.kill_at.is_some()
    }

    fn all_exited(&self) -> bool {
        self.running().next().is_none()
    }

    fn grace_expired(&self) -> bool {
        self.kill_at.is_some_and(|at| Instant::now() >= at)
    }

    /// Send `signal` to every running rank, then SIGCONT (a stopped rank
    /// acts on the signal only once it runs again), and start the grace
    /// period (if not started yet). Returns how many ranks were signalled.
    fn stop(&mut self, signal: c_int) -> usize {
        self.kill_at.get_or_insert(Instant::now() + self.grace);
        let mut sent = 0;
        for rank in self.running() {
            let (r, pid) = (rank.process.rank, rank.process.pid);
            match signals::send_to_rank(pid, signal) {
                Ok(()) => {
                    tracing::debug!(rank = r, pid, signal, "sent stop signal");
                    sent += 1;
                    if let Err(e) = signals::send_to_rank(pid, libc::SIGCONT) {
                        tracing::debug!(rank = r, pid, "could not send SIGCONT: {e}");
                    }
                }
                Err(e) => tracing::warn!(rank = r, pid, "could not send {signal}: {e}"),
            }
        }
        sent
    }

    /// SIGKILL every running rank (once each).
    fn kill_running(&mut self) {
        for rank in self.ranks.iter_mut() {
            if rank.exit.is_some() || rank.killed {
                continue;
            }
            let (r, pid) = (rank.process.rank, rank.process.pid);
            if let Err(e) = signals::send_to_rank(pid, libc::SIGKILL) {
                tracing::warn!(rank = r, pid, "could not send SIGKILL: {e}");
            }
            rank.killed = true;
            self.killed.push(r);
        }
    }

    /// Reap ranks that have exited, telling the others; returns their
    /// indices in rank order.
    fn reap(&mut self) -> Vec<usize> {
        let mut exited = Vec::new();
        for (index, rank) in self.ranks.iter_mut().enumerate() {
            if rank.exit.is_some() {
                continue;
            }
            let exit = match rank.process.child.try_wait() {
                Ok(None) => continue,
                Ok(Some(status)) => RankExit::from_status(status),
                Err(e) => RankExit::Unknown(e.to_string()),
            };
            tracing::debug!(
                rank = rank.process.rank,
                pid = rank.process.pid,
                "rank {}",
                exit.describe()
            );
            if let Some(exits) = self.exits.as_mut() {
                exits.record(rank.process.rank, &exit);
            }
            rank.exit = Some(exit);
            exited.push(index);
        }
        exited
    }
}

/// The rank to blame among those that ended in one look at the ranks
/// (`(index, exit)` in rank order): one that a signal killed (the launcher
/// had sent none yet), else the first that failed. A rank killed from
/// outside makes its peers fail within milliseconds; when both have ended
/// by the same look, the killed one is the cause, not the lowest rank.
fn first_failure(exits: &[(usize, RankExit)]) -> Option<usize> {
    exits
        .iter()
        .find(|(_, e)| matches!(e, RankExit::Signal(_)))
        .or_else(|| exits.iter().find(|(_, e)| !e.success()))
        .map(|(i, _)| *i)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_rank_killed_by_a_signal_is_blamed_before_peers_that_failed_because_of_it() {
        // Rank 0 failed because rank 2 was killed; both ended by one look.
        let exits = [
            (0, RankExit::Code(1)),
            (1, RankExit::Code(0)),
            (2, RankExit::Signal(libc::SIGKILL)),
            (3, RankExit::Code(1)),
        ];
        assert_eq!(first_failure(&exits), Some(2));
        // Without a signal, the first failure in rank order.
        assert_eq!(
            first_failure(&[(0, RankExit::Code(0)), (1, RankExit::Code(3))]),
            Some(1)
        );
        assert_eq!(first_failure(&[(0, RankExit::Code(0))]), None);
        assert_eq!(first_failure(&[]), None);
    }
}
