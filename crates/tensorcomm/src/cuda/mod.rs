//! CUDA: the runtime layer, tensorcomm's kernels and single-process
//! multi-GPU communication.
//!
//! - [`runtime`]: contexts, streams, events, device and pinned memory, peer
//!   access, run-time compiled (NVRTC) programs — the only place that
//!   touches cudarc's raw API. It wraps CUDA and knows nothing of tensors.
//! - [`kernels`]: tensorcomm's own CUDA C kernels (copies and sums) and
//!   their launchers, built on [`runtime`].
//! - [`intranode`]: all-reduce of the ranks of one host on peer memory
//!   (one-shot and two-shot kernels over CUDA IPC mappings).
//! - [`nccl`]: the NCCL process group (CUDA tensors across processes and
//!   nodes), a backend of the group engine.
//! - [`comm`]: `torch.cuda.comm` for Rust — broadcast, scatter, gather and
//!   reduce between the GPUs of one process.
//! - `staged` (crate-internal): CUDA tensors through the CPU process
//!   group, staged through pinned host memory.
//!
//! Nothing CUDA is needed to build: the driver is loaded at run time, and
//! without one every call returns [`Error::NoCuda`](crate::Error::NoCuda).

pub mod comm;
pub mod intranode;
pub mod kernels;
pub mod nccl;
pub mod runtime;
pub(crate) mod staged;
