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
    /// which incarnation of the uid this is (see migration 0017)
    pub generation: i64,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
}

const COLUMNS: &str =
    "c.tenant, c.uid, c.name, c.metadata::text AS metadata, c.created_at, c.updated_at,
    c.generation,
    (SELECT count(*) FROM (SELECT 1 FROM hookd.endpoints e
        WHERE e.tenant = c.tenant AND e.consumer = c.uid AND e.consumer_generation = c.generation
          AND e.removed_at IS NULL
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
/// concurrent [`start_delete`] waits for that transaction, and then sees (and disables)
/// what it wrote. Without the lock a delete could miss an endpoint committed just after its
/// snapshot and leave it live for a consumer that no longer exists. Returns the consumer's
/// generation, which what the caller writes for it must carry.
pub async fn ensure(conn: &mut PgConnection, tenant: &str, uid: &str) -> Result<i64, DbError> {
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
        if let Some(generation) = hold(conn, tenant, uid).await? {
            return Ok(generation);
        }
    }
    Err(DbError::Query(sqlx::Error::RowNotFound))
}

/// Holds an existing consumer for the caller's transaction (see [`ensure`]) and returns
/// its generation; None when there is no such consumer.
pub async fn hold(
    conn: &mut PgConnection,
    tenant: &str,
    uid: &str,
) -> Result<Option<i64>, DbError> {
    Ok(sqlx::query_scalar(
        "SELECT generation FROM hookd.consumers WHERE tenant = $1 AND uid = $2 FOR KEY SHARE",
    )
    .bind(tenant)
    .bind(uid)
    .fetch_optional(on(conn))
    .await?)
}

/// Like [`ensure`], but holds the consumer exclusively against other endpoint creations
/// (`FOR NO KEY UPDATE`): two concurrent creates for one consumer count its endpoints one
/// after the other, so both cannot pass the cap. Tokens, deletes' waits and fan-out are not
/// held up by it. `create` false: an existing consumer only (a consumer token never brings
/// its consumer back).
pub async fn lock_for_endpoints(
    conn: &mut PgConnection,
    tenant: &str,
    uid: &str,
    create: bool,
) -> Result<Option<i64>, DbError> {
    for _ in 0..3 {
        if create {
            sqlx::query(
                "INSERT INTO hookd.consumers (tenant, uid) VALUES ($1, $2) ON CONFLICT (tenant, uid) DO NOTHING",
            )
            .bind(tenant)
            .bind(uid)
            .execute(on(&mut *conn))
            .await?;
        }
        let generation: Option<i64> = sqlx::query_scalar(
            "SELECT generation FROM hookd.consumers WHERE tenant = $1 AND uid = $2 FOR NO KEY UPDATE",
        )
        .bind(tenant)
        .bind(uid)
        .fetch_optional(on(&mut *conn))
        .await?;
        if generation.is_some() || !create {
            return Ok(generation);
        }
    }
    Err(DbError::Query(sqlx::Error::RowNotFound))
}

/// Live endpoints of one consumer generation, counted up to `cap` (call with the consumer
/// held by [`lock_for_endpoints`]).
pub async fn count_endpoints(
    conn: &mut PgConnection,
    tenant: &str,
    uid: &str,
    generation: i64,
    cap: i64,
) -> Result<i64, DbError> {
    Ok(sqlx::query_scalar(
        "SELECT count(*) FROM (SELECT 1 FROM hookd.endpoints
            WHERE tenant = $1 AND consumer = $2 AND consumer_generation = $3 AND removed_at IS NULL
            LIMIT $4) n",
    )
    .bind(tenant)
    .bind(uid)
    .bind(generation)
    .bind(cap)
    .fetch_one(on(conn))
    .await?)
}

