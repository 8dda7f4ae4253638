//! `hookd.consumers`: the parties a tenant's webhooks are for.

use chrono::{DateTime, Utc};
use sqlx::{PgConnection, PgPool};
use uuid::Uuid;

use super::{DbError, on};

#[derive(Debug, Clone, sqlx::FromRow)]
pub struct ConsumerRow {
    pub tenant: String,
    pub uid: String,
    pub name: Option<String>,
    /// The stored JSON object as Postgres prints it. Read as text, not decoded: jsonb keeps
    /// numbers exactly (`-1.7976931348623157e308` comes back as 309 digits), and decoding
    /// them into `serde_json::Value` fails, which made the consumer unreadable.
    pub metadata: String,
    /// live endpoints (not removed), at most 10,000 counted
    pub endpoint_count: i64,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
}

const COLUMNS: &str =
    "c.tenant, c.uid, c.name, c.metadata::text AS metadata, c.created_at, c.updated_at,
    (SELECT count(*) FROM (SELECT 1 FROM hookd.endpoints e
        WHERE e.tenant = c.tenant AND e.consumer = c.uid AND e.removed_at IS NULL
        LIMIT 10000) n) AS endpoint_count";

/// Creates or replaces the consumer's name and metadata. Returns the row and whether it
/// was created.
pub async fn upsert(
    pool: &PgPool,
    tenant: &str,
    uid: &str,
    name: Option<&str>,
    metadata: &serde_json::Value,
) -> Result<(ConsumerRow, bool), DbError> {
    let created: bool = sqlx::query_scalar(
        r#"
        INSERT INTO hookd.consumers AS c (tenant, uid, name, metadata)
        VALUES ($1, $2, $3, $4)
        ON CONFLICT (tenant, uid) DO UPDATE
            SET name = EXCLUDED.name, metadata = EXCLUDED.metadata, updated_at = now()
        RETURNING (xmax = 0)
        "#,
    )
    .bind(tenant)
    .bind(uid)
    .bind(name)
    .bind(sqlx::types::Json(metadata))
    .fetch_one(on(pool))
    .await?;
    let row = get(pool, tenant, uid)
        .await?
        .ok_or_else(|| DbError::Query(sqlx::Error::RowNotFound))?;
    Ok((row, created))
}

/// Makes sure the consumer exists (an endpoint or token names it before anyone described
/// it), leaving an existing one unchanged, and holds it for the caller's transaction: a
/// concurrent [`delete`] waits for that transaction, and then sees (and disables) what it
/// wrote. Without the lock a delete could miss an endpoint committed just after its
/// snapshot and leave it live for a consumer that no longer exists.
pub async fn ensure(conn: &mut PgConnection, tenant: &str, uid: &str) -> Result<(), DbError> {
    // a delete that commits between the insert and the hold removes the row again: insert
    // once more (the caller asked for the consumer to exist)
    for _ in 0..3 {
        sqlx::query(
            "INSERT INTO hookd.consumers (tenant, uid) VALUES ($1, $2) ON CONFLICT (tenant, uid) DO NOTHING",
        )
        .bind(tenant)
        .bind(uid)
        .execute(on(&mut *conn))
        .await?;
        if hold(conn, tenant, uid).await? {
            return Ok(());
        }
    }
    Err(DbError::Query(sqlx::Error::RowNotFound))
}

/// Holds an existing consumer for the caller's transaction (see [`ensure`]); false when
/// there is no such consumer.
pub async fn hold(conn: &mut PgConnection, tenant: &str, uid: &str) -> Result<bool, DbError> {
    let held: Option<i32> = sqlx::query_scalar(
        "SELECT 1 FROM hookd.consumers WHERE tenant = $1 AND uid = $2 FOR KEY SHARE",
    )
    .bind(tenant)
    .bind(uid)
    .fetch_optional(on(conn))
    .await?;
    Ok(held.is_some())
}

pub async fn get(pool: &PgPool, tenant: &str, uid: &str) -> Result<Option<ConsumerRow>, DbError> {
    Ok(
        sqlx::query_as::<_, ConsumerRow>(sqlx::AssertSqlSafe(format!(
            "SELECT {COLUMNS} FROM hookd.consumers c WHERE c.tenant = $1 AND c.uid = $2"
        )))
        .bind(tenant)
        .bind(uid)
        .fetch_optional(on(pool))
        .await?,
    )
}

