//! `hookd`: parses the command line and runs the chosen component.

use clap::Parser;

use hookd::config::{Cli, Command};
use hookd::{api, apply, db, dispatch, k8s, rekey, retention, runtime};

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

async fn run(command: Command) -> anyhow::Result<()> {
    match command {
        Command::Crd => {
            print!("{}", k8s::crds_yaml());
            Ok(())
        }
        Command::Migrate(args) => {
            let pool = db::connect_checked(&args.pool_settings()).await?;
            db::migrate(&pool).await?;
            eprintln!("migrations applied");
            if let Ok(Some(warning)) = db::autovacuum_warning(&pool).await {
                eprintln!("warning: {warning}");
            }
            Ok(())
        }
        Command::Apply(args) => {
            let plan = apply::load(&args.files)?;
            for warning in apply::published_secret_warnings(&plan) {
                eprintln!("hookd apply: {warning}");
            }
            let keyring = args.keys.keyring()?;
            let pool = runtime::open_checked(&args.db).await?;
            let results = apply::apply_plan(&pool, &plan, &keyring).await?;
            for line in apply::describe(&pool, &results).await? {
                println!("{line}");
            }
            Ok(())
        }
        Command::Api(args) => {
            let pool = runtime::open_checked(&args.db).await?;
            api::run(pool, args.api, runtime::shutdown_on_signals()).await
        }
        Command::Dispatch(args) => {
            let keyring = args.keys.keyring()?;
            let pool = runtime::open_checked(&args.db).await?;
            let shutdown = runtime::shutdown_on_signals();
            dispatch::run(pool, args.dispatch, keyring, args.retention, shutdown).await
        }
        Command::Controller(args) => {
            let keyring = args.keys.keyring()?;
            let pool = runtime::open_checked(&args.db).await?;
            k8s::run(
                pool,
                keyring,
                args.controller,
                runtime::shutdown_on_signals(),
            )
            .await
        }
        Command::Dev(args) => hookd::dev::run(args, runtime::shutdown_on_signals()).await,
        Command::Receiver(args) => hookd::receiver::run(args, runtime::shutdown_on_signals()).await,
        Command::Rekey(args) => {
            let keyring = args.keys.keyring()?;
            let pool = runtime::open_checked(&args.db).await?;
            Ok(rekey::run(&pool, &keyring, args.batch).await?)
        }
        Command::Prune(args) => {
            let pool = db::connect_lazy(&args.db.pool_settings())?;
            retention::run_once(&pool, &args.retention).await
        }
        Command::Token(cmd) => hookd::auth::cli::run(cmd).await,
        Command::Bench(args) => hookd::bench::run(args, runtime::shutdown_on_signals()).await,
    }
}
