//! CUDA tensors through the CPU process group (staged through pinned host
//! memory): every collective on two ranks against a reference computed
//! from the rank numbers, sparse all-reduce, ranks mixing host and CUDA
//! tensors, ordering after the caller's current stream, and the errors.
//! Ranks are threads of this process sharing cuda:0. Each test prints a
//! line and returns when the machine has no GPU.
#![cfg(feature = "cuda")]

mod common;
mod cuda_spin;
mod skip;

use std::sync::Arc;

use tensorcomm::cpu::backend::ProcessGroupCpu;
use tensorcomm::cuda::intranode::AllReduceAlgo;
use tensorcomm::cuda::runtime::{self, set_current_stream, Stream};
use tensorcomm::group::{ProcessGroup, ReduceOp};
use tensorcomm::store::HashStore;
use tensorcomm::tensor::{DType, Device, SparseTensor, Tensor};
use tensorcomm::Error;

use common::{groups, on_every_rank};
use cuda_spin::{tensor_with_address, Spin};

use skip::has_gpu as can_run;

const GPU: Device = Device::Cuda(0);

/// Two CPU groups (ranks as threads) named `prefix`.
fn two_ranks(prefix: &str) -> Vec<ProcessGroupCpu> {
    groups(2, &Arc::new(HashStore::new()), prefix)
}

/// An f32 tensor of `values` on `device`.
fn on(device: Device, values: Vec<f32>, shape: &[usize]) -> Tensor<'static> {
    Tensor::from_vec(values, shape)
        .unwrap()
        .to_device(device)
        .unwrap()
}

/// `n` copies of `v` on the GPU.
fn full(v: f32, n: usize) -> Tensor<'static> {
    on(GPU, vec![v; n], &[n])
}

/// A GPU tensor of `n` elements holding a value no result has.
fn poisoned(n: usize) -> Tensor<'static> {
    full(-77.0, n)
}

fn get(t: &Tensor<'_>) -> Vec<f32> {
    t.to_vec::<f32>().unwrap()
}

/// Rank `r`'s data: `n` elements `10 r + i`.
fn rank_data(r: usize, n: usize) -> Vec<f32> {
    (0..n).map(|i| (10 * r + i) as f32).collect()
}

#[test]
fn every_collective_through_the_staged_path_gives_the_reference_result() {
    if !can_run("every_collective_through_the_staged_path_gives_the_reference_result") {
        return;
    }
    let pgs = two_ranks("every");
    on_every_rank(&pgs, |pg| {
        let (me, other) = (pg.rank(), 1 - pg.rank());
        let n = 6;

        // all_reduce, two ops.
        let t = on(GPU, rank_data(me, n), &[n]);
        pg.all_reduce(&t, ReduceOp::Sum, None)
            .unwrap()
            .synchronize()
            .unwrap();
        let sum: Vec<f32> = (0..n).map(|i| (10 + 2 * i) as f32).collect();
        assert_eq!(get(&t), sum, "all_reduce sum, rank {me}");
        let t = on(GPU, rank_data(me, n), &[n]);
        pg.all_reduce(&t, ReduceOp::Max, None)
            .unwrap()
            .synchronize()
            .unwrap();
        assert_eq!(get(&t), rank_data(1, n), "all_reduce max, rank {me}");

        // all_reduce_coalesced.
        let ts = [full(me as f32 + 1.0, 3), full(10.0 * (me as f32 + 1.0), 5)];
        pg.all_reduce_coalesced(&ts, ReduceOp::Sum, None)
            .unwrap()
            .synchronize()
            .unwrap();
        assert_eq!(get(&ts[0]), [3.0; 3]);
        assert_eq!(get(&ts[1]), [30.0; 5]);

        // broadcast from rank 1.
        let t = if me == 1 {
            on(GPU, rank_data(1, n), &[n])
        } else {
            poisoned(n)
        };
        pg.broadcast(&t, 1, None).unwrap().synchronize().unwrap();
        assert_eq!(get(&t), rank_data(1, n), "broadcast, rank {me}");

        // reduce to rank 0: the other rank's tensor is left as it was.
        let t = on(GPU, rank_data(me, n), &[n]);
        pg.reduce(&t, 0, ReduceOp::Sum, None)
            .unwrap()
            .synchronize()
            .unwrap();
        let want = if me == 0 {
            sum.clone()
        } else {
            rank_data(1, n)
        };
        assert_eq!(get(&t), want, "reduce, rank {me}");

        // all_gather and its forms.
        let input = on(GPU, rank_data(me, n), &[n]);
        let outs = [poisoned(n), poisoned(n)];
        pg.all_gather(&outs, &input, None)
            .unwrap()
            .synchronize()
            .unwrap();
        for (r, out) in outs.iter().enumerate() {
            assert_eq!(get(out), rank_data(r, n), "all_gather [{r}], rank {me}");
        }
        let gathered: Vec<f32> = [rank_data(0, n), rank_data(1, n)].concat();
        let out = poisoned(2 * n);
        pg.all_gather_into_tensor(&out, &input, None)
            .unwrap()
            .synchronize()
            .unwrap();
        assert_eq!(get(&out), gathered, "all_gather_into_tensor, rank {me}");
        let inputs = [input.clone(), full(me as f32, 2)];
        let lists = [
            vec![poisoned(n), poisoned(2)],
            vec![poisoned(n), poisoned(2)],
        ];
        pg.all_gather_coalesced(&lists, &inputs, None)
            .unwrap()
            .synchronize()
            .unwrap();
        for (r, list) in lists.iter().enumerate() {
            assert_eq!(get(&list[0]), rank_data(r, n));
            assert_eq!(get(&list[1]), [r as f32; 2]);
        }
        let outs = [poisoned(2 * n), poisoned(4)];
        pg.all_gather_into_tensor_coalesced(&outs, &inputs, None)
            .unwrap()
            .synchronize()
            .unwrap();
        assert_eq!(get(&outs[0]), gathered);
        assert_eq!(get(&outs[1]), [0.0, 0.0, 1.0, 1.0]);

        // gather to rank 1, scatter from rank 0.
        let list = [poisoned(n), poisoned(n)];
        let outputs = (me == 1).then_some(&list[..]);
        pg.gather(&input, outputs, 1, None)
            .unwrap()
            .synchronize()
            .unwrap();
        if me == 1 {
            assert_eq!(get(&list[0]), rank_data(0, n));
            assert_eq!(get(&list[1]), rank_data(1, n));
        }
        let pieces = [full(5.0, n), full(6.0, n)];
        let inputs = (me == 0).then_some(&pieces[..]);
        let out = poisoned(n);
        pg.scatter(&out, inputs, 0, None)
            .unwrap()
            .synchronize()
            .unwrap();
        assert_eq!(get(&out), vec![5.0 + me as f32; n], "scatter, rank {me}");

        // reduce_scatter and its forms: block r of the sum goes to rank r.
        let inputs = [full(me as f32 + 1.0, n), full(10.0 * (me as f32 + 1.0), n)];
        let out = poisoned(n);
        pg.reduce_scatter(&out, &inputs, ReduceOp::Sum, None)
            .unwrap()
            .synchronize()
            .unwrap();
        assert_eq!(get(&out), vec![if me == 0 { 3.0 } else { 30.0 }; n]);
        let big = on(GPU, [rank_data(me, n), rank_data(me, n)].concat(), &[2 * n]);
        let out = poisoned(n);
        pg.reduce_scatter_tensor(&out, &big, ReduceOp::Sum, None)
            .unwrap()
            .synchronize()
            .unwrap();
        assert_eq!(get(&out), sum, "reduce_scatter_tensor, rank {me}");
        let outs = [poisoned(n), poisoned(1)];
        let bigs = [big.clone(), full(me as f32 + 1.0, 2)];
        pg.reduce_scatter_tensor_coalesced(&outs, &bigs, ReduceOp::Sum, None)
            .unwrap()
            .synchronize()
            .unwrap();
        assert_eq!(get(&outs[0]), sum);
        assert_eq!(get(&outs[1]), [3.0]);

        // all_to_all: rank r sends 100 r + p to rank p.
        let inputs = [full((100 * me) as f32, 2), full((100 * me + 1) as f32, 2)];
        let outs = [poisoned(2), poisoned(2)];
        pg.all_to_all(&outs, &inputs, None)
            .unwrap()
            .synchronize()
            .unwrap();
        for (p, out) in outs.iter().enumerate() {
            assert_eq!(get(out), [(100 * p + me) as f32; 2], "all_to_all from {p}");
        }
        // all_to_all_single, even then uneven (rank r sends r + 1 rows to
        // each peer).
        let input = on(GPU, vec![me as f32, me as f32], &[2]);
        let out = poisoned(2);
        pg.all_to_all_single(&out, &input, &[], &[], None)
            .unwrap()
            .synchronize()
            .unwrap();
        assert_eq!(get(&out), [0.0, 1.0]);
        let rows = me + 1;
        let input = on(GPU, vec![me as f32; 2 * rows], &[2 * rows]);
        let out = poisoned(3);
        pg.all_to_all_single(&out, &input, &[1, 2], &[rows, rows], None)
            .unwrap()
            .synchronize()
            .unwrap();
        assert_eq!(get(&out), [0.0, 1.0, 1.0]);

        // send/recv both ways, then a barrier.
        let mine = full(me as f32 + 0.5, 4);
        let theirs = poisoned(4);
        let sent = pg.send(&mine, other, 7, None).unwrap();
        let got = pg.recv(&theirs, other, 7, None).unwrap();
        got.synchronize().unwrap();
        sent.synchronize().unwrap();
        assert_eq!(get(&theirs), [other as f32 + 0.5; 4]);
        pg.barrier(None).unwrap().wait().unwrap();
    });
}

