//! `hookd.events`: the enqueue statement (event rows + fan-out into deliveries) and reads.

use chrono::{DateTime, Utc};
use sqlx::{PgConnection, PgPool};
use uuid::Uuid;

use super::DbError;

/// One event to insert. `id` is minted by the caller (UUIDv7) so that inserted rows can
/// be matched back to requests without relying on result order.
#[derive(Debug, Clone)]
pub struct NewEvent {
    pub id: Uuid,
    pub tenant: String,
    pub event_type: String,
    pub payload: String,
    pub idempotency_key: Option<String>,
    pub request_hash: Vec<u8>,
}

/// An event as stored, with its delivery ids (an existing event found by idempotency key).
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct EventIds {
    pub event_id: Uuid,
    pub delivery_ids: Vec<Uuid>,
}

#[derive(Debug, Clone, sqlx::FromRow)]
pub struct ExistingByKey {
    pub tenant: String,
    pub idempotency_key: String,
    pub event_id: Uuid,
    pub request_hash: Vec<u8>,
    pub delivery_ids: Vec<Uuid>,
}

/// Inserts events and fans each out to its tenant's non-disabled endpoints whose
/// event-type filter matches, in one statement. Events whose idempotency key already
/// exists are skipped (ON CONFLICT DO NOTHING, which also waits for a concurrent
/// inserter of the same key to finish, so concurrent duplicates end as one event).
/// Returns the inserted events only.
pub async fn insert_with_fanout(
    conn: &mut PgConnection,
    events: &[NewEvent],
) -> Result<Vec<EventIds>, DbError> {
    let mut ids = Vec::with_capacity(events.len());
    let mut tenants = Vec::with_capacity(events.len());
    let mut types = Vec::with_capacity(events.len());
    let mut payloads = Vec::with_capacity(events.len());
    let mut keys = Vec::with_capacity(events.len());
    let mut hashes = Vec::with_capacity(events.len());
    for e in events {
        ids.push(e.id);
        tenants.push(e.tenant.as_str());
        types.push(e.event_type.as_str());
        payloads.push(e.payload.as_str());
        keys.push(e.idempotency_key.as_deref());
        hashes.push(e.request_hash.as_slice());
    }
    let rows = sqlx::query_as::<_, EventIds>(
        r#"
        WITH input AS (
            SELECT * FROM unnest($1::uuid[], $2::text[], $3::text[], $4::text[], $5::text[], $6::bytea[])
                AS i(id, tenant, event_type, payload, idempotency_key, request_hash)
        ), ev AS (
            INSERT INTO hookd.events (id, tenant, event_type, payload, idempotency_key, request_hash)
            -- a stable key order keeps two concurrent groups sharing keys from deadlocking
            SELECT id, tenant, event_type, payload, idempotency_key, request_hash
            FROM input ORDER BY tenant, idempotency_key NULLS LAST
            ON CONFLICT (tenant, idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING
            RETURNING id, tenant, event_type
        ), dl AS (
            INSERT INTO hookd.deliveries (id, event_id, endpoint_id, tenant)
            SELECT hookd.uuid_v7(), ev.id, e.id, ev.tenant
            FROM ev JOIN hookd.endpoints e
              ON e.tenant = ev.tenant AND e.state <> 'disabled'
             AND hookd.event_type_matches(e.event_types, ev.event_type)
            RETURNING id, event_id
        )
        SELECT ev.id AS event_id,
               coalesce(array_agg(dl.id ORDER BY dl.id) FILTER (WHERE dl.id IS NOT NULL), '{}') AS delivery_ids
        FROM ev LEFT JOIN dl ON dl.event_id = ev.id
        GROUP BY ev.id
        "#,
    )
    .bind(&ids)
    .bind(&tenants)
    .bind(&types)
    .bind(&payloads)
    .bind(&keys)
    .bind(&hashes)
    .fetch_all(conn)
    .await?;
    Ok(rows)
}

/// The server session an enqueue transaction runs in, so that a lost COMMIT answer can be
/// investigated from another connection (see [`settle_commit`]).
#[derive(Debug, Clone, Copy)]
pub struct Session {
    pid: i32,
    backend_start: DateTime<Utc>,
}

/// First statement of every enqueue transaction: commit synchronously whatever the
/// server's default (the commit backs a 2xx, invariant 9), bound every lock wait, and
/// note the session.
pub async fn begin_enqueue(
    conn: &mut PgConnection,
    lock_timeout: std::time::Duration,
) -> Result<Session, DbError> {
    let (pid, backend_start): (i32, DateTime<Utc>) = sqlx::query_as(
        r#"
        SELECT pg_backend_pid(),
               (SELECT backend_start FROM pg_stat_activity WHERE pid = pg_backend_pid())
        FROM (SELECT set_config('synchronous_commit', 'on', true),
                     set_config('lock_timeout', $1, true)) s
        "#,
    )
    .bind(format!("{}ms", lock_timeout.as_millis().max(1)))
    .fetch_one(conn)
    .await?;
    Ok(Session { pid, backend_start })
}

/// Idempotency keys are claimed with a transaction-scoped advisory lock on
/// hash(tenant, key), taken the same way by `hookd.enqueue()`, so that whoever holds a key
/// can be detected without waiting on the unique index (which would hold a whole group).
/// Try-locks every key; returns the keys someone else holds.
pub async fn try_lock_keys(
    conn: &mut PgConnection,
    keys: &[(String, String)],
) -> Result<Vec<(String, String)>, DbError> {
    if keys.is_empty() {
        return Ok(Vec::new());
    }
    let tenants: Vec<&str> = keys.iter().map(|k| k.0.as_str()).collect();
    let idem: Vec<&str> = keys.iter().map(|k| k.1.as_str()).collect();
    Ok(sqlx::query_as(
        r#"
        SELECT t, k FROM unnest($1::text[], $2::text[]) AS u(t, k)
        WHERE NOT pg_try_advisory_xact_lock(hashtextextended(t || E'\n' || k, 0))
        "#,
    )
    .bind(&tenants)
    .bind(&idem)
    .fetch_all(conn)
    .await?)
}

/// Takes the key locks, waiting up to the transaction's `lock_timeout` (SQLSTATE 55P03
/// when it expires). Sorted, so two batches sharing keys cannot deadlock.
pub async fn lock_keys(conn: &mut PgConnection, keys: &[(String, String)]) -> Result<(), DbError> {
    if keys.is_empty() {
        return Ok(());
    }
    let tenants: Vec<&str> = keys.iter().map(|k| k.0.as_str()).collect();
    let idem: Vec<&str> = keys.iter().map(|k| k.1.as_str()).collect();
    sqlx::query(
        r#"
        SELECT pg_advisory_xact_lock(h) FROM (
            SELECT DISTINCT hashtextextended(t || E'\n' || k, 0) AS h
            FROM unnest($1::text[], $2::text[]) AS u(t, k) ORDER BY 1) s
        "#,
    )
    .bind(&tenants)
    .bind(&idem)
    .execute(conn)
    .await?;
    Ok(())
}

/// What a fresh connection found out about a commit whose answer was lost.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Settled {
    Committed,
    NotCommitted,
}

