//! Checking, before any rank starts, that the process limits leave room
//! for the job, so that a job too large for them is refused up front with
//! the limit named instead of failing at the rank where it runs out.
//!
//! With prefixed output the launcher holds two pipes per rank
//! (`RLIMIT_NOFILE`, `ulimit -n`); each rank is a process of the user's
//! (`RLIMIT_NPROC`, `ulimit -u`, not enforced for root). The limits are
//! not raised: the ranks inherit them, and what they allow is the user's
//! choice.

use std::io;

/// Descriptors the launcher holds besides two per rank: its standard
/// streams, the output thread's epoll, the guardian's pipe, and the pipes
/// of the rank being started.
const BASE_FILES: u64 = 32;
/// Tasks of the user's besides the ranks: the launcher's threads and the
/// guardian.
const BASE_TASKS: u64 = 8;

/// A soft limit and its hard ceiling; `None` for unlimited.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limit {
    pub soft: Option<u64>,
    pub hard: Option<u64>,
}

/// The limits that bound how many ranks can start.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// `RLIMIT_NOFILE`.
    pub open_files: Limit,
    /// `RLIMIT_NPROC`; `None` where it is not enforced (root).
    pub processes: Option<Limit>,
}

impl Limits {
    /// This process's limits.
    pub fn current() -> io::Result<Self> {
        // SAFETY: geteuid takes nothing and cannot fail.
        let root = unsafe { libc::geteuid() } == 0;
        Ok(Limits {
            open_files: get(libc::RLIMIT_NOFILE)?,
            processes: if root {
                None
            } else {
                Some(get(libc::RLIMIT_NPROC)?)
            },
        })
    }

    /// Whether `nproc` ranks fit; the error names the limit, what the job
    /// needs and how to get it.
    pub fn check(&self, nproc: usize, prefix_output: bool) -> Result<(), String> {
        let nproc = nproc as u64;
        if prefix_output {
            let need = 2 * nproc + BASE_FILES;
            if let Some(soft) = self.open_files.soft.filter(|&soft| soft < need) {
                return Err(format!(
                    "{nproc} ranks with prefixed output need about {need} open files in the launcher (two pipes per rank), but its limit is {soft} (ulimit -n{}); raise it or pass --no-prefix",
                    hard_note(self.open_files)
                ));
            }
        }
        if let Some(limit) = self.processes {
            let need = nproc + BASE_TASKS;
            if let Some(soft) = limit.soft.filter(|&soft| soft < need) {
                return Err(format!(
                    "{nproc} ranks need at least {need} processes of this user, but the limit is {soft} (ulimit -u{}); raise it or start fewer ranks",
                    hard_note(limit)
                ));
            }
        }
        Ok(())
    }
}

fn hard_note(limit: Limit) -> String {
    match limit.hard {
        Some(hard) => format!(", hard limit {hard}"),
        None => ", hard limit unlimited".to_string(),
    }
}

fn get(resource: libc::__rlimit_resource_t) -> io::Result<Limit> {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `limit` is a valid rlimit for getrlimit to fill.
    if unsafe { libc::getrlimit(resource, &mut limit) } != 0 {
        return Err(io::Error::last_os_error());
    }
    let finite = |value: libc::rlim_t| (value != libc::RLIM_INFINITY).then_some(value);
    Ok(Limit {
        soft: finite(limit.rlim_cur),
        hard: finite(limit.rlim_max),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits(files: Option<u64>, processes: Option<u64>) -> Limits {
        Limits {
            open_files: Limit {
                soft: files,
                hard: Some(4096),
            },
            processes: processes.map(|soft| Limit {
                soft: Some(soft),
                hard: None,
            }),
        }
    }

    #[test]
    fn too_few_open_files_for_the_pipes_is_named() {
        let err = limits(Some(1024), None).check(600, true).unwrap_err();
        assert_eq!(
            err,
            "600 ranks with prefixed output need about 1232 open files in the launcher (two pipes per rank), but its limit is 1024 (ulimit -n, hard limit 4096); raise it or pass --no-prefix"
        );
        assert!(limits(Some(1024), None).check(600, false).is_ok());
        assert!(limits(Some(1024), None).check(496, true).is_ok());
        assert!(limits(None, None).check(4096, true).is_ok());
    }

    #[test]
    fn too_few_processes_is_named() {
        let err = limits(None, Some(100)).check(100, false).unwrap_err();
        assert!(
            err.starts_with("100 ranks need at least 108 processes of this user, but the limit is 100 (ulimit -u, hard limit unlimited)"),
            "{err}"
        );
        assert!(limits(None, Some(108)).check(100, false).is_ok());
    }
}
