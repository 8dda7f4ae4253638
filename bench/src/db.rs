//! Every SQL statement of the bench (the rule "all SQL in `db`" holds per crate): its
//! dedicated database, the server settings it reports, the plain-SQL baselines it
//! compares ingest with, set-based fixture fills, and the lease model's drain. What the
//! bench measures of hookd itself goes through `hookd::db`.
//!
//! Nothing here is part of the hookd product, and the bench only ever runs it inside a
//! database it created itself (`hookd_bench_<pid>_<n>`, and `…_model` for the lease
//! model), which it drops at the end.

use sqlx::PgPool;
use uuid::Uuid;

use hookd::db::DbError;

/// `name` must be a plain identifier minted by the caller (letters, digits, `_`): it is
/// spliced into the statement, since CREATE/DROP DATABASE take no parameters.
fn checked_identifier(name: &str) -> Result<&str, DbError> {
    let ok = !name.is_empty()
        && name.len() <= 63
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_');
    if ok {
        Ok(name)
    } else {
        Err(DbError::Query(sqlx::Error::Protocol(format!(
            "refusing database name {name:?}"
        ))))
    }
}

pub async fn create_database(admin: &PgPool, name: &str) -> Result<(), DbError> {
    let name = checked_identifier(name)?;
    sqlx::query(sqlx::AssertSqlSafe(format!("CREATE DATABASE {name}")))
        .execute(admin)
        .await?;
    Ok(())
}

/// Drops the database, disconnecting anyone still on it (PostgreSQL 13+).
pub async fn drop_database(admin: &PgPool, name: &str) -> Result<(), DbError> {
    let name = checked_identifier(name)?;
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "DROP DATABASE IF EXISTS {name} WITH (FORCE)"
    )))
    .execute(admin)
    .await?;
    Ok(())
}

/// The server settings that decide the figures: (name, value) in a fixed order.
pub async fn server_settings(pool: &PgPool) -> Result<Vec<(String, String)>, DbError> {
    Ok(sqlx::query_as(
        r#"
        SELECT name, current_setting(name) FROM unnest(ARRAY[
            'server_version', 'synchronous_commit', 'fsync', 'wal_sync_method',
            'shared_buffers', 'max_connections', 'commit_delay'
        ]) WITH ORDINALITY AS s(name, i)
        ORDER BY i
        "#,
    )
    .fetch_all(pool)
    .await?)
}

/// Empties the queue tables between runs, so every run starts from the same state.
pub async fn truncate_queue(pool: &PgPool) -> Result<(), DbError> {
    sqlx::query(
        "TRUNCATE hookd.dead_letters, hookd.delivery_attempts, hookd.deliveries, hookd.events,
                  hookd.endpoint_queue, hookd.ordering_advances, hookd.ordering_holds",
    )
    .execute(pool)
    .await?;
    Ok(())
}

/// VACUUM ANALYZE of the queue tables, so plans after a bulk fill are the ones a long-
/// running system (with autovacuum) would have.
pub async fn vacuum_analyze(pool: &PgPool) -> Result<(), DbError> {
    sqlx::query("VACUUM ANALYZE hookd.events, hookd.deliveries, hookd.endpoint_queue")
        .execute(pool)
        .await?;
    Ok(())
}

/// Profiling (HOOKD_BENCH_STATEMENTS, on a server that loads `pg_stat_statements`): forget
/// every statement's figures so far.
pub async fn statements_reset(pool: &PgPool) -> Result<(), DbError> {
    sqlx::query("SELECT pg_stat_statements_reset()")
        .execute(pool)
        .await?;
    Ok(())
}

/// Where the server's write-ahead log ends now, as text (a `pg_lsn`).
pub async fn wal_position(pool: &PgPool) -> Result<String, DbError> {
    Ok(sqlx::query_scalar("SELECT pg_current_wal_lsn()::text")
        .fetch_one(pool)
        .await?)
}

