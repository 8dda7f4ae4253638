//! Inbound sources (issue 33): `/v1/sources` and `POST /in/{name}` through the real API,
//! with providers' signatures computed here as each provider documents them (and by the
//! `standardwebhooks` crate for that scheme), a real dispatcher and a real receiver.

use crate::common;

use std::time::Duration;

use axum::http::StatusCode;
use common::*;
use reqwest::Method;
use serde_json::{Value, json};
use sqlx::PgPool;

const TENANT: &str = DEFAULT_TENANT;
const ENDPOINT_SECRET: &str = "whsec_RzJH00HTPAJeFtgT0NteobsaX6JniEw0YX6Ro3Uz0HA=";
const STRIPE_SECRET: &str = "whsec_test_5hX2qJv0Yk3mNpR7sT9uVwXy1zA4bC6d";

async fn post_in(
    api: &TestApi,
    name: &str,
    headers: &[(&str, String)],
    body: &str,
) -> (StatusCode, Value) {
    let mut r = api
        .client
        .post(format!("{}/in/{name}", api.base))
        .header("content-type", "application/json")
        .body(body.to_string());
    for (k, v) in headers {
        r = r.header(*k, v);
    }
    send(r).await
}

async fn events(pool: &PgPool) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM hookd.events")
        .fetch_one(pool)
        .await
        .unwrap()
}

