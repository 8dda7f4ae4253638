//! `hookd-bench`: parses the bench's flags and runs it (see the `hookd_bench` library).
//! Started as `hookd` (the e2e section's child processes), it is the hookd binary instead.

use clap::Parser;

use hookd::config::LogFormat;
use hookd::runtime;
use hookd_bench::BenchArgs;

#[derive(Debug, Parser)]
#[command(
    name = "hookd-bench",
    version,
    about = "Measure ingest, dispatch, end-to-end latency and claim cost on this machine (in a dedicated, dropped database)"
)]
struct Cli {
    /// Log filter (tracing env-filter syntax), e.g. `info` or `hookd=debug,info`
    #[arg(long, env = "HOOKD_LOG", default_value = "info")]
    log: String,
    /// Log format: `text` or `json`
    #[arg(long, env = "HOOKD_LOG_FORMAT", default_value = "text")]
    log_format: LogFormat,
    #[command(flatten)]
    bench: BenchArgs,
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    if hookd_bench::invoked_as_hookd() {
        return hookd::cli::main(hookd::cli::Cli::parse()).await;
    }
    let cli = Cli::parse();
    let _exporting = runtime::init_tracing(&cli.log, cli.log_format, "hookd-bench");
    match hookd_bench::run(cli.bench, runtime::shutdown_on_signals()).await {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!(
                "{}: error: {}",
                hookd_bench::BIN_NAME,
                runtime::error_line(&e)
            );
            std::process::ExitCode::FAILURE
        }
    }
}
