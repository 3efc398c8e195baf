//! Rendezvous key-value stores, the c10d `Store` API.
//!
//! Ranks find each other through a [`Store`]: they publish addresses, count
//! arrivals and wait for keys. [`TcpStore`] works across hosts,
//! [`FileStore`] through a shared file, [`HashStore`] between threads of one
//! process, and [`PrefixStore`] namespaces any of them.
//!
//! Every blocking call (`get`, `wait`, `multi_get`, `queue_pop`, `barrier`)
//! uses the store's default timeout (300 s unless changed with
//! [`Store::set_timeout`]) or the one passed to its `_timeout` variant, and
//! fails with [`Error::StoreTimeout`] naming the keys when it runs out.
//!
//! ```
//! use std::sync::Arc;
//! use std::time::Duration;
//! use tensorcomm::store::{HashStore, PrefixStore, Store};
//!
//! let base = Arc::new(HashStore::new());
//! let job = PrefixStore::new("job1", base.clone());
//! job.set("addr", b"10.0.0.1:4000")?;
//! assert_eq!(base.get("job1/addr")?, b"10.0.0.1:4000");
//! // compare_set: a missing key with an empty expected value is set.
//! assert_eq!(job.compare_set("leader", b"", b"rank0")?, b"rank0");
//! job.wait_timeout(&["addr", "leader"], Duration::from_secs(1))?;
//! # Ok::<(), tensorcomm::Error>(())
//! ```

mod file;
mod hash;
mod prefix;
pub(crate) mod state;
pub(crate) mod tcp;
mod timeout;
pub(crate) mod watched;

use std::time::Duration;

pub use file::FileStore;
pub use hash::HashStore;
pub use prefix::PrefixStore;
pub use tcp::{TcpStore, TcpStoreOptions, TcpStoreServer};
pub use tcp::{DEFAULT_IDLE_TIMEOUT, DEFAULT_MAX_CONNECTIONS, DEFAULT_MAX_MESSAGE_SIZE, TOKEN_ENV};
pub use timeout::DefaultTimeout;

use crate::{Error, Result};

/// The default timeout of every store: 300 seconds, as in c10d.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(300);

/// The c10d key-value store API.
///
/// Keys are strings, values are bytes. Counters written by [`Store::add`]
/// are stored as ASCII decimal, so `get` on a counter returns e.g. `b"42"`.
pub trait Store: Send + Sync {
    /// Sets `key` to `value`, waking everyone waiting for it.
    fn set(&self, key: &str, value: &[u8]) -> Result<()>;

    /// Returns the value of `key`, waiting up to `timeout` for it to exist.
    fn get_timeout(&self, key: &str, timeout: Duration) -> Result<Vec<u8>>;

    /// Adds `delta` to the integer counter at `key` (a missing key counts as
    /// 0) and returns the new value.
    fn add(&self, key: &str, delta: i64) -> Result<i64>;

    /// Atomically replaces the value of `key` with `desired` if it currently
    /// equals `expected`, and returns the value the key holds afterwards.
    ///
    /// A missing key with an empty `expected` is set to `desired`; a missing
    /// key with a non-empty `expected` is left missing and `expected` is
    /// returned.
    fn compare_set(&self, key: &str, expected: &[u8], desired: &[u8]) -> Result<Vec<u8>>;

    /// Waits up to `timeout` until every key in `keys` exists.
    fn wait_timeout(&self, keys: &[&str], timeout: Duration) -> Result<()>;

    /// True if every key in `keys` exists now. Never blocks.
    fn check(&self, keys: &[&str]) -> Result<bool>;

    /// Deletes `key`; returns whether it existed.
    fn delete_key(&self, key: &str) -> Result<bool>;

    /// The number of keys (queues not counted).
    fn num_keys(&self) -> Result<usize>;

    /// Appends `value` to the bytes at `key` (creating it if missing).
    fn append(&self, key: &str, value: &[u8]) -> Result<()>;

    /// Returns the values of `keys`, waiting up to `timeout` for all of them.
    fn multi_get_timeout(&self, keys: &[&str], timeout: Duration) -> Result<Vec<Vec<u8>>>;

    /// Sets each of `keys` to the value at the same position in `values`.
    fn multi_set(&self, keys: &[&str], values: &[&[u8]]) -> Result<()>;

    /// Every key (queues not included), in no particular order.
    fn list_keys(&self) -> Result<Vec<String>>;

    /// Pushes `value` to the back of the queue named `key`.
    fn queue_push(&self, key: &str, value: &[u8]) -> Result<()>;

    /// Pops the front of the queue named `key`, waiting up to `timeout` for
    /// an element. A zero timeout never blocks.
    fn queue_pop_timeout(&self, key: &str, timeout: Duration) -> Result<Vec<u8>>;

