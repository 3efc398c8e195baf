//! tensorcomm moves and reduces tensors between GPUs and between processes.
//!
//! It is the Rust counterpart of PyTorch's `torch.cuda.comm` and
//! `torch.distributed`. This crate is built in layers that depend only on the
//! layers below them:
//!
//! - [`tensor`]: dtypes, devices, dense and sparse tensor handles.
//! - [`store`]: rendezvous key-value stores (TCP, file, in-memory, prefix).
//! - `cuda` (feature `cuda`, on by default): the CUDA runtime layer and
//!   `cuda::comm`, single-process multi-GPU broadcast/scatter/gather/reduce.
//! - [`rendezvous`]: turning an init method (`env://`, `tcp://`, `file://`)
//!   into a rank, a world size and a connected store.
//! - [`cpu`]: transports (TCP), reduction kernels and collective algorithms
//!   of the CPU backend.
//!
//! ```
//! use tensorcomm::store::{HashStore, Store};
//!
//! let store = HashStore::new();
//! store.set("greeting", b"hello")?;
//! assert_eq!(store.get("greeting")?, b"hello");
//! assert_eq!(store.add("counter", 2)?, 2);
//! # Ok::<(), tensorcomm::Error>(())
//! ```

#![deny(unsafe_op_in_unsafe_fn)]

pub mod cpu;
#[cfg(feature = "cuda")]
pub mod cuda;
pub mod error;
pub mod group;
pub mod rendezvous;
pub mod store;
pub mod tensor;
pub mod tuning;

pub use error::{Error, Result};

/// The README's examples, compiled and run as doc tests.
#[doc = include_str!("../../../README.md")]
#[cfg(doctest)]
pub struct ReadmeDoctests;
