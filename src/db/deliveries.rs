//! `hookd.deliveries`: the queue. Claim, fenced batch completion, replay and reads.

use chrono::{DateTime, Utc};
use sqlx::postgres::PgArguments;
use sqlx::{Arguments, PgConnection, PgPool};
use uuid::Uuid;

use super::DbError;

pub const CLAIMABLE: [&str; 3] = ["pending", "in_progress", "failed"];

/// What one worker asks for in one claim.
#[derive(Debug, Clone)]
pub struct ClaimRequest {
    pub worker_id: Uuid,
    pub limit: i64,
    pub lease_secs: f64,
    /// per-endpoint cap on rows this worker holds at once
    pub per_endpoint_cap: i32,
    /// endpoints this worker already has rows in flight for, and how many
    pub busy: Vec<(Uuid, i32)>,
    /// the clock (tests pass a fixed time; production passes None = the database's now())
    pub now: Option<DateTime<Utc>>,
}

/// Everything a worker needs to deliver, returned by the claim itself: no per-delivery
/// SELECT afterwards.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct ClaimedDelivery {
    pub id: Uuid,
    pub event_id: Uuid,
    pub endpoint_id: Uuid,
    pub tenant: String,
    /// the attempt number this claim started (1 for the first); the completion fence
    pub attempts: i32,
    pub lease_until: DateTime<Utc>,
    pub event_type: String,
    pub payload: String,
    pub event_created_at: DateTime<Utc>,
    pub url: String,
    pub headers: sqlx::types::Json<serde_json::Value>,
    pub timeout_ms: Option<i32>,
    pub max_attempts: Option<i32>,
    pub retry_schedule_secs: Option<Vec<i32>>,
    /// Current and in-grace signing secrets, newest first, still sealed: row ids, key
    /// ids and ciphertexts, index for index. The dispatcher opens them through its cache,
    /// so the AEAD runs once per secret row, not once per delivery.
    pub secret_ids: Vec<i64>,
    pub secret_key_ids: Vec<String>,
    pub secret_ciphertexts: Vec<Vec<u8>>,
}

