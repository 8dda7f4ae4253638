//! The command line: the composition root. It parses flags into each component's
//! settings (`config`) and calls that component's entry point; nothing else depends on it.

pub mod token;

use clap::{Parser, Subcommand};

use crate::config::*;
use crate::{api, apply, db, dispatch, k8s, rekey, retention, runtime};

#[derive(Debug, Parser)]
#[command(
    name = "hookd",
    version,
    about = "Kubernetes-native webhook gateway on the transactional outbox pattern"
)]
pub struct Cli {
    /// Log filter (tracing env-filter syntax), e.g. `info` or `hookd=debug,info`
    #[arg(long, env = "HOOKD_LOG", default_value = "info", global = true)]
    pub log: String,
    /// Log format: `text` or `json`
    #[arg(long, env = "HOOKD_LOG_FORMAT", default_value = "text", global = true)]
    pub log_format: LogFormat,
    /// Bearer token that `GET /metrics` of every component requires (default: none, the
    /// metrics are open to whoever reaches the port)
    #[arg(
        long,
        env = "HOOKD_METRICS_TOKEN",
        global = true,
        hide_env_values = true
    )]
    pub metrics_token: Option<String>,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Apply the database migrations (idempotent)
    Migrate(DbArgs),
    /// Serve the ingest and operations API
    Api(ApiArgs),
    /// Run a dispatcher: claim due deliveries and send them
    Dispatch(DispatchArgs),
    /// Run the Kubernetes controller (WebhookEndpoint, WebhookDispatcher and WebhookSource)
    Controller(ControllerArgs),
    /// Apply WebhookEndpoint, WebhookSource and Secret YAML documents straight to Postgres
    Apply(ApplyArgs),
    /// Remove the WebhookEndpoints (disabled, unsent deliveries cancelled, history kept) and WebhookSources that `hookd apply -f` declared
    Delete(DeleteArgs),
    /// Print the CustomResourceDefinitions as YAML
    Crd,
    /// Run everything in one process for a laptop (throwaway Postgres when DATABASE_URL is unset)
    Dev(DevArgs),
    /// Run a webhook receiver that verifies signatures and records webhook ids (for testing a setup)
    Receiver(ReceiverArgs),
    /// Re-encrypt every signing secret not under the active encryption key (online, idempotent)
    Rekey(RekeyArgs),
    /// Delete terminal deliveries, their attempts and dead letters, and events past the retention (one pass)
    Prune(PruneArgs),
    /// Manage static API tokens
    #[command(subcommand)]
    Token(token::TokenCommand),
    /// The bench moved to the hookd-bench crate; this only says so (exit status 2)
    #[command(hide = true, disable_help_flag = true)]
    Bench(BenchMoved),
}

impl Command {
    /// The process's name in traces (`service.name`, unless OTEL_SERVICE_NAME is set).
    pub fn service_name(&self) -> &'static str {
        match self {
            Command::Api(_) => "hookd-api",
            Command::Dispatch(_) => "hookd-dispatch",
            Command::Controller(_) => "hookd-controller",
            Command::Dev(_) => "hookd-dev",
            _ => "hookd",
        }
    }
}

/// `hookd bench [args]`: the benchmark is no longer part of the product (it is the
/// hookd-bench crate of this workspace); old scripts and docs get the command to run.
#[derive(Debug, clap::Args)]
pub struct BenchMoved {
    #[arg(trailing_var_arg = true, allow_hyphen_values = true, num_args = 0..)]
    pub args: Vec<String>,
}

impl BenchMoved {
    /// The one line `hookd bench` prints.
    pub fn message(&self) -> String {
        let mut command = String::from("cargo run --release -p hookd-bench");
        if !self.args.is_empty() {
            command.push_str(" -- ");
            command.push_str(&self.args.join(" "));
        }
        format!(
            "hookd bench moved out of the hookd binary into the hookd-bench crate; in the source tree run: {command}"
        )
    }
}

