//! Operational events (issue 34, item 4): a producer's own endpoints hear, through the same
//! outbox, when its endpoints are disabled, enabled again, cannot sign, or keep their
//! circuit open. Against a real `hookd dev` process (the API, a dispatcher and its duties)
//! and real receivers on 127.0.0.1.

use crate::common;
use crate::common::browser::Hookd;

use std::time::Duration;

use common::*;
use hookd::auth::Scope;
use reqwest::Method;
use serde_json::{Value, json};
use sqlx::PgPool;

/// Secrets of this test's endpoints (the API refuses the published test vectors).
const OPS_SECRET: &str = "whsec_c8VKzFnbvD0INDaNt9Wru/AeJrbxU7oh34SkGTDn4TM=";
const CUSTOMER_SECRET: &str = "whsec_yPpiQd1dmZUVpWjLQmpqJBar6ReAUUpzZKFsD7fPen4=";

/// The operational events `rx` received so far, in order: (type, payload), each checked
/// to be signed with the operational endpoint's secret.
fn operational(rx: &Receiver) -> Vec<(String, Value)> {
    rx.all()
        .into_iter()
        .filter(|r| {
            r.event_type
                .as_deref()
                .is_some_and(|t| t.starts_with("hookd."))
        })
        .map(|r| {
            assert_eq!(r.verified_by, [true], "signed with the endpoint's secret");
            (
                r.event_type.unwrap(),
                serde_json::from_slice(&r.body).unwrap(),
            )
        })
        .collect()
}

