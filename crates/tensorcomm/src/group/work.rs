//! `Work`: the handle a collective returns, completed on the host or on a
//! device, and the futures chained on it.

mod device_event;
mod future;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock, PoisonError};
use std::time::{Duration, Instant};

pub use device_event::DeviceEvent;
pub use future::WorkFuture;

use crate::{Error, Result};

/// How long [`Work::wait_timeout`] sleeps between queries of a device event.
const DEVICE_POLL: Duration = Duration::from_micros(100);

/// Where a collective's outcome is left by the thread running it.
#[derive(Default)]
pub(crate) struct Completion {
    state: Mutex<State>,
    done: Condvar,
    /// Set once the host outcome is in `state`: what a waiter polls
    /// before it sleeps on `done`.
    settled: AtomicBool,
    /// How long a waiter polls `settled` before it sleeps (see
    /// `GroupBackend::idle_spin`).
    spin: Duration,
    /// The rank a receive got its message from, set before it completes.
    source: OnceLock<usize>,
}

#[derive(Default)]
struct State {
    /// The host outcome, once known. It is stored, not taken, so every
    /// taker gets a copy ([`Error`] is `Clone`); an error of the device
    /// event replaces a success.
    outcome: Option<Result<()>>,
    /// Device work that a successful outcome still waits on.
    event: Option<Arc<dyn DeviceEvent>>,
    /// Run once with the outcome: the futures of this work.
    hooks: Vec<Hook>,
    /// Threads blocked on `done`: completing wakes them only if there are
    /// any (a notify is a syscall even with nobody to wake, and a caller
    /// that runs its own collective never waits).
    waiters: usize,
}

/// The hooks of a work that [`Completion::settle`] completed, to run with
/// its outcome.
#[derive(Default)]
#[must_use = "the futures of the work wait for these hooks"]
pub(crate) struct SettledHooks {
    hooks: Vec<Hook>,
    outcome: Option<Result<()>>,
    event: Option<Arc<dyn DeviceEvent>>,
}

impl SettledHooks {
    /// Runs every hook with the outcome.
    pub(crate) fn run(self) {
        if let Some(outcome) = self.outcome {
            for hook in self.hooks {
                hook(outcome.clone(), self.event.clone());
            }
        }
    }
}

/// See [`Completion::on_complete`].
type Hook = Box<dyn FnOnce(Result<()>, Option<Arc<dyn DeviceEvent>>) + Send>;

impl Completion {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Records the outcome and wakes every waiter. Only the first outcome
    /// counts; a later one is ignored.
    pub(crate) fn complete(&self, outcome: Result<()>) {
        self.finish(outcome, None);
    }

    /// Records the host outcome of work that, on success, still runs on a
    /// device until `event` has passed, and wakes every waiter (see
    /// [`Work`] for what waiting means then). On failure `event` is
    /// dropped.
    pub(crate) fn complete_on_device(&self, outcome: Result<()>, event: Arc<dyn DeviceEvent>) {
        let event = outcome.is_ok().then_some(event);
        self.finish(outcome, event);
    }

    /// Records the outcome of a receive, with the rank the message came
    /// from when it succeeded, and wakes every waiter.
    pub(crate) fn complete_recv(&self, outcome: Result<usize>) {
        let outcome = outcome.map(|source| {
            let _ = self.source.set(source);
        });
        self.complete(outcome);
    }

    /// Records a successful receive from `source` whose message still
    /// goes to a device until `event` has passed (see
    /// [`complete_on_device`](Self::complete_on_device)).
    pub(crate) fn complete_recv_on_device(&self, source: usize, event: Arc<dyn DeviceEvent>) {
        let _ = self.source.set(source);
        self.complete_on_device(Ok(()), event);
    }

    fn finish(&self, outcome: Result<()>, event: Option<Arc<dyn DeviceEvent>>) {
        self.settle(outcome, event).run();
    }

