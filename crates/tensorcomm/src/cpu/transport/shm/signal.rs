//! [`Signal`]: a wake-up word in shared memory, so that a thread waiting
//! a long time for a peer in another process sleeps in the kernel
//! (`futex`) instead of polling, and wakes as soon as the peer acts.
//!
//! The waiter announces itself (`sleepers`), re-checks its condition, and
//! sleeps on `seq` only if the condition still does not hold; the peer
//! makes the condition true, then looks at `sleepers` and, when someone
//! sleeps, bumps `seq` and wakes them. A sequentially consistent fence on
//! each side between its write and its read means at least one of the two
//! sees the other: either the waiter sees the condition and does not
//! sleep, or the peer sees the sleeper and wakes it (a bump that lands
//! before the sleep makes the kernel return at once). Sleeps are bounded
//! by a timeout, so a peer that dies without a word is still noticed.
//!
//! Besides `segment.rs`, the only file here that calls the OS.

use std::sync::atomic::{fence, AtomicU32, Ordering};
use std::time::Duration;

/// A wake-up word shared by the processes of a link (see the module docs).
#[repr(C)]
#[derive(Default)]
pub(crate) struct Signal {
    /// Threads about to sleep or sleeping on `seq`.
    sleepers: AtomicU32,
    /// Bumped by every wake-up; the futex word.
    seq: AtomicU32,
}

impl Signal {
    /// Sleeps up to `timeout` unless `ready()` holds once this thread has
    /// announced itself; returns early when woken (or spuriously). The
    /// caller checks its condition again afterwards.
    pub fn sleep_unless(&self, ready: impl FnOnce() -> bool, timeout: Duration) {
        let seen = self.seq.load(Ordering::Acquire);
        self.sleepers.fetch_add(1, Ordering::SeqCst);
        fence(Ordering::SeqCst);
        if !ready() {
            futex_wait(&self.seq, seen, timeout);
        }
        self.sleepers.fetch_sub(1, Ordering::Release);
    }

    /// Threads about to sleep or sleeping on this signal now.
    #[cfg(test)]
    pub fn sleepers(&self) -> u32 {
        self.sleepers.load(Ordering::SeqCst)
    }

    /// Wakes every thread sleeping on this signal, if any; call it after
    /// making the condition they wait for true.
    pub fn notify(&self) {
        fence(Ordering::SeqCst);
        if self.sleepers.load(Ordering::Relaxed) != 0 {
            self.seq.fetch_add(1, Ordering::Release);
            futex_wake(&self.seq);
        }
    }
}

/// Sleeps while `word` holds `expected`, up to `timeout`.
fn futex_wait(word: &AtomicU32, expected: u32, timeout: Duration) {
    let ts = libc::timespec {
        tv_sec: timeout.as_secs().min(i64::MAX as u64) as libc::time_t,
        tv_nsec: timeout.subsec_nanos() as libc::c_long,
    };
    // SAFETY: `word` is a valid, aligned u32 for the call's duration; a
    // shared (not process-private) futex, because the word lives in memory
    // mapped by several processes. Every outcome (woken, timed out,
    // interrupted, value already changed) is fine: the caller re-checks.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAIT,
            expected,
            &ts as *const libc::timespec,
        );
    }
}

/// Wakes every thread sleeping on `word`.
fn futex_wake(word: &AtomicU32) {
    // SAFETY: `word` is a valid, aligned u32; waking has no other effect.
    unsafe {
        libc::syscall(libc::SYS_futex, word.as_ptr(), libc::FUTEX_WAKE, i32::MAX);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicBool;
    use std::time::Instant;

    #[test]
    fn a_sleeper_wakes_when_notified_not_at_its_timeout() {
        let signal = Signal::default();
        let ready = AtomicBool::new(false);
        let long = Duration::from_secs(20);
        let waited = std::thread::scope(|s| {
            let sleeper = s.spawn(|| {
                let started = Instant::now();
                while !ready.load(Ordering::Acquire) {
                    signal.sleep_unless(|| ready.load(Ordering::Acquire), long);
                }
                started.elapsed()
            });
            std::thread::sleep(Duration::from_millis(50));
            ready.store(true, Ordering::Release);
            signal.notify();
            sleeper.join().unwrap()
        });
        assert!(
            waited < Duration::from_secs(10),
            "woke only after {waited:?}"
        );
        assert_eq!(signal.sleepers.load(Ordering::Relaxed), 0);
    }

    #[test]
    fn no_wake_up_is_lost_over_many_rounds() {
        // Ping-pong through two signals: a lost wake-up would stall a
        // round until the 20 s timeout.
        let (ping, pong) = (Signal::default(), Signal::default());
        let turn = AtomicU32::new(0);
        let rounds = 2000;
        let long = Duration::from_secs(20);
        let started = Instant::now();
        std::thread::scope(|s| {
            s.spawn(|| {
                for r in 0..rounds {
                    while turn.load(Ordering::Acquire) != 2 * r + 1 {
                        ping.sleep_unless(|| turn.load(Ordering::Acquire) == 2 * r + 1, long);
                    }
                    turn.store(2 * r + 2, Ordering::Release);
                    pong.notify();
                }
            });
            for r in 0..rounds {
                turn.store(2 * r + 1, Ordering::Release);
                ping.notify();
                while turn.load(Ordering::Acquire) != 2 * r + 2 {
                    pong.sleep_unless(|| turn.load(Ordering::Acquire) == 2 * r + 2, long);
                }
            }
        });
        assert!(
            started.elapsed() < Duration::from_secs(15),
            "{:?}",
            started.elapsed()
        );
    }

    #[test]
    fn a_timeout_bounds_the_sleep() {
        let signal = Signal::default();
        let started = Instant::now();
        signal.sleep_unless(|| false, Duration::from_millis(30));
        assert!(started.elapsed() >= Duration::from_millis(20));
    }
}
