//! `tensorcomm store`: serve a standalone TCP store, or benchmark one.
//!
//! `tensorcomm store serve --host 0.0.0.0 --port 29500 [--world-size N]`
//! runs a [`TcpStoreServer`] until the process is killed, printing
//! `tensorcomm store listening on ADDR` once it listens. The shared token,
//! if any, comes from `$TENSORCOMM_STORE_TOKEN`.
//!
//! `tensorcomm store bench` measures a server started in this process: how
//! fast one `set` wakes a thousand waiting clients, the round-trip latency
//! of `set`/`get`, and the throughput of a set+get mix.

mod bench;

use std::io::Write;
use std::process::ExitCode;
use std::time::Duration;

use tensorcomm::store::{TcpStoreOptions, TcpStoreServer};

/// Serve or benchmark a TCP rendezvous store.
#[derive(clap::Args)]
pub struct StoreArgs {
    #[command(subcommand)]
    command: StoreCommand,
}

#[derive(clap::Subcommand)]
enum StoreCommand {
    /// Run a standalone store server until killed.
    Serve(ServeArgs),
    /// Benchmark a store server started in this process.
    Bench(bench::BenchArgs),
}

#[derive(clap::Args)]
struct ServeArgs {
    /// Address to listen on.
    #[arg(long, default_value = "0.0.0.0")]
    host: String,
    /// Port to listen on (0 picks a free one, printed on start).
    #[arg(long, default_value_t = 29500)]
    port: u16,
    /// Wait until this many clients joined (exit 1 if they do not in time).
    #[arg(long)]
    world_size: Option<usize>,
    /// Timeout for --world-size and the default for blocking requests.
    #[arg(long, default_value_t = 300)]
    timeout_secs: u64,
}

pub fn main(args: StoreArgs) -> ExitCode {
    match args.command {
        StoreCommand::Serve(args) => serve(args),
        StoreCommand::Bench(args) => bench::main(args),
    }
}

fn serve(args: ServeArgs) -> ExitCode {
    let options = TcpStoreOptions {
        timeout: Duration::from_secs(args.timeout_secs),
        ..TcpStoreOptions::default()
    };
    let addr = tensorcomm::rendezvous::host_port(&args.host, args.port);
    let server = match TcpStoreServer::bind(&addr, &options) {
        Ok(server) => server,
        Err(e) => {
            eprintln!("tensorcomm store: {e}");
            return ExitCode::FAILURE;
        }
    };
    let mut stdout = std::io::stdout().lock();
    let announced = writeln!(
        stdout,
        "tensorcomm store listening on {}",
        server.local_addr()
    )
    .and_then(|()| stdout.flush());
    drop(stdout);
    if let Err(e) = announced {
        eprintln!("tensorcomm store: could not write to stdout: {e}");
        return ExitCode::FAILURE;
    }
    if let Some(world_size) = args.world_size {
        if let Err(e) = server.wait_for_clients(world_size, options.timeout) {
            eprintln!("tensorcomm store: {e}");
            return ExitCode::FAILURE;
        }
        tracing::info!(world_size, "all store clients joined");
    }
    // The server runs on its own threads; this one only keeps the process
    // alive until SIGINT/SIGTERM ends it (the kernel closes every socket).
    loop {
        std::thread::park();
    }
}