/// The claim statement (see [`claim`]); shared with [`explain_claim`] so the plan a test
/// inspects is the plan of exactly this text.
const CLAIM_SQL: &str = r#"
        WITH clock AS (SELECT coalesce($6::timestamptz, now()) AS now),
        busy AS (
            SELECT * FROM unnest($4::uuid[], $5::int[]) AS b(endpoint_id, n)
        ), probes AS (
            UPDATE hookd.endpoints e
            SET circuit_state = 'half_open',
                circuit_open_until = (SELECT now FROM clock) + make_interval(secs => $3)
            WHERE e.state = 'active' AND e.circuit_state <> 'closed'
              AND e.circuit_open_until <= (SELECT now FROM clock)
              AND NOT EXISTS (SELECT 1 FROM busy WHERE busy.endpoint_id = e.id)
            RETURNING e.id, 1 AS quota
        ), eligible AS (
            SELECT e.id,
                   least(coalesce(e.max_in_flight, $7), $7) - coalesce(b.n, 0) AS quota
            FROM hookd.endpoints e LEFT JOIN busy b ON b.endpoint_id = e.id
            WHERE e.state = 'active' AND e.circuit_state = 'closed'
            UNION ALL
            SELECT id, quota FROM probes
        ), picked AS (
            SELECT c.id, c.visible_at, el.id AS endpoint_id
            FROM eligible el
            CROSS JOIN LATERAL (
                SELECT d.id, d.visible_at FROM hookd.deliveries d
                WHERE d.endpoint_id = el.id
                  AND d.status IN ('pending', 'in_progress', 'failed')
                  AND d.visible_at <= (SELECT now FROM clock)
                ORDER BY d.visible_at
                LIMIT el.quota
                FOR UPDATE OF d SKIP LOCKED
            ) c
            WHERE el.quota > 0
            ORDER BY c.visible_at
            LIMIT $2
        ), sec AS (
            -- once per claimed endpoint, not per row. Legacy plaintext rows (from before
            -- migration 0004) are never handed out; `hookd rekey` or a dispatcher's
            -- start encrypts them.
            SELECT pe.endpoint_id, x.*
            FROM (SELECT DISTINCT endpoint_id FROM picked) pe
            CROSS JOIN LATERAL (
                SELECT coalesce(array_agg(s.id ORDER BY s.id DESC), '{}') AS secret_ids,
                       coalesce(array_agg(s.key_id ORDER BY s.id DESC), '{}') AS secret_key_ids,
                       coalesce(array_agg(s.ciphertext ORDER BY s.id DESC), '{}') AS secret_ciphertexts
                FROM hookd.endpoint_secrets s
                WHERE s.endpoint_id = pe.endpoint_id AND s.ciphertext IS NOT NULL
                  AND (s.not_after IS NULL OR s.not_after > (SELECT now FROM clock))
            ) x
        )
        UPDATE hookd.deliveries d
        SET status = 'in_progress',
            attempts = d.attempts + 1,
            visible_at = (SELECT now FROM clock) + make_interval(secs => $3),
            locked_by = $1,
            updated_at = (SELECT now FROM clock)
        FROM picked p, sec, hookd.events ev, hookd.endpoints ep
        WHERE d.id = p.id AND sec.endpoint_id = p.endpoint_id AND ev.id = d.event_id
          AND ep.id = d.endpoint_id
        RETURNING d.id, d.event_id, d.endpoint_id, d.tenant, d.attempts,
                  d.visible_at AS lease_until,
                  ev.event_type, ev.payload, ev.created_at AS event_created_at,
                  ep.url, ep.headers, ep.timeout_ms, ep.max_attempts, ep.retry_schedule_secs,
                  sec.secret_ids, sec.secret_key_ids, sec.secret_ciphertexts
        "#;

/// Leases up to `limit` due deliveries in one statement.
///
/// The walk is endpoint by endpoint: for each active endpoint with a closed circuit (or
/// whose open circuit may now be probed, which this statement marks half-open so only one
/// replica probes), one range scan of `deliveries_claimable` (endpoint_id, visible_at)
/// takes its oldest due rows up to the endpoint's remaining in-flight quota. Rows of
/// paused, disabled or open endpoints are never read, so an open circuit costs nothing
/// and its backlog is not re-deferred. Due rows include in_progress rows whose lease
/// lapsed: the lease expiry lives in the same visibility column.
pub async fn claim(pool: &PgPool, req: &ClaimRequest) -> Result<Vec<ClaimedDelivery>, DbError> {
    let rows = sqlx::query_as_with::<_, ClaimedDelivery, _>(CLAIM_SQL, claim_arguments(req)?)
        .fetch_all(pool)
        .await?;
    Ok(rows)
}

/// The claim's parameters, shared by `claim` and `explain_claim` so the plan a test
/// inspects is the plan production runs.
fn claim_arguments(req: &ClaimRequest) -> Result<PgArguments, DbError> {
    let busy_ids: Vec<Uuid> = req.busy.iter().map(|b| b.0).collect();
    let busy_counts: Vec<i32> = req.busy.iter().map(|b| b.1).collect();
    let mut args = PgArguments::default();
    let encode = |e| DbError::Query(sqlx::Error::Encode(e));
    args.add(req.worker_id).map_err(encode)?;
    args.add(req.limit).map_err(encode)?;
    args.add(req.lease_secs).map_err(encode)?;
    args.add(busy_ids).map_err(encode)?;
    args.add(busy_counts).map_err(encode)?;
    args.add(req.now).map_err(encode)?;
    args.add(req.per_endpoint_cap).map_err(encode)?;
    Ok(args)
}

