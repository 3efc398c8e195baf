//! A store whose blocking waits look around while they wait: a wait for
//! keys (`get`, `wait`, `multi_get`, and `barrier` through them) waits in
//! slices of at most [`SLICE`] and calls a check between
//! them, which may end the wait with its own error (a peer known to be
//! gone). The whole wait still ends at its timeout with the error the
//! store gives for it. Rendezvous and a CPU group's set-up wait through
//! one.

use std::time::{Duration, Instant};

use super::Store;
use crate::{Error, Result};

/// The longest slice a blocking call waits at a time.
pub(crate) const SLICE: Duration = Duration::from_millis(500);

/// `inner`, with `between(keys)` called between the slices of each wait.
pub(crate) struct WatchedStore<'a, F> {
    inner: &'a dyn Store,
    between: F,
}

impl<'a, F: Fn(&[&str]) -> Result<()> + Send + Sync> WatchedStore<'a, F> {
    pub(crate) fn new(inner: &'a dyn Store, between: F) -> Self {
        WatchedStore { inner, between }
    }

    /// Runs `call` with slices of `timeout` until it does not time out, or
    /// the last slice did.
    fn sliced<T>(
        &self,
        keys: &[&str],
        timeout: Duration,
        call: impl Fn(Duration) -> Result<T>,
    ) -> Result<T> {
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let slice = left.min(SLICE);
            match call(slice) {
                Err(Error::StoreTimeout { keys: k, .. }) if slice == left => {
                    return Err(Error::StoreTimeout { keys: k, timeout });
                }
                Err(Error::StoreTimeout { .. }) => (self.between)(keys)?,
                other => return other,
            }
        }
    }
}

impl<F: Fn(&[&str]) -> Result<()> + Send + Sync> Store for WatchedStore<'_, F> {
    fn set(&self, key: &str, value: &[u8]) -> Result<()> {
        self.inner.set(key, value)
    }
    fn get_timeout(&self, key: &str, timeout: Duration) -> Result<Vec<u8>> {
        self.sliced(&[key], timeout, |t| self.inner.get_timeout(key, t))
    }
    fn add(&self, key: &str, delta: i64) -> Result<i64> {
        self.inner.add(key, delta)
    }
    fn compare_set(&self, key: &str, expected: &[u8], desired: &[u8]) -> Result<Vec<u8>> {
        self.inner.compare_set(key, expected, desired)
    }
    fn wait_timeout(&self, keys: &[&str], timeout: Duration) -> Result<()> {
        self.sliced(keys, timeout, |t| self.inner.wait_timeout(keys, t))
    }
    fn check(&self, keys: &[&str]) -> Result<bool> {
        self.inner.check(keys)
    }
    fn delete_key(&self, key: &str) -> Result<bool> {
        self.inner.delete_key(key)
    }
    fn num_keys(&self) -> Result<usize> {
        self.inner.num_keys()
    }
    fn append(&self, key: &str, value: &[u8]) -> Result<()> {
        self.inner.append(key, value)
    }
    fn multi_get_timeout(&self, keys: &[&str], timeout: Duration) -> Result<Vec<Vec<u8>>> {
        self.sliced(keys, timeout, |t| self.inner.multi_get_timeout(keys, t))
    }
    fn multi_set(&self, keys: &[&str], values: &[&[u8]]) -> Result<()> {
        self.inner.multi_set(keys, values)
    }
    fn list_keys(&self) -> Result<Vec<String>> {
        self.inner.list_keys()
    }
    fn queue_push(&self, key: &str, value: &[u8]) -> Result<()> {
        self.inner.queue_push(key, value)
    }
    fn queue_pop_timeout(&self, key: &str, timeout: Duration) -> Result<Vec<u8>> {
        self.inner.queue_pop_timeout(key, timeout)
    }
    fn queue_len(&self, key: &str) -> Result<usize> {
        self.inner.queue_len(key)
    }
    fn timeout(&self) -> Duration {
        self.inner.timeout()
    }
    fn set_timeout(&self, timeout: Duration) {
        self.inner.set_timeout(timeout)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;
    use crate::store::HashStore;

    #[test]
    fn a_wait_checks_between_slices_and_ends_with_the_checks_error() {
        let store = HashStore::new();
        let checks = AtomicUsize::new(0);
        let watched = WatchedStore::new(&store, |keys: &[&str]| {
            assert_eq!(keys, ["never"]);
            match checks.fetch_add(1, Ordering::Relaxed) {
                0 => Ok(()),
                _ => Err(Error::InvalidArgument("gone".into())),
            }
        });
        let started = Instant::now();
        let err = watched
            .wait_timeout(&["never"], Duration::from_secs(60))
            .unwrap_err();
        assert!(
            matches!(&err, Error::InvalidArgument(m) if m == "gone"),
            "{err}"
        );
        assert_eq!(checks.load(Ordering::Relaxed), 2);
        assert!(started.elapsed() < Duration::from_secs(5));
    }

    #[test]
    fn a_wait_that_runs_out_names_its_whole_timeout_and_a_barrier_waits_through_it() {
        let store = HashStore::new();
        let watched = WatchedStore::new(&store, |_: &[&str]| Ok(()));
        let timeout = Duration::from_millis(700);
        let err = watched.get_timeout("never", timeout).unwrap_err();
        assert!(
            matches!(&err, Error::StoreTimeout { timeout: t, .. } if *t == timeout),
            "{err}"
        );
        store.set("there", b"1").unwrap();
        assert_eq!(watched.get_timeout("there", timeout).unwrap(), b"1");
        let err = watched
            .barrier("b", 2, Some(Duration::from_millis(600)))
            .unwrap_err();
        assert!(
            matches!(err, Error::BarrierTimeout { arrived: 1, .. }),
            "{err}"
        );
    }
}
