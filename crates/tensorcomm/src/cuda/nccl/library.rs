//! The NCCL library, loaded at run time: the C types tensorcomm passes to
//! it, the functions it calls, and NCCL results turned into typed errors.
//!
//! The library is found through `TENSORCOMM_NCCL_LIBRARY`, else as
//! `libnccl.so.2` (what NVIDIA's packages install), else `libnccl.so`, on
//! the loader's path. A machine without it gets
//! [`Error::NcclUnavailable`] naming what was tried, never a panic.

use std::ffi::{c_char, c_int, c_void, CStr};
use std::sync::OnceLock;

use crate::env_vars;
use crate::{Error, Result};

/// NCCL's opaque communicator.
pub(crate) type RawComm = *mut c_void;
/// A CUDA stream as NCCL takes it (`cudaStream_t`, the driver's `CUstream`).
pub(crate) type RawStream = *mut c_void;
/// `ncclResult_t`.
pub(crate) type NcclResult = c_int;
/// `ncclDataType_t`.
pub(crate) type RawDType = c_int;
/// `ncclRedOp_t`.
pub(crate) type RawRedOp = c_int;

/// `ncclSuccess`.
pub(crate) const SUCCESS: NcclResult = 0;
/// `ncclInProgress`: a non-blocking communicator is still working.
pub(crate) const IN_PROGRESS: NcclResult = 7;

/// `ncclUniqueId`: what rank 0 creates and every rank needs to join.
#[repr(C)]
#[derive(Clone, Copy)]
pub(crate) struct UniqueId {
    pub(crate) bytes: [u8; 128],
}

/// `ncclConfig_t` as NCCL 2.17 laid it out. Later NCCLs read the fields a
/// config's `size` and `version` cover and default the rest.
#[repr(C)]
pub(crate) struct Config {
    size: usize,
    magic: u32,
    version: u32,
    pub(crate) blocking: c_int,
    cga_cluster_size: c_int,
    min_ctas: c_int,
    max_ctas: c_int,
    net_name: *const c_char,
    split_share: c_int,
}

impl Config {
    /// NCCL's `NCCL_CONFIG_INITIALIZER`: every field undefined (NCCL's
    /// default) except `blocking`.
    pub(crate) fn new(blocking: bool) -> Config {
        const UNDEF: c_int = c_int::MIN;
        Config {
            size: std::mem::size_of::<Config>(),
            magic: 0xcafe_beef,
            version: 21700,
            blocking: c_int::from(blocking),
            cga_cluster_size: UNDEF,
            min_ctas: UNDEF,
            max_ctas: UNDEF,
            net_name: std::ptr::null(),
            split_share: UNDEF,
        }
    }
}

type Coll = unsafe extern "C" fn(
    *const c_void,
    *mut c_void,
    usize,
    RawDType,
    RawRedOp,
    RawComm,
    RawStream,
) -> NcclResult;

/// The NCCL functions tensorcomm calls.
pub(crate) struct Nccl {
    _lib: libloading::Library,
    /// The file that was loaded.
    pub(crate) library: String,
    /// `ncclGetVersion`'s code, e.g. 22809 for 2.28.9.
    pub(crate) version: c_int,
    pub(crate) get_unique_id: unsafe extern "C" fn(*mut UniqueId) -> NcclResult,
    pub(crate) comm_init_rank_config:
        unsafe extern "C" fn(*mut RawComm, c_int, UniqueId, c_int, *mut Config) -> NcclResult,
    pub(crate) comm_split:
        unsafe extern "C" fn(RawComm, c_int, c_int, *mut RawComm, *mut Config) -> NcclResult,
    pub(crate) comm_get_async_error: unsafe extern "C" fn(RawComm, *mut NcclResult) -> NcclResult,
    pub(crate) comm_count: unsafe extern "C" fn(RawComm, *mut c_int) -> NcclResult,
    pub(crate) comm_user_rank: unsafe extern "C" fn(RawComm, *mut c_int) -> NcclResult,
    pub(crate) comm_abort: unsafe extern "C" fn(RawComm) -> NcclResult,
    pub(crate) comm_finalize: unsafe extern "C" fn(RawComm) -> NcclResult,
    pub(crate) comm_destroy: unsafe extern "C" fn(RawComm) -> NcclResult,
    get_error_string: unsafe extern "C" fn(NcclResult) -> *const c_char,
    get_last_error: unsafe extern "C" fn(RawComm) -> *const c_char,
    pub(crate) red_op_create_pre_mul_sum:
        unsafe extern "C" fn(*mut RawRedOp, *mut c_void, RawDType, c_int, RawComm) -> NcclResult,
    pub(crate) red_op_destroy: unsafe extern "C" fn(RawRedOp, RawComm) -> NcclResult,
    pub(crate) all_reduce: Coll,
    pub(crate) reduce_scatter: Coll,
    pub(crate) reduce: unsafe extern "C" fn(
        *const c_void,
        *mut c_void,
        usize,
        RawDType,
        RawRedOp,
        c_int,
        RawComm,
        RawStream,
    ) -> NcclResult,
    pub(crate) broadcast: unsafe extern "C" fn(
        *const c_void,
        *mut c_void,
        usize,
        RawDType,
        c_int,
        RawComm,
        RawStream,
    ) -> NcclResult,
    pub(crate) all_gather: unsafe extern "C" fn(
        *const c_void,
        *mut c_void,
        usize,
        RawDType,
        RawComm,
        RawStream,
    ) -> NcclResult,
    pub(crate) send: unsafe extern "C" fn(
        *const c_void,
        usize,
        RawDType,
        c_int,
        RawComm,
        RawStream,
    ) -> NcclResult,
    pub(crate) recv:
        unsafe extern "C" fn(*mut c_void, usize, RawDType, c_int, RawComm, RawStream) -> NcclResult,
    pub(crate) group_start: unsafe extern "C" fn() -> NcclResult,
    pub(crate) group_end: unsafe extern "C" fn() -> NcclResult,
}

