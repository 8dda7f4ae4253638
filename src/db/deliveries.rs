//! `hookd.deliveries`: the queue. Claim, fenced batch completion, replay and reads.

use chrono::{DateTime, Utc};
use sqlx::postgres::PgArguments;
use sqlx::{Arguments, PgConnection, PgPool};
use uuid::Uuid;

use super::{DbError, on};
use crate::domain::{DeliveryStatus, ErrorClass};

/// The statuses a claim takes: the predicate of the partial index `deliveries_claimable`
/// and of every query that counts the backlog (a test in tests/dispatch.rs reads the
/// index's predicate back from the database).
pub const CLAIMABLE: [DeliveryStatus; 3] = [
    DeliveryStatus::Pending,
    DeliveryStatus::InProgress,
    DeliveryStatus::Failed,
];

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
    /// the dispatcher's max attempts for endpoints without their own: a lapsed lease
    /// re-claimed at the maximum is sent again without counting past it
    pub default_max_attempts: i32,
}

/// Everything a worker needs to deliver, returned by the claim itself: no per-delivery
/// SELECT afterwards.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct ClaimedDelivery {
    pub id: Uuid,
    pub event_id: Uuid,
    pub endpoint_id: Uuid,
    pub tenant: String,
    /// the consumer the delivery is for; None for a tenant-wide endpoint's
    pub consumer: Option<String>,
    /// the attempt number this claim started (1 for the first) since the last replay;
    /// what the retry policy counts
    pub attempts: i32,
    /// this claim's fence: the outcome is written only while the row still carries it
    pub claim_token: Uuid,
    /// every send of this delivery, never reset; numbers the attempt log
    pub attempt_seq: i32,
    /// the endpoint configuration this send used (see `endpoints.config_version`)
    pub config_version: i64,
    pub lease_until: DateTime<Utc>,
    pub event_type: String,
    pub payload: String,
    pub event_created_at: DateTime<Utc>,
    /// an inbound event's source and the provider's id for it (migration 0026)
    pub source: Option<String>,
    pub source_event_id: Option<String>,
    /// the producer's W3C trace context (migration 0031)
    pub traceparent: Option<String>,
    pub tracestate: Option<String>,
    /// in an ordering key's line (migration 0034): its end lets the key's next one go
    pub ordered: bool,
    pub url: String,
    pub headers: sqlx::types::Json<serde_json::Value>,
    pub timeout_ms: Option<i32>,
    pub max_attempts: Option<i32>,
    pub retry_schedule_secs: Option<Vec<i32>>,
    /// the endpoint's own cap on deliveries in flight, below the dispatcher's (None: the
    /// dispatcher's): a freed slot of an endpoint at its cap is worth a scan
    pub max_in_flight: Option<i32>,
    /// Current and in-grace signing secrets, newest first, still sealed: row ids, key
    /// ids and ciphertexts, index for index. The dispatcher opens them through its cache,
    /// so the AEAD runs once per secret row, not once per delivery.
    pub secret_ids: Vec<i64>,
    pub secret_key_ids: Vec<String>,
    pub secret_ciphertexts: Vec<Vec<u8>>,
}

