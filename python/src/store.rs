//! Stores for Python: tensorcomm's own (`TcpStore`, `FileStore`,
//! `HashStore`, `PrefixStore`, all `Store`s), and [`PythonStore`], which
//! lets a group rendezvous through a Python object with
//! `torch.distributed.Store`'s methods (the store PyTorch hands a backend).

use std::sync::Arc;
use std::time::Duration;

use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyList, PyString};
use tensorcomm::store::{
    DefaultTimeout, FileStore, HashStore, PrefixStore, Store, TcpStore, TcpStoreOptions,
    DEFAULT_TIMEOUT,
};
use tensorcomm::{Error, Result};

use crate::errors::py_err;
use crate::finalizing;

/// Seconds from Python as a `Duration` (`None`: `default`).
pub(crate) fn seconds(value: Option<f64>, default: Duration) -> PyResult<Duration> {
    match value {
        None => Ok(default),
        Some(s) if s.is_finite() && s >= 0.0 => Ok(Duration::from_secs_f64(s)),
        Some(s) => Err(crate::errors::raise(
            "InvalidArgumentError",
            format!("expected a timeout in seconds (a finite number >= 0), found {s}"),
        )),
    }
}

/// A value from Python: `bytes`, `bytearray` or `str` (as UTF-8).
fn value_bytes(value: &Bound<'_, PyAny>) -> PyResult<Vec<u8>> {
    if let Ok(b) = value.downcast::<PyBytes>() {
        return Ok(b.as_bytes().to_vec());
    }
    if let Ok(s) = value.downcast::<PyString>() {
        return Ok(s.to_cow()?.as_bytes().to_vec());
    }
    if let Ok(v) = value.extract::<Vec<u8>>() {
        return Ok(v);
    }
    Err(crate::errors::raise(
        "InvalidArgumentError",
        format!(
            "expected a store value of bytes or str, found {}",
            value.get_type().name()?
        ),
    ))
}

/// A rendezvous key-value store (c10d's `Store` API): values are bytes,
/// timeouts are seconds, blocking calls release the GIL.
///
/// ```python
/// store = tensorcomm.HashStore()
/// store.set("addr", b"10.0.0.1:4000")
/// assert store.get("addr") == b"10.0.0.1:4000"
/// assert store.add("arrived", 1) == 1
/// ```
#[pyclass(name = "Store", module = "tensorcomm._tensorcomm", subclass, frozen)]
pub struct PyStore {
    /// `None` only while being dropped.
    inner: Option<Arc<dyn Store>>,
}

impl PyStore {
    fn wrap(store: Arc<dyn Store>) -> PyStore {
        PyStore { inner: Some(store) }
    }

    /// The Rust store.
    pub(crate) fn store(&self) -> &Arc<dyn Store> {
        self.inner
            .as_ref()
            .expect("a store is present until dropped")
    }
}

impl Drop for PyStore {
    /// Drops the store without the GIL: a hosting TCP store waits for its
    /// clients to leave, and none of that needs Python.
    fn drop(&mut self) {
        crate::drop_without_gil(self.inner.take());
    }
}

#[pymethods]
impl PyStore {
    /// Sets `key` to `value` (bytes or str).
    fn set(&self, py: Python<'_>, key: String, value: &Bound<'_, PyAny>) -> PyResult<()> {
        let value = value_bytes(value)?;
        py.allow_threads(|| self.store().set(&key, &value))
            .map_err(py_err)
    }

