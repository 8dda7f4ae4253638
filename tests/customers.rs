//! Customers are contained (issue 29, DESIGN.md invariant 11): endpoint caps per consumer
//! and tenant, tokens listed and revoked through the API, consumer work on its own rate,
//! request bytes of every route in the in-flight budget, consumer deletion at any size
//! with a new consumer of the same uid starting empty. Real API, real Postgres, real HTTP.

use crate::common;

use std::sync::Arc;
use std::time::Duration;

use axum::http::StatusCode;
use common::*;
use reqwest::Method;
use serde_json::{Value, json};
use sqlx::PgPool;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;
use uuid::Uuid;

const TENANT: &str = DEFAULT_TENANT;

async fn consumer_token(api: &TestApi, tenant_token: &str, uid: &str) -> String {
    let (s, t) = call(
        api,
        tenant_token,
        Method::POST,
        &format!("/v1/consumers/{uid}/tokens"),
        None,
    )
    .await;
    assert_eq!(s, StatusCode::CREATED, "{t}");
    t["token"].as_str().unwrap().to_string()
}

fn id(v: &Value) -> String {
    v["id"].as_str().unwrap().to_string()
}

// ---- A: endpoints per consumer and per tenant ----

/// With HOOKD_CONSUMER_MAX_ENDPOINTS=3, twelve concurrent creates for one consumer (half
/// through its own token, half through the tenant's) make exactly three endpoints; the
/// rest answer 422 `consumer_endpoint_limit`. HOOKD_TENANT_MAX_ENDPOINTS bounds the
/// tenant's the same way, consumers' endpoints included.
#[sqlx::test]
async fn endpoints_are_capped_per_consumer_and_per_tenant_under_concurrency(pool: PgPool) {
    let mut settings = api_settings();
    settings.consumer_max_endpoints = 3;
    settings.tenant_max_endpoints = 6;
    let api = Arc::new(TestApi::start_with(&pool, settings).await);
    let token = api.token_for(TENANT).await;
    let ct = consumer_token(&api, &token, "c1").await;
    let mut tasks = Vec::new();
    for i in 0..12 {
        let (api, t) = (
            api.clone(),
            if i % 2 == 0 {
                ct.clone()
            } else {
                token.clone()
            },
        );
        tasks.push(tokio::spawn(async move {
            call(
                &api,
                &t,
                Method::POST,
                "/v1/endpoints",
                Some(json!({"url": format!("https://example.com/c1/{i}"), "consumer": "c1"})),
            )
            .await
        }));
    }
    let mut created = 0;
    for t in tasks {
        let (s, v) = t.await.unwrap();
        match s {
            StatusCode::CREATED => created += 1,
            StatusCode::UNPROCESSABLE_ENTITY => {
                assert_eq!(v["error"]["code"], "consumer_endpoint_limit", "{v}")
            }
            other => panic!("{other}: {v}"),
        }
    }
    assert_eq!(created, 3);
    // another consumer has its own three; the tenant's cap (6) then stops the next one
    for i in 0..3 {
        let (s, v) = call(
            &api,
            &token,
            Method::POST,
            "/v1/endpoints",
            Some(json!({"url": format!("https://example.com/c2/{i}"), "consumer": "c2"})),
        )
        .await;
        assert_eq!(s, StatusCode::CREATED, "{v}");
    }
    let (s, v) = call(
        &api,
        &token,
        Method::POST,
        "/v1/endpoints",
        Some(json!({"url": "https://example.com/wide"})),
    )
    .await;
    assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY, "{v}");
    assert_eq!(v["error"]["code"], "tenant_endpoint_limit");
    // a deleted endpoint frees its place
    let (_, page) = call(&api, &token, Method::GET, "/v1/endpoints?consumer=c2", None).await;
    let first = id(&page["items"][0]);
    let (s, _) = call(
        &api,
        &token,
        Method::DELETE,
        &format!("/v1/endpoints/{first}"),
        None,
    )
    .await;
    assert_eq!(s, StatusCode::NO_CONTENT);
    let (s, v) = call(
        &api,
        &token,
        Method::POST,
        "/v1/endpoints",
        Some(json!({"url": "https://example.com/wide"})),
    )
    .await;
    assert_eq!(s, StatusCode::CREATED, "{v}");
}

// ---- B: tokens ----

