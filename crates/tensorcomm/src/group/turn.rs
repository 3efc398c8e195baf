//! Call order: a group's queued collectives and whose turn it is to run.

use std::sync::{Condvar, Mutex, PoisonError};

pub(crate) type Job = Box<dyn FnOnce() + Send>;

/// A queued collective, run once by whichever comes first: the group's
/// thread reaching it in the queue, or a caller waiting on its `Work`.
pub(crate) struct QueuedJob {
    pub(crate) job: Mutex<Option<Job>>,
}

impl QueuedJob {
    /// Runs the job unless another thread has already taken it.
    pub(crate) fn run_once(&self) {
        let job = self
            .job
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        if let Some(job) = job {
            job();
        }
    }

    /// True once a thread has taken the job (it ran, or is running).
    pub(crate) fn is_taken(&self) -> bool {
        self.job
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .is_none()
    }
}

/// Whose turn it is: the sequence number of the next collective to run.
/// Jobs may be taken out of order (a waiter takes its own), so each waits
/// here for its turn before running.
#[derive(Default)]
pub(crate) struct Turn {
    state: Mutex<TurnState>,
    changed: Condvar,
}

#[derive(Default)]
struct TurnState {
    /// The sequence number of the next collective to run.
    next: u64,
    /// Threads blocked in [`Turn::wait_for`]: passing the turn on wakes
    /// them only if there are any (a notify is a syscall even with nobody
    /// to wake, and collectives run in order mostly find their turn).
    waiting: usize,
}

impl Turn {
    /// Blocks until collective `seq` may run; dropping the returned guard
    /// (also on a panic) hands the turn to `seq + 1`.
    pub(crate) fn wait_for(&self, seq: u64) -> TurnGuard<'_> {
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        while state.next != seq {
            state.waiting += 1;
            state = self
                .changed
                .wait(state)
                .unwrap_or_else(PoisonError::into_inner);
            state.waiting -= 1;
        }
        TurnGuard { turn: self }
    }
}

/// The running collective's turn; passes it on when dropped.
pub(crate) struct TurnGuard<'a> {
    turn: &'a Turn,
}

impl Drop for TurnGuard<'_> {
    fn drop(&mut self) {
        let waiting = {
            let mut state = self
                .turn
                .state
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            state.next += 1;
            state.waiting > 0
        };
        if waiting {
            self.turn.changed.notify_all();
        }
    }
}
