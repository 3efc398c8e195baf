//! `tensorcomm store`: serve a standalone TCP store, or benchmark one.
//!
//! `tensorcomm store serve [--host H] --port 29500 [--world-size N]`
//! runs a [`TcpStoreServer`] until the process is killed, printing
//! `tensorcomm store listening on ADDR` once it listens. It listens on
//! `--host`, by default `$MASTER_ADDR` where set and loopback otherwise;
//! every interface only when asked (`--host 0.0.0.0`, or
//! `TENSORCOMM_BIND_ALL=1`). The shared token, if any, comes from
//! `$TENSORCOMM_STORE_TOKEN`.
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
    /// Address to listen on [default: $MASTER_ADDR, else 127.0.0.1;
    /// every interface with TENSORCOMM_BIND_ALL=1].
    #[arg(long)]
    host: Option<String>,
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
    let bind_all = match tensorcomm::listen_address::bind_all_from_env() {
        Ok(all) => all,
        Err(e) => {
            eprintln!("tensorcomm store: {e}");
            return ExitCode::FAILURE;
        }
    };
    let host = args.host.clone().unwrap_or_else(|| {
        let master = std::env::var("MASTER_ADDR").ok().filter(|h| !h.is_empty());
        let host = master.unwrap_or_else(|| "127.0.0.1".into());
        tensorcomm::listen_address::listen_host(&host, bind_all).to_string()
    });
    let addr = tensorcomm::rendezvous::host_port(&host, args.port);
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
