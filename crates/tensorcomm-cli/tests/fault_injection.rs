//! Fault injection on the CPU backend, end to end: N ranks (2 to 8
//! processes started by `tensorcomm run`, this test binary re-run as each
//! rank) run a seeded random sequence of collectives, and one rank — the
//! victim — fails at a random step: SIGKILLed, its sockets shut down,
//! SIGSTOPped past the timeout, exiting 0 early, calling another
//! collective or shape, or (rank 0) killing the store it hosts while the
//! others meet through it.
//!
//! Every surviving rank must fail naming the victim within its timeout
//! (within half of it when a connection dropped); the launcher must exit
//! non-zero naming the rank that failed first (the victim, by signal, when
//! it was killed); nothing may hang and no process or `/dev/shm` name of
//! the job may be left. The report line counts scenarios run, survived,
//! hung and leaked, with the seed of every failure.
//!
//! Knobs: `TENSORCOMM_FAULT_SCENARIOS` (how many; default a CI-sized set),
//! `TENSORCOMM_FAULT_SEED` (base seed, hex, or `clock`; default
//! [`CI_SEED`], so that a CI run is the same set of scenarios every time),
//! `TENSORCOMM_FAULT_KINDS` (comma-separated: kill, close-sockets,
//! stop, exit-early, mismatch, store-kill; default the first five),
//! `TENSORCOMM_FAULT_VICTIM_0=1` (rank 0 may be the victim),
//! `TENSORCOMM_FAULT_TIMEOUT_MS` (group timeout, default 2000),
//! `TENSORCOMM_FAULT_LINGER_MS` (how long a rank that got its error waits
//! before exiting, default 300).
//!
//! Not in the default set, because they fail today (library issues, not
//! the suite's):
//! - rank 0 SIGSTOPped (`stop` with `TENSORCOMM_FAULT_VICTIM_0=1`): with
//!   the store's host stopped, survivors still setting up may take 4x the
//!   timeout and blame another rank (1 of 2 such scenarios in one run).
//!   (Another rank stopped is named: a timeout blames the ranks furthest
//!   behind, read from the rings of recent calls stalled ranks post to the
//!   store; see `group/absent_ranks.rs`.)
//! - rank 0 dying during set-up (`store-kill`, whose kill may land while
//!   the others still set up): a rank may blame another survivor that
//!   gave up on rank 0 while exchanging transport hellos, and some ranks
//!   of a shared-memory job were seen not to report at all. Once the
//!   group is up, a survivor that finds the store gone names rank 0, its
//!   host (`group/failure_report.rs`).
//! - linger 0: a survivor rank 0 that exits at once after its error takes
//!   the store with it, and the others, finding the store gone, name rank
//!   0 instead of the victim.
//!
//! The default seed is fixed so that CI checks the same set every time;
//! long runs (`clock`, other seeds) explore.
//!
//! Scenario `i` uses seed `base + i` and kind `KINDS[i % KINDS.len()]`;
//! rerun one with `TENSORCOMM_FAULT_SEED=<its seed> TENSORCOMM_FAULT_SCENARIOS=1
//! TENSORCOMM_FAULT_KINDS=<its kind>`.

mod fault;

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use fault::job::{self, Timing};
use fault::scenario::{FaultKind, Scenario};

/// Scenarios per kind in the default (CI) run.
const CI_PER_KIND: usize = 3;
/// The base seed when none is given (see the module docs).
const CI_SEED: u64 = 0x5eed_0000;

/// Not a test of its own: the rank program when the harness re-runs this
/// binary under the launcher; passes at once otherwise.
#[test]
fn fault_rank_entry() {
    if std::env::var_os(fault::rank::SEED_VAR).is_some() {
        fault::rank::main();
    }
}

