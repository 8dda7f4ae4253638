//! Webhooks for a tenant's customers (issue 15): consumers, the endpoints API, consumer
//! tokens and listings, through the real API router, real Postgres, a real dispatcher and
//! a receiver that verifies every signature.

use crate::common;

use std::time::Duration;

use axum::http::StatusCode;
use common::*;
use reqwest::Method;
use serde_json::{Value, json};
use sqlx::PgPool;
use uuid::Uuid;

const TENANT: &str = DEFAULT_TENANT;

/// Signing secrets for endpoints made through the API, which refuses the published
/// test-vector secrets (issue 29).
const API_SECRET_A: &str = "whsec_RzJH00HTPAJeFtgT0NteobsaX6JniEw0YX6Ro3Uz0HA=";
const API_SECRET_B: &str = "whsec_qBYHruxdag2GhR0jGFD0P6luw59//9IvimdT3qYlPiQ=";

async fn create_endpoint(api: &TestApi, token: &str, body: Value) -> Value {
    let (s, v) = call(api, token, Method::POST, "/v1/endpoints", Some(body)).await;
    assert_eq!(s, StatusCode::CREATED, "{v}");
    v
}

fn id(v: &Value) -> Uuid {
    v["id"].as_str().unwrap().parse().unwrap()
}

async fn enqueue(api: &TestApi, token: &str, body: Value) -> (StatusCode, Value) {
    call(api, token, Method::POST, "/v1/messages", Some(body)).await
}

async fn delivery_endpoints(pool: &PgPool, event: &str) -> Vec<Uuid> {
    sqlx::query_scalar(
        "SELECT endpoint_id FROM hookd.deliveries WHERE event_id = $1::uuid ORDER BY endpoint_id",
    )
    .bind(event)
    .fetch_all(pool)
    .await
    .unwrap()
}

#[sqlx::test]
async fn one_producer_token_reaches_only_the_addressed_consumer(pool: PgPool) {
    let api = TestApi::start(&pool).await;
    let token = api.token_for(TENANT).await;
    let rx = Receiver::start(&[API_SECRET_A]).await;
    let c42 = create_endpoint(
        &api,
        &token,
        json!({"url": rx.url("/c42"), "consumer": "cust_42", "eventTypes": ["order.*"], "secret": API_SECRET_A}),
    )
    .await;
    assert_eq!(c42["consumer"], "cust_42");
    assert_eq!(c42["managedBy"], "api");
    assert_eq!(c42["secret"], API_SECRET_A);
    let c7 = create_endpoint(
        &api,
        &token,
        json!({"url": rx.url("/c7"), "consumer": "cust_7", "secret": API_SECRET_A}),
    )
    .await;
    let wide = create_endpoint(
        &api,
        &token,
        json!({"url": rx.url("/wide"), "eventTypes": ["order.paid"], "secret": API_SECRET_A}),
    )
    .await;

    // for cust_42: its endpoint only, not cust_7's, not the tenant-wide one
    let (s, v) = enqueue(
        &api,
        &token,
        json!({"eventType": "order.paid", "consumer": "cust_42", "payload": {"order": 1}}),
    )
    .await;
    assert_eq!(s, StatusCode::CREATED, "{v}");
    assert_eq!(
        delivery_endpoints(&pool, v["eventId"].as_str().unwrap()).await,
        vec![id(&c42)]
    );
    // without a consumer: the tenant-wide endpoint only
    let (_, v2) = enqueue(
        &api,
        &token,
        json!({"eventType": "order.paid", "payload": {"order": 2}}),
    )
    .await;
    assert_eq!(
        delivery_endpoints(&pool, v2["eventId"].as_str().unwrap()).await,
        vec![id(&wide)]
    );
    // an unknown consumer reaches nobody, and says so with an empty list
    let (s, v3) = enqueue(
        &api,
        &token,
        json!({"eventType": "order.paid", "consumer": "nobody", "payload": {}}),
    )
    .await;
    assert_eq!(s, StatusCode::CREATED);
    assert_eq!(v3["deliveryIds"], json!([]));
    // cust_42's filter still applies
    let (_, v4) = enqueue(
        &api,
        &token,
        json!({"eventType": "invoice.paid", "consumer": "cust_42", "payload": {}}),
    )
    .await;
    assert_eq!(v4["deliveryIds"], json!([]));
    // the batch route takes a consumer per message
    let (s, b) = call(
        &api,
        &token,
        Method::POST,
        "/v1/messages/batch",
        Some(json!({"messages": [
            {"eventType": "order.paid", "consumer": "cust_7", "payload": {"order": 3}},
            {"eventType": "order.paid", "consumer": "cust_42", "payload": {"order": 4}}
        ]})),
    )
    .await;
    assert_eq!(s, StatusCode::CREATED, "{b}");
    assert_eq!(
        delivery_endpoints(&pool, b["results"][0]["eventId"].as_str().unwrap()).await,
        vec![id(&c7)]
    );

    // and the receiver sees exactly that, signed with the endpoint's secret
    let d = TestDispatcher::start(&pool, dispatch_settings()).await;
    assert!(wait_until(Duration::from_secs(20), || async { rx.count() == 4 }).await);
    let mut got: Vec<(String, String)> = rx
        .all()
        .iter()
        .map(|r| {
            assert_eq!(r.verified_by, vec![true]);
            let p: Value = serde_json::from_slice(&r.body).unwrap();
            (
                p["order"].to_string(),
                r.event_type.clone().unwrap_or_default(),
            )
        })
        .collect();
    got.sort();
    assert_eq!(got.len(), 4);
    d.stop().await;
    let paths: std::collections::BTreeSet<_> = sqlx::query_scalar::<_, String>(
        "SELECT e.url FROM hookd.deliveries d JOIN hookd.endpoints e ON e.id = d.endpoint_id WHERE d.status = 'succeeded'",
    )
    .fetch_all(&pool)
    .await
    .unwrap()
    .into_iter()
    .map(|u| u.rsplit('/').next().unwrap().to_string())
    .collect();
    assert_eq!(paths, ["c42", "c7", "wide"].map(String::from).into());
}

