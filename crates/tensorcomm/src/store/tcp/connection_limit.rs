//! How many connections a server keeps open at once: what
//! [`super::TcpStoreOptions::max_connections`] asks, lowered to fit the
//! process's open-file limit.
//!
//! Every connection holds a file descriptor. A cap above the process's
//! limit (`ulimit -n`, often 1024 or 20000 against the default cap of
//! 65536) is no cap at all: the server runs out of descriptors first, its
//! `accept` fails, and a good client waits in the kernel's queue until its
//! timeout instead of being told why. So the cap is lowered to leave a
//! reserve of descriptors for everything else the process does (a rank 0
//! also runs transports) and for answering refusals; past it, clients get
//! a refusal naming the limit.

/// The least kept back for the rest of the process, unless the limit is
/// tiny (then half of it is).
const MIN_RESERVE: u64 = 128;

/// The cap a server applies and where it comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ConnectionLimit {
    pub(crate) max: usize,
    /// Says where `max` comes from, in a refusal's reason.
    pub(crate) origin: String,
}

impl ConnectionLimit {
    /// The cap for a server asked for `requested` connections in this
    /// process.
    pub(crate) fn new(requested: usize) -> Self {
        Self::fit(requested, open_file_limit())
    }

    /// `requested`, lowered to fit an open-file limit of `files` (unknown:
    /// `None`) minus a reserve of an eighth of it (at least
    /// [`MIN_RESERVE`], at most half).
    pub(crate) fn fit(requested: usize, files: Option<u64>) -> Self {
        let asked = || ConnectionLimit {
            max: requested,
            origin: "TcpStoreOptions::max_connections".to_string(),
        };
        let Some(files) = files else {
            return asked();
        };
        let reserve = (files / 8).max(MIN_RESERVE).min(files / 2);
        let budget = usize::try_from(files - reserve)
            .unwrap_or(usize::MAX)
            .max(1);
        if budget >= requested {
            return asked();
        }
        ConnectionLimit {
            max: budget,
            origin: format!(
                "TcpStoreOptions::max_connections is {requested}, lowered to {budget} to fit \
                 the server process's open-file limit of {files}; raise it with ulimit -n"
            ),
        }
    }
}

/// The soft limit on open files of this process, where it can be read.
fn open_file_limit() -> Option<u64> {
    let limits = std::fs::read_to_string("/proc/self/limits").ok()?;
    parse_open_file_limit(&limits)
}

/// The soft "Max open files" of a `/proc/<pid>/limits` text; `None` when
/// absent or unlimited.
fn parse_open_file_limit(limits: &str) -> Option<u64> {
    let line = limits.lines().find(|l| l.starts_with("Max open files"))?;
    line["Max open files".len()..]
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cap_fits_the_open_file_limit_with_a_reserve() {
        // Unknown limit, or room enough: what was asked.
        assert_eq!(ConnectionLimit::fit(65536, None).max, 65536);
        assert_eq!(ConnectionLimit::fit(65536, Some(1 << 20)).max, 65536);
        // 20000 files: an eighth kept back.
        let fitted = ConnectionLimit::fit(65536, Some(20000));
        assert_eq!(fitted.max, 17500);
        assert!(
            fitted.origin.contains("lowered to 17500")
                && fitted.origin.contains("open-file limit of 20000"),
            "{}",
            fitted.origin
        );
        // 1024 files: at least 128 kept back; 100 files: half.
        assert_eq!(ConnectionLimit::fit(65536, Some(1024)).max, 896);
        assert_eq!(ConnectionLimit::fit(65536, Some(100)).max, 50);
        assert_eq!(ConnectionLimit::fit(65536, Some(1)).max, 1);
        // A cap asked below the budget is kept.
        assert_eq!(ConnectionLimit::fit(2, Some(1024)).max, 2);
    }

    #[test]
    fn the_soft_open_file_limit_is_read_from_proc_limits() {
        let text = "Limit                     Soft Limit           Hard Limit           Units     \n\
                    Max processes             unlimited            unlimited            processes \n\
                    Max open files            1024                 1048576              files     \n";
        assert_eq!(parse_open_file_limit(text), Some(1024));
        let unlimited =
            "Max open files            unlimited            unlimited            files\n";
        assert_eq!(parse_open_file_limit(unlimited), None);
        assert_eq!(parse_open_file_limit(""), None);
    }
}