/// A `mismatch` victim must pass the library something else than the
/// others do: another op, root, dtype or tensor length. Seeds 0x9125 and
/// 0x9201 once drew a `numel` one rank's chunk hides (485 and 487 elements
/// over 8 ranks are both chunks of 61), so every rank rightly completed.
#[test]
fn every_mismatch_scenario_changes_what_the_victim_passes() {
    let seeds = (0x9000..0x9400).chain(CI_SEED..CI_SEED + 64);
    let same: Vec<String> = seeds
        .map(|seed| Scenario::new(seed, FaultKind::Mismatch, false))
        .filter(|sc| sc.steps[sc.fault_step].call(sc.world) == sc.wrong.call(sc.world))
        .map(|sc| {
            format!(
                "{:#x}: {:?} and {:?} both pass {:?}",
                sc.seed,
                sc.steps[sc.fault_step],
                sc.wrong,
                sc.wrong.call(sc.world)
            )
        })
        .collect();
    assert!(
        same.is_empty(),
        "expected every mismatch to differ in op, root, dtype or tensor length; found {} that do not: {same:#?}",
        same.len()
    );
}

fn env_parse<T: std::str::FromStr>(name: &str) -> Option<T> {
    let v = std::env::var(name).ok()?;
    Some(
        v.parse()
            .unwrap_or_else(|_| panic!("{name}={v:?} does not parse")),
    )
}

#[test]
fn every_survivor_names_the_failed_rank_and_nothing_hangs_or_leaks() {
    let kinds: Vec<FaultKind> = match std::env::var("TENSORCOMM_FAULT_KINDS") {
        Ok(list) => list
            .split(',')
            .map(|k| k.trim().parse().unwrap_or_else(|e: String| panic!("{e}")))
            .collect(),
        Err(_) => FaultKind::RELIABLE.to_vec(),
    };
    let count = env_parse("TENSORCOMM_FAULT_SCENARIOS").unwrap_or(CI_PER_KIND * kinds.len());
    let base = match std::env::var("TENSORCOMM_FAULT_SEED") {
        Ok(s) if s == "clock" => SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64),
        Ok(s) => u64::from_str_radix(s.trim_start_matches("0x"), 16)
            .unwrap_or_else(|_| panic!("TENSORCOMM_FAULT_SEED={s:?} is not hex or `clock`")),
        Err(_) => CI_SEED,
    };
    let timeout = Duration::from_millis(env_parse("TENSORCOMM_FAULT_TIMEOUT_MS").unwrap_or(2000));
    let timing = Timing {
        timeout,
        // Survivors ignore SIGTERM and must report before the launcher's
        // SIGKILL.
        grace: timeout * 2 + Duration::from_secs(2),
        hard_limit: timeout * 5 + Duration::from_secs(10),
        linger: Duration::from_millis(env_parse("TENSORCOMM_FAULT_LINGER_MS").unwrap_or(300)),
    };
    let victim_0 = std::env::var("TENSORCOMM_FAULT_VICTIM_0").as_deref() == Ok("1");
    let started = Instant::now();
    let (mut survived, mut hung, mut leaked) = (0, 0, 0);
    let mut failures = Vec::new();
    for i in 0..count {
        let sc = Scenario::new(
            base.wrapping_add(i as u64),
            kinds[i % kinds.len()],
            victim_0,
        );
        let verdict = job::run(&sc, timing);
        eprintln!(
            "fault scenario {i}: {sc}: {:?}{}",
            verdict.elapsed,
            if verdict.problems.is_empty() {
                " ok"
            } else {
                " FAILED"
            }
        );
        hung += usize::from(verdict.hung);
        leaked += usize::from(verdict.leaked);
        if verdict.problems.is_empty() {
            survived += 1;
        } else {
            for p in &verdict.problems {
                eprintln!("    {p}");
            }
            failures.push(format!("{sc}"));
        }
    }
    eprintln!(
        "fault injection: {count} scenarios run, {survived} survived, {hung} hung, {leaked} leaked in {:?} (base seed {base:#x}); failed: {failures:?}",
        started.elapsed()
    );
    assert_eq!(hung, 0, "hung scenarios: {failures:?}");
    assert_eq!(leaked, 0, "leaking scenarios: {failures:?}");
    assert_eq!(survived, count, "failed scenarios: {failures:?}");
}
