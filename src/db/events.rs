//! `hookd.events`: the enqueue statement (event rows + fan-out into deliveries) and reads.

use chrono::{DateTime, Utc};
use sqlx::postgres::PgArguments;
use sqlx::{Arguments, PgConnection, PgPool};
use uuid::Uuid;

use super::{Audience, DbError, on};
use crate::domain::DeliveryStatus;

/// One event to insert. `id` is minted by the caller (UUIDv7) so that inserted rows can
/// be matched back to requests without relying on result order.
#[derive(Debug, Clone)]
pub struct NewEvent {
    pub id: Uuid,
    pub tenant: String,
    pub event_type: String,
    pub payload: String,
    pub idempotency_key: Option<String>,
    pub request_hash: Vec<u8>,
    /// the consumer the event is for; `None`: the tenant's endpoints without a consumer
    pub consumer: Option<String>,
    /// where an inbound event came from; `None` for a produced one
    pub origin: Option<Origin>,
    /// the producer's W3C trace context (migration 0031)
    pub trace: Option<crate::domain::TraceContext>,
    /// the key whose deliveries endpoints that order by key send in order (migration 0034)
    pub ordering_key: Option<String>,
}

/// Where an inbound event came from (issue 33, migration 0026).
#[derive(Debug, Clone, PartialEq)]
pub struct Origin {
    /// the source's name (its route, `/in/{name}`)
    pub source: String,
    /// the provider's own id for the event, when it sends one
    pub source_event_id: Option<String>,
    /// the request headers its provider documents, by lower-case name
    pub headers: serde_json::Map<String, serde_json::Value>,
}

/// An event as stored, with its delivery ids (an existing event found by idempotency key).
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct EventIds {
    pub event_id: Uuid,
    pub delivery_ids: Vec<Uuid>,
}

#[derive(Debug, Clone, sqlx::FromRow)]
pub struct ExistingByKey {
    pub tenant: String,
    pub idempotency_key: String,
    pub event_id: Uuid,
    pub request_hash: Vec<u8>,
    pub delivery_ids: Vec<Uuid>,
}

