//! `hookd.delivery_attempts`: the attempt log (written by `deliveries::complete`).

use chrono::{DateTime, Utc};
use sqlx::PgPool;
use uuid::Uuid;

use super::{DbError, on};
use crate::domain::ErrorClass;

#[derive(Debug, Clone, sqlx::FromRow)]
pub struct AttemptRow {
    pub attempt: i32,
    pub started_at: DateTime<Utc>,
    pub duration_ms: i32,
    pub status_code: Option<i32>,
    pub error_class: Option<ErrorClass>,
    pub error: Option<String>,
    pub response_snippet: Option<String>,
}

/// The latest `limit` entries of a delivery's attempt log, oldest first, and how many
/// older ones there are. The log grows with every replay (each resets the attempt counter,
/// not the log), so a read is bounded by `limit`, never by the delivery's history. Both
/// are range scans of `delivery_attempts_delivery`.
pub async fn latest_for_delivery(
    pool: &PgPool,
    delivery_id: Uuid,
    limit: i64,
) -> Result<(Vec<AttemptRow>, i64), DbError> {
    let mut rows = sqlx::query_as::<_, AttemptRow>(
        "SELECT attempt, started_at, duration_ms, status_code, error_class, error, response_snippet
         FROM hookd.delivery_attempts WHERE delivery_id = $1 ORDER BY id DESC LIMIT $2",
    )
    .bind(delivery_id)
    .bind(limit)
    .fetch_all(on(pool))
    .await?;
    rows.reverse();
    let older = if (rows.len() as i64) < limit {
        0
    } else {
        sqlx::query_scalar::<_, i64>(
            "SELECT count(*) - $2 FROM hookd.delivery_attempts WHERE delivery_id = $1",
        )
        .bind(delivery_id)
        .bind(limit)
        .fetch_one(on(pool))
        .await?
    };
    Ok((rows, older))
}

/// The whole attempt log of a delivery, oldest first (tests and tools; the API reads
/// [`latest_for_delivery`]).
pub async fn for_delivery(pool: &PgPool, delivery_id: Uuid) -> Result<Vec<AttemptRow>, DbError> {
    Ok(sqlx::query_as::<_, AttemptRow>(
        "SELECT attempt, started_at, duration_ms, status_code, error_class, error, response_snippet
         FROM hookd.delivery_attempts WHERE delivery_id = $1 ORDER BY id",
    )
    .bind(delivery_id)
    .fetch_all(on(pool))
    .await?)
}
