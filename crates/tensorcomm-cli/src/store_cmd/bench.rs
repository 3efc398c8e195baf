//! `tensorcomm store bench`: numbers for the TCP store, from one process.
//!
//! 1. **Wake-up**: C client threads (each its own connection) wait for one
//!    key; once the server reports all C requests blocked, one client sets
//!    the key. Reported: time from just before the `set` until the last
//!    waiter returned, and until the median waiter returned. Repeated; the
//!    clients start each round together and stay connected until the end,
//!    so no client's own traffic overlaps another's wake-up.
//! 2. **Round trip**: `set` and `get` latency from one client (p50, p99).
//! 3. **Throughput**: ops/s of a set+get mix from 1, 8, 64 client threads.

use std::process::ExitCode;
use std::sync::mpsc;
use std::sync::{Arc, Barrier, Condvar, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use serde_json::json;
use tensorcomm::store::{Store, TcpStore, TcpStoreOptions, TcpStoreServer};

use crate::stdout::Stdout;

/// Stack of each client thread: the client needs little, and a thousand
/// default 8 MiB stacks would be a lot of address space.
const CLIENT_STACK: usize = 256 * 1024;
/// Timeout of every blocking call the benchmark makes.
const PATIENCE: Duration = Duration::from_secs(120);
/// Bytes of each value written.
const VALUE_SIZE: usize = 32;

#[derive(clap::Args)]
pub(super) struct BenchArgs {
    /// Clients waiting on one key in the wake-up test.
    #[arg(long, default_value_t = 1024)]
    clients: usize,
    /// Operations in the round-trip test (each of set and get) and per
    /// throughput row.
    #[arg(long, default_value_t = 20000)]
    ops: usize,
    /// Times the wake-up test is repeated.
    #[arg(long, default_value_t = 3)]
    rounds: usize,
    /// Client threads of each throughput row.
    #[arg(long, value_delimiter = ',', default_value = "1,8,64")]
    threads: Vec<usize>,
    /// Print one JSON object instead of a table.
    #[arg(long)]
    json: bool,
}

pub(super) fn main(args: BenchArgs) -> ExitCode {
    match run(&args) {
        Ok(report) => {
            // Until a write to it fails (`store bench | head`).
            let mut stdout = Stdout::new(true);
            if args.json {
                stdout.line(format_args!("{}", report.to_json()));
            } else {
                report.print_table(&mut stdout);
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("tensorcomm store bench: {e}");
            ExitCode::FAILURE
        }
    }
}

struct WakeRound {
    last: Duration,
    median: Duration,
}

struct Percentiles {
    p50: Duration,
    p99: Duration,
}

struct Report {
    clients: usize,
    ops: usize,
    fd_limit: libc::rlim_t,
    wake: Vec<WakeRound>,
    set: Percentiles,
    get: Percentiles,
    throughput: Vec<(usize, f64)>,
}

fn run(args: &BenchArgs) -> Result<Report, String> {
    if args.ops == 0 || args.clients == 0 || args.threads.contains(&0) {
        return Err("expected --clients, --ops and --threads above 0, found 0".into());
    }
    let fd_limit = raise_open_file_limit()?;
    // Each client holds a socket here and the server holds its other end.
    let needed = 2 * args
        .clients
        .max(args.threads.iter().copied().max().unwrap_or(1))
        + 64;
    if (fd_limit as usize) < needed {
        return Err(format!(
            "expected an open-file limit of at least {needed} for {} clients, found {fd_limit} (raise `ulimit -Hn`)",
            args.clients
        ));
    }
    let options = TcpStoreOptions {
        timeout: PATIENCE,
        ..TcpStoreOptions::default()
    };
    let server = TcpStoreServer::bind("127.0.0.1:0", &options).map_err(|e| e.to_string())?;
    let addr = server.local_addr().to_string();
    let wake = wake_up(&server, &addr, &options, args.clients, args.rounds)?;
    let (set, get) = round_trip(&addr, &options, args.ops)?;
    let mut throughput = Vec::new();
    for &threads in &args.threads {
        throughput.push((
            threads,
            mixed_throughput(&addr, &options, threads, args.ops)?,
        ));
    }
    Ok(Report {
        clients: args.clients,
        ops: args.ops,
        fd_limit,
        wake,
        set,
        get,
        throughput,
    })
}

/// Raises the soft limit on open files to the hard limit; returns the soft
/// limit in force afterwards.
fn raise_open_file_limit() -> Result<libc::rlim_t, String> {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit and setrlimit read and write only the rlimit struct
    // passed, which is a valid, initialised local; RLIMIT_NOFILE is a valid
    // resource. Raising the soft limit up to the hard one needs no privilege.
    let status = unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) != 0 {
            -1
        } else if limit.rlim_cur < limit.rlim_max {
            limit.rlim_cur = limit.rlim_max;
            libc::setrlimit(libc::RLIMIT_NOFILE, &limit)
        } else {
            0
        }
    };
    if status != 0 {
        return Err(format!(
            "could not raise the open-file limit: {}",
            std::io::Error::last_os_error()
        ));
    }
    Ok(limit.rlim_cur)
}

