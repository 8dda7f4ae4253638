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
