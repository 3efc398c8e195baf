//! [`run_here`]: the first collective a caller submits inside it runs on
//! that caller's thread, never on the group's, whether the caller waits
//! on it or not; a second one inside it is queued as usual, so waiting on
//! it first does not deadlock.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::backend::{Call, GroupBackend};
use super::collective::Collective;
use super::engine::Engine;
use super::one_rank_engine::{host_scope, one_rank_engine};
use super::{run_here, DeviceEvent, ReduceOp, Work};
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

/// Runs `f(submit)` on a thread named "the-caller", where `submit()`
/// starts an all-reduce on a host group of one rank.
fn on_caller(f: impl FnOnce(&dyn Fn() -> Work) + Send + 'static) -> Vec<String> {
    let backend = Arc::new(Recording::default());
    let engine = one_rank_engine(backend.clone(), "here");
    std::thread::Builder::new()
        .name("the-caller".into())
        .spawn(move || f(&|| submit_on(&engine)))
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

// ---- review repros ----

#[derive(Default)]
struct Ids {
    ran: Mutex<Vec<std::thread::ThreadId>>,
}
impl GroupBackend for Ids {
    fn run(&self, _: &Collective, _: &Call) -> Result<Option<Arc<dyn DeviceEvent>>> {
        self.ran.lock().unwrap().push(std::thread::current().id());
        Ok(None)
    }
    fn abort(&self) {}
}

fn engine_with<B: GroupBackend + 'static>(b: Arc<B>, name: &str) -> Arc<Engine> {
    Arc::new(one_rank_engine(b, name))
}

/// Starts an all-reduce of two zeros on `engine`'s host group of one rank.
fn submit_on(engine: &Engine) -> Work {
    let t = Tensor::zeros(&[2], DType::F32).unwrap();
    let call = Collective::all_reduce(&host_scope(), &t, ReduceOp::Sum).unwrap();
    engine.submit(call, None).unwrap()
}

/// Another thread's collective queued between the two submits of one
/// `run_here`: the group's thread takes it and waits for the kept one's
/// turn, so the kept one must reach the queue before anything after it
/// (it used to land behind, and waiting on the second first hung).
#[test]
fn another_threads_collective_between_two_inside_run_here_does_not_deadlock() {
    let engine = engine_with(Arc::new(Ids::default()), "r1");
    let (done_tx, done_rx) = std::sync::mpsc::channel();
    let e = engine.clone();
    std::thread::spawn(move || {
        run_here(|| {
            let first = submit_on(&e);
            let e2 = e.clone();
            let other = std::thread::spawn(move || submit_on(&e2).wait().unwrap());
            std::thread::sleep(HAND_OFF); // the group's thread takes the other's
            let second = submit_on(&e);
            second.wait().unwrap();
            first.wait().unwrap();
            other.join().unwrap();
        });
        done_tx.send(()).unwrap();
    });
    assert!(
        done_rx.recv_timeout(Duration::from_secs(5)).is_ok(),
        "deadlock: waiting on the second collective first never returns"
    );
}

/// A collective kept for its caller in group A is never queued to group
/// B (it used to be, when the caller's second submit went to B).
#[test]
fn a_kept_collective_stays_in_its_own_groups_queue() {
    let a = Arc::new(Ids::default());
    let b = Arc::new(Ids::default());
    let (ea, eb) = (engine_with(a.clone(), "ra"), engine_with(b.clone(), "rb"));
    let me = std::thread::current().id();
    let (wa, wb) = run_here(|| (submit_on(&ea), submit_on(&eb)));
    std::thread::sleep(Duration::from_millis(200));
    wa.wait().unwrap();
    wb.wait().unwrap();
    let (ra, rb) = (a.ran.lock().unwrap()[0], b.ran.lock().unwrap()[0]);
    eprintln!("A ran on {ra:?}, B ran on {rb:?}, caller {me:?}");
    assert_ne!(ra, rb, "group A's collective ran on group B's thread");
}
