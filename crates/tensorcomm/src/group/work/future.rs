//! `WorkFuture`: a value that a [`Work`](super::Work) will give, with
//! callbacks chained on it (c10d's `Work::getFuture` and `Future::then`,
//! which DDP communication hooks return).

use std::any::Any;
use std::panic::{self, AssertUnwindSafe};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};

use super::{run_pending, DeviceEvent, SharedRunner};
use crate::{Error, Result};

/// A value that is known once a collective (and the callbacks chained
/// after it) has finished: c10d's `Future`. From
/// [`Work::get_future`](super::Work::get_future), from
/// [`WorkFuture::then`] or [`WorkFuture::ready`].
///
/// Each future has one consumer: [`wait`](WorkFuture::wait),
/// [`synchronize`](WorkFuture::synchronize) or
/// [`then`](WorkFuture::then) takes it. A `then` callback runs once, as
/// soon as the value is known: on the thread that completes it (for a
/// collective, the thread running it), or at once on the calling thread if
/// it is already known. Keep callbacks short, and do not wait in one on
/// later work of the same group: the group's thread may be the one running
/// it. A callback that panics gives [`Error::FutureFailed`] to the next
/// future in the chain; the panic goes no further.
///
/// A value whose collective finished on the host but still runs on a
/// device carries its [`DeviceEvent`], with the same meaning as for
/// [`Work`](super::Work): `wait` makes the current stream wait for it,
/// `synchronize` blocks the host on it, `is_completed` queries it. Before
/// a callback gets a value, the calling thread's current stream is made to
/// wait for the event, so device work the callback queues there runs
/// after the collective; the future `then` returns carries the same event
/// (unless making the stream wait failed: the callback gets that error).
///
/// ```
/// use tensorcomm::{init_process_group, Backend, ReduceOp};
/// use tensorcomm::tensor::Tensor;
///
/// // A DDP communication hook: sum a bucket over the ranks, then divide it
/// // by the world size, and hand back the bucket.
/// let pg = init_process_group(Backend::Cpu, "tcp://127.0.0.1:0?rank=0&world_size=1")?;
/// let bucket = Tensor::from_vec(vec![2.0f32, 4.0], &[2])?;
/// let world = pg.size() as f32;
/// let averaged = pg
///     .all_reduce(&bucket, ReduceOp::Sum, None)?
///     .get_future()
///     .then({
///         let bucket = bucket.clone();
///         move |summed| {
///             summed?;
///             let avg: Vec<f32> = bucket.to_vec::<f32>()?.iter().map(|x| x / world).collect();
///             Ok(avg)
///         }
///     });
/// assert_eq!(averaged.wait()?, [2.0, 4.0]);
/// # Ok::<(), tensorcomm::Error>(())
/// ```
#[must_use = "a future does nothing until it is waited on or chained"]
pub struct WorkFuture<T> {
    shared: Arc<Shared<T>>,
    /// The runner of the collective at the root of the chain, so that
    /// waiting on any future of the chain runs it if nobody has.
    runner: Option<SharedRunner>,
}

/// What a future and its [`Promise`] share.
struct Shared<T> {
    state: Mutex<State<T>>,
    ready: Condvar,
}

struct State<T> {
    /// The value once known, until its one consumer takes it.
    value: Option<Result<T>>,
    /// Device work that an `Ok` value still waits on.
    event: Option<Arc<dyn DeviceEvent>>,
    /// Set by `then` before the value is known: takes it when it comes.
    callback: Option<Callback<T>>,
}

type Callback<T> = Box<dyn FnOnce(Result<T>, Option<Arc<dyn DeviceEvent>>) + Send>;

/// The side of a [`WorkFuture`] that gives it its value. Dropped without
/// giving one, it gives [`Error::FutureFailed`], so no waiter hangs.
pub(super) struct Promise<T> {
    shared: Option<Arc<Shared<T>>>,
}

impl<T> Shared<T> {
    fn lock(&self) -> MutexGuard<'_, State<T>> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Hands `value` to the waiting callback, or stores it and wakes the
    /// waiters. The callback runs on this thread, outside the lock.
    fn complete(&self, value: Result<T>, event: Option<Arc<dyn DeviceEvent>>) {
        let event = if value.is_ok() { event } else { None };
        let mut state = self.lock();
        if let Some(callback) = state.callback.take() {
            drop(state);
            callback(value, event);
        } else {
            state.value = Some(value);
            state.event = event;
            drop(state);
            self.ready.notify_all();
        }
    }

