//! `hookd.endpoints`: upserts from the endpoint sync core, state changes, circuit breaker.

use chrono::{DateTime, Utc};
use sqlx::postgres::PgArguments;
use sqlx::{Arguments, PgConnection, PgPool};
use uuid::Uuid;

use super::{DbError, on};
use crate::domain::{
    CircuitState, DeliveryOrder, EndpointState, ManagedBy, OnDeadLetter, RateLimit,
};

/// The endpoint row as the sync core wants it (identity + declared policy + state).
#[derive(Debug, Clone)]
pub struct EndpointUpsert {
    pub namespace: String,
    pub name: String,
    pub uid: Option<String>,
    pub tenant: String,
    /// the consumer the endpoint belongs to (`spec.consumer`)
    pub consumer: Option<String>,
    pub url: String,
    pub event_types: Vec<String>,
    /// active or paused (the controller never declares an endpoint disabled)
    pub state: EndpointState,
    pub state_reason: Option<String>,
    pub timeout_ms: Option<i32>,
    pub max_attempts: Option<i32>,
    pub retry_schedule_secs: Option<Vec<i32>>,
    pub max_in_flight: Option<i32>,
    /// burst resolved ([`crate::endpoints::RateLimit::validate`])
    pub rate_limit: Option<RateLimit>,
    pub ordering: DeliveryOrder,
    pub on_dead_letter: OnDeadLetter,
    pub headers: serde_json::Value,
    pub secret_grace_secs: i32,
    pub spec_fingerprint: Vec<u8>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UpsertResult {
    pub id: Uuid,
    pub created: bool,
    pub changed: bool,
    pub state: EndpointState,
}

/// Inserts or updates the endpoint declared as namespace/name. The id is fixed at first
/// insert. An endpoint disabled by its receiver (410) keeps that state while the
/// declaration is unchanged; a changed declaration resets it. A changed URL closes the
/// circuit, since the failures belonged to the old destination (the trigger
/// `endpoints_new_url`, migration 0023, as for every door).
///
/// An endpoint's tenant is fixed for the life of its row (migration 0006 refuses a change):
/// deliveries follow the row, so a row that changed hands would carry the old tenant's
/// pending deliveries and replays to the new owner's receiver. A declaration naming another
/// tenant therefore retires the old row first ([`retire_if_owner_changed`]) and gets a new
/// row with a new id (`created`).
pub async fn upsert(conn: &mut PgConnection, e: &EndpointUpsert) -> Result<UpsertResult, DbError> {
    // one transaction (a savepoint inside the caller's): never a retired row without its
    // successor
    let mut tx = super::begin_on(&mut *conn).await?;
    retire_if_owner_changed(
        &mut tx,
        &e.namespace,
        &e.name,
        &e.tenant,
        e.consumer.as_deref(),
    )
    .await?;
    let generation = match &e.consumer {
        Some(c) => Some(super::consumers::ensure(&mut tx, &e.tenant, c).await?),
        None => None,
    };
    let result = upsert_row(&mut tx, e, generation).await?;
    tx.commit().await?;
    Ok(result)
}

/// When the endpoint declared as namespace/name belongs to another owner (a tenant other
/// than `tenant`, or another consumer),
/// moves it aside for good: renamed out of the declaration's way (`name/retired/id`, which
/// no Kubernetes name can be), disabled, its open deliveries cancelled. Its deliveries and
/// dead letters stay with it, under their tenant: a replay by the old tenant sets them due
/// on a disabled row, which no dispatcher claims, so nothing of theirs reaches the new
/// owner. Returns the retired id and the number of deliveries cancelled.
pub async fn retire_if_owner_changed(
    conn: &mut PgConnection,
    namespace: &str,
    name: &str,
    tenant: &str,
    consumer: Option<&str>,
) -> Result<Option<(Uuid, i64)>, DbError> {
    let mut tries = 0;
    loop {
        let mut tx = super::begin_on(conn).await?;
        let work = retire_once(&mut tx, namespace, name, tenant, consumer).await;
        if let Some(done) =
            super::commit_or_retry(tx, work, &mut tries, "endpoint retirement").await?
        {
            return Ok(done);
        }
    }
}

async fn retire_once(
    conn: &mut PgConnection,
    namespace: &str,
    name: &str,
    tenant: &str,
    consumer: Option<&str>,
) -> Result<Option<(Uuid, i64)>, DbError> {
    let ids = declared_ids(conn, namespace, name).await?;
    super::lock_open_deliveries(conn, &ids).await?;
    Ok(sqlx::query_as(
        r#"
        WITH ep AS (
            UPDATE hookd.endpoints
            SET k8s_name = k8s_name || '/retired/' || id, state = 'disabled',
                -- read by the old owner (a consumer token of the old consumer sees this
                -- row): it must not learn who the declaration names now
                state_reason = 'retired: the declaration now names another owner',
                spec_fingerprint = NULL, updated_at = now()
            WHERE k8s_namespace = $1 AND k8s_name = $2
              AND (tenant <> $3 OR consumer IS DISTINCT FROM $4::text)
            RETURNING id
        ), cancelled AS (
            UPDATE hookd.deliveries d
            SET status = 'cancelled', locked_by = NULL, completed_at = now(), updated_at = now(),
                last_error = 'cancelled: the endpoint changed owner'
            FROM ep
            WHERE d.endpoint_id = ep.id AND d.status IN ('pending', 'in_progress', 'failed')
            RETURNING d.id
        )
        SELECT ep.id, (SELECT count(*) FROM cancelled) FROM ep
        "#,
    )
    .bind(namespace)
    .bind(name)
    .bind(tenant)
    .bind(consumer)
    .fetch_optional(on(conn))
    .await?)
}

async fn upsert_row(
    conn: &mut PgConnection,
    e: &EndpointUpsert,
    consumer_generation: Option<i64>,
) -> Result<UpsertResult, DbError> {
    let row: (Uuid, bool, bool, EndpointState) = sqlx::query_as(
        r#"
        WITH prev AS (
            SELECT id, spec_fingerprint, state FROM hookd.endpoints
            WHERE k8s_namespace = $1 AND k8s_name = $2
        ), up AS (
            INSERT INTO hookd.endpoints AS t (
                id, k8s_namespace, k8s_name, k8s_uid, tenant, url, event_types, state, state_reason,
                timeout_ms, max_attempts, retry_schedule_secs, max_in_flight,
                headers, secret_grace_secs, spec_fingerprint, consumer, consumer_generation,
                rate_per_second, rate_burst, ordering, on_dead_letter)
            VALUES (hookd.uuid_v7(), $1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17,
                    $18, $19, $20, $21)
            ON CONFLICT (k8s_namespace, k8s_name) DO UPDATE SET
                -- the declaration is the producer's: it follows the consumer's current
                -- generation (visible to that consumer's tokens)
                consumer_generation = EXCLUDED.consumer_generation,
                k8s_uid = EXCLUDED.k8s_uid,
                url = EXCLUDED.url,
                event_types = EXCLUDED.event_types,
                state = CASE WHEN t.state = 'disabled' AND t.spec_fingerprint = EXCLUDED.spec_fingerprint
                             THEN t.state ELSE EXCLUDED.state END,
                state_reason = CASE WHEN t.state = 'disabled' AND t.spec_fingerprint = EXCLUDED.spec_fingerprint
                                    THEN t.state_reason ELSE EXCLUDED.state_reason END,
                timeout_ms = EXCLUDED.timeout_ms,
                max_attempts = EXCLUDED.max_attempts,
                retry_schedule_secs = EXCLUDED.retry_schedule_secs,
                max_in_flight = EXCLUDED.max_in_flight,
                rate_per_second = EXCLUDED.rate_per_second,
                rate_burst = EXCLUDED.rate_burst,
                -- a changed limit starts with a full bucket and holds nothing
                rate_tokens = CASE WHEN (t.rate_per_second, t.rate_burst)
                                        IS NOT DISTINCT FROM (EXCLUDED.rate_per_second, EXCLUDED.rate_burst)
                                   THEN t.rate_tokens END,
                rate_wait_until = CASE WHEN (t.rate_per_second, t.rate_burst)
                                        IS NOT DISTINCT FROM (EXCLUDED.rate_per_second, EXCLUDED.rate_burst)
                                   THEN t.rate_wait_until END,
                ordering = EXCLUDED.ordering,
                on_dead_letter = EXCLUDED.on_dead_letter,
                headers = EXCLUDED.headers,
                secret_grace_secs = EXCLUDED.secret_grace_secs,
                spec_fingerprint = EXCLUDED.spec_fingerprint,
                -- a new URL closes the circuit and bumps config_version: the trigger
                -- endpoints_new_url (migration 0023), for every door
                removed_at = NULL,
                updated_at = now()
            WHERE t.spec_fingerprint IS DISTINCT FROM EXCLUDED.spec_fingerprint
               OR t.k8s_uid IS DISTINCT FROM EXCLUDED.k8s_uid
               OR t.consumer_generation IS DISTINCT FROM EXCLUDED.consumer_generation
            RETURNING t.id, t.state
        )
        SELECT coalesce(up.id, prev.id) AS id,
               prev.id IS NULL AS created,
               up.id IS NOT NULL AS changed,
               coalesce(up.state, prev.state) AS state
        FROM (SELECT 1) one
        LEFT JOIN up ON true
        LEFT JOIN prev ON true
        "#,
    )
    .bind(&e.namespace)
    .bind(&e.name)
    .bind(&e.uid)
    .bind(&e.tenant)
    .bind(&e.url)
    .bind(&e.event_types)
    .bind(e.state)
    .bind(&e.state_reason)
    .bind(e.timeout_ms)
    .bind(e.max_attempts)
    .bind(&e.retry_schedule_secs)
    .bind(e.max_in_flight)
    .bind(&e.headers)
    .bind(e.secret_grace_secs)
    .bind(&e.spec_fingerprint)
    .bind(&e.consumer)
    .bind(consumer_generation)
    .bind(e.rate_limit.map(|r| r.per_second))
    .bind(e.rate_limit.map(|r| r.burst_or_default() as i32))
    .bind(e.ordering)
    .bind(e.on_dead_letter)
    .fetch_one(on(conn))
    .await?;
    Ok(UpsertResult {
        id: row.0,
        created: row.1,
        changed: row.2,
        state: row.3,
    })
}

/// Marks the endpoint declared as namespace/name disabled (its declaration is gone) and
/// cancels every delivery that has not reached a terminal state, so they are visible as
/// `cancelled` rather than silently dropped. History stays. Returns the endpoint id and
/// the number of cancelled deliveries, or None when no such endpoint exists.
pub async fn remove_declared(
    conn: &mut PgConnection,
    namespace: &str,
    name: &str,
    reason: &str,
) -> Result<Option<(Uuid, i64)>, DbError> {
    let mut tries = 0;
    loop {
        let mut tx = super::begin_on(conn).await?;
        let work = remove_declared_once(&mut tx, namespace, name, reason).await;
        if let Some(done) = super::commit_or_retry(tx, work, &mut tries, "endpoint removal").await?
        {
            return Ok(done);
        }
    }
}

/// The ids of the rows declared as namespace/name (one, unless retired ones share it).
async fn declared_ids(
    conn: &mut PgConnection,
    namespace: &str,
    name: &str,
) -> Result<Vec<Uuid>, DbError> {
    Ok(sqlx::query_scalar(
        "SELECT id FROM hookd.endpoints WHERE k8s_namespace = $1 AND k8s_name = $2",
    )
    .bind(namespace)
    .bind(name)
    .fetch_all(on(conn))
    .await?)
}

async fn remove_declared_once(
    conn: &mut PgConnection,
    namespace: &str,
    name: &str,
    reason: &str,
) -> Result<Option<(Uuid, i64)>, DbError> {
    let ids = declared_ids(conn, namespace, name).await?;
    super::lock_open_deliveries(conn, &ids).await?;
    let row: Option<(Uuid, i64)> = sqlx::query_as(
        r#"
        WITH ep AS (
            UPDATE hookd.endpoints SET state = 'disabled', state_reason = $3,
                   spec_fingerprint = NULL, removed_at = now(), updated_at = now()
            WHERE k8s_namespace = $1 AND k8s_name = $2
            RETURNING id
        ), cancelled AS (
            UPDATE hookd.deliveries d
            SET status = 'cancelled', locked_by = NULL, claim_token = NULL, completed_at = now(),
                updated_at = now(), last_error = $3
            FROM ep
            WHERE d.endpoint_id = ep.id AND d.status IN ('pending', 'in_progress', 'failed')
            RETURNING d.id
        )
        SELECT ep.id, (SELECT count(*) FROM cancelled) FROM ep
        "#,
    )
    .bind(namespace)
    .bind(name)
    .bind(reason)
    .fetch_optional(on(conn))
    .await?;
    Ok(row)
}

/// The id of the endpoint declared as namespace/name whose declaration has not been
/// removed (`hookd delete` answers "not found" for one already removed, as kubectl does).
pub async fn declared_live(
    conn: &mut PgConnection,
    namespace: &str,
    name: &str,
) -> Result<Option<Uuid>, DbError> {
    Ok(sqlx::query_scalar(
        "SELECT id FROM hookd.endpoints
         WHERE k8s_namespace = $1 AND k8s_name = $2 AND removed_at IS NULL",
    )
    .bind(namespace)
    .bind(name)
    .fetch_optional(on(conn))
    .await?)
}

/// Holds the endpoint declared as namespace/name (paused, with `reason`) without touching
/// the rest of its row: its current declaration is refused, so the last accepted one stays
/// but nothing is sent. A disabled endpoint stays disabled. Clearing the fingerprint makes
/// the next accepted declaration rewrite the row. Returns the id, if such a row exists.
pub async fn hold_declared(
    conn: &mut PgConnection,
    namespace: &str,
    name: &str,
    reason: &str,
) -> Result<Option<Uuid>, DbError> {
    Ok(sqlx::query_scalar(
        r#"
        UPDATE hookd.endpoints
        SET state = CASE WHEN state = 'disabled' THEN state ELSE 'paused' END,
            state_reason = CASE WHEN state = 'disabled' THEN state_reason ELSE $3 END,
            spec_fingerprint = NULL, updated_at = now()
        WHERE k8s_namespace = $1 AND k8s_name = $2
        RETURNING id
        "#,
    )
    .bind(namespace)
    .bind(name)
    .bind(reason)
    .fetch_optional(on(conn))
    .await?)
}

/// Disables endpoints because their receiver said so (410 Gone), each only if it still
/// has the configuration (`config_version`) the 410 was received under. Deliveries stay
/// where they are: an operator who re-enables the endpoint (by changing its declaration)
/// can let them drain. Returns the endpoints disabled.
pub async fn disable(
    conn: &mut PgConnection,
    ids: &[(Uuid, i64)],
    reason: &str,
) -> Result<Vec<Uuid>, DbError> {
    let (eps, versions): (Vec<Uuid>, Vec<i64>) = ids.iter().copied().unzip();
    Ok(sqlx::query_scalar(
        "UPDATE hookd.endpoints e SET state = 'disabled', state_reason = $3, updated_at = now()
         FROM unnest($1::uuid[], $2::bigint[]) AS i(id, version)
         WHERE e.id = i.id AND e.config_version = i.version AND e.state <> 'disabled'
         RETURNING e.id",
    )
    .bind(&eps)
    .bind(&versions)
    .bind(reason)
    .fetch_all(on(conn))
    .await?)
}

/// Outcomes of one completion batch for one endpoint, in attempt order collapsed to what
/// the breaker needs: whether any attempt succeeded, and how many failed after the last
/// success.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CircuitInput {
    pub endpoint_id: Uuid,
    /// the configuration the sends used; outcomes for an older one are ignored
    pub config_version: i64,
    pub any_success: bool,
    pub trailing_failures: i32,
}

/// Applies a batch of outcomes to the circuit breakers in one atomic statement, so
/// concurrent replicas never lose each other's counts. A success closes the circuit; a
/// failure while half-open, or reaching `threshold` consecutive failures, opens it for
/// `cooldown`. An endpoint whose breaker is closed and clean is not written on success at
/// all: with thousands of customers' endpoints taking a delivery or two each, writing
/// every endpoint's row on its first success cost as much as a tenth of a drain
/// (hookd-bench, issue 27). Returns the endpoints that this batch opened.
pub async fn record_circuit(
    conn: &mut PgConnection,
    inputs: &[CircuitInput],
    threshold: i32,
    cooldown_secs: f64,
) -> Result<Vec<Uuid>, DbError> {
    Ok(
        record_circuit_transitions(conn, inputs, threshold, cooldown_secs)
            .await?
            .opened,
    )
}

/// The endpoints whose circuit this batch opened, and those it closed again.
#[derive(Debug, Default)]
pub struct CircuitTransitions {
    pub opened: Vec<Uuid>,
    pub closed: Vec<Uuid>,
}

/// [`record_circuit`], also returning the circuits it closed (so the dispatcher can log
/// both transitions).
pub async fn record_circuit_transitions(
    conn: &mut PgConnection,
    inputs: &[CircuitInput],
    threshold: i32,
    cooldown_secs: f64,
) -> Result<CircuitTransitions, DbError> {
    if inputs.is_empty() {
        return Ok(CircuitTransitions::default());
    }
    let rows: Vec<(Uuid, CircuitState, bool, CircuitState)> = sqlx::query_as_with(
        RECORD_CIRCUIT_SQL,
        record_circuit_arguments(inputs, threshold, cooldown_secs)?,
    )
    .fetch_all(on(conn))
    .await?;
    let mut t = CircuitTransitions::default();
    for (id, was, open_now, now) in rows {
        if open_now && was != CircuitState::Open {
            t.opened.push(id);
        } else if was != CircuitState::Closed && now == CircuitState::Closed {
            t.closed.push(id);
        }
    }
    Ok(t)
}

/// The circuit statement of [`record_circuit_transitions`]; shared with
/// [`explain_record_circuit`] so a test reads the plan of exactly this text.
const RECORD_CIRCUIT_SQL: &str = r#"
        WITH i AS MATERIALIZED (
            SELECT * FROM unnest($1::uuid[], $2::bool[], $3::int[], $6::bigint[])
              AS i(id, any_success, trailing_failures, version)
        ), calc AS MATERIALIZED (
            -- One primary-key probe per outcome, locking in id order, written as a LATERAL
            -- so the plan is driven from the batch whatever the statistics say: with
            -- statistics taken while a bulk `hookd apply` was still uncommitted (0 rows in
            -- 455 pages), the planner expected one endpoint and joined the batch to a full
            -- scan of the table, three times: 1-1.5 s per batch of 512 with 10,000
            -- endpoints, leases lapsing meanwhile (hookd-bench, auto_explain).
            SELECT i.id, e.circuit_state AS was, i.any_success, i.trailing_failures,
                   (CASE WHEN i.any_success THEN 0 ELSE e.circuit_failures END) + i.trailing_failures AS failures,
                   i.trailing_failures > 0
                     AND ((e.circuit_state <> 'closed' AND NOT i.any_success)
                          OR (CASE WHEN i.any_success THEN 0 ELSE e.circuit_failures END) + i.trailing_failures >= $4)
                     AS open_now
            -- a sorted subquery is never flattened, and a LATERAL that names its columns
            -- is joined by a nested loop in its order: the locks are taken in id order
            FROM (SELECT * FROM i ORDER BY i.id) i
            CROSS JOIN LATERAL (
                SELECT e.circuit_state, e.circuit_failures FROM hookd.endpoints e
                -- only outcomes of the endpoint's current configuration count
                WHERE e.id = i.id AND e.config_version = i.version
                  -- a clean, closed breaker has nothing to record for a success: the row
                  -- is neither locked nor written (an endpoint's last success is read from
                  -- its deliveries, see last_success)
                  AND (i.trailing_failures > 0 OR e.circuit_failures <> 0 OR e.circuit_state <> 'closed'
                       -- a send happened: the secret was readable after all
                       OR (e.secret_unreadable IS NOT NULL AND (i.any_success OR i.trailing_failures > 0)))
                FOR NO KEY UPDATE OF e
            ) e
        )
        UPDATE hookd.endpoints e SET
            circuit_failures = calc.failures,
            circuit_state = CASE WHEN calc.open_now THEN 'open'
                                 WHEN calc.failures = 0 THEN 'closed'
                                 ELSE e.circuit_state END,
            circuit_open_until = CASE WHEN calc.open_now THEN now() + make_interval(secs => $5)
                                      WHEN calc.failures = 0 THEN NULL
                                      ELSE e.circuit_open_until END,
            last_failure_at = CASE WHEN calc.trailing_failures > 0 THEN now() ELSE e.last_failure_at END,
            secret_unreadable = CASE WHEN calc.any_success OR calc.trailing_failures > 0 THEN NULL
                                     ELSE e.secret_unreadable END,
            secret_unreadable_since = CASE WHEN calc.any_success OR calc.trailing_failures > 0 THEN NULL
                                           ELSE e.secret_unreadable_since END
        FROM calc
        -- the batch's ids bound the scan of the target in any join order the
        -- statistics lead to
        WHERE e.id = calc.id AND e.id = ANY ($1::uuid[])
        RETURNING e.id, calc.was, calc.open_now, e.circuit_state
        "#;

fn record_circuit_arguments(
    inputs: &[CircuitInput],
    threshold: i32,
    cooldown_secs: f64,
) -> Result<PgArguments, DbError> {
    let ids: Vec<Uuid> = inputs.iter().map(|i| i.endpoint_id).collect();
    let ok: Vec<bool> = inputs.iter().map(|i| i.any_success).collect();
    let fails: Vec<i32> = inputs.iter().map(|i| i.trailing_failures).collect();
    let versions: Vec<i64> = inputs.iter().map(|i| i.config_version).collect();
    let mut args = PgArguments::default();
    let encode = |e| DbError::Query(sqlx::Error::Encode(e));
    args.add(ids).map_err(encode)?;
    args.add(ok).map_err(encode)?;
    args.add(fails).map_err(encode)?;
    args.add(threshold).map_err(encode)?;
    args.add(cooldown_secs).map_err(encode)?;
    args.add(versions).map_err(encode)?;
    Ok(args)
}

/// `EXPLAIN (ANALYZE, BUFFERS)` of the circuit statement for `inputs`, executed the way an
/// outcome batch runs it (index paths only) in a transaction that is rolled back. For
/// tests that prove it probes the batch's endpoints whatever the statistics say.
pub async fn explain_record_circuit(
    pool: &PgPool,
    inputs: &[CircuitInput],
    threshold: i32,
    cooldown_secs: f64,
) -> Result<Vec<String>, DbError> {
    super::explain_analyze(
        pool,
        RECORD_CIRCUIT_SQL,
        record_circuit_arguments(inputs, threshold, cooldown_secs)?,
    )
    .await
}

/// Refreshes the planner's statistics of the endpoints table (after a bulk apply). Waits
/// at most 5 s for a lock (a manual VACUUM or another ANALYZE holds it; the statistics
/// then come from autovacuum). Needs the table's owner, the role that ran the migrations:
/// for any other role Postgres skips the table with a warning and this returns Ok.
pub async fn analyze(pool: &PgPool) -> Result<(), DbError> {
    let mut tx = super::begin(pool).await?;
    sqlx::query("SELECT set_config('lock_timeout', '5s', true)")
        .execute(on(&mut *tx))
        .await?;
    sqlx::query("ANALYZE hookd.endpoints")
        .execute(on(&mut *tx))
        .await?;
    tx.commit().await?;
    Ok(())
}

#[derive(Debug, Clone, sqlx::FromRow)]
pub struct EndpointRow {
    pub id: Uuid,
    pub tenant: String,
    /// empty for endpoints made through the endpoints API
    pub k8s_namespace: String,
    pub k8s_name: String,
    pub url: String,
    pub event_types: Vec<String>,
    pub state: EndpointState,
    pub state_reason: Option<String>,
    pub circuit_state: CircuitState,
    pub circuit_failures: i32,
    pub circuit_open_until: Option<DateTime<Utc>>,
}

/// The endpoint with this id; with `tenant` set, only if it belongs to that tenant (another
/// tenant's endpoint is as absent as an unknown id).
pub async fn get(
    pool: &PgPool,
    id: Uuid,
    tenant: Option<&str>,
) -> Result<Option<EndpointRow>, DbError> {
    Ok(sqlx::query_as::<_, EndpointRow>(
        "SELECT id, tenant, coalesce(k8s_namespace, '') AS k8s_namespace,
                coalesce(k8s_name, '') AS k8s_name, url, event_types, state, state_reason, circuit_state, circuit_failures, circuit_open_until
         FROM hookd.endpoints WHERE id = $1 AND ($2::text IS NULL OR tenant = $2)",
    )
    .bind(id)
    .bind(tenant)
    .fetch_optional(on(pool))
    .await?)
}

pub async fn get_declared(
    pool: &PgPool,
    namespace: &str,
    name: &str,
) -> Result<Option<EndpointRow>, DbError> {
    Ok(sqlx::query_as::<_, EndpointRow>(
        "SELECT id, tenant, coalesce(k8s_namespace, '') AS k8s_namespace,
                coalesce(k8s_name, '') AS k8s_name, url, event_types, state, state_reason, circuit_state, circuit_failures, circuit_open_until
         FROM hookd.endpoints WHERE k8s_namespace = $1 AND k8s_name = $2",
    )
    .bind(namespace)
    .bind(name)
    .fetch_optional(on(pool))
    .await?)
}

/// What the controller reports in a WebhookEndpoint's status and the API in an endpoint's
/// stats.
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub struct EndpointStats {
    pub id: Uuid,
    pub state: EndpointState,
    pub state_reason: Option<String>,
    pub circuit_state: CircuitState,
    pub circuit_failures: i32,
    pub circuit_open_until: Option<DateTime<Utc>>,
    /// see [`last_success`]
    #[sqlx(skip)]
    pub last_success: Option<LastAttempt>,
    /// written with the failure counts of the breaker
    pub last_failure_at: Option<DateTime<Utc>>,
    /// claimable deliveries (pending, in progress, waiting for a retry), at most `cap`
    pub backlog: i64,
    /// dead letters not yet replayed, at most `cap`
    pub dead_letters: i64,
    /// why a dispatcher holds the endpoint's deliveries: it cannot decrypt its signing
    /// secret (see [`mark_secret_unreadable`])
    pub secret_unreadable: Option<String>,
    pub secret_unreadable_since: Option<DateTime<Utc>>,
}

/// Status figures for one endpoint. Both counts are bounded range scans of an index whose
/// leading column is the endpoint (`deliveries_claimable`, `dead_letters_endpoint`), so
/// sampling every few seconds costs the same however much history the endpoint has; past
/// `cap` they saturate rather than scan further.
pub async fn stats(pool: &PgPool, id: Uuid, cap: i64) -> Result<Option<EndpointStats>, DbError> {
    let Some(mut stats) = sqlx::query_as::<_, EndpointStats>(
        r#"
        SELECT e.id, e.state, e.state_reason, e.circuit_state, e.circuit_failures,
               e.circuit_open_until, e.last_failure_at,
               (SELECT count(*) FROM (
                   SELECT 1 FROM hookd.deliveries d
                   WHERE d.endpoint_id = e.id AND d.status IN ('pending', 'in_progress', 'failed')
                   LIMIT $2) b) AS backlog,
               (SELECT count(*) FROM (
                   SELECT 1 FROM hookd.dead_letters dl WHERE dl.endpoint_id = e.id LIMIT $2) x)
                 AS dead_letters,
               e.secret_unreadable, e.secret_unreadable_since
        FROM hookd.endpoints e WHERE e.id = $1
        "#,
    )
    .bind(id)
    .bind(cap)
    .fetch_optional(on(pool))
    .await?
    else {
        return Ok(None);
    };
    stats.last_success = last_success(pool, id).await?;
    Ok(Some(stats))
}

/// Records why deliveries of these endpoints are held (issue 19): a dispatcher could not
/// decrypt a signing secret. Written only when the reason changes, so a held backlog
/// retried every minute does not rewrite the row each time; the first time is kept.
/// Cleared by [`record_circuit`] when an attempt is sent again.
pub async fn mark_secret_unreadable(
    conn: &mut PgConnection,
    held: &[(Uuid, String)],
) -> Result<(), DbError> {
    if held.is_empty() {
        return Ok(());
    }
    let ids: Vec<Uuid> = held.iter().map(|h| h.0).collect();
    let reasons: Vec<String> = held
        .iter()
        .map(|h| super::deliveries::pg_text(&h.1).into_owned())
        .collect();
    sqlx::query(
        r#"
        UPDATE hookd.endpoints e
        SET secret_unreadable = h.reason,
            secret_unreadable_since = coalesce(e.secret_unreadable_since, now())
        FROM (SELECT DISTINCT ON (id) id, reason
              FROM unnest($1::uuid[], $2::text[]) AS h(id, reason) ORDER BY id) h
        WHERE e.id = h.id AND e.secret_unreadable IS DISTINCT FROM h.reason
        "#,
    )
    .bind(&ids)
    .bind(&reasons)
    .execute(on(conn))
    .await?;
    Ok(())
}

/// Marks as reported the circuits open for longer than `after` and not reported since
/// they opened; migration 0030's trigger emits `hookd.endpoint.circuit_open` for each in
/// the same transaction. Locks in id order (as the outcome batches do) and skips rows
/// another transaction holds: they are found on the next pass. Returns how many.
pub async fn report_open_circuits(
    pool: &PgPool,
    after: std::time::Duration,
) -> Result<u64, DbError> {
    let r = sqlx::query(
        "UPDATE hookd.endpoints e SET circuit_alerted_at = now()
         WHERE e.id = ANY (ARRAY(
             SELECT id FROM hookd.endpoints
             WHERE circuit_state <> 'closed' AND circuit_alerted_at IS NULL
               AND circuit_opened_at < now() - make_interval(secs => $1)
               AND state <> 'disabled' AND removed_at IS NULL
             ORDER BY id
             FOR NO KEY UPDATE SKIP LOCKED))",
    )
    .bind(after.as_secs_f64())
    .execute(on(pool))
    .await?;
    Ok(r.rows_affected())
}

// ---- the endpoints API ----

/// An endpoint as the endpoints API shows it.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct EndpointView {
    pub id: Uuid,
    pub tenant: String,
    pub consumer: Option<String>,
    pub url: String,
    pub event_types: Vec<String>,
    pub description: Option<String>,
    pub headers: sqlx::types::Json<serde_json::Value>,
    pub state: EndpointState,
    pub state_reason: Option<String>,
    pub managed_by: ManagedBy,
    pub k8s_namespace: Option<String>,
    pub k8s_name: Option<String>,
    pub circuit_state: CircuitState,
    pub circuit_open_until: Option<DateTime<Utc>>,
    pub secret_unreadable: Option<String>,
    pub secret_unreadable_since: Option<DateTime<Utc>>,
    pub rate_per_second: Option<f64>,
    pub rate_burst: Option<i32>,
    pub ordering: DeliveryOrder,
    pub on_dead_letter: OnDeadLetter,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
}

