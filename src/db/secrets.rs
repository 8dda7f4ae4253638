//! `hookd.endpoint_secrets`: signing secrets, encrypted at rest, with rotation grace.
//!
//! Rows hold a ciphertext and its key id (see `crypto`); only rows written before
//! migration 0004 may still hold `plaintext_secret`, until `hookd rekey` (or a
//! dispatcher's start) encrypts them.

use sqlx::{PgConnection, PgPool};
use uuid::Uuid;

use super::{DbError, on};

/// Most secrets that sign an endpoint's deliveries at once: the current one and the
/// newest ones still in their grace period.
pub const MAX_SIGNING_SECRETS: i64 = 4;

/// Result of making a secret the endpoint's current signing secret.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RotateResult {
    /// a new secret was stored (first secret, or a rotation)
    pub rotated: bool,
    /// previously current secrets this call retired (> 0: a rotation, not a first secret)
    pub retired: i64,
    /// secrets that sign from now on (the current one plus those still in grace)
    pub active: i64,
}

/// The secret to store, already sealed for its endpoint.
pub struct NewSecret<'a> {
    pub key_id: &'a str,
    pub ciphertext: &'a [u8],
    /// keyed fingerprint under `key_id`
    pub fingerprint: &'a [u8],
    /// (key id, fingerprint) of the same secret under every configured key, so a secret
    /// stored under an older key is still recognised as the current one
    pub known: &'a [(String, Vec<u8>)],
    /// bare SHA-256, the fingerprint of rows written before encryption at rest
    pub legacy_fingerprint: &'a [u8],
}

/// Makes the given secret current. If it already is (matched by fingerprint under any
/// configured key), nothing is written. Otherwise every previously current secret gets
/// `not_after = now() + grace`, so deliveries are signed with both until receivers have
/// switched, and the new one is inserted. Expired secrets are pruned on the way.
pub async fn set_current(
    conn: &mut PgConnection,
    endpoint_id: Uuid,
    secret: &NewSecret<'_>,
    grace_secs: i32,
) -> Result<RotateResult, DbError> {
    // Rotations of one endpoint one at a time: two concurrent ones would each retire only
    // what they saw and both insert, leaving two "current" secrets.
    sqlx::query("SELECT 1 FROM hookd.endpoints WHERE id = $1 FOR NO KEY UPDATE")
        .bind(endpoint_id)
        .execute(on(&mut *conn))
        .await?;
    let known_ids: Vec<&str> = secret.known.iter().map(|k| k.0.as_str()).collect();
    let known_fps: Vec<&[u8]> = secret.known.iter().map(|k| k.1.as_slice()).collect();
    let row: (bool, i64, i64) = sqlx::query_as(
        r#"
        WITH cur AS (
            SELECT id FROM hookd.endpoint_secrets
            WHERE endpoint_id = $1 AND not_after IS NULL
              AND ((key_id, fingerprint) IN (SELECT * FROM unnest($6::text[], $7::bytea[]))
                   OR (key_id IS NULL AND fingerprint = $8))
        ), pruned AS (
            DELETE FROM hookd.endpoint_secrets
            WHERE endpoint_id = $1 AND not_after IS NOT NULL AND not_after <= now()
            RETURNING id
        ), retired AS (
            UPDATE hookd.endpoint_secrets SET not_after = now() + make_interval(secs => $5)
            WHERE endpoint_id = $1 AND not_after IS NULL
              AND NOT EXISTS (SELECT 1 FROM cur)
            RETURNING id
        ), ins AS (
            INSERT INTO hookd.endpoint_secrets (endpoint_id, key_id, ciphertext, fingerprint)
            SELECT $1, $2, $3, $4 WHERE NOT EXISTS (SELECT 1 FROM cur)
            RETURNING id
        )
        SELECT EXISTS (SELECT 1 FROM ins) AS rotated,
               (SELECT count(*) FROM retired) AS retired,
               (SELECT count(*) FROM hookd.endpoint_secrets
                 WHERE endpoint_id = $1 AND (not_after IS NULL OR not_after > now())
                   AND id NOT IN (SELECT id FROM pruned))
               + (SELECT count(*) FROM ins)
               -- with no grace the retired secrets stop signing at once
               - CASE WHEN $5 = 0 THEN (SELECT count(*) FROM retired) ELSE 0 END AS active
        "#,
    )
    .bind(endpoint_id)
    .bind(secret.key_id)
    .bind(secret.ciphertext)
    .bind(secret.fingerprint)
    .bind(f64::from(grace_secs))
    .bind(&known_ids)
    .bind(&known_fps)
    .bind(secret.legacy_fingerprint)
    .fetch_one(on(&mut *conn))
    .await?;
    // Every live secret adds a signature to every delivery: past MAX_SIGNING_SECRETS the
    // oldest in grace stop signing now, so rotations in a loop cannot grow the
    // webhook-signature header (and the dispatcher's work per send) without bound.
    let capped = sqlx::query(
        r#"
        UPDATE hookd.endpoint_secrets SET not_after = now()
        WHERE endpoint_id = $1 AND (not_after IS NULL OR not_after > now())
          AND id NOT IN (SELECT id FROM hookd.endpoint_secrets
                         WHERE endpoint_id = $1 AND (not_after IS NULL OR not_after > now())
                         ORDER BY id DESC LIMIT $2)
        "#,
    )
    .bind(endpoint_id)
    .bind(MAX_SIGNING_SECRETS)
    .execute(on(&mut *conn))
    .await?
    .rows_affected() as i64;
    let row = (row.0, row.1, (row.2 - capped).max(1));
    Ok(RotateResult {
        rotated: row.0,
        retired: row.1,
        active: row.2,
    })
}

