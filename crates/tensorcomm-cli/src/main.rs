//! The `tensorcomm` command: launch ranks, serve a store, run the demo,
//! benchmark collectives.

mod bench;
mod demo;
mod launch;
mod memory;
mod stdout;
mod store_cmd;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// tensorcomm: move and reduce tensors between GPUs and between processes.
#[derive(Parser)]
#[command(name = "tensorcomm", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Start the ranks of a job on this node (torchrun-style).
    Run(launch::RunArgs),
    /// Serve or benchmark a TCP rendezvous store.
    Store(store_cmd::StoreArgs),
    /// The demo job: ranks rendezvous through the store and exchange data.
    Demo(demo::DemoArgs),
    /// Benchmark a collective (cpu, nccl), the peer-memory all-reduce
    /// (intranode) or cuda::comm (cuda-comm), nccl-tests style.
    Bench(bench::BenchArgs),
}

fn main() -> ExitCode {
    init_logging();
    let cli = Cli::parse();
    match cli.command {
        Command::Run(args) => launch::main(args),
        Command::Store(args) => store_cmd::main(args),
        Command::Demo(args) => demo::main(args),
        Command::Bench(args) => bench::main(args),
    }
}

/// Quiet by default; `TENSORCOMM_LOG=debug` shows connections and timings.
fn init_logging() {
    let filter = tracing_subscriber::EnvFilter::try_from_env("TENSORCOMM_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .init();
}
