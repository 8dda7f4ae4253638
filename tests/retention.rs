//! Retention (issue 8, part 7): terminal deliveries past the retention are deleted with
//! their attempts and dead letters, and their events once no delivery remains; pending,
//! in-progress and retrying deliveries never are, whatever their age; per-tenant
//! overrides; one pruner at a time; the claim plan stays an index range scan; the
//! one-shot `hookd prune` and the dispatcher's interval pruner. Rows are built backdated
//! directly (with UUIDv7 ids of their creation time), as an old database would hold them.

use crate::common;

use std::time::Duration;

use chrono::{DateTime, TimeDelta, Utc};
use common::*;
use hookd::db::deliveries::{self, ClaimRequest};
use hookd::domain::DeliveryStatus;
use hookd::metrics::Metrics;
use hookd::retention::{PruneCounts, PruneOutcome, RetentionPolicy, prune_once};
use sqlx::PgPool;
use uuid::Uuid;

// ---- fixtures ----

fn days_ago(d: i64) -> DateTime<Utc> {
    Utc::now() - TimeDelta::days(d)
}

fn policy(days: u32, tenants: &str, batch: u32) -> RetentionPolicy {
    RetentionPolicy::from_settings(&hookd::config::RetentionSettings {
        retention_days: days,
        tenant_retention: tenants.into(),
        prune_interval_secs: 600,
        prune_batch: batch,
    })
    .unwrap()
}

async fn ep(pool: &PgPool, tenant: &str) -> Uuid {
    endpoint(
        pool,
        EndpointOpts {
            tenant: Some(tenant.into()),
            url: "http://127.0.0.1:9/unused".into(),
            ..Default::default()
        },
    )
    .await
}

async fn dead_letter(pool: &PgPool, delivery_id: Uuid, endpoint_id: Uuid, tenant: &str) {
    sqlx::query(
        "INSERT INTO hookd.dead_letters (delivery_id, endpoint_id, tenant, reason, attempts, dead_at)
         VALUES ($1, $2, $3, 'exhausted', 1, now() - interval '40 days')",
    )
    .bind(delivery_id)
    .bind(endpoint_id)
    .bind(tenant)
    .execute(pool)
    .await
    .unwrap();
}

/// One attempt made, created `age` days ago and last changed `changed` days ago.
fn aged(tenant: &str, status: &str, age: i64, changed: i64) -> DeliveryOpts {
    DeliveryOpts {
        tenant: tenant.into(),
        status: DeliveryStatus::parse(status).unwrap(),
        attempts: 1,
        created_at: days_ago(age),
        updated_at: Some(days_ago(changed)),
        ..Default::default()
    }
}

/// An event with one delivery in `status`, both created `age` days ago and last changed
/// `changed` days ago; returns (event, delivery).
async fn pair(
    pool: &PgPool,
    endpoint_id: Uuid,
    tenant: &str,
    status: &str,
    age: i64,
    changed: i64,
) -> (Uuid, Uuid) {
    let d = delivery(
        pool,
        DeliveryOpts {
            endpoint: Some(endpoint_id),
            ..aged(tenant, status, age, changed)
        },
    )
    .await;
    (d.event_id, d.id)
}

async fn exists(pool: &PgPool, table: &str, column: &str, id: Uuid) -> bool {
    sqlx::query_scalar::<_, bool>(sqlx::AssertSqlSafe(format!(
        "SELECT EXISTS (SELECT 1 FROM hookd.{table} WHERE {column} = $1)"
    )))
    .bind(id)
    .fetch_one(pool)
    .await
    .unwrap()
}

async fn count(pool: &PgPool, table: &str) -> i64 {
    sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
        "SELECT count(*) FROM hookd.{table}"
    )))
    .fetch_one(pool)
    .await
    .unwrap()
}

async fn prune(pool: &PgPool, p: &RetentionPolicy, metrics: &Metrics) -> PruneCounts {
    match prune_once(pool, p, Utc::now(), metrics).await.unwrap() {
        PruneOutcome::Done(c) => c,
        PruneOutcome::Skipped => panic!("no other pruner is running"),
    }
}

// ---- what is deleted and what never is ----