/// The claim statement around the CTE `due` that picks the endpoints it serves: the
/// scan's ([`CLAIM_SQL`]) or the handed deliveries' ([`CLAIM_HANDED_SQL`]). One text, so
/// both lease by the same rules (caps, shares, circuits, rate limits, lines).
macro_rules! claim_sql {
    ($due:literal) => {
        concat!(
            r#"
        WITH clock AS (
            -- Leases commit asynchronously (invariant 9): one lost in a database crash
            -- re-sends a delivery, never drops one. Set here, not by a SET LOCAL
            -- round trip, because the claim runs as a single-statement transaction.
            SELECT coalesce($6::timestamptz, now()) AS now,
                   set_config('synchronous_commit', 'off', true) AS async_commit
        ), busy AS (
            SELECT * FROM unnest($4::uuid[], $5::int[]) AS b(endpoint_id, n)
        ), tenant_busy AS (
            SELECT * FROM unnest($9::text[], $10::int[], $12::int[]) AS t(tenant, n, consumer_cap)
        ), consumer_busy AS (
            -- '' stands for a tenant's tenant-wide endpoints (a consumer uid is never empty)
            SELECT * FROM unnest($14::text[], $15::text[], $16::int[]) AS c(tenant, consumer, n)
        ), tenants AS (
            -- Every tenant with a queue entry: a loose scan of endpoint_queue_tenant_turn,
            -- one probe per tenant whatever its number of entries (migration 0037).
            SELECT t.tenant FROM hookd.endpoint_queue_tenants() t(tenant)
        ), "#,
            $due,
            r#"        ), settings AS (
            SELECT du.endpoint_id, du.tenant, du.turn_at, e.config_version, e.url, e.headers,
                   e.timeout_ms, e.max_attempts, e.retry_schedule_secs, e.max_in_flight,
                   e.circuit_state <> 'closed' AS probe,
                   e.rate_per_second IS NOT NULL AS limited,
                   least(
                       CASE WHEN e.circuit_state <> 'closed'
                            -- a circuit whose cool-down is over gets one probe, and none
                            -- from a worker that still has a send in flight to it
                            THEN CASE WHEN b.n IS NULL THEN 1 ELSE 0 END
                            ELSE least(coalesce(e.max_in_flight, $7), $7) - coalesce(b.n, 0)
                       END,
                       -- a rate-limited endpoint: the whole tokens in its bucket
                       -- (migration 0032), charged under its row lock below
                       CASE WHEN e.rate_per_second IS NULL THEN $7
                            ELSE floor(hookd.rate_tokens(e.rate_per_second, e.rate_burst,
                                       e.rate_tokens, e.rate_at, (SELECT now FROM clock)))::int
                       END) AS own,
                   $11 - coalesce(tb.n, 0) AS tenant_left,
                   coalesce(e.consumer, '') AS consumer,
                   coalesce(tb.consumer_cap, $13) - coalesce(cb.n, 0) AS consumer_left
            FROM due du
            -- a primary-key probe per due endpoint (LIMIT 1 keeps the planner from
            -- turning it into a merge join that walks the endpoints index from its start)
            CROSS JOIN LATERAL (
                SELECT * FROM hookd.endpoints e WHERE e.id = du.endpoint_id LIMIT 1
            ) e
            LEFT JOIN busy b ON b.endpoint_id = du.endpoint_id
            LEFT JOIN tenant_busy tb ON tb.tenant = du.tenant
            LEFT JOIN consumer_busy cb
                ON cb.tenant = du.tenant AND cb.consumer = coalesce(e.consumer, '')
            WHERE e.state = 'active'
              AND (e.circuit_state = 'closed' OR e.circuit_open_until <= (SELECT now FROM clock))
        ), quota AS (
            -- What each endpoint can actually take: its due rows, counted up to its own
            -- quota (an index range scan of at most that many entries, no lock). The
            -- shares below charge an endpoint this, not its full quota: charged 32 each,
            -- a claim of 250 served 7 endpoints of one due row, and a tenant's share of
            -- 225 went to 7 entries with nothing due at all.
            SELECT s.*, greatest(0, least(s.own, a.avail)) AS take, a.avail
            FROM settings s
            CROSS JOIN LATERAL (
                SELECT count(*)::int AS avail FROM (
                    SELECT 1 FROM hookd.deliveries d
                    WHERE d.endpoint_id = s.endpoint_id
                      AND d.status IN ('pending', 'in_progress', 'failed')
                      AND d.visible_at <= (SELECT now FROM clock)
                    LIMIT greatest(s.own, 1)
                ) x
            ) a
        ), rechecks AS (
            -- an entry whose turn came with nothing due is early: the next fold puts it
            -- right (migration 0015), so it is never read at the head of the line again
            INSERT INTO hookd.endpoint_rechecks (endpoint_id)
            SELECT endpoint_id FROM quota WHERE avail = 0
        ), own_share AS (
            -- A consumer's rows stop at what is left of its share of its tenant's, then
            -- (below) a tenant's at what is left of its share, each counting every
            -- endpoint before as taking what it can take: never more rows locked than
            -- returned. In this order, so an endpoint its consumer's share holds back
            -- does not use up its tenant's.
            SELECT *, least(take, greatest(0, consumer_left
                       - (sum(take) OVER wc - take))) AS own_left
            FROM quota
            WINDOW wc AS (PARTITION BY tenant, consumer ORDER BY turn_at, endpoint_id
                          ROWS UNBOUNDED PRECEDING)
        ), eligible AS (
            SELECT endpoint_id, probe, limited, turn_at, config_version, url, headers, timeout_ms,
                   max_attempts, retry_schedule_secs, max_in_flight,
                   least(own_left, greatest(0, tenant_left
                       - (sum(greatest(own_left, 0)) OVER w - greatest(own_left, 0)))) AS quota
            FROM own_share
            WINDOW w AS (PARTITION BY tenant ORDER BY turn_at, endpoint_id
                         ROWS UNBOUNDED PRECEDING)
        ), picked AS (
            -- endpoint by endpoint in turn order, each one's oldest due rows up to its
            -- quota: a range scan of deliveries_claimable (endpoint_id, visible_at) that
            -- locks only the rows it returns
            SELECT c.id, c.event_id, el.endpoint_id, el.probe, el.limited, el.config_version, el.url,
                   el.headers, el.timeout_ms, el.max_attempts, el.retry_schedule_secs, el.max_in_flight,
                   el.secret_ids, el.secret_key_ids, el.secret_ciphertexts
            FROM (
                -- Each endpoint's signing secrets, read once as its turn comes: not per row,
                -- and not by a join of the rows to their endpoints afterwards, which the
                -- planner (expecting a few endpoints) ran as a nested loop of every row
                -- against every endpoint, 225 x 225 in a claim of the trickle shape.
                -- OFFSET 0 keeps this a subquery of its own, so they stay per endpoint.
                -- Legacy plaintext rows (from before migration 0004) are never handed out;
                -- `hookd rekey` or a dispatcher's start encrypts them.
                SELECT el.*, x.*
                FROM (SELECT * FROM eligible WHERE quota > 0 ORDER BY turn_at, endpoint_id) el
                CROSS JOIN LATERAL (
                    SELECT coalesce(array_agg(s.id ORDER BY s.id DESC), '{}') AS secret_ids,
                           coalesce(array_agg(s.key_id ORDER BY s.id DESC), '{}') AS secret_key_ids,
                           coalesce(array_agg(s.ciphertext ORDER BY s.id DESC), '{}') AS secret_ciphertexts
                    FROM hookd.endpoint_secrets s
                    WHERE s.endpoint_id = el.endpoint_id AND s.ciphertext IS NOT NULL
                      AND (s.not_after IS NULL OR s.not_after > (SELECT now FROM clock))
                ) x
                OFFSET 0
            ) el
            CROSS JOIN LATERAL (
                SELECT d.id, d.event_id FROM hookd.deliveries d
                WHERE d.endpoint_id = el.endpoint_id
                  AND d.status IN ('pending', 'in_progress', 'failed')
                  AND d.visible_at <= (SELECT now FROM clock)
                ORDER BY d.visible_at
                LIMIT el.quota
                FOR UPDATE OF d SKIP LOCKED
            ) c
            LIMIT $2
        ), markable AS (
            -- The endpoint rows `marks` may write, locked here without waiting: a row
            -- someone else holds (another claim probing it or charging its bucket, an
            -- outcome batch, an operator's transaction) is passed over, and its picked
            -- rows with it, rather than making this claim, and every tenant behind it,
            -- wait. In id order, the order every writer of endpoint rows keeps.
            SELECT e.id FROM hookd.endpoints e
            WHERE e.id = ANY (ARRAY(SELECT endpoint_id FROM picked WHERE probe OR limited))
            ORDER BY e.id
            FOR NO KEY UPDATE OF e SKIP LOCKED
        ), marks AS (
            -- The endpoint rows this claim writes: each circuit that got a probe row
            -- goes half-open (only those: a probe slot is never spent without a probe),
            -- and each rate-limited endpoint that got rows has them taken from its
            -- bucket (migration 0032). Both are checked again under the row lock, so a
            -- concurrent claimer that picked a probe for the same circuit, or rows its
            -- bucket no longer has tokens for, gets 0 rows here and its rows are excluded
            -- below: one probe at a time, and never more leases than tokens, across
            -- replicas. Only rows `markable` locked, so nothing here waits. An array, not a
            -- semi-join: with statistics that expect one endpoint, the semi-join scanned
            -- every endpoint on every claim (1,717 buffers at 10,000 endpoints).
            UPDATE hookd.endpoints e
            SET circuit_state = CASE WHEN m.probe THEN 'half_open' ELSE e.circuit_state END,
                circuit_open_until = CASE WHEN m.probe
                    THEN (SELECT now FROM clock) + make_interval(secs => $3)
                    ELSE e.circuit_open_until END,
                rate_tokens = CASE WHEN e.rate_per_second IS NULL THEN e.rate_tokens
                    ELSE hookd.rate_tokens(e.rate_per_second, e.rate_burst, e.rate_tokens,
                                           e.rate_at, (SELECT now FROM clock)) - m.n END,
                -- never back: a claim that waited for this row behind a later one has
                -- an earlier clock, and moving the bucket's time back would refill the
                -- time between twice
                rate_at = CASE WHEN e.rate_per_second IS NULL THEN e.rate_at
                    ELSE greatest(e.rate_at, (SELECT now FROM clock)) END,
                -- while a whole token is left, no wait; one already over is left as it
                -- is (rewriting it would move the queue entry's hold for nothing)
                rate_wait_until = CASE WHEN e.rate_per_second IS NULL THEN e.rate_wait_until
                    ELSE coalesce(hookd.rate_wait(e.rate_per_second, e.rate_burst,
                                      hookd.rate_tokens(e.rate_per_second, e.rate_burst,
                                          e.rate_tokens, e.rate_at, (SELECT now FROM clock)) - m.n,
                                      -- from the bucket's time, which a claim with an
                                      -- earlier clock does not move back (above)
                                      greatest(e.rate_at, (SELECT now FROM clock))),
                                  CASE WHEN e.rate_wait_until <= (SELECT now FROM clock)
                                       THEN e.rate_wait_until END) END
            FROM (SELECT endpoint_id, bool_or(probe) AS probe, count(*)::int AS n
                  FROM picked WHERE probe OR limited
                  GROUP BY endpoint_id ORDER BY endpoint_id) m
            WHERE e.id = ANY (ARRAY(SELECT id FROM markable))
              AND e.id = m.endpoint_id
              AND (NOT m.probe
                   OR (e.state = 'active' AND e.circuit_state <> 'closed'
                       AND e.circuit_open_until <= (SELECT now FROM clock)))
              AND (e.rate_per_second IS NULL
                   OR hookd.rate_tokens(e.rate_per_second, e.rate_burst, e.rate_tokens,
                                        e.rate_at, (SELECT now FROM clock)) >= m.n)
            RETURNING e.id
        ), rows AS (
            SELECT p.*, ev.event_type, ev.payload, ev.created_at AS event_created_at,
                   ev.source, ev.source_event_id, ev.traceparent, ev.tracestate
            FROM picked p
            CROSS JOIN LATERAL (
                SELECT ev.event_type, ev.payload, ev.created_at, ev.source, ev.source_event_id,
                       ev.traceparent, ev.tracestate
                FROM hookd.events ev
                WHERE ev.id = p.event_id LIMIT 1
            ) ev
        )
        UPDATE hookd.deliveries d
        SET status = 'in_progress',
            -- a lapsed lease re-claimed at the maximum is sent again (its first send's
            -- outcome is unknown) without counting past the maximum
            attempts = CASE WHEN d.attempts >= coalesce(r.max_attempts, $8) THEN d.attempts
                            ELSE d.attempts + 1 END,
            attempt_seq = d.attempt_seq + 1,
            claim_token = gen_random_uuid(),
            visible_at = (SELECT now FROM clock) + make_interval(secs => $3),
            locked_by = $1,
            updated_at = (SELECT now FROM clock)
        FROM rows r
        -- the status names the queue partition (migration 0014), so the update is
        -- planned on it alone rather than on every history day
        WHERE d.id = r.id AND d.status IN ('pending', 'in_progress', 'failed')
          AND (NOT (r.probe OR r.limited) OR r.endpoint_id IN (SELECT id FROM marks))
        RETURNING d.id, d.event_id, d.endpoint_id, d.tenant, d.consumer, d.attempts,
                  d.claim_token, d.attempt_seq, r.config_version,
                  d.visible_at AS lease_until, d.ordering_key IS NOT NULL AS ordered,
                  r.event_type, r.payload, r.event_created_at, r.source, r.source_event_id,
                  r.traceparent, r.tracestate, r.url, r.headers, r.timeout_ms, r.max_attempts, r.retry_schedule_secs,
                  r.max_in_flight,
                  r.secret_ids, r.secret_key_ids, r.secret_ciphertexts
        "#
        )
    };
}

/// The claim statement (see [`claim`]); shared with [`explain_claim`] so the plan a test
/// inspects is the plan of exactly this text.
const CLAIM_SQL: &str = claim_sql!(
    r#"due AS (
            -- Endpoints whose turn has come, longest waiting first, read tenant by tenant:
            -- each tenant's range scan stops at what its share can use (a row per entry)
            -- plus a margin for entries that turn out to have nothing to give, so one
            -- tenant's thousands of endpoints never fill the window and hide another
            -- tenant's one (issue 27: 6-11 rows per claim of 250, the small tenant not
            -- reached). Entries past their tenant's share sort last, so the window's
            -- limit cuts them first. Endpoints this worker holds at the per-endpoint cap
            -- and tenants at their share are passed over inside the scans.
            SELECT w.endpoint_id, w.tenant, w.turn_at
            FROM (
                SELECT d.*, row_number() OVER (PARTITION BY d.tenant ORDER BY d.turn_at) AS rn,
                       least($2, $11 - coalesce(tb.n, 0)) AS useful
                FROM tenants t
                LEFT JOIN tenant_busy tb ON tb.tenant = t.tenant
                CROSS JOIN LATERAL (
                    SELECT q.endpoint_id, q.tenant, q.turn_at
                    FROM hookd.endpoint_queue q
                    WHERE q.tenant = t.tenant
                      AND q.turn_at <= (SELECT now FROM clock)
                      AND q.endpoint_id NOT IN (SELECT endpoint_id FROM busy WHERE n >= $7)
                    ORDER BY q.turn_at
                    LIMIT least($2, $11 - coalesce(tb.n, 0)) + 16
                ) d
                WHERE coalesce(tb.n, 0) < $11
            ) w
            ORDER BY w.rn > w.useful, w.turn_at
            LIMIT $2 + cardinality($4::uuid[]) + 64
"#
);