    /// Records the outcome (a success still waiting on the device until
    /// `event` has passed) and wakes every waiter, like
    /// [`complete`](Self::complete) and
    /// [`complete_on_device`](Self::complete_on_device), but leaves the
    /// hooks (the futures' callbacks) to the caller: the engine marks a
    /// collective complete while it still holds the group's turn, so the
    /// next collective cannot finish first, and runs the callbacks after
    /// handing the turn on, so a callback may itself wait on a collective.
    pub(crate) fn settle(
        &self,
        outcome: Result<()>,
        event: Option<Arc<dyn DeviceEvent>>,
    ) -> SettledHooks {
        let event = if outcome.is_ok() { event } else { None };
        let (hooks, waiters) = {
            let mut state = self.lock();
            if state.outcome.is_some() {
                return SettledHooks::default();
            }
            state.outcome = Some(outcome.clone());
            state.event = event.clone();
            self.settled.store(true, Ordering::Release);
            (std::mem::take(&mut state.hooks), state.waiters > 0)
        };
        if waiters {
            self.done.notify_all();
        }
        SettledHooks {
            hooks,
            outcome: Some(outcome),
            event,
        }
    }

    /// Runs `hook` with the outcome (and the device event a success still
    /// waits on): at once on this thread if it is known, else on the
    /// thread that completes the work, after the waiters are woken.
    fn on_complete(&self, hook: Hook) {
        let mut state = self.lock();
        match &state.outcome {
            Some(outcome) => {
                let (outcome, event) = (outcome.clone(), state.event.clone());
                drop(state);
                hook(outcome, event);
            }
            None => state.hooks.push(hook),
        }
    }

    /// Blocks until the host outcome is known; gives it, with the device
    /// event a success still waits on.
    fn wait_host(&self) -> Result<Option<Arc<dyn DeviceEvent>>> {
        if !self.spin.is_zero() && !self.settled.load(Ordering::Acquire) {
            let until = Instant::now() + self.spin;
            while !self.settled.load(Ordering::Acquire) && Instant::now() < until {
                std::hint::spin_loop();
            }
        }
        let mut state = self.lock();
        loop {
            if let Some(outcome) = &state.outcome {
                return outcome.clone().map(|()| state.event.clone());
            }
            state.waiters += 1;
            state = self
                .done
                .wait(state)
                .unwrap_or_else(PoisonError::into_inner);
            state.waiters -= 1;
        }
    }

    /// True once the host outcome is known and the device event, if any,
    /// has passed (or failed: its error is then the outcome). Never blocks.
    fn is_settled(&self) -> bool {
        let event = {
            let state = self.lock();
            if state.outcome.is_none() {
                return false;
            }
            state.event.clone()
        };
        match event.map(|event| event.query()) {
            None | Some(Ok(true)) => true,
            Some(Ok(false)) => false,
            Some(Err(e)) => {
                self.device_failed(e);
                true
            }
        }
    }

    /// Makes `error`, raised by the device event, the outcome of a work
    /// that had succeeded on the host, and gives it back.
    fn device_failed(&self, error: Error) -> Error {
        let mut state = self.lock();
        if matches!(state.outcome, Some(Ok(()))) {
            state.outcome = Some(Err(error.clone()));
        }
        state.event = None;
        error
    }
}

/// A collective in flight (or finished): c10d's `Work`.
///
/// Collectives of one group run in the order they were called; the call
/// returns at once with a `Work`. A backend may run a collective on the
/// thread that calls [`Work::wait`] when it has not started yet (the CPU
/// backend does, to save a thread hand-off).
///
/// A collective finishes on the host (the CPU backend), or its host part
/// finishes and its device part is still queued on a device behind a
/// [`DeviceEvent`] (a device backend). For host-only work, [`wait`] and
/// [`synchronize`] are the same. For device work they follow c10d's NCCL
/// backend: [`wait`] makes the caller's current stream wait for the device
/// work and returns without blocking on it; [`synchronize`] also blocks
/// the host until the device work is done; [`is_completed`] is true only
/// once the device work is done. An error of the device event is the
/// work's error.
///
/// [`wait`]: Work::wait
/// [`synchronize`]: Work::synchronize
/// [`is_completed`]: Work::is_completed
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
    /// yet (and does nothing otherwise); taken by the first waiter.
    runner: Option<SharedRunner>,
    /// Set once [`Work::result`] has handed the outcome out.
    result_taken: bool,
}

/// See [`Work::with_runner`].
pub(crate) type Runner = Box<dyn FnOnce() + Send>;