/// With the default 30 days and batches of 7: pending, in_progress and failed deliveries
/// 40 days old stay with their events; succeeded, dead and cancelled ones 40 days old go
/// with their attempts and dead letter and then their events; a 5-day-old success stays;
/// a 40-day-old delivery replayed and succeeded yesterday stays; an event whose other
/// delivery is still pending stays until that one expires too; an event with no
/// delivery goes once expired. 50 more expired deliveries exercise the batching. The
/// counts and the metric match, and a further pass deletes nothing.
#[sqlx::test]
async fn expired_terminal_rows_go_and_live_deliveries_never_do(pool: PgPool) {
    init();
    let ep1 = ep(&pool, "ret").await;
    let ep2 = ep(&pool, "ret").await;
    let mut kept = Vec::new();
    for status in ["pending", "in_progress", "failed"] {
        kept.push(pair(&pool, ep1, "ret", status, 40, 40).await);
    }
    let recent = pair(&pool, ep1, "ret", "succeeded", 5, 5).await;
    let replayed = pair(&pool, ep1, "ret", "succeeded", 40, 1).await;
    kept.extend([recent, replayed]);

    let (e_ok, d_ok) = pair(&pool, ep1, "ret", "succeeded", 40, 40).await;
    failed_attempts(&pool, d_ok, 2).await;
    let (e_dead, d_dead) = pair(&pool, ep1, "ret", "dead", 40, 40).await;
    failed_attempts(&pool, d_dead, 3).await;
    dead_letter(&pool, d_dead, ep1, "ret").await;
    let (e_cancel, d_cancel) = pair(&pool, ep1, "ret", "cancelled", 40, 40).await;
    // one event, two endpoints: one delivery done long ago, the other still pending
    let e_mixed = event_at(&pool, "ret", days_ago(40)).await;
    let mixed = |endpoint, status| DeliveryOpts {
        event: Some(e_mixed),
        endpoint: Some(endpoint),
        ..aged("ret", status, 40, 40)
    };
    let d_mixed_done = delivery(&pool, mixed(ep1, "succeeded")).await.id;
    let d_mixed_pending = delivery(&pool, mixed(ep2, "pending")).await.id;
    let orphan = event_at(&pool, "ret", days_ago(40)).await;
    let young_orphan = event_at(&pool, "ret", days_ago(5)).await;
    for i in 0..50 {
        pair(&pool, ep2, "ret", "succeeded", 31 + i % 5, 31).await;
    }

    let metrics = Metrics::new();
    let p = policy(30, "", 7);
    let c = prune(&pool, &p, &metrics).await;
    assert_eq!(
        c,
        PruneCounts {
            deliveries: 3 + 1 + 50,
            attempts: 5,
            dead_letters: 1,
            events: 3 + 50 + 1,
            ..PruneCounts::default()
        }
    );
    for (e, d) in &kept {
        assert!(exists(&pool, "deliveries", "id", *d).await, "kept {d}");
        assert!(exists(&pool, "events", "id", *e).await, "kept event {e}");
    }
    for (e, d) in [(e_ok, d_ok), (e_dead, d_dead), (e_cancel, d_cancel)] {
        assert!(!exists(&pool, "deliveries", "id", d).await);
        assert!(!exists(&pool, "events", "id", e).await);
        assert!(!exists(&pool, "delivery_attempts", "delivery_id", d).await);
    }
    assert!(!exists(&pool, "dead_letters", "delivery_id", d_dead).await);
    assert!(!exists(&pool, "deliveries", "id", d_mixed_done).await);
    assert!(exists(&pool, "deliveries", "id", d_mixed_pending).await);
    assert!(
        exists(&pool, "events", "id", e_mixed).await,
        "an event stays while a delivery remains"
    );
    assert!(!exists(&pool, "events", "id", orphan).await);
    assert!(exists(&pool, "events", "id", young_orphan).await);
    assert_eq!(count(&pool, "deliveries").await, 6);
    assert_eq!(count(&pool, "delivery_attempts").await, 0);
    let text = metrics.render();
    for line in [
        "hookd_retention_deleted_total{table=\"deliveries\"} 54",
        "hookd_retention_deleted_total{table=\"delivery_attempts\"} 5",
        "hookd_retention_deleted_total{table=\"dead_letters\"} 1",
        "hookd_retention_deleted_total{table=\"events\"} 54",
    ] {
        assert!(text.contains(line), "{line} in\n{text}");
    }

    // the pending half of the mixed event finishes long ago: both go now
    sqlx::query(
        "UPDATE hookd.deliveries SET status = 'succeeded', updated_at = now() - interval '35 days' WHERE id = $1",
    )
    .bind(d_mixed_pending)
    .execute(&pool)
    .await
    .unwrap();
    let c = prune(&pool, &p, &metrics).await;
    assert_eq!((c.deliveries, c.events), (1, 1));
    assert!(!exists(&pool, "events", "id", e_mixed).await);
    assert_eq!(prune(&pool, &p, &metrics).await, PruneCounts::default());
    for (_, d) in &kept {
        assert!(exists(&pool, "deliveries", "id", *d).await);
    }
}

/// Per-tenant overrides: `short=1` deletes a 2-day-old success the default would keep;
/// `long=90` keeps a 40-day-old one the default would delete, and deletes a 100-day-old
/// one; `forever=0` keeps everything.
#[sqlx::test]
async fn tenant_overrides_replace_the_default_retention(pool: PgPool) {
    init();
    let mut eps = std::collections::HashMap::new();
    for t in ["default-t", "short", "long", "forever"] {
        eps.insert(t, ep(&pool, t).await);
    }
    let mut rows = Vec::new();
    for (t, age) in [
        ("default-t", 2),
        ("default-t", 40),
        ("short", 2),
        ("long", 40),
        ("long", 100),
        ("forever", 2),
        ("forever", 40),
        ("forever", 100),
    ] {
        rows.push((t, age, pair(&pool, eps[t], t, "succeeded", age, age).await));
    }
    let c = prune(
        &pool,
        &policy(30, "short=1,long=90,forever=0", 100),
        &Metrics::new(),
    )
    .await;
    assert_eq!((c.deliveries, c.events), (3, 3));
    for (t, age, (e, d)) in rows {
        let expired = matches!((t, age), ("default-t", 40) | ("short", 2) | ("long", 100));
        assert_eq!(
            exists(&pool, "deliveries", "id", d).await,
            !expired,
            "{t} {age} days"
        );
        assert_eq!(exists(&pool, "events", "id", e).await, !expired);
    }
}

