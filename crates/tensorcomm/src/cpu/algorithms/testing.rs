//! Test harness for algorithms: a TCP mesh on loopback, one thread per
//! rank, and an all-reduce checker against a scalar reference.

use std::ops::Range;
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use half::bf16;

use super::ExchangeBlocks;
use crate::cpu::reduce_kernels::ReduceOp;
use crate::cpu::transport::{TcpTransport, TcpTransportOptions, Transport};
use crate::store::HashStore;
use crate::tensor::DType;
use crate::Result;

pub(crate) fn deadline() -> Instant {
    Instant::now() + Duration::from_secs(60)
}

/// The shared-memory arena of rank `t.rank()` of `t`'s ranks for a test
/// (slot halves of `chunk` bytes, set up through `store` under `prefix`),
/// waiting as `TENSORCOMM_SHM_WAIT` asks: `sleep` or `spin` in the test
/// run's environment forces every arena test's waits (unset: `auto`, so
/// `sleep` on a host with fewer CPUs than the test's ranks).
#[cfg(target_os = "linux")]
pub(crate) fn test_arena(
    t: &dyn Transport,
    store: &HashStore,
    prefix: &str,
    chunk: usize,
) -> crate::cpu::transport::shm::ShmArena {
    use crate::cpu::transport::shm::{ShmArena, ShmWait};
    use crate::env_vars::EnvVar;
    let wait = ShmWait::from_vars(&EnvVar::get_lossy).expect("TENSORCOMM_SHM_WAIT");
    let mut arena = ShmArena::connect(
        store,
        prefix,
        t.rank(),
        t.world_size(),
        chunk,
        Duration::from_secs(30),
    )
    .expect("arena setup");
    arena.set_wait(wait);
    arena
}

/// Runs `f` on every rank of a fresh mesh of `world` ranks, one thread
/// each, and returns the results in rank order.
pub(crate) fn run_ranks<R: Send>(world: usize, f: impl Fn(&dyn Transport) -> R + Sync) -> Vec<R> {
    run_ranks_with_store(world, |t, _| f(t))
}

