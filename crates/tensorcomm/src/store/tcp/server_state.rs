//! What a TCP store server holds: the keys, the waiters, the joined clients.
//!
//! The keys live in a [`KvState`] behind one mutex, held only for the
//! duration of one operation and never across an `.await`. A blocking
//! request that cannot be served yet registers a [`Notify`] under each key
//! (or queue) it still misses; an operation that writes a key takes that
//! key's waiters out and notifies each of them once. A woken request takes
//! the lock again, re-checks, and either answers or registers under the keys
//! still missing. Nothing polls, and a write wakes only the requests waiting
//! for the key it wrote.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;

use super::own_connections::Ends;
use super::protocol::{Request, Response};
use crate::store::state::KvState;
use crate::Error;

/// Waiters registered under each name: waiter id -> its notifier.
type WaiterMap = HashMap<String, HashMap<u64, Arc<Notify>>>;

/// Keys and queues are separate namespaces, with separate waiters.
#[derive(Debug, Clone, Copy)]
enum Namespace {
    Keys,
    Queues,
}

#[derive(Debug, Default)]
struct Inner {
    kv: KvState,
    key_waiters: WaiterMap,
    queue_waiters: WaiterMap,
}

impl Inner {
    fn waiters(&mut self, ns: Namespace) -> &mut WaiterMap {
        match ns {
            Namespace::Keys => &mut self.key_waiters,
            Namespace::Queues => &mut self.queue_waiters,
        }
    }

    /// Wakes (and unregisters) everyone waiting for `name`.
    fn wake(&mut self, ns: Namespace, name: &str) {
        if let Some(waiters) = self.waiters(ns).remove(name) {
            for notify in waiters.values() {
                notify.notify_one();
            }
        }
    }
}

/// The state one server shares between all its connections.
#[derive(Debug, Default)]
pub(crate) struct ServerState {
    inner: Mutex<Inner>,
    next_waiter: AtomicU64,
    waiting: AtomicUsize,
    joined: Gauge,
    connections: Gauge,
    /// The open connections by their ends (`None`: not known), so that an
    /// exit can tell other processes' clients from its own.
    ends: Mutex<BTreeMap<Option<Ends>, usize>>,
}

/// A count that threads can wait on.
#[derive(Debug, Default)]
struct Gauge {
    value: Mutex<usize>,
    changed: Condvar,
}

impl Gauge {
    fn lock(&self) -> MutexGuard<'_, usize> {
        self.value.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn adjust(&self, f: impl FnOnce(usize) -> usize) -> usize {
        let mut value = self.lock();
        *value = f(*value);
        self.changed.notify_all();
        *value
    }

    /// Waits while `keep_waiting(value)` holds, at most `timeout`; returns
    /// the value it ended with.
    fn wait_while(&self, timeout: Duration, keep_waiting: impl FnMut(&mut usize) -> bool) -> usize {
        let value = self.lock();
        let (value, _) = self
            .changed
            .wait_timeout_while(value, timeout, keep_waiting)
            .unwrap_or_else(|p| p.into_inner());
        *value
    }
}

/// Counts a connection as open for as long as it lives (tasks that are
/// cancelled still drop it).
pub(crate) struct OpenConnection(Arc<ServerState>, Option<Ends>);

impl OpenConnection {
    pub(crate) fn new(state: &Arc<ServerState>, ends: Option<Ends>) -> Self {
        *state.ends().entry(ends).or_insert(0) += 1;
        state.connections.adjust(|n| n + 1);
        OpenConnection(state.clone(), ends)
    }
}

impl Drop for OpenConnection {
    fn drop(&mut self) {
        self.0.connections.adjust(|n| n.saturating_sub(1));
        let mut ends = self.0.ends();
        if let Some(n) = ends.get_mut(&self.1) {
            *n -= 1;
            if *n == 0 {
                ends.remove(&self.1);
            }
        }
    }
}

impl ServerState {
    fn lock(&self) -> MutexGuard<'_, Inner> {
        // Every operation on Inner is a single map update, so a panic while
        // holding the lock cannot leave it inconsistent: take it over.
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn ends(&self) -> MutexGuard<'_, BTreeMap<Option<Ends>, usize>> {
        // One insert or removal at a time: a panic cannot leave it half done.
        self.ends.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The open connections by their ends, taking the lock for at most
    /// `patience` (`None` if it could not be had; see `at_exit.rs`).
    pub(crate) fn open_ends(&self, patience: Duration) -> Option<BTreeMap<Option<Ends>, usize>> {
        crate::process_exit::lock_within(&self.ends, patience).map(|ends| ends.clone())
    }

    /// Counts one more client that completed the handshake.
    pub(crate) fn client_joined(&self) -> usize {
        self.joined.adjust(|n| n + 1)
    }