/// While another session holds the pruning lock, a pass is skipped and deletes nothing;
/// once it is released, the next pass runs.
#[sqlx::test]
async fn only_one_process_prunes_at_a_time(pool: PgPool) {
    init();
    let e = ep(&pool, "lock").await;
    let (_, d) = pair(&pool, e, "lock", "succeeded", 40, 40).await;
    let mut holder = pool.acquire().await.unwrap();
    sqlx::query("SELECT pg_advisory_lock($1)")
        .bind(hookd::db::retention::PRUNE_LOCK)
        .execute(&mut *holder)
        .await
        .unwrap();
    let p = policy(30, "", 100);
    assert_eq!(
        prune_once(&pool, &p, Utc::now(), &Metrics::new())
            .await
            .unwrap(),
        PruneOutcome::Skipped
    );
    assert!(exists(&pool, "deliveries", "id", d).await);
    sqlx::query("SELECT pg_advisory_unlock($1)")
        .bind(hookd::db::retention::PRUNE_LOCK)
        .execute(&mut *holder)
        .await
        .unwrap();
    assert_eq!(prune(&pool, &p, &Metrics::new()).await.deliveries, 1);
    // the pass released its lock: it can be taken again at once
    let free: bool = sqlx::query_scalar("SELECT pg_try_advisory_lock($1)")
        .bind(hookd::db::retention::PRUNE_LOCK)
        .fetch_one(&mut *holder)
        .await
        .unwrap();
    assert!(free);
}

// ---- claims are unaffected ----

/// 50k due deliveries over three endpoints and 50k expired successes: pruning deletes
/// exactly the expired ones, and afterwards the claim statement is still an index range
/// scan of `deliveries_claimable`, never a sequential scan, taking its full quota.
#[sqlx::test]
async fn claim_plan_stays_an_index_scan_after_pruning(pool: PgPool) {
    init();
    let mut eps = Vec::new();
    for _ in 0..3 {
        eps.push(ep(&pool, "plan").await);
    }
    let mut conn = pool.acquire().await.unwrap();
    sqlx::query(
        "CREATE TEMP TABLE gen AS
         SELECT g AS rn, now() - CASE WHEN g <= 50000 THEN interval '1 minute' ELSE interval '40 days' END
                          - g * interval '1 ms' AS ts
         FROM generate_series(1, 100000) g",
    )
    .execute(&mut *conn)
    .await
    .unwrap();
    // UUIDv7 ids of each row's (backdated) creation time, as production writes them;
    // temporary objects live in this session, so everything runs on one connection
    sqlx::query(
        "CREATE FUNCTION pg_temp.v7_at(ts timestamptz) RETURNS uuid LANGUAGE sql AS $$
           SELECT encode(set_bit(set_bit(overlay(uuid_send(gen_random_uuid())
                  placing substring(int8send((extract(epoch FROM ts) * 1000)::bigint) FROM 3)
                  FROM 1 FOR 6), 52, 1), 53, 1), 'hex')::uuid $$",
    )
    .execute(&mut *conn)
    .await
    .unwrap();
    sqlx::query(
        "INSERT INTO hookd.events (id, tenant, event_type, payload, request_hash, created_at)
         SELECT pg_temp.v7_at(ts), 'plan', 'bulk.event', '{}', '\\x00'::bytea, ts FROM gen",
    )
    .execute(&mut *conn)
    .await
    .unwrap();
    sqlx::query(
        "INSERT INTO hookd.deliveries (id, event_id, endpoint_id, tenant, status, attempts,
             visible_at, created_at, updated_at, completed_at)
         SELECT pg_temp.v7_at(e.created_at), e.id, ($1::uuid[])[1 + (g.rn % 3)], 'plan',
                CASE WHEN g.rn <= 50000 THEN 'pending' ELSE 'succeeded' END,
                CASE WHEN g.rn <= 50000 THEN 0 ELSE 1 END,
                e.created_at, e.created_at, e.created_at,
                CASE WHEN g.rn <= 50000 THEN NULL ELSE e.created_at END
         FROM gen g JOIN hookd.events e ON e.created_at = g.ts",
    )
    .bind(&eps)
    .execute(&mut *conn)
    .await
    .unwrap();
    drop(conn);
    assert_eq!(count(&pool, "deliveries").await, 100_000);

    sqlx::query("ANALYZE hookd.deliveries, hookd.events, hookd.endpoints")
        .execute(&pool)
        .await
        .unwrap();
    // a prune batch is an ordered range scan of one endpoint's old rows that stops at
    // the batch size, never a table scan
    let p = policy(30, "", 5000);
    let prune_plan = hookd::db::retention::explain_prune_endpoint_batch(
        &mut pool.acquire().await.unwrap(),
        eps[0],
        days_ago(30),
        &p.cutoffs(Utc::now()),
        500, // the default HOOKD_PRUNE_BATCH
    )
    .await
    .unwrap()
    .join("\n");
    assert!(
        prune_plan.contains("_endpoint_id_id_idx on delivery_history"),
        "{prune_plan}"
    );
    assert!(!prune_plan.contains("Seq Scan on deliver"), "{prune_plan}");

    let c = prune(&pool, &p, &Metrics::new()).await;
    assert_eq!((c.deliveries, c.events), (50_000, 50_000));
    sqlx::query("ANALYZE hookd.deliveries, hookd.events, hookd.endpoints")
        .execute(&pool)
        .await
        .unwrap();
    let pending: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM hookd.deliveries WHERE status = 'pending' AND visible_at <= now()",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(pending, 50_000, "no due delivery was pruned");

    let req = ClaimRequest {
        worker_id: Uuid::now_v7(),
        limit: 100,
        lease_secs: 30.0,
        per_endpoint_cap: 32,
        busy: vec![(eps[0], 4)],
        now: None,
        default_max_attempts: 8,
    };
    let plan = deliveries::explain_claim(&pool, &req).await.unwrap();
    let text = plan.join("\n");
    assert!(
        plan.iter()
            .any(|l| l.contains("Index Scan using deliveries_claimable on delivery_queue")),
        "claim must range-scan deliveries_claimable:\n{text}"
    );
    assert!(
        !plan.iter().any(|l| l.contains("Seq Scan on deliver")),
        "claim must never scan deliveries sequentially:\n{text}"
    );
    assert!(
        plan.iter()
            .any(|l| l.starts_with("Update on deliveries") && l.contains("rows=92 ")),
        "expected 92 claimed rows:\n{text}"
    );
}

