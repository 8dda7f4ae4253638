//! `hookd`: parses the command line and runs the chosen component (see `hookd::cli`).

use clap::Parser;

#[tokio::main]
async fn main() -> std::process::ExitCode {
    hookd::cli::main(hookd::cli::Cli::parse()).await
}
