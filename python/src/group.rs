//! The process group as the Python package sees it: every collective of
//! tensorcomm's `ProcessGroup`, on arrays described by [`Desc`]s.
//!
//! Each method views its arrays as tensors (no copy), queues the
//! collective without the GIL, and returns a [`PyWork`] that keeps `keep`
//! (the Python arrays) alive until the collective is done with them; with
//! `blocking=True` a method also waits for the collective before it
//! returns (one GIL-free call for a caller that would wait at once). The
//! friendlier signatures (NumPy arrays, defaults, op names) are in
//! `tensorcomm/__init__.py`; PyTorch's are in `tensorcomm/torch.py`.

use std::sync::Arc;
use std::time::Duration;

use pyo3::prelude::*;
use tensorcomm::group::{run_here, ProcessGroup};
use tensorcomm::tensor::SparseTensor;
use tensorcomm::{ReduceOp, Work};

use crate::errors::{py_err, raise};
use crate::sparse_work::PySparseWork;
use crate::store::seconds;
use crate::tensor_arg::{caller_stream, view, views, CudaPlace, Desc, StreamGuard};
use crate::work::{release_after_device, PyWork};

/// The reduce op with index `code` in `SUM, AVG, PRODUCT, MIN, MAX, BAND,
/// BOR, BXOR, PREMUL_SUM` (`factor` is PREMUL_SUM's).
pub(crate) fn reduce_op(code: u8, factor: f64) -> PyResult<ReduceOp> {
    Ok(match code {
        0 => ReduceOp::Sum,
        1 => ReduceOp::Avg,
        2 => ReduceOp::Product,
        3 => ReduceOp::Min,
        4 => ReduceOp::Max,
        5 => ReduceOp::Band,
        6 => ReduceOp::Bor,
        7 => ReduceOp::Bxor,
        8 => ReduceOp::PremulSum(factor),
        _ => {
            return Err(raise(
                "InvalidArgumentError",
                format!("expected a reduce op code in 0..9, found {code}"),
            ))
        }
    })
}

/// A per-call timeout in seconds (`None` or <= 0: the group's default).
fn call_timeout(timeout: Option<f64>) -> PyResult<Option<Duration>> {
    match timeout {
        Some(t) if t > 0.0 => Ok(Some(seconds(Some(t), Duration::ZERO)?)),
        _ => Ok(None),
    }
}

/// A group of ranks running collectives together (the native half of
/// `tensorcomm.ProcessGroup`; use that class).
#[pyclass(name = "_Group", module = "tensorcomm._tensorcomm", frozen)]
pub struct PyGroup {
    /// `None` only while being dropped.
    pg: Option<Arc<dyn ProcessGroup>>,
}

impl Drop for PyGroup {
    /// Drops the group without the GIL: its threads may be calling into a
    /// Python store as it shuts down.
    fn drop(&mut self) {
        crate::drop_without_gil(self.pg.take());
    }
}

impl PyGroup {
    pub(crate) fn new(pg: Arc<dyn ProcessGroup>) -> PyGroup {
        PyGroup { pg: Some(pg) }
    }

    fn pg(&self) -> &Arc<dyn ProcessGroup> {
        self.pg.as_ref().expect("a group is present until dropped")
    }

    /// Queues `start` without the GIL, ordered after `stream` (the caller's
    /// current stream on the GPU of the call's CUDA tensors, if any), and
    /// wraps its `Work`. With
    /// `blocking`, also waits for it in the same GIL-free stretch (running
    /// it on this thread, as the engine does for a waiter that comes
    /// before the group's thread) and returns the finished work, whose
    /// `wait()` gives the outcome: what a caller that waits at once (a
    /// synchronous `torch.distributed` call) needs, without a second
    /// call, a second GIL release or a window for the group's thread to
    /// take the collective over: the collective is never queued to that
    /// thread ([`run_here`]), which would cost a wake-up.
    fn start(
        &self,
        py: Python<'_>,
        keep: Py<PyAny>,
        is_receive: bool,
        blocking: bool,
        stream: Option<CudaPlace>,
        start: impl FnOnce(&dyn ProcessGroup) -> tensorcomm::Result<Work> + Send,
    ) -> PyResult<PyWork> {
        let pg = &**self.pg();
        if blocking {
            let (outcome, device_done) = py
                .allow_threads(|| {
                    let _current = StreamGuard::new(stream)?;
                    // Run here, not queued to the group's thread: no
                    // wake-up of that thread for a call waited on at once.
                    run_here(|| {
                        start(pg).map(|work| {
                            let device_done = stream.is_some().then(|| work.get_future());
                            (work.wait(), device_done)
                        })
                    })
                })
                .map_err(py_err)?;
            // The host is done with the arrays in `keep`; CUDA tensors are
            // kept until the device is done with them too.
            match device_done {
                Some(done) => release_after_device(done, keep),
                None => drop(keep),
            }
            return Ok(PyWork::finished(outcome));
        }
        let work = py
            .allow_threads(|| {
                let _current = StreamGuard::new(stream)?;
                start(pg)
            })
            .map_err(py_err)?;
        Ok(PyWork::new(
            work,
            keep,
            is_receive,
            stream.map(|p| p.device),
        ))
    }
}

