//! The `hookd dispatch` process: its health and metrics listener, its background duties
//! and the dispatcher loop, started in that order and stopped together.

use std::sync::Arc;

use sqlx::PgPool;
use tokio_util::sync::CancellationToken;

use super::{DispatchConfig, duties, run_dispatcher};
use crate::config::{DispatchSettings, RetentionSettings};
use crate::crypto::Keyring;
use crate::metrics::Metrics;

/// `hookd dispatch`: the dispatcher, its background duties (history days, the retention
/// pruner, the backlog sampler, the straggler sweep, the open-circuit report; awaited together at shutdown) and its
/// health/metrics listener.
pub async fn run(
    pool: PgPool,
    settings: DispatchSettings,
    keyring: Keyring,
    retention: RetentionSettings,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    let listener = tokio::net::TcpListener::bind(settings.listen).await?;
    run_on(listener, pool, settings, keyring, retention, shutdown).await
}

/// [`run`] on a listener already bound (`hookd dev` binds its ports first, so a clash is
/// reported before anything starts).
pub async fn run_on(
    listener: tokio::net::TcpListener,
    pool: PgPool,
    settings: DispatchSettings,
    keyring: Keyring,
    retention: RetentionSettings,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    let cfg = DispatchConfig::from_settings(&settings)?;
    let policy = crate::retention::RetentionPolicy::from_settings(&retention)?;
    let metrics = Metrics::new();
    // before the health listener: a dispatcher that reports ready has left no
    // plaintext secret behind
    duties::encrypt_legacy_secrets(&pool, &keyring).await;
    let health = crate::ops::router(pool.clone(), metrics.clone());
    tracing::info!(listen = %settings.listen, worker = %cfg.worker_id, key_id = keyring.active_key_id(), "dispatcher starting");
    let server = tokio::spawn(crate::ops::serve_on(listener, health, shutdown.clone()));
    let keyring = Arc::new(keyring);
    let mut background = crate::runtime::Duties::new();
    duties::start(
        &mut background,
        &pool,
        policy,
        &retention,
        &metrics,
        std::time::Duration::from_secs(settings.circuit_alert_secs),
        &shutdown,
    );
    run_dispatcher(pool, cfg, keyring, metrics, shutdown).await;
    background.join().await;
    server.await??;
    Ok(())
}