/// `EXPLAIN (ANALYZE, BUFFERS)` of the claim statement with `req`'s parameters, executed in
/// a transaction that is rolled back (nothing is leased). For tests and benchmarks that
/// prove the claim is an index range scan whatever the backlog. One line per plan line.
pub async fn explain_claim(pool: &PgPool, req: &ClaimRequest) -> Result<Vec<String>, DbError> {
    let sql = format!("EXPLAIN (ANALYZE, BUFFERS) {CLAIM_SQL}");
    let mut tx = pool.begin().await?;
    // the only dynamic part is a constant prefix on the constant claim text
    let plan: Vec<String> =
        sqlx::query_scalar_with(sqlx::AssertSqlSafe(sql), claim_arguments(req)?)
            .fetch_all(&mut *tx)
            .await?;
    tx.rollback().await?;
    Ok(plan)
}

/// The earliest time any claimable delivery of a claimable endpoint becomes due, for the
/// dispatcher's next-due timer. One index probe per active endpoint.
pub async fn next_due(pool: &PgPool) -> Result<Option<DateTime<Utc>>, DbError> {
    Ok(sqlx::query_scalar(
        r#"
        SELECT min(n.visible_at) FROM hookd.endpoints e
        CROSS JOIN LATERAL (
            SELECT d.visible_at FROM hookd.deliveries d
            WHERE d.endpoint_id = e.id AND d.status IN ('pending', 'in_progress', 'failed')
            ORDER BY d.visible_at LIMIT 1
        ) n
        WHERE e.state = 'active'
        "#,
    )
    .fetch_one(pool)
    .await?)
}

/// The terminal or retry state a worker writes for one attempt.
#[derive(Debug, Clone)]
pub struct Completion {
    pub delivery_id: Uuid,
    /// the attempt number from the claim (fence)
    pub attempt: i32,
    /// `succeeded`, `failed` (retry at `retry_at`) or `dead`
    pub status: &'static str,
    pub retry_at: Option<DateTime<Utc>>,
    pub started_at: DateTime<Utc>,
    pub duration_ms: i32,
    pub status_code: Option<i32>,
    pub error_class: Option<&'static str>,
    pub error: Option<String>,
    pub response_snippet: Option<String>,
    /// reason recorded on the dead-letter row when `status` is `dead`
    pub dead_reason: Option<String>,
}