/// Bytes of write-ahead log the whole server wrote since `from` (a [`wal_position`]).
pub async fn wal_bytes_since(pool: &PgPool, from: &str) -> Result<f64, DbError> {
    Ok(
        sqlx::query_scalar("SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), $1::pg_lsn)::float8")
            .bind(from)
            .fetch_one(pool)
            .await?,
    )
}

/// The `n` statements that took the most execution time since the last reset: (ms, calls,
/// rows, WAL bytes, the statement's first 160 characters on one line).
pub async fn statements_top(
    pool: &PgPool,
    n: i64,
) -> Result<Vec<(f64, i64, i64, f64, String)>, DbError> {
    Ok(sqlx::query_as(
        "SELECT total_exec_time, calls, rows, wal_bytes::float8,
                left(regexp_replace(query, '\\s+', ' ', 'g'), 160)
         FROM pg_stat_statements ORDER BY total_exec_time DESC LIMIT $1",
    )
    .bind(n)
    .fetch_all(pool)
    .await?)
}

/// Profiling (HOOKD_BENCH_STATEMENTS): the write-ahead log between two [`wal_position`]s by
/// record type, largest first: (resource manager/record type, records, record bytes,
/// full-page-image bytes). Empty when the server lacks `pg_walinspect` (a contrib module of
/// PostgreSQL 15 and later), which this creates when it can. It reads only what is flushed:
/// the last few records of a drain whose commits were asynchronous may be left out.
pub async fn wal_records(
    pool: &PgPool,
    from: &str,
    to: &str,
) -> Result<Vec<(String, i64, f64, f64)>, DbError> {
    if sqlx::query("CREATE EXTENSION IF NOT EXISTS pg_walinspect")
        .execute(pool)
        .await
        .is_err()
    {
        return Ok(Vec::new());
    }
    Ok(sqlx::query_as(
        "SELECT \"resource_manager/record_type\", count, record_size::float8, fpi_size::float8
         FROM pg_get_wal_stats($1::pg_lsn, least($2::pg_lsn, pg_current_wal_flush_lsn()), true)
         WHERE count > 0 ORDER BY combined_size DESC LIMIT 15",
    )
    .bind(from)
    .bind(to)
    .fetch_all(pool)
    .await?)
}

/// (events, deliveries) row counts.
pub async fn queue_counts(pool: &PgPool) -> Result<(i64, i64), DbError> {
    Ok(sqlx::query_as(
        "SELECT (SELECT count(*) FROM hookd.events), (SELECT count(*) FROM hookd.deliveries)",
    )
    .fetch_one(pool)
    .await?)
}

/// Deliveries not yet terminal (an index-only count over `deliveries_claimable`, cheap
/// once a backlog has drained).
pub async fn open_deliveries(pool: &PgPool) -> Result<i64, DbError> {
    Ok(sqlx::query_scalar(
        "SELECT count(*) FROM hookd.deliveries WHERE status IN ('pending', 'in_progress', 'failed')",
    )
    .fetch_one(pool)
    .await?)
}

/// The endpoint of each delivery in `ids`.
pub async fn endpoints_of(
    pool: &PgPool,
    ids: &[Uuid],
) -> Result<std::collections::HashMap<Uuid, Uuid>, DbError> {
    let rows: Vec<(Uuid, Uuid)> =
        sqlx::query_as("SELECT id, endpoint_id FROM hookd.deliveries WHERE id = ANY ($1)")
            .bind(ids)
            .fetch_all(pool)
            .await?;
    Ok(rows.into_iter().collect())
}

/// Events enqueued by `enqueue_keyed` per transaction: each takes its key's advisory
/// lock until commit, and the server's lock table holds a few thousand.
const KEYED_PER_TRANSACTION: i64 = 1_000;

