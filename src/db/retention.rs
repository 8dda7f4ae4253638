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

use super::{DbError, on};

/// The smallest UUIDv7 of the millisecond `t`: every id minted at or after `t` sorts at
/// or above it, so `id < floor` selects ids minted before `t` with a primary-key range.
/// Past UUIDv7's 48 bits of milliseconds (the year 10889) it is the largest id, not a
/// wrapped-around small one.
pub fn uuid_v7_floor(t: DateTime<Utc>) -> Uuid {
    let ms = u64::try_from(t.timestamp_millis()).unwrap_or(0);
    if ms >= 1 << 48 {
        return Uuid::max();
    }
    let mut bytes = [0u8; 16];
    bytes[..6].copy_from_slice(&ms.to_be_bytes()[2..]);
    Uuid::from_bytes(bytes)
}

/// History days created ahead of today (UTC). There is no default partition (migration
/// 0016: attaching a day would lock it), so a delivery can become terminal only inside a
/// day that exists: a week ahead leaves every hookd process down for a week before that
/// can fail, and every dispatcher and every `hookd migrate` creates the coming days.
pub const HISTORY_DAYS_AHEAD: i32 = 7;

/// How long upkeep DDL waits for a lock before it gives up and tries again later. Creating
/// a day conflicts with no statement of the hot path (it attaches under SHARE UPDATE
/// EXCLUSIVE), so this bounds waits on other upkeep only; a day drop never waits at all
/// (see [`drop_history_day`]).
const UPKEEP_LOCK_TIMEOUT: &str = "100ms";

/// Advisory lock held by the one process pruning at a time.
pub const PRUNE_LOCK: i64 = 0x686f_6f6b_6470_7275; // "hookdpru"

/// Takes the pruning lock, if it is free, for the rest of the transaction `lock` (which
/// the caller keeps open, idle, for its pass; the pass runs on another connection). A
/// transaction's lock rather than a session's: behind a pooler in transaction mode a
/// session lock would stay with the server session, held for good by whichever client
/// gets it next, and a transaction's ends with it on every path, a cancelled pass
/// included. It conflicts with a session lock on the same key as well.
pub async fn try_lock(lock: &mut PgConnection) -> Result<bool, DbError> {
    Ok(sqlx::query_scalar("SELECT pg_try_advisory_xact_lock($1)")
        .bind(PRUNE_LOCK)
        .fetch_one(on(lock))
        .await?)
}

/// The cutoff per tenant: rows of a listed tenant last updated before its cutoff are
/// expired; every other tenant uses `default`. "Keep forever" is the Unix epoch.
#[derive(Debug, Clone)]
pub struct Cutoffs {
    pub default: DateTime<Utc>,
    pub tenants: Vec<String>,
    pub tenant_cutoffs: Vec<DateTime<Utc>>,
    /// Rows with ids below this belong to days that retention will drop whole within
    /// `drop_grace`; the row-by-row walk leaves them that long past their cutoff.
    pub drop_below: Uuid,
    pub drop_grace: std::time::Duration,
}

