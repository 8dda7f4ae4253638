//! Authentication and tenant isolation (issue 8, parts 1 and 2), over real HTTP and real
//! Postgres: 401 without or with a bad credential, 403 for another tenant in the body or
//! a missing scope, 404 for every other tenant's object on every read and replay route,
//! the token CLI, revocation, ServiceAccount tokens through a TokenReview (kube's
//! tower_test mock pattern for the API server), and no token in any log line.

use crate::common;

use std::collections::HashSet;
use std::pin::pin;
use std::time::Duration;

use axum::http::StatusCode;
use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use common::*;
use hookd::auth::Scope;
use serde_json::{Value, json};
use sqlx::PgPool;
use uuid::Uuid;

// ---- helpers ----

async fn count_events(pool: &PgPool) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM hookd.events")
        .fetch_one(pool)
        .await
        .unwrap()
}

fn assert_error(v: &Value, code: &str) {
    assert_eq!(v["error"]["code"], code, "{v}");
    assert!(
        v["error"]["message"]
            .as_str()
            .is_some_and(|m| !m.is_empty()),
        "{v}"
    );
}

/// (status, WWW-Authenticate, body) of one request with an optional bearer token.
async fn call(
    api: &TestApi,
    method: reqwest::Method,
    path: &str,
    token: Option<&str>,
    body: Option<&str>,
) -> (StatusCode, Option<String>, Value) {
    let mut req = api.client.request(method, format!("{}{path}", api.base));
    if let Some(t) = token {
        req = req.bearer_auth(t);
    }
    if let Some(b) = body {
        req = req
            .header("content-type", "application/json")
            .body(b.to_string());
    }
    let r = req.send().await.unwrap();
    let status = StatusCode::from_u16(r.status().as_u16()).unwrap();
    let www = r
        .headers()
        .get("www-authenticate")
        .map(|v| v.to_str().unwrap().to_string());
    let text = r.text().await.unwrap();
    (
        status,
        www,
        serde_json::from_str(&text).unwrap_or(Value::String(text)),
    )
}

