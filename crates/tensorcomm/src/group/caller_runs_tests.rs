//! [`run_here`]: the first collective a caller submits inside it runs on
//! that caller's thread, never on the group's, whether the caller waits
//! on it or not; a second one inside it is queued as usual, so waiting on
//! it first does not deadlock.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::backend::{Call, GroupBackend};
use super::collective::{Capabilities, Collective, Scope};
use super::engine::Engine;
use super::{run_here, DeviceEvent, FlightRecorder, ReduceOp, Work};
use crate::store::HashStore;
use crate::tensor::{DType, Tensor};
use crate::Result;

/// Records the name of the thread that runs each collective.
#[derive(Default)]
struct Recording {
    ran_on: Mutex<Vec<String>>,
}

impl GroupBackend for Recording {
    fn run(&self, _: &Collective, _: &Call) -> Result<Option<Arc<dyn DeviceEvent>>> {
        let name = std::thread::current().name().unwrap_or("?").to_string();
        self.ran_on.lock().unwrap().push(name);
        Ok(None)
    }

    fn abort(&self) {}
}

/// Runs `f(engine, submit)` on a thread named "the-caller", where
/// `submit()` starts an all-reduce on a host group of one rank.
fn on_caller(f: impl FnOnce(&dyn Fn() -> Work) + Send + 'static) -> Vec<String> {
    let backend = Arc::new(Recording::default());
    let engine = Engine::start(
        backend.clone(),
        Arc::new(HashStore::new()),
        "here",
        (0, 1),
        FlightRecorder::new(16, 0, 1, "here"),
        Duration::from_secs(30),
    )
    .unwrap();
    let scope = Scope {
        rank: 0,
        size: 1,
        caps: Capabilities::HOST,
    };
    std::thread::Builder::new()
        .name("the-caller".into())
        .spawn(move || {
            let t = Tensor::zeros(&[2], DType::F32).unwrap();
            let submit = || {
                let call = Collective::all_reduce(&scope, &t, ReduceOp::Sum).unwrap();
                engine.submit(call, None).unwrap()
            };
            f(&submit);
        })
        .unwrap()
        .join()
        .unwrap();
    let ran_on = backend.ran_on.lock().unwrap().clone();
    ran_on
}

/// Long enough for the group's thread to take a queued collective.
const HAND_OFF: Duration = Duration::from_millis(50);

#[test]
fn without_run_here_the_groups_thread_takes_a_collective_nobody_waits_for() {
    let ran_on = on_caller(|submit| {
        let work = submit();
        std::thread::sleep(HAND_OFF);
        work.wait().unwrap();
    });
    assert_eq!(ran_on, ["tensorcomm-pg-rank0"]);
}

#[test]
fn the_first_collective_inside_run_here_runs_on_the_caller() {
    let ran_on = on_caller(|submit| {
        run_here(|| {
            let work = submit();
            std::thread::sleep(HAND_OFF);
            work.wait().unwrap();
        });
        // Not waited for inside: run when `run_here` returns.
        let work = run_here(submit);
        assert!(work.is_completed());
        work.wait().unwrap();
    });
    assert_eq!(ran_on, ["the-caller", "the-caller"]);
}

#[test]
fn a_second_collective_inside_run_here_queues_both() {
    let ran_on = on_caller(|submit| {
        run_here(|| {
            let first = submit();
            let second = submit();
            // Waiting on the second first needs the first to run: the
            // group's thread runs it.
            second.wait().unwrap();
            assert!(first.is_completed());
            first.wait().unwrap();
        });
        // Outside, collectives are queued again; inside a new
        // `run_here`, the first is kept again.
        run_here(|| submit().wait().unwrap());
    });
    assert_eq!(ran_on.len(), 3);
    assert_eq!(ran_on[2], "the-caller");
}
