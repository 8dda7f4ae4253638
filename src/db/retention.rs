//! Retention: deleting terminal deliveries (with their attempts and dead letters) and
//! then their events, in small batches.
//!
//! No statement here touches a claimable row: only `succeeded`, `dead` and `cancelled`
//! deliveries are deleted, and those never enter the claim index `deliveries_claimable`,
//! so claims neither wait for a prune nor see their index change. Each batch is one
//! short statement that locks only the rows it deletes (`SKIP LOCKED`, so a replay
//! holding a row is simply passed over).

use chrono::{DateTime, Utc};
use sqlx::postgres::PgArguments;
use sqlx::{Arguments, PgConnection};
use uuid::Uuid;

use super::DbError;

/// Session advisory lock held by the one process pruning at a time.
pub const PRUNE_LOCK: i64 = 0x686f_6f6b_6470_7275; // "hookdpru"

/// Takes the pruning lock on this session if it is free.
pub async fn try_lock(conn: &mut PgConnection) -> Result<bool, DbError> {
    Ok(sqlx::query_scalar("SELECT pg_try_advisory_lock($1)")
        .bind(PRUNE_LOCK)
        .fetch_one(conn)
        .await?)
}

pub async fn unlock(conn: &mut PgConnection) -> Result<(), DbError> {
    sqlx::query("SELECT pg_advisory_unlock($1)")
        .bind(PRUNE_LOCK)
        .execute(conn)
        .await?;
    Ok(())
}

/// The cutoff per tenant: rows of a listed tenant last updated before its cutoff are
/// expired; every other tenant uses `default`. "Keep forever" is the Unix epoch.
#[derive(Debug, Clone)]
pub struct Cutoffs {
    pub default: DateTime<Utc>,
    pub tenants: Vec<String>,
    pub tenant_cutoffs: Vec<DateTime<Utc>>,
}

/// Every endpoint (disabled ones too: their history expires like any other) with its
/// tenant.
pub async fn endpoints(conn: &mut PgConnection) -> Result<Vec<(Uuid, String)>, DbError> {
    Ok(
        sqlx::query_as("SELECT id, tenant FROM hookd.endpoints ORDER BY id")
            .fetch_all(conn)
            .await?,
    )
}

/// What one delivery batch deleted, and where the walk stands.
#[derive(Debug, Clone, Default)]
pub struct DeliveryBatch {
    pub deliveries: i64,
    pub attempts: i64,
    pub dead_letters: i64,
    pub events: i64,
    /// (created_at, id) of the last row deleted, the cursor for the next batch
    pub last: Option<(DateTime<Utc>, Uuid)>,
}

/// One delivery batch (see [`prune_endpoint_batch`]); shared with
/// [`explain_prune_endpoint_batch`] so a test inspects the plan of exactly this text.
const PRUNE_ENDPOINT_SQL: &str = r#"
        WITH doomed AS (
            SELECT d.id, d.event_id, d.created_at
            FROM hookd.deliveries d
            LEFT JOIN unnest($5::text[], $6::timestamptz[]) AS t(tenant, cutoff)
              ON t.tenant = d.tenant
            WHERE d.endpoint_id = $1
              AND d.created_at < $2
              AND d.created_at >= $3
              AND (d.created_at, d.id) > ($3, $4)
              AND d.status IN ('succeeded', 'dead', 'cancelled')
              AND d.updated_at < coalesce(t.cutoff, $7)
            ORDER BY d.created_at, d.id
            LIMIT $8
            FOR UPDATE OF d SKIP LOCKED
        ), attempts AS (
            DELETE FROM hookd.delivery_attempts a USING doomed
            WHERE a.delivery_id = doomed.id
            RETURNING 1
        ), letters AS (
            DELETE FROM hookd.dead_letters l USING doomed
            WHERE l.delivery_id = doomed.id
            RETURNING 1
        ), gone AS (
            DELETE FROM hookd.deliveries d USING doomed
            WHERE d.id = doomed.id
            RETURNING d.id, d.event_id
        ), events AS (
            -- An event goes with its last delivery; its other deliveries (other
            -- endpoints) may still be pending or kept longer. The statement's snapshot
            -- still shows the deliveries deleted above, so "none left" is "all of them
            -- are in this batch". A scalar subquery per event probes deliveries_event;
            -- a NOT EXISTS would be planned as an anti join over the whole table.
            DELETE FROM hookd.events e
            USING (SELECT event_id, count(*) AS n FROM gone GROUP BY event_id) g
            WHERE e.id = g.event_id
              AND (SELECT count(*) FROM hookd.deliveries o WHERE o.event_id = e.id) = g.n
            RETURNING 1
        ), last AS (
            SELECT created_at, id FROM doomed ORDER BY created_at DESC, id DESC LIMIT 1
        )
        SELECT (SELECT count(*) FROM gone), (SELECT count(*) FROM attempts),
               (SELECT count(*) FROM letters), (SELECT count(*) FROM events),
               (SELECT created_at FROM last), (SELECT id FROM last)
        "#;

