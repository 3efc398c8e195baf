//! What `tensorcomm run` tells its ranks about ranks that have exited.
//!
//! The launcher creates one file per job (mode 0600, in the system's
//! temporary folder, removed when the job ends), names it to every rank in
//! `TENSORCOMM_LAUNCH_EXITS`, and appends one line per rank as it reaps
//! it: `rank 2 exited with status 0`, `rank 3 was killed by signal 9
//! (SIGKILL)`. A rendezvous of the launcher's ranks (see [`path_for`])
//! reads it while it waits for the ranks to arrive, and fails at once,
//! naming the rank, when one it waits for is listed: a rank that exits
//! before it ever reaches rendezvous would otherwise leave the others
//! waiting until their timeout, since it posted no process record to tell
//! its death by. (After rendezvous, a CPU group's set-up tells a gone peer
//! on this host by its process record, not by this file.) Nothing else
//! reads it, so a rank that leaves once its work is done breaks nothing
//! that no longer waits for it.
//!
//! Each launcher knows only the ranks of its own node: in a job of several
//! nodes a rank learns only of its own node's ranks this way. A missing,
//! unreadable or unset file means nothing is known, never an error; ranks
//! started without the launcher are not affected.
//!
//! ```
//! use tensorcomm::rendezvous::launch_exits::{line, parse, Ended};
//!
//! let mut text = line(2, &Ended::Status(0));
//! text += &line(3, &Ended::Signal { number: 9, name: Some("SIGKILL".into()) });
//! assert_eq!(text, "rank 2 exited with status 0\nrank 3 was killed by signal 9 (SIGKILL)\n");
//! let exits = parse(&text);
//! assert_eq!(exits[&2], Ended::Status(0));
//! assert_eq!(exits[&3].to_string(), "was killed by signal 9 (SIGKILL)");
//! ```

use std::collections::BTreeMap;
use std::fmt;
use std::path::PathBuf;

use super::InitMethod;
use crate::env_vars::LAUNCH_EXITS;

/// How a rank's process ended, as its launcher saw it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Ended {
    /// It exited with this status.
    Status(i32),
    /// A signal killed it; `name` such as `SIGKILL` where the launcher
    /// knows one.
    Signal { number: i32, name: Option<String> },
}

impl fmt::Display for Ended {
    /// `exited with status 0`, `was killed by signal 9 (SIGKILL)`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Ended::Status(code) => write!(f, "exited with status {code}"),
            Ended::Signal {
                number,
                name: Some(name),
            } => write!(f, "was killed by signal {number} ({name})"),
            Ended::Signal { number, name: None } => write!(f, "was killed by signal {number}"),
        }
    }
}

/// The line the launcher appends when rank `rank` has ended.
pub fn line(rank: usize, ended: &Ended) -> String {
    format!("rank {rank} {ended}\n")
}

/// The ranks listed in a launcher's file, by rank. Only whole lines (ending
/// in a newline) count, so a line the launcher is still writing is read
/// next time; lines that do not parse are skipped.
pub fn parse(text: &str) -> BTreeMap<usize, Ended> {
    in_order(text).into_iter().collect()
}

/// The lines of a launcher's file in the order it wrote them (the order it
/// reaped the ranks), whole lines only, as [`parse`] reads them.
fn in_order(text: &str) -> Vec<(usize, Ended)> {
    let mut exits = Vec::new();
    let mut lines = text.split_inclusive('\n');
    while let Some(whole) = lines.next().and_then(|l| l.strip_suffix('\n')) {
        exits.extend(parse_line(whole));
    }
    exits
}

fn parse_line(line: &str) -> Option<(usize, Ended)> {
    let rest = line.strip_prefix("rank ")?;
    let (rank, how) = rest.split_once(' ')?;
    let rank = rank.parse().ok()?;
    if let Some(code) = how.strip_prefix("exited with status ") {
        return Some((rank, Ended::Status(code.parse().ok()?)));
    }
    let signal = how.strip_prefix("was killed by signal ")?;
    let (number, name) = match signal.split_once(' ') {
        None => (signal, None),
        Some((number, name)) => {
            let name = name.strip_prefix('(')?.strip_suffix(')')?;
            (number, Some(name.to_string()))
        }
    };
    let number = number.parse().ok()?;
    Some((rank, Ended::Signal { number, name }))
}

/// The file this process's launcher writes, if it was started by one and
/// `method` meets the launcher's ranks: its rank and world size are the
/// `RANK` and `WORLD_SIZE` the launcher set (the store may be any: `env://`,
/// or a `file://` or `tcp://` URL built from them). The file lists the
/// launcher's job ranks, so it tells nothing about a rendezvous of other
/// ranks that a rank's program makes. A listed rank that has not joined
/// such a rendezvous never will.
pub(crate) fn path_for(method: &InitMethod) -> Option<PathBuf> {
    path_for_with(method, |name| std::env::var(name).ok())
}

/// [`path_for`], reading the environment through `env`.
fn path_for_with(method: &InitMethod, env: impl Fn(&str) -> Option<String>) -> Option<PathBuf> {
    let path = env(LAUNCH_EXITS.name).filter(|p| !p.is_empty())?;
    let number = |name: &str| env(name)?.trim().parse::<usize>().ok();
    let same =
        number("RANK") == Some(method.rank) && number("WORLD_SIZE") == Some(method.world_size);
    same.then(|| PathBuf::from(path))
}

/// The ranks listed in the file at `path` now; empty when it is missing or
/// cannot be read.
pub(crate) fn read(path: &std::path::Path) -> BTreeMap<usize, Ended> {
    match std::fs::read_to_string(path) {
        Ok(text) => parse(&text),
        Err(e) => {
            tracing::debug!(path = %path.display(), "cannot read the launcher's exits file: {e}");
            BTreeMap::new()
        }
    }
}

