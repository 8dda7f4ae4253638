//! Acceptance tests of the dispatcher (issue 4): leases, fencing, the claim plan, signing,
//! retries, 410, dead letters, replay, the circuit breaker, head-of-line isolation,
//! wake-ups, graceful stop and outbound refusal. Real Postgres, real HTTP on 127.0.0.1.

use crate::common;

use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::http::{HeaderMap, StatusCode};
use chrono::{DateTime, Utc};
use common::*;
use hookd::db::deliveries::{self, ClaimRequest, ClaimedDelivery, Completion, DeliveryOutcome};
use hookd::db::endpoints::{self, CircuitInput};
use hookd::dispatch::{Stage, StageHook};
use hookd::domain::{
    CircuitState, DeliveryOrder, DeliveryStatus, EndpointState, ErrorClass, ManagedBy, OnDeadLetter,
};
use serde_json::json;
use sqlx::PgPool;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::DropGuard;
use uuid::Uuid;

// ---- helpers local to this binary ----

/// The test database with 12 connections (the default test pool has 5), so concurrent
/// workers really run concurrently.
async fn wide_pool(opts: PgPoolOptions, connect: PgConnectOptions) -> PgPool {
    opts.max_connections(12)
        .connect_with(connect)
        .await
        .unwrap()
}

/// Enqueues `n` events for `tenant` through the SQL outbox function (one statement);
/// each fans out to every matching endpoint of the tenant.
async fn enqueue_sql(pool: &PgPool, tenant: &str, n: i32) -> Vec<Uuid> {
    sqlx::query_scalar(
        "SELECT hookd.enqueue($1, 'test.event', '{\"n\":' || g || '}') FROM generate_series(1, $2) g",
    )
    .bind(tenant)
    .bind(n)
    .fetch_all(pool)
    .await
    .unwrap()
}

fn outcome(c: &ClaimedDelivery, status: &'static str) -> Completion {
    Completion {
        delivery_id: c.id,
        claim_token: c.claim_token,
        attempt: c.attempt_seq,
        status: match status {
            "succeeded" => DeliveryOutcome::Succeeded,
            "failed" => DeliveryOutcome::Retry,
            "dead" => DeliveryOutcome::Dead,
            other => panic!("no outcome {other}"),
        },
        retry_delay_ms: (status == "failed").then_some(0),
        started_at: Utc::now(),
        duration_ms: 1,
        status_code: Some(if status == "succeeded" { 200 } else { 500 }),
        error_class: (status != "succeeded").then_some(ErrorClass::HttpStatus),
        error: (status != "succeeded").then(|| "HTTP 500".to_string()),
        response_snippet: None,
        dead_reason: (status == "dead").then(|| "test: exhausted".to_string()),
    }
}

async fn complete(pool: &PgPool, _worker: Uuid, batch: &[Completion]) -> Vec<Uuid> {
    let mut conn = pool.acquire().await.unwrap();
    deliveries::complete(&mut conn, batch).await.unwrap()
}

async fn endpoint_row(pool: &PgPool, id: Uuid) -> endpoints::EndpointRow {
    endpoints::get(pool, id, None).await.unwrap().unwrap()
}

async fn attempt_rows(pool: &PgPool, id: Uuid) -> Vec<hookd::db::attempts::AttemptRow> {
    hookd::db::attempts::for_delivery(pool, id).await.unwrap()
}

async fn wait_status(pool: &PgPool, id: Uuid, status: &str, timeout: Duration) -> bool {
    wait_until(timeout, || async {
        delivery_status(pool, id).await.0 == status
    })
    .await
}

fn opts(tenant: &str, url: String) -> EndpointOpts {
    EndpointOpts {
        tenant: Some(tenant.into()),
        url,
        ..Default::default()
    }
}

/// A receiver that records every request's full header map and body (the kit's
/// `Receiver` keeps only selected headers), answering 200.
struct Tap {
    addr: SocketAddr,
    got: Arc<Mutex<Vec<(HeaderMap, Bytes)>>>,
    _stop: DropGuard,
}

impl Tap {
    async fn start() -> Tap {
        let got: Arc<Mutex<Vec<(HeaderMap, Bytes)>>> = Arc::default();
        let sink = got.clone();
        let app = axum::Router::new().fallback(axum::routing::post(
            move |headers: HeaderMap, body: Bytes| {
                let sink = sink.clone();
                async move {
                    sink.lock().unwrap().push((headers, body));
                    "ok"
                }
            },
        ));
        let (addr, stop) = serve_local(app).await;
        Tap {
            addr,
            got,
            _stop: stop.drop_guard(),
        }
    }
    fn url(&self) -> String {
        format!("http://{}/tap", self.addr)
    }
    fn count(&self) -> usize {
        self.got.lock().unwrap().len()
    }
    fn all(&self) -> Vec<(HeaderMap, Bytes)> {
        self.got.lock().unwrap().clone()
    }
}

fn header<'a>(h: &'a HeaderMap, name: &str) -> &'a str {
    h.get(name)
        .unwrap_or_else(|| panic!("missing header {name}"))
        .to_str()
        .unwrap()
}

// ---- leases and fencing ----