/// One keyset page of a tenant's consumers by uid (`tenant` None: every tenant, by tenant
/// then uid; the cursor is then `tenant/uid`).
pub async fn list(
    pool: &PgPool,
    tenant: Option<&str>,
    after: Option<(&str, &str)>,
    limit: i64,
) -> Result<Vec<ConsumerRow>, DbError> {
    Ok(
        sqlx::query_as::<_, ConsumerRow>(sqlx::AssertSqlSafe(format!(
            "SELECT {COLUMNS} FROM hookd.consumers c
         WHERE ($1::text IS NULL OR c.tenant = $1)
           AND ($2::text IS NULL OR (c.tenant, c.uid) > ($2, $3))
         ORDER BY c.tenant, c.uid LIMIT $4"
        )))
        .bind(tenant)
        .bind(after.map(|a| a.0))
        .bind(after.map(|a| a.1))
        .bind(limit)
        .fetch_all(on(pool))
        .await?,
    )
}

/// What deleting a consumer did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Deleted {
    pub endpoints_disabled: i64,
    pub deliveries_cancelled: i64,
    pub tokens_revoked: i64,
}

/// Deletes the consumer: its endpoints are disabled (reason "consumer deleted"), their
/// open deliveries cancelled with that reason, its tokens revoked, in one transaction.
/// History stays readable by the tenant. None when there is no such consumer.
/// Run again after a deadlock or serialization failure (see [`super::commit_or_retry`]).
pub async fn delete(pool: &PgPool, tenant: &str, uid: &str) -> Result<Option<Deleted>, DbError> {
    let mut conn = pool.acquire().await?;
    let mut tries = 0;
    loop {
        let mut tx = super::begin_on(&mut conn).await?;
        let work = delete_once(&mut tx, tenant, uid).await;
        if let Some(done) =
            super::commit_or_retry(tx, work, &mut tries, "consumer deletion").await?
        {
            return Ok(done);
        }
    }
}

async fn delete_once(
    tx: &mut PgConnection,
    tenant: &str,
    uid: &str,
) -> Result<Option<Deleted>, DbError> {
    // First wait for every transaction holding the consumer (an endpoint being created, a
    // token being minted) to finish; the statement below then runs on a snapshot that
    // sees what they wrote.
    let exists: Option<i32> = sqlx::query_scalar(
        "SELECT 1 FROM hookd.consumers WHERE tenant = $1 AND uid = $2 FOR UPDATE",
    )
    .bind(tenant)
    .bind(uid)
    .fetch_optional(on(&mut *tx))
    .await?;
    if exists.is_none() {
        return Ok(None);
    }
    // its endpoints' open deliveries before their rows, in the order outcome batches
    // lock them (see `lock_open_deliveries`)
    let endpoints: Vec<Uuid> = sqlx::query_scalar(
        "SELECT id FROM hookd.endpoints WHERE tenant = $1 AND consumer = $2 AND removed_at IS NULL",
    )
    .bind(tenant)
    .bind(uid)
    .fetch_all(on(&mut *tx))
    .await?;
    super::lock_open_deliveries(tx, &endpoints).await?;
    let row: Option<(i64, i64, i64)> = sqlx::query_as(
        r#"
        WITH c AS (
            DELETE FROM hookd.consumers WHERE tenant = $1 AND uid = $2 RETURNING tenant, uid
        ), eps AS (
            SELECT e.id FROM hookd.endpoints e, c
            WHERE e.tenant = c.tenant AND e.consumer = c.uid AND e.removed_at IS NULL
        ), ep AS (
            UPDATE hookd.endpoints e
            SET state = 'disabled', state_reason = 'consumer ' || $2 || ' deleted',
                spec_fingerprint = NULL, consumer_deleted_at = now(), updated_at = now()
            FROM eps
            WHERE e.id = eps.id
            RETURNING e.id
        ), cancelled AS (
            -- by endpoint: a range of the claim index per endpoint, not a table scan
            UPDATE hookd.deliveries d
            SET status = 'cancelled', locked_by = NULL, claim_token = NULL, completed_at = now(),
                updated_at = now(), last_error = 'cancelled: consumer ' || $2 || ' deleted'
            FROM eps
            WHERE d.endpoint_id = eps.id AND d.status IN ('pending', 'in_progress', 'failed')
            RETURNING d.id
        ), revoked AS (
            UPDATE hookd.api_tokens t SET revoked_at = now()
            FROM c
            WHERE t.tenant = c.tenant AND t.consumer = c.uid AND t.revoked_at IS NULL
            RETURNING t.id
        )
        SELECT (SELECT count(*) FROM ep), (SELECT count(*) FROM cancelled),
               (SELECT count(*) FROM revoked)
        FROM c
        "#,
    )
    .bind(tenant)
    .bind(uid)
    .fetch_optional(on(&mut *tx))
    .await?;
    Ok(row.map(|(e, d, t)| Deleted {
        endpoints_disabled: e,
        deliveries_cancelled: d,
        tokens_revoked: t,
    }))
}
