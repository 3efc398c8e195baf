//! `tensorcomm demo`: ranks rendezvous through a store and exchange data.
//!
//! Started on its own, the demo launches `--nproc-per-node` copies of itself
//! through the same machinery as `tensorcomm run`; started by a launcher (or
//! with `RANK` set), it is one rank. Each rank:
//! 1. meets the others (`env://`, through a TCP store hosted by rank 0, or a
//!    file store with `--store file`);
//! 2. publishes a payload and reads every other rank's, checking each byte
//!    against an independently regenerated copy;
//! 3. hammers one counter with `add` and checks the total is exact;
//! 4. passes a token around a ring of queues.
//!
//! Every check failing makes the rank exit non-zero, which ends the job.

use std::ffi::OsString;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use tensorcomm::rendezvous::{self, InitMethod, StoreAddress};
use tensorcomm::store::Store;

use crate::stdout::Stdout;

/// Which store the ranks meet through.
#[derive(Clone, Copy, Debug, clap::ValueEnum)]
pub enum StoreKind {
    /// A TCP store hosted by rank 0 (`env://`).
    Tcp,
    /// A file store in the temporary directory.
    File,
}

#[derive(clap::Args, Debug)]
pub struct DemoArgs {
    /// Ranks to start when run on its own (ignored inside a launcher).
    #[arg(long, default_value_t = 4)]
    nproc_per_node: usize,
    /// Store the ranks meet through.
    #[arg(long, value_enum, default_value_t = StoreKind::Tcp)]
    store: StoreKind,
    /// Bytes each rank publishes.
    #[arg(long, default_value_t = 1 << 20)]
    bytes: usize,
    /// Counter increments each rank makes.
    #[arg(long, default_value_t = 1000)]
    adds: usize,
    /// Seconds to wait for the other ranks.
    #[arg(long, default_value_t = 60)]
    timeout_secs: u64,
}

pub fn main(args: DemoArgs) -> ExitCode {
    if let Err(msg) = fits_in_memory(&args) {
        eprintln!("tensorcomm demo: {msg}");
        return ExitCode::from(2);
    }
    if std::env::var_os("RANK").is_none() {
        return launch_self(&args);
    }
    match run_rank(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("demo failed: {err}");
            ExitCode::FAILURE
        }
    }
}

/// Refuses a payload that cannot fit in this host's memory: every rank
/// holds its own payload, everyone's as read back and a regenerated copy to
/// compare; the store holds one of each rank's.
fn fits_in_memory(args: &DemoArgs) -> Result<(), String> {
    let world = match std::env::var("LOCAL_WORLD_SIZE")
        .ok()
        .and_then(|v| v.parse().ok())
    {
        Some(n) if std::env::var_os("RANK").is_some() => n,
        _ => args.nproc_per_node,
    }
    .max(1) as u128;
    let bytes = args.bytes as u128;
    crate::memory::check(
        &format!("--bytes {}", args.bytes),
        world * (world + 3) * bytes,
        &format!("{world} rank(s) each holding {world} payloads of {} and 2 of its own, and the store one per rank", crate::memory::human(bytes)),
    )
}

/// Starts `nproc_per_node` copies of this program as ranks of the demo.
fn launch_self(args: &DemoArgs) -> ExitCode {
    let exe = match std::env::current_exe() {
        Ok(exe) => exe,
        Err(err) => {
            eprintln!("tensorcomm demo: cannot find its own executable: {err}");
            return ExitCode::FAILURE;
        }
    };
    let rank_args: Vec<OsString> = [
        "demo".to_string(),
        format!(
            "--store={}",
            match args.store {
                StoreKind::Tcp => "tcp",
                StoreKind::File => "file",
            }
        ),
        format!("--bytes={}", args.bytes),
        format!("--adds={}", args.adds),
        format!("--timeout-secs={}", args.timeout_secs),
    ]
    .into_iter()
    .map(OsString::from)
    .collect();
    // A closed stdout (`demo | head`) is not a failure; the launcher stops
    // copying the ranks' lines, and they stop writing them.
    Stdout::new(true).line(format_args!(
        "tensorcomm demo: starting {} ({:?} store, {} bytes each, {} adds each)",
        crate::bench::rank_count(args.nproc_per_node),
        args.store,
        args.bytes,
        args.adds
    ));
    crate::launch::launch_local(&exe, &rank_args, args.nproc_per_node, None, &[])
}

type DemoResult<T> = Result<T, Box<dyn std::error::Error>>;