/// `count` events of `tenant` through `hookd.enqueue`'s 6-argument form (what a SQL
/// producer calls), [`KEYED_PER_TRANSACTION`] per statement, in order: event i has
/// ordering key `k<i mod keys>` and event type `bench.ordering.e<(i mod keys) mod
/// endpoints>`, so a key always goes to the same endpoint (when endpoint e subscribes to
/// `bench.ordering.e<e>` only), and a payload `{"seq":i,...}` of about `payload_bytes`.
pub async fn enqueue_keyed(
    pool: &PgPool,
    tenant: &str,
    count: i64,
    keys: i64,
    endpoints: i64,
    payload_bytes: i64,
) -> Result<(), DbError> {
    let mut from = 0;
    while from < count {
        let to = (from + KEYED_PER_TRANSACTION).min(count) - 1;
        sqlx::query(
            r#"
            SELECT count(hookd.enqueue($1, 'bench.ordering.e' || ((i % $4) % $5),
                                       p.head || repeat('x', greatest(0, $6::int - length(p.head) - 2)) || '"}',
                                       NULL, NULL, 'k' || (i % $4)))
            FROM generate_series($2::bigint, $3::bigint) i
            CROSS JOIN LATERAL (SELECT '{"seq":' || i || ',"invoice":"in_1","amount":4200,"pad":"' AS head) p
            "#,
        )
        .bind(tenant)
        .bind(from)
        .bind(to)
        .bind(keys)
        .bind(endpoints)
        .bind(payload_bytes)
        .execute(pool)
        .await?;
        from = to + 1;
    }
    Ok(())
}

/// Endpoints with `ordering = mode` (`none` or `perKey`).
pub async fn endpoints_with_ordering(pool: &PgPool, mode: &str) -> Result<i64, DbError> {
    Ok(
        sqlx::query_scalar("SELECT count(*) FROM hookd.endpoints WHERE ordering = $1")
            .bind(mode)
            .fetch_one(pool)
            .await?,
    )
}

/// Open deliveries waiting behind an earlier one of their key.
pub async fn ordering_waiting(pool: &PgPool) -> Result<i64, DbError> {
    Ok(sqlx::query_scalar(
        "SELECT count(*) FROM hookd.deliveries
         WHERE status IN ('pending', 'in_progress', 'failed') AND visible_at = hookd.ordering_waiting()",
    )
    .fetch_one(pool)
    .await?)
}

/// Where the open deliveries are, for a drain that did not finish: by status, waiting or
/// not, and the advances not yet folded.
pub async fn ordering_state(pool: &PgPool) -> Result<String, DbError> {
    let rows: Vec<(String, bool, i64)> = sqlx::query_as(
        "SELECT status::text, visible_at = hookd.ordering_waiting(), count(*) FROM hookd.deliveries
         WHERE status IN ('pending', 'in_progress', 'failed') GROUP BY 1, 2 ORDER BY 1, 2",
    )
    .fetch_all(pool)
    .await?;
    let advances: i64 = sqlx::query_scalar("SELECT count(*) FROM hookd.ordering_advances")
        .fetch_one(pool)
        .await?;
    let open: Vec<String> = rows
        .iter()
        .map(|(status, waiting, n)| {
            format!("{n} {status}{}", if *waiting { " waiting" } else { "" })
        })
        .collect();
    Ok(format!(
        "open deliveries: [{}], ordering advances not folded: {advances}",
        open.join(", ")
    ))
}

/// The (ordering key, ordering sequence) of the event of each delivery in `ids`.
pub async fn ordering_of(
    pool: &PgPool,
    ids: &[Uuid],
) -> Result<std::collections::HashMap<Uuid, (String, i64)>, DbError> {
    let rows: Vec<(Uuid, String, i64)> = sqlx::query_as(
        "SELECT d.id, e.ordering_key, e.ordering_seq
         FROM hookd.deliveries d JOIN hookd.events e ON e.id = d.event_id
         WHERE d.id = ANY ($1) AND e.ordering_key IS NOT NULL",
    )
    .bind(ids)
    .fetch_all(pool)
    .await?;
    Ok(rows
        .into_iter()
        .map(|(id, k, seq)| (id, (k, seq)))
        .collect())
}

/// Deliveries in `status`.
pub async fn count_status(pool: &PgPool, status: &str) -> Result<i64, DbError> {
    Ok(
        sqlx::query_scalar("SELECT count(*) FROM hookd.deliveries WHERE status = $1")
            .bind(status)
            .fetch_one(pool)
            .await?,
    )
}