#[sqlx::test]
async fn a_consumer_token_sees_and_manages_only_its_consumer(pool: PgPool) {
    let api = TestApi::start(&pool).await;
    let tenant_token = api.token_for(TENANT).await;
    let rx = Receiver::start(&[API_SECRET_A]).await;
    let mine = create_endpoint(
        &api,
        &tenant_token,
        json!({"url": rx.url("/42"), "consumer": "cust_42", "secret": API_SECRET_A}),
    )
    .await;
    let theirs = create_endpoint(
        &api,
        &tenant_token,
        json!({"url": rx.url("/7"), "consumer": "cust_7", "secret": API_SECRET_A}),
    )
    .await;
    let (_, m7) = enqueue(
        &api,
        &tenant_token,
        json!({"eventType": "a.b", "consumer": "cust_7", "payload": {}}),
    )
    .await;
    let (_, m42) = enqueue(
        &api,
        &tenant_token,
        json!({"eventType": "a.b", "consumer": "cust_42", "payload": {}}),
    )
    .await;

    let (s, t) = call(
        &api,
        &tenant_token,
        Method::POST,
        "/v1/consumers/cust_42/tokens",
        Some(json!({"ttlSeconds": 600})),
    )
    .await;
    assert_eq!(s, StatusCode::CREATED, "{t}");
    let ct = t["token"].as_str().unwrap().to_string();
    assert!(t["expiresAt"].is_string());

    let (s, who) = call(&api, &ct, Method::GET, "/v1/whoami", None).await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(who["consumer"], "cust_42");

    // lists: its own only
    let (s, list) = call(&api, &ct, Method::GET, "/v1/endpoints", None).await;
    assert_eq!(s, StatusCode::OK, "{list}");
    let ids: Vec<Uuid> = list["items"].as_array().unwrap().iter().map(id).collect();
    assert_eq!(ids, vec![id(&mine)]);
    let (_, msgs) = call(&api, &ct, Method::GET, "/v1/messages", None).await;
    assert_eq!(msgs["items"].as_array().unwrap().len(), 1, "{msgs}");
    assert_eq!(msgs["items"][0]["id"], m42["eventId"]);
    // a filter naming another consumer finds nothing rather than widening
    let (_, msgs) = call(&api, &ct, Method::GET, "/v1/messages?consumer=cust_7", None).await;
    assert_eq!(msgs["items"], json!([]));

    // everything of cust_7 is as absent as an unknown id
    let t7 = theirs["id"].as_str().unwrap();
    let e7 = m7["eventId"].as_str().unwrap();
    let d7 = m7["deliveryIds"][0].as_str().unwrap();
    for (method, path) in [
        (Method::GET, format!("/v1/endpoints/{t7}")),
        (Method::GET, format!("/v1/endpoints/{t7}/stats")),
        (Method::GET, format!("/v1/endpoints/{t7}/deliveries")),
        (Method::PATCH, format!("/v1/endpoints/{t7}")),
        (Method::DELETE, format!("/v1/endpoints/{t7}")),
        (Method::POST, format!("/v1/endpoints/{t7}/secret/rotate")),
        (Method::POST, format!("/v1/endpoints/{t7}/pause")),
        (Method::POST, format!("/v1/endpoints/{t7}/test")),
        (Method::POST, format!("/v1/endpoints/{t7}/replay")),
        (Method::GET, format!("/v1/messages/{e7}")),
        (Method::GET, format!("/v1/deliveries/{d7}")),
        (Method::POST, format!("/v1/deliveries/{d7}/replay")),
        (Method::GET, "/v1/consumers/cust_7".to_string()),
    ] {
        let body = (method == Method::PATCH).then(|| json!({"description": "x"}));
        let (s, v) = call(&api, &ct, method.clone(), &path, body).await;
        assert_eq!(s, StatusCode::NOT_FOUND, "{method} {path}: {v}");
    }
    // tenant-wide routes are never a consumer's
    for (method, path) in [
        (Method::GET, "/v1/consumers"),
        (Method::PUT, "/v1/consumers/cust_42"),
        (Method::DELETE, "/v1/consumers/cust_42"),
        (Method::POST, "/v1/consumers/cust_42/tokens"),
        (Method::POST, "/v1/consumers/cust_42/portal"),
    ] {
        let (s, v) = call(&api, &ct, method.clone(), path, None).await;
        assert_eq!(s, StatusCode::FORBIDDEN, "{method} {path}: {v}");
    }
    // it cannot produce, nor create for another consumer
    let (s, _) = enqueue(&api, &ct, json!({"eventType": "a", "payload": {}})).await;
    assert_eq!(s, StatusCode::FORBIDDEN);
    let (s, v) = call(
        &api,
        &ct,
        Method::POST,
        "/v1/endpoints",
        Some(json!({"url": rx.url("/x"), "consumer": "cust_7"})),
    )
    .await;
    assert_eq!(s, StatusCode::FORBIDDEN, "{v}");
    assert_eq!(v["error"]["code"], "consumer_mismatch");

    // its own: add (consumer implied), rotate, test, read deliveries, delete
    let (s, added) = call(
        &api,
        &ct,
        Method::POST,
        "/v1/endpoints",
        Some(json!({"url": rx.url("/42b"), "eventTypes": ["a.*"]})),
    )
    .await;
    assert_eq!(s, StatusCode::CREATED, "{added}");
    assert_eq!(added["consumer"], "cust_42");
    assert!(added["secret"].as_str().unwrap().starts_with("whsec_"));
    let added_id = added["id"].as_str().unwrap();
    let (s, got) = call(
        &api,
        &ct,
        Method::GET,
        &format!("/v1/endpoints/{added_id}"),
        None,
    )
    .await;
    assert_eq!(s, StatusCode::OK);
    assert!(
        got.get("secret").is_none(),
        "the secret is shown once: {got}"
    );
    let (s, r) = call(
        &api,
        &ct,
        Method::POST,
        &format!("/v1/endpoints/{added_id}/secret/rotate"),
        None,
    )
    .await;
    assert_eq!(s, StatusCode::CREATED, "{r}");
    assert_ne!(r["secret"], added["secret"]);
    let (s, test) = call(
        &api,
        &ct,
        Method::POST,
        &format!("/v1/endpoints/{}/test", mine["id"].as_str().unwrap()),
        None,
    )
    .await;
    assert_eq!(s, StatusCode::CREATED, "{test}");
    let (s, dl) = call(
        &api,
        &ct,
        Method::GET,
        &format!("/v1/endpoints/{}/deliveries", mine["id"].as_str().unwrap()),
        None,
    )
    .await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(dl["items"].as_array().unwrap().len(), 2, "{dl}");
    let (s, _) = call(
        &api,
        &ct,
        Method::DELETE,
        &format!("/v1/endpoints/{added_id}"),
        None,
    )
    .await;
    assert_eq!(s, StatusCode::NO_CONTENT);
    let (s, _) = call(
        &api,
        &ct,
        Method::GET,
        &format!("/v1/endpoints/{added_id}"),
        None,
    )
    .await;
    assert_eq!(s, StatusCode::NOT_FOUND);
}

