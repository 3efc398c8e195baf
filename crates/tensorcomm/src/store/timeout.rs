//! A store's default timeout, changeable through a shared reference.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// A timeout that can be read and replaced from several threads.
///
/// ```
/// use std::time::Duration;
/// use tensorcomm::store::DefaultTimeout;
///
/// let t = DefaultTimeout::new(Duration::from_secs(300));
/// t.set(Duration::from_millis(250));
/// assert_eq!(t.get(), Duration::from_millis(250));
/// ```
#[derive(Debug)]
pub struct DefaultTimeout(AtomicU64);

impl DefaultTimeout {
    /// A timeout starting at `timeout` (saturating at about 584 years).
    pub fn new(timeout: Duration) -> Self {
        DefaultTimeout(AtomicU64::new(as_nanos(timeout)))
    }

    /// The current value.
    pub fn get(&self) -> Duration {
        Duration::from_nanos(self.0.load(Ordering::Relaxed))
    }

    /// Replaces the value.
    pub fn set(&self, timeout: Duration) {
        self.0.store(as_nanos(timeout), Ordering::Relaxed);
    }
}

impl Default for DefaultTimeout {
    fn default() -> Self {
        DefaultTimeout::new(super::DEFAULT_TIMEOUT)
    }
}

fn as_nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}
