//! Acceptance tests for the ingest path (issue 3): commit-then-2xx, fan-out and filters,
//! idempotent enqueue, byte-exact payloads, every bad input, the batch endpoint, an
//! unreachable database, the `hookd.enqueue()` SQL function and `hookd migrate`.
//! Everything runs against real Postgres and real HTTP.

use crate::common;

use std::collections::{BTreeSet, HashSet};
use std::sync::Arc;
use std::time::Duration;

use axum::http::StatusCode;
use common::*;
use hookd::db::PoolSettings;
use serde_json::{Value, json};
use sqlx::{Executor, PgPool};
use uuid::Uuid;

// ---- helpers ----

async fn count_events(pool: &PgPool) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM hookd.events")
        .fetch_one(pool)
        .await
        .unwrap()
}

async fn count_deliveries(pool: &PgPool) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM hookd.deliveries")
        .fetch_one(pool)
        .await
        .unwrap()
}

/// (events, deliveries) row counts.
async fn counts(pool: &PgPool) -> (i64, i64) {
    (count_events(pool).await, count_deliveries(pool).await)
}

/// POST as `DEFAULT_TENANT` with full control over content type and extra headers.
async fn post_raw(
    api: &TestApi,
    path: &str,
    content_type: Option<&str>,
    headers: &[(&str, &str)],
    body: impl Into<reqwest::Body>,
) -> (StatusCode, Value) {
    post_raw_as(api, DEFAULT_TENANT, path, content_type, headers, body).await
}

async fn post_raw_as(
    api: &TestApi,
    tenant: &str,
    path: &str,
    content_type: Option<&str>,
    headers: &[(&str, &str)],
    body: impl Into<reqwest::Body>,
) -> (StatusCode, Value) {
    let mut req = api
        .request_as(tenant, reqwest::Method::POST, path)
        .await
        .body(body);
    if let Some(ct) = content_type {
        req = req.header("content-type", ct);
    }
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let r = req.send().await.unwrap();
    let status = StatusCode::from_u16(r.status().as_u16()).unwrap();
    let text = r.text().await.unwrap();
    (
        status,
        serde_json::from_str(&text).unwrap_or(Value::String(text)),
    )
}

/// Asserts the documented error shape `{"error":{"code","message"}}` with this code.
fn assert_error(v: &Value, code: &str) {
    let err = v["error"]
        .as_object()
        .unwrap_or_else(|| panic!("not an error body: {v}"));
    assert_eq!(err.len(), 2, "error has exactly code and message: {v}");
    assert_eq!(err["code"], code, "{v}");
    assert!(
        !err["message"].as_str().unwrap_or("").is_empty(),
        "error message must explain the problem: {v}"
    );
}