#[sqlx::test]
async fn endpoint_fields_are_checked_and_kubernetes_endpoints_are_read_only(pool: PgPool) {
    let api = TestApi::start(&pool).await;
    let token = api.token_for(TENANT).await;
    let bad = |body: Value, code: &'static str, mentions: &'static str| {
        let api = &api;
        let token = token.clone();
        async move {
            let (s, v) = call(api, &token, Method::POST, "/v1/endpoints", Some(body)).await;
            assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY, "{v}");
            assert_eq!(v["error"]["code"], code, "{v}");
            let msg = v["error"]["message"].as_str().unwrap();
            assert!(msg.contains(mentions), "{msg} should mention {mentions}");
            msg.to_string()
        }
    };
    bad(
        json!({"url": "http://10.0.0.7/hook"}),
        "invalid_field",
        "not allowed",
    )
    .await;
    bad(
        json!({"url": "http://169.254.169.254/latest"}),
        "invalid_field",
        "not allowed",
    )
    .await;
    bad(
        json!({"url": "ftp://example.com/"}),
        "invalid_field",
        "http:// or https://",
    )
    .await;
    bad(
        json!({"url": "https://example.com/", "eventTypes": ["a..b"]}),
        "invalid_field",
        "eventTypes",
    )
    .await;
    bad(
        json!({"url": "https://example.com/", "headers": {"webhook-id": "x"}}),
        "invalid_field",
        "headers",
    )
    .await;
    bad(
        json!({"url": "https://example.com/", "consumer": "bad uid"}),
        "invalid_field",
        "consumer",
    )
    .await;
    bad(
        json!({"url": "https://example.com/", "evenTypes": []}),
        "invalid_field",
        "evenTypes",
    )
    .await;
    let msg = bad(
        json!({"url": "https://example.com/", "secret": "whsec_tooshort"}),
        "invalid_field",
        "secret",
    )
    .await;
    assert!(!msg.contains("tooshort"), "never echo a secret: {msg}");
    // Postgres text and jsonb cannot hold U+0000: refused, not a 500 (schemathesis found it)
    bad(
        json!({"url": "https://example.com/", "description": "a\u{0}b"}),
        "invalid_field",
        "NUL",
    )
    .await;
    let (s, v) = call(
        &api,
        &token,
        Method::PUT,
        "/v1/consumers/c0",
        Some(json!({"metadata": {"k": {"a\u{0}": 1}}})),
    )
    .await;
    assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY, "{v}");
    let (s, _) = call(&api, &token, Method::POST, "/v1/endpoints", None).await;
    assert_eq!(s, StatusCode::UNSUPPORTED_MEDIA_TYPE);

    // paging by keyset
    for i in 0..3 {
        create_endpoint(
            &api,
            &token,
            json!({"url": format!("https://example.com/{i}")}),
        )
        .await;
    }
    let (_, p1) = call(&api, &token, Method::GET, "/v1/endpoints?limit=2", None).await;
    assert_eq!(p1["items"].as_array().unwrap().len(), 2);
    let cursor = p1["nextCursor"].as_str().unwrap();
    let (_, p2) = call(
        &api,
        &token,
        Method::GET,
        &format!("/v1/endpoints?limit=2&cursor={cursor}"),
        None,
    )
    .await;
    assert_eq!(p2["items"].as_array().unwrap().len(), 1, "{p2}");
    assert!(p2["nextCursor"].is_null());

    // PATCH: new URL, filter, description cleared with null
    let ep = id(&p1["items"][0]);
    let (s, v) = call(
        &api,
        &token,
        Method::PATCH,
        &format!("/v1/endpoints/{ep}"),
        Some(json!({"url": "https://example.org/new", "eventTypes": ["x.*"], "description": null, "paused": true})),
    )
    .await;
    assert_eq!(s, StatusCode::OK, "{v}");
    assert_eq!(v["url"], "https://example.org/new");
    assert_eq!(v["state"], "paused");
    let (s, v) = call(
        &api,
        &token,
        Method::POST,
        &format!("/v1/endpoints/{ep}/resume"),
        None,
    )
    .await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(v["state"], "active");

    // a WebhookEndpoint's endpoint is listed, read-only
    let k8s = endpoint(
        &pool,
        EndpointOpts {
            namespace: TENANT.into(),
            url: "https://example.com/k8s".into(),
            ..Default::default()
        },
    )
    .await;
    let (s, v) = call(
        &api,
        &token,
        Method::GET,
        &format!("/v1/endpoints/{k8s}"),
        None,
    )
    .await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(v["managedBy"], "kubernetes");
    assert_eq!(v["kubernetes"]["namespace"], TENANT);
    for (method, path) in [
        (Method::PATCH, format!("/v1/endpoints/{k8s}")),
        (Method::DELETE, format!("/v1/endpoints/{k8s}")),
        (Method::POST, format!("/v1/endpoints/{k8s}/pause")),
        (Method::POST, format!("/v1/endpoints/{k8s}/secret/rotate")),
    ] {
        let body = (method == Method::PATCH).then(|| json!({"description": "x"}));
        let (s, v) = call(&api, &token, method.clone(), &path, body).await;
        assert_eq!(s, StatusCode::CONFLICT, "{method} {path}: {v}");
        assert_eq!(v["error"]["code"], "managed_by_kubernetes");
    }
    // another tenant sees none of it
    let other = api.token_for("team-b").await;
    let (s, _) = call(
        &api,
        &other,
        Method::GET,
        &format!("/v1/endpoints/{ep}"),
        None,
    )
    .await;
    assert_eq!(s, StatusCode::NOT_FOUND);
    let (_, l) = call(&api, &other, Method::GET, "/v1/endpoints", None).await;
    assert_eq!(l["items"], json!([]));
}