/// One baseline row: an event and its one delivery, ids minted by the caller.
#[derive(Debug, Clone)]
pub struct BaselineRow {
    pub event_id: Uuid,
    pub delivery_id: Uuid,
    pub tenant: String,
    pub event_type: String,
    pub payload: String,
    pub request_hash: Vec<u8>,
    pub endpoint_id: Uuid,
}

/// Baseline "one transaction per event": the event and its delivery in one statement,
/// committed on its own (autocommit). One round trip and one commit per event: the
/// cheapest way plain SQL can write one event durably.
pub async fn baseline_insert_one(pool: &PgPool, r: &BaselineRow) -> Result<(), DbError> {
    sqlx::query(
        r#"
        WITH ev AS (
            INSERT INTO hookd.events (id, tenant, event_type, payload, request_hash)
            VALUES ($1, $2, $3, $4, $5)
            RETURNING id, tenant
        )
        INSERT INTO hookd.deliveries (id, event_id, endpoint_id, tenant)
        SELECT $6, ev.id, $7, ev.tenant FROM ev
        "#,
    )
    .bind(r.event_id)
    .bind(&r.tenant)
    .bind(&r.event_type)
    .bind(&r.payload)
    .bind(&r.request_hash)
    .bind(r.delivery_id)
    .bind(r.endpoint_id)
    .execute(pool)
    .await?;
    Ok(())
}

/// Baseline "many events per transaction": the same rows for a whole batch in one
/// statement (arrays unnested), committed once.
pub async fn baseline_insert_many(pool: &PgPool, rows: &[BaselineRow]) -> Result<(), DbError> {
    let mut ev = Vec::with_capacity(rows.len());
    let mut dl = Vec::with_capacity(rows.len());
    let mut tenants = Vec::with_capacity(rows.len());
    let mut types = Vec::with_capacity(rows.len());
    let mut payloads = Vec::with_capacity(rows.len());
    let mut hashes = Vec::with_capacity(rows.len());
    let mut endpoints = Vec::with_capacity(rows.len());
    for r in rows {
        ev.push(r.event_id);
        dl.push(r.delivery_id);
        tenants.push(r.tenant.as_str());
        types.push(r.event_type.as_str());
        payloads.push(r.payload.as_str());
        hashes.push(r.request_hash.as_slice());
        endpoints.push(r.endpoint_id);
    }
    sqlx::query(
        r#"
        WITH i AS (
            SELECT * FROM unnest($1::uuid[], $2::uuid[], $3::text[], $4::text[], $5::text[],
                                 $6::bytea[], $7::uuid[])
              AS i(event_id, delivery_id, tenant, event_type, payload, request_hash, endpoint_id)
        ), ev AS (
            INSERT INTO hookd.events (id, tenant, event_type, payload, request_hash)
            SELECT event_id, tenant, event_type, payload, request_hash FROM i
        )
        INSERT INTO hookd.deliveries (id, event_id, endpoint_id, tenant)
        SELECT delivery_id, event_id, endpoint_id, tenant FROM i
        "#,
    )
    .bind(&ev)
    .bind(&dl)
    .bind(&tenants)
    .bind(&types)
    .bind(&payloads)
    .bind(&hashes)
    .bind(&endpoints)
    .execute(pool)
    .await?;
    Ok(())
}