/// `GET /v1/tokens` lists the tenant's tokens, consumer tokens included, never a secret;
/// `DELETE /v1/tokens/{id}` revokes one at once; consumer tokens neither list nor revoke,
/// and never carry `produce`.
#[sqlx::test]
async fn tokens_are_listed_without_secrets_and_revoked_at_once(pool: PgPool) {
    let api = TestApi::start(&pool).await;
    let token = api.token_for(TENANT).await;
    let other = api.token_for("team-b").await;
    let ct = consumer_token(&api, &token, "c9").await;
    assert_eq!(
        call(&api, &ct, Method::GET, "/v1/endpoints", None).await.0,
        StatusCode::OK
    );
    let (s, page) = call(&api, &token, Method::GET, "/v1/tokens", None).await;
    assert_eq!(s, StatusCode::OK, "{page}");
    let text = page.to_string();
    assert!(!text.contains(&token) && !text.contains(&ct), "{text}");
    let items = page["items"].as_array().unwrap();
    assert_eq!(items.len(), 2, "{page}");
    // newest first: the consumer token
    assert_eq!(items[0]["consumer"], "c9");
    assert!(ct.starts_with(items[0]["prefix"].as_str().unwrap()));
    assert!(items[0].get("token").is_none() && items[0].get("tokenHash").is_none());
    assert!(
        !items[0]["scopes"]
            .as_array()
            .unwrap()
            .contains(&json!("produce"))
    );
    assert_eq!(items[1]["consumer"], Value::Null);
    let (_, only) = call(&api, &token, Method::GET, "/v1/tokens?consumer=c9", None).await;
    assert_eq!(only["items"].as_array().unwrap().len(), 1);
    // consumer tokens: tenant routes
    assert_eq!(
        call(&api, &ct, Method::GET, "/v1/tokens", None).await.0,
        StatusCode::FORBIDDEN
    );
    let ct_id = items[0]["id"].as_str().unwrap().to_string();
    // another tenant's token is not found
    assert_eq!(
        call(
            &api,
            &other,
            Method::DELETE,
            &format!("/v1/tokens/{ct_id}"),
            None
        )
        .await
        .0,
        StatusCode::NOT_FOUND
    );
    let (s, v) = call(
        &api,
        &token,
        Method::DELETE,
        &format!("/v1/tokens/{ct_id}"),
        None,
    )
    .await;
    assert_eq!(s, StatusCode::NO_CONTENT, "{v}");
    // at once: no cache entry outlives the revocation in this process
    let (s, _) = call(&api, &ct, Method::GET, "/v1/endpoints", None).await;
    assert_eq!(s, StatusCode::UNAUTHORIZED);
    let (_, page) = call(&api, &token, Method::GET, "/v1/tokens?consumer=c9", None).await;
    assert!(page["items"][0]["revokedAt"].is_string(), "{page}");
    // again: no change
    assert_eq!(
        call(
            &api,
            &token,
            Method::DELETE,
            &format!("/v1/tokens/{ct_id}"),
            None
        )
        .await
        .0,
        StatusCode::NO_CONTENT
    );
    // a consumer token is never made with produce
    let refused = hookd::auth::tokens::create(
        &pool,
        &hookd::auth::tokens::TokenRequest {
            tenant: TENANT.into(),
            consumer: Some("c9".into()),
            scopes: vec![hookd::auth::Scope::Produce, hookd::auth::Scope::Read],
            name: None,
            expires_at: None,
        },
    )
    .await;
    assert!(
        matches!(
            refused,
            Err(hookd::auth::tokens::CreateTokenError::Invalid(_))
        ),
        "{refused:?}"
    );
    // and one written before this rule (migration 0017 keeps old rows) cannot produce
    let legacy = hookd::auth::tokens::create(
        &pool,
        &hookd::auth::tokens::TokenRequest {
            tenant: TENANT.into(),
            consumer: Some("c9".into()),
            scopes: vec![hookd::auth::Scope::Read],
            name: None,
            expires_at: None,
        },
    )
    .await
    .unwrap();
    sqlx::query("ALTER TABLE hookd.api_tokens DROP CONSTRAINT api_tokens_consumer_never_produces")
        .execute(&pool)
        .await
        .unwrap();
    sqlx::query("UPDATE hookd.api_tokens SET scopes = '{produce,read}' WHERE id = $1")
        .bind(legacy.id)
        .execute(&pool)
        .await
        .unwrap();
    let (s, v) = call(
        &api,
        &legacy.token,
        Method::POST,
        "/v1/messages",
        Some(json!({"eventType": "a", "payload": {}, "idempotencyKey": "squat"})),
    )
    .await;
    assert_eq!(s, StatusCode::FORBIDDEN, "{v}");
}

// ---- C: a consumer's work never takes the producer's rate ----