impl EndpointView {
    pub fn rate_limit(&self) -> Option<RateLimit> {
        Some(RateLimit {
            per_second: self.rate_per_second?,
            burst: self.rate_burst.map(|b| b.max(1) as u32),
        })
    }
}

const VIEW_COLUMNS: &str =
    "e.id, e.tenant, e.consumer, e.url, e.event_types, e.description, e.headers,
    e.state, e.state_reason, e.managed_by, e.k8s_namespace, e.k8s_name, e.circuit_state,
    e.circuit_open_until, e.secret_unreadable, e.secret_unreadable_since, e.rate_per_second,
    e.rate_burst, e.ordering, e.on_dead_letter, e.created_at, e.updated_at";

/// The endpoint with this id if `audience` may see it and it was not deleted.
pub async fn get_visible(
    pool: &PgPool,
    id: Uuid,
    audience: super::Audience<'_>,
) -> Result<Option<EndpointView>, DbError> {
    Ok(
        sqlx::query_as::<_, EndpointView>(sqlx::AssertSqlSafe(format!(
            "SELECT {VIEW_COLUMNS} FROM hookd.endpoints e
         WHERE e.id = $1 AND e.removed_at IS NULL
           AND ($2::text IS NULL OR e.tenant = $2) AND ($3::text IS NULL OR e.consumer = $3)
           AND ($4::bigint IS NULL OR e.consumer_generation = $4)"
        )))
        .bind(id)
        .bind(audience.tenant)
        .bind(audience.consumer)
        .bind(audience.consumer_generation)
        .fetch_optional(on(pool))
        .await?,
    )
}

