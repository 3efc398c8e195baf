//! How long a TCP store client waits for a reply (and a new connection for
//! its handshake reply) before it declares the server hung
//! ([`crate::Error::StoreConnectionLost`]).
//!
//! A stopped server's kernel still accepts connections and takes requests,
//! so a hung server and a busy one look alike: only time tells them apart.
//! Ordinary calls are patient, since a server serving thousands of clients
//! may be slow: a blocking call waits its own timeout and
//! [`REPLY_GRACE`] more, any other the store's default timeout and the
//! grace. Inside a set-up ([`set_up_on_this_thread`]: rendezvous, a group's
//! set-up) the set-up's own timeout bounds every wait, since a store host
//! stopped mid-set-up must fail it within that timeout, naming the host,
//! not minutes later: a call answered at once waits until the set-up's
//! deadline, a blocking one its own timeout and half the set-up's timeout
//! (1 to 5 s), and never less than that half. A busy store is then only
//! called hung when the set-up would have timed out anyway. The helper
//! threads of a group's failure path, which their callers give up on after
//! a few seconds (a failed set-up's probe of the store: a quarter of a
//! second), must not outlive that by minutes when the store host
//! stopped: inside [`background_on_this_thread`] every call waits a short
//! grace beyond its own timeout. Either scope also bounds how long a new connection is
//! retried. The scopes are per thread so that they reach the store calls
//! of every stage without changing the store others share.

use std::cell::Cell;
use std::marker::PhantomData;
use std::time::{Duration, Instant};

/// What an ordinary call waits beyond its timeout.
pub(crate) const REPLY_GRACE: Duration = Duration::from_secs(5);
/// The shortest grace inside a set-up.
pub(crate) const MIN_SET_UP_GRACE: Duration = Duration::from_secs(1);
/// The longest grace inside a set-up.
pub(crate) const MAX_SET_UP_GRACE: Duration = Duration::from_secs(5);
/// The longest a new connection waits for its handshake reply.
const HANDSHAKE_PATIENCE: Duration = Duration::from_secs(30);

/// The set-up (or background work) the calling thread is in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct SetUp {
    /// None: no deadline (a timeout too long to represent).
    deadline: Option<Instant>,
    grace: Duration,
}

impl SetUp {
    /// What a call answered at once may wait: until the deadline, and at
    /// least the grace.
    fn immediate(&self) -> Option<Duration> {
        self.deadline.map(|d| time_left(d).max(self.grace))
    }
}

thread_local! {
    static ON_THIS_THREAD: Cell<Option<SetUp>> = const { Cell::new(None) };
}

/// Half of `timeout`, within [`MIN_SET_UP_GRACE`] and [`MAX_SET_UP_GRACE`].
pub(crate) fn for_timeout(timeout: Duration) -> Duration {
    (timeout / 2).clamp(MIN_SET_UP_GRACE, MAX_SET_UP_GRACE)
}

fn time_left(deadline: Instant) -> Duration {
    deadline.saturating_duration_since(Instant::now())
}

/// The sooner of two deadlines, `None` being none.
fn sooner(a: Option<Instant>, b: Option<Instant>) -> Option<Instant> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// What a call answered at once may wait within this thread's scope, if
/// it is in one that bounds it.
fn scope_bound() -> Option<Duration> {
    ON_THIS_THREAD.with(|s| s.get()).and_then(|s| s.immediate())
}

/// How long a call on this thread waits for its reply: `wait` is the
/// request's own timeout for a blocking request, `None` for one the server
/// answers at once, `store_timeout` the store's default timeout.
pub(super) fn reply_patience(wait: Option<Duration>, store_timeout: Duration) -> Duration {
    let ordinary = wait.unwrap_or(store_timeout).saturating_add(REPLY_GRACE);
    let Some(set_up) = ON_THIS_THREAD.with(|s| s.get()) else {
        return ordinary;
    };
    let bounded = match wait {
        Some(wait) => Some(wait.saturating_add(set_up.grace)),
        None => set_up.immediate(),
    };
    bounded.map_or(ordinary, |b| b.min(ordinary))
}

/// How long a new connection made on this thread waits for the server's
/// handshake reply when `dial_left` is left of its dial's `dial_timeout`:
/// what is left and half the dial's timeout (1 to 5 s) more, at most 30 s,
/// and within a set-up at most what is left of it (at least its grace).
pub(super) fn handshake_patience(dial_left: Duration, dial_timeout: Duration) -> Duration {
    let ordinary = dial_left
        .saturating_add(for_timeout(dial_timeout))
        .min(HANDSHAKE_PATIENCE);
    scope_bound().map_or(ordinary, |bound| ordinary.min(bound))
}

/// Until when a new connection made on this thread is retried, given its
/// dial's own deadline `own` (None: none): within a scope, no later than
/// the scope's deadline or its grace from now, whichever is later.
pub(super) fn dial_deadline(own: Option<Instant>) -> Option<Instant> {
    match scope_bound() {
        Some(bound) => sooner(own, Instant::now().checked_add(bound)),
        None => own,
    }
}

/// Until the guard drops, TCP store calls on this thread are bounded by a
/// set-up of `timeout` starting now (within an enclosing one, by the
/// sooner deadline and the shorter grace).
pub(crate) fn set_up_on_this_thread(timeout: Duration) -> SetUpScope {
    enter(SetUp {
        deadline: Instant::now().checked_add(timeout),
        grace: for_timeout(timeout),
    })
}

