//! Placeholder until its owner lands it.

use std::process::ExitCode;

#[derive(clap::Args)]
pub struct DemoArgs {}

pub fn main(_args: DemoArgs) -> ExitCode {
    eprintln!("not built yet");
    ExitCode::FAILURE
}
