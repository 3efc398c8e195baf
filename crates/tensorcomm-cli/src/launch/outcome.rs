//! How a job ended: the launcher's exit code and the line it prints about it.

use std::os::unix::process::ExitStatusExt;
use std::process::ExitStatus;
use std::time::Duration;

use libc::c_int;

use super::signals;
use super::spawn::SpawnError;

/// How one rank ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RankExit {
    /// It exited with this status.
    Code(i32),
    /// A signal killed it.
    Signal(c_int),
    /// It could not be waited for (something else reaped it).
    Unknown(String),
}

impl RankExit {
    pub fn from_status(status: ExitStatus) -> Self {
        match (status.code(), status.signal()) {
            (Some(code), _) => RankExit::Code(code),
            (None, Some(signal)) => RankExit::Signal(signal),
            (None, None) => RankExit::Unknown(format!("unrecognised wait status {status}")),
        }
    }

    pub fn success(&self) -> bool {
        *self == RankExit::Code(0)
    }

    /// The launcher's exit code for this: the status itself, 128 + the
    /// signal's number, or 1.
    pub fn exit_code(&self) -> u8 {
        match self {
            RankExit::Code(0) => 0,
            RankExit::Code(code) => u8::try_from(*code).ok().filter(|&c| c != 0).unwrap_or(1),
            RankExit::Signal(signal) => u8::try_from(128 + signal).unwrap_or(1),
            RankExit::Unknown(_) => 1,
        }
    }

    /// `exited with status 3`, `was killed by signal 9 (SIGKILL)`.
    pub fn describe(&self) -> String {
        match self {
            RankExit::Code(code) => format!("exited with status {code}"),
            RankExit::Signal(signal) => format!("was killed by {}", signals::describe(*signal)),
            RankExit::Unknown(why) => format!("could not be waited for: {why}"),
        }
    }
}

/// Why the launcher stopped the job before every rank finished by itself.
#[derive(Debug)]
pub enum StopCause {
    /// This rank failed first; `others` ranks were still running;
    /// `finished` had exited 0 (one that left before joining makes the
    /// others fail: it is the cause, not the rank named first).
    RankFailed {
        rank: usize,
        pid: u32,
        exit: RankExit,
        others: usize,
        finished: Vec<usize>,
    },
    /// The launcher received `signal` and forwarded it to `ranks` ranks.
    Signal { signal: c_int, ranks: usize },
    /// A rank could not be started; `started` ranks already were.
    SpawnFailed { error: SpawnError, started: usize },
}

/// The end of a job.
#[derive(Debug)]
pub struct Outcome {
    /// `None` when every rank exited 0 by itself.
    pub cause: Option<StopCause>,
    /// Ranks that got SIGKILL: still running `grace` after the stop signal,
    /// or when a second signal came (`killed_on`).
    pub killed: Vec<usize>,
    /// The second signal that made the launcher SIGKILL at once, if one did.
    pub killed_on: Option<c_int>,
    /// The SIGTERM-to-SIGKILL grace the job ran with.
    pub grace: Duration,
}

impl Outcome {
    /// 0 when all ranks succeeded; else the first failing rank's code, 128 +
    /// the signal the launcher received, or 127/126/1 when a rank could not
    /// start.
    pub fn exit_code(&self) -> u8 {
        match &self.cause {
            None => 0,
            Some(StopCause::RankFailed { exit, .. }) => exit.exit_code(),
            Some(StopCause::Signal { signal, .. }) => u8::try_from(128 + signal).unwrap_or(1),
            Some(StopCause::SpawnFailed { error, .. }) => error.exit_code(),
        }
    }

    /// The line to print on stderr, without the `tensorcomm run: ` prefix;
    /// `None` when all ranks succeeded.
    pub fn report(&self) -> Option<String> {
        let mut line = match self.cause.as_ref()? {
            StopCause::RankFailed {
                rank,
                pid,
                exit,
                others,
                finished,
            } => {
                let rest = match others {
                    0 => "no other rank was running".to_string(),
                    1 => "stopped the other running rank".to_string(),
                    n => format!("stopped the other {n} ranks"),
                };
                let mut line = format!("rank {rank} (pid {pid}) {}; {rest}", exit.describe());
                if !finished.is_empty() {
                    line.push_str(&format!(
                        "; {} already exited with status 0",
                        ranks_had(finished)
                    ));
                }
                line
            }
            StopCause::Signal { signal, ranks } => {
                let name = signals::name(*signal).unwrap_or("a signal");
                format!("received {name}; forwarded it to {}", count(*ranks, "rank"))
            }
            StopCause::SpawnFailed { error, started } => match started {
                0 => error.to_string(),
                n => format!("{error}; stopped the {} already started", count(*n, "rank")),
            },
        };
        if !self.killed.is_empty() {
            let ranks: Vec<String> = self.killed.iter().map(usize::to_string).collect();
            let (noun, verb) = if ranks.len() == 1 {
                ("rank", "was")
            } else {
                ("ranks", "were")
            };
            let ranks = ranks.join(", ");
            line.push_str(&match self.killed_on {
                None => format!(
                    "; {noun} {ranks} did not exit within {:?} of the stop signal and {verb} killed (SIGKILL)",
                    self.grace
                ),
                Some(signal) => format!(
                    "; {noun} {ranks} {verb} killed (SIGKILL) on a second {}",
                    signals::name(signal).unwrap_or("signal")
                ),
            });
        }
        Some(line)
    }
}

