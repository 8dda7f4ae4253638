//! The batch completer: workers hand in outcomes; one task writes them in batches (one
//! transaction per batch: fenced delivery updates, attempt log, dead letters, circuit
//! breakers, 410 disables). Batching is what lets a process complete thousands of
//! deliveries per second without a round-trip each.

use std::collections::HashMap;
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
    /// whether the attempt counts as a success for the circuit breaker
    pub success: bool,
    /// counts as a failure for the circuit breaker (permanent errors do not: they say
    /// nothing about the receiver's health)
    pub failure: bool,
    pub gone: bool,
}

#[derive(Debug, Clone)]
pub struct CompleterConfig {
    pub worker_id: Uuid,
    pub max_batch: usize,
    pub circuit_threshold: i32,
    pub circuit_cooldown: Duration,
    /// after shutdown, how long to keep retrying outcome writes against an unreachable
    /// database before giving up
    pub shutdown_grace: Duration,
}

/// Spawns the completer; it drains the channel and exits once every sender is dropped.
pub fn spawn(
    pool: PgPool,
    cfg: CompleterConfig,
    metrics: Metrics,
    shutdown: CancellationToken,
) -> (mpsc::UnboundedSender<Finished>, tokio::task::JoinHandle<()>) {
    let (tx, mut rx) = mpsc::unbounded_channel::<Finished>();
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
            let mut delay = Duration::from_millis(100);
            let mut give_up_at: Option<tokio::time::Instant> = None;
            loop {
                match write_batch(&pool, &cfg, &batch, &metrics).await {
                    Ok(()) => break,
                    Err(e)
                        if shutdown.is_cancelled()
                            && tokio::time::Instant::now()
                                >= *give_up_at.get_or_insert_with(|| {
                                    tokio::time::Instant::now() + cfg.shutdown_grace
                                }) =>
                    {
                        // Stopping with the database unreachable: unwritten outcomes are
                        // safe to drop, since their leases lapse and the rows are resent.
                        tracing::warn!(error = %e, dropped = batch.len(), "shutting down without writing outcomes; those deliveries will be retried");
                        break;
                    }
                    Err(e) => {
                        // Keep the outcomes and retry: while the database is down nothing
                        // else can make progress either. If leases lapse meanwhile, the
                        // fence turns these writes into no-ops and the rows are resent
                        // (at-least-once), never lost.
                        tracing::warn!(error = %e, batch = batch.len(), "writing outcomes failed; retrying");
                        tokio::time::sleep(delay).await;
                        delay = (delay * 2).min(Duration::from_secs(5));
                    }
                }
            }
            batch.clear();
        }
    });
    (tx, handle)
}

async fn write_batch(
    pool: &PgPool,
    cfg: &CompleterConfig,
    batch: &[Finished],
    metrics: &Metrics,
) -> Result<(), DbError> {
    let completions: Vec<Completion> = batch.iter().map(|f| f.completion.clone()).collect();
    let mut tx = pool.begin().await?;
    let passed = db::deliveries::complete(&mut tx, cfg.worker_id, &completions).await?;
    let passed: std::collections::HashSet<Uuid> = passed.into_iter().collect();

    // Fold this batch's fenced outcomes per endpoint in attempt order.
    let mut circuits: HashMap<Uuid, CircuitInput> = HashMap::new();
    let mut gone: Vec<Uuid> = Vec::new();
    for f in batch
        .iter()
        .filter(|f| passed.contains(&f.completion.delivery_id))
    {
        let c = circuits.entry(f.endpoint_id).or_insert(CircuitInput {
            endpoint_id: f.endpoint_id,
            any_success: false,
            trailing_failures: 0,
        });
        if f.success {
            c.any_success = true;
            c.trailing_failures = 0;
        } else if f.failure {
            c.trailing_failures += 1;
        }
        if f.gone && !gone.contains(&f.endpoint_id) {
            gone.push(f.endpoint_id);
        }
    }
    let inputs: Vec<CircuitInput> = circuits.into_values().collect();
    let circuit = db::endpoints::record_circuit_transitions(
        &mut tx,
        &inputs,
        cfg.circuit_threshold,
        cfg.circuit_cooldown.as_secs_f64(),
    )
    .await?;
    if !gone.is_empty() {
        db::endpoints::disable(
            &mut tx,
            &gone,
            "receiver answered 410 Gone; change the WebhookEndpoint to re-enable it",
        )
        .await?;
    }
    tx.commit().await?;

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
            "failed" => tracing::info!(
                delivery = %c.delivery_id,
                endpoint = %f.endpoint_id,
                attempt = c.attempt,
                status_code = ?c.status_code,
                error = c.error.as_deref().unwrap_or(""),
                retry_at = ?c.retry_at,
                "delivery failed; retry scheduled"
            ),
            "dead" => tracing::info!(
                delivery = %c.delivery_id,
                endpoint = %f.endpoint_id,
                attempt = c.attempt,
                reason = c.dead_reason.as_deref().unwrap_or(""),
                "delivery dead; dead-lettered (replay it with POST /v1/deliveries/{{id}}/replay)"
            ),
            _ => {}
        }
    }
    for id in &circuit.opened {
        tracing::warn!(endpoint = %id, "circuit opened");
    }
    for id in &circuit.closed {
        tracing::info!(endpoint = %id, "circuit closed: the endpoint answered again");
    }
    metrics.circuits_opened.inc_by(circuit.opened.len() as u64);
    for id in &gone {
        tracing::warn!(endpoint = %id, "endpoint disabled: receiver answered 410 Gone");
    }
    metrics.endpoints_disabled.inc_by(gone.len() as u64);
    Ok(())
}
