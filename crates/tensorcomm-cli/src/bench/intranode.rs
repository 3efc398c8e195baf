//! `tensorcomm bench --backend intranode`: the peer-memory all-reduce
//! (`cuda::intranode`), one rank per process on cuda:(LOCAL_RANK % GPUs).
//! Ranks sharing a GPU need `TENSORCOMM_INTRANODE=shared`.
//!
//! For each size it checks one call against the reference (rank r's input
//! all r + 1), then times `--iters` calls after `--warmup`, queued on one
//! stream behind a gate that opens once every rank has queued its batch
//! (so the device runs them back to back, not at the host's pace): before
//! each, a device copy of a fresh input over the (in-place) output, then
//! an event, the call, an event. `time` is the median device time of one
//! call (eager), `host` the median host time of queueing one, `graph` the
//! device time of one call inside a CUDA graph of 20 calls replayed (the
//! graph's time over 20; its input is refreshed before each replay), `reg`
//! the same for a graph captured with `IntraNodeComm::capture_registered`
//! (one-shot and two-shot calls then read and write the ranks' tensors in
//! place, with no copy through the buffers; other sizes capture as in
//! `graph`), and
//! `sync` the median host time of one call its caller waits for (the call,
//! then its stream synchronized), the way `bench --backend cpu --device
//! cuda --peer-memory` times the CPU group's device path, so the two
//! compare like for like. The last result of the timed calls is checked
//! again. Rows give the slowest rank's medians.
//! `--in-process` runs the ranks as threads of one process (ranks sharing
//! a GPU then run their kernels side by side; as processes they take
//! turns on the GPU, and each barrier waits for a time slice); threads
//! sharing a GPU queue one eager call and one graph replay per gate (see
//! `rank_body`), so their times also hold the skew between the ranks'
//! gates opening (each rank opens its own once the host barrier returns).

use std::sync::Arc;
use std::time::{Duration, Instant};

use tensorcomm::cpu::backend::{CpuOptions, ProcessGroupCpu};
use tensorcomm::cuda::intranode::{
    AllReduceAlgo, IntraNodeComm, IntraNodeOptions, GRAPH_INPUT_SLOTS,
};
use tensorcomm::cuda::runtime::{self, CapturedGraph, Event, MappedWords, Stream};
use tensorcomm::rendezvous::rendezvous;
use tensorcomm::store::{HashStore, Store};
use tensorcomm::tensor::{DType, Device, Tensor};
use tensorcomm::{ProcessGroup, ReduceOp};

use super::nccl::median;
use super::{data, progress, sizes, BenchArgs, BenchOp, Row};
use crate::stdout::Stdout;

/// Calls per captured graph.
const GRAPH_CALLS: usize = 20;

/// Calls queued behind one gate by all ranks together: the driver's
/// queue is shared by the process's streams, and a full one would block
/// the host behind a gate it has not opened yet.
const BATCH_ALL_RANKS: usize = 48;

/// A GPU tensor of `dtype` with every element `v`.
fn filled(dtype: DType, n: usize, v: f64, device: usize) -> tensorcomm::Result<Tensor<'static>> {
    data::make(dtype, n, |_| v)?.to_device(Device::Cuda(device))
}

/// True when every element of `t` is `want`.
fn all_equal(t: &Tensor<'_>, want: f64) -> tensorcomm::Result<bool> {
    Ok(data::decode(t)?.iter().all(|&g| g == want))
}

/// Runs every size on this rank; rank 0 prints. True when all rows were
/// correct.
pub fn run_rank(args: &BenchArgs, op: BenchOp) -> tensorcomm::Result<bool> {
    check_op(op)?;
    let r = rendezvous("env://", Duration::from_secs(300))?;
    let count = runtime::device_count()?.max(1);
    let device = r.local_rank.unwrap_or(r.rank) % count;
    rank_body(args, r.rank, r.world_size, device, r.store)
}

/// `--in-process`: the `-n` ranks as threads of this process, rank r on
/// cuda:(r % GPUs).
pub fn run_threads(args: &BenchArgs, op: BenchOp) -> tensorcomm::Result<bool> {
    check_op(op)?;
    // Every rank's stream needs its own hardware queue: with CUDA's default
    // of 8, a rank's kernel can wait behind another's that spins for it.
    // Set before the first CUDA call, while this is the only thread.
    if std::env::var_os("CUDA_DEVICE_MAX_CONNECTIONS").is_none() {
        std::env::set_var("CUDA_DEVICE_MAX_CONNECTIONS", "32");
    }
    let ranks = args.nproc;
    let count = runtime::device_count()?.max(1);
    let store: Arc<dyn Store> = Arc::new(HashStore::new());
    let results: Vec<tensorcomm::Result<bool>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..ranks)
            .map(|rank| {
                let store = store.clone();
                s.spawn(move || rank_body(args, rank, ranks, rank % count, store))
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join().unwrap_or_else(|_| {
                    Err(tensorcomm::Error::InvalidArgument(
                        "a rank thread panicked".into(),
                    ))
                })
            })
            .collect()
    });
    let mut all = true;
    for r in results {
        all &= r?;
    }
    Ok(all)
}

