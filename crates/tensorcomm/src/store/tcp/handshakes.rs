//! The connections a server holds that have not finished their handshake.
//!
//! A connection counts against the server's connection cap from the moment
//! it is accepted, but until its hello is checked it proves nothing: with a
//! token set, anyone who can reach the port can open it. So that such
//! connections never crowd out clients that did authenticate, a server at
//! its cap closes the connection that has been in its handshake longest
//! ([`Handshakes::evict_oldest`]) and takes the new one, rather than
//! refusing it; only when every open connection has finished its handshake
//! is a newcomer refused. A real client sends its hello as soon as it
//! connects and is answered within a round trip, so the oldest handshake is
//! almost surely one that is never going to send a valid hello.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard};

use tokio::sync::oneshot;

/// Connections in their handshake, oldest first.
#[derive(Debug, Default)]
pub(crate) struct Handshakes {
    inner: Mutex<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    next_id: u64,
    /// id (in order of arrival) -> the sender whose drop closes it.
    pending: BTreeMap<u64, oneshot::Sender<()>>,
}

/// One connection's place among the handshakes; leaving it (drop) takes the
/// connection off the list.
#[derive(Debug)]
pub(crate) struct HandshakeTicket {
    handshakes: Arc<Handshakes>,
    id: u64,
    evicted: Option<oneshot::Receiver<()>>,
}

impl Handshakes {
    fn lock(&self) -> MutexGuard<'_, Inner> {
        // Every update is a single map operation: a panic cannot leave the
        // map inconsistent.
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Puts a newly accepted connection on the list.
    pub(crate) fn enter(self: &Arc<Self>) -> HandshakeTicket {
        let (tx, rx) = oneshot::channel();
        let mut inner = self.lock();
        let id = inner.next_id;
        inner.next_id += 1;
        inner.pending.insert(id, tx);
        HandshakeTicket {
            handshakes: self.clone(),
            id,
            evicted: Some(rx),
        }
    }

    /// Tells the connection longest in its handshake to close; returns
    /// whether there was one.
    pub(crate) fn evict_oldest(&self) -> bool {
        match self.lock().pending.pop_first() {
            Some((_, evict)) => {
                // The connection may be gone already: nothing to tell then.
                let _ = evict.send(());
                true
            }
            None => false,
        }
    }

    /// Connections in their handshake right now.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.lock().pending.len()
    }
}

impl HandshakeTicket {
    /// A future that resolves when the server evicts this connection, and
    /// never if it is not (or once it has [left](Self::leave) the list).
    /// Call it at most once.
    pub(crate) fn eviction(&mut self) -> impl std::future::Future<Output = ()> + 'static {
        let evicted = self.evicted.take();
        async move {
            match evicted {
                Some(rx) => {
                    if rx.await.is_err() {
                        // Left the list without being evicted.
                        std::future::pending::<()>().await
                    }
                }
                None => std::future::pending().await,
            }
        }
    }

    /// Takes this connection off the list before it is welcomed, so that
    /// an accepted client is never evicted; `false` when it was evicted
    /// first (it must then be closed, the server took a newcomer in its
    /// place).
    pub(crate) fn leave(&self) -> bool {
        self.handshakes.lock().pending.remove(&self.id).is_some()
    }
}

impl Drop for HandshakeTicket {
    fn drop(&mut self) {
        self.handshakes.lock().pending.remove(&self.id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_oldest_handshake_is_evicted_first_and_finished_ones_never() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let handshakes = Arc::new(Handshakes::default());
        let mut first = handshakes.enter();
        let done = handshakes.enter();
        let mut third = handshakes.enter();
        assert_eq!(handshakes.len(), 3);
        drop(done); // finished its handshake: off the list
        assert_eq!(handshakes.len(), 2);
        assert!(handshakes.evict_oldest());
        rt.block_on(first.eviction()); // resolves: it was the oldest
        let third_evicted = third.eviction();
        let still_there = rt.block_on(async {
            tokio::select! {
                biased;
                _ = third_evicted => false,
                _ = std::future::ready(()) => true,
            }
        });
        assert!(still_there, "the younger handshake was evicted too");
        assert!(handshakes.evict_oldest());
        assert!(!handshakes.evict_oldest(), "nothing left to evict");
        assert_eq!(handshakes.len(), 0);
    }

    #[test]
    fn a_handshake_that_left_is_never_evicted_and_an_evicted_one_cannot_leave() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let handshakes = Arc::new(Handshakes::default());
        let mut welcomed = handshakes.enter();
        let welcomed_evicted = welcomed.eviction();
        assert!(welcomed.leave());
        assert!(
            !handshakes.evict_oldest(),
            "a welcomed connection was evictable"
        );
        let never = rt.block_on(async {
            tokio::select! {
                biased;
                _ = welcomed_evicted => false,
                _ = std::future::ready(()) => true,
            }
        });
        assert!(never, "leaving the list read as an eviction");
        let late = handshakes.enter();
        assert!(handshakes.evict_oldest());
        assert!(!late.leave(), "an evicted connection left as if welcomed");
    }
}
