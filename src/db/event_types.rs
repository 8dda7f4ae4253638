//! `hookd.event_types`: the event-type catalog of each tenant (migration 0033).

use chrono::{DateTime, Utc};
use sqlx::{PgConnection, PgPool};

use super::{DbError, on};
use crate::domain::ManagedBy;

/// An event type as the API shows it.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct EventTypeRow {
    pub tenant: String,
    pub name: String,
    pub description: Option<String>,
    pub schema: Option<sqlx::types::Json<serde_json::Value>>,
    /// the exact text the declarer sent
    pub example: Option<String>,
    pub deprecated: bool,
    pub deprecation_note: Option<String>,
    pub managed_by: ManagedBy,
    /// changes with every write (one sequence for all): what compiled schemas are kept under
    pub version: i64,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
}

const COLUMNS: &str = "tenant, name, description, schema, example, deprecated, \
    deprecation_note, managed_by, version, created_at, updated_at";

/// The fields of an event type every door writes.
#[derive(Debug, Clone, Default)]
pub struct EventTypeFields<'a> {
    pub description: Option<&'a str>,
    pub schema: Option<&'a serde_json::Value>,
    pub example: Option<&'a str>,
    pub deprecated: bool,
    pub deprecation_note: Option<&'a str>,
}

/// How many event types `tenant` has, counted under a lock that makes two creates of one
/// tenant count one after the other (held to the end of the caller's transaction).
pub async fn lock_and_count(conn: &mut PgConnection, tenant: &str) -> Result<i64, DbError> {
    sqlx::query("SELECT pg_advisory_xact_lock(hashtextextended('hookd.event_types:' || $1, 0))")
        .bind(tenant)
        .execute(on(&mut *conn))
        .await?;
    Ok(
        sqlx::query_scalar("SELECT count(*) FROM hookd.event_types WHERE tenant = $1")
            .bind(tenant)
            .fetch_one(on(&mut *conn))
            .await?,
    )
}

/// Inserts an event type made through the API; `None` when the tenant has one of that
/// name already (nothing written).
pub async fn insert(
    conn: &mut PgConnection,
    tenant: &str,
    name: &str,
    f: &EventTypeFields<'_>,
) -> Result<Option<EventTypeRow>, DbError> {
    Ok(
        sqlx::query_as::<_, EventTypeRow>(sqlx::AssertSqlSafe(format!(
            "INSERT INTO hookd.event_types (tenant, name, description, schema, example,
                                        deprecated, deprecation_note)
         VALUES ($1, $2, $3, $4, $5, $6, $7)
         ON CONFLICT (tenant, name) DO NOTHING
         RETURNING {COLUMNS}"
        )))
        .bind(tenant)
        .bind(name)
        .bind(f.description)
        .bind(f.schema.map(sqlx::types::Json))
        .bind(f.example)
        .bind(f.deprecated)
        .bind(f.deprecation_note)
        .fetch_optional(on(conn))
        .await?,
    )
}

/// The tenant's event types in name order, after `after`, at most `limit`; deprecated ones
/// only with `include_deprecated`.
pub async fn list(
    pool: &PgPool,
    tenant: Option<&str>,
    after: Option<&str>,
    include_deprecated: bool,
    limit: i64,
) -> Result<Vec<EventTypeRow>, DbError> {
    Ok(
        sqlx::query_as::<_, EventTypeRow>(sqlx::AssertSqlSafe(format!(
            "SELECT {COLUMNS} FROM hookd.event_types
         WHERE ($1::text IS NULL OR tenant = $1) AND ($2::text IS NULL OR name > $2)
           AND ($3 OR NOT deprecated)
         ORDER BY name, tenant LIMIT $4"
        )))
        .bind(tenant)
        .bind(after)
        .bind(include_deprecated)
        .bind(limit)
        .fetch_all(on(pool))
        .await?,
    )
}

/// The event type `name` of `tenant`.
pub async fn get(pool: &PgPool, tenant: &str, name: &str) -> Result<Option<EventTypeRow>, DbError> {
    Ok(
        sqlx::query_as::<_, EventTypeRow>(sqlx::AssertSqlSafe(format!(
            "SELECT {COLUMNS} FROM hookd.event_types WHERE tenant = $1 AND name = $2"
        )))
        .bind(tenant)
        .bind(name)
        .fetch_optional(on(pool))
        .await?,
    )
}

