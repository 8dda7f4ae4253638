//! Security hardening (issue 19), over real HTTP, raw TCP and real Postgres: ingest is
//! admitted from the request head (bytes in flight per tenant and per process, the rate
//! limit) before any body is read; replays count against the rate limit; duplicate
//! Authorization headers are refused; `/metrics` can require a token; an endpoint's tenant
//! never changes hands with its deliveries; `hookd.enqueue()` is bound to database roles.

use crate::common;

use std::time::Duration;

use axum::http::StatusCode;
use common::*;
use serde_json::{Value, json};
use sqlx::PgPool;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use uuid::Uuid;

async fn events_of(pool: &PgPool, tenant: &str) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM hookd.events WHERE tenant = $1")
        .bind(tenant)
        .fetch_one(pool)
        .await
        .unwrap()
}

/// Opens a connection and sends only the head of a POST with `content_length`, plus
/// `body_prefix` of its body: an upload the client holds open.
async fn held_upload(
    api: &TestApi,
    path: &str,
    token: &str,
    content_length: usize,
    body_prefix: &[u8],
) -> TcpStream {
    let addr = api.base.trim_start_matches("http://");
    let mut s = TcpStream::connect(addr).await.unwrap();
    let head = format!(
        "POST {path} HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer {token}\r\n\
         Content-Type: application/json\r\nContent-Length: {content_length}\r\n\r\n"
    );
    s.write_all(head.as_bytes()).await.unwrap();
    s.write_all(body_prefix).await.unwrap();
    s
}

/// The status and body of the response on `s`, which must arrive within 5 s although the
/// request body was never (completely) sent: proof the server answered from the head.
async fn answer_without_body(s: &mut TcpStream) -> (u16, Value) {
    let mut buf = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(5), async {
        let mut chunk = [0u8; 4096];
        loop {
            let n = s.read(&mut chunk).await.unwrap_or(0);
            if n == 0 {
                break;
            }
            buf.extend_from_slice(&chunk[..n]);
            let text = String::from_utf8_lossy(&buf);
            if let Some(end) = text.find("\r\n\r\n") {
                let len = text[..end]
                    .lines()
                    .find_map(|l| {
                        let (k, v) = l.split_once(':')?;
                        k.eq_ignore_ascii_case("content-length")
                            .then(|| v.trim().parse::<usize>().ok())?
                    })
                    .unwrap_or(0);
                if buf.len() >= end + 4 + len {
                    break;
                }
            }
        }
    })
    .await;
    assert!(read.is_ok(), "no answer while the body is held");
    let text = String::from_utf8_lossy(&buf).to_string();
    let status: u16 = text
        .split_whitespace()
        .nth(1)
        .expect("a status line")
        .parse()
        .unwrap();
    let body = text.split_once("\r\n\r\n").map(|x| x.1).unwrap_or("");
    (status, serde_json::from_str(body).unwrap_or(Value::Null))
}

