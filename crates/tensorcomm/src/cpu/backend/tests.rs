//! `TENSORCOMM_SHM_WAIT` at group creation: the choice reaches the
//! group's collective links, its point-to-point links and its arena, and
//! collectives over each of them still give exact results. The variable is
//! looked up through an injected function, so this test binary's
//! environment (shared by its threads) is never changed.

use super::*;
use crate::store::HashStore;

/// What one rank of a group saw: the waits of its collective transport,
/// point-to-point transport and arena, every link's wait (peer and wait)
/// of those two transports, how many elements of its two all-reduces
/// differ from the known sums, and what it received.
#[derive(Debug, PartialEq)]
struct Seen {
    waits: [Option<ShmWait>; 3],
    link_waits: [Vec<(usize, ShmWait)>; 2],
    wrong: usize,
    received: Vec<i32>,
}

/// Elements of the all-reduce that goes through the arena (64 KiB of
/// f32, above every world's arena threshold).
const LARGE: usize = 16 << 10;

/// Sets up `world` ranks as threads, each finding `value` for
/// `TENSORCOMM_SHM_WAIT`, and on each runs a small all-reduce (over the
/// links), a large one (through the arena) and a send to the next rank
/// with a receive from the previous one (over the point-to-point links).
fn run_group(prefix: &str, world: usize, value: Option<&'static str>) -> Vec<Result<Seen>> {
    let store: Arc<dyn Store> = Arc::new(HashStore::new());
    let env = move |v: &EnvVar| (v.name == "TENSORCOMM_SHM_WAIT").then_some(value?.to_string());
    std::thread::scope(|s| {
        let ranks: Vec<_> = (0..world)
            .map(|rank| {
                let store = store.clone();
                s.spawn(move || -> Result<Seen> {
                    let options = CpuOptions {
                        timeout: Duration::from_secs(60),
                        transport: TransportChoice::Auto,
                        ..CpuOptions::default()
                    };
                    let pg = ProcessGroupCpu::connect(
                        store,
                        prefix,
                        (rank, world),
                        &options,
                        (0..world).collect(),
                        &env,
                    )?;
                    let arena = pg.backend.arena.as_ref().map(|a| a.shm.wait());
                    let waits = [
                        pg.backend.transport.shm_wait(),
                        pg.backend.p2p.shm_wait(),
                        arena,
                    ];
                    let link_waits = [
                        pg.backend.transport.shm_link_waits(),
                        pg.backend.p2p.shm_link_waits(),
                    ];
                    let small = Tensor::from_vec(vec![rank as i64 + 1; 8], &[8])?;
                    pg.all_reduce(&small, ReduceOp::Sum, None)?.wait()?;
                    let large: Vec<f32> =
                        (0..LARGE).map(|e| (rank * 100 + e % 50) as f32).collect();
                    let large = Tensor::from_vec(large, &[LARGE])?;
                    pg.all_reduce(&large, ReduceOp::Sum, None)?.wait()?;
                    let (next, previous) = ((rank + 1) % world, (rank + world - 1) % world);
                    let inbox = Tensor::zeros(&[4], DType::I32)?;
                    let got = pg.recv(&inbox, previous, 7, None)?;
                    let outbox = Tensor::from_vec(vec![rank as i32 * 10; 4], &[4])?;
                    pg.send(&outbox, next, 7, None)?.wait()?;
                    got.wait()?;
                    let w = world as i64;
                    let wrong_small = small
                        .to_vec::<i64>()?
                        .iter()
                        .filter(|&&v| v != w * (w + 1) / 2)
                        .count();
                    let wrong_large = large
                        .to_vec::<f32>()?
                        .iter()
                        .enumerate()
                        .filter(|&(e, &v)| {
                            v != (100 * world * (world - 1) / 2 + world * (e % 50)) as f32
                        })
                        .count();
                    Ok(Seen {
                        waits,
                        link_waits,
                        wrong: wrong_small + wrong_large,
                        received: inbox.to_vec()?,
                    })
                })
            })
            .collect();
        ranks.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

/// What rank `rank` of a `world`-rank group must see when it waits by
/// `wait` (resolved).
fn expected(world: usize, rank: usize, wait: ShmWait) -> Seen {
    let links: Vec<(usize, ShmWait)> = (0..world)
        .filter(|&q| q != rank)
        .map(|q| (q, wait))
        .collect();
    Seen {
        waits: [Some(wait); 3],
        link_waits: [links.clone(), links],
        wrong: 0,
        received: vec![((rank + world - 1) % world) as i32 * 10; 4],
    }
}

#[test]
fn the_shm_wait_variable_reaches_links_and_arena_and_collectives_stay_exact() {
    // Three ranks: on a 2-CPU machine `auto` sleeps, on a larger one it
    // spins, so each forced value differs from `auto` on some machine.
    let world = 3;
    let auto = ShmWait::Auto.resolve(world, crate::cpu::host_cpus_online());
    for (value, wait) in [
        (None, auto),
        (Some("auto"), auto),
        (Some("spin"), ShmWait::Spin),
        (Some(" Sleep "), ShmWait::Sleep),
    ] {
        let prefix = format!("shm-wait-{}", value.unwrap_or("unset").trim());
        for (rank, seen) in run_group(&prefix, world, value).into_iter().enumerate() {
            let seen = seen.unwrap_or_else(|e| panic!("{value:?}, rank {rank}: {e}"));
            assert_eq!(seen, expected(world, rank, wait), "{value:?}, rank {rank}");
        }
    }
}

#[test]
fn a_bad_shm_wait_fails_group_creation_naming_the_variable() {
    let env = |v: &EnvVar| (v.name == "TENSORCOMM_SHM_WAIT").then(|| "nap".to_string());
    let options = CpuOptions {
        transport: TransportChoice::Auto,
        ..CpuOptions::default()
    };
    let store: Arc<dyn Store> = Arc::new(HashStore::new());
    match ProcessGroupCpu::connect(store, "bad-wait", (0, 1), &options, vec![0], &env) {
        Err(Error::BadValue {
            name,
            expected,
            found,
        }) => {
            assert_eq!(name, "TENSORCOMM_SHM_WAIT");
            assert_eq!(expected, "auto, spin or sleep");
            assert_eq!(found, "nap");
        }
        other => panic!("expected BadValue, found {other:?}"),
    }
}