/// Every endpoint (disabled ones too: their history expires like any other) with its
/// tenant.
pub async fn endpoints(conn: &mut PgConnection) -> Result<Vec<(Uuid, String)>, DbError> {
    Ok(
        sqlx::query_as("SELECT id, tenant FROM hookd.endpoints ORDER BY id")
            .fetch_all(on(conn))
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
    /// the id of the last row deleted, the cursor for the next batch
    pub last: Option<Uuid>,
}

/// One delivery batch (see [`prune_endpoint_batch`]); shared with
/// [`explain_prune_endpoint_batch`] so a test inspects the plan of exactly this text.
const PRUNE_ENDPOINT_SQL: &str = r#"
        WITH doomed AS (
            SELECT d.id, d.event_id
            FROM hookd.deliveries d
            LEFT JOIN unnest($4::text[], $5::timestamptz[]) AS t(tenant, cutoff)
              ON t.tenant = d.tenant
            WHERE d.endpoint_id = $1
              -- ids minted before the scan's bound: the history days above it are left
              -- out by the id range itself
              AND d.id < $2
              AND d.id > $3
              AND d.status IN ('succeeded', 'dead', 'cancelled')
              AND d.updated_at < coalesce(t.cutoff, $6)
              -- a row of a day that retention is about to drop whole is left to that drop
              -- for a grace period more (see `retention::DROP_GRACE`)
              AND (d.id >= $8 OR d.updated_at < coalesce(t.cutoff, $6) - make_interval(secs => $9))
            ORDER BY d.id
            LIMIT $7
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
        )
        SELECT (SELECT count(*) FROM gone), (SELECT count(*) FROM attempts),
               (SELECT count(*) FROM letters), (SELECT count(*) FROM events),
               (SELECT id FROM doomed ORDER BY id DESC LIMIT 1)
        "#;

/// Deletes up to `limit` expired terminal deliveries of one endpoint with ids above the
/// cursor `after`, with their attempts and dead letters, and the events whose last
/// delivery this was.
///
/// The walk is a range scan of `deliveries_endpoint_page` (endpoint_id, id) below the
/// UUIDv7 floor of `scan_before` (the endpoint's tenant cutoff: nothing created later can
/// have expired), so its cost is the old rows of that endpoint, never the whole table. A
/// delivery's id is minted after its enqueue transaction began, so a row whose transaction
/// spanned the cutoff is left to the next pass, whose cutoff is later. A row is expired
/// when its own tenant's cutoff is past its `updated_at`: a delivery replayed yesterday
/// counts from yesterday, not from its creation.
pub async fn prune_endpoint_batch(
    conn: &mut PgConnection,
    endpoint_id: Uuid,
    scan_before: DateTime<Utc>,
    after: Uuid,
    cutoffs: &Cutoffs,
    limit: i64,
) -> Result<DeliveryBatch, DbError> {
    let row: (i64, i64, i64, i64, Option<Uuid>) = sqlx::query_as_with(
        PRUNE_ENDPOINT_SQL,
        prune_endpoint_arguments(endpoint_id, scan_before, after, cutoffs, limit)?,
    )
    .fetch_one(on(conn))
    .await?;
    Ok(DeliveryBatch {
        deliveries: row.0,
        attempts: row.1,
        dead_letters: row.2,
        events: row.3,
        last: row.4,
    })
}

fn prune_endpoint_arguments(
    endpoint_id: Uuid,
    scan_before: DateTime<Utc>,
    after: Uuid,
    cutoffs: &Cutoffs,
    limit: i64,
) -> Result<PgArguments, DbError> {
    let mut args = PgArguments::default();
    let encode = |e| DbError::Query(sqlx::Error::Encode(e));
    args.add(endpoint_id).map_err(encode)?;
    args.add(uuid_v7_floor(scan_before)).map_err(encode)?;
    args.add(after).map_err(encode)?;
    args.add(&cutoffs.tenants).map_err(encode)?;
    args.add(&cutoffs.tenant_cutoffs).map_err(encode)?;
    args.add(cutoffs.default).map_err(encode)?;
    args.add(limit).map_err(encode)?;
    args.add(cutoffs.drop_below).map_err(encode)?;
    args.add(cutoffs.drop_grace.as_secs_f64()).map_err(encode)?;
    Ok(args)
}

/// `EXPLAIN` (not executed) of one of this module's statements with `args`, one line per
/// plan line, planned as every hookd connection plans (index paths only): for tests that
/// prove a pass reads by index ranges.
async fn explain(
    conn: &mut PgConnection,
    statement: &'static str,
    args: PgArguments,
) -> Result<Vec<String>, DbError> {
    // the only dynamic part is a constant prefix on a constant statement text
    let sql = format!("EXPLAIN {statement}");
    let mut tx = sqlx::Connection::begin(&mut *conn).await?;
    super::index_paths_only(&mut tx).await?;
    let plan = sqlx::query_scalar_with(sqlx::AssertSqlSafe(sql), args)
        .fetch_all(on(&mut *tx))
        .await?;
    tx.rollback().await?;
    Ok(plan)
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
    let args = prune_endpoint_arguments(endpoint_id, scan_before, Uuid::nil(), cutoffs, limit)?;
    explain(conn, PRUNE_ENDPOINT_SQL, args).await
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
    .fetch_one(on(conn))
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
    explain(
        conn,
        ORPHAN_EVENTS_SQL,
        orphan_arguments(Uuid::nil(), before, cutoffs, limit)?,
    )
    .await
}

/// The millisecond a UUIDv7 was minted (the inverse of [`uuid_v7_floor`]).
pub fn uuid_v7_time(id: Uuid) -> DateTime<Utc> {
    let mut ms = [0u8; 8];
    ms[2..].copy_from_slice(&id.as_bytes()[..6]);
    DateTime::from_timestamp_millis(i64::from_be_bytes(ms)).unwrap_or(DateTime::UNIX_EPOCH)
}

const DROPPED_DAY_EVENTS_SQL: &str = r#"
        WITH scanned AS (
            SELECT e.id, e.tenant, e.created_at FROM hookd.events e
            WHERE e.id > $1 AND e.id < $2
            ORDER BY e.id
            LIMIT $7
        ), doomed AS (
            SELECT e.id
            FROM scanned s
            JOIN hookd.events e ON e.id = s.id
            LEFT JOIN unnest($4::text[], $5::timestamptz[]) AS t(tenant, cutoff)
              ON t.tenant = s.tenant
            WHERE s.created_at < $3
              AND s.created_at < coalesce(t.cutoff, $6)
              -- the history below the lowest day is gone; only the queue can still hold
              -- a delivery of such an event (none should: its day would have stayed)
              AND (SELECT 1 FROM hookd.delivery_queue q WHERE q.event_id = s.id LIMIT 1) IS NULL
            FOR UPDATE OF e SKIP LOCKED
        ), gone AS (
            DELETE FROM hookd.events e USING doomed WHERE e.id = doomed.id RETURNING e.id
        )
        SELECT (SELECT count(*) FROM gone),
               CASE WHEN (SELECT count(*) FROM scanned) = $7
                    THEN (SELECT id FROM scanned ORDER BY id DESC LIMIT 1) END
        "#;

/// Where the events of dropped history days end: every event created a day or more before
/// the lowest history day that still exists (`lowest_day_lower`, that day's smallest id).
///
/// An event's deliveries get their ids (and so their history day) in the statement that
/// inserts the event, whose `created_at` is the moment of that insert (migration 0019),
/// so a delivery of such an event can only have lived in a day below the lowest: one that
/// has been dropped. A day's margin covers the statement and any clock step. None when
/// the lowest day is the open-ended one from before migration 0014.
pub fn dropped_days_end(lowest_day_lower: Uuid) -> Option<(Uuid, DateTime<Utc>)> {
    if lowest_day_lower.is_nil() {
        return None;
    }
    let created_below = uuid_v7_time(lowest_day_lower) - chrono::TimeDelta::days(1);
    Some((uuid_v7_floor(created_below), created_below))
}

/// Deletes up to `limit` expired events of dropped history days, reading at most `limit`
/// events upwards from `after` and below `end` (see [`dropped_days_end`]). Their history
/// is gone with the days, so no history partition is probed: one range scan of the
/// events' primary key, one probe of the queue per event, one delete. The row-by-row
/// orphan walk ([`prune_orphan_events_batch`]) probes every history day per event
/// instead, so its cost grows with the days kept: for 490,000 events of a dropped day,
/// 12.8-16.3 s with 34 days of history kept against 3.6-5.4 s here, and about the same
/// (4.9 s, 4.6 s) with 3 days kept (docs/retention-partitions.md). Returns (deleted,
/// where to continue: the last id read when the window was full).
pub async fn prune_dropped_day_events_batch(
    conn: &mut PgConnection,
    after: Uuid,
    end: (Uuid, DateTime<Utc>),
    cutoffs: &Cutoffs,
    limit: i64,
) -> Result<(i64, Option<Uuid>), DbError> {
    Ok(sqlx::query_as_with(
        DROPPED_DAY_EVENTS_SQL,
        dropped_day_events_arguments(after, end, cutoffs, limit)?,
    )
    .fetch_one(on(conn))
    .await?)
}

fn dropped_day_events_arguments(
    after: Uuid,
    end: (Uuid, DateTime<Utc>),
    cutoffs: &Cutoffs,
    limit: i64,
) -> Result<PgArguments, DbError> {
    let mut args = PgArguments::default();
    let encode = |e| DbError::Query(sqlx::Error::Encode(e));
    args.add(after).map_err(encode)?;
    args.add(end.0).map_err(encode)?;
    args.add(end.1).map_err(encode)?;
    args.add(&cutoffs.tenants).map_err(encode)?;
    args.add(&cutoffs.tenant_cutoffs).map_err(encode)?;
    args.add(cutoffs.default).map_err(encode)?;
    args.add(limit).map_err(encode)?;
    Ok(args)
}

/// `EXPLAIN` (not executed) of one batch of [`prune_dropped_day_events_batch`], for tests.
pub async fn explain_prune_dropped_day_events_batch(
    conn: &mut PgConnection,
    end: (Uuid, DateTime<Utc>),
    cutoffs: &Cutoffs,
    limit: i64,
) -> Result<Vec<String>, DbError> {
    explain(
        conn,
        DROPPED_DAY_EVENTS_SQL,
        dropped_day_events_arguments(Uuid::nil(), end, cutoffs, limit)?,
    )
    .await
}

/// One partition of `delivery_history` (a UTC day, or the range before migration 0014),
/// with its siblings in `delivery_attempts` and `dead_letters` under the same suffix.
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub struct HistoryDay {
    /// what follows `delivery_history_` in the partition's name
    pub suffix: String,
    /// the smallest id not in it (ids are UUIDv7: milliseconds first)
    pub upper: Uuid,
    /// the smallest id in it; nil for the open lower end
    pub lower: Uuid,
}

/// Creates the history partitions of today (UTC) and of the next `ahead` days that do not
/// exist yet; returns how many days exist afterwards (0 when another process is creating
/// them right now). A day is a free-standing table attached to its parent under SHARE
/// UPDATE EXCLUSIVE, which no enqueue, claim or outcome write conflicts with (migration
/// 0016); a wait on other upkeep is bounded by [`UPKEEP_LOCK_TIMEOUT`] and tried again at
/// the next call.
pub async fn ensure_history_days(conn: &mut PgConnection, ahead: i32) -> Result<i32, DbError> {
    let mut tx = sqlx::Connection::begin(&mut *conn).await?;
    sqlx::query("SELECT set_config('lock_timeout', $1, true)")
        .bind(UPKEEP_LOCK_TIMEOUT)
        .execute(on(&mut *tx))
        .await?;
    let n: i32 = sqlx::query_scalar("SELECT hookd.history_days_ensure($1)")
        .bind(ahead)
        .fetch_one(on(&mut *tx))
        .await?;
    tx.commit().await?;
    Ok(n)
}

/// Every dated partition of `delivery_history` whose ids all lie below `below`, oldest
/// first (the default partition, which has no range, is never listed).
pub async fn history_days_below(
    conn: &mut PgConnection,
    below: Uuid,
) -> Result<Vec<HistoryDay>, DbError> {
    Ok(sqlx::query_as(
        r#"
        SELECT suffix, upper, coalesce(lower, '00000000-0000-0000-0000-000000000000'::uuid) AS lower
        FROM (
            SELECT substr(c.relname, length('delivery_history_') + 1) AS suffix,
                   substring(pg_get_expr(c.relpartbound, c.oid) FROM $$TO \('([0-9a-f-]+)'\)$$)::uuid AS upper,
                   substring(pg_get_expr(c.relpartbound, c.oid) FROM $$FROM \('([0-9a-f-]+)'\)$$)::uuid AS lower
            FROM pg_inherits i
            JOIN pg_class c ON c.oid = i.inhrelid
            WHERE i.inhparent = 'hookd.delivery_history'::regclass
              AND pg_get_expr(c.relpartbound, c.oid) <> 'DEFAULT'
        ) p
        WHERE upper <= $1
        ORDER BY upper
        "#,
    )
    .bind(below)
    .fetch_all(on(conn))
    .await?)
}

/// Attempts at the day drop's NOWAIT lock within one pass.
const DROP_LOCK_TRIES: u32 = 25;

/// What became of one history day.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DayDrop {
    /// dropped: every row had expired; about this many deliveries (the planner's
    /// estimate) went with it
    Dropped { deliveries: i64 },
    /// a row is unexpired, or a delivery of that day is back in the queue (replayed or
    /// still retrying): kept, and its expired rows are deleted one by one
    Kept,
    /// the tables were busy for longer than the lock timeout: tried at the next pass
    Busy,
}