/// A tenant's live API endpoints, counted up to `cap` under a per-tenant transaction lock,
/// so that two concurrent creates in one tenant cannot both pass the cap. The count is an
/// index-only scan of `endpoints_api_live`.
pub async fn lock_and_count_tenant_endpoints(
    conn: &mut PgConnection,
    tenant: &str,
    cap: i64,
) -> Result<i64, DbError> {
    sqlx::query("SELECT pg_advisory_xact_lock(hashtextextended('hookd.endpoints.cap\n' || $1, 0))")
        .bind(tenant)
        .execute(on(&mut *conn))
        .await?;
    Ok(sqlx::query_scalar(
        "SELECT count(*) FROM (SELECT 1 FROM hookd.endpoints
            WHERE tenant = $1 AND managed_by = 'api' AND removed_at IS NULL
              AND consumer_deleted_at IS NULL
            LIMIT $2) n",
    )
    .bind(tenant)
    .bind(cap)
    .fetch_one(on(conn))
    .await?)
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

/// A consumer deletion and how far it got.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct DeletionRow {
    pub id: Uuid,
    pub tenant: String,
    pub uid: String,
    pub generation: i64,
    /// `endpoints`, `deliveries` or `done`
    pub phase: String,
    pub tokens_revoked: i64,
    pub endpoints_disabled: i64,
    pub deliveries_cancelled: i64,
    pub requested_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
    pub completed_at: Option<DateTime<Utc>>,
}

const DELETION_COLUMNS: &str =
    "id, tenant, uid, generation, phase, tokens_revoked, endpoints_disabled,
    deliveries_cancelled, requested_at, updated_at, completed_at";

/// What [`start_delete`] did at once.
#[derive(Debug, Clone)]
pub struct DeleteStarted {
    pub deletion: DeletionRow,
    /// the tokens revoked, so the caller can drop them from its verification cache
    pub revoked_tokens: Vec<Uuid>,
}

/// Deletes the consumer, in one short transaction whatever its size: the row goes (a later
/// consumer with this uid is a new generation), its tokens are revoked, its subscriptions
/// removed (no new delivery is made for its endpoints from this commit on), and a deletion
/// is recorded for [`delete_step`] to disable its endpoints and cancel their open
/// deliveries in batches. None when there is no such consumer.
pub async fn start_delete(
    pool: &PgPool,
    tenant: &str,
    uid: &str,
) -> Result<Option<DeleteStarted>, DbError> {
    let mut tx = super::begin(pool).await?;
    // First wait for every transaction holding the consumer (an endpoint being created, a
    // token being minted) to finish: what they wrote is then visible to what follows.
    let generation: Option<i64> = sqlx::query_scalar(
        "SELECT generation FROM hookd.consumers WHERE tenant = $1 AND uid = $2 FOR UPDATE",
    )
    .bind(tenant)
    .bind(uid)
    .fetch_optional(on(&mut *tx))
    .await?;
    let Some(generation) = generation else {
        return Ok(None);
    };
    sqlx::query("DELETE FROM hookd.consumers WHERE tenant = $1 AND uid = $2")
        .bind(tenant)
        .bind(uid)
        .execute(on(&mut *tx))
        .await?;
    let revoked_tokens: Vec<Uuid> = sqlx::query_scalar(
        "UPDATE hookd.api_tokens SET revoked_at = now()
         WHERE tenant = $1 AND consumer = $2 AND revoked_at IS NULL RETURNING id",
    )
    .bind(tenant)
    .bind(uid)
    .fetch_all(on(&mut *tx))
    .await?;
    // one index range of (tenant, consumer): fan-out stops reaching these endpoints now,
    // before the batches disable them
    sqlx::query("DELETE FROM hookd.subscriptions WHERE tenant = $1 AND consumer = $2")
        .bind(tenant)
        .bind(uid)
        .execute(on(&mut *tx))
        .await?;
    let deletion = sqlx::query_as::<_, DeletionRow>(sqlx::AssertSqlSafe(format!(
        "INSERT INTO hookd.consumer_deletions (id, tenant, uid, generation, tokens_revoked)
         VALUES ($1, $2, $3, $4, $5) RETURNING {DELETION_COLUMNS}"
    )))
    .bind(Uuid::now_v7())
    .bind(tenant)
    .bind(uid)
    .bind(generation)
    .bind(revoked_tokens.len() as i64)
    .fetch_one(on(&mut *tx))
    .await?;
    tx.commit().await?;
    Ok(Some(DeleteStarted {
        deletion,
        revoked_tokens,
    }))
}