/// A [`Runner`] that any of several waiters may take and run.
type SharedRunner = Arc<Mutex<Option<Runner>>>;

/// Runs the collective behind `runner` on this thread unless another
/// waiter already took it.
fn run_pending(runner: &SharedRunner) {
    let job = runner.lock().unwrap_or_else(PoisonError::into_inner).take();
    if let Some(job) = job {
        job();
    }
}

impl std::fmt::Debug for Work {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Work")
            .field("completed", &self.is_completed())
            .finish()
    }
}

impl Work {
    pub(crate) fn new() -> (Self, Arc<Completion>) {
        Work::polling_for(Duration::ZERO)
    }

    /// [`Work::new`] whose waiters poll for up to `spin` before they sleep
    /// (see `GroupBackend::idle_spin`).
    pub(crate) fn polling_for(spin: Duration) -> (Self, Arc<Completion>) {
        let completion = Arc::new(Completion {
            spin,
            ..Completion::default()
        });
        (
            Work {
                completion: completion.clone(),
                runner: None,
                result_taken: false,
            },
            completion,
        )
    }

    /// Lets [`Work::wait`] run the collective itself through `runner`,
    /// which must run it if no other thread has started it and return at
    /// once otherwise.
    pub(crate) fn with_runner(mut self, runner: Runner) -> Self {
        self.runner = Some(Arc::new(Mutex::new(Some(runner))));
        self
    }

    /// A `Work` that is already finished with `outcome`.
    pub(crate) fn done(outcome: Result<()>) -> Self {
        let (work, completion) = Work::new();
        completion.complete(outcome);
        work
    }

    /// True once the collective has finished, successfully or not: its
    /// host outcome is known and its device work, if any, is done.
    ///
    /// ```
    /// use tensorcomm::{init_process_group, Backend};
    ///
    /// let pg = init_process_group(Backend::Cpu, "tcp://127.0.0.1:0?rank=0&world_size=1")?;
    /// let work = pg.barrier(None)?;
    /// while !work.is_completed() {
    ///     std::thread::yield_now(); // the group's thread runs it
    /// }
    /// work.wait()?;
    /// # Ok::<(), tensorcomm::Error>(())
    /// ```
    pub fn is_completed(&self) -> bool {
        self.completion.is_settled()
    }

