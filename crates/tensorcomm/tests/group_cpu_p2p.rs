//! Point-to-point messages of the CPU process group between threads over
//! loopback: tags, ordering, any-source receives, large messages both ways
//! at once, interleaving with collectives, validation and size mismatches.
//! Every test runs once per transport the group is built over (modules
//! `tcp` and `shm`, routes checked), so the messages meet that transport's
//! collectives, set-up and teardown.

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{groups_over, on_every_rank};
use tensorcomm::cpu::backend::ProcessGroupCpu;
use tensorcomm::cpu::transport::TransportChoice;
use tensorcomm::group::{ProcessGroup, ReduceOp};
use tensorcomm::store::HashStore;
use tensorcomm::tensor::{DType, Tensor};
use tensorcomm::Error;

over_transports!(
    messages_match_by_tag_keep_order_and_do_not_disturb_collectives,
    recv_any_source_reports_each_sender,
    large_messages_cross_in_both_directions_at_once,
    channels_last_tensors_keep_their_layout,
    bad_peers_and_tensors_are_refused_before_sending,
    a_size_mismatch_fails_the_receiver_naming_both_sizes_and_the_group_goes_on,
    receives_time_out_by_name_and_later_messages_still_arrive,
    a_receive_from_a_dropped_peer_fails_at_once,
);

/// One group per rank over `choice`, routes checked.
fn groups(world: usize, choice: TransportChoice) -> Vec<ProcessGroupCpu> {
    groups_over(world, &Arc::new(HashStore::new()), "pg", choice)
}

fn bytes(seed: usize, n: usize) -> Vec<u8> {
    (0..n)
        .map(|i| ((i * 131 + seed * 17) % 251) as u8)
        .collect()
}

fn messages_match_by_tag_keep_order_and_do_not_disturb_collectives(choice: TransportChoice) {
    let pgs = groups(3, choice);
    on_every_rank(&pgs, |pg| match pg.rank() {
        0 => {
            // Three messages to rank 1: tag 1 twice, then tag 2.
            let works = [(1u64, 10.0f32), (1, 11.0), (2, 20.0)].map(|(tag, v)| {
                let t = Tensor::from_vec(vec![v; 4], &[4]).unwrap();
                pg.send(&t, 1, tag, None).unwrap()
            });
            // Sent before the collective but received after it on rank 1.
            let t = Tensor::from_vec(vec![1i64; 5], &[5]).unwrap();
            pg.all_reduce(&t, ReduceOp::Sum, None)
                .unwrap()
                .wait()
                .unwrap();
            assert_eq!(t.to_vec::<i64>().unwrap(), [3; 5]);
            for w in works {
                w.wait().unwrap();
            }
        }
        1 => {
            let t = Tensor::from_vec(vec![1i64; 5], &[5]).unwrap();
            pg.all_reduce(&t, ReduceOp::Sum, None)
                .unwrap()
                .wait()
                .unwrap();
            assert_eq!(t.to_vec::<i64>().unwrap(), [3; 5]);
            // Tag 2 first although it was sent last; tag 1 in send order.
            let recv = |tag| {
                let t = Tensor::zeros(&[4], DType::F32).unwrap();
                let w = pg.recv(&t, 0, tag, None).unwrap();
                assert!(w.wait_timeout(Duration::from_secs(30)));
                assert_eq!(w.source_rank(), Some(0));
                w.wait().unwrap();
                t.to_vec::<f32>().unwrap()[0]
            };
            assert_eq!([recv(2), recv(1), recv(1)], [20.0, 10.0, 11.0]);
        }
        _ => {
            let t = Tensor::from_vec(vec![1i64; 5], &[5]).unwrap();
            pg.all_reduce(&t, ReduceOp::Sum, None)
                .unwrap()
                .wait()
                .unwrap();
            assert_eq!(t.to_vec::<i64>().unwrap(), [3; 5]);
        }
    });
}

