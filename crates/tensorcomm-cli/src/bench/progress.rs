//! The bench's progress line: which size of how many, on stderr, only when
//! stderr is a terminal (so logs and pipes get nothing extra).

use std::io::{IsTerminal, Write};

/// A one-line indicator rewritten in place with `\r`.
pub struct Progress {
    enabled: bool,
    done: usize,
    total: usize,
}

impl Progress {
    /// Shown only when `wanted` (rank 0) and stderr is a terminal.
    pub fn on_terminal(wanted: bool, total: usize) -> Self {
        Progress {
            enabled: wanted && std::io::stderr().is_terminal(),
            done: 0,
            total,
        }
    }

    /// Says that the size of `bytes` is being measured.
    pub fn show(&mut self, bytes: usize) {
        self.done += 1;
        if self.enabled {
            let mut err = std::io::stderr().lock();
            let _ = write!(err, "\r\x1b[2K[{}/{}] {bytes} B ...", self.done, self.total);
            let _ = err.flush();
        }
    }

    /// Erases the line (before a row is printed on stdout).
    pub fn clear(&self) {
        if self.enabled {
            let mut err = std::io::stderr().lock();
            let _ = write!(err, "\r\x1b[2K");
            let _ = err.flush();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_sizes_and_stays_off_when_not_wanted() {
        let mut p = Progress::on_terminal(false, 3);
        assert!(!p.enabled);
        p.show(8);
        p.show(16);
        assert_eq!((p.done, p.total), (2, 3));
    }
}