#[test]
fn large_tensors_and_permuted_layouts_round_trip() {
    if !can_run("large_tensors_and_permuted_layouts_round_trip") {
        return;
    }
    let pgs = two_ranks("large");
    on_every_rank(&pgs, |pg| {
        let me = pg.rank() as f32;
        // 64 MiB, several times (pinned buffers are reused).
        let n = 16 << 20;
        for round in 0..3 {
            let t = full(me + round as f32, n);
            pg.all_reduce(&t, ReduceOp::Sum, None)
                .unwrap()
                .synchronize()
                .unwrap();
            let got = get(&t);
            assert!(
                got.iter().all(|&v| v == 1.0 + 2.0 * round as f32),
                "round {round}"
            );
        }
        // A transposed [3, 4] view travels in logical order.
        let base = on(GPU, (0..12).map(|i| i as f32 + me).collect(), &[4, 3]);
        let t = base.permute(&[1, 0]).unwrap();
        let want: Vec<f32> = get(&t).iter().map(|v| 2.0 * v + 1.0 - 2.0 * me).collect();
        pg.all_reduce(&t, ReduceOp::Sum, None)
            .unwrap()
            .synchronize()
            .unwrap();
        assert_eq!(get(&t), want);
    });
}

#[test]
fn ranks_may_mix_host_and_cuda_tensors() {
    if !can_run("ranks_may_mix_host_and_cuda_tensors") {
        return;
    }
    let pgs = two_ranks("mixed");
    on_every_rank(&pgs, |pg| {
        let me = pg.rank();
        // Rank 0 on the host, rank 1 on the GPU.
        let device = if me == 0 { Device::Cpu } else { GPU };
        let t = on(device, rank_data(me, 4), &[4]);
        pg.all_reduce(&t, ReduceOp::Sum, None)
            .unwrap()
            .synchronize()
            .unwrap();
        assert_eq!(get(&t), [10.0, 12.0, 14.0, 16.0], "rank {me}");
        assert_eq!(t.device(), device);
        let out = on(device, vec![-1.0; 8], &[8]);
        pg.all_gather_into_tensor(&out, &on(device, rank_data(me, 4), &[4]), None)
            .unwrap()
            .synchronize()
            .unwrap();
        assert_eq!(get(&out), [rank_data(0, 4), rank_data(1, 4)].concat());
        // Within one call too: a CUDA input gathered into host outputs.
        let outs = [
            on(Device::Cpu, vec![-1.0; 4], &[4]),
            on(Device::Cpu, vec![-1.0; 4], &[4]),
        ];
        pg.all_gather(&outs, &on(GPU, rank_data(me, 4), &[4]), None)
            .unwrap()
            .synchronize()
            .unwrap();
        assert_eq!(get(&outs[1]), rank_data(1, 4));
        // Sparse: host values on one rank, GPU values on the other.
        let values = on(device, vec![1.0 + me as f32], &[1]);
        let s = SparseTensor::new(vec![2], values, &[4]).unwrap();
        let sum = pg
            .all_reduce_sparse(&s, ReduceOp::Sum, None)
            .unwrap()
            .wait()
            .unwrap();
        assert_eq!(sum.device(), device);
        assert_eq!((sum.indices(), get(sum.values())), (&[2][..], vec![3.0]));
    });
}