fn recv_any_source_reports_each_sender(choice: TransportChoice) {
    let pgs = groups(4, choice);
    on_every_rank(&pgs, |pg| {
        if pg.rank() != 0 {
            let t = Tensor::from_vec(vec![pg.rank() as i32 * 100; 3], &[3]).unwrap();
            pg.send(&t, 0, 9, None).unwrap().wait().unwrap();
            return;
        }
        let mut seen = Vec::new();
        for _ in 1..4 {
            let t = Tensor::zeros(&[3], DType::I32).unwrap();
            let w = pg.recv_any_source(&t, 9, None).unwrap();
            assert!(w.wait_timeout(Duration::from_secs(30)));
            let src = w.source_rank().expect("a source rank");
            w.wait().unwrap();
            assert_eq!(t.to_vec::<i32>().unwrap(), vec![src as i32 * 100; 3]);
            seen.push(src);
        }
        seen.sort_unstable();
        assert_eq!(seen, [1, 2, 3]);
    });
}

fn large_messages_cross_in_both_directions_at_once(choice: TransportChoice) {
    const N: usize = 3 << 20;
    let pgs = groups(2, choice);
    on_every_rank(&pgs, |pg| {
        let (me, peer) = (pg.rank(), 1 - pg.rank());
        let out = Tensor::from_vec(bytes(me, N), &[N]).unwrap();
        let into = Tensor::zeros(&[N], DType::U8).unwrap();
        // Both send first: the receiving side drains into its buffer.
        let sent = pg.send(&out, peer, 0, None).unwrap();
        let got = pg.recv(&into, peer, 0, None).unwrap();
        sent.wait().unwrap();
        got.wait().unwrap();
        assert!(into.to_vec::<u8>().unwrap() == bytes(peer, N));
    });
}

fn channels_last_tensors_keep_their_layout(choice: TransportChoice) {
    let pgs = groups(2, choice);
    on_every_rank(&pgs, |pg| {
        let t = Tensor::zeros_channels_last(&[1, 2, 2, 3], DType::F64).unwrap();
        if pg.rank() == 0 {
            let src = Tensor::from_vec((0..12).map(f64::from).collect(), &[1, 2, 2, 3]).unwrap();
            t.copy_from(&src).unwrap();
            pg.send(&t, 1, 3, None).unwrap().wait().unwrap();
        } else {
            pg.recv(&t, 0, 3, None).unwrap().wait().unwrap();
            let expected: Vec<f64> = (0..12).map(f64::from).collect();
            assert_eq!(t.to_vec::<f64>().unwrap(), expected);
        }
    });
}

fn bad_peers_and_tensors_are_refused_before_sending(choice: TransportChoice) {
    let pgs = groups(2, choice);
    let t = Tensor::zeros(&[4], DType::F32).unwrap();
    for (result, op, found) in [
        (pgs[0].send(&t, 2, 0, None), "send", "found 2"),
        (pgs[0].send(&t, 0, 0, None), "send", "this rank 0, found 0"),
        (pgs[1].recv(&t, 5, 0, None), "recv", "found 5"),
        (pgs[1].recv(&t, 1, 0, None), "recv", "this rank 1, found 1"),
    ] {
        match result {
            Err(Error::InvalidCollective { op: o, reason }) => {
                assert_eq!(o, op);
                assert!(
                    reason.contains(found) && reason.contains("0..2"),
                    "{reason}"
                );
            }
            other => panic!("{other:?}"),
        }
    }
    let strided = Tensor::zeros(&[4, 4], DType::I32)
        .unwrap()
        .narrow(1, 0, 2)
        .unwrap();
    assert!(matches!(
        pgs[0].send(&strided, 1, 0, None),
        Err(Error::InvalidCollective { .. })
    ));
    assert!(matches!(
        pgs[1].recv_any_source(&strided, 0, None),
        Err(Error::InvalidCollective { .. })
    ));
    // Nothing was sent: the next message on tag 0 is the real one.
    on_every_rank(&pgs, |pg| {
        let t = Tensor::from_vec(vec![7u8 * pg.rank() as u8; 2], &[2]).unwrap();
        if pg.rank() == 1 {
            pg.send(&t, 0, 0, None).unwrap().wait().unwrap();
        } else {
            pg.recv(&t, 1, 0, None).unwrap().wait().unwrap();
            assert_eq!(t.to_vec::<u8>().unwrap(), [7, 7]);
        }
    });
}