/// What a wake-up client thread reports.
enum Event {
    Connected(Result<(), String>),
    Woke(Result<Instant, String>),
}

fn wake_up(
    server: &TcpStoreServer,
    addr: &str,
    options: &TcpStoreOptions,
    clients: usize,
    rounds: usize,
) -> Result<Vec<WakeRound>, String> {
    let (tx, rx) = mpsc::channel();
    let gate = Arc::new(Gate::default());
    let mut handles = Vec::with_capacity(clients);
    for _ in 0..clients {
        let tx = tx.clone();
        let client_gate = gate.clone();
        let (client_addr, client_options) = (addr.to_string(), options.clone());
        let spawned = thread::Builder::new()
            .name("bench-waiter".into())
            .stack_size(CLIENT_STACK)
            .spawn(move || {
                let store = waiter(&client_addr, &client_options, rounds, &tx, &client_gate);
                // Threads exiting and connections closing would compete
                // with the last round's wake-ups: stay until all are done.
                client_gate.wait_until_open(rounds);
                drop(store);
            });
        match spawned {
            Ok(handle) => handles.push(handle),
            Err(e) => {
                release_waiters(addr, options, rounds);
                gate.open_all();
                return Err(format!("could not start client thread: {e}"));
            }
        }
    }
    drop(tx);
    let outcome = lead_rounds(server, addr, options, clients, rounds, &rx, &gate);
    if outcome.is_err() {
        release_waiters(addr, options, rounds);
    }
    gate.open_all();
    for handle in handles {
        let _ = handle.join();
    }
    outcome
}

/// Lets the waiting clients into one round at a time, so that clients
/// woken in round r do not start round r+1 while others are still being
/// woken (that would measure the clients' own traffic, not the wake-up).
#[derive(Default)]
struct Gate {
    /// Rounds opened so far; round r may start once `opened > r`.
    opened: Mutex<usize>,
    changed: Condvar,
}

impl Gate {
    fn open(&self, round: usize) {
        let mut opened = self.opened.lock().unwrap_or_else(|p| p.into_inner());
        *opened = (*opened).max(round + 1);
        self.changed.notify_all();
    }

    fn open_all(&self) {
        self.open(usize::MAX - 1);
    }

    fn wait_until_open(&self, round: usize) {
        let opened = self.opened.lock().unwrap_or_else(|p| p.into_inner());
        let _opened = self
            .changed
            .wait_while(opened, |opened| *opened <= round)
            .unwrap_or_else(|p| p.into_inner());
    }
}

/// One waiting client: every round, count itself in, wait, report.
/// Returns its store, to be closed once every client is done.
fn waiter(
    addr: &str,
    options: &TcpStoreOptions,
    rounds: usize,
    tx: &mpsc::Sender<Event>,
    gate: &Gate,
) -> Option<TcpStore> {
    let store = match TcpStore::connect(addr, options) {
        Ok(store) => {
            let _ = tx.send(Event::Connected(Ok(())));
            store
        }
        Err(e) => {
            let _ = tx.send(Event::Connected(Err(e.to_string())));
            return None;
        }
    };
    for round in 0..rounds {
        gate.wait_until_open(round);
        let woke = store
            .add(&ready_key(round), 1)
            .and_then(|_| store.wait(&[&go_key(round)]))
            .map(|()| Instant::now())
            .map_err(|e| e.to_string());
        let failed = woke.is_err();
        if tx.send(Event::Woke(woke)).is_err() || failed {
            break;
        }
    }
    Some(store)
}

