//! `Work`: the handle of one collective, as Python sees it.
//!
//! The arrays a collective reads and writes are Python objects whose
//! memory the Rust tensors borrow. Each `Work` holds those objects until
//! the collective has finished: waiting on it releases them; a `Work`
//! dropped while its collective still runs hands them to a callback
//! chained on the collective's future, which releases them once it has
//! finished. So dropping a `Work` early never frees memory the collective
//! still uses, and the usual call-then-wait pays for no callback.
//! Done-callbacks registered from Python run on one helper thread of the
//! process that takes the GIL, never on a thread that moves bytes.

use std::sync::mpsc::{channel, Sender};
use std::sync::{Mutex, OnceLock, PoisonError};
use std::time::Duration;

use pyo3::prelude::*;
use tensorcomm::group::WorkFuture;
use tensorcomm::{Error, Work};

use crate::errors::{py_err, raise, to_py};
use crate::finalizing;
use crate::tensor_arg::{CudaPlace, StreamGuard};

/// A Python callable to call with `None` or the collective's exception.
type Callback = (Py<PyAny>, Result<(), Error>);

/// The helper thread that runs done-callbacks, started on first use.
fn callbacks() -> &'static Mutex<Sender<Callback>> {
    static SENDER: OnceLock<Mutex<Sender<Callback>>> = OnceLock::new();
    SENDER.get_or_init(|| {
        let (tx, rx) = channel::<Callback>();
        std::thread::Builder::new()
            .name("tensorcomm-py-callbacks".into())
            .spawn(move || {
                for (callback, outcome) in rx {
                    if finalizing() {
                        // The interpreter is going away: leak the callable.
                        std::mem::forget(callback);
                        continue;
                    }
                    Python::with_gil(|py| {
                        let arg = match outcome {
                            Ok(()) => py.None(),
                            Err(e) => to_py(py, e).into_value(py).into_any(),
                        };
                        if let Err(e) = callback.call1(py, (arg,)) {
                            e.write_unraisable(py, Some(callback.bind(py)));
                        }
                    });
                }
            })
            .expect("spawning the tensorcomm callback thread");
        Mutex::new(tx)
    })
}

/// The Python objects (tensors) of device work, with the work's future.
type Release = (WorkFuture<()>, Py<PyAny>);

/// The helper thread that lets go of device work's tensors once the device
/// is done with them, started on first use.
fn releases() -> &'static Mutex<Sender<Release>> {
    static SENDER: OnceLock<Mutex<Sender<Release>>> = OnceLock::new();
    SENDER.get_or_init(|| {
        let (tx, rx) = channel::<Release>();
        std::thread::Builder::new()
            .name("tensorcomm-py-release".into())
            .spawn(move || {
                for (done, keep) in rx {
                    // Its outcome was reported where it was waited for.
                    let _ = done.synchronize();
                    if finalizing() {
                        std::mem::forget(keep);
                    } else {
                        // Without the GIL, pyo3 defers this decref.
                        drop(keep);
                    }
                }
            })
            .expect("spawning the tensorcomm release thread");
        Mutex::new(tx)
    })
}

/// Keeps `keep` (the tensors of a collective on CUDA tensors) alive until
/// the device is done with them, not only the host: the copies back into
/// them may still run on tensorcomm's stream after `wait()` returns, and
/// PyTorch's allocator may hand a freed tensor's memory to another tensor
/// at once. Blocks here only if the helper thread is gone.
pub(crate) fn release_after_device(done: WorkFuture<()>, keep: Py<PyAny>) {
    let sender = releases().lock().unwrap_or_else(PoisonError::into_inner);
    if let Err(std::sync::mpsc::SendError((done, keep))) = sender.send((done, keep)) {
        drop(sender);
        let _ = done.synchronize();
        drop(keep);
    }
}

/// Hands `callback` and `outcome` to the callback thread.
pub(crate) fn send_callback(callback: Py<PyAny>, outcome: Result<(), Error>) -> PyResult<()> {
    let sender = callbacks()
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .clone();
    sender.send((callback, outcome)).map_err(|_| {
        py_err(Error::InvalidArgument(
            "the tensorcomm callback thread has stopped".into(),
        ))
    })
}