/// Inserts events and fans each out, in one statement: an event for a consumer to that
/// consumer's live endpoints whose event-type filter matches, an event without one to the
/// tenant's live endpoints without a consumer. Who that is, is `hookd.subscribers`
/// (migration 0025), the rule `hookd.enqueue` uses too: a few probes of the
/// `subscriptions` index, never a scan of the tenant's endpoints. Events whose idempotency key already
/// exists are skipped (ON CONFLICT DO NOTHING, which also waits for a concurrent
/// inserter of the same key to finish, so concurrent duplicates end as one event).
/// Returns the inserted events only, and the server session the statement ran in (none
/// when it inserted nothing), for [`settle_commit`]: read here, not by a statement of its
/// own, to save the acknowledgement a round trip.
pub async fn insert_with_fanout(
    conn: &mut PgConnection,
    events: &[NewEvent],
) -> Result<(Vec<EventIds>, Option<Session>), DbError> {
    let mut ids = Vec::with_capacity(events.len());
    let mut tenants = Vec::with_capacity(events.len());
    let mut types = Vec::with_capacity(events.len());
    let mut payloads = Vec::with_capacity(events.len());
    let mut keys = Vec::with_capacity(events.len());
    let mut hashes = Vec::with_capacity(events.len());
    let mut consumers = Vec::with_capacity(events.len());
    let mut sources = Vec::with_capacity(events.len());
    let mut source_ids = Vec::with_capacity(events.len());
    let mut source_headers = Vec::with_capacity(events.len());
    let mut traceparents = Vec::with_capacity(events.len());
    let mut tracestates = Vec::with_capacity(events.len());
    let mut ordering_keys = Vec::with_capacity(events.len());
    for e in events {
        ids.push(e.id);
        tenants.push(e.tenant.as_str());
        types.push(e.event_type.as_str());
        payloads.push(e.payload.as_str());
        keys.push(e.idempotency_key.as_deref());
        hashes.push(e.request_hash.as_slice());
        consumers.push(e.consumer.as_deref());
        let origin = e.origin.as_ref();
        sources.push(origin.map(|o| o.source.as_str()));
        source_ids.push(origin.and_then(|o| o.source_event_id.as_deref()));
        source_headers
            .push(origin.map(|o| serde_json::Value::Object(o.headers.clone()).to_string()));
        traceparents.push(e.trace.as_ref().map(|t| t.traceparent.as_str()));
        tracestates.push(e.trace.as_ref().and_then(|t| t.tracestate.as_deref()));
        ordering_keys.push(e.ordering_key.as_deref());
    }
    let rows = sqlx::query_as::<_, InsertedRow>(
        r#"
        WITH input AS (
            SELECT * FROM unnest($1::uuid[], $2::text[], $3::text[], $4::text[], $5::text[], $6::bytea[], $7::text[],
                                 $8::text[], $9::text[], $10::text[], $11::text[], $12::text[], $13::text[])
                WITH ORDINALITY
                AS i(id, tenant, event_type, payload, idempotency_key, request_hash, consumer,
                     source, source_event_id, source_headers, traceparent, tracestate, ordering_key, ord)
        ), numbered AS MATERIALIZED (
            -- A keyed event's place in its key's line, taken in request order (a sorted
            -- subquery is read in its order) and under the key's lock (taken before this
            -- statement, db::events::try_lock_keys): so in commit order, per key.
            SELECT i.*, CASE WHEN i.ordering_key IS NOT NULL THEN nextval('hookd.ordering_seq') END AS ordering_seq
            FROM (SELECT * FROM input ORDER BY ord) i
        ), ev AS (
            INSERT INTO hookd.events (id, tenant, event_type, payload, idempotency_key, request_hash, consumer,
                                      source, source_event_id, source_headers, traceparent, tracestate,
                                      ordering_key, ordering_seq)
            -- a stable key order keeps two concurrent groups sharing keys from deadlocking
            SELECT id, tenant, event_type, payload, idempotency_key, request_hash, consumer,
                   source, source_event_id, source_headers::jsonb, traceparent, tracestate,
                   ordering_key, ordering_seq
            FROM numbered ORDER BY tenant, idempotency_key NULLS LAST
            ON CONFLICT (tenant, idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING
            RETURNING id, tenant, event_type, consumer, ordering_key, ordering_seq
        ), fan AS (
            SELECT ev.id AS event_id, ev.tenant, ev.consumer, s.endpoint_id, o.k AS ordering_key,
                   ev.ordering_seq
            -- the one fan-out rule, shared with hookd.enqueue (migration 0025), inlined
            -- into this statement: a probe of the subscriptions per pattern the type matches
            FROM ev CROSS JOIN LATERAL hookd.subscribers(ev.tenant, ev.consumer, ev.event_type) AS s(endpoint_id)
            -- the key goes with a delivery only to an endpoint that orders by key (no
            -- probe at all for an event without one)
            LEFT JOIN LATERAL (
                SELECT ev.ordering_key AS k FROM hookd.endpoints e
                WHERE ev.ordering_key IS NOT NULL AND e.id = s.endpoint_id AND e.ordering = 'perKey'
            ) o ON true
        ), dl AS (
            INSERT INTO hookd.deliveries (id, event_id, endpoint_id, tenant, consumer, ordering_key,
                                          ordering_seq, visible_at)
            SELECT hookd.uuid_v7(), f.event_id, f.endpoint_id, f.tenant, f.consumer, f.ordering_key,
                   CASE WHEN f.ordering_key IS NOT NULL THEN f.ordering_seq END,
                   -- in line behind an open delivery of its key, an earlier one of this
                   -- statement or a dead letter holding the key (migration 0034)
                   CASE WHEN f.ordering_key IS NOT NULL
                             AND (row_number() OVER (PARTITION BY f.endpoint_id, f.ordering_key
                                                     ORDER BY f.ordering_seq) > 1
                                  OR hookd.ordering_blocked(f.endpoint_id, f.ordering_key))
                        THEN hookd.ordering_waiting() ELSE now() END
            FROM fan f
            RETURNING id, event_id
        )
        SELECT ev.id AS event_id,
               coalesce(array_agg(dl.id ORDER BY dl.id) FILTER (WHERE dl.id IS NOT NULL), '{}') AS delivery_ids,
               pg_backend_pid() AS pid,
               (SELECT a.backend_start FROM pg_stat_get_activity(pg_backend_pid()) a) AS backend_start
        FROM ev LEFT JOIN dl ON dl.event_id = ev.id
        GROUP BY ev.id
        "#,
    )
    .bind(&ids)
    .bind(&tenants)
    .bind(&types)
    .bind(&payloads)
    .bind(&keys)
    .bind(&hashes)
    .bind(&consumers)
    .bind(&sources)
    .bind(&source_ids)
    .bind(&source_headers)
    .bind(&traceparents)
    .bind(&tracestates)
    .bind(&ordering_keys)
    .fetch_all(on(conn))
    .await?;
    let session = rows.first().map(|r| Session {
        pid: r.pid,
        backend_start: r.backend_start,
    });
    let events = rows
        .into_iter()
        .map(|r| EventIds {
            event_id: r.event_id,
            delivery_ids: r.delivery_ids,
        })
        .collect();
    Ok((events, session))
}