    /// The value of `key`, waiting up to `timeout` seconds (the store's
    /// default if `None`) for it to exist.
    #[pyo3(signature = (key, timeout=None))]
    fn get<'py>(
        &self,
        py: Python<'py>,
        key: String,
        timeout: Option<f64>,
    ) -> PyResult<Bound<'py, PyBytes>> {
        let timeout = seconds(timeout, self.store().timeout())?;
        let value = py
            .allow_threads(|| self.store().get_timeout(&key, timeout))
            .map_err(py_err)?;
        Ok(PyBytes::new(py, &value))
    }

    /// Adds `delta` to the counter at `key` and returns the new value.
    fn add(&self, py: Python<'_>, key: String, delta: i64) -> PyResult<i64> {
        py.allow_threads(|| self.store().add(&key, delta))
            .map_err(py_err)
    }

    /// Sets `key` to `desired` if it holds `expected` (a missing key counts
    /// as empty); returns the value afterwards.
    fn compare_set<'py>(
        &self,
        py: Python<'py>,
        key: String,
        expected: &Bound<'py, PyAny>,
        desired: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyBytes>> {
        let (expected, desired) = (value_bytes(expected)?, value_bytes(desired)?);
        let value = py
            .allow_threads(|| self.store().compare_set(&key, &expected, &desired))
            .map_err(py_err)?;
        Ok(PyBytes::new(py, &value))
    }

    /// Waits up to `timeout` seconds until every key of `keys` exists.
    #[pyo3(signature = (keys, timeout=None))]
    fn wait(&self, py: Python<'_>, keys: Vec<String>, timeout: Option<f64>) -> PyResult<()> {
        let timeout = seconds(timeout, self.store().timeout())?;
        let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
        py.allow_threads(|| self.store().wait_timeout(&keys, timeout))
            .map_err(py_err)
    }

    /// True if every key of `keys` exists now.
    fn check(&self, py: Python<'_>, keys: Vec<String>) -> PyResult<bool> {
        let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
        py.allow_threads(|| self.store().check(&keys))
            .map_err(py_err)
    }

    /// Deletes `key`; returns whether it existed.
    fn delete_key(&self, py: Python<'_>, key: String) -> PyResult<bool> {
        py.allow_threads(|| self.store().delete_key(&key))
            .map_err(py_err)
    }

    /// The number of keys.
    fn num_keys(&self, py: Python<'_>) -> PyResult<usize> {
        py.allow_threads(|| self.store().num_keys()).map_err(py_err)
    }

    /// Appends `value` to the bytes at `key`.
    fn append(&self, py: Python<'_>, key: String, value: &Bound<'_, PyAny>) -> PyResult<()> {
        let value = value_bytes(value)?;
        py.allow_threads(|| self.store().append(&key, &value))
            .map_err(py_err)
    }

    /// The values of `keys`, waiting up to `timeout` seconds for them.
    #[pyo3(signature = (keys, timeout=None))]
    fn multi_get<'py>(
        &self,
        py: Python<'py>,
        keys: Vec<String>,
        timeout: Option<f64>,
    ) -> PyResult<Bound<'py, PyList>> {
        let timeout = seconds(timeout, self.store().timeout())?;
        let refs: Vec<&str> = keys.iter().map(String::as_str).collect();
        let values = py
            .allow_threads(|| self.store().multi_get_timeout(&refs, timeout))
            .map_err(py_err)?;
        PyList::new(py, values.iter().map(|v| PyBytes::new(py, v)))
    }

    /// Sets each of `keys` to the value at its position in `values`.
    fn multi_set(
        &self,
        py: Python<'_>,
        keys: Vec<String>,
        values: Vec<Bound<'_, PyAny>>,
    ) -> PyResult<()> {
        let values: Vec<Vec<u8>> = values.iter().map(value_bytes).collect::<PyResult<_>>()?;
        let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
        let values: Vec<&[u8]> = values.iter().map(Vec::as_slice).collect();
        py.allow_threads(|| self.store().multi_set(&keys, &values))
            .map_err(py_err)
    }

    /// Every key, in no particular order.
    fn list_keys(&self, py: Python<'_>) -> PyResult<Vec<String>> {
        py.allow_threads(|| self.store().list_keys())
            .map_err(py_err)
    }

    /// Pushes `value` to the back of the queue `key`.
    fn queue_push(&self, py: Python<'_>, key: String, value: &Bound<'_, PyAny>) -> PyResult<()> {
        let value = value_bytes(value)?;
        py.allow_threads(|| self.store().queue_push(&key, &value))
            .map_err(py_err)
    }

    /// Pops the front of the queue `key`, waiting up to `timeout` seconds.
    #[pyo3(signature = (key, timeout=None))]
    fn queue_pop<'py>(
        &self,
        py: Python<'py>,
        key: String,
        timeout: Option<f64>,
    ) -> PyResult<Bound<'py, PyBytes>> {
        let timeout = seconds(timeout, self.store().timeout())?;
        let value = py
            .allow_threads(|| self.store().queue_pop_timeout(&key, timeout))
            .map_err(py_err)?;
        Ok(PyBytes::new(py, &value))
    }

    /// The number of elements in the queue `key`.
    fn queue_len(&self, py: Python<'_>, key: String) -> PyResult<usize> {
        py.allow_threads(|| self.store().queue_len(&key))
            .map_err(py_err)
    }

    /// Blocks until `world_size` callers reached the barrier `key` (each
    /// name is used once), or `timeout` seconds pass.
    #[pyo3(signature = (key, world_size, timeout=None))]
    fn barrier(
        &self,
        py: Python<'_>,
        key: String,
        world_size: usize,
        timeout: Option<f64>,
    ) -> PyResult<()> {
        let timeout = timeout
            .map(|t| seconds(Some(t), DEFAULT_TIMEOUT))
            .transpose()?;
        py.allow_threads(|| self.store().barrier(&key, world_size, timeout))
            .map_err(py_err)
    }

    /// The default timeout of blocking calls, in seconds.
    #[getter]
    fn timeout(&self) -> f64 {
        self.store().timeout().as_secs_f64()
    }

    /// Changes the default timeout of blocking calls (seconds).
    fn set_timeout(&self, timeout: f64) -> PyResult<()> {
        self.store()
            .set_timeout(seconds(Some(timeout), DEFAULT_TIMEOUT)?);
        Ok(())
    }
}