/// Writes a batch of outcomes in one statement: the delivery update is fenced on lease
/// ownership (`locked_by = worker AND attempts = attempt AND status = in_progress`), and
/// the attempt log and dead-letter rows are written only for rows that passed the fence.
/// Returns the ids that passed; any other id lost its lease and nothing was written for it.
pub async fn complete(
    conn: &mut PgConnection,
    worker_id: Uuid,
    batch: &[Completion],
) -> Result<Vec<Uuid>, DbError> {
    if batch.is_empty() {
        return Ok(Vec::new());
    }
    let n = batch.len();
    let mut ids = Vec::with_capacity(n);
    let mut attempts = Vec::with_capacity(n);
    let mut statuses = Vec::with_capacity(n);
    let mut retry_at = Vec::with_capacity(n);
    let mut started = Vec::with_capacity(n);
    let mut duration = Vec::with_capacity(n);
    let mut codes = Vec::with_capacity(n);
    let mut classes = Vec::with_capacity(n);
    let mut errors = Vec::with_capacity(n);
    let mut snippets = Vec::with_capacity(n);
    let mut reasons = Vec::with_capacity(n);
    for c in batch {
        ids.push(c.delivery_id);
        attempts.push(c.attempt);
        statuses.push(c.status);
        retry_at.push(c.retry_at);
        started.push(c.started_at);
        duration.push(c.duration_ms);
        codes.push(c.status_code);
        classes.push(c.error_class);
        errors.push(c.error.as_deref());
        snippets.push(c.response_snippet.as_deref());
        reasons.push(c.dead_reason.as_deref());
    }
    let done: Vec<(Uuid,)> = sqlx::query_as(
        r#"
        WITH i AS (
            SELECT * FROM unnest($2::uuid[], $3::int[], $4::text[], $5::timestamptz[], $6::timestamptz[],
                                 $7::int[], $8::int[], $9::text[], $10::text[], $11::text[], $12::text[])
              AS i(id, attempt, status, retry_at, started_at, duration_ms, status_code, error_class,
                   error, snippet, dead_reason)
        ), fenced AS (
            -- One primary-key probe per outcome, locking the rows that pass the fence.
            -- Written as a LATERAL so the plan is driven from the batch whatever the
            -- statistics say: with the fence as a plain join filter the planner expects
            -- ~1 in_progress row (true of the table as a whole), scans the table and
            -- joins it to the batch in a nested loop: 0.3-0.8 s per 512 outcomes on a
            -- 20 k-row table, measured by `hookd bench`.
            SELECT x.id FROM i
            CROSS JOIN LATERAL (
                SELECT d.id FROM hookd.deliveries d
                WHERE d.id = i.id AND d.locked_by = $1 AND d.attempts = i.attempt
                  AND d.status = 'in_progress'
                FOR UPDATE OF d
            ) x
        ), upd AS (
            UPDATE hookd.deliveries d
            SET status = i.status,
                visible_at = coalesce(i.retry_at, d.visible_at),
                locked_by = NULL,
                last_status_code = i.status_code,
                last_error = i.error,
                updated_at = now(),
                completed_at = CASE WHEN i.status IN ('succeeded', 'dead') THEN now() END
            -- no fence here: `fenced` checked it under the row locks this transaction now
            -- holds, so nobody can have changed these rows since (and restating it here
            -- brings the mis-estimated scan back)
            FROM fenced f JOIN i ON i.id = f.id
            WHERE d.id = f.id
            RETURNING d.id, d.endpoint_id, d.tenant
        ), log AS (
            INSERT INTO hookd.delivery_attempts
                (delivery_id, attempt, started_at, duration_ms, status_code, error_class, error, response_snippet)
            SELECT i.id, i.attempt, i.started_at, i.duration_ms, i.status_code, i.error_class, i.error, i.snippet
            FROM i JOIN upd USING (id)
        ), dead AS (
            INSERT INTO hookd.dead_letters (delivery_id, endpoint_id, tenant, reason, attempts)
            SELECT i.id, upd.endpoint_id, upd.tenant, coalesce(i.dead_reason, 'exhausted'), i.attempt
            FROM i JOIN upd USING (id)
            WHERE i.status = 'dead'
            ON CONFLICT (delivery_id) DO UPDATE
              SET reason = EXCLUDED.reason, attempts = EXCLUDED.attempts, dead_at = now()
        )
        SELECT id FROM upd
        "#,
    )
    .bind(worker_id)
    .bind(&ids)
    .bind(&attempts)
    .bind(&statuses)
    .bind(&retry_at)
    .bind(&started)
    .bind(&duration)
    .bind(&codes)
    .bind(&classes)
    .bind(&errors)
    .bind(&snippets)
    .bind(&reasons)
    .fetch_all(conn)
    .await?;
    Ok(done.into_iter().map(|(id,)| id).collect())
}

/// Hands back leases of rows a stopping worker claimed but never started: due now again,
/// and the attempt it never made is not counted.
pub async fn release(
    pool: &PgPool,
    worker_id: Uuid,
    leases: &[(Uuid, i32)],
) -> Result<u64, DbError> {
    let ids: Vec<Uuid> = leases.iter().map(|l| l.0).collect();
    let attempts: Vec<i32> = leases.iter().map(|l| l.1).collect();
    let r = sqlx::query(
        r#"
        UPDATE hookd.deliveries d
        SET status = CASE WHEN d.attempts > 1 THEN 'failed' ELSE 'pending' END,
            attempts = d.attempts - 1, visible_at = now(), locked_by = NULL, updated_at = now()
        FROM unnest($2::uuid[], $3::int[]) AS i(id, attempt)
        WHERE d.id = i.id AND d.locked_by = $1 AND d.attempts = i.attempt AND d.status = 'in_progress'
        "#,
    )
    .bind(worker_id)
    .bind(&ids)
    .bind(&attempts)
    .execute(pool)
    .await?;
    Ok(r.rows_affected())
}

