//! `hookd.api_tokens`: static API tokens, stored as their SHA-256 only (see the
//! migration for why a fast hash is the right one).

use chrono::{DateTime, Utc};
use sqlx::PgPool;
use uuid::Uuid;

use super::{DbError, on};

/// A token row as `hookd token create` writes it.
#[derive(Debug, Clone)]
pub struct NewToken {
    pub id: Uuid,
    pub token_hash: Vec<u8>,
    pub prefix: String,
    pub tenant: String,
    pub consumer: Option<String>,
    /// the consumer generation a consumer token is for (see migration 0017)
    pub consumer_generation: Option<i64>,
    pub scopes: Vec<String>,
    pub name: Option<String>,
    pub expires_at: Option<DateTime<Utc>>,
}

/// What the API needs to authorize a request made with a valid token.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct ValidToken {
    pub id: Uuid,
    pub tenant: String,
    pub consumer: Option<String>,
    /// a consumer token's generation, and when that consumer was created (rows of an
    /// earlier consumer with the same uid are older)
    pub consumer_generation: Option<i64>,
    pub consumer_since: Option<DateTime<Utc>>,
    pub scopes: Vec<String>,
    pub expires_at: Option<DateTime<Utc>>,
}

/// A token row for `hookd token list` (no hash: nothing secret leaves this module).
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct TokenRow {
    pub id: Uuid,
    pub prefix: String,
    pub tenant: String,
    pub consumer: Option<String>,
    pub scopes: Vec<String>,
    pub name: Option<String>,
    pub created_at: DateTime<Utc>,
    pub expires_at: Option<DateTime<Utc>>,
    pub revoked_at: Option<DateTime<Utc>>,
}

pub async fn insert(conn: &mut sqlx::PgConnection, t: &NewToken) -> Result<(), DbError> {
    sqlx::query(
        "INSERT INTO hookd.api_tokens (id, token_hash, prefix, tenant, scopes, name, expires_at, consumer,
                                       consumer_generation)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)",
    )
    .bind(t.id)
    .bind(&t.token_hash)
    .bind(&t.prefix)
    .bind(&t.tenant)
    .bind(&t.scopes)
    .bind(&t.name)
    .bind(t.expires_at)
    .bind(&t.consumer)
    .bind(t.consumer_generation)
    .execute(on(conn))
    .await?;
    Ok(())
}

/// The unrevoked, unexpired token with this hash, if any. A consumer token is valid only
/// while its consumer generation exists: deleting the consumer kills it in the same commit,
/// whatever became of the revocation.
pub async fn find_valid(pool: &PgPool, token_hash: &[u8]) -> Result<Option<ValidToken>, DbError> {
    Ok(sqlx::query_as::<_, ValidToken>(
        "SELECT t.id, t.tenant, t.consumer, t.scopes, t.expires_at, t.consumer_generation,
                c.created_at AS consumer_since
         FROM hookd.api_tokens t
         LEFT JOIN hookd.consumers c ON c.tenant = t.tenant AND c.uid = t.consumer
         WHERE t.token_hash = $1 AND t.revoked_at IS NULL
           AND (t.expires_at IS NULL OR t.expires_at > now())
           AND (t.consumer IS NULL OR c.generation = t.consumer_generation)",
    )
    .bind(token_hash)
    .fetch_optional(on(pool))
    .await?)
}

/// Every token (optionally of one tenant), newest first.
pub async fn list(pool: &PgPool, tenant: Option<&str>) -> Result<Vec<TokenRow>, DbError> {
    Ok(sqlx::query_as::<_, TokenRow>(
        "SELECT id, prefix, tenant, consumer, scopes, name, created_at, expires_at, revoked_at
         FROM hookd.api_tokens WHERE ($1::text IS NULL OR tenant = $1)
         ORDER BY created_at DESC, id DESC",
    )
    .bind(tenant)
    .fetch_all(on(pool))
    .await?)
}

/// Outcome of a revocation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Revoked {
    Now,
    Already(DateTime<Utc>),
    NotFound,
}

/// Revokes a token; revoking it again keeps the first revocation time.
pub async fn revoke(pool: &PgPool, id: Uuid) -> Result<Revoked, DbError> {
    let row: Option<(bool, DateTime<Utc>)> = sqlx::query_as(
        r#"
        WITH before AS (SELECT id, revoked_at FROM hookd.api_tokens WHERE id = $1 FOR UPDATE),
        upd AS (
            UPDATE hookd.api_tokens t SET revoked_at = now()
            FROM before WHERE t.id = before.id AND before.revoked_at IS NULL
            RETURNING t.revoked_at
        )
        SELECT before.revoked_at IS NULL AS now_revoked,
               coalesce(before.revoked_at, (SELECT revoked_at FROM upd)) AS revoked_at
        FROM before
        "#,
    )
    .bind(id)
    .fetch_optional(on(pool))
    .await?;
    Ok(match row {
        None => Revoked::NotFound,
        Some((true, _)) => Revoked::Now,
        Some((false, at)) => Revoked::Already(at),
    })
}

/// One page of a tenant's tokens, newest first (`api_tokens_tenant_page`); `before`: the
/// previous page's last id. No hash leaves this module.
pub async fn list_page(
    pool: &PgPool,
    tenant: Option<&str>,
    consumer: Option<&str>,
    before: Option<Uuid>,
    limit: i64,
) -> Result<Vec<TokenRow>, DbError> {
    Ok(sqlx::query_as::<_, TokenRow>(
        "SELECT id, prefix, tenant, consumer, scopes, name, created_at, expires_at, revoked_at
         FROM hookd.api_tokens
         WHERE ($1::text IS NULL OR tenant = $1) AND ($2::text IS NULL OR consumer = $2)
           AND ($3::uuid IS NULL OR id < $3)
         ORDER BY id DESC LIMIT $4",
    )
    .bind(tenant)
    .bind(consumer)
    .bind(before)
    .bind(limit)
    .fetch_all(on(pool))
    .await?)
}

/// Revokes a token of `tenant` (None: any tenant); another tenant's token is NotFound.
pub async fn revoke_in_tenant(
    pool: &PgPool,
    id: Uuid,
    tenant: Option<&str>,
) -> Result<Revoked, DbError> {
    let owned: Option<String> =
        sqlx::query_scalar("SELECT tenant FROM hookd.api_tokens WHERE id = $1")
            .bind(id)
            .fetch_optional(on(pool))
            .await?;
    match (owned, tenant) {
        (None, _) => Ok(Revoked::NotFound),
        (Some(t), Some(want)) if t != want => Ok(Revoked::NotFound),
        _ => revoke(pool, id).await,
    }
}

/// One token of `tenant` (None: any), without its hash.
pub async fn get(
    pool: &PgPool,
    id: Uuid,
    tenant: Option<&str>,
) -> Result<Option<TokenRow>, DbError> {
    Ok(sqlx::query_as::<_, TokenRow>(
        "SELECT id, prefix, tenant, consumer, scopes, name, created_at, expires_at, revoked_at
         FROM hookd.api_tokens WHERE id = $1 AND ($2::text IS NULL OR tenant = $2)",
    )
    .bind(id)
    .bind(tenant)
    .fetch_optional(on(pool))
    .await?)
}