/// Until the guard drops, TCP store calls on this thread wait at most
/// `grace` beyond their own timeout (a call answered at once: `grace`),
/// and a new connection is retried for at most `grace`: for a thread that
/// calls the store for diagnostics only and must not be held by a stopped
/// store host.
pub(crate) fn background_on_this_thread(grace: Duration) -> SetUpScope {
    // A deadline already reached: every call gets the grace alone.
    enter(SetUp {
        deadline: Some(Instant::now()),
        grace,
    })
}

fn enter(ours: SetUp) -> SetUpScope {
    let previous = ON_THIS_THREAD.with(|s| s.get());
    let scope = match previous {
        Some(outer) => SetUp {
            deadline: sooner(ours.deadline, outer.deadline),
            grace: ours.grace.min(outer.grace),
        },
        None => ours,
    };
    ON_THIS_THREAD.with(|s| s.set(Some(scope)));
    SetUpScope {
        previous,
        _this_thread: PhantomData,
    }
}

/// Ends a [`set_up_on_this_thread`] or [`background_on_this_thread`]
/// scope when dropped, on the thread that entered it.
pub(crate) struct SetUpScope {
    previous: Option<SetUp>,
    /// Not `Send`: the scope is this thread's.
    _this_thread: PhantomData<*const ()>,
}

impl Drop for SetUpScope {
    fn drop(&mut self) {
        ON_THIS_THREAD.with(|s| s.set(self.previous));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MINUTES: Duration = Duration::from_secs(300);

    fn close(found: Duration, expected: Duration) -> bool {
        found <= expected && expected - found < Duration::from_millis(200)
    }

    #[test]
    fn ordinary_calls_wait_their_timeout_and_the_grace() {
        let get = Some(Duration::from_millis(500));
        assert_eq!(reply_patience(get, MINUTES), Duration::from_millis(5500));
        assert_eq!(reply_patience(None, MINUTES), MINUTES + REPLY_GRACE);
        let secs = |s| Duration::from_secs(s);
        assert_eq!(handshake_patience(secs(2), secs(2)), secs(3));
        assert_eq!(handshake_patience(Duration::ZERO, secs(60)), secs(5));
        assert_eq!(handshake_patience(MINUTES, MINUTES), HANDSHAKE_PATIENCE);
    }

    #[test]
    fn a_set_up_bounds_the_calls_on_its_thread_by_its_deadline() {
        let _set_up = set_up_on_this_thread(Duration::from_secs(4));
        // Answered at once: until the deadline.
        assert!(close(reply_patience(None, MINUTES), Duration::from_secs(4)));
        // Blocking: its own timeout and half the set-up's.
        let get = Some(Duration::from_millis(500));
        assert_eq!(reply_patience(get, MINUTES), Duration::from_millis(2500));
        assert!(close(
            handshake_patience(MINUTES, MINUTES),
            Duration::from_secs(4)
        ));
        // Other threads are not in it.
        std::thread::spawn(|| assert_eq!(reply_patience(None, MINUTES), MINUTES + REPLY_GRACE))
            .join()
            .unwrap();
        {
            // Nested: the sooner deadline, the shorter grace, either way.
            let _inner = set_up_on_this_thread(MINUTES);
            assert!(close(reply_patience(None, MINUTES), Duration::from_secs(4)));
            let _innermost = set_up_on_this_thread(Duration::ZERO);
            assert_eq!(reply_patience(None, MINUTES), MIN_SET_UP_GRACE);
            assert_eq!(reply_patience(get, MINUTES), Duration::from_millis(1500));
        }
        assert!(close(reply_patience(None, MINUTES), Duration::from_secs(4)));
    }

    #[test]
    fn a_set_up_never_waits_longer_than_an_ordinary_call() {
        let _set_up = set_up_on_this_thread(MINUTES);
        let ten = Duration::from_secs(10);
        assert_eq!(reply_patience(None, ten), ten + REPLY_GRACE);
    }

    #[test]
    fn a_background_thread_waits_its_grace_beyond_each_call_and_dials_no_longer() {
        let grace = Duration::from_secs(2);
        let _background = background_on_this_thread(grace);
        assert_eq!(reply_patience(None, MINUTES), grace);
        let get = Some(Duration::from_millis(500));
        assert_eq!(reply_patience(get, MINUTES), Duration::from_millis(2500));
        assert_eq!(handshake_patience(MINUTES, MINUTES), grace);
        let far = Instant::now() + MINUTES;
        let dial = dial_deadline(Some(far)).expect("bounded");
        assert!(close(time_left(dial), grace));
        assert!(close(
            time_left(dial_deadline(None).expect("bounded")),
            grace
        ));
        // Later, still the grace from the call's start.
        std::thread::sleep(Duration::from_millis(20));
        assert_eq!(reply_patience(None, MINUTES), grace);
    }

    #[test]
    fn a_set_up_too_long_to_represent_bounds_nothing() {
        let _set_up = set_up_on_this_thread(Duration::MAX);
        assert_eq!(reply_patience(None, MINUTES), MINUTES + REPLY_GRACE);
        assert_eq!(dial_deadline(None), None);
        let far = Instant::now() + MINUTES;
        assert_eq!(dial_deadline(Some(far)), Some(far));
    }

    #[test]
    fn past_its_deadline_a_set_up_still_waits_its_grace() {
        let _set_up = set_up_on_this_thread(Duration::from_millis(10));
        std::thread::sleep(Duration::from_millis(20));
        assert_eq!(reply_patience(None, MINUTES), MIN_SET_UP_GRACE);
        assert_eq!(handshake_patience(MINUTES, MINUTES), MIN_SET_UP_GRACE);
    }
}