/// A TCP store: `is_master=True` hosts the server on `host:port` (port 0:
/// any free port, see `.port`) and waits for `world_size` clients, itself
/// included; otherwise connects to it, retrying until `timeout` seconds.
///
/// ```python
/// server = tensorcomm.TcpStore("127.0.0.1", 0, world_size=1, is_master=True)
/// client = tensorcomm.TcpStore("127.0.0.1", server.port)
/// client.set("k", "v")
/// assert server.get("k") == b"v"
/// ```
#[pyclass(name = "TcpStore", module = "tensorcomm._tensorcomm", extends = PyStore, frozen)]
pub struct PyTcpStore {
    port: u16,
}

#[pymethods]
impl PyTcpStore {
    #[new]
    #[pyo3(signature = (host, port, world_size=None, is_master=false, timeout=300.0, token=None))]
    fn new(
        py: Python<'_>,
        host: String,
        port: u16,
        world_size: Option<usize>,
        is_master: bool,
        timeout: f64,
        token: Option<String>,
    ) -> PyResult<(Self, PyStore)> {
        let mut options = TcpStoreOptions {
            timeout: seconds(Some(timeout), DEFAULT_TIMEOUT)?,
            ..TcpStoreOptions::default()
        };
        if token.is_some() {
            options.token = token;
        }
        let addr = if host.contains(':') {
            format!("[{host}]:{port}")
        } else {
            format!("{host}:{port}")
        };
        let store = py
            .allow_threads(|| {
                if is_master {
                    TcpStore::host(&addr, world_size.unwrap_or(1), &options)
                } else {
                    TcpStore::connect(&addr, &options)
                }
            })
            .map_err(py_err)?;
        let port = store.server_addr().port();
        Ok((PyTcpStore { port }, PyStore::wrap(Arc::new(store))))
    }

    /// The server's port (the real one when hosted on port 0).
    #[getter]
    fn port(&self) -> u16 {
        self.port
    }
}

/// A store in one file shared by processes (an append-only log).
///
/// ```python
/// store = tensorcomm.FileStore("/tmp/rendezvous")
/// store.set("k", b"v")
/// ```
#[pyclass(name = "FileStore", module = "tensorcomm._tensorcomm", extends = PyStore, frozen)]
pub struct PyFileStore;

#[pymethods]
impl PyFileStore {
    #[new]
    fn new(py: Python<'_>, path: String) -> PyResult<(Self, PyStore)> {
        let store = py
            .allow_threads(|| FileStore::open(&path))
            .map_err(py_err)?;
        Ok((PyFileStore, PyStore::wrap(Arc::new(store))))
    }
}

/// A store in this process's memory, for threads.
///
/// ```python
/// store = tensorcomm.HashStore()
/// assert store.add("n", 5) == 5
/// ```
#[pyclass(name = "HashStore", module = "tensorcomm._tensorcomm", extends = PyStore, frozen)]
pub struct PyHashStore;

#[pymethods]
impl PyHashStore {
    #[new]
    fn new() -> (Self, PyStore) {
        (PyHashStore, PyStore::wrap(Arc::new(HashStore::new())))
    }
}