/// The first rank but `me` the file at `path` lists, in the order the
/// launcher reaped them (the first to go is the likeliest cause); `None`
/// when none is, or the file is missing or cannot be read.
pub(crate) fn first_listed(path: &std::path::Path, me: usize) -> Option<(usize, Ended)> {
    let text = std::fs::read_to_string(path).ok()?;
    in_order(&text).into_iter().find(|&(r, _)| r != me)
}

/// The reason of the error a rendezvous wait fails with when a rank it
/// waits for is listed as `ended` and never joined.
pub(crate) fn before_joining(ended: &Ended) -> String {
    format!("it {ended} before joining the job (it never reached rendezvous; reported by tensorcomm run)")
}

/// The reason when a rank is listed as `ended` while this rank had not
/// joined yet (so rendezvous could not have ended), whether or not that
/// rank had.
pub(crate) fn before_rendezvous_ended(ended: &Ended) -> String {
    format!("it {ended} before rendezvous was complete (reported by tensorcomm run)")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_line_the_launcher_writes_reads_back() {
        let cases = [
            Ended::Status(0),
            Ended::Status(3),
            Ended::Status(-1),
            Ended::Signal {
                number: 9,
                name: Some("SIGKILL".into()),
            },
            Ended::Signal {
                number: 64,
                name: None,
            },
        ];
        for (rank, ended) in cases.iter().enumerate() {
            let exits = parse(&line(rank * 100, ended));
            assert_eq!(exits.len(), 1);
            assert_eq!(exits.get(&(rank * 100)), Some(ended), "{ended}");
        }
    }

    #[test]
    fn a_partial_last_line_and_lines_that_do_not_parse_are_skipped() {
        let text = "rank 1 exited with status 0\n\
                    something else\n\
                    rank x exited with status 0\n\
                    rank 2 exited with status zero\n\
                    rank 3 was killed by signal 9 SIGKILL\n\
                    rank 4 exited with status 0";
        let exits = parse(text);
        assert_eq!(exits.keys().copied().collect::<Vec<_>>(), [1]);
        assert!(parse("").is_empty());
        assert!(parse("rank 5 exited with st").is_empty());
    }

    #[test]
    fn the_first_listed_rank_is_the_first_the_launcher_reaped() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("exits");
        assert_eq!(first_listed(&file, 0), None, "no file");
        let text = line(5, &Ended::Status(0)) + &line(1, &Ended::Status(3)) + "rank 0 exi";
        std::fs::write(&file, text).unwrap();
        assert_eq!(first_listed(&file, 0), Some((5, Ended::Status(0))));
        assert_eq!(first_listed(&file, 5), Some((1, Ended::Status(3))));
        std::fs::write(&file, line(5, &Ended::Status(0))).unwrap();
        assert_eq!(first_listed(&file, 5), None, "only this rank");
    }

    #[test]
    fn a_missing_file_means_nothing_is_known() {
        let dir = tempfile::tempdir().unwrap();
        assert!(read(&dir.path().join("none")).is_empty());
        assert!(read(dir.path()).is_empty(), "a folder cannot be read");
        let file = dir.path().join("exits");
        std::fs::write(&file, line(7, &Ended::Status(0))).unwrap();
        assert_eq!(read(&file)[&7], Ended::Status(0));
    }

    #[test]
    fn the_reason_says_how_the_rank_ended() {
        assert_eq!(
            before_joining(&Ended::Status(0)),
            "it exited with status 0 before joining the job (it never reached rendezvous; reported by tensorcomm run)"
        );
        let killed = Ended::Signal {
            number: 15,
            name: Some("SIGTERM".into()),
        };
        assert!(before_joining(&killed).starts_with("it was killed by signal 15 (SIGTERM) before"));
    }

    #[test]
    fn only_a_rendezvous_of_the_launchers_ranks_reads_the_file() {
        let launched = |name: &str| {
            match name {
                "TENSORCOMM_LAUNCH_EXITS" => Some("/tmp/exits"),
                "RANK" => Some("1"),
                "WORLD_SIZE" => Some("4"),
                "MASTER_ADDR" => Some("127.0.0.1"),
                "MASTER_PORT" => Some("29500"),
                _ => None,
            }
            .map(String::from)
        };
        let planned = InitMethod::parse("env://", launched).unwrap();
        assert_eq!(path_for_with(&planned, launched), Some("/tmp/exits".into()));
        // The launcher's ranks, at any store.
        for url in [
            "tcp://127.0.0.1:29501?rank=1&world_size=4",
            "file:///tmp/store?rank=1&world_size=4",
        ] {
            let same = InitMethod::parse(url, |_| None).unwrap();
            let got = path_for_with(&same, launched);
            assert_eq!(got, Some("/tmp/exits".into()), "{url}");
        }
        // Other ranks: not the launcher's.
        for url in [
            "tcp://127.0.0.1:29500?rank=0&world_size=2",
            "tcp://127.0.0.1:29500?rank=0&world_size=4",
            "file:///tmp/store?rank=1&world_size=3",
        ] {
            let other = InitMethod::parse(url, |_| None).unwrap();
            assert_eq!(path_for_with(&other, launched), None, "{url}");
        }
        // Not launched: no file.
        let unset = |name: &str| launched(name).filter(|_| name != "TENSORCOMM_LAUNCH_EXITS");
        assert_eq!(path_for_with(&planned, unset), None);
        let empty = |name: &str| match name {
            "TENSORCOMM_LAUNCH_EXITS" => Some(String::new()),
            _ => launched(name),
        };
        assert_eq!(path_for_with(&planned, empty), None);
    }
}