/// The claim of handed deliveries (see [`claim_handed`]): `due` is the endpoints of the
/// deliveries named in `$17` that are queued and due, by primary key, each as if its
/// turn were now. Endpoints this worker holds at the per-endpoint cap are passed over.
const CLAIM_HANDED_SQL: &str = claim_sql!(
    r#"due AS (
            SELECT d.endpoint_id, d.tenant, (SELECT now FROM clock) AS turn_at
            FROM hookd.deliveries d
            WHERE d.id = ANY ($17::uuid[])
              AND d.status IN ('pending', 'in_progress', 'failed')
              AND d.visible_at <= (SELECT now FROM clock)
              AND d.endpoint_id NOT IN (SELECT endpoint_id FROM busy WHERE n >= $7)
            GROUP BY d.endpoint_id, d.tenant
        "#
);

/// Fairness for one claim (issue 19): the rows each tenant, and each consumer within a
/// tenant, has in flight in this worker, and the most each may have. A tenant's
/// tenant-wide endpoints count as one consumer (`None`). Those not listed have none.
#[derive(Debug, Clone, Default)]
pub struct TenantShares {
    /// the most any tenant may have in flight
    pub cap: i32,
    pub busy: Vec<TenantBusy>,
    /// the most one consumer of a tenant not in `busy` may have in flight
    pub consumer_cap: i32,
    pub consumers_busy: Vec<ConsumerBusy>,
}

#[derive(Debug, Clone)]
pub struct TenantBusy {
    pub tenant: String,
    pub in_flight: i32,
    /// the most one of this tenant's consumers may have in flight
    pub consumer_cap: i32,
}

#[derive(Debug, Clone)]
pub struct ConsumerBusy {
    pub tenant: String,
    pub consumer: Option<String>,
    pub in_flight: i32,
}

impl TenantShares {
    /// No limit beyond the worker's slots.
    pub fn unlimited() -> Self {
        TenantShares {
            cap: i32::MAX,
            busy: Vec::new(),
            consumer_cap: i32::MAX,
            consumers_busy: Vec::new(),
        }
    }
}

/// Leases up to `limit` due deliveries in one statement, with no per-tenant share (see
/// [`claim_shared`]).
pub async fn claim(pool: &PgPool, req: &ClaimRequest) -> Result<Vec<ClaimedDelivery>, DbError> {
    claim_shared(pool, req, &TenantShares::unlimited()).await
}

/// Leases up to `limit` due deliveries in one statement.
///
/// Only endpoints with open deliveries have an entry in `hookd.endpoint_queue`, ordered
/// by when their turn comes (their earliest due row, their circuit's cool-down, or just
/// after the last claim that served them). The claim reads the entries whose turn has
/// come, in that order and tenant by tenant (each tenant's scan stops at what its share
/// can use), and for each takes its oldest due rows up to the endpoint's remaining
/// in-flight quota (one probe per circuit whose cool-down is over, which this statement
/// marks half-open so only one replica probes) and up to its consumer's and tenant's
/// remaining shares, charging each endpoint the rows it actually has due. So its cost
/// follows the rows it claims and the tenants with work, not the number of endpoints;
/// rows of paused, disabled or open endpoints are never read, and an open circuit's
/// backlog is not re-deferred. Due rows include in_progress rows whose lease lapsed: the
/// lease expiry lives in the same visibility column.
pub async fn claim_shared(
    pool: &PgPool,
    req: &ClaimRequest,
    shares: &TenantShares,
) -> Result<Vec<ClaimedDelivery>, DbError> {
    fold_wakeups(pool).await?;
    lease(pool, CLAIM_SQL, req, shares, None).await
}

/// Leases the deliveries named in `handed` that are queued and due, with their
/// endpoints' other due rows older than them, by the rules of [`claim_shared`], as if
/// each endpoint's turn had come: the API names the deliveries each commit created (the
/// NOTIFY payload), so a waiting dispatcher sends them without a scan. By primary key,
/// so its cost follows `handed`; no fold of wake-ups first, and the queue entries are
/// left to the next scan's fold. What it does not lease (an endpoint at its cap, a share
/// used up, an open circuit, a line) the scan finds as before.
pub async fn claim_handed(
    pool: &PgPool,
    req: &ClaimRequest,
    shares: &TenantShares,
    handed: &[Uuid],
) -> Result<Vec<ClaimedDelivery>, DbError> {
    lease(pool, CLAIM_HANDED_SQL, req, shares, Some(handed)).await
}

/// Runs one of the claim statements [`claim_sql!`] builds; `handed` is the handed
/// statement's `$17`.
async fn lease(
    pool: &PgPool,
    sql: &'static str,
    req: &ClaimRequest,
    shares: &TenantShares,
    handed: Option<&[Uuid]>,
) -> Result<Vec<ClaimedDelivery>, DbError> {
    super::retry_conflicts(|| async {
        let mut args = claim_arguments(req, shares)?;
        if let Some(handed) = handed {
            args.add(handed)
                .map_err(|e| DbError::Query(sqlx::Error::Encode(e)))?;
        }
        Ok(sqlx::query_as_with::<_, ClaimedDelivery, _>(sql, args)
            .fetch_all(on(pool))
            .await?)
    })
    .await
}

/// Folds the wake-ups of endpoints that got work (`hookd.endpoint_wakeups`, migration
/// 0008) and the rechecks of entries that may be early (`hookd.endpoint_rechecks`,
/// migration 0015) into their queue entries, so the claim that follows sees them. Run before every
/// claim: a separate statement, because a claim cannot see entries its own statement
/// writes. Its cost follows the endpoints that got work since the last fold. Commits
/// asynchronously: lost in a crash, the wake-ups come back with it and are folded again.
pub async fn fold_wakeups(pool: &PgPool) -> Result<u64, DbError> {
    // Entries a refresh had to skip, or a claim found early (migration 0015): refreshed
    // with a snapshot that sees what made them so.
    sqlx::query(
        "SELECT set_config('synchronous_commit', 'off', true), hookd.endpoint_queue_recheck(10000)",
    )
    .execute(on(pool))
    .await?;
    let r = sqlx::query(FOLD_SQL).execute(on(pool)).await?;
    Ok(r.rows_affected())
}