/// Outcome of a replay request for one delivery.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReplayOutcome {
    Replayed,
    Leased,
    NotFound,
}

/// Makes a delivery due now with its attempts reset and the same id, and removes its
/// dead-letter row. Refused while a worker holds an unexpired lease, so a replay never
/// races a send in progress. `tenant` scopes the lookup when set.
pub async fn replay(
    pool: &PgPool,
    id: Uuid,
    tenant: Option<&str>,
) -> Result<ReplayOutcome, DbError> {
    let row: Option<(bool,)> = sqlx::query_as(
        r#"
        WITH target AS (
            SELECT id, status = 'in_progress' AND visible_at > now() AS leased
            FROM hookd.deliveries
            WHERE id = $1 AND ($2::text IS NULL OR tenant = $2)
            FOR UPDATE
        ), upd AS (
            UPDATE hookd.deliveries d
            SET status = 'pending', attempts = 0, visible_at = now(), locked_by = NULL,
                completed_at = NULL, updated_at = now()
            FROM target WHERE d.id = target.id AND NOT target.leased
            RETURNING d.id
        ), undead AS (
            DELETE FROM hookd.dead_letters WHERE delivery_id IN (SELECT id FROM upd)
        )
        SELECT leased FROM target
        "#,
    )
    .bind(id)
    .bind(tenant)
    .fetch_optional(pool)
    .await?;
    Ok(match row {
        None => ReplayOutcome::NotFound,
        Some((true,)) => ReplayOutcome::Leased,
        Some((false,)) => ReplayOutcome::Replayed,
    })
}

/// Replays an endpoint's deliveries created in [since, until) (either end open when
/// `None`) whose status is one of `statuses`, skipping leased ones; at most `limit` per
/// call. `tenant` confines it to that tenant's deliveries (an endpoint whose tenant was
/// changed keeps its older deliveries under the old one). Returns (replayed, skipped
/// because leased).
pub async fn replay_endpoint(
    pool: &PgPool,
    endpoint_id: Uuid,
    since: Option<DateTime<Utc>>,
    until: Option<DateTime<Utc>>,
    statuses: &[String],
    limit: i64,
    tenant: Option<&str>,
) -> Result<(i64, i64), DbError> {
    let row: (i64, i64) = sqlx::query_as(
        r#"
        WITH target AS (
            SELECT id, status = 'in_progress' AND visible_at > now() AS leased
            FROM hookd.deliveries
            WHERE endpoint_id = $1
              AND ($2::timestamptz IS NULL OR created_at >= $2)
              AND ($3::timestamptz IS NULL OR created_at < $3)
              AND status = ANY($4)
              AND ($6::text IS NULL OR tenant = $6)
            ORDER BY created_at
            LIMIT $5
            FOR UPDATE SKIP LOCKED
        ), upd AS (
            UPDATE hookd.deliveries d
            SET status = 'pending', attempts = 0, visible_at = now(), locked_by = NULL,
                completed_at = NULL, updated_at = now()
            FROM target WHERE d.id = target.id AND NOT target.leased
            RETURNING d.id
        ), undead AS (
            DELETE FROM hookd.dead_letters WHERE delivery_id IN (SELECT id FROM upd)
        )
        SELECT (SELECT count(*) FROM upd), (SELECT count(*) FROM target WHERE leased)
        "#,
    )
    .bind(endpoint_id)
    .bind(since)
    .bind(until)
    .bind(statuses)
    .bind(limit)
    .bind(tenant)
    .fetch_one(pool)
    .await?;
    Ok(row)
}

