//! How long a TCP store client waits for a reply beyond the request's own
//! timeout (none for a request the server answers at once) before it
//! declares the server hung ([`crate::Error::StoreConnectionLost`]): half
//! a timeout, within [`MIN_REPLY_GRACE`] and [`MAX_REPLY_GRACE`].
//!
//! The timeout is the store's default one, unless the calling thread is
//! inside [`shorter_on_this_thread`]: a group's set-up waits with the
//! group's timeout (seconds, say) on a store whose default timeout is
//! minutes, and a store host stopped mid-set-up must fail it within the
//! group's timeout, naming the host, not after the store's grace. The
//! scope is per thread so that it reaches the store calls of the set-up's
//! every stage without changing the store others share.

use std::cell::Cell;
use std::time::Duration;

/// The shortest grace: a busy server's reply may be late by this much.
pub(crate) const MIN_REPLY_GRACE: Duration = Duration::from_secs(1);
/// The longest grace.
pub(crate) const MAX_REPLY_GRACE: Duration = Duration::from_secs(5);

thread_local! {
    static ON_THIS_THREAD: Cell<Option<Duration>> = const { Cell::new(None) };
}

/// The grace for waits bounded by `timeout`.
pub(crate) fn for_timeout(timeout: Duration) -> Duration {
    (timeout / 2).clamp(MIN_REPLY_GRACE, MAX_REPLY_GRACE)
}

/// The grace of a call on this thread to a store whose default timeout is
/// `store_timeout`.
pub(super) fn current(store_timeout: Duration) -> Duration {
    let store = for_timeout(store_timeout);
    ON_THIS_THREAD
        .with(|g| g.get())
        .map_or(store, |g| g.min(store))
}

/// Until the guard drops, TCP store calls on this thread take the grace of
/// `timeout` where it is shorter than their store's.
pub(crate) fn shorter_on_this_thread(timeout: Duration) -> ShorterGrace {
    let grace = for_timeout(timeout);
    let previous = ON_THIS_THREAD.with(|g| g.replace(Some(grace)));
    ShorterGrace { previous }
}

/// Ends a [`shorter_on_this_thread`] scope when dropped.
pub(crate) struct ShorterGrace {
    previous: Option<Duration>,
}

impl Drop for ShorterGrace {
    fn drop(&mut self) {
        ON_THIS_THREAD.with(|g| g.set(self.previous));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_grace_is_half_a_timeout_within_bounds_and_scoped_to_the_thread() {
        let minutes = Duration::from_secs(300);
        assert_eq!(for_timeout(Duration::from_millis(50)), MIN_REPLY_GRACE);
        assert_eq!(for_timeout(Duration::from_secs(4)), Duration::from_secs(2));
        assert_eq!(for_timeout(minutes), MAX_REPLY_GRACE);
        assert_eq!(current(minutes), MAX_REPLY_GRACE);
        {
            let _short = shorter_on_this_thread(Duration::from_secs(3));
            assert_eq!(current(minutes), Duration::from_millis(1500));
            // Never longer than the store's own.
            assert_eq!(current(Duration::from_secs(2)), MIN_REPLY_GRACE);
            std::thread::spawn(move || assert_eq!(current(minutes), MAX_REPLY_GRACE))
                .join()
                .unwrap();
            {
                let _shorter = shorter_on_this_thread(Duration::ZERO);
                assert_eq!(current(minutes), MIN_REPLY_GRACE);
            }
            assert_eq!(current(minutes), Duration::from_millis(1500));
        }
        assert_eq!(current(minutes), MAX_REPLY_GRACE);
    }
}
