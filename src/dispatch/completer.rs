//! The batch completer: workers hand in outcomes; one task writes them in batches (one
//! transaction per batch: fenced delivery updates, attempt log, dead letters, circuit
//! breakers, 410 disables). Batching is what lets a process complete thousands of
//! deliveries per second without a round-trip each.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use sqlx::PgPool;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use crate::db::{self, DbError, deliveries::Completion, endpoints::CircuitInput};
use crate::metrics::Metrics;

/// One finished attempt, as the worker reports it.
#[derive(Debug)]
pub struct Finished {
    pub completion: Completion,
    pub endpoint_id: Uuid,
    /// the endpoint configuration the send used
    pub config_version: i64,
    /// whether the attempt counts as a success for the circuit breaker
    pub success: bool,
    /// counts as a failure for the circuit breaker (permanent errors do not: they say
    /// nothing about the receiver's health)
    pub failure: bool,
    pub gone: bool,
    /// the delivery is in an ordering key's line (see [`CompleterConfig::line_moved`])
    pub ordered: bool,
}

#[derive(Debug, Clone)]
pub struct CompleterConfig {
    pub max_batch: usize,
    /// outcomes waiting to be written at most; a full queue makes workers wait before
    /// freeing their slot, so claiming slows down instead of memory growing
    pub queue: usize,
    pub circuit_threshold: i32,
    pub circuit_cooldown: Duration,
    /// after shutdown, how long to keep retrying outcome writes against an unreachable
    /// database before giving up
    pub shutdown_grace: Duration,
    /// notified once a batch that ended deliveries in an ordering key's line committed:
    /// the line mover (`dispatch::lines`) then lets each key's next delivery go
    /// (migration 0034), at once rather than at its next poll
    pub line_moved: std::sync::Arc<tokio::sync::Notify>,
    /// asked to scan once a batch committed that makes something due later or sooner
    /// than the claim loop knows: a retry or a held delivery scheduled, a circuit opened
    /// or closed. The loop leases handed deliveries without scanning, so this is how its
    /// timer to the next due row learns of them.
    pub rescan: std::sync::Arc<crate::notify::Wakeup>,
}

/// Spawns the completer; it drains the channel and exits once every sender is dropped.
pub fn spawn(
    pool: PgPool,
    cfg: CompleterConfig,
    metrics: Metrics,
    shutdown: CancellationToken,
) -> (mpsc::Sender<Finished>, tokio::task::JoinHandle<()>) {
    let (tx, mut rx) = mpsc::channel::<Finished>(cfg.queue.max(1));
    let handle = tokio::spawn(async move {
        let mut batch: Vec<Finished> = Vec::with_capacity(cfg.max_batch);
        while let Some(first) = rx.recv().await {
            batch.push(first);
            while batch.len() < cfg.max_batch {
                match rx.try_recv() {
                    Ok(f) => batch.push(f),
                    Err(_) => break,
                }
            }
            write_with_retry(&pool, &cfg, &batch, &metrics, &shutdown).await;
            batch.clear();
        }
    });
    (tx, handle)
}

/// How often a batch that met a deadlock or serialization failure is written again
/// before it is split like a refused one.
const MAX_CONFLICT_RETRIES: u64 = 5;

/// Writes one batch. An unreachable database is waited out (nothing else can progress
/// either; leases that lapse meanwhile turn these writes into fenced no-ops and the rows
/// are resent, never lost). Any other failure is a statement the database refuses
/// because of something in the batch: the batch is split until the refused outcome is
/// alone, so one bad outcome never holds back the others (invariant 8).
async fn write_with_retry(
    pool: &PgPool,
    cfg: &CompleterConfig,
    batch: &[Finished],
    metrics: &Metrics,
    shutdown: &CancellationToken,
) {
    let mut delay = Duration::from_millis(100);
    let mut give_up_at: Option<tokio::time::Instant> = None;
    let mut conflicts = 0;
    loop {
        match write_batch(pool, cfg, batch, metrics).await {
            Ok(()) => return,
            // A deadlock or serialization failure says nothing about the outcomes: the
            // batch is written again whole, not split as if an outcome were refused
            // (which stored it without its response details).
            Err(e) if e.is_transient_conflict() && conflicts < MAX_CONFLICT_RETRIES => {
                conflicts += 1;
                tracing::info!(error = %e, batch = batch.len(), "writing outcomes met a concurrent transaction; retrying");
                tokio::time::sleep(Duration::from_millis(10 * conflicts)).await;
            }
            Err(e) if e.is_unavailable() => {
                if shutdown.is_cancelled()
                    && tokio::time::Instant::now()
                        >= *give_up_at
                            .get_or_insert_with(|| tokio::time::Instant::now() + cfg.shutdown_grace)
                {
                    tracing::warn!(error = %e, dropped = batch.len(), "shutting down without writing outcomes; those deliveries will be retried");
                    return;
                }
                tracing::warn!(error = %e, batch = batch.len(), "writing outcomes failed; retrying");
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(Duration::from_secs(5));
            }
            Err(e) => {
                Box::pin(isolate(pool, cfg, batch, metrics, shutdown, e)).await;
                return;
            }
        }
    }
}