#[sqlx::test]
async fn a_stripe_source_takes_a_signed_event_once_and_delivers_it_byte_for_byte(pool: PgPool) {
    let api = TestApi::start(&pool).await;
    let token = api.token_for(TENANT).await;
    let (s, src) = call(
        &api,
        &token,
        Method::POST,
        "/v1/sources",
        Some(json!({"name": "stripe-main", "provider": "stripe", "secret": STRIPE_SECRET})),
    )
    .await;
    assert_eq!(s, StatusCode::CREATED, "{src}");
    assert_eq!(src["url"], "/in/stripe-main");
    assert_eq!(src["eventTypePrefix"], "stripe-main");
    assert_eq!(src["tenant"], TENANT);
    let rx = Receiver::start(&[ENDPOINT_SECRET]).await;
    let (s, ep) = call(
        &api,
        &token,
        Method::POST,
        "/v1/endpoints",
        Some(json!({"url": rx.url("/billing"), "eventTypes": ["stripe-main.invoice.*"], "secret": ENDPOINT_SECRET})),
    )
    .await;
    assert_eq!(s, StatusCode::CREATED, "{ep}");

    // the provider's exact bytes, spacing included
    let body = r#"{ "id": "evt_1NqW", "type": "invoice.paid",  "data": {"amount": 4200} }"#;
    let now = chrono::Utc::now().timestamp();
    let signed =
        |body: &str, t: i64| vec![("stripe-signature", stripe_signature(STRIPE_SECRET, t, body))];
    // what a proxy in front adds is not the provider's, and is not kept
    let mut with_proxy = signed(body, now);
    with_proxy.push(("x-forwarded-for", "203.0.113.9".into()));
    with_proxy.push((
        "user-agent",
        "Stripe/1.0 (+https://stripe.com/docs/webhooks)".into(),
    ));
    let (s, first) = post_in(&api, "stripe-main", &with_proxy, body).await;
    assert_eq!(s, StatusCode::ACCEPTED, "{first}");
    // the request as it came: its source, the provider's event id, the headers Stripe
    // documents
    let (source, source_event_id, kept): (Option<String>, Option<String>, Option<Value>) =
        sqlx::query_as(
            "SELECT source, source_event_id, source_headers FROM hookd.events WHERE id = $1::text::uuid",
        )
        .bind(first["eventId"].as_str().unwrap())
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(source.as_deref(), Some("stripe-main"));
    assert_eq!(source_event_id.as_deref(), Some("evt_1NqW"));
    assert_eq!(
        kept.unwrap(),
        json!({
            "content-type": "application/json",
            "stripe-signature": with_proxy[0].1,
            "user-agent": "Stripe/1.0 (+https://stripe.com/docs/webhooks)",
        })
    );
    assert_eq!(first["duplicate"], false);
    assert_eq!(first["deliveryIds"].as_array().unwrap().len(), 1, "{first}");

    // Stripe's retry: a new signature and timestamp over the same event
    let (s, again) = post_in(&api, "stripe-main", &signed(body, now + 1), body).await;
    assert_eq!(s, StatusCode::ACCEPTED, "{again}");
    assert_eq!(again["duplicate"], true);
    assert_eq!(again["eventId"], first["eventId"]);
    // the same event id with other bytes is still that event
    let other = r#"{"id": "evt_1NqW", "type": "invoice.paid"}"#;
    let (s, v) = post_in(&api, "stripe-main", &signed(other, now), other).await;
    assert_eq!(
        (s, &v["duplicate"]),
        (StatusCode::ACCEPTED, &json!(true)),
        "{v}"
    );
    assert_eq!(v["eventId"], first["eventId"]);
    assert_eq!(events(&pool).await, 1);

    // refusals: one 401 for a wrong secret, a stale or missing signature and an unknown
    // source, and nothing stored
    let (s, unknown) = post_in(&api, "nobody-here", &signed(body, now), body).await;
    assert_eq!(s, StatusCode::UNAUTHORIZED, "{unknown}");
    assert_eq!(unknown["error"]["code"], "inbound_unauthorized");
    let forged = vec![(
        "stripe-signature",
        stripe_signature("whsec_not_the_secret", now, body),
    )];
    for (what, headers) in [
        ("wrong secret", forged),
        ("stale", signed(body, now - 600)),
        ("from the future", signed(body, now + 600)),
        ("unsigned", vec![]),
    ] {
        let (s, v) = post_in(&api, "stripe-main", &headers, body).await;
        assert_eq!(s, StatusCode::UNAUTHORIZED, "{what}: {v}");
        assert_eq!(v, unknown, "{what}: the same answer as an unknown source");
    }
    // signed, but not JSON: refused, never forwarded as something else
    let text = "id=evt_2&type=x";
    let (s, v) = post_in(&api, "stripe-main", &signed(text, now), text).await;
    assert_eq!(s, StatusCode::UNSUPPORTED_MEDIA_TYPE, "{v}");
    assert_eq!(v["error"]["code"], "inbound_not_json");
    assert_eq!(
        events(&pool).await,
        1,
        "nothing of a refused request is stored"
    );

    // the event goes out like a produced one: signed by hookd, the provider's bytes as is
    let _d = TestDispatcher::start(&pool, dispatch_settings()).await;
    assert!(wait_until(Duration::from_secs(10), || async { rx.count() == 1 }).await);
    let got = rx.received.lock().unwrap()[0].clone();
    assert_eq!(&got.body[..], body.as_bytes());
    assert_eq!(got.verified_by, vec![true]);
    assert_eq!(got.event_type.as_deref(), Some("stripe-main.invoice.paid"));
    // and says where it came from
    assert_eq!(got.headers["hookd-source"], "stripe-main");
    assert_eq!(got.headers["hookd-source-event-id"], "evt_1NqW");

    let metrics = api
        .client
        .get(format!("{}/metrics", api.base))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    for (source, outcome, n) in [
        ("stripe-main", "accepted", 1),
        ("stripe-main", "duplicate", 2),
        ("stripe-main", "bad_signature", 1),
        ("stripe-main", "stale_timestamp", 2),
        ("stripe-main", "missing_signature", 1),
        ("stripe-main", "not_json", 1),
        ("(unknown)", "unknown_source", 1),
    ] {
        let line = format!(
            "hookd_inbound_requests_total{{source=\"{source}\",outcome=\"{outcome}\"}} {n}"
        );
        assert!(metrics.contains(&line), "{line} in:\n{metrics}");
    }
}

