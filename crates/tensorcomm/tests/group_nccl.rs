//! The NCCL process group on one GPU (world size 1, and a second rank that
//! never comes): every collective against its reference result, stream
//! order, the watchdog, keeping tensors alive, sub-groups and the errors.
//! Each test prints a line and returns when the machine has no GPU or no
//! NCCL.
#![cfg(feature = "cuda")]

mod cuda_spin;
mod nccl_data;
mod skip;

use std::sync::Arc;
use std::time::{Duration, Instant};

use tensorcomm::cuda::nccl::{self, NcclOptions, ProcessGroupNccl};
use tensorcomm::cuda::runtime::{set_current_stream, Stream};
use tensorcomm::group::{ProcessGroup, ReduceOp};
use tensorcomm::store::HashStore;
use tensorcomm::tensor::{DType, Tensor};
use tensorcomm::Error;

use cuda_spin::{tensor_with_address, Spin};
use nccl_data::{data, ops_for, read as values, DTYPES};

/// True when this machine can run NCCL on a GPU; prints why not.
fn can_run(test: &str) -> bool {
    if !skip::has_gpu(test) {
        return false;
    }
    match nccl::version() {
        Ok(_) => true,
        Err(e) => {
            skip::skipped(test, e);
            false
        }
    }
}

fn group() -> ProcessGroupNccl {
    let options = NcclOptions {
        timeout: Duration::from_secs(60),
        device: Some(0),
    };
    ProcessGroupNccl::new(Arc::new(HashStore::new()), "pg", 0, 1, &options).unwrap()
}

/// A tensor of `dtype` holding `values` on GPU 0.
fn gpu(dtype: DType, values: &[f64], shape: &[usize]) -> Tensor<'static> {
    nccl_data::gpu(dtype, values, shape, 0)
}

/// A tensor of `dtype` on GPU 0 filled with a value no result has.
fn poisoned(dtype: DType, shape: &[usize]) -> Tensor<'static> {
    nccl_data::poisoned(dtype, shape, 0)
}

/// What one rank's reduction gives: the value, scaled by PREMUL_SUM.
fn reduced(op: ReduceOp, v: &[f64]) -> Vec<f64> {
    match op {
        ReduceOp::PremulSum(f) => v.iter().map(|x| x * f).collect(),
        _ => v.to_vec(),
    }
}

fn close(got: &[f64], want: &[f64], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!(
            (g - w).abs() <= 1e-2 * w.abs().max(1.0),
            "{what}: element {i}: got {g}, want {w}"
        );
    }
}