#[pymethods]
impl PyGroup {
    fn rank(&self) -> usize {
        self.pg().rank()
    }

    fn size(&self) -> usize {
        self.pg().size()
    }

    fn backend(&self) -> String {
        format!("{:?}", self.pg().backend()).to_ascii_lowercase()
    }

    fn global_ranks(&self) -> Vec<usize> {
        self.pg().global_ranks()
    }

    #[pyo3(signature = (t, op, factor, timeout, keep, blocking=false))]
    #[allow(clippy::too_many_arguments)]
    fn all_reduce(
        &self,
        py: Python<'_>,
        t: Desc,
        op: u8,
        factor: f64,
        timeout: Option<f64>,
        keep: Py<PyAny>,
        blocking: bool,
    ) -> PyResult<PyWork> {
        let stream = caller_stream([&t]);
        let (t, op, timeout) = (view(&t)?, reduce_op(op, factor)?, call_timeout(timeout)?);
        self.start(py, keep, false, blocking, stream, |pg| {
            pg.all_reduce(&t, op, timeout)
        })
    }

    #[pyo3(signature = (t, root, timeout, keep, blocking=false))]
    fn broadcast(
        &self,
        py: Python<'_>,
        t: Desc,
        root: usize,
        timeout: Option<f64>,
        keep: Py<PyAny>,
        blocking: bool,
    ) -> PyResult<PyWork> {
        let stream = caller_stream([&t]);
        let (t, timeout) = (view(&t)?, call_timeout(timeout)?);
        self.start(py, keep, false, blocking, stream, |pg| {
            pg.broadcast(&t, root, timeout)
        })
    }

    #[pyo3(signature = (t, root, op, factor, timeout, keep, blocking=false))]
    #[allow(clippy::too_many_arguments)]
    fn reduce(
        &self,
        py: Python<'_>,
        t: Desc,
        root: usize,
        op: u8,
        factor: f64,
        timeout: Option<f64>,
        keep: Py<PyAny>,
        blocking: bool,
    ) -> PyResult<PyWork> {
        let stream = caller_stream([&t]);
        let (t, op, timeout) = (view(&t)?, reduce_op(op, factor)?, call_timeout(timeout)?);
        self.start(py, keep, false, blocking, stream, |pg| {
            pg.reduce(&t, root, op, timeout)
        })
    }

    #[pyo3(signature = (outputs, input, timeout, keep, blocking=false))]
    fn all_gather(
        &self,
        py: Python<'_>,
        outputs: Vec<Desc>,
        input: Desc,
        timeout: Option<f64>,
        keep: Py<PyAny>,
        blocking: bool,
    ) -> PyResult<PyWork> {
        let stream = caller_stream(outputs.iter().chain([&input]));
        let (outputs, input, timeout) = (views(&outputs)?, view(&input)?, call_timeout(timeout)?);
        self.start(py, keep, false, blocking, stream, |pg| {
            pg.all_gather(&outputs, &input, timeout)
        })
    }

    #[pyo3(signature = (output, input, timeout, keep, blocking=false))]
    fn all_gather_into_tensor(
        &self,
        py: Python<'_>,
        output: Desc,
        input: Desc,
        timeout: Option<f64>,
        keep: Py<PyAny>,
        blocking: bool,
    ) -> PyResult<PyWork> {
        let stream = caller_stream([&output, &input]);
        let (output, input, timeout) = (view(&output)?, view(&input)?, call_timeout(timeout)?);
        self.start(py, keep, false, blocking, stream, |pg| {
            pg.all_gather_into_tensor(&output, &input, timeout)
        })
    }

