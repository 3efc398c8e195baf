//! Tests of `Work::get_future` and `WorkFuture`.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::thread::{self, ThreadId};

use super::tests::{calls, device_work};
use super::*;

fn failed(seq: u64) -> Error {
    Error::CollectiveFailed {
        op: "all_reduce".into(),
        seq,
        rank: 0,
        ranks: vec![1],
        source: Box::new(Error::PeerClosed {
            peer: 1,
            during: "receiving".into(),
            reason: "connection reset".into(),
        }),
    }
}

/// A work with a runner that completes it with `outcome` and counts its
/// runs.
fn lazy_work(outcome: Result<()>) -> (Work, Arc<Completion>, Arc<AtomicUsize>) {
    let (work, completion) = Work::new();
    let runs = Arc::new(AtomicUsize::new(0));
    let work = {
        let (completion, runs) = (completion.clone(), runs.clone());
        work.with_runner(Box::new(move || {
            runs.fetch_add(1, Ordering::SeqCst);
            completion.complete(outcome);
        }))
    };
    (work, completion, runs)
}

#[test]
fn then_on_a_finished_work_runs_at_once_on_the_calling_thread() {
    let work = Work::done(Ok(()));
    let ran_on = Arc::new(Mutex::new(None::<ThreadId>));
    let future = work.get_future().then({
        let ran_on = ran_on.clone();
        move |outcome| {
            *ran_on.lock().unwrap() = Some(thread::current().id());
            outcome.map(|()| 20)
        }
    });
    assert_eq!(*ran_on.lock().unwrap(), Some(thread::current().id()));
    assert!(future.is_completed());
    let total = future.then(|n| Ok(n? + 1)).then(|n| Ok(n? * 2));
    assert_eq!(total.wait().unwrap(), 42);
}

#[test]
fn then_on_a_work_finished_later_runs_on_the_completing_thread() {
    let (work, completion) = Work::new();
    let ran_on = Arc::new(Mutex::new(None::<ThreadId>));
    let runs = Arc::new(AtomicUsize::new(0));
    let future = work.get_future().then({
        let (ran_on, runs) = (ran_on.clone(), runs.clone());
        move |outcome| {
            runs.fetch_add(1, Ordering::SeqCst);
            *ran_on.lock().unwrap() = Some(thread::current().id());
            outcome.map(|()| "reduced")
        }
    });
    assert!(!future.is_completed());
    assert_eq!(runs.load(Ordering::SeqCst), 0);
    let completer = thread::spawn(move || {
        thread::sleep(Duration::from_millis(20));
        completion.complete(Ok(()));
        thread::current().id()
    });
    assert_eq!(future.wait().unwrap(), "reduced");
    let completer_id = completer.join().unwrap();
    assert_eq!(*ran_on.lock().unwrap(), Some(completer_id));
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    work.wait().unwrap();
}

#[test]
fn errors_pass_down_the_chain_and_a_callback_may_handle_them() {
    let work = Work::done(Err(failed(7)));
    let future = work
        .get_future()
        .then(|r| r.map(|()| 1))
        .then(|r| r.map(|n| n + 1));
    match future.wait() {
        Err(Error::CollectiveFailed { seq: 7, source, .. }) => {
            assert!(matches!(*source, Error::PeerClosed { peer: 1, .. }));
        }
        other => panic!("{other:?}"),
    }
    let recovered = work
        .get_future()
        .then(|r| match r {
            Err(Error::CollectiveFailed { seq, .. }) => Ok(seq),
            other => other.map(|()| 0),
        })
        .wait();
    assert_eq!(recovered.unwrap(), 7);
    // The work itself still gives the same typed error.
    assert!(matches!(
        work.wait(),
        Err(Error::CollectiveFailed { seq: 7, .. })
    ));
}