/// With HOOKD_TENANT_RATE_LIMIT=20, a consumer flooding test events and replays is
/// refused on its own rate (429 `consumer_rate_limited`), and the producer's next 20
/// events are all accepted.
#[sqlx::test]
async fn a_consumer_flood_never_refuses_the_producers_ingest(pool: PgPool) {
    let mut settings = api_settings();
    settings.tenant_rate_limit = Some(20.0);
    settings.consumer_rate_limit = 5.0;
    let api = TestApi::start_with(&pool, settings).await;
    let token = api.token_for(TENANT).await;
    let ct = consumer_token(&api, &token, "hostile").await;
    let (s, ep) = call(
        &api,
        &ct,
        Method::POST,
        "/v1/endpoints",
        Some(json!({"url": "https://example.com/h", "paused": true})),
    )
    .await;
    assert_eq!(s, StatusCode::CREATED, "{ep}");
    let ep = id(&ep);
    let mut refused = 0;
    for i in 0..60 {
        let path = if i % 2 == 0 {
            format!("/v1/endpoints/{ep}/test")
        } else {
            format!("/v1/endpoints/{ep}/replay")
        };
        let (s, v) = call(&api, &ct, Method::POST, &path, None).await;
        match s {
            StatusCode::CREATED | StatusCode::ACCEPTED => {}
            StatusCode::TOO_MANY_REQUESTS => {
                assert_eq!(v["error"]["code"], "consumer_rate_limited", "{v}");
                refused += 1;
            }
            other => panic!("{other}: {v}"),
        }
    }
    assert!(refused > 0, "the consumer's own rate applies");
    for i in 0..20 {
        let (s, v) = call(
            &api,
            &token,
            Method::POST,
            "/v1/messages",
            Some(json!({"eventType": "order.paid", "consumer": "other", "payload": {"i": i}})),
        )
        .await;
        assert_eq!(s, StatusCode::CREATED, "producer event {i} refused: {v}");
    }
}

/// A consumer token's reads come from a bucket of its own (HOOKD_CONSUMER_READ_RATE_LIMIT):
/// a consumer listing in a loop is refused (429 `consumer_read_rate_limited`, Retry-After),
/// while the tenant's own reads and the producer's ingest go on. Before, its reads were
/// never limited, and from outside they cut the producer's ingest to a sixth.
#[sqlx::test]
async fn a_consumer_reading_in_a_loop_spends_its_own_read_rate(pool: PgPool) {
    let mut settings = api_settings();
    settings.consumer_read_rate_limit = 5.0;
    let api = TestApi::start_with(&pool, settings).await;
    let token = api.token_for(TENANT).await;
    let ct = consumer_token(&api, &token, "poller").await;
    let mut refused = 0;
    for _ in 0..40 {
        let r = api
            .client
            .get(format!("{}/v1/messages", api.base))
            .bearer_auth(&ct)
            .send()
            .await
            .unwrap();
        match r.status() {
            StatusCode::OK => {}
            StatusCode::TOO_MANY_REQUESTS => {
                assert!(r.headers().contains_key("retry-after"));
                let v: Value = r.json().await.unwrap();
                assert_eq!(v["error"]["code"], "consumer_read_rate_limited", "{v}");
                refused += 1;
            }
            other => panic!("{other}"),
        }
    }
    assert!(refused >= 30, "only {refused} of 40 reads refused at 5/s");
    for i in 0..20 {
        let (s, v) = call(&api, &token, Method::GET, "/v1/messages", None).await;
        assert_eq!(s, StatusCode::OK, "tenant read {i}: {v}");
        let (s, v) = call(
            &api,
            &token,
            Method::POST,
            "/v1/messages",
            Some(json!({"eventType": "order.paid", "consumer": "poller", "payload": {"i": i}})),
        )
        .await;
        assert_eq!(s, StatusCode::CREATED, "producer event {i}: {v}");
    }
}

// ---- D: request bytes of every route count in the budget ----

/// Opens a request with a declared body it does not finish sending: the API holds it.
async fn hold_request(
    api: &TestApi,
    token: &str,
    method: &str,
    path: &str,
    declared: usize,
) -> TcpStream {
    let addr = api.base.trim_start_matches("http://");
    let mut s = TcpStream::connect(addr).await.unwrap();
    let head = format!(
        "{method} {path} HTTP/1.1\r\nhost: {addr}\r\nauthorization: Bearer {token}\r\ncontent-type: application/json\r\ncontent-length: {declared}\r\n\r\n{{\"url\":\""
    );
    s.write_all(head.as_bytes()).await.unwrap();
    s.flush().await.unwrap();
    s
}