/// Splits a refused batch in halves and writes each; an outcome refused alone is written
/// once more without its receiver-supplied details, and dropped (counted, logged) if even
/// that fails: its lease lapses and the delivery is sent again, so nothing is lost.
async fn isolate(
    pool: &PgPool,
    cfg: &CompleterConfig,
    batch: &[Finished],
    metrics: &Metrics,
    shutdown: &CancellationToken,
    error: DbError,
) {
    if batch.len() > 1 {
        let (a, b) = batch.split_at(batch.len() / 2);
        write_with_retry(pool, cfg, a, metrics, shutdown).await;
        write_with_retry(pool, cfg, b, metrics, shutdown).await;
        return;
    }
    metrics.outcome_write_errors.inc();
    let Some(f) = batch.first() else { return };
    tracing::error!(delivery = %f.completion.delivery_id, error = %error, "the database refused this outcome; writing it without response details");
    let mut bare = Finished {
        completion: f.completion.clone(),
        ..*f
    };
    bare.completion.response_snippet = None;
    bare.completion.error = Some(format!(
        "the outcome could not be stored as received ({}); response details dropped",
        error.sqlstate().unwrap_or_else(|| "database error".into())
    ));
    bare.completion.dead_reason = bare.completion.dead_reason.as_ref().map(|_| "dead".into());
    if let Err(e) = write_batch(pool, cfg, std::slice::from_ref(&bare), metrics).await {
        tracing::error!(delivery = %f.completion.delivery_id, error = %e, "outcome dropped; the delivery will be resent when its lease lapses");
    }
}

async fn write_batch(
    pool: &PgPool,
    cfg: &CompleterConfig,
    batch: &[Finished],
    metrics: &Metrics,
) -> Result<(), DbError> {
    let completions: Vec<Completion> = batch.iter().map(|f| f.completion.clone()).collect();
    let _span = crate::telemetry::enabled().then(|| {
        tracing::info_span!(
            target: crate::telemetry::TARGET,
            "hookd.outcome",
            hookd.rows = batch.len(),
        )
    });
    let mut tx = crate::db::begin(pool).await?;
    // Outcomes may commit asynchronously (invariant 9): losing one in a crash re-sends a
    // delivery, which receivers dedupe by webhook-id; it never drops one.
    db::set_async_commit(&mut tx).await?;
    let passed = db::deliveries::complete(&mut tx, &completions).await?;
    tx.commit().await?;
    let passed: HashSet<Uuid> = passed.into_iter().collect();
    if batch.iter().any(|f| {
        f.ordered
            && matches!(
                f.completion.status,
                db::deliveries::DeliveryOutcome::Succeeded | db::deliveries::DeliveryOutcome::Dead
            )
            && passed.contains(&f.completion.delivery_id)
    }) {
        cfg.line_moved.notify_one();
    }
    let circuits_moved = endpoint_effects(pool, cfg, batch, &passed, metrics).await;
    if circuits_moved
        || batch.iter().any(|f| {
            matches!(
                f.completion.status,
                db::deliveries::DeliveryOutcome::Retry | db::deliveries::DeliveryOutcome::Held
            ) && passed.contains(&f.completion.delivery_id)
        })
    {
        cfg.rescan.scan();
    }
    let lost = batch.len() - passed.len();
    if lost > 0 {
        metrics.leases_lost.inc_by(lost as u64);
        for f in batch
            .iter()
            .filter(|f| !passed.contains(&f.completion.delivery_id))
        {
            tracing::info!(
                delivery = %f.completion.delivery_id,
                attempt = f.completion.attempt,
                "lease was lost before the outcome was written; outcome dropped (the delivery will be retried by its new holder)"
            );
        }
    }
    // Without a cluster the log is the only place an operator sees a delivery failing or
    // dying, so each such outcome is logged once, at info, with its ids.
    for f in batch
        .iter()
        .filter(|f| passed.contains(&f.completion.delivery_id))
    {
        let c = &f.completion;
        match c.status {
            db::deliveries::DeliveryOutcome::Retry => tracing::info!(
                delivery = %c.delivery_id,
                endpoint = %f.endpoint_id,
                attempt = c.attempt,
                status_code = ?c.status_code,
                error = c.error.as_deref().unwrap_or(""),
                retry_in_ms = ?c.retry_delay_ms,
                "delivery failed; retry scheduled"
            ),
            db::deliveries::DeliveryOutcome::Dead => tracing::info!(
                delivery = %c.delivery_id,
                endpoint = %f.endpoint_id,
                attempt = c.attempt,
                reason = c.dead_reason.as_deref().unwrap_or(""),
                "delivery dead; dead-lettered (replay it with POST /v1/deliveries/{{id}}/replay)"
            ),
            db::deliveries::DeliveryOutcome::Held => tracing::warn!(
                delivery = %c.delivery_id,
                endpoint = %f.endpoint_id,
                error = c.error.as_deref().unwrap_or(""),
                retry_in_ms = ?c.retry_delay_ms,
                "delivery held, not sent and not counted"
            ),
            db::deliveries::DeliveryOutcome::Succeeded => {}
        }
    }
    Ok(())
}