#[sqlx::test]
async fn deleting_a_consumer_disables_its_endpoints_and_cancels_visibly(pool: PgPool) {
    let api = TestApi::start(&pool).await;
    let token = api.token_for(TENANT).await;
    let (s, c) = call(
        &api,
        &token,
        Method::PUT,
        "/v1/consumers/cust_9",
        Some(json!({"name": "Customer 9", "metadata": {"plan": "pro"}})),
    )
    .await;
    assert_eq!(s, StatusCode::CREATED, "{c}");
    let (s, c) = call(
        &api,
        &token,
        Method::PUT,
        "/v1/consumers/cust_9",
        Some(json!({"name": "Customer Nine"})),
    )
    .await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(c["name"], "Customer Nine");
    let ep = create_endpoint(
        &api,
        &token,
        json!({"url": "https://example.com/9", "consumer": "cust_9"}),
    )
    .await;
    let (_, m) = enqueue(
        &api,
        &token,
        json!({"eventType": "a", "consumer": "cust_9", "payload": {}}),
    )
    .await;
    let d: Uuid = m["deliveryIds"][0].as_str().unwrap().parse().unwrap();
    let (_, t) = call(
        &api,
        &token,
        Method::POST,
        "/v1/consumers/cust_9/tokens",
        None,
    )
    .await;
    let ct = t["token"].as_str().unwrap().to_string();
    let (_, got) = call(&api, &token, Method::GET, "/v1/consumers/cust_9", None).await;
    assert_eq!(got["endpointCount"], 1);

    let (s, _) = call(&api, &token, Method::DELETE, "/v1/consumers/cust_9", None).await;
    assert_eq!(s, StatusCode::NO_CONTENT);
    let (_, e) = call(
        &api,
        &token,
        Method::GET,
        &format!("/v1/endpoints/{}", id(&ep)),
        None,
    )
    .await;
    assert_eq!(e["state"], "disabled");
    assert!(
        e["disabledReason"].as_str().unwrap().contains("cust_9"),
        "{e}"
    );
    let (_, dv) = call(
        &api,
        &token,
        Method::GET,
        &format!("/v1/deliveries/{d}"),
        None,
    )
    .await;
    assert_eq!(dv["status"], "cancelled");
    assert!(
        dv["lastError"]
            .as_str()
            .unwrap()
            .contains("consumer cust_9 deleted")
    );
    let (s, _) = call(&api, &token, Method::GET, "/v1/consumers/cust_9", None).await;
    assert_eq!(s, StatusCode::NOT_FOUND);
    // its token stops working (once the API's 5 s token cache lets go)
    assert!(
        wait_until(Duration::from_secs(10), || async {
            call(&api, &ct, Method::GET, "/v1/endpoints", None).await.0 == StatusCode::UNAUTHORIZED
        })
        .await
    );
    // new events for it reach nothing
    let (_, m) = enqueue(
        &api,
        &token,
        json!({"eventType": "a", "consumer": "cust_9", "payload": {}}),
    )
    .await;
    assert_eq!(m["deliveryIds"], json!([]));
}

#[sqlx::test]
async fn listings_filter_and_page_within_the_credential(pool: PgPool) {
    let api = TestApi::start(&pool).await;
    let token = api.token_for(TENANT).await;
    create_endpoint(
        &api,
        &token,
        json!({"url": "https://example.com/a", "consumer": "c1"}),
    )
    .await;
    let mut ids = Vec::new();
    for (i, (ty, consumer)) in [("a.x", "c1"), ("a.y", "c1"), ("a.x", "c2"), ("a.x", "c1")]
        .into_iter()
        .enumerate()
    {
        let (_, v) = enqueue(
            &api,
            &token,
            json!({"eventType": ty, "consumer": consumer, "payload": {"i": i}}),
        )
        .await;
        ids.push(v["eventId"].as_str().unwrap().to_string());
    }
    let list = |q: &'static str| {
        let api = &api;
        let token = token.clone();
        async move {
            let (s, v) = call(api, &token, Method::GET, &format!("/v1/messages{q}"), None).await;
            assert_eq!(s, StatusCode::OK, "{v}");
            v
        }
    };
    let all = list("").await;
    let got: Vec<&str> = all["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["id"].as_str().unwrap())
        .collect();
    let newest_first: Vec<&str> = ids.iter().rev().map(String::as_str).collect();
    assert_eq!(got, newest_first);
    let c1x = list("?consumer=c1&eventType=a.x").await;
    assert_eq!(c1x["items"].as_array().unwrap().len(), 2);
    assert_eq!(c1x["items"][0]["deliveries"]["total"], 1);
    let pending = list("?status=pending").await;
    assert_eq!(
        pending["items"].as_array().unwrap().len(),
        3,
        "c2 has no endpoint"
    );
    let future = list("?since=2999-01-01T00:00:00Z").await;
    assert_eq!(future["items"], json!([]));
    let p1 = list("?limit=3").await;
    let cursor = p1["nextCursor"].as_str().unwrap().to_string();
    let (_, p2) = call(
        &api,
        &token,
        Method::GET,
        &format!("/v1/messages?limit=3&cursor={cursor}"),
        None,
    )
    .await;
    assert_eq!(p2["items"][0]["id"].as_str().unwrap(), ids[0]);
    let (s, v) = call(&api, &token, Method::GET, "/v1/messages?status=lost", None).await;
    assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY, "{v}");
    let (s, _) = call(&api, &token, Method::GET, "/v1/messages?cursor=nope", None).await;
    assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY);
    // another tenant lists nothing of this one
    let other = api.token_for("team-b").await;
    let (_, v) = call(&api, &other, Method::GET, "/v1/messages", None).await;
    assert_eq!(v["items"], json!([]));
}

/// Each listing page is an index range scan, whatever the table holds.
#[sqlx::test]
async fn listing_plans_are_index_range_scans(pool: PgPool) {
    sqlx::query(
        "INSERT INTO hookd.events (id, tenant, event_type, payload, request_hash, consumer)
         SELECT hookd.uuid_v7(), 't' || (i % 50), 'e.' || (i % 7), '{}', '\\x00', 'c' || (i % 1000)
         FROM generate_series(1, 50000) i",
    )
    .execute(&pool)
    .await
    .unwrap();
    sqlx::query("ANALYZE hookd.events")
        .execute(&pool)
        .await
        .unwrap();
    for (consumer, ty) in [(None, None), (Some("c7"), None), (None, Some("e.3"))] {
        let plan: Vec<String> = sqlx::query_scalar(
            "EXPLAIN SELECT id FROM hookd.events ev
             WHERE ev.tenant = 't7' AND ($1::text IS NULL OR ev.consumer = $1)
               AND ($2::text IS NULL OR ev.event_type = $2)
             ORDER BY ev.id DESC LIMIT 100",
        )
        .bind(consumer)
        .bind(ty)
        .fetch_all(&pool)
        .await
        .unwrap();
        let text = plan.join("\n");
        assert!(text.contains("Index"), "{text}");
        assert!(!text.contains("Seq Scan"), "{text}");
    }
}