// SAFETY: the table holds plain function pointers into a library that is
// never unloaded; NCCL's functions may be called from any thread.
unsafe impl Send for Nccl {}
unsafe impl Sync for Nccl {}

/// The loaded NCCL, or why it could not be loaded (kept, so every caller
/// gets the same answer without retrying).
pub(crate) fn nccl() -> Result<&'static Nccl> {
    static NCCL: OnceLock<std::result::Result<Nccl, Error>> = OnceLock::new();
    NCCL.get_or_init(|| load(&candidates()))
        .as_ref()
        .map_err(Clone::clone)
}

/// The names tried, in order.
fn candidates() -> Vec<String> {
    match std::env::var(env_vars::NCCL_LIBRARY.name) {
        Ok(path) if !path.is_empty() => vec![path],
        _ => vec!["libnccl.so.2".into(), "libnccl.so".into()],
    }
}

fn load(names: &[String]) -> std::result::Result<Nccl, Error> {
    let mut failures = Vec::new();
    for name in names {
        // SAFETY: loading NCCL runs its initialisers, which have no
        // preconditions.
        match unsafe { libloading::Library::new(name) } {
            Ok(lib) => {
                let nccl = resolve(lib, name)?;
                tracing::debug!(library = %nccl.library, version = %nccl.version_string(), "NCCL loaded");
                return Ok(nccl);
            }
            Err(e) => failures.push(format!("{name}: {e}")),
        }
    }
    Err(Error::NcclUnavailable {
        library: names.join(" or "),
        reason: format!(
            "not found ({}); set {} to its path",
            failures.join("; "),
            env_vars::NCCL_LIBRARY.name
        ),
    })
}

fn resolve(lib: libloading::Library, name: &str) -> std::result::Result<Nccl, Error> {
    macro_rules! sym {
        ($sym:literal) => {{
            // SAFETY: the field's type is the C signature of the symbol
            // in nccl.h.
            let f = unsafe { lib.get(concat!($sym, "\0").as_bytes()) }.map_err(|e| {
                Error::NcclUnavailable {
                    library: name.into(),
                    reason: format!("it has no {}: {e} (NCCL 2.18 or newer is needed)", $sym),
                }
            })?;
            *f
        }};
    }
    let get_version: unsafe extern "C" fn(*mut c_int) -> NcclResult = sym!("ncclGetVersion");
    let mut version = 0;
    // SAFETY: one int out-parameter.
    unsafe { get_version(&mut version) };
    Ok(Nccl {
        library: name.into(),
        version,
        get_unique_id: sym!("ncclGetUniqueId"),
        comm_init_rank_config: sym!("ncclCommInitRankConfig"),
        comm_split: sym!("ncclCommSplit"),
        comm_get_async_error: sym!("ncclCommGetAsyncError"),
        comm_count: sym!("ncclCommCount"),
        comm_user_rank: sym!("ncclCommUserRank"),
        comm_abort: sym!("ncclCommAbort"),
        comm_finalize: sym!("ncclCommFinalize"),
        comm_destroy: sym!("ncclCommDestroy"),
        get_error_string: sym!("ncclGetErrorString"),
        get_last_error: sym!("ncclGetLastError"),
        red_op_create_pre_mul_sum: sym!("ncclRedOpCreatePreMulSum"),
        red_op_destroy: sym!("ncclRedOpDestroy"),
        all_reduce: sym!("ncclAllReduce"),
        reduce_scatter: sym!("ncclReduceScatter"),
        reduce: sym!("ncclReduce"),
        broadcast: sym!("ncclBroadcast"),
        all_gather: sym!("ncclAllGather"),
        send: sym!("ncclSend"),
        recv: sym!("ncclRecv"),
        group_start: sym!("ncclGroupStart"),
        group_end: sym!("ncclGroupEnd"),
        _lib: lib,
    })
}