#[test]
fn sparse_all_reduce_on_cuda_sums_overlapping_and_disjoint_entries() {
    if !can_run("sparse_all_reduce_on_cuda_sums_overlapping_and_disjoint_entries") {
        return;
    }
    let pgs = two_ranks("sparse");
    on_every_rank(&pgs, |pg| {
        let me = pg.rank();
        // Rows of a [5, 2] tensor: rank 0 has rows 1 and 3, rank 1 rows 3
        // and 4 (row 3 overlaps), each row [10 r + row, 1].
        let rows: Vec<i64> = if me == 0 { vec![3, 1] } else { vec![3, 4] };
        let values: Vec<f32> = rows
            .iter()
            .flat_map(|&row| [(10 * me) as f32 + row as f32, 1.0])
            .collect();
        let s = SparseTensor::new(rows, on(GPU, values, &[2, 2]), &[5, 2]).unwrap();
        let sum = pg
            .all_reduce_sparse(&s, ReduceOp::Sum, None)
            .unwrap()
            .wait()
            .unwrap();
        assert_eq!(sum.device(), GPU);
        assert!(sum.is_coalesced());
        assert_eq!(sum.indices(), [1, 3, 4]);
        // wait() ordered the current stream; the host reads after it.
        assert_eq!(
            get(sum.values()),
            [1.0, 1.0, 3.0 + 13.0, 2.0, 14.0, 1.0],
            "rank {me}"
        );
        // Disjoint: nothing to sum.
        let s =
            SparseTensor::new(vec![me as i64], on(GPU, vec![7.0, 8.0], &[1, 2]), &[5, 2]).unwrap();
        let sum = pg
            .all_reduce_sparse(&s, ReduceOp::Sum, None)
            .unwrap()
            .wait()
            .unwrap();
        assert_eq!(sum.indices(), [0, 1]);
        assert_eq!(get(sum.values()), [7.0, 8.0, 7.0, 8.0]);
    });
}

#[test]
fn sparse_errors_are_clear() {
    if !can_run("sparse_errors_are_clear") {
        return;
    }
    let pgs = two_ranks("sparse-errors");
    let s = SparseTensor::new(vec![0], full(1.0, 1), &[3]).unwrap();
    // Only SUM, refused on the calling rank.
    let err = pgs[0]
        .all_reduce_sparse(&s, ReduceOp::Max, None)
        .unwrap_err();
    assert!(matches!(err, Error::UnsupportedReduceOp { .. }), "{err}");
    assert!(err.to_string().contains("MAX"), "{err}");
    // One rank sparse, the other dense: both fail, naming the mismatch.
    let outcomes = on_every_rank(&pgs, |pg| {
        if pg.rank() == 0 {
            pg.all_reduce_sparse(&s, ReduceOp::Sum, None)
                .unwrap()
                .wait()
                .map(drop)
        } else {
            pg.all_reduce(&full(1.0, 3), ReduceOp::Sum, None)
                .unwrap()
                .synchronize()
        }
    });
    for (rank, outcome) in outcomes.into_iter().enumerate() {
        let text = outcome
            .expect_err("a sparse call against a dense one must fail")
            .to_string();
        assert!(
            text.contains("all_reduce_sparse") || text.to_lowercase().contains("mismatch"),
            "rank {rank}: {text}"
        );
    }
}

#[test]
fn tensors_on_two_gpus_in_one_call_are_refused() {
    if !can_run("tensors_on_two_gpus_in_one_call_are_refused") {
        return;
    }
    if runtime::device_count().unwrap() < 2 {
        skip::skipped("tensors_on_two_gpus_in_one_call_are_refused", "one GPU");
        return;
    }
    let pgs = two_ranks("two-gpus");
    let outs = [full(0.0, 2), on(Device::Cuda(1), vec![0.0; 2], &[2])];
    let err = pgs[0].all_gather(&outs, &full(1.0, 2), None).unwrap_err();
    let text = err.to_string();
    assert!(text.contains("cuda:0") && text.contains("cuda:1"), "{text}");
}

#[test]
fn collectives_follow_the_callers_stream_and_wait_orders_it_after_them() {
    if !can_run("collectives_follow_the_callers_stream_and_wait_orders_it_after_them") {
        return;
    }
    let pgs = two_ranks("streams");
    on_every_rank(&pgs, |pg| {
        let me = pg.rank();
        let mine = Stream::new(0).unwrap();
        let spin = Spin::load(&mine);
        let n = 1 << 16;
        let (input, input_addr) = tensor_with_address(&mine, n);
        let (check, check_addr) = tensor_with_address(&mine, n);
        let (got_p2p, got_addr) = tensor_with_address(&mine, n);
        let _current = set_current_stream(&mine);
        for round in 0..3 {
            let v = 3.0 + round as f32 + me as f32;
            // Written by a slow kernel just before the call: the call sees it.
            spin.fill_after(&mine, input_addr, n, v, 30);
            let work = pg.all_reduce(&input, ReduceOp::Sum, None).unwrap();
            // The host is not blocked on the device by wait(); work queued
            // after it on this stream sees the result.
            work.wait().unwrap();
            spin.copy(&mine, check_addr, input_addr, n);
            mine.synchronize().unwrap();
            let want = 7.0 + 2.0 * round as f32;
            let got = get(&check);
            assert!(
                got.iter().all(|&g| g == want),
                "round {round}: {:?}",
                &got[..4]
            );
        }
        // The same for a send (its copy down follows the stream) and a
        // receive (wait() orders the stream after its copy up).
        let other = 1 - me;
        spin.fill_after(&mine, input_addr, n, 40.0 + me as f32, 30);
        let sent = pg.send(&input, other, 1, None).unwrap();
        let got = pg.recv(&got_p2p, other, 1, None).unwrap();
        got.wait().unwrap();
        spin.copy(&mine, check_addr, got_addr, n);
        sent.wait().unwrap();
        mine.synchronize().unwrap();
        assert!(get(&check).iter().all(|&g| g == 40.0 + other as f32));
    });
}