/// A row of [`insert_with_fanout`]'s statement.
#[derive(sqlx::FromRow)]
struct InsertedRow {
    event_id: Uuid,
    delivery_ids: Vec<Uuid>,
    pid: i32,
    backend_start: DateTime<Utc>,
}

/// The server session an enqueue transaction runs in, so that a lost COMMIT answer can be
/// investigated from another connection (see [`settle_commit`]).
#[derive(Debug, Clone, Copy)]
pub struct Session {
    pid: i32,
    backend_start: DateTime<Utc>,
}

/// Opens an enqueue transaction, with its settings in the same round trip: commit
/// synchronously whatever the server's default (the commit backs a 2xx, invariant 9), and
/// bound every lock wait.
pub async fn begin_enqueue(
    pool: &PgPool,
    lock_timeout: std::time::Duration,
) -> Result<sqlx::Transaction<'static, sqlx::Postgres>, DbError> {
    let settings = format!(
        "SET LOCAL synchronous_commit = on; SET LOCAL lock_timeout = '{}ms'; \
         {ENQUEUE_PLAN_SETTINGS}",
        lock_timeout.as_millis().max(1)
    );
    super::begin_with_settings(pool, &settings).await
}

/// How the fan-out statement is planned, in every enqueue transaction.
const ENQUEUE_PLAN_SETTINGS: &str =
    // Fan-out is primary-key probes whatever the planner estimates: with 100,000
    // consumers subscribed to `*` in one tenant it estimated a probe at 233,000 rows,
    // chose a sequential scan of the subscriptions and JIT-compiled it (0.8 s), for every
    // group of every tenant: 10 events/s (`hookd-bench --only consumers`, 300,000
    // endpoints). And it is planned once per connection: the group's arrays change size
    // with every group, so the plan cache kept choosing a fresh custom plan of the fan-out
    // statement for each one (about a millisecond of planning per group, most of
    // Postgres's CPU at a steady 1,000 single events/s); its probes are key lookups
    // whatever the sizes.
    "SET LOCAL enable_seqscan = off; SET LOCAL jit = off; \
     SET LOCAL plan_cache_mode = force_generic_plan";

/// A key an enqueue transaction holds until it commits: an idempotency key, or an
/// ordering key (its line: same-key enqueues commit one after the other, so the sequence
/// they take is their commit order). Each is a transaction-scoped advisory lock on a hash
/// of (tenant, key), taken the same way by `hookd.enqueue()` (and, for ordering keys, by
/// replays), so that whoever holds a key can be detected without waiting (a wait on the
/// unique index would hold a whole group).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct KeyLock {
    pub tenant: String,
    pub key: String,
    /// an ordering key (migration 0034's `hookd.ordering_lock_id`), not an idempotency key
    pub ordering: bool,
}

