//! Collectives their caller runs: a caller that waits for a collective at
//! once (a synchronous `torch.distributed` call) need not queue it to the
//! group's thread at all. Queuing wakes that thread when it sleeps (a futex
//! syscall and a context switch, then a lock it contends for with the
//! caller, who runs the collective anyway when it waits first), which costs
//! more than a small collective on a loaded host; where it polls instead
//! (`GroupBackend::idle_spin`), it takes the collective and the caller
//! waits for the hand-off back.

use std::cell::RefCell;
use std::sync::Arc;

use super::turn::QueuedJob;

/// Where this thread stands with [`run_here`].
enum Kept {
    /// Not inside it.
    Outside,
    /// Inside it, before its first collective.
    Armed,
    /// Holding its first collective.
    Holding(Arc<QueuedJob>),
    /// It submitted a second collective (queued); the first, if any, is
    /// still run here unless its group queued it meanwhile.
    Spent(Option<Arc<QueuedJob>>),
}

thread_local! {
    static KEPT: RefCell<Kept> = const { RefCell::new(Kept::Outside) };
}

/// Calls `start`, keeping the first collective of a host group that it
/// submits on this thread off the group's thread: that collective runs on
/// this thread, when `start` waits on its [`Work`](super::Work) (the usual
/// use: start it and wait), or else here, after `start` returns. It still
/// runs after every earlier collective of its group, in call order. Any
/// later collective of that group (a second one from `start`, or one from
/// another thread) queues it to the group's thread first, so waiting on
/// the later one first cannot deadlock; a collective of another group
/// leaves it kept. Inside `start`, only [`Work::wait`](super::Work::wait)
/// (and its futures' waits) run the kept collective: polling it with
/// `is_completed`, `wait_timeout` or `result` sees it unfinished until a
/// later collective of its group queues it. A device group's collectives
/// are queued on the caller's thread anyway; they are unaffected.
///
/// ```
/// use tensorcomm::group::run_here;
/// use tensorcomm::tensor::Tensor;
/// use tensorcomm::{init_process_group, Backend, ReduceOp};
///
/// let pg = init_process_group(Backend::Cpu, "tcp://127.0.0.1:0?rank=0&world_size=1")?;
/// let t = Tensor::from_vec(vec![1.0f32, 2.0], &[2])?;
/// run_here(|| pg.all_reduce(&t, ReduceOp::Sum, None)?.wait())?;
/// assert_eq!(t.to_vec::<f32>()?, [1.0, 2.0]);
/// # Ok::<(), tensorcomm::Error>(())
/// ```
pub fn run_here<T>(start: impl FnOnce() -> T) -> T {
    /// Runs the kept collective if `start` did not (also when it panics:
    /// the group's later collectives wait for this one's turn).
    struct Leave(Option<Kept>);
    impl Drop for Leave {
        fn drop(&mut self) {
            let outer = self.0.take().unwrap_or(Kept::Outside);
            if let Kept::Holding(job) | Kept::Spent(Some(job)) = KEPT.with(|k| k.replace(outer)) {
                job.run_once();
            }
        }
    }
    // Inside another `run_here` (a collective's callback that runs
    // collectives), the outer one's kept collective stays its own.
    let _leave = Leave(Some(KEPT.with(|k| k.replace(Kept::Armed))));
    start()
}

/// Whether `job` is kept for this thread (the first inside run_here).
pub(crate) fn keep(job: &Arc<QueuedJob>) -> bool {
    KEPT.with(|k| {
        let mut kept = k.borrow_mut();
        match std::mem::replace(&mut *kept, Kept::Outside) {
            Kept::Armed => {
                *kept = Kept::Holding(job.clone());
                true
            }
            Kept::Holding(first) => {
                *kept = Kept::Spent(Some(first));
                false
            }
            other => {
                *kept = other;
                false
            }
        }
    })
}
