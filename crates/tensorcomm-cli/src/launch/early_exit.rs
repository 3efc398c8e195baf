//! Saying so when a rank exits 0 while the others keep running.
//!
//! A rank that finishes early is often legitimate (rank 0 alone writes a
//! checkpoint, the others are already done), so nothing is stopped for it.
//! The others learn of its exit through [`super::exits_file`]: if they
//! wait for it at rendezvous (it never joined), that wait fails at once
//! naming it. But a collective it never joins waits silently until its
//! own timeout. So once the first rank that exited 0 has been gone
//! [`NOTICE_AFTER`] with others still running, the launcher says so on
//! stderr, naming it, and then again every [`REMIND_EVERY`] with the count,
//! while any still run.

use std::time::{Duration, Instant};

/// How long the others may keep running after a rank exited 0 before the
/// launcher says so: the ranks of a job that is ending together are all
/// gone well within this.
pub const NOTICE_AFTER: Duration = Duration::from_secs(5);
/// How often it says so again while ranks still run.
pub const REMIND_EVERY: Duration = Duration::from_secs(10);

/// What has been said so far about ranks that exited 0 early.
#[derive(Debug)]
pub struct EarlyExitNotice {
    /// The first rank that exited 0, and when it was seen to.
    first: Option<(usize, Instant)>,
    /// Ranks that exited 0 so far.
    finished: usize,
    /// When to say something next.
    next_at: Option<Instant>,
    /// Whether the first message went out.
    noticed: bool,
}

impl EarlyExitNotice {
    pub fn new() -> Self {
        EarlyExitNotice {
            first: None,
            finished: 0,
            next_at: None,
            noticed: false,
        }
    }

    /// One look at the ranks at `now`: `exited_ok` are the ranks seen to
    /// exit 0 in it, `running` how many still run after it. Returns the
    /// line to print, if one is due.
    pub fn look(&mut self, now: Instant, exited_ok: &[usize], running: usize) -> Option<String> {
        self.finished += exited_ok.len();
        if let (None, Some(&rank)) = (self.first, exited_ok.first()) {
            self.first = Some((rank, now));
            self.next_at = Some(now + NOTICE_AFTER);
        }
        let (rank, since) = self.first?;
        let at = self.next_at?;
        if running == 0 || now < at {
            return None;
        }
        self.next_at = Some(now + REMIND_EVERY);
        let gone = now.duration_since(since).as_secs();
        let others = match running {
            1 => "1 other rank still runs".to_string(),
            n => format!("{n} other ranks still run"),
        };
        if !self.noticed {
            self.noticed = true;
            return Some(format!(
                "rank {rank} exited with status 0 {gone}s ago and {others}; if they wait for it in a collective, they wait until their own timeout (a rendezvous waiting for it fails at once; nothing is stopped for this)"
            ));
        }
        let finished = match self.finished {
            1 => "1 rank has".to_string(),
            n => format!("{n} ranks have"),
        };
        Some(format!(
            "{running} still running, {gone}s after rank {rank} exited with status 0 ({finished} exited 0)"
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn says_so_once_after_the_delay_then_reminds_with_the_count() {
        let t0 = Instant::now();
        let at = |secs: u64| t0 + Duration::from_secs(secs);
        let mut notice = EarlyExitNotice::new();
        assert_eq!(notice.look(at(0), &[], 4), None);
        assert_eq!(notice.look(at(1), &[2], 3), None, "not at once");
        assert_eq!(notice.look(at(5), &[], 3), None, "not before NOTICE_AFTER");
        let first = notice.look(at(6), &[3], 2).expect("due");
        assert!(
            first.starts_with("rank 2 exited with status 0 5s ago and 2 other ranks still run;"),
            "{first}"
        );
        assert_eq!(notice.look(at(7), &[], 2), None, "said once");
        assert_eq!(notice.look(at(15), &[], 2), None);
        let reminder = notice.look(at(16), &[], 2).expect("a reminder");
        assert_eq!(
            reminder,
            "2 still running, 15s after rank 2 exited with status 0 (2 ranks have exited 0)"
        );
        assert_eq!(notice.look(at(17), &[], 2), None, "no spam");
        assert!(notice.look(at(26), &[], 1).is_some());
    }

    #[test]
    fn nothing_is_said_when_the_others_end_in_time() {
        let t0 = Instant::now();
        let mut notice = EarlyExitNotice::new();
        assert_eq!(notice.look(t0, &[0], 1), None);
        assert_eq!(notice.look(t0 + Duration::from_millis(300), &[1], 0), None);
        assert_eq!(notice.look(t0 + Duration::from_secs(60), &[], 0), None);
    }
}
