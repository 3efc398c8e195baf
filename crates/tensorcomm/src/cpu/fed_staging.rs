//! The CPU group's side of fed all-reduces, where a staged CUDA tensor is
//! copied straight into and out of the group's shared-memory arena
//! (`algorithms::all_reduce_shm_arena_fed` with `cuda::staged::ArenaFeed`):
//! the arena registered with CUDA once per group, on the first large
//! all_reduce of a CUDA tensor, and how many such all_reduces ran.

use std::ops::Range;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, OnceLock};
use std::time::Instant;

use super::algorithms::SlotFeed;
use super::transport::shm::ShmArena;
use crate::cuda::runtime::HostRegistration;
use crate::cuda::staged::{register_arena, ArenaFeed, StagingDevice};
use crate::Result;

/// See the module docs.
#[derive(Default)]
pub(crate) struct FedArena {
    /// The arena's registration, or why CUDA refused it.
    registered: OnceLock<std::result::Result<HostRegistration, String>>,
    /// All-reduces this rank ran fed.
    pub(crate) count: AtomicU64,
}

impl FedArena {
    /// `arena`'s mapping registered with CUDA (through `device`'s
    /// context), made on the first call; `None` if CUDA refused, which is
    /// logged once (the group then stages through pinned copies).
    pub(crate) fn registered(
        &self,
        arena: &Arc<ShmArena>,
        device: &StagingDevice,
    ) -> Option<&HostRegistration> {
        let made = self.registered.get_or_init(|| {
            let (ptr, len) = arena.mapping();
            let owner: Arc<dyn std::any::Any + Send + Sync> = arena.clone();
            // SAFETY: the arena's mapping stays mapped while `owner` (the
            // arena) lives, and only this cell registers it.
            unsafe { register_arena(device, ptr, len, owner) }.map_err(|e| {
                tracing::warn!(
                    error = %e,
                    "could not register the shared-memory arena with CUDA; large all_reduces of CUDA tensors stage through pinned copies"
                );
                e.to_string()
            })
        });
        made.as_ref().ok()
    }
}

impl SlotFeed for ArenaFeed<'_> {
    unsafe fn fill(&mut self, step: usize, from: Range<usize>, to: *mut u8) -> Result<()> {
        // SAFETY: forwarded; the algorithm upholds the same contract.
        unsafe { ArenaFeed::fill(self, step, from, to) }
    }

    fn filled(&mut self, step: usize, block: bool, deadline: Instant) -> Result<bool> {
        ArenaFeed::filled(self, step, block, deadline)
    }

    unsafe fn drain(&mut self, step: usize, pieces: &[(*const u8, Range<usize>)]) -> Result<()> {
        // SAFETY: forwarded; the algorithm upholds the same contract.
        unsafe { ArenaFeed::drain(self, step, pieces) }
    }

    fn drained(&mut self, step: usize, block: bool, deadline: Instant) -> Result<bool> {
        ArenaFeed::drained(self, step, block, deadline)
    }
}