#[test]
fn every_collective_on_one_rank_gives_the_reference_result() {
    if !can_run("every_collective_on_one_rank_gives_the_reference_result") {
        return;
    }
    let pg = group();
    assert_eq!((pg.rank(), pg.size(), pg.device()), (0, 1, 0));
    for dtype in DTYPES {
        let x = data(24, 5);
        for op in ops_for(dtype) {
            let what = format!("{dtype} {op}");
            let t = gpu(dtype, &x, &[4, 6]);
            pg.all_reduce(&t, op, None).unwrap().synchronize().unwrap();
            close(&values(&t), &reduced(op, &x), &format!("all_reduce {what}"));

            let t = gpu(dtype, &x, &[24]);
            pg.reduce(&t, 0, op, None).unwrap().synchronize().unwrap();
            close(&values(&t), &reduced(op, &x), &format!("reduce {what}"));

            let (a, b) = (gpu(dtype, &x[..8], &[8]), gpu(dtype, &x[8..], &[16]));
            pg.all_reduce_coalesced(&[a.clone(), b.clone()], op, None)
                .unwrap()
                .synchronize()
                .unwrap();
            close(
                &values(&a),
                &reduced(op, &x[..8]),
                &format!("coalesced {what}"),
            );
            close(
                &values(&b),
                &reduced(op, &x[8..]),
                &format!("coalesced {what}"),
            );

            let out = poisoned(dtype, &[24]);
            let input = gpu(dtype, &x, &[24]);
            pg.reduce_scatter_tensor(&out, &input, op, None)
                .unwrap()
                .synchronize()
                .unwrap();
            close(
                &values(&out),
                &reduced(op, &x),
                &format!("reduce_scatter_tensor {what}"),
            );

            let out = poisoned(dtype, &[24]);
            pg.reduce_scatter(&out, std::slice::from_ref(&input), op, None)
                .unwrap()
                .synchronize()
                .unwrap();
            close(
                &values(&out),
                &reduced(op, &x),
                &format!("reduce_scatter {what}"),
            );

            let outs = [poisoned(dtype, &[8]), poisoned(dtype, &[16])];
            let ins = [gpu(dtype, &x[..8], &[8]), gpu(dtype, &x[8..], &[16])];
            pg.reduce_scatter_tensor_coalesced(&outs, &ins, op, None)
                .unwrap()
                .synchronize()
                .unwrap();
            close(
                &values(&outs[0]),
                &reduced(op, &x[..8]),
                &format!("rs coalesced {what}"),
            );
            close(
                &values(&outs[1]),
                &reduced(op, &x[8..]),
                &format!("rs coalesced {what}"),
            );
        }

        let what = format!("{dtype}");
        let input = gpu(dtype, &x, &[4, 6]);
        let t = gpu(dtype, &x, &[24]);
        pg.broadcast(&t, 0, None).unwrap().synchronize().unwrap();
        close(&values(&t), &x, &format!("broadcast {what}"));

        let out = poisoned(dtype, &[4, 6]);
        pg.all_gather(std::slice::from_ref(&out), &input, None)
            .unwrap()
            .synchronize()
            .unwrap();
        close(&values(&out), &x, &format!("all_gather {what}"));

        let out = poisoned(dtype, &[4, 6]);
        pg.all_gather_into_tensor(&out, &input, None)
            .unwrap()
            .synchronize()
            .unwrap();
        close(&values(&out), &x, &format!("all_gather_into_tensor {what}"));

        let small = gpu(dtype, &x[..4], &[4]);
        // One list per rank, one tensor per input in each.
        let outs = vec![vec![poisoned(dtype, &[4, 6]), poisoned(dtype, &[4])]];
        pg.all_gather_coalesced(&outs, &[input.clone(), small.clone()], None)
            .unwrap()
            .synchronize()
            .unwrap();
        close(
            &values(&outs[0][0]),
            &x,
            &format!("all_gather_coalesced {what}"),
        );
        close(
            &values(&outs[0][1]),
            &x[..4],
            &format!("all_gather_coalesced {what}"),
        );

        let outs = [poisoned(dtype, &[4, 6]), poisoned(dtype, &[4])];
        pg.all_gather_into_tensor_coalesced(&outs, &[input.clone(), small.clone()], None)
            .unwrap()
            .synchronize()
            .unwrap();
        close(
            &values(&outs[0]),
            &x,
            &format!("ag into tensor coalesced {what}"),
        );
        close(
            &values(&outs[1]),
            &x[..4],
            &format!("ag into tensor coalesced {what}"),
        );

        let out = poisoned(dtype, &[4, 6]);
        pg.gather(&input, Some(std::slice::from_ref(&out)), 0, None)
            .unwrap()
            .synchronize()
            .unwrap();
        close(&values(&out), &x, &format!("gather {what}"));

        let out = poisoned(dtype, &[4, 6]);
        pg.scatter(&out, Some(std::slice::from_ref(&input)), 0, None)
            .unwrap()
            .synchronize()
            .unwrap();
        close(&values(&out), &x, &format!("scatter {what}"));

        let out = poisoned(dtype, &[4, 6]);
        pg.all_to_all(
            std::slice::from_ref(&out),
            std::slice::from_ref(&input),
            None,
        )
        .unwrap()
        .synchronize()
        .unwrap();
        close(&values(&out), &x, &format!("all_to_all {what}"));

        for splits in [&[][..], &[4][..]] {
            let out = poisoned(dtype, &[4, 6]);
            pg.all_to_all_single(&out, &input, splits, splits, None)
                .unwrap()
                .synchronize()
                .unwrap();
            close(
                &values(&out),
                &x,
                &format!("all_to_all_single {what} {splits:?}"),
            );
        }
    }
    pg.barrier(None).unwrap().wait().unwrap();
    let recorded = pg.flight_recorder_json();
    assert!(recorded.contains("all_to_all_single"), "{recorded}");
}