#[test]
fn a_point_to_point_call_does_not_hold_an_earlier_all_reduce_behind_later_work() {
    if !can_run("a_point_to_point_call_does_not_hold_an_earlier_all_reduce_behind_later_work") {
        return;
    }
    // A large all_reduce (pipelined: its copies down are queued chunk by
    // chunk while it runs, the first only once its input is ready 200 ms
    // on), then a 4 s kernel on the caller's stream, then a send (rank 0)
    // or a receive (rank 1) of a small CUDA tensor. The point-to-point
    // copies wait for that kernel; the all_reduce's must not wait behind
    // them. A first round with 1 ms kernels loads the kernels and pools the
    // pinned buffers on both ranks before the timed round starts.
    let pgs = two_ranks("p2p-order");
    let both = std::sync::Barrier::new(2);
    on_every_rank(&pgs, |pg| {
        let (me, other) = (pg.rank(), 1 - pg.rank());
        let mine = Stream::new(0).unwrap();
        let spin = Spin::load(&mine);
        let n = 3 << 20; // 12 MiB
        let (input, input_addr) = tensor_with_address(&mine, n);
        let (scratch, scratch_addr) = tensor_with_address(&mine, 4);
        let small = full(me as f32, 4);
        let _current = set_current_stream(&mine);
        for (ready_ms, long_ms) in [(1, 1), (200, 4000)] {
            spin.fill_after(&mine, input_addr, n, 1.0 + me as f32, ready_ms);
            let first = pg.all_reduce(&input, ReduceOp::Sum, None).unwrap();
            spin.fill_after(&mine, scratch_addr, 4, 5.0, long_ms);
            let long_done = mine.record().unwrap();
            let p2p = if me == 0 {
                pg.send(&small, other, 3, None)
            } else {
                pg.recv(&small, other, 3, None)
            }
            .unwrap();
            first.synchronize().unwrap();
            if long_ms > 1 {
                assert!(
                    !long_done.query().unwrap(),
                    "rank {me}: the all_reduce waited for a kernel queued after it, behind a point-to-point call"
                );
            }
            p2p.synchronize().unwrap();
            mine.synchronize().unwrap();
            assert!(get(&input).iter().all(|&v| v == 3.0), "rank {me}");
            assert_eq!(get(&scratch), [5.0; 4], "rank {me}");
            assert_eq!(get(&small), [0.0; 4], "rank {me}: the message");
            assert_eq!(
                pg.pipelined_all_reduces() as usize,
                1 + usize::from(long_ms > 1)
            );
            both.wait();
        }
    });
}

#[test]
fn a_receive_lands_after_the_work_queued_before_it_on_the_callers_stream() {
    if !can_run("a_receive_lands_after_the_work_queued_before_it_on_the_callers_stream") {
        return;
    }
    // Rank 1 queues a slow kernel that writes its receive buffer, then
    // receives into that buffer; rank 0 fills its buffer with a 1 ms
    // kernel and sends it, so the message is on rank 1's host long before
    // rank 1's kernel is done. The copy up must wait for that kernel: the
    // buffer ends with the message, not with what the kernel wrote. The
    // message is what rank 0's kernel wrote (the send followed it).
    let pgs = two_ranks("recv-order");
    on_every_rank(&pgs, |pg| {
        let me = pg.rank();
        let mine = Stream::new(0).unwrap();
        let spin = Spin::load(&mine);
        let n = 1 << 16;
        let (buffer, buffer_addr) = tensor_with_address(&mine, n);
        let _current = set_current_stream(&mine);
        for (round, ms) in [(0, 1), (1, 1000)] {
            let message = 100.0 + round as f32;
            if me == 0 {
                spin.fill_after(&mine, buffer_addr, n, message, 1);
                let sent = pg.send(&buffer, 1, 7, None).unwrap();
                sent.wait().unwrap();
            } else {
                spin.fill_after(&mine, buffer_addr, n, -5.0, ms);
                let got = pg.recv(&buffer, 0, 7, None).unwrap();
                got.wait().unwrap();
            }
            mine.synchronize().unwrap();
            if me == 1 {
                let got = get(&buffer);
                assert!(
                    got.iter().all(|&g| g == message),
                    "round {round}: the receive's copy up did not follow the kernel queued before it: {:?}",
                    &got[..4]
                );
            }
        }
    });
}

#[test]
fn a_receive_landing_late_does_not_wait_for_work_queued_after_it() {
    if !can_run("a_receive_landing_late_does_not_wait_for_work_queued_after_it") {
        return;
    }
    // Rank 1 receives A, queues a 4 s kernel on its stream, then receives
    // B (whose copy up waits for that kernel). Rank 0 sends B first, and A
    // once rank 1 has had B land: A's copy up must not wait behind B's
    // wait for the kernel queued after A. Two rounds with 1 ms kernels
    // load the kernels and pool the pinned buffers. Every tensor is made
    // before the rounds: making one copies on the legacy stream, which
    // would wait for the kernel (ranks are threads sharing a context).
    let pgs = two_ranks("recv-late");
    let both = std::sync::Barrier::new(2);
    on_every_rank(&pgs, |pg| {
        let me = pg.rank();
        let mine = Stream::new(0).unwrap();
        let spin = Spin::load(&mine);
        let n = 1 << 14;
        let (scratch, scratch_addr) = tensor_with_address(&mine, 4);
        let rounds = [1, 1, 4000].map(|ms| (ms, poisoned(n), poisoned(n)));
        let (one, two) = (full(1.0, n), full(2.0, n));
        let _current = set_current_stream(&mine);
        let mut failures = Vec::new();
        for (long_ms, a, b) in &rounds {
            both.wait();
            if me == 0 {
                pg.send(&two, 1, 2, None).unwrap().synchronize().unwrap();
                both.wait();
                pg.send(&one, 1, 1, None).unwrap().synchronize().unwrap();
            } else {
                let got_a = pg.recv(a, 0, 1, None).unwrap();
                spin.fill_after(&mine, scratch_addr, 4, 5.0, *long_ms);
                let long_done = mine.record().unwrap();
                let got_b = pg.recv(b, 0, 2, None).unwrap();
                // B lands and its copy up is queued (behind the kernel).
                std::thread::sleep(std::time::Duration::from_millis(100));
                both.wait();
                got_a.synchronize().unwrap();
                let a_early = !long_done.query().unwrap();
                got_b.synchronize().unwrap();
                if !long_done.query().unwrap() {
                    failures.push(format!("{long_ms} ms: B's copy up ran before the kernel"));
                }
                if *long_ms > 1 && !a_early {
                    failures.push(format!(
                        "{long_ms} ms: a receive's copy up waited for a kernel queued after the receive, behind a later receive's wait"
                    ));
                }
                mine.synchronize().unwrap();
                let messages = get(a).iter().all(|&v| v == 1.0) && get(b).iter().all(|&v| v == 2.0);
                if !messages || get(&scratch) != [5.0; 4] {
                    failures.push(format!("{long_ms} ms: the messages or the kernel's write"));
                }
            }
        }
        // Told after every round, so that rank 0 is not left waiting.
        assert!(failures.is_empty(), "rank {me}: {failures:?}");
    });
}