/// Lets the next delivery of each ordering key whose line may have moved go (migration
/// 0034's `hookd.ordering_advance`), at most [`ADVANCES_PER_CALL`] keys per call; returns
/// how many advances it took (a full batch: call again). The dispatcher runs it on a task
/// of its own, off the claim's path (`dispatch::lines`). Commits asynchronously: lost in a
/// crash, the advances come back with it.
pub async fn advance_lines(pool: &PgPool) -> Result<u64, DbError> {
    let (_, n): (String, i32) = sqlx::query_as(
        "SELECT set_config('synchronous_commit', 'off', true), hookd.ordering_advance($1)",
    )
    .bind(ADVANCES_PER_CALL as i32)
    .fetch_one(on(pool))
    .await?;
    Ok(n.unsigned_abs().into())
}

/// The most ordering advances one call of [`advance_lines`] takes. Each locks its key's
/// line for the call's transaction, and Postgres's lock table is shared by every session
/// (`max_locks_per_transaction` x `max_connections`, 6,400 entries by default): 10,000 in
/// one transaction can run out of it ("out of shared memory"; a producer's transaction of
/// 10,000 keys did in the bench).
pub const ADVANCES_PER_CALL: u32 = 500;

/// The most ordering keys one endpoint replay takes (each a lock on its line, like the
/// line mover's): deliveries of further keys are left for the next call and counted as skipped.
pub const LINES_PER_REPLAY: i64 = 1000;

/// The fold of wake-ups into queue entries (see [`fold_wakeups`]); shared with
/// [`explain_fold_wakeups`].
const FOLD_SQL: &str = r#"
        WITH async AS (SELECT set_config('synchronous_commit', 'off', true)),
        w AS (
            -- An array, not a semi-join: the table is empty most of the time, so its
            -- statistics usually say so, and the semi-join they lead to re-ran the
            -- locking subquery once per wake-up: 8.9 s to fold 10,000 (hookd-bench).
            DELETE FROM hookd.endpoint_wakeups
            WHERE id = ANY (ARRAY(SELECT id FROM hookd.endpoint_wakeups ORDER BY id LIMIT 10000
                                  FOR UPDATE SKIP LOCKED))
              AND (SELECT count(*) FROM async) = 1
            RETURNING endpoint_id, due_at
        ), m AS (
            SELECT endpoint_id, min(due_at) AS due FROM w GROUP BY endpoint_id
        )
        -- FOR SHARE on the endpoint: a state change that has not committed yet is waited
        -- for and then read; one that starts after waits for this entry to commit, so
        -- its trigger (hookd.endpoints_queue_hold) sees it. Either way the hold is right.
        -- A deletion the same way (hookd.endpoints_queue_gone): the entry has no foreign
        -- key (migration 0038), and this is what keeps it from outliving its endpoint.
        INSERT INTO hookd.endpoint_queue AS q (endpoint_id, tenant, due_at, hold_until)
        -- A primary-key probe per endpoint whatever the statistics say; the sorted
        -- subquery makes the nested loop take the locks in id order.
        SELECT e.id, e.tenant, m.due,
               hookd.endpoint_hold(e.state, e.circuit_state, e.circuit_open_until,
                                   e.rate_wait_until)
        FROM (SELECT * FROM m ORDER BY m.endpoint_id) m
        CROSS JOIN LATERAL (
            SELECT e.id, e.tenant, e.state, e.circuit_state, e.circuit_open_until,
                   e.rate_wait_until
            FROM hookd.endpoints e WHERE e.id = m.endpoint_id
            FOR SHARE OF e
        ) e
        ON CONFLICT (endpoint_id) DO UPDATE SET due_at = least(q.due_at, EXCLUDED.due_at)
        "#;

/// `EXPLAIN (ANALYZE, BUFFERS)` of the fold of wake-ups, executed the way the dispatcher
/// runs it (index paths only) in a transaction that is rolled back. For tests that prove
/// its cost follows the wake-ups whatever the statistics say.
pub async fn explain_fold_wakeups(pool: &PgPool) -> Result<Vec<String>, DbError> {
    super::explain_analyze(pool, FOLD_SQL, PgArguments::default()).await
}

/// The claim's parameters, shared by `claim` and `explain_claim` so the plan a test
/// inspects is the plan production runs.
fn claim_arguments(req: &ClaimRequest, shares: &TenantShares) -> Result<PgArguments, DbError> {
    let busy_ids: Vec<Uuid> = req.busy.iter().map(|b| b.0).collect();
    let busy_counts: Vec<i32> = req.busy.iter().map(|b| b.1).collect();
    let tenants: Vec<&str> = shares.busy.iter().map(|b| b.tenant.as_str()).collect();
    let tenant_counts: Vec<i32> = shares.busy.iter().map(|b| b.in_flight).collect();
    let consumer_caps: Vec<i32> = shares.busy.iter().map(|b| b.consumer_cap).collect();
    let c_tenants: Vec<&str> = shares
        .consumers_busy
        .iter()
        .map(|c| c.tenant.as_str())
        .collect();
    let c_uids: Vec<&str> = shares
        .consumers_busy
        .iter()
        .map(|c| c.consumer.as_deref().unwrap_or(""))
        .collect();
    let c_counts: Vec<i32> = shares.consumers_busy.iter().map(|c| c.in_flight).collect();
    let mut args = PgArguments::default();
    let encode = |e| DbError::Query(sqlx::Error::Encode(e));
    args.add(req.worker_id).map_err(encode)?;
    args.add(req.limit).map_err(encode)?;
    args.add(req.lease_secs).map_err(encode)?;
    args.add(busy_ids).map_err(encode)?;
    args.add(busy_counts).map_err(encode)?;
    args.add(req.now).map_err(encode)?;
    args.add(req.per_endpoint_cap).map_err(encode)?;
    args.add(req.default_max_attempts).map_err(encode)?;
    args.add(tenants).map_err(encode)?;
    args.add(tenant_counts).map_err(encode)?;
    args.add(shares.cap).map_err(encode)?;
    args.add(consumer_caps).map_err(encode)?;
    args.add(shares.consumer_cap).map_err(encode)?;
    args.add(c_tenants).map_err(encode)?;
    args.add(c_uids).map_err(encode)?;
    args.add(c_counts).map_err(encode)?;
    Ok(args)
}

/// `EXPLAIN (ANALYZE, BUFFERS)` of the claim statement with `req`'s parameters, executed in
/// a transaction that is rolled back (nothing is leased). For tests and benchmarks that
/// prove the claim is an index range scan whatever the backlog. One line per plan line.
pub async fn explain_claim(pool: &PgPool, req: &ClaimRequest) -> Result<Vec<String>, DbError> {
    fold_wakeups(pool).await?;
    super::explain_analyze(
        pool,
        CLAIM_SQL,
        claim_arguments(req, &TenantShares::unlimited())?,
    )
    .await
}

/// The next time (after now) an endpoint's turn comes, for the dispatcher's next-due
/// timer: two probes of `endpoint_queue_tenant_turn` per tenant with entries (the tenants
/// from `hookd.endpoint_queue_tenants`, migration 0037), whatever the number of
/// endpoints. What is due already is the claim's business (and wakes the dispatcher
/// through NOTIFY, freed slots or the poll), so it is not reported here.
///
/// While an entry waits to be rechecked (`hookd.endpoint_rechecks`: a claim found it
/// early, or a refresh skipped it), its turn here may be wrong, and a wake-up of its
/// endpoint (a retry written while the entry was earlier) was never written: the answer
/// is then a few milliseconds from now, so a scan comes and its fold puts the entry right.
/// A dispatcher that leases handed deliveries without scanning would otherwise sleep past
/// that retry until its poll.
pub async fn next_due(pool: &PgPool) -> Result<Option<DateTime<Utc>>, DbError> {
    Ok(sqlx::query_scalar(
        r#"
        SELECT CASE WHEN EXISTS (SELECT 1 FROM hookd.endpoint_rechecks)
                    THEN now() + interval '5 milliseconds'
               ELSE (SELECT min(n.turn_at)
                     FROM hookd.endpoint_queue_tenants() t(tenant)
                     CROSS JOIN LATERAL (
                         SELECT q.turn_at FROM hookd.endpoint_queue q
                         WHERE q.tenant = t.tenant AND q.turn_at > now()
                           AND q.turn_at < 'infinity'
                         ORDER BY q.turn_at LIMIT 1
                     ) n)
               END
        "#,
    )
    .fetch_one(on(pool))
    .await?)
}

