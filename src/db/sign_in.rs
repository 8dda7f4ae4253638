//! `hookd.sign_in_codes` and browser sessions (`hookd.api_tokens` rows with a
//! `parent_id`, migration 0018): what lets a browser page work without ever holding the
//! token it was opened with.

use chrono::{DateTime, Utc};
use sqlx::{PgConnection, PgPool};
use uuid::Uuid;

use super::{DbError, on};

/// A session token row to insert; everything else is copied from its parent.
#[derive(Debug, Clone)]
pub struct NewSession {
    pub id: Uuid,
    pub parent_id: Uuid,
    pub token_hash: Vec<u8>,
    pub prefix: String,
    /// the session ends then at the latest (its parent's expiry may be earlier)
    pub expires_at: DateTime<Utc>,
}

/// Who a new session speaks for.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct SessionRow {
    pub tenant: String,
    pub consumer: Option<String>,
    pub scopes: Vec<String>,
    pub expires_at: DateTime<Utc>,
}

/// Stores a one-time code for `token_id` (in the caller's transaction, so a code never
/// exists without its token), and drops codes that expired: the table holds only the
/// codes of the last few minutes.
pub async fn insert_code(
    conn: &mut PgConnection,
    code_hash: &[u8],
    token_id: Uuid,
    expires_at: DateTime<Utc>,
) -> Result<(), DbError> {
    sqlx::query("DELETE FROM hookd.sign_in_codes WHERE expires_at < now()")
        .execute(on(&mut *conn))
        .await?;
    sqlx::query(
        "INSERT INTO hookd.sign_in_codes (code_hash, token_id, expires_at) VALUES ($1, $2, $3)",
    )
    .bind(code_hash)
    .bind(token_id)
    .bind(expires_at)
    .execute(on(&mut *conn))
    .await?;
    Ok(())
}

/// Uses up the code: the token it stands for if the code exists and has not expired.
/// The row is deleted either way, so a code works at most once even under concurrent
/// exchanges (the second DELETE finds nothing).
pub async fn take_code(conn: &mut PgConnection, code_hash: &[u8]) -> Result<Option<Uuid>, DbError> {
    let row: Option<(Uuid, bool)> = sqlx::query_as(
        "DELETE FROM hookd.sign_in_codes WHERE code_hash = $1
         RETURNING token_id, expires_at > now()",
    )
    .bind(code_hash)
    .fetch_optional(on(&mut *conn))
    .await?;
    Ok(row.and_then(|(id, fresh)| fresh.then_some(id)))
}

/// Makes a session of the token `s.parent_id` if that token is valid now (unrevoked,
/// unexpired, and a consumer token's consumer still the same generation, as in
/// `tokens::find_valid`); `None` otherwise.
pub async fn insert_session(
    conn: &mut PgConnection,
    s: &NewSession,
) -> Result<Option<SessionRow>, DbError> {
    Ok(sqlx::query_as::<_, SessionRow>(
        "INSERT INTO hookd.api_tokens (id, token_hash, prefix, tenant, scopes, name, expires_at,
                                       consumer, consumer_generation, parent_id)
         SELECT $2, $3, $4, t.tenant,
                -- a consumer token made before migration 0017 may list produce: never copied
                CASE WHEN t.consumer IS NULL THEN t.scopes ELSE array_remove(t.scopes, 'produce') END,
                left('browser session of ' || t.prefix, 200),
                least(t.expires_at, $5), t.consumer, t.consumer_generation, t.id
         FROM hookd.api_tokens t
         LEFT JOIN hookd.consumers c ON c.tenant = t.tenant AND c.uid = t.consumer
         WHERE t.id = $1 AND t.revoked_at IS NULL AND t.parent_id IS NULL
           AND (t.expires_at IS NULL OR t.expires_at > now())
           AND (t.consumer IS NULL OR c.generation = t.consumer_generation)
         -- a revoke of the parent that commits meanwhile is seen (the row is re-read), or
         -- waits for this insert, and its trigger then revokes the new session too
         FOR SHARE OF t
         RETURNING tenant, consumer, scopes, expires_at",
    )
    .bind(s.parent_id)
    .bind(s.id)
    .bind(&s.token_hash)
    .bind(&s.prefix)
    .bind(s.expires_at)
    .fetch_optional(on(&mut *conn))
    .await?)
}

/// Whether the token `id` is a session (has a parent).
pub async fn is_session(pool: &PgPool, id: Uuid) -> Result<bool, DbError> {
    Ok(sqlx::query_scalar::<_, bool>(
        "SELECT parent_id IS NOT NULL FROM hookd.api_tokens WHERE id = $1",
    )
    .bind(id)
    .fetch_optional(on(pool))
    .await?
    .unwrap_or(false))
}

/// Deletes the sessions of `parent` past its `keep` newest; how many. A session is made on
/// every sign-in, and a customer signing in in a loop would otherwise keep every one it
/// made alive for its 12 hours.
pub async fn trim_sessions(
    conn: &mut PgConnection,
    parent: Uuid,
    keep: i64,
) -> Result<u64, DbError> {
    Ok(sqlx::query(
        "DELETE FROM hookd.api_tokens WHERE id IN (
             SELECT id FROM hookd.api_tokens WHERE parent_id = $1
             ORDER BY id DESC OFFSET $2)",
    )
    .bind(parent)
    .bind(keep)
    .execute(on(&mut *conn))
    .await?
    .rows_affected())
}

/// Revokes the token `id` if it is a session (has a parent); whether it was one and live.
/// A session ends itself this way (sign out); any other token is left alone.
pub async fn end_session(pool: &PgPool, id: Uuid) -> Result<bool, DbError> {
    Ok(sqlx::query(
        "UPDATE hookd.api_tokens SET revoked_at = now()
         WHERE id = $1 AND parent_id IS NOT NULL AND revoked_at IS NULL",
    )
    .bind(id)
    .execute(on(pool))
    .await?
    .rows_affected()
        == 1)
}

/// Deletes up to `limit` sessions that ended (expired or revoked) more than a day ago, and
/// expired sign-in codes; the number of sessions deleted. Sessions are made on every
/// sign-in, so without this the table grows by every page a customer ever opened.
pub async fn delete_ended_sessions(conn: &mut PgConnection, limit: i64) -> Result<u64, DbError> {
    sqlx::query("DELETE FROM hookd.sign_in_codes WHERE expires_at < now()")
        .execute(on(&mut *conn))
        .await?;
    Ok(sqlx::query(
        "DELETE FROM hookd.api_tokens WHERE id IN (
             SELECT id FROM hookd.api_tokens
             WHERE parent_id IS NOT NULL
               AND least(expires_at, revoked_at) < now() - interval '1 day'
             LIMIT $1)",
    )
    .bind(limit)
    .execute(on(&mut *conn))
    .await?
    .rows_affected())
}