fn message(i: usize) -> String {
    format!(r#"{{"eventType":"up","payload":{{"i":{i}}}}}"#)
}

// ---- Medium 1: admit before reading ----

/// A tenant holding uploads up to its share of bytes in flight is refused further uploads
/// with 429 `tenant_ingest_busy` from the head alone (nothing of the body read), while
/// other tenants are admitted; past the process total, 503 `ingest_busy`; a declared body
/// larger than the share is 413 at once. Closing the held upload gives its bytes back.
#[sqlx::test]
async fn uploads_are_admitted_on_their_head_within_tenant_and_process_budgets(pool: PgPool) {
    let mut settings = api_settings();
    settings.api_max_inflight_bytes = 250_000;
    settings.api_tenant_inflight_bytes = Some(100_000);
    let api = TestApi::start_with(&pool, settings).await;
    let (a, b, c) = (
        api.token_for("team-a").await,
        api.token_for("team-b").await,
        api.token_for("team-c").await,
    );

    let mut held_a = held_upload(&api, "/v1/messages/batch", &a, 90_000, b"{\"messages\":[").await;
    // the bytes are reserved once the head is in: wait for the server to have it
    assert!(
        wait_until(Duration::from_secs(5), || async {
            let (_, m) = api.get("/metrics").await;
            m.as_str()
                .unwrap()
                .lines()
                .any(|l| l.starts_with("hookd_ingest_bytes_in_flight 90000"))
        })
        .await
    );

    // team-a again: refused from the head (its body is never sent)
    let mut second = held_upload(&api, "/v1/messages", &a, 20_000, b"").await;
    let (status, v) = answer_without_body(&mut second).await;
    assert_eq!(status, 429, "{v}");
    assert_eq!(v["error"]["code"], "tenant_ingest_busy", "{v}");
    // a message that still fits in the share is admitted
    let (s, v) = api.post_as("team-a", "/v1/messages", &message(1)).await;
    assert_eq!(s, StatusCode::CREATED, "{v}");

    // another tenant is admitted meanwhile
    let (s, v) = api.post_as("team-b", "/v1/messages", &message(2)).await;
    assert_eq!(s, StatusCode::CREATED, "{v}");

    // a body over the tenant's share can never be admitted: 413 from the head
    let mut huge = held_upload(&api, "/v1/messages/batch", &b, 150_000, b"").await;
    let (status, v) = answer_without_body(&mut huge).await;
    assert_eq!(status, 413, "{v}");
    assert_eq!(v["error"]["code"], "body_too_large", "{v}");

    // the process total: a (90 000) + b (90 000) held, c's 80 000 would pass 250 000
    let _held_b = held_upload(&api, "/v1/messages/batch", &b, 90_000, b"").await;
    assert!(
        wait_until(Duration::from_secs(5), || async {
            let (_, m) = api.get("/metrics").await;
            m.as_str()
                .unwrap()
                .lines()
                .any(|l| l.starts_with("hookd_ingest_bytes_in_flight 180000"))
        })
        .await
    );
    let mut third = held_upload(&api, "/v1/messages/batch", &c, 80_000, b"").await;
    let (status, v) = answer_without_body(&mut third).await;
    assert_eq!(status, 503, "{v}");
    assert_eq!(v["error"]["code"], "ingest_busy", "{v}");

    // team-a lets go of its upload: its bytes come back, and a new upload of team-a is
    // admitted (its bytes reserved) while team-b still holds its own
    held_a.shutdown().await.unwrap();
    drop(held_a);
    let in_flight = |n: usize| {
        let api = &api;
        async move {
            wait_until(Duration::from_secs(10), || async {
                let (_, m) = api.get("/metrics").await;
                m.as_str()
                    .unwrap()
                    .lines()
                    .any(|l| l == format!("hookd_ingest_bytes_in_flight {n}"))
            })
            .await
        }
    };
    assert!(
        in_flight(90_000).await,
        "team-a's bytes were not given back"
    );
    let _again = held_upload(&api, "/v1/messages", &a, 20_000, b"").await;
    assert!(in_flight(110_000).await, "team-a not admitted again");
    let (_, m) = api.get("/metrics").await;
    let m = m.as_str().unwrap();
    for reason in ["tenant_bytes", "process_bytes"] {
        assert!(
            m.lines().any(|l| l.starts_with(&format!(
                "hookd_ingest_refused_total{{reason=\"{reason}\"}}"
            ))),
            "{m}"
        );
    }
}

/// With HOOKD_TENANT_RATE_LIMIT, a tenant with an empty bucket is refused a batch from its
/// head: 429 before any of a (possibly huge) body is read.
#[sqlx::test]
async fn a_rate_limited_tenant_is_refused_before_its_body_is_read(pool: PgPool) {
    let mut settings = api_settings();
    settings.tenant_rate_limit = Some(1.0);
    let api = TestApi::start_with(&pool, settings).await;
    let token = api.token_for("team-a").await;
    let (s, v) = api.post_as("team-a", "/v1/messages", &message(1)).await;
    assert_eq!(s, StatusCode::CREATED, "{v}");
    let mut batch = held_upload(&api, "/v1/messages/batch", &token, 2_000_000, b"").await;
    let (status, v) = answer_without_body(&mut batch).await;
    assert_eq!(status, 429, "{v}");
    assert_eq!(v["error"]["code"], "rate_limited", "{v}");
    assert_eq!(events_of(&pool, "team-a").await, 1);
}

// ---- Low: replays count against the rate limit ----

/// A replay is a send: with HOOKD_TENANT_RATE_LIMIT it takes from the tenant's bucket (429
/// when empty), and an endpoint replay replays at most what the bucket holds.
#[sqlx::test]
async fn replays_count_against_the_tenant_rate_limit(pool: PgPool) {
    let ep = endpoint(&pool, EndpointOpts::default()).await;
    let mut settings = api_settings();
    settings.tenant_rate_limit = Some(3.0);
    let api = TestApi::start_with(&pool, settings).await;
    let batch = json!({"messages": [
        {"eventType": "r", "payload": 1},
        {"eventType": "r", "payload": 2},
        {"eventType": "r", "payload": 3},
    ]})
    .to_string();
    let (s, v) = api.post_as("team-a", "/v1/messages/batch", &batch).await;
    assert_eq!(s, StatusCode::CREATED, "{v}");
    sqlx::query(
        "WITH d AS (UPDATE hookd.deliveries SET status = 'dead', completed_at = now()
                    RETURNING id, endpoint_id, tenant)
         INSERT INTO hookd.dead_letters (delivery_id, endpoint_id, tenant, reason, attempts)
         SELECT id, endpoint_id, tenant, 'exhausted', 1 FROM d",
    )
    .execute(&pool)
    .await
    .unwrap();
    let delivery = v["results"][0]["deliveryIds"][0]
        .as_str()
        .unwrap()
        .to_string();

    // the batch emptied the bucket: a replay now is over the limit
    let (s, v) = send(
        api.request_as(
            "team-a",
            reqwest::Method::POST,
            &format!("/v1/deliveries/{delivery}/replay"),
        )
        .await,
    )
    .await;
    assert_eq!(s, StatusCode::TOO_MANY_REQUESTS, "{v}");
    assert_eq!(v["error"]["code"], "rate_limited");

    // an endpoint replay waits for the bucket, then replays what it holds (1 event), not
    // all 3 dead deliveries at once
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    let replayed = loop {
        let (s, v) = send(
            api.request_as(
                "team-a",
                reqwest::Method::POST,
                &format!("/v1/endpoints/{ep}/replay"),
            )
            .await,
        )
        .await;
        if s == StatusCode::ACCEPTED {
            break v["replayed"].as_i64().unwrap();
        }
        assert_eq!(s, StatusCode::TOO_MANY_REQUESTS, "{v}");
        assert!(std::time::Instant::now() < deadline, "never admitted");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(replayed, 1, "one event's worth of the bucket");
}

// ---- Low: duplicate Authorization ----

/// Two Authorization headers are ambiguous: 400 `duplicate_authorization`, even when both
/// are valid, and nothing is written.
#[sqlx::test]
async fn duplicate_authorization_headers_are_400(pool: PgPool) {
    let api = TestApi::start(&pool).await;
    let a = api.token_for("team-a").await;
    let b = api.token_for("team-b").await;
    let r = api
        .client
        .post(format!("{}/v1/messages", api.base))
        .header("authorization", format!("Bearer {a}"))
        .header("authorization", format!("Bearer {b}"))
        .header("content-type", "application/json")
        .body(message(1));
    let (s, v) = send(r).await;
    assert_eq!(s, StatusCode::BAD_REQUEST, "{v}");
    assert_eq!(v["error"]["code"], "duplicate_authorization", "{v}");
    let n: i64 = sqlx::query_scalar("SELECT count(*) FROM hookd.events")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(n, 0);
}

// ---- Low: /metrics token ----

/// With HOOKD_METRICS_TOKEN set, `/metrics` answers only `Authorization: Bearer <token>`
/// (401 otherwise); health stays open.
#[sqlx::test]
async fn metrics_can_require_a_bearer_token(pool: PgPool) {
    init();
    let mut state = hookd::api::AppState::start(
        pool.clone(),
        &api_settings(),
        None,
        tokio_util::sync::CancellationToken::new(),
    );
    state.metrics = state.metrics.clone().with_scrape_token(Some("scrape-me"));
    let (addr, _stop) = serve_local(hookd::api::app(state)).await;
    let client = reqwest::Client::new();
    let url = format!("http://{addr}/metrics");
    let (s, v) = send(client.get(&url)).await;
    assert_eq!(s, StatusCode::UNAUTHORIZED, "{v}");
    let (s, _) = send(client.get(&url).bearer_auth("wrong")).await;
    assert_eq!(s, StatusCode::UNAUTHORIZED);
    let (s, v) = send(client.get(&url).bearer_auth("scrape-me")).await;
    assert_eq!(s, StatusCode::OK);
    assert!(v.as_str().unwrap().contains("hookd_http_requests"));
    let (s, _) = send(client.get(format!("http://{addr}/healthz"))).await;
    assert_eq!(s, StatusCode::OK);
}

// ---- Medium 4: an endpoint's tenant never changes hands ----

/// Re-declaring an endpoint for another tenant retires the old row (disabled, renamed,
/// its open deliveries cancelled) and makes a new one: the old tenant's deliveries stay on
/// the old row (its URL) and a replay of them never reaches the new owner's receiver. The
/// database refuses any other way of changing a row's tenant.
#[sqlx::test]
async fn an_endpoint_changing_tenant_leaves_the_old_tenants_deliveries_behind(pool: PgPool) {
    let opts = EndpointOpts {
        tenant: Some("team-b".into()),
        url: "http://b.example/hook".into(),
        ..Default::default()
    };
    let old = endpoint(&pool, opts.clone()).await;
    let event: Uuid =
        sqlx::query_scalar("SELECT hookd.enqueue('team-b', 'secret.stuff', '{\"card\":\"4242\"}')")
            .fetch_one(&pool)
            .await
            .unwrap();
    let delivery: Uuid = sqlx::query_scalar("SELECT id FROM hookd.deliveries WHERE event_id = $1")
        .bind(event)
        .fetch_one(&pool)
        .await
        .unwrap();

    let new = endpoint(
        &pool,
        EndpointOpts {
            tenant: Some("team-a".into()),
            url: "http://a.example/hook".into(),
            ..opts.clone()
        },
    )
    .await;
    assert_ne!(new, old, "a new owner gets a new endpoint");

    let (ep, status): (Uuid, String) =
        sqlx::query_as("SELECT endpoint_id, status FROM hookd.deliveries WHERE id = $1")
            .bind(delivery)
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(ep, old);
    assert_eq!(status, "cancelled");
    let rows: Vec<(Uuid, String, String, String, String)> = sqlx::query_as(
        "SELECT id, tenant, url, state, k8s_name FROM hookd.endpoints
         WHERE k8s_namespace = $1 ORDER BY created_at",
    )
    .bind(&opts.namespace)
    .fetch_all(&pool)
    .await
    .unwrap();
    assert_eq!(rows.len(), 2, "{rows:?}");
    assert_eq!(
        (&rows[0].1, &rows[0].2, &rows[0].3),
        (
            &"team-b".to_string(),
            &"http://b.example/hook".to_string(),
            &"disabled".to_string()
        )
    );
    assert!(rows[0].4.contains("/retired/"), "{rows:?}");
    assert_eq!(
        (rows[1].0, &rows[1].1, &rows[1].3),
        (new, &"team-a".to_string(), &"active".to_string())
    );

    // team-b replays its delivery: due again, but on its own disabled row, never claimed
    // for team-a's URL
    let api = TestApi::start(&pool).await;
    let (s, v) = send(
        api.request_as(
            "team-b",
            reqwest::Method::POST,
            &format!("/v1/deliveries/{delivery}/replay"),
        )
        .await,
    )
    .await;
    assert_eq!(s, StatusCode::ACCEPTED, "{v}");
    let (ep, state): (Uuid, String) = sqlx::query_as(
        "SELECT d.endpoint_id, e.state FROM hookd.deliveries d
         JOIN hookd.endpoints e ON e.id = d.endpoint_id WHERE d.id = $1",
    )
    .bind(delivery)
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!((ep, state.as_str()), (old, "disabled"));

    // no other way round
    let err = sqlx::query("UPDATE hookd.endpoints SET tenant = 'team-c' WHERE id = $1")
        .bind(new)
        .execute(&pool)
        .await
        .expect_err("a tenant change is refused");
    assert!(err.to_string().contains("cannot change"), "{err}");
}

// ---- Medium 5: hookd.enqueue() is bound to database roles ----

/// A producer role with only EXECUTE on `hookd.enqueue()` and a row in
/// `hookd.producer_roles` enqueues for its tenant, inside its own transaction; it cannot
/// enqueue for another tenant (42501), read `hookd.events`, or call the function at all
/// without the grant. The function runs with a fixed search_path.
#[sqlx::test]
async fn sql_enqueue_is_bound_to_the_roles_tenant(pool: PgPool) {
    endpoint(&pool, EndpointOpts::default()).await;
    let suffix = Uuid::now_v7().simple().to_string();
    let (producer, stranger) = (format!("prod_{suffix}"), format!("other_{suffix}"));
    for role in [&producer, &stranger] {
        sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
            "CREATE ROLE {role} LOGIN; GRANT USAGE ON SCHEMA hookd TO {role};"
        )))
        .execute(&pool)
        .await
        .unwrap();
    }
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "GRANT EXECUTE ON FUNCTION hookd.enqueue(text, text, text, text) TO {producer};
         INSERT INTO hookd.producer_roles (role_name, tenant) VALUES ('{producer}', 'team-a');"
    )))
    .execute(&pool)
    .await
    .unwrap();
    let url_as = |role: &str| {
        let url = database_url(&pool);
        let rest = url.split_once('@').unwrap().1;
        format!("postgres://{role}@{rest}")
    };

    let as_producer = PgPool::connect(&url_as(&producer)).await.unwrap();
    let mut tx = as_producer.begin().await.unwrap();
    let id: Uuid =
        sqlx::query_scalar("SELECT hookd.enqueue('team-a', 'order.placed', '{\"n\":1}')")
            .fetch_one(&mut *tx)
            .await
            .unwrap();
    tx.commit().await.unwrap();
    let deliveries: i64 =
        sqlx::query_scalar("SELECT count(*) FROM hookd.deliveries WHERE event_id = $1")
            .bind(id)
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(deliveries, 1, "fan-out runs as before");

    let code = |e: sqlx::Error| {
        e.as_database_error()
            .and_then(|d| d.code())
            .map(|c| c.to_string())
    };
    let err = sqlx::query_scalar::<_, Uuid>("SELECT hookd.enqueue('team-b', 'order.placed', '{}')")
        .fetch_one(&as_producer)
        .await
        .expect_err("another tenant");
    assert_eq!(code(err).as_deref(), Some("42501"));
    let err = sqlx::query_scalar::<_, i64>("SELECT count(*) FROM hookd.events")
        .fetch_one(&as_producer)
        .await
        .expect_err("no read access to payloads");
    assert_eq!(code(err).as_deref(), Some("42501"));

    let as_stranger = PgPool::connect(&url_as(&stranger)).await.unwrap();
    let err = sqlx::query_scalar::<_, Uuid>("SELECT hookd.enqueue('team-a', 'order.placed', '{}')")
        .fetch_one(&as_stranger)
        .await
        .expect_err("no EXECUTE grant");
    assert_eq!(code(err).as_deref(), Some("42501"));
    assert_eq!(events_of(&pool, "team-a").await, 1);
    assert_eq!(events_of(&pool, "team-b").await, 0);

    let config: Vec<String> = sqlx::query_scalar(
        "SELECT unnest(proconfig) FROM pg_proc WHERE oid = 'hookd.enqueue(text,text,text,text)'::regprocedure",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    assert_eq!(config, vec!["search_path=pg_catalog, pg_temp".to_string()]);

    as_producer.close().await;
    as_stranger.close().await;
    for role in [&producer, &stranger] {
        sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
            "DROP OWNED BY {role}; DROP ROLE {role};"
        )))
        .execute(&pool)
        .await
        .unwrap();
    }
}