#[sqlx::test]
async fn sources_belong_to_their_tenant_and_a_deleted_one_takes_nothing(pool: PgPool) {
    let api = TestApi::start(&pool).await;
    let token = api.token_for(TENANT).await;
    let other = api.token_for("team-b").await;
    // GitHub lets its user choose the secret: hookd generates one
    let (s, gh) = call(
        &api,
        &token,
        Method::POST,
        "/v1/sources",
        Some(json!({"name": "gh", "provider": "github"})),
    )
    .await;
    assert_eq!(s, StatusCode::CREATED, "{gh}");
    let secret = gh["secret"].as_str().unwrap().to_string();
    assert_eq!(secret.len(), 64);
    // Stripe issues its own: it must be given
    let (s, v) = call(
        &api,
        &token,
        Method::POST,
        "/v1/sources",
        Some(json!({"name": "st", "provider": "stripe"})),
    )
    .await;
    assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY, "{v}");
    // names are the route: unique across tenants
    let (s, v) = call(
        &api,
        &other,
        Method::POST,
        "/v1/sources",
        Some(json!({"name": "gh", "provider": "github"})),
    )
    .await;
    assert_eq!(
        (s, v["error"]["code"].as_str()),
        (StatusCode::CONFLICT, Some("source_exists"))
    );
    for bad in [
        json!({"name": "Upper", "provider": "github"}),
        json!({"name": "x", "provider": "gitlab"}),
        json!({"name": "x", "provider": "hmac"}),
        json!({"name": "x", "provider": "github", "hmac": {"header": "X-Sig"}}),
        json!({"name": "x", "provider": "hmac", "hmac": {"header": "bad header"}}),
        json!({"name": "x", "provider": "standard-webhooks", "secret": "whsec_!!"}),
        json!({"name": "x", "provider": "github", "maxBodyBytes": 0}),
        json!({"name": "x", "provider": "github", "eventTypePrefix": "a..b"}),
    ] {
        let (s, v) = call(&api, &token, Method::POST, "/v1/sources", Some(bad.clone())).await;
        assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY, "{bad}: {v}");
        assert!(
            !v.to_string().contains("whsec_!!"),
            "never echoes a secret: {v}"
        );
    }
    // another tenant sees nothing
    let (s, _) = call(&api, &other, Method::GET, "/v1/sources/gh", None).await;
    assert_eq!(s, StatusCode::NOT_FOUND);
    let (_, page) = call(&api, &other, Method::GET, "/v1/sources", None).await;
    assert_eq!(page["items"], json!([]));
    let (_, page) = call(&api, &token, Method::GET, "/v1/sources", None).await;
    assert_eq!(page["items"][0]["name"], "gh");
    assert!(page["items"][0].get("secret").is_none());

    let body = r#"{"ref":"refs/heads/main"}"#;
    let sig = format!("sha256={}", hmac_hex(secret.as_bytes(), body.as_bytes()));
    let headers = vec![
        ("x-hub-signature-256", sig),
        ("x-github-event", "push".to_string()),
        (
            "x-github-delivery",
            "72d3162e-cc78-11e3-81ab-4c9367dc0958".to_string(),
        ),
    ];
    let (s, v) = post_in(&api, "gh", &headers, body).await;
    assert_eq!(s, StatusCode::ACCEPTED, "{v}");
    let event_type: String = sqlx::query_scalar("SELECT event_type FROM hookd.events")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(event_type, "gh.push");

    let (s, _) = call(&api, &other, Method::DELETE, "/v1/sources/gh", None).await;
    assert_eq!(s, StatusCode::NOT_FOUND, "another tenant cannot delete it");
    let (s, _) = call(&api, &token, Method::DELETE, "/v1/sources/gh", None).await;
    assert_eq!(s, StatusCode::NO_CONTENT);
    let (s, v) = post_in(&api, "gh", &headers, body).await;
    assert_eq!(s, StatusCode::UNAUTHORIZED, "{v}");
    assert_eq!(events(&pool).await, 1, "the event it took stays");
}