/// NCCL's name of a result code.
pub(crate) fn result_name(code: NcclResult) -> &'static str {
    match code {
        0 => "ncclSuccess",
        1 => "ncclUnhandledCudaError",
        2 => "ncclSystemError",
        3 => "ncclInternalError",
        4 => "ncclInvalidArgument",
        5 => "ncclInvalidUsage",
        6 => "ncclRemoteError",
        7 => "ncclInProgress",
        _ => "an unknown ncclResult_t",
    }
}

impl Nccl {
    /// `Ok` for `ncclSuccess` (and `ncclInProgress`, which non-blocking
    /// communicators return while they work), else [`Error::Nccl`] naming
    /// `call` with NCCL's description of the failure (the communicator's
    /// last error when `comm` is given and NCCL kept one).
    pub(crate) fn check(&self, call: &str, code: NcclResult, comm: Option<RawComm>) -> Result<()> {
        if code == SUCCESS || code == IN_PROGRESS {
            return Ok(());
        }
        Err(self.error(call, code, comm))
    }

    /// The error of `call` having returned `code`.
    pub(crate) fn error(&self, call: &str, code: NcclResult, comm: Option<RawComm>) -> Error {
        let text = |p: *const c_char| {
            // SAFETY: NCCL returns NUL-terminated static or per-thread
            // strings, or null.
            (!p.is_null()).then(|| unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned())
        };
        // SAFETY: both take a code or a (possibly null) communicator.
        let general = text(unsafe { (self.get_error_string)(code) });
        let last = text(unsafe { (self.get_last_error)(comm.unwrap_or(std::ptr::null_mut())) })
            .filter(|s| !s.is_empty());
        let message = match (general, last) {
            (Some(g), Some(l)) => format!("{g}: {l}"),
            (Some(g), None) => g,
            (None, Some(l)) => l,
            (None, None) => "no description".into(),
        };
        Error::Nccl {
            call: call.into(),
            code: result_name(code).into(),
            message,
        }
    }

    /// The version as `major.minor.patch`.
    pub(crate) fn version_string(&self) -> String {
        let v = self.version;
        format!("{}.{}.{}", v / 10000, (v % 10000) / 100, v % 100)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_library_is_a_named_error_not_a_panic() {
        let names = ["libtensorcomm-no-such-nccl.so.2".to_string()];
        match load(&names) {
            Err(Error::NcclUnavailable { library, reason }) => {
                assert_eq!(library, names[0]);
                assert!(reason.contains("TENSORCOMM_NCCL_LIBRARY"), "{reason}");
                assert!(reason.contains("libtensorcomm-no-such-nccl"), "{reason}");
            }
            Ok(_) => panic!("a library that does not exist was loaded"),
            Err(e) => panic!("unexpected error {e}"),
        }
    }

    #[test]
    fn a_library_without_nccls_functions_is_refused_by_name() {
        // libc is everywhere and has no ncclGetVersion.
        match load(&["libc.so.6".to_string()]) {
            Err(Error::NcclUnavailable { library, reason }) => {
                assert_eq!(library, "libc.so.6");
                assert!(reason.contains("ncclGetVersion"), "{reason}");
            }
            Ok(_) => panic!("libc was taken for NCCL"),
            Err(e) => panic!("unexpected error {e}"),
        }
    }

    #[test]
    fn the_config_starts_like_nccls_initializer() {
        let c = Config::new(false);
        assert_eq!(c.size, std::mem::size_of::<Config>());
        assert_eq!((c.magic, c.version, c.blocking), (0xcafe_beef, 21700, 0));
        assert_eq!(c.min_ctas, c_int::MIN);
    }

    #[test]
    fn result_codes_have_ncclsnames() {
        assert_eq!(result_name(IN_PROGRESS), "ncclInProgress");
        assert_eq!(result_name(5), "ncclInvalidUsage");
        assert_eq!(result_name(99), "an unknown ncclResult_t");
    }
}