/// One keyset page by id (`endpoints_tenant_page` / `endpoints_consumer_page`).
pub async fn list(
    pool: &PgPool,
    audience: super::Audience<'_>,
    consumer: Option<&str>,
    after: Option<Uuid>,
    limit: i64,
) -> Result<Vec<EndpointView>, DbError> {
    Ok(
        sqlx::query_as::<_, EndpointView>(sqlx::AssertSqlSafe(format!(
            "SELECT {VIEW_COLUMNS} FROM hookd.endpoints e
         WHERE e.removed_at IS NULL
           AND ($1::text IS NULL OR e.tenant = $1)
           AND ($2::text IS NULL OR e.consumer = $2)
           AND ($3::text IS NULL OR e.consumer = $3)
           AND ($4::uuid IS NULL OR e.id > $4)
           AND ($6::bigint IS NULL OR e.consumer_generation = $6)
         ORDER BY e.id LIMIT $5"
        )))
        .bind(audience.tenant)
        .bind(audience.consumer)
        .bind(consumer)
        .bind(after)
        .bind(limit)
        .bind(audience.consumer_generation)
        .fetch_all(on(pool))
        .await?,
    )
}

/// A new endpoint from the endpoints API.
#[derive(Debug, Clone)]
pub struct NewApiEndpoint {
    pub id: Uuid,
    pub tenant: String,
    pub consumer: Option<String>,
    pub url: String,
    pub event_types: Vec<String>,
    pub description: Option<String>,
    pub headers: serde_json::Value,
    pub paused: bool,
    /// burst resolved
    pub rate_limit: Option<RateLimit>,
    pub ordering: DeliveryOrder,
    pub on_dead_letter: OnDeadLetter,
    /// the consumer generation it is made for (held by the caller's transaction)
    pub consumer_generation: Option<i64>,
}