#[test]
fn a_panicking_callback_fails_its_future_and_nothing_else() {
    let (work, completion) = Work::new();
    let panicking = work
        .get_future()
        .then(|_| -> Result<u32> { panic!("bucket hook exploded") })
        .then(|r| r.map(|n| n + 1));
    let healthy = work.get_future().then(|r| r.map(|()| 5));
    completion.complete(Ok(()));
    match panicking.wait() {
        Err(Error::FutureFailed { reason }) => {
            assert!(reason.contains("bucket hook exploded"), "{reason}");
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(healthy.wait().unwrap(), 5);
    // Nothing is poisoned: the work and new futures of it still work.
    assert_eq!(work.get_future().then(|r| r.map(|()| 6)).wait().unwrap(), 6);
    assert!(work.is_completed());
    work.wait().unwrap();
}

#[test]
fn waiting_on_a_future_runs_the_job_once() {
    let (work, _completion, runs) = lazy_work(Ok(()));
    let future = work.get_future().then(|r| r.map(|()| 3));
    assert_eq!(runs.load(Ordering::SeqCst), 0, "then does not run the job");
    assert_eq!(future.wait().unwrap(), 3);
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    work.wait().unwrap();
    assert_eq!(runs.load(Ordering::SeqCst), 1, "the job runs once");
}

#[test]
fn work_wait_runs_the_job_for_its_futures_too() {
    let (work, _completion, runs) = lazy_work(Err(failed(2)));
    let future = work.get_future();
    assert!(matches!(
        work.wait(),
        Err(Error::CollectiveFailed { seq: 2, .. })
    ));
    assert!(future.is_completed());
    assert!(matches!(
        future.wait(),
        Err(Error::CollectiveFailed { seq: 2, .. })
    ));
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

#[test]
fn wait_timeout_is_unaffected_by_futures() {
    let (work, completion, runs) = lazy_work(Ok(()));
    let future = work.get_future().then(|r| r.map(|()| 1));
    assert!(!work.wait_timeout(Duration::from_millis(10)));
    assert_eq!(runs.load(Ordering::SeqCst), 0);
    completion.complete(Ok(()));
    assert!(work.wait_timeout(Duration::from_millis(10)));
    assert!(future.is_completed());
    assert_eq!(future.wait().unwrap(), 1);
}

#[test]
fn a_work_dropped_unfinished_fails_its_futures() {
    let (work, completion) = Work::new();
    let future = work.get_future().then(|r| r.map(|()| 1));
    drop(work);
    drop(completion);
    match future.wait() {
        Err(Error::FutureFailed { reason }) => assert!(reason.contains("dropped"), "{reason}"),
        other => panic!("{other:?}"),
    }
}

#[test]
fn ready_futures_are_complete_and_chain() {
    let future = WorkFuture::ready(vec![1u8, 2]);
    assert!(future.is_completed());
    let len = future.then(|v| Ok(v?.len()));
    assert!(len.is_completed());
    assert_eq!(len.synchronize().unwrap(), 2);
}

#[test]
fn futures_of_device_work_follow_its_event() {
    let (work, event) = device_work();
    let plain = work.get_future();
    assert!(!plain.is_completed(), "the device has not finished");
    event.done.store(true, Ordering::SeqCst);
    assert!(plain.is_completed());
    plain.wait().unwrap();
    assert_eq!(calls(&event), (1, 0), "wait makes the stream wait");

    // A callback is ordered after the device work, and its future carries
    // the event on.
    let chained = work.get_future().then(|r| r.map(|()| 9));
    assert_eq!(calls(&event), (2, 0));
    assert_eq!(chained.synchronize().unwrap(), 9);
    assert_eq!(calls(&event), (3, 1));
}

#[test]
fn a_device_error_before_a_callback_is_the_value_it_gets() {
    let (work, event) = device_work();
    event.fail_stream_wait.store(true, Ordering::SeqCst);
    let seen = work
        .get_future()
        .then(|r| match r {
            Err(Error::Cuda { call, .. }) => Ok(call),
            other => Err(Error::InvalidArgument(format!(
                "expected a CUDA error, got {other:?}"
            ))),
        })
        .wait();
    assert_eq!(seen.unwrap(), "cuStreamWaitEvent");
}

#[test]
fn a_deferred_job_runs_once_on_the_first_waiting_thread() {
    let runs = Arc::new(AtomicUsize::new(0));
    let future = WorkFuture::deferred({
        let runs = runs.clone();
        move || {
            runs.fetch_add(1, Ordering::SeqCst);
            Ok(20)
        }
    });
    assert!(!future.is_completed());
    let chained = future.then(|n| Ok(n? + 1));
    assert_eq!(runs.load(Ordering::SeqCst), 0, "nothing runs before a wait");
    assert_eq!(chained.wait().unwrap(), 21);
    assert_eq!(runs.load(Ordering::SeqCst), 1);

    let panicking = WorkFuture::<u8>::deferred(|| panic!("boom"));
    let e = panicking.wait().unwrap_err();
    assert!(matches!(e, Error::FutureFailed { .. }), "{e}");
    assert!(e.to_string().contains("boom"), "{e}");
}
