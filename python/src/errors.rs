//! tensorcomm's `Error` as Python exceptions.
//!
//! The classes live in the pure-Python module `tensorcomm.errors` (so that
//! one class can derive from both `TensorcommError` and a builtin such as
//! `ValueError` or `TimeoutError`); each Rust error picks one by kind and
//! keeps its message, which names the rank, the op and the sequence number.

use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;
use pyo3::sync::GILOnceCell;
use pyo3::types::PyType;
use tensorcomm::Error;

/// The name of the class in `tensorcomm.errors` that `error` is raised as.
pub(crate) fn class_name(error: &Error) -> &'static str {
    match error {
        Error::ShapeMismatch { .. }
        | Error::DTypeMismatch { .. }
        | Error::DimOutOfRange { .. }
        | Error::InvalidLayout(_)
        | Error::InvalidArgument(_)
        | Error::InvalidSparse(_)
        | Error::InvalidCollective { .. }
        | Error::UnsupportedReduceOp { .. }
        | Error::BadValue { .. }
        | Error::MissingParam { .. }
        | Error::UnsupportedInitMethod { .. }
        | Error::MissingEnv { .. } => "InvalidArgumentError",
        Error::StoreTimeout { .. }
        | Error::BarrierTimeout { .. }
        | Error::ClientsTimeout { .. } => "StoreTimeoutError",
        Error::KeyNotFound { .. } => "StoreKeyError",
        Error::StoreFileNotRegular { .. }
        | Error::NotACounter { .. }
        | Error::CounterOverflow { .. }
        | Error::AddressInUse { .. }
        | Error::StoreConnect { .. }
        | Error::StoreConnectionLost { .. }
        | Error::StoreRefused { .. }
        | Error::Protocol { .. }
        | Error::MessageTooLarge { .. }
        | Error::StoreServer { .. }
        | Error::BarrierOverflow { .. } => "StoreError",
        Error::CollectiveTimeout { .. }
        | Error::PeerTimeout { .. }
        | Error::RanksMissing { .. } => "CollectiveTimeoutError",
        Error::CollectiveMismatch { .. } => "CollectiveMismatchError",
        Error::CollectiveFailed { source, .. } => match class_name(source) {
            "CollectiveTimeoutError" => "CollectiveTimeoutError",
            "CollectiveMismatchError" => "CollectiveMismatchError",
            _ => "CollectiveError",
        },
        Error::GroupBroken { .. }
        | Error::PeerClosed { .. }
        | Error::LinkShutDownHere { .. }
        | Error::PeerIo { .. }
        | Error::PeerProtocol { .. }
        | Error::MessageSizeMismatch { .. }
        | Error::NoMessage { .. } => "CollectiveError",
        _ => "TensorcommError",
    }
}

static ERRORS_MODULE: GILOnceCell<Py<PyModule>> = GILOnceCell::new();

/// The exception class `name` of `tensorcomm.errors`.
pub(crate) fn error_class<'py>(py: Python<'py>, name: &str) -> PyResult<Bound<'py, PyType>> {
    let module = ERRORS_MODULE.get_or_try_init(py, || {
        PyModule::import(py, "tensorcomm.errors").map(Bound::unbind)
    })?;
    Ok(module.bind(py).getattr(name)?.downcast_into::<PyType>()?)
}

/// `error` as a Python exception of its kind's class (a `RuntimeError`
/// when `tensorcomm.errors` cannot be imported).
pub(crate) fn to_py(py: Python<'_>, error: Error) -> PyErr {
    let message = error.to_string();
    match error_class(py, class_name(&error)) {
        Ok(class) => PyErr::from_type(class, message),
        Err(_) => PyRuntimeError::new_err(message),
    }
}

/// [`to_py`] for `map_err`, taking the GIL (cheap when it is held).
pub(crate) fn py_err(error: Error) -> PyErr {
    Python::with_gil(|py| to_py(py, error))
}

/// A `tensorcomm.errors` exception of class `name` with `message`, for
/// checks made in this crate.
pub(crate) fn raise(name: &str, message: String) -> PyErr {
    Python::with_gil(|py| match error_class(py, name) {
        Ok(class) => PyErr::from_type(class, message),
        Err(_) => PyRuntimeError::new_err(message),
    })
}
