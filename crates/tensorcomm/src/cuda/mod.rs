//! CUDA: the runtime layer and single-process multi-GPU communication.
//!
//! - [`runtime`]: contexts, streams, events, device and pinned memory, peer
//!   access, NVRTC kernels — the only place that touches cudarc's raw API.
//! - [`comm`]: `torch.cuda.comm` for Rust — broadcast, scatter, gather and
//!   reduce between the GPUs of one process.
//!
//! Nothing CUDA is needed to build: the driver is loaded at run time, and
//! without one every call returns [`Error::NoCuda`](crate::Error::NoCuda).

pub mod comm;
pub(crate) mod kernels;
pub mod runtime;