/// Deletes up to `limit` expired terminal deliveries of one endpoint created after the
/// cursor `after`, with their attempts and dead letters, and the events whose last
/// delivery this was.
///
/// The walk is a range scan of `deliveries_endpoint_created` (endpoint_id, created_at)
/// below `scan_before` (the endpoint's tenant cutoff: nothing created later can have
/// expired), so its cost is the old rows of that endpoint, never the whole table. A row
/// is expired when its own tenant's cutoff is past its `updated_at`: a delivery replayed
/// yesterday counts from yesterday, not from its creation.
pub async fn prune_endpoint_batch(
    conn: &mut PgConnection,
    endpoint_id: Uuid,
    scan_before: DateTime<Utc>,
    after: (DateTime<Utc>, Uuid),
    cutoffs: &Cutoffs,
    limit: i64,
) -> Result<DeliveryBatch, DbError> {
    let row: (i64, i64, i64, i64, Option<DateTime<Utc>>, Option<Uuid>) = sqlx::query_as_with(
        PRUNE_ENDPOINT_SQL,
        prune_endpoint_arguments(endpoint_id, scan_before, after, cutoffs, limit)?,
    )
    .fetch_one(conn)
    .await?;
    Ok(DeliveryBatch {
        deliveries: row.0,
        attempts: row.1,
        dead_letters: row.2,
        events: row.3,
        last: row.4.zip(row.5),
    })
}

fn prune_endpoint_arguments(
    endpoint_id: Uuid,
    scan_before: DateTime<Utc>,
    after: (DateTime<Utc>, Uuid),
    cutoffs: &Cutoffs,
    limit: i64,
) -> Result<PgArguments, DbError> {
    let mut args = PgArguments::default();
    let encode = |e| DbError::Query(sqlx::Error::Encode(e));
    args.add(endpoint_id).map_err(encode)?;
    args.add(scan_before).map_err(encode)?;
    args.add(after.0).map_err(encode)?;
    args.add(after.1).map_err(encode)?;
    args.add(&cutoffs.tenants).map_err(encode)?;
    args.add(&cutoffs.tenant_cutoffs).map_err(encode)?;
    args.add(cutoffs.default).map_err(encode)?;
    args.add(limit).map_err(encode)?;
    Ok(args)
}