/// The handle of a collective started from Python: `wait()`,
/// `is_completed()`, `exception()`, `add_done_callback()`,
/// `source_rank()`.
///
/// ```python
/// work = pg.all_reduce(grads)
/// work.wait()                 # raises the collective's error, if any
/// assert work.is_completed()
/// ```
#[pyclass(name = "Work", module = "tensorcomm._tensorcomm", frozen)]
pub struct PyWork {
    /// The work and the arrays it uses, until someone has waited for it.
    work: Mutex<Option<Pending>>,
    /// Its outcome, once waited for.
    outcome: OnceLock<Result<(), Error>>,
    /// The sender's rank, for a receive from any source.
    source: OnceLock<Option<usize>>,
    /// Whether this is a receive whose sender `source_rank` names.
    is_receive: bool,
    /// The GPU of the collective's CUDA tensors, if any: whose current
    /// stream `wait()` makes wait.
    cuda_device: Option<usize>,
}

/// A collective not waited for yet, with the Python objects whose memory it
/// uses.
struct Pending {
    work: Work,
    keep: Py<PyAny>,
}

impl Drop for PyWork {
    /// A work dropped before anyone waited for it keeps its arrays alive
    /// until the collective has finished, through a callback on its
    /// future (run by the thread that finishes it).
    fn drop(&mut self) {
        let pending = self
            .work
            .get_mut()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        let Some(Pending { work, keep }) = pending else {
            return;
        };
        if self.cuda_device.is_some() {
            release_after_device(work.get_future(), keep);
            return;
        }
        if work.is_completed() {
            // Python drops a `Work` holding the GIL: a plain decref.
            drop(keep);
            return;
        }
        let release = work.get_future().then(move |outcome| {
            // Without the GIL, pyo3 defers this decref to the next holder.
            drop(keep);
            outcome
        });
        drop(release);
    }
}

impl PyWork {
    /// Wraps `work`, keeping `keep` (the arrays it uses) alive until the
    /// collective has finished.
    /// `cuda_device` is the GPU of its CUDA tensors, if any.
    pub(crate) fn new(
        work: Work,
        keep: Py<PyAny>,
        is_receive: bool,
        cuda_device: Option<usize>,
    ) -> PyWork {
        PyWork {
            work: Mutex::new(Some(Pending { work, keep })),
            outcome: OnceLock::new(),
            source: OnceLock::new(),
            is_receive,
            cuda_device,
        }
    }

    /// A work whose collective has already finished with `outcome` (see
    /// `PyGroup::start`'s `blocking`).
    pub(crate) fn finished(outcome: Result<(), Error>) -> PyWork {
        PyWork {
            work: Mutex::new(None),
            outcome: OnceLock::from(outcome),
            source: OnceLock::new(),
            is_receive: false,
            cuda_device: None,
        }
    }

    /// Waits without the GIL (running the collective on this thread if
    /// nobody has started it) and records the outcome. For device work
    /// (CUDA tensors) `stream`, the caller's current stream on their GPU,
    /// is made to wait for it (none given: the legacy default stream);
    /// `block_host` also blocks until the device work is done.
    fn settle(
        &self,
        py: Python<'_>,
        timeout: Option<Duration>,
        stream: Option<CudaPlace>,
        block_host: bool,
    ) -> PyResult<()> {
        if self.outcome.get().is_some() {
            // Already waited for (or finished by a blocking call).
            return Ok(());
        }
        let (timed_out, released) = py.allow_threads(|| {
            let mut slot = self.work.lock().unwrap_or_else(PoisonError::into_inner);
            if let Some(Pending { work, .. }) = slot.as_ref() {
                let limit = match (timeout, self.is_receive) {
                    (Some(t), _) => Some(t),
                    // Keep the work until done to read its sender.
                    (None, true) => Some(Duration::from_secs(10 * 365 * 24 * 3600)),
                    (None, false) => None,
                };
                if let Some(limit) = limit {
                    if !work.wait_timeout(limit) {
                        return (true, None);
                    }
                    let _ = self.source.set(work.source_rank());
                }
            }
            match slot.take() {
                Some(Pending { work, keep }) => {
                    // Device work the host does not wait for keeps its
                    // tensors until the device is done (see
                    // `release_after_device`).
                    let device_done =
                        (self.cuda_device.is_some() && !block_host).then(|| work.get_future());
                    let outcome = StreamGuard::new(stream).and_then(|_current| {
                        if block_host {
                            work.synchronize()
                        } else {
                            work.wait()
                        }
                    });
                    let _ = self.outcome.set(outcome);
                    match device_done {
                        Some(done) => {
                            release_after_device(done, keep);
                            (false, None)
                        }
                        None => (false, Some(keep)),
                    }
                }
                None => (false, None),
            }
        });
        // The collective is done with the arrays: released with the GIL.
        drop(released);
        if timed_out {
            return Err(raise(
                "CollectiveTimeoutError",
                format!(
                    "Work.wait: the collective did not finish within {:?}; it keeps running \
                     (wait again, or let the group's own timeout end it)",
                    timeout.unwrap_or_default()
                ),
            ));
        }
        Ok(())
    }

