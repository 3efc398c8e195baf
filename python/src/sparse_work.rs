//! `SparseWork`: the handle of a sparse all-reduce, as Python sees it.
//!
//! Unlike a dense collective, a sparse all-reduce does not write into the
//! caller's arrays (the number of entries of the sum is only known at the
//! end): it copies its input when it starts, and `wait()` hands back the
//! coalesced sum as new buffers that the Python side turns into arrays or
//! a torch sparse tensor. So this work keeps no Python object alive.

use std::sync::{Mutex, OnceLock, PoisonError};
use std::time::Duration;

use pyo3::prelude::*;
use pyo3::types::PyByteArray;
use tensorcomm::group::SparseWork;
use tensorcomm::tensor::SparseTensor;
use tensorcomm::Error;

use crate::errors::{raise, to_py};
use crate::work::send_callback;

/// The work of `_Group.all_reduce_sparse`: `wait()` gives
/// `(nnz, indices, values)`, the coalesced sum's number of entries, its
/// `[sparse_dim, nnz]` int64 coordinates and its `[nnz, dense dims...]`
/// values, both as `bytearray`s in native byte order.
#[pyclass(name = "SparseWork", module = "tensorcomm._tensorcomm", frozen)]
pub struct PySparseWork {
    /// The work, until someone has waited for it.
    work: Mutex<Option<SparseWork>>,
    /// Its outcome, once waited for.
    outcome: OnceLock<Result<SparseTensor, Error>>,
}

impl PySparseWork {
    pub(crate) fn new(work: SparseWork) -> PySparseWork {
        PySparseWork {
            work: Mutex::new(Some(work)),
            outcome: OnceLock::new(),
        }
    }

    /// A work whose collective has already finished with `outcome`.
    pub(crate) fn finished(outcome: Result<SparseTensor, Error>) -> PySparseWork {
        PySparseWork {
            work: Mutex::new(None),
            outcome: OnceLock::from(outcome),
        }
    }

    /// Waits without the GIL and records the outcome; false when
    /// `timeout` passed first.
    fn settle(&self, py: Python<'_>, timeout: Option<Duration>) -> bool {
        if self.outcome.get().is_some() {
            return true;
        }
        py.allow_threads(|| {
            let mut slot = self.work.lock().unwrap_or_else(PoisonError::into_inner);
            if let (Some(t), Some(work)) = (timeout, slot.as_ref()) {
                if !work.wait_timeout(t) {
                    return false;
                }
            }
            if let Some(work) = slot.take() {
                let _ = self.outcome.set(work.wait());
            }
            true
        })
    }
}

/// `sum` as `(nnz, indices, values)`.
fn parts(py: Python<'_>, sum: &SparseTensor) -> PyResult<(usize, PyObject, PyObject)> {
    let indices = sum.indices();
    let indices = PyByteArray::new_with(py, std::mem::size_of_val(indices), |buf| {
        for (chunk, i) in buf.chunks_exact_mut(8).zip(indices) {
            chunk.copy_from_slice(&i.to_ne_bytes());
        }
        Ok(())
    })?;
    let values = sum
        .values()
        .with_bytes(|b| PyByteArray::new(py, b))
        .map_err(|e| to_py(py, e))?;
    Ok((
        sum.nnz(),
        indices.into_any().unbind(),
        values.into_any().unbind(),
    ))
}

#[pymethods]
impl PySparseWork {
    /// Blocks (without the GIL) until the sum is there and returns
    /// `(nnz, indices, values)`, or raises the collective's error.
    /// `timeout` (seconds) bounds the wait: past it a
    /// `CollectiveTimeoutError` is raised and the collective keeps running.
    #[pyo3(signature = (timeout=None))]
    fn wait(&self, py: Python<'_>, timeout: Option<f64>) -> PyResult<(usize, PyObject, PyObject)> {
        let timeout = timeout.filter(|t| *t > 0.0).map(Duration::from_secs_f64);
        if !self.settle(py, timeout) {
            return Err(raise(
                "CollectiveTimeoutError",
                format!(
                    "SparseWork.wait: the sparse all-reduce did not finish within {:?}; it keeps \
                     running (wait again, or let the group's own timeout end it)",
                    timeout.unwrap_or_default()
                ),
            ));
        }
        match self.outcome.get() {
            Some(Ok(sum)) => parts(py, sum),
            Some(Err(e)) => Err(to_py(py, e.clone())),
            None => Err(raise(
                "TensorcommError",
                "SparseWork.wait: the work has no outcome".into(),
            )),
        }
    }

    /// True once the collective has finished, successfully or not. Never
    /// blocks.
    fn is_completed(&self) -> bool {
        if self.outcome.get().is_some() {
            return true;
        }
        match self.work.try_lock() {
            Ok(slot) => slot.as_ref().is_none_or(SparseWork::is_completed),
            Err(_) => false, // another thread is waiting on it
        }
    }

    /// `None` while running or after success; the collective's exception
    /// once it has failed.
    fn exception(&self, py: Python<'_>) -> Option<PyObject> {
        if !self.is_completed() {
            return None;
        }
        self.settle(py, None);
        match self.outcome.get() {
            Some(Err(e)) => Some(to_py(py, e.clone()).into_value(py).into_any()),
            _ => None,
        }
    }

    /// Calls `callback(None)` once the collective succeeds, or
    /// `callback(exception)` once it fails, on tensorcomm's callback
    /// thread (with the GIL); `wait()` then gives the sum at once.
    fn add_done_callback(&self, callback: PyObject) -> PyResult<()> {
        let slot = self.work.lock().unwrap_or_else(PoisonError::into_inner);
        let outcome = match slot.as_ref() {
            Some(work) => {
                let chained = work.get_future().then(move |outcome| {
                    let _ = send_callback(callback, outcome.clone());
                    outcome
                });
                drop(chained);
                return Ok(());
            }
            None => match self.outcome.get() {
                Some(Err(e)) => Err(e.clone()),
                _ => Ok(()),
            },
        };
        send_callback(callback, outcome)
    }

    /// Always `None`: a sparse all-reduce works on host copies, so no
    /// stream needs to wait for it.
    #[getter]
    fn cuda_device(&self) -> Option<usize> {
        None
    }

    fn __repr__(&self) -> String {
        format!("SparseWork(completed={})", self.is_completed())
    }
}