#[sqlx::test]
async fn sql_enqueue_takes_a_consumer_and_keeps_the_four_argument_form(pool: PgPool) {
    let api = TestApi::start(&pool).await;
    let token = api.token_for(TENANT).await;
    let c = create_endpoint(
        &api,
        &token,
        json!({"url": "https://example.com/c", "consumer": "c1"}),
    )
    .await;
    let w = create_endpoint(&api, &token, json!({"url": "https://example.com/w"})).await;
    let e5: Uuid = sqlx::query_scalar("SELECT hookd.enqueue($1, 'a.b', '{}', NULL, 'c1')")
        .bind(TENANT)
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(
        delivery_endpoints(&pool, &e5.to_string()).await,
        vec![id(&c)]
    );
    let e4: Uuid = sqlx::query_scalar("SELECT hookd.enqueue($1, 'a.b', '{}')")
        .bind(TENANT)
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(
        delivery_endpoints(&pool, &e4.to_string()).await,
        vec![id(&w)]
    );
    // a key reused for another consumer is different content
    sqlx::query("SELECT hookd.enqueue($1, 'a.b', '{}', 'k1', 'c1')")
        .bind(TENANT)
        .execute(&pool)
        .await
        .unwrap();
    let e = sqlx::query("SELECT hookd.enqueue($1, 'a.b', '{}', 'k1', 'c2')")
        .bind(TENANT)
        .execute(&pool)
        .await
        .unwrap_err();
    assert!(e.to_string().contains("different content"), "{e}");
    // and the API agrees with the SQL function on what a key stands for
    let (s, v) = enqueue(
        &api,
        &token,
        json!({"eventType": "a.b", "payload": {}, "consumer": "c1", "idempotencyKey": "k1"}),
    )
    .await;
    assert_eq!(s, StatusCode::OK, "{v}");
    let e = sqlx::query("SELECT hookd.enqueue($1, 'a.b', '{}', NULL, 'bad uid')")
        .bind(TENANT)
        .execute(&pool)
        .await
        .unwrap_err();
    assert!(e.to_string().contains("invalid consumer"), "{e}");
}

/// The subscription index (migration 0007) must pick exactly the endpoints
/// `hookd.event_type_matches` accepts.
#[sqlx::test]
async fn fan_out_by_index_agrees_with_the_pattern_function(pool: PgPool) {
    let patterns: &[&[&str]] = &[
        &[],
        &["*"],
        &["a"],
        &["a.*"],
        &["a.b"],
        &["a.b.*"],
        &["a.b.c", "x.*"],
        &["b.*", "a.b"],
    ];
    for (i, p) in patterns.iter().enumerate() {
        endpoint(
            &pool,
            EndpointOpts {
                name: format!("p{i}"),
                event_types: p.iter().map(|s| s.to_string()).collect(),
                ..Default::default()
            },
        )
        .await;
    }
    for ty in ["a", "a.b", "a.b.c", "a.b.c.d", "ab", "b", "x.y", "a.bc"] {
        let by_index: Vec<Uuid> = sqlx::query_scalar(
            "SELECT DISTINCT endpoint_id FROM hookd.subscriptions
             WHERE tenant = 'team-a' AND consumer = '' AND pattern = ANY (hookd.event_type_keys($1))
             ORDER BY 1",
        )
        .bind(ty)
        .fetch_all(&pool)
        .await
        .unwrap();
        let by_function: Vec<Uuid> = sqlx::query_scalar(
            "SELECT id FROM hookd.endpoints WHERE tenant = 'team-a'
               AND hookd.event_type_matches(event_types, $1) ORDER BY 1",
        )
        .bind(ty)
        .fetch_all(&pool)
        .await
        .unwrap();
        assert_eq!(by_index, by_function, "event type {ty}");
    }
}

#[sqlx::test]
async fn a_webhook_endpoint_object_can_name_a_consumer(pool: PgPool) {
    let api = TestApi::start(&pool).await;
    let token = api.token_for(TENANT).await;
    let ep = endpoint(
        &pool,
        EndpointOpts {
            name: "for-c1".into(),
            consumer: Some("c1".into()),
            ..Default::default()
        },
    )
    .await;
    let (_, v) = enqueue(
        &api,
        &token,
        json!({"eventType": "a", "consumer": "c1", "payload": {}}),
    )
    .await;
    assert_eq!(
        delivery_endpoints(&pool, v["eventId"].as_str().unwrap()).await,
        vec![ep]
    );
    let (_, v) = enqueue(&api, &token, json!({"eventType": "a", "payload": {}})).await;
    assert_eq!(v["deliveryIds"], json!([]));
    // the consumer exists now
    let (s, _) = call(&api, &token, Method::GET, "/v1/consumers/c1", None).await;
    assert_eq!(s, StatusCode::OK);
    // a declaration moved to another consumer gets a new row; the old one keeps its
    // deliveries, cancelled, and never sends to the new owner
    let moved = endpoint(
        &pool,
        EndpointOpts {
            name: "for-c1".into(),
            consumer: Some("c2".into()),
            ..Default::default()
        },
    )
    .await;
    assert_ne!(moved, ep);
    let (state, reason): (String, Option<String>) =
        sqlx::query_as("SELECT state, state_reason FROM hookd.endpoints WHERE id = $1")
            .bind(ep)
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(state, "disabled");
    // the old owner can read this row: it must not learn who the declaration names now
    // (issue 29)
    let reason = reason.unwrap();
    assert!(reason.contains("another owner"), "{reason}");
    assert!(!reason.contains("c2"), "{reason}");
    let owner_change = sqlx::query("UPDATE hookd.endpoints SET consumer = 'c3' WHERE id = $1")
        .bind(moved)
        .execute(&pool)
        .await
        .unwrap_err();
    assert!(
        owner_change.to_string().contains("cannot change"),
        "{owner_change}"
    );
}

#[sqlx::test]
async fn a_rotated_secret_signs_beside_the_old_one_and_tokens_need_the_manage_scope(pool: PgPool) {
    let api = TestApi::start(&pool).await;
    let token = api.token_for(TENANT).await;
    let rx = Receiver::start(&[API_SECRET_A, API_SECRET_B]).await;
    let ep = create_endpoint(
        &api,
        &token,
        json!({"url": rx.url("/r"), "secret": API_SECRET_A}),
    )
    .await;
    let (s, r) = call(
        &api,
        &token,
        Method::POST,
        &format!("/v1/endpoints/{}/secret/rotate", id(&ep)),
        Some(json!({"secret": API_SECRET_B, "graceSeconds": 3600})),
    )
    .await;
    assert_eq!(s, StatusCode::CREATED, "{r}");
    enqueue(&api, &token, json!({"eventType": "a", "payload": {}})).await;
    let d = TestDispatcher::start(&pool, dispatch_settings()).await;
    assert!(wait_until(Duration::from_secs(20), || async { rx.count() == 1 }).await);
    d.stop().await;
    assert_eq!(
        rx.all()[0].verified_by,
        vec![true, true],
        "signed with both"
    );

    let produce_only = mint_token(
        &pool,
        TENANT,
        &[hookd::auth::Scope::Produce, hookd::auth::Scope::Read],
    )
    .await;
    let (s, v) = call(
        &api,
        &produce_only,
        Method::POST,
        "/v1/endpoints",
        Some(json!({"url": "https://example.com/"})),
    )
    .await;
    assert_eq!(s, StatusCode::FORBIDDEN, "{v}");
    assert_eq!(v["error"]["code"], "insufficient_scope");
    let (s, _) = call(&api, &produce_only, Method::GET, "/v1/endpoints", None).await;
    assert_eq!(s, StatusCode::OK, "read may list");

    // stats of the endpoint
    let (s, st) = call(
        &api,
        &token,
        Method::GET,
        &format!("/v1/endpoints/{}/stats", id(&ep)),
        None,
    )
    .await;
    assert_eq!(s, StatusCode::OK, "{st}");
    assert_eq!(st["lastDay"]["succeeded"], 1);
    assert_eq!(st["hourly"].as_array().unwrap().len(), 24);
    assert_eq!(st["lastSuccess"]["statusCode"], 200);
    assert_eq!(st["circuit"]["state"], "closed");
}