// ---- the command and the dispatcher's pruner ----

/// `hookd prune` runs one pass and says what it deleted; a malformed
/// HOOKD_TENANT_RETENTION is refused with a clear message.
#[sqlx::test]
async fn hookd_prune_reports_what_it_deleted(pool: PgPool) {
    init();
    let e = ep(&pool, "cli").await;
    let (_, d) = pair(&pool, e, "cli", "dead", 45, 45).await;
    failed_attempts(&pool, d, 2).await;
    dead_letter(&pool, d, e, "cli").await;
    pair(&pool, e, "cli", "pending", 45, 45).await;
    let run = |env: Vec<(&'static str, &'static str)>| {
        let url = database_url(&pool);
        async move {
            let out = HookdCommand::new(["prune"])
                .env("DATABASE_URL", url)
                .env("HOOKD_LOG", "warn")
                .envs(env)
                .run()
                .await;
            (
                out.status.success(),
                String::from_utf8_lossy(&out.stdout).into_owned(),
                String::from_utf8_lossy(&out.stderr).into_owned(),
            )
        }
    };
    let (ok, _, err) = run(vec![("HOOKD_TENANT_RETENTION", "cli=soon")]).await;
    assert!(!ok);
    assert!(
        err.contains("HOOKD_TENANT_RETENTION: \"cli=soon\" is not `tenant=days`"),
        "{err}"
    );
    assert_eq!(count(&pool, "deliveries").await, 2);
    let (ok, out, err) = run(vec![("HOOKD_TENANT_RETENTION", "other=90")]).await;
    assert!(ok, "{err}");
    assert_eq!(
        out.trim(),
        "prune: deleted 1 deliveries, 2 attempts, 1 dead letters, 1 events (retention 30 days; other=90 days)"
    );
    assert_eq!(count(&pool, "deliveries").await, 1, "the pending one stays");
}

/// A `hookd dispatch` process prunes on its interval (HOOKD_PRUNE_INTERVAL_SECS) and
/// counts what it deleted in /metrics.
#[sqlx::test]
async fn dispatcher_prunes_on_its_interval(pool: PgPool) {
    init();
    let e = ep(&pool, "interval").await;
    let (old_event, old) = pair(&pool, e, "interval", "succeeded", 40, 40).await;
    let (_, live) = pair(&pool, e, "interval", "failed", 40, 40).await;
    let port = free_port();
    let mut child = HookdCommand::new(["dispatch"])
        .database(&pool)
        .test_key()
        .listen(port)
        .env("HOOKD_PRUNE_INTERVAL_SECS", "1")
        .env("HOOKD_LOG", "warn")
        .spawn();
    assert!(
        wait_until(Duration::from_secs(20), || async {
            !exists(&pool, "deliveries", "id", old).await
        })
        .await,
        "the dispatcher pruned the expired delivery"
    );
    assert!(!exists(&pool, "events", "id", old_event).await);
    assert!(
        exists(&pool, "deliveries", "id", live).await,
        "a retrying delivery is never pruned"
    );
    // The rows are gone at the pass's commit; the pass is counted a moment later.
    let url = format!("http://127.0.0.1:{port}/metrics");
    let metrics = || async { reqwest::get(&url).await.unwrap().text().await.unwrap() };
    let counted = |m: &str| {
        m.contains("hookd_retention_deleted_total{table=\"deliveries\"} 1")
            && m.contains("hookd_retention_passes_total{result=\"done\"}")
    };
    assert!(
        wait_until(Duration::from_secs(20), || async {
            counted(&metrics().await)
        })
        .await,
        "{}",
        metrics().await
    );
    child.kill();
}