/// What a batch's fenced outcomes do to their endpoints: circuit breakers, the
/// unreadable-secret status, 410 disables. Written after the outcomes committed, as
/// statements of their own: the outcomes' statement locks the endpoints' queue entries
/// (its trigger), and a claim's wake-up fold locks an endpoint row and then its entry, so
/// taking endpoint rows in the same transaction as the outcomes deadlocked with folds
/// (a 1 s stall each time, dozens a minute under a steady 1,000 events/s). Losing these
/// in a crash between the commits costs a circuit count, never a delivery. Returns
/// whether a circuit opened or closed.
async fn endpoint_effects(
    pool: &PgPool,
    cfg: &CompleterConfig,
    batch: &[Finished],
    passed: &HashSet<Uuid>,
    metrics: &Metrics,
) -> bool {
    // Fold this batch's fenced outcomes per endpoint configuration in attempt order.
    let mut circuits: HashMap<(Uuid, i64), CircuitInput> = HashMap::new();
    let mut gone: Vec<(Uuid, i64)> = Vec::new();
    for f in batch
        .iter()
        .filter(|f| passed.contains(&f.completion.delivery_id))
    {
        let key = (f.endpoint_id, f.config_version);
        let c = circuits.entry(key).or_insert(CircuitInput {
            endpoint_id: f.endpoint_id,
            config_version: f.config_version,
            any_success: false,
            trailing_failures: 0,
        });
        if f.success {
            c.any_success = true;
            c.trailing_failures = 0;
        } else if f.failure {
            c.trailing_failures += 1;
        }
        if f.gone && !gone.contains(&key) {
            gone.push(key);
        }
    }
    let inputs: Vec<CircuitInput> = circuits.into_values().collect();
    // deliveries held because this dispatcher cannot open a signing secret: say so on the
    // endpoint, where its owner and the operator look (issue 19)
    let held: Vec<(Uuid, String)> = batch
        .iter()
        .filter(|f| {
            f.completion.status == db::deliveries::DeliveryOutcome::Held
                && passed.contains(&f.completion.delivery_id)
        })
        .map(|f| {
            (
                f.endpoint_id,
                f.completion.error.clone().unwrap_or_default(),
            )
        })
        .collect();
    if inputs.is_empty() && held.is_empty() && gone.is_empty() {
        return false;
    }
    let mut delay = Duration::from_millis(10);
    let mut tries = 0;
    let (circuit, disabled) = loop {
        tries += 1;
        match write_endpoint_effects(pool, cfg, &inputs, &held, &gone).await {
            Ok(done) => break done,
            Err(e) if (e.is_unavailable() || e.is_transient_conflict()) && tries < 5 => {
                tracing::info!(error = %e, "recording circuit breakers failed; retrying");
                tokio::time::sleep(delay).await;
                delay *= 4;
            }
            Err(e) => {
                // the outcomes are written; the next batch of these endpoints counts again
                metrics.outcome_write_errors.inc();
                tracing::warn!(error = %e, endpoints = inputs.len(), "could not record these outcomes' circuit breakers and endpoint status");
                return false;
            }
        }
    };
    for id in &circuit.opened {
        tracing::warn!(endpoint = %id, "circuit opened");
    }
    for id in &circuit.closed {
        tracing::info!(endpoint = %id, "circuit closed: the endpoint answered again");
    }
    metrics.circuits_opened.inc_by(circuit.opened.len() as u64);
    for id in &disabled {
        tracing::warn!(endpoint = %id, "endpoint disabled: receiver answered 410 Gone");
    }
    metrics.endpoints_disabled.inc_by(disabled.len() as u64);
    !circuit.opened.is_empty() || !circuit.closed.is_empty()
}

async fn write_endpoint_effects(
    pool: &PgPool,
    cfg: &CompleterConfig,
    inputs: &[CircuitInput],
    held: &[(Uuid, String)],
    gone: &[(Uuid, i64)],
) -> Result<(db::endpoints::CircuitTransitions, Vec<Uuid>), DbError> {
    // Each statement on its own (autocommit): they need no common snapshot, and most
    // batches change no endpoint row at all, so one round trip instead of four; one that
    // does change a row (a circuit, at most a success stamp a second) commits it at once.
    let mut conn = pool.acquire().await?;
    let circuit = db::endpoints::record_circuit_transitions(
        &mut conn,
        inputs,
        cfg.circuit_threshold,
        cfg.circuit_cooldown.as_secs_f64(),
    )
    .await?;
    db::endpoints::mark_secret_unreadable(&mut conn, held).await?;
    let disabled = if gone.is_empty() {
        Vec::new()
    } else {
        db::endpoints::disable(
            &mut conn,
            gone,
            "receiver answered 410 Gone; change the WebhookEndpoint to re-enable it",
        )
        .await?
    };
    Ok((circuit, disabled))
}