    /// Clients that completed the handshake so far.
    pub(crate) fn clients_joined(&self) -> usize {
        *self.joined.lock()
    }

    /// Blocks the calling thread until `expected` clients joined; returns the
    /// number joined when it returns (less than `expected` on timeout).
    pub(crate) fn wait_for_clients(&self, expected: usize, timeout: Duration) -> usize {
        self.joined.wait_while(timeout, |j| *j < expected)
    }

    /// Connections open right now.
    pub(crate) fn open_connections(&self) -> usize {
        *self.connections.lock()
    }

    /// Blocks the calling thread until no connection is open; returns how
    /// many still are when it returns (more than 0 on timeout).
    pub(crate) fn wait_until_idle(&self, timeout: Duration) -> usize {
        self.connections.wait_while(timeout, |n| *n > 0)
    }

    /// Requests currently blocked waiting for keys or queue elements.
    pub(crate) fn waiting_requests(&self) -> usize {
        self.waiting.load(Ordering::SeqCst)
    }

    /// Serves one request. Blocking requests wait here (asynchronously).
    pub(crate) async fn handle(self: &Arc<Self>, request: &Request<'_>) -> Response {
        match request {
            Request::Set { key, value } => self.write(key, |kv| kv.set(key, value)),
            Request::Get { key, timeout } => self
                .block_until(Namespace::Keys, &[key], *timeout, |kv| {
                    kv.get(key).map(<[u8]>::to_vec)
                })
                .await
                .map_or(Response::TimedOut, Response::Value),
            Request::Add { key, delta } => {
                let mut inner = self.lock();
                match inner.kv.add(key, *delta) {
                    Ok(value) => {
                        inner.wake(Namespace::Keys, key);
                        Response::Int(value)
                    }
                    Err(Error::NotACounter { key, found }) => Response::NotACounter { key, found },
                    Err(other) => Response::Failed(other.to_string()),
                }
            }
            Request::CompareSet {
                key,
                expected,
                desired,
            } => Response::Value(
                self.write_returning(key, |kv| kv.compare_set(key, expected, desired)),
            ),
            Request::Wait { keys, timeout } => self
                .block_until(Namespace::Keys, keys, *timeout, |kv| {
                    kv.missing(keys).is_empty().then_some(())
                })
                .await
                .map_or(Response::TimedOut, |()| Response::Done),
            Request::Check { keys } => Response::Bool(self.lock().kv.missing(keys).is_empty()),
            Request::DeleteKey { key } => Response::Bool(self.lock().kv.delete(key)),
            Request::NumKeys => Response::Count(self.lock().kv.num_keys() as u64),
            Request::Append { key, value } => self.write(key, |kv| kv.append(key, value)),
            Request::MultiGet { keys, timeout } => self
                .block_until(Namespace::Keys, keys, *timeout, |kv| {
                    keys.iter()
                        .map(|k| kv.get(k).map(<[u8]>::to_vec))
                        .collect::<Option<Vec<_>>>()
                })
                .await
                .map_or(Response::TimedOut, Response::Values),
            Request::MultiSet { keys, values } => {
                let mut inner = self.lock();
                for (key, value) in keys.iter().zip(values) {
                    inner.kv.set(key, value);
                    inner.wake(Namespace::Keys, key);
                }
                Response::Done
            }
            Request::ListKeys => Response::Keys(self.lock().kv.list_keys()),
            Request::QueuePush { key, value } => {
                let mut inner = self.lock();
                inner.kv.queue_push(key, value);
                inner.wake(Namespace::Queues, key);
                Response::Done
            }
            Request::QueuePop { key, timeout } => self
                .block_until(Namespace::Queues, &[key], *timeout, |kv| kv.queue_pop(key))
                .await
                .map_or(Response::TimedOut, Response::Value),
            Request::QueueLen { key } => Response::Count(self.lock().kv.queue_len(key) as u64),
        }
    }

    fn write(&self, key: &str, f: impl FnOnce(&mut KvState)) -> Response {
        self.write_returning(key, f);
        Response::Done
    }

    fn write_returning<T>(&self, key: &str, f: impl FnOnce(&mut KvState) -> T) -> T {
        let mut inner = self.lock();
        let out = f(&mut inner.kv);
        inner.wake(Namespace::Keys, key);
        out
    }