fn message(tenant: &str, event_type: &str, payload: &str) -> String {
    format!(r#"{{"tenant":"{tenant}","eventType":"{event_type}","payload":{payload}}}"#)
}

fn message_with_key(tenant: &str, event_type: &str, payload: &str, key: &str) -> String {
    format!(
        r#"{{"tenant":"{tenant}","eventType":"{event_type}","payload":{payload},"idempotencyKey":"{key}"}}"#
    )
}

/// Endpoint ids that hold a delivery for `event`.
async fn delivery_endpoints(pool: &PgPool, event: Uuid) -> BTreeSet<Uuid> {
    sqlx::query_scalar::<_, Uuid>("SELECT endpoint_id FROM hookd.deliveries WHERE event_id = $1")
        .bind(event)
        .fetch_all(pool)
        .await
        .unwrap()
        .into_iter()
        .collect()
}

async fn delivery_ids_of(pool: &PgPool, event: Uuid) -> BTreeSet<Uuid> {
    sqlx::query_scalar::<_, Uuid>("SELECT id FROM hookd.deliveries WHERE event_id = $1")
        .bind(event)
        .fetch_all(pool)
        .await
        .unwrap()
        .into_iter()
        .collect()
}

/// A deferred constraint trigger that fails the COMMIT of any transaction holding an
/// event of type `test.poison`: the failure lands after the event and all its delivery
/// rows were inserted, between the inserts and the commit.
async fn install_poison_trigger(pool: &PgPool) {
    pool.execute(
        r#"
        CREATE FUNCTION public.poison_check() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
          IF NEW.event_type = 'test.poison' THEN
            RAISE EXCEPTION 'poisoned event % refused at commit', NEW.id;
          END IF;
          RETURN NULL;
        END $$;
        CREATE CONSTRAINT TRIGGER poison AFTER INSERT ON hookd.events
          DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION public.poison_check();
        "#,
    )
    .await
    .unwrap();
}

fn small_limits() -> hookd::config::ApiSettings {
    let mut s = api_settings();
    s.max_payload_bytes = 1024;
    s.max_batch = 3;
    s
}

// ---- atomicity ----

/// A failure injected between the inserts and the commit leaves neither the event nor
/// any of its deliveries, and the producer gets a 5xx with a JSON error, never a 2xx.
#[sqlx::test]
async fn failure_before_commit_leaves_nothing_and_answers_5xx(pool: PgPool) {
    endpoint(&pool, EndpointOpts::default()).await;
    endpoint(&pool, EndpointOpts::default()).await;
    install_poison_trigger(&pool).await;
    let api = TestApi::start(&pool).await;

    let (status, v) = api
        .post(
            "/v1/messages",
            &message("team-a", "test.poison", r#"{"poison": true}"#),
        )
        .await;
    assert_eq!(status, StatusCode::INTERNAL_SERVER_ERROR, "{v}");
    assert_error(&v, "internal");
    assert_eq!(counts(&pool).await, (0, 0));

    // the same endpoints do get deliveries for a good event, so (0, 0) above is the
    // rollback and not an absent fan-out
    let (_, deliveries) = api.enqueue("team-a", "test.good", "{}").await;
    assert_eq!(deliveries.len(), 2);
    assert_eq!(counts(&pool).await, (1, 2));
}

/// A poisoned request sharing a group commit with good ones fails alone: the group
/// falls back to one transaction per request, so every good request still gets 201 and
/// its rows. A single committer held behind a blocked transaction forces them all into
/// one group; the group-size histogram proves they were grouped.
#[sqlx::test]
async fn poisoned_request_in_a_group_commit_does_not_fail_its_neighbours(pool: PgPool) {
    endpoint(&pool, EndpointOpts::default()).await;
    install_poison_trigger(&pool).await;
    // events of type test.slow wait for advisory lock 4242, which the test holds
    pool.execute(
        r#"
        CREATE FUNCTION public.slow_check() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
          IF NEW.event_type = 'test.slow' THEN PERFORM pg_advisory_xact_lock_shared(4242); END IF;
          RETURN NEW;
        END $$;
        CREATE TRIGGER slow BEFORE INSERT ON hookd.events
          FOR EACH ROW EXECUTE FUNCTION public.slow_check();
        "#,
    )
    .await
    .unwrap();
    let mut settings = api_settings();
    settings.ingest_committers = 1;
    let api = Arc::new(TestApi::start_with(&pool, settings).await);

    let mut lock = pool.acquire().await.unwrap();
    sqlx::query("SELECT pg_advisory_lock(4242)")
        .execute(&mut *lock)
        .await
        .unwrap();
    let slow = {
        let api = api.clone();
        tokio::spawn(async move {
            api.post("/v1/messages", &message("team-a", "test.slow", "1"))
                .await
        })
    };
    // the only committer is now blocked inside the slow request's transaction
    assert!(
        wait_until(Duration::from_secs(10), || async {
            sqlx::query_scalar::<_, i64>(
                "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND wait_event = 'advisory'",
            )
            .fetch_one(&pool)
            .await
            .unwrap()
                == 1
        })
        .await
    );
    let mut tasks = Vec::new();
    for i in 0..20 {
        let api = api.clone();
        tasks.push(tokio::spawn(async move {
            let (s, v) = api
                .post(
                    "/v1/messages",
                    &message("team-a", "test.good", &format!(r#"{{"n":{i}}}"#)),
                )
                .await;
            (false, s, v)
        }));
    }
    {
        let api = api.clone();
        tasks.push(tokio::spawn(async move {
            let (s, v) = api
                .post(
                    "/v1/messages",
                    &message("team-a", "test.poison", r#"{"poison": true}"#),
                )
                .await;
            (true, s, v)
        }));
    }
    // The queued requests cannot be observed from outside the process; give them time to
    // reach the committer's queue. Too short a wait fails the histogram check below
    // rather than passing without proving anything.
    tokio::time::sleep(Duration::from_millis(500)).await;
    sqlx::query("SELECT pg_advisory_unlock(4242)")
        .execute(&mut *lock)
        .await
        .unwrap();
    let (s, v) = slow.await.unwrap();
    assert_eq!(s, StatusCode::CREATED, "{v}");

    let mut good = Vec::new();
    for t in tasks {
        let (poison, s, v) = t.await.unwrap();
        if poison {
            assert_eq!(s, StatusCode::INTERNAL_SERVER_ERROR, "{v}");
            assert_error(&v, "internal");
        } else {
            assert_eq!(s, StatusCode::CREATED, "{v}");
            good.push(ids(&v));
        }
    }
    assert_eq!(good.len(), 20);
    for (event, deliveries) in &good {
        assert_eq!(
            &delivery_ids_of(&pool, *event).await,
            &deliveries.iter().copied().collect::<BTreeSet<_>>()
        );
    }
    let poisoned: i64 =
        sqlx::query_scalar("SELECT count(*) FROM hookd.events WHERE event_type = 'test.poison'")
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(poisoned, 0);
    assert_eq!(counts(&pool).await, (21, 21));

    // two shared transactions were started: the slow one alone, then the other 21 together
    let (_, metrics) = api.get("/metrics").await;
    let metrics = metrics.as_str().unwrap().to_string();
    let line = |name: &str| {
        metrics
            .lines()
            .find(|l| l.starts_with(name))
            .unwrap_or_else(|| panic!("{name} missing from /metrics:\n{metrics}"))
            .split_whitespace()
            .nth(1)
            .unwrap()
            .parse::<f64>()
            .unwrap()
    };
    assert_eq!(line("hookd_ingest_group_size_count"), 2.0, "{metrics}");
    assert_eq!(line("hookd_ingest_group_size_sum"), 22.0, "{metrics}");
}

// ---- fan-out and filters ----

/// One delivery per subscribed endpoint of the tenant, exactly: empty filter, exact
/// type, `prefix.*` and `*` match; other types and prefixes do not; a paused endpoint
/// still gets a (held) delivery; a disabled endpoint and other tenants' endpoints get
/// none. Event and delivery ids are UUIDv7.
#[sqlx::test]
async fn fan_out_follows_event_type_filters_state_and_tenant(pool: PgPool) {
    let ep = |name: &str, types: &[&str]| EndpointOpts {
        name: name.into(),
        event_types: types.iter().map(|s| s.to_string()).collect(),
        ..Default::default()
    };
    let all = endpoint(&pool, ep("all", &[])).await;
    let exact = endpoint(&pool, ep("exact", &["invoice.paid"])).await;
    let prefix = endpoint(&pool, ep("prefix", &["user.*", "invoice.*"])).await;
    let star = endpoint(&pool, ep("star", &["*"])).await;
    let _other_type = endpoint(&pool, ep("other-type", &["invoice.created"])).await;
    let _other_prefix = endpoint(&pool, ep("other-prefix", &["invoices.*", "paid.*"])).await;
    let _longer = endpoint(&pool, ep("longer", &["invoice.paid.late"])).await;
    let paused = endpoint(
        &pool,
        EndpointOpts {
            name: "paused".into(),
            paused: true,
            ..Default::default()
        },
    )
    .await;
    let disabled = endpoint(&pool, ep("disabled", &[])).await;
    let removed = endpoint(&pool, ep("removed", &[])).await;
    let _other_tenant = endpoint(
        &pool,
        EndpointOpts {
            namespace: "team-b".into(),
            name: "b-all".into(),
            ..Default::default()
        },
    )
    .await;
    let _other_tenant_explicit = endpoint(
        &pool,
        EndpointOpts {
            name: "a-ns-b-tenant".into(),
            tenant: Some("team-b".into()),
            ..Default::default()
        },
    )
    .await;
    {
        let mut conn = pool.acquire().await.unwrap();
        hookd::db::endpoints::disable(&mut conn, &[(disabled, 1)], "test")
            .await
            .unwrap();
        let (id, _) = hookd::k8s::sync::remove_endpoint(&mut conn, "team-a", "removed")
            .await
            .unwrap()
            .unwrap();
        assert_eq!(id, removed);
    }
    let api = TestApi::start(&pool).await;

    let (event, deliveries) = api.enqueue("team-a", "invoice.paid", "{}").await;
    assert_eq!(event.get_version_num(), 7, "{event}");
    for d in &deliveries {
        assert_eq!(d.get_version_num(), 7, "{d}");
    }
    let expected: BTreeSet<Uuid> = [all, exact, prefix, star, paused].into_iter().collect();
    assert_eq!(delivery_endpoints(&pool, event).await, expected);
    assert_eq!(
        deliveries.iter().copied().collect::<BTreeSet<_>>(),
        delivery_ids_of(&pool, event).await
    );
    assert_eq!(deliveries.len(), 5, "no duplicate delivery ids");

    // the paused endpoint's delivery exists and waits
    let (status, attempts): (String, i32) = sqlx::query_as(
        "SELECT status, attempts FROM hookd.deliveries WHERE event_id = $1 AND endpoint_id = $2",
    )
    .bind(event)
    .bind(paused)
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!((status.as_str(), attempts), ("pending", 0));

    // a type no filter names reaches only the catch-all endpoints
    let (event2, _) = api.enqueue("team-a", "order.shipped", "{}").await;
    let expected: BTreeSet<Uuid> = [all, star, paused].into_iter().collect();
    assert_eq!(delivery_endpoints(&pool, event2).await, expected);

    // a tenant without endpoints: an event with no deliveries is still a 201
    let (event3, d3) = api.enqueue("team-c", "invoice.paid", "{}").await;
    assert!(d3.is_empty());
    assert!(delivery_endpoints(&pool, event3).await.is_empty());
    // the deliveries' tenant column is the event's tenant
    let foreign: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM hookd.deliveries d JOIN hookd.endpoints e ON e.id = d.endpoint_id
         WHERE d.tenant <> e.tenant OR e.tenant <> 'team-a'",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(foreign, 0);
}

// ---- idempotency ----

fn keyed_post(
    api: &Arc<TestApi>,
    body: String,
    header: Option<&'static str>,
) -> tokio::task::JoinHandle<(StatusCode, Value)> {
    let api = api.clone();
    tokio::spawn(async move {
        let headers: Vec<(&str, &str)> =
            header.map(|h| ("Idempotency-Key", h)).into_iter().collect();
        let tenant = serde_json::from_str::<Value>(&body).unwrap()["tenant"]
            .as_str()
            .unwrap()
            .to_string();
        post_raw_as(
            &api,
            &tenant,
            "/v1/messages",
            Some("application/json"),
            &headers,
            body,
        )
        .await
    })
}

/// Asserts 50 concurrent answers: one 201, 49 200, all with the same body.
async fn assert_one_created(tasks: Vec<tokio::task::JoinHandle<(StatusCode, Value)>>) -> Value {
    let mut created = 0;
    let mut repeated = 0;
    let mut bodies = HashSet::new();
    let mut first = None;
    for t in tasks {
        let (s, v) = t.await.unwrap();
        match s {
            StatusCode::CREATED => created += 1,
            StatusCode::OK => repeated += 1,
            other => panic!("unexpected {other}: {v}"),
        }
        bodies.insert(v.to_string());
        first.get_or_insert(v);
    }
    assert_eq!((created, repeated), (1, 49));
    assert_eq!(
        bodies.len(),
        1,
        "every answer carries the same ids: {bodies:?}"
    );
    first.unwrap()
}

/// 50 concurrent requests with one `Idempotency-Key` header end as exactly one event:
/// one 201, 49 200, all with the same eventId and deliveryIds.
#[sqlx::test]
async fn concurrent_duplicates_by_header_end_as_one_event(pool: PgPool) {
    endpoint(&pool, EndpointOpts::default()).await;
    endpoint(&pool, EndpointOpts::default()).await;
    let api = Arc::new(TestApi::start(&pool).await);
    let body = message("team-a", "invoice.paid", r#"{"id":42}"#);
    let tasks = (0..50)
        .map(|_| keyed_post(&api, body.clone(), Some("order-42")))
        .collect();
    let v = assert_one_created(tasks).await;
    let (event, deliveries) = ids(&v);
    assert_eq!(deliveries.len(), 2);
    assert_eq!(counts(&pool).await, (1, 2));
    let key: Option<String> =
        sqlx::query_scalar("SELECT idempotency_key FROM hookd.events WHERE id = $1")
            .bind(event)
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(key.as_deref(), Some("order-42"));
}

/// The `idempotencyKey` body field behaves exactly like the header, and the two name
/// the same key: a field-keyed event is found again by the header.
#[sqlx::test]
async fn concurrent_duplicates_by_field_end_as_one_event(pool: PgPool) {
    endpoint(&pool, EndpointOpts::default()).await;
    let api = Arc::new(TestApi::start(&pool).await);
    let body = message_with_key("team-a", "invoice.paid", r#"{"id":7}"#, "order-7");
    let tasks = (0..50)
        .map(|_| keyed_post(&api, body.clone(), None))
        .collect();
    let v = assert_one_created(tasks).await;
    assert_eq!(counts(&pool).await, (1, 1));

    let (s, again) = keyed_post(
        &api,
        message("team-a", "invoice.paid", r#"{"id":7}"#),
        Some("order-7"),
    )
    .await
    .unwrap();
    assert_eq!(s, StatusCode::OK, "{again}");
    assert_eq!(again, v);
    // header and field agreeing is fine too
    let (s, again) = keyed_post(&api, body, Some("order-7")).await.unwrap();
    assert_eq!((s, again), (StatusCode::OK, v));
    assert_eq!(counts(&pool).await, (1, 1));
}

/// A reused key with a different payload or event type is refused with 409
/// `idempotency_key_conflict` and writes nothing; the same key under another tenant is
/// an independent event; header and field that disagree are refused with 422.
#[sqlx::test]
async fn key_reuse_with_other_content_is_refused(pool: PgPool) {
    endpoint(&pool, EndpointOpts::default()).await;
    endpoint(
        &pool,
        EndpointOpts {
            namespace: "team-b".into(),
            ..Default::default()
        },
    )
    .await;
    let api = Arc::new(TestApi::start(&pool).await);
    let (s, original) = keyed_post(
        &api,
        message("team-a", "invoice.paid", r#"{"amount":1}"#),
        Some("k-1"),
    )
    .await
    .unwrap();
    assert_eq!(s, StatusCode::CREATED, "{original}");
    let before = counts(&pool).await;
    assert_eq!(before, (1, 1));

    for body in [
        message("team-a", "invoice.paid", r#"{"amount":2}"#),
        // the same value with other bytes is other content: payloads are byte-exact
        message("team-a", "invoice.paid", r#"{"amount": 1}"#),
        message("team-a", "invoice.refunded", r#"{"amount":1}"#),
    ] {
        let (s, v) = keyed_post(&api, body, Some("k-1")).await.unwrap();
        assert_eq!(s, StatusCode::CONFLICT, "{v}");
        assert_error(&v, "idempotency_key_conflict");
        assert_eq!(counts(&pool).await, before);
    }

    let (s, other) = keyed_post(
        &api,
        message("team-b", "invoice.paid", r#"{"amount":2}"#),
        Some("k-1"),
    )
    .await
    .unwrap();
    assert_eq!(s, StatusCode::CREATED, "{other}");
    assert_ne!(other["eventId"], original["eventId"]);
    assert_eq!(counts(&pool).await, (2, 2));

    let (s, v) = keyed_post(
        &api,
        message_with_key("team-a", "invoice.paid", r#"{"amount":1}"#, "k-2"),
        Some("k-1"),
    )
    .await
    .unwrap();
    assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY, "{v}");
    assert_error(&v, "idempotency_key_mismatch");
    assert_eq!(counts(&pool).await, (2, 2));

    // the original is still answered with its ids
    let (s, again) = keyed_post(
        &api,
        message("team-a", "invoice.paid", r#"{"amount":1}"#),
        Some("k-1"),
    )
    .await
    .unwrap();
    assert_eq!((s, again), (StatusCode::OK, original));
}

// ---- byte-exact payloads ----

/// The payload's exact bytes (key order, whitespace, big integers, a number beyond f64)
/// are what is stored and what GET returns, next to the deliveries in lowercase state.
#[sqlx::test]
async fn payload_bytes_survive_storage_and_read_back(pool: PgPool) {
    let ep = endpoint(&pool, EndpointOpts::default()).await;
    let api = TestApi::start(&pool).await;
    let payload = "{\"z\": 1,  \"a\":123456789012345678901234567890, \"f\":1.0e400,\n\t\"s\":\"\\u00e9\u{e9}\", \"n\":[ ]}";
    let (event, deliveries) = api.enqueue("team-a", "invoice.paid", payload).await;

    let stored: String = sqlx::query_scalar("SELECT payload FROM hookd.events WHERE id = $1")
        .bind(event)
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(stored, payload);

    let r = api
        .request_as(
            "team-a",
            reqwest::Method::GET,
            &format!("/v1/messages/{event}"),
        )
        .await
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 200);
    let text = r.text().await.unwrap();
    assert!(
        text.contains(&format!("\"payload\":{payload},")),
        "GET must return the payload byte for byte: {text}"
    );
    // 1.0e400 does not fit an f64, so check the rest with the payload cut out
    let v: Value = serde_json::from_str(&text.replace(payload, "null")).unwrap();
    assert_eq!(v["eventId"], event.to_string());
    assert_eq!(v["tenant"], "team-a");
    assert_eq!(v["eventType"], "invoice.paid");
    assert!(v["createdAt"].as_str().is_some(), "{v}");
    let ds = v["deliveries"].as_array().unwrap();
    assert_eq!(ds.len(), 1);
    assert_eq!(ds[0]["deliveryId"], deliveries[0].to_string());
    assert_eq!(ds[0]["endpointId"], ep.to_string());
    assert_eq!(ds[0]["status"], "pending");
    assert_eq!(ds[0]["attempts"], 0);

    // scalars are payloads too, kept as sent
    let (e2, _) = api.enqueue("team-a", "invoice.paid", "  \"x\"  ").await;
    let stored: String = sqlx::query_scalar("SELECT payload FROM hookd.events WHERE id = $1")
        .bind(e2)
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(
        stored, "\"x\"",
        "RawValue keeps the value's bytes, not the padding"
    );
}

// ---- bad input ----

/// Every malformed request is refused with its status, a JSON error naming the
/// problem, and no row written.
#[sqlx::test]
async fn bad_input_is_refused_without_writing(pool: PgPool) {
    endpoint(&pool, EndpointOpts::default()).await;
    let api = TestApi::start_with(&pool, small_limits()).await;
    let json = Some("application/json");
    let big_payload = format!(r#"{{"x":"{}"}}"#, "a".repeat(1100));
    let cases: Vec<(&str, Option<&str>, String, StatusCode, &str)> = vec![
        (
            "malformed JSON",
            json,
            r#"{"tenant":"team-a","eventType":"a","payload":{"#.into(),
            StatusCode::BAD_REQUEST,
            "malformed_json",
        ),
        (
            "not JSON at all",
            json,
            "tenant=team-a".into(),
            StatusCode::BAD_REQUEST,
            "malformed_json",
        ),
        (
            "payload over max_payload_bytes",
            json,
            message("team-a", "a", &big_payload),
            StatusCode::PAYLOAD_TOO_LARGE,
            "payload_too_large",
        ),
        (
            "body over the overall limit",
            json,
            format!(
                "{}{}",
                message("team-a", "a", "1"),
                " ".repeat(1024 + 16 * 1024)
            ),
            StatusCode::PAYLOAD_TOO_LARGE,
            "body_too_large",
        ),
        (
            "missing eventType",
            json,
            r#"{"tenant":"team-a","payload":1}"#.into(),
            StatusCode::UNPROCESSABLE_ENTITY,
            "missing_field",
        ),
        (
            "missing payload",
            json,
            r#"{"tenant":"team-a","eventType":"a"}"#.into(),
            StatusCode::UNPROCESSABLE_ENTITY,
            "missing_field",
        ),
        (
            "null payload",
            json,
            r#"{"tenant":"team-a","eventType":"a","payload":null}"#.into(),
            StatusCode::UNPROCESSABLE_ENTITY,
            "missing_field",
        ),
        (
            "eventType with an empty segment",
            json,
            message("team-a", "a..b", "1"),
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_event_type",
        ),
        (
            "eventType with a space",
            json,
            message("team-a", "invoice paid", "1"),
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_event_type",
        ),
        (
            "wildcard eventType",
            json,
            message("team-a", "invoice.*", "1"),
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_event_type",
        ),
        (
            "unknown field",
            json,
            r#"{"tenant":"team-a","eventType":"a","payload":1,"idempotency_key":"x"}"#.into(),
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_field",
        ),
        (
            "wrong field type",
            json,
            r#"{"tenant":1,"eventType":"a","payload":1}"#.into(),
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_field",
        ),
        (
            "invalid idempotency key",
            json,
            message_with_key("team-a", "a", "1", "has space"),
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_idempotency_key",
        ),
        (
            "text/plain",
            Some("text/plain"),
            message("team-a", "a", "1"),
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "unsupported_media_type",
        ),
        (
            "no content type",
            None,
            message("team-a", "a", "1"),
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "unsupported_media_type",
        ),
    ];
    for (what, ct, body, status, code) in cases {
        let (s, v) = post_raw(&api, "/v1/messages", ct, &[], body).await;
        assert_eq!(s, status, "{what}: {v}");
        assert_error(&v, code);
        assert_eq!(counts(&pool).await, (0, 0), "{what} wrote rows");
    }

    let batch = |n: usize| {
        let msgs: Vec<Value> = (0..n)
            .map(|i| json!({"tenant":"team-a","eventType":"a","payload":i}))
            .collect();
        json!({ "messages": msgs }).to_string()
    };
    let batch_cases: Vec<(&str, Option<&str>, String, StatusCode, &str)> = vec![
        (
            "batch over max_batch",
            json,
            batch(4),
            StatusCode::UNPROCESSABLE_ENTITY,
            "batch_too_large",
        ),
        (
            "empty batch",
            json,
            batch(0),
            StatusCode::UNPROCESSABLE_ENTITY,
            "empty_batch",
        ),
        (
            "batch with one invalid message",
            json,
            r#"{"messages":[{"tenant":"team-a","eventType":"a","payload":1},{"tenant":"team-a","eventType":"a"}]}"#.into(),
            StatusCode::UNPROCESSABLE_ENTITY,
            "missing_field",
        ),
        (
            "batch that is not JSON",
            json,
            "[".into(),
            StatusCode::BAD_REQUEST,
            "malformed_json",
        ),
        (
            "batch as text/plain",
            Some("text/plain"),
            batch(1),
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "unsupported_media_type",
        ),
    ];
    for (what, ct, body, status, code) in batch_cases {
        let (s, v) = post_raw(&api, "/v1/messages/batch", ct, &[], body).await;
        assert_eq!(s, status, "{what}: {v}");
        assert_error(&v, code);
        assert_eq!(counts(&pool).await, (0, 0), "{what} wrote rows");
    }

    let (s, v) = api.get("/v1/messages/not-a-uuid").await;
    assert_eq!(s, StatusCode::BAD_REQUEST, "{v}");
    assert_error(&v, "invalid_id");
    let (s, v) = api.get(&format!("/v1/messages/{}", Uuid::now_v7())).await;
    assert_eq!(s, StatusCode::NOT_FOUND, "{v}");
    assert_error(&v, "not_found");

    // and a payload at exactly the limit is accepted
    let at_limit = format!(r#""{}""#, "a".repeat(1022));
    assert_eq!(at_limit.len(), 1024);
    api.enqueue("team-a", "a", &at_limit).await;
    assert_eq!(count_events(&pool).await, 1);
}

// ---- batch ----

/// A batch commits in one transaction: all messages exist with their fan-out, in input
/// order; one poisoned message means none of them exist and a 5xx.
#[sqlx::test]
async fn batch_is_one_transaction(pool: PgPool) {
    endpoint(&pool, EndpointOpts::default()).await;
    endpoint(&pool, EndpointOpts::default()).await;
    install_poison_trigger(&pool).await;
    let api = TestApi::start(&pool).await;

    let body = json!({"messages": [
        {"tenant":"team-a","eventType":"a.one","payload":{"n":1}},
        {"tenant":"team-a","eventType":"a.two","payload":{"n":2}},
        {"tenant":"team-a","eventType":"a.three","payload":{"n":3}},
    ]})
    .to_string();
    let (s, v) = api.post("/v1/messages/batch", &body).await;
    assert_eq!(s, StatusCode::CREATED, "{v}");
    let results = v["results"].as_array().unwrap();
    assert_eq!(results.len(), 3);
    for (r, ty) in results.iter().zip(["a.one", "a.two", "a.three"]) {
        assert_eq!(r["created"], true);
        let (event, deliveries) = ids(r);
        assert_eq!(deliveries.len(), 2);
        let stored: String =
            sqlx::query_scalar("SELECT event_type FROM hookd.events WHERE id = $1")
                .bind(event)
                .fetch_one(&pool)
                .await
                .unwrap();
        assert_eq!(stored, ty, "results are in input order");
        assert_eq!(
            delivery_ids_of(&pool, event).await,
            deliveries.into_iter().collect()
        );
    }
    assert_eq!(counts(&pool).await, (3, 6));

    let poisoned = json!({"messages": [
        {"tenant":"team-a","eventType":"b.one","payload":1},
        {"tenant":"team-a","eventType":"test.poison","payload":{"poison":true}},
        {"tenant":"team-a","eventType":"b.three","payload":3},
    ]})
    .to_string();
    let (s, v) = api.post("/v1/messages/batch", &poisoned).await;
    assert_eq!(s, StatusCode::INTERNAL_SERVER_ERROR, "{v}");
    assert_error(&v, "internal");
    assert_eq!(
        counts(&pool).await,
        (3, 6),
        "no message of the batch exists"
    );
}

/// Idempotency keys in a batch: new keys are created, known keys (from an earlier
/// request or repeated within the batch) return the original ids with created=false;
/// a fully repeated batch answers 200; a conflicting key fails the whole batch with 409;
/// an Idempotency-Key header on a batch is refused.
#[sqlx::test]
async fn batch_with_repeated_keys(pool: PgPool) {
    endpoint(&pool, EndpointOpts::default()).await;
    let api = TestApi::start(&pool).await;
    let (s, first) = api
        .post(
            "/v1/messages",
            &message_with_key("team-a", "a", r#"{"k":1}"#, "k1"),
        )
        .await;
    assert_eq!(s, StatusCode::CREATED);

    let body = json!({"messages": [
        {"tenant":"team-a","eventType":"a","payload":{"k":1},"idempotencyKey":"k1"},
        {"tenant":"team-a","eventType":"a","payload":{"k":2},"idempotencyKey":"k2"},
        {"tenant":"team-a","eventType":"a","payload":{"k":2},"idempotencyKey":"k2"},
        {"tenant":"team-a","eventType":"a","payload":{"k":3}},
    ]})
    .to_string();
    let (s, v) = api.post("/v1/messages/batch", &body).await;
    assert_eq!(s, StatusCode::CREATED, "{v}");
    let r = v["results"].as_array().unwrap().clone();
    assert_eq!(
        r.iter().map(|x| x["created"].clone()).collect::<Vec<_>>(),
        vec![json!(false), json!(true), json!(false), json!(true)]
    );
    assert_eq!(r[0]["eventId"], first["eventId"]);
    assert_eq!(r[0]["deliveryIds"], first["deliveryIds"]);
    assert_eq!(r[1]["eventId"], r[2]["eventId"]);
    assert_eq!(r[1]["deliveryIds"], r[2]["deliveryIds"]);
    assert_eq!(counts(&pool).await, (3, 3));

    let only_keyed = json!({"messages": [
        {"tenant":"team-a","eventType":"a","payload":{"k":2},"idempotencyKey":"k2"},
        {"tenant":"team-a","eventType":"a","payload":{"k":1},"idempotencyKey":"k1"},
    ]})
    .to_string();
    let (s, v) = api.post("/v1/messages/batch", &only_keyed).await;
    assert_eq!(s, StatusCode::OK, "{v}");
    assert_eq!(v["results"][0]["eventId"], r[1]["eventId"]);
    assert_eq!(v["results"][1]["eventId"], first["eventId"]);
    assert_eq!(counts(&pool).await, (3, 3));

    let conflicting = json!({"messages": [
        {"tenant":"team-a","eventType":"a","payload":{"k":9},"idempotencyKey":"k9"},
        {"tenant":"team-a","eventType":"a","payload":{"k":"other"},"idempotencyKey":"k1"},
    ]})
    .to_string();
    let (s, v) = api.post("/v1/messages/batch", &conflicting).await;
    assert_eq!(s, StatusCode::CONFLICT, "{v}");
    assert_error(&v, "idempotency_key_conflict");
    assert_eq!(counts(&pool).await, (3, 3));

    let (s, v) = post_raw(
        &api,
        "/v1/messages/batch",
        Some("application/json"),
        &[("Idempotency-Key", "k1")],
        only_keyed,
    )
    .await;
    assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY, "{v}");
    assert_error(&v, "idempotency_key_header_on_batch");
}

// ---- database unreachable ----

/// With the database unreachable the API never answers 2xx: enqueue is a 503
/// `database_unavailable` (with Retry-After), `/readyz` is 503, `/healthz` stays 200.
/// Authentication is off here: with it on, the token check is what meets the outage
/// first (503 `auth_unavailable`, tested in tests/auth.rs).
#[tokio::test]
async fn unreachable_database_is_503_never_2xx() {
    let dead = hookd::db::connect_lazy(&PoolSettings {
        url: "postgres://postgres@127.0.0.1:1/x".into(),
        max_connections: 2,
        acquire_timeout: Duration::from_secs(1),
    })
    .unwrap();
    let mut settings = api_settings();
    settings.auth = hookd::auth::AuthMode::None;
    let api = TestApi::start_with(&dead, settings).await;

    let r = api
        .client
        .post(format!("{}/v1/messages", api.base))
        .header("content-type", "application/json")
        .body(message("team-a", "invoice.paid", "{}"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 503);
    assert_eq!(r.headers()["retry-after"], "1");
    let v: Value = r.json().await.unwrap();
    assert_error(&v, "database_unavailable");

    let body = json!({"messages":[{"tenant":"team-a","eventType":"a","payload":1}]}).to_string();
    let (s, v) = api.post("/v1/messages/batch", &body).await;
    assert_eq!(s, StatusCode::SERVICE_UNAVAILABLE, "{v}");
    assert_error(&v, "database_unavailable");

    let (s, v) = api.get(&format!("/v1/messages/{}", Uuid::now_v7())).await;
    assert_eq!(s, StatusCode::SERVICE_UNAVAILABLE, "{v}");
    assert_error(&v, "database_unavailable");

    let (s, v) = api.get("/readyz").await;
    assert_eq!(s, StatusCode::SERVICE_UNAVAILABLE, "{v}");
    assert_error(&v, "database_unavailable");
    let (s, v) = api.get("/healthz").await;
    assert_eq!((s, v), (StatusCode::OK, Value::String("ok".into())));
}

// ---- the SQL function ----

async fn business_table(pool: &PgPool) {
    pool.execute("CREATE TABLE public.orders (id int PRIMARY KEY, total int NOT NULL)")
        .await
        .unwrap();
}

/// `hookd.enqueue()` inside a producer's committed transaction: the business row, the
/// event (exact payload) and its fan-out all exist.
#[sqlx::test]
async fn sql_enqueue_commits_with_the_business_transaction(pool: PgPool) {
    let a = endpoint(&pool, EndpointOpts::default()).await;
    let b = endpoint(
        &pool,
        EndpointOpts {
            event_types: vec!["invoice.*".into()],
            ..Default::default()
        },
    )
    .await;
    endpoint(
        &pool,
        EndpointOpts {
            event_types: vec!["user.*".into()],
            ..Default::default()
        },
    )
    .await;
    endpoint(
        &pool,
        EndpointOpts {
            namespace: "team-b".into(),
            ..Default::default()
        },
    )
    .await;
    business_table(&pool).await;

    let mut tx = pool.begin().await.unwrap();
    sqlx::query("INSERT INTO public.orders VALUES (1, 100)")
        .execute(&mut *tx)
        .await
        .unwrap();
    let event: Uuid =
        sqlx::query_scalar("SELECT hookd.enqueue('team-a', 'invoice.paid', '{\"a\":1}')")
            .fetch_one(&mut *tx)
            .await
            .unwrap();
    // not visible outside the transaction before commit
    assert_eq!(count_events(&pool).await, 0);
    tx.commit().await.unwrap();

    assert_eq!(event.get_version_num(), 7);
    let (tenant, ty, payload): (String, String, String) =
        sqlx::query_as("SELECT tenant, event_type, payload FROM hookd.events WHERE id = $1")
            .bind(event)
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(
        (tenant.as_str(), ty.as_str(), payload.as_str()),
        ("team-a", "invoice.paid", r#"{"a":1}"#)
    );
    assert_eq!(
        delivery_endpoints(&pool, event).await,
        [a, b].into_iter().collect()
    );
    for d in delivery_ids_of(&pool, event).await {
        assert_eq!(d.get_version_num(), 7);
    }
    let orders: i64 = sqlx::query_scalar("SELECT count(*) FROM public.orders")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(orders, 1);

    // the API reads it like any other event
    let api = TestApi::start(&pool).await;
    let (s, v) = api.get(&format!("/v1/messages/{event}")).await;
    assert_eq!(s, StatusCode::OK, "{v}");
    assert_eq!(v["payload"], json!({"a":1}));
    assert_eq!(v["deliveries"].as_array().unwrap().len(), 2);
}

/// `hookd.enqueue()` inside a producer's rolled-back transaction leaves no business row,
/// no event and no delivery.
#[sqlx::test]
async fn sql_enqueue_rolls_back_with_the_business_transaction(pool: PgPool) {
    endpoint(&pool, EndpointOpts::default()).await;
    business_table(&pool).await;
    let mut tx = pool.begin().await.unwrap();
    sqlx::query("INSERT INTO public.orders VALUES (1, 100)")
        .execute(&mut *tx)
        .await
        .unwrap();
    let _: Uuid = sqlx::query_scalar(
        "SELECT hookd.enqueue('team-a', 'invoice.paid', '{\"a\":1}', 'order-1')",
    )
    .fetch_one(&mut *tx)
    .await
    .unwrap();
    let inside: (i64, i64) = sqlx::query_as(
        "SELECT (SELECT count(*) FROM hookd.events), (SELECT count(*) FROM hookd.deliveries)",
    )
    .fetch_one(&mut *tx)
    .await
    .unwrap();
    assert_eq!(inside, (1, 1), "the rows existed inside the transaction");
    tx.rollback().await.unwrap();

    assert_eq!(counts(&pool).await, (0, 0));
    let orders: i64 = sqlx::query_scalar("SELECT count(*) FROM public.orders")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(orders, 0);
    // the key was not consumed by the rolled-back attempt
    let again: Uuid = sqlx::query_scalar(
        "SELECT hookd.enqueue('team-a', 'invoice.paid', '{\"a\":1}', 'order-1')",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(counts(&pool).await, (1, 1));
    assert_eq!(again.get_version_num(), 7);
}

/// `hookd.enqueue()` idempotency and validation: a repeat returns the same id and writes
/// nothing; the same key with other content, an invalid JSON payload or an invalid
/// event type raises; the key is shared with the HTTP API.
#[sqlx::test]
async fn sql_enqueue_idempotency_and_validation(pool: PgPool) {
    endpoint(&pool, EndpointOpts::default()).await;
    let enqueue = |payload: &'static str, key: Option<&'static str>| {
        let pool = pool.clone();
        async move {
            sqlx::query_scalar::<_, Uuid>("SELECT hookd.enqueue('team-a', 'invoice.paid', $1, $2)")
                .bind(payload)
                .bind(key)
                .fetch_one(&pool)
                .await
        }
    };
    let first = enqueue(r#"{"a":1}"#, Some("k")).await.unwrap();
    let again = enqueue(r#"{"a":1}"#, Some("k")).await.unwrap();
    assert_eq!(first, again);
    assert_eq!(counts(&pool).await, (1, 1));

    let err = enqueue(r#"{"a":2}"#, Some("k")).await.unwrap_err();
    let db = err.as_database_error().expect("a database error");
    assert_eq!(db.code().as_deref(), Some("23505"), "{db}");
    assert!(db.message().contains("different content"), "{db}");

    let err = enqueue(r#"{"a":"#, None).await.unwrap_err();
    let db = err.as_database_error().expect("a database error");
    assert_eq!(db.code().as_deref(), Some("22P02"), "{db}");

    let err = sqlx::query_scalar::<_, Uuid>("SELECT hookd.enqueue('team-a', 'a..b', '1')")
        .fetch_one(&pool)
        .await
        .unwrap_err();
    let db = err.as_database_error().expect("a database error");
    assert_eq!(db.code().as_deref(), Some("22023"), "{db}");
    assert!(db.message().contains("invalid event type"), "{db}");
    assert_eq!(counts(&pool).await, (1, 1));

    // exactly the three documented forms, no stale overload: the 4-argument one (whose
    // grants producers already hold), the 5-argument one with a consumer (issue 15) and
    // the 6-argument one with an ordering key (issue 34); none has defaults that make a
    // call ambiguous
    let overloads: Vec<String> = sqlx::query_scalar(
        "SELECT pg_get_function_identity_arguments(p.oid) FROM pg_proc p
         JOIN pg_namespace n ON n.oid = p.pronamespace
         WHERE n.nspname = 'hookd' AND p.proname = 'enqueue' ORDER BY p.pronargs",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    assert_eq!(
        overloads,
        [
            "tenant text, event_type text, payload text, idempotency_key text",
            "tenant text, event_type text, payload text, idempotency_key text, consumer text",
            "tenant text, event_type text, payload text, idempotency_key text, consumer text, ordering_key text"
        ]
    );

    // the HTTP API sees the same key space: the SQL event is its original
    let api = TestApi::start(&pool).await;
    let (s, v) = api
        .post(
            "/v1/messages",
            &message_with_key("team-a", "invoice.paid", r#"{"a":1}"#, "k"),
        )
        .await;
    assert_eq!(s, StatusCode::OK, "{v}");
    assert_eq!(v["eventId"], first.to_string());
    assert_eq!(counts(&pool).await, (1, 1));
}

// ---- migrations ----

/// A fresh empty database on the same server; returns its name and URL.
async fn empty_database(pool: &PgPool) -> (String, String) {
    let name = format!("hookd_empty_{}", Uuid::now_v7().simple());
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!("CREATE DATABASE {name}")))
        .execute(pool)
        .await
        .unwrap();
    let url = database_url(pool);
    let base = url.rsplit_once('/').unwrap().0;
    (name.clone(), format!("{base}/{name}"))
}

async fn drop_database(pool: &PgPool, name: &str) {
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "DROP DATABASE IF EXISTS {name} WITH (FORCE)"
    )))
    .execute(pool)
    .await
    .unwrap();
}

async fn hookd(args: &[&str], database_url: &str) -> std::process::Output {
    HookdCommand::new(args)
        .env("DATABASE_URL", database_url)
        .env("HOOKD_LOG", "warn")
        .env_remove("HOOKD_LISTEN")
        .run()
        .await
}

/// `hookd migrate` on an empty database succeeds, and again (idempotent); the schema is
/// then accepted by the start-up check.
#[sqlx::test]
async fn migrate_is_idempotent(pool: PgPool) {
    let (name, url) = empty_database(&pool).await;
    for run in 1..=2 {
        let out = hookd(&["migrate"], &url).await;
        assert!(
            out.status.success(),
            "run {run}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let migrated = hookd::db::connect_lazy(&PoolSettings {
        url: url.clone(),
        max_connections: 1,
        acquire_timeout: Duration::from_secs(5),
    })
    .unwrap();
    hookd::db::check_schema(&migrated).await.unwrap();
    let applied: i64 = sqlx::query_scalar("SELECT count(*) FROM public._sqlx_migrations")
        .fetch_one(&migrated)
        .await
        .unwrap();
    assert_eq!(applied, hookd::db::MIGRATOR.iter().count() as i64);
    migrated.close().await;
    drop_database(&pool, &name).await;
}

/// `hookd api` on an unmigrated database exits non-zero and tells the operator to run
/// `hookd migrate`.
#[sqlx::test]
async fn api_refuses_an_unmigrated_database(pool: PgPool) {
    let (name, url) = empty_database(&pool).await;
    let out = hookd(&["api", "--listen", "127.0.0.1:0"], &url).await;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(stderr.contains("not migrated"), "{stderr}");
    assert!(stderr.contains("hookd migrate"), "{stderr}");
    drop_database(&pool, &name).await;
}

/// A TCP proxy in front of Postgres that counts the client's round trips: each simple
/// query ('Q') and each Sync ('S') that ends an extended-protocol exchange waits for the
/// server's ReadyForQuery. Plain TCP: the client must not ask for TLS.
struct RoundTrips {
    port: u16,
    count: Arc<std::sync::atomic::AtomicUsize>,
}

async fn count_round_trips(upstream: u16) -> RoundTrips {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let count = Arc::new(AtomicUsize::new(0));
    let counted = count.clone();
    tokio::spawn(async move {
        while let Ok((client, _)) = listener.accept().await {
            let Ok(server) = tokio::net::TcpStream::connect(("127.0.0.1", upstream)).await else {
                continue;
            };
            let counted = counted.clone();
            tokio::spawn(async move {
                let (mut cr, mut cw) = client.into_split();
                let (mut sr, mut sw) = server.into_split();
                tokio::spawn(async move { tokio::io::copy(&mut sr, &mut cw).await });
                // the startup message has no type byte; every later one is a type byte
                // and a length that counts itself
                let mut pending: Vec<u8> = Vec::new();
                let mut started = false;
                let mut buf = vec![0u8; 64 * 1024];
                while let Ok(n) = cr.read(&mut buf).await {
                    if n == 0 || sw.write_all(&buf[..n]).await.is_err() {
                        break;
                    }
                    pending.extend_from_slice(&buf[..n]);
                    loop {
                        let head = usize::from(started);
                        if pending.len() < head + 4 {
                            break;
                        }
                        let len = u32::from_be_bytes(pending[head..head + 4].try_into().unwrap())
                            as usize;
                        if pending.len() < head + len {
                            break;
                        }
                        if started && matches!(pending[0], b'Q' | b'S') {
                            counted.fetch_add(1, Ordering::SeqCst);
                        }
                        pending.drain(..head + len);
                        started = true;
                    }
                }
            });
        }
    });
    RoundTrips { port, count }
}

/// An acknowledgement is three statements on a connection: the transaction's start with
/// its settings (one message), the insert with its fan-out, and COMMIT. The settings were
/// a statement of their own (issue 32's latency path). The pool adds a check of the
/// connection as it hands it out, which finds a connection the server closed (a restart,
/// `pg_terminate_backend`) before a request uses it, and one as it takes it back, after
/// the answer: five round trips per ack, six before.
#[sqlx::test]
async fn an_acknowledgement_is_three_statements(pool: PgPool) {
    use std::sync::atomic::Ordering;
    endpoint(
        &pool,
        EndpointOpts {
            tenant: Some("trips".into()),
            ..Default::default()
        },
    )
    .await;
    let proxy = count_round_trips(pool.connect_options().get_port()).await;
    let o = pool.connect_options();
    let counted = hookd::db::connect_lazy(&PoolSettings {
        url: format!(
            "postgres://{}@127.0.0.1:{}/{}?sslmode=disable",
            o.get_username(),
            proxy.port,
            o.get_database().unwrap_or("postgres")
        ),
        max_connections: 1,
        acquire_timeout: Duration::from_secs(5),
    })
    .unwrap();
    let outbox = hookd::outbox::Outbox::start(
        counted,
        hookd::outbox::OutboxConfig {
            committers: 1,
            ..hookd::outbox::OutboxConfig::defaults()
        },
        hookd::notify::Notifier::disabled(),
        hookd::metrics::Metrics::new(),
    );
    let message = |i: u32| hookd::outbox::NewMessage {
        tenant: "trips".into(),
        event_type: "a.b".into(),
        payload: format!(r#"{{"i":{i}}}"#),
        idempotency_key: None,
        consumer: None,
        origin: None,
        trace: None,
        ordering_key: None,
    };
    // The pool's check after an ack runs after its answer: wait for the round trips to
    // reach what is expected, then a little longer for any beyond it.
    let settled = |expected: usize| {
        let count = proxy.count.clone();
        async move {
            wait_until(Duration::from_secs(5), || {
                let count = count.clone();
                async move { count.load(Ordering::SeqCst) >= expected }
            })
            .await;
            tokio::time::sleep(Duration::from_millis(100)).await;
            count.load(Ordering::SeqCst)
        }
    };
    // the connection is made and the statements prepared
    for i in 0..2 {
        outbox.enqueue(vec![message(i)]).await.unwrap();
    }
    // until the warm-up's last check has run: the count holds still
    let mut last = usize::MAX;
    while proxy.count.load(Ordering::SeqCst) != last {
        last = proxy.count.load(Ordering::SeqCst);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    proxy.count.store(0, Ordering::SeqCst);
    for i in 0..10 {
        let done = outbox.enqueue(vec![message(i)]).await.unwrap();
        assert_eq!(done[0].delivery_ids.len(), 1);
    }
    assert_eq!(
        settled(10 * (1 + 3 + 1)).await,
        10 * (1 + 3 + 1),
        "round trips of 10 acks, with the pool's checks of the connection"
    );
}