// ---- found by a hostile review: races and hostile input ----

/// Deleting a consumer while endpoints are being created for it never leaves a live
/// endpoint of a consumer that no longer exists, nor a live token for it.
#[sqlx::test]
async fn deleting_a_consumer_while_it_is_being_used_leaves_nothing_live(pool: PgPool) {
    let api = TestApi::start(&pool).await;
    let token = api.token_for(TENANT).await;
    for i in 0..12 {
        let uid = format!("race_{i}");
        let (s, _) = call(
            &api,
            &token,
            Method::PUT,
            &format!("/v1/consumers/{uid}"),
            None,
        )
        .await;
        assert_eq!(s, StatusCode::CREATED);
        let mut tasks = Vec::new();
        for k in 0..3 {
            let (api_base, client, token, uid) = (
                api.base.clone(),
                api.client.clone(),
                token.clone(),
                uid.clone(),
            );
            tasks.push(tokio::spawn(async move {
                let r = if k == 2 {
                    client
                        .post(format!("{api_base}/v1/consumers/{uid}/tokens"))
                        .bearer_auth(&token)
                } else {
                    client
                        .post(format!("{api_base}/v1/endpoints"))
                        .bearer_auth(&token)
                        .json(&json!({"url": format!("https://example.com/{uid}/{k}"), "consumer": uid}))
                };
                r.send().await.unwrap().status()
            }));
        }
        let (s, _) = call(
            &api,
            &token,
            Method::DELETE,
            &format!("/v1/consumers/{uid}"),
            None,
        )
        .await;
        assert_eq!(s, StatusCode::NO_CONTENT);
        for t in tasks {
            t.await.unwrap();
        }
    }
    // a create that ran after the delete re-created the consumer (it asked for it); what
    // must never exist is something live for a consumer that does not
    let orphans: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM hookd.endpoints e
         WHERE e.consumer LIKE 'race\\_%' AND e.state <> 'disabled' AND e.removed_at IS NULL
           AND NOT EXISTS (SELECT 1 FROM hookd.consumers c WHERE c.tenant = e.tenant AND c.uid = e.consumer)",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(orphans, 0, "live endpoints of deleted consumers");
    let tokens: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM hookd.api_tokens t
         WHERE t.consumer LIKE 'race\\_%' AND t.revoked_at IS NULL
           AND NOT EXISTS (SELECT 1 FROM hookd.consumers c WHERE c.tenant = t.tenant AND c.uid = t.consumer)",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(tokens, 0, "live tokens of deleted consumers");
}

#[sqlx::test]
async fn a_deleted_consumers_endpoints_stay_off_and_late_deliveries_are_cancelled(pool: PgPool) {
    let api = TestApi::start(&pool).await;
    let token = api.token_for(TENANT).await;
    let ep = create_endpoint(
        &api,
        &token,
        json!({"url": "https://example.com/z", "consumer": "gone"}),
    )
    .await;
    let (s, _) = call(&api, &token, Method::DELETE, "/v1/consumers/gone", None).await;
    assert_eq!(s, StatusCode::NO_CONTENT);
    for path in ["enable", "resume"] {
        let (s, v) = call(
            &api,
            &token,
            Method::POST,
            &format!("/v1/endpoints/{}/{path}", id(&ep)),
            None,
        )
        .await;
        assert_eq!(s, StatusCode::CONFLICT, "{path}: {v}");
        assert_eq!(v["error"]["code"], "consumer_deleted");
    }
    let (s, _) = call(
        &api,
        &token,
        Method::PATCH,
        &format!("/v1/endpoints/{}", id(&ep)),
        Some(json!({"paused": false})),
    )
    .await;
    assert_eq!(s, StatusCode::CONFLICT);
    // an enqueue that read the endpoint as live just before the delete committed its
    // delivery after it: the straggler sweep cancels it
    let (_, m) = enqueue(&api, &token, json!({"eventType": "a", "payload": {}})).await;
    let event: Uuid = m["eventId"].as_str().unwrap().parse().unwrap();
    let late: Uuid = sqlx::query_scalar(
        "INSERT INTO hookd.deliveries (id, event_id, endpoint_id, tenant, consumer)
         VALUES (hookd.uuid_v7(), $1, $2, 'team-a', 'gone') RETURNING id",
    )
    .bind(event)
    .bind(id(&ep))
    .fetch_one(&pool)
    .await
    .unwrap();
    assert!(
        hookd::db::deliveries::cancel_stragglers(&pool)
            .await
            .unwrap()
            >= 1
    );
    assert_eq!(delivery_status(&pool, late).await.0, "cancelled");
    // a consumer created again with the uid is another customer (issue 29): the old
    // endpoint stays off for good
    call(&api, &token, Method::PUT, "/v1/consumers/gone", None).await;
    let (s, v) = call(
        &api,
        &token,
        Method::POST,
        &format!("/v1/endpoints/{}/enable", id(&ep)),
        None,
    )
    .await;
    assert_eq!(s, StatusCode::CONFLICT, "{v}");
    assert_eq!(v["error"]["code"], "consumer_deleted");
}