pub async fn insert_api(conn: &mut PgConnection, e: &NewApiEndpoint) -> Result<(), DbError> {
    sqlx::query(
        r#"
        INSERT INTO hookd.endpoints (id, tenant, consumer, managed_by, url, event_types,
                                     description, headers, state, state_reason,
                                     consumer_generation, rate_per_second, rate_burst,
                                     ordering, on_dead_letter)
        VALUES ($1, $2, $3, 'api', $4, $5, $6, $7,
                CASE WHEN $8 THEN 'paused' ELSE 'active' END,
                CASE WHEN $8 THEN 'paused through the API' END, $9, $10, $11, $12, $13)
        "#,
    )
    .bind(e.id)
    .bind(&e.tenant)
    .bind(&e.consumer)
    .bind(&e.url)
    .bind(&e.event_types)
    .bind(&e.description)
    .bind(&e.headers)
    .bind(e.paused)
    .bind(e.consumer_generation)
    .bind(e.rate_limit.map(|r| r.per_second))
    .bind(e.rate_limit.map(|r| r.burst_or_default() as i32))
    .bind(e.ordering)
    .bind(e.on_dead_letter)
    .execute(on(conn))
    .await?;
    Ok(())
}

/// A change through the endpoints API; `None` leaves a field as it is.
#[derive(Debug, Clone, Default)]
pub struct EndpointPatch {
    pub url: Option<String>,
    pub event_types: Option<Vec<String>>,
    /// `Some(None)` clears it
    pub description: Option<Option<String>>,
    pub headers: Option<serde_json::Value>,
    pub state: Option<ApiState>,
    /// `Some(None)` removes the limit; burst resolved
    pub rate_limit: Option<Option<RateLimit>>,
    pub ordering: Option<DeliveryOrder>,
    pub on_dead_letter: Option<OnDeadLetter>,
}