    fn outcome(&self) -> Option<&Result<(), Error>> {
        self.outcome.get()
    }
}

#[pymethods]
impl PyWork {
    /// Blocks until the collective has finished and raises its error, if
    /// any; returns `True`. `timeout` (seconds) bounds the wait: past it a
    /// `CollectiveTimeoutError` is raised and the collective keeps running.
    /// The GIL is released while waiting.
    ///
    /// For a collective on CUDA tensors, `stream` is `(device, stream)`:
    /// the caller's current stream on their GPU (a raw `CUstream`
    /// address, `torch.cuda.current_stream(device).cuda_stream`), which is
    /// made to wait for the collective's device work (copies back into
    /// the tensors) without blocking the host, as c10d's `Work::wait`
    /// does; `synchronize=True` also blocks the host until that work is
    /// done (c10d's `Work::synchronize`).
    #[pyo3(signature = (timeout=None, stream=None, synchronize=false))]
    fn wait(
        &self,
        py: Python<'_>,
        timeout: Option<f64>,
        stream: Option<CudaPlace>,
        synchronize: bool,
    ) -> PyResult<bool> {
        let timeout = timeout.filter(|t| *t > 0.0).map(Duration::from_secs_f64);
        self.settle(py, timeout, stream, synchronize)?;
        match self.outcome() {
            Some(Err(e)) => Err(to_py(py, e.clone())),
            _ => Ok(true),
        }
    }

    /// True once the collective has finished, successfully or not. Never
    /// blocks.
    fn is_completed(&self) -> bool {
        if self.outcome().is_some() {
            return true;
        }
        match self.work.try_lock() {
            Ok(slot) => slot.as_ref().is_none_or(|p| p.work.is_completed()),
            Err(_) => false, // another thread is waiting on it
        }
    }

    /// `None` while running or after success; the collective's exception
    /// once it has failed.
    fn exception(&self, py: Python<'_>) -> PyResult<Option<PyObject>> {
        if !self.is_completed() {
            return Ok(None);
        }
        // Completed: any device work is done, no stream needs to wait.
        self.settle(py, None, None, false)?;
        Ok(match self.outcome() {
            Some(Err(e)) => Some(to_py(py, e.clone()).into_value(py).into_any()),
            _ => None,
        })
    }

    /// Calls `callback(None)` once the collective succeeds, or
    /// `callback(exception)` once it fails, on tensorcomm's callback
    /// thread (with the GIL); at once (on that thread) if it has finished.
    fn add_done_callback(&self, py: Python<'_>, callback: PyObject) -> PyResult<()> {
        let slot = self.work.lock().unwrap_or_else(PoisonError::into_inner);
        let sender = callbacks()
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        match slot.as_ref() {
            Some(Pending { work, .. }) => {
                let chained = work.get_future().then(move |outcome| {
                    let _ = sender.send((callback, outcome.clone()));
                    outcome
                });
                drop(chained);
            }
            None => {
                let outcome = self.outcome().cloned().unwrap_or(Ok(()));
                sender.send((callback, outcome)).map_err(|_| {
                    py_err(Error::InvalidArgument(
                        "the tensorcomm callback thread has stopped".into(),
                    ))
                })?;
            }
        }
        let _ = py;
        Ok(())
    }

    /// A `concurrent.futures.Future` that completes (result `None`, or the
    /// collective's exception) when this work does.
    fn get_future<'py>(slf: &Bound<'py, Self>) -> PyResult<Bound<'py, PyAny>> {
        slf.py()
            .import("tensorcomm")?
            .getattr("_work_future")?
            .call1((slf,))
    }

    /// The GPU of the collective's CUDA tensors (`None`: host tensors
    /// only, or a work that has already finished on every device): pass
    /// its current stream to `wait()`.
    #[getter]
    fn cuda_device(&self) -> Option<usize> {
        self.cuda_device
    }

    /// The rank a finished receive got its message from (`None` before it
    /// has been waited for, and for other collectives).
    fn source_rank(&self) -> Option<usize> {
        self.source.get().copied().flatten()
    }

    fn __repr__(&self) -> String {
        format!("Work(completed={})", self.is_completed())
    }
}