// ---- the history apart from the queue (migration 0014) ----

fn claim_req() -> ClaimRequest {
    ClaimRequest {
        worker_id: Uuid::now_v7(),
        limit: 10,
        lease_secs: 30.0,
        per_endpoint_cap: 32,
        busy: Vec::new(),
        now: None,
        default_max_attempts: 8,
    }
}

/// The partition a delivery's row is in.
async fn partition_of(pool: &PgPool, id: Uuid) -> String {
    sqlx::query_scalar("SELECT tableoid::regclass::text FROM hookd.deliveries WHERE id = $1")
        .bind(id)
        .fetch_one(pool)
        .await
        .unwrap()
}

async fn relation_exists(pool: &PgPool, name: &str) -> bool {
    sqlx::query_scalar("SELECT to_regclass($1) IS NOT NULL")
        .bind(name)
        .fetch_one(pool)
        .await
        .unwrap()
}

/// A delivery sits in the queue partition while it is open, moves into its day's
/// history partition when it succeeds (with its attempt in that day's attempts
/// partition), and a replay brings it back into the queue under the same id; the claim
/// reads the queue partition alone.
#[sqlx::test]
async fn a_delivery_leaves_the_queue_when_done_and_a_replay_brings_it_back(pool: PgPool) {
    let e = ep(&pool, "hist").await;
    let d = delivery(
        &pool,
        DeliveryOpts {
            endpoint: Some(e),
            tenant: "hist".into(),
            ..Default::default()
        },
    )
    .await;
    assert_eq!(partition_of(&pool, d.id).await, "hookd.delivery_queue");
    let day = Utc::now().format("%Y%m%d").to_string();

    let claimed = deliveries::claim(&pool, &claim_req()).await.unwrap();
    assert_eq!(claimed.len(), 1);
    let plan = deliveries::explain_claim(&pool, &claim_req())
        .await
        .unwrap();
    assert!(
        !plan.iter().any(|l| l.contains("delivery_history")),
        "the claim must be planned on the queue partition alone:\n{}",
        plan.join("\n")
    );
    let outcome = deliveries::Completion {
        delivery_id: claimed[0].id,
        claim_token: claimed[0].claim_token,
        attempt: claimed[0].attempt_seq,
        status: deliveries::DeliveryOutcome::Succeeded,
        retry_delay_ms: None,
        started_at: Utc::now(),
        duration_ms: 1,
        status_code: Some(200),
        error_class: None,
        error: None,
        response_snippet: None,
        dead_reason: None,
    };
    let mut conn = pool.acquire().await.unwrap();
    let done = deliveries::complete(&mut conn, &[outcome]).await.unwrap();
    assert_eq!(done, vec![d.id]);
    assert_eq!(
        partition_of(&pool, d.id).await,
        format!("hookd.delivery_history_{day}")
    );
    let attempt_partition: String = sqlx::query_scalar(
        "SELECT tableoid::regclass::text FROM hookd.delivery_attempts WHERE delivery_id = $1",
    )
    .bind(d.id)
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(attempt_partition, format!("hookd.delivery_attempts_{day}"));

    let r = deliveries::replay(&pool, d.id, Default::default())
        .await
        .unwrap();
    assert_eq!(r, deliveries::ReplayOutcome::Replayed);
    assert_eq!(partition_of(&pool, d.id).await, "hookd.delivery_queue");
    let n: i64 = sqlx::query_scalar("SELECT count(*) FROM hookd.deliveries WHERE id = $1")
        .bind(d.id)
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(n, 1, "one row per delivery, wherever it is");
    assert_eq!(
        deliveries::claim(&pool, &claim_req()).await.unwrap().len(),
        1
    );
}