fn a_size_mismatch_fails_the_receiver_naming_both_sizes_and_the_group_goes_on(
    choice: TransportChoice,
) {
    let pgs = groups(2, choice);
    on_every_rank(&pgs, |pg| {
        if pg.rank() == 0 {
            let big = Tensor::zeros(&[6], DType::I32).unwrap();
            pg.send(&big, 1, 4, None).unwrap().wait().unwrap();
            let ok = Tensor::from_vec(vec![5i32; 4], &[4]).unwrap();
            pg.send(&ok, 1, 4, None).unwrap().wait().unwrap();
        } else {
            let small = Tensor::zeros(&[4], DType::I32).unwrap();
            let w = pg.recv(&small, 0, 4, None).unwrap();
            assert!(w.wait_timeout(Duration::from_secs(30)));
            assert_eq!(w.source_rank(), None, "a failed receive has no source");
            match w.wait() {
                Err(Error::MessageSizeMismatch {
                    rank: 1,
                    peer: 0,
                    tag: 4,
                    expected: 16,
                    found: 24,
                }) => {}
                other => panic!("{other:?}"),
            }
            pg.recv(&small, 0, 4, None).unwrap().wait().unwrap();
            assert_eq!(small.to_vec::<i32>().unwrap(), [5; 4]);
        }
        let t = Tensor::from_vec(vec![1.5f64], &[1]).unwrap();
        pg.all_reduce(&t, ReduceOp::Sum, None)
            .unwrap()
            .wait()
            .unwrap();
        assert_eq!(t.to_vec::<f64>().unwrap(), [3.0]);
    });
}

fn receives_time_out_by_name_and_later_messages_still_arrive(choice: TransportChoice) {
    let pgs = groups(3, choice);
    let t = Tensor::zeros(&[2], DType::U8).unwrap();
    let started = Instant::now();
    let short = Some(Duration::from_millis(200));
    match pgs[0].recv(&t, 2, 11, short).unwrap().wait() {
        Err(Error::PeerTimeout {
            peer: 2,
            during,
            timeout,
        }) => {
            assert!(during.contains("tag 11"), "{during}");
            assert_eq!(timeout, Duration::from_millis(200));
        }
        other => panic!("{other:?}"),
    }
    match pgs[0].recv_any_source(&t, 12, short).unwrap().wait() {
        Err(Error::NoMessage {
            rank: 0,
            tag: 12,
            reason,
        }) => {
            assert!(reason.contains("200ms"), "{reason}");
        }
        other => panic!("{other:?}"),
    }
    assert!(started.elapsed() >= Duration::from_millis(400));
    let payload = Tensor::from_vec(vec![4u8, 2], &[2]).unwrap();
    pgs[2].send(&payload, 0, 11, None).unwrap().wait().unwrap();
    pgs[0].recv(&t, 2, 11, None).unwrap().wait().unwrap();
    assert_eq!(t.to_vec::<u8>().unwrap(), [4, 2]);
}

fn a_receive_from_a_dropped_peer_fails_at_once(choice: TransportChoice) {
    let mut pgs = groups(3, choice);
    let t = Tensor::zeros(&[2], DType::U8).unwrap();
    let pending = pgs[0].recv(&t, 2, 0, None).unwrap();
    let any = pgs[0].recv_any_source(&t, 1, None).unwrap();
    let started = Instant::now();
    drop(pgs.pop());
    match pending.wait() {
        Err(Error::PeerClosed { peer: 2, .. }) => {}
        other => panic!("{other:?}"),
    }
    assert!(!any.is_completed(), "rank 1 may still send");
    drop(pgs.pop());
    assert!(matches!(
        any.wait(),
        Err(Error::NoMessage {
            rank: 0,
            tag: 1,
            ..
        })
    ));
    assert!(started.elapsed() < Duration::from_secs(10));
}
