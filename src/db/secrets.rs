//! `hookd.endpoint_secrets`: signing secrets with rotation grace.

use sqlx::PgConnection;
use uuid::Uuid;

use super::DbError;

/// Result of making `secret` the endpoint's current signing secret.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RotateResult {
    /// a new secret was stored (first secret, or a rotation)
    pub rotated: bool,
    /// previously current secrets this call retired (> 0: a rotation, not a first secret)
    pub retired: i64,
    /// secrets that sign from now on (the current one plus those still in grace)
    pub active: i64,
}

/// Makes `secret` the current secret. If it already is, nothing is written. Otherwise
/// every previously current secret gets `not_after = now() + grace`, so deliveries are
/// signed with both until receivers have switched, and the new one is inserted.
/// Expired secrets are pruned on the way.
pub async fn set_current(
    conn: &mut PgConnection,
    endpoint_id: Uuid,
    secret: &str,
    fingerprint: &[u8],
    grace_secs: i32,
) -> Result<RotateResult, DbError> {
    let row: (bool, i64, i64) = sqlx::query_as(
        r#"
        WITH cur AS (
            SELECT id FROM hookd.endpoint_secrets
            WHERE endpoint_id = $1 AND not_after IS NULL AND fingerprint = $3
        ), pruned AS (
            DELETE FROM hookd.endpoint_secrets
            WHERE endpoint_id = $1 AND not_after IS NOT NULL AND not_after <= now()
            RETURNING id
        ), retired AS (
            UPDATE hookd.endpoint_secrets SET not_after = now() + make_interval(secs => $4)
            WHERE endpoint_id = $1 AND not_after IS NULL AND fingerprint <> $3
              AND NOT EXISTS (SELECT 1 FROM cur)
            RETURNING id
        ), ins AS (
            INSERT INTO hookd.endpoint_secrets (endpoint_id, secret, fingerprint)
            SELECT $1, $2, $3 WHERE NOT EXISTS (SELECT 1 FROM cur)
            RETURNING id
        )
        SELECT EXISTS (SELECT 1 FROM ins) AS rotated,
               (SELECT count(*) FROM retired) AS retired,
               (SELECT count(*) FROM hookd.endpoint_secrets
                 WHERE endpoint_id = $1 AND (not_after IS NULL OR not_after > now())
                   AND id NOT IN (SELECT id FROM pruned))
               + (SELECT count(*) FROM ins)
               -- with no grace the retired secrets stop signing at once
               - CASE WHEN $4 = 0 THEN (SELECT count(*) FROM retired) ELSE 0 END AS active
        "#,
    )
    .bind(endpoint_id)
    .bind(secret)
    .bind(fingerprint)
    .bind(f64::from(grace_secs))
    .fetch_one(conn)
    .await?;
    Ok(RotateResult {
        rotated: row.0,
        retired: row.1,
        active: row.2,
    })
}
