//! [`HelperThreads`]: threads kept alive between collectives, so that an
//! algorithm that splits its work across cores does not pay for starting
//! threads on every call.
//!
//! Starting and joining a thread took 40 µs on the 32-core GPU host and
//! 113 µs on the 2-core dev VM (one `std::thread::scope` spawn and join,
//! measured with a throwaway probe); an arena all-reduce of 2 MiB over 2
//! ranks with 4 threads took about 340 µs in all, a quarter of it starting
//! its three helpers. A parked helper is woken in a few microseconds.
//!
//! [`HelperThreads::run`] runs lane `i` of `lanes` on helper `i - 1` and
//! lane 0 on the calling thread, all at once (lanes may wait for each
//! other), and returns once every lane has finished. Helpers are started
//! the first time a run needs them; after a run they spin briefly for the
//! next one, then park.

use std::any::Any;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::{JoinHandle, Thread};
use std::time::{Duration, Instant};

/// How long an idle helper keeps spinning for its next lane before it
/// parks: back-to-back collectives find it awake.
const SPIN_AFTER_RUN: Duration = Duration::from_micros(100);

/// The lane a helper runs next, with its lifetime erased (see `run`).
type Job = &'static (dyn Fn(usize) + Sync);

/// A lane posted to a helper: the job, the lane's number, and the counter
/// of the run's finished lanes it reports to.
type Post = (Job, usize, Arc<AtomicUsize>);

/// What the caller and one helper share.
struct Mailbox {
    /// The number of lanes posted to this helper so far; a helper runs a
    /// lane when this passes the count it has run.
    posted: AtomicU64,
    /// The lane posted: written before `posted` is raised, taken after.
    post: Mutex<Option<Post>>,
    shutdown: AtomicBool,
}

struct Helper {
    mailbox: Arc<Mailbox>,
    thread: Thread,
    handle: Option<JoinHandle<()>>,
}

/// A set of helper threads for one process group (see the module docs).
///
/// ```
/// use std::sync::atomic::{AtomicUsize, Ordering};
/// use tensorcomm::cpu::HelperThreads;
///
/// let helpers = HelperThreads::new("doc");
/// let sum = AtomicUsize::new(0);
/// let results = helpers.run(4, |lane| {
///     sum.fetch_add(lane, Ordering::Relaxed);
///     lane * 10
/// });
/// assert_eq!(sum.load(Ordering::Relaxed), 6);
/// let results: Vec<usize> = results.into_iter().map(|r| r.unwrap()).collect();
/// assert_eq!(results, [0, 10, 20, 30]);
/// ```
pub struct HelperThreads {
    name: String,
    /// Held for a whole run: one run at a time.
    helpers: Mutex<Vec<Helper>>,
}

impl std::fmt::Debug for HelperThreads {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let started = self.helpers.lock().map_or(0, |h| h.len());
        f.debug_struct("HelperThreads")
            .field("name", &self.name)
            .field("started", &started)
            .finish()
    }
}

/// Spins briefly, then yields: the lanes of one run finish within
/// microseconds of each other when they have cores of their own, and must
/// not starve each other when they do not.
fn pause(spins: &mut u32) {
    if *spins < 200 {
        std::hint::spin_loop();
        *spins += 1;
    } else {
        std::thread::yield_now();
    }
}

fn helper_loop(mailbox: Arc<Mailbox>) {
    let mut ran = 0u64;
    let mut idle_since = Instant::now();
    loop {
        if mailbox.shutdown.load(Ordering::Acquire) {
            return;
        }
        if mailbox.posted.load(Ordering::Acquire) == ran {
            if idle_since.elapsed() < SPIN_AFTER_RUN {
                std::hint::spin_loop();
            } else {
                // Woken by `unpark` when a lane or shutdown is posted; the
                // timeout only guards against a lost wake-up.
                std::thread::park_timeout(Duration::from_millis(100));
            }
            continue;
        }
        ran += 1;
        // Taken, not copied: no reference to a finished run's lane stays
        // behind in the mailbox.
        let post = mailbox
            .post
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        debug_assert!(post.is_some(), "a lane posted without its job");
        if let Some((job, lane, finished)) = post {
            // A panic is caught by the job wrapper `run` builds; nothing
            // else can unwind here.
            job(lane);
            finished.fetch_add(1, Ordering::Release);
        }
        idle_since = Instant::now();
    }
}