#[test]
fn a_rank_that_never_joins_ends_init_with_a_named_timeout() {
    if !can_run("a_rank_that_never_joins_ends_init_with_a_named_timeout") {
        return;
    }
    let options = NcclOptions {
        timeout: Duration::from_secs(3),
        device: Some(0),
    };
    let started = Instant::now();
    let err = ProcessGroupNccl::new(Arc::new(HashStore::new()), "pg", 0, 2, &options).unwrap_err();
    let took = started.elapsed();
    match &err {
        Error::NcclInitTimeout {
            rank: 0,
            size: 2,
            joined: 1,
            ..
        } => {}
        other => panic!("expected NcclInitTimeout, got {other}"),
    }
    assert!(err.to_string().contains("1 of 2 ranks had joined"), "{err}");
    assert!(took < Duration::from_secs(20), "took {took:?}");
    // The process stays usable: a group of one still works.
    let pg = group();
    let t = gpu(DType::F32, &[1.0, 2.0], &[2]);
    pg.all_reduce(&t, ReduceOp::PremulSum(3.0), None)
        .unwrap()
        .synchronize()
        .unwrap();
    assert_eq!(values(&t), [3.0, 6.0]);
}

#[test]
fn collectives_follow_the_callers_stream_and_wait_orders_it_after_them() {
    if !can_run("collectives_follow_the_callers_stream_and_wait_orders_it_after_them") {
        return;
    }
    let pg = group();
    let mine = Stream::new(0).unwrap();
    let spin = Spin::load(&mine);
    let n = 1 << 16;
    let (input, input_addr) = tensor_with_address(&mine, n);
    let (check, check_addr) = tensor_with_address(&mine, n);
    let _current = set_current_stream(&mine);
    for round in 0..3 {
        let v = 3.0 + round as f32;
        // Written by a slow kernel just before the call: the call sees it.
        spin.fill_after(&mine, input_addr, n, v, 30);
        let work = pg
            .all_reduce(&input, ReduceOp::PremulSum(2.0), None)
            .unwrap();
        // After wait(), work on this stream sees the result.
        work.wait().unwrap();
        spin.copy(&mine, check_addr, input_addr, n);
        mine.synchronize().unwrap();
        let got = check.to_vec::<f32>().unwrap();
        assert!(
            got.iter().all(|&g| g == 2.0 * v),
            "round {round}: {:?}",
            &got[..4]
        );
    }
}

