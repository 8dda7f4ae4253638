//! W3C trace context (issue 34, item 5): a producer's `traceparent` and `tracestate` are
//! kept with the event and sent on with each delivery, from every door a producer uses
//! (a message, a batch, `hookd.enqueue` inside the producer's own transaction), through the
//! real API, a real dispatcher and a receiver that records what it got.

use crate::common;

use std::time::Duration;

use common::*;
use sqlx::PgPool;

const TRACEPARENT: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
const TRACESTATE: &str = "rojo=00f067aa0ba902b7,congo=t61rcWkgMzE";

/// The `traceparent` and `tracestate` each delivery of `event_type` carried, once all
/// `n` arrived.
async fn received(
    rx: &Receiver,
    event_type: &str,
    n: usize,
) -> Vec<(Option<String>, Option<String>)> {
    let of_type = || {
        rx.all()
            .into_iter()
            .filter(|r| r.event_type.as_deref() == Some(event_type))
            .collect::<Vec<_>>()
    };
    assert!(
        wait_until(Duration::from_secs(10), || async { of_type().len() >= n }).await,
        "{event_type}: {} of {n}",
        of_type().len()
    );
    of_type()
        .into_iter()
        .map(|r| {
            let h = |name: &str| r.headers.get(name).map(|v| v.to_str().unwrap().to_string());
            (h("traceparent"), h("tracestate"))
        })
        .collect()
}

#[sqlx::test]
async fn a_producers_trace_context_reaches_the_receiver_from_every_door(pool: PgPool) {
    let rx = Receiver::start(&[SECRET_A]).await;
    endpoint(
        &pool,
        EndpointOpts {
            url: rx.url("/hook"),
            ..Default::default()
        },
    )
    .await;
    let api = TestApi::start(&pool).await;
    let d = TestDispatcher::start(&pool, dispatch_settings()).await;
    let post = |path: &'static str, body: &'static str, traceparent: &'static str| {
        let api = &api;
        async move {
            let r = api
                .request_as("team-a", reqwest::Method::POST, path)
                .await
                .header("content-type", "application/json")
                .header("traceparent", traceparent)
                .header("tracestate", TRACESTATE)
                .body(body)
                .send()
                .await
                .unwrap();
            assert_eq!(r.status(), 201, "{}", r.text().await.unwrap());
        }
    };
    let traced = (Some(TRACEPARENT.to_string()), Some(TRACESTATE.to_string()));

    // a message
    post(
        "/v1/messages",
        r#"{"tenant":"team-a","eventType":"trace.single","payload":{}}"#,
        TRACEPARENT,
    )
    .await;
    assert_eq!(received(&rx, "trace.single", 1).await, vec![traced.clone()]);

    // a batch: the request's context for every message
    post(
        "/v1/messages/batch",
        r#"{"messages":[{"tenant":"team-a","eventType":"trace.batch","payload":1},{"tenant":"team-a","eventType":"trace.batch","payload":2}]}"#,
        TRACEPARENT,
    )
    .await;
    assert_eq!(
        received(&rx, "trace.batch", 2).await,
        [traced.clone(), traced.clone()]
    );

    // a malformed traceparent is ignored, not refused (upper-case hex, an all-zero trace
    // id): the event is taken and sent without a context, tracestate included
    post(
        "/v1/messages",
        r#"{"tenant":"team-a","eventType":"trace.bad","payload":{}}"#,
        "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
    )
    .await;
    post(
        "/v1/messages",
        r#"{"tenant":"team-a","eventType":"trace.bad","payload":{}}"#,
        "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
    )
    .await;
    assert_eq!(
        received(&rx, "trace.bad", 2).await,
        [(None, None), (None, None)]
    );

    // hookd.enqueue inside the producer's transaction: the context from its settings
    let mut tx = pool.begin().await.unwrap();
    sqlx::query("SELECT set_config('hookd.traceparent', $1, true), set_config('hookd.tracestate', $2, true)")
        .bind(TRACEPARENT)
        .bind(TRACESTATE)
        .execute(&mut *tx)
        .await
        .unwrap();
    sqlx::query("SELECT hookd.enqueue('team-a', 'trace.sql', '{}')")
        .execute(&mut *tx)
        .await
        .unwrap();
    tx.commit().await.unwrap();
    // and without one, or with a malformed one
    sqlx::query("SELECT hookd.enqueue('team-a', 'trace.sql.none', '{}')")
        .execute(&pool)
        .await
        .unwrap();
    let mut tx = pool.begin().await.unwrap();
    sqlx::query("SET LOCAL hookd.traceparent = 'not-a-traceparent'")
        .execute(&mut *tx)
        .await
        .unwrap();
    sqlx::query("SELECT hookd.enqueue('team-a', 'trace.sql.none', '{}')")
        .execute(&mut *tx)
        .await
        .unwrap();
    tx.commit().await.unwrap();
    assert_eq!(received(&rx, "trace.sql", 1).await, [traced]);
    assert_eq!(
        received(&rx, "trace.sql.none", 2).await,
        [(None, None), (None, None)]
    );
    d.stop().await;
}