/// Retention drops a day whole (deliveries, attempts and dead letters) once every row in
/// it has expired, and keeps a day while one of its deliveries is back in the queue or
/// one of its rows is unexpired. Migration 0014 put everything minted before it into
/// one partition (`before_0014`), which is the day the test ages: the pass runs 45 days
/// from now with 30 days of retention.
#[sqlx::test]
async fn a_day_whose_rows_all_expired_is_dropped_whole(pool: PgPool) {
    let e = ep(&pool, "ret").await;
    let (old_event, old) = pair(&pool, e, "ret", "dead", 40, 40).await;
    dead_letter(&pool, old, e, "ret").await;
    let (_, today_open) = pair(&pool, e, "ret", "pending", 0, 0).await;
    assert_eq!(
        partition_of(&pool, old).await,
        "hookd.delivery_history_before_0014"
    );
    let later = Utc::now() + TimeDelta::days(45);
    let metrics = Metrics::new();
    let p = policy(30, "", 100);
    let c = match prune_once(&pool, &p, later, &metrics).await.unwrap() {
        PruneOutcome::Done(c) => c,
        PruneOutcome::Skipped => panic!("no other pruner is running"),
    };
    assert!(c.days_dropped >= 1, "{c:?}");
    for t in ["delivery_history", "delivery_attempts", "dead_letters"] {
        assert!(
            !relation_exists(&pool, &format!("hookd.{t}_before_0014")).await,
            "{t}_before_0014 is dropped"
        );
    }
    assert!(!exists(&pool, "deliveries", "id", old).await);
    assert!(!exists(&pool, "delivery_attempts", "delivery_id", old).await);
    assert!(!exists(&pool, "dead_letters", "delivery_id", old).await);
    assert!(
        !exists(&pool, "events", "id", old_event).await,
        "its event goes after it"
    );
    // today's day holds an open delivery: kept, and so is the delivery
    let today = Utc::now().format("%Y%m%d").to_string();
    assert!(relation_exists(&pool, &format!("hookd.delivery_history_{today}")).await);
    assert!(exists(&pool, "deliveries", "id", today_open).await);
    assert_eq!(metrics.retention_days_dropped.get(), c.days_dropped as u64);
}

/// The events of dropped days go in bulk (issue 27, item 7): once the day is gone, each is
/// one probe of the queue and a delete, in batches, never a probe of every history day
/// per event as the row-by-row walk does (115 s for the ~490,000 events of a week). An
/// event that still has a delivery in the queue stays, whatever its age.
#[sqlx::test]
async fn events_of_dropped_days_go_in_bulk_and_one_with_a_queued_delivery_stays(pool: PgPool) {
    let e = ep(&pool, "ret").await;
    let mut old = Vec::new();
    for _ in 0..20 {
        old.push(pair(&pool, e, "ret", "dead", 40, 40).await.0);
    }
    // events no endpoint was subscribed to
    for _ in 0..3 {
        let d = pair(&pool, e, "ret", "succeeded", 40, 40).await;
        sqlx::query("DELETE FROM hookd.deliveries WHERE id = $1")
            .bind(d.1)
            .execute(&pool)
            .await
            .unwrap();
        old.push(d.0);
    }
    // an old event with a delivery in the queue minted today: no history names it, the
    // queue does (ids are minted with their event, so only a clock gone wrong makes this)
    let (held_event, _) = pair(&pool, e, "ret", "dead", 40, 40).await;
    let queued = delivery(
        &pool,
        DeliveryOpts {
            endpoint: Some(e),
            event: Some(held_event),
            ..aged("ret", "pending", 0, 0)
        },
    )
    .await;

    let later = Utc::now() + TimeDelta::days(45);
    let metrics = Metrics::new();
    let c = match prune_once(&pool, &policy(30, "", 7), later, &metrics)
        .await
        .unwrap()
    {
        PruneOutcome::Done(c) => c,
        PruneOutcome::Skipped => panic!("no other pruner is running"),
    };
    assert!(c.days_dropped >= 1, "{c:?}");
    assert!(
        !relation_exists(&pool, "hookd.delivery_history_before_0014").await,
        "the day is dropped"
    );
    assert_eq!(c.events_with_days, 23, "{c:?}");
    assert_eq!(c.events, 23, "the walk found nothing left: {c:?}");
    for id in old {
        assert!(!exists(&pool, "events", "id", id).await, "event {id} goes");
    }
    assert!(exists(&pool, "events", "id", held_event).await);
    assert!(exists(&pool, "deliveries", "id", queued.id).await);
}

/// The bulk statement reads the events by their primary key and probes the queue, never
/// a history day (the walk's statement probes `deliveries` whole: every day per event).
#[sqlx::test]
async fn the_events_of_dropped_days_are_read_by_key_and_the_history_is_not_probed(pool: PgPool) {
    use hookd::db::retention::{dropped_days_end, uuid_v7_floor, uuid_v7_time};
    let lowest = uuid_v7_floor(Utc::now());
    let end = dropped_days_end(lowest).expect("a day with a lower bound");
    assert_eq!(end.1, uuid_v7_time(lowest) - TimeDelta::days(1));
    assert_eq!(end.0, uuid_v7_floor(end.1));
    let p = policy(30, "", 500);
    let plan = hookd::db::retention::explain_prune_dropped_day_events_batch(
        &mut pool.acquire().await.unwrap(),
        end,
        &p.cutoffs(Utc::now()),
        500,
    )
    .await
    .unwrap()
    .join("\n");
    assert!(plan.contains("using events_pkey on events"), "{plan}");
    assert!(plan.contains("delivery_queue_event_id_idx"), "{plan}");
    assert!(!plan.contains("delivery_history"), "{plan}");
    assert!(!plan.contains("Seq Scan"), "{plan}");
    assert_eq!(
        dropped_days_end(Uuid::nil()),
        None,
        "below the open-ended day from before 0014 nothing is known to be gone"
    );
}