/// Another store's keys under `prefix/`.
///
/// ```python
/// base = tensorcomm.HashStore()
/// job = tensorcomm.PrefixStore("job1", base)
/// job.set("addr", b"x")
/// assert base.get("job1/addr") == b"x"
/// ```
#[pyclass(name = "PrefixStore", module = "tensorcomm._tensorcomm", extends = PyStore, frozen)]
pub struct PyPrefixStore;

#[pymethods]
impl PyPrefixStore {
    #[new]
    fn new(prefix: String, store: &Bound<'_, PyAny>) -> PyResult<(Self, PyStore)> {
        let inner = as_store(store)?;
        Ok((
            PyPrefixStore,
            PyStore::wrap(Arc::new(PrefixStore::new(prefix, inner))),
        ))
    }
}

/// `store` as a Rust store: a tensorcomm store as itself, any other object
/// through its Python methods ([`PythonStore`]).
pub(crate) fn as_store(store: &Bound<'_, PyAny>) -> PyResult<Arc<dyn Store>> {
    if let Ok(native) = store.downcast::<PyStore>() {
        return Ok(native.get().store().clone());
    }
    for method in ["set", "get", "add", "wait", "check"] {
        if !store.hasattr(method)? {
            return Err(crate::errors::raise(
                "InvalidArgumentError",
                format!(
                    "expected a store (a tensorcomm Store, or an object with torch.distributed.Store's \
                     methods), found {} without a {method}() method",
                    store.get_type().name()?
                ),
            ));
        }
    }
    let timeout = store
        .getattr("timeout")
        .ok()
        .and_then(|t| timedelta_seconds(&t))
        .map_or(DEFAULT_TIMEOUT, Duration::from_secs_f64);
    Ok(Arc::new(PythonStore {
        object: store.clone().unbind(),
        timeout: DefaultTimeout::new(timeout),
    }))
}

/// Seconds of a `datetime.timedelta` (or a number).
fn timedelta_seconds(value: &Bound<'_, PyAny>) -> Option<f64> {
    if let Ok(s) = value.extract::<f64>() {
        return Some(s);
    }
    value
        .call_method0("total_seconds")
        .ok()?
        .extract::<f64>()
        .ok()
}

/// A store reached through a Python object's methods, with the signatures
/// of `torch.distributed.Store`: `set(key, value)`, `get(key)`,
/// `add(key, delta)`, `compare_set(key, expected, desired)`,
/// `wait(keys, timedelta)`, `check(keys)`, `delete_key`, `num_keys`,
/// `append`, `multi_get`, `multi_set`, `list_keys`, `queue_push`,
/// `queue_pop(key, block)`, `queue_len`. Each call takes the GIL; the
/// group's threads call it while the Python caller waits without it.
pub(crate) struct PythonStore {
    object: Py<PyAny>,
    timeout: DefaultTimeout,
}

impl PythonStore {
    /// Runs `f` with the GIL on the Python store, turning a Python
    /// exception into a store error (a timeout when its message says so).
    fn call<T>(
        &self,
        what: &str,
        keys: &[&str],
        timeout: Duration,
        f: impl FnOnce(&Bound<'_, PyAny>) -> PyResult<T>,
    ) -> Result<T> {
        if finalizing() {
            return Err(Error::StoreServer {
                addr: "python store".into(),
                reason: "the Python interpreter is shutting down".into(),
            });
        }
        Python::with_gil(|py| {
            f(self.object.bind(py)).map_err(|e| {
                let message = e.to_string();
                if message.to_ascii_lowercase().contains("timeout")
                    || message.to_ascii_lowercase().contains("timed out")
                {
                    Error::StoreTimeout {
                        keys: keys.iter().map(|k| k.to_string()).collect(),
                        timeout,
                    }
                } else {
                    Error::StoreServer {
                        addr: "python store".into(),
                        reason: format!("{what} failed: {message}"),
                    }
                }
            })
        })
    }

    fn timedelta<'py>(py: Python<'py>, timeout: Duration) -> PyResult<Bound<'py, PyAny>> {
        let secs = timeout.as_secs_f64().min(1e9);
        py.import("datetime")?
            .getattr("timedelta")?
            .call1((0, secs))
    }

    fn key_list<'py>(py: Python<'py>, keys: &[&str]) -> PyResult<Bound<'py, PyList>> {
        PyList::new(py, keys)
    }
}

impl Store for PythonStore {
    fn set(&self, key: &str, value: &[u8]) -> Result<()> {
        self.call("set", &[key], self.timeout(), |s| {
            s.call_method1("set", (key, PyBytes::new(s.py(), value)))
                .map(drop)
        })
    }

