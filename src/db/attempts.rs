//! `hookd.delivery_attempts`: the attempt log (written by `deliveries::complete`).

use chrono::{DateTime, Utc};
use sqlx::PgPool;
use uuid::Uuid;

use super::DbError;

#[derive(Debug, Clone, sqlx::FromRow)]
pub struct AttemptRow {
    pub attempt: i32,
    pub started_at: DateTime<Utc>,
    pub duration_ms: i32,
    pub status_code: Option<i32>,
    pub error_class: Option<String>,
    pub error: Option<String>,
    pub response_snippet: Option<String>,
}

pub async fn for_delivery(pool: &PgPool, delivery_id: Uuid) -> Result<Vec<AttemptRow>, DbError> {
    Ok(sqlx::query_as::<_, AttemptRow>(
        "SELECT attempt, started_at, duration_ms, status_code, error_class, error, response_snippet
         FROM hookd.delivery_attempts WHERE delivery_id = $1 ORDER BY id",
    )
    .bind(delivery_id)
    .fetch_all(pool)
    .await?)
}