/// Fills `count` events of `tenant` with one delivery each, spread round-robin over
/// `endpoints`, in one set-based statement. `terminal` rows are `succeeded` (completed a
/// day ago); the others are `pending` and due now (visible_at in the recent past, in id
/// order, as a backlog built up over time would be).
pub async fn fill(
    pool: &PgPool,
    tenant: &str,
    endpoints: &[Uuid],
    count: i64,
    payload: &str,
    terminal: bool,
) -> Result<(), DbError> {
    sqlx::query(
        r#"
        WITH ev AS (
            INSERT INTO hookd.events (id, tenant, event_type, payload, request_hash, created_at)
            SELECT hookd.uuid_v7(), $1, 'bench.fill', $4, '\x00'::bytea,
                   CASE WHEN $5 THEN now() - interval '1 day' ELSE now() END
            FROM generate_series(1, $3)
            RETURNING id
        ), numbered AS (
            SELECT id, row_number() OVER () AS n FROM ev
        )
        INSERT INTO hookd.deliveries
            (id, event_id, endpoint_id, tenant, status, attempts, visible_at, completed_at)
        SELECT hookd.uuid_v7(), numbered.id,
               ($2::uuid[])[1 + (numbered.n % cardinality($2::uuid[]))], $1,
               CASE WHEN $5 THEN 'succeeded' ELSE 'pending' END,
               CASE WHEN $5 THEN 1 ELSE 0 END,
               CASE WHEN $5 THEN now() - interval '1 day'
                    ELSE now() - interval '1 hour' + numbered.n * interval '1 microsecond' END,
               CASE WHEN $5 THEN now() - interval '1 day' END
        FROM numbered
        "#,
    )
    .bind(tenant)
    .bind(endpoints)
    .bind(count)
    .bind(payload)
    .bind(terminal)
    .execute(pool)
    .await?;
    Ok(())
}

/// Deletes every endpoint (their secrets and any remaining deliveries follow by cascade).
pub async fn delete_endpoints(pool: &PgPool) -> Result<(), DbError> {
    // every referencing table named, so Postgres has no cascade to announce
    sqlx::query(
        "TRUNCATE hookd.endpoints, hookd.subscriptions, hookd.consumers, hookd.endpoint_secrets, hookd.events, hookd.deliveries,
                  hookd.delivery_attempts, hookd.dead_letters, hookd.endpoint_queue, hookd.operational_budget",
    )
    .execute(pool)
    .await?;
    Ok(())
}

/// Adds `count` active endpoints with no deliveries, written straight to the table (the
/// declaration path takes minutes for 300,000), spread over 100 tenants. They exist only
/// to show that the claim and the dispatcher's periodic queries do not read them.
pub async fn idle_endpoints(pool: &PgPool, count: i64) -> Result<(), DbError> {
    sqlx::query(
        "INSERT INTO hookd.endpoints (id, tenant, k8s_namespace, k8s_name, url)
         SELECT hookd.uuid_v7(), 'bench-idle-' || (g % 100), 'bench-idle', 'idle-' || g || '-' || hookd.uuid_v7(),
                'http://127.0.0.1:9/idle'
         FROM generate_series(1, $1) g",
    )
    .bind(count)
    .execute(pool)
    .await?;
    sqlx::query("ANALYZE hookd.endpoints").execute(pool).await?;
    Ok(())
}

/// Active endpoints.
pub async fn active_endpoints(pool: &PgPool) -> Result<i64, DbError> {
    Ok(
        sqlx::query_scalar("SELECT count(*) FROM hookd.endpoints WHERE state = 'active'")
            .fetch_one(pool)
            .await?,
    )
}

/// A one-row table for timing synchronous commits (what every enqueue waits for).
pub async fn create_commit_probe(pool: &PgPool) -> Result<(), DbError> {
    sqlx::query("CREATE TABLE IF NOT EXISTS public.hookd_bench_commit_probe (n bigint)")
        .execute(pool)
        .await?;
    Ok(())
}

/// One synchronously committed single-row insert (a WAL flush, i.e. an fsync, per call).
pub async fn commit_probe(pool: &PgPool) -> Result<(), DbError> {
    let mut tx = pool.begin().await?;
    sqlx::query("SET LOCAL synchronous_commit = on")
        .execute(&mut *tx)
        .await?;
    sqlx::query("INSERT INTO public.hookd_bench_commit_probe VALUES (1)")
        .execute(&mut *tx)
        .await?;
    tx.commit().await?;
    Ok(())
}

/// One round trip that writes nothing.
pub async fn round_trip(pool: &PgPool) -> Result<(), DbError> {
    sqlx::query("SELECT 1").execute(pool).await?;
    Ok(())
}