/// Fills `n` elements at `addr` with `v` on `stream` (a kernel: no copy
/// on the legacy stream, which would wait for other threads' kernels).
fn refill(spin: &Spin, stream: &Stream, addr: u64, n: usize, v: f32) {
    spin.fill_after(stream, addr, n, v, 0);
}

#[test]
fn a_send_then_a_receive_into_the_same_tensor_sends_it_as_it_was() {
    if !can_run("a_send_then_a_receive_into_the_same_tensor_sends_it_as_it_was") {
        return;
    }
    // Rank 1 queues a kernel, then sends T (all 1.0) to rank 0 and
    // receives into T from rank 0, whose message (all 2.0) lands while the
    // kernel runs. When it ends, the send's copy down must read T before
    // the receive's copy up writes it. 64 MiB, so the copies would
    // overlap. Rounds with 1 ms kernels first: they load the kernels and
    // pool the pinned buffers.
    let pgs = two_ranks("send-then-recv");
    let both = std::sync::Barrier::new(2);
    on_every_rank(&pgs, |pg| {
        let me = pg.rank();
        let mine = Stream::new(0).unwrap();
        let spin = Spin::load(&mine);
        let n = 16 << 20;
        let (t, t_addr) = tensor_with_address(&mine, n);
        let (scratch, scratch_addr) = tensor_with_address(&mine, 4);
        let _current = set_current_stream(&mine);
        let mut failures = Vec::new();
        for ms in [1, 1, 1000] {
            refill(&spin, &mine, t_addr, n, 2.0 - me as f32);
            mine.synchronize().unwrap();
            both.wait();
            if me == 0 {
                pg.send(&t, 1, 2, None).unwrap().synchronize().unwrap();
                pg.recv(&t, 1, 1, None).unwrap().synchronize().unwrap();
                let got = get(&t);
                if !got.iter().all(|&v| v == 1.0) {
                    failures.push(format!(
                        "{ms} ms: rank 1 sent T after its receive wrote it: {} of {n} elements were 2.0",
                        got.iter().filter(|&&v| v == 2.0).count()
                    ));
                }
            } else {
                spin.fill_after(&mine, scratch_addr, 4, 5.0, ms);
                let sent = pg.send(&t, 0, 1, None).unwrap();
                let got = pg.recv(&t, 0, 2, None).unwrap();
                sent.synchronize().unwrap();
                got.synchronize().unwrap();
                if !get(&t).iter().all(|&v| v == 2.0) || get(&scratch) != [5.0; 4] {
                    failures.push(format!("{ms} ms: the message or the kernel's write"));
                }
            }
            both.wait();
        }
        // Failures are told after every round, so a failing rank does not
        // leave the other waiting at the barrier.
        assert!(failures.is_empty(), "rank {me}: {failures:?}");
    });
}

#[test]
fn dropped_works_keep_their_tensors_until_the_copies_are_done() {
    if !can_run("dropped_works_keep_their_tensors_until_the_copies_are_done") {
        return;
    }
    let pgs = two_ranks("dropped");
    on_every_rank(&pgs, |pg| {
        for _ in 0..20 {
            let t = full(1.0, 1 << 20);
            let work = pg.all_reduce(&t, ReduceOp::Sum, None).unwrap();
            // Neither the tensor nor the Work is kept by the caller.
            drop(t);
            drop(work);
        }
        let t = full(2.0, 4);
        pg.all_reduce(&t, ReduceOp::Sum, None)
            .unwrap()
            .synchronize()
            .unwrap();
        assert_eq!(get(&t), [4.0; 4]);
    });
    drop(pgs);
}

#[test]
fn back_to_back_calls_on_one_tensor_see_each_others_results() {
    if !can_run("back_to_back_calls_on_one_tensor_see_each_others_results") {
        return;
    }
    let pgs = two_ranks("back-to-back");
    on_every_rank(&pgs, |pg| {
        let me = pg.rank();
        // Rank 0 on the GPU, rank 1 on the host: the result must not depend
        // on where a rank keeps its tensor.
        let device = if me == 0 { GPU } else { Device::Cpu };
        for round in 0..20 {
            let t = on(device, vec![me as f32 + 1.0; 1024], &[1024]);
            // No wait between the calls: the second reads what the first
            // wrote (3 after the first, 6 after the second).
            let works: Vec<_> = (0..3)
                .map(|_| pg.all_reduce(&t, ReduceOp::Sum, None).unwrap())
                .collect();
            for w in works {
                w.synchronize().unwrap();
            }
            assert!(
                get(&t).iter().all(|&v| v == 12.0),
                "rank {me} round {round}: {:?}",
                &get(&t)[..4]
            );
        }
    });
}

