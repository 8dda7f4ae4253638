//! `hookd dev`: everything in one process for a laptop. A throwaway Postgres when
//! DATABASE_URL is unset, migrations, the example WebhookEndpoints applied, the API and a
//! dispatcher (the same `run` functions as in a cluster), and a receiver for the examples
//! (`hookd receiver`'s, from [`crate::receiver`]) that verifies each delivery's signature
//! and prints it.

use std::sync::Arc;

use clap::Parser;
use tokio_util::sync::CancellationToken;

use crate::auth::{AuthMode, Scope};
use crate::config::{ApiSettings, DevArgs, DispatchSettings};
use crate::db::{self, PoolSettings};
use crate::pgtemp::TempPostgres;
use crate::receiver::{Receiver, ReceiverConfig};

/// The tenant of the examples (their namespace), which the printed token acts for.
const DEV_TENANT: &str = "default";

/// Defaults of each component's settings, with HOOKD_* from the environment applied
/// (one parser each: both components have a `--listen`).
#[derive(Parser)]
struct ApiDefaults {
    #[command(flatten)]
    s: ApiSettings,
}

#[derive(Parser)]
struct DispatchDefaults {
    #[command(flatten)]
    s: DispatchSettings,
}

pub async fn run(args: DevArgs, shutdown: CancellationToken) -> anyhow::Result<()> {
    // Without HOOKD_ENCRYPTION_KEY this is the local key file, which is what a laptop wants.
    let keyring = Arc::new(args.keys.keyring()?);
    let temp = match &args.database_url {
        Some(_) => None,
        None => {
            eprintln!("hookd dev: DATABASE_URL is unset; starting a throwaway Postgres…");
            Some(TempPostgres::start().await?)
        }
    };
    let url = args
        .database_url
        .clone()
        .or_else(|| temp.as_ref().map(TempPostgres::url))
        .expect("a database url");
    let pool = db::connect_lazy(&PoolSettings {
        url: url.clone(),
        max_connections: 16,
        acquire_timeout: std::time::Duration::from_secs(5),
    })?;
    db::migrate(&pool).await?;

    let mut files: Vec<std::path::PathBuf> = std::fs::read_dir(&args.examples)
        .map_err(|e| anyhow::anyhow!("{}: {e}", args.examples.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "yaml" || x == "yml"))
        .collect();
    files.sort();
    let plan = crate::apply::load(&files)?;
    let secrets: Vec<String> = plan
        .iter()
        .filter_map(|d| d.secret.as_ref())
        .map(|s| s.value.clone())
        .collect();
    for (name, outcome) in crate::apply::apply_plan(&pool, &plan, &keyring).await? {
        eprintln!(
            "hookd dev: webhookendpoint/{name} applied (id {})",
            outcome.endpoint_id
        );
    }

    let mut api = ApiDefaults::parse_from(["hookd"]).s;
    api.listen = args.listen;
    let mut dispatch = DispatchDefaults::parse_from(["hookd"]).s;
    if dispatch.allowed_destinations.is_empty() {
        // the example receiver lives on loopback, which is refused by default
        dispatch.allowed_destinations = "127.0.0.0/8,::1/128".into();
    }
    let cfg = crate::dispatch::DispatchConfig::from_settings(&dispatch)?;

    // `load` has validated every secret, so the receiver accepts them all.
    let receiver = Receiver::new(ReceiverConfig {
        secrets,
        ..ReceiverConfig::default()
    })?;
    let receiver_listener = tokio::net::TcpListener::bind(args.receiver_listen).await?;
    tokio::spawn(crate::api::serve_on(
        receiver_listener,
        receiver.router(),
        shutdown.clone(),
    ));

    let dispatcher = tokio::spawn(crate::dispatch::run_dispatcher(
        pool.clone(),
        cfg,
        keyring,
        crate::metrics::Metrics::new(),
        shutdown.clone(),
    ));
    println!(
        "hookd dev: API on http://{}, example receiver on http://{}",
        args.listen, args.receiver_listen
    );
    println!("hookd dev: database {url}");
    let payload = r#""eventType":"invoice.paid","payload":{"invoice":"in_1","amount":4200}"#;
    match api.auth {
        AuthMode::On => {
            // the examples' tenant, with every scope, so the curl line and a follow-up
            // GET /v1/messages/{id} (and replays) all work as printed
            let token = crate::auth::tokens::create(
                &pool,
                &crate::auth::tokens::TokenRequest {
                    tenant: DEV_TENANT.into(),
                    scopes: Scope::ALL.to_vec(),
                    name: Some("hookd dev".into()),
                    expires_at: None,
                },
            )
            .await?
            .token;
            println!(
                "hookd dev: API token for tenant {DEV_TENANT} (scopes produce, read, operate): {token}"
            );
            println!("hookd dev: send a first event with:");
            println!(
                "curl -sS -X POST http://{}/v1/messages -H 'authorization: Bearer {token}' -H 'content-type: application/json' -d '{{{payload}}}'",
                args.listen
            );
            println!(
                "hookd dev: read it back with: curl -sS http://{}/v1/messages/<eventId> -H 'authorization: Bearer {token}'",
                args.listen
            );
        }
        AuthMode::None => {
            println!("hookd dev: HOOKD_AUTH=none, so no token is needed; send a first event with:");
            println!(
                "curl -sS -X POST http://{}/v1/messages -H 'content-type: application/json' -d '{{\"tenant\":\"{DEV_TENANT}\",{payload}}}'",
                args.listen
            );
        }
    }
    let api_result = crate::api::run(pool, api, shutdown.clone()).await;
    shutdown.cancel();
    let _ = dispatcher.await;
    if let Some(t) = temp {
        t.shutdown().await?;
        eprintln!("hookd dev: throwaway Postgres removed");
    }
    api_result
}
