//! Fuzz target bodies: each takes arbitrary bytes, drives one decoder of
//! untrusted input, and panics only on a bug (a panic inside the code under
//! test, or a broken invariant that the body checks).
//!
//! Not part of the API (hidden from the docs, may change at any time). The
//! bodies live here, in the library, so that the `cargo fuzz` targets in
//! `fuzz/` (nightly, libFuzzer) and the smoke test in
//! `tests/fuzz_smoke.rs` (stable, every `cargo test`) run the same code.
//! This is a hidden module rather than a cargo feature so that the stable
//! smoke test needs no extra flags in CI; it exposes functions of bytes
//! only, no types.
//!
//! One file per surface:
//! - `store_server.rs`: a TCP store server connection (handshake and every
//!   request type) fed the bytes through an in-memory pipe.
//! - `store_codec.rs`: request and reply frames, decoded and re-encoded.
//! - `transport_frames.rs`: the CPU transport's connection hello and the
//!   point-to-point message stream (header, then payload).
//! - `fingerprint.rs`: collective fingerprints and failure reports.
//! - `init_method.rs`: `env://`, `tcp://`, `file://` URLs and their
//!   environment.
//! - `size.rs`: size suffixes (`64K`, `16M`).
//! - `sparse.rs`: sparse COO metadata (`SparseTensor::new`, coalescing,
//!   densifying).
//! - `sparse_all_reduce.rs`: the sparse all-reduce reading its peers'
//!   metadata and entries.

mod input;
mod mock_transport;

mod fingerprint;
mod init_method;
mod size;
mod sparse;
mod sparse_all_reduce;
mod store_codec;
mod store_server;
mod transport_frames;

pub use fingerprint::fingerprint;
pub use init_method::init_method;
pub use size::size;
pub use sparse::sparse;
pub use sparse_all_reduce::sparse_all_reduce;
pub use store_codec::store_codec;
pub use store_server::store_server;
pub use transport_frames::transport_frames;

/// A fuzz target's body.
pub type Body = fn(&[u8]);

/// Every target: its name (the `cargo fuzz` target and corpus folder) and
/// its body.
pub const TARGETS: &[(&str, Body)] = &[
    ("store_server", store_server),
    ("store_codec", store_codec),
    ("transport_frames", transport_frames),
    ("fingerprint", fingerprint),
    ("init_method", init_method),
    ("size", size),
    ("sparse", sparse),
    ("sparse_all_reduce", sparse_all_reduce),
];
