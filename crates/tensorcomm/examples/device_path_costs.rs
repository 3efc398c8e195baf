//! Where the CPU group's device path (CUDA tensors all-reduced on peer
//! memory, `CpuOptions::peer_memory`) spends its time: the median host
//! time of one 8-byte call its caller waits for, against the intra-node
//! all-reduce it runs ([`IntraNodeComm`] called directly), with and
//! without [`run_here`], and a host tensor's all_reduce beside it (the
//! device path's vote is one). Rank 0 prints the slowest rank's medians.
//!
//! ```text
//! cargo build --release -p tensorcomm --example device_path_costs
//! tensorcomm run --nproc-per-node 2 -- target/release/examples/device_path_costs
//! ```
//!
//! Needs one GPU per rank where peer memory is eligible (distinct GPUs
//! with NVLink by default); elsewhere the group is created without peer
//! memory and the device rows time the staged path instead.
use std::sync::Arc;
use std::time::{Duration, Instant};

use tensorcomm::cpu::backend::{CpuOptions, PeerMemory, ProcessGroupCpu};
use tensorcomm::cuda::intranode::{IntraNodeComm, IntraNodeOptions};
use tensorcomm::cuda::runtime::{self, current_stream};
use tensorcomm::group::run_here;
use tensorcomm::rendezvous::rendezvous;
use tensorcomm::tensor::{DType, Device, Tensor};
use tensorcomm::{ProcessGroup, ReduceOp, Result};

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 2]
}

fn main() -> Result<()> {
    let r = rendezvous("env://", Duration::from_secs(60))?;
    let (rank, world) = (r.rank, r.world_size);
    let gpu = r.local_rank.unwrap_or(rank) % runtime::device_count()?.max(1);
    let store = r.store.clone();
    let pg = ProcessGroupCpu::new(
        store.clone(),
        "probe",
        rank,
        world,
        &CpuOptions {
            peer_memory: Some(PeerMemory {
                device: gpu,
                options: IntraNodeOptions::default(),
            }),
            ..CpuOptions::default()
        },
    )?;
    let comm = Arc::new(IntraNodeComm::new(
        &*store,
        "probe-direct",
        rank,
        world,
        gpu,
        &IntraNodeOptions::default(),
    )?);
    let n = 20000;
    let t = Tensor::zeros_on(&[2], DType::F32, Device::Cuda(gpu))?;
    let h = Tensor::zeros_on(&[2], DType::F32, Device::Cpu)?;
    let ctx = runtime::context(gpu)?;
    let stream = current_stream(gpu)?;
    let mut rows: Vec<(&str, f64)> = Vec::new();
    let mut time = |name: &'static str, f: &mut dyn FnMut() -> Result<()>| -> Result<()> {
        for _ in 0..500 {
            f()?;
        }
        pg.barrier(None)?.wait()?;
        let mut v = Vec::with_capacity(n);
        for _ in 0..n {
            let t0 = Instant::now();
            f()?;
            v.push(t0.elapsed().as_secs_f64() * 1e6);
        }
        rows.push((name, median(v)));
        Ok(())
    };
    time("intranode direct + stream sync", &mut || {
        comm.all_reduce_on(&t, ReduceOp::Sum, &stream)?;
        stream.synchronize()
    })?;
    time("intranode direct + ctx sync", &mut || {
        comm.all_reduce_on(&t, ReduceOp::Sum, &stream)?;
        ctx.synchronize()
    })?;
    time("group cuda wait + ctx sync (bench)", &mut || {
        pg.all_reduce(&t, ReduceOp::Sum, None)?.wait()?;
        ctx.synchronize()
    })?;
    time("group cuda wait + stream sync", &mut || {
        pg.all_reduce(&t, ReduceOp::Sum, None)?.wait()?;
        stream.synchronize()
    })?;
    time("run_here group cuda wait + ctx sync", &mut || {
        run_here(|| pg.all_reduce(&t, ReduceOp::Sum, None)?.wait())?;
        ctx.synchronize()
    })?;
    time("group cpu 8B wait", &mut || {
        pg.all_reduce(&h, ReduceOp::Sum, None)?.wait()
    })?;
    time("run_here group cpu 8B wait", &mut || {
        run_here(|| pg.all_reduce(&h, ReduceOp::Sum, None)?.wait())
    })?;
    time("ctx sync alone", &mut || ctx.synchronize())?;
    let vals = Tensor::from_vec(
        rows.iter().map(|r| r.1).collect::<Vec<f64>>(),
        &[rows.len()],
    )?;
    pg.all_reduce(&vals, ReduceOp::Max, None)?.wait()?;
    if rank == 0 {
        for ((name, _), v) in rows.iter().zip(vals.to_vec::<f64>()?) {
            println!("{name:40} {v:8.2} us (median, slowest rank)");
        }
    }
    pg.barrier(None)?.wait()?;
    Ok(())
}
