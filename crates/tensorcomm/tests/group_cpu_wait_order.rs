//! The CPU process group runs a collective on the thread that waits on its
//! `Work` when the group's thread has not picked it up yet: collectives
//! must still run in call order, whichever `Work` is waited on first and
//! from whichever thread, and un-waited ones must still complete.

use std::sync::Arc;
use std::thread;
use std::time::Duration;

use tensorcomm::cpu::backend::{CpuOptions, ProcessGroupCpu};
use tensorcomm::cpu::transport::TransportChoice;
use tensorcomm::group::{ProcessGroup, ReduceOp};
use tensorcomm::store::HashStore;
use tensorcomm::tensor::Tensor;

fn groups(world: usize, choice: TransportChoice) -> Vec<ProcessGroupCpu> {
    let store = Arc::new(HashStore::new());
    let handles: Vec<_> = (0..world)
        .map(|rank| {
            let store = store.clone();
            thread::spawn(move || {
                let options = CpuOptions {
                    timeout: Duration::from_secs(30),
                    transport: choice,
                    ..CpuOptions::default()
                };
                ProcessGroupCpu::new(store, "wait-order", rank, world, &options).unwrap()
            })
        })
        .collect();
    handles.into_iter().map(|h| h.join().unwrap()).collect()
}

/// Each rank queues SUM, PRODUCT and MAX all-reduces on three tensors, and
/// a fourth SUM on the first tensor again, then waits on them in an order
/// that differs per rank (rank 2 also waits on one from a second thread and
/// never waits on another at all). Run out of order, the fourth would see
/// a different first tensor; mixed across ranks, ops would mismatch.
fn out_of_order_waits_keep_call_order(choice: TransportChoice) {
    let world = 3;
    let pgs = groups(world, choice);
    thread::scope(|s| {
        for (rank, pg) in pgs.iter().enumerate() {
            s.spawn(move || {
                let r = rank as i64 + 1;
                let a = Tensor::from_vec(vec![r; 5], &[5]).unwrap();
                let b = Tensor::from_vec(vec![r + 1; 4], &[4]).unwrap();
                let c = Tensor::from_vec(vec![10 * r; 3], &[3]).unwrap();
                let wa = pg.all_reduce(&a, ReduceOp::Sum, None).unwrap();
                let wb = pg.all_reduce(&b, ReduceOp::Product, None).unwrap();
                let wc = pg.all_reduce(&c, ReduceOp::Max, None).unwrap();
                let wd = pg.all_reduce(&a, ReduceOp::Sum, None).unwrap();
                match rank {
                    0 => {
                        wd.wait().unwrap();
                        wc.wait().unwrap();
                        wb.wait().unwrap();
                        wa.wait().unwrap();
                    }
                    1 => {
                        wa.wait().unwrap();
                        wb.wait().unwrap();
                        wc.wait().unwrap();
                        wd.wait().unwrap();
                    }
                    _ => {
                        let other = thread::spawn(move || wc.wait());
                        wb.wait().unwrap();
                        drop(wa); // never waited on: the group's thread runs it
                        wd.wait().unwrap();
                        other.join().unwrap().unwrap();
                    }
                }
                // Sums 1+2+3 = 6, then 6 * 3 ranks = 18; products 2*3*4;
                // max of 10, 20, 30.
                assert_eq!(a.to_vec::<i64>().unwrap(), [18; 5]);
                assert_eq!(b.to_vec::<i64>().unwrap(), [24; 4]);
                assert_eq!(c.to_vec::<i64>().unwrap(), [30; 3]);
                // A collective called right after waits still works.
                let e = Tensor::from_vec(vec![r; 2], &[2]).unwrap();
                pg.all_reduce(&e, ReduceOp::Min, None)
                    .unwrap()
                    .wait()
                    .unwrap();
                assert_eq!(e.to_vec::<i64>().unwrap(), [1; 2]);
            });
        }
    });
}

#[test]
fn tcp_out_of_order_waits_keep_call_order() {
    out_of_order_waits_keep_call_order(TransportChoice::Tcp);
}

#[test]
fn shm_out_of_order_waits_keep_call_order() {
    out_of_order_waits_keep_call_order(TransportChoice::Shm);
}

/// A barrier implies completion of all earlier work (as in PyTorch): once
/// `barrier().wait()` returns, every un-waited collective queued before it
/// reports `is_completed()`. Before the fix a collective handed the turn to
/// the next one before marking its `Work` complete, so the barrier could
/// finish first (about 1 run in 15); hundreds of rounds catch that.
#[test]
fn a_barrier_implies_every_earlier_collective_is_complete() {
    let world = 3;
    let pgs = groups(world, TransportChoice::Shm);
    thread::scope(|s| {
        for (rank, pg) in pgs.iter().enumerate() {
            s.spawn(move || {
                let tensors: Vec<_> = (0..16)
                    .map(|i| Tensor::from_vec(vec![(rank + i) as i64; 4], &[4]).unwrap())
                    .collect();
                for round in 0..300 {
                    let works: Vec<_> = tensors
                        .iter()
                        .map(|t| pg.all_reduce(t, ReduceOp::Max, None).unwrap())
                        .collect();
                    pg.barrier(None).unwrap().wait().unwrap();
                    for (i, work) in works.iter().enumerate() {
                        assert!(
                            work.is_completed(),
                            "rank {rank}, round {round}: all_reduce {i} not complete after the barrier"
                        );
                    }
                    assert_eq!(tensors[15].to_vec::<i64>().unwrap(), vec![17; 4]);
                }
            });
        }
    });
}