impl KeyLock {
    pub fn idempotency(tenant: &str, key: &str) -> Self {
        KeyLock {
            tenant: tenant.to_owned(),
            key: key.to_owned(),
            ordering: false,
        }
    }

    pub fn ordering(tenant: &str, key: &str) -> Self {
        KeyLock {
            tenant: tenant.to_owned(),
            key: key.to_owned(),
            ordering: true,
        }
    }
}

/// The lock id of each key, as SQL over `unnest($1 tenants, $2 keys, $3 is-ordering)`.
const KEY_LOCK_IDS: &str = r#"
    SELECT t, k, o, CASE WHEN o THEN hookd.ordering_lock_id(t, k)
                         ELSE hashtextextended(t || E'\n' || k, 0) END AS h
    FROM unnest($1::text[], $2::text[], $3::bool[]) AS u(t, k, o)"#;

fn key_lock_arrays(keys: &[KeyLock]) -> (Vec<&str>, Vec<&str>, Vec<bool>) {
    (
        keys.iter().map(|k| k.tenant.as_str()).collect(),
        keys.iter().map(|k| k.key.as_str()).collect(),
        keys.iter().map(|k| k.ordering).collect(),
    )
}

/// Try-locks every key; returns the keys someone else holds.
pub async fn try_lock_keys(
    conn: &mut PgConnection,
    keys: &[KeyLock],
) -> Result<Vec<KeyLock>, DbError> {
    if keys.is_empty() {
        return Ok(Vec::new());
    }
    let (tenants, names, ordering) = key_lock_arrays(keys);
    let busy: Vec<(String, String, bool)> = sqlx::query_as(sqlx::AssertSqlSafe(format!(
        "SELECT t, k, o FROM ({KEY_LOCK_IDS}) l WHERE NOT pg_try_advisory_xact_lock(l.h)"
    )))
    .bind(&tenants)
    .bind(&names)
    .bind(&ordering)
    .fetch_all(on(conn))
    .await?;
    Ok(busy
        .into_iter()
        .map(|(tenant, key, ordering)| KeyLock {
            tenant,
            key,
            ordering,
        })
        .collect())
}

/// Takes the key locks, waiting up to the transaction's `lock_timeout` (SQLSTATE 55P03
/// when it expires). Sorted, so two batches sharing keys cannot deadlock.
pub async fn lock_keys(conn: &mut PgConnection, keys: &[KeyLock]) -> Result<(), DbError> {
    if keys.is_empty() {
        return Ok(());
    }
    let (tenants, names, ordering) = key_lock_arrays(keys);
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "SELECT pg_advisory_xact_lock(h) FROM (SELECT DISTINCT h FROM ({KEY_LOCK_IDS}) l ORDER BY 1) s"
    )))
    .bind(&tenants)
    .bind(&names)
    .bind(&ordering)
    .execute(on(conn))
    .await?;
    Ok(())
}

/// What a fresh connection found out about a commit whose answer was lost.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Settled {
    Committed,
    NotCommitted,
}

