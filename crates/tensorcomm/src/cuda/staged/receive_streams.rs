//! The streams that received point-to-point messages copy up to the GPU
//! on, and what each copy waits for. A receive's copy up is queued when
//! its message lands, and waits for what was called before the receive
//! and may touch its tensor: the caller's stream as it was at the call,
//! the copies down of sends still in flight whose tensors overlap it, and
//! every earlier-called receive's copy still in flight (so receives into
//! one tensor whose messages land in call order write it in that order).
//! [`ReceiveOrder`] is taken at the call, under one lock, so numbers and
//! points agree.
//!
//! On one shared stream, a receive landing after a later call's copy was
//! queued would also wait for that later call's point on the caller's
//! stream, and so for work the caller queued after the receive. So each
//! copy up goes on a stream holding only copies of receives called before
//! it, or on an idle one, or on a new one, up to [`RECEIVE_STREAMS`]; only
//! when all of those hold later calls does it wait behind one (and then a
//! receive called later waits for it, and so for that later call too).
//!
//! Receives into one tensor whose messages land out of call order are
//! not ordered (the earlier call's copy does not exist yet when the later
//! one is queued): wait for a receive before receiving into its tensor
//! again. Collectives are not covered either: their copies are queued when
//! the group runs them, so wait for a collective before receiving into
//! its tensors.

use std::sync::{Arc, Mutex, PoisonError, Weak};

use super::staged_event::StagedEvent;
use crate::cuda::runtime::{Context, Event, Stream};
use crate::Result;

/// The most streams receives copy up on, per GPU and group.
pub(crate) const RECEIVE_STREAMS: usize = 8;

/// What a receive's copy up waits for besides earlier receives, taken at
/// its call: its number in call order, the caller's stream then, and the
/// copies down of the sends then in flight whose tensors overlap its own.
pub(crate) struct ReceiveOrder {
    pub(crate) call: u64,
    pub(crate) caller: Event,
    pub(crate) sends: Vec<Weak<StagedEvent>>,
}

/// What a stream holds, as the choice sees it: the latest call number
/// among its receives' copies still in flight, and whether they are all
/// done.
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
/// stream holds (`None`: nothing yet): the one whose copies in flight
/// are of the latest receive called before `call` (it waits for that one
/// anyway); else an idle one; else a new one while there are fewer than
/// `max`; else the one whose copies in flight were called earliest.
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

/// How receive number `call`'s copy up is queued: on which stream
/// ([`choose`] over `lasts`), and after which earlier receives' copies,
/// given `copies` (the copies in flight in the order they were queued:
/// call number and stream index): on every other stream, the last queued
/// of those called before it (a stream runs its copies in order, and
/// holds copies of increasing calls unless one had to wait behind a later
/// call). Gives indices into `copies`.
pub(crate) fn plan(
    lasts: &[Option<Last>],
    copies: &[(u64, usize)],
    call: u64,
    max: usize,
) -> (Choice, Vec<usize>) {
    let choice = choose(lasts, call, max);
    let chosen = match choice {
        Choice::Use(i) => i,
        Choice::New => lasts.len(),
    };
    let mut last_before: Vec<Option<usize>> = vec![None; lasts.len()];
    for (k, &(c, stream)) in copies.iter().enumerate() {
        if c < call && stream != chosen {
            if let Some(slot) = last_before.get_mut(stream) {
                *slot = Some(k);
            }
        }
    }
    (choice, last_before.into_iter().flatten().collect())
}

/// The event of a copy, if it is still in flight. Events are weak here:
/// the device's in-flight list holds each one until it has passed, so one
/// that is gone is done, and the tensors it keeps are not held longer.
fn in_flight(event: &Weak<StagedEvent>) -> Option<Arc<StagedEvent>> {
    event.upgrade().filter(|e| !e.is_done())
}

/// One receive stream: a number of its own, the latest call number among
/// its copies, and the event after its last copy.
struct ReceiveStream {
    id: u64,
    stream: Stream,
    last: Option<(u64, Weak<StagedEvent>)>,
}

#[derive(Default)]
struct Pool {
    streams: Vec<ReceiveStream>,
    /// Every receive's copy queued, in that order, until it is done: its
    /// call number and its stream's number.
    copies: Vec<(u64, u64, Weak<StagedEvent>)>,
    /// The next stream's number.
    next_id: u64,
}

/// See the module docs.
#[derive(Default)]
pub(crate) struct ReceiveStreams {
    pool: Mutex<Pool>,
}