/// The states the API may set.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ApiState {
    /// resume a paused endpoint, or re-enable one a receiver's 410 disabled
    Active,
    Paused,
}

impl From<ApiState> for EndpointState {
    fn from(s: ApiState) -> EndpointState {
        match s {
            ApiState::Active => EndpointState::Active,
            ApiState::Paused => EndpointState::Paused,
        }
    }
}

/// Why a change through the API was not made.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PatchRefused {
    NotFound,
    /// declared by a WebhookEndpoint object: Kubernetes owns it
    ManagedByKubernetes,
    /// activating an endpoint whose consumer no longer exists
    ConsumerDeleted,
}

/// Locks the endpoint for a change through the API: it must be visible to `audience`, not
/// deleted, and made through the API (Kubernetes owns the others).
async fn lock_api_endpoint(
    conn: &mut PgConnection,
    id: Uuid,
    audience: super::Audience<'_>,
) -> Result<Result<(String, Option<String>, Option<i64>), PatchRefused>, DbError> {
    let managed: Option<(ManagedBy, String, Option<String>, Option<i64>)> = sqlx::query_as(
        "SELECT managed_by, tenant, consumer, consumer_generation FROM hookd.endpoints
         WHERE id = $1 AND removed_at IS NULL
           AND ($2::text IS NULL OR tenant = $2) AND ($3::text IS NULL OR consumer = $3)
           AND ($4::bigint IS NULL OR consumer_generation = $4)
         FOR UPDATE",
    )
    .bind(id)
    .bind(audience.tenant)
    .bind(audience.consumer)
    .bind(audience.consumer_generation)
    .fetch_optional(on(&mut *conn))
    .await?;
    Ok(match managed {
        None => Err(PatchRefused::NotFound),
        Some((ManagedBy::Api, tenant, consumer, generation)) => Ok((tenant, consumer, generation)),
        Some((ManagedBy::Kubernetes, ..)) => Err(PatchRefused::ManagedByKubernetes),
    })
}