/// A stored secret row as `hookd rekey` sees it: either encrypted under `key_id`, or a
/// legacy plaintext row.
#[derive(sqlx::FromRow)]
pub struct StoredSecret {
    pub id: i64,
    pub endpoint_id: Uuid,
    pub key_id: Option<String>,
    pub ciphertext: Option<Vec<u8>>,
    pub plaintext_secret: Option<String>,
}

impl std::fmt::Debug for StoredSecret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StoredSecret")
            .field("id", &self.id)
            .field("endpoint_id", &self.endpoint_id)
            .field("key_id", &self.key_id)
            .field("plaintext", &self.plaintext_secret.is_some())
            .finish_non_exhaustive()
    }
}

/// Which rows a rekey batch takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RekeyScope {
    /// every row not under the active key (legacy plaintext included)
    NotUnder,
    /// only legacy plaintext rows
    PlaintextOnly,
}

/// Locks and returns the next `limit` rows after `after_id` (by id) that `scope` selects,
/// on the caller's transaction. Row locks are held until that transaction ends, so a
/// concurrent `apply` waits for the batch instead of racing it; claims only read this
/// table and never wait.
pub async fn lock_rekey_batch(
    conn: &mut PgConnection,
    active_key_id: &str,
    scope: RekeyScope,
    after_id: i64,
    limit: i64,
) -> Result<Vec<StoredSecret>, DbError> {
    Ok(sqlx::query_as::<_, StoredSecret>(
        r#"
        SELECT id, endpoint_id, key_id, ciphertext, plaintext_secret
        FROM hookd.endpoint_secrets
        WHERE id > $2
          AND CASE WHEN $3 THEN plaintext_secret IS NOT NULL
                   ELSE key_id IS DISTINCT FROM $1 END
        ORDER BY id
        LIMIT $4
        FOR UPDATE
        "#,
    )
    .bind(active_key_id)
    .bind(after_id)
    .bind(scope == RekeyScope::PlaintextOnly)
    .bind(limit)
    .fetch_all(on(conn))
    .await?)
}

/// One row re-sealed by rekey.
pub struct Resealed {
    pub id: i64,
    pub key_id: String,
    pub ciphertext: Vec<u8>,
    pub fingerprint: Vec<u8>,
}