    #[pyo3(signature = (outputs, inputs, timeout, keep, blocking=false))]
    fn all_gather_coalesced(
        &self,
        py: Python<'_>,
        outputs: Vec<Vec<Desc>>,
        inputs: Vec<Desc>,
        timeout: Option<f64>,
        keep: Py<PyAny>,
        blocking: bool,
    ) -> PyResult<PyWork> {
        let stream = caller_stream(outputs.iter().flatten().chain(&inputs));
        let outputs: Vec<_> = outputs.iter().map(|o| views(o)).collect::<PyResult<_>>()?;
        let (inputs, timeout) = (views(&inputs)?, call_timeout(timeout)?);
        self.start(py, keep, false, blocking, stream, |pg| {
            pg.all_gather_coalesced(&outputs, &inputs, timeout)
        })
    }

    #[pyo3(signature = (outputs, inputs, timeout, keep, blocking=false))]
    fn all_gather_into_tensor_coalesced(
        &self,
        py: Python<'_>,
        outputs: Vec<Desc>,
        inputs: Vec<Desc>,
        timeout: Option<f64>,
        keep: Py<PyAny>,
        blocking: bool,
    ) -> PyResult<PyWork> {
        let stream = caller_stream(outputs.iter().chain(&inputs));
        let (outputs, inputs, timeout) =
            (views(&outputs)?, views(&inputs)?, call_timeout(timeout)?);
        self.start(py, keep, false, blocking, stream, |pg| {
            pg.all_gather_into_tensor_coalesced(&outputs, &inputs, timeout)
        })
    }

    #[pyo3(signature = (input, outputs, root, timeout, keep, blocking=false))]
    #[allow(clippy::too_many_arguments)]
    fn gather(
        &self,
        py: Python<'_>,
        input: Desc,
        outputs: Option<Vec<Desc>>,
        root: usize,
        timeout: Option<f64>,
        keep: Py<PyAny>,
        blocking: bool,
    ) -> PyResult<PyWork> {
        let stream = caller_stream(outputs.iter().flatten().chain([&input]));
        let input = view(&input)?;
        let outputs = outputs.map(|o| views(&o)).transpose()?;
        let timeout = call_timeout(timeout)?;
        self.start(py, keep, false, blocking, stream, |pg| {
            pg.gather(&input, outputs.as_deref(), root, timeout)
        })
    }

    #[pyo3(signature = (output, inputs, root, timeout, keep, blocking=false))]
    #[allow(clippy::too_many_arguments)]
    fn scatter(
        &self,
        py: Python<'_>,
        output: Desc,
        inputs: Option<Vec<Desc>>,
        root: usize,
        timeout: Option<f64>,
        keep: Py<PyAny>,
        blocking: bool,
    ) -> PyResult<PyWork> {
        let stream = caller_stream(inputs.iter().flatten().chain([&output]));
        let output = view(&output)?;
        let inputs = inputs.map(|i| views(&i)).transpose()?;
        let timeout = call_timeout(timeout)?;
        self.start(py, keep, false, blocking, stream, |pg| {
            pg.scatter(&output, inputs.as_deref(), root, timeout)
        })
    }

    #[pyo3(signature = (output, inputs, op, factor, timeout, keep, blocking=false))]
    #[allow(clippy::too_many_arguments)]
    fn reduce_scatter(
        &self,
        py: Python<'_>,
        output: Desc,
        inputs: Vec<Desc>,
        op: u8,
        factor: f64,
        timeout: Option<f64>,
        keep: Py<PyAny>,
        blocking: bool,
    ) -> PyResult<PyWork> {
        let stream = caller_stream(inputs.iter().chain([&output]));
        let (output, inputs) = (view(&output)?, views(&inputs)?);
        let (op, timeout) = (reduce_op(op, factor)?, call_timeout(timeout)?);
        self.start(py, keep, false, blocking, stream, |pg| {
            pg.reduce_scatter(&output, &inputs, op, timeout)
        })
    }