/// `EXPLAIN` (not executed) of one delivery batch with these parameters, one line per
/// plan line: for tests that prove pruning is an index range scan per endpoint.
pub async fn explain_prune_endpoint_batch(
    conn: &mut PgConnection,
    endpoint_id: Uuid,
    scan_before: DateTime<Utc>,
    cutoffs: &Cutoffs,
    limit: i64,
) -> Result<Vec<String>, DbError> {
    // the only dynamic part is a constant prefix on the constant statement text
    let sql = format!("EXPLAIN {PRUNE_ENDPOINT_SQL}");
    Ok(sqlx::query_scalar_with(
        sqlx::AssertSqlSafe(sql),
        prune_endpoint_arguments(
            endpoint_id,
            scan_before,
            (DateTime::UNIX_EPOCH, Uuid::nil()),
            cutoffs,
            limit,
        )?,
    )
    .fetch_all(conn)
    .await?)
}
const ORPHAN_EVENTS_SQL: &str = r#"
        WITH scanned AS (
            -- the statement's bound: it reads at most 4 x limit events whatever they hold,
            -- so a stretch of old events that all still have deliveries cannot make one
            -- statement walk the table (5 s warm, 48 s cold at 1.25 M events before)
            SELECT e.id, e.tenant, e.created_at FROM hookd.events e
            WHERE e.id > $1 AND e.id < $2
            ORDER BY e.id
            LIMIT $6 * 4
        ), doomed AS (
            SELECT e.id
            FROM scanned s
            JOIN hookd.events e ON e.id = s.id
            LEFT JOIN unnest($3::text[], $4::timestamptz[]) AS t(tenant, cutoff)
              ON t.tenant = s.tenant
            WHERE s.created_at < coalesce(t.cutoff, $5)
              -- a scalar subquery probes deliveries_event per candidate; NOT EXISTS
              -- would be planned as an anti join over the whole deliveries table
              AND (SELECT 1 FROM hookd.deliveries d WHERE d.event_id = s.id LIMIT 1) IS NULL
            FOR UPDATE OF e SKIP LOCKED
        ), gone AS (
            DELETE FROM hookd.events e USING doomed WHERE e.id = doomed.id RETURNING e.id
        )
        SELECT (SELECT count(*) FROM gone),
               CASE WHEN (SELECT count(*) FROM scanned) = $6 * 4
                    THEN (SELECT id FROM scanned ORDER BY id DESC LIMIT 1) END
        "#;

/// Deletes expired events that have no delivery at all (no endpoint was subscribed, or
/// their deliveries went in a batch that could not see the last one), reading at most
/// 4 x `limit` events upwards from `after` and below `before`. Ids are UUIDv7, so
/// `before` (the UUIDv7 floor of the newest cutoff) bounds the walk to old rows; the
/// `created_at` test is what decides. Returns (deleted, where to continue: the last id
/// read when the window was full, None when the walk is done).
pub async fn prune_orphan_events_batch(
    conn: &mut PgConnection,
    after: Uuid,
    before: Uuid,
    cutoffs: &Cutoffs,
    limit: i64,
) -> Result<(i64, Option<Uuid>), DbError> {
    Ok(sqlx::query_as_with(
        ORPHAN_EVENTS_SQL,
        orphan_arguments(after, before, cutoffs, limit)?,
    )
    .fetch_one(conn)
    .await?)
}

fn orphan_arguments(
    after: Uuid,
    before: Uuid,
    cutoffs: &Cutoffs,
    limit: i64,
) -> Result<PgArguments, DbError> {
    let mut args = PgArguments::default();
    let encode = |e| DbError::Query(sqlx::Error::Encode(e));
    args.add(after).map_err(encode)?;
    args.add(before).map_err(encode)?;
    args.add(&cutoffs.tenants).map_err(encode)?;
    args.add(&cutoffs.tenant_cutoffs).map_err(encode)?;
    args.add(cutoffs.default).map_err(encode)?;
    args.add(limit).map_err(encode)?;
    Ok(args)
}

/// `EXPLAIN` (not executed) of one orphan-event batch, for tests.
pub async fn explain_prune_orphan_events_batch(
    conn: &mut PgConnection,
    before: Uuid,
    cutoffs: &Cutoffs,
    limit: i64,
) -> Result<Vec<String>, DbError> {
    // the only dynamic part is a constant prefix on the constant statement text
    let sql = format!("EXPLAIN {ORPHAN_EVENTS_SQL}");
    Ok(sqlx::query_scalar_with(
        sqlx::AssertSqlSafe(sql),
        orphan_arguments(Uuid::nil(), before, cutoffs, limit)?,
    )
    .fetch_all(conn)
    .await?)
}