// ---- suspected: the attempt log is bounded ----

/// A delivery replayed many times has a long attempt log; `GET /v1/deliveries/{id}` shows
/// its latest 100 entries, oldest first, and says how many older ones it left out.
#[sqlx::test]
async fn the_attempt_log_in_a_delivery_read_is_bounded(pool: PgPool) {
    endpoint(&pool, EndpointOpts::default()).await;
    let api = TestApi::start(&pool).await;
    let (_, deliveries) = api.enqueue("team-a", "log", "{}").await;
    let id = deliveries[0];
    failed_attempts(&pool, id, 150).await;
    let (s, v) = api.get(&format!("/v1/deliveries/{id}")).await;
    assert_eq!(s, StatusCode::OK, "{v}");
    let attempts = v["attempts"].as_array().unwrap();
    assert_eq!(attempts.len(), 100);
    assert_eq!(attempts[0]["attempt"], 51);
    assert_eq!(attempts[99]["attempt"], 150);
    assert_eq!(v["attemptsOmitted"], 50);
}

/// Requests are counted per method and matched route template: reads and writes of one
/// path are apart, every operation has its own series (endpoints and consumers calls were
/// all `route="other"`, and `route="messages"` mixed listings with ingest), and ids or
/// unknown paths never mint series.
#[sqlx::test]
async fn requests_are_counted_by_method_and_matched_route(pool: PgPool) {
    let api = TestApi::start(&pool).await;
    let (s, v) = api
        .post("/v1/messages", r#"{"eventType":"a.b","payload":{}}"#)
        .await;
    assert_eq!(s, StatusCode::CREATED, "{v}");
    let (s, _) = api.get("/v1/messages").await;
    assert_eq!(s, StatusCode::OK);
    let (s, _) = api.get("/v1/endpoints").await;
    assert_eq!(s, StatusCode::OK);
    let id = Uuid::now_v7();
    let (s, _) = api.get(&format!("/v1/endpoints/{id}")).await;
    assert_eq!(s, StatusCode::NOT_FOUND);
    let (s, _) = api.get(&format!("/no/such/{id}")).await;
    assert_eq!(s, StatusCode::NOT_FOUND);
    let text = api
        .client
        .get(format!("{}/metrics", api.base))
        .send()
        .await
        .unwrap();
    let text = text.text().await.unwrap();
    let lines: Vec<&str> = text
        .lines()
        .filter(|l| l.starts_with("hookd_http_requests_total{"))
        .collect();
    for want in [
        r#"method="POST",route="/v1/messages",status="201""#,
        r#"method="GET",route="/v1/messages",status="200""#,
        r#"method="GET",route="/v1/endpoints",status="200""#,
        r#"method="GET",route="/v1/endpoints/{id}",status="404""#,
        r#"method="GET",route="unmatched",status="404""#,
    ] {
        assert!(
            lines.iter().any(|l| l.contains(want)),
            "no series with {want}:\n{}",
            lines.join("\n")
        );
    }
    assert!(
        !lines
            .iter()
            .any(|l| l.contains(&id.to_string()) || l.contains("other")),
        "{}",
        lines.join("\n")
    );
}