fn message(tenant: Option<&str>, event_type: &str) -> String {
    match tenant {
        Some(t) => format!(r#"{{"tenant":"{t}","eventType":"{event_type}","payload":{{"a":1}}}}"#),
        None => format!(r#"{{"eventType":"{event_type}","payload":{{"a":1}}}}"#),
    }
}

async fn post_message(
    api: &TestApi,
    token: &str,
    tenant: Option<&str>,
) -> (StatusCode, Option<String>, Value) {
    let body = message(tenant, "a");
    call(
        api,
        method("POST"),
        "/v1/messages",
        Some(token),
        Some(&body),
    )
    .await
}

/// Marks a delivery dead with a dead-letter row, as an exhausted dispatcher would.
async fn make_dead(pool: &PgPool, delivery: Uuid) {
    sqlx::query(
        "WITH d AS (
             UPDATE hookd.deliveries SET status = 'dead', completed_at = now(), attempts = 3
             WHERE id = $1 RETURNING id, endpoint_id, tenant)
         INSERT INTO hookd.dead_letters (delivery_id, endpoint_id, tenant, reason, attempts)
         SELECT id, endpoint_id, tenant, 'exhausted 3 attempts', 3 FROM d",
    )
    .bind(delivery)
    .execute(pool)
    .await
    .unwrap();
}

const V1_ROUTES: [(&str, &str, Option<&str>); 7] = [
    (
        "POST",
        "/v1/messages",
        Some(r#"{"eventType":"a","payload":1}"#),
    ),
    (
        "POST",
        "/v1/messages/batch",
        Some(r#"{"messages":[{"eventType":"a","payload":1}]}"#),
    ),
    ("GET", "/v1/messages/{id}", None),
    ("GET", "/v1/deliveries/{id}", None),
    ("POST", "/v1/deliveries/{id}/replay", None),
    ("POST", "/v1/endpoints/{id}/replay", None),
    ("GET", "/v1/dead-letters", None),
];

fn method(m: &str) -> reqwest::Method {
    m.parse().unwrap()
}

// ---- 401 ----

/// Every /v1 route answers 401 with `WWW-Authenticate: Bearer` and writes nothing when
/// the credential is missing, not Bearer, malformed, unknown (a well-formed hookd_ token
/// that was never issued), or a JWT while no cluster is configured. Health, metrics and
/// the OpenAPI document stay open.
#[sqlx::test]
async fn missing_or_bad_credentials_are_401_on_every_v1_route(pool: PgPool) {
    endpoint(&pool, EndpointOpts::default()).await;
    let api = TestApi::start(&pool).await;
    let unknown = hookd::auth::tokens::generate();
    let jwt = fake_jwt(3600);
    for (m, path, body) in V1_ROUTES {
        let path = path.replace("{id}", &Uuid::now_v7().to_string());
        let (s, www, v) = call(&api, method(m), &path, None, body).await;
        assert_eq!(s, StatusCode::UNAUTHORIZED, "{m} {path}: {v}");
        assert_error(&v, "unauthenticated");
        assert!(www.unwrap().starts_with("Bearer"), "{m} {path}");
        for bad in [unknown.as_str(), "hookd_short", "not a token", jwt.as_str()] {
            let (s, www, v) = call(&api, method(m), &path, Some(bad), body).await;
            assert_eq!(s, StatusCode::UNAUTHORIZED, "{m} {path} with {bad:?}: {v}");
            assert_error(&v, "invalid_credential");
            assert!(www.unwrap().contains(r#"error="invalid_token""#));
            assert!(!v.to_string().contains(bad), "the token is echoed: {v}");
        }
        // another scheme is not a bearer credential
        let r = api
            .client
            .request(method(m), format!("{}{path}", api.base))
            .basic_auth("team-a", Some("secret"))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status().as_u16(), 401, "{m} {path} with Basic");
    }
    assert_eq!(count_events(&pool).await, 0);
    for open in ["/healthz", "/readyz", "/metrics", "/openapi.json"] {
        let r = api
            .client
            .get(format!("{}{open}", api.base))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status().as_u16(), 200, "{open}");
    }
    // a valid token passes, so the refusals above were about the credential
    let (s, _, v) = call(
        &api,
        method("POST"),
        "/v1/messages",
        Some(&api.token_for("team-a").await),
        Some(&message(None, "a")),
    )
    .await;
    assert_eq!(s, StatusCode::CREATED, "{v}");
    let (_, metrics) = api.get("/metrics").await;
    assert!(
        metrics
            .as_str()
            .unwrap()
            .contains(r#"hookd_auth_failures_total{reason="missing"}"#),
        "{metrics}"
    );
}

/// With the token table unreachable a static token can be checked neither way: 503
/// `auth_unavailable` with Retry-After, never a 2xx and never "open".
#[tokio::test]
async fn unreachable_token_store_is_503_not_open() {
    let dead = hookd::db::connect_lazy(&hookd::db::PoolSettings {
        url: "postgres://postgres@127.0.0.1:1/x".into(),
        max_connections: 2,
        acquire_timeout: Duration::from_secs(1),
    })
    .unwrap();
    let api = TestApi::start_with(&dead, api_settings()).await;
    let token = hookd::auth::tokens::generate();
    for (m, path, body) in V1_ROUTES {
        let path = path.replace("{id}", &Uuid::now_v7().to_string());
        let r = api
            .client
            .request(method(m), format!("{}{path}", api.base))
            .bearer_auth(&token)
            .header("content-type", "application/json")
            .body(body.unwrap_or("").to_string())
            .send()
            .await
            .unwrap();
        assert_eq!(r.status().as_u16(), 503, "{m} {path}");
        assert_eq!(r.headers()["retry-after"], "1");
        let v: Value = r.json().await.unwrap();
        assert_error(&v, "auth_unavailable");
    }
}

// ---- 403 ----

/// The tenant comes from the credential: a body may omit it or repeat it, but naming
/// another tenant is a 403 that writes nothing, in a single message, anywhere in a batch,
/// and in the dead-letter query.
#[sqlx::test]
async fn a_body_tenant_other_than_the_credentials_is_403(pool: PgPool) {
    endpoint(&pool, EndpointOpts::default()).await;
    let api = TestApi::start(&pool).await;
    let token = api.token_for("team-a").await;
    let post = |path: &'static str, body: String| {
        let token = token.clone();
        let api = &api;
        async move { call(api, method("POST"), path, Some(&token), Some(&body)).await }
    };

    let (s, _, v) = post("/v1/messages", message(Some("team-b"), "a")).await;
    assert_eq!(s, StatusCode::FORBIDDEN, "{v}");
    assert_error(&v, "tenant_mismatch");
    let batch = json!({"messages": [
        {"eventType": "a", "payload": 1},
        {"tenant": "team-b", "eventType": "a", "payload": 2},
    ]});
    let (s, _, v) = post("/v1/messages/batch", batch.to_string()).await;
    assert_eq!(s, StatusCode::FORBIDDEN, "{v}");
    assert_error(&v, "tenant_mismatch");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .starts_with("messages[1]"),
        "{v}"
    );
    assert_eq!(count_events(&pool).await, 0);
    let (s, _, v) = call(
        &api,
        method("GET"),
        "/v1/dead-letters?tenant=team-b",
        Some(&token),
        None,
    )
    .await;
    assert_eq!(s, StatusCode::FORBIDDEN, "{v}");
    assert_error(&v, "tenant_mismatch");

    // omitted or repeated: the credential's tenant
    for body in [message(None, "a"), message(Some("team-a"), "a")] {
        let (s, _, v) = post("/v1/messages", body).await;
        assert_eq!(s, StatusCode::CREATED, "{v}");
        let event = v["eventId"].as_str().unwrap().parse::<Uuid>().unwrap();
        let tenant: String = sqlx::query_scalar("SELECT tenant FROM hookd.events WHERE id = $1")
            .bind(event)
            .fetch_one(&pool)
            .await
            .unwrap();
        assert_eq!(tenant, "team-a");
        assert_eq!(
            v["deliveryIds"].as_array().unwrap().len(),
            1,
            "fan-out to team-a's endpoint"
        );
    }
    let (s, _, v) = call(
        &api,
        method("GET"),
        "/v1/dead-letters?tenant=team-a",
        Some(&token),
        None,
    )
    .await;
    assert_eq!(s, StatusCode::OK, "{v}");
}

/// produce: POST messages and batches only. read: the GET routes only. operate: the
/// replay routes only. Each refusal is a 403 `insufficient_scope` naming the scope in
/// WWW-Authenticate, and a refused produce writes nothing.
#[sqlx::test]
async fn scopes_are_enforced(pool: PgPool) {
    let ep = endpoint(&pool, EndpointOpts::default()).await;
    let api = TestApi::start(&pool).await;
    let (event, deliveries) = api.enqueue("team-a", "a", "{}").await;
    let produce = mint_token(&pool, "team-a", &[Scope::Produce]).await;
    let read = mint_token(&pool, "team-a", &[Scope::Read]).await;
    let operate = mint_token(&pool, "team-a", &[Scope::Operate]).await;
    let routes: Vec<(&str, String, Option<String>, Scope)> = vec![
        (
            "POST",
            "/v1/messages".into(),
            Some(message(None, "a")),
            Scope::Produce,
        ),
        (
            "POST",
            "/v1/messages/batch".into(),
            Some(json!({"messages":[{"eventType":"a","payload":1}]}).to_string()),
            Scope::Produce,
        ),
        ("GET", format!("/v1/messages/{event}"), None, Scope::Read),
        (
            "GET",
            format!("/v1/deliveries/{}", deliveries[0]),
            None,
            Scope::Read,
        ),
        ("GET", "/v1/dead-letters".into(), None, Scope::Read),
        (
            "POST",
            format!("/v1/deliveries/{}/replay", deliveries[0]),
            None,
            Scope::Operate,
        ),
        (
            "POST",
            format!("/v1/endpoints/{ep}/replay"),
            None,
            Scope::Operate,
        ),
    ];
    for (token, has) in [
        (&produce, Scope::Produce),
        (&read, Scope::Read),
        (&operate, Scope::Operate),
    ] {
        for (m, path, body, needs) in &routes {
            let before = count_events(&pool).await;
            let (s, www, v) = call(&api, method(m), path, Some(token), body.as_deref()).await;
            if *needs == has {
                assert!(s.is_success(), "{has} token on {m} {path}: {s} {v}");
            } else {
                assert_eq!(s, StatusCode::FORBIDDEN, "{has} token on {m} {path}: {v}");
                assert_error(&v, "insufficient_scope");
                let www = www.expect("WWW-Authenticate on 403");
                assert!(
                    www.contains("insufficient_scope") && www.contains(needs.as_str()),
                    "{www}"
                );
                assert_eq!(count_events(&pool).await, before, "a refused request wrote");
            }
        }
    }
}

// ---- 404 across tenants ----

/// With team-a's credential, team-b's message, delivery, delivery replay, endpoint replay
/// and dead letters are exactly as absent as unknown ids: the same 404 body, no state
/// change, and the dead-letter list (even filtered by team-b's endpoint) shows none of
/// them. team-b's own credential sees all of it, so the 404s are about the tenant.
#[sqlx::test]
async fn other_tenants_objects_are_404_on_every_read_and_replay_route(pool: PgPool) {
    let ep_a = endpoint(&pool, EndpointOpts::default()).await;
    let ep_b = endpoint(
        &pool,
        EndpointOpts {
            namespace: "team-b".into(),
            ..Default::default()
        },
    )
    .await;
    let api = TestApi::start(&pool).await;
    let (_, a_deliveries) = api.enqueue("team-a", "a", "{}").await;
    make_dead(&pool, a_deliveries[0]).await;
    let (b_event, b_deliveries) = api.enqueue("team-b", "a", r#"{"secret":"b"}"#).await;
    make_dead(&pool, b_deliveries[0]).await;
    let a = api.token_for("team-a").await;
    let b = api.token_for("team-b").await;
    let unknown = Uuid::now_v7();

    let probes = [
        ("GET", "/v1/messages/{}", b_event, "message"),
        ("GET", "/v1/deliveries/{}", b_deliveries[0], "delivery"),
        (
            "POST",
            "/v1/deliveries/{}/replay",
            b_deliveries[0],
            "delivery",
        ),
        ("POST", "/v1/endpoints/{}/replay", ep_b, "endpoint"),
    ];
    for (m, template, id, what) in probes {
        let (s_other, _, v_other) = call(
            &api,
            method(m),
            &template.replace("{}", &id.to_string()),
            Some(&a),
            None,
        )
        .await;
        let (s_unknown, _, v_unknown) = call(
            &api,
            method(m),
            &template.replace("{}", &unknown.to_string()),
            Some(&a),
            None,
        )
        .await;
        assert_eq!(s_other, StatusCode::NOT_FOUND, "{m} {template}: {v_other}");
        assert_eq!(
            (s_other, &v_other),
            (s_unknown, &v_unknown),
            "{m} {template}: another tenant's {what} must look unknown"
        );
        assert_eq!(v_other["error"]["message"], format!("{what} not found"));
    }
    // nothing of team-b's was replayed
    assert_eq!(delivery_status(&pool, b_deliveries[0]).await.0, "dead");
    let dead_b: i64 =
        sqlx::query_scalar("SELECT count(*) FROM hookd.dead_letters WHERE tenant = 'team-b'")
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(dead_b, 1);

    for query in [
        "/v1/dead-letters".to_string(),
        format!("/v1/dead-letters?endpointId={ep_b}"),
    ] {
        let (s, _, v) = call(&api, method("GET"), &query, Some(&a), None).await;
        assert_eq!(s, StatusCode::OK, "{v}");
        let ids: HashSet<&str> = v["items"]
            .as_array()
            .unwrap()
            .iter()
            .map(|i| i["deliveryId"].as_str().unwrap())
            .collect();
        assert!(
            !ids.contains(b_deliveries[0].to_string().as_str()),
            "{query}: {v}"
        );
        if !query.contains("endpointId") {
            assert_eq!(ids, HashSet::from([a_deliveries[0].to_string().as_str()]));
        }
    }

    // the owner sees and replays all of it
    for (m, template, id, _) in probes {
        let (s, _, v) = call(
            &api,
            method(m),
            &template.replace("{}", &id.to_string()),
            Some(&b),
            None,
        )
        .await;
        assert!(s.is_success(), "team-b on {m} {template}: {s} {v}");
    }
    assert_eq!(delivery_status(&pool, b_deliveries[0]).await.0, "pending");
    let (s, _, v) = call(
        &api,
        method("POST"),
        &format!("/v1/endpoints/{ep_a}/replay"),
        Some(&b),
        None,
    )
    .await;
    assert_eq!(s, StatusCode::NOT_FOUND, "team-b on team-a's endpoint: {v}");
    assert_eq!(delivery_status(&pool, a_deliveries[0]).await.0, "dead");
}

// ---- the token CLI and revocation ----

fn hookd_cli(pool: &PgPool, args: &[&str]) -> std::process::Output {
    HookdCommand::new(args)
        .database(pool)
        .env("HOOKD_LOG", "warn")
        .output()
}

/// `hookd token create` prints the token alone on the last stdout line; `list` shows
/// id, prefix, tenant, scopes and status but never the token, and only its hash is
/// stored; `revoke` takes effect within the documented 5 s; an expiring token stops
/// working at its expiry.
#[sqlx::test]
async fn token_cli_create_list_revoke(pool: PgPool) {
    let out = hookd_cli(
        &pool,
        &[
            "token", "create", "--tenant", "team-a", "--scope", "produce", "--scope", "read",
            "--name", "ci",
        ],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8(out.stdout).unwrap();
    let token = stdout.lines().last().unwrap().to_string();
    assert!(token.starts_with("hookd_") && token.len() == 49, "{stdout}");
    let stderr = String::from_utf8(out.stderr).unwrap();
    assert!(!stderr.contains(&token), "{stderr}");

    let stored: Vec<u8> = sqlx::query_scalar("SELECT token_hash FROM hookd.api_tokens")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(stored, hookd::auth::tokens::hash(&token).to_vec());
    let dump: String = sqlx::query_scalar("SELECT row_to_json(t)::text FROM hookd.api_tokens t")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert!(
        !dump.contains(&token[14..]),
        "the table holds the token: {dump}"
    );

    let api = TestApi::start(&pool).await;
    let (s, _, v) = call(
        &api,
        method("POST"),
        "/v1/messages",
        Some(&token),
        Some(&message(None, "a")),
    )
    .await;
    assert_eq!(s, StatusCode::CREATED, "{v}");

    let list = hookd_cli(&pool, &["token", "list"]);
    assert!(list.status.success());
    let listed = String::from_utf8(list.stdout).unwrap();
    assert!(!listed.contains(&token), "{listed}");
    assert!(!listed.contains(&token[14..]), "{listed}");
    let row = listed.lines().nth(1).expect("one token listed");
    assert!(row.contains(&token[..14]), "{listed}");
    for want in ["team-a", "produce,read", "ci", "active"] {
        assert!(row.contains(want), "{want} in {listed}");
    }
    let id: Uuid = row.split_whitespace().next().unwrap().parse().unwrap();

    let revoke = hookd_cli(&pool, &["token", "revoke", &id.to_string()]);
    assert!(
        revoke.status.success(),
        "{}",
        String::from_utf8_lossy(&revoke.stderr)
    );
    let revoked_at = std::time::Instant::now();
    assert!(
        wait_until(Duration::from_secs(10), || async {
            call(
                &api,
                method("POST"),
                "/v1/messages",
                Some(&token),
                Some(&message(None, "a")),
            )
            .await
            .0 == StatusCode::UNAUTHORIZED
        })
        .await
    );
    assert!(
        revoked_at.elapsed() <= Duration::from_secs(6),
        "revocation took {:?}",
        revoked_at.elapsed()
    );
    let listed = String::from_utf8(hookd_cli(&pool, &["token", "list"]).stdout).unwrap();
    assert!(listed.contains("revoked"), "{listed}");
    let again = hookd_cli(&pool, &["token", "revoke", &id.to_string()]);
    assert!(again.status.success());
    assert!(String::from_utf8_lossy(&again.stdout).contains("already revoked"));
    assert!(
        !hookd_cli(&pool, &["token", "revoke", &Uuid::now_v7().to_string()])
            .status
            .success()
    );
    // bad input is refused before anything is written
    for bad in [
        vec!["token", "create", "--tenant", "team a", "--scope", "read"],
        vec!["token", "create", "--tenant", "team-a", "--scope", "admin"],
        vec!["token", "create", "--tenant", "team-a"],
    ] {
        assert!(!hookd_cli(&pool, &bad).status.success(), "{bad:?}");
    }
    let rows: i64 = sqlx::query_scalar("SELECT count(*) FROM hookd.api_tokens")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(rows, 1);

    // an expiring token works until its expiry, then is refused
    let expiring = hookd::auth::tokens::create(
        &pool,
        &hookd::auth::tokens::TokenRequest {
            consumer: None,
            tenant: "team-a".into(),
            scopes: vec![Scope::Read],
            name: None,
            expires_at: Some(chrono::Utc::now() + chrono::Duration::seconds(2)),
        },
    )
    .await
    .unwrap()
    .token;
    let (s, _, _) = call(
        &api,
        method("GET"),
        "/v1/dead-letters",
        Some(&expiring),
        None,
    )
    .await;
    assert_eq!(s, StatusCode::OK);
    assert!(
        wait_until(Duration::from_secs(10), || async {
            call(
                &api,
                method("GET"),
                "/v1/dead-letters",
                Some(&expiring),
                None,
            )
            .await
            .0 == StatusCode::UNAUTHORIZED
        })
        .await
    );
}

// ---- ServiceAccount tokens through a TokenReview ----

/// A JWT-shaped token (the API never checks its signature itself: the TokenReview does).
fn fake_jwt(expires_in: i64) -> String {
    let claims = json!({
        "aud": ["hookd"],
        "exp": chrono::Utc::now().timestamp() + expires_in,
        "sub": "system:serviceaccount:team-a:producer",
        "n": Uuid::now_v7().to_string(),
    });
    format!(
        "eyJhbGciOiJSUzI1NiJ9.{}.c2lnbmF0dXJl",
        URL_SAFE_NO_PAD.encode(claims.to_string())
    )
}

type MockHandle =
    tower_test::mock::Handle<http::Request<kube::client::Body>, http::Response<kube::client::Body>>;

/// What the mock API server answers to one TokenReview.
enum Review {
    Authenticated {
        username: &'static str,
        audiences: Vec<&'static str>,
    },
    Unauthenticated,
    Status(u16),
    Unreachable,
}

/// A 404 `Status` from the mock API server.
fn not_found() -> http::Response<kube::client::Body> {
    http::Response::builder()
        .status(404)
        .body(kube::client::Body::from(
            serde_json::to_vec(&json!({
                "kind": "Status", "apiVersion": "v1", "status": "Failure",
                "message": "the server could not find the requested resource", "reason": "NotFound", "code": 404
            }))
            .unwrap(),
        ))
        .unwrap()
}

/// Answers the next TokenReview, asserting it is one of `token` for audience hookd. This
/// mock API server publishes no signing keys: its issuer discovery (read once, before the
/// first review) answers 404, so tokens are reviewed unverified, as in a cluster that does
/// not serve discovery.
async fn answer_review(handle: &mut std::pin::Pin<&mut MockHandle>, token: &str, review: Review) {
    let (request, send) = loop {
        let (request, send) = tokio::time::timeout(Duration::from_secs(10), handle.next_request())
            .await
            .expect("a TokenReview within 10 s")
            .expect("the service was called");
        if request.method() == http::Method::GET {
            send.send_response(not_found());
            continue;
        }
        break (request, send);
    };
    assert_eq!(request.method(), http::Method::POST);
    assert_eq!(
        request.uri().path(),
        "/apis/authentication.k8s.io/v1/tokenreviews"
    );
    let body: Value =
        serde_json::from_slice(&request.into_body().collect_bytes().await.unwrap()).unwrap();
    assert_eq!(body["spec"]["token"], token);
    assert_eq!(body["spec"]["audiences"], json!(["hookd"]));
    let ok = |status: Value| {
        let mut answer = body.clone();
        answer["status"] = status;
        http::Response::builder()
            .status(201)
            .body(kube::client::Body::from(
                serde_json::to_vec(&answer).unwrap(),
            ))
            .unwrap()
    };
    match review {
        Review::Authenticated { username, audiences } => send.send_response(ok(json!({
            "authenticated": true,
            "user": {"username": username, "uid": "u-1", "groups": ["system:serviceaccounts"]},
            "audiences": audiences,
        }))),
        Review::Unauthenticated => send.send_response(ok(json!({
            "authenticated": false,
            "error": "[invalid bearer token, token has been invalidated]",
        }))),
        Review::Status(code) => send.send_response(
            http::Response::builder()
                .status(code)
                .body(kube::client::Body::from(
                    serde_json::to_vec(&json!({
                        "kind": "Status", "apiVersion": "v1", "status": "Failure",
                        "message": "tokenreviews.authentication.k8s.io is forbidden", "reason": "Forbidden", "code": code
                    }))
                    .unwrap(),
                ))
                .unwrap(),
        ),
        Review::Unreachable => send.send_error(std::io::Error::new(
            std::io::ErrorKind::ConnectionRefused,
            "connection refused",
        )),
    }
}

async fn sa_api(pool: &PgPool) -> (TestApi, MockHandle) {
    let (service, handle) = tower_test::mock::pair::<
        http::Request<kube::client::Body>,
        http::Response<kube::client::Body>,
    >();
    let client = kube::Client::new(service, "default");
    (
        TestApi::start_with_kube(pool, api_settings(), Some(client)).await,
        handle,
    )
}

/// An authenticated ServiceAccount token (audience hookd) acts for its namespace's
/// tenant with the default ServiceAccount scopes (produce, read; not operate), and the
/// result is cached: the second request makes no second TokenReview.
#[sqlx::test]
async fn serviceaccount_token_is_verified_with_a_tokenreview(pool: PgPool) {
    let ep = endpoint(&pool, EndpointOpts::default()).await;
    let (api, handle) = sa_api(&pool).await;
    let mut handle = pin!(handle);
    let token = fake_jwt(3600);

    let request = post_message(&api, &token, None);
    let review = answer_review(
        &mut handle,
        &token,
        Review::Authenticated {
            username: "system:serviceaccount:team-a:producer",
            audiences: vec!["hookd"],
        },
    );
    let ((s, _, v), ()) = tokio::join!(request, review);
    assert_eq!(s, StatusCode::CREATED, "{v}");
    let event = v["eventId"].as_str().unwrap().to_string();
    let delivery = v["deliveryIds"][0].as_str().unwrap().to_string();
    let tenant: String = sqlx::query_scalar("SELECT tenant FROM hookd.events")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(tenant, "team-a");

    // cached: these make no TokenReview (an unexpected one would hang the request,
    // since nobody answers the mock)
    let (s, _, v) = call(
        &api,
        method("GET"),
        &format!("/v1/messages/{event}"),
        Some(&token),
        None,
    )
    .await;
    assert_eq!(s, StatusCode::OK, "{v}");
    let (s, _, v) = call(
        &api,
        method("POST"),
        "/v1/messages",
        Some(&token),
        Some(&message(Some("team-b"), "a")),
    )
    .await;
    assert_eq!(s, StatusCode::FORBIDDEN, "{v}");
    assert_error(&v, "tenant_mismatch");
    let (s, _, v) = call(
        &api,
        method("POST"),
        &format!("/v1/deliveries/{delivery}/replay"),
        Some(&token),
        None,
    )
    .await;
    assert_eq!(
        s,
        StatusCode::FORBIDDEN,
        "ServiceAccounts do not operate by default: {v}"
    );
    assert_error(&v, "insufficient_scope");
    let (s, _, _) = call(
        &api,
        method("POST"),
        &format!("/v1/endpoints/{ep}/replay"),
        Some(&token),
        None,
    )
    .await;
    assert_eq!(s, StatusCode::FORBIDDEN);
    assert_eq!(count_events(&pool).await, 1);
}

/// TokenReview says no (not authenticated), or yes for another audience (an ordinary
/// API-server token), or yes for a user who is not a ServiceAccount: 401 and nothing
/// written.
#[sqlx::test]
async fn unauthenticated_serviceaccount_tokens_are_401(pool: PgPool) {
    let (api, handle) = sa_api(&pool).await;
    let mut handle = pin!(handle);
    let cases = [
        Review::Unauthenticated,
        Review::Authenticated {
            username: "system:serviceaccount:team-a:producer",
            audiences: vec![],
        },
        Review::Authenticated {
            username: "system:serviceaccount:team-a:producer",
            audiences: vec!["https://kubernetes.default.svc"],
        },
        Review::Authenticated {
            username: "alice@example.com",
            audiences: vec!["hookd"],
        },
    ];
    for review in cases {
        let token = fake_jwt(3600);
        let request = post_message(&api, &token, None);
        let ((s, www, v), ()) = tokio::join!(request, answer_review(&mut handle, &token, review));
        assert_eq!(s, StatusCode::UNAUTHORIZED, "{v}");
        assert_error(&v, "invalid_credential");
        assert!(www.unwrap().starts_with("Bearer"));
    }
    assert_eq!(count_events(&pool).await, 0);
}

/// The API server unreachable, or refusing the review (403: the API's own RBAC is
/// missing; 500): 503 `auth_unavailable`, never a 2xx, never open; nothing written, and
/// nothing cached, so the next request asks again and succeeds once the API server is back.
#[sqlx::test]
async fn unreachable_api_server_is_503(pool: PgPool) {
    let (api, handle) = sa_api(&pool).await;
    let mut handle = pin!(handle);
    let token = fake_jwt(3600);
    for review in [
        Review::Unreachable,
        Review::Status(403),
        Review::Status(500),
    ] {
        let request = post_message(&api, &token, None);
        let ((s, _, v), ()) = tokio::join!(request, answer_review(&mut handle, &token, review));
        assert_eq!(s, StatusCode::SERVICE_UNAVAILABLE, "{v}");
        assert_error(&v, "auth_unavailable");
    }
    assert_eq!(count_events(&pool).await, 0);
    let request = post_message(&api, &token, None);
    let review = answer_review(
        &mut handle,
        &token,
        Review::Authenticated {
            username: "system:serviceaccount:team-a:producer",
            audiences: vec!["hookd"],
        },
    );
    let ((s, _, v), ()) = tokio::join!(request, review);
    assert_eq!(s, StatusCode::CREATED, "{v}");
}

/// `HOOKD_AUTH_NAMESPACE_TENANTS` maps a namespace to another tenant, and
/// `HOOKD_AUTH_SA_SCOPES` sets what ServiceAccounts may do.
#[sqlx::test]
async fn namespace_tenant_mapping_and_sa_scopes_are_configurable(pool: PgPool) {
    let (service, handle) = tower_test::mock::pair::<
        http::Request<kube::client::Body>,
        http::Response<kube::client::Body>,
    >();
    let mut settings = api_settings();
    settings.auth_namespace_tenants = "billing-prod=billing".parse().unwrap();
    settings.auth_sa_scopes = vec![Scope::Produce];
    let api =
        TestApi::start_with_kube(&pool, settings, Some(kube::Client::new(service, "default")))
            .await;
    let mut handle = pin!(handle);
    let token = fake_jwt(3600);
    let request = post_message(&api, &token, Some("billing"));
    let review = answer_review(
        &mut handle,
        &token,
        Review::Authenticated {
            username: "system:serviceaccount:billing-prod:api",
            audiences: vec!["hookd"],
        },
    );
    let ((s, _, v), ()) = tokio::join!(request, review);
    assert_eq!(s, StatusCode::CREATED, "{v}");
    let (s, _, v) = call(&api, method("GET"), "/v1/dead-letters", Some(&token), None).await;
    assert_eq!(s, StatusCode::FORBIDDEN, "{v}");
}

// ---- HOOKD_AUTH=none and the logs ----

/// Runs `hookd api` with `envs` until it is ready; its `lines()` are its stderr.
async fn start_api(pool: &PgPool, envs: &[(&str, &str)]) -> HookdProcess {
    HookdCommand::new(["api"])
        .database(pool)
        .listen(free_port())
        .env_remove("KUBECONFIG")
        .envs(envs.iter().copied())
        .lines(Lines::Stderr)
        .start()
        .await
}

/// `HOOKD_AUTH=none` is an explicit choice with a warning at start: the tenant then comes
/// from the body (required, validated) and no credential is needed.
#[sqlx::test]
async fn auth_none_is_explicit_and_warned(pool: PgPool) {
    init();
    let child = start_api(&pool, &[("HOOKD_AUTH", "none"), ("HOOKD_LOG", "info")]).await;
    let (base, lines) = (child.base(), child.lines());
    let client = reqwest::Client::new();
    let post = |body: String| {
        client
            .post(format!("{base}/v1/messages"))
            .header("content-type", "application/json")
            .body(body)
            .send()
    };
    let r = post(message(Some("team-z"), "a")).await.unwrap();
    assert_eq!(r.status().as_u16(), 201);
    let r = post(message(None, "a")).await.unwrap();
    assert_eq!(r.status().as_u16(), 422);
    assert_error(&r.json().await.unwrap(), "missing_field");
    let r = post(message(Some("team/z"), "a")).await.unwrap();
    assert_eq!(r.status().as_u16(), 422);
    assert_error(&r.json().await.unwrap(), "invalid_tenant");
    let warned = lines
        .try_iter()
        .chain(std::iter::from_fn(|| {
            lines.recv_timeout(Duration::from_secs(5)).ok()
        }))
        .find(|l| l.contains("HOOKD_AUTH=none") && l.contains("WARN"));
    assert!(warned.is_some(), "no start-up warning");
    drop(child);
}

/// A full run of `hookd api` at the most verbose log level, with a valid token (enqueue,
/// read, replay), a revoked one, an unknown one and a ServiceAccount-shaped one (refused:
/// no cluster), plus `hookd token create/list/revoke`: no token appears in the API's logs,
/// in the CLI's stderr or `list` output, in any response body, or in /metrics.
#[sqlx::test]
async fn tokens_never_appear_in_logs_errors_or_metrics(pool: PgPool) {
    init();
    endpoint(&pool, EndpointOpts::default()).await;
    let mut secrets = Vec::new();
    let mut cli_output = String::new();
    let mut create = |scopes: &[&str]| {
        let mut args = vec!["token", "create", "--tenant", "team-a"];
        for s in scopes {
            args.extend(["--scope", s]);
        }
        let out = hookd_cli(&pool, &args);
        assert!(out.status.success());
        let token = String::from_utf8(out.stdout).unwrap().trim().to_string();
        cli_output.push_str(&String::from_utf8(out.stderr).unwrap());
        token
    };
    let valid = create(&["produce", "read", "operate"]);
    let revoked = create(&["read"]);
    secrets.extend([valid.clone(), revoked.clone()]);
    let unknown = hookd::auth::tokens::generate();
    let jwt = fake_jwt(600);
    secrets.extend([unknown.clone(), jwt.clone()]);

    let child = start_api(&pool, &[("HOOKD_LOG", "trace")]).await;
    let base = child.base().to_string();
    let client = reqwest::Client::new();
    let mut bodies = String::new();
    let mut send = async |m: &str, path: &str, token: &str, body: Option<String>| {
        let mut req = client
            .request(method(m), format!("{base}{path}"))
            .bearer_auth(token);
        if let Some(b) = body {
            req = req.header("content-type", "application/json").body(b);
        }
        let r = req.send().await.unwrap();
        let status = r.status().as_u16();
        bodies.push_str(&format!("{:?}", r.headers()));
        let text = r.text().await.unwrap();
        bodies.push_str(&text);
        (status, text)
    };
    let (s, text) = send("POST", "/v1/messages", &valid, Some(message(None, "a"))).await;
    assert_eq!(s, 201, "{text}");
    let v: Value = serde_json::from_str(&text).unwrap();
    let (event, delivery) = (
        v["eventId"].as_str().unwrap().to_string(),
        v["deliveryIds"][0].as_str().unwrap().to_string(),
    );
    assert_eq!(
        send("GET", &format!("/v1/messages/{event}"), &valid, None)
            .await
            .0,
        200
    );
    assert_eq!(
        send(
            "POST",
            &format!("/v1/deliveries/{delivery}/replay"),
            &valid,
            None
        )
        .await
        .0,
        202
    );
    assert_eq!(
        send(
            "POST",
            "/v1/messages",
            &valid,
            Some(message(Some("team-b"), "a"))
        )
        .await
        .0,
        403
    );
    assert_eq!(send("GET", "/v1/dead-letters", &revoked, None).await.0, 200);
    let id: Uuid = sqlx::query_scalar("SELECT id FROM hookd.api_tokens WHERE scopes = '{read}'")
        .fetch_one(&pool)
        .await
        .unwrap();
    let out = hookd_cli(&pool, &["token", "revoke", &id.to_string()]);
    cli_output.push_str(&String::from_utf8(out.stdout).unwrap());
    cli_output.push_str(&String::from_utf8(out.stderr).unwrap());
    let out = hookd_cli(&pool, &["token", "list"]);
    cli_output.push_str(&String::from_utf8(out.stdout).unwrap());
    cli_output.push_str(&String::from_utf8(out.stderr).unwrap());
    assert!(
        wait_until(Duration::from_secs(10), || async {
            reqwest::Client::new()
                .get(format!("{base}/v1/dead-letters"))
                .bearer_auth(&revoked)
                .send()
                .await
                .unwrap()
                .status()
                == 401
        })
        .await
    );
    assert_eq!(send("GET", "/v1/dead-letters", &unknown, None).await.0, 401);
    assert_eq!(send("GET", "/v1/dead-letters", &jwt, None).await.0, 401);
    assert_eq!(
        send("GET", "/v1/dead-letters", "hookd_malformed", None)
            .await
            .0,
        401
    );
    let metrics = reqwest::get(format!("{base}/metrics"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();

    // stop it (SIGTERM) and take every line it logged
    child.signal("TERM");
    let mut logs = Vec::new();
    while let Ok(line) = child.lines().recv_timeout(Duration::from_secs(20)) {
        logs.push(line);
    }
    drop(child);
    let logs = logs.join("\n");
    assert!(
        logs.lines().count() > 10,
        "the run logged little; the check below proves nothing:\n{logs}"
    );
    assert!(logs.contains("listening"), "{logs}");
    for secret in &secrets {
        // the whole token, and its secret part past the non-secret display prefix
        let tail = &secret[secret.len() - 20..];
        for (what, text) in [
            ("API logs", &logs),
            ("CLI output", &cli_output),
            ("responses", &bodies),
            ("metrics", &metrics),
        ] {
            assert!(!text.contains(secret.as_str()), "a token is in the {what}");
            assert!(!text.contains(tail), "part of a token is in the {what}");
        }
    }
}

// ---- TokenReview amplification (issue 19) ----

/// A token that cannot pass a review (not a JWT, another audience, expired, `alg: none`)
/// is refused without one; a flood of distinct plausible tokens costs at most the review
/// budget (20/s; 503 `auth_unavailable` past it), while a caller verified before keeps
/// working throughout.
#[sqlx::test]
async fn tokenreviews_are_only_for_plausible_tokens_and_bounded(pool: PgPool) {
    endpoint(&pool, EndpointOpts::default()).await;
    let (api, handle) = sa_api(&pool).await;
    let now = chrono::Utc::now().timestamp();
    let jwt = |header: &str, claims: Value| {
        format!(
            "{}.{}.c2lnbmF0dXJl",
            URL_SAFE_NO_PAD.encode(header),
            URL_SAFE_NO_PAD.encode(claims.to_string())
        )
    };
    let rs256 = r#"{"alg":"RS256"}"#;
    for i in 0..300 {
        let junk = match i % 4 {
            0 => format!("opaque-{i}"),
            1 => jwt(
                rs256,
                json!({"aud": ["https://kubernetes.default.svc"], "exp": now + 600, "n": i}),
            ),
            2 => jwt(rs256, json!({"aud": ["hookd"], "exp": now - 1, "n": i})),
            _ => jwt(
                r#"{"alg":"none"}"#,
                json!({"aud": ["hookd"], "exp": now + 600, "n": i}),
            ),
        };
        let (s, _, v) = post_message(&api, &junk, None).await;
        assert_eq!(s, StatusCode::UNAUTHORIZED, "{v}");
    }
    // the first review the API server sees is the legitimate caller's
    let mut handle = Box::pin(handle);
    let legit = fake_jwt(3600);
    let mut pinned = handle.as_mut();
    let review = answer_review(
        &mut pinned,
        &legit,
        Review::Authenticated {
            username: "system:serviceaccount:team-a:producer",
            audiences: vec!["hookd"],
        },
    );
    let ((s, _, v), ()) = tokio::join!(post_message(&api, &legit, None), review);
    assert_eq!(s, StatusCode::CREATED, "{v}");

    // a flood of distinct plausible tokens: every review answered "no", and counted
    let reviews = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counter = reviews.clone();
    tokio::spawn(async move {
        while let Some((_, send)) = handle.as_mut().next_request().await {
            counter.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            let body = json!({
                "apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview",
                "spec": {}, "status": {"authenticated": false}
            });
            send.send_response(
                http::Response::builder()
                    .status(201)
                    .body(kube::client::Body::from(serde_json::to_vec(&body).unwrap()))
                    .unwrap(),
            );
        }
    });
    let api = std::sync::Arc::new(api);
    let started = std::time::Instant::now();
    let mut flood = Vec::new();
    for _ in 0..300 {
        let api = api.clone();
        flood.push(tokio::spawn(async move {
            post_message(&api, &fake_jwt(600), None).await.0
        }));
    }
    // the verified caller is served from the cache meanwhile
    let (s, _, v) = post_message(&api, &legit, None).await;
    assert_eq!(s, StatusCode::CREATED, "{v}");
    let (mut refused, mut unavailable) = (0, 0);
    for f in flood {
        match f.await.unwrap() {
            StatusCode::UNAUTHORIZED => refused += 1,
            StatusCode::SERVICE_UNAVAILABLE => unavailable += 1,
            other => panic!("unexpected {other}"),
        }
    }
    let elapsed = started.elapsed().as_secs_f64();
    let sent = reviews.load(std::sync::atomic::Ordering::SeqCst);
    assert!(
        (sent as f64) <= 20.0 + (elapsed * 20.0).ceil(),
        "{sent} TokenReviews in {elapsed:.2} s"
    );
    assert_eq!(refused, sent, "each review answered one request");
    assert_eq!(refused + unavailable, 300);
    assert!(unavailable > 0, "the budget was never reached");
}

// ---- ServiceAccount tokens verified against the cluster's keys (issue 29 item 7) ----

const ISSUER: &str = "https://kubernetes.default.svc.cluster.local";
const CLUSTER_KID: &str = "cluster-key-1";

/// The cluster's signing key (its public half is in jwks.json) and a forger's, both
/// 2048-bit RSA made for these tests.
fn cluster_key() -> jsonwebtoken::EncodingKey {
    jsonwebtoken::EncodingKey::from_rsa_der(include_bytes!("fixtures/service-account/cluster.der"))
}
fn forger_key() -> jsonwebtoken::EncodingKey {
    jsonwebtoken::EncodingKey::from_rsa_der(include_bytes!("fixtures/service-account/forger.der"))
}
const JWKS: &str = include_str!("fixtures/service-account/jwks.json");

/// A ServiceAccount token for team-a, signed as `alg` with `key`, naming `kid`.
fn signed_jwt(
    alg: jsonwebtoken::Algorithm,
    kid: Option<&str>,
    key: &jsonwebtoken::EncodingKey,
) -> String {
    let mut header = jsonwebtoken::Header::new(alg);
    header.kid = kid.map(str::to_string);
    let claims = json!({
        "iss": ISSUER,
        "aud": ["hookd"],
        "exp": chrono::Utc::now().timestamp() + 3600,
        "sub": "system:serviceaccount:team-a:producer",
        "n": Uuid::now_v7().to_string(),
    });
    jsonwebtoken::encode(&header, &claims, key).unwrap()
}

/// What the stand-in API server has been asked.
#[derive(Default)]
struct Asked {
    reviews: std::sync::atomic::AtomicUsize,
    discoveries: std::sync::atomic::AtomicUsize,
    key_reads: std::sync::atomic::AtomicUsize,
}

/// A stand-in API server: issuer discovery and the key set (or 503 for both when
/// `published` is false), and TokenReviews that authenticate exactly the tokens the
/// cluster key signed (as a real API server would); every request counted.
async fn stand_in_cluster(
    pool: &PgPool,
    published: bool,
) -> (std::sync::Arc<TestApi>, std::sync::Arc<Asked>) {
    use std::sync::atomic::Ordering::SeqCst;
    let (service, handle) = tower_test::mock::pair::<
        http::Request<kube::client::Body>,
        http::Response<kube::client::Body>,
    >();
    let asked = std::sync::Arc::new(Asked::default());
    let seen = asked.clone();
    tokio::spawn(async move {
        let mut handle = Box::pin(handle);
        let json_response = |status: u16, body: Vec<u8>| {
            http::Response::builder()
                .status(status)
                .header("content-type", "application/json")
                .body(kube::client::Body::from(body))
                .unwrap()
        };
        while let Some((request, send)) = handle.as_mut().next_request().await {
            let path = request.uri().path().to_string();
            let unavailable = || {
                json_response(
                    503,
                    serde_json::to_vec(&json!({"kind": "Status", "apiVersion": "v1",
                        "status": "Failure", "message": "unavailable", "code": 503}))
                    .unwrap(),
                )
            };
            match path.as_str() {
                "/.well-known/openid-configuration" => {
                    seen.discoveries.fetch_add(1, SeqCst);
                    send.send_response(if published {
                        json_response(
                            200,
                            serde_json::to_vec(&json!({
                                "issuer": ISSUER,
                                "jwks_uri": format!("{ISSUER}:6443/openid/v1/jwks"),
                                "response_types_supported": ["id_token"],
                                "subject_types_supported": ["public"],
                                "id_token_signing_alg_values_supported": ["RS256"],
                            }))
                            .unwrap(),
                        )
                    } else {
                        unavailable()
                    });
                }
                "/openid/v1/jwks" => {
                    seen.key_reads.fetch_add(1, SeqCst);
                    // as kube-apiserver does: the set is application/jwk-set+json, and a
                    // request that does not accept it is 406
                    let accepts = request
                        .headers()
                        .get(http::header::ACCEPT)
                        .and_then(|v| v.to_str().ok())
                        .is_none_or(|v| {
                            v.contains("application/jwk-set+json") || v.contains("*/*")
                        });
                    send.send_response(if !accepts {
                        json_response(406, b"{}".to_vec())
                    } else if published {
                        json_response(200, JWKS.as_bytes().to_vec())
                    } else {
                        unavailable()
                    });
                }
                "/apis/authentication.k8s.io/v1/tokenreviews" => {
                    seen.reviews.fetch_add(1, SeqCst);
                    let mut body: Value =
                        serde_json::from_slice(&request.into_body().collect_bytes().await.unwrap())
                            .unwrap();
                    let token = body["spec"]["token"].as_str().unwrap().to_string();
                    let mut validation =
                        jsonwebtoken::Validation::new(jsonwebtoken::Algorithm::RS256);
                    validation.set_audience(&["hookd"]);
                    let jwks: jsonwebtoken::jwk::JwkSet = serde_json::from_str(JWKS).unwrap();
                    let genuine = jsonwebtoken::decode::<Value>(
                        &token,
                        &jsonwebtoken::DecodingKey::from_jwk(&jwks.keys[0]).unwrap(),
                        &validation,
                    )
                    .is_ok();
                    body["status"] = if genuine {
                        json!({"authenticated": true, "audiences": ["hookd"],
                               "user": {"username": "system:serviceaccount:team-a:producer"}})
                    } else {
                        json!({"authenticated": false, "error": "invalid bearer token"})
                    };
                    send.send_response(json_response(201, serde_json::to_vec(&body).unwrap()));
                }
                _ => send.send_response(not_found()),
            }
        }
    });
    let client = kube::Client::new(service, "default");
    let api = TestApi::start_with_kube(pool, api_settings(), Some(client)).await;
    (std::sync::Arc::new(api), asked)
}

/// Forged tokens (another key under the cluster's key id, a key id the cluster does not
/// publish, no key id, `alg: none`, HS256 keyed with the cluster's public key) are 401
/// without a TokenReview; a genuine one is reviewed (once) and accepted. Made-up key ids
/// cost at most one extra read of the keys per 30 s.
#[sqlx::test]
async fn forged_serviceaccount_tokens_never_reach_a_tokenreview(pool: PgPool) {
    use std::sync::atomic::Ordering::SeqCst;
    endpoint(&pool, EndpointOpts::default()).await;
    let (api, asked) = stand_in_cluster(&pool, true).await;
    let rs256 = jsonwebtoken::Algorithm::RS256;
    let public_n = serde_json::from_str::<Value>(JWKS).unwrap()["keys"][0]["n"]
        .as_str()
        .unwrap()
        .to_string();
    let alg_none = {
        let genuine = signed_jwt(rs256, Some(CLUSTER_KID), &cluster_key());
        let mut parts = genuine.split('.');
        let (_, claims) = (parts.next(), parts.next().unwrap());
        format!(
            "{}.{claims}.",
            URL_SAFE_NO_PAD.encode(format!(r#"{{"alg":"none","kid":"{CLUSTER_KID}"}}"#))
        )
    };
    let mut forged = vec![
        (
            "another key under the cluster's key id".to_string(),
            signed_jwt(rs256, Some(CLUSTER_KID), &forger_key()),
        ),
        (
            "a key id the cluster does not publish".to_string(),
            signed_jwt(rs256, Some("forged-kid"), &forger_key()),
        ),
        (
            "no key id".to_string(),
            signed_jwt(rs256, None, &cluster_key()),
        ),
        ("alg none".to_string(), alg_none),
    ];
    for (what, secret) in [
        ("the JWK's n", public_n.as_bytes().to_vec()),
        ("the JWK set", JWKS.as_bytes().to_vec()),
    ] {
        forged.push((
            format!("HS256 keyed with {what}"),
            signed_jwt(
                jsonwebtoken::Algorithm::HS256,
                Some(CLUSTER_KID),
                &jsonwebtoken::EncodingKey::from_secret(&secret),
            ),
        ));
    }
    for (what, token) in &forged {
        for _ in 0..3 {
            let (s, _, v) = post_message(&api, token, None).await;
            assert_eq!(s, StatusCode::UNAUTHORIZED, "{what}: {v}");
        }
    }
    assert_eq!(
        asked.reviews.load(SeqCst),
        0,
        "a forged token reached a TokenReview"
    );
    assert!(
        asked.key_reads.load(SeqCst) <= 2,
        "{} key reads",
        asked.key_reads.load(SeqCst)
    );

    // the genuine article: verified here, then reviewed, once (then cached)
    let genuine = signed_jwt(rs256, Some(CLUSTER_KID), &cluster_key());
    for _ in 0..3 {
        let (s, _, v) = post_message(&api, &genuine, None).await;
        assert_eq!(s, StatusCode::CREATED, "{v}");
    }
    assert_eq!(asked.reviews.load(SeqCst), 1);
}

/// The issue's flood, repeated: hundreds of forged tokens at once do not make fresh,
/// genuine ServiceAccount tokens 503 (they spend none of the review budget); and with the
/// keys unpublished (discovery unavailable), tokens of the issuer and key id a review
/// confirmed keep the reserved share against a flood of made-up ones.
#[sqlx::test]
async fn a_flood_of_forged_tokens_does_not_starve_real_serviceaccounts(pool: PgPool) {
    use std::sync::atomic::Ordering::SeqCst;
    endpoint(&pool, EndpointOpts::default()).await;
    let rs256 = jsonwebtoken::Algorithm::RS256;
    for published in [true, false] {
        let (api, asked) = stand_in_cluster(&pool, published).await;
        // without published keys, a first genuine token confirms the issuer and key id
        let first = signed_jwt(rs256, Some(CLUSTER_KID), &cluster_key());
        let (s, _, v) = post_message(&api, &first, None).await;
        assert_eq!(s, StatusCode::CREATED, "published={published}: {v}");

        let mut flood = Vec::new();
        for i in 0..300 {
            let api = api.clone();
            // forged: another key under the cluster's key id or a made-up one; with no keys
            // published a token naming the confirmed issuer and key id cannot be told from
            // a genuine one, so that flood uses made-up key ids only (see the docs)
            let kid = if published && i % 2 == 0 {
                CLUSTER_KID.to_string()
            } else {
                format!("made-up-{i}")
            };
            let token = signed_jwt(rs256, Some(&kid), &forger_key());
            flood.push(tokio::spawn(async move {
                post_message(&api, &token, None).await.0
            }));
        }
        // fresh genuine tokens while the flood runs: fewer than the reserved share's burst
        let mut genuine = Vec::new();
        for _ in 0..10 {
            let api = api.clone();
            let token = signed_jwt(rs256, Some(CLUSTER_KID), &cluster_key());
            genuine.push(tokio::spawn(async move {
                post_message(&api, &token, None).await
            }));
        }
        for g in genuine {
            let (s, _, v) = g.await.unwrap();
            assert_eq!(
                s,
                StatusCode::CREATED,
                "published={published}: a genuine token got {v}"
            );
        }
        let mut outcomes = std::collections::BTreeMap::new();
        for f in flood {
            *outcomes.entry(f.await.unwrap().as_u16()).or_insert(0) += 1;
        }
        if published {
            assert_eq!(outcomes, [(401, 300)].into(), "every forged token is 401");
            assert_eq!(
                asked.reviews.load(SeqCst),
                11,
                "only the genuine tokens were reviewed"
            );
        } else {
            // unverifiable: reviewed within the small unmatched share, the rest 503
            assert!(
                outcomes.keys().all(|s| *s == 401 || *s == 503),
                "{outcomes:?}"
            );
            assert!(outcomes.contains_key(&503), "{outcomes:?}");
        }
    }
}