/// With 200,000 bytes in flight per process, three held 60,000-byte requests on the
/// endpoints route leave no room for a fourth (503 `ingest_busy`, without its body being
/// read); a consumer token has its own 100,000-byte share (429 `consumer_requests_busy`)
/// apart from its tenant's; once the held requests go away, requests pass again.
#[sqlx::test]
async fn every_routes_request_bytes_count_in_the_in_flight_budget(pool: PgPool) {
    let mut settings = api_settings();
    settings.api_max_inflight_bytes = 200_000;
    settings.consumer_inflight_bytes = 100_000;
    settings.consumer_rate_limit = 1000.0;
    let api = TestApi::start_with(&pool, settings).await;
    let token = api.token_for(TENANT).await;
    let ct = consumer_token(&api, &token, "c1").await;
    let big = "x".repeat(50_000);
    let body = json!({"url": format!("https://example.com/{big}")});

    // the consumer: one held request of 60,000 bytes; a second does not fit its share
    let held_c = hold_request(&api, &ct, "POST", "/v1/endpoints", 60_000).await;
    assert!(
        wait_until(Duration::from_secs(20), || async {
            let (s, v) = call(&api, &ct, Method::POST, "/v1/endpoints", Some(body.clone())).await;
            s == StatusCode::TOO_MANY_REQUESTS && v["error"]["code"] == "consumer_requests_busy"
        })
        .await,
        "the consumer's second large request was not refused"
    );
    // the tenant's share is untouched by it
    let (s, v) = call(
        &api,
        &token,
        Method::POST,
        "/v1/endpoints",
        Some(body.clone()),
    )
    .await;
    assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY, "{v}");
    assert_eq!(v["error"]["code"], "invalid_field", "{v}");

    // the process: two more held requests (180,000 bytes in all); the next is refused
    let held_t1 = hold_request(&api, &token, "PUT", "/v1/consumers/c7", 60_000).await;
    let held_t2 = hold_request(
        &api,
        &token,
        "POST",
        "/v1/endpoints/00000000-0000-0000-0000-000000000000/test",
        60_000,
    )
    .await;
    assert!(
        wait_until(Duration::from_secs(20), || async {
            let (s, v) = call(
                &api,
                &token,
                Method::POST,
                "/v1/endpoints",
                Some(body.clone()),
            )
            .await;
            s == StatusCode::SERVICE_UNAVAILABLE && v["error"]["code"] == "ingest_busy"
        })
        .await,
        "the request past the process budget was not refused"
    );
    drop((held_c, held_t1, held_t2));
    assert!(
        wait_until(Duration::from_secs(20), || async {
            let (s, v) = call(
                &api,
                &token,
                Method::POST,
                "/v1/endpoints",
                Some(body.clone()),
            )
            .await;
            s == StatusCode::UNPROCESSABLE_ENTITY && v["error"]["code"] == "invalid_field"
        })
        .await,
        "the budget was not given back"
    );
}

// ---- E: deletion at any size, and a new consumer with the same uid ----

async fn open_deliveries_of(pool: &PgPool, uid: &str) -> i64 {
    sqlx::query_scalar(
        "SELECT count(*) FROM hookd.deliveries d JOIN hookd.endpoints e ON e.id = d.endpoint_id
         WHERE e.consumer = $1 AND d.status IN ('pending', 'in_progress', 'failed')",
    )
    .bind(uid)
    .fetch_one(pool)
    .await
    .unwrap()
}

