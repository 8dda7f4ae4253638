//! `hookd.sources` and `hookd.source_secrets`: inbound sources and their sealed
//! verification secrets.

use chrono::{DateTime, Utc};
use sqlx::{PgConnection, PgPool};
use uuid::Uuid;

use super::{DbError, on};
use crate::domain::ManagedBy;

/// A source as the API shows it and the inbound route uses it.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct SourceRow {
    pub id: Uuid,
    pub name: String,
    pub tenant: String,
    pub consumer: Option<String>,
    pub provider: String,
    pub hmac: Option<sqlx::types::Json<serde_json::Value>>,
    pub event_type_prefix: String,
    pub max_body_bytes: i32,
    pub description: Option<String>,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
    /// a WebhookSource object, or the API (migration 0027)
    pub managed_by: ManagedBy,
}

const COLUMNS: &str = "id, name, tenant, consumer, provider, hmac, event_type_prefix, \
    max_body_bytes, description, created_at, updated_at, managed_by";

/// A new source with its first secret, sealed by the caller.
#[derive(Debug, Clone)]
pub struct NewSource<'a> {
    pub id: Uuid,
    pub name: &'a str,
    pub tenant: &'a str,
    pub consumer: Option<&'a str>,
    pub provider: &'a str,
    pub hmac: Option<serde_json::Value>,
    pub event_type_prefix: &'a str,
    pub max_body_bytes: i32,
    pub description: Option<&'a str>,
    pub key_id: &'a str,
    pub ciphertext: &'a [u8],
    /// the namespace of the WebhookSource object that declares it (its object name is the
    /// source's); `None`: made through the API
    pub declared_in: Option<&'a str>,
}

/// How many sources `tenant` has, counted under a lock that makes two creates of one
/// tenant count one after the other (held to the end of the caller's transaction).
pub async fn lock_and_count(conn: &mut PgConnection, tenant: &str) -> Result<i64, DbError> {
    sqlx::query("SELECT pg_advisory_xact_lock(hashtextextended('hookd.sources:' || $1, 0))")
        .bind(tenant)
        .execute(on(&mut *conn))
        .await?;
    Ok(
        sqlx::query_scalar("SELECT count(*) FROM hookd.sources WHERE tenant = $1")
            .bind(tenant)
            .fetch_one(on(&mut *conn))
            .await?,
    )
}

/// Inserts the source and its current secret, and returns it. `None`: the name is taken
/// (by any tenant: it is the route's key), and nothing was written.
pub async fn insert(
    conn: &mut PgConnection,
    s: &NewSource<'_>,
) -> Result<Option<SourceRow>, DbError> {
    let inserted = sqlx::query_as::<_, SourceRow>(sqlx::AssertSqlSafe(format!(
        "INSERT INTO hookd.sources (id, name, tenant, consumer, provider, hmac,
                                    event_type_prefix, max_body_bytes, description,
                                    managed_by, k8s_namespace, k8s_name)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9,
                 CASE WHEN $10::text IS NULL THEN 'api' ELSE 'kubernetes' END,
                 $10, CASE WHEN $10::text IS NULL THEN NULL ELSE $2 END)
         ON CONFLICT (name) DO NOTHING
         RETURNING {COLUMNS}"
    )))
    .bind(s.id)
    .bind(s.name)
    .bind(s.tenant)
    .bind(s.consumer)
    .bind(s.provider)
    .bind(s.hmac.as_ref().map(sqlx::types::Json))
    .bind(s.event_type_prefix)
    .bind(s.max_body_bytes)
    .bind(s.description)
    .bind(s.declared_in)
    .fetch_optional(on(&mut *conn))
    .await?;
    let Some(row) = inserted else {
        return Ok(None);
    };
    sqlx::query(
        "INSERT INTO hookd.source_secrets (source_id, version, key_id, ciphertext)
         VALUES ($1, 1, $2, $3)",
    )
    .bind(s.id)
    .bind(s.key_id)
    .bind(s.ciphertext)
    .execute(on(&mut *conn))
    .await?;
    Ok(Some(row))
}

