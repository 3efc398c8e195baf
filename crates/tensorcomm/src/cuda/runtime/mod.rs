//! The CUDA runtime layer: the only module that calls cudarc's raw API.
//! It wraps CUDA and nothing else: it knows no tensors or dtypes and holds
//! no kernels of its own (tensorcomm's are in `cuda::kernels`).
//!
//! - devices and their primary contexts ([`context`], [`device_count`]),
//! - streams and events ([`Stream`], [`Event`]), and each thread's
//!   current stream per device ([`current_stream`]),
//! - device buffers from `cuMemAlloc`, suitable for IPC, kept in a
//!   per-device cache for reuse ([`DeviceBuffer`]), and pinned host memory
//!   ([`PinnedBuffer`]),
//! - peer access ([`enable_peer_access`], [`peer_link`]) and copies between
//!   GPUs; memory shared with other processes ([`SharedAllocation`],
//!   [`PeerMapping`]); host words kernels poll ([`MappedWords`]),
//! - CUDA graphs captured from a stream ([`CapturedGraph`]),
//! - CUDA C programs compiled at run time with NVRTC, once per architecture
//!   and cached on disk ([`cache_dir`]), loaded once per device, and their
//!   kernels launched (crate-internal: `Program`, `Function`).
//!
//! Every CUDA failure is a typed error ([`Error::Cuda`](crate::Error::Cuda),
//! [`Error::Nvrtc`](crate::Error::Nvrtc)). On a machine without a driver,
//! every entry point returns [`Error::NoCuda`](crate::Error::NoCuda): the
//! driver library's presence is checked before the first call into it.
//!
//! ```
//! use tensorcomm::cuda::runtime;
//! match runtime::device_count() {
//!     Ok(n) => {
//!         for i in 0..n {
//!             let ctx = runtime::context(i)?;
//!             println!("cuda:{i} {} ({})", ctx.name(), ctx.arch());
//!         }
//!     }
//!     Err(tensorcomm::Error::NoCuda { reason }) => println!("no GPU here: {reason}"),
//!     Err(e) => return Err(e),
//! }
//! # Ok::<(), tensorcomm::Error>(())
//! ```

mod context;
mod current_stream;
mod driver;
mod graph;
mod ipc;
mod mapped_words;
mod memory;
mod module;
mod nvrtc;
mod stream;

pub use context::{context, device_count, Context, COPY_STREAMS};
pub use current_stream::{current_stream, set_current_stream, CurrentStreamGuard};
pub use graph::CapturedGraph;
pub use ipc::{
    device_uuid, export_address, peer_link, IpcHandle, PeerLink, PeerMapping, SharedAllocation,
};
pub use mapped_words::MappedWords;
pub use memory::{enable_peer_access, DeviceBuffer, DevicePtr, PinnedBuffer};
pub use nvrtc::cache_dir;
pub use stream::{Event, Stream};

pub(crate) use memory::{
    copy_dtod_async, copy_dtoh_async, copy_dtoh_sync, copy_htod_async, copy_htod_sync,
    cudarc_slice_parts,
};
pub(crate) use module::{Function, KernelArg, Program};