    #[pyo3(signature = (output, input, op, factor, timeout, keep, blocking=false))]
    #[allow(clippy::too_many_arguments)]
    fn reduce_scatter_tensor(
        &self,
        py: Python<'_>,
        output: Desc,
        input: Desc,
        op: u8,
        factor: f64,
        timeout: Option<f64>,
        keep: Py<PyAny>,
        blocking: bool,
    ) -> PyResult<PyWork> {
        let stream = caller_stream([&output, &input]);
        let (output, input) = (view(&output)?, view(&input)?);
        let (op, timeout) = (reduce_op(op, factor)?, call_timeout(timeout)?);
        self.start(py, keep, false, blocking, stream, |pg| {
            pg.reduce_scatter_tensor(&output, &input, op, timeout)
        })
    }

    #[pyo3(signature = (outputs, inputs, op, factor, timeout, keep, blocking=false))]
    #[allow(clippy::too_many_arguments)]
    fn reduce_scatter_tensor_coalesced(
        &self,
        py: Python<'_>,
        outputs: Vec<Desc>,
        inputs: Vec<Desc>,
        op: u8,
        factor: f64,
        timeout: Option<f64>,
        keep: Py<PyAny>,
        blocking: bool,
    ) -> PyResult<PyWork> {
        let stream = caller_stream(outputs.iter().chain(&inputs));
        let (outputs, inputs) = (views(&outputs)?, views(&inputs)?);
        let (op, timeout) = (reduce_op(op, factor)?, call_timeout(timeout)?);
        self.start(py, keep, false, blocking, stream, |pg| {
            pg.reduce_scatter_tensor_coalesced(&outputs, &inputs, op, timeout)
        })
    }

    #[pyo3(signature = (outputs, inputs, timeout, keep, blocking=false))]
    fn all_to_all(
        &self,
        py: Python<'_>,
        outputs: Vec<Desc>,
        inputs: Vec<Desc>,
        timeout: Option<f64>,
        keep: Py<PyAny>,
        blocking: bool,
    ) -> PyResult<PyWork> {
        let stream = caller_stream(outputs.iter().chain(&inputs));
        let (outputs, inputs, timeout) =
            (views(&outputs)?, views(&inputs)?, call_timeout(timeout)?);
        self.start(py, keep, false, blocking, stream, |pg| {
            pg.all_to_all(&outputs, &inputs, timeout)
        })
    }

    #[pyo3(signature = (output, input, output_split_sizes, input_split_sizes, timeout, keep, blocking=false))]
    #[allow(clippy::too_many_arguments)]
    fn all_to_all_single(
        &self,
        py: Python<'_>,
        output: Desc,
        input: Desc,
        output_split_sizes: Vec<usize>,
        input_split_sizes: Vec<usize>,
        timeout: Option<f64>,
        keep: Py<PyAny>,
        blocking: bool,
    ) -> PyResult<PyWork> {
        let stream = caller_stream([&output, &input]);
        let (output, input, timeout) = (view(&output)?, view(&input)?, call_timeout(timeout)?);
        self.start(py, keep, false, blocking, stream, |pg| {
            pg.all_to_all_single(
                &output,
                &input,
                &output_split_sizes,
                &input_split_sizes,
                timeout,
            )
        })
    }

    #[pyo3(signature = (tensors, op, factor, timeout, keep, blocking=false))]
    #[allow(clippy::too_many_arguments)]
    fn all_reduce_coalesced(
        &self,
        py: Python<'_>,
        tensors: Vec<Desc>,
        op: u8,
        factor: f64,
        timeout: Option<f64>,
        keep: Py<PyAny>,
        blocking: bool,
    ) -> PyResult<PyWork> {
        let stream = caller_stream(&tensors);
        let (tensors, op, timeout) = (
            views(&tensors)?,
            reduce_op(op, factor)?,
            call_timeout(timeout)?,
        );
        self.start(py, keep, false, blocking, stream, |pg| {
            pg.all_reduce_coalesced(&tensors, op, timeout)
        })
    }

