//! Each rank's progress in a device group: the last collective it started
//! and completed, which its watchdog publishes through the store so that a
//! timed-out rank can say where every rank was.

use crate::store::{read_if_present, Store};
use crate::Result;

/// This rank's last started and last completed sequence numbers.
#[derive(Clone, Copy, Default, PartialEq, Eq, Debug)]
pub(crate) struct Progress {
    pub(crate) started: Option<u64>,
    pub(crate) completed: Option<u64>,
}

impl Progress {
    pub(crate) fn encode(self) -> String {
        let n = |v: Option<u64>| v.map_or("-".into(), |v| v.to_string());
        format!("{} {}", n(self.started), n(self.completed))
    }

    pub(crate) fn decode(bytes: &[u8]) -> Option<Progress> {
        let text = std::str::from_utf8(bytes).ok()?;
        let mut parts = text.split(' ');
        let mut field = || -> Option<Option<u64>> {
            match parts.next()? {
                "-" => Some(None),
                v => v.parse().ok().map(Some),
            }
        };
        Some(Progress {
            started: field()?,
            completed: field()?,
        })
    }
}

#[derive(Clone)]
pub(crate) struct ProgressKeys {
    pub(crate) prefix: String,
    pub(crate) rank: usize,
    pub(crate) size: usize,
}

impl ProgressKeys {
    pub(crate) fn key(&self, rank: usize) -> String {
        format!("{}/{rank}", self.prefix)
    }
}

/// Where the ranks of the group under `key_prefix` publish their progress.
pub(crate) fn progress_prefix(key_prefix: &str) -> String {
    format!("{key_prefix}/progress")
}

/// Rank `rank`'s last started collective as its watchdog published it in
/// the group under `key_prefix` (`None`: nothing published, or a group
/// without a watchdog).
pub(crate) fn published_start(
    store: &dyn Store,
    key_prefix: &str,
    rank: usize,
) -> Result<Option<u64>> {
    let key = format!("{}/{rank}", progress_prefix(key_prefix));
    Ok(read_if_present(store, &key)?
        .and_then(|v| Progress::decode(&v))
        .and_then(|p| p.started))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn progress_round_trips_through_its_store_value() {
        for p in [
            Progress::default(),
            Progress {
                started: Some(7),
                completed: None,
            },
            Progress {
                started: Some(9),
                completed: Some(8),
            },
        ] {
            assert_eq!(Progress::decode(p.encode().as_bytes()), Some(p));
        }
        assert_eq!(Progress::decode(b"x 1"), None);
    }
}
