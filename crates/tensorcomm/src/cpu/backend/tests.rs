//! `TENSORCOMM_SHM_WAIT` at group creation: the choice reaches the
//! group's collective links, its point-to-point links and its arena, and
//! collectives over each of them still give exact results, also when
//! ranks choose differently. The variable is looked up through an
//! injected function (one per rank), so this test binary's environment
//! (shared by its threads) is never changed.

use super::*;
use crate::store::HashStore;

/// What one rank of a group saw: the waits of its collective transport,
/// point-to-point transport and arena, every link's wait (peer and wait)
/// of those two transports, how many elements of its two all-reduces and
/// its broadcast differ from the known results, and what it received.
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

/// Elements of the broadcast that goes through the arena (128 KiB of f32,
/// above the arena's broadcast threshold of 64 KiB).
const BROADCAST: usize = 32 << 10;

/// Sets up `world` ranks as threads, rank `r` finding `value(r)` for
/// `TENSORCOMM_SHM_WAIT`, and on each runs a small all-reduce (over the
/// links), a large one and a large broadcast from rank 1 (through the
/// arena) and a send to the next rank with a receive from the previous
/// one (over the point-to-point links).
fn run_group(
    prefix: &str,
    world: usize,
    value: impl Fn(usize) -> Option<&'static str> + Sync,
) -> Vec<Result<Seen>> {
    let store: Arc<dyn Store> = Arc::new(HashStore::new());
    std::thread::scope(|s| {
        let ranks: Vec<_> = (0..world)
            .map(|rank| {
                let store = store.clone();
                let value = value(rank);
                s.spawn(move || -> Result<Seen> {
                    let env = |v: &EnvVar| {
                        (v.name == "TENSORCOMM_SHM_WAIT").then_some(value?.to_string())
                    };
                    let options = CpuOptions {
                        timeout: Duration::from_secs(60),
                        transport: TransportChoice::Auto,
                        ..CpuOptions::default()
                    };
                    let pg = ProcessGroupCpu::connect(
                        (store.clone(), store),
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
                    let root = 1 % world;
                    let sent = |e: usize| (e % 1000) as f32 - 7.0;
                    let broadcast: Vec<f32> = (0..BROADCAST)
                        .map(|e| if rank == root { sent(e) } else { -1.0 })
                        .collect();
                    let broadcast = Tensor::from_vec(broadcast, &[BROADCAST])?;
                    pg.broadcast(&broadcast, root, None)?.wait()?;
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
                    let wrong_broadcast = broadcast
                        .to_vec::<f32>()?
                        .iter()
                        .enumerate()
                        .filter(|&(e, &v)| v != sent(e))
                        .count();
                    Ok(Seen {
                        waits,
                        link_waits,
                        wrong: wrong_small + wrong_large + wrong_broadcast,
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
        for (rank, seen) in run_group(&prefix, world, |_| value).into_iter().enumerate() {
            let seen = seen.unwrap_or_else(|e| panic!("{value:?}, rank {rank}: {e}"));
            assert_eq!(seen, expected(world, rank, wait), "{value:?}, rank {rank}");
        }
    }
}

#[test]
fn ranks_that_wait_differently_still_get_exact_results() {
    // Each rank's waits are its own: a spinning rank's writes wake a
    // sleeping peer, and a sleeping rank's writes reach a spinning one.
    let world = 3;
    for (first, rest) in [("spin", "sleep"), ("sleep", "spin")] {
        let prefix = format!("shm-wait-mixed-{first}");
        let value = |rank: usize| Some(if rank == 0 { first } else { rest });
        for (rank, seen) in run_group(&prefix, world, value).into_iter().enumerate() {
            let chose = value(rank).unwrap();
            let seen = seen.unwrap_or_else(|e| panic!("{first} then {rest}, rank {rank}: {e}"));
            let wait = chose.parse().unwrap();
            assert_eq!(
                seen,
                expected(world, rank, wait),
                "{first} then {rest}, rank {rank} ({chose})"
            );
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
    match ProcessGroupCpu::connect(
        (store.clone(), store),
        "bad-wait",
        (0, 1),
        &options,
        vec![0],
        &env,
    ) {
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

#[test]
fn the_group_polls_when_idle_only_with_two_cpus_a_rank_and_peers() {
    use super::super::group_backend::IDLE_SPIN;
    let rule = PollRule {
        size: 8,
        wait: ShmWait::Auto,
        local_ranks: 8,
        cpus_online: 16,
        cores: 16,
    };
    assert_eq!(rule.idle_spin(), IDLE_SPIN);
    assert_eq!(
        PollRule {
            wait: ShmWait::Spin,
            ..rule
        }
        .idle_spin(),
        IDLE_SPIN
    );
    let off = [
        // Nobody to hand a call to.
        PollRule {
            size: 1,
            local_ranks: 1,
            ..rule
        },
        // Asked to sleep.
        PollRule {
            wait: ShmWait::Sleep,
            ..rule
        },
        // Spinning for a wait on peers does not give CPUs to spare.
        PollRule {
            wait: ShmWait::Spin,
            local_ranks: 9,
            ..rule
        },
        // More than half as many ranks on the host as CPUs.
        PollRule {
            local_ranks: 9,
            ..rule
        },
        // A process pinned to one core.
        PollRule { cores: 1, ..rule },
        // A count that would overflow when doubled.
        PollRule {
            local_ranks: usize::MAX,
            ..rule
        },
    ];
    for rule in off {
        assert_eq!(rule.idle_spin(), Duration::ZERO, "{rule:?}");
    }
}
