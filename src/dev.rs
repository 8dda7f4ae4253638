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
    #[command(flatten)]
    retention: crate::config::RetentionSettings,
}

/// The examples of this source tree, built in so `hookd dev` runs from any directory.
const BUILTIN_EXAMPLES: &[(&str, &str)] = &[(
    "examples/endpoint.yaml",
    include_str!("../examples/endpoint.yaml"),
)];

/// The receiver address the built-in examples are written for; rewritten to the actual
/// `--receiver-listen`.
const EXAMPLES_RECEIVER: &str = "http://127.0.0.1:9000";

/// How often the example receiver re-reads the signing secrets of the dev database.
const SECRET_REFRESH: std::time::Duration = std::time::Duration::from_secs(1);

#[derive(Debug, thiserror::Error)]
pub enum DevError {
    #[error(transparent)]
    Listen(#[from] crate::runtime::ListenError),
    #[error("{}: {source}", path.display())]
    Examples {
        path: std::path::PathBuf,
        #[source]
        source: std::io::Error,
    },
}

async fn bind(
    addr: std::net::SocketAddr,
    what: &'static str,
    flag: &'static str,
) -> Result<tokio::net::TcpListener, DevError> {
    Ok(crate::runtime::bind(addr, what, flag).await?)
}

/// The YAML texts to apply: the given folder's `*.yaml`, or the built-in examples aimed
/// at the example receiver's actual address.
fn example_texts(args: &DevArgs) -> Result<Vec<(std::path::PathBuf, String)>, DevError> {
    let Some(dir) = &args.examples else {
        let receiver = format!("http://{}", args.receiver_listen);
        return Ok(BUILTIN_EXAMPLES
            .iter()
            .map(|(name, text)| (name.into(), text.replace(EXAMPLES_RECEIVER, &receiver)))
            .collect());
    };
    let err = |source| DevError::Examples {
        path: dir.clone(),
        source,
    };
    let mut files: Vec<std::path::PathBuf> = std::fs::read_dir(dir)
        .map_err(err)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "yaml" || x == "yml"))
        .collect();
    files.sort();
    files
        .into_iter()
        .map(|p| {
            let text = std::fs::read_to_string(&p).map_err(|source| DevError::Examples {
                path: p.clone(),
                source,
            })?;
            Ok::<_, DevError>((p, text))
        })
        .collect()
}

/// Reads every live secret of the dev database into `secrets`, labelled by endpoint.
async fn load_secrets(
    pool: &sqlx::PgPool,
    keyring: &crate::crypto::Keyring,
    secrets: &crate::receiver::DynamicSecrets,
) {
    let rows = match db::secrets::live(pool).await {
        Ok(rows) => rows,
        Err(e) => {
            tracing::warn!(error = %e, "could not read signing secrets for the example receiver");
            return;
        }
    };
    let mut next = Vec::with_capacity(rows.len());
    for r in rows {
        let value = match (&r.key_id, &r.ciphertext, &r.plaintext_secret) {
            (Some(k), Some(c), _) => keyring
                .decrypt(r.endpoint_id, k, c)
                .map(|z| z.to_string())
                .ok(),
            (_, _, Some(p)) => Some(p.clone()),
            _ => None,
        };
        if let Some(v) = value {
            let label = if r.endpoint.is_empty() {
                format!("endpoint {}", r.endpoint_id)
            } else {
                format!("webhookendpoint/{}", r.endpoint)
            };
            next.push((label, v));
        }
    }
    *secrets.write().unwrap_or_else(|e| e.into_inner()) = next;
}

/// Keeps the receiver's secrets equal to every live secret of the dev database, so an
/// endpoint the user applies (with a secret of their own) is verified too, not 401'd.
/// The first load is done before this returns.
async fn start_secret_refresh(
    pool: sqlx::PgPool,
    keyring: Arc<crate::crypto::Keyring>,
    secrets: crate::receiver::DynamicSecrets,
    shutdown: CancellationToken,
) {
    load_secrets(&pool, &keyring, &secrets).await;
    tokio::spawn(async move {
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = tokio::time::sleep(SECRET_REFRESH) => {}
            }
            load_secrets(&pool, &keyring, &secrets).await;
        }
    });
}

/// A closing terminal sends SIGHUP: stop as on Ctrl-C, so the throwaway Postgres is
/// removed (the watchdog of [`TempPostgres`] covers deaths no handler sees).
fn cancel_on_hangup(shutdown: &CancellationToken) -> std::io::Result<()> {
    let mut hup = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup())?;
    let token = shutdown.clone();
    tokio::spawn(async move {
        if hup.recv().await.is_some() {
            tracing::info!("terminal closed (SIGHUP); shutting down");
            token.cancel();
        }
    });
    Ok(())
}

