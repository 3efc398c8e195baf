//! Telling the ranks which of them have exited.
//!
//! A rank that exits before it ever reaches rendezvous posts nothing the
//! others could tell its death by, so they would wait for it until their
//! timeout (30 minutes by default). The launcher knows: it creates one file
//! per job (in the system's temporary folder, mode 0600, named after its
//! pid with a random suffix), names it to every rank in
//! `TENSORCOMM_LAUNCH_EXITS`, appends one line per rank as it reaps it
//! (`rank 2 exited with status 0`, `rank 3 was killed by signal 9
//! (SIGKILL)`), and removes it when the job ends (its guardian does, when
//! the launcher is killed: see [`super::guard`]). The ranks' rendezvous
//! (one of the launcher's ranks) reads it and fails at once naming the rank
//! (`tensorcomm::rendezvous::launch_exits`); nothing else reads it. Only
//! this node's ranks are listed.

use std::io::{self, Write};
use std::path::Path;

use tensorcomm::env_vars::LAUNCH_EXITS;
use tensorcomm::rendezvous::launch_exits::{line, Ended};

use super::outcome::RankExit;
use super::signals;

/// The job's file; removed when dropped.
pub struct ExitsFile {
    file: tempfile::NamedTempFile,
}

impl ExitsFile {
    /// Creates an empty file for this job.
    pub fn create() -> io::Result<Self> {
        // tempfile creates it with mode 0600 and a random name, refusing
        // to follow a name someone else made.
        let file = tempfile::Builder::new()
            .prefix(&format!("tensorcomm-exits-{}-", std::process::id()))
            .tempfile()?;
        Ok(ExitsFile { file })
    }

    /// Where it is.
    pub fn path(&self) -> &Path {
        self.file.path()
    }

    /// The variable and value that name the file to a rank.
    pub fn env(&self) -> (&'static str, &Path) {
        (LAUNCH_EXITS.name, self.path())
    }

    /// Appends that rank `rank` ended as `exit`, in one write, so a rank
    /// reading meanwhile sees the line whole or not at all (it reads only
    /// whole lines). An exit the launcher could not read (the rank was
    /// reaped by someone else) is not written.
    pub fn record(&mut self, rank: usize, exit: &RankExit) {
        let ended = match *exit {
            RankExit::Code(code) => Ended::Status(code),
            RankExit::Signal(number) => Ended::Signal {
                number,
                name: signals::name(number).map(str::to_string),
            },
            RankExit::Unknown(_) => return,
        };
        let text = line(rank, &ended);
        if let Err(e) = self.file.as_file_mut().write_all(text.as_bytes()) {
            tracing::warn!(
                path = %self.file.path().display(),
                "cannot tell the ranks that rank {rank} {ended}: {e}"
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use tensorcomm::rendezvous::launch_exits::parse;

    use super::*;

    #[test]
    fn the_ranks_read_back_each_exit_and_the_file_goes_with_the_job() {
        let mut exits = ExitsFile::create().expect("a file in the temporary folder");
        let (name, path) = exits.env();
        assert_eq!(name, "TENSORCOMM_LAUNCH_EXITS");
        let path = path.to_path_buf();
        let file_name = path.file_name().unwrap().to_string_lossy().into_owned();
        assert!(
            file_name.starts_with(&format!("tensorcomm-exits-{}-", std::process::id())),
            "{file_name}"
        );
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        assert!(parse(&std::fs::read_to_string(&path).unwrap()).is_empty());
        exits.record(2, &RankExit::Code(0));
        exits.record(3, &RankExit::Signal(libc::SIGKILL));
        exits.record(4, &RankExit::Unknown("reaped elsewhere".into()));
        let text = std::fs::read_to_string(&path).unwrap();
        assert_eq!(
            text,
            "rank 2 exited with status 0\nrank 3 was killed by signal 9 (SIGKILL)\n"
        );
        let listed = parse(&text);
        assert_eq!(listed[&2], Ended::Status(0));
        assert_eq!(listed.len(), 2);
        drop(exits);
        assert!(!path.exists(), "removed when the job ends");
    }
}
