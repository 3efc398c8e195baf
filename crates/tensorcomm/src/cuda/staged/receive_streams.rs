//! The streams that received point-to-point messages copy up to the GPU
//! on. A receive's copy up is queued when its message lands, after the
//! caller's stream as it was at the receive's call. On one shared stream,
//! a receive landing after a later call's copy was queued would wait for
//! that later call's point on the caller's stream, and so for work the
//! caller queued after the receive. So each copy up goes on a stream whose
//! queued copies all belong to receives called before it (their waits are
//! for earlier points), or on an idle one, or on a new one, up to
//! [`RECEIVE_STREAMS`]; only when all of those are taken by later calls
//! does it wait behind one.
//!
//! Receives are numbered in call order. Chaining a receive behind the
//! latest earlier one still in flight keeps two receives into the same
//! tensor landing in call order when their messages arrive in that order.

use std::sync::{Arc, Mutex, PoisonError};

use super::staged_event::StagedEvent;
use crate::cuda::runtime::{Context, Event, Stream};
use crate::Result;

/// The most streams receives copy up on, per GPU and group.
pub(crate) const RECEIVE_STREAMS: usize = 8;

/// What a stream has queued, as the choice sees it: the latest call
/// number among its receives' copies, and whether they are all done.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Last {
    pub(crate) call: u64,
    pub(crate) done: bool,
}

/// Where a receive's copy up goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Choice {
    /// The stream at this index.
    Use(usize),
    /// A new stream.
    New,
}

/// The stream for the copy up of receive number `call`, given what each
/// stream last had queued (`None`: nothing yet): the one whose copy still
/// in flight is the latest receive called before `call`; else an idle
/// one; else a new one while there are fewer than `max`; else the one
/// whose copy in flight was called earliest.
pub(crate) fn choose(lasts: &[Option<Last>], call: u64, max: usize) -> Choice {
    let busy = |l: &Option<Last>| l.filter(|l| !l.done).map(|l| l.call);
    let chained = lasts
        .iter()
        .enumerate()
        .filter_map(|(i, l)| busy(l).filter(|&c| c < call).map(|c| (c, i)))
        .max();
    if let Some((_, i)) = chained {
        return Choice::Use(i);
    }
    if let Some(i) = lasts.iter().position(|l| busy(l).is_none()) {
        return Choice::Use(i);
    }
    if lasts.len() < max {
        return Choice::New;
    }
    lasts
        .iter()
        .enumerate()
        .filter_map(|(i, l)| busy(l).map(|c| (c, i)))
        .min()
        .map_or(Choice::New, |(_, i)| Choice::Use(i))
}

/// One receive stream: the latest call number among the copies queued on
/// it, and the event after its last copy.
struct ReceiveStream {
    stream: Stream,
    last: Option<(u64, Arc<StagedEvent>)>,
}

/// See the module docs.
#[derive(Default)]
pub(crate) struct ReceiveStreams {
    streams: Mutex<Vec<ReceiveStream>>,
}

impl ReceiveStreams {
    /// Queues receive number `call`'s copy up on a stream chosen as the
    /// module docs say: the stream waits for `caller`, then `queue` runs
    /// with it, then `record` gives the event after the copy, which the
    /// stream remembers. The context is bound.
    pub(crate) fn queue(
        &self,
        ctx: &Context,
        call: u64,
        caller: &Event,
        queue: impl FnOnce(&Stream) -> Result<()>,
        record: impl FnOnce(&Stream) -> Result<Arc<StagedEvent>>,
    ) -> Result<Arc<StagedEvent>> {
        let mut streams = self.streams.lock().unwrap_or_else(PoisonError::into_inner);
        let lasts: Vec<Option<Last>> = streams
            .iter()
            .map(|s| {
                s.last.as_ref().map(|(call, event)| Last {
                    call: *call,
                    done: event.is_done(),
                })
            })
            .collect();
        let i = match choose(&lasts, call, RECEIVE_STREAMS) {
            Choice::Use(i) => i,
            Choice::New => {
                streams.push(ReceiveStream {
                    stream: ctx.new_stream()?,
                    last: None,
                });
                streams.len() - 1
            }
        };
        let chosen = &mut streams[i];
        chosen.stream.wait(caller)?;
        queue(&chosen.stream)?;
        let event = record(&chosen.stream)?;
        // The stream's number is the latest call among its copies in
        // flight: a receive chains behind it only if called after all.
        let latest = match &chosen.last {
            Some((c, e)) if !e.is_done() => (*c).max(call),
            _ => call,
        };
        chosen.last = Some((latest, event.clone()));
        Ok(event)
    }

    /// Waits for every receive stream (the context is bound).
    pub(crate) fn synchronize(&self) {
        for s in self
            .streams
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
        {
            let _ = s.stream.synchronize();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn busy(call: u64) -> Option<Last> {
        Some(Last { call, done: false })
    }

    fn done(call: u64) -> Option<Last> {
        Some(Last { call, done: true })
    }

    #[test]
    fn a_receive_chains_behind_the_latest_earlier_call_in_flight() {
        assert_eq!(choose(&[busy(1), busy(3), busy(9)], 5, 8), Choice::Use(1));
        // Also when an idle stream exists: same-tensor receives keep order.
        assert_eq!(choose(&[None, busy(2)], 5, 8), Choice::Use(1));
    }

    #[test]
    fn a_receive_never_waits_behind_a_later_call_while_a_stream_is_free() {
        // Only later calls in flight: an idle stream, else a new one.
        assert_eq!(choose(&[busy(7), done(8)], 5, 8), Choice::Use(1));
        assert_eq!(choose(&[busy(7), None], 5, 8), Choice::Use(1));
        assert_eq!(choose(&[busy(7), busy(6)], 5, 8), Choice::New);
        assert_eq!(choose(&[], 0, 8), Choice::New);
    }

    #[test]
    fn with_every_stream_taken_by_later_calls_it_waits_behind_the_earliest() {
        assert_eq!(choose(&[busy(9), busy(6), busy(7)], 5, 3), Choice::Use(1));
    }
}