#[sqlx::test]
async fn minting_and_rotating_are_bounded(pool: PgPool) {
    let api = TestApi::start(&pool).await;
    let manage_only = mint_token(&pool, TENANT, &[hookd::auth::Scope::Manage]).await;
    let (s, t) = call(
        &api,
        &manage_only,
        Method::POST,
        "/v1/consumers/c1/tokens",
        None,
    )
    .await;
    assert_eq!(s, StatusCode::CREATED, "{t}");
    let (_, who) = call(
        &api,
        t["token"].as_str().unwrap(),
        Method::GET,
        "/v1/whoami",
        None,
    )
    .await;
    assert_eq!(
        who["scopes"],
        json!(["manage"]),
        "no scope the minter lacks"
    );

    let token = api.token_for(TENANT).await;
    let ep = create_endpoint(&api, &token, json!({"url": "https://example.com/r"})).await;
    let rotate = |api: &TestApi, token: String, ep: Uuid| {
        let (base, client) = (api.base.clone(), api.client.clone());
        tokio::spawn(async move {
            client
                .post(format!("{base}/v1/endpoints/{ep}/secret/rotate"))
                .bearer_auth(token)
                .send()
                .await
                .unwrap()
                .status()
        })
    };
    let tasks: Vec<_> = (0..12)
        .map(|_| rotate(&api, token.clone(), id(&ep)))
        .collect();
    for t in tasks {
        assert_eq!(t.await.unwrap(), reqwest::StatusCode::CREATED);
    }
    let (current, live): (i64, i64) = sqlx::query_as(
        "SELECT count(*) FILTER (WHERE not_after IS NULL),
                count(*) FILTER (WHERE not_after IS NULL OR not_after > now())
         FROM hookd.endpoint_secrets WHERE endpoint_id = $1",
    )
    .bind(id(&ep))
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(current, 1, "concurrent rotations leave one current secret");
    assert!(
        live <= hookd::db::secrets::MAX_SIGNING_SECRETS,
        "{live} secrets sign"
    );

    // PATCH null and other hostile input
    for body in [
        json!({"url": null}),
        json!({"eventTypes": null}),
        json!({"headers": null}),
        json!({"paused": null}),
        json!({"url": "http://example.com:0/"}),
        json!({"headers": {"Expect": "100-continue"}}),
        json!({"headers": {"Content-Encoding": "gzip"}}),
    ] {
        let (s, v) = call(
            &api,
            &token,
            Method::PATCH,
            &format!("/v1/endpoints/{}", id(&ep)),
            Some(body.clone()),
        )
        .await;
        assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY, "{body}: {v}");
    }

    // Routes whose body is optional: no bytes reads as `{}`, but a body that is only
    // whitespace is not JSON (found by schemathesis: a lone `\r` minted a portal link).
    for path in [
        "/v1/consumers/c1/portal".to_string(),
        "/v1/consumers/c1/tokens".to_string(),
        format!("/v1/endpoints/{}/secret/rotate", id(&ep)),
        format!("/v1/endpoints/{}/test", id(&ep)),
    ] {
        let send = |body: &'static str| {
            api.client
                .post(format!("{}{path}", api.base))
                .bearer_auth(&token)
                .header("content-type", "application/json")
                .body(body)
                .send()
        };
        let r = send("\r").await.unwrap();
        assert_eq!(r.status(), reqwest::StatusCode::BAD_REQUEST, "{path}");
        let v: Value = r.json().await.unwrap();
        assert_eq!(v["error"]["code"], "malformed_json", "{path}: {v}");
        let r = send("").await.unwrap();
        assert!(r.status().is_success(), "{path}: {}", r.status());
    }
}

/// jsonb keeps numbers exactly and prints `-1.7976931348623157e308` as 309 digits, which
/// `serde_json::Value` cannot hold: found by schemathesis, such a consumer answered 500 on
/// its PUT and made every listing of its tenant fail.
#[sqlx::test]
async fn consumer_metadata_with_extreme_numbers_reads_back(pool: PgPool) {
    let api = TestApi::start(&pool).await;
    let token = api.token_for(TENANT).await;
    let body = r#"{"name":"big","metadata":{"min":-1.7976931348623157e+308,"tiny":5e-324,"n":{"x":[1e300,-4.48e16]}}}"#;
    let r = api
        .client
        .put(format!("{}/v1/consumers/big_numbers", api.base))
        .bearer_auth(&token)
        .header("content-type", "application/json")
        .body(body)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 201, "{}", r.text().await.unwrap());
    for path in [
        "/v1/consumers/big_numbers",
        &format!("/v1/consumers?tenant={TENANT}&limit=10"),
    ] {
        let r = api
            .client
            .get(format!("{}{path}", api.base))
            .bearer_auth(&token)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200, "{path}");
        let text = r.text().await.unwrap();
        // the exact digits jsonb stored, as a JSON number, in a well-formed document
        assert!(text.contains(r#""min": -17976931348623157000"#), "{text}");
        serde_json::from_str::<Box<serde_json::value::RawValue>>(&text)
            .unwrap_or_else(|e| panic!("{path}: {e}: {text}"));
    }
}

/// Fan-out reads the matching subscriptions only, however the tenant's endpoints are
/// spread. With many consumers the planner estimates one subscription per (tenant,
/// consumer) and, left free, scanned all of a tenant's tenant-wide subscriptions for
/// every event, filtering by pattern: `hookd-bench --only consumers` measured 0.05-0.09 x
/// the ingest rate among 10,000 tenant-wide endpoints of distinct types.
#[sqlx::test]
async fn fan_out_reads_only_the_matching_subscriptions_whatever_the_statistics(pool: PgPool) {
    sqlx::query(
        "INSERT INTO hookd.consumers (tenant, uid) SELECT 'wide', 'c' || g FROM generate_series(1, 30000) g",
    )
    .execute(&pool)
    .await
    .unwrap();
    sqlx::query(
        // 30,000 consumers with an endpoint for every type (pattern `*`), and 3,000
        // tenant-wide endpoints of distinct types
        "INSERT INTO hookd.endpoints (id, tenant, consumer, managed_by, url, event_types)
         SELECT hookd.uuid_v7(), 'wide', CASE WHEN g <= 30000 THEN 'c' || g END, 'api',
                'https://example.com/' || g,
                CASE WHEN g <= 30000 THEN '{}'::text[] ELSE ARRAY['t.' || (g - 27000)] END
         FROM generate_series(1, 33000) g",
    )
    .execute(&pool)
    .await
    .unwrap();
    sqlx::query("ANALYZE hookd.subscriptions")
        .execute(&pool)
        .await
        .unwrap();
    let events: Vec<hookd::db::events::NewEvent> = (0..16)
        .map(|i| hookd::db::events::NewEvent {
            id: Uuid::now_v7(),
            tenant: "wide".into(),
            event_type: format!("t.{}", 3001 + i),
            payload: "{}".into(),
            idempotency_key: None,
            request_hash: vec![0],
            consumer: None,
            origin: None,
            trace: None,
            ordering_key: None,
        })
        .collect();
    let mut tx = pool.begin().await.unwrap();
    let (inserted, _) = hookd::db::events::insert_with_fanout(&mut tx, &events)
        .await
        .unwrap();
    assert!(inserted.iter().all(|e| e.delivery_ids.len() == 1));
    let read: i64 = sqlx::query_scalar(
        // entries read through the index, and rows read by sequential scans
        "SELECT pg_stat_get_xact_tuples_returned('hookd.subscriptions_pkey'::regclass)
              + pg_stat_get_xact_tuples_returned('hookd.subscriptions'::regclass)",
    )
    .fetch_one(&mut *tx)
    .await
    .unwrap();
    // one match per event (each type has 3 patterns: *, t.*, t.<n>)
    assert!(
        read <= 16 * 3,
        "{read} subscription entries read for 16 events"
    );
    tx.rollback().await.unwrap();

    // hookd.enqueue likewise, past the five calls after which PL/pgSQL may plan once for
    // any tenant and consumer
    let mut tx = pool.begin().await.unwrap();
    sqlx::query(
        "SELECT hookd.enqueue('wide', 't.' || g, '{}', NULL, NULL) FROM generate_series(3001, 3016) g",
    )
    .execute(&mut *tx)
    .await
    .unwrap();
    let read: i64 = sqlx::query_scalar(
        // entries read through the index, and rows read by sequential scans
        "SELECT pg_stat_get_xact_tuples_returned('hookd.subscriptions_pkey'::regclass)
              + pg_stat_get_xact_tuples_returned('hookd.subscriptions'::regclass)",
    )
    .fetch_one(&mut *tx)
    .await
    .unwrap();
    assert!(
        read <= 16 * 3,
        "hookd.enqueue: {read} subscription entries read for 16 events"
    );
    tx.rollback().await.unwrap();
}