#[derive(Debug, Clone, sqlx::FromRow)]
pub struct DeliveryRow {
    pub id: Uuid,
    pub event_id: Uuid,
    pub endpoint_id: Uuid,
    pub tenant: String,
    pub status: String,
    pub attempts: i32,
    pub visible_at: DateTime<Utc>,
    pub last_status_code: Option<i32>,
    pub last_error: Option<String>,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
    pub completed_at: Option<DateTime<Utc>>,
}

/// The delivery with this id; with `tenant` set, only if it is that tenant's.
pub async fn get(
    pool: &PgPool,
    id: Uuid,
    tenant: Option<&str>,
) -> Result<Option<DeliveryRow>, DbError> {
    Ok(sqlx::query_as::<_, DeliveryRow>(
        "SELECT id, event_id, endpoint_id, tenant, status, attempts, visible_at, last_status_code,
                last_error, created_at, updated_at, completed_at
         FROM hookd.deliveries WHERE id = $1 AND ($2::text IS NULL OR tenant = $2)",
    )
    .bind(id)
    .bind(tenant)
    .fetch_optional(pool)
    .await?)
}

pub async fn for_event(pool: &PgPool, event_id: Uuid) -> Result<Vec<DeliveryRow>, DbError> {
    Ok(sqlx::query_as::<_, DeliveryRow>(
        "SELECT id, event_id, endpoint_id, tenant, status, attempts, visible_at, last_status_code,
                last_error, created_at, updated_at, completed_at
         FROM hookd.deliveries WHERE event_id = $1 ORDER BY id",
    )
    .bind(event_id)
    .fetch_all(pool)
    .await?)
}

/// (claimable rows capped at 100 000, age in seconds of the oldest due row of an active
/// endpoint). Both are bounded index scans, cheap enough to sample every few seconds.
pub async fn backlog_sample(pool: &PgPool) -> Result<(i64, i64), DbError> {
    Ok(sqlx::query_as(
        r#"
        SELECT
          (SELECT count(*) FROM (SELECT 1 FROM hookd.deliveries
                                  WHERE status IN ('pending', 'in_progress', 'failed') LIMIT 100000) b),
          coalesce((SELECT extract(epoch FROM now() - min(n.visible_at))::bigint
                      FROM hookd.endpoints e
                      CROSS JOIN LATERAL (
                        SELECT d.visible_at FROM hookd.deliveries d
                        WHERE d.endpoint_id = e.id AND d.status IN ('pending', 'in_progress', 'failed')
                          AND d.visible_at <= now()
                        ORDER BY d.visible_at LIMIT 1) n
                     WHERE e.state = 'active'), 0)
        "#,
    )
    .fetch_one(pool)
    .await?)
}

/// The work dispatchers have right now, for the autoscaler: deliveries that are due or in
/// flight, of endpoints a claim would serve (active, circuit closed or ready for a probe).
/// Retries waiting for their time and held endpoints do not need pods. One bounded range
/// scan of `deliveries_claimable` per active endpoint, each stopping at `cap_per_endpoint`.
pub async fn dispatch_backlog(pool: &PgPool, cap_per_endpoint: i64) -> Result<i64, DbError> {
    Ok(sqlx::query_scalar(
        r#"
        SELECT coalesce(sum(c.n), 0)::bigint FROM hookd.endpoints e
        CROSS JOIN LATERAL (
            SELECT count(*) AS n FROM (
                SELECT 1 FROM hookd.deliveries d
                WHERE d.endpoint_id = e.id AND d.status IN ('pending', 'in_progress', 'failed')
                  AND (d.visible_at <= now() OR d.status = 'in_progress')
                LIMIT $1) x
        ) c
        WHERE e.state = 'active'
          AND (e.circuit_state = 'closed' OR e.circuit_open_until <= now())
        "#,
    )
    .bind(cap_per_endpoint)
    .fetch_one(pool)
    .await?)
}
