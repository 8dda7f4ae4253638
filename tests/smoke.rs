use crate::common;

use std::time::Duration;

use common::*;
use sqlx::PgPool;

/// The whole path: endpoint declared, event enqueued over HTTP, delivered signed.
#[sqlx::test]
async fn event_is_delivered_signed(pool: PgPool) {
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
    let (_, deliveries) = api
        .enqueue(
            "team-a",
            "invoice.paid",
            r#"{"b": 1, "a":12345678901234567890123}"#,
        )
        .await;
    assert_eq!(deliveries.len(), 1);
    assert!(wait_until(Duration::from_secs(10), || async { rx.count() == 1 }).await);
    let got = rx.all().remove(0);
    assert_eq!(got.webhook_id, deliveries[0].to_string());
    assert_eq!(
        got.idempotency_key.as_deref(),
        Some(got.webhook_id.as_str())
    );
    assert_eq!(&got.body[..], br#"{"b": 1, "a":12345678901234567890123}"#);
    assert_eq!(got.verified_by, vec![true]);
    assert!(
        wait_until(Duration::from_secs(5), || async {
            delivery_status(&pool, deliveries[0]).await.0 == "succeeded"
        })
        .await
    );
    d.stop().await;
}