    /// Runs `callback` with the value now if it is known, else when it is.
    fn on_value(&self, callback: Callback<T>) {
        let mut state = self.lock();
        match state.value.take() {
            Some(value) => {
                let event = state.event.take();
                drop(state);
                callback(value, event);
            }
            None => state.callback = Some(callback),
        }
    }

    /// Blocks until the value is known and takes it.
    fn take(&self) -> (Result<T>, Option<Arc<dyn DeviceEvent>>) {
        let mut state = self.lock();
        loop {
            if let Some(value) = state.value.take() {
                return (value, state.event.take());
            }
            state = self
                .ready
                .wait(state)
                .unwrap_or_else(PoisonError::into_inner);
        }
    }
}

impl<T> Promise<T> {
    /// Gives the future its value (and, with an `Ok` value, the device
    /// event it still waits on).
    pub(super) fn complete(mut self, value: Result<T>, event: Option<Arc<dyn DeviceEvent>>) {
        if let Some(shared) = self.shared.take() {
            shared.complete(value, event);
        }
    }
}

impl<T> Drop for Promise<T> {
    fn drop(&mut self) {
        if let Some(shared) = self.shared.take() {
            let reason = "the work was dropped before it finished; no value will come";
            shared.complete(
                Err(Error::FutureFailed {
                    reason: reason.into(),
                }),
                None,
            );
        }
    }
}

impl<T> std::fmt::Debug for WorkFuture<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WorkFuture")
            .field("completed", &self.shared.lock().value.is_some())
            .finish()
    }
}