/// 8 concurrent claim loops over 2000 due deliveries of 4 endpoints: every delivery is
/// claimed exactly once (attempts = 1, one attempt row each), and no id is ever held by
/// two workers at once (SKIP LOCKED leases are exclusive).
#[sqlx::test]
async fn concurrent_claimers_never_hold_the_same_row(
    pool_opts: PgPoolOptions,
    connect: PgConnectOptions,
) {
    init();
    let pool = wide_pool(pool_opts, connect).await;
    for _ in 0..4 {
        endpoint(&pool, opts("claimers", "http://127.0.0.1:9/x".into())).await;
    }
    enqueue_sql(&pool, "claimers", 500).await;
    let total: i64 = sqlx::query_scalar("SELECT count(*) FROM hookd.deliveries")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(total, 2000);

    let held: Arc<Mutex<HashMap<Uuid, Uuid>>> = Arc::default();
    let overlaps: Arc<Mutex<Vec<(Uuid, Uuid, Uuid)>>> = Arc::default();
    let claims: Arc<Mutex<Vec<(Uuid, Uuid)>>> = Arc::default();
    let mut workers = tokio::task::JoinSet::new();
    for _ in 0..8 {
        let (pool, held, overlaps, claims) =
            (pool.clone(), held.clone(), overlaps.clone(), claims.clone());
        workers.spawn(async move {
            let me = Uuid::now_v7();
            loop {
                let rows = deliveries::claim(&pool, &claim_req(me, 25, None))
                    .await
                    .unwrap();
                if rows.is_empty() {
                    return;
                }
                {
                    let mut h = held.lock().unwrap();
                    let mut c = claims.lock().unwrap();
                    for r in &rows {
                        assert_eq!(r.attempts, 1, "a fresh row's first claim is attempt 1");
                        if let Some(other) = h.insert(r.id, me) {
                            overlaps.lock().unwrap().push((r.id, other, me));
                        }
                        c.push((r.id, me));
                    }
                }
                let batch: Vec<Completion> = rows.iter().map(|r| outcome(r, "succeeded")).collect();
                let done = complete(&pool, me, &batch).await;
                assert_eq!(done.len(), rows.len(), "a held lease must pass the fence");
                let mut h = held.lock().unwrap();
                for r in &rows {
                    h.remove(&r.id);
                }
            }
        });
    }
    while let Some(r) = workers.join_next().await {
        r.unwrap();
    }
    let claims = claims.lock().unwrap().clone();
    let unique: HashSet<Uuid> = claims.iter().map(|c| c.0).collect();
    let mut per_worker: HashMap<Uuid, usize> = HashMap::new();
    for (_, w) in &claims {
        *per_worker.entry(*w).or_default() += 1;
    }
    println!(
        "claims: {} ({} unique), per worker: {:?}",
        claims.len(),
        unique.len(),
        per_worker.values().collect::<Vec<_>>()
    );
    assert!(
        overlaps.lock().unwrap().is_empty(),
        "ids held by two workers at once: {:?}",
        overlaps.lock().unwrap()
    );
    assert_eq!(claims.len(), 2000, "every delivery claimed exactly once");
    assert_eq!(unique.len(), 2000);
    let (succeeded, attempt_rows, distinct): (i64, i64, i64) = sqlx::query_as(
        "SELECT (SELECT count(*) FROM hookd.deliveries WHERE status = 'succeeded' AND attempts = 1),
                (SELECT count(*) FROM hookd.delivery_attempts),
                (SELECT count(DISTINCT delivery_id) FROM hookd.delivery_attempts)",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!((succeeded, attempt_rows, distinct), (2000, 2000, 2000));
}

/// A lease that lapses is reclaimed by another worker (attempt 2), and the first worker's
/// late outcome is fenced off: no ids returned, no attempt row, status unchanged. The new
/// holder's outcome is written.
#[sqlx::test]
async fn lapsed_lease_is_reclaimed_and_stale_outcome_is_fenced(pool: PgPool) {
    init();
    endpoint(&pool, opts("lease", "http://127.0.0.1:9/x".into())).await;
    enqueue_sql(&pool, "lease", 1).await;
    let (a, b) = (Uuid::now_v7(), Uuid::now_v7());
    let got_a = deliveries::claim(&pool, &claim_req(a, 10, None))
        .await
        .unwrap();
    assert_eq!(got_a.len(), 1);
    let row_a = &got_a[0];
    assert_eq!(row_a.attempts, 1);

    // Before the lease lapses nobody else gets it.
    let early = Utc::now() + chrono::Duration::seconds(20);
    assert!(
        deliveries::claim(&pool, &claim_req(b, 10, Some(early)))
            .await
            .unwrap()
            .is_empty()
    );
    // After it lapses, B takes it over.
    let late = row_a.lease_until + chrono::Duration::seconds(1);
    let got_b = deliveries::claim(&pool, &claim_req(b, 10, Some(late)))
        .await
        .unwrap();
    assert_eq!(got_b.len(), 1);
    let row_b = &got_b[0];
    assert_eq!(row_b.id, row_a.id);
    assert_eq!(row_b.attempts, 2);

    // A's late outcome: fenced.
    let stale = complete(&pool, a, &[outcome(row_a, "succeeded")]).await;
    assert!(stale.is_empty(), "stale worker's outcome must be fenced");
    assert!(attempt_rows(&pool, row_a.id).await.is_empty());
    let (status, attempts) = delivery_status(&pool, row_a.id).await;
    assert_eq!((status.as_str(), attempts), ("in_progress", 2));
    let locked_by: Option<Uuid> =
        sqlx::query_scalar("SELECT locked_by FROM hookd.deliveries WHERE id = $1")
            .bind(row_a.id)
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(locked_by, Some(b));
    // A dead outcome from A is fenced too (no dead letter).
    assert!(
        complete(&pool, a, &[outcome(row_a, "dead")])
            .await
            .is_empty()
    );
    let dead: i64 = sqlx::query_scalar("SELECT count(*) FROM hookd.dead_letters")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(dead, 0);

    // B's outcome passes.
    let done = complete(&pool, b, &[outcome(row_b, "succeeded")]).await;
    assert_eq!(done, vec![row_b.id]);
    assert_eq!(
        delivery_status(&pool, row_b.id).await,
        ("succeeded".to_string(), 2)
    );
    let log = attempt_rows(&pool, row_b.id).await;
    assert_eq!(log.len(), 1);
    assert_eq!(log[0].attempt, 2);
}

/// With 50k due rows over three endpoints and 50k terminal rows, the claim statement is
/// an index range scan of `deliveries_claimable` and never a sequential scan of
/// deliveries (the plan is taken from the very SQL text `claim` runs).
#[sqlx::test]
async fn claim_plan_is_an_index_range_scan(pool: PgPool) {
    init();
    let mut eps = Vec::new();
    for _ in 0..3 {
        eps.push(endpoint(&pool, opts("plan", "http://127.0.0.1:9/x".into())).await);
    }
    bulk_events(&pool, "plan", 100_000).await;
    sqlx::query(
        "INSERT INTO hookd.deliveries (id, event_id, endpoint_id, tenant, status, attempts, completed_at)
         SELECT hookd.uuid_v7(), e.id, ($1::uuid[])[1 + (e.rn % 3)], 'plan',
                CASE WHEN e.rn <= 50000 THEN 'pending' ELSE 'succeeded' END,
                CASE WHEN e.rn <= 50000 THEN 0 ELSE 1 END,
                CASE WHEN e.rn <= 50000 THEN NULL ELSE now() END
         FROM (SELECT id, row_number() OVER () AS rn FROM hookd.events) e",
    )
    .bind(&eps)
    .execute(&pool)
    .await
    .unwrap();
    sqlx::query("ANALYZE hookd.deliveries, hookd.events, hookd.endpoints")
        .execute(&pool)
        .await
        .unwrap();
    let due: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM hookd.deliveries WHERE status = 'pending' AND visible_at <= now()",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(due, 50000);

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
    println!("{text}");
    assert!(
        plan.iter()
            .any(|l| l.contains("Index Scan using deliveries_claimable on delivery_queue")),
        "claim must range-scan deliveries_claimable:\n{text}"
    );
    assert!(
        plan.iter()
            .any(|l| l.contains("Index Cond: ((endpoint_id = "))
    );
    assert!(
        !plan.iter().any(|l| l.contains("Seq Scan on deliver")),
        "claim must never scan deliveries sequentially:\n{text}"
    );
    // The claim took its full quota (28 + 32 + 32 = 92) without touching the backlog.
    assert!(
        plan.iter()
            .any(|l| l.starts_with("Update on deliveries") && l.contains("rows=92 ")),
        "expected 92 claimed rows:\n{text}"
    );
    // explain_claim rolled back: nothing is leased.
    let leased: i64 =
        sqlx::query_scalar("SELECT count(*) FROM hookd.deliveries WHERE status = 'in_progress'")
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(leased, 0);
}

/// The statements that fence on a claim token (an outcome batch, a lease renewal, a
/// release) find each row by primary key, whatever the statistics say. Stats taken when
/// `deliveries_claimable` held a handful of rows made the planner scan that whole partial
/// index once per outcome instead (its predicate is implied by `status = 'in_progress'`):
/// 1.4 s to 22 s per batch once a backlog built up, 13 minutes into a sustained run.
#[sqlx::test]
async fn fenced_writes_probe_the_primary_key_whatever_the_statistics(pool: PgPool) {
    init();
    let ep = endpoint(&pool, opts("fence-plan", "http://127.0.0.1:9/x".into())).await;
    bulk_events(&pool, "fence-plan", 50_000).await;
    // 50k terminal rows and 3 in flight, then statistics that saw the claim index nearly
    // empty (as an autovacuum between two bursts does)
    sqlx::query(
        "INSERT INTO hookd.deliveries (id, event_id, endpoint_id, tenant, status, attempts,
                                       completed_at, claim_token)
         SELECT hookd.uuid_v7(), e.id, $1, 'fence-plan',
                CASE WHEN e.rn <= 3 THEN 'in_progress' ELSE 'succeeded' END, 1,
                CASE WHEN e.rn <= 3 THEN NULL ELSE now() END,
                CASE WHEN e.rn <= 3 THEN gen_random_uuid() END
         FROM (SELECT id, row_number() OVER () AS rn FROM hookd.events) e",
    )
    .bind(ep)
    .execute(&pool)
    .await
    .unwrap();
    sqlx::query("VACUUM ANALYZE hookd.deliveries")
        .execute(&pool)
        .await
        .unwrap();
    let leases: Vec<(Uuid, Uuid)> = sqlx::query_as(
        "SELECT id, claim_token FROM hookd.deliveries WHERE status = 'in_progress' ORDER BY id",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    assert_eq!(leases.len(), 3);

    let plans = deliveries::explain_fenced_writes(&pool, &leases)
        .await
        .unwrap();
    assert_eq!(plans.len(), 3, "one plan per statement");
    for (name, plan) in &plans {
        let text = plan.join("\n");
        assert!(
            plan.iter()
                .any(|l| l.contains("Index Scan using delivery_queue_pkey on delivery_queue")),
            "{name} must probe the queue partition's primary key:\n{text}"
        );
        assert!(
            !plan.iter().any(|l| l.contains("deliveries_claimable")),
            "{name} must not scan deliveries_claimable:\n{text}"
        );
        assert!(
            !plan.iter().any(|l| l.contains("Seq Scan on deliver")),
            "{name} must not scan deliveries sequentially:\n{text}"
        );
    }
    // an outcome's row is locked by its update alone: a lock of its own before the
    // update wrote a lock record per delivery to the log (docs/benchmarks.md, issue 32)
    let (_, complete) = &plans[0];
    assert!(
        !complete.iter().any(|l| l.contains("LockRows")),
        "{}",
        complete.join("\n")
    );
}

// ---- signing and headers ----

/// Every delivery verifies with the official `standardwebhooks` crate; headers carry
/// webhook-id = idempotency-key = delivery id, a current webhook-timestamp and
/// content-type application/json. After a rotation with grace (through the sync core),
/// each delivery carries two `v1,` entries, one per secret, verifying under each.
#[sqlx::test]
async fn deliveries_are_signed_and_rotation_signs_with_both_secrets(pool: PgPool) {
    let rx = Receiver::start(&[SECRET_A, SECRET_B]).await;
    let tap = Tap::start().await;
    let rx_opts = EndpointOpts {
        name: "signed-rx".into(),
        tenant: Some("signing".into()),
        url: rx.url("/hook"),
        secret: SECRET_A.into(),
        grace_seconds: Some(3600),
        ..Default::default()
    };
    let tap_opts = EndpointOpts {
        name: "signed-tap".into(),
        url: tap.url(),
        ..rx_opts.clone()
    };
    endpoint(&pool, rx_opts.clone()).await;
    endpoint(&pool, tap_opts.clone()).await;
    let api = TestApi::start(&pool).await;
    let d = TestDispatcher::start(&pool, dispatch_settings()).await;

    let mut delivery_ids = HashSet::new();
    for i in 0..3 {
        let (_, ids) = api
            .enqueue("signing", "order.created", &format!(r#"{{"i": {i}}}"#))
            .await;
        assert_eq!(ids.len(), 2);
        delivery_ids.extend(ids.iter().map(Uuid::to_string));
    }
    assert!(
        wait_until(Duration::from_secs(10), || async {
            rx.count() == 3 && tap.count() == 3
        })
        .await
    );
    for r in rx.all() {
        assert_eq!(r.verified_by, vec![true, false], "signed with A only");
        assert_eq!(r.signature.split(' ').count(), 1);
        assert!(r.signature.starts_with("v1,"));
        assert_eq!(r.idempotency_key.as_deref(), Some(r.webhook_id.as_str()));
        assert_eq!(r.event_type.as_deref(), Some("order.created"));
        assert!(delivery_ids.contains(&r.webhook_id));
    }
    let wa = standardwebhooks::Webhook::new(SECRET_A).unwrap();
    let wb = standardwebhooks::Webhook::new(SECRET_B).unwrap();
    for (h, body) in tap.all() {
        let id = header(&h, "webhook-id");
        assert!(delivery_ids.contains(id), "webhook-id is a delivery id");
        assert_eq!(header(&h, "idempotency-key"), id);
        assert_eq!(header(&h, "content-type"), "application/json");
        assert!(header(&h, "user-agent").starts_with("hookd/"));
        let ts: i64 = header(&h, "webhook-timestamp").parse().unwrap();
        assert!((Utc::now().timestamp() - ts).abs() < 60);
        assert_eq!(
            header(&h, "webhook-signature"),
            wa.sign(id, ts, &body).unwrap()
        );
        wa.verify(&body, &h).unwrap();
    }
    let by_id: HashMap<String, String> = tap
        .all()
        .iter()
        .map(|(h, _)| (header(h, "webhook-id").to_string(), String::new()))
        .collect();
    assert_eq!(by_id.len(), 3, "three distinct deliveries to the tap");

    // Rotate to B with grace: both endpoints now sign with B and A.
    endpoint(
        &pool,
        EndpointOpts {
            secret: SECRET_B.into(),
            ..rx_opts
        },
    )
    .await;
    endpoint(
        &pool,
        EndpointOpts {
            secret: SECRET_B.into(),
            ..tap_opts
        },
    )
    .await;
    for i in 3..6 {
        api.enqueue("signing", "order.created", &format!(r#"{{"i": {i}}}"#))
            .await;
    }
    assert!(
        wait_until(Duration::from_secs(10), || async {
            rx.count() == 6 && tap.count() == 6
        })
        .await
    );
    for r in &rx.all()[3..] {
        assert_eq!(
            r.verified_by,
            vec![true, true],
            "verifies under each secret"
        );
        let entries: Vec<&str> = r.signature.split(' ').collect();
        assert_eq!(entries.len(), 2, "{}", r.signature);
        assert!(entries.iter().all(|e| e.starts_with("v1,")));
    }
    for (h, body) in &tap.all()[3..] {
        let id = header(h, "webhook-id");
        let ts: i64 = header(h, "webhook-timestamp").parse().unwrap();
        let entries: HashSet<&str> = header(h, "webhook-signature").split(' ').collect();
        let expected: HashSet<String> = [
            wa.sign(id, ts, body).unwrap(),
            wb.sign(id, ts, body).unwrap(),
        ]
        .into();
        assert_eq!(
            entries,
            expected.iter().map(String::as_str).collect::<HashSet<_>>()
        );
    }
    d.stop().await;
}

// ---- retries, Retry-After, exhaustion, dead letters ----

/// A 500 moves the delivery to `failed`, due after schedule[0] (30 s, no jitter), with an
/// attempt row: status 500, class http_status, response snippet capped at
/// response_snippet_bytes (1 byte of "ok").
#[sqlx::test]
async fn http_500_schedules_a_retry_and_logs_the_attempt(pool: PgPool) {
    let rx = Receiver::start(&[SECRET_A]).await;
    rx.set(Behavior {
        status: 500,
        ..Default::default()
    });
    endpoint(&pool, opts("retry", rx.url("/hook"))).await;
    let api = TestApi::start(&pool).await;
    let d = TestDispatcher::start(
        &pool,
        hookd::config::DispatchSettings {
            retry_schedule: "30,60".into(),
            response_snippet_bytes: 1,
            ..dispatch_settings()
        },
    )
    .await;
    let (_, ids) = api.enqueue("retry", "a.b", "{}").await;
    assert!(wait_status(&pool, ids[0], "failed", Duration::from_secs(10)).await);
    let row = deliveries::get(&pool, ids[0], hookd::db::Audience::default())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(row.attempts, 1);
    assert_eq!(row.last_status_code, Some(500));
    let log = attempt_rows(&pool, ids[0]).await;
    assert_eq!(log.len(), 1);
    let a = &log[0];
    assert_eq!(a.attempt, 1);
    assert_eq!(a.status_code, Some(500));
    assert_eq!(a.error_class, Some(ErrorClass::HttpStatus));
    assert_eq!(a.response_snippet.as_deref(), Some("o"), "capped at 1 byte");
    let delay = (row.visible_at - a.started_at).as_seconds_f64();
    assert!(
        (30.0..31.0).contains(&delay),
        "retry due {delay}s after the attempt, expected 30 s"
    );
    assert_eq!(rx.count(), 1);
    d.stop().await;
}

/// Retry-After postpones the retry (120 s instead of the 30 s schedule), is capped at
/// max_retry_after (600 s), and never hurries the schedule (5 s → still 30 s).
#[sqlx::test]
async fn retry_after_is_honoured_within_bounds(pool: PgPool) {
    let mut rxs = Vec::new();
    let mut ids = Vec::new();
    let api = TestApi::start(&pool).await;
    for (i, ra) in ["120", "100000", "5"].iter().enumerate() {
        let rx = Receiver::start(&[SECRET_A]).await;
        rx.set(Behavior {
            status: 503,
            retry_after: Some(ra.to_string()),
            ..Default::default()
        });
        let tenant = format!("ra{i}");
        endpoint(&pool, opts(&tenant, rx.url("/hook"))).await;
        rxs.push(rx);
        ids.push(api.enqueue(&tenant, "a.b", "{}").await.1[0]);
    }
    let d = TestDispatcher::start(
        &pool,
        hookd::config::DispatchSettings {
            retry_schedule: "30".into(),
            max_retry_after_secs: 600,
            ..dispatch_settings()
        },
    )
    .await;
    for (id, expected) in ids.iter().zip([120.0, 600.0, 30.0]) {
        assert!(wait_status(&pool, *id, "failed", Duration::from_secs(10)).await);
        let row = deliveries::get(&pool, *id, hookd::db::Audience::default())
            .await
            .unwrap()
            .unwrap();
        let a = &attempt_rows(&pool, *id).await[0];
        assert_eq!(a.status_code, Some(503));
        let delay = (row.visible_at - a.started_at).as_seconds_f64();
        println!("Retry-After case: retry after {delay:.3}s (expected {expected})");
        assert!(
            (expected..expected + 1.0).contains(&delay),
            "retry after {delay}s, expected {expected}s"
        );
    }
    d.stop().await;
}

/// With the endpoint's schedule [1] and maxAttempts 2, two failures make a delivery
/// `dead` with a dead-letter row naming the attempts; GET /v1/dead-letters lists them with
/// keyset pagination (limit=1: a nextCursor, the second page holds the other one, the
/// third is empty without a cursor).
#[sqlx::test]
async fn exhaustion_dead_letters_with_keyset_pagination(pool: PgPool) {
    let rx = Receiver::start(&[SECRET_A]).await;
    rx.set(Behavior {
        status: 500,
        ..Default::default()
    });
    let ep = endpoint(
        &pool,
        EndpointOpts {
            retry_schedule: Some(vec![1]),
            max_attempts: Some(2),
            ..opts("exhaust", rx.url("/hook"))
        },
    )
    .await;
    let api = TestApi::start(&pool).await;
    let d = TestDispatcher::start(&pool, dispatch_settings()).await;
    let a = api.enqueue("exhaust", "a.b", r#"{"a":1}"#).await.1[0];
    let b = api.enqueue("exhaust", "a.b", r#"{"b":1}"#).await.1[0];
    for id in [a, b] {
        assert!(wait_status(&pool, id, "dead", Duration::from_secs(15)).await);
        assert_eq!(delivery_status(&pool, id).await.1, 2);
        let log = attempt_rows(&pool, id).await;
        assert_eq!(
            log.iter().map(|l| l.attempt).collect::<Vec<_>>(),
            vec![1, 2]
        );
        assert!(log.iter().all(|l| l.status_code == Some(500)));
        let (reason, attempts): (String, i32) = sqlx::query_as(
            "SELECT reason, attempts FROM hookd.dead_letters WHERE delivery_id = $1",
        )
        .bind(id)
        .fetch_one(&pool)
        .await
        .unwrap();
        assert!(
            reason.contains("exhausted 2 attempts") && reason.contains("HTTP 500"),
            "{reason}"
        );
        assert_eq!(attempts, 2);
    }
    assert_eq!(rx.count(), 4);

    let (s, p1) = api.get_as("exhaust", "/v1/dead-letters?limit=1").await;
    assert_eq!(s, StatusCode::OK, "{p1}");
    let items = p1["items"].as_array().unwrap();
    assert_eq!(items.len(), 1);
    assert_eq!(items[0]["endpointId"], json!(ep.to_string()));
    assert!(
        items[0]["reason"]
            .as_str()
            .unwrap()
            .contains("exhausted 2 attempts")
    );
    let cursor = p1["nextCursor"]
        .as_str()
        .expect("nextCursor on a full page");
    let (s, p2) = api
        .get_as(
            "exhaust",
            &format!("/v1/dead-letters?limit=1&cursor={cursor}"),
        )
        .await;
    assert_eq!(s, StatusCode::OK, "{p2}");
    let items2 = p2["items"].as_array().unwrap();
    assert_eq!(items2.len(), 1);
    let seen: HashSet<String> = [&items[0], &items2[0]]
        .iter()
        .map(|i| i["deliveryId"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(seen, HashSet::from([a.to_string(), b.to_string()]));
    let cursor2 = p2["nextCursor"].as_str().unwrap();
    let (_, p3) = api
        .get_as(
            "exhaust",
            &format!("/v1/dead-letters?limit=1&cursor={cursor2}"),
        )
        .await;
    assert_eq!(p3["items"].as_array().unwrap().len(), 0);
    assert!(p3["nextCursor"].is_null());
    // the endpoint filter
    let (_, all) = api
        .get_as(
            "exhaust",
            &format!("/v1/dead-letters?endpointId={ep}&limit=10"),
        )
        .await;
    assert_eq!(all["items"].as_array().unwrap().len(), 2);
    d.stop().await;
}

/// 410 Gone disables the endpoint with a reason; its remaining deliveries are held (not
/// dead, not dropped) and are not claimed, while another endpoint's rows still are.
#[sqlx::test]
async fn gone_disables_the_endpoint_and_holds_its_deliveries(pool: PgPool) {
    let rx = Receiver::start(&[SECRET_A]).await;
    rx.set(Behavior {
        status: 410,
        ..Default::default()
    });
    let gone = endpoint(
        &pool,
        EndpointOpts {
            max_in_flight: Some(1),
            ..opts("gone", rx.url("/hook"))
        },
    )
    .await;
    endpoint(&pool, opts("alive", "http://127.0.0.1:9/x".into())).await;
    let api = TestApi::start(&pool).await;
    let mut ids = Vec::new();
    for i in 0..3 {
        ids.push(
            api.enqueue("gone", "a.b", &format!("{{\"i\":{i}}}"))
                .await
                .1[0],
        );
    }
    let d = TestDispatcher::start(&pool, dispatch_settings()).await;
    assert!(
        wait_until(Duration::from_secs(10), || async {
            endpoint_row(&pool, gone).await.state == EndpointState::Disabled
        })
        .await
    );
    d.stop().await;
    let ep = endpoint_row(&pool, gone).await;
    assert!(
        ep.state_reason.as_deref().unwrap_or("").contains("410"),
        "{:?}",
        ep.state_reason
    );
    let got = rx.count();
    assert!((1..=3).contains(&got), "{got}");
    for id in &ids {
        let (status, _) = delivery_status(&pool, *id).await;
        assert!(
            status == "pending" || status == "failed",
            "held, not {status}"
        );
    }
    let a = attempt_rows(&pool, ids[0]).await;
    assert_eq!(a[0].status_code, Some(410));
    assert_eq!(a[0].error_class, Some(ErrorClass::Gone));

    // Nothing of the disabled endpoint is claimable, even far in the future; another
    // endpoint's row is.
    let alive = api.enqueue("alive", "a.b", "{}").await.1[0];
    let later = Utc::now() + chrono::Duration::days(2);
    let claimed = deliveries::claim(&pool, &claim_req(Uuid::now_v7(), 100, Some(later)))
        .await
        .unwrap();
    assert_eq!(
        claimed.iter().map(|c| c.id).collect::<Vec<_>>(),
        vec![alive]
    );
    assert_eq!(
        rx.count(),
        got,
        "nothing more sent to the disabled endpoint"
    );
    // A disabled endpoint gets no new deliveries; its held ones are all still there.
    let (_, new_ids) = api.enqueue("gone", "a.b", "{}").await;
    assert!(new_ids.is_empty());
    let held: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM hookd.deliveries WHERE endpoint_id = $1 AND status IN ('pending', 'failed')",
    )
    .bind(gone)
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(held, 3);
}

// ---- replay ----

/// Replaying a dead delivery: 202, pending, attempts 0, same id, dead letter gone, and
/// it is delivered again (the receiver sees the same webhook-id twice); replaying the
/// succeeded delivery resends it (three times). GET /v1/deliveries/{id} shows the
/// attempt log across replays.
#[sqlx::test]
async fn replay_of_dead_and_succeeded_deliveries_resends_the_same_id(pool: PgPool) {
    let rx = Receiver::start(&[SECRET_A]).await;
    rx.set(Behavior {
        status: 500,
        ..Default::default()
    });
    endpoint(
        &pool,
        EndpointOpts {
            max_attempts: Some(1),
            ..opts("replay", rx.url("/hook"))
        },
    )
    .await;
    let api = TestApi::start(&pool).await;
    let d = TestDispatcher::start(&pool, dispatch_settings()).await;
    let id = api.enqueue("replay", "a.b", "{}").await.1[0];
    assert!(wait_status(&pool, id, "dead", Duration::from_secs(10)).await);
    d.stop().await;
    assert_eq!(rx.count(), 1);
    rx.set(Behavior::default());

    let (s, v) = api
        .post_as("replay", &format!("/v1/deliveries/{id}/replay"), "")
        .await;
    assert_eq!(s, StatusCode::ACCEPTED, "{v}");
    assert_eq!(v["deliveryId"], json!(id.to_string()));
    assert_eq!(v["status"], json!("pending"));
    let row = deliveries::get(&pool, id, hookd::db::Audience::default())
        .await
        .unwrap()
        .unwrap();
    assert_eq!((row.status.as_str(), row.attempts), ("pending", 0));
    assert!(row.visible_at <= Utc::now());
    assert!(row.completed_at.is_none());
    let dl: i64 =
        sqlx::query_scalar("SELECT count(*) FROM hookd.dead_letters WHERE delivery_id = $1")
            .bind(id)
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(dl, 0, "dead-letter row removed by replay");

    let d = TestDispatcher::start(&pool, dispatch_settings()).await;
    assert!(wait_status(&pool, id, "succeeded", Duration::from_secs(10)).await);
    assert_eq!(rx.ids(), vec![id.to_string(), id.to_string()]);

    let (s, _) = api
        .post_as("replay", &format!("/v1/deliveries/{id}/replay"), "")
        .await;
    assert_eq!(s, StatusCode::ACCEPTED);
    assert!(wait_until(Duration::from_secs(10), || async { rx.count() == 3 }).await);
    assert!(wait_status(&pool, id, "succeeded", Duration::from_secs(10)).await);
    assert!(rx.ids().iter().all(|w| *w == id.to_string()));
    d.stop().await;

    let (s, v) = api.get_as("replay", &format!("/v1/deliveries/{id}")).await;
    assert_eq!(s, StatusCode::OK, "{v}");
    assert_eq!(v["status"], json!("succeeded"));
    assert_eq!(v["attemptCount"], json!(1));
    let log = v["attempts"].as_array().expect("attempts is the log");
    assert_eq!(
        log.iter()
            .map(|a| a["statusCode"].as_i64().unwrap())
            .collect::<Vec<_>>(),
        vec![500, 200, 200]
    );
    assert_eq!(log[0]["errorClass"], json!("http_status"));
}

/// Replay is refused with 409 delivery_leased while a worker holds the lease (nothing
/// changes), 404 for an unknown id, and accepted once the outcome is written.
#[sqlx::test]
async fn replay_refuses_leased_and_unknown_deliveries(pool: PgPool) {
    init();
    endpoint(&pool, opts("leased", "http://127.0.0.1:9/x".into())).await;
    let api = TestApi::start(&pool).await;
    let id = api.enqueue("leased", "a.b", "{}").await.1[0];
    let worker = Uuid::now_v7();
    let claimed = deliveries::claim(&pool, &claim_req(worker, 10, None))
        .await
        .unwrap();
    assert_eq!(claimed.len(), 1);

    let (s, v) = api
        .post_as("leased", &format!("/v1/deliveries/{id}/replay"), "")
        .await;
    assert_eq!(s, StatusCode::CONFLICT, "{v}");
    assert_eq!(v["error"]["code"], json!("delivery_leased"));
    let (status, attempts) = delivery_status(&pool, id).await;
    assert_eq!((status.as_str(), attempts), ("in_progress", 1));
    // the lease holder can still complete: the refused replay did not touch the fence
    assert_eq!(
        complete(&pool, worker, &[outcome(&claimed[0], "failed")]).await,
        vec![id]
    );
    let (s, _) = api
        .post_as("leased", &format!("/v1/deliveries/{id}/replay"), "")
        .await;
    assert_eq!(s, StatusCode::ACCEPTED);
    assert_eq!(delivery_status(&pool, id).await, ("pending".to_string(), 0));

    let (s, v) = api
        .post_as(
            "leased",
            &format!("/v1/deliveries/{}/replay", Uuid::now_v7()),
            "",
        )
        .await;
    assert_eq!(s, StatusCode::NOT_FOUND, "{v}");
    assert_eq!(v["error"]["code"], json!("not_found"));
}

/// POST /v1/endpoints/{id}/replay with statuses ["dead"] and a window replays exactly the
/// dead deliveries created in the window: not the dead one before it, not the succeeded.
#[sqlx::test]
async fn endpoint_replay_filters_by_status_and_window(pool: PgPool) {
    init();
    let ep = endpoint(&pool, opts("window", "http://127.0.0.1:9/x".into())).await;
    let api = TestApi::start(&pool).await;
    let worker = Uuid::now_v7();
    let old_dead = api.enqueue("window", "a.b", r#"{"k":0}"#).await.1[0];
    let c = deliveries::claim(&pool, &claim_req(worker, 10, None))
        .await
        .unwrap();
    complete(&pool, worker, &[outcome(&c[0], "dead")]).await;
    let since: DateTime<Utc> = sqlx::query_scalar("SELECT now()")
        .fetch_one(&pool)
        .await
        .unwrap();
    let new_dead = api.enqueue("window", "a.b", r#"{"k":1}"#).await.1[0];
    let ok = api.enqueue("window", "a.b", r#"{"k":2}"#).await.1[0];
    let c = deliveries::claim(&pool, &claim_req(worker, 10, None))
        .await
        .unwrap();
    assert_eq!(c.len(), 2);
    let batch: Vec<Completion> = c
        .iter()
        .map(|r| {
            outcome(
                r,
                if r.id == new_dead {
                    "dead"
                } else {
                    "succeeded"
                },
            )
        })
        .collect();
    assert_eq!(complete(&pool, worker, &batch).await.len(), 2);

    let body = json!({"since": since, "statuses": ["dead"]}).to_string();
    let (s, v) = api
        .post_as("window", &format!("/v1/endpoints/{ep}/replay"), &body)
        .await;
    assert_eq!(s, StatusCode::ACCEPTED, "{v}");
    assert_eq!(v["replayed"], json!(1));
    assert_eq!(v["skippedLeased"], json!(0));
    assert_eq!(
        delivery_status(&pool, new_dead).await,
        ("pending".to_string(), 0)
    );
    assert_eq!(delivery_status(&pool, old_dead).await.0, "dead");
    assert_eq!(delivery_status(&pool, ok).await.0, "succeeded");
    let dl: Vec<Uuid> = sqlx::query_scalar("SELECT delivery_id FROM hookd.dead_letters")
        .fetch_all(&pool)
        .await
        .unwrap();
    assert_eq!(dl, vec![old_dead]);

    let (s, _) = api
        .post_as(
            "window",
            &format!("/v1/endpoints/{}/replay", Uuid::now_v7()),
            "",
        )
        .await;
    assert_eq!(s, StatusCode::NOT_FOUND);
}

/// An endpoint replay's window is by creation time (the enqueue transaction's start), not
/// by when the delivery's id was minted: a delivery enqueued inside a producer's
/// transaction that began before `until` is in the window although its id was minted
/// after it. The replay reads the endpoint's rows by id (migration 0040), with a bound
/// that allows for such transactions; its lower bound, `since`, is exact.
#[sqlx::test]
async fn endpoint_replay_window_counts_from_the_enqueue_transactions_start(pool: PgPool) {
    init();
    let ep = endpoint(&pool, opts("late-id", "http://127.0.0.1:9/x".into())).await;
    let api = TestApi::start(&pool).await;
    let worker = Uuid::now_v7();
    let mut tx = pool.begin().await.unwrap();
    let started: DateTime<Utc> = sqlx::query_scalar("SELECT now()")
        .fetch_one(&mut *tx)
        .await
        .unwrap();
    sqlx::query("SELECT pg_sleep(0.3)")
        .execute(&mut *tx)
        .await
        .unwrap();
    sqlx::query("SELECT hookd.enqueue('late-id', 'a.b', '{}')")
        .execute(&mut *tx)
        .await
        .unwrap();
    tx.commit().await.unwrap();
    let c = deliveries::claim(&pool, &claim_req(worker, 10, None))
        .await
        .unwrap();
    assert_eq!(c.len(), 1);
    complete(&pool, worker, &[outcome(&c[0], "dead")]).await;
    let (created, minted): (DateTime<Utc>, DateTime<Utc>) = sqlx::query_as(
        "SELECT created_at, to_timestamp(('x' || substr(replace(id::text, '-', ''), 1, 12))::bit(48)::bigint / 1000.0)
         FROM hookd.deliveries WHERE id = $1",
    )
    .bind(c[0].id)
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(created, started);
    let until = started + chrono::TimeDelta::milliseconds(100);
    assert!(minted > until, "the id was minted after the window's end");

    let replay = |since: DateTime<Utc>, until: DateTime<Utc>| {
        let body = json!({"since": since, "until": until, "statuses": ["dead"]}).to_string();
        let api = &api;
        async move {
            let (s, v) = api
                .post_as("late-id", &format!("/v1/endpoints/{ep}/replay"), &body)
                .await;
            assert_eq!(s, StatusCode::ACCEPTED, "{v}");
            v["replayed"].clone()
        }
    };
    // created after the window: not replayed
    assert_eq!(
        replay(started - chrono::TimeDelta::seconds(5), started).await,
        json!(0)
    );
    // created in it, minted after it: replayed
    assert_eq!(replay(started, until).await, json!(1));
    assert_eq!(
        delivery_status(&pool, c[0].id).await,
        ("pending".to_string(), 0)
    );
}

// ---- circuit breaker ----

/// End to end: after 3 consecutive HTTP failures the circuit opens; while open the
/// endpoint's new delivery is not sent (another endpoint's is); after the cooldown one
/// probe goes out, succeeds and closes the circuit (failures 0).
#[sqlx::test]
async fn circuit_opens_after_failures_and_a_probe_closes_it(pool: PgPool) {
    let rx = Receiver::start(&[SECRET_A]).await;
    rx.set(Behavior {
        status: 500,
        ..Default::default()
    });
    let other = Receiver::start(&[SECRET_A]).await;
    let x = endpoint(
        &pool,
        EndpointOpts {
            max_in_flight: Some(1),
            retry_schedule: Some(vec![3600]),
            max_attempts: Some(10),
            ..opts("cx", rx.url("/hook"))
        },
    )
    .await;
    endpoint(&pool, opts("cy", other.url("/hook"))).await;
    let api = TestApi::start(&pool).await;
    let d = TestDispatcher::start(
        &pool,
        hookd::config::DispatchSettings {
            circuit_failures: 3,
            circuit_cooldown_secs: 3,
            ..dispatch_settings()
        },
    )
    .await;
    for i in 0..3 {
        api.enqueue("cx", "a.b", &format!("{{\"i\":{i}}}")).await;
    }
    assert!(
        wait_until(Duration::from_secs(10), || async {
            endpoint_row(&pool, x).await.circuit_state == CircuitState::Open
        })
        .await
    );
    let ep = endpoint_row(&pool, x).await;
    assert_eq!(ep.circuit_failures, 3);
    let open_until = ep.circuit_open_until.unwrap();
    assert_eq!(rx.count(), 3);

    let held = api.enqueue("cx", "a.b", r#"{"i":3}"#).await.1[0];
    api.enqueue("cy", "a.b", "{}").await;
    assert!(wait_until(Duration::from_secs(2), || async { other.count() == 1 }).await);
    assert!(
        Utc::now() < open_until,
        "the healthy endpoint's delivery must arrive while the circuit is still open"
    );
    assert_eq!(rx.count(), 3, "nothing sent to an open circuit");
    assert_eq!(
        delivery_status(&pool, held).await,
        ("pending".to_string(), 0)
    );

    rx.set(Behavior::default());
    assert!(wait_status(&pool, held, "succeeded", Duration::from_secs(15)).await);
    let probe = &attempt_rows(&pool, held).await[0];
    assert!(
        probe.started_at >= open_until - chrono::Duration::milliseconds(50),
        "probe at {} before the cooldown ended at {open_until}",
        probe.started_at
    );
    assert!(
        wait_until(Duration::from_secs(5), || async {
            let e = endpoint_row(&pool, x).await;
            e.circuit_state == CircuitState::Closed && e.circuit_failures == 0
        })
        .await
    );
    assert!(endpoint_row(&pool, x).await.circuit_open_until.is_none());
    assert_eq!(
        rx.count(),
        4,
        "exactly one probe; the failed rows wait an hour"
    );
    d.stop().await;
}

/// With the claim itself: an open circuit's rows are not claimed while another
/// endpoint's are; after the cooldown 8 concurrent claimers get exactly one probe row;
/// success closes the circuit; a failed probe re-opens it.
#[sqlx::test]
async fn open_circuit_is_skipped_and_yields_a_single_probe(pool: PgPool) {
    init();
    let x = endpoint(&pool, opts("px", "http://127.0.0.1:9/x".into())).await;
    let y = endpoint(&pool, opts("py", "http://127.0.0.1:9/y".into())).await;
    enqueue_sql(&pool, "px", 5).await;
    enqueue_sql(&pool, "py", 5).await;
    let fail = |n| CircuitInput {
        endpoint_id: x,
        config_version: 1,
        any_success: false,
        trailing_failures: n,
    };
    let mut conn = pool.acquire().await.unwrap();
    assert!(
        endpoints::record_circuit(&mut conn, &[fail(2)], 3, 2.0)
            .await
            .unwrap()
            .is_empty(),
        "2 < threshold 3"
    );
    assert_eq!(
        endpoints::record_circuit(&mut conn, &[fail(1)], 3, 2.0)
            .await
            .unwrap(),
        vec![x]
    );
    let ep = endpoint_row(&pool, x).await;
    assert_eq!(
        (ep.circuit_state.as_str(), ep.circuit_failures),
        ("open", 3)
    );
    let open_until = ep.circuit_open_until.unwrap();

    let w = Uuid::now_v7();
    let got = deliveries::claim(&pool, &claim_req(w, 100, None))
        .await
        .unwrap();
    assert_eq!(got.len(), 5);
    assert!(
        got.iter().all(|c| c.endpoint_id == y),
        "open circuit skipped"
    );
    complete(
        &pool,
        w,
        &got.iter()
            .map(|c| outcome(c, "succeeded"))
            .collect::<Vec<_>>(),
    )
    .await;

    // After the cooldown: many concurrent claimers, one probe.
    let at = open_until + chrono::Duration::seconds(1);
    let claimers: Vec<_> = (0..8)
        .map(|_| {
            let pool = pool.clone();
            tokio::spawn(async move {
                let me = Uuid::now_v7();
                (
                    me,
                    deliveries::claim(&pool, &claim_req(me, 100, Some(at)))
                        .await
                        .unwrap(),
                )
            })
        })
        .collect();
    let mut probes = Vec::new();
    for c in claimers {
        let (me, rows) = c.await.unwrap();
        probes.extend(rows.into_iter().map(|r| (me, r)));
    }
    assert_eq!(probes.len(), 1, "exactly one half-open probe");
    assert_eq!(probes[0].1.endpoint_id, x);
    assert_eq!(
        endpoint_row(&pool, x).await.circuit_state,
        CircuitState::HalfOpen
    );
    let (pw, probe) = &probes[0];

    // The probe succeeds: closed, failures 0, and the backlog flows again.
    assert_eq!(
        complete(&pool, *pw, &[outcome(probe, "succeeded")]).await,
        vec![probe.id]
    );
    let ok = CircuitInput {
        endpoint_id: x,
        config_version: 1,
        any_success: true,
        trailing_failures: 0,
    };
    endpoints::record_circuit(&mut conn, &[ok], 3, 2.0)
        .await
        .unwrap();
    let ep = endpoint_row(&pool, x).await;
    assert_eq!(
        (
            ep.circuit_state.as_str(),
            ep.circuit_failures,
            ep.circuit_open_until
        ),
        ("closed", 0, None)
    );
    let rest = deliveries::claim(&pool, &claim_req(w, 100, Some(at)))
        .await
        .unwrap();
    assert_eq!(rest.len(), 4);
    assert!(rest.iter().all(|c| c.endpoint_id == x));
    // make them due again (failed, retry now) so a re-opened circuit has a backlog
    complete(
        &pool,
        w,
        &rest
            .iter()
            .map(|c| outcome(c, "failed"))
            .collect::<Vec<_>>(),
    )
    .await;

    // Re-open, probe, the probe fails: open again with a fresh cooldown.
    endpoints::record_circuit(&mut conn, &[fail(3)], 3, 2.0)
        .await
        .unwrap();
    let until = endpoint_row(&pool, x).await.circuit_open_until.unwrap();
    let at = until + chrono::Duration::seconds(1);
    let p = deliveries::claim(&pool, &claim_req(w, 100, Some(at)))
        .await
        .unwrap();
    assert_eq!(p.len(), 1);
    assert_eq!(
        endpoint_row(&pool, x).await.circuit_state,
        CircuitState::HalfOpen
    );
    complete(&pool, w, &[outcome(&p[0], "failed")]).await;
    assert_eq!(
        endpoints::record_circuit(&mut conn, &[fail(1)], 3, 2.0)
            .await
            .unwrap(),
        vec![x],
        "a failed probe re-opens the circuit"
    );
    let ep = endpoint_row(&pool, x).await;
    assert_eq!(ep.circuit_state, CircuitState::Open);
    assert!(ep.circuit_open_until.unwrap() > Utc::now());
    assert!(
        deliveries::claim(&pool, &claim_req(w, 100, None))
            .await
            .unwrap()
            .is_empty()
    );
}

/// A success on an endpoint whose breaker is closed and clean writes nothing to its row:
/// with thousands of customers' endpoints taking a delivery or two each, the first
/// success of each rewrote its row, about a tenth of a drain (issue 27). The figures
/// still report the success, read from the delivery and its attempt.
#[sqlx::test]
async fn a_clean_breaker_is_not_written_on_success(pool: PgPool) {
    init();
    let x = endpoint(&pool, opts("clean", "http://127.0.0.1:9/x".into())).await;
    enqueue_sql(&pool, "clean", 1).await;
    let w = Uuid::now_v7();
    let got = deliveries::claim(&pool, &claim_req(w, 10, None))
        .await
        .unwrap();
    assert_eq!(got.len(), 1);
    complete(&pool, w, &[outcome(&got[0], "succeeded")]).await;
    let version = || async {
        sqlx::query_scalar::<_, String>(
            "SELECT xmin::text || ctid::text FROM hookd.endpoints WHERE id = $1",
        )
        .bind(x)
        .fetch_one(&pool)
        .await
        .unwrap()
    };
    let before = version().await;
    let ok = CircuitInput {
        endpoint_id: x,
        config_version: 1,
        any_success: true,
        trailing_failures: 0,
    };
    let mut conn = pool.acquire().await.unwrap();
    assert!(
        endpoints::record_circuit(&mut conn, &[ok], 3, 2.0)
            .await
            .unwrap()
            .is_empty()
    );
    assert_eq!(version().await, before, "the endpoint row was rewritten");

    let st = endpoints::stats(&pool, x, 10).await.unwrap().unwrap();
    let last = st.last_success.expect("the success is reported");
    assert_eq!(last.status_code, Some(200));
    assert!(st.last_failure_at.is_none());
}

/// record_circuit called concurrently from 8 tasks, 5 times each with one failure, ends
/// with exactly 40 consecutive failures (atomic SQL, no lost updates).
#[sqlx::test]
async fn circuit_counter_is_atomic_under_concurrency(
    pool_opts: PgPoolOptions,
    connect: PgConnectOptions,
) {
    init();
    let pool = wide_pool(pool_opts, connect).await;
    let x = endpoint(&pool, opts("atomic", "http://127.0.0.1:9/x".into())).await;
    let barrier = Arc::new(tokio::sync::Barrier::new(8));
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..8 {
        let (pool, barrier) = (pool.clone(), barrier.clone());
        tasks.spawn(async move {
            let mut conn = pool.acquire().await.unwrap();
            barrier.wait().await;
            let input = CircuitInput {
                endpoint_id: x,
                config_version: 1,
                any_success: false,
                trailing_failures: 1,
            };
            for _ in 0..5 {
                endpoints::record_circuit(&mut conn, &[input], 1000, 30.0)
                    .await
                    .unwrap();
            }
        });
    }
    while let Some(r) = tasks.join_next().await {
        r.unwrap();
    }
    let ep = endpoint_row(&pool, x).await;
    assert_eq!(ep.circuit_failures, 40);
    assert_eq!(ep.circuit_state, CircuitState::Closed);
}

// ---- concurrency, wake-ups, stop, outbound safety ----

/// Endpoint H hangs (10 s per request), endpoint F is fast; H's backlog is enqueued first.
/// All of F's deliveries arrive within 2 s while H's are still in flight, H holding exactly
/// its per-endpoint cap of slots.
#[sqlx::test]
async fn hanging_endpoint_does_not_delay_a_healthy_one(pool: PgPool) {
    let h_rx = Receiver::start(&[SECRET_A]).await;
    h_rx.set(Behavior {
        delay: Duration::from_secs(10),
        ..Default::default()
    });
    let f_rx = Receiver::start(&[SECRET_A]).await;
    let h = endpoint(&pool, opts("hang", h_rx.url("/hook"))).await;
    endpoint(&pool, opts("fast", f_rx.url("/hook"))).await;
    let api = TestApi::start(&pool).await;
    let d = TestDispatcher::start(
        &pool,
        hookd::config::DispatchSettings {
            shutdown_grace_secs: 1,
            ..dispatch_settings()
        },
    )
    .await;
    for i in 0..40 {
        api.enqueue("hang", "a.b", &format!("{{\"i\":{i}}}")).await;
    }
    // H's deliveries are in flight before F's are enqueued.
    assert!(
        wait_until(Duration::from_secs(5), || async {
            in_flight(&pool, h).await >= 16
        })
        .await
    );
    let t0 = Instant::now();
    let mut f_ids = Vec::new();
    for i in 0..10 {
        f_ids.push(
            api.enqueue("fast", "a.b", &format!("{{\"i\":{i}}}"))
                .await
                .1[0],
        );
    }
    assert!(
        wait_until(Duration::from_secs(2), || async { f_rx.count() == 10 }).await,
        "healthy endpoint's deliveries delayed: {} of 10 after {:?}",
        f_rx.count(),
        t0.elapsed()
    );
    let latencies: Vec<Duration> = f_rx.all().iter().map(|r| r.at - t0).collect();
    println!("F latencies since first F enqueue: {latencies:?}");
    let h_in_flight = in_flight(&pool, h).await;
    println!(
        "H in flight meanwhile: {h_in_flight}, H received: {}",
        h_rx.count()
    );
    assert_eq!(
        h_in_flight, 16,
        "H still in flight, held at the per-endpoint cap (endpoint_concurrency 16)"
    );
    assert_eq!(h_rx.count(), 0, "H's receiver is still hanging");
    assert!(f_rx.all().iter().all(|r| r.verified_by == vec![true]));
    d.stop().await;
}

async fn in_flight(pool: &PgPool, endpoint_id: Uuid) -> i64 {
    sqlx::query_scalar(
        "SELECT count(*) FROM hookd.deliveries
         WHERE endpoint_id = $1 AND status = 'in_progress' AND visible_at > now()",
    )
    .bind(endpoint_id)
    .fetch_one(pool)
    .await
    .unwrap()
}

/// With LISTEN off (notify = false) and a 300 ms poll, deliveries still arrive: wake-ups
/// are an optimisation only.
#[sqlx::test]
async fn deliveries_arrive_without_notify(pool: PgPool) {
    let rx = Receiver::start(&[SECRET_A]).await;
    endpoint(&pool, opts("nonotify", rx.url("/hook"))).await;
    let api = TestApi::start_with(
        &pool,
        hookd::config::ApiSettings {
            notify: false,
            ..api_settings()
        },
    )
    .await;
    let d = TestDispatcher::start(
        &pool,
        hookd::config::DispatchSettings {
            notify: false,
            poll_ms: 300,
            ..dispatch_settings()
        },
    )
    .await;
    // let the dispatcher go idle first, so the deliveries are found by a later poll
    tokio::time::sleep(Duration::from_millis(100)).await;
    let t0 = Instant::now();
    let mut ids = HashSet::new();
    for i in 0..5 {
        ids.insert(
            api.enqueue("nonotify", "a.b", &format!("{{\"i\":{i}}}"))
                .await
                .1[0]
                .to_string(),
        );
    }
    assert!(wait_until(Duration::from_secs(5), || async { rx.count() == 5 }).await);
    println!("delivered without NOTIFY in {:?}", t0.elapsed());
    assert_eq!(rx.ids().into_iter().collect::<HashSet<_>>(), ids);
    d.stop().await;
}

/// A graceful stop (SIGTERM path) while a slow delivery is in flight lets it finish
/// within the grace period: the receiver got it and the row is succeeded.
#[sqlx::test]
async fn graceful_stop_finishes_in_flight_delivery(pool: PgPool) {
    let rx = Receiver::start(&[SECRET_A]).await;
    rx.set(Behavior {
        delay: Duration::from_millis(1500),
        ..Default::default()
    });
    let ep = endpoint(&pool, opts("stop", rx.url("/hook"))).await;
    let api = TestApi::start(&pool).await;
    let d = TestDispatcher::start(&pool, dispatch_settings()).await;
    let id = api.enqueue("stop", "a.b", "{}").await.1[0];
    assert!(
        wait_until(Duration::from_secs(5), || async {
            in_flight(&pool, ep).await == 1
        })
        .await
    );
    assert_eq!(rx.count(), 0, "still in flight at the stop");
    let t0 = Instant::now();
    d.stop().await;
    let took = t0.elapsed();
    println!("stop took {took:?}");
    assert!(took < Duration::from_secs(5), "within the 5 s grace");
    assert_eq!(rx.count(), 1);
    assert_eq!(
        delivery_status(&pool, id).await,
        ("succeeded".to_string(), 1)
    );
}

/// A stage hook that tells the test each stage a worker reaches and holds the worker
/// there until the test sends on the channel it hands over (or drops it).
type Reached = (Stage, Uuid, oneshot::Sender<()>);

fn holding_hook() -> (StageHook, mpsc::UnboundedReceiver<Reached>) {
    let (tx, rx) = mpsc::unbounded_channel();
    let hook: StageHook = Arc::new(move |stage, id| {
        let tx = tx.clone();
        Box::pin(async move {
            let (go, held) = oneshot::channel();
            if tx.send((stage, id, go)).is_ok() {
                let _ = held.await;
            }
        })
    });
    (hook, rx)
}

async fn next_stage(reached: &mut mpsc::UnboundedReceiver<Reached>) -> Reached {
    tokio::time::timeout(Duration::from_secs(10), reached.recv())
        .await
        .expect("a worker reaches the next stage")
        .expect("the hook is alive")
}

/// (status, locked_by, seconds of lease left) of one delivery.
async fn lease_of(pool: &PgPool, id: Uuid) -> (String, Option<Uuid>, f64) {
    sqlx::query_as(
        "SELECT status, locked_by, extract(epoch FROM visible_at - now())::float8
         FROM hookd.deliveries WHERE id = $1",
    )
    .bind(id)
    .fetch_one(pool)
    .await
    .unwrap()
}

/// A worker held between claim and send (by the stage hook) for longer than its 2 s
/// lease keeps the delivery: the row stays in_progress under that worker with a lease
/// renewed into the future, and a second dispatcher polling meanwhile claims nothing.
/// Released, it sends once; held again after the send, the row is still in_progress (a
/// crash here would resend it: at least once), and released, it is succeeded after one
/// attempt with one request received. Before the hook, "claimed but not yet sent" could
/// only be caught by racing a slow receiver.
#[sqlx::test]
async fn a_worker_held_after_claim_keeps_its_lease_and_sends_once(pool: PgPool) {
    let rx = Receiver::start(&[SECRET_A]).await;
    endpoint(&pool, opts("held", rx.url("/hook"))).await;
    let settings = hookd::config::DispatchSettings {
        lease_secs: 2,
        ..dispatch_settings()
    };
    let (hook, mut reached) = holding_hook();
    let mut cfg = hookd::dispatch::DispatchConfig::from_settings(&settings).unwrap();
    cfg.stage_hook = Some(hook);
    let held = TestDispatcher::start_with(&pool, cfg, test_keyring()).await;
    let event = enqueue_sql(&pool, "held", 1).await[0];
    let id: Uuid = sqlx::query_scalar("SELECT id FROM hookd.deliveries WHERE event_id = $1")
        .bind(event)
        .fetch_one(&pool)
        .await
        .unwrap();

    let (stage, claimed, go) = next_stage(&mut reached).await;
    assert_eq!((stage, claimed), (Stage::Claimed, id));
    let (status, locked_by, lease_left) = lease_of(&pool, id).await;
    assert_eq!(status, "in_progress");
    assert_eq!(locked_by, Some(held.worker_id));
    assert!(lease_left > 0.0, "leased: {lease_left}s left");

    let other = TestDispatcher::start(&pool, settings).await;
    // longer than the lease: only renewal keeps the row from the other dispatcher
    tokio::time::sleep(Duration::from_secs(3)).await;
    let (status, locked_by, lease_left) = lease_of(&pool, id).await;
    assert_eq!(status, "in_progress");
    assert_eq!(locked_by, Some(held.worker_id), "still the held worker's");
    assert!(lease_left > 0.0, "renewed while held: {lease_left}s left");
    assert_eq!(
        other.metrics.claimed.get(),
        0,
        "the other dispatcher took it"
    );
    assert_eq!(held.metrics.leases_lost.get(), 0);
    assert_eq!(rx.count(), 0, "not sent while held");

    go.send(()).unwrap();
    let (stage, sent, go) = next_stage(&mut reached).await;
    assert_eq!((stage, sent), (Stage::Sent, id));
    assert_eq!(rx.count(), 1);
    assert_eq!(
        delivery_status(&pool, id).await.0,
        "in_progress",
        "the outcome is not written before the worker hands it over"
    );

    go.send(()).unwrap();
    assert!(wait_status(&pool, id, "succeeded", Duration::from_secs(5)).await);
    assert_eq!(
        delivery_status(&pool, id).await,
        ("succeeded".to_string(), 1)
    );
    assert_eq!(attempt_rows(&pool, id).await.len(), 1);
    assert_eq!(rx.ids(), vec![id.to_string()], "received once");
    assert_eq!(other.metrics.claimed.get(), 0);
    other.stop().await;
    held.stop().await;
}

/// A slot freed while a claim runs is not lost. The endpoint's one slot (cap 1) is busy
/// with D1 when D2 arrives; the claim woken by D2's NOTIFY reads "1 in flight", and is
/// then held (its wake-up fold waits on a lock this test holds on the endpoint's queue
/// entry) while D1 finishes and frees the slot. The claim gets nothing, as it must; the freed slot's
/// wake-up must then claim D2 at once. Before, the dispatcher ignored it because nothing
/// was in flight any more by the time it went to sleep, and D2 waited for the poll (30 s
/// here; at the 1 s default this stalled `hookd-bench` drains about once a second).
#[sqlx::test]
async fn a_slot_freed_during_a_claim_wakes_the_next_claim(pool: PgPool) {
    let rx = Receiver::start(&[SECRET_A]).await;
    let ep = endpoint(&pool, opts("freed", rx.url("/hook"))).await;
    let settings = hookd::config::DispatchSettings {
        endpoint_concurrency: 1,
        poll_ms: 30_000,
        ..dispatch_settings()
    };
    let (hook, mut reached) = holding_hook();
    let mut cfg = hookd::dispatch::DispatchConfig::from_settings(&settings).unwrap();
    cfg.stage_hook = Some(hook);
    let d = TestDispatcher::start_with(&pool, cfg, test_keyring()).await;
    enqueue_sql(&pool, "freed", 1).await;
    let (stage, d1, d1_go) = next_stage(&mut reached).await;
    assert_eq!(stage, Stage::Claimed);

    // on the endpoint's queue entry: the dispatcher's fold of D2's wake-up waits (its
    // upsert), the enqueue does not (D2 is due before the entry, so it leaves a wake-up
    // rather than pin the entry), nor does D1's outcome (it skips a locked entry)
    let mut lock = pool.begin().await.unwrap();
    sqlx::query("SELECT 1 FROM hookd.endpoint_queue WHERE endpoint_id = $1 FOR NO KEY UPDATE")
        .bind(ep)
        .execute(&mut *lock)
        .await
        .unwrap();
    enqueue_sql(&pool, "freed", 1).await;
    let waiting = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            let n: i64 = sqlx::query_scalar(
                "SELECT count(*) FROM pg_stat_activity
                 WHERE wait_event_type = 'Lock' AND query LIKE '%endpoint_wakeups%'",
            )
            .fetch_one(&pool)
            .await
            .unwrap();
            if n > 0 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    assert!(
        waiting.is_ok(),
        "the claim woken by D2 never waited on the endpoint"
    );

    // D1 finishes while that claim is held: its slot is free before the claim resumes
    d1_go.send(()).unwrap();
    let (stage, sent, go) = next_stage(&mut reached).await;
    assert_eq!((stage, sent), (Stage::Sent, d1));
    go.send(()).unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(rx.count(), 1);
    lock.commit().await.unwrap();

    let started = std::time::Instant::now();
    let next = tokio::time::timeout(Duration::from_secs(5), reached.recv()).await;
    let Ok(Some((stage, d2, go))) = next else {
        panic!("D2 not claimed within 5 s of its slot freeing (the poll is 30 s)");
    };
    assert_eq!(stage, Stage::Claimed);
    assert_ne!(d2, d1);
    assert!(started.elapsed() < Duration::from_secs(5));
    go.send(()).unwrap();
    let (_, _, go) = next_stage(&mut reached).await;
    go.send(()).unwrap();
    assert!(wait_status(&pool, d2, "succeeded", Duration::from_secs(5)).await);
    d.stop().await;
}

/// With an empty allow-list, a loopback destination is refused: the delivery is dead at
/// once with error class destination_forbidden, and the receiver got nothing.
#[sqlx::test]
async fn loopback_destination_is_refused_without_allow_list(pool: PgPool) {
    let rx = Receiver::start(&[SECRET_A]).await;
    endpoint(&pool, opts("ssrf", rx.url("/hook"))).await;
    let api = TestApi::start(&pool).await;
    let d = TestDispatcher::start(
        &pool,
        hookd::config::DispatchSettings {
            allowed_destinations: String::new(),
            ..dispatch_settings()
        },
    )
    .await;
    let id = api.enqueue("ssrf", "a.b", "{}").await.1[0];
    assert!(wait_status(&pool, id, "dead", Duration::from_secs(10)).await);
    let log = attempt_rows(&pool, id).await;
    assert_eq!(log.len(), 1);
    assert_eq!(log[0].error_class, Some(ErrorClass::DestinationForbidden));
    assert_eq!(log[0].status_code, None);
    let reason: String =
        sqlx::query_scalar("SELECT reason FROM hookd.dead_letters WHERE delivery_id = $1")
            .bind(id)
            .fetch_one(&pool)
            .await
            .unwrap();
    assert!(reason.contains("destination_forbidden"), "{reason}");
    d.stop().await;
    assert_eq!(rx.count(), 0);
}

// ---- the queue's SQL literals are the values of its enums ----

/// The string literals `column` is compared with in SQL text: `column = 'x'`,
/// `column <> 'x'`, `column [NOT] IN ('x', …)`, and Postgres's deparsed
/// `column = ANY (ARRAY['x'::text, …])`. Comparisons with anything else (a parameter,
/// another column, a CASE) yield nothing.
fn literals_compared_with(sql: &str, column: &str) -> Vec<String> {
    let ident = |b: u8| b.is_ascii_alphanumeric() || b == b'_';
    let mut out = Vec::new();
    for (at, _) in sql.match_indices(column) {
        let end = at + column.len();
        if (at > 0 && ident(sql.as_bytes()[at - 1]))
            || sql.as_bytes().get(end).is_some_and(|b| ident(*b))
        {
            continue;
        }
        let rest = sql[end..].trim_start();
        let Some(rest) = ["<>", "!=", "=", "NOT IN", "IN"]
            .into_iter()
            .find_map(|op| {
                let r = rest.strip_prefix(op)?;
                (!op.ends_with("IN") || r.starts_with(|c: char| c == '(' || c.is_whitespace()))
                    .then_some(r)
            })
        else {
            continue;
        };
        let rest = rest.trim_start();
        let rest = rest.strip_prefix("ANY").map_or(rest, str::trim_start);
        let span = if rest.starts_with('(') {
            // up to the matching parenthesis, outside quotes
            let (mut depth, mut quoted, mut stop) = (0, false, rest.len());
            for (i, c) in rest.char_indices() {
                match c {
                    '\'' => quoted = !quoted,
                    '(' if !quoted => depth += 1,
                    ')' if !quoted => {
                        depth -= 1;
                        if depth == 0 {
                            stop = i;
                            break;
                        }
                    }
                    _ => {}
                }
            }
            &rest[..stop]
        } else if let Some(literal) = rest.strip_prefix('\'') {
            out.extend(literal.split('\'').next().map(str::to_string));
            continue;
        } else {
            continue;
        };
        out.extend(span.split('\'').skip(1).step_by(2).map(str::to_string));
    }
    out
}

#[test]
fn literals_are_found_in_written_and_deparsed_sql() {
    let sql = "WHERE d.status IN ('pending', 'failed') AND status = 'dead' AND x.status <> 'a'
               AND o.status NOT IN ('b') AND last_status = 'no' AND status = $1
               AND (status = ANY (ARRAY['in_progress'::text, 'c'::text])) AND status = CASE WHEN";
    assert_eq!(
        literals_compared_with(sql, "status"),
        ["pending", "failed", "dead", "a", "b", "in_progress", "c"]
    );
}

/// Every status, class, circuit, endpoint state and owner literal the database holds (CHECK
/// constraints, partial-index predicates, functions and triggers) and every one the
/// statements of `src/db/` write is a value of `DeliveryStatus` / `CircuitState` /
/// `ErrorClass` / `EndpointState` / `ManagedBy` / `DeliveryOrder` / `OnDeadLetter`, the CHECK constraints
/// accept exactly the enums' values, `deliveries_claimable` is exactly
/// `deliveries::CLAIMABLE`, and sqlx writes and reads the enums as those literals.
#[sqlx::test]
async fn sql_literals_are_the_values_of_the_queue_enums(pool: PgPool) {
    use std::collections::BTreeSet;
    let set = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<BTreeSet<_>>();
    let statuses = set(&DeliveryStatus::ALL.map(DeliveryStatus::as_str));
    let circuits = set(&CircuitState::ALL.map(CircuitState::as_str));
    let classes = set(&ErrorClass::ALL.map(ErrorClass::as_str));
    let endpoint_states = set(&EndpointState::ALL.map(EndpointState::as_str));
    let owners = set(&ManagedBy::ALL.map(ManagedBy::as_str));
    let orderings = set(&DeliveryOrder::ALL.map(DeliveryOrder::as_str));
    let on_dead_letters = set(&OnDeadLetter::ALL.map(OnDeadLetter::as_str));

    // the CHECK constraints: exactly the enums' values
    let check = |table: &'static str, column: &'static str| {
        let pool = pool.clone();
        async move {
            let defs: Vec<String> = sqlx::query_scalar(
                "SELECT pg_get_constraintdef(c.oid) FROM pg_constraint c
                 JOIN pg_attribute a ON a.attrelid = c.conrelid AND a.attnum = ANY (c.conkey)
                 WHERE c.conrelid = $1::regclass AND c.contype = 'c' AND a.attname = $2",
            )
            .bind(table)
            .bind(column)
            .fetch_all(&pool)
            .await
            .unwrap();
            assert!(!defs.is_empty(), "a CHECK on {table}.{column}");
            // the literals of every CHECK naming the column (managed_by has two: its
            // values, and that `kubernetes` goes with a declaring object)
            defs.iter()
                .flat_map(|d| literals_compared_with(d, column))
                .collect::<BTreeSet<_>>()
        }
    };
    assert_eq!(check("hookd.deliveries", "status").await, statuses);
    assert_eq!(check("hookd.endpoints", "circuit_state").await, circuits);
    assert_eq!(check("hookd.endpoints", "state").await, endpoint_states);
    assert_eq!(check("hookd.endpoints", "managed_by").await, owners);
    assert_eq!(check("hookd.endpoints", "ordering").await, orderings);
    assert_eq!(
        check("hookd.endpoints", "on_dead_letter").await,
        on_dead_letters
    );
    assert_eq!(
        check("hookd.delivery_attempts", "error_class").await,
        classes
    );
    // and it holds: no class (an attempt answered 2xx) is accepted, a made-up one is not
    let d = delivery(&pool, DeliveryOpts::default()).await;
    let attempt = |class: Option<&'static str>| {
        sqlx::query(
            "INSERT INTO hookd.delivery_attempts (delivery_id, attempt, started_at, duration_ms, error_class)
             VALUES ($1, 1, now(), 1, $2)",
        )
        .bind(d.id)
        .bind(class)
        .execute(&pool)
    };
    attempt(None).await.unwrap();
    let refused = attempt(Some("made_up")).await.unwrap_err();
    assert_eq!(
        refused.as_database_error().and_then(|e| e.constraint()),
        Some("delivery_attempts_error_class"),
        "{refused}"
    );

    // partial indexes, functions and triggers of the schema
    let indexes: Vec<(String, String)> = sqlx::query_as(
        "SELECT indexname::text, indexdef FROM pg_indexes WHERE schemaname = 'hookd'",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    // the claim index has no predicate since migration 0014: the queue partition's bound
    // is what keeps terminal rows out of it
    let bound: String = sqlx::query_scalar(
        "SELECT pg_get_expr(relpartbound, oid) FROM pg_class WHERE oid = 'hookd.delivery_queue'::regclass",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    let queued: BTreeSet<String> = bound
        .split('\'')
        .skip(1)
        .step_by(2)
        .map(str::to_owned)
        .collect();
    assert_eq!(
        queued,
        set(&deliveries::CLAIMABLE.map(DeliveryStatus::as_str)),
        "the queue partition holds exactly deliveries::CLAIMABLE ({bound})"
    );
    let mut stored: Vec<(String, String)> = indexes;
    stored.extend(
        sqlx::query_as::<_, (String, String)>(
            "SELECT p.proname::text, pg_get_functiondef(p.oid) FROM pg_proc p
             JOIN pg_namespace n ON n.oid = p.pronamespace
             WHERE n.nspname = 'hookd' AND p.prokind = 'f'
             UNION ALL
             SELECT t.tgname::text, pg_get_triggerdef(t.oid) FROM pg_trigger t
             JOIN pg_class c ON c.oid = t.tgrelid JOIN pg_namespace n ON n.oid = c.relnamespace
             WHERE n.nspname = 'hookd' AND NOT t.tgisinternal",
        )
        .fetch_all(&pool)
        .await
        .unwrap(),
    );
    // and the statements of src/db/, where `held` is the one outcome `complete` reads
    // that is not a status (it stores it as `failed`)
    let db_dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src/db");
    for file in std::fs::read_dir(&db_dir).unwrap() {
        let path = file.unwrap().path();
        stored.push((
            path.display().to_string(),
            std::fs::read_to_string(&path).unwrap(),
        ));
    }
    let mut seen = 0;
    for (name, sql) in &stored {
        for lit in literals_compared_with(sql, "status") {
            let known = statuses.contains(&lit) || lit == DeliveryOutcome::Held.as_sql();
            assert!(
                known,
                "{name}: status literal {lit:?} is not a DeliveryStatus"
            );
            seen += 1;
        }
        for lit in literals_compared_with(sql, "circuit_state") {
            assert!(
                circuits.contains(&lit),
                "{name}: circuit literal {lit:?} is not a CircuitState"
            );
            seen += 1;
        }
        for lit in literals_compared_with(sql, "state") {
            assert!(
                endpoint_states.contains(&lit),
                "{name}: endpoint state literal {lit:?} is not an EndpointState"
            );
            seen += 1;
        }
        for lit in literals_compared_with(sql, "managed_by") {
            assert!(
                owners.contains(&lit),
                "{name}: managed_by literal {lit:?} is not a ManagedBy"
            );
        }
        for lit in literals_compared_with(sql, "error_class") {
            assert!(
                classes.contains(&lit),
                "{name}: error class literal {lit:?} is not an ErrorClass"
            );
        }
    }
    assert!(seen > 50, "the scan found the literals ({seen})");

    // sqlx writes the enums as these literals and reads them back
    for s in DeliveryStatus::ALL {
        let (text, back): (String, DeliveryStatus) = sqlx::query_as("SELECT $1::text, $1::text")
            .bind(s)
            .fetch_one(&pool)
            .await
            .unwrap();
        assert_eq!((text.as_str(), back), (s.as_str(), s));
    }
    for c in CircuitState::ALL {
        let (text, back): (String, CircuitState) = sqlx::query_as("SELECT $1::text, $1::text")
            .bind(c)
            .fetch_one(&pool)
            .await
            .unwrap();
        assert_eq!((text.as_str(), back), (c.as_str(), c));
    }
    for s in EndpointState::ALL {
        let (text, back): (String, EndpointState) = sqlx::query_as("SELECT $1::text, $1::text")
            .bind(s)
            .fetch_one(&pool)
            .await
            .unwrap();
        assert_eq!((text.as_str(), back), (s.as_str(), s));
    }
    for m in ManagedBy::ALL {
        let (text, back): (String, ManagedBy) = sqlx::query_as("SELECT $1::text, $1::text")
            .bind(m)
            .fetch_one(&pool)
            .await
            .unwrap();
        assert_eq!((text.as_str(), back), (m.as_str(), m));
    }
    for e in ErrorClass::ALL {
        let (text, back): (String, ErrorClass) = sqlx::query_as("SELECT $1::text, $1::text")
            .bind(e)
            .fetch_one(&pool)
            .await
            .unwrap();
        assert_eq!((text.as_str(), back), (e.as_str(), e));
    }
}

/// The claim stays an ordered index range scan per endpoint, reading no more than the
/// quota, when the queue partition was analyzed nearly empty and then filled (as it is
/// between two bursts). Planned from those statistics without `db::INDEX_PATHS_ONLY`, it
/// read each endpoint's whole backlog through a bitmap and sorted it: 2,500 rows per
/// endpoint for a quota of 32, 69 ms instead of 24, and minutes of doubled latency in a
/// sustained run.
#[sqlx::test]
async fn claim_reads_only_its_quota_after_statistics_of_an_empty_queue(pool: PgPool) {
    init();
    let mut eps = Vec::new();
    for _ in 0..8 {
        eps.push(endpoint(&pool, opts("plan", "http://127.0.0.1:9/x".into())).await);
    }
    bulk_events(&pool, "plan", 20_000).await;
    sqlx::query("VACUUM ANALYZE hookd.deliveries")
        .execute(&pool)
        .await
        .unwrap();
    sqlx::query(
        "INSERT INTO hookd.deliveries (id, event_id, endpoint_id, tenant, status, attempts)
         SELECT gen_random_uuid(), e.id, ($1::uuid[])[1 + (e.rn % 8)], 'plan', 'pending', 0
         FROM (SELECT id, row_number() OVER () AS rn FROM hookd.events) e",
    )
    .bind(&eps)
    .execute(&pool)
    .await
    .unwrap();
    let req = ClaimRequest {
        worker_id: Uuid::now_v7(),
        limit: 256,
        lease_secs: 30.0,
        per_endpoint_cap: 32,
        busy: vec![],
        now: None,
        default_max_attempts: 8,
    };
    let plan = deliveries::explain_claim(&pool, &req).await.unwrap();
    let text = plan.join("\n");
    let scan = plan
        .iter()
        .find(|l| l.contains("Index Scan using deliveries_claimable on delivery_queue"))
        .unwrap_or_else(|| panic!("claim must range-scan deliveries_claimable:\n{text}"));
    assert!(
        scan.contains("rows=32 loops=8"),
        "each endpoint's scan stops at its quota of 32:\n{text}"
    );
    assert!(
        !plan
            .iter()
            .any(|l| l.contains("Bitmap Heap Scan on delivery_queue")),
        "no bitmap over the backlog:\n{text}"
    );
}

/// The deliveries of `tenant` still queued, oldest due first.
async fn queued_deliveries(pool: &PgPool, tenant: &str) -> Vec<Uuid> {
    sqlx::query_scalar(
        "SELECT id FROM hookd.deliveries WHERE tenant = $1
           AND status IN ('pending', 'in_progress', 'failed')
         ORDER BY visible_at, id",
    )
    .bind(tenant)
    .fetch_all(pool)
    .await
    .unwrap()
}

/// Waits until this database has a session listening for new deliveries (the
/// dispatcher's LISTEN), so what is enqueued next is heard.
async fn wait_listening(pool: &PgPool) {
    let listening = wait_until(Duration::from_secs(10), || async {
        sqlx::query_scalar::<_, i64>(
            "SELECT count(*) FROM pg_stat_activity
             WHERE datname = current_database() AND query ILIKE 'LISTEN%hookd_deliveries%'",
        )
        .fetch_one(pool)
        .await
        .unwrap()
            > 0
    })
    .await;
    assert!(listening, "the dispatcher never listened");
}

/// A dispatcher that is waiting leases what the API's NOTIFY names, without scanning the
/// queue: with the poll an hour away, five events arrive one by one, every lease is a
/// handed one, and their wake-ups are never folded (a scan folds them first). A retry
/// the completer schedules still arrives when due: the scan it asks for, and the timer
/// to the next due row, find it with no NOTIFY at all.
#[sqlx::test]
async fn enqueued_deliveries_are_handed_to_a_waiting_dispatcher(pool: PgPool) {
    let rx = Receiver::start(&[SECRET_A]).await;
    endpoint(&pool, opts("handed", rx.url("/hook"))).await;
    let api = TestApi::start(&pool).await;
    let d = TestDispatcher::start(
        &pool,
        hookd::config::DispatchSettings {
            poll_ms: 3_600_000,
            retry_schedule: "1".into(),
            ..dispatch_settings()
        },
    )
    .await;
    wait_listening(&pool).await;
    // the scan a new listener asks for has run and found nothing
    tokio::time::sleep(Duration::from_millis(300)).await;
    for i in 0..5 {
        api.enqueue("handed", "a.b", &format!("{{\"i\":{i}}}"))
            .await;
        let want = i + 1;
        assert!(
            wait_until(Duration::from_secs(5), || async { rx.count() == want }).await,
            "event {i} was not delivered"
        );
    }
    assert_eq!(d.metrics.claimed_handed.get(), 5);
    assert_eq!(d.metrics.claimed.get(), 5);
    let unfolded: i64 = sqlx::query_scalar("SELECT count(*) FROM hookd.endpoint_wakeups")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(unfolded, 5, "no scan ran, so no fold");

    rx.set(Behavior {
        status: 500,
        ..Default::default()
    });
    let t0 = Instant::now();
    api.enqueue("handed", "a.b", "{\"i\":5}").await;
    assert!(
        wait_until(Duration::from_secs(6), || async { rx.count() == 7 }).await,
        "the retry, due 1 s after the 500, did not arrive (the poll is an hour away)"
    );
    let retried_after = t0.elapsed();
    assert!(
        retried_after >= Duration::from_millis(800),
        "retried after {retried_after:?}, before it was due"
    );
    d.stop().await;
}

/// A claim of handed deliveries leases by the claim's own rules: only queued, due
/// deliveries it was named (with their endpoint's older due rows), up to the endpoint's
/// cap, none of a paused endpoint, none already leased, and nothing for ids that name no
/// delivery.
#[sqlx::test]
async fn handed_deliveries_are_leased_by_key_within_the_claims_rules(pool: PgPool) {
    init();
    endpoint(&pool, opts("a", "http://127.0.0.1:9/a".into())).await;
    endpoint(&pool, opts("b", "http://127.0.0.1:9/b".into())).await;
    endpoint(
        &pool,
        EndpointOpts {
            paused: true,
            ..opts("p", "http://127.0.0.1:9/p".into())
        },
    )
    .await;
    // one transaction each, so the three are due one after another
    for _ in 0..3 {
        enqueue_sql(&pool, "a", 1).await;
    }
    enqueue_sql(&pool, "b", 2).await;
    enqueue_sql(&pool, "p", 1).await;
    let a = queued_deliveries(&pool, "a").await;
    let b = queued_deliveries(&pool, "b").await;
    let p = queued_deliveries(&pool, "p").await;
    let req = ClaimRequest {
        worker_id: Uuid::now_v7(),
        limit: 100,
        lease_secs: 30.0,
        per_endpoint_cap: 2,
        busy: vec![],
        now: None,
        default_max_attempts: 8,
    };
    let shares = deliveries::TenantShares::unlimited();
    let ids = |rows: &[ClaimedDelivery]| rows.iter().map(|r| r.id).collect::<HashSet<_>>();

    // a's newest only: its two oldest go first, up to its cap of 2
    let got = deliveries::claim_handed(&pool, &req, &shares, &[a[2]])
        .await
        .unwrap();
    assert_eq!(ids(&got), HashSet::from([a[0], a[1]]));
    // b's first, a paused endpoint's, and an id that is no delivery
    let got = deliveries::claim_handed(&pool, &req, &shares, &[b[0], p[0], Uuid::now_v7()])
        .await
        .unwrap();
    assert_eq!(
        ids(&got),
        HashSet::from([b[0], b[1]]),
        "b's older and newer due rows"
    );
    // already leased: not again
    let got = deliveries::claim_handed(&pool, &req, &shares, &[a[0], b[1]])
        .await
        .unwrap();
    assert!(got.is_empty(), "leased twice: {got:?}");
    // the worker's cap for a is counted from what it holds
    let busy = ClaimRequest {
        busy: vec![(got_endpoint(&pool, a[2]).await, 2)],
        ..req.clone()
    };
    let got = deliveries::claim_handed(&pool, &busy, &shares, &[a[2]])
        .await
        .unwrap();
    assert!(got.is_empty(), "a is at its cap: {got:?}");
    let got = deliveries::claim_handed(&pool, &req, &shares, &[a[2]])
        .await
        .unwrap();
    assert_eq!(ids(&got), HashSet::from([a[2]]));
    assert_eq!(
        delivery_status(&pool, p[0]).await.0,
        "pending",
        "a paused endpoint's delivery stays queued"
    );
}

async fn got_endpoint(pool: &PgPool, delivery: Uuid) -> Uuid {
    sqlx::query_scalar("SELECT endpoint_id FROM hookd.deliveries WHERE id = $1")
        .bind(delivery)
        .fetch_one(pool)
        .await
        .unwrap()
}

/// A backlog already queued when a dispatcher starts, over many endpoints of one tenant,
/// drains with no NOTIFY at all and the poll an hour away: a slot freed while the tenant
/// was at its share scans again, also when every send ended during the scan (the loop
/// once judged by what was in flight after it: 36 of 1,000 in 20 s).
#[sqlx::test]
async fn a_backlog_queued_before_the_start_drains_without_notifications(pool: PgPool) {
    let rx = Receiver::start(&[SECRET_A]).await;
    for i in 0..50 {
        endpoint(
            &pool,
            EndpointOpts {
                name: format!("crowd-{i}"),
                ..opts("crowd", rx.url(&format!("/c{i}")))
            },
        )
        .await;
    }
    enqueue_sql(&pool, "crowd", 20).await;
    let d = TestDispatcher::start(
        &pool,
        hookd::config::DispatchSettings {
            poll_ms: 3_600_000,
            concurrency: 40,
            ..dispatch_settings()
        },
    )
    .await;
    let drained = wait_until(Duration::from_secs(20), || async { rx.count() >= 1000 }).await;
    assert!(drained, "only {} of 1000 delivered", rx.count());
    d.stop().await;
}

/// Writes `n` events of `tenant` and a pending delivery of each, spread over `endpoints`
/// in turn, straight to the tables as `hookd-bench` fills them (no API, no NOTIFY, no
/// wake-up of a dispatcher), due since an hour ago.
async fn write_due_rows(pool: &PgPool, tenant: &str, endpoints: &[Uuid], n: i64) {
    sqlx::query(
        "WITH ev AS (
             INSERT INTO hookd.events (id, tenant, event_type, payload, request_hash)
             SELECT hookd.uuid_v7(), $2, 'test.event', '{}', '\\x00'::bytea
             FROM generate_series(1, $3) RETURNING id
         ), numbered AS (SELECT id, row_number() OVER () AS n FROM ev)
         INSERT INTO hookd.deliveries (id, event_id, endpoint_id, tenant, status, attempts, visible_at)
         SELECT hookd.uuid_v7(), id, ($1::uuid[])[1 + (n % cardinality($1::uuid[]))], $2,
                'pending', 0, now() - interval '1 hour' + n * interval '1 microsecond'
         FROM numbered",
    )
    .bind(endpoints)
    .bind(tenant)
    .bind(n)
    .execute(pool)
    .await
    .unwrap();
}

/// A tenant's backlog over a thousand endpoints keeps draining while another tenant's
/// events are handed to the dispatcher as they come (`hookd-bench`'s crowd row). Sends
/// that end while a claim runs free no slot at a cap as the counts then stand (the
/// claim's rows are not counted yet), though the claim filled the tenant's share as it
/// read it; judged by those counts alone, the crowd got 450 deliveries in 15 s in the
/// bench, and 7,856 of 18,000 in 30 s here, with the poll an hour away.
#[sqlx::test]
async fn a_backlog_drains_beside_another_tenants_handed_events(pool: PgPool) {
    let rx = Receiver::start(&[SECRET_A]).await;
    let mut crowd = Vec::new();
    for i in 0..1000 {
        crowd.push(
            endpoint(
                &pool,
                EndpointOpts {
                    name: format!("crowd-{i}"),
                    ..opts("crowd", rx.url(&format!("/c{i}")))
                },
            )
            .await,
        );
    }
    write_due_rows(&pool, "crowd", &crowd, 18_000).await;
    let small_rx = Receiver::start(&[SECRET_A]).await;
    endpoint(&pool, opts("small", small_rx.url("/hook"))).await;
    let api = TestApi::start(&pool).await;
    let d = TestDispatcher::start(
        &pool,
        hookd::config::DispatchSettings {
            poll_ms: 3_600_000,
            concurrency: 256,
            endpoint_concurrency: 32,
            ..dispatch_settings()
        },
    )
    .await;
    wait_listening(&pool).await;
    for _ in 0..40 {
        api.enqueue("small", "a.b", "{}").await;
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let drained = wait_until(Duration::from_secs(30), || async {
        rx.count() >= 18000 && small_rx.count() >= 40
    })
    .await;
    assert!(
        drained,
        "the crowd got {} of 18000, the small tenant {} of 40",
        rx.count(),
        small_rx.count()
    );
    d.stop().await;
}

/// The poll is the backstop for a row due with no wake-up of its own (written straight to
/// the table, as a restore or `hookd-bench`'s fill does), and it runs out while another
/// tenant's events keep waking the dispatcher, each handed and leased without a scan.
/// Counted from each wake-up, the poll never ran out while they came: the row waited
/// for them to stop.
#[sqlx::test]
async fn the_poll_runs_out_while_handed_deliveries_keep_coming(pool: PgPool) {
    let busy_rx = Receiver::start(&[SECRET_A]).await;
    let quiet_rx = Receiver::start(&[SECRET_A]).await;
    endpoint(&pool, opts("busy", busy_rx.url("/hook"))).await;
    let quiet = endpoint(&pool, opts("quiet", quiet_rx.url("/hook"))).await;
    let api = TestApi::start(&pool).await;
    let d = TestDispatcher::start(
        &pool,
        hookd::config::DispatchSettings {
            poll_ms: 500,
            ..dispatch_settings()
        },
    )
    .await;
    wait_listening(&pool).await;
    let mut written = None;
    let mut found = None;
    for i in 0..100 {
        api.enqueue("busy", "a.b", "{}").await;
        if i == 10 {
            write_due_rows(&pool, "quiet", &[quiet], 1).await;
            written = Some(tokio::time::Instant::now());
        }
        if let Some(at) = written
            && found.is_none()
            && quiet_rx.count() > 0
        {
            found = Some(at.elapsed());
        }
        tokio::time::sleep(Duration::from_millis(40)).await;
    }
    let found =
        found.expect("the quiet row was not delivered while the other tenant's events came");
    assert!(found < Duration::from_secs(2), "found after {found:?}");
    assert!(
        d.metrics.claimed_handed.get() > 50,
        "the busy tenant's events were not handed"
    );
    d.stop().await;
}

/// At 200 events/s, sends overlap, and the new deliveries are still leased as handed, not
/// by scans: a freed slot scans only when it was at a cap, and a handed id this loop has
/// leased already (with its endpoint's older rows, or by a scan before its NOTIFY came)
/// is no reason to scan. Before, most freed slots scanned and each such scan leased
/// deliveries whose ids then came and were not leased, which scanned again: 78-90 of
/// 600 were leased as handed. With the poll an hour away, a scan here has no other cause.
#[sqlx::test]
async fn overlapping_sends_leave_new_deliveries_to_the_handed_claim(pool: PgPool) {
    let rx = Receiver::start(&[SECRET_A]).await;
    endpoint(&pool, opts("overlap", rx.url("/hook"))).await;
    let api = Arc::new(TestApi::start(&pool).await);
    let d = TestDispatcher::start(
        &pool,
        hookd::config::DispatchSettings {
            poll_ms: 3_600_000,
            ..dispatch_settings()
        },
    )
    .await;
    wait_listening(&pool).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let mut sent = tokio::task::JoinSet::new();
    let t0 = tokio::time::Instant::now();
    for i in 0..400u64 {
        tokio::time::sleep_until(t0 + Duration::from_millis(5 * i)).await;
        let api = api.clone();
        sent.spawn(async move { api.enqueue("overlap", "a.b", "{}").await });
    }
    while sent.join_next().await.is_some() {}
    assert!(wait_until(Duration::from_secs(10), || async { rx.count() == 400 }).await);
    let handed = d.metrics.claimed_handed.get();
    assert_eq!(d.metrics.claimed.get(), 400);
    // margin for a loaded machine, where a late NOTIFY leaves some to a scan
    assert!(handed >= 300, "only {handed} of 400 leased as handed");
    d.stop().await;
}
