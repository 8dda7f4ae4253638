//! The background duties of a `hookd dispatch` process besides the loop, each with one
//! `run` until shutdown, started together by [`start`] and awaited together at shutdown
//! (`runtime::Duties`).

use std::time::Duration;

use sqlx::PgPool;
use tokio_util::sync::CancellationToken;

use crate::config::RetentionSettings;
use crate::crypto::Keyring;
use crate::db;
use crate::metrics::Metrics;
use crate::retention::RetentionPolicy;
use crate::runtime::Duties;

/// Starts every duty: the history days ahead, the retention pruner (unless its interval
/// is 0), the backlog sampler, the straggler sweep and the open-circuit report (unless
/// `circuit_alert` is 0).
pub(super) fn start(
    duties: &mut Duties,
    pool: &PgPool,
    policy: RetentionPolicy,
    retention: &RetentionSettings,
    metrics: &Metrics,
    circuit_alert: Duration,
    shutdown: &CancellationToken,
) {
    duties.start(
        "history days",
        crate::retention::run_history_days(pool.clone(), shutdown.clone()),
    );
    if retention.prune_interval_secs > 0 {
        duties.start(
            "retention pruner",
            crate::retention::run_pruner(
                pool.clone(),
                policy,
                Duration::from_secs(retention.prune_interval_secs),
                metrics.clone(),
                shutdown.clone(),
            ),
        );
    }
    duties.start(
        "backlog sampler",
        run_backlog_sampler(pool.clone(), metrics.clone(), shutdown.clone()),
    );
    duties.start(
        "straggler sweep",
        run_straggler_sweep(pool.clone(), shutdown.clone()),
    );
    if !circuit_alert.is_zero() {
        duties.start(
            "open-circuit report",
            run_circuit_report(pool.clone(), circuit_alert, shutdown.clone()),
        );
    }
}

/// Secrets stored before encryption at rest (migration 0004) are never handed to a
/// worker in plaintext: encrypt them now, so an upgrade leaves none readable even if
/// nobody runs `hookd rekey`. Idempotent and cheap when there are none; a failure is
/// logged and left to `hookd rekey`, since it must not keep deliveries from flowing.
pub(super) async fn encrypt_legacy_secrets(pool: &PgPool, keyring: &Keyring) {
    match crate::rekey::encrypt_plaintext(pool, keyring, 100).await {
        Ok(0) => {}
        Ok(n) => tracing::warn!(
            encrypted = n,
            key_id = keyring.active_key_id(),
            "encrypted signing secrets left in plaintext by an upgrade"
        ),
        Err(e) => {
            tracing::warn!(error = %e, "could not encrypt plaintext signing secrets; run `hookd rekey`")
        }
    }
}

/// Samples backlog gauges every few seconds with bounded, index-only queries, so a
/// scrape never costs a table scan. A background duty of `hookd dispatch`.
async fn run_backlog_sampler(pool: PgPool, metrics: Metrics, shutdown: CancellationToken) {
    loop {
        if let Ok((backlog, oldest)) = db::deliveries::backlog_sample(&pool).await {
            metrics.backlog.set(backlog);
            metrics.oldest_due_age_seconds.set(oldest);
        }
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_secs(10)) => {}
            _ = shutdown.cancelled() => return,
        }
    }
}

/// Cancels, every 10 s, deliveries an enqueue committed for an endpoint while it was being
/// removed (see [`db::deliveries::cancel_stragglers`]). A background duty of
/// `hookd dispatch`.
async fn run_straggler_sweep(pool: PgPool, shutdown: CancellationToken) {
    loop {
        match db::deliveries::cancel_stragglers(&pool).await {
            Ok(0) => {}
            Ok(n) => tracing::info!(
                cancelled = n,
                "cancelled deliveries committed for endpoints while they were being removed"
            ),
            Err(e) => {
                tracing::warn!(error = %e, "straggler sweep failed; retrying in 10 s")
            }
        }
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_secs(10)) => {}
            _ = shutdown.cancelled() => return,
        }
    }
}

/// Marks the circuits open longer than `after` as reported, which makes migration 0030's
/// trigger emit `hookd.endpoint.circuit_open` for each, once per opening (another
/// dispatcher's pass finds them marked). Checked every `after / 4`, between 1 s and 30 s.
async fn run_circuit_report(pool: PgPool, after: Duration, shutdown: CancellationToken) {
    let every = (after / 4).clamp(Duration::from_secs(1), Duration::from_secs(30));
    loop {
        match db::endpoints::report_open_circuits(&pool, after).await {
            Ok(0) => {}
            Ok(n) => tracing::warn!(
                endpoints = n,
                open_for_secs = after.as_secs(),
                "circuits open past HOOKD_CIRCUIT_ALERT_SECS reported (hookd.endpoint.circuit_open)"
            ),
            Err(e) => tracing::warn!(error = %e, "open-circuit report failed; retrying"),
        }
        tokio::select! {
            _ = tokio::time::sleep(every) => {}
            _ = shutdown.cancelled() => return,
        }
    }
}
