//! The key-value state every store implementation shares.
//!
//! `KvState` holds the keys and queues and implements the semantics of each
//! operation (counters as ASCII decimal, compare_set's rules for missing
//! keys). The stores differ only in where this state lives and how waiters
//! are woken: in a mutex ([`super::HashStore`]), in a server process
//! ([`super::TcpStore`]), or replayed from a log file ([`super::FileStore`]).

use std::collections::{HashMap, VecDeque};

use crate::{Error, Result};

/// Keys, values and queues, with the c10d semantics of each operation.
#[derive(Debug, Default)]
pub(crate) struct KvState {
    kv: HashMap<String, Vec<u8>>,
    queues: HashMap<String, VecDeque<Vec<u8>>>,
}

impl KvState {
    pub(crate) fn set(&mut self, key: &str, value: &[u8]) {
        self.kv.insert(key.to_string(), value.to_vec());
    }

    pub(crate) fn get(&self, key: &str) -> Option<&[u8]> {
        self.kv.get(key).map(Vec::as_slice)
    }

    /// Adds `delta` to the counter at `key` and returns the new value.
    pub(crate) fn add(&mut self, key: &str, delta: i64) -> Result<i64> {
        let current = match self.kv.get(key) {
            None => 0,
            Some(bytes) => parse_counter(key, bytes)?,
        };
        let next = checked_add(key, current, delta)?;
        self.kv
            .insert(key.to_string(), next.to_string().into_bytes());
        Ok(next)
    }

    /// c10d compare_set: see [`super::Store::compare_set`].
    pub(crate) fn compare_set(&mut self, key: &str, expected: &[u8], desired: &[u8]) -> Vec<u8> {
        match self.kv.get_mut(key) {
            None if expected.is_empty() => {
                self.kv.insert(key.to_string(), desired.to_vec());
                desired.to_vec()
            }
            None => expected.to_vec(),
            Some(current) if current.as_slice() == expected => {
                *current = desired.to_vec();
                desired.to_vec()
            }
            Some(current) => current.clone(),
        }
    }

    pub(crate) fn append(&mut self, key: &str, value: &[u8]) {
        self.kv
            .entry(key.to_string())
            .or_default()
            .extend_from_slice(value);
    }

    pub(crate) fn delete(&mut self, key: &str) -> bool {
        self.kv.remove(key).is_some()
    }

    /// The keys of `keys` that do not exist yet.
    pub(crate) fn missing<'k>(&self, keys: &[&'k str]) -> Vec<&'k str> {
        keys.iter()
            .copied()
            .filter(|k| !self.kv.contains_key(*k))
            .collect()
    }

    pub(crate) fn num_keys(&self) -> usize {
        self.kv.len()
    }

    pub(crate) fn list_keys(&self) -> Vec<String> {
        self.kv.keys().cloned().collect()
    }

    pub(crate) fn queue_push(&mut self, key: &str, value: &[u8]) {
        self.queues
            .entry(key.to_string())
            .or_default()
            .push_back(value.to_vec());
    }

    pub(crate) fn queue_pop(&mut self, key: &str) -> Option<Vec<u8>> {
        let queue = self.queues.get_mut(key)?;
        let value = queue.pop_front();
        if queue.is_empty() {
            self.queues.remove(key);
        }
        value
    }

    pub(crate) fn queue_front(&self, key: &str) -> Option<&[u8]> {
        self.queues.get(key)?.front().map(Vec::as_slice)
    }

    pub(crate) fn queue_len(&self, key: &str) -> usize {
        self.queues.get(key).map_or(0, VecDeque::len)
    }
}

/// Parses a counter's ASCII decimal value.
pub(crate) fn parse_counter(key: &str, bytes: &[u8]) -> Result<i64> {
    std::str::from_utf8(bytes)
        .ok()
        .and_then(|s| s.trim().parse::<i64>().ok())
        .ok_or_else(|| Error::NotACounter {
            key: key.to_string(),
            found: String::from_utf8_lossy(&bytes[..bytes.len().min(64)]).into_owned(),
        })
}

/// `current + delta`, or [`Error::CounterOverflow`] past the i64 range.
pub(crate) fn checked_add(key: &str, current: i64, delta: i64) -> Result<i64> {
    current
        .checked_add(delta)
        .ok_or_else(|| Error::CounterOverflow {
            key: key.to_string(),
            current,
            delta,
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_are_ascii_decimal() {
        let mut s = KvState::default();
        assert_eq!(s.add("c", 5).unwrap(), 5);
        assert_eq!(s.add("c", -7).unwrap(), -2);
        assert_eq!(s.get("c"), Some(&b"-2"[..]));
        s.set("text", b"hello");
        let err = s.add("text", 1).unwrap_err();
        assert!(err.to_string().contains("hello"), "{err}");
    }

    #[test]
    fn compare_set_follows_c10d_rules() {
        let mut s = KvState::default();
        // missing key + non-empty expected: nothing set, expected returned
        assert_eq!(s.compare_set("k", b"x", b"y"), b"x");
        assert_eq!(s.get("k"), None);
        // missing key + empty expected: set
        assert_eq!(s.compare_set("k", b"", b"v1"), b"v1");
        // match: replaced
        assert_eq!(s.compare_set("k", b"v1", b"v2"), b"v2");
        // mismatch: current returned, unchanged
        assert_eq!(s.compare_set("k", b"zz", b"v3"), b"v2");
        assert_eq!(s.get("k"), Some(&b"v2"[..]));
    }

    #[test]
    fn queues_are_fifo_and_not_keys() {
        let mut s = KvState::default();
        s.queue_push("q", b"a");
        s.queue_push("q", b"b");
        assert_eq!(s.queue_len("q"), 2);
        assert_eq!(s.num_keys(), 0);
        assert_eq!(s.queue_pop("q").unwrap(), b"a");
        assert_eq!(s.queue_pop("q").unwrap(), b"b");
        assert_eq!(s.queue_pop("q"), None);
        assert_eq!(s.queue_len("q"), 0);
    }
}
