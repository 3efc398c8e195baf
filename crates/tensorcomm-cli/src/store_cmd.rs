//! Placeholder until its owner lands it.

use std::process::ExitCode;

#[derive(clap::Args)]
pub struct StoreArgs {}

pub fn main(_args: StoreArgs) -> ExitCode {
    eprintln!("not built yet");
    ExitCode::FAILURE
}
