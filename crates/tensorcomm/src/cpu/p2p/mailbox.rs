//! Matching arrived point-to-point messages with posted receives.
//!
//! Each peer's reader thread hands every message it reads to
//! [`Mailbox::arrive`]; a receive is posted with [`Mailbox::post`]. Whichever
//! comes second completes the pair, on its own thread, by calling the
//! receive's delivery function. Unmatched messages wait in arrival order,
//! unmatched receives in posting order, so messages from one peer with one
//! tag are received in the order they were sent. A receive that finds no
//! message by its deadline is failed by the group's watcher thread
//! ([`Mailbox::expire_until_shutdown`]); one waiting on a peer whose
//! connection closed fails at once.

use std::collections::VecDeque;
use std::sync::{Condvar, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use super::message::Channel;
use crate::{Error, Result};

/// A message as it arrived.
pub(crate) struct Message {
    pub(crate) src: usize,
    pub(crate) payload: Vec<u8>,
}

/// What a posted receive does with its message (or its failure).
pub(crate) type Deliver = Box<dyn FnOnce(Result<Message>) + Send>;

struct Arrived {
    src: usize,
    channel: Channel,
    tag: u64,
    payload: Vec<u8>,
}

struct Posted {
    src: Option<usize>,
    channel: Channel,
    tag: u64,
    deadline: Instant,
    timeout: Duration,
    deliver: Deliver,
}

impl Posted {
    fn accepts(&self, src: usize, channel: Channel, tag: u64) -> bool {
        self.src.is_none_or(|s| s == src) && self.channel == channel && self.tag == tag
    }
}

#[derive(Default)]
struct State {
    arrived: VecDeque<Arrived>,
    posted: Vec<Posted>,
    /// Why each peer's connection closed, once it has.
    closed: Vec<Option<String>>,
    shutdown: bool,
}

/// Arrived messages and posted receives of one group's rank.
pub(crate) struct Mailbox {
    rank: usize,
    state: Mutex<State>,
    /// Wakes the watcher when a receive is posted or the group shuts down.
    changed: Condvar,
}

impl Mailbox {
    pub(crate) fn new(rank: usize, world_size: usize) -> Self {
        Mailbox {
            rank,
            state: Mutex::new(State {
                closed: vec![None; world_size],
                ..State::default()
            }),
            changed: Condvar::new(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Waits for a message from `src` (any peer when `None`) on `channel`
    /// with `tag`, for at most `timeout`, and hands it (or the failure) to
    /// `deliver`, possibly on this thread before returning.
    pub(crate) fn post(
        &self,
        src: Option<usize>,
        channel: Channel,
        tag: u64,
        timeout: Duration,
        deliver: Deliver,
    ) {
        let mut state = self.lock();
        let found = state
            .arrived
            .iter()
            .position(|m| src.is_none_or(|s| s == m.src) && m.channel == channel && m.tag == tag);
        if let Some(i) = found {
            let m = state.arrived.remove(i);
            drop(state);
            if let Some(m) = m {
                deliver(Ok(Message {
                    src: m.src,
                    payload: m.payload,
                }));
            }
            return;
        }
        if let Some(err) = self.closed_error(&state, src, tag) {
            drop(state);
            deliver(Err(err));
            return;
        }
        state.posted.push(Posted {
            src,
            channel,
            tag,
            deadline: Instant::now() + timeout,
            timeout,
            deliver,
        });
        drop(state);
        self.changed.notify_all();
    }

    /// The error for a receive that can no longer be matched because its
    /// peer (or, for any source, every peer) closed its connection.
    fn closed_error(&self, state: &State, src: Option<usize>, tag: u64) -> Option<Error> {
        match src {
            Some(peer) => state
                .closed
                .get(peer)?
                .as_ref()
                .map(|why| Error::PeerClosed {
                    peer,
                    during: format!("waiting for a point-to-point message with tag {tag}"),
                    reason: why.to_string(),
                }),
            None => {
                let peers = (0..state.closed.len()).filter(|&p| p != self.rank);
                let all_closed = peers.clone().all(|p| state.closed[p].is_some());
                (all_closed && peers.count() > 0).then(|| Error::NoMessage {
                    rank: self.rank,
                    tag,
                    reason: "every peer closed its connection".into(),
                })
            }
        }
    }

    /// Hands a message that `src` sent to the first receive waiting for it,
    /// or keeps it until one is posted.
    pub(crate) fn arrive(&self, src: usize, channel: Channel, tag: u64, payload: Vec<u8>) {
        let mut state = self.lock();
        match state
            .posted
            .iter()
            .position(|p| p.accepts(src, channel, tag))
        {
            Some(i) => {
                let posted = state.posted.remove(i);
                drop(state);
                (posted.deliver)(Ok(Message { src, payload }));
            }
            None => state.arrived.push_back(Arrived {
                src,
                channel,
                tag,
                payload,
            }),
        }
    }

    /// Records that `peer`'s connection closed (`why`) and fails the
    /// receives that can no longer be matched.
    pub(crate) fn close(&self, peer: usize, why: String) {
        let mut state = self.lock();
        if let Some(slot) = state.closed.get_mut(peer) {
            *slot = Some(why);
        }
        let mut failed = Vec::new();
        let mut i = 0;
        while i < state.posted.len() {
            let p = &state.posted[i];
            match self.closed_error(&state, p.src, p.tag) {
                Some(err) => failed.push((state.posted.remove(i).deliver, err)),
                None => i += 1,
            }
        }
        drop(state);
        for (deliver, err) in failed {
            deliver(Err(err));
        }
    }

    /// Fails each posted receive when its deadline passes, until
    /// [`shutdown`](Mailbox::shutdown); run by the group's watcher thread.
    pub(crate) fn expire_until_shutdown(&self) {
        let mut state = self.lock();
        loop {
            if state.shutdown {
                return;
            }
            let now = Instant::now();
            let mut expired = Vec::new();
            let mut i = 0;
            while i < state.posted.len() {
                if state.posted[i].deadline <= now {
                    expired.push(state.posted.remove(i));
                } else {
                    i += 1;
                }
            }
            if !expired.is_empty() {
                drop(state);
                for p in expired {
                    let err = match p.src {
                        Some(peer) => Error::PeerTimeout {
                            peer,
                            during: format!(
                                "waiting for a point-to-point message with tag {}",
                                p.tag
                            ),
                            timeout: p.timeout,
                        },
                        None => Error::NoMessage {
                            rank: self.rank,
                            tag: p.tag,
                            reason: format!("no rank sent one within {:?}", p.timeout),
                        },
                    };
                    (p.deliver)(Err(err));
                }
                state = self.lock();
                continue;
            }
            state = match state.posted.iter().map(|p| p.deadline).min() {
                Some(next) => {
                    self.changed
                        .wait_timeout(state, next.saturating_duration_since(now))
                        .unwrap_or_else(PoisonError::into_inner)
                        .0
                }
                None => self
                    .changed
                    .wait(state)
                    .unwrap_or_else(PoisonError::into_inner),
            };
        }
    }

    /// Stops the watcher.
    pub(crate) fn shutdown(&self) {
        self.lock().shutdown = true;
        self.changed.notify_all();
    }
}

#[cfg(test)]
mod tests {
    use std::sync::mpsc::channel;
    use std::sync::Arc;

    use super::*;

    fn collect(
        mailbox: &Mailbox,
        src: Option<usize>,
        tag: u64,
        timeout: Duration,
    ) -> std::sync::mpsc::Receiver<Result<(usize, Vec<u8>)>> {
        let (tx, rx) = channel();
        mailbox.post(
            src,
            Channel::User,
            tag,
            timeout,
            Box::new(move |m| {
                let _ = tx.send(m.map(|m| (m.src, m.payload)));
            }),
        );
        rx
    }

    #[test]
    fn messages_match_receives_by_source_channel_and_tag_in_order() {
        let mb = Mailbox::new(0, 3);
        let long = Duration::from_secs(60);
        mb.arrive(2, Channel::User, 7, vec![1]);
        mb.arrive(2, Channel::BarrierArrive, 7, vec![9]);
        mb.arrive(1, Channel::User, 7, vec![2]);
        mb.arrive(2, Channel::User, 7, vec![3]);
        let from1 = collect(&mb, Some(1), 7, long);
        assert_eq!(from1.try_recv().unwrap().unwrap(), (1, vec![2]));
        let any = collect(&mb, None, 7, long);
        assert_eq!(any.try_recv().unwrap().unwrap(), (2, vec![1]));
        let any = collect(&mb, None, 7, long);
        assert_eq!(any.try_recv().unwrap().unwrap(), (2, vec![3]));
        // Posted first, matched on arrival; another tag does not match.
        let waiting = collect(&mb, Some(1), 8, long);
        mb.arrive(1, Channel::User, 9, vec![4]);
        assert!(waiting.try_recv().is_err());
        mb.arrive(1, Channel::User, 8, vec![5]);
        assert_eq!(waiting.try_recv().unwrap().unwrap(), (1, vec![5]));
    }

    #[test]
    fn closed_peers_and_deadlines_fail_receives_with_named_errors() {
        let mb = Arc::new(Mailbox::new(0, 3));
        let watcher = {
            let mb = mb.clone();
            std::thread::spawn(move || mb.expire_until_shutdown())
        };
        let from2 = collect(&mb, Some(2), 1, Duration::from_secs(60));
        let any = collect(&mb, None, 1, Duration::from_secs(60));
        mb.close(2, "connection reset".into());
        match from2.recv().unwrap() {
            Err(Error::PeerClosed {
                peer: 2,
                during,
                reason,
            }) => {
                assert!(during.contains("tag 1"), "{during}");
                assert!(reason.contains("reset"), "{reason}");
            }
            other => panic!("{other:?}"),
        }
        assert!(any.try_recv().is_err(), "rank 1 may still send");
        mb.close(1, "eof".into());
        assert!(matches!(
            any.recv().unwrap(),
            Err(Error::NoMessage {
                rank: 0,
                tag: 1,
                ..
            })
        ));
        let mb2 = Arc::new(Mailbox::new(1, 2));
        let w2 = {
            let mb2 = mb2.clone();
            std::thread::spawn(move || mb2.expire_until_shutdown())
        };
        let started = Instant::now();
        let late = collect(&mb2, Some(0), 3, Duration::from_millis(50));
        match late.recv().unwrap() {
            Err(Error::PeerTimeout {
                peer: 0, timeout, ..
            }) => {
                assert_eq!(timeout, Duration::from_millis(50));
            }
            other => panic!("{other:?}"),
        }
        assert!(started.elapsed() >= Duration::from_millis(50));
        mb.shutdown();
        mb2.shutdown();
        watcher.join().unwrap();
        w2.join().unwrap();
    }
}