    /// The number of elements in the queue named `key` (0 if it never existed).
    fn queue_len(&self, key: &str) -> Result<usize>;

    /// This store's default timeout for blocking calls.
    fn timeout(&self) -> Duration;

    /// Changes this store's default timeout for blocking calls.
    fn set_timeout(&self, timeout: Duration);

    /// [`Store::get_timeout`] with the default timeout.
    fn get(&self, key: &str) -> Result<Vec<u8>> {
        self.get_timeout(key, self.timeout())
    }

    /// [`Store::wait_timeout`] with the default timeout.
    fn wait(&self, keys: &[&str]) -> Result<()> {
        self.wait_timeout(keys, self.timeout())
    }

    /// [`Store::multi_get_timeout`] with the default timeout.
    fn multi_get(&self, keys: &[&str]) -> Result<Vec<Vec<u8>>> {
        self.multi_get_timeout(keys, self.timeout())
    }

    /// [`Store::queue_pop_timeout`] with the default timeout.
    fn queue_pop(&self, key: &str) -> Result<Vec<u8>> {
        self.queue_pop_timeout(key, self.timeout())
    }

    /// Blocks until `world_size` callers have reached the barrier named
    /// `key`, or `timeout` (the default if `None`) runs out.
    ///
    /// Each barrier name is used once: the keys `key/arrived` and
    /// `key/done` stay behind. A timeout says how many ranks arrived.
    ///
    /// ```
    /// use std::{sync::Arc, thread, time::Duration};
    /// use tensorcomm::store::{HashStore, Store};
    ///
    /// let store = Arc::new(HashStore::new());
    /// let handles: Vec<_> = (0..3)
    ///     .map(|_| {
    ///         let s = store.clone();
    ///         thread::spawn(move || s.barrier("start", 3, Some(Duration::from_secs(5))))
    ///     })
    ///     .collect();
    /// for h in handles {
    ///     h.join().unwrap()?;
    /// }
    /// # Ok::<(), tensorcomm::Error>(())
    /// ```
    fn barrier(&self, key: &str, world_size: usize, timeout: Option<Duration>) -> Result<()> {
        let timeout = timeout.unwrap_or_else(|| self.timeout());
        let arrived_key = format!("{key}/arrived");
        let done_key = format!("{key}/done");
        let arrived = self.add(&arrived_key, 1)?;
        if arrived > world_size as i64 {
            return Err(Error::BarrierOverflow {
                key: key.to_string(),
                expected: world_size,
                found: arrived,
            });
        }
        if arrived == world_size as i64 {
            return self.set(&done_key, b"1");
        }
        match self.wait_timeout(&[&done_key], timeout) {
            Err(Error::StoreTimeout { .. }) => {
                let now = self.add(&arrived_key, 0).unwrap_or(arrived);
                Err(Error::BarrierTimeout {
                    key: key.to_string(),
                    arrived: now.max(0) as usize,
                    expected: world_size,
                    timeout,
                })
            }
            other => other,
        }
    }
}

/// How long [`read_if_present`] lets the server wait for a key it has
/// just said is there (deleted in between: a timeout, not a long wait).
const PRESENT_KEY_WAIT: Duration = Duration::from_secs(1);

/// The value of `key` if the store holds it now, `None` if not (or if it
/// was deleted before it could be read): a check,
/// then a get that does not wait (a plain get of a missing key would wait
/// the store's timeout, and a stopped store host would hold the caller
/// that long beyond it).
pub(crate) fn read_if_present(store: &dyn Store, key: &str) -> Result<Option<Vec<u8>>> {
    if !store.check(&[key])? {
        return Ok(None);
    }
    match store.get_timeout(key, PRESENT_KEY_WAIT) {
        Ok(value) => Ok(Some(value)),
        // Deleted since the check.
        Err(Error::StoreTimeout { .. }) => Ok(None),
        Err(e) => Err(e),
    }
}

/// Checks that `keys` and `values` have the same length (for `multi_set`).
pub(crate) fn check_multi_set(keys: &[&str], values: &[&[u8]]) -> Result<()> {
    if keys.len() != values.len() {
        return Err(Error::InvalidArgument(format!(
            "multi_set expected as many values as keys ({}), found {} values",
            keys.len(),
            values.len()
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn read_if_present_reads_a_key_that_is_there_and_does_not_wait_for_one_that_is_not() {
        let store = HashStore::new();
        store.set_timeout(Duration::from_secs(300));
        let started = std::time::Instant::now();
        assert_eq!(read_if_present(&store, "k").unwrap(), None);
        assert!(started.elapsed() < Duration::from_secs(1));
        store.set("k", b"v").unwrap();
        assert_eq!(read_if_present(&store, "k").unwrap(), Some(b"v".to_vec()));
    }
}