/// Process ids of the server backends connected to `database` (to read their CPU time
/// when the server runs on this machine).
pub async fn backend_pids(pool: &PgPool, database: &str) -> Result<Vec<i32>, DbError> {
    Ok(sqlx::query_scalar(
        "SELECT pid FROM pg_stat_activity WHERE datname = $1 AND pid <> pg_backend_pid()",
    )
    .bind(database)
    .fetch_all(pool)
    .await?)
}

/// `consumers` consumers of `tenant` with `per` endpoints each (every event type), made
/// straight in SQL (the subscriptions trigger runs as for any insert), for the fan-out
/// rows of the bench.
pub async fn bulk_consumer_endpoints(
    pool: &PgPool,
    tenant: &str,
    consumers: i64,
    per: i64,
    url: &str,
) -> Result<(), DbError> {
    sqlx::query(
        "INSERT INTO hookd.consumers (tenant, uid)
         SELECT $1, 'c' || i FROM generate_series(0, $2 - 1) i ON CONFLICT DO NOTHING",
    )
    .bind(tenant)
    .bind(consumers)
    .execute(pool)
    .await?;
    sqlx::query(
        "INSERT INTO hookd.endpoints (id, tenant, consumer, managed_by, url)
         SELECT hookd.uuid_v7(), $1, 'c' || (i / $3), 'api', $4
         FROM generate_series(0, $2 * $3 - 1) i",
    )
    .bind(tenant)
    .bind(consumers)
    .bind(per)
    .bind(url)
    .execute(pool)
    .await?;
    Ok(())
}

/// `count` endpoints of `tenant` without a consumer; with `type_prefix`, endpoint i
/// subscribes to `<prefix><i>` only, else to every type.
pub async fn bulk_tenant_endpoints(
    pool: &PgPool,
    tenant: &str,
    count: i64,
    type_prefix: Option<&str>,
    url: &str,
) -> Result<(), DbError> {
    sqlx::query(
        "INSERT INTO hookd.endpoints (id, tenant, managed_by, url, event_types)
         SELECT hookd.uuid_v7(), $1, 'api', $3,
                CASE WHEN $4::text IS NULL THEN '{}'::text[] ELSE ARRAY[$4 || i] END
         FROM generate_series(0, $2 - 1) i",
    )
    .bind(tenant)
    .bind(count)
    .bind(url)
    .bind(type_prefix)
    .execute(pool)
    .await?;
    Ok(())
}

/// The bench database's size on disk, in bytes.
pub async fn database_size(pool: &PgPool) -> Result<i64, DbError> {
    Ok(
        sqlx::query_scalar("SELECT pg_database_size(current_database())")
            .fetch_one(pool)
            .await?,
    )
}

/// Dead tuples of the queue tables, as the statistics collector counts them.
pub async fn dead_tuples(pool: &PgPool) -> Result<i64, DbError> {
    Ok(sqlx::query_scalar(
        "SELECT coalesce(sum(n_dead_tup), 0)::bigint FROM pg_stat_user_tables WHERE schemaname = 'hookd'",
    )
    .fetch_one(pool)
    .await?)
}

// ---- the lease model (section `lease-model`) ----
//
// A model of where a delivery's lease lives, on hookd's own tables and indexes in a
// database of its own (`<bench database>_model`): nothing of it is hookd's code. It
// answers one question with the server's own counters: what would a claim cost if it
// changed none of the queue partition's indexed columns (its update HOT), against the
// claim of today, which moves `status` and `visible_at`?