/// Finds out whether the transaction of `session` committed, after its connection failed
/// at COMMIT: looks for the event ids it inserted (a transaction commits all of them or
/// none); while none is found, waits until that session has ended (until then the commit
/// may still land) and looks again.
/// Connection failures are retried until `within` has passed; then the error is returned
/// and the outcome is unknown.
pub async fn settle_commit(
    pool: &PgPool,
    session: Option<Session>,
    event_ids: &[Uuid],
    within: std::time::Duration,
) -> Result<Settled, DbError> {
    if event_ids.is_empty() {
        // nothing of its own to write: every message was an idempotent repeat
        return Ok(Settled::Committed);
    }
    // the statement that returned the ids named its session: one without the other is a
    // caller's mistake, and the outcome is then unknown
    let Some(session) = session else {
        return Err(DbError::Query(sqlx::Error::Protocol(
            "no server session is known for the rows written".into(),
        )));
    };
    let deadline = tokio::time::Instant::now() + within;
    loop {
        let attempt: Result<Option<bool>, DbError> = async {
            // The session before the rows, each in its own snapshot: a session seen
            // ended before the rows were looked for cannot commit after the look. Rows
            // found settle it whether the session lives or not: after a silent network cut
            // (no FIN or RST) the old session lives on idle for minutes, and waiting for it
            // answered a committed event 503 `commit_outcome_unknown` after the whole wait.
            // Not found while the old session lives, the commit may still land: ask again.
            let alive: bool = sqlx::query_scalar(
                "SELECT EXISTS (SELECT 1 FROM pg_stat_activity WHERE pid = $1 AND backend_start = $2)",
            )
            .bind(session.pid)
            .bind(session.backend_start)
            .fetch_one(on(pool))
            .await?;
            let found: bool =
                sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM hookd.events WHERE id = ANY($1))")
                    .bind(event_ids)
                    .fetch_one(on(pool))
                    .await?;
            Ok(if found || !alive { Some(found) } else { None })
        }
        .await;
        match attempt {
            Ok(Some(true)) => return Ok(Settled::Committed),
            Ok(Some(false)) => return Ok(Settled::NotCommitted),
            Ok(None) | Err(_) if tokio::time::Instant::now() < deadline => {
                tokio::time::sleep(std::time::Duration::from_millis(25)).await;
            }
            Ok(None) => {
                return Err(DbError::Query(sqlx::Error::Protocol(
                    "the committing session is still running".into(),
                )));
            }
            Err(e) => return Err(e),
        }
    }
}

/// Existing events for (tenant, idempotency key) pairs, with their deliveries.
pub async fn find_by_keys(
    conn: &mut PgConnection,
    keys: &[(String, String)],
) -> Result<Vec<ExistingByKey>, DbError> {
    let tenants: Vec<&str> = keys.iter().map(|k| k.0.as_str()).collect();
    let idem: Vec<&str> = keys.iter().map(|k| k.1.as_str()).collect();
    let rows = sqlx::query_as::<_, ExistingByKey>(
        r#"
        SELECT e.tenant, e.idempotency_key, e.id AS event_id, e.request_hash,
               coalesce(array_agg(d.id ORDER BY d.id) FILTER (WHERE d.id IS NOT NULL), '{}') AS delivery_ids
        FROM hookd.events e
        LEFT JOIN hookd.deliveries d ON d.event_id = e.id
        WHERE (e.tenant, e.idempotency_key) IN (SELECT * FROM unnest($1::text[], $2::text[]))
          AND e.idempotency_key IS NOT NULL
        GROUP BY e.id
        "#,
    )
    .bind(&tenants)
    .bind(&idem)
    .fetch_all(on(conn))
    .await?;
    Ok(rows)
}

#[derive(Debug, Clone, sqlx::FromRow)]
pub struct EventRow {
    pub id: Uuid,
    pub tenant: String,
    pub event_type: String,
    pub payload: String,
    pub idempotency_key: Option<String>,
    pub consumer: Option<String>,
    pub created_at: DateTime<Utc>,
    pub source: Option<String>,
    pub source_event_id: Option<String>,
    pub ordering_key: Option<String>,
}

