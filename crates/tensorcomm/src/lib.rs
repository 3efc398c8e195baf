//! tensorcomm moves and reduces tensors between GPUs and between processes.
//!
//! It is the Rust counterpart of PyTorch's `torch.cuda.comm` and
//! `torch.distributed`. The everyday API is at the crate root:
//! [`init_process_group`], [`ProcessGroup`], [`Work`], [`ReduceOp`],
//! [`Backend`], [`Tensor`], [`Error`]. The crate is built in layers that
//! depend only on the layers below them:
//!
//! - [`init`]: `init_process_group`, above every backend: meets the other
//!   ranks and builds the default group of the chosen [`Backend`].
//! - [`group`]: the engine every backend shares: the [`ProcessGroup`]
//!   trait, validation of a call's arguments, sequence numbers,
//!   fingerprints and the mismatch check, call order, timeouts, failure
//!   reports through the store, the flight recorder, and [`Work`]. It
//!   defines the narrow trait a backend implements (run one validated,
//!   sequenced collective) and imports no backend.
//! - [`cpu`]: the CPU backend: collectives (one file each) over
//!   algorithms (one file each), chosen in one place (`cpu/select.rs`),
//!   over transports (TCP, shared memory).
//! - [`ddp`]: data-parallel training over any [`ProcessGroup`]: gradient
//!   buckets, a `Reducer` that averages gradients while the backward pass
//!   runs, communication hooks (all-reduce, f16/bf16 compression),
//!   `broadcast_coalesced`.
//! - [`auto_group`]: [`Backend::Auto`], host tensors to the CPU backend and
//!   CUDA tensors to NCCL in one group.
//! - `cuda` (feature `cuda`, on by default): `cuda::nccl`, the NCCL
//!   backend; `cuda::comm`, single-process multi-GPU
//!   broadcast/scatter/gather/reduce; `cuda::kernels`, tensorcomm's CUDA C
//!   kernels; all over `cuda::runtime`, the only module that calls CUDA.
//! - [`rendezvous`]: turning an init method (`env://`, `tcp://`, `file://`)
//!   into a rank, a world size and a connected store.
//! - [`store`]: rendezvous key-value stores (TCP, file, in-memory, prefix).
//! - [`tensor`]: dtypes, devices, dense and sparse tensor handles.
//! - [`env_vars`]: every `TENSORCOMM_*` variable, its default and meaning.
//! - [`listen_address`] and [`job_token`]: where listeners bind and how
//!   connections prove the job's token (the README's Security section).
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

pub mod auto_group;
pub mod cpu;
#[cfg(feature = "cuda")]
pub mod cuda;
pub mod ddp;
pub mod env_vars;
pub mod error;
#[doc(hidden)]
pub mod fuzz_targets;
pub mod group;
pub mod init;
pub mod job_token;
pub mod listen_address;
mod process_exit;
pub mod rendezvous;
pub mod store;
pub mod tensor;
pub mod tuning;

pub use error::{Error, Report, Result};
pub use group::{Backend, ProcessGroup, ReduceOp, Work};
pub use init::{init_process_group, init_process_group_with, InitOptions};
pub use tensor::Tensor;

/// The README's examples, compiled and run as doc tests.
#[doc = include_str!("../../../README.md")]
#[cfg(doctest)]
pub struct ReadmeDoctests;

/// Says that a unit test skipped, past the test harness's capture (which
/// hides `println!`), so a plain `cargo test` shows it, in the one line
/// `scripts/test.sh` counts: `test {name} skipped: {why}` (the name is the
/// test's, from the harness's thread; `why` on one line). The integration
/// tests' `tests/skip/mod.rs` writes the same line.
#[cfg(test)]
pub(crate) fn test_skipped(why: impl std::fmt::Display) {
    use std::io::Write;
    let thread = std::thread::current();
    let name = thread
        .name()
        .filter(|n| *n != "main")
        .unwrap_or("(unnamed)");
    let why = why.to_string().replace(['\r', '\n'], " ");
    let _ = std::io::stderr()
        .lock()
        .write_all(format!("test {name} skipped: {why}\n").as_bytes());
}