fn lead_rounds(
    server: &TcpStoreServer,
    addr: &str,
    options: &TcpStoreOptions,
    clients: usize,
    rounds: usize,
    rx: &mpsc::Receiver<Event>,
    gate: &Gate,
) -> Result<Vec<WakeRound>, String> {
    for _ in 0..clients {
        match rx.recv() {
            Ok(Event::Connected(Ok(()))) => {}
            Ok(Event::Connected(Err(e))) => return Err(format!("a client could not connect: {e}")),
            Ok(Event::Woke(_)) => return Err("a client woke before any key was set".into()),
            Err(_) => return Err("client threads ended early".into()),
        }
    }
    let setter = TcpStore::connect(addr, options).map_err(|e| e.to_string())?;
    let mut results = Vec::with_capacity(rounds);
    for round in 0..rounds {
        gate.open(round);
        // Everyone counted in, and every wait request blocked on the server.
        let ready = ready_key(round);
        wait_for(|| Ok(setter.add(&ready, 0).map_err(|e| e.to_string())? as usize == clients))?;
        wait_for(|| Ok(server.waiting_requests() == clients))?;
        let t0 = Instant::now();
        setter
            .set(&go_key(round), b"go")
            .map_err(|e| e.to_string())?;
        let mut woke = Vec::with_capacity(clients);
        for _ in 0..clients {
            match rx.recv() {
                Ok(Event::Woke(Ok(at))) => woke.push(at.saturating_duration_since(t0)),
                Ok(Event::Woke(Err(e))) => return Err(format!("a waiting client failed: {e}")),
                Ok(Event::Connected(_)) => return Err("unexpected connect report".into()),
                Err(_) => return Err("client threads ended early".into()),
            }
        }
        woke.sort_unstable();
        results.push(WakeRound {
            last: woke[woke.len() - 1],
            median: woke[woke.len() / 2],
        });
    }
    Ok(results)
}

/// Sets every round's key so waiting clients return after a failure.
fn release_waiters(addr: &str, options: &TcpStoreOptions, rounds: usize) {
    if let Ok(store) = TcpStore::connect(addr, options) {
        for round in 0..rounds {
            let _ = store.set(&go_key(round), b"abort");
        }
    }
}

fn ready_key(round: usize) -> String {
    format!("bench/ready/{round}")
}

fn go_key(round: usize) -> String {
    format!("bench/go/{round}")
}

/// Polls `condition` every millisecond, for at most `PATIENCE`.
fn wait_for(mut condition: impl FnMut() -> Result<bool, String>) -> Result<(), String> {
    let deadline = Instant::now() + PATIENCE;
    while !condition()? {
        if Instant::now() > deadline {
            return Err(format!("clients not ready after {PATIENCE:?}"));
        }
        thread::sleep(Duration::from_millis(1));
    }
    Ok(())
}

fn round_trip(
    addr: &str,
    options: &TcpStoreOptions,
    ops: usize,
) -> Result<(Percentiles, Percentiles), String> {
    let store = TcpStore::connect(addr, options).map_err(|e| e.to_string())?;
    let value = [b'v'; VALUE_SIZE];
    let keys: Vec<String> = (0..64).map(|i| format!("bench/rt/{i}")).collect();
    let mut sets = Vec::with_capacity(ops);
    let mut gets = Vec::with_capacity(ops);
    for i in 0..ops {
        let key = &keys[i % keys.len()];
        let start = Instant::now();
        store.set(key, &value).map_err(|e| e.to_string())?;
        sets.push(start.elapsed());
        let start = Instant::now();
        let got = store.get(key).map_err(|e| e.to_string())?;
        gets.push(start.elapsed());
        if got.len() != VALUE_SIZE {
            return Err(format!(
                "get returned {} bytes, expected {VALUE_SIZE}",
                got.len()
            ));
        }
    }
    Ok((percentiles(sets), percentiles(gets)))
}

fn percentiles(mut samples: Vec<Duration>) -> Percentiles {
    samples.sort_unstable();
    let at =
        |q: f64| samples[((q * samples.len() as f64).ceil() as usize).clamp(1, samples.len()) - 1];
    Percentiles {
        p50: at(0.50),
        p99: at(0.99),
    }
}

