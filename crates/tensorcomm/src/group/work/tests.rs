use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::thread;

use super::*;

/// A device event flipped by hand, counting the calls made on it; each
/// method fails with an error of its own when told to.
#[derive(Default)]
pub(super) struct FakeEvent {
    pub(super) done: AtomicBool,
    queries: AtomicUsize,
    stream_waits: AtomicUsize,
    synchronizes: AtomicUsize,
    fail_query: AtomicBool,
    pub(super) fail_stream_wait: AtomicBool,
    fail_synchronize: AtomicBool,
}

fn cuda_error(call: &str) -> Error {
    Error::Cuda {
        call: call.into(),
        code: "CUDA_ERROR_LAUNCH_FAILED".into(),
        message: "unspecified launch failure".into(),
    }
}

impl DeviceEvent for FakeEvent {
    fn query(&self) -> Result<bool> {
        self.queries.fetch_add(1, Ordering::SeqCst);
        if self.fail_query.load(Ordering::SeqCst) {
            return Err(cuda_error("cuEventQuery"));
        }
        Ok(self.done.load(Ordering::SeqCst))
    }

    fn synchronize(&self) -> Result<()> {
        self.synchronizes.fetch_add(1, Ordering::SeqCst);
        if self.fail_synchronize.load(Ordering::SeqCst) {
            return Err(cuda_error("cuEventSynchronize"));
        }
        while !self.done.load(Ordering::SeqCst) {
            thread::yield_now();
        }
        Ok(())
    }

    fn wait_on_current_stream(&self) -> Result<()> {
        self.stream_waits.fetch_add(1, Ordering::SeqCst);
        if self.fail_stream_wait.load(Ordering::SeqCst) {
            return Err(cuda_error("cuStreamWaitEvent"));
        }
        Ok(())
    }
}

/// A work whose host part succeeded and whose device part waits on a new
/// fake event.
pub(super) fn device_work() -> (Work, Arc<FakeEvent>) {
    let (work, completion) = Work::new();
    let event = Arc::new(FakeEvent::default());
    completion.complete_on_device(Ok(()), event.clone());
    (work, event)
}

/// (stream waits, host synchronizes) made on `event`.
pub(super) fn calls(event: &FakeEvent) -> (usize, usize) {
    (
        event.stream_waits.load(Ordering::SeqCst),
        event.synchronizes.load(Ordering::SeqCst),
    )
}

fn is_cuda_error(outcome: &Result<()>, call: &str) -> bool {
    matches!(outcome, Err(Error::Cuda { call: c, .. }) if c == call)
}

#[test]
fn device_work_is_completed_only_once_its_event_has_passed() {
    let (mut work, event) = device_work();
    assert!(!work.is_completed());
    assert!(work.result().is_none(), "not finished on the device yet");
    event.done.store(true, Ordering::SeqCst);
    assert!(work.is_completed());
    assert!(matches!(work.result(), Some(Ok(()))));
    assert!(work.result().is_none(), "the outcome is given once");
}

#[test]
fn wait_makes_the_stream_wait_and_does_not_block_the_host() {
    let (work, event) = device_work();
    // The event never passes: a host-blocking wait would hang here.
    work.wait().unwrap();
    assert_eq!(calls(&event), (1, 0));
    assert!(!event.done.load(Ordering::SeqCst));
}

#[test]
fn synchronize_blocks_the_host_until_the_event_passes() {
    let (work, event) = device_work();
    let flipper = {
        let event = event.clone();
        thread::spawn(move || {
            thread::sleep(Duration::from_millis(20));
            event.done.store(true, Ordering::SeqCst);
        })
    };
    work.synchronize().unwrap();
    assert!(event.done.load(Ordering::SeqCst));
    assert_eq!(calls(&event), (1, 1));
    flipper.join().unwrap();
}

#[test]
fn host_only_work_waits_and_synchronizes_alike() {
    for synchronize in [false, true] {
        let (work, completion) = Work::new();
        completion.complete(Ok(()));
        assert!(work.is_completed());
        let outcome = if synchronize {
            work.synchronize()
        } else {
            work.wait()
        };
        assert!(outcome.is_ok());
    }
}

