//! `PrefixStore`: a namespace (`prefix/key`) inside another store.

use std::sync::Arc;
use std::time::Duration;

use super::Store;
use crate::Result;

/// Puts every key of its user under `prefix/` in an underlying store.
///
/// Sub-groups and separate jobs share one server this way without their
/// keys colliding. `num_keys` and `list_keys` see only this namespace.
///
/// ```
/// use std::sync::Arc;
/// use tensorcomm::store::{HashStore, PrefixStore, Store};
///
/// let base = Arc::new(HashStore::new());
/// let a = PrefixStore::new("a", base.clone());
/// let b = PrefixStore::new("b", base.clone());
/// a.set("x", b"1")?;
/// b.set("x", b"2")?;
/// assert_eq!(a.get("x")?, b"1");
/// assert_eq!(a.list_keys()?, vec!["x".to_string()]);
/// assert_eq!(base.num_keys()?, 2);
/// # Ok::<(), tensorcomm::Error>(())
/// ```
pub struct PrefixStore {
    prefix: String,
    inner: Arc<dyn Store>,
}

impl PrefixStore {
    /// Namespaces `inner` under `prefix`.
    pub fn new(prefix: impl Into<String>, inner: Arc<dyn Store>) -> Self {
        PrefixStore {
            prefix: prefix.into(),
            inner,
        }
    }

    /// The store this one writes into.
    pub fn underlying(&self) -> &Arc<dyn Store> {
        &self.inner
    }

    fn key(&self, key: &str) -> String {
        format!("{}/{}", self.prefix, key)
    }

    fn keys(&self, keys: &[&str]) -> Vec<String> {
        keys.iter().map(|k| self.key(k)).collect()
    }

    fn strip<'k>(&self, full: &'k str) -> Option<&'k str> {
        full.strip_prefix(self.prefix.as_str())?.strip_prefix('/')
    }
}

/// Turns owned keys back into the `&[&str]` the trait takes.
fn refs(keys: &[String]) -> Vec<&str> {
    keys.iter().map(String::as_str).collect()
}

impl Store for PrefixStore {
    fn set(&self, key: &str, value: &[u8]) -> Result<()> {
        self.inner.set(&self.key(key), value)
    }

    fn get_timeout(&self, key: &str, timeout: Duration) -> Result<Vec<u8>> {
        self.inner
            .get_timeout(&self.key(key), timeout)
            .map_err(|e| self.unprefix_error(e))
    }

    fn add(&self, key: &str, delta: i64) -> Result<i64> {
        self.inner.add(&self.key(key), delta)
    }

    fn compare_set(&self, key: &str, expected: &[u8], desired: &[u8]) -> Result<Vec<u8>> {
        self.inner.compare_set(&self.key(key), expected, desired)
    }

    fn wait_timeout(&self, keys: &[&str], timeout: Duration) -> Result<()> {
        self.inner
            .wait_timeout(&refs(&self.keys(keys)), timeout)
            .map_err(|e| self.unprefix_error(e))
    }

    fn check(&self, keys: &[&str]) -> Result<bool> {
        self.inner.check(&refs(&self.keys(keys)))
    }

    fn delete_key(&self, key: &str) -> Result<bool> {
        self.inner.delete_key(&self.key(key))
    }

    fn num_keys(&self) -> Result<usize> {
        Ok(self.list_keys()?.len())
    }

    fn append(&self, key: &str, value: &[u8]) -> Result<()> {
        self.inner.append(&self.key(key), value)
    }

    fn multi_get_timeout(&self, keys: &[&str], timeout: Duration) -> Result<Vec<Vec<u8>>> {
        self.inner
            .multi_get_timeout(&refs(&self.keys(keys)), timeout)
            .map_err(|e| self.unprefix_error(e))
    }

    fn multi_set(&self, keys: &[&str], values: &[&[u8]]) -> Result<()> {
        self.inner.multi_set(&refs(&self.keys(keys)), values)
    }

    fn list_keys(&self) -> Result<Vec<String>> {
        Ok(self
            .inner
            .list_keys()?
            .iter()
            .filter_map(|k| self.strip(k).map(str::to_string))
            .collect())
    }

    fn queue_push(&self, key: &str, value: &[u8]) -> Result<()> {
        self.inner.queue_push(&self.key(key), value)
    }

    fn queue_pop_timeout(&self, key: &str, timeout: Duration) -> Result<Vec<u8>> {
        self.inner
            .queue_pop_timeout(&self.key(key), timeout)
            .map_err(|e| self.unprefix_error(e))
    }

    fn queue_len(&self, key: &str) -> Result<usize> {
        self.inner.queue_len(&self.key(key))
    }

    fn timeout(&self) -> Duration {
        self.inner.timeout()
    }

    fn set_timeout(&self, timeout: Duration) {
        self.inner.set_timeout(timeout)
    }
}

impl PrefixStore {
    /// Timeouts name the keys as this store's user wrote them.
    fn unprefix_error(&self, err: crate::Error) -> crate::Error {
        match err {
            crate::Error::StoreTimeout { keys, timeout } => crate::Error::StoreTimeout {
                keys: keys
                    .iter()
                    .map(|k| self.strip(k).unwrap_or(k).to_string())
                    .collect(),
                timeout,
            },
            other => other,
        }
    }
}
