//! The peer-memory all-reduce (`cuda::intranode`): ranks as threads of
//! this process (each on its own stream) or as child processes (through
//! CUDA IPC), sharing cuda:0 under `PeerPolicy::Shared`; on a machine with
//! two GPUs one test also runs two processes on a GPU each. Results are compared bit for bit with a CPU
//! reference that accumulates in f32 in rank order, as the kernels do.
//! Each test prints a line and returns when the machine has no GPU. Up to
//! 8 ranks run as threads, each on its own stream: run with
//! CUDA_DEVICE_MAX_CONNECTIONS=32 (scripts/gpu-run.sh sets it).
#![cfg(feature = "cuda")]

mod skip;

use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use half::{bf16, f16};
use tensorcomm::cuda::intranode::{
    one_shot_max, push_max, two_shot_max, AlgoChoice, AllReduceAlgo, IntraNodeComm,
    IntraNodeOptions, PeerPolicy,
};
use tensorcomm::cuda::runtime::Stream;
use tensorcomm::group::ReduceOp;
use tensorcomm::store::{FileStore, HashStore, Store};
use tensorcomm::tensor::{DType, Device, Tensor};
use tensorcomm::Error;

const GPU: Device = Device::Cuda(0);

/// True when this machine has a GPU (else the test says it skips); fails
/// at once when the ranks' streams could share a hardware queue.
fn can_run(test: &str) -> bool {
    if !skip::has_gpu(test) {
        return false;
    }
    // Threads' streams map onto CUDA_DEVICE_MAX_CONNECTIONS hardware
    // queues in turn: two ranks' streams on one queue deadlock as soon as
    // one rank's second call waits there behind its first, which waits for
    // the other rank's call queued behind it (until the kernel timeout).
    let queues = std::env::var("CUDA_DEVICE_MAX_CONNECTIONS").unwrap_or_default();
    assert!(
        queues.parse::<u32>().is_ok_and(|q| q >= 32),
        "{test}: expected CUDA_DEVICE_MAX_CONNECTIONS=32 or more (scripts/gpu-run.sh sets it), found {queues:?}"
    );
    true
}

fn options(algo: AlgoChoice, region: usize) -> IntraNodeOptions {
    IntraNodeOptions {
        policy: Some(PeerPolicy::Shared),
        algo: Some(algo),
        region_bytes: Some(region),
        timeout: Duration::from_secs(60),
        kernel_timeout: Some(Duration::from_secs(60)),
        overlap_launches: None,
    }
}

/// `world` communicators over one store, set up by threads (as ranks of
/// one process do), each rank with its own stream.
fn comms(world: usize, prefix: &str, opts: &IntraNodeOptions) -> Vec<(IntraNodeComm, Stream)> {
    comms_and_store(world, prefix, opts).1
}

