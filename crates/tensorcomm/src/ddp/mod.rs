//! Data-parallel training (c10d's DDP machinery): gradient buckets, a
//! [`Reducer`] that averages gradients while the backward pass runs, and
//! communication hooks.
//!
//! This layer uses only [`ProcessGroup`](crate::ProcessGroup), its
//! [`Work`](crate::Work) futures and [`Tensor`](crate::Tensor), so it runs
//! over every backend.
//!
//! - [`compute_bucket_assignment_by_size`]: grouping tensors into
//!   size-limited buckets by dtype and device.
//! - [`broadcast_coalesced`]: broadcasting many tensors as a few buckets
//!   (every rank starts from rank 0's parameters).
//! - [`GradBucket`]: one bucket of gradients in a flat buffer, what a hook
//!   gets.
//! - [`CommHook`]: how a bucket is communicated: [`AllReduceHook`] (the
//!   default), [`CompressHook`] (f16 or bf16), [`QuantizePerTensorHook`]
//!   (uint8 codes), [`PowerSgdHook`] (low-rank approximations), [`NoOpHook`].
//! - [`Reducer`]: buckets gradients as they are produced and starts each
//!   bucket's hook as soon as it is complete.
//!
//! Gradients may be host or CUDA tensors. Every built-in hook does its
//! element-wise maths (dividing, casting, quantizing, PowerSGD's
//! projections) on the host, a CUDA bucket making a round trip through
//! host memory, and communicates on the bucket's device: CUDA buckets run
//! over a NCCL group (one GPU per rank) or through a CPU group's CUDA path
//! (ranks may share a GPU), with the same results as host buckets.
//!
//! ```
//! use std::sync::Arc;
//! use tensorcomm::ddp::{broadcast_coalesced, AllReduceHook, Reducer, ReducerOptions, TensorSpec};
//! use tensorcomm::tensor::Tensor;
//!
//! let pg = tensorcomm::init_process_group(tensorcomm::Backend::Cpu, "tcp://127.0.0.1:0?rank=0&world_size=1")?;
//! let weight = Tensor::from_vec(vec![0.5f32; 3], &[3])?;
//! broadcast_coalesced(&*pg, &[weight.clone()], 1 << 20, 0)?; // same start on every rank
//! let mut reducer = Reducer::new(pg, vec![TensorSpec::of(&weight)], Arc::new(AllReduceHook), ReducerOptions::default())?;
//! let grad = Tensor::from_vec(vec![1.0f32, 2.0, 3.0], &[3])?;
//! reducer.mark_ready(0, &grad)?; // as backward produces it
//! reducer.finish()?; // grad now holds the mean over the ranks
//! assert_eq!(grad.to_vec::<f32>()?, [1.0, 2.0, 3.0]);
//! # Ok::<(), tensorcomm::Error>(())
//! ```

mod broadcast_coalesced;
mod bucket_assignment;
mod comm_hook;
mod compression;
mod flat_buffer;
mod grad_bucket;
mod power_sgd;
mod quantization;
mod reducer;
mod tensor_spec;

pub use broadcast_coalesced::broadcast_coalesced;
pub use bucket_assignment::{
    compute_bucket_assignment_by_size, BucketAssignment, DEFAULT_BUCKET_BYTES,
    DEFAULT_FIRST_BUCKET_BYTES,
};
pub use comm_hook::{AllReduceHook, CommHook, NoOpHook};
pub use compression::CompressHook;
pub use grad_bucket::GradBucket;
pub use power_sgd::{PowerSgdHook, PowerSgdOptions, PowerSgdStats};
pub use quantization::QuantizePerTensorHook;
pub use reducer::{default_copy_threads, Reducer, ReducerOptions};
pub use tensor_spec::TensorSpec;