    /// Waits until `ready` returns `Some`, registering under the names still
    /// missing each time it does not; `None` when `timeout` runs out.
    async fn block_until<T>(
        self: &Arc<Self>,
        ns: Namespace,
        names: &[&str],
        timeout: Option<Duration>,
        mut ready: impl FnMut(&mut KvState) -> Option<T>,
    ) -> Option<T> {
        let deadline = timeout.and_then(|t| Instant::now().checked_add(t));
        let mut waiter: Option<Waiter> = None;
        loop {
            let notify = {
                let mut inner = self.lock();
                if let Some(out) = ready(&mut inner.kv) {
                    return Some(out);
                }
                if deadline.is_some_and(|d| Instant::now() >= d) {
                    return None;
                }
                let waiter = waiter.get_or_insert_with(|| Waiter::new(self, ns, names));
                let missing: Vec<&str> = match ns {
                    Namespace::Keys => inner.kv.missing(names),
                    Namespace::Queues => names.to_vec(),
                };
                let map = inner.waiters(ns);
                for name in missing {
                    map.entry(name.to_string())
                        .or_default()
                        .insert(waiter.id, waiter.notify.clone());
                }
                waiter.notify.clone()
            };
            // A notify_one that happened after the lock was released left a
            // permit, so this wakes at once: no wake-up is lost.
            match deadline {
                Some(deadline) => {
                    if tokio::time::timeout_at(deadline, notify.notified())
                        .await
                        .is_err()
                    {
                        let last_chance = ready(&mut self.lock().kv);
                        return last_chance;
                    }
                }
                None => notify.notified().await,
            }
        }
    }
}

/// One blocked request's registration; dropping it (answered, timed out, or
/// its connection closed) removes it from every name it waited under.
struct Waiter {
    state: Arc<ServerState>,
    ns: Namespace,
    names: Vec<String>,
    id: u64,
    notify: Arc<Notify>,
}

impl Waiter {
    fn new(state: &Arc<ServerState>, ns: Namespace, names: &[&str]) -> Self {
        state.waiting.fetch_add(1, Ordering::SeqCst);
        Waiter {
            state: state.clone(),
            ns,
            names: names.iter().map(|n| n.to_string()).collect(),
            id: state.next_waiter.fetch_add(1, Ordering::Relaxed),
            notify: Arc::new(Notify::new()),
        }
    }
}

impl Drop for Waiter {
    fn drop(&mut self) {
        let mut inner = self.state.lock();
        let map = inner.waiters(self.ns);
        for name in &self.names {
            if let Some(waiters) = map.get_mut(name) {
                waiters.remove(&self.id);
                if waiters.is_empty() {
                    map.remove(name);
                }
            }
        }
        drop(inner);
        self.state.waiting.fetch_sub(1, Ordering::SeqCst);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn runtime() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap()
    }

    #[test]
    fn a_set_wakes_a_waiter_and_unregisters_it() {
        runtime().block_on(async {
            let state = Arc::new(ServerState::default());
            let waiter = {
                let state = state.clone();
                tokio::spawn(async move {
                    let req = Request::Wait {
                        keys: vec!["a", "b"],
                        timeout: None,
                    };
                    state.handle(&req).await
                })
            };
            while state.waiting_requests() == 0 {
                tokio::task::yield_now().await;
            }
            assert_eq!(state.lock().key_waiters.len(), 2);
            state
                .handle(&Request::Set {
                    key: "a",
                    value: b"1",
                })
                .await;
            // Woken by "a", re-registered under "b" only.
            while state.lock().key_waiters.contains_key("a") {
                tokio::task::yield_now().await;
            }
            state
                .handle(&Request::Set {
                    key: "b",
                    value: b"2",
                })
                .await;
            assert_eq!(waiter.await.unwrap(), Response::Done);
            assert_eq!(state.waiting_requests(), 0);
            assert!(state.lock().key_waiters.is_empty());
        });
    }

    #[test]
    fn a_timed_out_waiter_leaves_no_registration() {
        runtime().block_on(async {
            let state = Arc::new(ServerState::default());
            let req = Request::Get {
                key: "never",
                timeout: Some(Duration::from_millis(5)),
            };
            assert_eq!(state.handle(&req).await, Response::TimedOut);
            assert_eq!(state.waiting_requests(), 0);
            assert!(state.lock().key_waiters.is_empty());
        });
    }

    #[test]
    fn zero_timeout_pop_answers_without_blocking() {
        runtime().block_on(async {
            let state = Arc::new(ServerState::default());
            let pop = Request::QueuePop {
                key: "q",
                timeout: Some(Duration::ZERO),
            };
            assert_eq!(state.handle(&pop).await, Response::TimedOut);
            state
                .handle(&Request::QueuePush {
                    key: "q",
                    value: b"x",
                })
                .await;
            assert_eq!(state.handle(&pop).await, Response::Value(b"x".to_vec()));
        });
    }

    #[test]
    fn add_on_text_is_a_typed_reply() {
        runtime().block_on(async {
            let state = Arc::new(ServerState::default());
            state
                .handle(&Request::Set {
                    key: "t",
                    value: b"text",
                })
                .await;
            let reply = state.handle(&Request::Add { key: "t", delta: 1 }).await;
            assert_eq!(
                reply,
                Response::NotACounter {
                    key: "t".into(),
                    found: "text".into()
                }
            );
        });
    }
}