fn check_op(op: BenchOp) -> tensorcomm::Result<()> {
    if op != BenchOp::AllReduce {
        return Err(tensorcomm::Error::InvalidArgument(format!(
            "--backend intranode times all_reduce, found {}",
            op.name()
        )));
    }
    Ok(())
}

/// One rank's sizes; rank 0 prints.
fn rank_body(
    args: &BenchArgs,
    rank: usize,
    ranks: usize,
    device: usize,
    store: Arc<dyn Store>,
) -> tensorcomm::Result<bool> {
    let count = runtime::device_count()?.max(1);
    // A CPU group to agree on the slowest rank's numbers.
    let pg = ProcessGroupCpu::new(
        store.clone(),
        "bench-cpu",
        rank,
        ranks,
        &CpuOptions::default(),
    )?;
    // Tensors of registered graphs, kept until the communicator is gone
    // (declared first, dropped last).
    let mut kept: Vec<Tensor<'static>> = Vec::new();
    let comm = IntraNodeComm::new(
        &*store,
        "bench",
        rank,
        ranks,
        device,
        &IntraNodeOptions::default(),
    )?;
    let dtype = args.dtype;
    // Rank 0's stdout, until a write to it fails (`bench | head`).
    let mut stdout = Stdout::new(rank == 0);
    if rank == 0 && !args.json {
        stdout.line(format_args!(
            "# tensorcomm bench: all_reduce {dtype} on {} {} (peer memory, cuda:{device} of {count} GPUs), {} iterations after {} warm-up; time = device time per eager call, graph = per call in a CUDA graph of {GRAPH_CALLS}, reg = the same with registered tensors (medians)",
            super::rank_count(ranks),
            if args.in_process { "as threads" } else { "as processes" },
            args.iters,
            args.warmup
        ));
        stdout.line(format_args!(
            "{} {:>10} {:>9} {:>9} {:>9} {:>9}",
            Row::header(),
            "graph(us)",
            "reg(us)",
            "host(us)",
            "sync(us)",
            "algo"
        ));
    }
    // Ranks that are threads of one process on one GPU queue a call only
    // once their last one has run (`IntraNodeComm::all_reduce_on`), so a
    // second call queued behind a closed gate would wait for the gate
    // forever: they queue one call per gate, and one graph replay (their
    // replays back to back can wait on each other's kernels, as
    // `IntraNodeComm`'s docs say).
    let one_at_a_time = args.in_process && ranks > count;
    let stream = Stream::new(device)?;
    // One gate for the whole run: freeing pinned memory waits for the
    // whole device, which a rank of this process may keep busy waiting for
    // this one (ranks as threads).
    let gate = MappedWords::new(device, 1)?;
    let mut released = 0;
    let sizes = sizes(args);
    let mut progress = progress::Progress::on_terminal(rank == 0, sizes.len());
    let mut all_correct = true;
    let want = (ranks * (ranks + 1) / 2) as f64;
    for size in sizes {
        // Before this size queues any work gated on the other ranks, so
        // stopping here leaves none of it waiting.
        if !stdout.agree_open(&pg, Device::Cpu)? {
            // Nobody reads the rows any more: every rank stops here.
            break;
        }
        let n = (size / dtype.size()).max(1);
        progress.show(n * dtype.size());
        let fresh = filled(dtype, n, rank as f64 + 1.0, device)?;
        let data = filled(dtype, n, -7.0, device)?;
        // Check one call.
        data.copy_from_on(&fresh, &stream)?;
        let algo = comm.all_reduce_on(&data, ReduceOp::Sum, &stream)?;
        comm.synchronize()?;
        stream.synchronize()?;
        let mut correct = all_equal(&data, want)?;
        // Eager calls, queued behind a gate in batches, so that the device
        // runs them back to back whatever the host's pace (the host time
        // per call is measured apart).
        let mut eager = Vec::new();
        let mut host = Vec::new();
        let total = args.warmup + args.iters;
        let mut done = 0;
        while done < total {
            let batch = if one_at_a_time {
                1
            } else {
                (BATCH_ALL_RANKS / ranks).max(2)
            }
            .min(total - done);
            stream.wait_word(&gate, 0, released + 1)?;
            let mut events: Vec<(Event, Event)> = Vec::new();
            for _ in 0..batch {
                data.copy_from_on(&fresh, &stream)?;
                let start = stream.record_timed()?;
                let t0 = Instant::now();
                comm.all_reduce_on(&data, ReduceOp::Sum, &stream)?;
                host.push(t0.elapsed().as_secs_f64() * 1e6);
                events.push((start, stream.record_timed()?));
            }
            pg.barrier(None)?.wait()?;
            released += 1;
            gate.store(0, released);
            stream.synchronize()?;
            comm.check()?;
            for (i, (start, end)) in events.iter().enumerate() {
                if done + i >= args.warmup {
                    eager.push(f64::from(start.elapsed_ms(end)?) * 1e3);
                }
            }
            done += batch;
        }
        correct &= all_equal(&data, want)?;
        // Graph replays, GRAPH_CALLS calls each, gated the same way: a
        // plain capture, then a registered one.
        stream.begin_capture()?;
        for _ in 0..GRAPH_CALLS {
            comm.all_reduce_on(&data, ReduceOp::Sum, &stream)?;
        }
        let graph = stream.end_capture()?;
        let replays_n = args.warmup + args.iters.div_ceil(GRAPH_CALLS).max(5);
        let per_gate = if one_at_a_time { 1 } else { replays_n };
        let mut time_replays = |graph: &CapturedGraph| -> tensorcomm::Result<Vec<f64>> {
            let mut events: Vec<(Event, Event)> = Vec::new();
            while events.len() < replays_n {
                stream.wait_word(&gate, 0, released + 1)?;
                for _ in 0..per_gate.min(replays_n - events.len()) {
                    data.copy_from_on(&fresh, &stream)?;
                    let start = stream.record_timed()?;
                    graph.launch(&stream)?;
                    events.push((start, stream.record_timed()?));
                }
                pg.barrier(None)?.wait()?;
                released += 1;
                gate.store(0, released);
                stream.synchronize()?;
            }
            let mut per_call = Vec::new();
            for (start, end) in &events[args.warmup..] {
                per_call.push(f64::from(start.elapsed_ms(end)?) * 1e3 / GRAPH_CALLS as f64);
            }
            Ok(per_call)
        };
        let replays = time_replays(&graph)?;
        comm.check()?;
        let before = comm.usage().registered;
        let registered = comm.capture_registered(&*store, &stream, |s| {
            for _ in 0..GRAPH_CALLS {
                comm.all_reduce_on(&data, ReduceOp::Sum, s)?;
            }
            Ok(())
        })?;
        let took = comm.usage().registered - before;
        if took > 0 {
            // Peers keep registered tensors mapped: they must outlive
            // the communicator.
            kept.push(data.clone());
        }
        if took < GRAPH_CALLS as u64
            && matches!(algo, AllReduceAlgo::OneShot | AllReduceAlgo::TwoShot)
        {
            stdout.line(format_args!(
                "# reg at {} B: {took} of {GRAPH_CALLS} calls registered (the communicator's {GRAPH_INPUT_SLOTS} slots ran out), the rest captured as in graph",
                n * dtype.size()
            ));
        }
        let registered_replays = time_replays(&registered)?;
        comm.check()?;
        // One more replay, checked: GRAPH_CALLS sums in place, each after
        // the first multiplying every element by the number of ranks.
        data.copy_from_on(&fresh, &stream)?;
        registered.launch(&stream)?;
        stream.synchronize()?;
        comm.check()?;
        let mut after_replay = want;
        for _ in 1..GRAPH_CALLS {
            // Rounded to the dtype, as the kernel stores each result.
            after_replay =
                data::decode(&data::make(dtype, 1, |_| after_replay * ranks as f64)?)?[0];
        }
        correct &= all_equal(&data, after_replay)?;
        // Calls the host waits for one by one, as a synchronous caller
        // (and the CPU group's device path) does; the ranks start together.
        let mut sync = Vec::new();
        pg.barrier(None)?.wait()?;
        for i in 0..total {
            // A fresh input (sums of sums would overflow), not timed.
            data.copy_from_on(&fresh, &stream)?;
            stream.synchronize()?;
            let t0 = Instant::now();
            comm.all_reduce_on(&data, ReduceOp::Sum, &stream)?;
            stream.synchronize()?;
            if i >= args.warmup {
                sync.push(t0.elapsed().as_secs_f64() * 1e6);
            }
        }
        comm.check()?;
        correct &= all_equal(&data, want)?;
        // The slowest rank's medians and everyone's verdict.
        let agreed = Tensor::from_vec(
            vec![
                median(eager),
                median(replays),
                if correct { 0.0 } else { 1.0 },
                median(host),
                median(sync),
                median(registered_replays),
            ],
            &[6],
        )?;
        pg.all_reduce(&agreed, ReduceOp::Max, None)?.wait()?;
        let v = agreed.to_vec::<f64>()?;
        let row_correct = v[2] == 0.0;
        all_correct &= row_correct;
        progress.clear();
        if rank == 0 {
            let row = Row::new(
                n * dtype.size(),
                n,
                dtype.name(),
                "all_reduce",
                ranks,
                v[0],
                row_correct,
            );
            if args.json {
                stdout.line(format_args!(
                    "{}",
                    row.json_with(&[
                        ("graph_us", serde_json::json!(v[1])),
                        ("registered_graph_us", serde_json::json!(v[5])),
                        ("host_us", serde_json::json!(v[3])),
                        ("sync_us", serde_json::json!(v[4])),
                        ("algo", serde_json::json!(algo.name())),
                    ])
                ));
            } else {
                stdout.line(format_args!(
                    "{} {:>10.2} {:>9.2} {:>9.2} {:>9.2} {:>9}",
                    row.text(),
                    v[1],
                    v[5],
                    v[3],
                    v[4],
                    algo.name()
                ));
            }
        }
    }
    pg.barrier(None)?.wait()?;
    Ok(all_correct)
}