pub async fn run(args: DevArgs, shutdown: CancellationToken) -> anyhow::Result<()> {
    cancel_on_hangup(&shutdown)?;
    // Without HOOKD_ENCRYPTION_KEY this is the local key file, which is what a laptop wants.
    // Loaded once for every component below: each load reads the key file again and
    // repeats its warnings.
    let keyring = args.keys.keyring()?;
    let texts = example_texts(&args)?;
    let plan = crate::apply::load_texts(&texts)?;
    // Every address first, so a port clash is reported before anything is started.
    let api_listener = bind(args.listen, "API", "--listen, HOOKD_LISTEN").await?;
    let receiver_listener = bind(
        args.receiver_listen,
        "example receiver",
        "--receiver-listen, HOOKD_DEV_RECEIVER_LISTEN",
    )
    .await?;
    let dispatch_listener = bind(
        args.dispatch_listen,
        "dispatcher metrics",
        "--dispatch-listen, HOOKD_DEV_DISPATCH_LISTEN",
    )
    .await?;
    let temp = match &args.database_url {
        Some(_) => None,
        None => {
            eprintln!("hookd dev: DATABASE_URL is unset; starting a throwaway Postgres…");
            Some(TempPostgres::start().await?)
        }
    };
    let settings = PoolSettings {
        url: args
            .database_url
            .clone()
            .or_else(|| temp.as_ref().map(TempPostgres::url))
            .expect("a database url"),
        max_connections: 16,
        acquire_timeout: std::time::Duration::from_secs(5),
    };
    let url = settings.url.clone();
    let pool = db::connect_checked(&settings).await?;
    db::migrate(&pool).await?;

    for warning in crate::apply::published_secret_warnings(&plan) {
        eprintln!("hookd dev: {warning}");
    }
    let results = crate::apply::apply_plan(&pool, &plan, &keyring).await?;
    for line in crate::apply::describe(&pool, &results).await? {
        eprintln!("hookd dev: {line}");
    }

    let mut api = ApiDefaults::parse_from(["hookd"]).s;
    api.listen = args.listen;
    let DispatchDefaults {
        s: mut dispatch,
        retention,
    } = DispatchDefaults::parse_from(["hookd"]);
    // what its "dispatcher starting" line reports (the listener is bound above)
    dispatch.listen = args.dispatch_listen;
    if dispatch.allowed_destinations.is_empty() {
        // the example receiver lives on loopback, which is refused by default
        dispatch.allowed_destinations = "127.0.0.0/8,::1/128".into();
    }
    // checked now, so a bad setting is refused before anything starts
    crate::dispatch::DispatchConfig::from_settings(&dispatch)?;
    let dispatch_allowed = dispatch.allowed_destinations.clone();

    // The receiver verifies with every live secret of this database, refreshed.
    let secrets = crate::receiver::DynamicSecrets::default();
    start_secret_refresh(
        pool.clone(),
        Arc::new(keyring.clone()),
        secrets.clone(),
        shutdown.clone(),
    )
    .await;
    let receiver = Receiver::new(ReceiverConfig {
        dynamic: Some(secrets),
        ..ReceiverConfig::default()
    })?;
    tokio::spawn(crate::ops::serve_on(
        receiver_listener,
        receiver.router(),
        shutdown.clone(),
    ));

    // the same entry point as `hookd dispatch`: its listener serves /metrics, and it runs
    // the retention pruner
    let dispatcher = tokio::spawn(crate::dispatch::run_on(
        dispatch_listener,
        pool.clone(),
        dispatch,
        keyring.clone(),
        retention,
        shutdown.clone(),
    ));
    println!(
        "hookd dev: API on http://{}, example receiver on http://{}, dispatcher metrics on http://{}/metrics",
        args.listen, args.receiver_listen, args.dispatch_listen
    );
    match &temp {
        Some(t) => println!(
            "hookd dev: database {url} (throwaway, in {}; removed on exit)",
            t.root().display()
        ),
        None => println!("hookd dev: database {}", db::redact_url(&url)),
    }
    let payload = r#""eventType":"invoice.paid","payload":{"invoice":"in_1","amount":4200}"#;
    match api.auth {
        AuthMode::On => {
            // the examples' tenant, with every scope, so the curl line and a follow-up
            // GET /v1/messages/{id} (and replays) all work as printed
            let token = crate::auth::tokens::create(
                &pool,
                &crate::auth::tokens::TokenRequest {
                    consumer: None,
                    tenant: DEV_TENANT.into(),
                    scopes: Scope::ALL.to_vec(),
                    name: Some("hookd dev".into()),
                    expires_at: None,
                },
            )
            .await?
            .token;
            println!(
                "hookd dev: API token for tenant {DEV_TENANT} (scopes produce, read, operate, manage): {token}"
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
            println!(
                "hookd dev: or open the web console at http://{}/ui and sign in with that token (it is sent once, never put in the address)",
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
    // api::run binds the address itself; hand it back now that it is known to be free
    drop(api_listener);
    let manage = crate::api::ManageDeps {
        keyring: Ok(keyring),
        allow: crate::outbound::AllowList::parse(&dispatch_allowed)
            .map_err(|e| anyhow::anyhow!(e))?,
        public_url: Some(format!("http://{}", args.listen)),
    };
    let api_result = crate::api::run(pool, api, manage, shutdown.clone()).await;
    shutdown.cancel();
    let _ = dispatcher.await;
    if let Some(t) = temp {
        t.shutdown().await?;
        eprintln!("hookd dev: throwaway Postgres removed");
    }
    api_result
}
