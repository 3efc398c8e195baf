//! Placeholder until its owner lands it.

use std::process::ExitCode;

#[derive(clap::Args)]
pub struct RunArgs {}

pub fn main(_args: RunArgs) -> ExitCode {
    eprintln!("not built yet");
    ExitCode::FAILURE
}
