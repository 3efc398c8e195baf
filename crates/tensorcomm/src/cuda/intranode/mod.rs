//! Intra-node all-reduce on peer memory: every rank of one host maps the
//! others' buffers (CUDA IPC) and one kernel per call reads or writes
//! them directly, as PyTorch's IntraNodeComm and symmetric memory, vLLM's
//! and TensorRT-LLM's custom all-reduce do.
//!
//! - `symmetric_memory`: each rank's block (signal pad and three buffer
//!   regions), set up and mapped through the store, unmapped and freed in
//!   order,
//! - `topology`: whether a group can use it ([`PeerPolicy`]): 2 to 8 ranks
//!   of one host, compute capability 8.0 or newer, distinct GPUs over
//!   NVLink (or, when asked, ranks sharing a GPU),
//! - `algorithm`: push, one-shot, two-shot or the large kernel by size
//!   ([`AllReduceAlgo`], [`AlgoChoice`]), with usage counters,
//! - `graph_inputs`: the tensors of captured calls, registered once the
//!   capture has ended, so that replays need no copy
//!   ([`IntraNodeComm::capture_registered`]),
//! - `registering_capture`: one call of
//!   [`IntraNodeComm::capture_registered`], registering exactly once,
//! - `intranode_comm`: [`IntraNodeComm`], the communicator.
//!
//! The kernels are in [`cuda::kernels`](crate::cuda::kernels)
//! (`peer_all_reduce.cu`). The NCCL process group all-reduces eligible
//! CUDA tensors through this when its ranks qualify.

mod algorithm;
mod graph_inputs;
mod intranode_comm;
mod registering_capture;
mod symmetric_memory;
mod topology;

pub use algorithm::{
    large_beats_nccl, one_shot_max, push_max, two_shot_max, AlgoChoice, AlgoUsage, AllReduceAlgo,
};
pub use graph_inputs::GRAPH_INPUT_SLOTS;
pub use intranode_comm::{IntraNodeComm, IntraNodeOptions};
pub use topology::PeerPolicy;
