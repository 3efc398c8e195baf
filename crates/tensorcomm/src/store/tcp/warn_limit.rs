//! A rate limit on the server's per-connection warnings: a flood of bad
//! connections (a scanner, a misconfigured job) would otherwise write one
//! WARN line each. At most [`PER_WINDOW`] lines per [`WINDOW`]; the first
//! line of the next window says how many were held back.

use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Warnings shown per window.
pub(crate) const PER_WINDOW: u32 = 10;

/// The length of a window.
pub(crate) const WINDOW: Duration = Duration::from_secs(10);

#[derive(Debug, Default)]
pub(crate) struct WarnLimit {
    inner: Mutex<Window>,
}

#[derive(Debug, Default)]
struct Window {
    start: Option<Instant>,
    shown: u32,
    suppressed: u64,
}

impl WarnLimit {
    /// Whether a warning at `now` may be shown: `Some(n)` with the number
    /// of warnings held back since the last one shown, `None` to hold this
    /// one back (log it at debug level instead).
    pub(crate) fn admit(&self, now: Instant) -> Option<u64> {
        let mut w = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        if w.start
            .is_none_or(|start| now.duration_since(start) >= WINDOW)
        {
            w.start = Some(now);
            w.shown = 0;
        }
        if w.shown < PER_WINDOW {
            w.shown += 1;
            Some(std::mem::take(&mut w.suppressed))
        } else {
            w.suppressed += 1;
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn at_most_ten_warnings_per_window_and_the_next_one_counts_the_rest() {
        let limit = WarnLimit::default();
        let t0 = Instant::now();
        for _ in 0..PER_WINDOW {
            assert_eq!(limit.admit(t0), Some(0));
        }
        for _ in 0..25 {
            assert_eq!(limit.admit(t0 + Duration::from_secs(1)), None);
        }
        assert_eq!(limit.admit(t0 + WINDOW), Some(25));
        assert_eq!(limit.admit(t0 + WINDOW), Some(0));
    }
}