/// Prepares a freshly migrated model database: a column for a lease kept apart from the
/// indexed columns, no queue triggers (the model measures the row's own writes, which is
/// where the two designs differ), no autovacuum between runs, and the model's drain.
const MODEL_PREPARE: [&str; 4] = [
    "ALTER TABLE hookd.deliveries ADD COLUMN lease_until timestamptz",
    "ALTER TABLE hookd.deliveries DISABLE TRIGGER USER",
    "ALTER TABLE hookd.delivery_queue SET (autovacuum_enabled = false)",
    r#"
    CREATE PROCEDURE hookd.model_drain(apart boolean, depth int) LANGUAGE plpgsql AS $$
    DECLARE
      eps uuid[] := ARRAY(SELECT id FROM hookd.endpoints ORDER BY id);
      worker uuid := gen_random_uuid();
      turn int := 0;
      idle int := 0;
      claimed uuid[];
      out jsonb := '[]';
      oldest uuid[];
    BEGIN
      LOOP
        -- one claim: up to 32 due rows of the next endpoint, each in its own transaction
        IF apart THEN
          WITH c AS (SELECT id FROM hookd.deliveries
                     WHERE endpoint_id = eps[1 + turn % cardinality(eps)]
                       AND status IN ('pending', 'in_progress', 'failed')
                       AND visible_at <= now()
                       AND (lease_until IS NULL OR lease_until <= now())
                     ORDER BY visible_at LIMIT 32 FOR UPDATE SKIP LOCKED),
               u AS (UPDATE hookd.deliveries d
                     SET attempts = d.attempts + 1, attempt_seq = d.attempt_seq + 1,
                         claim_token = gen_random_uuid(), lease_until = now() + interval '30 s',
                         locked_by = worker, updated_at = now()
                     FROM c WHERE d.id = c.id AND d.status IN ('pending', 'in_progress', 'failed')
                     RETURNING d.id)
          SELECT array_agg(id) INTO claimed FROM u;
        ELSE
          WITH c AS (SELECT id FROM hookd.deliveries
                     WHERE endpoint_id = eps[1 + turn % cardinality(eps)]
                       AND status IN ('pending', 'in_progress', 'failed')
                       AND visible_at <= now()
                     ORDER BY visible_at LIMIT 32 FOR UPDATE SKIP LOCKED),
               u AS (UPDATE hookd.deliveries d
                     SET status = 'in_progress', attempts = d.attempts + 1,
                         attempt_seq = d.attempt_seq + 1, claim_token = gen_random_uuid(),
                         visible_at = now() + interval '30 s', locked_by = worker,
                         updated_at = now()
                     FROM c WHERE d.id = c.id AND d.status IN ('pending', 'in_progress', 'failed')
                     RETURNING d.id)
          SELECT array_agg(id) INTO claimed FROM u;
        END IF;
        COMMIT;
        turn := turn + 1;
        IF claimed IS NULL THEN
          idle := idle + 1;
        ELSE
          idle := 0;
          out := out || jsonb_build_array(to_jsonb(claimed));
        END IF;
        -- outcomes: the oldest batch out succeeds (its rows move to history) once
        -- `depth` newer ones are out, and every batch once nothing is left to claim
        WHILE jsonb_array_length(out) > depth
              OR (idle >= cardinality(eps) AND jsonb_array_length(out) > 0) LOOP
          oldest := ARRAY(SELECT jsonb_array_elements_text(out -> 0)::uuid);
          out := out - 0;
          UPDATE hookd.deliveries
          SET status = 'succeeded', completed_at = now(), updated_at = now(),
              last_status_code = 204, visible_at = now()
          WHERE id = ANY (oldest) AND status IN ('pending', 'in_progress', 'failed');
          COMMIT;
        END LOOP;
        EXIT WHEN idle >= cardinality(eps);
      END LOOP;
    END $$
    "#,
];

/// [`MODEL_PREPARE`] and `endpoints` endpoints of one tenant.
pub async fn model_prepare(pool: &PgPool, endpoints: i64) -> Result<(), DbError> {
    for sql in MODEL_PREPARE {
        sqlx::query(sql).execute(pool).await?;
    }
    sqlx::query(
        "INSERT INTO hookd.endpoints (id, tenant, url, managed_by)
         SELECT hookd.uuid_v7(), 'model', 'http://127.0.0.1:9/' || g, 'api'
         FROM generate_series(1, $1) g",
    )
    .bind(endpoints)
    .execute(pool)
    .await?;
    Ok(())
}