/// Extends the leases of deliveries a worker is still sending, each only while it holds
/// the claim (`claim_token`), so a lease outlives a slow request without a long lease
/// delaying recovery from a killed worker. A circuit half-open for one of them (the probe)
/// stays half-open as long, so no second probe starts beside it. Synchronous: a renewal
/// lost in a database crash would let another worker send the row beside this one.
/// Returns the deliveries whose lease was renewed; any other was taken over.
pub async fn renew_leases(
    pool: &PgPool,
    leases: &[(Uuid, Uuid)],
    lease_secs: f64,
) -> Result<Vec<Uuid>, DbError> {
    if leases.is_empty() {
        return Ok(Vec::new());
    }
    super::retry_conflicts(|| async {
        Ok(
            sqlx::query_scalar_with(RENEW_SQL, renew_arguments(leases, lease_secs)?)
                .fetch_all(on(pool))
                .await?,
        )
    })
    .await
}

const RENEW_SQL: &str = r#"
        WITH held AS MATERIALIZED (
            -- locked in id order, as an outcome batch locks them, and probed by primary
            -- key one lease at a time (a LATERAL driven by the batch) with the status
            -- checked after the lock, for the reasons given in `complete`
            SELECT i.id, x.status
            FROM (SELECT * FROM unnest($1::uuid[], $2::uuid[]) AS u(id, token) ORDER BY id) i
            CROSS JOIN LATERAL (
                SELECT d.status FROM hookd.deliveries d
                WHERE d.id = i.id AND d.claim_token = i.token
                  AND d.status IN ('pending', 'in_progress', 'failed')
                FOR UPDATE OF d
            ) x
        ), renewed AS (
            UPDATE hookd.deliveries d
            SET visible_at = greatest(d.visible_at, now() + make_interval(secs => $3))
            FROM held
            WHERE d.id = held.id AND d.status IN ('pending', 'in_progress', 'failed') AND held.status = 'in_progress'
            RETURNING d.id, d.endpoint_id
        ), probes AS (
            UPDATE hookd.endpoints e
            SET circuit_open_until = now() + make_interval(secs => $3)
            WHERE e.id IN (SELECT endpoint_id FROM renewed)
              AND e.circuit_state = 'half_open'
              AND e.circuit_open_until < now() + make_interval(secs => $3)
        )
        SELECT id FROM renewed
        "#;

fn renew_arguments(leases: &[(Uuid, Uuid)], lease_secs: f64) -> Result<PgArguments, DbError> {
    let ids: Vec<Uuid> = leases.iter().map(|l| l.0).collect();
    let tokens: Vec<Uuid> = leases.iter().map(|l| l.1).collect();
    let mut args = PgArguments::default();
    let encode = |e| DbError::Query(sqlx::Error::Encode(e));
    args.add(ids).map_err(encode)?;
    args.add(tokens).map_err(encode)?;
    args.add(lease_secs).map_err(encode)?;
    Ok(args)
}

/// The terminal or retry state a worker writes for one attempt.
#[derive(Debug, Clone)]
pub struct Completion {
    pub delivery_id: Uuid,
    /// the claim's token (the fence)
    pub claim_token: Uuid,
    /// the attempt number for the log (`attempt_seq` of the claim)
    pub attempt: i32,
    pub status: DeliveryOutcome,
    /// for `Retry`: how long from the database's now() (not this host's clock, which may
    /// be skewed) until the next attempt is due
    pub retry_delay_ms: Option<i64>,
    pub started_at: DateTime<Utc>,
    pub duration_ms: i32,
    pub status_code: Option<i32>,
    pub error_class: Option<ErrorClass>,
    pub error: Option<String>,
    pub response_snippet: Option<String>,
    /// reason recorded on the dead-letter row when `status` is `Dead`
    pub dead_reason: Option<String>,
}

/// The state one attempt leaves a delivery in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeliveryOutcome {
    Succeeded,
    /// failed, due again after the retry delay
    Retry,
    Dead,
    /// not sent, for a reason on this side (its signing secret cannot be decrypted here):
    /// due again after the delay, and the attempt the claim counted is given back, so a
    /// misconfigured key holds deliveries instead of exhausting them
    Held,
}

impl DeliveryOutcome {
    /// The literal [`complete`] reads: the `deliveries.status` it leaves, but `held`,
    /// which it stores as `failed` with the attempt uncounted.
    pub fn as_sql(self) -> &'static str {
        match self {
            DeliveryOutcome::Succeeded => DeliveryStatus::Succeeded.as_str(),
            DeliveryOutcome::Retry => DeliveryStatus::Failed.as_str(),
            DeliveryOutcome::Dead => DeliveryStatus::Dead.as_str(),
            DeliveryOutcome::Held => "held",
        }
    }
}

/// Makes text safe to bind as a Postgres `text` value: Postgres refuses U+0000 in text
/// (SQLSTATE 22021), and a receiver or resolver controls these bytes. Everything a
/// receiver can influence goes through here before it reaches a statement.
pub fn pg_text(s: &str) -> std::borrow::Cow<'_, str> {
    if s.contains('\0') {
        std::borrow::Cow::Owned(s.replace('\0', "\u{FFFD}"))
    } else {
        std::borrow::Cow::Borrowed(s)
    }
}

/// Writes a batch of outcomes in one statement. Each delivery update is fenced on the
/// claim's token (`claim_token = token AND status = in_progress`), and the attempt log and
/// dead-letter rows are joined on the same (id, token) identity, so an outcome that lost
/// its lease writes nothing anywhere. The batch is de-duplicated first: two outcomes of one
/// claim never meet in one statement (at most one of two claims of a row can hold the
/// current token anyway). Returns the ids that passed the fence.
pub async fn complete(conn: &mut PgConnection, batch: &[Completion]) -> Result<Vec<Uuid>, DbError> {
    if batch.is_empty() {
        return Ok(Vec::new());
    }
    // last outcome per claim wins; keeps input order otherwise
    let mut seen = std::collections::HashSet::with_capacity(batch.len());
    let mut unique: Vec<&Completion> = batch
        .iter()
        .rev()
        .filter(|c| seen.insert((c.delivery_id, c.claim_token)))
        .collect();
    // Rows are locked in id order, as the lease renewal locks them: in batch order the two
    // deadlocked (a renewal holding some of a batch's rows while the batch held others:
    // a 1 s stall of both, several a minute at a steady 1,000 events/s). Postgres orders
    // uuids bytewise, as `Uuid` does.
    unique.sort_by_key(|c| c.delivery_id);
    let done: Vec<(Uuid,)> = sqlx::query_as_with(COMPLETE_SQL, complete_arguments(&unique)?)
        .fetch_all(on(conn))
        .await?;
    Ok(done.into_iter().map(|(id,)| id).collect())
}