/// The tenant's sources in name order, after `after`, at most `limit`.
pub async fn list(
    pool: &PgPool,
    tenant: Option<&str>,
    after: Option<&str>,
    limit: i64,
) -> Result<Vec<SourceRow>, DbError> {
    Ok(sqlx::query_as::<_, SourceRow>(sqlx::AssertSqlSafe(format!(
        "SELECT {COLUMNS} FROM hookd.sources
         WHERE ($1::text IS NULL OR tenant = $1) AND ($2::text IS NULL OR name > $2)
         ORDER BY name LIMIT $3"
    )))
    .bind(tenant)
    .bind(after)
    .bind(limit)
    .fetch_all(on(pool))
    .await?)
}

/// The source named `name`; with `tenant`, only if it is that tenant's (another tenant's
/// source is as absent as an unknown name).
pub async fn get(
    pool: &PgPool,
    name: &str,
    tenant: Option<&str>,
) -> Result<Option<SourceRow>, DbError> {
    Ok(sqlx::query_as::<_, SourceRow>(sqlx::AssertSqlSafe(format!(
        "SELECT {COLUMNS} FROM hookd.sources
         WHERE name = $1 AND ($2::text IS NULL OR tenant = $2)"
    )))
    .bind(name)
    .bind(tenant)
    .fetch_optional(on(pool))
    .await?)
}

/// A sealed secret that verifies now.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct SealedSecret {
    pub key_id: String,
    pub ciphertext: Vec<u8>,
    /// when it stops verifying (a rotated-out secret in its grace period); `None`: it is
    /// the current one
    pub not_after: Option<DateTime<Utc>>,
}

#[derive(sqlx::FromRow)]
struct IngestRow {
    #[sqlx(flatten)]
    source: SourceRow,
    key_ids: Vec<String>,
    ciphertexts: Vec<Vec<u8>>,
    not_afters: Vec<Option<DateTime<Utc>>>,
}

/// The source named `name` with the secrets that verify now (current first), in one
/// statement: what the inbound route verifies with (kept between requests by
/// `inbound::cache`).
pub async fn for_ingest(
    pool: &PgPool,
    name: &str,
) -> Result<Option<(SourceRow, Vec<SealedSecret>)>, DbError> {
    let row = sqlx::query_as::<_, IngestRow>(sqlx::AssertSqlSafe(format!(
        "SELECT {COLUMNS}, k.key_ids, k.ciphertexts, k.not_afters
         FROM hookd.sources s
         CROSS JOIN LATERAL (
             SELECT coalesce(array_agg(ss.key_id ORDER BY ss.version DESC), '{{}}') AS key_ids,
                    coalesce(array_agg(ss.ciphertext ORDER BY ss.version DESC), '{{}}') AS ciphertexts,
                    coalesce(array_agg(ss.not_after ORDER BY ss.version DESC), '{{}}') AS not_afters
             FROM hookd.source_secrets ss
             WHERE ss.source_id = s.id AND (ss.not_after IS NULL OR ss.not_after > now())) k
         WHERE s.name = $1"
    )))
    .bind(name)
    .fetch_optional(on(pool))
    .await?;
    Ok(row.map(|r| {
        let secrets = r
            .key_ids
            .into_iter()
            .zip(r.ciphertexts)
            .zip(r.not_afters)
            .map(|((key_id, ciphertext), not_after)| SealedSecret {
                key_id,
                ciphertext,
                not_after,
            })
            .collect();
        (r.source, secrets)
    }))
}

/// Deletes the API's source named `name` of `tenant` with its secrets; the events it took
/// in stay. Returns whether there was one (a declared source is its object's to delete).
pub async fn delete(pool: &PgPool, name: &str, tenant: Option<&str>) -> Result<bool, DbError> {
    let r = sqlx::query(
        "DELETE FROM hookd.sources
         WHERE name = $1 AND ($2::text IS NULL OR tenant = $2) AND managed_by = 'api'",
    )
    .bind(name)
    .bind(tenant)
    .execute(on(pool))
    .await?;
    Ok(r.rows_affected() > 0)
}

