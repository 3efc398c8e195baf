//! Collectives their caller runs: a caller that waits for a collective at
//! once (a synchronous `torch.distributed` call) need not queue it to the
//! group's thread at all. Queuing wakes that thread (a futex syscall and a
//! context switch, then a lock it contends for with the caller, who runs
//! the collective anyway when it waits first), which costs more than a
//! small collective on a loaded host.

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
    /// It submitted a second collective: both went to the queue.
    Spent,
}

thread_local! {
    static KEPT: RefCell<Kept> = const { RefCell::new(Kept::Outside) };
}

/// Calls `start`, keeping the first collective of a host group that it
/// submits on this thread off the group's thread: that collective runs on
/// this thread, when `start` waits on its [`Work`](super::Work) (the usual
/// use: start it and wait), or else here, after `start` returns. It still
/// runs after every earlier collective of its group, in call order. If
/// `start` submits a second collective, both are queued to the group's
/// thread as usual (so waiting on the second first cannot deadlock). A
/// device group's collectives are queued on the caller's thread anyway;
/// they are unaffected.
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
            if let Kept::Holding(job) = KEPT.with(|k| k.replace(outer)) {
                job.run_once();
            }
        }
    }
    // Inside another `run_here` (a collective's callback that runs
    // collectives), the outer one's kept collective stays its own.
    let _leave = Leave(Some(KEPT.with(|k| k.replace(Kept::Armed))));
    start()
}

/// What [`Engine::submit`](super::engine::Engine::submit) queues, in this
/// order, for `job`: nothing when it is the first collective inside
/// [`run_here`] (kept for its caller); that first one and `job` for a
/// second; `job` otherwise.
pub(crate) fn to_queue(job: Arc<QueuedJob>) -> [Option<Arc<QueuedJob>>; 2] {
    KEPT.with(|k| {
        let mut kept = k.borrow_mut();
        match std::mem::replace(&mut *kept, Kept::Spent) {
            Kept::Armed => {
                *kept = Kept::Holding(job);
                [None, None]
            }
            Kept::Holding(first) => [Some(first), Some(job)],
            other @ (Kept::Outside | Kept::Spent) => {
                *kept = other;
                [None, Some(job)]
            }
        }
    })
}
