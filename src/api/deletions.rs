//! Consumer deletions after their request: the batches that disable a deleted consumer's
//! endpoints and cancel their open deliveries (`db::consumers::delete_step`), run in a
//! task of the API process that took the delete, and resumed by any API process whose
//! sweep finds one unfinished (its process died, or the database was briefly away).

use std::time::Duration;

use sqlx::PgPool;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use crate::db::consumers::{self, DeleteStep};

/// Runs a deletion's batches until it is done, or another process holds it (that one is
/// making progress), or the database keeps failing (the sweep takes it up again later).
pub async fn finish(pool: PgPool, id: Uuid, batch: i64) {
    let mut failures = 0;
    let mut last = None;
    loop {
        match consumers::delete_step(&pool, id, batch).await {
            Ok(DeleteStep::Progress(row)) => {
                failures = 0;
                let counts = (row.endpoints_disabled, row.deliveries_cancelled);
                if last == Some(counts) && row.completed_at.is_none() {
                    // nothing moved: what is left is locked for the moment (a batch of
                    // outcomes); give it time rather than spin
                    tokio::time::sleep(Duration::from_millis(250)).await;
                }
                last = Some(counts);
                if row.completed_at.is_some() {
                    tracing::info!(
                        deletion = %id, tenant = %row.tenant, consumer = %row.uid,
                        endpoints_disabled = row.endpoints_disabled,
                        deliveries_cancelled = row.deliveries_cancelled,
                        "consumer deletion finished"
                    );
                    return;
                }
            }
            Ok(DeleteStep::Busy) => return,
            Err(e) => {
                failures += 1;
                tracing::warn!(deletion = %id, error = %e, "consumer deletion batch failed");
                if failures >= 5 {
                    return;
                }
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        }
    }
}

/// How often an API process looks for deletions left unfinished.
const SWEEP_EVERY: Duration = Duration::from_secs(30);

/// Resumes unfinished deletions now and then, until `shutdown`.
pub async fn sweep(pool: PgPool, batch: i64, shutdown: CancellationToken) {
    loop {
        match consumers::open_deletions(&pool, 16).await {
            Ok(ids) => {
                for id in ids {
                    tokio::select! {
                        _ = shutdown.cancelled() => return,
                        _ = finish(pool.clone(), id, batch) => {}
                    }
                }
            }
            Err(e) => tracing::warn!(error = %e, "cannot look for unfinished consumer deletions"),
        }
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(SWEEP_EVERY) => {}
        }
    }
}