/// The event with this id, if `audience` may see it (another tenant's or consumer's event
/// is as absent as an unknown id).
pub async fn get(
    pool: &PgPool,
    id: Uuid,
    audience: Audience<'_>,
) -> Result<Option<EventRow>, DbError> {
    Ok(sqlx::query_as::<_, EventRow>(
        "SELECT id, tenant, event_type, payload, idempotency_key, consumer, created_at,
                source, source_event_id, ordering_key
         FROM hookd.events
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

/// One message of a listing page, with its deliveries counted by status.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct EventSummary {
    pub id: Uuid,
    pub tenant: String,
    pub event_type: String,
    pub consumer: Option<String>,
    pub created_at: DateTime<Utc>,
    /// the inbound source that took it (`None`: produced)
    pub source: Option<String>,
    pub source_event_id: Option<String>,
    pub total: i64,
    pub succeeded: i64,
    pub pending: i64,
    pub failed: i64,
    pub dead: i64,
    pub cancelled: i64,
}

/// Filters of a message listing. `since`/`until` bound the UUIDv7 ids (their time prefix),
/// so the time range is part of the same index range as the keyset cursor.
#[derive(Debug, Clone, Default)]
pub struct EventQuery<'a> {
    pub audience: Audience<'a>,
    pub consumer: Option<&'a str>,
    pub event_type: Option<&'a str>,
    /// events an inbound source took (`events_source_page`)
    pub source: Option<&'a str>,
    /// messages with at least one delivery in this status
    pub status: Option<DeliveryStatus>,
    /// ids below this one (the previous page's last id)
    pub before: Option<Uuid>,
    pub since: Option<DateTime<Utc>>,
    pub until: Option<DateTime<Utc>>,
    pub limit: i64,
}

/// Messages newest first, one keyset page. With a tenant, each filter combination walks
/// one of the `events_*_page` indexes backwards from the cursor; a status filter walks
/// `deliveries_status_page` or `deliveries_consumer_status_page` instead (see
/// [`status_served`]), so a page costs what it returns however few events match.
pub async fn list(pool: &PgPool, q: &EventQuery<'_>) -> Result<Vec<EventSummary>, DbError> {
    let (sql, args) = list_statement(q)?;
    Ok(
        sqlx::query_as_with::<_, EventSummary, _>(sqlx::AssertSqlSafe(sql), args)
            .fetch_all(on(pool))
            .await?,
    )
}

/// The statement [`list`] runs for `q`, with its arguments: shared with [`explain_list`]
/// so a test inspects the plan of exactly what a listing runs.
fn list_statement(q: &EventQuery<'_>) -> Result<(String, PgArguments), DbError> {
    if let Some(by_status) = ByStatus::of(q) {
        return Ok((by_status.sql(), by_status.arguments()?));
    }
    let (lower, upper) = id_bounds(q);
    let mut args = PgArguments::default();
    let encode = |e| DbError::Query(sqlx::Error::Encode(e));
    args.add(q.audience.tenant).map_err(encode)?;
    args.add(q.audience.consumer).map_err(encode)?;
    args.add(q.consumer).map_err(encode)?;
    args.add(q.event_type).map_err(encode)?;
    args.add(upper).map_err(encode)?;
    args.add(lower).map_err(encode)?;
    args.add(q.status).map_err(encode)?;
    args.add(q.limit).map_err(encode)?;
    args.add(q.source).map_err(encode)?;
    Ok((LIST_SQL.to_string(), args))
}

/// A listing without a status filter (or one the API refuses, see [`status_served`]):
/// with a tenant, each filter combination walks one of the `events_*_page` indexes
/// backwards from the cursor.
const LIST_SQL: &str = r#"
        SELECT e.id, e.tenant, e.event_type, e.consumer, e.created_at,
               e.source, e.source_event_id,
               coalesce(c.total, 0) AS total, coalesce(c.succeeded, 0) AS succeeded,
               coalesce(c.pending, 0) AS pending, coalesce(c.failed, 0) AS failed,
               coalesce(c.dead, 0) AS dead, coalesce(c.cancelled, 0) AS cancelled
        FROM (
            SELECT ev.id, ev.tenant, ev.event_type, ev.consumer, ev.created_at,
                   ev.source, ev.source_event_id
            FROM hookd.events ev
            WHERE ($1::text IS NULL OR ev.tenant = $1)
              AND ($2::text IS NULL OR ev.consumer = $2)
              AND ($3::text IS NULL OR ev.consumer = $3)
              AND ($4::text IS NULL OR ev.event_type = $4)
              AND ($5::uuid IS NULL OR ev.id < $5)
              AND ($6::uuid IS NULL OR ev.id >= $6)
              AND ($9::text IS NULL OR ev.source = $9)
              AND ($7::text IS NULL OR EXISTS (
                    SELECT 1 FROM hookd.deliveries d WHERE d.event_id = ev.id AND d.status = $7))
            ORDER BY ev.id DESC
            LIMIT $8
        ) e
        LEFT JOIN LATERAL (
            SELECT count(*) AS total,
                   count(*) FILTER (WHERE d.status = 'succeeded') AS succeeded,
                   count(*) FILTER (WHERE d.status IN ('pending', 'in_progress')) AS pending,
                   count(*) FILTER (WHERE d.status = 'failed') AS failed,
                   count(*) FILTER (WHERE d.status = 'dead') AS dead,
                   count(*) FILTER (WHERE d.status = 'cancelled') AS cancelled
            FROM hookd.deliveries d WHERE d.event_id = e.id
        ) c ON true
        ORDER BY e.id DESC
        "#;

/// The id range of a listing: `[lower, upper)`, from `since`, `until` and the cursor.
fn id_bounds(q: &EventQuery<'_>) -> (Option<Uuid>, Option<Uuid>) {
    // a consumer token's floor (an earlier consumer with its uid) bounds the range too
    let lower = match (q.since.map(uuid_floor), q.audience.since) {
        (Some(a), Some(b)) => Some(a.max(b)),
        (a, b) => a.or(b),
    };
    let upper = match (q.before, q.until.map(uuid_floor)) {
        (Some(b), Some(u)) => Some(b.min(u)),
        (b, u) => b.or(u),
    };
    (lower, upper)
}

/// Whether a listing with a status filter is served by an index: it needs a tenant and no
/// event-type or source filter (deliveries carry neither; the API refuses those
/// combinations, `docs/retention-partitions.md`). Any consumer filter is served.
pub fn status_served(q: &EventQuery<'_>) -> bool {
    q.status.is_none()
        || (q.audience.tenant.is_some() && q.event_type.is_none() && q.source.is_none())
}

/// Whether a listing by source is served by `events_source_page`: it needs a tenant and
/// combines with no other filter than the time range and the cursor (a source's events
/// are its tenant's, addressed to the source's consumer if any).
pub fn source_served(q: &EventQuery<'_>) -> bool {
    q.source.is_none()
        || (q.audience.tenant.is_some()
            && q.audience.consumer.is_none()
            && q.consumer.is_none()
            && q.event_type.is_none()
            && q.status.is_none())
}

/// A status listing read from the deliveries' status indexes: the newest distinct events
/// with a delivery in the status, one ordered index range per partition merged, then
/// the page's events and their counts. Never more index entries than the page's
/// deliveries in that status.
struct ByStatus<'a> {
    tenant: &'a str,
    /// the audience's consumer or the filter's
    consumer: Option<&'a str>,
    status: DeliveryStatus,
    lower: Uuid,
    upper: Uuid,
    limit: i64,
}