/// Most secrets of one source that verify at once (the current one and those in their
/// grace period): each is one more HMAC per request, and a loop of rotations must not
/// make a source's every request cost more.
pub const MAX_SOURCE_SECRETS: i64 = 4;

/// Makes a new sealed secret current for the source `id`: the current one verifies for
/// `grace_secs` more, expired ones are dropped, and past [`MAX_SOURCE_SECRETS`] the oldest
/// in grace stop at once. Rotations of one source run one at a time (the source row is
/// locked). Returns when the previous secret stops verifying.
pub async fn rotate(
    conn: &mut PgConnection,
    id: Uuid,
    key_id: &str,
    ciphertext: &[u8],
    grace_secs: i32,
) -> Result<DateTime<Utc>, DbError> {
    sqlx::query("SELECT 1 FROM hookd.sources WHERE id = $1 FOR NO KEY UPDATE")
        .bind(id)
        .execute(on(&mut *conn))
        .await?;
    let until: DateTime<Utc> = sqlx::query_scalar(
        r#"
        WITH pruned AS (
            DELETE FROM hookd.source_secrets
            WHERE source_id = $1 AND not_after IS NOT NULL AND not_after <= now()
        ), retired AS (
            UPDATE hookd.source_secrets SET not_after = now() + make_interval(secs => $4)
            WHERE source_id = $1 AND not_after IS NULL
        ), ins AS (
            INSERT INTO hookd.source_secrets (source_id, version, key_id, ciphertext)
            SELECT $1, coalesce(max(version), 0) + 1, $2, $3
            FROM hookd.source_secrets WHERE source_id = $1
        )
        SELECT now() + make_interval(secs => $4)
        "#,
    )
    .bind(id)
    .bind(key_id)
    .bind(ciphertext)
    .bind(grace_secs)
    .fetch_one(on(&mut *conn))
    .await?;
    // the statement's parts see one snapshot, so the bound is kept in a second one: the
    // oldest secrets in grace beyond the most allowed stop now
    sqlx::query(
        "UPDATE hookd.source_secrets SET not_after = now()
         WHERE source_id = $1 AND not_after > now()
           AND version NOT IN (SELECT version FROM hookd.source_secrets
                               WHERE source_id = $1 AND (not_after IS NULL OR not_after > now())
                               ORDER BY version DESC LIMIT $2)",
    )
    .bind(id)
    .bind(MAX_SOURCE_SECRETS)
    .execute(on(&mut *conn))
    .await?;
    Ok(until)
}

/// A change to a source; `None` leaves a field as it is (`Some(None)` clears it).
#[derive(Debug, Clone, Default)]
pub struct SourcePatch {
    pub consumer: Option<Option<String>>,
    pub event_type_prefix: Option<String>,
    pub max_body_bytes: Option<i32>,
    pub description: Option<Option<String>>,
    pub hmac: Option<serde_json::Value>,
}

/// Applies `patch` to the source named `name` of `tenant`; None when there is none.
pub async fn patch(
    pool: &PgPool,
    name: &str,
    tenant: Option<&str>,
    p: &SourcePatch,
) -> Result<Option<SourceRow>, DbError> {
    Ok(sqlx::query_as::<_, SourceRow>(sqlx::AssertSqlSafe(format!(
        "UPDATE hookd.sources SET
            consumer = CASE WHEN $3 THEN $4 ELSE consumer END,
            event_type_prefix = coalesce($5, event_type_prefix),
            max_body_bytes = coalesce($6, max_body_bytes),
            description = CASE WHEN $7 THEN $8 ELSE description END,
            hmac = coalesce($9, hmac),
            updated_at = now()
         WHERE name = $1 AND ($2::text IS NULL OR tenant = $2) AND managed_by = 'api'
         RETURNING {COLUMNS}"
    )))
    .bind(name)
    .bind(tenant)
    .bind(p.consumer.is_some())
    .bind(p.consumer.clone().flatten())
    .bind(&p.event_type_prefix)
    .bind(p.max_body_bytes)
    .bind(p.description.is_some())
    .bind(p.description.clone().flatten())
    .bind(p.hmac.as_ref().map(sqlx::types::Json))
    .fetch_optional(on(pool))
    .await?)
}

