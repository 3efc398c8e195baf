//! The group thread's idle poll (see `GroupBackend::idle_spin`): how long
//! to poll after a collective, and taking the next collective from the
//! queue, polling first.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, TryRecvError};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::turn::QueuedJob;

/// A group's idle poll: how long it polls (`GroupBackend::idle_spin`) and
/// how long the last collective's `run` took, which says whether to poll
/// now ([`poll_after`]).
pub(super) struct IdlePoll {
    spin: Duration,
    last_run_ns: AtomicU64,
}

impl IdlePoll {
    pub(super) fn new(spin: Duration) -> Self {
        IdlePoll {
            spin,
            last_run_ns: AtomicU64::new(0),
        }
    }

    /// How long to poll now, after the last collective.
    pub(super) fn now(&self) -> Duration {
        poll_after(&self.last_run_ns, self.spin)
    }

    /// Runs a collective's `run` and records how long it took; a group
    /// that never polls reads no clock.
    pub(super) fn timed<T>(&self, run: impl FnOnce() -> T) -> T {
        if self.spin.is_zero() {
            return run();
        }
        let ran = Instant::now();
        let result = run();
        let took = u64::try_from(ran.elapsed().as_nanos()).unwrap_or(u64::MAX);
        self.last_run_ns.store(took, Ordering::Relaxed);
        result
    }
}

/// How long to poll after a collective whose `run` took `last_run_ns`: the
/// backend's `spin` after a short one, nothing after one longer than that.
/// Long collectives are bandwidth-bound and often busy every core with
/// helper threads, where a poll would take a core from them; their
/// callers and the group's thread sleep as they would without it, and a
/// wake-up costs little beside them.
fn poll_after(last_run_ns: &AtomicU64, spin: Duration) -> Duration {
    let short = u128::from(last_run_ns.load(Ordering::Relaxed)) <= spin.as_nanos();
    if short {
        spin
    } else {
        Duration::ZERO
    }
}

/// The group thread's next collective, `None` once the group is gone: a
/// collective queued within `spin` of asking is taken while polling,
/// without the queue having to wake this thread; after that it sleeps.
pub(super) fn next_job(
    incoming: &Receiver<Arc<QueuedJob>>,
    spin: Duration,
) -> Option<Arc<QueuedJob>> {
    if !spin.is_zero() {
        let until = Instant::now() + spin;
        loop {
            match incoming.try_recv() {
                Ok(job) => return Some(job),
                Err(TryRecvError::Disconnected) => return None,
                Err(TryRecvError::Empty) if Instant::now() < until => std::hint::spin_loop(),
                Err(TryRecvError::Empty) => break,
            }
        }
    }
    incoming.recv().ok()
}

#[cfg(test)]
mod next_job_tests {
    use std::sync::mpsc::channel;
    use std::time::{Duration, Instant};

    use super::*;
    use std::sync::Mutex;

    fn job() -> Arc<QueuedJob> {
        Arc::new(QueuedJob {
            job: Mutex::new(Some(Box::new(|| {}))),
        })
    }

    const POLL: Duration = Duration::from_millis(20);

    #[test]
    fn a_job_queued_during_the_poll_or_after_it_is_taken() {
        let (tx, rx) = channel();
        // During the poll.
        let sender = std::thread::spawn({
            let tx = tx.clone();
            move || {
                std::thread::sleep(Duration::from_millis(5));
                tx.send(job()).unwrap();
            }
        });
        assert!(next_job(&rx, POLL).is_some());
        sender.join().unwrap();
        // After it, once the thread sleeps.
        let sender = std::thread::spawn(move || {
            std::thread::sleep(POLL * 3);
            tx.send(job()).unwrap();
        });
        assert!(next_job(&rx, POLL).is_some());
        sender.join().unwrap();
    }

    #[test]
    fn queued_jobs_drain_before_a_dropped_queue_ends_the_thread() {
        let (tx, rx) = channel();
        tx.send(job()).unwrap();
        tx.send(job()).unwrap();
        drop(tx);
        assert!(next_job(&rx, POLL).is_some());
        assert!(next_job(&rx, Duration::ZERO).is_some());
        let asked = Instant::now();
        assert!(next_job(&rx, POLL * 50).is_none());
        assert!(asked.elapsed() < POLL * 25, "{:?}", asked.elapsed());
    }

    #[test]
    fn a_queue_dropped_during_the_poll_ends_it_at_once() {
        let (tx, rx) = channel::<Arc<QueuedJob>>();
        let dropper = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(5));
            drop(tx);
        });
        let asked = Instant::now();
        assert!(next_job(&rx, Duration::from_secs(5)).is_none());
        assert!(
            asked.elapsed() < Duration::from_secs(2),
            "{:?}",
            asked.elapsed()
        );
        dropper.join().unwrap();
    }
}

#[cfg(test)]
mod poll_after_tests {
    use super::*;

    #[test]
    fn only_a_short_collective_is_followed_by_a_poll() {
        let spin = Duration::from_micros(50);
        let took = |us: u64| AtomicU64::new(us * 1000);
        assert_eq!(poll_after(&took(0), spin), spin);
        assert_eq!(poll_after(&took(50), spin), spin);
        assert_eq!(poll_after(&took(51), spin), Duration::ZERO);
        assert_eq!(poll_after(&took(0), Duration::ZERO), Duration::ZERO);
    }
}