/// Applies `patch` to an API-managed endpoint `audience` may see. A new URL closes the
/// circuit and bumps `config_version` (outcomes of sends to the old URL no longer count);
/// activating clears a 410's `disabled`.
pub async fn patch_api(
    conn: &mut PgConnection,
    id: Uuid,
    audience: super::Audience<'_>,
    patch: &EndpointPatch,
) -> Result<Result<EndpointView, PatchRefused>, DbError> {
    let (tenant, consumer, generation) = match lock_api_endpoint(conn, id, audience).await? {
        Ok(owner) => owner,
        Err(refused) => return Ok(Err(refused)),
    };
    // An endpoint of a deleted consumer stays disabled for good: a later consumer with the
    // same uid is another customer (another generation), and its events must never reach
    // the earlier one's URL. Pausing counts too: a paused endpoint is subscribed again.
    if patch.state.is_some()
        && let Some(c) = &consumer
        && (generation.is_none() || super::consumers::hold(conn, &tenant, c).await? != generation)
    {
        return Ok(Err(PatchRefused::ConsumerDeleted));
    }
    let state = patch.state.map(EndpointState::from);
    let view = sqlx::query_as::<_, EndpointView>(sqlx::AssertSqlSafe(format!(
        r#"
        UPDATE hookd.endpoints e SET
            url = coalesce($2::text, e.url),
            event_types = coalesce($3::text[], e.event_types),
            description = CASE WHEN $4::bool THEN $5::text ELSE e.description END,
            headers = coalesce($6::jsonb, e.headers),
            state = coalesce($7::text, e.state),
            state_reason = CASE WHEN $7 IS NULL THEN e.state_reason
                                WHEN $7 = 'paused' THEN 'paused through the API'
                                ELSE NULL END,
            consumer_deleted_at = CASE WHEN $7 = 'active' THEN NULL ELSE e.consumer_deleted_at END,
            rate_per_second = CASE WHEN $8::bool THEN $9::float8 ELSE e.rate_per_second END,
            rate_burst = CASE WHEN $8::bool THEN $10::int ELSE e.rate_burst END,
            -- a changed limit starts with a full bucket and holds nothing; the same limit
            -- sent again (a portal's Save with nothing changed) keeps its bucket, or a
            -- customer could refill it at will
            rate_tokens = CASE WHEN $8::bool AND (e.rate_per_second, e.rate_burst)
                                   IS DISTINCT FROM ($9::float8, $10::int)
                               THEN NULL ELSE e.rate_tokens END,
            rate_wait_until = CASE WHEN $8::bool AND (e.rate_per_second, e.rate_burst)
                                       IS DISTINCT FROM ($9::float8, $10::int)
                                   THEN NULL ELSE e.rate_wait_until END,
            -- a change releases or holds the lines (trigger endpoints_ordering, 0034)
            ordering = coalesce($11::text, e.ordering),
            on_dead_letter = coalesce($12::text, e.on_dead_letter),
            updated_at = now()
        WHERE e.id = $1
        RETURNING {VIEW_COLUMNS}
        "#
    )))
    .bind(id)
    .bind(&patch.url)
    .bind(&patch.event_types)
    .bind(patch.description.is_some())
    .bind(patch.description.clone().flatten())
    .bind(&patch.headers)
    .bind(state)
    .bind(patch.rate_limit.is_some())
    .bind(patch.rate_limit.flatten().map(|r| r.per_second))
    .bind(
        patch
            .rate_limit
            .flatten()
            .map(|r| r.burst_or_default() as i32),
    )
    .bind(patch.ordering)
    .bind(patch.on_dead_letter)
    .fetch_one(on(&mut *conn))
    .await?;
    Ok(Ok(view))
}

/// Deletes an API-managed endpoint: it stops receiving (removed, disabled), its open
/// deliveries are cancelled with a reason, its history stays until retention prunes it.
/// In a transaction of its own (a savepoint in the caller's), run again after a deadlock
/// or serialization failure (see [`super::commit_or_retry`]).
pub async fn delete_api(
    conn: &mut PgConnection,
    id: Uuid,
    audience: super::Audience<'_>,
) -> Result<Result<i64, PatchRefused>, DbError> {
    let mut tries = 0;
    loop {
        let mut tx = super::begin_on(conn).await?;
        let work = delete_api_once(&mut tx, id, audience).await;
        if let Some(done) =
            super::commit_or_retry(tx, work, &mut tries, "endpoint deletion").await?
        {
            return Ok(done);
        }
    }
}

async fn delete_api_once(
    conn: &mut PgConnection,
    id: Uuid,
    audience: super::Audience<'_>,
) -> Result<Result<i64, PatchRefused>, DbError> {
    // deliveries before the endpoint row, as outcome batches take them (see
    // `lock_open_deliveries`); an endpoint the caller may not touch has its rows
    // locked for a moment, nothing more
    super::lock_open_deliveries(conn, &[id]).await?;
    if let Err(refused) = lock_api_endpoint(conn, id, audience).await? {
        return Ok(Err(refused));
    }
    let cancelled: i64 = sqlx::query_scalar(
        r#"
        WITH ep AS (
            UPDATE hookd.endpoints SET state = 'disabled', state_reason = 'deleted through the API',
                   removed_at = now(), updated_at = now()
            WHERE id = $1 RETURNING id
        ), cancelled AS (
            UPDATE hookd.deliveries d
            SET status = 'cancelled', locked_by = NULL, claim_token = NULL, completed_at = now(),
                updated_at = now(), last_error = 'cancelled: the endpoint was deleted'
            FROM ep
            WHERE d.endpoint_id = ep.id AND d.status IN ('pending', 'in_progress', 'failed')
            RETURNING d.id
        )
        SELECT count(*) FROM cancelled
        "#,
    )
    .bind(id)
    .fetch_one(on(&mut *conn))
    .await?;
    Ok(Ok(cancelled))
}

/// Recent outcomes of one endpoint, for its stats page.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct HourlyOutcomes {
    pub hour: DateTime<Utc>,
    pub succeeded: i64,
    pub failed: i64,
}

