//! What the library does while its process exits, in a fixed order: first
//! every CPU group still alive closes its connections, so that peers
//! waiting on this rank fail at once; then every store this process hosts
//! keeps serving the other processes' clients, up to its linger, so that
//! they can still read why the job failed.
//!
//! A process that ends with `std::process::exit`, or returns from `main`
//! while statics or other threads still hold a group or a store, runs no
//! destructors for them. One `atexit` handler, installed by the first
//! [`on_exit`], runs the registered hooks stage by stage (`atexit` alone
//! would run them in the reverse order of their registration, which
//! depends on what the program created first).
//!
//! While the hooks run, [`exiting`] is true: a collective that fails
//! because its own process closed its connections posts no failure report
//! (it would blame a peer through the store the process keeps serving) and
//! dumps no flight record.
//!
//! Libraries that register exit handlers of their own after this one (NCCL
//! and its CUDA clean-up) would run theirs first, and this process's
//! threads would then use them torn down while a store lingers: such a
//! library's loader calls [`run_before_handlers_registered_so_far`], which
//! registers the handler again (it runs once, at its latest registration,
//! that is first).
//!
//! Hooks run on the exiting thread while the other threads still run:
//! each takes locks only with [`lock_within`], logs nothing through
//! `tracing` (the exiting thread's thread-locals are gone), and returns at
//! once in a child that `fork()` made without `exec` (it inherits the
//! handler and copies of the registries, not the threads or the objects
//! they stand for); a panic in one is caught.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, MutexGuard, Once, OnceLock, TryLockError};
use std::time::{Duration, Instant};

/// When a hook runs, in order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ExitStage {
    /// The process's groups close their connections.
    CloseConnections = 0,
    /// Hosting stores serve other processes until they leave.
    ServeStores = 1,
}

const STAGES: usize = 2;

static HOOKS: [OnceLock<fn()>; STAGES] = [OnceLock::new(), OnceLock::new()];
static INSTALL: Once = Once::new();
/// Set when the handler first runs: it runs once, however often it was
/// registered.
static EXITING: AtomicBool = AtomicBool::new(false);

/// Runs `hook` in `stage` when the process exits. One hook per stage: a
/// later registration for a stage that has one is ignored (each stage's
/// owner registers the same function every time).
pub(crate) fn on_exit(stage: ExitStage, hook: fn()) {
    let _ = HOOKS[stage as usize].set(hook);
    INSTALL.call_once(register_handler);
}

/// Registers the exit handler (again): it then runs before every exit
/// handler registered so far, e.g. a library's clean-up. Call it where
/// that library has set itself up, with a `site` of that call's own: each
/// site registers once (the first time it is reached with the handler
/// installed), so a site reached after another that registered more
/// handlers still puts these hooks before them.
#[cfg(feature = "cuda")]
pub(crate) fn run_before_handlers_registered_so_far(site: &'static Once) {
    if INSTALL.is_completed() {
        site.call_once(register_handler);
    }
}

fn register_handler() {
    // SAFETY: `run_hooks` is a plain `extern "C" fn()` with no captured
    // state, compiled into this program for its whole life, and it never
    // unwinds into libc (it catches panics).
    let rc = unsafe { libc::atexit(run_hooks) };
    if rc != 0 {
        tracing::warn!(
            "could not register the exit-time hooks (atexit returned {rc}): a process \
             that exits without dropping its groups and hosting stores stops them at once"
        );
    }
}

/// True once the process has begun to exit and the hooks run.
pub(crate) fn exiting() -> bool {
    EXITING.load(Ordering::Acquire)
}

extern "C" fn run_hooks() {
    if EXITING.swap(true, Ordering::AcqRel) {
        return;
    }
    for hook in HOOKS.iter().filter_map(OnceLock::get) {
        // Unwinding out of an `extern "C"` function aborts: catch it first.
        let _ = std::panic::catch_unwind(hook);
    }
}

/// `lock`, tried for at most `patience` (a poisoned lock is taken as it
/// is); `None` if it stayed held.
pub(crate) fn lock_within<T>(lock: &Mutex<T>, patience: Duration) -> Option<MutexGuard<'_, T>> {
    let deadline = Instant::now() + patience;
    loop {
        match lock.try_lock() {
            Ok(guard) => return Some(guard),
            Err(TryLockError::Poisoned(p)) => return Some(p.into_inner()),
            Err(TryLockError::WouldBlock) if Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(1));
            }
            Err(TryLockError::WouldBlock) => return None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lock_held_elsewhere_is_given_up_on() {
        let lock = Mutex::new(());
        let _held = lock.lock().unwrap();
        std::thread::scope(|s| {
            let waited = s.spawn(|| lock_within(&lock, Duration::from_millis(20)).is_none());
            assert!(waited.join().unwrap());
        });
    }
}
