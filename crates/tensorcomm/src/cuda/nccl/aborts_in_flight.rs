//! The NCCL aborts running in this process, which the process's exit
//! waits for: NCCL's own clean-up at exit, run while another thread was
//! inside `ncclCommAbort`, crashed a rank (SIGSEGV, seen on four H200s: a
//! rank reported its group's failure and exited while the watchdog still
//! aborted the communicator).

use std::sync::{Condvar, Mutex, Once, PoisonError};
use std::time::{Duration, Instant};

/// A count of aborts in progress, and a way to wait until there are none.
pub(crate) struct AbortsInFlight {
    count: Mutex<usize>,
    idle: Condvar,
}

/// One abort in progress: counted until dropped.
pub(crate) struct Aborting<'a>(&'a AbortsInFlight);

impl Drop for Aborting<'_> {
    fn drop(&mut self) {
        let mut n = self.0.count.lock().unwrap_or_else(PoisonError::into_inner);
        *n -= 1;
        if *n == 0 {
            self.0.idle.notify_all();
        }
    }
}

impl AbortsInFlight {
    pub(crate) const fn new() -> Self {
        AbortsInFlight {
            count: Mutex::new(0),
            idle: Condvar::new(),
        }
    }

    /// Counts an abort until the returned guard is dropped.
    pub(crate) fn begin(&self) -> Aborting<'_> {
        *self.count.lock().unwrap_or_else(PoisonError::into_inner) += 1;
        Aborting(self)
    }

    /// Waits until no abort runs, at most `limit`; true when none does.
    pub(crate) fn wait_idle(&self, limit: Duration) -> bool {
        let deadline = Instant::now() + limit;
        let mut n = self.count.lock().unwrap_or_else(PoisonError::into_inner);
        while *n > 0 {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return false;
            }
            n = self
                .idle
                .wait_timeout(n, left)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
        true
    }
}

/// This process's NCCL aborts.
pub(crate) static ABORTS: AbortsInFlight = AbortsInFlight::new();

/// How long the process's exit waits for aborts in progress (an abort
/// blocked for good must not keep the process alive).
const EXIT_WAIT: Duration = Duration::from_secs(10);

extern "C" fn wait_for_aborts_at_exit() {
    if !ABORTS.wait_idle(EXIT_WAIT) {
        eprintln!(
            "tensorcomm: exiting while an NCCL communicator is still being aborted (waited {EXIT_WAIT:?})"
        );
    }
}

/// Makes the process's exit wait for [`ABORTS`]. Call it once NCCL is
/// loaded: handlers registered later run earlier at exit, so this one runs
/// before NCCL's own clean-up.
pub(crate) fn wait_for_aborts_at_exit_once() {
    static REGISTERED: Once = Once::new();
    REGISTERED.call_once(|| {
        // SAFETY: registers a handler that takes no arguments and does not
        // unwind (it only locks, waits and prints).
        unsafe {
            libc::atexit(wait_for_aborts_at_exit);
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn waiting_ends_when_the_last_abort_does_and_gives_up_at_its_limit() {
        let aborts = AbortsInFlight::new();
        assert!(aborts.wait_idle(Duration::ZERO), "none running");
        std::thread::scope(|s| {
            let first = aborts.begin();
            let second = aborts.begin();
            assert!(!aborts.wait_idle(Duration::from_millis(50)));
            drop(first);
            assert!(!aborts.wait_idle(Duration::from_millis(50)), "one left");
            s.spawn(move || {
                std::thread::sleep(Duration::from_millis(100));
                drop(second);
            });
            let started = Instant::now();
            assert!(aborts.wait_idle(Duration::from_secs(10)));
            assert!(started.elapsed() < Duration::from_secs(5));
        });
    }
}