/// What an enqueue checks a message against: whether the type is declared, its version
/// (the key of its compiled schema) and deprecation, without the schema itself, which is
/// read only when this process has not compiled that version yet ([`schemas`]).
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct Declared {
    pub name: String,
    pub version: i64,
    pub has_schema: bool,
    pub deprecated: bool,
    pub deprecation_note: Option<String>,
}

/// The declared types among `names` of `tenant`, in one statement (a batch's distinct
/// types of one tenant).
pub async fn declared(
    pool: &PgPool,
    tenant: &str,
    names: &[&str],
) -> Result<Vec<Declared>, DbError> {
    Ok(sqlx::query_as::<_, Declared>(
        "SELECT name, version, schema IS NOT NULL AS has_schema, deprecated, deprecation_note
         FROM hookd.event_types WHERE tenant = $1 AND name = ANY($2)",
    )
    .bind(tenant)
    .bind(names)
    .fetch_all(on(pool))
    .await?)
}

/// The schemas of `names` of `tenant` with their versions.
pub async fn schemas(
    pool: &PgPool,
    tenant: &str,
    names: &[&str],
) -> Result<Vec<(String, i64, sqlx::types::Json<serde_json::Value>)>, DbError> {
    Ok(sqlx::query_as(
        "SELECT name, version, schema FROM hookd.event_types
         WHERE tenant = $1 AND name = ANY($2) AND schema IS NOT NULL",
    )
    .bind(tenant)
    .bind(names)
    .fetch_all(on(pool))
    .await?)
}

/// A change through the API; `None` leaves a field as it is (`Some(None)` clears it).
#[derive(Debug, Clone, Default)]
pub struct EventTypePatch {
    pub description: Option<Option<String>>,
    pub schema: Option<Option<serde_json::Value>>,
    pub example: Option<Option<String>>,
    pub deprecated: Option<bool>,
    pub deprecation_note: Option<Option<String>>,
}

/// Locks and reads the event type `name` of `tenant` for a change in the caller's
/// transaction, so the checks of the change (an example against a schema kept) see what
/// is written.
pub async fn get_for_update(
    conn: &mut PgConnection,
    tenant: &str,
    name: &str,
) -> Result<Option<EventTypeRow>, DbError> {
    Ok(
        sqlx::query_as::<_, EventTypeRow>(sqlx::AssertSqlSafe(format!(
            "SELECT {COLUMNS} FROM hookd.event_types WHERE tenant = $1 AND name = $2
         FOR NO KEY UPDATE"
        )))
        .bind(tenant)
        .bind(name)
        .fetch_optional(on(conn))
        .await?,
    )
}

/// Applies `p` to the API's event type `name` of `tenant` (a new version: the trigger
/// `event_types_version`, migration 0033, for every write).
pub async fn patch(
    conn: &mut PgConnection,
    tenant: &str,
    name: &str,
    p: &EventTypePatch,
) -> Result<Option<EventTypeRow>, DbError> {
    Ok(
        sqlx::query_as::<_, EventTypeRow>(sqlx::AssertSqlSafe(format!(
            "UPDATE hookd.event_types SET
            description = CASE WHEN $3 THEN $4 ELSE description END,
            schema = CASE WHEN $5 THEN $6 ELSE schema END,
            example = CASE WHEN $7 THEN $8 ELSE example END,
            deprecated = coalesce($9, deprecated),
            deprecation_note = CASE WHEN $10 THEN $11 ELSE deprecation_note END,
            updated_at = now()
         WHERE tenant = $1 AND name = $2 AND managed_by = 'api'
         RETURNING {COLUMNS}"
        )))
        .bind(tenant)
        .bind(name)
        .bind(p.description.is_some())
        .bind(p.description.clone().flatten())
        .bind(p.schema.is_some())
        .bind(p.schema.clone().flatten().map(sqlx::types::Json))
        .bind(p.example.is_some())
        .bind(p.example.clone().flatten())
        .bind(p.deprecated)
        .bind(p.deprecation_note.is_some())
        .bind(p.deprecation_note.clone().flatten())
        .fetch_optional(on(conn))
        .await?,
    )
}