impl<'a> ByStatus<'a> {
    fn of(q: &EventQuery<'a>) -> Option<Self> {
        let status = q.status?;
        let tenant = q.audience.tenant?;
        if q.event_type.is_some() || q.source.is_some() {
            return None;
        }
        let consumer = match (q.audience.consumer, q.consumer) {
            (Some(a), Some(f)) if a != f => {
                // a consumer asking for another's messages sees none; the id range below
                // is made empty rather than adding a branch to the statement
                return Some(ByStatus {
                    tenant,
                    consumer: Some(a),
                    status,
                    lower: Uuid::max(),
                    upper: Uuid::nil(),
                    limit: q.limit,
                });
            }
            (a, f) => a.or(f),
        };
        let (lower, upper) = id_bounds(q);
        Some(ByStatus {
            tenant,
            consumer,
            status,
            lower: lower.unwrap_or(Uuid::nil()),
            upper: upper.unwrap_or(Uuid::max()),
            limit: q.limit,
        })
    }

    /// One of two constant texts: with or without the consumer, so that each is planned
    /// on the index whose leading columns it fixes.
    fn sql(&self) -> String {
        let consumer = if self.consumer.is_some() {
            "AND d.consumer = $6"
        } else {
            "AND $6::text IS NULL"
        };
        format!(
            r#"
        WITH page AS (
            SELECT d.event_id
            FROM hookd.deliveries d
            WHERE d.tenant = $1 AND d.status = $2 {consumer}
              AND d.event_id < $3 AND d.event_id >= $4
            GROUP BY d.event_id
            ORDER BY d.event_id DESC
            LIMIT $5
        )
        SELECT e.id, e.tenant, e.event_type, e.consumer, e.created_at,
               e.source, e.source_event_id,
               c.total, c.succeeded, c.pending, c.failed, c.dead, c.cancelled
        FROM page
        JOIN hookd.events e ON e.id = page.event_id
        CROSS JOIN LATERAL (
            SELECT count(*) AS total,
                   count(*) FILTER (WHERE d.status = 'succeeded') AS succeeded,
                   count(*) FILTER (WHERE d.status IN ('pending', 'in_progress')) AS pending,
                   count(*) FILTER (WHERE d.status = 'failed') AS failed,
                   count(*) FILTER (WHERE d.status = 'dead') AS dead,
                   count(*) FILTER (WHERE d.status = 'cancelled') AS cancelled
            FROM hookd.deliveries d WHERE d.event_id = e.id
        ) c
        ORDER BY e.id DESC
        "#
        )
    }

