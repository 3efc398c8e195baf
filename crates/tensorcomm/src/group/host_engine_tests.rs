//! The engine with a host backend (not inline) that prepares each call on
//! the caller's thread and leaves device work behind, as the CPU backend
//! does for CUDA tensors: what `prepare` returned reaches `run`, a failed
//! `prepare` fails the collective when it runs, and a returned event makes
//! the `Work` complete on the device.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::backend::{Call, GroupBackend, Prepared};
use super::collective::{Collective, Scope};
use super::engine::Engine;
use super::one_rank_engine::{host_scope, one_rank_engine};
use super::{DeviceEvent, ReduceOp};
use crate::tensor::{DType, Tensor};
use crate::{Error, Result};

/// Done once a test sets it.
#[derive(Default)]
struct Flag(AtomicBool);

impl DeviceEvent for Flag {
    fn query(&self) -> Result<bool> {
        Ok(self.0.load(Ordering::Acquire))
    }

    fn synchronize(&self) -> Result<()> {
        while !self.query()? {
            std::thread::sleep(Duration::from_millis(1));
        }
        Ok(())
    }

    fn wait_on_current_stream(&self) -> Result<()> {
        Ok(())
    }
}

/// Prepares the caller thread's name (or fails when told to), and returns
/// `event` from every run.
struct PreparingBackend {
    fail_prepare: bool,
    event: Arc<Flag>,
    seen: Mutex<Vec<String>>,
}

impl GroupBackend for PreparingBackend {
    fn prepare(&self, _: &Collective) -> Result<Option<Prepared>> {
        if self.fail_prepare {
            return Err(Error::InvalidArgument("staging failed".into()));
        }
        let name = std::thread::current().name().unwrap_or("?").to_string();
        Ok(Some(Box::new(name)))
    }

    fn run(&self, _: &Collective, call: &Call) -> Result<Option<Arc<dyn DeviceEvent>>> {
        let prepared = call.take_prepared()?.expect("prepared");
        let name = prepared.downcast::<String>().expect("a String");
        self.seen.lock().unwrap().push(*name);
        assert!(call.take_prepared()?.is_none(), "taken twice");
        Ok(Some(self.event.clone()))
    }

    fn abort(&self) {}
}

fn engine(backend: Arc<PreparingBackend>) -> (Engine, Scope) {
    (one_rank_engine(backend, "host"), host_scope())
}

#[test]
fn prepared_calls_complete_on_the_device_when_run_returns_an_event() {
    let backend = Arc::new(PreparingBackend {
        fail_prepare: false,
        event: Arc::default(),
        seen: Mutex::default(),
    });
    let (engine, scope) = engine(backend.clone());
    let caller = std::thread::Builder::new()
        .name("the-caller".into())
        .spawn(move || {
            let t = Tensor::zeros(&[2], DType::F32).unwrap();
            let call = Collective::all_reduce(&scope, &t, ReduceOp::Sum).unwrap();
            let work = engine.submit(call, None).unwrap();
            // The host part finishes; the device part has not.
            assert!(!work.wait_timeout(Duration::from_millis(50)));
            assert!(!work.is_completed());
            work
        })
        .unwrap();
    let work = caller.join().unwrap();
    // The group's thread runs the job; wait (bounded) until it has.
    let until = std::time::Instant::now() + Duration::from_secs(10);
    while backend.seen.lock().unwrap().is_empty() && std::time::Instant::now() < until {
        std::thread::sleep(Duration::from_millis(1));
    }
    assert_eq!(*backend.seen.lock().unwrap(), ["the-caller"]);
    backend.event.0.store(true, Ordering::Release);
    assert!(work.is_completed());
    work.synchronize().unwrap();
}

#[test]
fn a_failed_prepare_fails_the_collective_when_it_runs() {
    let backend = Arc::new(PreparingBackend {
        fail_prepare: true,
        event: Arc::default(),
        seen: Mutex::default(),
    });
    let (engine, scope) = engine(backend.clone());
    let t = Tensor::zeros(&[2], DType::F32).unwrap();
    let call = Collective::all_reduce(&scope, &t, ReduceOp::Sum).unwrap();
    let err = engine.submit(call, None).unwrap().wait().unwrap_err();
    assert!(
        matches!(&err, Error::CollectiveFailed { source, .. } if err.to_string().contains("staging failed") && matches!(**source, Error::InvalidArgument(_))),
        "{err:?}"
    );
    assert!(backend.seen.lock().unwrap().is_empty());
}

/// Runs every call on whichever thread gets it, counting them and taking
/// `takes` each; its group's thread and waiters poll for `spin`.
struct Polling {
    spin: Duration,
    takes: Duration,
    ran: std::sync::atomic::AtomicUsize,
}

impl GroupBackend for Polling {
    fn run(&self, _: &Collective, _: &Call) -> Result<Option<Arc<dyn DeviceEvent>>> {
        std::thread::sleep(self.takes);
        self.ran.fetch_add(1, Ordering::Relaxed);
        Ok(None)
    }

    fn abort(&self) {}

    fn idle_spin(&self) -> Duration {
        self.spin
    }
}

#[test]
fn a_polling_group_thread_and_waiters_miss_no_collective() {
    // Back to back with short collectives (the thread polling when each
    // call comes, the caller polling for the outcome or running the call
    // itself), spaced out past the poll (the thread sleeps and is woken),
    // and collectives longer than the poll (neither polls after them).
    let cases = [
        (2000, Duration::ZERO, Duration::ZERO),
        (200, Duration::ZERO, Duration::from_micros(30)),
        (20, Duration::from_millis(2), Duration::ZERO),
        (20, Duration::ZERO, Duration::from_millis(2)),
    ];
    for (calls, gap, takes) in cases {
        let backend = Arc::new(Polling {
            spin: Duration::from_micros(200),
            takes,
            ran: Default::default(),
        });
        let engine = one_rank_engine(backend.clone(), "polling");
        // On a thread of its own, so that a lost hand-off fails the test
        // instead of hanging it.
        let (done, finished) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let scope = host_scope();
            let t = Tensor::zeros(&[2], DType::F32).unwrap();
            for _ in 0..calls {
                let call = Collective::all_reduce(&scope, &t, ReduceOp::Sum).unwrap();
                let work = engine.submit(call, None).unwrap();
                std::thread::sleep(gap);
                work.wait().unwrap();
            }
            let _ = done.send(());
        });
        let case = format!("{calls} calls, gap {gap:?}, takes {takes:?}");
        finished
            .recv_timeout(Duration::from_secs(60))
            .unwrap_or_else(|_| panic!("{case}: a collective was never run or never heard of"));
        assert_eq!(backend.ran.load(Ordering::Relaxed), calls, "{case}");
    }
}

#[test]
fn a_waiter_whose_poll_ran_out_still_hears_of_the_outcome() {
    use super::work::Work;
    for settle_after in [Duration::ZERO, Duration::from_millis(20)] {
        let (work, completion) = Work::polling_for(Duration::from_millis(5));
        let settler = std::thread::spawn(move || {
            std::thread::sleep(settle_after);
            completion.complete(Err(Error::InvalidArgument("settled".into())));
        });
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let _ = tx.send(work.wait());
        });
        let outcome = rx
            .recv_timeout(Duration::from_secs(10))
            .expect("the waiter was woken");
        assert!(
            matches!(&outcome, Err(Error::InvalidArgument(m)) if m == "settled"),
            "{outcome:?}"
        );
        settler.join().unwrap();
    }
}