/// A consumer with 20 paused endpoints and 3,000 held deliveries, deleted with batches of
/// 100: the answer is 202 with progress, its token is dead at once, new events for its uid
/// reach nothing, and the batches finish in the background. A consumer created again with
/// the uid starts empty: it sees none of the old endpoints or messages and cannot enable
/// them; the tenant cannot either.
#[sqlx::test]
async fn a_large_consumer_is_deleted_in_batches_and_its_uid_starts_empty(pool: PgPool) {
    let mut settings = api_settings();
    settings.consumer_delete_batch = 100;
    settings.consumer_max_endpoints = 50;
    let api = TestApi::start_with(&pool, settings).await;
    let token = api.token_for(TENANT).await;
    let mut old_endpoints = Vec::new();
    for i in 0..20 {
        let (s, v) = call(
            &api,
            &token,
            Method::POST,
            "/v1/endpoints",
            Some(json!({"url": format!("https://example.com/big/{i}"), "consumer": "big", "paused": true})),
        )
        .await;
        assert_eq!(s, StatusCode::CREATED, "{v}");
        old_endpoints.push(id(&v));
    }
    let mut old_event = String::new();
    for b in 0..2 {
        let messages: Vec<Value> = (0..75)
            .map(|i| json!({"eventType": "order.paid", "consumer": "big", "payload": {"b": b, "i": i}}))
            .collect();
        let (s, v) = call(
            &api,
            &token,
            Method::POST,
            "/v1/messages/batch",
            Some(json!({"messages": messages})),
        )
        .await;
        assert_eq!(s, StatusCode::CREATED, "{v}");
        old_event = v["results"][0]["eventId"].as_str().unwrap().to_string();
    }
    assert_eq!(open_deliveries_of(&pool, "big").await, 3000);
    let ct = consumer_token(&api, &token, "big").await;

    let r = api
        .client
        .delete(format!("{}/v1/consumers/big", api.base))
        .bearer_auth(&token)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 202);
    let location = r.headers()["location"].to_str().unwrap().to_string();
    let progress: Value = r.json().await.unwrap();
    assert_eq!(progress["status"], "running", "{progress}");
    assert_eq!(progress["consumer"], "big");
    assert_eq!(progress["tokensRevoked"], 1);
    assert!(location.ends_with(progress["id"].as_str().unwrap()));
    // its token is dead at once
    assert_eq!(
        call(&api, &ct, Method::GET, "/v1/endpoints", None).await.0,
        StatusCode::UNAUTHORIZED
    );
    // new events for the uid reach none of the old endpoints, while batches still run
    let (_, m) = call(
        &api,
        &token,
        Method::POST,
        "/v1/messages",
        Some(json!({"eventType": "order.paid", "consumer": "big", "payload": {}})),
    )
    .await;
    assert_eq!(m["deliveryIds"], json!([]), "{m}");

    // the uid again: a new, empty consumer
    let (s, _) = call(&api, &token, Method::PUT, "/v1/consumers/big", None).await;
    assert_eq!(s, StatusCode::CREATED);
    let ct2 = consumer_token(&api, &token, "big").await;
    let (_, eps) = call(&api, &ct2, Method::GET, "/v1/endpoints", None).await;
    assert_eq!(eps["items"], json!([]), "{eps}");
    let (_, msgs) = call(&api, &ct2, Method::GET, "/v1/messages", None).await;
    assert_eq!(msgs["items"], json!([]), "{msgs}");
    assert_eq!(
        call(
            &api,
            &ct2,
            Method::GET,
            &format!("/v1/messages/{old_event}"),
            None
        )
        .await
        .0,
        StatusCode::NOT_FOUND
    );
    let (_, c) = call(&api, &token, Method::GET, "/v1/consumers/big", None).await;
    assert_eq!(c["endpointCount"], 0, "{c}");
    for path in ["enable", "resume", "pause"] {
        let p = format!("/v1/endpoints/{}/{path}", old_endpoints[0]);
        assert_eq!(
            call(&api, &ct2, Method::POST, &p, None).await.0,
            StatusCode::NOT_FOUND,
            "{path}"
        );
        let (s, v) = call(&api, &token, Method::POST, &p, None).await;
        assert_eq!(s, StatusCode::CONFLICT, "{path}: {v}");
        assert_eq!(v["error"]["code"], "consumer_deleted");
    }

    // the batches finish, visibly
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    let last = loop {
        let (s, v) = call(&api, &token, Method::GET, &location, None).await;
        assert_eq!(s, StatusCode::OK, "{v}");
        if v["status"] == "done" {
            break v;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "deletion did not finish: {v}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(last["endpointsDisabled"], 20, "{last}");
    assert_eq!(last["deliveriesCancelled"], 3000, "{last}");
    assert_eq!(open_deliveries_of(&pool, "big").await, 0);
    let active: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM hookd.endpoints WHERE consumer = 'big' AND state <> 'disabled'",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(active, 0);

    // the new consumer's endpoint is the only one its events reach
    let (s, mine) = call(
        &api,
        &ct2,
        Method::POST,
        "/v1/endpoints",
        Some(json!({"url": "https://example.com/new"})),
    )
    .await;
    assert_eq!(s, StatusCode::CREATED, "{mine}");
    let (_, m) = call(
        &api,
        &token,
        Method::POST,
        "/v1/messages",
        Some(json!({"eventType": "order.paid", "consumer": "big", "payload": {}})),
    )
    .await;
    let d: Uuid = m["deliveryIds"][0].as_str().unwrap().parse().unwrap();
    assert_eq!(m["deliveryIds"].as_array().unwrap().len(), 1);
    let ep: Uuid = sqlx::query_scalar("SELECT endpoint_id FROM hookd.deliveries WHERE id = $1")
        .bind(d)
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(ep.to_string(), id(&mine));
    let (_, msgs) = call(&api, &ct2, Method::GET, "/v1/messages", None).await;
    assert_eq!(msgs["items"].as_array().unwrap().len(), 1, "{msgs}");
}

/// A deletion whose process went away is finished by another API process's sweep.
#[sqlx::test]
async fn an_unfinished_deletion_is_resumed(pool: PgPool) {
    let api = TestApi::start(&pool).await;
    let token = api.token_for(TENANT).await;
    let (s, v) = call(
        &api,
        &token,
        Method::POST,
        "/v1/endpoints",
        Some(json!({"url": "https://example.com/r", "consumer": "r", "paused": true})),
    )
    .await;
    assert_eq!(s, StatusCode::CREATED, "{v}");
    call(
        &api,
        &token,
        Method::POST,
        "/v1/messages",
        Some(json!({"eventType": "a", "consumer": "r", "payload": {}})),
    )
    .await;
    // as if the process died right after the delete's own transaction
    let started = hookd::db::consumers::start_delete(&pool, TENANT, "r")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(open_deliveries_of(&pool, "r").await, 1);
    let shutdown = tokio_util::sync::CancellationToken::new();
    tokio::spawn(hookd::api::deletions::sweep(
        pool.clone(),
        10,
        shutdown.clone(),
    ));
    assert!(
        wait_until(Duration::from_secs(30), || async {
            hookd::db::consumers::get_deletion(&pool, started.deletion.id, None)
                .await
                .unwrap()
                .unwrap()
                .completed_at
                .is_some()
        })
        .await
    );
    shutdown.cancel();
    assert_eq!(open_deliveries_of(&pool, "r").await, 0);
}

// ---- F: the low items ----

/// Test events carry the reserved type and are refused on Kubernetes endpoints; a consumer
/// token reads neither the tenant's name nor metadata of its consumer; published and
/// degenerate signing secrets are refused.
#[sqlx::test]
async fn test_events_are_marked_and_consumers_do_not_read_the_producers_notes(pool: PgPool) {
    let mut settings = api_settings();
    settings.consumer_rate_limit = 1000.0;
    let api = TestApi::start_with(&pool, settings).await;
    let token = api.token_for(TENANT).await;
    let (s, _) = call(
        &api,
        &token,
        Method::PUT,
        "/v1/consumers/c5",
        Some(json!({"name": "ACME (churn risk)", "metadata": {"plan": "free", "notes": "late payer"}})),
    )
    .await;
    assert_eq!(s, StatusCode::CREATED);
    let ct = consumer_token(&api, &token, "c5").await;
    let (_, mine) = call(&api, &ct, Method::GET, "/v1/consumers/c5", None).await;
    assert_eq!(mine["uid"], "c5");
    assert_eq!(mine["name"], Value::Null, "{mine}");
    assert_eq!(mine["metadata"], json!({}), "{mine}");
    let (_, theirs) = call(&api, &token, Method::GET, "/v1/consumers/c5", None).await;
    assert_eq!(theirs["metadata"]["plan"], "free");

    let (_, ep) = call(
        &api,
        &ct,
        Method::POST,
        "/v1/endpoints",
        Some(json!({"url": "https://example.com/t", "paused": true})),
    )
    .await;
    let path = format!("/v1/endpoints/{}/test", id(&ep));
    let (s, v) = call(
        &api,
        &ct,
        Method::POST,
        &path,
        Some(json!({"eventType": "invoice.paid", "payload": {"forged": true}})),
    )
    .await;
    assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY, "{v}");
    assert_eq!(v["error"]["code"], "invalid_test_event_type");
    let (s, v) = call(
        &api,
        &ct,
        Method::POST,
        &path,
        Some(json!({"eventType": "hookd.test.invoice"})),
    )
    .await;
    assert_eq!(s, StatusCode::CREATED, "{v}");
    let (s, v) = call(&api, &ct, Method::POST, &path, None).await;
    assert_eq!(s, StatusCode::CREATED, "{v}");

    // secrets anyone can know are refused, and never echoed
    for weak in [
        SECRET_A,
        "whsec_AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=",
        "whsec_Qk3pV2m0nZ7yJd8tXr5aLw1cHs9uE6gB",
    ] {
        let (s, v) = call(
            &api,
            &ct,
            Method::POST,
            "/v1/endpoints",
            Some(json!({"url": "https://example.com/weak", "secret": weak})),
        )
        .await;
        assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY, "{v}");
        assert_eq!(v["error"]["code"], "weak_secret");
        assert!(!v.to_string().contains(weak));
        let (s, v) = call(
            &api,
            &ct,
            Method::POST,
            &format!("/v1/endpoints/{}/secret/rotate", id(&ep)),
            Some(json!({"secret": weak})),
        )
        .await;
        assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY, "{v}");
    }

    let k8s = endpoint(
        &pool,
        EndpointOpts {
            name: "declared".into(),
            ..Default::default()
        },
    )
    .await;
    let (s, v) = call(
        &api,
        &token,
        Method::POST,
        &format!("/v1/endpoints/{k8s}/test"),
        None,
    )
    .await;
    assert_eq!(s, StatusCode::CONFLICT, "{v}");
    assert_eq!(v["error"]["code"], "managed_by_kubernetes");
}

