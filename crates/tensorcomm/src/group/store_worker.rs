//! A group's background store calls (its stall checks, its published
//! progress) on a thread of their own. The threads that watch the group's
//! collectives (the stall monitor, the watchdog) hand the calls over and
//! keep checking their stop flag and their deadlines while the store
//! answers, so a store that is slow or whose host stopped neither delays
//! a deadline nor holds the group's drop, which joins those threads. The
//! calls themselves keep the store client's ordinary patience, so a
//! busy store is waited for and a mismatch it has to reveal is still
//! found.
//!
//! The worker is not joined: once its group is gone it runs no queued
//! call and ends when its current call returns.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use crate::store::Store;
use crate::{Error, Result};

type Job = Box<dyn FnOnce(&dyn Store) + Send>;

/// The thread that makes a group's background store calls.
pub(crate) struct StoreWorker {
    jobs: Mutex<Sender<Job>>,
    /// Set when the group is gone: queued calls are dropped, not made.
    closed: Arc<AtomicBool>,
}

impl StoreWorker {
    /// Starts the worker thread, named `name`, calling `store`.
    pub(crate) fn start(store: Arc<dyn Store>, name: String) -> Result<StoreWorker> {
        let (jobs, incoming) = mpsc::channel::<Job>();
        let closed = Arc::new(AtomicBool::new(false));
        let done = closed.clone();
        std::thread::Builder::new()
            .name(name)
            .spawn(move || {
                for job in incoming {
                    if done.load(Ordering::Acquire) {
                        return;
                    }
                    job(&*store);
                }
            })
            .map_err(|e| Error::io("starting the process group's store worker", e))?;
        Ok(StoreWorker {
            jobs: Mutex::new(jobs),
            closed,
        })
    }

    /// Queues `f` on the worker; its answer comes through the returned
    /// [`Answer`].
    pub(crate) fn ask<T: Send + 'static>(
        &self,
        f: impl FnOnce(&dyn Store) -> T + Send + 'static,
    ) -> Answer<T> {
        let (tx, rx) = mpsc::channel();
        let job: Job = Box::new(move |store| {
            let _ = tx.send(f(store));
        });
        // A worker that has ended drops the answer's sender: `Gone`.
        let _ = self
            .jobs
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .send(job);
        Answer(rx)
    }
}

impl Drop for StoreWorker {
    fn drop(&mut self) {
        self.closed.store(true, Ordering::Release);
    }
}

/// What a call handed to a [`StoreWorker`] returns, once it has.
pub(crate) struct Answer<T>(Receiver<T>);

/// Where a [`StoreWorker`] call stands.
pub(crate) enum Reply<T> {
    Answered(T),
    /// Not answered yet.
    Waiting,
    /// The worker ended without answering.
    Gone,
}

impl<T> Answer<T> {
    /// The answer, waiting up to `patience` for it.
    pub(crate) fn wait(&self, patience: Duration) -> Reply<T> {
        match self.0.recv_timeout(patience) {
            Ok(v) => Reply::Answered(v),
            Err(RecvTimeoutError::Timeout) => Reply::Waiting,
            Err(RecvTimeoutError::Disconnected) => Reply::Gone,
        }
    }

    /// The answer if it has come.
    pub(crate) fn poll(&self) -> Reply<T> {
        self.wait(Duration::ZERO)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::HashStore;
    use std::time::Instant;

    #[test]
    fn calls_run_in_order_and_answer() {
        let worker = StoreWorker::start(Arc::new(HashStore::new()), "w".into()).unwrap();
        let set = worker.ask(|s| s.set("k", b"v"));
        let got = worker.ask(|s| s.get("k"));
        assert!(matches!(
            set.wait(Duration::from_secs(5)),
            Reply::Answered(Ok(()))
        ));
        let Reply::Answered(value) = got.wait(Duration::from_secs(5)) else {
            panic!("the get was not answered");
        };
        assert_eq!(value.unwrap(), b"v");
    }

    #[test]
    fn a_call_the_store_holds_leaves_the_asker_free_and_later_calls_are_dropped() {
        let store = Arc::new(HashStore::new());
        let worker = StoreWorker::start(store.clone(), "w".into()).unwrap();
        // A get of a key nobody sets: the store holds it for 1 s.
        let (began, began_rx) = mpsc::channel();
        let held = worker.ask(move |s| {
            let _ = began.send(());
            s.get_timeout("never", Duration::from_secs(1))
        });
        let started = Instant::now();
        assert!(matches!(held.poll(), Reply::Waiting));
        assert!(started.elapsed() < Duration::from_millis(500));
        began_rx.recv_timeout(Duration::from_secs(5)).unwrap();
        let queued = worker.ask(|s| s.set("late", b"1"));
        drop(worker);
        // The held call still answers; the queued one is never made.
        assert!(matches!(
            held.wait(Duration::from_secs(5)),
            Reply::Answered(Err(Error::StoreTimeout { .. }))
        ));
        assert!(matches!(queued.wait(Duration::from_secs(5)), Reply::Gone));
        assert!(!store.check(&["late"]).unwrap());
    }
}
