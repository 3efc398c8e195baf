//! `Work`: the handle a collective returns.

use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock, PoisonError};
use std::time::{Duration, Instant};

use crate::Result;

/// Where a collective's outcome is left by the thread running it.
#[derive(Default)]
pub(crate) struct Completion {
    outcome: Mutex<Option<Result<()>>>,
    done: Condvar,
    /// The rank a receive got its message from, set before it completes.
    source: OnceLock<usize>,
}

impl Completion {
    fn lock(&self) -> MutexGuard<'_, Option<Result<()>>> {
        self.outcome.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Records the outcome and wakes every waiter.
    pub(crate) fn complete(&self, outcome: Result<()>) {
        *self.lock() = Some(outcome);
        self.done.notify_all();
    }

    /// Records the outcome of a receive, with the rank the message came
    /// from when it succeeded, and wakes every waiter.
    pub(crate) fn complete_recv(&self, outcome: Result<usize>) {
        let outcome = outcome.map(|source| {
            let _ = self.source.set(source);
        });
        self.complete(outcome);
    }
}

/// A collective in flight (or finished): c10d's `Work`.
///
/// Collectives of one group run in the order they were called; the call
/// returns at once with a `Work`. A backend may run a collective on the
/// thread that calls [`Work::wait`] when it has not started yet (the CPU
/// backend does, to save a thread hand-off).
///
/// ```
/// use std::time::Duration;
/// use tensorcomm::{init_process_group, Backend, ReduceOp};
/// use tensorcomm::tensor::Tensor;
///
/// let pg = init_process_group(Backend::Cpu, "tcp://127.0.0.1:0?rank=0&world_size=1")?;
/// let t = Tensor::from_vec(vec![1.0f32, 2.0], &[2])?;
/// let work = pg.all_reduce(&t, ReduceOp::Sum, None)?;
/// assert!(work.wait_timeout(Duration::from_secs(10)));
/// assert!(work.is_completed());
/// work.wait()?;
/// assert_eq!(t.to_vec::<f32>()?, [1.0, 2.0]);
/// # Ok::<(), tensorcomm::Error>(())
/// ```
#[must_use = "a collective's errors are only seen through its Work"]
pub struct Work {
    completion: Arc<Completion>,
    /// Runs the collective on the waiting thread if nobody has started it
    /// yet (and does nothing otherwise); called by [`Work::wait`].
    runner: Option<Runner>,
}

/// See [`Work::with_runner`].
pub(crate) type Runner = Box<dyn FnOnce() + Send>;

impl std::fmt::Debug for Work {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Work")
            .field("completed", &self.is_completed())
            .finish()
    }
}

impl Work {
    pub(crate) fn new() -> (Self, Arc<Completion>) {
        let completion = Arc::new(Completion::default());
        (
            Work {
                completion: completion.clone(),
                runner: None,
            },
            completion,
        )
    }

    /// Lets [`Work::wait`] run the collective itself through `runner`,
    /// which must run it if no other thread has started it and return at
    /// once otherwise.
    pub(crate) fn with_runner(mut self, runner: Runner) -> Self {
        self.runner = Some(runner);
        self
    }

    /// A `Work` that is already finished with `outcome`.
    pub(crate) fn done(outcome: Result<()>) -> Self {
        let (work, completion) = Work::new();
        completion.complete(outcome);
        work
    }

    /// True once the collective has finished, successfully or not.
    pub fn is_completed(&self) -> bool {
        self.completion.lock().is_some()
    }

    /// Waits at most `timeout` for the collective to finish; true if it has.
    /// The collective's own timeout still bounds it when this returns false.
    pub fn wait_timeout(&self, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        let mut guard = self.completion.lock();
        while guard.is_none() {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return false;
            }
            guard = self
                .completion
                .done
                .wait_timeout(guard, left)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
        true
    }

    /// Waits for the collective and returns its outcome.
    pub fn wait(mut self) -> Result<()> {
        if let Some(runner) = self.runner.take() {
            runner();
        }
        let mut guard = self.completion.lock();
        loop {
            if let Some(outcome) = guard.take() {
                return outcome;
            }
            guard = self
                .completion
                .done
                .wait(guard)
                .unwrap_or_else(PoisonError::into_inner);
        }
    }

    /// The outcome if the collective has finished (taking it: a second call
    /// returns `None`), without waiting.
    pub fn result(&mut self) -> Option<Result<()>> {
        self.completion.lock().take()
    }

    /// The rank a finished receive (`recv`, `recv_any_source`) got its
    /// message from; `None` before it finishes, when it failed, and for
    /// every other kind of `Work`.
    ///
    /// ```
    /// use std::{sync::Arc, thread, time::Duration};
    /// use tensorcomm::cpu::backend::{CpuOptions, ProcessGroupCpu};
    /// use tensorcomm::group::ProcessGroup;
    /// use tensorcomm::store::HashStore;
    /// use tensorcomm::tensor::Tensor;
    ///
    /// let store = Arc::new(HashStore::new());
    /// let sender = {
    ///     let store = store.clone();
    ///     thread::spawn(move || -> tensorcomm::Result<()> {
    ///         let pg = ProcessGroupCpu::new(store, "doc", 1, 2, &CpuOptions::default())?;
    ///         pg.send(&Tensor::from_vec(vec![7u8; 3], &[3])?, 0, 5, None)?.wait()
    ///     })
    /// };
    /// let pg = ProcessGroupCpu::new(store, "doc", 0, 2, &CpuOptions::default())?;
    /// let t = Tensor::zeros(&[3], tensorcomm::tensor::DType::U8)?;
    /// let work = pg.recv_any_source(&t, 5, None)?;
    /// assert!(work.wait_timeout(Duration::from_secs(30)));
    /// assert_eq!(work.source_rank(), Some(1));
    /// work.wait()?;
    /// assert_eq!(t.to_vec::<u8>()?, [7, 7, 7]);
    /// sender.join().unwrap()?;
    /// # Ok::<(), tensorcomm::Error>(())
    /// ```
    pub fn source_rank(&self) -> Option<usize> {
        self.completion.source.get().copied()
    }
}