#[sqlx::test]
async fn a_producer_hears_when_its_endpoints_are_disabled_enabled_unreadable_or_held_open(
    pool: PgPool,
) {
    init();
    let hookd = Hookd::start(
        &pool,
        &[
            ("HOOKD_CIRCUIT_FAILURES", "2"),
            ("HOOKD_CIRCUIT_COOLDOWN_SECS", "300"),
            ("HOOKD_CIRCUIT_ALERT_SECS", "1"),
        ],
    )
    .await;
    let token = mint_token(
        &pool,
        "team-a",
        &[Scope::Produce, Scope::Read, Scope::Operate, Scope::Manage],
    )
    .await;
    let create = |url: String, types: Value, secret: &'static str| {
        let hookd = &hookd;
        let token = &token;
        async move {
            let (status, v) = hookd
                .call(
                    token,
                    Method::POST,
                    "/v1/endpoints",
                    Some(json!({"url": url, "eventTypes": types, "secret": secret})),
                )
                .await;
            assert_eq!(status, 201, "{v}");
            v["id"].as_str().unwrap().to_string()
        }
    };
    // the producer's operational endpoint, and an endpoint of every type
    let ops = Receiver::start(&[OPS_SECRET]).await;
    create(ops.url("/ops"), json!(["hookd.endpoint.*"]), OPS_SECRET).await;
    let everything = Receiver::start(&[CUSTOMER_SECRET]).await;
    create(everything.url("/all"), json!([]), CUSTOMER_SECRET).await;
    // a receiver that is gone, one that fails, one whose secret this process cannot open
    let gone = Receiver::start(&[CUSTOMER_SECRET]).await;
    gone.set(Behavior {
        status: 410,
        ..Default::default()
    });
    let gone_id = create(gone.url("/gone"), json!(["invoice.*"]), CUSTOMER_SECRET).await;
    let failing = Receiver::start(&[CUSTOMER_SECRET]).await;
    failing.set(Behavior {
        status: 500,
        ..Default::default()
    });
    let failing_id = create(failing.url("/failing"), json!(["order.*"]), CUSTOMER_SECRET).await;
    let sealed = Receiver::start(&[CUSTOMER_SECRET]).await;
    let sealed_id = create(sealed.url("/sealed"), json!(["refund.*"]), CUSTOMER_SECRET).await;

    // hookd's own types are not the producer's to send, through either door
    let (status, v) = hookd
        .call(
            &token,
            Method::POST,
            "/v1/messages",
            Some(json!({"eventType": "hookd.endpoint.disabled", "payload": {}})),
        )
        .await;
    assert_eq!(status, 422, "{v}");
    assert_eq!(v["error"]["code"], "reserved_event_type");
    let refused = sqlx::query("SELECT hookd.enqueue('team-a', 'hookd.endpoint.enabled', '{}')")
        .execute(&pool)
        .await
        .unwrap_err();
    assert!(refused.to_string().contains("reserved"), "{refused}");

    let wait_for = |n: usize| {
        let ops = &ops;
        let hookd = &hookd;
        async move {
            assert!(
                wait_until(Duration::from_secs(30), || async {
                    operational(ops).len() >= n
                })
                .await,
                "{n} operational event(s) expected, got {:?}; hookd log:\n{}",
                operational(ops),
                hookd.log()
            );
            operational(ops)
        }
    };

    // 410: disabled, and the producer hears it
    hookd.send(&token, "invoice.paid", r#"{"n":1}"#).await;
    let events = wait_for(1).await;
    let (t, p) = &events[0];
    assert_eq!(t, "hookd.endpoint.disabled");
    assert_eq!(p["endpointId"], gone_id.as_str());
    assert_eq!(p["state"], "disabled");
    assert!(p["reason"].as_str().unwrap().contains("410"), "{p}");
    assert_eq!(p["url"], gone.url("/gone").as_str());

    // enabled again through the API
    gone.set(Behavior::default());
    let (status, v) = hookd
        .call(
            &token,
            Method::POST,
            &format!("/v1/endpoints/{gone_id}/enable"),
            None,
        )
        .await;
    assert_eq!(status, 200, "{v}");
    let events = wait_for(2).await;
    assert_eq!(events[1].0, "hookd.endpoint.enabled");
    assert_eq!(events[1].1["endpointId"], gone_id.as_str());
    assert_eq!(events[1].1["state"], "active");

    // two failures open the circuit; open past HOOKD_CIRCUIT_ALERT_SECS, it is reported once
    hookd.send(&token, "order.created", r#"{"n":1}"#).await;
    hookd.send(&token, "order.created", r#"{"n":2}"#).await;
    let events = wait_for(3).await;
    assert_eq!(events[2].0, "hookd.endpoint.circuit_open");
    assert_eq!(events[2].1["endpointId"], failing_id.as_str());
    assert!(
        events[2].1["reason"]
            .as_str()
            .unwrap()
            .contains("2 consecutive failures"),
        "{}",
        events[2].1
    );

    // a signing secret sealed under a key this process lacks
    sqlx::query("UPDATE hookd.endpoint_secrets SET key_id = 'retired-key' WHERE endpoint_id = $1")
        .bind(uuid::Uuid::parse_str(&sealed_id).unwrap())
        .execute(&pool)
        .await
        .unwrap();
    hookd.send(&token, "refund.issued", r#"{"n":1}"#).await;
    let events = wait_for(4).await;
    assert_eq!(events[3].0, "hookd.endpoint.secret_unreadable");
    assert_eq!(events[3].1["endpointId"], sealed_id.as_str());
    assert_eq!(sealed.count(), 0, "nothing was sent unsigned");

    // once each: the circuit's report is not repeated while it stays open
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(operational(&ops).len(), 4, "{:?}", operational(&ops));
    // the endpoint of every type got the produced events and none of hookd's own
    let types: Vec<String> = everything
        .all()
        .into_iter()
        .filter_map(|r| r.event_type)
        .collect();
    assert!(types.contains(&"invoice.paid".to_string()), "{types:?}");
    assert!(!types.iter().any(|t| t.starts_with("hookd.")), "{types:?}");
}

/// A customer flapping its own endpoint (a receiver answering 410, enabled again in a
/// loop) reaches the tenant's alerting at most 10 times an hour per endpoint, the 10th
/// saying until when it goes quiet; and a reserved type cannot be named in any case, nor
/// a source's prefix be one.
#[sqlx::test]
async fn a_flapping_endpoint_is_reported_at_most_ten_times_an_hour(pool: PgPool) {
    let ops_rx = Receiver::start(&[OPS_SECRET]).await;
    endpoint(
        &pool,
        EndpointOpts {
            url: ops_rx.url("/ops"),
            event_types: vec!["hookd.endpoint.*".into()],
            ..Default::default()
        },
    )
    .await;
    let flapping = endpoint(
        &pool,
        EndpointOpts {
            consumer: Some("cust_1".into()),
            ..Default::default()
        },
    )
    .await;
    for _ in 0..15 {
        for state in ["disabled", "active"] {
            sqlx::query("UPDATE hookd.endpoints SET state = $2 WHERE id = $1")
                .bind(flapping)
                .bind(state)
                .execute(&pool)
                .await
                .unwrap();
        }
    }
    let sent: Vec<(String, Value)> = sqlx::query_as::<_, (String, String)>(
        "SELECT event_type, payload FROM hookd.events WHERE event_type LIKE 'hookd.endpoint.%' ORDER BY id",
    )
    .fetch_all(&pool)
    .await
    .unwrap()
    .into_iter()
    .map(|(t, p)| (t, serde_json::from_str(&p).unwrap()))
    .collect();
    assert_eq!(sent.len(), 10, "{sent:?}");
    assert!(sent.iter().all(|(_, p)| p["consumer"] == "cust_1"));
    assert!(sent[..9].iter().all(|(_, p)| p["quietUntil"].is_null()));
    assert!(sent[9].1["quietUntil"].is_string(), "{}", sent[9].1);

    for reserved in ["HOOKD.endpoint.disabled", "Hookd.x", "hookd"] {
        let e = sqlx::query("SELECT hookd.enqueue('team-a', $1, '{}')")
            .bind(reserved)
            .execute(&pool)
            .await
            .unwrap_err();
        assert!(e.to_string().contains("reserved"), "{reserved}: {e}");
        assert!(
            hookd::domain::check_not_reserved(reserved).is_err(),
            "{reserved}"
        );
    }
    let e = sqlx::query(
        "INSERT INTO hookd.sources (id, name, tenant, provider, event_type_prefix, max_body_bytes)
         VALUES (gen_random_uuid(), 'legacy', 'team-a', 'github', 'Hookd', 1024)",
    )
    .execute(&pool)
    .await
    .unwrap_err();
    assert!(e.to_string().contains("sources_prefix_not_reserved"), "{e}");
}