const COMPLETE_SQL: &str = r#"
        WITH i AS (
            SELECT * FROM unnest($1::uuid[], $2::uuid[], $3::int[], $4::text[], $5::bigint[],
                                 $6::timestamptz[], $7::int[], $8::int[], $9::text[], $10::text[],
                                 $11::text[], $12::text[])
              AS i(id, token, attempt, status, delay_ms, started_at, duration_ms, status_code,
                   error_class, error, snippet, dead_reason)
        ), probed AS MATERIALIZED (
            -- One primary-key probe per outcome, of the row that holds the claim's token.
            -- Written as a LATERAL so the plan is driven from the batch whatever
            -- the statistics say: with the fence as a plain join filter the planner
            -- expects ~1 in_progress row (true of the table as a whole), scans the table
            -- and joins it to the batch in a nested loop: 0.3-0.8 s per 512 outcomes on
            -- a 20 k-row table, measured by `hookd-bench`.
            -- The probe names the queue partition's statuses (migration 0014), so it is
            -- planned on that partition alone, and checks `in_progress` only after the
            -- lock: when the claim index was a partial index on the whole table,
            -- `status = 'in_progress'` implied its predicate, and with statistics taken
            -- while it was nearly empty the planner scanned all of it once per outcome
            -- (1.4 s to 22 s per batch once a backlog built up, 13 minutes into a
            -- sustained run). MATERIALIZED keeps the status check below out of the probe.
            -- The outcome's own columns ride along, so the update below needs no join
            -- back to the batch (planned from the CTE's estimate of a few rows, that
            -- join was a nested loop over the whole batch per row: 4 x the statement).
            -- No row lock here: the update takes it, and checks the fence again on the
            -- row as it then is. Locked here first, each row wrote a lock record to the
            -- write-ahead log besides its update (docs/benchmarks.md, issue 32).
            SELECT i.*, x.status AS row_status FROM i
            CROSS JOIN LATERAL (
                SELECT d.status FROM hookd.deliveries d
                WHERE d.id = i.id AND d.claim_token = i.token AND d.status IN ('pending', 'in_progress', 'failed')
            ) x
        ), fenced AS (
            -- the fence: the claim's token on a row still in flight. The token alone is
            -- not enough: some cancellations (an endpoint changing owner) keep it on the row.
            SELECT * FROM probed WHERE row_status = 'in_progress'
        ), upd AS (
            UPDATE hookd.deliveries d
            SET status = CASE WHEN f.status = 'held' THEN 'failed' ELSE f.status END,
                attempts = d.attempts - (f.status = 'held' AND d.attempts > 0)::int,
                visible_at = CASE WHEN f.delay_ms IS NULL THEN d.visible_at
                                  ELSE now() + make_interval(secs => f.delay_ms / 1000.0) END,
                locked_by = NULL,
                claim_token = NULL,
                last_status_code = f.status_code,
                last_error = f.error,
                updated_at = now(),
                completed_at = CASE WHEN f.status IN ('succeeded', 'dead') THEN now() END
            -- The fence again, as the update's own condition: a row changed since the
            -- statement's snapshot (re-claimed after its lease lapsed, cancelled) is
            -- checked as it is once locked, and left alone when it fails. In fenced's
            -- order, which is id order: the order the lease renewal locks rows in.
            FROM fenced f
            WHERE d.id = f.id AND d.claim_token = f.token AND d.status = 'in_progress'
            RETURNING d.id, d.endpoint_id, d.tenant, f.token
        ), log AS (
            INSERT INTO hookd.delivery_attempts
                (delivery_id, attempt, started_at, duration_ms, status_code, error_class, error, response_snippet)
            SELECT i.id, i.attempt, i.started_at, i.duration_ms, i.status_code, i.error_class, i.error, i.snippet
            FROM i JOIN upd ON upd.id = i.id AND upd.token = i.token
        ), dead AS (
            INSERT INTO hookd.dead_letters (delivery_id, endpoint_id, tenant, reason, attempts)
            SELECT i.id, upd.endpoint_id, upd.tenant, coalesce(i.dead_reason, 'exhausted'), i.attempt
            FROM i JOIN upd ON upd.id = i.id AND upd.token = i.token
            WHERE i.status = 'dead'
            ON CONFLICT (delivery_id) DO UPDATE
              SET reason = EXCLUDED.reason, attempts = EXCLUDED.attempts, dead_at = now()
        )
        SELECT id FROM upd
        "#;

/// The arguments of [`COMPLETE_SQL`] for a de-duplicated batch in id order.
fn complete_arguments(batch: &[&Completion]) -> Result<PgArguments, DbError> {
    let n = batch.len();
    let mut ids = Vec::with_capacity(n);
    let mut tokens = Vec::with_capacity(n);
    let mut attempts = Vec::with_capacity(n);
    let mut statuses = Vec::with_capacity(n);
    let mut delays = Vec::with_capacity(n);
    let mut started = Vec::with_capacity(n);
    let mut duration = Vec::with_capacity(n);
    let mut codes = Vec::with_capacity(n);
    let mut classes = Vec::with_capacity(n);
    let mut errors = Vec::with_capacity(n);
    let mut snippets = Vec::with_capacity(n);
    let mut reasons = Vec::with_capacity(n);
    for c in batch {
        ids.push(c.delivery_id);
        tokens.push(c.claim_token);
        attempts.push(c.attempt);
        statuses.push(c.status.as_sql());
        delays.push(c.retry_delay_ms);
        started.push(c.started_at);
        duration.push(c.duration_ms);
        codes.push(c.status_code);
        classes.push(c.error_class);
        errors.push(c.error.as_deref().map(pg_text));
        snippets.push(c.response_snippet.as_deref().map(pg_text));
        reasons.push(c.dead_reason.as_deref().map(pg_text));
    }
    let mut args = PgArguments::default();
    let encode = |e| DbError::Query(sqlx::Error::Encode(e));
    args.add(ids).map_err(encode)?;
    args.add(tokens).map_err(encode)?;
    args.add(attempts).map_err(encode)?;
    args.add(statuses).map_err(encode)?;
    args.add(delays).map_err(encode)?;
    args.add(started).map_err(encode)?;
    args.add(duration).map_err(encode)?;
    args.add(codes).map_err(encode)?;
    args.add(classes).map_err(encode)?;
    args.add(errors).map_err(encode)?;
    args.add(snippets).map_err(encode)?;
    args.add(reasons).map_err(encode)?;
    Ok(args)
}

/// A lease a stopping worker hands back.
#[derive(Debug, Clone, Copy)]
pub struct Release {
    pub delivery_id: Uuid,
    pub claim_token: Uuid,
    /// whether the send had begun: a begun send may have reached the receiver, so its
    /// attempt stays counted; one never begun is not counted
    pub started: bool,
}

/// Hands back leases a stopping worker holds: due now again, fenced on the claim token.
pub async fn release(pool: &PgPool, leases: &[Release]) -> Result<u64, DbError> {
    let r = sqlx::query_with(RELEASE_SQL, release_arguments(leases)?)
        .execute(on(pool))
        .await?;
    Ok(r.rows_affected())
}

const RELEASE_SQL: &str = r#"
        WITH held AS MATERIALIZED (
            -- probed by primary key one lease at a time, the status checked after the
            -- lock, and locked in id order: as `complete` does, for the reasons given there
            SELECT i.id, x.status, i.started
            FROM (SELECT * FROM unnest($1::uuid[], $2::uuid[], $3::bool[]) AS u(id, token, started)
                  ORDER BY id) i
            CROSS JOIN LATERAL (
                SELECT d.status FROM hookd.deliveries d
                WHERE d.id = i.id AND d.claim_token = i.token
                  AND d.status IN ('pending', 'in_progress', 'failed')
                FOR UPDATE OF d
            ) x
        )
        UPDATE hookd.deliveries d
        SET status = CASE WHEN d.attempts - (NOT h.started)::int > 0 THEN 'failed' ELSE 'pending' END,
            attempts = d.attempts - (NOT h.started)::int,
            attempt_seq = d.attempt_seq - (NOT h.started)::int,
            visible_at = now(), locked_by = NULL, claim_token = NULL, updated_at = now()
        FROM held h
        WHERE d.id = h.id AND d.status IN ('pending', 'in_progress', 'failed') AND h.status = 'in_progress'
        "#;

fn release_arguments(leases: &[Release]) -> Result<PgArguments, DbError> {
    let ids: Vec<Uuid> = leases.iter().map(|l| l.delivery_id).collect();
    let tokens: Vec<Uuid> = leases.iter().map(|l| l.claim_token).collect();
    let started: Vec<bool> = leases.iter().map(|l| l.started).collect();
    let mut args = PgArguments::default();
    let encode = |e| DbError::Query(sqlx::Error::Encode(e));
    args.add(ids).map_err(encode)?;
    args.add(tokens).map_err(encode)?;
    args.add(started).map_err(encode)?;
    Ok(args)
}

/// `EXPLAIN` (not executed) of the statements that fence on a claim token: an outcome
/// batch (every lease succeeded), a lease renewal and a release of `leases`, each with its
/// name. For tests that prove each finds its rows by primary key whatever the statistics.
pub async fn explain_fenced_writes(
    pool: &PgPool,
    leases: &[(Uuid, Uuid)],
) -> Result<Vec<(&'static str, Vec<String>)>, DbError> {
    let outcomes: Vec<Completion> = leases
        .iter()
        .map(|&(delivery_id, claim_token)| Completion {
            delivery_id,
            claim_token,
            attempt: 1,
            status: DeliveryOutcome::Succeeded,
            retry_delay_ms: None,
            started_at: Utc::now(),
            duration_ms: 1,
            status_code: Some(204),
            error_class: None,
            error: None,
            response_snippet: None,
            dead_reason: None,
        })
        .collect();
    let releases: Vec<Release> = leases
        .iter()
        .map(|&(delivery_id, claim_token)| Release {
            delivery_id,
            claim_token,
            started: true,
        })
        .collect();
    let statements = [
        (
            "complete",
            COMPLETE_SQL,
            complete_arguments(&outcomes.iter().collect::<Vec<_>>())?,
        ),
        ("renew_leases", RENEW_SQL, renew_arguments(leases, 30.0)?),
        ("release", RELEASE_SQL, release_arguments(&releases)?),
    ];
    let mut plans = Vec::with_capacity(statements.len());
    let mut tx = super::begin(pool).await?;
    super::index_paths_only(&mut tx).await?;
    for (name, sql, args) in statements {
        // the only dynamic part is a constant prefix on a constant statement text
        let plan = sqlx::query_scalar_with(sqlx::AssertSqlSafe(format!("EXPLAIN {sql}")), args)
            .fetch_all(on(&mut *tx))
            .await?;
        plans.push((name, plan));
    }
    tx.rollback().await?;
    Ok(plans)
}

