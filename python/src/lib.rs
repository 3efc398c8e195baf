//! `tensorcomm._tensorcomm`: the native half of the `tensorcomm` Python
//! package (stable ABI, Python >= 3.9). It links no libtorch: arrays cross
//! as (address, dtype, shape, strides) plus the objects that own them, and
//! are viewed in place. See `tensorcomm/__init__.py` for the public API.

mod errors;
mod group;
mod sparse_work;
mod store;
mod tensor_arg;
mod work;

use std::net::UdpSocket;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use pyo3::prelude::*;
use tensorcomm::cpu::backend::{CpuOptions, ProcessGroupCpu};
use tensorcomm::cpu::transport::TransportChoice;
use tensorcomm::group::DEFAULT_COLLECTIVE_TIMEOUT;
use tensorcomm::tensor::DType;
use tensorcomm::{Backend, InitOptions};

use crate::errors::py_err;
use crate::group::PyGroup;
use crate::store::{as_store, seconds};

/// Set when the interpreter exits: threads of tensorcomm then stop calling
/// into Python.
static FINALIZING: AtomicBool = AtomicBool::new(false);

/// True once the interpreter has started to exit.
pub(crate) fn finalizing() -> bool {
    FINALIZING.load(Ordering::Relaxed)
}

/// Called through `atexit`: from now on no thread of tensorcomm takes the
/// GIL.
#[pyfunction]
fn _mark_finalizing() {
    FINALIZING.store(true, Ordering::Relaxed);
}

/// Drops `value` with the GIL released (when this thread holds it), so that
/// threads it joins may take the GIL meanwhile; at interpreter exit it is
/// leaked instead.
pub(crate) fn drop_without_gil<T: Send>(value: T) {
    if finalizing() {
        std::mem::forget(value);
        return;
    }
    Python::with_gil(|py| py.allow_threads(move || drop(value)));
}

/// A transport name (`auto`, `tcp`, `shm`; `None`: `TENSORCOMM_TRANSPORT`).
fn transport(name: Option<String>) -> PyResult<TransportChoice> {
    name.map_or(Ok(TransportChoice::default()), |n| {
        n.parse().map_err(py_err)
    })
}

/// Meets the other ranks through `init_method` and builds the default
/// group of `backend` (`cpu`/`gloo`, `nccl`, `auto`).
#[pyfunction]
#[pyo3(signature = (backend, init_method, timeout=None, group_name=None, transport_name=None))]
fn init_process_group(
    py: Python<'_>,
    backend: String,
    init_method: String,
    timeout: Option<f64>,
    group_name: Option<String>,
    transport_name: Option<String>,
) -> PyResult<PyGroup> {
    let backend: Backend = backend.parse().map_err(py_err)?;
    let options = InitOptions {
        timeout: seconds(timeout, DEFAULT_COLLECTIVE_TIMEOUT)?,
        group_name: group_name.unwrap_or_else(|| "default".into()),
        transport: transport(transport_name)?,
        ..InitOptions::default()
    };
    let pg = py
        .allow_threads(|| tensorcomm::init_process_group_with(backend, &init_method, &options))
        .map_err(py_err)?;
    Ok(PyGroup::new(pg))
}

/// Builds a CPU group of `size` ranks over `store` (a tensorcomm store or
/// any object with `torch.distributed.Store`'s methods), its keys under
/// `prefix`. Every rank calls it with the same prefix.
#[pyfunction]
#[pyo3(signature = (store, rank, size, prefix="tensorcomm".to_string(), timeout=None, advertise_host=None, transport_name=None))]
#[allow(clippy::too_many_arguments)]
fn cpu_group_from_store(
    py: Python<'_>,
    store: &Bound<'_, PyAny>,
    rank: usize,
    size: usize,
    prefix: String,
    timeout: Option<f64>,
    advertise_host: Option<String>,
    transport_name: Option<String>,
) -> PyResult<PyGroup> {
    let store = as_store(store)?;
    let options = CpuOptions {
        timeout: seconds(timeout, DEFAULT_COLLECTIVE_TIMEOUT)?,
        advertise_host: advertise_host.unwrap_or_else(default_advertise_host),
        transport: transport(transport_name)?,
        ..CpuOptions::default()
    };
    let pg = py
        .allow_threads(|| ProcessGroupCpu::new(store, &prefix, rank, size, &options))
        .map_err(py_err)?;
    Ok(PyGroup::new(Arc::new(pg)))
}

/// The address other ranks reach this one at: loopback when
/// `MASTER_ADDR` is unset or loopback, else this host's interface that
/// routes towards it (found without sending anything).
fn default_advertise_host() -> String {
    let master = std::env::var("MASTER_ADDR").unwrap_or_default();
    let port: u16 = std::env::var("MASTER_PORT")
        .ok()
        .and_then(|p| p.parse().ok())
        .unwrap_or(29500);
    if master.is_empty() || master == "localhost" || master.starts_with("127.") || master == "::1" {
        return "127.0.0.1".into();
    }
    let (bind, target) = if master.contains(':') {
        ("[::]:0", format!("[{master}]:{port}"))
    } else {
        ("0.0.0.0:0", format!("{master}:{port}"))
    };
    UdpSocket::bind(bind)
        .and_then(|s| s.connect(&target).and_then(|()| s.local_addr()))
        .map_or_else(|_| "127.0.0.1".into(), |a| a.ip().to_string())
}

#[pymodule]
fn _tensorcomm(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<store::PyStore>()?;
    m.add_class::<store::PyTcpStore>()?;
    m.add_class::<store::PyFileStore>()?;
    m.add_class::<store::PyHashStore>()?;
    m.add_class::<store::PyPrefixStore>()?;
    m.add_class::<group::PyGroup>()?;
    m.add_class::<work::PyWork>()?;
    m.add_class::<sparse_work::PySparseWork>()?;
    m.add_function(wrap_pyfunction!(init_process_group, m)?)?;
    m.add_function(wrap_pyfunction!(cpu_group_from_store, m)?)?;
    m.add_function(wrap_pyfunction!(_mark_finalizing, m)?)?;
    let dtypes: Vec<&str> = DType::ALL.iter().map(|d| d.name()).collect();
    m.add("DTYPES", dtypes)?;
    m.add(
        "REDUCE_OPS",
        vec![
            "SUM",
            "AVG",
            "PRODUCT",
            "MIN",
            "MAX",
            "BAND",
            "BOR",
            "BXOR",
            "PREMUL_SUM",
        ],
    )?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