/// A source as its WebhookSource object declares it (the route name is the object's).
#[derive(Debug, Clone)]
pub struct DeclaredSource<'a> {
    pub namespace: &'a str,
    pub name: &'a str,
    pub tenant: &'a str,
    pub consumer: Option<&'a str>,
    pub provider: &'a str,
    pub hmac: Option<serde_json::Value>,
    pub event_type_prefix: &'a str,
    pub max_body_bytes: i32,
    pub description: Option<&'a str>,
}

/// What writing a declared source did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeclaredWrite {
    Created(Uuid),
    /// the fields were written; `secret_rotated`: the declared secret was not the current
    /// one, and the previous one verifies for the grace
    Updated {
        id: Uuid,
        secret_rotated: bool,
    },
    /// the name is another namespace's or the API's source: nothing was written
    NameTaken,
    /// a new source would pass the tenant's cap: nothing was written
    TenantLimit,
}

/// Creates or updates the source of one WebhookSource object, in the caller's
/// transaction. `seal` seals the declared secret for a source id; `is_current` says
/// whether a stored sealed secret (source id, key id, ciphertext) is the declared one.
pub async fn write_declared(
    conn: &mut PgConnection,
    d: &DeclaredSource<'_>,
    seal: impl Fn(Uuid) -> (String, Vec<u8>),
    is_current: impl Fn(Uuid, &str, &[u8]) -> bool,
    grace_secs: i32,
    tenant_cap: i64,
) -> Result<DeclaredWrite, DbError> {
    let existing: Option<(Uuid, String, Option<String>)> = sqlx::query_as(
        "SELECT id, managed_by, k8s_namespace FROM hookd.sources WHERE name = $1 FOR NO KEY UPDATE",
    )
    .bind(d.name)
    .fetch_optional(on(&mut *conn))
    .await?;
    let Some((id, managed_by, namespace)) = existing else {
        if lock_and_count(&mut *conn, d.tenant).await? >= tenant_cap {
            return Ok(DeclaredWrite::TenantLimit);
        }
        let id = Uuid::now_v7();
        let (key_id, ciphertext) = seal(id);
        let inserted = insert(
            &mut *conn,
            &NewSource {
                id,
                name: d.name,
                tenant: d.tenant,
                consumer: d.consumer,
                provider: d.provider,
                hmac: d.hmac.clone(),
                event_type_prefix: d.event_type_prefix,
                max_body_bytes: d.max_body_bytes,
                description: d.description,
                key_id: &key_id,
                ciphertext: &ciphertext,
                declared_in: Some(d.namespace),
            },
        )
        .await?;
        return Ok(inserted.map_or(DeclaredWrite::NameTaken, |row| {
            DeclaredWrite::Created(row.id)
        }));
    };
    if managed_by != ManagedBy::Kubernetes.as_str() || namespace.as_deref() != Some(d.namespace) {
        return Ok(DeclaredWrite::NameTaken);
    }
    sqlx::query(
        "UPDATE hookd.sources SET tenant = $2, consumer = $3, provider = $4, hmac = $5,
                event_type_prefix = $6, max_body_bytes = $7, description = $8, updated_at = now()
         WHERE id = $1
           AND (tenant, consumer, provider, hmac, event_type_prefix, max_body_bytes, description)
               IS DISTINCT FROM ($2, $3, $4, $5, $6, $7, $8)",
    )
    .bind(id)
    .bind(d.tenant)
    .bind(d.consumer)
    .bind(d.provider)
    .bind(d.hmac.as_ref().map(sqlx::types::Json))
    .bind(d.event_type_prefix)
    .bind(d.max_body_bytes)
    .bind(d.description)
    .execute(on(&mut *conn))
    .await?;
    let current: Option<(String, Vec<u8>)> = sqlx::query_as(
        "SELECT key_id, ciphertext FROM hookd.source_secrets
         WHERE source_id = $1 AND not_after IS NULL",
    )
    .bind(id)
    .fetch_optional(on(&mut *conn))
    .await?;
    let same = current.as_ref().is_some_and(|(k, c)| is_current(id, k, c));
    if !same {
        let (key_id, ciphertext) = seal(id);
        rotate(&mut *conn, id, &key_id, &ciphertext, grace_secs).await?;
    }
    Ok(DeclaredWrite::Updated {
        id,
        secret_rotated: !same,
    })
}