impl HelperThreads {
    /// No threads yet: they start on the first run that needs them, named
    /// `tensorcomm-{name}-{i}`.
    pub fn new(name: &str) -> HelperThreads {
        HelperThreads {
            name: name.to_string(),
            helpers: Mutex::new(Vec::new()),
        }
    }

    /// Runs `lane(i)` for every `i` in `0..lanes` at once, lane 0 on the
    /// calling thread and the others on helpers, and returns each lane's
    /// result (`Err` with the payload for a lane that panicked) once all
    /// have finished. Lanes may wait for each other: each has a thread of
    /// its own. Concurrent runs on one `HelperThreads` take turns; a lane
    /// must not call `run` on the same `HelperThreads` (it would wait for
    /// itself), only [`try_run`](Self::try_run), which declines.
    pub fn run<R: Send>(
        &self,
        lanes: usize,
        lane: impl Fn(usize) -> R + Sync,
    ) -> Vec<std::thread::Result<R>> {
        let helpers = self.helpers.lock().unwrap_or_else(PoisonError::into_inner);
        self.run_locked(helpers, lanes, lane)
    }

    /// [`run`](Self::run) if no other run is in progress, `None` (having
    /// run nothing) if one is: for callers that have a slower way that
    /// needs no helpers and must not wait for another caller's lanes.
    pub fn try_run<R: Send>(
        &self,
        lanes: usize,
        lane: impl Fn(usize) -> R + Sync,
    ) -> Option<Vec<std::thread::Result<R>>> {
        let helpers = match self.helpers.try_lock() {
            Ok(helpers) => helpers,
            Err(std::sync::TryLockError::Poisoned(p)) => p.into_inner(),
            Err(std::sync::TryLockError::WouldBlock) => return None,
        };
        Some(self.run_locked(helpers, lanes, lane))
    }

    fn run_locked<R: Send>(
        &self,
        mut helpers: std::sync::MutexGuard<'_, Vec<Helper>>,
        lanes: usize,
        lane: impl Fn(usize) -> R + Sync,
    ) -> Vec<std::thread::Result<R>> {
        let results: Vec<Mutex<Option<std::thread::Result<R>>>> =
            (0..lanes).map(|_| Mutex::new(None)).collect();
        let body = |i: usize| {
            let outcome = catch_unwind(AssertUnwindSafe(|| lane(i)));
            *results[i].lock().unwrap_or_else(PoisonError::into_inner) = Some(outcome);
        };
        if lanes > 1 {
            self.start(&mut helpers, lanes - 1);
            let finished = Arc::new(AtomicUsize::new(0));
            let job: &(dyn Fn(usize) + Sync) = &body;
            // SAFETY: the helpers call `job` only for the lanes posted
            // below, and this function does not return (nor unwind: `body`
            // catches panics) before all of them have reported through
            // `finished`, after which no helper touches `job` again. So the
            // borrow outlives every use despite its erased lifetime.
            let job: Job = unsafe { std::mem::transmute::<&(dyn Fn(usize) + Sync), Job>(job) };
            for (i, helper) in helpers.iter().take(lanes - 1).enumerate() {
                let mailbox = &helper.mailbox;
                *mailbox.post.lock().unwrap_or_else(PoisonError::into_inner) =
                    Some((job, i + 1, finished.clone()));
                mailbox.posted.fetch_add(1, Ordering::AcqRel);
                helper.thread.unpark();
            }
            body(0);
            let mut spins = 0;
            while finished.load(Ordering::Acquire) < lanes - 1 {
                pause(&mut spins);
            }
            drop(helpers);
        } else if lanes == 1 {
            body(0);
        }
        results
            .into_iter()
            .map(|r| {
                r.into_inner()
                    .unwrap_or_else(PoisonError::into_inner)
                    .unwrap_or_else(|| Err(Box::new("lane never ran") as Box<dyn Any + Send>))
            })
            .collect()
    }