/// Empties the model's queue and history, sets the queue partition's fillfactor (which
/// the inserts that follow keep free) and fills `rows` due deliveries over the endpoints
/// in turn, each with its event (payload 256 B). Then a checkpoint, so every run starts
/// with each page's first change carrying its image, as after any checkpoint; `false`
/// when the role may not checkpoint.
pub async fn model_fill(pool: &PgPool, fillfactor: i32, rows: i64) -> Result<bool, DbError> {
    sqlx::query("TRUNCATE hookd.deliveries, hookd.events CASCADE")
        .execute(pool)
        .await?;
    // a reloption takes no parameter; the value is an integer from the caller
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "ALTER TABLE hookd.delivery_queue SET (fillfactor = {})",
        fillfactor.clamp(10, 100)
    )))
    .execute(pool)
    .await?;
    sqlx::query(
        "WITH ev AS (
           INSERT INTO hookd.events (id, tenant, event_type, payload, request_hash)
           SELECT hookd.uuid_v7(), 'model', 'model.event', repeat('x', 256), '\\x00'
           FROM generate_series(1, $1)
           RETURNING id
         ), eps AS (
           SELECT id, row_number() OVER (ORDER BY id) - 1 AS n, count(*) OVER () AS k
           FROM hookd.endpoints
         )
         INSERT INTO hookd.deliveries (id, event_id, endpoint_id, tenant, visible_at)
         SELECT hookd.uuid_v7(), ev.id, eps.id, 'model', now() - interval '1 hour'
         FROM (SELECT id, row_number() OVER (ORDER BY id) AS r FROM ev) ev
         JOIN eps ON eps.n = ev.r % eps.k
         ORDER BY ev.r",
    )
    .bind(rows)
    .execute(pool)
    .await?;
    sqlx::query("ANALYZE hookd.deliveries, hookd.events")
        .execute(pool)
        .await?;
    match sqlx::query("CHECKPOINT").execute(pool).await {
        Ok(_) => Ok(true),
        Err(sqlx::Error::Database(e)) if e.code().as_deref() == Some("42501") => Ok(false),
        Err(e) => Err(e.into()),
    }
}

/// What one model drain did: rows moved to history, and the queue partition's updates
/// and HOT updates over the drain.
#[derive(Debug, Clone, Copy)]
pub struct ModelDrain {
    pub succeeded: i64,
    pub updates: i64,
    pub hot_updates: i64,
}

/// Runs [`MODEL_PREPARE`]'s drain on one connection with asynchronous commits (the
/// model measures work, not the disk's flush), `depth` batches of 32 in flight.
pub async fn model_drain(
    conn: &mut sqlx::PgConnection,
    apart: bool,
    depth: i32,
) -> Result<ModelDrain, DbError> {
    const COUNTERS: &str = "SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables
                            WHERE relid = 'hookd.delivery_queue'::regclass";
    sqlx::query("SET synchronous_commit = off")
        .execute(&mut *conn)
        .await?;
    let (upd0, hot0): (i64, i64) = sqlx::query_as(COUNTERS).fetch_one(&mut *conn).await?;
    sqlx::query("CALL hookd.model_drain($1, $2)")
        .bind(apart)
        .bind(depth)
        .execute(&mut *conn)
        .await?;
    // this backend's counters reach the shared statistics when a transaction of its
    // ends after the flag is set, i.e. with this statement (PostgreSQL 15 and later;
    // before, the backend sends them to the collector within half a second of idling)
    match sqlx::query("SELECT pg_stat_force_next_flush()")
        .execute(&mut *conn)
        .await
    {
        Ok(_) => {}
        Err(sqlx::Error::Database(e)) if e.code().as_deref() == Some("42883") => {
            tokio::time::sleep(std::time::Duration::from_millis(1500)).await;
        }
        Err(e) => return Err(e.into()),
    }
    let (upd1, hot1): (i64, i64) = sqlx::query_as(COUNTERS).fetch_one(&mut *conn).await?;
    let succeeded: i64 =
        sqlx::query_scalar("SELECT count(*) FROM hookd.deliveries WHERE status = 'succeeded'")
            .fetch_one(&mut *conn)
            .await?;
    Ok(ModelDrain {
        succeeded,
        updates: upd1 - upd0,
        hot_updates: hot1 - hot0,
    })
}