/// Finds out whether the transaction of `session` committed, after its connection failed
/// at COMMIT. Waits until that session has ended (until then the commit may still land),
/// then looks for the event ids it inserted: a transaction commits all of them or none.
/// Connection failures are retried until `within` has passed; then the error is returned
/// and the outcome is unknown.
pub async fn settle_commit(
    pool: &PgPool,
    session: Session,
    event_ids: &[Uuid],
    within: std::time::Duration,
) -> Result<Settled, DbError> {
    if event_ids.is_empty() {
        // nothing of its own to write: every message was an idempotent repeat
        return Ok(Settled::Committed);
    }
    let deadline = tokio::time::Instant::now() + within;
    loop {
        let attempt: Result<Option<bool>, DbError> = async {
            let mut conn = pool.acquire().await?;
            let alive: bool = sqlx::query_scalar(
                "SELECT EXISTS (SELECT 1 FROM pg_stat_activity WHERE pid = $1 AND backend_start = $2)",
            )
            .bind(session.pid)
            .bind(session.backend_start)
            .fetch_one(&mut *conn)
            .await?;
            if alive {
                return Ok(None);
            }
            let found: bool =
                sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM hookd.events WHERE id = ANY($1))")
                    .bind(event_ids)
                    .fetch_one(&mut *conn)
                    .await?;
            Ok(Some(found))
        }
        .await;
        match attempt {
            Ok(Some(true)) => return Ok(Settled::Committed),
            Ok(Some(false)) => return Ok(Settled::NotCommitted),
            Ok(None) | Err(_) if tokio::time::Instant::now() < deadline => {
                tokio::time::sleep(std::time::Duration::from_millis(25)).await;
            }
            Ok(None) => {
                return Err(DbError::Query(sqlx::Error::Protocol(
                    "the committing session is still running".into(),
                )));
            }
            Err(e) => return Err(e),
        }
    }
}

/// Existing events for (tenant, idempotency key) pairs, with their deliveries.
pub async fn find_by_keys(
    conn: &mut PgConnection,
    keys: &[(String, String)],
) -> Result<Vec<ExistingByKey>, DbError> {
    let tenants: Vec<&str> = keys.iter().map(|k| k.0.as_str()).collect();
    let idem: Vec<&str> = keys.iter().map(|k| k.1.as_str()).collect();
    let rows = sqlx::query_as::<_, ExistingByKey>(
        r#"
        SELECT e.tenant, e.idempotency_key, e.id AS event_id, e.request_hash,
               coalesce(array_agg(d.id ORDER BY d.id) FILTER (WHERE d.id IS NOT NULL), '{}') AS delivery_ids
        FROM hookd.events e
        LEFT JOIN hookd.deliveries d ON d.event_id = e.id
        WHERE (e.tenant, e.idempotency_key) IN (SELECT * FROM unnest($1::text[], $2::text[]))
          AND e.idempotency_key IS NOT NULL
        GROUP BY e.id
        "#,
    )
    .bind(&tenants)
    .bind(&idem)
    .fetch_all(conn)
    .await?;
    Ok(rows)
}

#[derive(Debug, Clone, sqlx::FromRow)]
pub struct EventRow {
    pub id: Uuid,
    pub tenant: String,
    pub event_type: String,
    pub payload: String,
    pub idempotency_key: Option<String>,
    pub created_at: DateTime<Utc>,
}

/// The event with this id; with `tenant` set, only if it is that tenant's.
pub async fn get(
    pool: &PgPool,
    id: Uuid,
    tenant: Option<&str>,
) -> Result<Option<EventRow>, DbError> {
    Ok(sqlx::query_as::<_, EventRow>(
        "SELECT id, tenant, event_type, payload, idempotency_key, created_at FROM hookd.events
         WHERE id = $1 AND ($2::text IS NULL OR tenant = $2)",
    )
    .bind(id)
    .bind(tenant)
    .fetch_optional(pool)
    .await?)
}