/// [`run_ranks`], also handing each rank the store the mesh met through.
pub(crate) fn run_ranks_with_store<R: Send>(
    world: usize,
    f: impl Fn(&dyn Transport, &HashStore) -> R + Sync,
) -> Vec<R> {
    let store = Arc::new(HashStore::new());
    let f = &f;
    thread::scope(|s| {
        let handles: Vec<_> = (0..world)
            .map(|rank| {
                let store = store.clone();
                s.spawn(move || {
                    let options = TcpTransportOptions {
                        timeout: Duration::from_secs(30),
                        ..TcpTransportOptions::default()
                    };
                    let t = TcpTransport::connect(&*store, "test", rank, world, &options)
                        .expect("mesh setup");
                    f(&t, &store)
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("rank thread"))
            .collect()
    })
}

/// One all-reduce case: a dtype, an op and the value rank `r` holds at
/// element `i` (small integers, exact in every dtype).
struct Case {
    dtype: DType,
    op: ReduceOp,
    value: fn(usize, usize) -> f64,
}

const CASES: [Case; 7] = [
    Case {
        dtype: DType::I64,
        op: ReduceOp::Sum,
        value: |r, i| (r * 1000 + i) as f64 * if i % 2 == 1 { -1.0 } else { 1.0 },
    },
    Case {
        dtype: DType::I32,
        op: ReduceOp::Product,
        value: |r, i| ((r + i) % 3 + 1) as f64,
    },
    Case {
        dtype: DType::F32,
        op: ReduceOp::Max,
        value: |r, i| ((r * 5 + i * 7) % 13) as f64 - 6.0,
    },
    Case {
        dtype: DType::F64,
        op: ReduceOp::Avg,
        value: |r, i| (r * 3 + i) as f64,
    },
    Case {
        dtype: DType::U8,
        op: ReduceOp::Bxor,
        value: |r, i| ((r * 37 + i * 11) % 256) as f64,
    },
    Case {
        dtype: DType::BF16,
        op: ReduceOp::Min,
        value: |r, i| ((r + 2 * i) % 9) as f64 - 4.0,
    },
    Case {
        dtype: DType::Bool,
        op: ReduceOp::Band,
        value: |r, i| f64::from((r + i) % 3 != 0),
    },
];

fn encode(dtype: DType, v: f64) -> Vec<u8> {
    match dtype {
        DType::I64 => (v as i64).to_ne_bytes().to_vec(),
        DType::I32 => (v as i32).to_ne_bytes().to_vec(),
        DType::F32 => (v as f32).to_ne_bytes().to_vec(),
        DType::F64 => v.to_ne_bytes().to_vec(),
        DType::BF16 => bf16::from_f64(v).to_ne_bytes().to_vec(),
        DType::U8 | DType::Bool => vec![v as u8],
        DType::I8 => vec![v as i8 as u8],
        DType::F16 => half::f16::from_f64(v).to_ne_bytes().to_vec(),
    }
}

fn reference(case: &Case, world: usize, i: usize) -> f64 {
    let mut acc = (case.value)(0, i);
    for r in 1..world {
        let b = (case.value)(r, i);
        acc = match case.op {
            ReduceOp::Sum | ReduceOp::Avg => acc + b,
            ReduceOp::Product => acc * b,
            ReduceOp::Max => acc.max(b),
            ReduceOp::Min => acc.min(b),
            ReduceOp::Bxor => ((acc as i64) ^ (b as i64)) as f64,
            ReduceOp::Band => ((acc as i64) & (b as i64)) as f64,
            other => unreachable!("{other}"),
        };
    }
    if case.op == ReduceOp::Avg {
        acc /= world as f64;
    }
    acc
}

/// Runs `algorithm` for every case, world size and element count, checking
/// each rank's result against the reference, plus a random f32 sum that
/// must come out bit-identical on every rank.
pub(crate) fn check_all_reduce(
    worlds: &[usize],
    lengths: &[usize],
    algorithm: impl Fn(&dyn Transport, &mut [u8], DType, ReduceOp, Instant) -> Result<()> + Sync,
) {
    check_all_reduce_with(
        worlds,
        lengths,
        |_, _| (),
        |t, _: &(), buf, dtype, op, deadline| algorithm(t, buf, dtype, op, deadline),
    );
}

/// [`check_all_reduce`] for an algorithm that needs per-rank state `S`
/// besides the transport, made by `setup` once per rank.
pub(crate) fn check_all_reduce_with<S>(
    worlds: &[usize],
    lengths: &[usize],
    setup: impl Fn(&dyn Transport, &HashStore) -> S + Sync,
    algorithm: impl Fn(&dyn Transport, &S, &mut [u8], DType, ReduceOp, Instant) -> Result<()> + Sync,
) {
    for &world in worlds {
        let results = run_ranks_with_store(world, |t, store| {
            let state = setup(t, store);
            let mut out = Vec::new();
            for &n in lengths {
                for case in &CASES {
                    let mut buf: Vec<u8> = (0..n)
                        .flat_map(|i| encode(case.dtype, (case.value)(t.rank(), i)))
                        .collect();
                    algorithm(t, &state, &mut buf, case.dtype, case.op, deadline())
                        .expect("all_reduce");
                    out.push(buf);
                }
                let mut noise: Vec<u8> = (0..n)
                    .flat_map(|i| {
                        let x = ((t.rank() * 7919 + i * 104_729) % 1000) as f32 / 997.0 - 0.5;
                        x.to_ne_bytes()
                    })
                    .collect();
                algorithm(t, &state, &mut noise, DType::F32, ReduceOp::Sum, deadline())
                    .expect("all_reduce");
                out.push(noise);
            }
            out
        });
        let mut k = 0;
        for &n in lengths {
            for case in &CASES {
                let expected: Vec<u8> = (0..n)
                    .flat_map(|i| encode(case.dtype, reference(case, world, i)))
                    .collect();
                for (rank, got) in results.iter().enumerate() {
                    assert_eq!(
                        got[k], expected,
                        "{} {} world {world} n {n} rank {rank}",
                        case.op, case.dtype
                    );
                }
                k += 1;
            }
            for (rank, got) in results.iter().enumerate() {
                assert_eq!(
                    got[k], results[0][k],
                    "f32 sum differs between rank 0 and rank {rank}"
                );
                for (i, bytes) in got[k].chunks_exact(4).enumerate() {
                    let v = f32::from_ne_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]);
                    let exact: f64 = (0..world)
                        .map(|r| ((r * 7919 + i * 104_729) % 1000) as f32 as f64 / 997.0 - 0.5)
                        .sum();
                    assert!(
                        (f64::from(v) - exact).abs() < 1e-4,
                        "f32 sum {v} vs {exact}"
                    );
                }
            }
            k += 1;
        }
    }
}

/// An all-to-all's blocks in plain buffers: block `p` of `send` goes to
/// rank `p`, block `p` of `recv` comes from it.
pub(crate) struct BlockBuffers {
    pub send: Vec<Vec<u8>>,
    pub recv: Vec<Mutex<Vec<u8>>>,
}

impl BlockBuffers {
    /// `send[p]` to send, and `recv_lens[p]` bytes of 0xEE to receive into.
    pub fn new(send: Vec<Vec<u8>>, recv_lens: impl Iterator<Item = usize>) -> BlockBuffers {
        BlockBuffers {
            send,
            recv: recv_lens.map(|n| Mutex::new(vec![0xEE; n])).collect(),
        }
    }

    /// The received blocks.
    pub fn received(self) -> Vec<Vec<u8>> {
        self.recv
            .into_iter()
            .map(|m| m.into_inner().unwrap_or_else(|e| e.into_inner()))
            .collect()
    }
}

impl ExchangeBlocks for BlockBuffers {
    fn send_len(&self, peer: usize) -> usize {
        self.send[peer].len()
    }
    fn recv_len(&self, peer: usize) -> usize {
        self.recv[peer].lock().map_or(0, |b| b.len())
    }
    fn read(&self, peer: usize, range: Range<usize>, f: &mut dyn FnMut(&[u8])) -> Result<()> {
        f(&self.send[peer][range]);
        Ok(())
    }
    fn write(&self, peer: usize, range: Range<usize>, f: &mut dyn FnMut(&mut [u8])) -> Result<()> {
        let mut block = self.recv[peer].lock().unwrap_or_else(|e| e.into_inner());
        f(&mut block[range]);
        Ok(())
    }
}