impl ReceiveStreams {
    /// Queues receive `order`'s copy up on a stream chosen as the module
    /// docs say, after what it waits for; `queue` runs with the stream,
    /// then `record` gives the event after the copy. The context is
    /// bound. On failure the chosen stream leaves the pool (no later
    /// receive queues behind a wait that nothing recorded) and is waited
    /// for, without the pool's lock, before this returns.
    pub(crate) fn queue(
        &self,
        ctx: &Context,
        order: &ReceiveOrder,
        queue: impl FnOnce(&Stream) -> Result<()>,
        record: impl FnOnce(&Stream) -> Result<Arc<StagedEvent>>,
    ) -> Result<Arc<StagedEvent>> {
        let call = order.call;
        let mut pool = self.pool.lock().unwrap_or_else(PoisonError::into_inner);
        let Pool {
            streams,
            copies,
            next_id,
        } = &mut *pool;
        copies.retain(|(_, _, e)| in_flight(e).is_some());
        let lasts: Vec<Option<Last>> = streams
            .iter()
            .map(|s| {
                s.last.as_ref().map(|(c, e)| Last {
                    call: *c,
                    done: in_flight(e).is_none(),
                })
            })
            .collect();
        // Copies whose stream left the pool were waited for when it did.
        let (placed, events): (Vec<(u64, usize)>, Vec<&Weak<StagedEvent>>) = copies
            .iter()
            .filter_map(|(c, id, e)| {
                let at = streams.iter().position(|s| s.id == *id)?;
                Some(((*c, at), e))
            })
            .unzip();
        let (choice, before) = plan(&lasts, &placed, call, RECEIVE_STREAMS);
        // Those still in flight (one done since has nothing to wait for),
        // and the overlapping sends still in flight.
        let waits: Vec<Arc<StagedEvent>> = before
            .iter()
            .filter_map(|&k| in_flight(events[k]))
            .chain(order.sends.iter().filter_map(in_flight))
            .collect();
        let i = match choice {
            Choice::Use(i) => i,
            Choice::New => {
                streams.push(ReceiveStream {
                    id: *next_id,
                    stream: ctx.new_stream()?,
                    last: None,
                });
                *next_id += 1;
                streams.len() - 1
            }
        };
        let chosen = &mut streams[i];
        let queued = (|| {
            chosen.stream.wait(&order.caller)?;
            for event in &waits {
                chosen.stream.wait(event.event())?;
            }
            queue(&chosen.stream)?;
            record(&chosen.stream)
        })();
        let event = match queued {
            Ok(event) => event,
            Err(e) => {
                let failed = streams.remove(i).stream;
                drop(pool);
                let _ = failed.synchronize();
                return Err(e);
            }
        };
        let latest = match &chosen.last {
            Some((c, e)) if in_flight(e).is_some() => (*c).max(call),
            _ => call,
        };
        chosen.last = Some((latest, Arc::downgrade(&event)));
        copies.push((call, chosen.id, Arc::downgrade(&event)));
        Ok(event)
    }

    /// Waits for every receive stream (the context is bound), without
    /// holding the pool while it does.
    pub(crate) fn synchronize(&self) {
        let streams: Vec<Stream> = self
            .pool
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .streams
            .iter()
            .map(|s| s.stream.clone())
            .collect();
        for s in streams {
            let _ = s.synchronize();
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
        // Also when an idle stream exists.
        assert_eq!(choose(&[None, busy(2)], 5, 8), Choice::Use(1));
    }

    #[test]
    fn a_receive_never_waits_behind_a_later_call_while_a_stream_is_free() {
        // Only later calls in flight: an idle stream, else a new one.
        assert_eq!(choose(&[busy(7), done(8)], 5, 8), Choice::Use(1));
        assert_eq!(choose(&[busy(7), None], 5, 8), Choice::Use(1));
        assert_eq!(choose(&[busy(7), busy(6)], 5, 8), Choice::New);
        assert_eq!(choose(&[], 0, 8), Choice::New);
        // A stream holding an earlier and a later call counts as later:
        // receive 1 does not go behind 0 and 2 (it waits for 0's copy by
        // its event instead).
        assert_eq!(choose(&[busy(2)], 1, 8), Choice::New);
    }

    #[test]
    fn a_receive_waits_for_the_earlier_called_copies_on_other_streams() {
        // A (0) into T lands and goes on stream 0; C (2) into U lands and
        // chains behind it (same stream: no wait); B (1) into T lands
        // last. Stream 0 now holds a later call, so B takes a new stream,
        // and waits for A's copy.
        assert_eq!(plan(&[], &[], 0, 8), (Choice::New, vec![]));
        assert_eq!(plan(&[busy(0)], &[(0, 0)], 2, 8), (Choice::Use(0), vec![]));
        assert_eq!(
            plan(&[busy(2)], &[(0, 0), (2, 0)], 1, 8),
            (Choice::New, vec![0])
        );
        // D (1) into U lands first; A (0) into T finds only a later call
        // in flight and takes a new stream; B (2) into T chains behind D
        // and waits for A's copy on the other stream too, since D's copy
        // does not wait for A.
        assert_eq!(plan(&[busy(1)], &[(1, 0)], 0, 8), (Choice::New, vec![]));
        assert_eq!(
            plan(&[busy(1), busy(0)], &[(1, 0), (0, 1)], 2, 8),
            (Choice::Use(0), vec![1])
        );
    }

    #[test]
    fn per_stream_only_the_last_queued_earlier_call_is_waited_for() {
        // Stream 1 holds 9, then 4 (queued behind a later call); receive 7
        // goes behind 5 on stream 0 and waits for 4 on stream 1, and for
        // nothing of 3 or 5 (ahead of it on its own stream).
        let copies = [(3, 0), (5, 0), (9, 1), (4, 1)];
        assert_eq!(
            plan(&[busy(5), busy(9)], &copies, 7, 8),
            (Choice::Use(0), vec![3])
        );
        // Later calls are never waited for.
        assert!(plan(&[busy(9), busy(8)], &[(9, 0), (8, 1)], 7, 8)
            .1
            .is_empty());
    }

    #[test]
    fn with_every_stream_taken_by_later_calls_it_waits_behind_the_earliest() {
        assert_eq!(choose(&[busy(9), busy(6), busy(7)], 5, 3), Choice::Use(1));
    }
}
