//! One bench op in flight, and what waiting on it gives back besides the
//! buffers it wrote: whether it completed, the sender a receive reports,
//! the sum a sparse all-reduce returns.

use std::time::Duration;

use tensorcomm::group::{SparseWork, Work};
use tensorcomm::tensor::SparseTensor;

/// How long one wait for a ring receive lasts before it waits again (the
/// receive's own timeout, the group's, bounds the whole).
const RECV_POLL: Duration = Duration::from_secs(60);

/// What [`launch`](super::ops::launch) started.
#[must_use = "an op's errors are only seen by waiting on it"]
pub enum Pending {
    /// One collective call (a barrier included).
    Work(Work),
    /// A ring step: the send to the next rank and the receive from the
    /// previous one, both posted.
    Ring { send: Work, recv: Work },
    /// A sparse all-reduce, whose result comes back from its wait.
    Sparse(SparseWork),
}

/// What a finished op left outside its buffers. The default is an op that
/// never ran, which every check depending on it refuses.
#[derive(Debug, Default)]
pub struct Outcome {
    /// Every call of the op completed without error.
    pub completed: bool,
    /// The rank the ring's receive reported its message came from.
    pub source: Option<usize>,
    /// The coalesced sum the sparse all-reduce returned.
    pub sparse: Option<SparseTensor>,
}

impl Pending {
    /// Waits for every call of the op; the first error is returned.
    pub fn wait(self) -> tensorcomm::Result<Outcome> {
        let mut outcome = Outcome {
            completed: true,
            ..Outcome::default()
        };
        match self {
            Pending::Work(work) => work.wait()?,
            Pending::Ring { send, recv } => {
                send.wait()?;
                // `wait` consumes the Work, and its source is only readable
                // before: wait for it to finish first.
                while !recv.wait_timeout(RECV_POLL) {}
                outcome.source = recv.source_rank();
                recv.wait()?;
            }
            Pending::Sparse(work) => outcome.sparse = Some(work.wait()?),
        }
        Ok(outcome)
    }
}