#[test]
fn a_collective_past_its_deadline_fails_every_pending_work_and_breaks_the_group() {
    if !can_run("a_collective_past_its_deadline_fails_every_pending_work_and_breaks_the_group") {
        return;
    }
    // The group's timeout also bounds its creation, which can take longer
    // than this test's deadline when other tests create groups at once:
    // the deadline is the calls' own.
    let pg = group();
    let deadline = Some(Duration::from_millis(300));
    let mine = Stream::new(0).unwrap();
    let spin = Spin::load(&mine);
    let (input, addr) = tensor_with_address(&mine, 256);
    let _current = set_current_stream(&mine);
    // The caller's stream is busy for ~3 s, so the collective can't start.
    spin.fill_after(&mine, addr, 256, 1.0, 3000);
    let first = pg.all_reduce(&input, ReduceOp::Sum, deadline).unwrap();
    let second = pg.broadcast(&input, 0, deadline).unwrap();
    let started = Instant::now();
    let err = first.synchronize().unwrap_err();
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "{:?}",
        started.elapsed()
    );
    let text = err.to_string();
    assert!(
        text.contains("all_reduce") && text.contains("seq 0"),
        "{text}"
    );
    assert!(text.contains("did not finish on the device"), "{text}");
    assert!(text.contains("last started seq"), "{text}");
    assert!(second.synchronize().is_err());
    let later = pg.all_reduce(&input, ReduceOp::Sum, None).unwrap().wait();
    assert!(matches!(later, Err(Error::GroupBroken { .. })), "{later:?}");
    mine.synchronize().unwrap();
}

#[test]
fn a_collective_keeps_its_tensors_alive_until_the_device_is_done() {
    if !can_run("a_collective_keeps_its_tensors_alive_until_the_device_is_done") {
        return;
    }
    let pg = group();
    let t = gpu(DType::F32, &data(1 << 20, 1), &[1 << 20]);
    assert_eq!(t.storage_handle_count(), 1);
    let work = pg.all_reduce(&t, ReduceOp::Sum, None).unwrap();
    assert!(
        t.storage_handle_count() >= 2,
        "the queued collective holds a handle"
    );
    work.synchronize().unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    while t.storage_handle_count() > 1 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(1));
    }
    assert_eq!(t.storage_handle_count(), 1, "released once done");
}

#[test]
fn bad_calls_are_refused_by_name_and_the_group_stays_usable() {
    if !can_run("bad_calls_are_refused_by_name_and_the_group_stays_usable") {
        return;
    }
    let pg = group();
    let host = Tensor::from_vec(vec![1.0f32; 4], &[4]).unwrap();
    let e = pg.all_reduce(&host, ReduceOp::Sum, None).unwrap_err();
    assert!(e.to_string().contains("expected a CUDA tensor"), "{e}");
    let ints = gpu(DType::I32, &[1.0, 2.0], &[2]);
    let e = pg.all_reduce(&ints, ReduceOp::Band, None).unwrap_err();
    assert!(matches!(e, Error::UnsupportedReduceOp { .. }), "{e}");
    let e = pg.monitored_barrier(None, false).unwrap_err();
    assert!(e.to_string().contains("monitored_barrier"), "{e}");
    let e = pg.recv_any_source(&ints, 0, None).unwrap_err();
    assert!(e.to_string().contains("recv_any_source"), "{e}");
    let e = pg.send(&ints, 0, 0, None).unwrap_err();
    assert!(e.to_string().contains("send"), "{e}");
    let f = gpu(DType::F32, &[1.0, 2.0], &[2]);
    pg.all_reduce(&f, ReduceOp::Max, None)
        .unwrap()
        .synchronize()
        .unwrap();
    assert_eq!(values(&f), [1.0, 2.0]);
}

#[test]
fn a_subgroup_is_split_from_the_groups_communicator() {
    if !can_run("a_subgroup_is_split_from_the_groups_communicator") {
        return;
    }
    let pg = group();
    let sub = pg
        .new_subgroup(&[0])
        .unwrap()
        .expect("rank 0 is in the sub-group");
    assert_eq!((sub.rank(), sub.size()), (0, 1));
    let t = gpu(DType::BF16, &[1.0, 2.0, 4.0], &[3]);
    sub.all_reduce(&t, ReduceOp::PremulSum(0.5), None)
        .unwrap()
        .synchronize()
        .unwrap();
    assert_eq!(values(&t), [0.5, 1.0, 2.0]);
    // The parent still works after the split.
    pg.barrier(None).unwrap().wait().unwrap();
}

