//! Shared by the fault-injection suite (`tests/fault_injection.rs`).

pub mod job;
pub mod rank;
pub mod scenario;