#[sqlx::test]
async fn a_day_stays_while_a_delivery_of_it_is_queued_or_a_row_is_unexpired(pool: PgPool) {
    let e = ep(&pool, "ret").await;
    let later = Utc::now() + TimeDelta::days(45);
    let p = policy(30, "", 100);
    let before = "hookd.delivery_history_before_0014";

    // an old delivery being retried (in the queue) keeps its day; the day's expired rows
    // are deleted one by one instead
    let (_, expired) = pair(&pool, e, "ret", "succeeded", 40, 40).await;
    let (_, retrying) = pair(&pool, e, "ret", "failed", 40, 40).await;
    prune_once(&pool, &p, later, &Metrics::new()).await.unwrap();
    assert!(relation_exists(&pool, before).await);
    assert!(exists(&pool, "deliveries", "id", retrying).await);
    assert!(!exists(&pool, "deliveries", "id", expired).await);

    // once it is done but still within its retention (updated 20 days from now: after
    // the pass's cutoff, 15 days from now), the day stays too
    sqlx::query(
        "UPDATE hookd.deliveries SET status = 'succeeded', updated_at = now() + interval '20 days' WHERE id = $1",
    )
    .bind(retrying)
    .execute(&pool)
    .await
    .unwrap();
    assert_eq!(partition_of(&pool, retrying).await, before);
    prune_once(&pool, &p, later, &Metrics::new()).await.unwrap();
    assert!(
        relation_exists(&pool, before).await,
        "an unexpired row keeps its day"
    );
    assert!(exists(&pool, "deliveries", "id", retrying).await);

    // and goes with it once that row has expired as well
    prune_once(&pool, &p, later + TimeDelta::days(10), &Metrics::new())
        .await
        .unwrap();
    assert!(!relation_exists(&pool, before).await);
    assert!(!exists(&pool, "deliveries", "id", retrying).await);
}

/// Every connection hookd opens prices sequential and bitmap scans out
/// (`db::INDEX_PATHS_ONLY`), so that a queue partition analyzed while nearly empty is
/// still read by key and in index order.
#[sqlx::test]
async fn hookd_connections_plan_index_paths_only(pool: PgPool) {
    let ours = hookd::db::connect_lazy(&hookd::db::PoolSettings {
        url: database_url(&pool),
        max_connections: 1,
        acquire_timeout: Duration::from_secs(5),
    })
    .unwrap();
    for setting in ["enable_seqscan", "enable_bitmapscan"] {
        let value: String = sqlx::query_scalar("SELECT current_setting($1)")
            .bind(setting)
            .fetch_one(&ours)
            .await
            .unwrap();
        assert_eq!(value, "off", "{setting}");
    }
}

/// Migration 0014 on a database written by the version before it: every delivery, attempt
/// and dead letter is still there, each in the partition its status and id say, and the
/// queue triggers still run (a claim finds the open delivery).
#[sqlx::test(migrations = false)]
async fn migration_0014_moves_existing_rows_into_their_partitions(pool: PgPool) {
    let dir = std::env::temp_dir().join(format!("hookd-0013-{}", Uuid::now_v7().simple()));
    std::fs::create_dir_all(&dir).unwrap();
    let src = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("migrations");
    let mut names: Vec<_> = std::fs::read_dir(&src)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| n.as_str() < "0014")
        .collect();
    names.sort();
    assert_eq!(names.len(), 13);
    for n in &names {
        std::fs::copy(src.join(n), dir.join(n)).unwrap();
    }
    sqlx::migrate::Migrator::new(dir.as_path())
        .await
        .unwrap()
        .run(&pool)
        .await
        .unwrap();
    std::fs::remove_dir_all(&dir).unwrap();

    let ep = Uuid::now_v7();
    let ev = Uuid::now_v7();
    sqlx::query(
        "WITH e AS (INSERT INTO hookd.endpoints (id, tenant, k8s_namespace, k8s_name, url)
                    VALUES ($1, 'up', 'up', 'ep', 'http://127.0.0.1:9/x'))
         INSERT INTO hookd.events (id, tenant, event_type, payload, request_hash)
         VALUES ($2, 'up', 'a.b', '{}', '\\x00')",
    )
    .bind(ep)
    .bind(ev)
    .execute(&pool)
    .await
    .unwrap();
    let open = Uuid::now_v7();
    let old_done = v7_at(days_ago(40));
    let dead_today = Uuid::now_v7();
    for (id, status) in [
        (open, "pending"),
        (old_done, "succeeded"),
        (dead_today, "dead"),
    ] {
        sqlx::query(
            "INSERT INTO hookd.deliveries (id, event_id, endpoint_id, tenant, status, attempts)
             VALUES ($1, $2, $3, 'up', $4, 1)",
        )
        .bind(id)
        .bind(ev)
        .bind(ep)
        .bind(status)
        .execute(&pool)
        .await
        .unwrap();
        sqlx::query(
            "INSERT INTO hookd.delivery_attempts (delivery_id, attempt, started_at, duration_ms, status_code)
             VALUES ($1, 1, now(), 5, 500)",
        )
        .bind(id)
        .execute(&pool)
        .await
        .unwrap();
    }
    dead_letter(&pool, dead_today, ep, "up").await;

    hookd::db::migrate(&pool).await.unwrap();

    let today = Utc::now().format("%Y%m%d").to_string();
    assert_eq!(partition_of(&pool, open).await, "hookd.delivery_queue");
    assert_eq!(
        partition_of(&pool, old_done).await,
        "hookd.delivery_history_before_0014"
    );
    assert_eq!(
        partition_of(&pool, dead_today).await,
        format!("hookd.delivery_history_{today}")
    );
    assert_eq!(count(&pool, "delivery_attempts").await, 3);
    assert!(exists(&pool, "dead_letters", "delivery_id", dead_today).await);
    for day in 0..=hookd::db::retention::HISTORY_DAYS_AHEAD {
        let d = (Utc::now() + TimeDelta::days(i64::from(day))).format("%Y%m%d");
        assert!(relation_exists(&pool, &format!("hookd.delivery_history_{d}")).await);
    }
    let claimed = deliveries::claim(&pool, &claim_req()).await.unwrap();
    assert_eq!(claimed.iter().map(|c| c.id).collect::<Vec<_>>(), vec![open]);
}