/// Cancels deliveries that an enqueue transaction committed for an endpoint after its
/// removal, or after its consumer's deletion (it read the endpoint as live just before).
/// Only endpoints removed (or whose consumer was deleted) in the last day are probed, one
/// bounded index range scan each, so the sweep's cost follows recent removals, not the
/// number of endpoints. Returns the number cancelled.
pub async fn cancel_stragglers(pool: &PgPool) -> Result<u64, DbError> {
    let r = sqlx::query(
        r#"
        UPDATE hookd.deliveries d
        SET status = 'cancelled', locked_by = NULL, claim_token = NULL, completed_at = now(),
            updated_at = now(), last_error = coalesce(e.state_reason, 'endpoint removed')
        FROM hookd.endpoints e
        WHERE e.id IN (SELECT id FROM hookd.endpoints WHERE removed_at > now() - interval '1 day'
                       UNION
                       SELECT id FROM hookd.endpoints WHERE consumer_deleted_at > now() - interval '1 day')
          AND e.state = 'disabled'
          AND d.endpoint_id = e.id AND d.status IN ('pending', 'failed')
        "#,
    )
    .execute(on(pool))
    .await?;
    Ok(r.rows_affected())
}

/// Releases the ordering keys held by a dead letter that is gone (retention deleted it
/// before anyone replayed it): the hold can no longer be lifted by a replay, so the key's
/// line moves on (an advance for the next fold) as `onDeadLetter: continue` would have.
/// Returns the number released. Cheap: the holds are few, each a primary-key probe of the
/// dead delivery's day.
pub async fn release_orphaned_holds(conn: &mut PgConnection) -> Result<u64, DbError> {
    let n: i64 = sqlx::query_scalar(
        r#"
        WITH gone AS (
            DELETE FROM hookd.ordering_holds h
            WHERE NOT EXISTS (SELECT 1 FROM hookd.deliveries d
                              WHERE d.id = h.delivery_id AND d.status = 'dead')
            RETURNING endpoint_id, ordering_key
        ), advanced AS (
            INSERT INTO hookd.ordering_advances (endpoint_id, ordering_key)
            SELECT endpoint_id, ordering_key FROM gone
        )
        SELECT count(*) FROM gone
        "#,
    )
    .fetch_one(on(conn))
    .await?;
    Ok(n.unsigned_abs())
}

/// Outcome of a replay request for one delivery.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReplayOutcome {
    Replayed,
    Leased,
    /// its ordering key's line is held by a transaction that has not finished (a
    /// producer's, through `hookd.enqueue`, or another replay): nothing was changed
    LineBusy,
    NotFound,
}

/// Makes a delivery due now with its attempts reset and the same id, and removes its
/// dead-letter row. Refused while a worker holds an unexpired lease, so a replay never
/// races a send in progress. `audience` scopes the lookup.
pub async fn replay(
    pool: &PgPool,
    id: Uuid,
    audience: super::Audience<'_>,
) -> Result<ReplayOutcome, DbError> {
    let row: Option<(bool, bool)> = super::retry_conflicts(|| async {
        Ok(sqlx::query_as(
            r#"
        WITH target AS (
            SELECT id, status = 'in_progress' AND visible_at > now() AS leased, tenant, ordering_key
            FROM hookd.deliveries
            WHERE id = $1 AND ($2::text IS NULL OR tenant = $2) AND ($3::text IS NULL OR consumer = $3)
              AND ($4::uuid IS NULL OR id >= $4)
            FOR UPDATE
        ), free AS MATERIALIZED (
            -- A keyed delivery's line, as enqueues take it (migration 0034), without
            -- waiting: a producer's open transaction holding the key makes this a 409,
            -- not a wait that keeps this row locked
            SELECT id FROM target
            WHERE NOT leased
              AND CASE WHEN ordering_key IS NULL THEN true
                       ELSE pg_try_advisory_xact_lock(hookd.ordering_lock_id(tenant, ordering_key)) END
        ), upd AS (
            UPDATE hookd.deliveries d
            SET status = 'pending', attempts = 0,
                -- a keyed delivery of an endpoint that orders by key waits its turn
                visible_at = hookd.ordering_replay_at(d.endpoint_id, d.ordering_key),
                locked_by = NULL, claim_token = NULL, completed_at = NULL, updated_at = now()
            FROM free WHERE d.id = free.id
            RETURNING d.id
        ), undead AS (
            DELETE FROM hookd.dead_letters WHERE delivery_id IN (SELECT id FROM upd)
        )
        SELECT leased, NOT leased AND id NOT IN (SELECT id FROM free) AS line_busy FROM target
        "#,
        )
        .bind(id)
        .bind(audience.tenant)
        .bind(audience.consumer)
        .bind(audience.since)
        .fetch_optional(on(pool))
        .await?)
    })
    .await?;
    Ok(match row {
        None => ReplayOutcome::NotFound,
        Some((true, _)) => ReplayOutcome::Leased,
        Some((false, true)) => ReplayOutcome::LineBusy,
        Some((false, false)) => ReplayOutcome::Replayed,
    })
}

/// What an endpoint replay did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EndpointReplay {
    pub replayed: i64,
    /// left alone: a dispatcher holds them
    pub skipped_leased: i64,
    /// left alone: their ordering key's line is held by a transaction that has not
    /// finished (a producer's, or another replay), or is past the [`LINES_PER_REPLAY`]
    /// keys one call takes
    pub skipped_line_busy: i64,
}

/// Replays an endpoint's deliveries created in [since, until) (either end open when
/// `None`) whose status is one of `statuses`, skipping leased ones; at most `limit` per
/// call, oldest first. `tenant` confines it to that tenant's deliveries (an endpoint whose
/// tenant was changed keeps its older deliveries under the old one).
///
/// A range of `deliveries_endpoint_page` (endpoint_id, id): a delivery's UUIDv7 is minted
/// in its enqueue transaction, after the transaction's start (its `created_at`), so
/// `since`'s floor bounds the scan exactly; the upper bound allows a day for that
/// transaction, as retention's walk does ([`super::retention::uuid_v7_floor`]).
pub async fn replay_endpoint(
    pool: &PgPool,
    endpoint_id: Uuid,
    since: Option<DateTime<Utc>>,
    until: Option<DateTime<Utc>>,
    statuses: &[DeliveryStatus],
    limit: i64,
    tenant: Option<&str>,
) -> Result<EndpointReplay, DbError> {
    let row: (i64, i64, i64) = super::retry_conflicts(|| async {
        Ok(sqlx::query_as(
            r#"
        WITH target AS (
            SELECT id, status = 'in_progress' AND visible_at > now() AS leased, tenant, ordering_key
            FROM hookd.deliveries
            WHERE endpoint_id = $1
              AND ($2::timestamptz IS NULL OR created_at >= $2)
              AND ($3::timestamptz IS NULL OR created_at < $3)
              AND ($8::uuid IS NULL OR id >= $8)
              AND ($9::uuid IS NULL OR id < $9)
              AND status = ANY($4)
              AND ($6::text IS NULL OR tenant = $6)
            ORDER BY id
            LIMIT $5
            FOR UPDATE SKIP LOCKED
        ), ranked AS MATERIALIZED (
            SELECT id, tenant, ordering_key,
                   dense_rank() OVER (ORDER BY tenant, ordering_key) AS line
            FROM target WHERE NOT leased
        ), free AS MATERIALIZED (
            -- the ordering keys' lines, as enqueues take them (migration 0034), without
            -- waiting: a line a producer's open transaction holds is skipped (and
            -- counted), its rows left unlocked for the dispatchers; so are the lines past
            -- the first $7 (a lock each, in a lock table every session shares)
            SELECT id FROM ranked
            WHERE CASE WHEN ordering_key IS NULL THEN true
                       WHEN line > $7 THEN false
                       ELSE pg_try_advisory_xact_lock(hookd.ordering_lock_id(tenant, ordering_key)) END
        ), upd AS (
            UPDATE hookd.deliveries d
            SET status = 'pending', attempts = 0,
                -- keyed deliveries of an endpoint that orders by key wait their turn, and
                -- go in the order of their events, whatever order they are replayed in
                visible_at = hookd.ordering_replay_at(d.endpoint_id, d.ordering_key),
                locked_by = NULL, claim_token = NULL, completed_at = NULL, updated_at = now()
            FROM free WHERE d.id = free.id
            RETURNING d.id
        ), undead AS (
            DELETE FROM hookd.dead_letters WHERE delivery_id IN (SELECT id FROM upd)
        )
        SELECT (SELECT count(*) FROM upd), (SELECT count(*) FROM target WHERE leased),
               (SELECT count(*) FROM target WHERE NOT leased AND id NOT IN (SELECT id FROM free))
        "#,
        )
        .bind(endpoint_id)
        .bind(since)
        .bind(until)
        .bind(statuses)
        .bind(limit)
        .bind(tenant)
        .bind(LINES_PER_REPLAY)
        .bind(since.map(super::retention::uuid_v7_floor))
        .bind(until.map(|t| {
            super::retention::uuid_v7_floor(
                t.checked_add_signed(chrono::TimeDelta::days(1))
                    .unwrap_or(DateTime::<Utc>::MAX_UTC),
            )
        }))
        .fetch_one(on(pool))
        .await?)
    })
    .await?;
    Ok(EndpointReplay {
        replayed: row.0,
        skipped_leased: row.1,
        skipped_line_busy: row.2,
    })
}