/// `rank 2 had`, `ranks 2, 5 had`, the first [`LISTED`] and a count.
fn ranks_had(ranks: &[usize]) -> String {
    const LISTED: usize = 8;
    let shown: Vec<String> = ranks.iter().take(LISTED).map(usize::to_string).collect();
    let more = match ranks.len().saturating_sub(LISTED) {
        0 => String::new(),
        n => format!(" and {n} more"),
    };
    match ranks.len() {
        1 => format!("rank {} had", shown[0]),
        _ => format!("ranks {}{more} had", shown.join(", ")),
    }
}

fn count(n: usize, noun: &str) -> String {
    if n == 1 {
        format!("1 {noun}")
    } else {
        format!("{n} {noun}s")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn failed(exit: RankExit, others: usize, killed: Vec<usize>) -> Outcome {
        Outcome {
            cause: Some(StopCause::RankFailed {
                rank: 2,
                pid: 1234,
                exit,
                others,
                finished: vec![],
            }),
            killed,
            killed_on: None,
            grace: Duration::from_secs(5),
        }
    }

    #[test]
    fn a_failed_rank_is_named_with_its_status() {
        let outcome = failed(RankExit::Code(3), 3, vec![]);
        assert_eq!(outcome.exit_code(), 3);
        assert_eq!(
            outcome.report().as_deref(),
            Some("rank 2 (pid 1234) exited with status 3; stopped the other 3 ranks")
        );
    }

    #[test]
    fn ranks_that_had_exited_0_are_named_after_the_failed_one() {
        // A rank that exits 0 before joining makes the others fail at
        // rendezvous: the line names the first to fail, then it.
        let mut outcome = failed(RankExit::Code(1), 0, vec![]);
        if let Some(StopCause::RankFailed { finished, .. }) = &mut outcome.cause {
            finished.push(4);
        }
        assert_eq!(
            outcome.report().as_deref(),
            Some("rank 2 (pid 1234) exited with status 1; no other rank was running; rank 4 had already exited with status 0")
        );
        assert_eq!(outcome.exit_code(), 1);
        assert_eq!(ranks_had(&[0, 3]), "ranks 0, 3 had");
        let many: Vec<usize> = (0..10).collect();
        assert_eq!(
            ranks_had(&many),
            "ranks 0, 1, 2, 3, 4, 5, 6, 7 and 2 more had"
        );
    }

    #[test]
    fn a_signalled_rank_exits_128_plus_the_signal() {
        let outcome = failed(RankExit::Signal(9), 1, vec![0]);
        assert_eq!(outcome.exit_code(), 137);
        assert_eq!(
            outcome.report().as_deref(),
            Some(
                "rank 2 (pid 1234) was killed by signal 9 (SIGKILL); stopped the other running \
                 rank; rank 0 did not exit within 5s of the stop signal and was killed (SIGKILL)"
            )
        );
    }

    #[test]
    fn success_is_silent_and_zero() {
        let outcome = Outcome {
            cause: None,
            killed: vec![],
            killed_on: None,
            grace: Duration::from_secs(5),
        };
        assert_eq!(outcome.exit_code(), 0);
        assert_eq!(outcome.report(), None);
    }

    #[test]
    fn a_received_signal_is_reported() {
        let outcome = Outcome {
            cause: Some(StopCause::Signal {
                signal: libc::SIGINT,
                ranks: 4,
            }),
            killed: vec![1, 3],
            killed_on: None,
            grace: Duration::from_millis(500),
        };
        assert_eq!(outcome.exit_code(), 130);
        assert_eq!(
            outcome.report().as_deref(),
            Some(
                "received SIGINT; forwarded it to 4 ranks; ranks 1, 3 did not exit within 500ms \
                 of the stop signal and were killed (SIGKILL)"
            )
        );
        let outcome = Outcome {
            killed_on: Some(libc::SIGINT),
            ..outcome
        };
        assert_eq!(
            outcome.report().as_deref(),
            Some("received SIGINT; forwarded it to 4 ranks; ranks 1, 3 were killed (SIGKILL) on a second SIGINT")
        );
    }
}