/// The outcome of one [`delete_step`].
#[derive(Debug, Clone)]
pub enum DeleteStep {
    /// a batch was done; the row says where the deletion stands
    Progress(DeletionRow),
    /// another process holds the deletion right now (it is making progress), or it is done
    Busy,
}

/// One bounded batch of a consumer deletion, in its own transaction: disables up to
/// `batch` of the consumer generation's endpoints, or (once all are disabled) cancels up to
/// `batch` open deliveries of theirs. The deletion row is locked for the batch, so two
/// processes resuming one deletion take turns; every batch is idempotent.
pub async fn delete_step(pool: &PgPool, id: Uuid, batch: i64) -> Result<DeleteStep, DbError> {
    super::retry_conflicts(|| async {
        let mut tx = super::begin(pool).await?;
        let row: Option<(String, String, i64, String, Option<Uuid>)> = sqlx::query_as(
            "SELECT tenant, uid, generation, phase, cursor_id FROM hookd.consumer_deletions
             WHERE id = $1 AND completed_at IS NULL FOR UPDATE SKIP LOCKED",
        )
        .bind(id)
        .fetch_optional(on(&mut *tx))
        .await?;
        let Some((tenant, uid, generation, phase, cursor)) = row else {
            return Ok(DeleteStep::Busy);
        };
        if phase == "endpoints" {
            let (n, last): (i64, Option<Uuid>) = sqlx::query_as(
                r#"
                WITH eps AS (
                    SELECT id FROM hookd.endpoints
                    WHERE tenant = $1 AND consumer = $2 AND consumer_generation = $3
                      AND removed_at IS NULL AND ($4::uuid IS NULL OR id > $4)
                    ORDER BY id LIMIT $5
                    FOR UPDATE
                ), upd AS (
                    UPDATE hookd.endpoints e
                    SET state = 'disabled', state_reason = 'consumer ' || $2 || ' deleted',
                        spec_fingerprint = NULL,
                        consumer_deleted_at = coalesce(e.consumer_deleted_at, now()),
                        updated_at = now()
                    FROM eps WHERE e.id = eps.id
                    RETURNING e.id
                )
                SELECT count(*), max(id::text)::uuid FROM upd
                "#,
            )
            .bind(&tenant)
            .bind(&uid)
            .bind(generation)
            .bind(cursor)
            .bind(batch)
            .fetch_one(on(&mut *tx))
            .await?;
            let (next_phase, next_cursor) = if n < batch {
                ("deliveries", None)
            } else {
                ("endpoints", last)
            };
            sqlx::query(
                "UPDATE hookd.consumer_deletions SET phase = $2, cursor_id = $3,
                    endpoints_disabled = endpoints_disabled + $4, updated_at = now()
                 WHERE id = $1",
            )
            .bind(id)
            .bind(next_phase)
            .bind(next_cursor)
            .bind(n)
            .execute(on(&mut *tx))
            .await?;
        } else {
            // the next `batch` endpoints after the cursor, and up to `batch` of their open
            // deliveries; the cursor moves past them once they have none left
            let eps: Vec<Uuid> = sqlx::query_scalar(
                "SELECT id FROM hookd.endpoints
                 WHERE tenant = $1 AND consumer = $2 AND consumer_generation = $3
                   AND removed_at IS NULL AND ($4::uuid IS NULL OR id > $4)
                 ORDER BY id LIMIT $5",
            )
            .bind(&tenant)
            .bind(&uid)
            .bind(generation)
            .bind(cursor)
            .bind(batch)
            .fetch_all(on(&mut *tx))
            .await?;
            let cancelled: i64 = if eps.is_empty() {
                0
            } else {
                sqlx::query_scalar(
                    r#"
                    WITH target AS (
                        SELECT id FROM hookd.deliveries
                        WHERE endpoint_id = ANY($1) AND status IN ('pending', 'in_progress', 'failed')
                        LIMIT $2
                        FOR UPDATE SKIP LOCKED
                    ), upd AS (
                        UPDATE hookd.deliveries d
                        SET status = 'cancelled', locked_by = NULL, claim_token = NULL,
                            completed_at = now(), updated_at = now(),
                            last_error = 'cancelled: consumer ' || $3 || ' deleted'
                        FROM target WHERE d.id = target.id
                        RETURNING d.id
                    )
                    SELECT count(*) FROM upd
                    "#,
                )
                .bind(&eps)
                .bind(batch)
                .bind(&uid)
                .fetch_one(on(&mut *tx))
                .await?
            };
            // A delivery locked right now (an outcome batch, a claim) was skipped, not
            // cancelled: while one is left open the cursor stays, and the next step takes
            // it again. Moving on lost it: open for good under a disabled endpoint.
            let skipped: bool = if eps.is_empty() {
                false
            } else {
                sqlx::query_scalar(
                    "SELECT EXISTS (SELECT 1 FROM hookd.deliveries
                     WHERE endpoint_id = ANY($1) AND status IN ('pending', 'in_progress', 'failed'))",
                )
                .bind(&eps)
                .fetch_one(on(&mut *tx))
                .await?
            };
            let cleared = cancelled < batch && !skipped;
            // the last endpoints (fewer than a batch), none of their deliveries left open
            let done = (eps.len() as i64) < batch && cleared;
            let next_cursor = if cleared {
                eps.last().copied().or(cursor)
            } else {
                cursor
            };
            sqlx::query(
                "UPDATE hookd.consumer_deletions SET cursor_id = $2,
                    deliveries_cancelled = deliveries_cancelled + $3, updated_at = now(),
                    phase = CASE WHEN $4 THEN 'done' ELSE phase END,
                    completed_at = CASE WHEN $4 THEN now() END
                 WHERE id = $1",
            )
            .bind(id)
            .bind(next_cursor)
            .bind(cancelled)
            .bind(done)
            .execute(on(&mut *tx))
            .await?;
        }
        let row = sqlx::query_as::<_, DeletionRow>(sqlx::AssertSqlSafe(format!(
            "SELECT {DELETION_COLUMNS} FROM hookd.consumer_deletions WHERE id = $1"
        )))
        .bind(id)
        .fetch_one(on(&mut *tx))
        .await?;
        tx.commit().await?;
        Ok(DeleteStep::Progress(row))
    })
    .await
}

/// A deletion, if `tenant` (None: any) may see it.
pub async fn get_deletion(
    pool: &PgPool,
    id: Uuid,
    tenant: Option<&str>,
) -> Result<Option<DeletionRow>, DbError> {
    Ok(
        sqlx::query_as::<_, DeletionRow>(sqlx::AssertSqlSafe(format!(
            "SELECT {DELETION_COLUMNS} FROM hookd.consumer_deletions
         WHERE id = $1 AND ($2::text IS NULL OR tenant = $2)"
        )))
        .bind(id)
        .bind(tenant)
        .fetch_optional(on(pool))
        .await?,
    )
}

/// Deletions not finished, oldest first (to resume those whose process went away).
pub async fn open_deletions(pool: &PgPool, limit: i64) -> Result<Vec<Uuid>, DbError> {
    Ok(sqlx::query_scalar(
        "SELECT id FROM hookd.consumer_deletions WHERE completed_at IS NULL
         ORDER BY requested_at LIMIT $1",
    )
    .bind(limit)
    .fetch_all(on(pool))
    .await?)
}
