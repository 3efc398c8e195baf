//! How a blocked send or recv waits: spin, then yield, then sleep.
//!
//! A peer that answers within a few microseconds is caught while spinning,
//! so small round trips never enter the kernel. A peer that is busy for
//! longer gets the core back: first through `yield_now` (cheap, still
//! prompt), then through sleeps that grow to [`MAX_SLEEP`], so a rank that
//! waits for seconds costs almost nothing. A wait on one ring sleeps on the
//! ring's signal instead ([`Backoff::snooze_on`]): the peer's next write
//! (or read) wakes it at once, so those sleeps may grow longer, to
//! [`MAX_SIGNAL_SLEEP`], and an idle reader wakes a few dozen times a
//! second.

use std::time::{Duration, Instant};

/// Spin on the ring counters for this long after the last progress.
pub(super) const SPIN_FOR: Duration = Duration::from_micros(50);
/// Then yield the core until this long after the last progress.
pub(super) const YIELD_UNTIL: Duration = Duration::from_millis(2);
/// The first sleep after yielding; each later one doubles, up to MAX_SLEEP.
const FIRST_SLEEP: Duration = Duration::from_micros(20);
/// The longest sleep, which bounds how late a waiter notices new data.
pub(super) const MAX_SLEEP: Duration = Duration::from_millis(1);
/// The longest sleep on a ring's signal, which bounds how late a waiter
/// notices a peer that died without a word (new data wakes it at once).
pub(super) const MAX_SIGNAL_SLEEP: Duration = Duration::from_millis(20);

/// The waiting state of one blocked call.
pub(crate) struct Backoff {
    since: Instant,
    sleep: Duration,
}

impl Backoff {
    pub fn new() -> Backoff {
        Backoff {
            since: Instant::now(),
            sleep: FIRST_SLEEP,
        }
    }

    /// Called after progress: the next wait spins again.
    pub fn reset(&mut self) {
        self.since = Instant::now();
        self.sleep = FIRST_SLEEP;
    }

    /// Waits a little, more the longer nothing has happened.
    pub fn snooze(&mut self) {
        self.snooze_with(std::thread::sleep, MAX_SLEEP);
    }

    /// [`snooze`](Self::snooze), but a sleep is `sleep(duration)`, which
    /// returns early when what the caller waits for happens (a ring's
    /// signal), so sleeps grow to [`MAX_SIGNAL_SLEEP`].
    pub fn snooze_on(&mut self, sleep: impl FnOnce(Duration)) {
        self.snooze_with(sleep, MAX_SIGNAL_SLEEP);
    }

    fn snooze_with(&mut self, sleep: impl FnOnce(Duration), longest: Duration) {
        let idle = self.since.elapsed();
        if idle < SPIN_FOR {
            for _ in 0..32 {
                std::hint::spin_loop();
            }
        } else if idle < YIELD_UNTIL {
            std::thread::yield_now();
        } else {
            sleep(self.sleep);
            self.sleep = (self.sleep * 2).min(longest);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sleeps_grow_to_max_sleep_and_progress_starts_over() {
        let mut b = Backoff::new();
        b.snooze(); // spinning: no sleep taken yet
        assert_eq!(b.sleep, FIRST_SLEEP);
        std::thread::sleep(YIELD_UNTIL);
        for _ in 0..8 {
            b.snooze();
        }
        assert_eq!(b.sleep, MAX_SLEEP);
        let t = Instant::now();
        b.snooze();
        assert!(t.elapsed() >= MAX_SLEEP);
        b.reset();
        assert_eq!(b.sleep, FIRST_SLEEP);
    }
}