/// Writes re-sealed rows (clearing any plaintext) in one statement; returns how many
/// were written.
pub async fn store_resealed(conn: &mut PgConnection, rows: &[Resealed]) -> Result<u64, DbError> {
    if rows.is_empty() {
        return Ok(0);
    }
    let ids: Vec<i64> = rows.iter().map(|r| r.id).collect();
    let key_ids: Vec<&str> = rows.iter().map(|r| r.key_id.as_str()).collect();
    let cts: Vec<&[u8]> = rows.iter().map(|r| r.ciphertext.as_slice()).collect();
    let fps: Vec<&[u8]> = rows.iter().map(|r| r.fingerprint.as_slice()).collect();
    let r = sqlx::query(
        r#"
        UPDATE hookd.endpoint_secrets s
        SET key_id = i.key_id, ciphertext = i.ciphertext, fingerprint = i.fingerprint,
            plaintext_secret = NULL
        FROM unnest($1::bigint[], $2::text[], $3::bytea[], $4::bytea[])
          AS i(id, key_id, ciphertext, fingerprint)
        WHERE s.id = i.id
        "#,
    )
    .bind(&ids)
    .bind(&key_ids)
    .bind(&cts)
    .bind(&fps)
    .execute(on(conn))
    .await?;
    Ok(r.rows_affected())
}

/// Rows per key id (`None` = legacy plaintext), for rekey's report.
pub async fn count_by_key(pool: &PgPool) -> Result<Vec<(Option<String>, i64)>, DbError> {
    Ok(sqlx::query_as(
        "SELECT key_id, count(*) FROM hookd.endpoint_secrets GROUP BY key_id ORDER BY key_id NULLS FIRST",
    )
    .fetch_all(on(pool))
    .await?)
}

/// Rewrites the table so the bytes of cleared plaintext secrets do not linger in dead
/// tuples on disk. The table holds a few rows per endpoint, so the exclusive lock lasts
/// milliseconds. `SKIP_LOCKED` rather than a `lock_timeout` keeps it from queueing claims
/// behind a long transaction: a session setting would stay on a pooler's server session
/// (invariant 12), and VACUUM cannot run in a transaction that could carry a local one.
/// A skipped run leaves the file in place, which a new file node tells apart; it is
/// tried a few times; `false` when every try was skipped.
pub async fn compact(pool: &PgPool) -> Result<bool, DbError> {
    const FILE: &str = "SELECT pg_relation_filenode('hookd.endpoint_secrets')::bigint";
    let before: i64 = sqlx::query_scalar(FILE).fetch_one(on(pool)).await?;
    for attempt in 0..5u32 {
        // simple protocol, outside any transaction: VACUUM refuses to run in one
        sqlx::raw_sql("VACUUM (FULL, SKIP_LOCKED) hookd.endpoint_secrets")
            .execute(on(pool))
            .await?;
        let after: i64 = sqlx::query_scalar(FILE).fetch_one(on(pool)).await?;
        if after != before {
            return Ok(true);
        }
        tokio::time::sleep(std::time::Duration::from_millis(200 << attempt)).await;
    }
    Ok(false)
}

/// An unexpired signing secret with the name of its endpoint's declaration.
#[derive(sqlx::FromRow)]
pub struct LiveSecret {
    pub endpoint_id: Uuid,
    /// `namespace/name` of the declaration (empty for endpoints created through the API)
    pub endpoint: String,
    pub key_id: Option<String>,
    pub ciphertext: Option<Vec<u8>>,
    pub plaintext_secret: Option<String>,
}

/// Every unexpired secret of every endpoint that is not disabled: what `hookd dev`'s
/// receiver verifies with, so an endpoint a user adds is verified too.
pub async fn live(pool: &PgPool) -> Result<Vec<LiveSecret>, DbError> {
    Ok(sqlx::query_as::<_, LiveSecret>(
        r#"
        SELECT s.endpoint_id,
               coalesce(e.k8s_namespace || '/' || e.k8s_name, '') AS endpoint,
               s.key_id, s.ciphertext, s.plaintext_secret
        FROM hookd.endpoint_secrets s
        JOIN hookd.endpoints e ON e.id = s.endpoint_id
        WHERE e.state <> 'disabled' AND (s.not_after IS NULL OR s.not_after > now())
        ORDER BY s.id
        "#,
    )
    .fetch_all(on(pool))
    .await?)
}