/// A new URL is a new destination whichever door changes it: its circuit closes, its
/// failures are forgotten and its configuration version moves on (outcomes of sends to the
/// old URL stop counting). One trigger holds the rule (migration 0023); an operator's own
/// `UPDATE` of the URL got none of it before.
#[sqlx::test]
async fn a_new_url_closes_the_circuit_through_every_door(pool: PgPool) {
    let api = TestApi::start(&pool).await;
    let token = api.token_for(TENANT).await;
    let trip = |id: Uuid| {
        let pool = pool.clone();
        async move {
            sqlx::query(
                "UPDATE hookd.endpoints SET circuit_state = 'open', circuit_failures = 7,
                        circuit_open_until = now() + interval '1 hour' WHERE id = $1",
            )
            .bind(id)
            .execute(&pool)
            .await
            .unwrap();
        }
    };
    let circuit = |id: Uuid| {
        let pool = pool.clone();
        async move {
            sqlx::query_as::<_, (String, i32, bool, i64)>(
                "SELECT circuit_state, circuit_failures, circuit_open_until IS NULL, config_version
                 FROM hookd.endpoints WHERE id = $1",
            )
            .bind(id)
            .fetch_one(&pool)
            .await
            .unwrap()
        }
    };
    let fresh = |v: i64| ("closed".to_string(), 0, true, v);

    let held = |id: Uuid| {
        let pool = pool.clone();
        async move {
            sqlx::query_scalar::<_, bool>(
                "SELECT coalesce(hold_until > now(), false) FROM hookd.endpoint_queue WHERE endpoint_id = $1",
            )
            .bind(id)
            .fetch_one(&pool)
            .await
            .unwrap()
        }
    };

    // the endpoints API, with a delivery waiting, which the open circuit holds
    let ep = id(&create_endpoint(&api, &token, json!({"url": "https://example.com/a"})).await);
    let (s, v) = enqueue(&api, &token, json!({"eventType": "x.y", "payload": {}})).await;
    assert_eq!(s, StatusCode::CREATED, "{v}");
    // the dispatcher's step before each claim: new work becomes a queue entry
    hookd::db::deliveries::fold_wakeups(&pool).await.unwrap();
    trip(ep).await;
    assert!(held(ep).await, "the open circuit holds the queue entry");
    let (s, v) = call(
        &api,
        &token,
        Method::PATCH,
        &format!("/v1/endpoints/{ep}"),
        Some(json!({"url": "https://example.com/b"})),
    )
    .await;
    assert_eq!(s, StatusCode::OK, "{v}");
    assert_eq!(v["circuit"]["state"], "closed", "{v}");
    assert_eq!(circuit(ep).await, fresh(2));
    assert!(
        !held(ep).await,
        "the new destination's deliveries are due again"
    );
    // the same URL again is no change
    trip(ep).await;
    call(
        &api,
        &token,
        Method::PATCH,
        &format!("/v1/endpoints/{ep}"),
        Some(json!({"url": "https://example.com/b"})),
    )
    .await;
    assert_eq!(
        circuit(ep).await.0,
        "open",
        "an unchanged URL keeps the circuit"
    );

    // a declaration (the controller's and `hookd apply`'s sync core)
    let mut o = EndpointOpts {
        url: "https://example.com/declared".into(),
        ..Default::default()
    };
    let declared = endpoint(&pool, o.clone()).await;
    let (s, v) = enqueue(&api, &token, json!({"eventType": "x.y", "payload": {}})).await;
    assert_eq!(s, StatusCode::CREATED, "{v}");
    hookd::db::deliveries::fold_wakeups(&pool).await.unwrap();
    trip(declared).await;
    o.url = "https://example.com/declared-2".into();
    assert_eq!(endpoint(&pool, o).await, declared);
    assert_eq!(circuit(declared).await, fresh(2));

    // and an operator's own statement
    trip(declared).await;
    sqlx::query("UPDATE hookd.endpoints SET url = 'https://example.com/by-hand' WHERE id = $1")
        .bind(declared)
        .execute(&pool)
        .await
        .unwrap();
    assert_eq!(circuit(declared).await, fresh(3));
    assert!(
        !held(declared).await,
        "a statement that names only the URL releases the hold too"
    );
}

/// Who an event goes to is one rule, `hookd.subscribers`, for the API's group commit and
/// for `hookd.enqueue` alike; Postgres inlines it into the calling statement, so the rule
/// costs what the two copies it replaced cost (probes of the subscriptions' key).
#[sqlx::test]
async fn fan_out_is_one_rule_inlined_into_both_doors(pool: PgPool) {
    let enqueue: String = sqlx::query_scalar(
        "SELECT prosrc FROM pg_proc WHERE oid = 'hookd.enqueue(text, text, text, text, text, text)'::regprocedure",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert!(enqueue.contains("hookd.subscribers("), "{enqueue}");
    assert!(!enqueue.contains("hookd.subscriptions"), "{enqueue}");
    let plan: Vec<String> =
        sqlx::query_scalar("EXPLAIN SELECT * FROM hookd.subscribers('t', NULL, 'a.b.c')")
            .fetch_all(&pool)
            .await
            .unwrap();
    let plan = plan.join("\n");
    assert!(
        !plan.contains("Function Scan on subscribers"),
        "not inlined:\n{plan}"
    );
    assert!(plan.contains("subscriptions_pkey"), "{plan}");
}