/// The `visible_at` of a delivery waiting in its ordering key's line behind an earlier
/// one (`hookd.ordering_waiting()`, migration 0034): not a time anything is due.
pub fn ordering_waiting() -> DateTime<Utc> {
    DateTime::from_timestamp(253_402_214_400, 0).expect("9999-12-31 is a valid time")
}

#[derive(Debug, Clone, sqlx::FromRow)]
pub struct DeliveryRow {
    pub id: Uuid,
    pub event_id: Uuid,
    pub endpoint_id: Uuid,
    pub tenant: String,
    pub status: DeliveryStatus,
    pub attempts: i32,
    pub visible_at: DateTime<Utc>,
    pub last_status_code: Option<i32>,
    pub last_error: Option<String>,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
    pub completed_at: Option<DateTime<Utc>>,
}

/// The delivery with this id, if `audience` may see it.
pub async fn get(
    pool: &PgPool,
    id: Uuid,
    audience: super::Audience<'_>,
) -> Result<Option<DeliveryRow>, DbError> {
    Ok(sqlx::query_as::<_, DeliveryRow>(
        "SELECT id, event_id, endpoint_id, tenant, status, attempts, visible_at, last_status_code,
                last_error, created_at, updated_at, completed_at
         FROM hookd.deliveries
         WHERE id = $1 AND ($2::text IS NULL OR tenant = $2) AND ($3::text IS NULL OR consumer = $3)
           AND ($4::uuid IS NULL OR id >= $4)",
    )
    .bind(id)
    .bind(audience.tenant)
    .bind(audience.consumer)
    .bind(audience.since)
    .fetch_optional(on(pool))
    .await?)
}

pub async fn for_event(pool: &PgPool, event_id: Uuid) -> Result<Vec<DeliveryRow>, DbError> {
    Ok(sqlx::query_as::<_, DeliveryRow>(
        "SELECT id, event_id, endpoint_id, tenant, status, attempts, visible_at, last_status_code,
                last_error, created_at, updated_at, completed_at
         FROM hookd.deliveries WHERE event_id = $1 ORDER BY id",
    )
    .bind(event_id)
    .fetch_all(on(pool))
    .await?)
}

/// (claimable rows capped at 100 000, age in seconds of the oldest due row of an endpoint
/// that may be sent to). Both are bounded index scans, cheap enough to sample every few
/// seconds.
pub async fn backlog_sample(pool: &PgPool) -> Result<(i64, i64), DbError> {
    Ok(sqlx::query_as(
        r#"
        SELECT
          (SELECT count(*) FROM (SELECT 1 FROM hookd.deliveries
                                  WHERE status IN ('pending', 'in_progress', 'failed') LIMIT 100000) b),
          -- the oldest among each tenant's first 1,000 endpoints whose turn has come
          -- (held ones never have): bounded whatever the number of endpoints
          coalesce((SELECT extract(epoch FROM now() - min(f.due_at))::bigint
                    FROM hookd.endpoint_queue_tenants() t(tenant)
                    CROSS JOIN LATERAL (
                        SELECT q.due_at FROM hookd.endpoint_queue q
                        WHERE q.tenant = t.tenant AND q.turn_at <= now()
                        ORDER BY q.turn_at LIMIT 1000
                    ) f), 0)
        "#,
    )
    .fetch_one(on(pool))
    .await?)
}

/// The most rows [`dispatch_backlog`] counts, whatever cap it is given.
pub const MAX_BACKLOG_SAMPLE: i64 = 200_000;

/// The work dispatchers have right now, for the autoscaler: deliveries that are due or in
/// flight, of endpoints a claim would serve (active, circuit closed or ready for a probe).
/// Retries waiting for their time and held endpoints do not need pods. One scan of the
/// partial index `deliveries_claimable` that stops after 2 x `cap` rows, whatever the
/// backlog (rows
/// of held endpoints inside that window are read and not counted, so under a large held
/// backlog the figure is a lower bound, which is what a scaler wants).
pub async fn dispatch_backlog(pool: &PgPool, cap: i64) -> Result<i64, DbError> {
    // counting past this says nothing a scaler can use and would make the sample a
    // table walk again
    let cap = cap.clamp(1, MAX_BACKLOG_SAMPLE);
    let count: i64 = sqlx::query_scalar(
        r#"
        SELECT count(*)::bigint FROM (
            SELECT d.endpoint_id FROM hookd.deliveries d
            WHERE d.status IN ('pending', 'in_progress', 'failed')
              AND (d.visible_at <= now() OR d.status = 'in_progress')
            LIMIT $1) x
        JOIN hookd.endpoints e ON e.id = x.endpoint_id
        WHERE e.state = 'active'
          AND (e.circuit_state = 'closed' OR e.circuit_open_until <= now())
        "#,
    )
    .bind(cap.saturating_mul(2))
    .fetch_one(on(pool))
    .await?;
    Ok(count.min(cap))
}

/// Filters of one endpoint's delivery listing (newest first, keyset on the UUIDv7 id).
#[derive(Debug, Clone, Default)]
pub struct EndpointDeliveryQuery {
    pub endpoint_id: Uuid,
    pub status: Option<DeliveryStatus>,
    pub before: Option<Uuid>,
    pub since: Option<DateTime<Utc>>,
    pub until: Option<DateTime<Utc>>,
    pub limit: i64,
}

/// A delivery with its event type, for listings.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct DeliveryListRow {
    #[sqlx(flatten)]
    pub row: DeliveryRow,
    pub event_type: String,
}

/// One page of an endpoint's deliveries: a backward range scan of
/// `deliveries_endpoint_page` (endpoint_id, id) from the cursor, the time range being a
/// range of the UUIDv7 ids.
pub async fn list_for_endpoint(
    pool: &PgPool,
    q: &EndpointDeliveryQuery,
) -> Result<Vec<DeliveryListRow>, DbError> {
    let lower = q.since.map(super::events::uuid_floor);
    let upper = match (q.before, q.until.map(super::events::uuid_floor)) {
        (Some(b), Some(u)) => Some(b.min(u)),
        (b, u) => b.or(u),
    };
    Ok(sqlx::query_as::<_, DeliveryListRow>(
        r#"
        SELECT d.id, d.event_id, d.endpoint_id, d.tenant, d.status, d.attempts, d.visible_at,
               d.last_status_code, d.last_error, d.created_at, d.updated_at, d.completed_at,
               ev.event_type
        FROM hookd.deliveries d JOIN hookd.events ev ON ev.id = d.event_id
        WHERE d.endpoint_id = $1
          AND ($2::text IS NULL OR d.status = $2)
          AND ($3::uuid IS NULL OR d.id < $3)
          AND ($4::uuid IS NULL OR d.id >= $4)
        ORDER BY d.id DESC
        LIMIT $5
        "#,
    )
    .bind(q.endpoint_id)
    .bind(q.status)
    .bind(upper)
    .bind(lower)
    .bind(q.limit)
    .fetch_all(on(pool))
    .await?)
}