    /// Waits at most `timeout` for the collective to finish as
    /// [`is_completed`](Work::is_completed) means it (polling a device
    /// event, if any); true if it has. The collective's own timeout still
    /// bounds it when this returns false. Does not run the collective on
    /// this thread.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tensorcomm::{init_process_group, Backend};
    ///
    /// let pg = init_process_group(Backend::Cpu, "tcp://127.0.0.1:0?rank=0&world_size=1")?;
    /// let work = pg.barrier(None)?;
    /// assert!(work.wait_timeout(Duration::from_secs(10)));
    /// work.wait()?;
    /// # Ok::<(), tensorcomm::Error>(())
    /// ```
    pub fn wait_timeout(&self, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        let mut state = self.completion.lock();
        while state.outcome.is_none() {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return false;
            }
            state.waiters += 1;
            state = self
                .completion
                .done
                .wait_timeout(state, left)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
            state.waiters -= 1;
        }
        drop(state);
        loop {
            if self.completion.is_settled() {
                return true;
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return false;
            }
            std::thread::sleep(left.min(DEVICE_POLL));
        }
    }

    /// Waits for the collective's host outcome and returns it; for device
    /// work that succeeded, also makes the caller's current stream wait for
    /// the device work (the host does not wait for it: see
    /// [`synchronize`](Work::synchronize)).
    ///
    /// ```
    /// use tensorcomm::{init_process_group, Backend, ReduceOp};
    /// use tensorcomm::tensor::Tensor;
    ///
    /// let pg = init_process_group(Backend::Cpu, "tcp://127.0.0.1:0?rank=0&world_size=1")?;
    /// let t = Tensor::from_vec(vec![3i32, 4], &[2])?;
    /// pg.all_reduce(&t, ReduceOp::Max, None)?.wait()?;
    /// assert_eq!(t.to_vec::<i32>()?, [3, 4]);
    /// # Ok::<(), tensorcomm::Error>(())
    /// ```
    pub fn wait(self) -> Result<()> {
        if let Some(event) = self.wait_host()? {
            event
                .wait_on_current_stream()
                .map_err(|e| self.completion.device_failed(e))?;
        }
        Ok(())
    }

    /// [`wait`](Work::wait), then blocks the host until the device work,
    /// if any, is done: c10d's `Work::synchronize`. For host-only work it
    /// is `wait`.
    ///
    /// ```
    /// use tensorcomm::{init_process_group, Backend};
    /// use tensorcomm::tensor::Tensor;
    ///
    /// let pg = init_process_group(Backend::Cpu, "tcp://127.0.0.1:0?rank=0&world_size=1")?;
    /// let t = Tensor::from_vec(vec![1u8, 2, 3], &[3])?;
    /// pg.broadcast(&t, 0, None)?.synchronize()?;
    /// assert_eq!(t.to_vec::<u8>()?, [1, 2, 3]);
    /// # Ok::<(), tensorcomm::Error>(())
    /// ```
    pub fn synchronize(self) -> Result<()> {
        if let Some(event) = self.wait_host()? {
            event
                .wait_on_current_stream()
                .and_then(|()| event.synchronize())
                .map_err(|e| self.completion.device_failed(e))?;
        }
        Ok(())
    }

    /// A future of this work's outcome (c10d's `Work::getFuture`), to
    /// chain callbacks on with [`WorkFuture::then`], as DDP communication
    /// hooks do. Waiting on the future (or on any future chained after it)
    /// runs the collective on the waiting thread if nobody has started it,
    /// as [`wait`](Work::wait) does. The work and each of its futures get
    /// the same outcome; an error is cloned for each of them.
    ///
    /// ```
    /// use tensorcomm::{init_process_group, Backend, ReduceOp};
    /// use tensorcomm::tensor::Tensor;
    ///
    /// let pg = init_process_group(Backend::Cpu, "tcp://127.0.0.1:0?rank=0&world_size=1")?;
    /// let t = Tensor::from_vec(vec![1.5f64, 2.5], &[2])?;
    /// let work = pg.all_reduce(&t, ReduceOp::Sum, None)?;
    /// let sum = work.get_future().then({
    ///     let t = t.clone();
    ///     move |outcome| {
    ///         outcome?;
    ///         Ok(t.to_vec::<f64>()?.iter().sum::<f64>())
    ///     }
    /// });
    /// assert_eq!(sum.wait()?, 4.0);
    /// work.wait()?; // the same outcome
    /// # Ok::<(), tensorcomm::Error>(())
    /// ```
    pub fn get_future(&self) -> WorkFuture<()> {
        let (future, promise) = WorkFuture::pending(self.runner.clone());
        self.completion.on_complete(Box::new(move |outcome, event| {
            promise.complete(outcome, event)
        }));
        future
    }

    /// Runs the collective on this thread if nobody has started it, then
    /// waits for its host outcome.
    fn wait_host(&self) -> Result<Option<Arc<dyn DeviceEvent>>> {
        if let Some(runner) = &self.runner {
            run_pending(runner);
        }
        self.completion.wait_host()
    }

    /// The outcome if the collective has finished as
    /// [`is_completed`](Work::is_completed) means it, without waiting; the
    /// first call that finds it gives it, later calls give `None`.
    /// [`wait`](Work::wait) still gives the outcome after this.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tensorcomm::{init_process_group, Backend};
    ///
    /// let pg = init_process_group(Backend::Cpu, "tcp://127.0.0.1:0?rank=0&world_size=1")?;
    /// let mut work = pg.barrier(None)?;
    /// assert!(work.wait_timeout(Duration::from_secs(10)));
    /// assert!(work.result().expect("finished").is_ok());
    /// assert!(work.result().is_none());
    /// work.wait()?;
    /// # Ok::<(), tensorcomm::Error>(())
    /// ```
    pub fn result(&mut self) -> Option<Result<()>> {
        if self.result_taken || !self.completion.is_settled() {
            return None;
        }
        self.result_taken = true;
        self.completion.lock().outcome.clone()
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

#[cfg(test)]
mod future_tests;
#[cfg(test)]
mod tests;