// ---- F: portal links carry a one-time code; browsers hold sessions (item 5) ----

/// `POST /v1/sessions/from-code` with `code`, no credential; (status, body).
async fn redeem(api: &TestApi, code: &str) -> (StatusCode, Value) {
    let r = api
        .client
        .post(format!("{}/v1/sessions/from-code", api.base))
        .json(&json!({ "code": code }))
        .send()
        .await
        .unwrap();
    let status = r.status();
    (status, r.json().await.unwrap_or_default())
}

/// A portal link's code, not its token: stored as its SHA-256, exchanged once for a
/// session with the consumer token's tenant, consumer and scopes; a replayed, expired or
/// unknown code is 401 `sign_in_code_invalid`; a session dies with the token it came from;
/// the console's `POST /v1/sessions` makes one from the bearer token.
#[sqlx::test]
async fn portal_codes_work_once_and_sessions_die_with_their_token(pool: PgPool) {
    let api = TestApi::start(&pool).await;
    let token = api.token_for(TENANT).await;
    let (s, portal) = call(
        &api,
        &token,
        Method::POST,
        "/v1/consumers/cust_s/portal",
        Some(json!({})),
    )
    .await;
    assert_eq!(s, StatusCode::CREATED, "{portal}");
    let url = portal["url"].as_str().unwrap();
    let consumer_token = portal["token"].as_str().unwrap();
    let code = url.split_once("/portal#code=").expect("a #code= link").1;
    assert!(!url.contains(consumer_token), "{url}");
    assert_eq!(code.len(), 43, "{url}");

    // stored hashed, and nowhere as text
    let hashes: Vec<Vec<u8>> = sqlx::query_scalar("SELECT code_hash FROM hookd.sign_in_codes")
        .fetch_all(&pool)
        .await
        .unwrap();
    assert_eq!(
        hashes,
        vec![hookd::auth::tokens::hash(code).to_vec()],
        "one code, as its SHA-256"
    );

    let (s, session) = redeem(&api, code).await;
    assert_eq!(s, StatusCode::CREATED, "{session}");
    let session_token = session["token"].as_str().unwrap();
    assert!(session_token.starts_with("hookd_") && session_token != consumer_token);
    assert_eq!(session["consumer"], "cust_s");
    assert_eq!(session["tenant"], TENANT);
    let (s, who) = call(&api, session_token, Method::GET, "/v1/whoami", None).await;
    assert_eq!(s, StatusCode::OK, "{who}");
    assert_eq!(who["consumer"], "cust_s");

    // once only
    let (s, again) = redeem(&api, code).await;
    assert_eq!(s, StatusCode::UNAUTHORIZED, "{again}");
    assert_eq!(again["error"]["code"], "sign_in_code_invalid");
    for bad in ["", "nope", &"A".repeat(43)] {
        let (s, e) = redeem(&api, bad).await;
        assert_eq!(s, StatusCode::UNAUTHORIZED, "{bad}: {e}");
    }

    // an expired code (5 minutes) is refused, and so is one whose token was revoked
    let (_, late) = call(
        &api,
        &token,
        Method::POST,
        "/v1/consumers/cust_s/portal",
        Some(json!({})),
    )
    .await;
    let late_code = late["url"]
        .as_str()
        .unwrap()
        .split_once("#code=")
        .unwrap()
        .1;
    sqlx::query("UPDATE hookd.sign_in_codes SET expires_at = now() - interval '1 second'")
        .execute(&pool)
        .await
        .unwrap();
    let (s, e) = redeem(&api, late_code).await;
    assert_eq!(s, StatusCode::UNAUTHORIZED, "{e}");
    assert_eq!(e["error"]["code"], "sign_in_code_invalid");

    // revoking the consumer token kills its session within the verification cache's 5 s
    let listed =
        sqlx::query_scalar::<_, Uuid>("SELECT id FROM hookd.api_tokens WHERE token_hash = $1")
            .bind(hookd::auth::tokens::hash(consumer_token).to_vec())
            .fetch_one(&pool)
            .await
            .unwrap();
    let (s, _) = call(
        &api,
        &token,
        Method::DELETE,
        &format!("/v1/tokens/{listed}"),
        None,
    )
    .await;
    assert!(s.is_success(), "{s}");
    assert!(
        wait_until(Duration::from_secs(15), || async {
            call(&api, session_token, Method::GET, "/v1/whoami", None)
                .await
                .0
                == StatusCode::UNAUTHORIZED
        })
        .await,
        "the session outlived its token"
    );

    // the console's sign-in: a session of the bearer token, never the token again
    let (s, console) = call(&api, &token, Method::POST, "/v1/sessions", Some(json!({}))).await;
    assert_eq!(s, StatusCode::CREATED, "{console}");
    let console_session = console["token"].as_str().unwrap();
    assert_ne!(console_session, token);
    assert_eq!(console["consumer"], Value::Null);
    let (s, who) = call(&api, console_session, Method::GET, "/v1/whoami", None).await;
    assert_eq!(s, StatusCode::OK, "{who}");
    assert_eq!(who["tenant"], TENANT);
    // sign out: the session ends itself; a token is never revoked by presenting it
    let (s, e) = call(&api, &token, Method::DELETE, "/v1/sessions", None).await;
    assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY, "{e}");
    assert_eq!(e["error"]["code"], "not_a_session");
    let (s, _) = call(&api, console_session, Method::DELETE, "/v1/sessions", None).await;
    assert_eq!(s, StatusCode::NO_CONTENT);
    let (s, _) = call(&api, console_session, Method::GET, "/v1/whoami", None).await;
    assert_eq!(
        s,
        StatusCode::UNAUTHORIZED,
        "a signed-out session still works"
    );
    let (s, _) = call(&api, &token, Method::GET, "/v1/whoami", None).await;
    assert_eq!(s, StatusCode::OK, "signing out ended the parent token");
    // no credential: 401, and no session
    let r = api
        .client
        .post(format!("{}/v1/sessions", api.base))
        .json(&json!({}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::UNAUTHORIZED);
}