/// Deliveries of the last 24 hours by the hour they were created in and how they ended
/// (succeeded; dead, or failed and waiting for a retry). A range of
/// `deliveries_endpoint_page` (endpoint_id, id), newest first, capped at `cap` rows so a
/// busy endpoint's page stays cheap (the counts are then a sample of the newest). A
/// delivery's UUIDv7 is minted after its `created_at` (the enqueue transaction's start), so
/// the floor of the window's start bounds the scan; it is taken an hour early here, from
/// this process's clock, against skew with the database's.
pub async fn hourly_outcomes(
    pool: &PgPool,
    id: Uuid,
    cap: i64,
) -> Result<Vec<HourlyOutcomes>, DbError> {
    Ok(sqlx::query_as::<_, HourlyOutcomes>(
        r#"
        SELECT h.hour,
               count(*) FILTER (WHERE x.status = 'succeeded') AS succeeded,
               count(*) FILTER (WHERE x.status IN ('failed', 'dead')) AS failed
        FROM generate_series(date_trunc('hour', now()) - interval '23 hours',
                             date_trunc('hour', now()), interval '1 hour') AS h(hour)
        LEFT JOIN (
            SELECT d.created_at, d.status FROM hookd.deliveries d
            WHERE d.endpoint_id = $1 AND d.id >= $3
              AND d.created_at >= date_trunc('hour', now()) - interval '23 hours'
            ORDER BY d.id DESC
            LIMIT $2
        ) x ON date_trunc('hour', x.created_at) = h.hour
        GROUP BY h.hour ORDER BY h.hour
        "#,
    )
    .bind(id)
    .bind(cap)
    .bind(super::retention::uuid_v7_floor(
        Utc::now() - chrono::TimeDelta::hours(25),
    ))
    .fetch_all(on(pool))
    .await?)
}