/// Standard Webhooks, signed by the official `standardwebhooks` crate (a real signer).
#[sqlx::test]
async fn a_standard_webhooks_source_verifies_what_the_official_library_signs(pool: PgPool) {
    let api = TestApi::start(&pool).await;
    let token = api.token_for(TENANT).await;
    let (s, src) = call(
        &api,
        &token,
        Method::POST,
        "/v1/sources",
        Some(json!({"name": "partner", "provider": "standard-webhooks", "consumer": "cust_1"})),
    )
    .await;
    assert_eq!(s, StatusCode::CREATED, "{src}");
    let secret = src["secret"].as_str().unwrap();
    let wh = standardwebhooks::Webhook::new(secret).unwrap();
    let body = r#"{"type":"user.created","data":{"id":7}}"#;
    let ts = chrono::Utc::now().timestamp();
    let sig = wh.sign("msg_2Lx", ts, body.as_bytes()).unwrap();
    let headers = vec![
        ("webhook-id", "msg_2Lx".to_string()),
        ("webhook-timestamp", ts.to_string()),
        ("webhook-signature", sig),
    ];
    let (s, v) = post_in(&api, "partner", &headers, body).await;
    assert_eq!(s, StatusCode::ACCEPTED, "{v}");
    let (event_type, consumer): (String, Option<String>) =
        sqlx::query_as("SELECT event_type, consumer FROM hookd.events")
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(event_type, "partner.user.created");
    assert_eq!(consumer.as_deref(), Some("cust_1"));
    // a body over the source's limit is refused before it is read
    let (s, _) = call(
        &api,
        &token,
        Method::POST,
        "/v1/sources",
        Some(json!({"name": "tiny", "provider": "standard-webhooks", "maxBodyBytes": 16})),
    )
    .await;
    assert_eq!(s, StatusCode::CREATED);
    let (s, v) = post_in(&api, "tiny", &headers, body).await;
    assert_eq!(s, StatusCode::PAYLOAD_TOO_LARGE, "{v}");
}

/// A source's secret rotates with a grace period (both verify, so the provider can be
/// switched over without a refused request), at most 4 verify at once, and a change of its
/// prefix changes the types of the events it takes from then on.
#[sqlx::test]
async fn a_source_secret_rotates_with_grace_and_a_source_changes(pool: PgPool) {
    let api = TestApi::start(&pool).await;
    let token = api.token_for(TENANT).await;
    let (s, gh) = call(
        &api,
        &token,
        Method::POST,
        "/v1/sources",
        Some(json!({"name": "gh", "provider": "github"})),
    )
    .await;
    assert_eq!(s, StatusCode::CREATED, "{gh}");
    let old = gh["secret"].as_str().unwrap().to_string();
    let mut n = 0;
    let mut post = |secret: String| {
        n += 1;
        let body = format!(r#"{{"n":{n}}}"#);
        let headers = vec![
            (
                "x-hub-signature-256",
                format!("sha256={}", hmac_hex(secret.as_bytes(), body.as_bytes())),
            ),
            ("x-github-event", "push".to_string()),
            ("x-github-delivery", format!("d-{n}")),
        ];
        let api = &api;
        async move { post_in(api, "gh", &headers, &body).await.0 }
    };
    let (s, r) = call(
        &api,
        &token,
        Method::POST,
        "/v1/sources/gh/secret/rotate",
        Some(json!({"graceSeconds": 3600})),
    )
    .await;
    assert_eq!(s, StatusCode::CREATED, "{r}");
    let new = r["secret"].as_str().unwrap().to_string();
    assert_ne!(new, old);
    assert_eq!(
        post(old.clone()).await,
        StatusCode::ACCEPTED,
        "the old secret in its grace"
    );
    assert_eq!(
        post(new.clone()).await,
        StatusCode::ACCEPTED,
        "the new secret"
    );
    // without grace the previous one stops at once
    let (s, r) = call(
        &api,
        &token,
        Method::POST,
        "/v1/sources/gh/secret/rotate",
        Some(json!({"graceSeconds": 0})),
    )
    .await;
    assert_eq!(s, StatusCode::CREATED, "{r}");
    let newest = r["secret"].as_str().unwrap().to_string();
    assert_eq!(post(new).await, StatusCode::UNAUTHORIZED);
    assert_eq!(post(old).await, StatusCode::ACCEPTED, "still in its hour");
    assert_eq!(post(newest).await, StatusCode::ACCEPTED);
    for _ in 0..6 {
        let (s, _) = call(
            &api,
            &token,
            Method::POST,
            "/v1/sources/gh/secret/rotate",
            Some(json!({})),
        )
        .await;
        assert_eq!(s, StatusCode::CREATED);
    }
    let live: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM hookd.source_secrets WHERE not_after IS NULL OR not_after > now()",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert!(
        live <= hookd::db::sources::MAX_SOURCE_SECRETS,
        "{live} secrets verify"
    );
    let (s, v) = call(
        &api,
        &token,
        Method::POST,
        "/v1/sources/gh/secret/rotate",
        Some(json!({"graceSeconds": 604801})),
    )
    .await;
    assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY, "{v}");

    // a change
    let (s, v) = call(
        &api,
        &token,
        Method::PATCH,
        "/v1/sources/gh",
        Some(
            json!({"eventTypePrefix": "github", "consumer": "cust_9", "description": "main repo"}),
        ),
    )
    .await;
    assert_eq!(s, StatusCode::OK, "{v}");
    assert_eq!(v["eventTypePrefix"], "github");
    for bad in [
        json!({"eventTypePrefix": null}),
        json!({"eventTypePrefix": "a b"}),
        json!({"maxBodyBytes": 0}),
        json!({"hmac": {"header": "X-Sig"}}),
        json!({"provider": "stripe"}),
    ] {
        let (s, v) = call(
            &api,
            &token,
            Method::PATCH,
            "/v1/sources/gh",
            Some(bad.clone()),
        )
        .await;
        assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY, "{bad}: {v}");
    }
    let (s, _) = call(
        &api,
        &token,
        Method::PATCH,
        "/v1/sources/nope",
        Some(json!({})),
    )
    .await;
    assert_eq!(s, StatusCode::NOT_FOUND);
}