/// [`comms`] and their store.
fn comms_and_store(
    world: usize,
    prefix: &str,
    opts: &IntraNodeOptions,
) -> (Arc<HashStore>, Vec<(IntraNodeComm, Stream)>) {
    let store = Arc::new(HashStore::new());
    let ranks = std::thread::scope(|s| {
        let handles: Vec<_> = (0..world)
            .map(|rank| {
                let store = store.clone();
                s.spawn(move || {
                    let c = IntraNodeComm::new(&*store, prefix, rank, world, 0, opts).unwrap();
                    (c, Stream::new(0).unwrap())
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    (store, ranks)
}

/// Runs `f` on every rank at once (a thread each).
fn on_every_rank<T: Send>(
    ranks: &[(IntraNodeComm, Stream)],
    f: impl Fn(&IntraNodeComm, &Stream) -> T + Sync,
) -> Vec<T> {
    std::thread::scope(|s| {
        let handles: Vec<_> = ranks
            .iter()
            .map(|(c, st)| {
                let f = &f;
                s.spawn(move || f(c, st))
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

/// Rank `rank`'s `i`-th input value (not exact in f16/bf16, so rounding
/// and order show).
fn value(rank: usize, i: usize, call: usize) -> f32 {
    ((i as f32) * 0.37 + (rank as f32) * 1.13 + (call as f32) * 0.71).sin() * 3.0
}

/// `values` rounded to `dtype`, as a host tensor.
fn host_tensor(dtype: DType, values: &[f32]) -> Tensor<'static> {
    let n = [values.len()];
    match dtype {
        DType::F32 => Tensor::from_vec(values.to_vec(), &n),
        DType::F16 => Tensor::from_vec(values.iter().map(|&v| f16::from_f32(v)).collect(), &n),
        DType::BF16 => Tensor::from_vec(values.iter().map(|&v| bf16::from_f32(v)).collect(), &n),
        other => panic!("no test values for {other}"),
    }
    .unwrap()
}

/// The elements of a tensor as f32 (exact for the three dtypes).
fn read(t: &Tensor<'_>) -> Vec<f32> {
    match t.dtype() {
        DType::F32 => t.to_vec::<f32>().unwrap(),
        DType::F16 => t
            .to_vec::<f16>()
            .unwrap()
            .iter()
            .map(|v| v.to_f32())
            .collect(),
        DType::BF16 => t
            .to_vec::<bf16>()
            .unwrap()
            .iter()
            .map(|v| v.to_f32())
            .collect(),
        other => panic!("no reader for {other}"),
    }
}

/// `v` rounded to `dtype` and back.
fn round(dtype: DType, v: f32) -> f32 {
    match dtype {
        DType::F32 => v,
        DType::F16 => f16::from_f32(v).to_f32(),
        DType::BF16 => bf16::from_f32(v).to_f32(),
        other => panic!("{other}"),
    }
}

/// The reference result of element `i`: inputs rounded to `dtype`,
/// combined in f32 in rank order, rounded back.
fn reference(dtype: DType, op: ReduceOp, world: usize, i: usize, call: usize) -> f32 {
    let x = |r| round(dtype, value(r, i, call));
    let mut acc = x(0);
    for r in 1..world {
        acc = match op {
            ReduceOp::Sum | ReduceOp::Avg => acc + x(r),
            ReduceOp::Min => acc.min(x(r)),
            ReduceOp::Max => acc.max(x(r)),
            other => panic!("{other:?}"),
        };
    }
    if op == ReduceOp::Avg {
        acc /= world as f32;
    }
    round(dtype, acc)
}

/// Every rank's input for `call` on the GPU, `numel` elements starting
/// `offset` elements into a larger buffer (a view), so addresses that
/// are not 16-byte aligned are covered too.
fn gpu_input(
    dtype: DType,
    rank: usize,
    numel: usize,
    offset: usize,
    call: usize,
) -> Tensor<'static> {
    gpu_input_on(GPU, dtype, rank, numel, offset, call)
}

/// [`gpu_input`] on `device`.
fn gpu_input_on(
    device: Device,
    dtype: DType,
    rank: usize,
    numel: usize,
    offset: usize,
    call: usize,
) -> Tensor<'static> {
    let mut values = vec![-99.0f32; offset];
    values.extend((0..numel).map(|i| value(rank, i, call)));
    let whole = host_tensor(dtype, &values).to_device(device).unwrap();
    whole.narrow(0, offset, numel).unwrap()
}

/// All-reduces (SUM) every tensor of `tensors` in place, all calls
/// queued back to back, then waits for the stream. (Thread ranks sharing
/// the GPU: `IntraNodeComm` queues each only once the last has run, and
/// without that these tests deadlocked on H200s; see its docs.)
fn sum_all(c: &IntraNodeComm, s: &Stream, tensors: &[Tensor<'_>]) {
    for t in tensors {
        c.all_reduce_on(t, ReduceOp::Sum, s).unwrap();
    }
    s.synchronize().unwrap();
}

/// Checks `t` (rank `rank`'s result) against the reference, bit for bit.
fn assert_reference(t: &Tensor<'_>, op: ReduceOp, world: usize, call: usize, what: &str) {
    let got = read(t);
    for (i, g) in got.iter().enumerate() {
        let want = reference(t.dtype(), op, world, i, call);
        assert!(
            g.to_bits() == want.to_bits(),
            "{what}: element {i} of {}: got {g}, want {want}",
            got.len()
        );
    }
}

#[test]
fn every_dtype_op_and_algorithm_matches_the_reference_at_2_3_4_and_8_ranks() {
    if !can_run("every_dtype_op_and_algorithm_matches_the_reference_at_2_3_4_and_8_ranks") {
        return;
    }
    for world in [2, 3, 4, 8] {
        for algo in [
            AllReduceAlgo::Push,
            AllReduceAlgo::OneShot,
            AllReduceAlgo::TwoShot,
            AllReduceAlgo::Large,
        ] {
            // A 64 KiB region makes 40 000 f32 elements take the large
            // kernel's chunks (half of the two eager regions each): 3 of
            // 64 KiB at 2 ranks, 3 slots of 21 840 bytes at 3 ranks.
            let ranks = comms(
                world,
                &format!("all-{world}-{algo:?}"),
                &options(AlgoChoice::Force(algo), 64 << 10),
            );
            for dtype in [DType::F32, DType::F16, DType::BF16] {
                for op in [ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Min, ReduceOp::Max] {
                    for (numel, offset) in [
                        (1, 0),
                        (7, 1),
                        (4096, 0),
                        (4099, 2),
                        (40_000, 0),
                        (40_001, 1),
                        (40_002, 2),
                    ] {
                        if (numel * dtype.size()) % 4 != 0 || (offset * dtype.size()) % 4 != 0 {
                            continue; // the seed's alignment rule (tested below)
                        }
                        let what =
                            format!("{world} ranks {algo:?} {dtype} {op:?} {numel} at +{offset}");
                        let ran = on_every_rank(&ranks, |c, s| {
                            let t = gpu_input(dtype, c.rank(), numel, offset, 0);
                            let algo = c.all_reduce_on(&t, op, s).unwrap();
                            s.synchronize().unwrap();
                            c.check().unwrap();
                            assert_reference(&t, op, world, 0, &what);
                            algo
                        });
                        let fits = numel * dtype.size() <= 64 << 10;
                        let want = if fits { algo } else { AllReduceAlgo::Large };
                        assert!(ran.iter().all(|&a| a == want), "{what}: ran {ran:?}");
                    }
                }
            }
        }
    }
}

#[test]
fn results_are_bitwise_identical_on_every_rank() {
    if !can_run("results_are_bitwise_identical_on_every_rank") {
        return;
    }
    for algo in [
        AllReduceAlgo::Push,
        AllReduceAlgo::OneShot,
        AllReduceAlgo::TwoShot,
        AllReduceAlgo::Large,
    ] {
        // Large in chunks: 64 KiB of the 66 668-byte message a chunk.
        let region = if algo == AllReduceAlgo::Large {
            64 << 10
        } else {
            1 << 20
        };
        let ranks = comms(
            4,
            &format!("bits-{algo:?}"),
            &options(AlgoChoice::Force(algo), region),
        );
        let results = on_every_rank(&ranks, |c, s| {
            let t = gpu_input(DType::BF16, c.rank(), 33_334, 0, 5);
            c.all_reduce_on(&t, ReduceOp::Avg, s).unwrap();
            s.synchronize().unwrap();
            t.to_vec::<bf16>()
                .unwrap()
                .iter()
                .map(|v| v.to_bits())
                .collect::<Vec<_>>()
        });
        for r in 1..results.len() {
            assert!(
                results[r] == results[0],
                "{algo:?}: rank {r} differs from rank 0"
            );
        }
    }
}

#[test]
fn sizes_around_each_threshold_take_the_path_the_counter_shows() {
    if !can_run("sizes_around_each_threshold_take_the_path_the_counter_shows") {
        return;
    }
    // At 2 ranks the large kernel follows one-shot; at 3 two-shot comes
    // between them, up to the region here (below two-shot's own limit).
    for world in [2, 3] {
        let (push, one, two) = (push_max(world), one_shot_max(world), two_shot_max(world));
        let region = one * 2;
        let mut cases = vec![
            (push - 4, AllReduceAlgo::Push),
            (push, AllReduceAlgo::Push),
            (push + 4, AllReduceAlgo::OneShot),
            (one - 4, AllReduceAlgo::OneShot),
            (one, AllReduceAlgo::OneShot),
        ];
        if two > one {
            assert!(region <= two, "{world} ranks");
            cases.extend([
                (one + 4, AllReduceAlgo::TwoShot),
                (region, AllReduceAlgo::TwoShot),
            ]);
        } else {
            cases.push((one + 4, AllReduceAlgo::Large));
        }
        cases.push((region + 4, AllReduceAlgo::Large));
        let ranks = comms(
            world,
            &format!("thresholds-{world}"),
            &options(AlgoChoice::Auto, region),
        );
        for (i, (bytes, want)) in cases.into_iter().enumerate() {
            let what = format!("{world} ranks, {bytes} bytes");
            let before = ranks[0].0.usage();
            let ran = on_every_rank(&ranks, |c, s| {
                let t = gpu_input(DType::F32, c.rank(), bytes / 4, 0, i);
                let algo = c.all_reduce_on(&t, ReduceOp::Sum, s).unwrap();
                s.synchronize().unwrap();
                assert_reference(&t, ReduceOp::Sum, world, i, &what);
                assert_eq!(c.select_all_reduce_algo(&t, ReduceOp::Sum), want, "{what}");
                algo
            });
            assert_eq!(ran, vec![want; world], "{what}");
            let after = ranks[0].0.usage();
            let delta =
                |f: fn(&tensorcomm::cuda::intranode::AlgoUsage) -> u64| f(&after) - f(&before);
            let counted = match want {
                AllReduceAlgo::Push => delta(|u| u.push),
                AllReduceAlgo::OneShot => delta(|u| u.one_shot),
                AllReduceAlgo::TwoShot => delta(|u| u.two_shot),
                _ => delta(|u| u.large),
            };
            assert_eq!(counted, 1, "{what}: usage {after:?}");
        }
    }
}

#[test]
fn forced_push_takes_messages_up_to_its_inbox_and_one_shot_beyond() {
    if !can_run("forced_push_takes_messages_up_to_its_inbox_and_one_shot_beyond") {
        return;
    }
    let inbox = 256 << 10; // bytes of one message push's inbox holds
    for world in [2, 4] {
        let ranks = comms(
            world,
            &format!("push-inbox-{world}"),
            &options(AlgoChoice::Force(AllReduceAlgo::Push), 1 << 20),
        );
        for (call, (bytes, want)) in [
            (inbox, AllReduceAlgo::Push),
            (inbox - 4, AllReduceAlgo::Push),
            (inbox + 4, AllReduceAlgo::OneShot),
            (inbox, AllReduceAlgo::Push),
        ]
        .into_iter()
        .enumerate()
        {
            let ran = on_every_rank(&ranks, |c, s| {
                let t = gpu_input(DType::F32, c.rank(), bytes / 4, 0, call);
                let algo = c.all_reduce_on(&t, ReduceOp::Sum, s).unwrap();
                s.synchronize().unwrap();
                c.check().unwrap();
                assert_reference(
                    &t,
                    ReduceOp::Sum,
                    world,
                    call,
                    &format!("{world} ranks {bytes} bytes"),
                );
                algo
            });
            assert!(
                ran.iter().all(|&a| a == want),
                "{world} ranks {bytes} bytes: ran {ran:?}"
            );
        }
    }
}

#[test]
fn a_thousand_back_to_back_calls_never_see_stale_data() {
    if !can_run("a_thousand_back_to_back_calls_never_see_stale_data") {
        return;
    }
    for algo in [
        AllReduceAlgo::Push,
        AllReduceAlgo::OneShot,
        AllReduceAlgo::TwoShot,
        AllReduceAlgo::Large,
    ] {
        // The large kernel's smallest region: chunks of 4 KiB, so calls
        // take 1 or 2 of them.
        let region = if algo == AllReduceAlgo::Large {
            4096
        } else {
            1 << 20
        };
        let ranks = comms(
            2,
            &format!("thousand-{algo:?}"),
            &options(AlgoChoice::Force(algo), region),
        );
        // Every rank's inputs are made before any rank queues a call
        // (copying to the GPU while a peer's first call waits may wait for
        // it): distinct values per call, and sizes that change from call to
        // call, so that a half of push's inbox holds lines of an older,
        // longer call beside the new ones.
        let inputs: Vec<Vec<Tensor<'static>>> = (0..2)
            .map(|rank| {
                (0..1000)
                    .map(|call| gpu_input(DType::F32, rank, 200 + (call * 37) % 1800, 0, call))
                    .collect()
            })
            .collect();
        on_every_rank(&ranks, |c, s| {
            // Queued back to back; every result lands in its own tensor,
            // checked after all have run.
            let tensors = &inputs[c.rank()];
            sum_all(c, s, tensors);
            c.check().unwrap_or_else(|e| panic!("{algo:?}: {e}"));
            for (call, t) in tensors.iter().enumerate() {
                assert_reference(t, ReduceOp::Sum, 2, call, &format!("{algo:?} call {call}"));
            }
        });
    }
}

#[test]
fn every_algorithm_back_to_back_by_size_at_4_ranks_never_sees_stale_data() {
    if !can_run("every_algorithm_back_to_back_by_size_at_4_ranks_never_sees_stale_data") {
        return;
    }
    // A 1 MiB region at 4 ranks: push up to 4 KiB, one-shot up to 256 KiB,
    // two-shot up to the region, the large kernel beyond (two chunks of
    // 1 MiB, the second partial, on several blocks). Calls of every kind
    // follow each other with no synchronization, so the regions, the
    // large kernel's use of both eager ones, and the inboxes all change
    // hands between calls.
    let world = 4;
    let ranks = comms(world, "mixed-4", &options(AlgoChoice::Auto, 1 << 20));
    let numels = [250, 25_000, 150_000, 375_000, 3, 60_001];
    let calls = 40;
    let inputs: Vec<Vec<Tensor<'static>>> = (0..world)
        .map(|rank| {
            (0..calls)
                .map(|call| {
                    gpu_input(
                        DType::F32,
                        rank,
                        numels[call % numels.len()],
                        (call / numels.len()) % 3,
                        call,
                    )
                })
                .collect()
        })
        .collect();
    on_every_rank(&ranks, |c, s| {
        let tensors = &inputs[c.rank()];
        sum_all(c, s, tensors);
        c.check().unwrap();
        for (call, t) in tensors.iter().enumerate() {
            assert_reference(t, ReduceOp::Sum, world, call, &format!("mixed call {call}"));
        }
        let u = c.usage();
        assert!(
            u.push > 0 && u.one_shot > 0 && u.two_shot > 0 && u.large > 0,
            "every algorithm ran: {u:?}"
        );
    });
}

#[test]
fn captured_calls_replay_on_new_inputs() {
    if !can_run("captured_calls_replay_on_new_inputs") {
        return;
    }
    for algo in [
        AllReduceAlgo::Push,
        AllReduceAlgo::OneShot,
        AllReduceAlgo::TwoShot,
        AllReduceAlgo::Large,
    ] {
        // Large captured in chunks: 3001 f32 take 3 of 4 KiB (the graph
        // region is twice the 4 KiB eager region).
        let region = if algo == AllReduceAlgo::Large {
            4096
        } else {
            1 << 20
        };
        let ranks = comms(
            2,
            &format!("graph-{algo:?}"),
            &options(AlgoChoice::Force(algo), region),
        );
        on_every_rank(&ranks, |c, s| {
            let n = 3001;
            let t = gpu_input(DType::F32, c.rank(), n, 0, 0);
            // An eager call first, so eager and captured calls interleave.
            c.all_reduce_on(&t, ReduceOp::Sum, s).unwrap();
            s.synchronize().unwrap();
            s.begin_capture().unwrap();
            c.all_reduce_on(&t, ReduceOp::Sum, s).unwrap();
            let graph = s.end_capture().unwrap();
            for call in 1..20 {
                t.copy_from(&host_tensor(
                    DType::F32,
                    &(0..n).map(|i| value(c.rank(), i, call)).collect::<Vec<_>>(),
                ))
                .unwrap();
                graph.launch(s).unwrap();
                s.synchronize().unwrap();
                assert_reference(
                    &t,
                    ReduceOp::Sum,
                    2,
                    call,
                    &format!("{algo:?} replay {call}"),
                );
                // And an eager call between replays.
                let e = gpu_input(DType::F32, c.rank(), 17, 0, call);
                c.all_reduce_on(&e, ReduceOp::Sum, s).unwrap();
                s.synchronize().unwrap();
                assert_reference(
                    &e,
                    ReduceOp::Sum,
                    2,
                    call,
                    &format!("{algo:?} eager {call}"),
                );
            }
            c.check().unwrap();
        });
    }
}

#[test]
fn ineligible_inputs_fall_back_with_a_reason_and_misuse_is_refused() {
    if !can_run("ineligible_inputs_fall_back_with_a_reason_and_misuse_is_refused") {
        return;
    }
    let ranks = comms(2, "ineligible", &options(AlgoChoice::Auto, 1 << 20));
    let c = &ranks[0].0;
    let s = &ranks[0].1;
    let int64 = Tensor::zeros_on(&[8], DType::I64, GPU).unwrap();
    let f32s = Tensor::zeros_on(&[8], DType::F32, GPU).unwrap();
    let odd = Tensor::zeros_on(&[9], DType::BF16, GPU).unwrap(); // 18 bytes
    let shifted = Tensor::zeros_on(&[9], DType::BF16, GPU)
        .unwrap()
        .narrow(0, 1, 8)
        .unwrap();
    let host = Tensor::zeros(&[8], DType::F32).unwrap();
    let strided = Tensor::zeros_on(&[4, 4], DType::F32, GPU)
        .unwrap()
        .permute(&[1, 0])
        .unwrap();
    // An address that is not 4-byte aligned is taken (the kernels go
    // element by element there): addresses differ between ranks, and a
    // rule on them could split one call between two paths.
    assert_eq!(
        c.select_all_reduce_algo(&shifted, ReduceOp::Sum),
        AllReduceAlgo::Push
    );
    let cases: [(&Tensor<'_>, ReduceOp, &str); 5] = [
        (&int64, ReduceOp::Sum, "found i64"),
        (&f32s, ReduceOp::Product, "found Product"),
        (&odd, ReduceOp::Sum, "a multiple of 4 bytes"),
        (&host, ReduceOp::Sum, "found one on cpu"),
        (&strided, ReduceOp::Sum, "contiguous"),
    ];
    for (t, op, says) in cases {
        assert_eq!(
            c.select_all_reduce_algo(t, op),
            AllReduceAlgo::None,
            "{says}"
        );
        let reason = c.why_not(t, op).expect("a reason");
        assert!(reason.contains(says), "{reason}");
        match c.all_reduce_on(t, op, s) {
            Err(Error::InvalidCollective { reason, .. }) => {
                assert!(reason.contains(says), "{reason}")
            }
            other => panic!("{says}: {other:?}"),
        }
    }
    // Refusals queue nothing: the group still works.
    on_every_rank(&ranks, |c, s| {
        let t = gpu_input(DType::F32, c.rank(), 100, 0, 3);
        c.all_reduce_on(&t, ReduceOp::Max, s).unwrap();
        s.synchronize().unwrap();
        assert_reference(&t, ReduceOp::Max, 2, 3, "after refusals");
    });
}

#[test]
fn groups_that_cannot_use_peer_memory_are_refused_on_every_rank_with_the_reason() {
    if !can_run("groups_that_cannot_use_peer_memory_are_refused_on_every_rank_with_the_reason") {
        return;
    }
    let store = Arc::new(HashStore::new());
    // Two ranks on one GPU under the default policy.
    let auto = IntraNodeOptions {
        policy: Some(PeerPolicy::Auto),
        ..IntraNodeOptions::default()
    };
    let errors: Vec<Error> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..2)
            .map(|rank| {
                let (store, auto) = (store.clone(), auto.clone());
                s.spawn(move || IntraNodeComm::new(&*store, "auto", rank, 2, 0, &auto).unwrap_err())
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for e in errors {
        match e {
            Error::IntraNodeUnavailable { reason } => {
                assert!(reason.contains("share one GPU"), "{reason}")
            }
            other => panic!("{other}"),
        }
    }
    // One rank alone.
    match IntraNodeComm::new(
        &*store,
        "alone",
        0,
        1,
        0,
        &options(AlgoChoice::Auto, 1 << 20),
    ) {
        Err(Error::IntraNodeUnavailable { reason }) => {
            assert!(reason.contains("a group of 1"), "{reason}")
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_rank_that_fails_before_set_up_makes_the_others_fail_at_once_naming_it() {
    if !can_run("a_rank_that_fails_before_set_up_makes_the_others_fail_at_once_naming_it") {
        return;
    }
    for (name, bad) in [
        ("region", options(AlgoChoice::Auto, 1)),
        ("region_big", options(AlgoChoice::Auto, (1 << 40) + 1)),
        (
            "algo",
            options(AlgoChoice::Force(AllReduceAlgo::None), 1 << 20),
        ),
    ] {
        let store = Arc::new(HashStore::new());
        // Rank 0 would wait its whole set-up timeout for a rank that
        // never posts; it must stop at once.
        let good = IntraNodeOptions {
            timeout: Duration::from_secs(120),
            ..options(AlgoChoice::Auto, 1 << 20)
        };
        let start = Instant::now();
        let errors: Vec<Error> = std::thread::scope(|s| {
            let hs: Vec<_> = [good, bad]
                .into_iter()
                .enumerate()
                .map(|(rank, opts)| {
                    let store = store.clone();
                    s.spawn(move || {
                        IntraNodeComm::new(&*store, name, rank, 2, 0, &opts).unwrap_err()
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "{name}: {:?}",
            start.elapsed()
        );
        match &errors[1] {
            Error::InvalidArgument(why) => assert!(why.contains("IntraNodeOptions"), "{why}"),
            other => panic!("{name}: {other}"),
        }
        let e = errors[0].to_string();
        assert!(
            e.contains("rank 1") && e.contains("IntraNodeOptions"),
            "{name}: {e}"
        );
    }
}

// ---- registered captures (graph inputs) -----------------------------------

/// The calls of the registered-capture tests: (dtype, elements, offset),
/// every one above push's limit and within a 4 MiB region, so one-shot
/// or two-shot; odd sizes and an offset of 4 bytes (not 16-byte aligned)
/// among them.
fn registered_calls(world: usize) -> Vec<(DType, usize, usize)> {
    let calls = vec![
        (DType::F32, push_max(world) / 4 + 3, 0),
        (DType::BF16, 70_002, 2),
        (DType::F16, 500_000, 0),
        (DType::F32, 300_001, 0),
    ];
    for &(dtype, numel, _) in &calls {
        let bytes = numel * dtype.size();
        assert!(bytes > push_max(world) && bytes <= 4 << 20, "{bytes}");
    }
    calls
}

/// Whether CUDA IPC can share the allocation at `ptr`.
fn ipc_capable(ptr: u64) -> bool {
    use cudarc::driver::sys;
    let mut handle = sys::CUipcMemHandle_st { reserved: [0; 64] };
    // SAFETY: a valid out-pointer; the driver fails cleanly on memory it
    // cannot export.
    let r = unsafe { sys::cuIpcGetMemHandle(&mut handle, ptr) };
    r == sys::cudaError_enum::CUDA_SUCCESS
}

/// Rank `rank`'s f32 input for `call` in memory from cudarc's
/// stream-ordered pool, and whether CUDA IPC could share it.
fn pool_input(s: &Stream, rank: usize, numel: usize, call: usize) -> (Tensor<'static>, bool) {
    use cudarc::driver::DevicePtr as _;
    let values: Vec<f32> = (0..numel).map(|i| value(rank, i, call)).collect();
    let slice = s.cudarc().clone_htod(&values).unwrap();
    let shareable = {
        let (ptr, _record) = slice.device_ptr(s.cudarc());
        ipc_capable(ptr)
    };
    (Tensor::from_cuda_slice(slice, &[numel]).unwrap(), shareable)
}

/// Writes rank `rank`'s input for `call` into `t`.
fn refill(t: &Tensor<'_>, rank: usize, call: usize) {
    let values: Vec<f32> = (0..t.numel()).map(|i| value(rank, i, call)).collect();
    t.copy_from(&host_tensor(t.dtype(), &values)).unwrap();
}

/// The tensors of a rank of the registered-capture tests.
#[derive(Clone, Copy, PartialEq)]
enum Inputs {
    /// [`registered_calls`]' dtypes and offsets, from tensorcomm's memory.
    Mixed,
    /// Its sizes in f32, from tensorcomm's memory.
    F32,
    /// Its sizes in f32, from cudarc's stream-ordered pool.
    F32FromPool,
}

/// One rank of the registered-capture tests: captures, in one graph, a
/// push call, the calls of [`registered_calls`] and a call for the large
/// kernel (tensors as `inputs` says), all with `op`, then replays it on
/// new inputs with eager push and one-shot SUM calls between replays,
/// checking every result bit for bit; `first_call` numbers the inputs. With `back_to_back`
/// (ranks that are processes), three replays at a time are queued before
/// the stream is waited for, each on inputs copied in on the stream and
/// its results copied out. Gives the captured tensors back: they must
/// stay allocated until every rank's communicator is dropped.
fn registered_rank_calls(
    c: &IntraNodeComm,
    s: &Stream,
    store: &dyn Store,
    first_call: usize,
    inputs: Inputs,
    back_to_back: bool,
    op: ReduceOp,
) -> Vec<Tensor<'static>> {
    let world = c.world();
    let before = c.usage();
    let mut calls = vec![(DType::F32, push_max(world) / 8, 0)];
    calls.extend(registered_calls(world));
    calls.push((DType::F32, 1_100_001, 0)); // beyond the 4 MiB region
    let dtype_of = |dtype| match inputs {
        Inputs::Mixed => dtype,
        Inputs::F32 | Inputs::F32FromPool => DType::F32,
    };
    let tensors: Vec<Tensor<'static>> = calls
        .iter()
        .map(|&(dtype, numel, offset)| match inputs {
            Inputs::F32FromPool => {
                let (t, shareable) = pool_input(s, c.rank(), numel, first_call);
                assert!(
                    !shareable,
                    "expected cudarc's tensors to come from a stream-ordered pool that CUDA IPC cannot share"
                );
                t
            }
            Inputs::F32 => gpu_input(DType::F32, c.rank(), numel, 0, first_call),
            Inputs::Mixed => gpu_input(dtype, c.rank(), numel, offset, first_call),
        })
        .collect();
    let algos = std::cell::RefCell::new(Vec::new());
    let graph = c
        .capture_registered(store, s, |s| {
            for t in &tensors {
                algos.borrow_mut().push(c.all_reduce_on(t, op, s)?);
            }
            Ok(())
        })
        .unwrap();
    let algos = algos.into_inner();
    assert_eq!(algos.first(), Some(&AllReduceAlgo::Push), "{algos:?}");
    assert_eq!(algos.last(), Some(&AllReduceAlgo::Large), "{algos:?}");
    for a in &algos[1..algos.len() - 1] {
        assert!(
            matches!(a, AllReduceAlgo::OneShot | AllReduceAlgo::TwoShot),
            "{algos:?}"
        );
    }
    let after = c.usage();
    assert_eq!(
        after.registered - before.registered,
        (algos.len() - 2) as u64,
        "only one-shot and two-shot calls register: {after:?}"
    );
    let mut failures = Vec::new();
    let mut check = |t: &Tensor<'_>, op: ReduceOp, call: usize, what: String| {
        if let Err(e) = std::panic::catch_unwind(|| assert_reference(t, op, world, call, &what)) {
            failures.push(e);
        }
    };
    let per_round = if back_to_back { 3 } else { 1 };
    let mut call = first_call + 1;
    while call <= first_call + 21 {
        let round: Vec<usize> = (call..call + per_round).collect();
        if back_to_back {
            // Inputs made before anything is queued (making a tensor
            // copies on the legacy stream, which would wait for the
            // replays).
            let fresh: Vec<Vec<Tensor<'static>>> = round
                .iter()
                .map(|&n| {
                    calls
                        .iter()
                        .map(|&(dtype, numel, _)| gpu_input(dtype_of(dtype), c.rank(), numel, 0, n))
                        .collect()
                })
                .collect();
            let outs: Vec<Vec<Tensor<'static>>> = round
                .iter()
                .map(|_| {
                    tensors
                        .iter()
                        .map(|t| Tensor::zeros_on(t.shape(), t.dtype(), GPU).unwrap())
                        .collect()
                })
                .collect();
            for (ins, outs) in fresh.iter().zip(&outs) {
                for (t, f) in tensors.iter().zip(ins) {
                    t.copy_from_on(f, s).unwrap();
                }
                graph.launch(s).unwrap();
                for (o, t) in outs.iter().zip(&tensors) {
                    o.copy_from_on(t, s).unwrap();
                }
            }
            s.synchronize().unwrap();
            c.check().unwrap();
            for (&n, outs) in round.iter().zip(&outs) {
                for (k, o) in outs.iter().enumerate() {
                    check(
                        o,
                        op,
                        n,
                        format!("rank {} of {world}: replay {n}, call {k}", c.rank()),
                    );
                }
            }
        } else {
            for t in &tensors {
                refill(t, c.rank(), call);
            }
            graph.launch(s).unwrap();
            s.synchronize().unwrap();
            c.check().unwrap();
            for (k, t) in tensors.iter().enumerate() {
                check(
                    t,
                    op,
                    call,
                    format!("rank {} of {world}: replay {call}, call {k}", c.rank()),
                );
            }
        }
        // Eager push and one-shot calls between replays.
        for numel in [1001, push_max(world) / 4 + 3] {
            let e = gpu_input(DType::F32, c.rank(), numel, 0, call);
            c.all_reduce_on(&e, ReduceOp::Sum, s).unwrap();
            s.synchronize().unwrap();
            check(
                &e,
                ReduceOp::Sum,
                call,
                format!("eager {numel} between replays"),
            );
        }
        call += per_round;
    }
    // Every rank replays every time before any reports (a rank that
    // stopped early would leave the others waiting in a kernel).
    if let Some(e) = failures.into_iter().next() {
        std::panic::resume_unwind(e);
    }
    assert_eq!(
        c.usage().registered,
        after.registered,
        "replays are not calls"
    );
    tensors
}

#[test]
fn registered_captures_replay_in_place_on_new_inputs_at_2_and_4_ranks() {
    if !can_run("registered_captures_replay_in_place_on_new_inputs_at_2_and_4_ranks") {
        return;
    }
    for world in [2, 4] {
        let (store, ranks) = comms_and_store(
            world,
            &format!("registered-{world}"),
            &options(AlgoChoice::Auto, 4 << 20),
        );
        let kept = on_every_rank(&ranks, |c, s| {
            // An eager call first, so eager and captured calls interleave.
            let t = gpu_input(DType::F32, c.rank(), 3001, 0, 0);
            c.all_reduce_on(&t, ReduceOp::Sum, s).unwrap();
            s.synchronize().unwrap();
            let mut kept =
                registered_rank_calls(c, s, &*store, 0, Inputs::Mixed, false, ReduceOp::Sum);
            // A second capture takes the next slots (and averages).
            kept.extend(registered_rank_calls(
                c,
                s,
                &*store,
                100,
                Inputs::Mixed,
                false,
                ReduceOp::Avg,
            ));
            // Tensors from cudarc's stream-ordered pool (which CUDA IPC
            // cannot share) are reached at their addresses: every rank
            // shares this process's context.
            kept.extend(registered_rank_calls(
                c,
                s,
                &*store,
                300,
                Inputs::F32FromPool,
                false,
                ReduceOp::Max,
            ));
            kept
        });
        // The captured tensors outlive the communicators.
        drop(ranks);
        drop(kept);
    }
}

#[test]
fn registered_captures_reach_ranks_in_other_processes_and_a_rank_whose_memory_ipc_cannot_share() {
    if !can_run(
        "registered_captures_reach_ranks_in_other_processes_and_a_rank_whose_memory_ipc_cannot_share",
    ) {
        return;
    }
    // 2 and 4 processes through IPC; then 2 where rank 1's tensors come
    // from a stream-ordered pool, so its calls stage through its graph
    // region while rank 0's tensor is read and written in place.
    for (world, scenario) in [(2, "registered"), (4, "registered"), (2, "registered-pool")] {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("store");
        let store = FileStore::open(&path).unwrap();
        let children: Vec<_> = (1..world)
            .map(|r| spawn_child(&path, r, world, scenario))
            .collect();
        let c = IntraNodeComm::new(
            &store,
            "procs",
            0,
            world,
            0,
            &options(AlgoChoice::Auto, 4 << 20),
        )
        .unwrap();
        let s = Stream::new(0).unwrap();
        let inputs = if scenario == "registered-pool" {
            Inputs::F32
        } else {
            Inputs::Mixed
        };
        let kept = registered_rank_calls(&c, &s, &store, 0, inputs, true, ReduceOp::Sum);
        for mut child in children {
            assert!(
                child.wait().unwrap().success(),
                "a child rank of {world} ({scenario}) failed"
            );
        }
        // The captured tensors outlive the communicator.
        drop(c);
        drop(kept);
    }
}

#[test]
fn a_registering_capture_that_fails_or_differs_on_one_rank_fails_every_rank_by_name() {
    if !can_run("a_registering_capture_that_fails_or_differs_on_one_rank_fails_every_rank_by_name")
    {
        return;
    }
    let (store, ranks) = comms_and_store(2, "registered-bad", &options(AlgoChoice::Auto, 4 << 20));
    let n = 100_000;
    // Rank 1 fails inside its capture; rank 0 captured a call.
    let errors = on_every_rank(&ranks, |c, s| {
        let t = gpu_input(DType::F32, c.rank(), n, 0, 0);
        let started = Instant::now();
        let e = c
            .capture_registered(&*store, s, |s| {
                if c.rank() == 1 {
                    return Err(Error::InvalidArgument("the test's capture broke".into()));
                }
                c.all_reduce_on(&t, ReduceOp::Sum, s).map(|_| ())
            })
            .map(|_| ())
            .unwrap_err();
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "{:?}",
            started.elapsed()
        );
        e.to_string()
    });
    assert!(
        errors[1].contains("the test's capture broke"),
        "{}",
        errors[1]
    );
    assert!(
        errors[0].contains("rank 1 could not capture")
            && errors[0].contains("the test's capture broke"),
        "{}",
        errors[0]
    );
    // Rank 1's closure panics mid-capture: rank 0 is told, and rank 1's
    // stream stops capturing.
    let errors = on_every_rank(&ranks, |c, s| {
        let t = gpu_input(DType::F32, c.rank(), n, 0, 0);
        let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            c.capture_registered(&*store, s, |s| {
                c.all_reduce_on(&t, ReduceOp::Sum, s)?;
                assert!(c.rank() != 1, "the test's closure panics");
                Ok(())
            })
            .map(|_| ())
        }));
        match outcome {
            Ok(r) => r.unwrap_err().to_string(),
            Err(_) => {
                assert!(!s.is_capturing().unwrap(), "the stream still captures");
                "panicked".to_string()
            }
        }
    });
    assert_eq!(errors[1], "panicked");
    assert!(
        errors[0].contains("rank 1 could not capture") && errors[0].contains("panicked"),
        "{}",
        errors[0]
    );
    // Then rank 0 captures two calls and rank 1 one.
    let errors = on_every_rank(&ranks, |c, s| {
        let a = gpu_input(DType::F32, c.rank(), n, 0, 0);
        let b = gpu_input(DType::F32, c.rank(), n, 0, 0);
        let e = c
            .capture_registered(&*store, s, |s| {
                c.all_reduce_on(&a, ReduceOp::Sum, s)?;
                if c.rank() == 0 {
                    c.all_reduce_on(&b, ReduceOp::Sum, s)?;
                }
                Ok(())
            })
            .map(|_| ())
            .unwrap_err();
        assert!(matches!(e, Error::GraphRegistration { .. }), "{e}");
        e.to_string()
    });
    assert!(
        errors[0].contains("captured 2 one-shot or two-shot calls")
            && errors[0].contains("found 1 on rank 1"),
        "{}",
        errors[0]
    );
    assert!(
        errors[1].contains("captured 1 one-shot or two-shot calls")
            && errors[1].contains("found 2 on rank 0"),
        "{}",
        errors[1]
    );
    // Then the same size, but rank 1 takes the maximum.
    let errors = on_every_rank(&ranks, |c, s| {
        let a = gpu_input(DType::F32, c.rank(), n, 0, 0);
        let op = if c.rank() == 0 {
            ReduceOp::Sum
        } else {
            ReduceOp::Max
        };
        let e = c
            .capture_registered(&*store, s, |s| c.all_reduce_on(&a, op, s).map(|_| ()))
            .map(|_| ())
            .unwrap_err();
        assert!(matches!(e, Error::GraphRegistration { .. }), "{e}");
        e.to_string()
    });
    for e in &errors {
        assert!(e.contains("f32/Sum") && e.contains("f32/Max"), "{e}");
    }
    // The communicators still all-reduce, eagerly and in registered
    // captures (none of the graphs above ever ran).
    let kept = on_every_rank(&ranks, |c, s| {
        let t = gpu_input(DType::F32, c.rank(), n, 0, 7);
        c.all_reduce_on(&t, ReduceOp::Sum, s).unwrap();
        s.synchronize().unwrap();
        assert_reference(&t, ReduceOp::Sum, 2, 7, "eager after the failed captures");
        registered_rank_calls(c, s, &*store, 200, Inputs::Mixed, false, ReduceOp::Min)
    });
    // The captured tensors outlive the communicators.
    drop(ranks);
    drop(kept);
}

// ---- ranks as processes (CUDA IPC) ----------------------------------------

const CHILD_STORE: &str = "TENSORCOMM_TEST_INTRANODE_STORE";
const CHILD_RANK: &str = "TENSORCOMM_TEST_INTRANODE_RANK";
const CHILD_WORLD: &str = "TENSORCOMM_TEST_INTRANODE_WORLD";
const CHILD_SCENARIO: &str = "TENSORCOMM_TEST_INTRANODE_SCENARIO";

/// The calls every rank of the process tests makes, bf16 SUM: push,
/// one-shot and (where the world size's limits leave it any sizes)
/// two-shot in turn, each checked after it ran; then push, one-shot,
/// two-shot and the large kernel in turn, all queued back to back, checked
/// after the last.
fn process_rank_calls(c: &IntraNodeComm, s: &Stream) {
    // Ranks sharing a GPU keep usual launches (their kernels must all be
    // resident at once), whatever the environment asks.
    assert!(!c.overlaps_launches(), "rank {}", c.rank());
    // Processes sharing a GPU take turns on it, so each barrier waits for
    // every other rank's time slice: fewer calls for more ranks.
    let calls = if c.world() > 4 { 4 } else { 40 };
    // The sizes pick push, one-shot, then (where the world size's limit is
    // below 400 KB) two-shot; each call must run what the selection says.
    let mut want = (0, 0, 0);
    for call in 0..calls {
        let numel = [1000, 60_000, 200_000][call % 3];
        let t = gpu_input(DType::BF16, c.rank(), numel, 0, call);
        match c.select_all_reduce_algo(&t, ReduceOp::Sum) {
            AllReduceAlgo::Push => want.0 += 1,
            AllReduceAlgo::OneShot => want.1 += 1,
            AllReduceAlgo::TwoShot => want.2 += 1,
            other => panic!("{numel} bf16 elements: selected {other:?}"),
        }
        assert_eq!(c.all_reduce_on(&t, ReduceOp::Sum, s).unwrap(), {
            if numel * 2 <= push_max(c.world()) {
                AllReduceAlgo::Push
            } else if numel * 2 <= one_shot_max(c.world()) {
                AllReduceAlgo::OneShot
            } else {
                AllReduceAlgo::TwoShot
            }
        });
        s.synchronize().unwrap();
        assert_reference(
            &t,
            ReduceOp::Sum,
            c.world(),
            call,
            &format!("process rank {} call {call}", c.rank()),
        );
    }
    let u = c.usage();
    assert_eq!((u.push, u.one_shot, u.two_shot), want, "{u:?}");
    // Then back to back, all queued before the first is waited for (each
    // process has a context of its own, so a rank's queued calls cannot
    // hold up a peer's), the sizes taking every algorithm in turn; the
    // large kernel beyond the 1 MiB region.
    let inputs: Vec<Tensor<'static>> = (0..calls)
        .map(|call| {
            let numel = [1000, 60_000, 200_000, 600_002][call % 4];
            gpu_input(DType::BF16, c.rank(), numel, 2 * (call % 3), calls + call)
        })
        .collect();
    for t in &inputs {
        c.all_reduce_on(t, ReduceOp::Sum, s).unwrap();
    }
    s.synchronize().unwrap();
    for (call, t) in inputs.iter().enumerate() {
        let what = format!("process rank {} back-to-back call {call}", c.rank());
        assert_reference(t, ReduceOp::Sum, c.world(), calls + call, &what);
    }
    assert!(c.usage().large > 0, "{:?}", c.usage());
}

/// Not a test of its own: the entry point of the child ranks below.
#[test]
fn child_rank_entry() {
    let Ok(path) = std::env::var(CHILD_STORE) else {
        return;
    };
    let rank: usize = std::env::var(CHILD_RANK).unwrap().parse().unwrap();
    let world: usize = std::env::var(CHILD_WORLD).unwrap().parse().unwrap();
    let store = FileStore::open(&path).unwrap();
    let scenario = std::env::var(CHILD_SCENARIO).unwrap();
    let opts = match scenario.as_str() {
        "late" => gave_up_options(),
        "own-gpu" => overlap_options(),
        "registered" | "registered-pool" => options(AlgoChoice::Auto, 4 << 20),
        _ => options(AlgoChoice::Auto, 1 << 20),
    };
    // The captured tensors outlive the communicator (dropped below).
    let mut kept = Vec::new();
    // The overlap test's ranks have a GPU each.
    let device = if scenario == "own-gpu" { rank } else { 0 };
    let c = IntraNodeComm::new(&store, "procs", rank, world, device, &opts).unwrap();
    let s = Stream::new(device).unwrap();
    match scenario.as_str() {
        "calls" => process_rank_calls(&c, &s),
        "own-gpu" => own_gpu_rank_calls(&c, &s),
        "registered" => {
            kept = registered_rank_calls(&c, &s, &store, 0, Inputs::Mixed, true, ReduceOp::Sum)
        }
        "registered-pool" => {
            kept =
                registered_rank_calls(&c, &s, &store, 0, Inputs::F32FromPool, true, ReduceOp::Sum)
        }
        "late" => {
            // The gave-up test's rank 1: comes 5 s late, and must fail.
            std::thread::sleep(Duration::from_secs(5));
            let (_, _, verdict) = ten_calls(&c, &s);
            let e = verdict
                .expect_err("rank 1 completed calls rank 0 never made")
                .to_string();
            assert!(e.contains("peer rank 0 did not arrive"), "{e}");
        }
        "wait" => {
            // Set up, say so, and wait to be killed.
            store.set("child-ready", b"1").unwrap();
            std::thread::sleep(Duration::from_secs(120));
            std::process::exit(3);
        }
        other => panic!("scenario {other}"),
    }
    drop(c);
    drop(kept);
}

fn spawn_child(
    path: &std::path::Path,
    rank: usize,
    world: usize,
    scenario: &str,
) -> std::process::Child {
    Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "child_rank_entry",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD_STORE, path)
        .env(CHILD_RANK, rank.to_string())
        .env(CHILD_WORLD, world.to_string())
        .env(CHILD_SCENARIO, scenario)
        .spawn()
        .expect("spawn a child rank")
}

#[test]
fn ranks_in_separate_processes_reduce_through_ipc_at_2_4_and_8_ranks() {
    if !can_run("ranks_in_separate_processes_reduce_through_ipc_at_2_4_and_8_ranks") {
        return;
    }
    for world in [2, 4, 8] {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("store");
        let store = FileStore::open(&path).unwrap();
        let children: Vec<_> = (1..world)
            .map(|r| spawn_child(&path, r, world, "calls"))
            .collect();
        let c = IntraNodeComm::new(
            &store,
            "procs",
            0,
            world,
            0,
            &options(AlgoChoice::Auto, 1 << 20),
        )
        .unwrap();
        let s = Stream::new(0).unwrap();
        process_rank_calls(&c, &s);
        for mut child in children {
            assert!(
                child.wait().unwrap().success(),
                "a child rank of {world} failed"
            );
        }
    }
}

/// The overlap test's options: the defaults of the process tests, with
/// programmatic launches asked for whatever the environment says.
fn overlap_options() -> IntraNodeOptions {
    IntraNodeOptions {
        overlap_launches: Some(true),
        ..options(AlgoChoice::Auto, 1 << 20)
    }
}

/// Rank `c.rank()`'s input for `call` on its own GPU (`c.device()`).
fn own_gpu_input(c: &IntraNodeComm, numel: usize, call: usize) -> Tensor<'static> {
    gpu_input_on(
        Device::Cuda(c.device()),
        DType::BF16,
        c.rank(),
        numel,
        0,
        call,
    )
}

/// The calls of the overlap test's ranks (a GPU each, 2 ranks), bf16
/// SUM: calls of every algorithm 2 ranks use queued back to back (kernel after kernel on the
/// stream, where programmatic launches overlap), checked after the last;
/// then a graph of three such calls replayed on new inputs, checked after
/// every replay.
fn own_gpu_rank_calls(c: &IntraNodeComm, s: &Stream) {
    let capable = tensorcomm::cuda::runtime::context(c.device())
        .unwrap()
        .capability()
        .0
        >= 9;
    assert_eq!(c.overlaps_launches(), capable, "rank {}", c.rank());
    // At 2 ranks: push, push, one-shot and (beyond the 1 MiB region)
    // the large kernel (two-shot takes no sizes there).
    let sizes = [1000, 60_000, 200_000, 600_002];
    let inputs: Vec<Tensor<'static>> = (0..40)
        .map(|call| own_gpu_input(c, sizes[call % 4], call))
        .collect();
    sum_all(c, s, &inputs);
    for (call, t) in inputs.iter().enumerate() {
        let what = format!("own-GPU rank {} back-to-back call {call}", c.rank());
        assert_reference(t, ReduceOp::Sum, c.world(), call, &what);
    }
    let u = c.usage();
    assert!(u.push > 0 && u.one_shot > 0 && u.large > 0, "{u:?}");
    // The same tensor all-reduced k times in a row, each kernel reading
    // what the one before it wrote: after the first call every rank holds
    // the sum S, after call k 2^(k-1) S (doubling is exact).
    for &numel in &sizes {
        let t = own_gpu_input(c, numel, 99);
        for _ in 0..6 {
            c.all_reduce_on(&t, ReduceOp::Sum, s).unwrap();
        }
        s.synchronize().unwrap();
        let got = read(&t);
        for (i, g) in got.iter().enumerate() {
            let want = reference(DType::BF16, ReduceOp::Sum, c.world(), i, 99) * 32.0;
            assert!(
                g.to_bits() == want.to_bits(),
                "own-GPU rank {} chained, {numel} elements: element {i}: got {g}, want {want}",
                c.rank()
            );
        }
    }
    let graph_inputs: Vec<Tensor<'static>> = [1000, 200_000, 600_002]
        .iter()
        .map(|&n| own_gpu_input(c, n, 0))
        .collect();
    s.begin_capture().unwrap();
    for t in &graph_inputs {
        c.all_reduce_on(t, ReduceOp::Sum, s).unwrap();
    }
    let graph = s.end_capture().unwrap();
    for replay in 1..10 {
        for t in &graph_inputs {
            refill(t, c.rank(), replay);
        }
        graph.launch(s).unwrap();
        s.synchronize().unwrap();
        for t in &graph_inputs {
            let what = format!(
                "own-GPU rank {} replay {replay}, {} elements",
                c.rank(),
                t.numel()
            );
            assert_reference(t, ReduceOp::Sum, c.world(), replay, &what);
        }
    }
    c.check().unwrap();
}

#[test]
fn ranks_on_a_gpu_each_overlap_their_launches_back_to_back_and_in_graphs() {
    let test = "ranks_on_a_gpu_each_overlap_their_launches_back_to_back_and_in_graphs";
    if !can_run(test) {
        return;
    }
    let gpus = tensorcomm::cuda::runtime::device_count().unwrap_or(0);
    if gpus < 2 {
        println!("test {test} skipped: needs 2 GPUs, found {gpus}");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store");
    let store = FileStore::open(&path).unwrap();
    let mut child = spawn_child(&path, 1, 2, "own-gpu");
    let c = match IntraNodeComm::new(&store, "procs", 0, 2, 0, &overlap_options()) {
        Ok(c) => c,
        Err(Error::IntraNodeUnavailable { reason }) => {
            // The two GPUs cannot reach each other's memory: so does the
            // child, which fails alike.
            let _ = child.wait();
            println!("test {test} skipped: {reason}");
            return;
        }
        Err(e) => panic!("{e}"),
    };
    let s = Stream::new(0).unwrap();
    own_gpu_rank_calls(&c, &s);
    assert!(child.wait().unwrap().success(), "the child rank failed");
}

/// The options of the gave-up test's two ranks: one-shot, 2 s timeout.
fn gave_up_options() -> IntraNodeOptions {
    IntraNodeOptions {
        kernel_timeout: Some(Duration::from_secs(2)),
        ..options(AlgoChoice::Force(AllReduceAlgo::OneShot), 1 << 20)
    }
}

/// Queues ten calls (stopping at the first refused), waits for the
/// stream, and gives the time that took, the calls queued and the
/// communicator's verdict.
fn ten_calls(c: &IntraNodeComm, s: &Stream) -> (Duration, usize, tensorcomm::Result<()>) {
    let inputs: Vec<Tensor<'static>> = (0..10)
        .map(|call| gpu_input(DType::F32, c.rank(), 1000, 0, call))
        .collect();
    let began = Instant::now();
    let mut queued = 0;
    for t in &inputs {
        if c.all_reduce_on(t, ReduceOp::Sum, s).is_err() {
            break; // refused once a kernel of this rank has stopped
        }
        queued += 1;
    }
    s.synchronize().unwrap();
    (began.elapsed(), queued, c.check())
}

#[test]
fn a_rank_that_gave_up_ends_its_queued_calls_at_once_and_never_lets_a_late_peer_pass() {
    if !can_run("a_rank_that_gave_up_ends_its_queued_calls_at_once_and_never_lets_a_late_peer_pass")
    {
        return;
    }
    // Rank 0 queues 10 one-shot calls at once; rank 1 (a child process:
    // thread ranks sharing a GPU queue one call at a time) queues its own
    // only 5 s after set-up, once rank 0's first call has timed out (2 s).
    // Rank 0's other nine must end at entry (its queue drains in about one
    // timeout, not ten), and must not arrive at their barriers: rank 1's
    // first call may pass on rank 0's first arrival (its data was in
    // place), but its next call has to wait for an arrival that never
    // comes and fail, not reduce stale buffers (the child checks that).
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store");
    let store = FileStore::open(&path).unwrap();
    let mut child = spawn_child(&path, 1, 2, "late");
    let c = IntraNodeComm::new(&store, "procs", 0, 2, 0, &gave_up_options()).unwrap();
    let s = Stream::new(0).unwrap();
    let (took, queued, verdict) = ten_calls(&c, &s);
    assert_eq!(
        queued, 10,
        "rank 0 queued every call before its first gave up"
    );
    assert!(
        took < Duration::from_secs(5),
        "rank 0's ten calls took {took:?}: the nine behind the failed one waited"
    );
    let e = verdict.unwrap_err().to_string();
    assert!(e.contains("peer rank 1 did not arrive"), "{e}");
    let status = child.wait().unwrap();
    assert!(
        status.success(),
        "the late rank 1 failed its checks: {status}"
    );
}

#[test]
fn a_rank_killed_during_a_call_fails_the_survivor_by_name_without_a_hang() {
    if !can_run("a_rank_killed_during_a_call_fails_the_survivor_by_name_without_a_hang") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store");
    let store = FileStore::open(&path).unwrap();
    let mut child = spawn_child(&path, 1, 2, "wait");
    let opts = IntraNodeOptions {
        kernel_timeout: Some(Duration::from_secs(3)),
        ..options(AlgoChoice::Auto, 1 << 20)
    };
    let c = IntraNodeComm::new(&store, "procs", 0, 2, 0, &opts).unwrap();
    store
        .wait_timeout(&["child-ready"], Duration::from_secs(60))
        .unwrap();
    let s = Stream::new(0).unwrap();
    let t = gpu_input(DType::F32, 0, 1000, 0, 0);
    let started = Instant::now();
    c.all_reduce_on(&t, ReduceOp::Sum, &s).unwrap(); // waits in the kernel for rank 1
    child.kill().unwrap();
    child.wait().unwrap();
    match c.synchronize() {
        Err(Error::IntraNodeFailed { rank: 0, reason }) => {
            assert!(reason.contains("peer rank 1"), "{reason}")
        }
        other => panic!("{other:?}"),
    }
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "took {:?}",
        started.elapsed()
    );
    // Later calls are refused at once, and dropping unmaps and frees.
    match c.all_reduce_on(&t, ReduceOp::Sum, &s) {
        Err(Error::IntraNodeFailed { .. }) => {}
        other => panic!("{other:?}"),
    }
    drop(c);
    // The GPU is still usable by this process.
    let after = gpu_input(DType::F32, 0, 10, 0, 0);
    assert_eq!(read(&after).len(), 10);
}