/// A replay that waited for the lock of a delivery which another transaction meanwhile
/// moved out of the queue (it succeeded) is run again and replays it where it now is,
/// instead of failing with "tuple to be locked was already moved to another partition"
/// (SQLSTATE 40001).
#[sqlx::test]
async fn a_replay_that_waited_for_a_row_moved_meanwhile_runs_again(pool: PgPool) {
    let e = ep(&pool, "hist").await;
    let (_, d) = pair(&pool, e, "hist", "failed", 0, 0).await;
    let mut mover = pool.begin().await.unwrap();
    sqlx::query("UPDATE hookd.deliveries SET status = 'succeeded' WHERE id = $1")
        .bind(d)
        .execute(&mut *mover)
        .await
        .unwrap();
    let replay = tokio::spawn({
        let pool = pool.clone();
        async move { deliveries::replay(&pool, d, Default::default()).await }
    });
    // the replay is waiting for the mover's row lock
    let waiting = wait_until(Duration::from_secs(5), || async {
        sqlx::query_scalar::<_, bool>(
            "SELECT EXISTS (SELECT 1 FROM pg_stat_activity
                            WHERE wait_event_type = 'Lock' AND query LIKE '%WITH target AS%')",
        )
        .fetch_one(&pool)
        .await
        .unwrap()
    })
    .await;
    assert!(waiting, "the replay waits for the row lock");
    mover.commit().await.unwrap();
    let outcome = replay.await.unwrap().unwrap();
    assert_eq!(outcome, deliveries::ReplayOutcome::Replayed);
    assert_eq!(partition_of(&pool, d).await, "hookd.delivery_queue");
}

/// Browser sessions are made on every sign-in: the pruner deletes those that ended
/// (expired or revoked) more than a day ago, never a token that is not a session.
#[sqlx::test]
async fn ended_browser_sessions_are_deleted_a_day_later(pool: PgPool) {
    let token = |id: Uuid, parent: Option<Uuid>, expires: &str, revoked: &str| {
        let pool = pool.clone();
        let sql = format!(
            "INSERT INTO hookd.api_tokens (id, token_hash, prefix, tenant, scopes, expires_at, revoked_at, parent_id)
             VALUES ($1, sha256($1::text::bytea), 'hookd_x', 'ret', ARRAY['read'], {expires}, {revoked}, $2)"
        );
        async move {
            sqlx::query(sqlx::AssertSqlSafe(sql))
                .bind(id)
                .bind(parent)
                .execute(&pool)
                .await
                .unwrap();
        }
    };
    let parent = Uuid::now_v7();
    token(parent, None, "now() - interval '3 days'", "NULL").await;
    let (old_expiry, old_revoke, live, recent) = (
        Uuid::now_v7(),
        Uuid::now_v7(),
        Uuid::now_v7(),
        Uuid::now_v7(),
    );
    token(
        old_expiry,
        Some(parent),
        "now() - interval '2 days'",
        "NULL",
    )
    .await;
    token(
        old_revoke,
        Some(parent),
        "now() + interval '1 hour'",
        "now() - interval '2 days'",
    )
    .await;
    token(live, Some(parent), "now() + interval '5 hours'", "NULL").await;
    token(recent, Some(parent), "now() - interval '1 hour'", "NULL").await;

    let c = prune(&pool, &policy(30, "", 1), &Metrics::new()).await;
    assert_eq!(c.sessions, 2, "{c:?}");
    for (id, kept) in [
        (parent, true),
        (old_expiry, false),
        (old_revoke, false),
        (live, true),
        (recent, true),
    ] {
        assert_eq!(exists(&pool, "api_tokens", "id", id).await, kept, "{id}");
    }
}