/// A source whose secrets this process cannot open (sealed under a key it lacks) answers
/// 503, which providers retry, and says why: never a 401 that blames the sender.
#[sqlx::test]
async fn a_source_sealed_under_an_unknown_key_answers_503(pool: PgPool) {
    let api = TestApi::start(&pool).await;
    let token = api.token_for(TENANT).await;
    let (s, _) = call(
        &api,
        &token,
        Method::POST,
        "/v1/sources",
        Some(json!({"name": "gh", "provider": "github"})),
    )
    .await;
    assert_eq!(s, StatusCode::CREATED);
    sqlx::query("UPDATE hookd.source_secrets SET key_id = 'retired-key'")
        .execute(&pool)
        .await
        .unwrap();
    let (s, v) = post_in(
        &api,
        "gh",
        &[("x-hub-signature-256", "sha256=00".into())],
        "{}",
    )
    .await;
    assert_eq!(s, StatusCode::SERVICE_UNAVAILABLE, "{v}");
    assert_eq!(v["error"]["code"], "encryption_unavailable");
    assert_eq!(events(&pool).await, 0);
}

/// Requests nobody signed, however many, cost the source they are sent to and never its
/// tenant's rate: the tenant's producers keep enqueueing while a source is flooded.
#[sqlx::test]
async fn unsigned_floods_do_not_spend_the_tenants_rate(pool: PgPool) {
    let mut settings = api_settings();
    settings.tenant_rate_limit = Some(5.0);
    let api = TestApi::start_with(&pool, settings).await;
    let token = api.token_for(TENANT).await;
    let (s, _) = call(
        &api,
        &token,
        Method::POST,
        "/v1/sources",
        Some(json!({"name": "gh", "provider": "github"})),
    )
    .await;
    assert_eq!(s, StatusCode::CREATED);
    let mut refused = 0;
    for n in 0..40 {
        let headers = vec![("x-hub-signature-256", format!("sha256={:064x}", n))];
        let (s, _) = post_in(&api, "gh", &headers, "{}").await;
        assert!(
            s == StatusCode::UNAUTHORIZED || s == StatusCode::TOO_MANY_REQUESTS,
            "{s}"
        );
        refused += 1;
    }
    assert_eq!(refused, 40);
    let (s, v) = call(
        &api,
        &token,
        Method::POST,
        "/v1/messages",
        Some(json!({"eventType": "order.paid", "payload": {}})),
    )
    .await;
    assert_eq!(
        s,
        StatusCode::CREATED,
        "the tenant's own events still go in: {v}"
    );
}

