//! Traces over OTLP (issue 34, item 5): a real `hookd dev` process given the standard
//! `OTEL_EXPORTER_OTLP_ENDPOINT` exports its spans to a local OTLP/HTTP collector in this
//! test, in the producer's trace, and the receiver's `traceparent` names hookd's send span.

use crate::common;
use crate::common::browser::Hookd;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Bytes;
use common::*;
use hookd::auth::Scope;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use prost::Message as _;
use reqwest::Method;
use serde_json::json;
use sqlx::PgPool;

const SECRET: &str = "whsec_aGVyZS1pcy1hLXRyYWNpbmctdGVzdC1zZWNyZXQtb2YtMzI=";
const TRACE_ID: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const PRODUCER_SPAN: &str = "00f067aa0ba902b7";

/// A span as the collector got it: (service, name, trace id, span id, parent span id).
type Got = (String, String, String, String, String);

/// An OTLP/HTTP collector on 127.0.0.1 (`POST /v1/traces`, protobuf) that keeps what it gets.
async fn collector() -> (String, Arc<Mutex<Vec<Got>>>) {
    let got: Arc<Mutex<Vec<Got>>> = Arc::default();
    let keep = got.clone();
    let app = axum::Router::new().route(
        "/v1/traces",
        axum::routing::post(move |body: Bytes| {
            let keep = keep.clone();
            async move {
                let req = ExportTraceServiceRequest::decode(body).expect("OTLP protobuf");
                let hex = |b: &[u8]| b.iter().map(|x| format!("{x:02x}")).collect::<String>();
                for rs in req.resource_spans {
                    let service = rs
                        .resource
                        .iter()
                        .flat_map(|r| r.attributes.iter())
                        .find(|a| a.key == "service.name")
                        .and_then(|a| a.value.as_ref())
                        .map(|v| format!("{:?}", v.value))
                        .unwrap_or_default();
                    for ss in rs.scope_spans {
                        for s in ss.spans {
                            keep.lock().unwrap().push((
                                service.clone(),
                                s.name,
                                hex(&s.trace_id),
                                hex(&s.span_id),
                                hex(&s.parent_span_id),
                            ));
                        }
                    }
                }
                (
                    [("content-type", "application/x-protobuf")],
                    Vec::<u8>::new(),
                )
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (format!("http://{addr}"), got)
}

#[sqlx::test]
async fn spans_are_exported_over_otlp_in_the_producers_trace(pool: PgPool) {
    init();
    let (endpoint, got) = collector().await;
    let hookd = Hookd::start(
        &pool,
        &[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint.as_str()),
            ("OTEL_BSP_SCHEDULE_DELAY", "100"),
        ],
    )
    .await;
    let token = mint_token(&pool, "team-a", &[Scope::Produce, Scope::Manage]).await;
    let rx = Receiver::start(&[SECRET]).await;
    let (status, v) = hookd
        .call(
            &token,
            Method::POST,
            "/v1/endpoints",
            Some(json!({"url": rx.url("/traced"), "eventTypes": ["order.*"], "secret": SECRET})),
        )
        .await;
    assert_eq!(status, 201, "{v}");
    let r = reqwest::Client::new()
        .post(format!("{}/v1/messages", hookd.base))
        .bearer_auth(&token)
        .header("content-type", "application/json")
        .header("traceparent", format!("00-{TRACE_ID}-{PRODUCER_SPAN}-01"))
        .body(r#"{"eventType":"order.paid","payload":{"order":"o_1"}}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 201);
    assert!(wait_until(Duration::from_secs(10), || async { rx.count() == 1 }).await);
    let delivered = rx.all().remove(0);
    assert_eq!(delivered.verified_by, [true]);
    let traceparent = delivered.headers["traceparent"]
        .to_str()
        .unwrap()
        .to_string();
    let parts: Vec<&str> = traceparent.split('-').collect();
    assert_eq!(
        parts[1], TRACE_ID,
        "the receiver is in the producer's trace"
    );
    let send_span = parts[2].to_string();
    assert_ne!(send_span, PRODUCER_SPAN, "its parent is hookd's send span");

    let named = |name: &str| {
        got.lock()
            .unwrap()
            .iter()
            .filter(|s| s.1 == name)
            .cloned()
            .collect::<Vec<_>>()
    };
    assert!(
        wait_until(Duration::from_secs(20), || async {
            ["hookd.ingest", "hookd.claim", "hookd.send", "hookd.outcome"]
                .iter()
                .all(|n| !named(n).is_empty())
        })
        .await,
        "spans: {:?}; hookd log:\n{}",
        got.lock().unwrap(),
        hookd.log()
    );
    let ingest = named("hookd.ingest").remove(0);
    assert!(ingest.0.contains("hookd-dev"), "service.name: {}", ingest.0);
    assert_eq!(ingest.2, TRACE_ID);
    assert_eq!(ingest.4, PRODUCER_SPAN, "ingest is the producer's child");
    let send = named("hookd.send")
        .into_iter()
        .find(|s| s.3 == send_span)
        .expect("the span the receiver was told of");
    assert_eq!(send.2, TRACE_ID);
    assert_eq!(send.4, ingest.3, "send is the ingest's child");
}
