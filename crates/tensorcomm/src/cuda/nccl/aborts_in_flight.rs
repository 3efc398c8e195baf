//! The NCCL aborts running in this process, which the process's exit
//! waits for: NCCL's own clean-up at exit, run while another thread was
//! inside `ncclCommAbort`, crashed a rank (SIGSEGV, seen on four H200s: a
//! rank reported its group's failure and exited while the watchdog still
//! aborted the communicator).

use std::io::Write;
use std::sync::{Condvar, Mutex, Once, PoisonError};
use std::time::{Duration, Instant};

/// A count of aborts in progress, and a way to wait until there are none.
pub(crate) struct AbortsInFlight {
    /// Aborts running, and whether the process is exiting (no new ones).
    state: Mutex<(usize, bool)>,
    idle: Condvar,
}

/// One abort in progress: counted until dropped.
pub(crate) struct Aborting<'a>(&'a AbortsInFlight);

impl Drop for Aborting<'_> {
    fn drop(&mut self) {
        let mut state = self.0.state.lock().unwrap_or_else(PoisonError::into_inner);
        state.0 -= 1;
        if state.0 == 0 {
            self.0.idle.notify_all();
        }
    }
}

impl AbortsInFlight {
    pub(crate) const fn new() -> Self {
        AbortsInFlight {
            state: Mutex::new((0, false)),
            idle: Condvar::new(),
        }
    }

    /// Counts an abort until the returned guard is dropped; `None` once
    /// [`exiting`](AbortsInFlight::exiting) ran: the abort must not call
    /// NCCL then.
    pub(crate) fn begin(&self) -> Option<Aborting<'_>> {
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        if state.1 {
            return None;
        }
        state.0 += 1;
        Some(Aborting(self))
    }

    /// Waits until no abort runs, at most `limit`; true when none does.
    pub(crate) fn wait_idle(&self, limit: Duration) -> bool {
        let deadline = Instant::now() + limit;
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        while state.0 > 0 {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return false;
            }
            state = self
                .idle
                .wait_timeout(state, left)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
        true
    }

    /// Refuses every later [`begin`](AbortsInFlight::begin), then waits
    /// (at most `limit`) for the aborts running; true when none is left.
    pub(crate) fn exiting(&self, limit: Duration) -> bool {
        self.state.lock().unwrap_or_else(PoisonError::into_inner).1 = true;
        self.wait_idle(limit)
    }
}

/// This process's NCCL aborts.
pub(crate) static ABORTS: AbortsInFlight = AbortsInFlight::new();

/// How long the process's exit waits for aborts in progress (an abort
/// blocked for good must not keep the process alive).
const EXIT_WAIT: Duration = Duration::from_secs(10);

extern "C" fn wait_for_aborts_at_exit() {
    if !ABORTS.exiting(EXIT_WAIT) {
        // Never a panic here (a closed stderr): it would abort the exit.
        let _ = writeln!(
            std::io::stderr(),
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
            let first = aborts.begin().unwrap();
            let second = aborts.begin().unwrap();
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
        // At exit: no new abort is counted (nor calls NCCL).
        assert!(aborts.exiting(Duration::ZERO));
        assert!(aborts.begin().is_none());
    }
}