/// Held requests to a source (headers sent, the body never) take the source's own share
/// of the inbound budget, never its tenant's: the producers' ingest is untouched. Also the
/// settings a provider cannot live with are refused when the source is made, and Slack's
/// check of a Request URL gets its challenge back.
#[sqlx::test]
async fn held_requests_cost_the_source_and_sources_are_made_usable(pool: PgPool) {
    use tokio::io::AsyncWriteExt;
    let mut settings = api_settings();
    settings.api_tenant_inflight_bytes = Some(1 << 20);
    let max_payload = settings.max_payload_bytes;
    let api = TestApi::start_with(&pool, settings).await;
    let token = api.token_for(TENANT).await;
    let create = |body: Value| call(&api, &token, Method::POST, "/v1/sources", Some(body));
    let (s, _) = create(json!({"name": "gh", "provider": "github"})).await;
    assert_eq!(s, StatusCode::CREATED);

    let addr = api.base.trim_start_matches("http://").to_string();
    let mut held = Vec::new();
    for _ in 0..6 {
        let mut c = tokio::net::TcpStream::connect(&addr).await.unwrap();
        c.write_all(
            format!(
                "POST /in/gh HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: {max_payload}\r\nx-hub-signature-256: sha256=00\r\n\r\n"
            )
            .as_bytes(),
        )
        .await
        .unwrap();
        held.push(c);
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let (s, v) = call(
        &api,
        &token,
        Method::POST,
        "/v1/messages",
        Some(json!({"eventType": "order.paid", "payload": {}})),
    )
    .await;
    assert_eq!(
        s,
        StatusCode::CREATED,
        "held inbound requests cost the producer: {v}"
    );
    drop(held);

    for (bad, says) in [
        (
            json!({"name": "b1", "provider": "github", "secret": "a"}),
            "16 to 1024",
        ),
        (
            json!({"name": "b2", "provider": "standard-webhooks", "secret": "whsec_QQ=="}),
            "16 to 1024",
        ),
        (
            json!({"name": "b3", "provider": "hmac", "hmac": {"header": "content-length"}}),
            "header name",
        ),
        (
            json!({"name": "b4", "provider": "hmac", "hmac": {"header": "x-sig", "timestampHeader": "X-Sig"}}),
            "differ",
        ),
        (
            json!({"name": "b5", "provider": "github", "maxBodyBytes": max_payload + 1}),
            "HOOKD_MAX_PAYLOAD_BYTES",
        ),
    ] {
        let (s, v) = create(bad.clone()).await;
        assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY, "{bad}: {v}");
        assert!(
            v["error"]["message"].as_str().unwrap().contains(says),
            "{bad}: {v}"
        );
    }
    let (s, v) = create(json!({"name": "big", "provider": "github"})).await;
    assert_eq!(s, StatusCode::CREATED);
    assert_eq!(
        v["maxBodyBytes"],
        json!(max_payload),
        "the default fits the API's limit"
    );

    // Slack: a signed url_verification is answered with its challenge and stored nowhere
    let slack_secret = "8f742231b10e8888abcd99yyyzzz85a5";
    let (s, _) = create(json!({"name": "sl", "provider": "slack", "secret": slack_secret})).await;
    assert_eq!(s, StatusCode::CREATED);
    let body = r#"{"token":"x","challenge":"3eZbrw1aBm2rZgRNFdxV2595E9CY3gmdALWMmHkvFXO7tYXAYM8P","type":"url_verification"}"#;
    let ts = chrono::Utc::now().timestamp();
    let sig = format!(
        "v0={}",
        hmac_hex(
            slack_secret.as_bytes(),
            format!("v0:{ts}:{body}").as_bytes()
        )
    );
    let (s, v) = post_in(
        &api,
        "sl",
        &[
            ("x-slack-request-timestamp", ts.to_string()),
            ("x-slack-signature", sig),
        ],
        body,
    )
    .await;
    assert_eq!(s, StatusCode::OK, "{v}");
    assert_eq!(
        v["challenge"],
        "3eZbrw1aBm2rZgRNFdxV2595E9CY3gmdALWMmHkvFXO7tYXAYM8P"
    );
    let events: i64 =
        sqlx::query_scalar("SELECT count(*) FROM hookd.events WHERE event_type LIKE 'sl%'")
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(events, 0);
}