#[test]
fn a_reducer_averages_cuda_gradients_through_the_cpu_group() {
    use tensorcomm::ddp::{AllReduceHook, CompressHook, Reducer, ReducerOptions, TensorSpec};
    if !can_run("a_reducer_averages_cuda_gradients_through_the_cpu_group") {
        return;
    }
    let pgs: Vec<Arc<dyn ProcessGroup>> = two_ranks("ddp-cuda")
        .into_iter()
        .map(|pg| Arc::new(pg) as Arc<dyn ProcessGroup>)
        .collect();
    let handles: Vec<_> = pgs
        .into_iter()
        .map(|pg| {
            std::thread::spawn(move || {
                let me = pg.rank();
                let specs = vec![
                    TensorSpec::new(&[64, 32], DType::F32).on(GPU),
                    TensorSpec::new(&[32], DType::F32).on(GPU),
                ];
                let hooks: [Arc<dyn tensorcomm::ddp::CommHook>; 2] =
                    [Arc::new(AllReduceHook), Arc::new(CompressHook::bf16())];
                for hook in hooks {
                    // Buckets of at most 64 bytes: the weight and the
                    // bias take one each, and the first is written back
                    // while the second may still be communicating.
                    let options = ReducerOptions {
                        first_bucket_bytes: 64,
                        bucket_cap_bytes: 64,
                        ..ReducerOptions::default()
                    };
                    let mut reducer =
                        Reducer::new(pg.clone(), specs.clone(), hook, options).unwrap();
                    assert_eq!(reducer.bucket_indices().len(), 2);
                    for step in 0..3 {
                        // Gradients rank + step + 1 (exact in bf16): the
                        // mean over 2 ranks is step + 1.5.
                        let v = (me + step) as f32 + 1.0;
                        let w = on(GPU, vec![v; 64 * 32], &[64, 32]);
                        let b = on(GPU, vec![v; 32], &[32]);
                        reducer.mark_ready(1, &b).unwrap();
                        reducer.mark_ready(0, &w).unwrap();
                        reducer.finish().unwrap();
                        let want = step as f32 + 1.5;
                        for t in [&w, &b] {
                            assert!(get(t).iter().all(|&x| x == want), "rank {me} step {step}");
                        }
                    }
                }
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
}

// ---- the device path (peer memory) ------------------------------------------

/// Two CPU groups (ranks as threads) with the device path on cuda:0,
/// which both ranks share (`PeerPolicy::Shared`).
fn two_ranks_with_peer_memory(prefix: &str) -> Vec<ProcessGroupCpu> {
    use tensorcomm::cuda::intranode::{IntraNodeOptions, PeerPolicy};
    two_ranks_asking_peer_memory(
        prefix,
        IntraNodeOptions {
            policy: Some(PeerPolicy::Shared),
            region_bytes: Some(1 << 20),
            ..IntraNodeOptions::default()
        },
    )
}

/// Two ranks (threads sharing cuda:0) of groups created with peer memory
/// asked for with `options` (whether they get it depends on the policy).
fn two_ranks_asking_peer_memory(
    prefix: &str,
    options: tensorcomm::cuda::intranode::IntraNodeOptions,
) -> Vec<ProcessGroupCpu> {
    use tensorcomm::cpu::backend::{CpuOptions, PeerMemory};
    let store = Arc::new(HashStore::new());
    std::thread::scope(|s| {
        let hs: Vec<_> = (0..2)
            .map(|rank| {
                let (store, options) = (store.clone(), options.clone());
                s.spawn(move || {
                    let options = CpuOptions {
                        timeout: std::time::Duration::from_secs(60),
                        peer_memory: Some(PeerMemory { device: 0, options }),
                        ..CpuOptions::default()
                    };
                    ProcessGroupCpu::new(store, prefix, rank, 2, &options).unwrap()
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

#[test]
fn all_reduce_of_cuda_tensors_takes_the_device_path_when_every_rank_can() {
    if !can_run("all_reduce_of_cuda_tensors_takes_the_device_path_when_every_rank_can") {
        return;
    }
    let pgs = two_ranks_with_peer_memory("device-path");
    on_every_rank(&pgs, |pg| {
        // Each rank queues on its own stream (ranks of one process).
        let mine = Stream::new(0).unwrap();
        let _current = set_current_stream(&mine);
        let peer = pg.intranode().expect("peer memory set up");
        let me = pg.rank();
        let n = 3000;
        let mut calls = 0;
        for (op, want) in [(ReduceOp::Sum, 1.0f32), (ReduceOp::Avg, 0.5)] {
            for round in 0..3 {
                let t = on(GPU, rank_data(me, n), &[n]);
                let work = pg.all_reduce(&t, op, None).unwrap();
                work.wait().unwrap();
                mine.synchronize().unwrap();
                calls += 1;
                let got = get(&t);
                let reference: Vec<f32> = (0..n)
                    .map(|i| (rank_data(0, n)[i] + rank_data(1, n)[i]) * want)
                    .collect();
                assert_eq!(got, reference, "{op:?} round {round}");
            }
        }
        let u = peer.usage();
        assert_eq!((u.push, u.none), (calls, 0), "{u:?}");
        // A bigger bf16 tensor (two-shot where the world size's one-shot
        // limit is below 600 KB), through synchronize().
        let big = 300_000;
        let values: Vec<half::bf16> = (0..big)
            .map(|i| half::bf16::from_f32((i % 7 + me) as f32))
            .collect();
        let t = Tensor::from_vec(values, &[big])
            .unwrap()
            .to_device(GPU)
            .unwrap();
        let algo = peer.select_all_reduce_algo(&t, ReduceOp::Sum);
        assert!(
            matches!(algo, AllReduceAlgo::OneShot | AllReduceAlgo::TwoShot),
            "{algo:?}"
        );
        pg.all_reduce(&t, ReduceOp::Sum, None)
            .unwrap()
            .synchronize()
            .unwrap();
        let got = t.to_vec::<half::bf16>().unwrap();
        assert!(got
            .iter()
            .enumerate()
            .all(|(i, v)| v.to_f32() == (2 * (i % 7) + 1) as f32));
        let after = peer.usage();
        let ran = match algo {
            AllReduceAlgo::OneShot => after.one_shot - u.one_shot,
            _ => after.two_shot - u.two_shot,
        };
        assert_eq!((ran, after.none), (1, 0), "{after:?}");
    });
}

#[test]
fn the_device_path_group_stages_what_not_every_rank_can_take() {
    if !can_run("the_device_path_group_stages_what_not_every_rank_can_take") {
        return;
    }
    let pgs = two_ranks_with_peer_memory("device-path-fallback");
    on_every_rank(&pgs, |pg| {
        let mine = Stream::new(0).unwrap();
        let _current = set_current_stream(&mine);
        let me = pg.rank();
        let n = 64;
        let reference: Vec<f32> = (0..n)
            .map(|i| rank_data(0, n)[i] + rank_data(1, n)[i])
            .collect();
        // Rank 0 passes a host tensor, rank 1 a CUDA tensor.
        let device = if me == 0 { Device::Cpu } else { GPU };
        let t = on(device, rank_data(me, n), &[n]);
        pg.all_reduce(&t, ReduceOp::Sum, None)
            .unwrap()
            .synchronize()
            .unwrap();
        assert_eq!(get(&t), reference, "mixed placements");
        // PRODUCT and i64 are not the device path's.
        let t = on(GPU, vec![2.0; n], &[n]);
        pg.all_reduce(&t, ReduceOp::Product, None)
            .unwrap()
            .synchronize()
            .unwrap();
        assert_eq!(get(&t), vec![4.0; n], "product");
        let ints = Tensor::from_vec(vec![me as i64 + 1; n], &[n])
            .unwrap()
            .to_device(GPU)
            .unwrap();
        pg.all_reduce(&ints, ReduceOp::Sum, None)
            .unwrap()
            .synchronize()
            .unwrap();
        assert_eq!(ints.to_vec::<i64>().unwrap(), vec![3; n], "i64");
        let u = pg.intranode().unwrap().usage();
        assert_eq!(
            (u.push + u.one_shot + u.two_shot + u.large, u.none),
            (0, 3),
            "{u:?}"
        );
        // Other collectives of CUDA tensors are staged as before.
        let b = on(GPU, vec![me as f32 + 5.0; n], &[n]);
        pg.broadcast(&b, 1, None).unwrap().synchronize().unwrap();
        assert_eq!(get(&b), vec![6.0; n]);
    });
}

#[test]
fn a_group_that_cannot_use_peer_memory_stages_and_says_why() {
    if !can_run("a_group_that_cannot_use_peer_memory_stages_and_says_why") {
        return;
    }
    use tensorcomm::cuda::intranode::{IntraNodeOptions, PeerPolicy};
    let pgs = two_ranks_asking_peer_memory(
        "no-peer",
        IntraNodeOptions {
            policy: Some(PeerPolicy::Auto),
            ..IntraNodeOptions::default()
        },
    );
    on_every_rank(&pgs, |pg| {
        assert!(pg.intranode().is_none());
        assert!(
            pg.intranode_reason().contains("share one GPU"),
            "{}",
            pg.intranode_reason()
        );
        let t = full(pg.rank() as f32, 10);
        pg.all_reduce(&t, ReduceOp::Sum, None)
            .unwrap()
            .synchronize()
            .unwrap();
        assert_eq!(get(&t), vec![1.0; 10]);
    });
}

#[test]
fn small_tensors_of_every_byte_length_shape_copy_back_whole() {
    // Results under 32 KiB go back to the GPU as copies of several rows
    // (see `SMALL_HTOD_BYTES`): odd, prime, even and boundary byte counts
    // must all arrive whole, and the bytes around them untouched.
    if !can_run("small_tensors_of_every_byte_length_shape_copy_back_whole") {
        return;
    }
    let pgs = two_ranks("small-rows");
    on_every_rank(&pgs, |pg| {
        let me = pg.rank();
        for len in [1usize, 2, 3, 7, 9, 15, 4093, 4096, 32767, 32768, 32769] {
            // A u8 tensor of `len` bytes in the middle of a larger one,
            // whose other bytes must keep their value.
            let backing: Vec<u8> = (0..len + 64).map(|i| (i % 7) as u8).collect();
            let whole = Tensor::from_vec(backing.clone(), &[len + 64])
                .unwrap()
                .to_device(GPU)
                .unwrap();
            let part = whole.narrow(0, 32, len).unwrap();
            let host_part = Tensor::from_vec(vec![me as u8 + 1; len], &[len]).unwrap();
            part.copy_from(&host_part).unwrap();
            pg.all_reduce(&part, ReduceOp::Sum, None)
                .unwrap()
                .synchronize()
                .unwrap();
            let got = whole.to_vec::<u8>().unwrap();
            assert!(
                got[32..32 + len].iter().all(|&v| v == 3),
                "rank {me}, {len} bytes"
            );
            assert_eq!(
                got[..32],
                backing[..32],
                "rank {me}, {len} bytes: bytes before"
            );
            assert_eq!(
                got[32 + len..],
                backing[32 + len..],
                "rank {me}, {len} bytes: bytes after"
            );
        }
    });
}

#[test]
fn large_all_reduces_stage_in_pipelined_chunks_when_some_rank_passes_a_cuda_tensor() {
    if !can_run("large_all_reduces_stage_in_pipelined_chunks_when_some_rank_passes_a_cuda_tensor") {
        return;
    }
    // Peer memory asked for, which two ranks on one GPU do not get (`auto`):
    // large all_reduces still vote to pipeline their staging.
    let pgs = two_ranks_asking_peer_memory("pipelined", Default::default());
    on_every_rank(&pgs, |pg| {
        let me = pg.rank();
        assert!(
            pg.intranode().is_none(),
            "two ranks on one GPU: no peer memory"
        );
        // 3M + 5 f32 (12 MiB and a ragged last chunk); inputs exact in f32.
        let n = 3 * (1 << 20) + 5;
        let inputs: Vec<Vec<f32>> = (0..2)
            .map(|r| (0..n).map(|i| ((i * 7 + r * 3) % 101) as f32).collect())
            .collect();
        let input = |r: usize| inputs[r].clone();
        let sum: Vec<f32> = (0..n).map(|i| inputs[0][i] + inputs[1][i]).collect();
        let mut expected_chunked = 0;
        // Both ranks on the GPU; SUM and AVG.
        for (op, want) in [
            (ReduceOp::Sum, sum.clone()),
            (
                ReduceOp::Avg,
                sum.iter().map(|v| v / 2.0).collect::<Vec<_>>(),
            ),
        ] {
            let t = on(GPU, input(me), &[n]);
            pg.all_reduce(&t, op, None).unwrap().synchronize().unwrap();
            expected_chunked += 1;
            assert!(get(&t) == want, "rank {me}: {op} on two GPU tensors");
            assert_eq!(pg.pipelined_all_reduces(), expected_chunked);
        }
        // Rank 1 on the host: both still cut the message the same way.
        let device = if me == 0 { GPU } else { Device::Cpu };
        let t = on(device, input(me), &[n]);
        pg.all_reduce(&t, ReduceOp::Sum, None)
            .unwrap()
            .synchronize()
            .unwrap();
        expected_chunked += 1;
        assert!(get(&t) == sum, "rank {me}: mixed placements");
        assert_eq!(pg.pipelined_all_reduces(), expected_chunked);
        // 2 MiB, the smallest message cut.
        let two = on(GPU, input(me)[..1 << 19].to_vec(), &[1 << 19]);
        pg.all_reduce(&two, ReduceOp::Sum, None)
            .unwrap()
            .synchronize()
            .unwrap();
        expected_chunked += 1;
        assert!(get(&two) == sum[..1 << 19], "rank {me}: 2 MiB");
        assert_eq!(pg.pipelined_all_reduces(), expected_chunked);
        // Both on the host, a permuted CUDA tensor, or under 2 MiB: whole.
        let t = on(Device::Cpu, input(me), &[n]);
        pg.all_reduce(&t, ReduceOp::Sum, None)
            .unwrap()
            .wait()
            .unwrap();
        assert!(get(&t) == sum, "rank {me}: host tensors");
        let rows = (n - 5) / 1024;
        let square = on(GPU, input(me)[..rows * 1024].to_vec(), &[rows, 1024]);
        let permuted = square.permute(&[1, 0]).unwrap();
        pg.all_reduce(&permuted, ReduceOp::Sum, None)
            .unwrap()
            .synchronize()
            .unwrap();
        assert!(get(&square) == sum[..rows * 1024], "rank {me}: permuted");
        let small = on(GPU, input(me)[..(1 << 19) - 1].to_vec(), &[(1 << 19) - 1]);
        pg.all_reduce(&small, ReduceOp::Sum, None)
            .unwrap()
            .synchronize()
            .unwrap();
        assert!(
            get(&small) == sum[..(1 << 19) - 1],
            "rank {me}: under 2 MiB"
        );
        assert_eq!(pg.pipelined_all_reduces(), expected_chunked);
        // Back to back without waiting: the second reads the first's result.
        let t = on(GPU, input(me), &[n]);
        let first = pg.all_reduce(&t, ReduceOp::Sum, None).unwrap();
        let second = pg.all_reduce(&t, ReduceOp::Sum, None).unwrap();
        first.synchronize().unwrap();
        second.synchronize().unwrap();
        let twice: Vec<f32> = sum.iter().map(|v| 2.0 * v).collect();
        assert!(get(&t) == twice, "rank {me}: back to back");
    });
}

#[test]
fn a_default_group_on_a_gpu_host_pipelines_large_staged_all_reduces() {
    if !can_run("a_default_group_on_a_gpu_host_pipelines_large_staged_all_reduces") {
        return;
    }
    // No peer memory asked for: the ranks' hosts have GPUs, so large
    // all_reduces still vote, and CUDA tensors are staged in chunks.
    let pgs = two_ranks("default-pipelined");
    on_every_rank(&pgs, |pg| {
        let me = pg.rank();
        assert!(pg.intranode().is_none(), "no peer memory asked for");
        let n = (5 << 18) + 3; // 5 MiB and 12 bytes: ragged chunks
                               // Rank r's element i: 10 r + i % 1000 (exact in f32).
        let input = |r: usize| -> Vec<f32> { (0..n).map(|i| (10 * r + i % 1000) as f32).collect() };
        let sum: Vec<f32> = (0..n).map(|i| (10 + 2 * (i % 1000)) as f32).collect();
        let t = on(GPU, input(me), &[n]);
        pg.all_reduce(&t, ReduceOp::Sum, None)
            .unwrap()
            .synchronize()
            .unwrap();
        assert!(get(&t) == sum, "rank {me}: default group, both on the GPU");
        assert_eq!(pg.pipelined_all_reduces(), 1);
        // One rank on the host: both cut the message alike.
        let device = if me == 0 { Device::Cpu } else { GPU };
        let t = on(device, input(me), &[n]);
        pg.all_reduce(&t, ReduceOp::Sum, None)
            .unwrap()
            .synchronize()
            .unwrap();
        assert!(get(&t) == sum, "rank {me}: default group, mixed placements");
        assert_eq!(pg.pipelined_all_reduces(), 2);
        // Host tensors only: voted, not cut.
        let t = on(Device::Cpu, input(me), &[n]);
        pg.all_reduce(&t, ReduceOp::Sum, None)
            .unwrap()
            .wait()
            .unwrap();
        assert!(get(&t) == sum, "rank {me}: default group, host tensors");
        assert_eq!(pg.pipelined_all_reduces(), 2);
    });
}

#[test]
fn pipelined_all_reduces_match_the_reference_at_two_and_four_ranks() {
    if !can_run("pipelined_all_reduces_match_the_reference_at_two_and_four_ranks") {
        return;
    }
    // Large all_reduces of CUDA tensors in a default group on a GPU host
    // are staged in pipelined chunks: sizes at and past the 2 MiB
    // threshold, many chunks with ragged ends, SUM, MAX and AVG, a host
    // tensor on one rank, back to back.
    for world in [2, 4] {
        let pgs = groups(
            world,
            &Arc::new(HashStore::new()),
            &format!("pipelined{world}"),
        );
        on_every_rank(&pgs, |pg| {
            let me = pg.rank();
            let input = |r: usize, n: usize| -> Vec<f32> {
                (0..n).map(|i| ((i * 7 + r * 13) % 251) as f32).collect()
            };
            let mut chunked = 0;
            for n in [1 << 19, (1 << 19) + 1, (3 << 20) + 7, 9 << 20] {
                let inputs: Vec<Vec<f32>> = (0..world).map(|r| input(r, n)).collect();
                for op in [ReduceOp::Sum, ReduceOp::Max, ReduceOp::Avg] {
                    let want: Vec<f32> = (0..n)
                        .map(|i| {
                            let all = inputs.iter().map(|x| x[i]);
                            match op {
                                ReduceOp::Max => all.fold(f32::MIN, f32::max),
                                ReduceOp::Avg => all.sum::<f32>() / world as f32,
                                _ => all.sum(),
                            }
                        })
                        .collect();
                    // The last rank passes a host tensor for SUM.
                    let device = if op == ReduceOp::Sum && me == world - 1 {
                        Device::Cpu
                    } else {
                        GPU
                    };
                    let t = on(device, inputs[me].clone(), &[n]);
                    pg.all_reduce(&t, op, None).unwrap().synchronize().unwrap();
                    chunked += 1;
                    assert!(get(&t) == want, "{world} ranks, rank {me}: {op} of {n}");
                    assert_eq!(
                        pg.pipelined_all_reduces(),
                        chunked,
                        "rank {me}: {op} of {n}"
                    );
                }
            }
            // Back to back without waiting, on one tensor.
            let n = 5 << 20;
            let t = on(GPU, input(me, n), &[n]);
            let works: Vec<_> = (0..3)
                .map(|_| pg.all_reduce(&t, ReduceOp::Sum, None).unwrap())
                .collect();
            for w in works {
                w.synchronize().unwrap();
            }
            let cubed = (world * world * world) as f32;
            let inputs: Vec<Vec<f32>> = (0..world).map(|r| input(r, n)).collect();
            let want: Vec<f32> = (0..n)
                .map(|i| inputs.iter().map(|x| x[i]).sum::<f32>() * cubed / world as f32)
                .collect();
            assert!(get(&t) == want, "{world} ranks, rank {me}: back to back");
        });
    }
}
