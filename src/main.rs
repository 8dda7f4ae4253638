//! `hookd`: parses the command line and runs the chosen component (see `hookd::cli`).

use clap::Parser;

use hookd::cli::{Cli, run};
use hookd::runtime;

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    runtime::init_tracing(&cli.log, cli.log_format);
    if let Some(token) = cli.metrics_token.as_deref().filter(|t| !t.is_empty()) {
        hookd::metrics::require_scrape_token(token);
    }
    match run(cli.command).await {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("hookd: error: {}", runtime::error_line(&e));
            std::process::ExitCode::FAILURE
        }
    }
}
