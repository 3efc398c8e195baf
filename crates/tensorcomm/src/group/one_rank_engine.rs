//! Test support: an engine of one rank over a fresh store, and the scope
//! of a host group of one rank, for the engine's unit tests.

use std::sync::Arc;
use std::time::Duration;

use super::backend::GroupBackend;
use super::collective::{Capabilities, Scope};
use super::engine::Engine;
use super::FlightRecorder;
use crate::store::HashStore;

/// An engine of rank 0 of 1 running `backend`, its keys under `name`.
pub(super) fn one_rank_engine(backend: Arc<dyn GroupBackend>, name: &str) -> Engine {
    Engine::start(
        backend,
        Arc::new(HashStore::new()),
        name,
        (0, 1),
        FlightRecorder::new(16, 0, 1, name),
        Duration::from_secs(30),
    )
    .unwrap()
}

/// The scope of a host group of one rank.
pub(super) fn host_scope() -> Scope {
    Scope {
        rank: 0,
        size: 1,
        caps: Capabilities::HOST,
    }
}