/// Deletes the API's event type `name` of `tenant`; whether there was one (a declared
/// one is its object's to delete). Events of the type and endpoints subscribed to it stay.
pub async fn delete(pool: &PgPool, tenant: &str, name: &str) -> Result<bool, DbError> {
    let r = sqlx::query(
        "DELETE FROM hookd.event_types
         WHERE tenant = $1 AND name = $2 AND managed_by = 'api'",
    )
    .bind(tenant)
    .bind(name)
    .execute(on(pool))
    .await?;
    Ok(r.rows_affected() > 0)
}

/// What writing a declared event type did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeclaredWrite {
    Created,
    /// its fields were written (`changed`: they differed)
    Updated {
        changed: bool,
    },
    /// the tenant has a type of that name made through the API or by another object
    NameTaken,
    /// a new type would pass the tenant's cap: nothing was written
    TenantLimit,
}

/// Creates or updates the event type of one WebhookEventType object (`namespace`/`object`)
/// in the caller's transaction. An object renaming its type (`spec.name`) drops the
/// type it declared before.
pub async fn write_declared(
    conn: &mut PgConnection,
    namespace: &str,
    object: &str,
    tenant: &str,
    name: &str,
    f: &EventTypeFields<'_>,
    tenant_cap: i64,
) -> Result<DeclaredWrite, DbError> {
    let existing: Option<(String, Option<String>, Option<String>)> = sqlx::query_as(
        "SELECT managed_by, k8s_namespace, k8s_name FROM hookd.event_types
         WHERE tenant = $1 AND name = $2 FOR NO KEY UPDATE",
    )
    .bind(tenant)
    .bind(name)
    .fetch_optional(on(&mut *conn))
    .await?;
    let Some((managed_by, ns, obj)) = existing else {
        // the object's earlier type (another name or tenant) gives way to this one
        delete_declared(&mut *conn, namespace, object).await?;
        if lock_and_count(&mut *conn, tenant).await? >= tenant_cap {
            return Ok(DeclaredWrite::TenantLimit);
        }
        let inserted = sqlx::query(
            "INSERT INTO hookd.event_types (tenant, name, description, schema, example,
                    deprecated, deprecation_note, managed_by, k8s_namespace, k8s_name)
             VALUES ($1, $2, $3, $4, $5, $6, $7, 'kubernetes', $8, $9)
             ON CONFLICT (tenant, name) DO NOTHING",
        )
        .bind(tenant)
        .bind(name)
        .bind(f.description)
        .bind(f.schema.map(sqlx::types::Json))
        .bind(f.example)
        .bind(f.deprecated)
        .bind(f.deprecation_note)
        .bind(namespace)
        .bind(object)
        .execute(on(&mut *conn))
        .await?;
        return Ok(if inserted.rows_affected() == 1 {
            DeclaredWrite::Created
        } else {
            DeclaredWrite::NameTaken
        });
    };
    if managed_by != ManagedBy::Kubernetes.as_str()
        || ns.as_deref() != Some(namespace)
        || obj.as_deref() != Some(object)
    {
        return Ok(DeclaredWrite::NameTaken);
    }
    // only a real change takes a new version: a resync or a re-apply of the same file keeps
    // every API process's compiled schema
    let changed = sqlx::query(
        "UPDATE hookd.event_types SET description = $3, schema = $4, example = $5,
                deprecated = $6, deprecation_note = $7, updated_at = now()
         WHERE tenant = $1 AND name = $2
           AND (description, schema, example, deprecated, deprecation_note)
               IS DISTINCT FROM ($3, $4, $5, $6, $7)",
    )
    .bind(tenant)
    .bind(name)
    .bind(f.description)
    .bind(f.schema.map(sqlx::types::Json))
    .bind(f.example)
    .bind(f.deprecated)
    .bind(f.deprecation_note)
    .execute(on(&mut *conn))
    .await?;
    Ok(DeclaredWrite::Updated {
        changed: changed.rows_affected() > 0,
    })
}

/// Deletes the event type of one WebhookEventType object; its (tenant, name), when there
/// was one.
pub async fn delete_declared(
    conn: &mut PgConnection,
    namespace: &str,
    object: &str,
) -> Result<Option<(String, String)>, DbError> {
    Ok(sqlx::query_as(
        "DELETE FROM hookd.event_types
         WHERE managed_by = 'kubernetes' AND k8s_namespace = $1 AND k8s_name = $2
         RETURNING tenant, name",
    )
    .bind(namespace)
    .bind(object)
    .fetch_optional(on(conn))
    .await?)
}
