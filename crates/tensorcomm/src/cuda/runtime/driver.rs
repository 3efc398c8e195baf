//! Loading the driver and turning CUDA return codes into typed errors.
//!
//! cudarc loads `libcuda` on first use and panics when it is missing, so
//! every entry point of tensorcomm calls [`ensure_driver`] first: it checks
//! that the library can be loaded and initialises it once, and gives
//! [`Error::NoCuda`] instead of a panic on a machine without a driver.

use std::sync::OnceLock;

use cudarc::driver::{result, sys, DriverError};

use crate::{Error, Result};

/// The outcome of loading and initialising the driver, computed once.
static DRIVER: OnceLock<std::result::Result<usize, String>> = OnceLock::new();

/// Loads and initialises the CUDA driver once; gives the number of GPUs.
pub(crate) fn ensure_driver() -> Result<usize> {
    DRIVER
        .get_or_init(|| {
            // SAFETY: only tries to open the shared library by name; loading
            // libcuda runs no user code beyond the driver's initialisers.
            if !unsafe { sys::is_culib_present() } {
                return Err("the CUDA driver library (libcuda) could not be loaded".into());
            }
            result::init().map_err(|e| format!("cuInit failed: {}", describe(e)))?;
            let count = result::device::get_count()
                .map_err(|e| format!("cuDeviceGetCount failed: {}", describe(e)))?;
            Ok(usize::try_from(count).unwrap_or(0))
        })
        .clone()
        .map_err(|reason| Error::NoCuda { reason })
}

/// Name and description of a driver error, e.g.
/// `CUDA_ERROR_OUT_OF_MEMORY (out of memory)`.
pub(crate) fn describe(e: DriverError) -> String {
    let name = e
        .error_name()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_else(|_| format!("{:?}", e.0));
    let text = e
        .error_string()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default();
    format!("{name} ({text})")
}

/// Turns a driver result into a typed error naming the call.
pub(crate) fn check<T>(call: &str, r: std::result::Result<T, DriverError>) -> Result<T> {
    r.map_err(|e| cuda_error(call, e))
}

/// The [`Error::Cuda`] for a failed call.
pub(crate) fn cuda_error(call: &str, e: DriverError) -> Error {
    let name = e
        .error_name()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_else(|_| format!("{:?}", e.0));
    let message = e
        .error_string()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default();
    Error::Cuda {
        call: call.to_string(),
        code: name,
        message,
    }
}

/// Turns a raw `CUresult` into a typed error naming the call.
pub(crate) fn check_raw(call: &str, r: sys::CUresult) -> Result<()> {
    check(call, r.result())
}