    fn arguments(&self) -> Result<PgArguments, DbError> {
        let mut args = PgArguments::default();
        let encode = |e| DbError::Query(sqlx::Error::Encode(e));
        args.add(self.tenant).map_err(encode)?;
        args.add(self.status).map_err(encode)?;
        args.add(self.upper).map_err(encode)?;
        args.add(self.lower).map_err(encode)?;
        args.add(self.limit).map_err(encode)?;
        args.add(self.consumer).map_err(encode)?;
        Ok(args)
    }
}

/// `EXPLAIN (ANALYZE, BUFFERS)` of the listing `q` (a read: it is run), one line per plan
/// line: for tests that prove a filtered listing reads about what it returns.
pub async fn explain_list(pool: &PgPool, q: &EventQuery<'_>) -> Result<Vec<String>, DbError> {
    let (sql, args) = list_statement(q)?;
    let sql = format!("EXPLAIN (ANALYZE, BUFFERS) {sql}");
    Ok(sqlx::query_scalar_with(sqlx::AssertSqlSafe(sql), args)
        .fetch_all(on(pool))
        .await?)
}

/// The smallest UUIDv7 minted at `t` or later: its 48-bit millisecond prefix, zeros after.
pub fn uuid_floor(t: DateTime<Utc>) -> Uuid {
    let ms = t.timestamp_millis().max(0) as u64;
    let mut b = [0u8; 16];
    b[..6].copy_from_slice(&ms.to_be_bytes()[2..]);
    Uuid::from_bytes(b)
}

/// Inserts one event with a single delivery to `endpoint_id` (a test event, whatever the
/// endpoint's filter), committed synchronously like every enqueue.
pub async fn insert_for_endpoint(
    pool: &PgPool,
    e: &NewEvent,
    endpoint_id: Uuid,
) -> Result<(Uuid, Uuid), DbError> {
    let mut tx = super::begin(pool).await?;
    let row: (Uuid, Uuid) = sqlx::query_as(
        r#"
        WITH s AS (SELECT set_config('synchronous_commit', 'on', true)),
        ev AS (
            INSERT INTO hookd.events (id, tenant, event_type, payload, request_hash, consumer)
            SELECT $1, $2, $3, $4, $7, $5 FROM s
            RETURNING id
        )
        INSERT INTO hookd.deliveries (id, event_id, endpoint_id, tenant, consumer)
        SELECT hookd.uuid_v7(), ev.id, $6, $2, $5 FROM ev
        RETURNING event_id, id
        "#,
    )
    .bind(e.id)
    .bind(&e.tenant)
    .bind(&e.event_type)
    .bind(&e.payload)
    .bind(&e.consumer)
    .bind(endpoint_id)
    .bind(&e.request_hash)
    .fetch_one(on(&mut *tx))
    .await?;
    sqlx::query("SELECT pg_notify('hookd_deliveries', '')")
        .execute(on(&mut *tx))
        .await?;
    tx.commit().await?;
    Ok(row)
}