/// Ops/s of `ops` operations (alternating set and get) split over
/// `threads` clients.
fn mixed_throughput(
    addr: &str,
    options: &TcpStoreOptions,
    threads: usize,
    ops: usize,
) -> Result<f64, String> {
    let start = Arc::new(Barrier::new(threads + 1));
    let mut handles = Vec::with_capacity(threads);
    for t in 0..threads {
        let per_thread = ops / threads + usize::from(t < ops % threads);
        let store = TcpStore::connect(addr, options).map_err(|e| e.to_string())?;
        let start = start.clone();
        let spawned = thread::Builder::new()
            .name("bench-client".into())
            .stack_size(CLIENT_STACK)
            .spawn(move || -> Result<(), String> {
                let value = [b't'; VALUE_SIZE];
                let keys: Vec<String> = (0..16).map(|i| format!("bench/tp/{t}/{i}")).collect();
                start.wait();
                for i in 0..per_thread {
                    let key = &keys[(i / 2) % keys.len()];
                    if i % 2 == 0 {
                        store.set(key, &value).map_err(|e| e.to_string())?;
                    } else {
                        store.get(key).map_err(|e| e.to_string())?;
                    }
                }
                Ok(())
            });
        match spawned {
            Ok(handle) => handles.push(handle),
            // The threads already started wait on the barrier forever:
            // there is no way to recover them, so give up loudly.
            Err(e) => return Err(format!("could not start client thread: {e}")),
        }
    }
    start.wait();
    let began = Instant::now();
    for handle in handles {
        handle
            .join()
            .map_err(|_| "a client thread panicked".to_string())??;
    }
    Ok(ops as f64 / began.elapsed().as_secs_f64())
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn us(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

impl Report {
    fn print_table(&self, stdout: &mut Stdout) {
        stdout.line(format_args!(
            "tensorcomm store bench: {} clients, {} ops, server and clients in this process (open-file limit {})",
            self.clients, self.ops, self.fd_limit
        ));
        stdout.line(format_args!(""));
        stdout.line(format_args!(
            "wake-up: {} clients wait on one key, one set wakes them",
            self.clients
        ));
        stdout.line(format_args!(
            "  round   last waiter (ms)   median waiter (ms)"
        ));
        for (i, round) in self.wake.iter().enumerate() {
            stdout.line(format_args!(
                "  {:<5}   {:>16.3}   {:>18.3}",
                i + 1,
                ms(round.last),
                ms(round.median)
            ));
        }
        stdout.line(format_args!(""));
        stdout.line(format_args!(
            "round trip from one client ({} ops each, {VALUE_SIZE}-byte values)",
            self.ops
        ));
        stdout.line(format_args!("  op    p50 (us)   p99 (us)"));
        for (name, p) in [("set", &self.set), ("get", &self.get)] {
            stdout.line(format_args!(
                "  {name:<4}  {:>8.1}   {:>8.1}",
                us(p.p50),
                us(p.p99)
            ));
        }
        stdout.line(format_args!(""));
        stdout.line(format_args!(
            "throughput, alternating set/get ({} ops per row)",
            self.ops
        ));
        stdout.line(format_args!("  threads        ops/s"));
        for (threads, rate) in &self.throughput {
            stdout.line(format_args!("  {threads:>7}   {rate:>10.0}"));
        }
    }

    fn to_json(&self) -> serde_json::Value {
        json!({
            "clients": self.clients,
            "ops": self.ops,
            "open_file_limit": self.fd_limit,
            "wakeup": self.wake.iter().enumerate().map(|(i, r)| json!({
                "round": i + 1,
                "last_ms": ms(r.last),
                "median_ms": ms(r.median),
            })).collect::<Vec<_>>(),
            "round_trip_us": {
                "set": { "p50": us(self.set.p50), "p99": us(self.set.p99) },
                "get": { "p50": us(self.get.p50), "p99": us(self.get.p99) },
            },
            "throughput": self.throughput.iter().map(|(threads, rate)| json!({
                "threads": threads,
                "ops_per_s": rate,
            })).collect::<Vec<_>>(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_use_nearest_rank() {
        let samples: Vec<Duration> = (1..=100).rev().map(Duration::from_micros).collect();
        let p = percentiles(samples);
        assert_eq!(p.p50, Duration::from_micros(50));
        assert_eq!(p.p99, Duration::from_micros(99));
        let one = percentiles(vec![Duration::from_micros(7)]);
        assert_eq!(
            (one.p50, one.p99),
            (Duration::from_micros(7), Duration::from_micros(7))
        );
    }
}