/// Whether a day must stay: one of its deliveries is back in the queue, or one of its
/// rows has not expired by its tenant's cutoff.
async fn day_is_live(
    conn: &mut PgConnection,
    day: &HistoryDay,
    cutoffs: &Cutoffs,
) -> Result<bool, DbError> {
    let history = format!("hookd.\"delivery_history_{}\"", day.suffix);
    let oldest_cutoff = cutoffs
        .tenant_cutoffs
        .iter()
        .copied()
        .chain([cutoffs.default])
        .min()
        .unwrap_or(cutoffs.default);
    // The name comes from the catalog (a partition hookd created); quoted as an
    // identifier all the same. The BRIN index on updated_at finds the few block ranges
    // that may hold a row updated after the oldest cutoff; each such row is then judged
    // by its own tenant's cutoff.
    let check = format!(
        r#"
        SELECT EXISTS (SELECT 1 FROM hookd.delivery_queue q WHERE q.id >= $1 AND q.id < $2)
            OR EXISTS (
                SELECT 1 FROM {history} h
                LEFT JOIN unnest($3::text[], $4::timestamptz[]) AS t(tenant, cutoff)
                  ON t.tenant = h.tenant
                WHERE h.updated_at >= $5 AND h.updated_at >= coalesce(t.cutoff, $6))
        "#
    );
    let live: bool = sqlx::query_scalar(sqlx::AssertSqlSafe(check))
        .bind(day.lower)
        .bind(day.upper)
        .bind(&cutoffs.tenants)
        .bind(&cutoffs.tenant_cutoffs)
        .bind(oldest_cutoff)
        .bind(cutoffs.default)
        .fetch_one(on(conn))
        .await?;
    Ok(live)
}