/// A tenant holds at most 100 sources: each is a public URL and a name no other tenant
/// can take.
#[sqlx::test]
async fn a_tenant_holds_at_most_100_sources(pool: PgPool) {
    let api = TestApi::start(&pool).await;
    let token = api.token_for(TENANT).await;
    for n in 0..hookd::inbound::sources::MAX_SOURCES_PER_TENANT {
        let (s, v) = call(
            &api,
            &token,
            Method::POST,
            "/v1/sources",
            Some(json!({"name": format!("s{n}"), "provider": "github"})),
        )
        .await;
        assert_eq!(s, StatusCode::CREATED, "{v}");
    }
    let (s, v) = call(
        &api,
        &token,
        Method::POST,
        "/v1/sources",
        Some(json!({"name": "one-more", "provider": "github"})),
    )
    .await;
    assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY, "{v}");
    assert_eq!(v["error"]["code"], "tenant_source_limit");
}

/// The API keeps a source between requests (`inbound::cache`) only while it hears the
/// database's notifications: a change by another process (here SQL, as the controller,
/// `hookd apply` or another replica would write it) stops the kept copy once heard, and a
/// lost listener forgets everything it kept.
#[sqlx::test]
async fn a_kept_source_is_forgotten_on_every_change_and_on_a_lost_listener(pool: PgPool) {
    let api = TestApi::start(&pool).await;
    let token = api.token_for(TENANT).await;
    let (s, v) = call(
        &api,
        &token,
        Method::POST,
        "/v1/sources",
        Some(json!({"name": "kept", "provider": "stripe", "secret": STRIPE_SECRET})),
    )
    .await;
    assert_eq!(s, StatusCode::CREATED, "{v}");
    let listener = || async {
        sqlx::query_scalar::<_, i32>(
            "SELECT pid FROM pg_stat_activity
             WHERE datname = current_database() AND query LIKE 'LISTEN %hookd_sources%'",
        )
        .fetch_optional(&pool)
        .await
        .unwrap()
    };
    assert!(
        wait_until(Duration::from_secs(10), || async {
            listener().await.is_some()
        })
        .await,
        "the API listens for source changes"
    );
    let seq = std::sync::atomic::AtomicU32::new(0);
    let post = || async {
        let n = seq.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let body = format!(r#"{{"id":"evt_kept_{n}","type":"invoice.paid"}}"#);
        let t = chrono::Utc::now().timestamp();
        post_in(
            &api,
            "kept",
            &[(
                "stripe-signature",
                stripe_signature(STRIPE_SECRET, t, &body),
            )],
            &body,
        )
        .await
        .0
    };
    let key_id: String = sqlx::query_scalar("SELECT key_id FROM hookd.source_secrets")
        .fetch_one(&pool)
        .await
        .unwrap();
    // a change nobody hears (triggers off for this one transaction, which no hookd writer
    // does): the next request still verifies, so the source was kept, not read again
    let set_key = |key: String, heard: bool| {
        let pool = pool.clone();
        async move {
            let mut tx = pool.begin().await.unwrap();
            if !heard {
                sqlx::query("SET LOCAL session_replication_role = replica")
                    .execute(&mut *tx)
                    .await
                    .unwrap();
            }
            sqlx::query("UPDATE hookd.source_secrets SET key_id = $1")
                .bind(key)
                .execute(&mut *tx)
                .await
                .unwrap();
            tx.commit().await.unwrap();
        }
    };
    // A notification of an earlier change (the creation, or the last heard change) may still
    // be on its way and forget what the first request kept; it comes once, so the second try
    // sees the source kept for good.
    let kept_across_an_unheard_change = || async {
        wait_until(Duration::from_secs(5), || async {
            set_key(key_id.clone(), false).await;
            if post().await != StatusCode::ACCEPTED {
                return false;
            }
            set_key("retired-key".into(), false).await;
            post().await == StatusCode::ACCEPTED
        })
        .await
    };
    assert!(
        kept_across_an_unheard_change().await,
        "the kept source verifies"
    );
    // the same change, heard: read again, its secret no longer opens (503)
    set_key("retired-key".into(), true).await;
    assert!(
        wait_until(Duration::from_secs(5), || async {
            post().await == StatusCode::SERVICE_UNAVAILABLE
        })
        .await,
        "a change another process made is heard"
    );
    set_key(key_id.clone(), true).await;
    assert!(
        wait_until(Duration::from_secs(5), || async {
            post().await == StatusCode::ACCEPTED
        })
        .await
    );
    // the listener's connection is cut: what was kept is forgotten, and kept again only
    // once it listens anew
    assert!(kept_across_an_unheard_change().await, "kept");
    let pid = listener().await.unwrap();
    sqlx::query("SELECT pg_terminate_backend($1)")
        .bind(pid)
        .execute(&pool)
        .await
        .unwrap();
    assert!(
        wait_until(Duration::from_secs(5), || async {
            post().await == StatusCode::SERVICE_UNAVAILABLE
        })
        .await,
        "a lost listener forgets what it kept"
    );
    assert!(
        wait_until(Duration::from_secs(10), || async {
            listener().await.is_some_and(|p| p != pid)
        })
        .await,
        "the listener reconnects"
    );
    // a deletion by another process
    set_key(key_id, false).await;
    assert!(
        wait_until(Duration::from_secs(5), || async {
            post().await == StatusCode::ACCEPTED
        })
        .await
    );
    sqlx::query("DELETE FROM hookd.sources WHERE name = 'kept'")
        .execute(&pool)
        .await
        .unwrap();
    assert!(
        wait_until(Duration::from_secs(5), || async {
            post().await == StatusCode::UNAUTHORIZED
        })
        .await,
        "a source deleted elsewhere stops verifying"
    );
}

/// A request whose headers arrived before a rotation without grace and whose body after it
/// is verified with the source as it is once the body is in: refused, as it would be had
/// it started a moment later (before, the secret read at its start verified it).
#[sqlx::test]
async fn a_request_in_flight_across_a_rotation_is_verified_after_it(pool: PgPool) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let api = TestApi::start(&pool).await;
    let token = api.token_for(TENANT).await;
    let (s, v) = call(
        &api,
        &token,
        Method::POST,
        "/v1/sources",
        Some(json!({"name": "slow", "provider": "stripe", "secret": STRIPE_SECRET})),
    )
    .await;
    assert_eq!(s, StatusCode::CREATED, "{v}");
    let addr = api.base.trim_start_matches("http://").to_string();
    // the head and 5 bytes of the body; `between` runs; then the rest
    let slow_post = |id: &'static str| {
        let addr = addr.clone();
        async move {
            let body = format!(r#"{{"id":"{id}","type":"invoice.paid"}}"#);
            let sig = stripe_signature(STRIPE_SECRET, chrono::Utc::now().timestamp(), &body);
            let mut s = tokio::net::TcpStream::connect(&addr).await.unwrap();
            let head = format!(
                "POST /in/slow HTTP/1.1\r\nhost: {addr}\r\ncontent-type: application/json\r\nstripe-signature: {sig}\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
                body.len()
            );
            s.write_all(head.as_bytes()).await.unwrap();
            s.write_all(&body.as_bytes()[..5]).await.unwrap();
            (s, body)
        }
    };
    let finish = |(mut s, body): (tokio::net::TcpStream, String)| async move {
        s.write_all(&body.as_bytes()[5..]).await.unwrap();
        let mut answer = String::new();
        s.read_to_string(&mut answer).await.unwrap();
        answer.lines().next().unwrap_or_default().to_string()
    };
    // without a change meanwhile, a slow request is taken
    let pending = slow_post("evt_slow_0").await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(finish(pending).await, "HTTP/1.1 202 Accepted");
    // with a rotation without grace meanwhile, it is refused
    let pending = slow_post("evt_slow_1").await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let (s, v) = call(
        &api,
        &token,
        Method::POST,
        "/v1/sources/slow/secret/rotate",
        Some(json!({"secret": "whsec_test_rotatedAwayNoGrace000000", "graceSeconds": 0})),
    )
    .await;
    assert_eq!(s, StatusCode::CREATED, "{v}");
    assert_eq!(finish(pending).await, "HTTP/1.1 401 Unauthorized");
    assert_eq!(events(&pool).await, 1, "only the first was taken");
    // a listing by source takes a source's name only
    for bad in ["slow%00", "", "Slow"] {
        let (s, v) = call(
            &api,
            &token,
            Method::GET,
            &format!("/v1/messages?source={bad}"),
            None,
        )
        .await;
        assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY, "{bad}: {v}");
    }
}
