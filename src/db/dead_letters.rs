//! `hookd.dead_letters`: exhausted deliveries (written by `deliveries::complete`,
//! removed by replay).

use chrono::{DateTime, Utc};
use sqlx::PgPool;
use uuid::Uuid;

use super::{DbError, on};

#[derive(Debug, Clone, sqlx::FromRow)]
pub struct DeadLetterRow {
    pub delivery_id: Uuid,
    pub endpoint_id: Uuid,
    pub tenant: String,
    pub reason: String,
    pub attempts: i32,
    pub dead_at: DateTime<Utc>,
    pub event_id: Uuid,
}

/// A page of dead letters, oldest first, keyset-paginated on (dead_at, delivery_id) so a
/// page costs the same wherever it starts.
#[derive(Debug, Clone, Default)]
pub struct DeadLetterQuery {
    pub tenant: Option<String>,
    /// only this consumer's (a consumer token)
    pub consumer: Option<String>,
    /// a consumer token's id floor (`Audience::since`)
    pub since: Option<Uuid>,
    pub endpoint_id: Option<Uuid>,
    pub after: Option<(DateTime<Utc>, Uuid)>,
    pub limit: i64,
}

pub async fn list(pool: &PgPool, q: &DeadLetterQuery) -> Result<Vec<DeadLetterRow>, DbError> {
    let (after_at, after_id) = q.after.unzip();
    Ok(sqlx::query_as::<_, DeadLetterRow>(
        r#"
        SELECT dl.delivery_id, dl.endpoint_id, dl.tenant, dl.reason, dl.attempts, dl.dead_at, d.event_id
        FROM hookd.dead_letters dl JOIN hookd.deliveries d ON d.id = dl.delivery_id
        WHERE ($1::text IS NULL OR dl.tenant = $1)
          AND ($2::uuid IS NULL OR dl.endpoint_id = $2)
          AND ($3::timestamptz IS NULL OR (dl.dead_at, dl.delivery_id) > ($3, $4))
          AND ($6::text IS NULL OR d.consumer = $6)
          AND ($7::uuid IS NULL OR dl.delivery_id >= $7)
        ORDER BY dl.dead_at, dl.delivery_id
        LIMIT $5
        "#,
    )
    .bind(&q.tenant)
    .bind(q.endpoint_id)
    .bind(after_at)
    .bind(after_id)
    .bind(q.limit)
    .bind(&q.consumer)
    .bind(q.since)
    .fetch_all(on(pool))
    .await?)
}

/// Dead letters of one endpoint (for the controller's status).
pub async fn count_for_endpoint(pool: &PgPool, endpoint_id: Uuid) -> Result<i64, DbError> {
    Ok(
        sqlx::query_scalar("SELECT count(*) FROM hookd.dead_letters WHERE endpoint_id = $1")
            .bind(endpoint_id)
            .fetch_one(on(pool))
            .await?,
    )
}