fn run_rank(args: &DemoArgs) -> DemoResult<()> {
    let timeout = Duration::from_secs(args.timeout_secs);
    let env = |name: &str| std::env::var(name).ok();
    let mut method = InitMethod::parse("env://", env)?;
    if let StoreKind::File = args.store {
        let port = match &method.address {
            StoreAddress::Tcp { port, .. } => *port,
            StoreAddress::File { .. } => 0,
        };
        method.address = StoreAddress::File {
            path: std::env::temp_dir().join(format!("tensorcomm-demo-{port}.store")),
        };
    }
    let start = Instant::now();
    let rdzv = rendezvous::connect(&method, timeout)?;
    let (rank, world) = (rdzv.rank, rdzv.world_size);
    let store = rdzv.store;
    store.set_timeout(timeout);
    // Until a write to it fails (`demo | head`): the checks go on, silent.
    let mut out = Stdout::new(true);
    out.line(format_args!(
        "rendezvous of {world} ranks took {:.1} ms",
        ms(start.elapsed())
    ));

    exchange_payloads(&*store, rank, world, args.bytes, &mut out)?;
    count_together(&*store, world, args.adds, &mut out)?;
    pass_ring_token(&*store, rank, world, &mut out)?;
    store.barrier("demo/end", world, None)?;
    if rank == 0 {
        out.line(format_args!(
            "demo OK: {world} ranks exchanged payloads, counters and ring tokens"
        ));
    }
    Ok(())
}

/// Every rank publishes a payload and checks everyone else's.
fn exchange_payloads(
    store: &dyn Store,
    rank: usize,
    world: usize,
    bytes: usize,
    out: &mut Stdout,
) -> DemoResult<()> {
    let start = Instant::now();
    store.set(&format!("demo/payload/{rank}"), &payload(rank, bytes))?;
    let keys: Vec<String> = (0..world).map(|r| format!("demo/payload/{r}")).collect();
    let refs: Vec<&str> = keys.iter().map(String::as_str).collect();
    let all = store.multi_get(&refs)?;
    for (peer, got) in all.iter().enumerate() {
        if *got != payload(peer, bytes) {
            return Err(format!("payload of rank {peer} differs from what it published").into());
        }
    }
    let moved = bytes as f64 * world as f64;
    let secs = start.elapsed().as_secs_f64();
    out.line(format_args!(
        "exchanged {world} payloads of {bytes} bytes in {:.1} ms ({:.0} MB/s through the store), all verified",
        secs * 1e3,
        moved / secs / 1e6
    ));
    Ok(())
}

/// All ranks add to one counter; the total must be exact.
fn count_together(
    store: &dyn Store,
    world: usize,
    adds: usize,
    out: &mut Stdout,
) -> DemoResult<()> {
    store.barrier("demo/count-start", world, None)?;
    let start = Instant::now();
    for _ in 0..adds {
        store.add("demo/counter", 1)?;
    }
    let elapsed = start.elapsed();
    store.barrier("demo/count-end", world, None)?;
    let total = store.add("demo/counter", 0)?;
    let expected = (adds * world) as i64;
    if total != expected {
        return Err(format!("counter is {total}, expected {expected}").into());
    }
    out.line(format_args!(
        "{adds} adds in {:.1} ms ({:.1} µs each); counter {total} = {world} x {adds}",
        ms(elapsed),
        elapsed.as_secs_f64() * 1e6 / adds.max(1) as f64
    ));
    Ok(())
}

/// A token goes once around the ring; each rank stamps it.
fn pass_ring_token(
    store: &dyn Store,
    rank: usize,
    world: usize,
    out: &mut Stdout,
) -> DemoResult<()> {
    let queue = |r: usize| format!("demo/ring/{r}");
    if rank == 0 {
        store.queue_push(&queue(1 % world), b"0")?;
    }
    let token = store.queue_pop(&queue(rank))?;
    let stamps = String::from_utf8(token)?;
    let expected: Vec<String> = (0..(if rank == 0 { world } else { rank }))
        .map(|r| r.to_string())
        .collect();
    if stamps != expected.join(",") {
        return Err(format!(
            "ring token reached rank {rank} as {stamps:?}, expected {:?}",
            expected.join(",")
        )
        .into());
    }
    if rank != 0 {
        store.queue_push(
            &queue((rank + 1) % world),
            format!("{stamps},{rank}").as_bytes(),
        )?;
    } else {
        out.line(format_args!(
            "ring token went round all {world} ranks: {stamps}"
        ));
    }
    Ok(())
}

/// Deterministic bytes for `rank` (splitmix64), regenerated by every checker.
fn payload(rank: usize, bytes: usize) -> Vec<u8> {
    let mut state = 0x9E37_79B9_7F4A_7C15u64 ^ (rank as u64).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    let mut out = Vec::with_capacity(bytes + 8);
    while out.len() < bytes {
        state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        out.extend_from_slice(&(z ^ (z >> 31)).to_le_bytes());
    }
    out.truncate(bytes);
    out
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}
