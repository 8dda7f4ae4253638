//! `hookd`: parses the command line and runs the chosen component (see `hookd::cli`).

#[tokio::main]
async fn main() -> std::process::ExitCode {
    hookd::cli::main(hookd::cli::parse()).await
}