impl<T: Send + 'static> WorkFuture<T> {
    /// A future without a value yet, and the promise that gives it one.
    pub(super) fn pending(runner: Option<SharedRunner>) -> (WorkFuture<T>, Promise<T>) {
        let shared = Arc::new(Shared {
            state: Mutex::new(State {
                value: None,
                event: None,
                callback: None,
            }),
            ready: Condvar::new(),
        });
        let promise = Promise {
            shared: Some(shared.clone()),
        };
        (WorkFuture { shared, runner }, promise)
    }

    /// A future that already holds `value` (c10d's completed `Future`),
    /// for a hook that has nothing to communicate.
    ///
    /// ```
    /// use tensorcomm::group::WorkFuture;
    ///
    /// let future = WorkFuture::ready(vec![1.0f32, 2.0]);
    /// assert!(future.is_completed());
    /// let doubled = future.then(|v| Ok(v?.iter().map(|x| x * 2.0).collect::<Vec<f32>>()));
    /// assert_eq!(doubled.wait()?, [2.0, 4.0]);
    /// # Ok::<(), tensorcomm::Error>(())
    /// ```
    pub fn ready(value: T) -> WorkFuture<T> {
        let (future, promise) = WorkFuture::pending(None);
        promise.complete(Ok(value), None);
        future
    }

    /// A future whose value `job` computes on the thread that first waits
    /// on it (or on a future chained on it with [`then`](WorkFuture::then)),
    /// and not before: for a DDP hook whose later collectives must be
    /// issued in the same order on every rank, which the
    /// [`Reducer`](crate::ddp::Reducer) guarantees by waiting on buckets in
    /// index order. Dropped without a wait, `job` never runs. A panic in
    /// `job` gives [`Error::FutureFailed`].
    pub(crate) fn deferred<F>(job: F) -> WorkFuture<T>
    where
        F: FnOnce() -> Result<T> + Send + 'static,
    {
        let runner: SharedRunner = Arc::new(Mutex::new(None));
        let (future, promise) = WorkFuture::pending(Some(runner.clone()));
        let run: super::Runner = Box::new(move || {
            let outcome = panic::catch_unwind(AssertUnwindSafe(job)).unwrap_or_else(|payload| {
                Err(Error::FutureFailed {
                    reason: format!("a deferred job panicked: {}", panic_message(&*payload)),
                })
            });
            promise.complete(outcome, None);
        });
        *runner.lock().unwrap_or_else(PoisonError::into_inner) = Some(run);
        future
    }

    /// True once the value is known and the device work it waits on, if
    /// any, is done (or failed: the value is then that error). Never
    /// blocks. A future whose job runs only when it is waited on (a
    /// PowerSGD hook's result, for one) stays false until something waits.
    ///
    /// ```
    /// use tensorcomm::{init_process_group, Backend};
    ///
    /// let pg = init_process_group(Backend::Cpu, "tcp://127.0.0.1:0?rank=0&world_size=1")?;
    /// let future = pg.barrier(None)?.get_future();
    /// while !future.is_completed() {
    ///     std::thread::yield_now(); // the group's thread runs the barrier
    /// }
    /// future.wait()?;
    /// # Ok::<(), tensorcomm::Error>(())
    /// ```
    pub fn is_completed(&self) -> bool {
        let event = {
            let state = self.shared.lock();
            if state.value.is_none() {
                return false;
            }
            state.event.clone()
        };
        match event.map(|event| event.query()) {
            None | Some(Ok(true)) => true,
            Some(Ok(false)) => false,
            Some(Err(e)) => {
                let mut state = self.shared.lock();
                state.value = Some(Err(e));
                state.event = None;
                true
            }
        }
    }

    /// Waits for the value and returns it. Runs the collective at the root
    /// of the chain on this thread if nobody has started it (as
    /// [`Work::wait`](super::Work::wait) does). For a value that waits on
    /// device work, makes the current stream wait for it without blocking
    /// the host.
    ///
    /// ```
    /// use tensorcomm::{init_process_group, Backend};
    /// use tensorcomm::tensor::Tensor;
    ///
    /// let pg = init_process_group(Backend::Cpu, "tcp://127.0.0.1:0?rank=0&world_size=1")?;
    /// let t = Tensor::from_vec(vec![5i64], &[1])?;
    /// pg.broadcast(&t, 0, None)?.get_future().wait()?;
    /// assert_eq!(t.to_vec::<i64>()?, [5]);
    /// # Ok::<(), tensorcomm::Error>(())
    /// ```
    pub fn wait(self) -> Result<T> {
        let (value, event) = self.take();
        let value = value?;
        if let Some(event) = event {
            event.wait_on_current_stream()?;
        }
        Ok(value)
    }

    /// [`wait`](WorkFuture::wait), then blocks the host until the device
    /// work the value waits on, if any, is done.
    ///
    /// ```
    /// use tensorcomm::{init_process_group, Backend};
    ///
    /// let pg = init_process_group(Backend::Cpu, "tcp://127.0.0.1:0?rank=0&world_size=1")?;
    /// let n = pg.barrier(None)?.get_future().then(|r| r.map(|()| 42)).synchronize()?;
    /// assert_eq!(n, 42);
    /// # Ok::<(), tensorcomm::Error>(())
    /// ```
    pub fn synchronize(self) -> Result<T> {
        let (value, event) = self.take();
        let value = value?;
        if let Some(event) = event {
            event.wait_on_current_stream()?;
            event.synchronize()?;
        }
        Ok(value)
    }

    /// Runs the collective at the root of the chain on this thread if
    /// nobody has started it, then blocks until the value is known.
    fn take(self) -> (Result<T>, Option<Arc<dyn DeviceEvent>>) {
        if let Some(runner) = &self.runner {
            run_pending(runner);
        }
        self.shared.take()
    }

    /// A future of `f`'s result: `f` gets this future's value (or error)
    /// once it is known, on the thread that completes it, or at once if it
    /// is already known. An error passes down a chain through each
    /// callback, which may handle it; a callback that panics gives
    /// [`Error::FutureFailed`] instead.
    ///
    /// ```
    /// use tensorcomm::group::WorkFuture;
    /// use tensorcomm::Error;
    ///
    /// let len = WorkFuture::ready("four")
    ///     .then(|word| Ok(word?.len()))
    ///     .then(|len| if len? == 4 { Err(Error::InvalidArgument("too short".into())) } else { Ok(0) })
    ///     .then(|r: tensorcomm::Result<usize>| r.or(Ok(4)));
    /// assert_eq!(len.wait()?, 4);
    /// # Ok::<(), tensorcomm::Error>(())
    /// ```
    pub fn then<U, F>(self, f: F) -> WorkFuture<U>
    where
        U: Send + 'static,
        F: FnOnce(Result<T>) -> Result<U> + Send + 'static,
    {
        let (next, promise) = WorkFuture::pending(self.runner.clone());
        self.shared.on_value(Box::new(move |value, event| {
            // The event the next future waits on: this one, unless it failed.
            let mut carried = None;
            let outcome = panic::catch_unwind(AssertUnwindSafe(|| {
                let value = match (value, event) {
                    (Ok(v), Some(event)) => match event.wait_on_current_stream() {
                        Ok(()) => {
                            carried = Some(event);
                            Ok(v)
                        }
                        Err(e) => Err(e),
                    },
                    (value, _) => value,
                };
                f(value)
            }));
            let outcome = outcome.unwrap_or_else(|payload| {
                Err(Error::FutureFailed {
                    reason: format!("a then() callback panicked: {}", panic_message(&*payload)),
                })
            });
            promise.complete(outcome, carried);
        }));
        next
    }
}

/// The message of a panic payload (a `&str` or `String`, as `panic!` makes).
fn panic_message(payload: &(dyn Any + Send)) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a payload that is not a string".into())
}