#[test]
fn a_failed_query_completes_the_work_with_the_event_error() {
    let (mut work, event) = device_work();
    event.fail_query.store(true, Ordering::SeqCst);
    assert!(work.is_completed(), "failed on the device is finished");
    assert!(is_cuda_error(&work.result().unwrap(), "cuEventQuery"));
    let outcome = work.wait();
    assert!(is_cuda_error(&outcome, "cuEventQuery"), "{outcome:?}");
    assert_eq!(calls(&event), (0, 0), "a failed event is not used again");
}

#[test]
fn a_failed_stream_wait_is_the_wait_error_and_stays_the_outcome() {
    let (work, event) = device_work();
    event.fail_stream_wait.store(true, Ordering::SeqCst);
    let completion = work.completion.clone();
    let outcome = work.wait();
    assert!(is_cuda_error(&outcome, "cuStreamWaitEvent"), "{outcome:?}");
    let stored = completion.lock().outcome.clone().unwrap();
    assert!(is_cuda_error(&stored, "cuStreamWaitEvent"), "{stored:?}");
}

#[test]
fn a_failed_synchronize_is_the_synchronize_error() {
    let (work, event) = device_work();
    event.fail_synchronize.store(true, Ordering::SeqCst);
    let outcome = work.synchronize();
    assert!(is_cuda_error(&outcome, "cuEventSynchronize"), "{outcome:?}");
}

#[test]
fn a_host_failure_drops_the_device_event() {
    let (work, completion) = Work::new();
    let event = Arc::new(FakeEvent::default());
    completion.complete_on_device(Err(Error::InvalidArgument("bad".into())), event.clone());
    assert!(work.is_completed());
    assert!(matches!(work.wait(), Err(Error::InvalidArgument(_))));
    assert_eq!(event.queries.load(Ordering::SeqCst), 0);
    assert_eq!(calls(&event), (0, 0));
}

#[test]
fn wait_timeout_polls_the_device_event_until_the_deadline() {
    let (work, event) = device_work();
    assert!(!work.wait_timeout(Duration::from_millis(10)));
    let flipper = {
        let event = event.clone();
        thread::spawn(move || {
            thread::sleep(Duration::from_millis(20));
            event.done.store(true, Ordering::SeqCst);
        })
    };
    assert!(work.wait_timeout(Duration::from_secs(10)));
    flipper.join().unwrap();
}

#[test]
fn wait_timeout_waits_for_the_host_outcome_and_does_not_run_the_job() {
    let (work, completion) = Work::new();
    let ran = Arc::new(AtomicBool::new(false));
    let work = {
        let ran = ran.clone();
        work.with_runner(Box::new(move || ran.store(true, Ordering::SeqCst)))
    };
    assert!(!work.wait_timeout(Duration::from_millis(10)));
    assert!(!ran.load(Ordering::SeqCst));
    let completer = thread::spawn(move || {
        thread::sleep(Duration::from_millis(20));
        completion.complete(Ok(()));
    });
    assert!(work.wait_timeout(Duration::from_secs(10)));
    assert!(!ran.load(Ordering::SeqCst));
    completer.join().unwrap();
}

#[test]
fn wait_runs_the_job_on_the_waiting_thread_once() {
    let (work, completion) = Work::new();
    let runs = Arc::new(AtomicUsize::new(0));
    let work = {
        let runs = runs.clone();
        work.with_runner(Box::new(move || {
            runs.fetch_add(1, Ordering::SeqCst);
            completion.complete(Ok(()));
        }))
    };
    work.wait().unwrap();
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

#[test]
fn the_first_outcome_counts() {
    let (work, completion) = Work::new();
    completion.complete(Err(Error::InvalidArgument("first".into())));
    completion.complete(Ok(()));
    match work.wait() {
        Err(Error::InvalidArgument(m)) => assert_eq!(m, "first"),
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_receive_keeps_its_source_rank() {
    let (work, completion) = Work::new();
    assert_eq!(work.source_rank(), None);
    completion.complete_recv(Ok(3));
    assert_eq!(work.source_rank(), Some(3));
    work.wait().unwrap();
}
