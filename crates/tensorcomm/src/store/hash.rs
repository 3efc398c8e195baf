//! `HashStore`: an in-memory store shared by the threads of one process.

use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use super::state::KvState;
use super::{check_multi_set, DefaultTimeout, Store};
use crate::{Error, Result};

/// A store in this process's memory, for threads (and tests).
///
/// ```
/// use std::{sync::Arc, thread};
/// use tensorcomm::store::{HashStore, Store};
///
/// let store = Arc::new(HashStore::new());
/// let writer = store.clone();
/// thread::spawn(move || writer.set("ready", b"yes"));
/// assert_eq!(store.get("ready")?, b"yes"); // blocks until the thread sets it
/// # Ok::<(), tensorcomm::Error>(())
/// ```
#[derive(Debug, Default)]
pub struct HashStore {
    state: Mutex<KvState>,
    changed: Condvar,
    timeout: DefaultTimeout,
}

impl HashStore {
    /// An empty store with the default 300 s timeout.
    pub fn new() -> Self {
        Self::default()
    }

    fn lock(&self) -> MutexGuard<'_, KvState> {
        // A panic while holding the lock cannot leave KvState half-updated
        // in a way that matters to other users: every operation is a single
        // map update. So a poisoned lock is taken over.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn mutate<T>(&self, f: impl FnOnce(&mut KvState) -> T) -> T {
        let out = f(&mut self.lock());
        self.changed.notify_all();
        out
    }

    /// Waits until `ready` returns `Some`, or `timeout` passes.
    fn wait_until<T>(
        &self,
        keys: &[&str],
        timeout: Duration,
        mut ready: impl FnMut(&mut KvState) -> Option<T>,
    ) -> Result<T> {
        let deadline = Instant::now().checked_add(timeout);
        let mut state = self.lock();
        loop {
            if let Some(out) = ready(&mut state) {
                return Ok(out);
            }
            let left = match deadline {
                Some(d) => d.saturating_duration_since(Instant::now()),
                None => Duration::from_secs(3600),
            };
            if left.is_zero() {
                return Err(Error::StoreTimeout {
                    keys: keys.iter().map(|k| k.to_string()).collect(),
                    timeout,
                });
            }
            state = self
                .changed
                .wait_timeout(state, left)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
    }
}

impl Store for HashStore {
    fn set(&self, key: &str, value: &[u8]) -> Result<()> {
        self.mutate(|s| s.set(key, value));
        Ok(())
    }

    fn get_timeout(&self, key: &str, timeout: Duration) -> Result<Vec<u8>> {
        self.wait_until(&[key], timeout, |s| s.get(key).map(<[u8]>::to_vec))
    }

    fn add(&self, key: &str, delta: i64) -> Result<i64> {
        self.mutate(|s| s.add(key, delta))
    }

    fn compare_set(&self, key: &str, expected: &[u8], desired: &[u8]) -> Result<Vec<u8>> {
        Ok(self.mutate(|s| s.compare_set(key, expected, desired)))
    }

    fn wait_timeout(&self, keys: &[&str], timeout: Duration) -> Result<()> {
        self.wait_until(keys, timeout, |s| s.missing(keys).is_empty().then_some(()))
    }

    fn check(&self, keys: &[&str]) -> Result<bool> {
        Ok(self.lock().missing(keys).is_empty())
    }

    fn delete_key(&self, key: &str) -> Result<bool> {
        Ok(self.mutate(|s| s.delete(key)))
    }

    fn num_keys(&self) -> Result<usize> {
        Ok(self.lock().num_keys())
    }

    fn append(&self, key: &str, value: &[u8]) -> Result<()> {
        self.mutate(|s| s.append(key, value));
        Ok(())
    }

    fn multi_get_timeout(&self, keys: &[&str], timeout: Duration) -> Result<Vec<Vec<u8>>> {
        self.wait_until(keys, timeout, |s| {
            keys.iter()
                .map(|k| s.get(k).map(<[u8]>::to_vec))
                .collect::<Option<Vec<_>>>()
        })
    }

    fn multi_set(&self, keys: &[&str], values: &[&[u8]]) -> Result<()> {
        check_multi_set(keys, values)?;
        self.mutate(|s| keys.iter().zip(values).for_each(|(k, v)| s.set(k, v)));
        Ok(())
    }

    fn list_keys(&self) -> Result<Vec<String>> {
        Ok(self.lock().list_keys())
    }

    fn queue_push(&self, key: &str, value: &[u8]) -> Result<()> {
        self.mutate(|s| s.queue_push(key, value));
        Ok(())
    }

    fn queue_pop_timeout(&self, key: &str, timeout: Duration) -> Result<Vec<u8>> {
        self.wait_until(&[key], timeout, |s| s.queue_pop(key))
    }

    fn queue_len(&self, key: &str) -> Result<usize> {
        Ok(self.lock().queue_len(key))
    }

    fn timeout(&self) -> Duration {
        self.timeout.get()
    }

    fn set_timeout(&self, timeout: Duration) {
        self.timeout.set(timeout)
    }
}