/// An attempt of an endpoint's recent deliveries: its last success or failure.
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub struct LastAttempt {
    pub started_at: DateTime<Utc>,
    pub status_code: Option<i32>,
    pub error: Option<String>,
}

/// The attempt that delivered the endpoint's newest succeeded delivery, among its newest
/// 1,000 deliveries: the one home of an endpoint's last success (the row does not keep
/// it, see [`record_circuit`]). The controller reads it every few seconds for each
/// WebhookEndpoint, so the walk stops at the first succeeded delivery: a row or two for
/// an endpoint that is well. An older delivery that succeeded later, on a retry, is not
/// looked for.
pub async fn last_success(pool: &PgPool, id: Uuid) -> Result<Option<LastAttempt>, DbError> {
    Ok(sqlx::query_as::<_, LastAttempt>(
        r#"
        SELECT a.started_at, a.status_code, a.error
        FROM (SELECT d.id, d.status FROM hookd.deliveries d WHERE d.endpoint_id = $1
              ORDER BY d.id DESC LIMIT 1000) d
        CROSS JOIN LATERAL (
            SELECT a.started_at, a.status_code, a.error FROM hookd.delivery_attempts a
            WHERE a.delivery_id = d.id ORDER BY a.attempt DESC LIMIT 1
        ) a
        WHERE d.status = 'succeeded'
        ORDER BY d.id DESC LIMIT 1
        "#,
    )
    .bind(id)
    .fetch_optional(on(pool))
    .await?)
}

/// The newest failed attempt (an error or a status other than 2xx) among the endpoint's
/// newest 1,000 deliveries.
pub async fn last_failure(pool: &PgPool, id: Uuid) -> Result<Option<LastAttempt>, DbError> {
    Ok(sqlx::query_as::<_, LastAttempt>(
        r#"
        SELECT a.started_at, a.status_code, a.error
        FROM (SELECT d.id FROM hookd.deliveries d WHERE d.endpoint_id = $1
              ORDER BY d.id DESC LIMIT 1000) d
        JOIN hookd.delivery_attempts a ON a.delivery_id = d.id
        WHERE a.status_code IS NULL OR a.status_code NOT BETWEEN 200 AND 299
        ORDER BY a.started_at DESC LIMIT 1
        "#,
    )
    .bind(id)
    .fetch_optional(on(pool))
    .await?)
}
