//! [`RegisteringCapture`]: one call of
//! [`IntraNodeComm::capture_registered`], which captures the caller's work
//! and then registers the captured tensors with the peers exactly once,
//! whatever happens in between.

use super::graph_inputs::GraphInputs;
use super::intranode_comm::IntraNodeComm;
use crate::cuda::runtime::{CapturedGraph, Stream};
use crate::store::Store;
use crate::{Error, Result};

/// A registering capture under way (see
/// [`IntraNodeComm::capture_registered`]): registers exactly once, also
/// when the caller's closure panics (the peers are then told this rank
/// could not capture, instead of waiting for it).
pub(crate) struct RegisteringCapture<'a> {
    comm: &'a IntraNodeComm,
    store: &'a dyn Store,
    stream: &'a Stream,
    /// The stream is capturing.
    capturing: bool,
    registered: bool,
}

impl<'a> RegisteringCapture<'a> {
    /// A capture on `stream` for `comm`, registering through `store`
    /// (the communicator has begun it: `GraphInputs::begin`).
    pub(super) fn new(comm: &'a IntraNodeComm, store: &'a dyn Store, stream: &'a Stream) -> Self {
        RegisteringCapture {
            comm,
            store,
            stream,
            capturing: false,
            registered: false,
        }
    }

    /// Captures what `queue` queues.
    pub(super) fn run(
        &mut self,
        queue: impl FnOnce(&Stream) -> Result<()>,
    ) -> Result<CapturedGraph> {
        let comm = self.comm;
        comm.check()?;
        comm.check_stream(self.stream, "intra-node capture_registered")?;
        comm.inputs().ensure_table(comm.device())?;
        self.stream.begin_capture()?;
        self.capturing = true;
        let queued = queue(self.stream);
        self.capturing = false;
        let ended = self.stream.end_capture();
        queued.and(ended)
    }

    /// Registers this rank's captured calls, or its failure `failed`.
    pub(super) fn register(&mut self, failed: Option<&Error>) -> Result<()> {
        self.registered = true;
        let comm = self.comm;
        let calls = comm.inputs().end();
        let done = GraphInputs::register(
            comm.graph_inputs(),
            &comm.registration(self.store),
            &calls,
            failed,
        );
        if failed.is_some() || done.is_err() {
            comm.inputs().give_back();
        } else {
            comm.count_registered(calls.len() as u64);
        }
        done.map(|_| ())
    }
}

impl Drop for RegisteringCapture<'_> {
    fn drop(&mut self) {
        if self.registered {
            return;
        }
        if self.capturing {
            // The closure panicked mid-capture: end it, so that the stream
            // is usable again.
            drop(self.stream.end_capture());
        }
        let panicked =
            Error::InvalidArgument("capture_registered: the capturing closure panicked".into());
        if let Err(e) = self.register(Some(&panicked)) {
            tracing::debug!(rank = self.comm.rank(), %e, "registering capture abandoned");
        }
    }
}