#[test]
fn init_process_group_builds_an_nccl_group_from_its_name() {
    if !can_run("init_process_group_builds_an_nccl_group_from_its_name") {
        return;
    }
    let backend: tensorcomm::Backend = "nccl".parse().unwrap();
    let pg =
        tensorcomm::init_process_group(backend, "tcp://127.0.0.1:0?rank=0&world_size=1").unwrap();
    assert_eq!(pg.backend(), tensorcomm::Backend::Nccl);
    let t = gpu(DType::I64, &[5.0, 7.0], &[2]);
    pg.all_reduce(&t, ReduceOp::Sum, None)
        .unwrap()
        .synchronize()
        .unwrap();
    assert_eq!(values(&t), [5.0, 7.0]);
}

#[test]
fn an_auto_group_runs_host_tensors_on_the_cpu_and_cuda_tensors_on_nccl() {
    if !can_run("an_auto_group_runs_host_tensors_on_the_cpu_and_cuda_tensors_on_nccl") {
        return;
    }
    let pg = tensorcomm::init_process_group(
        tensorcomm::Backend::Auto,
        "tcp://127.0.0.1:0?rank=0&world_size=1",
    )
    .unwrap();
    let host = Tensor::from_vec(vec![1.0f32, 2.0], &[2]).unwrap();
    let cuda = gpu(DType::F32, &[3.0, 4.0], &[2]);
    pg.all_reduce(&host, ReduceOp::PremulSum(2.0), None)
        .unwrap()
        .wait()
        .unwrap();
    pg.all_reduce(&cuda, ReduceOp::PremulSum(2.0), None)
        .unwrap()
        .synchronize()
        .unwrap();
    assert_eq!(host.to_vec::<f32>().unwrap(), [2.0, 4.0]);
    assert_eq!(values(&cuda), [6.0, 8.0]);
    let recorded = pg.flight_recorder_json();
    assert!(recorded.contains("\"cuda\":{"), "{recorded}");
    let e = pg
        .all_gather(std::slice::from_ref(&host), &cuda, None)
        .unwrap_err();
    assert!(e.to_string().contains("found both"), "{e}");
}

#[test]
fn threads_calling_at_once_each_get_their_own_results() {
    if !can_run("threads_calling_at_once_each_get_their_own_results") {
        return;
    }
    let pg = group();
    std::thread::scope(|s| {
        for thread in 0..4 {
            let pg = &pg;
            s.spawn(move || {
                let factor = thread as f64 + 2.0;
                let tensors: Vec<_> = (0..50)
                    .map(|i| gpu(DType::F32, &[i as f64, 1.0], &[2]))
                    .collect();
                let works: Vec<_> = tensors
                    .iter()
                    .map(|t| pg.all_reduce(t, ReduceOp::PremulSum(factor), None).unwrap())
                    .collect();
                for w in works {
                    w.synchronize().unwrap();
                }
                for (i, t) in tensors.iter().enumerate() {
                    assert_eq!(
                        values(t),
                        [i as f64 * factor, factor],
                        "thread {thread} call {i}"
                    );
                }
            });
        }
    });
    pg.barrier(None).unwrap().wait().unwrap();
}

#[test]
fn a_one_rank_group_runs_all_reduce_in_nccl_and_says_why_not_on_peer_memory() {
    if !can_run("a_one_rank_group_runs_all_reduce_in_nccl_and_says_why_not_on_peer_memory") {
        return;
    }
    let pg = group();
    assert!(pg.intranode().is_none());
    assert!(
        pg.intranode_reason().contains("a group of 1"),
        "{}",
        pg.intranode_reason()
    );
    let t = gpu(DType::BF16, &[1.0, 2.0, 3.0, 4.0], &[4]);
    pg.all_reduce(&t, ReduceOp::Sum, None)
        .unwrap()
        .synchronize()
        .unwrap();
    assert_eq!(values(&t), [1.0, 2.0, 3.0, 4.0]);
}