/// Deletes the source of one WebhookSource object; its id, when there was one.
pub async fn delete_declared(
    conn: &mut PgConnection,
    namespace: &str,
    name: &str,
) -> Result<Option<Uuid>, DbError> {
    Ok(sqlx::query_scalar(
        "DELETE FROM hookd.sources
         WHERE managed_by = 'kubernetes' AND k8s_namespace = $1 AND k8s_name = $2
         RETURNING id",
    )
    .bind(namespace)
    .bind(name)
    .fetch_optional(on(conn))
    .await?)
}

/// Adds requests counted by one API process to `hookd.source_requests`, in the current
/// hour, in one statement: `(source id, outcome, count, last request's time)`.
pub async fn add_requests(
    pool: &PgPool,
    counted: &[(Uuid, &str, i64, DateTime<Utc>)],
) -> Result<(), DbError> {
    let ids: Vec<Uuid> = counted.iter().map(|c| c.0).collect();
    let outcomes: Vec<&str> = counted.iter().map(|c| c.1).collect();
    let counts: Vec<i64> = counted.iter().map(|c| c.2).collect();
    let last: Vec<DateTime<Utc>> = counted.iter().map(|c| c.3).collect();
    sqlx::query(
        "INSERT INTO hookd.source_requests AS r (source_id, hour, outcome, count, last_at)
         SELECT id, date_trunc('hour', now()), outcome, n, last_at
         FROM unnest($1::uuid[], $2::text[], $3::bigint[], $4::timestamptz[])
              AS u(id, outcome, n, last_at)
         ORDER BY id, outcome
         ON CONFLICT (source_id, hour, outcome) DO UPDATE
         SET count = r.count + excluded.count, last_at = greatest(r.last_at, excluded.last_at)",
    )
    .bind(&ids)
    .bind(&outcomes)
    .bind(&counts)
    .bind(&last)
    .execute(on(pool))
    .await?;
    Ok(())
}

/// Deletes request counts of hours before `keep` ago.
pub async fn prune_requests(pool: &PgPool, keep: std::time::Duration) -> Result<u64, DbError> {
    let r = sqlx::query(
        "DELETE FROM hookd.source_requests
         WHERE hour < now() - make_interval(secs => $1)",
    )
    .bind(keep.as_secs_f64())
    .execute(on(pool))
    .await?;
    Ok(r.rows_affected())
}

/// Requests to the source `id` by outcome since `since` (whole hours: the hour `since`
/// falls in counts whole), most first.
pub async fn request_counts(
    pool: &PgPool,
    id: Uuid,
    since: DateTime<Utc>,
) -> Result<Vec<(String, i64, DateTime<Utc>)>, DbError> {
    Ok(sqlx::query_as(
        "SELECT outcome, sum(count)::bigint, max(last_at)
         FROM hookd.source_requests
         WHERE source_id = $1 AND hour >= date_trunc('hour', $2::timestamptz)
         GROUP BY outcome
         ORDER BY 2 DESC, 1",
    )
    .bind(id)
    .bind(since)
    .fetch_all(on(pool))
    .await?)
}