    /// Makes sure at least `count` helpers are running.
    fn start(&self, helpers: &mut Vec<Helper>, count: usize) {
        while helpers.len() < count {
            let mailbox = Arc::new(Mailbox {
                posted: AtomicU64::new(0),
                post: Mutex::new(None),
                shutdown: AtomicBool::new(false),
            });
            let theirs = mailbox.clone();
            let name = format!("tensorcomm-{}-{}", self.name, helpers.len());
            match std::thread::Builder::new()
                .name(name)
                .spawn(move || helper_loop(theirs))
            {
                Ok(handle) => helpers.push(Helper {
                    mailbox,
                    thread: handle.thread().clone(),
                    handle: Some(handle),
                }),
                // Out of threads: run with what there is would deadlock
                // lanes that wait for each other, so fail loudly.
                Err(e) => panic!("tensorcomm: could not start a helper thread: {e}"),
            }
        }
    }
}

/// The first error among the outcomes of a run of fallible lanes, a lane
/// that panicked counting as an error of `op` ("{op}: a lane panicked").
pub(crate) fn first_error(
    outcomes: Vec<std::thread::Result<crate::Result<()>>>,
    op: &str,
) -> crate::Result<()> {
    let mut result = Ok(());
    for outcome in outcomes {
        result = result.and(outcome.unwrap_or_else(|_| {
            Err(crate::Error::InvalidArgument(format!(
                "{op}: a lane panicked"
            )))
        }));
    }
    result
}

impl Drop for HelperThreads {
    fn drop(&mut self) {
        let helpers = self
            .helpers
            .get_mut()
            .unwrap_or_else(PoisonError::into_inner);
        for helper in helpers.iter() {
            helper.mailbox.shutdown.store(true, Ordering::Release);
            helper.thread.unpark();
        }
        for helper in helpers.iter_mut() {
            if let Some(handle) = helper.handle.take() {
                let _ = handle.join();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Barrier;

    #[test]
    fn lanes_run_at_once_and_results_come_back_in_lane_order() {
        let helpers = HelperThreads::new("test");
        for lanes in [1, 3, 5, 2] {
            // Every lane waits for all the others: only concurrent lanes pass.
            let barrier = Barrier::new(lanes);
            let results = helpers.run(lanes, |i| {
                barrier.wait();
                i * i
            });
            let got: Vec<usize> = results.into_iter().map(|r| r.unwrap()).collect();
            assert_eq!(got, (0..lanes).map(|i| i * i).collect::<Vec<_>>());
        }
        assert_eq!(helpers.helpers.lock().unwrap().len(), 4);
    }

    #[test]
    fn a_panicking_lane_is_reported_and_the_helpers_stay_usable() {
        let helpers = HelperThreads::new("test");
        let results = helpers.run(3, |i| {
            if i == 2 {
                panic!("lane two fails");
            }
            i
        });
        assert!(results[0].is_ok() && results[1].is_ok());
        let payload = results[2].as_ref().unwrap_err();
        assert_eq!(payload.downcast_ref::<&str>(), Some(&"lane two fails"));
        let again: Vec<usize> = helpers
            .run(3, |i| i + 1)
            .into_iter()
            .map(|r| r.unwrap())
            .collect();
        assert_eq!(again, [1, 2, 3]);
    }

    #[test]
    fn try_run_declines_while_another_run_is_in_progress() {
        let helpers = HelperThreads::new("test");
        let inner = helpers.run(2, |i| {
            if i == 0 {
                // The outer run holds the helpers: the nested one declines.
                helpers.try_run(2, |j| j).is_none()
            } else {
                false
            }
        });
        assert!(inner[0].as_ref().unwrap());
        let got: Vec<usize> = helpers
            .try_run(2, |j| j * 2)
            .expect("no run in progress")
            .into_iter()
            .map(|r| r.unwrap())
            .collect();
        assert_eq!(got, [0, 2]);
    }

    #[test]
    fn parked_helpers_wake_for_the_next_run() {
        let helpers = HelperThreads::new("test");
        assert_eq!(helpers.run(2, |i| i).len(), 2);
        // Long enough for the helper to stop spinning and park.
        std::thread::sleep(SPIN_AFTER_RUN * 20);
        let started = Instant::now();
        let got: Vec<usize> = helpers
            .run(2, |i| i)
            .into_iter()
            .map(|r| r.unwrap())
            .collect();
        assert_eq!(got, [0, 1]);
        assert!(started.elapsed() < Duration::from_secs(5));
    }
}