/// The command line of this process. A missing database is named by its variable too:
/// clap's "required argument --database-url" alone never says that DATABASE_URL, which
/// every guide sets, is the usual way to give it.
pub fn parse() -> Cli {
    Cli::try_parse().unwrap_or_else(|e| {
        if e.kind() == clap::error::ErrorKind::MissingRequiredArgument
            && e.to_string().contains("--database-url")
        {
            let _ = e.print();
            eprintln!(
                "\nhookd needs a Postgres database: set DATABASE_URL (or pass --database-url), e.g. DATABASE_URL=postgres://postgres@127.0.0.1:5432/hookd; `hookd dev` starts a throwaway one when DATABASE_URL is unset"
            );
            std::process::exit(e.exit_code());
        }
        e.exit()
    })
}

/// The `hookd` executable's body: logging, the metrics token, the chosen component, the
/// exit status. Public so that the bench can run its child processes as `hookd api` and
/// `hookd dispatch` from its own executable (the same build, no second binary to find).
pub async fn main(cli: Cli) -> std::process::ExitCode {
    let _exporting = runtime::init_tracing(&cli.log, cli.log_format, cli.command.service_name());
    if let Some(token) = cli.metrics_token.as_deref().filter(|t| !t.is_empty()) {
        crate::metrics::require_scrape_token(token);
    }
    match run(cli.command).await {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("hookd: error: {}", runtime::error_line(&e));
            std::process::ExitCode::FAILURE
        }
    }
}