    fn get_timeout(&self, key: &str, timeout: Duration) -> Result<Vec<u8>> {
        self.wait_timeout(&[key], timeout)?;
        self.call("get", &[key], timeout, |s| {
            value_bytes(&s.call_method1("get", (key,))?)
        })
    }

    fn add(&self, key: &str, delta: i64) -> Result<i64> {
        self.call("add", &[key], self.timeout(), |s| {
            s.call_method1("add", (key, delta))?.extract()
        })
    }

    fn compare_set(&self, key: &str, expected: &[u8], desired: &[u8]) -> Result<Vec<u8>> {
        self.call("compare_set", &[key], self.timeout(), |s| {
            let py = s.py();
            s.call_method1(
                "compare_set",
                (key, PyBytes::new(py, expected), PyBytes::new(py, desired)),
            )
            .and_then(|v| value_bytes(&v))
        })
    }

    fn wait_timeout(&self, keys: &[&str], timeout: Duration) -> Result<()> {
        self.call("wait", keys, timeout, |s| {
            let py = s.py();
            s.call_method1(
                "wait",
                (Self::key_list(py, keys)?, Self::timedelta(py, timeout)?),
            )
            .map(drop)
        })
    }

    fn check(&self, keys: &[&str]) -> Result<bool> {
        self.call("check", keys, self.timeout(), |s| {
            s.call_method1("check", (Self::key_list(s.py(), keys)?,))?
                .extract()
        })
    }

    fn delete_key(&self, key: &str) -> Result<bool> {
        self.call("delete_key", &[key], self.timeout(), |s| {
            s.call_method1("delete_key", (key,))?.extract()
        })
    }

    fn num_keys(&self) -> Result<usize> {
        self.call("num_keys", &[], self.timeout(), |s| {
            s.call_method0("num_keys")?.extract()
        })
    }

    fn append(&self, key: &str, value: &[u8]) -> Result<()> {
        self.call("append", &[key], self.timeout(), |s| {
            s.call_method1("append", (key, PyBytes::new(s.py(), value)))
                .map(drop)
        })
    }

    fn multi_get_timeout(&self, keys: &[&str], timeout: Duration) -> Result<Vec<Vec<u8>>> {
        self.wait_timeout(keys, timeout)?;
        self.call("multi_get", keys, timeout, |s| {
            s.call_method1("multi_get", (Self::key_list(s.py(), keys)?,))?
                .try_iter()?
                .map(|v| value_bytes(&v?))
                .collect()
        })
    }

    fn multi_set(&self, keys: &[&str], values: &[&[u8]]) -> Result<()> {
        if keys.len() != values.len() {
            return Err(Error::InvalidArgument(format!(
                "multi_set expected as many values as keys ({}), found {} values",
                keys.len(),
                values.len()
            )));
        }
        self.call("multi_set", keys, self.timeout(), |s| {
            let py = s.py();
            let values = PyList::new(py, values.iter().map(|v| PyBytes::new(py, v)))?;
            s.call_method1("multi_set", (Self::key_list(py, keys)?, values))
                .map(drop)
        })
    }

    fn list_keys(&self) -> Result<Vec<String>> {
        self.call("list_keys", &[], self.timeout(), |s| {
            s.call_method0("list_keys")?.extract()
        })
    }

    fn queue_push(&self, key: &str, value: &[u8]) -> Result<()> {
        self.call("queue_push", &[key], self.timeout(), |s| {
            s.call_method1("queue_push", (key, PyBytes::new(s.py(), value)))
                .map(drop)
        })
    }

    fn queue_pop_timeout(&self, key: &str, timeout: Duration) -> Result<Vec<u8>> {
        // torch's queue_pop blocks for the store's own timeout; a zero
        // timeout asks it not to block.
        let block = !timeout.is_zero();
        self.call("queue_pop", &[key], timeout, |s| {
            value_bytes(&s.call_method1("queue_pop", (key, block))?)
        })
    }

    fn queue_len(&self, key: &str) -> Result<usize> {
        self.call("queue_len", &[key], self.timeout(), |s| {
            s.call_method1("queue_len", (key,))?.extract()
        })
    }

    fn timeout(&self) -> Duration {
        self.timeout.get()
    }

    fn set_timeout(&self, timeout: Duration) {
        self.timeout.set(timeout);
    }
}