/// A session made while its parent's revoke is in flight dies with the parent: the revoke
/// holds the parent's row (its trigger has already revoked the sessions it could see), and
/// the sign-in must wait for it and see the revoke, not store a live session under a
/// revoked token (before: 201, and the session worked for its 12 hours).
#[sqlx::test]
async fn a_session_made_during_its_parents_revoke_dies_with_it(pool: PgPool) {
    let api = TestApi::start(&pool).await;
    let token = api.token_for(TENANT).await;
    let (s, _) = call(&api, &token, Method::GET, "/v1/whoami", None).await;
    assert_eq!(s, StatusCode::OK, "verified and cached before the revoke");
    let mut revoke = pool.begin().await.unwrap();
    sqlx::query("UPDATE hookd.api_tokens SET revoked_at = now() WHERE token_hash = $1")
        .bind(hookd::auth::tokens::hash(&token).to_vec())
        .execute(&mut *revoke)
        .await
        .unwrap();
    let sign_in = {
        let (base, client, token) = (api.base.clone(), api.client.clone(), token.clone());
        tokio::spawn(async move {
            let r = client
                .post(format!("{base}/v1/sessions"))
                .bearer_auth(token)
                .json(&json!({}))
                .send()
                .await
                .unwrap();
            (r.status(), r.json::<Value>().await.unwrap_or(Value::Null))
        })
    };
    tokio::time::sleep(Duration::from_millis(500)).await;
    revoke.commit().await.unwrap();
    let (s, body) = sign_in.await.unwrap();
    if s == StatusCode::CREATED {
        let session = body["token"].as_str().unwrap().to_string();
        let live: bool = sqlx::query_scalar(
            "SELECT revoked_at IS NULL FROM hookd.api_tokens WHERE token_hash = $1",
        )
        .bind(hookd::auth::tokens::hash(&session).to_vec())
        .fetch_one(&pool)
        .await
        .unwrap();
        assert!(!live, "a live session under a revoked token: {body}");
    } else {
        assert_eq!(s, StatusCode::UNAUTHORIZED, "{body}");
    }
}