/// Drops one history day (its partitions of deliveries, attempts and dead letters) if
/// every delivery in it has expired by its tenant's cutoff and none of that day's
/// deliveries is back in the queue.
///
/// The three parents are locked first, so that no replay can move a row of the day into
/// the queue between the check and the drop, and held for two index probes and the
/// drop. The lock is taken with NOWAIT, a few times a short while apart: a drop never
/// waits in a lock queue, so it neither makes enqueues, claims or outcome batches queue
/// behind a waiting lock, nor closes a cycle with a statement that takes these tables in
/// another order (an outcome batch takes the attempts and dead letters when it starts and
/// the history when a row moves; a replay takes them the other way round). A day that
/// stays busy is tried again at the next pass.
pub async fn drop_history_day(
    conn: &mut PgConnection,
    day: &HistoryDay,
    cutoffs: &Cutoffs,
) -> Result<DayDrop, DbError> {
    // a day still in use is left alone without locking anything
    let mut tx = sqlx::Connection::begin(&mut *conn).await?;
    sqlx::query("SET LOCAL enable_bitmapscan = on")
        .execute(on(&mut *tx))
        .await?;
    let live = day_is_live(&mut tx, day, cutoffs).await?;
    tx.rollback().await?;
    if live {
        return Ok(DayDrop::Kept);
    }
    let mut tries = 0;
    let mut tx = loop {
        tries += 1;
        let mut tx = sqlx::Connection::begin(&mut *conn).await?;
        // the day's check wants a bitmap of the block-range index on updated_at, which the
        // connection's settings price out (`db::INDEX_PATHS_ONLY`)
        sqlx::query("SET LOCAL enable_bitmapscan = on")
            .execute(on(&mut *tx))
            .await?;
        let locked = sqlx::query(
            "LOCK TABLE hookd.delivery_attempts, hookd.dead_letters, hookd.delivery_history \
             IN ACCESS EXCLUSIVE MODE NOWAIT",
        )
        .execute(on(&mut *tx))
        .await;
        match locked {
            Ok(_) => break tx,
            Err(e) => {
                let e = DbError::from(e);
                // 55P03: lock_not_available
                if e.sqlstate().as_deref() != Some("55P03") {
                    return Err(e);
                }
                tx.rollback().await?;
                if tries >= DROP_LOCK_TRIES {
                    return Ok(DayDrop::Busy);
                }
                tokio::time::sleep(std::time::Duration::from_millis(20)).await;
            }
        }
    };
    // under the lock, the check again: a replay may have moved a row since
    let live = day_is_live(&mut tx, day, cutoffs).await?;
    if live {
        tx.rollback().await?;
        return Ok(DayDrop::Kept);
    }
    let history = format!("hookd.\"delivery_history_{}\"", day.suffix);
    // the planner's estimate: counting would read the whole day under the lock
    let estimate = format!(
        "SELECT greatest(reltuples, 0)::bigint FROM pg_class WHERE oid = '{history}'::regclass"
    );
    let deliveries: i64 = sqlx::query_scalar(sqlx::AssertSqlSafe(estimate))
        .fetch_one(on(&mut *tx))
        .await?;
    let drop = format!(
        "DROP TABLE IF EXISTS hookd.\"dead_letters_{s}\", hookd.\"delivery_attempts_{s}\", {history}",
        s = day.suffix
    );
    sqlx::query(sqlx::AssertSqlSafe(drop))
        .execute(on(&mut *tx))
        .await?;
    tx.commit().await?;
    Ok(DayDrop::Dropped { deliveries })
}