/// Runs the chosen component until it finishes or a signal stops it.
pub async fn run(command: Command) -> anyhow::Result<()> {
    match command {
        Command::Crd => {
            print!("{}", k8s::crds_yaml());
            Ok(())
        }
        Command::Migrate(args) => {
            if args.database_pooler == db::Pooler::Transaction {
                // sqlx's migrator holds a session advisory lock across its statements and
                // prepares named statements: neither survives a transaction-mode pooler
                anyhow::bail!(
                    "hookd migrate needs a session of its own: run it with DATABASE_URL pointing straight at Postgres and HOOKD_DATABASE_POOLER unset (see docs/poolers.md)"
                );
            }
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
        Command::Delete(args) => {
            let names = apply::load_deletions(&args.files)?;
            let pool = runtime::open_checked(&args.db).await?;
            let mut missing = Vec::new();
            for (declared, deletion) in apply::delete_declared(&pool, &names).await? {
                let (kind, name) = (
                    declared.kind,
                    format!("{}/{}", declared.namespace, declared.name),
                );
                match deletion {
                    apply::Deletion::Deleted {
                        endpoint_id,
                        cancelled,
                    } => println!(
                        "{kind}/{name} deleted (id {endpoint_id}, {cancelled} unfinished deliveries cancelled)"
                    ),
                    apply::Deletion::SourceDeleted { source_id } => println!(
                        "{kind}/{name} deleted (id {source_id}; its URL answers 401 from now on)"
                    ),
                    apply::Deletion::EventTypeDeleted {
                        tenant,
                        name: event_type,
                    } => println!(
                        "{kind}/{name} deleted (event type {event_type} left tenant {tenant}'s catalog)"
                    ),
                    apply::Deletion::NotFound => {
                        eprintln!("hookd delete: {kind}/{name} not found");
                        missing.push(format!("{kind}/{name}"));
                    }
                }
            }
            if !missing.is_empty() && !args.ignore_not_found {
                anyhow::bail!(
                    "{} of {} object(s) not found (never applied, or already deleted): {}; --ignore-not-found accepts that",
                    missing.len(),
                    names.len(),
                    missing.join(", ")
                );
            }
            Ok(())
        }
        Command::Api(args) => {
            // `api::run` binds the address itself; a clash is named here first
            drop(runtime::bind(args.api.listen, "API", "--listen, HOOKD_LISTEN").await?);
            let manage = api::ManageDeps {
                // The same keys as `hookd dispatch` and `hookd apply`: HOOKD_ENCRYPTION_KEY,
                // else the local key file, which every hookd of one user on one machine
                // shares (so the own-Postgres guide's api and dispatch agree) and which is
                // refused inside a cluster. Without a key the API still serves everything
                // but storing a secret (503 encryption_unavailable).
                keyring: args.keys.keyring().map_err(|e| {
                    tracing::warn!(error = %e, "no encryption key: the endpoints API cannot create endpoints or rotate secrets (503 encryption_unavailable); set HOOKD_ENCRYPTION_KEY, the dispatchers' key");
                    e.to_string()
                }),
                allow: crate::outbound::AllowList::parse(&args.manage.allowed_destinations)
                    .map_err(|e| anyhow::anyhow!("HOOKD_ALLOWED_DESTINATIONS: {e}"))?,
                public_url: args.manage.public_url,
            };
            let pool = runtime::open_checked(&args.db).await?;
            api::run(pool, args.api, manage, runtime::shutdown_on_signals()).await
        }
        Command::Dispatch(args) => {
            let listener = runtime::bind(
                args.dispatch.listen,
                "dispatcher health and metrics",
                "--listen, HOOKD_LISTEN",
            )
            .await?;
            let keyring = args.keys.keyring()?;
            let pool = runtime::open_checked(&args.db).await?;
            let shutdown = runtime::shutdown_on_signals();
            dispatch::run_on(
                listener,
                pool,
                args.dispatch,
                keyring,
                args.retention,
                shutdown,
            )
            .await
        }
        Command::Controller(args) => {
            // `k8s::run` binds the address itself; a clash is named here first
            drop(
                runtime::bind(
                    args.controller.listen,
                    "controller health and metrics",
                    "--listen, HOOKD_LISTEN",
                )
                .await?,
            );
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
        Command::Dev(args) => crate::dev::run(args, runtime::shutdown_on_signals()).await,
        Command::Receiver(args) => crate::receiver::run(args, runtime::shutdown_on_signals()).await,
        Command::Rekey(args) => {
            let keyring = args.keys.keyring()?;
            let pool = runtime::open_checked(&args.db).await?;
            Ok(rekey::run(&pool, &keyring, args.batch).await?)
        }
        Command::Prune(args) => {
            db::set_pooler(args.db.database_pooler);
            let pool = db::connect_lazy(&args.db.pool_settings())?;
            retention::run_once(&pool, &args.retention).await
        }
        Command::Token(cmd) => token::run(cmd).await,
        Command::Bench(moved) => {
            eprintln!("{}", moved.message());
            // 2, like a usage error: the command line names something hookd no longer has
            std::process::exit(2)
        }
    }
}

/// `docs/configuration.md`: every subcommand's flags, their environment variables,
/// defaults and help, rendered from the clap definitions themselves so the page cannot
/// drift from the binary (a test compares the committed page with this).
pub fn configuration_reference() -> String {
    use clap::CommandFactory;
    let cli = Cli::command();
    let mut out = String::from(
        "# Configuration reference\n\n\
         <!-- generated from the command-line definitions by `hookd::cli::configuration_reference`; \
         do not edit: `HOOKD_UPDATE_DOCS=1 cargo test --lib configuration_reference` rewrites it -->\n\n\
         Every flag has an environment equivalent (the second column); a flag given on the command \
         line wins over its variable. `hookd <command> --help` prints the same. Variables that hold \
         credentials (`DATABASE_URL`, keys, tokens, secrets) are never echoed by `--help`.\n",
    );
    render_args(&mut out, "Every command", None, cli.get_arguments());
    fn walk(out: &mut String, prefix: &str, cmd: &clap::Command) {
        for sub in cmd.get_subcommands().filter(|c| !c.is_hide_set()) {
            let name = format!("{prefix} {}", sub.get_name());
            let about = sub.get_about().map(|a| a.to_string());
            render_args(out, &name, about.as_deref(), sub.get_arguments());
            walk(out, &name, sub);
        }
    }
    walk(&mut out, "hookd", &cli);
    out
}

fn render_args<'a>(
    out: &mut String,
    title: &str,
    about: Option<&str>,
    args: impl Iterator<Item = &'a clap::Arg>,
) {
    let cell = |s: &str| {
        s.split_whitespace()
            .collect::<Vec<_>>()
            .join(" ")
            .replace('|', "\\|")
    };
    let rows: Vec<String> = args
        .filter(|a| !a.is_hide_set())
        .filter(|a| !matches!(a.get_id().as_str(), "help" | "version"))
        .map(|a| {
            let flag = match (a.get_long(), a.get_short()) {
                (Some(l), Some(s)) => format!("`-{s}`, `--{l}`"),
                (Some(l), None) => format!("`--{l}`"),
                (None, _) => format!("`<{}>`", a.get_id().as_str().to_uppercase()),
            };
            let env = a
                .get_env()
                .map(|e| format!("`{}`", e.to_string_lossy()))
                .unwrap_or_default();
            let defaults: Vec<String> = a
                .get_default_values()
                .iter()
                .map(|v| v.to_string_lossy().into_owned())
                .collect();
            let default = match defaults.join(",") {
                d if d.is_empty() => String::new(),
                d => format!("`{d}`"),
            };
            let help = a
                .get_long_help()
                .or_else(|| a.get_help())
                .map(|h| cell(&h.to_string()))
                .unwrap_or_default();
            format!("| {flag} | {env} | {default} | {help} |")
        })
        .collect();
    out.push_str(&format!("\n## `{title}`\n\n"));
    if let Some(about) = about {
        out.push_str(&cell(about));
        out.push_str("\n\n");
    }
    if rows.is_empty() {
        out.push_str("No flags.\n");
        return;
    }
    out.push_str("| flag | environment | default | meaning |\n|---|---|---|---|\n");
    for r in rows {
        out.push_str(&r);
        out.push('\n');
    }
}

// Here, at the composition root, rather than beside the controller: it compares the
// controller's output with this command line, and `k8s` must not depend on `cli`.
#[cfg(test)]
mod tests {
    use super::Cli;

    /// docs/configuration.md is the rendering of the command line; a flag added, renamed
    /// or given another default without the page fails here.
    #[test]
    fn configuration_reference_is_current() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/docs/configuration.md");
        let rendered = super::configuration_reference();
        if std::env::var_os("HOOKD_UPDATE_DOCS").is_some() {
            std::fs::write(path, &rendered).unwrap();
        }
        let committed = std::fs::read_to_string(path).unwrap_or_default();
        assert!(
            committed == rendered,
            "docs/configuration.md differs from the command line; rerun with HOOKD_UPDATE_DOCS=1 cargo test --lib configuration_reference"
        );
    }
    use crate::k8s::crd::WebhookDispatcher;
    use crate::k8s::dispatcher_controller::desired_deployment;

    /// The controller writes `hookd dispatch`'s settings as environment variables by name;
    /// every name it writes must be one `hookd dispatch` reads, or a renamed flag would be
    /// silently ignored in every dispatcher pod.
    #[test]
    fn every_variable_the_controller_sets_is_read_by_hookd_dispatch() {
        use clap::CommandFactory;
        let cli = Cli::command();
        let dispatch = cli
            .find_subcommand("dispatch")
            .expect("a dispatch subcommand");
        let read: std::collections::BTreeSet<String> = cli
            .get_arguments()
            .chain(dispatch.get_arguments())
            .filter_map(|a| a.get_env())
            .map(|e| e.to_string_lossy().into_owned())
            .collect();
        let d: WebhookDispatcher = serde_json::from_value(serde_json::json!({
            "apiVersion": "hookd.dev/v1alpha1", "kind": "WebhookDispatcher",
            "metadata": {"name": "default", "namespace": "hookd-system", "uid": "u-1", "generation": 2},
            "spec": {
                "replicas": 2, "concurrency": 100, "endpointConcurrency": 8,
                "requestTimeoutSeconds": 20, "leaseSeconds": 90,
                "databaseSecretRef": {"name": "db"},
                "allowedDestinations": ["10.0.0.0/8"],
            },
        }))
        .unwrap();
        let dep = desired_deployment(&d, "hookd:test", 2);
        let env = dep.spec.unwrap().template.spec.unwrap().containers[0]
            .env
            .clone()
            .unwrap();
        assert!(env.len() >= 10, "{env:?}");
        for e in env {
            assert!(
                read.contains(&e.name),
                "the controller sets {} but hookd dispatch reads no such variable",
                e.name
            );
        }
    }
}