/// A token keeps its 50 newest sessions: signing in in a loop deletes the oldest (which
/// then stops working) instead of keeping every one alive for 12 hours; and a session
/// makes no session (before: 663 live sessions after 90 s of a loop from outside, and
/// chains of sessions of sessions).
#[sqlx::test]
async fn a_token_keeps_its_newest_sessions_and_a_session_makes_none(pool: PgPool) {
    let api = TestApi::start(&pool).await;
    let token = api.token_for(TENANT).await;
    let mut made = Vec::new();
    for _ in 0..55 {
        let (s, v) = call(&api, &token, Method::POST, "/v1/sessions", Some(json!({}))).await;
        assert_eq!(s, StatusCode::CREATED, "{v}");
        made.push(v["token"].as_str().unwrap().to_string());
    }
    let live: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM hookd.api_tokens WHERE parent_id IS NOT NULL AND revoked_at IS NULL",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(live, hookd::auth::sessions::MAX_SESSIONS_PER_TOKEN);
    let (s, _) = call(&api, &made[0], Method::GET, "/v1/whoami", None).await;
    assert_eq!(
        s,
        StatusCode::UNAUTHORIZED,
        "the oldest session was deleted"
    );
    let newest = made.last().unwrap();
    let (s, _) = call(&api, newest, Method::GET, "/v1/whoami", None).await;
    assert_eq!(s, StatusCode::OK);
    let (s, v) = call(&api, newest, Method::POST, "/v1/sessions", Some(json!({}))).await;
    assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY, "{v}");
    assert_eq!(v["error"]["code"], "session_needs_token");
}