    /// Sums the sparse COO tensor of `indices` (`[sparse_dim, nnz]`,
    /// int64), `values` (`[nnz, dense dims...]`) and `sizes` over all
    /// ranks (`op` must be SUM). Both arrays are copied before this
    /// returns, so nothing needs keeping; the work's `wait()` gives the
    /// coalesced sum.
    #[pyo3(signature = (indices, values, sizes, op, timeout, blocking=false))]
    #[allow(clippy::too_many_arguments)]
    fn all_reduce_sparse(
        &self,
        py: Python<'_>,
        indices: Desc,
        values: Desc,
        sizes: Vec<usize>,
        op: u8,
        timeout: Option<f64>,
        blocking: bool,
    ) -> PyResult<PySparseWork> {
        let (op, timeout) = (reduce_op(op, 1.0)?, call_timeout(timeout)?);
        if let Some(place) = caller_stream([&indices, &values]) {
            return Err(raise(
                "InvalidArgumentError",
                format!(
                    "all_reduce_sparse: expected host arrays, found one on cuda:{} (the PyTorch \
                     backend stages a CUDA sparse tensor through host copies before this call)",
                    place.device
                ),
            ));
        }
        let (indices, values) = (view(&indices)?, view(&values)?);
        if indices.dtype() != tensorcomm::tensor::DType::I64 || indices.dim() != 2 {
            return Err(raise(
                "InvalidArgumentError",
                format!(
                    "all_reduce_sparse: expected int64 indices of shape [sparse_dim, nnz], found {} of shape {:?}",
                    indices.dtype(),
                    indices.shape()
                ),
            ));
        }
        // Owned copies: the collective outlives this call, the arrays need not.
        let (indices, values) = (
            indices.to_vec::<i64>().map_err(py_err)?,
            values.contiguous().map_err(py_err)?,
        );
        let sparse = SparseTensor::new(indices, values, &sizes).map_err(py_err)?;
        let pg = &**self.pg();
        if blocking {
            let outcome = py
                .allow_threads(|| pg.all_reduce_sparse(&sparse, op, timeout).map(|w| w.wait()))
                .map_err(py_err)?;
            return Ok(PySparseWork::finished(outcome));
        }
        let work = py
            .allow_threads(|| pg.all_reduce_sparse(&sparse, op, timeout))
            .map_err(py_err)?;
        Ok(PySparseWork::new(work))
    }

    #[pyo3(signature = (timeout, blocking=false))]
    fn barrier(&self, py: Python<'_>, timeout: Option<f64>, blocking: bool) -> PyResult<PyWork> {
        let timeout = call_timeout(timeout)?;
        self.start(py, py.None(), false, blocking, None, |pg| {
            pg.barrier(timeout)
        })
    }

    fn monitored_barrier(
        &self,
        py: Python<'_>,
        timeout: Option<f64>,
        wait_all: bool,
    ) -> PyResult<PyWork> {
        let timeout = call_timeout(timeout)?;
        self.start(py, py.None(), false, false, None, |pg| {
            pg.monitored_barrier(timeout, wait_all)
        })
    }

    fn send(
        &self,
        py: Python<'_>,
        t: Desc,
        dst: usize,
        tag: u64,
        timeout: Option<f64>,
        keep: Py<PyAny>,
    ) -> PyResult<PyWork> {
        let stream = caller_stream([&t]);
        let (t, timeout) = (view(&t)?, call_timeout(timeout)?);
        self.start(py, keep, false, false, stream, |pg| {
            pg.send(&t, dst, tag, timeout)
        })
    }

    fn recv(
        &self,
        py: Python<'_>,
        t: Desc,
        src: usize,
        tag: u64,
        timeout: Option<f64>,
        keep: Py<PyAny>,
    ) -> PyResult<PyWork> {
        let stream = caller_stream([&t]);
        let (t, timeout) = (view(&t)?, call_timeout(timeout)?);
        self.start(py, keep, true, false, stream, |pg| {
            pg.recv(&t, src, tag, timeout)
        })
    }

    fn recv_any_source(
        &self,
        py: Python<'_>,
        t: Desc,
        tag: u64,
        timeout: Option<f64>,
        keep: Py<PyAny>,
    ) -> PyResult<PyWork> {
        let stream = caller_stream([&t]);
        let (t, timeout) = (view(&t)?, call_timeout(timeout)?);
        self.start(py, keep, true, false, stream, |pg| {
            pg.recv_any_source(&t, tag, timeout)
        })
    }

    /// The sub-group of `ranks` (every rank calls it; `None` on the others).
    fn new_group(&self, py: Python<'_>, ranks: Vec<usize>) -> PyResult<Option<PyGroup>> {
        let pg = &**self.pg();
        let sub = py.allow_threads(|| pg.new_group(&ranks)).map_err(py_err)?;
        Ok(sub.map(PyGroup::new))
    }

    fn flight_recorder_json(&self) -> String {
        self.pg().flight_recorder_json()
    }
}
