//! Deleting an endpoint or a consumer, and the controller's removal of a declaration,
//! cancel every open delivery of the endpoint while dispatchers write outcomes on the same
//! rows (issue 27). A transaction in the test plays the outcome batch and takes row locks
//! in a chosen order around the cancellation, so the deadlock that answered the DELETE
//! 503 happens on every run.

use crate::common;

use std::future::Future;
use std::time::Duration;

use axum::http::StatusCode;
use chrono::{TimeDelta, Utc};
use common::*;
use hookd::domain::DeliveryStatus;
use reqwest::Method;
use serde_json::json;
use sqlx::PgPool;
use uuid::Uuid;

const TENANT: &str = DEFAULT_TENANT;

/// Two deliveries of `endpoint` leased by a dispatcher (in flight), the first with the
/// lower id.
async fn two_in_flight(pool: &PgPool, endpoint: Uuid) -> (Uuid, Uuid) {
    let at = Utc::now() - TimeDelta::seconds(5);
    let mut ids = Vec::new();
    for s in [0, 1] {
        let d = delivery(
            pool,
            DeliveryOpts {
                tenant: TENANT.into(),
                endpoint: Some(endpoint),
                status: DeliveryStatus::InProgress,
                attempts: 1,
                created_at: at + TimeDelta::seconds(s),
                ..Default::default()
            },
        )
        .await;
        ids.push(d.id);
    }
    assert!(ids[0] < ids[1]);
    (ids[0], ids[1])
}

/// Runs `cancel` while a transaction of the test, playing an outcome batch, holds the
/// lock `first` takes, waits until `cancel` waits for a lock, then takes the lock `then`
/// takes (waiting, if it must, until `cancel` gives way) and commits. The test's
/// transaction never detects a deadlock itself (a long `deadlock_timeout`), so when the
/// two close a cycle the cancellation is the one rolled back, as the deletion was when it
/// waited longest under load.
async fn around<T: Send + 'static>(
    pool: &PgPool,
    first: &str,
    then: &str,
    cancel: impl Future<Output = T> + Send + 'static,
) -> T {
    let mut batch = pool.begin().await.unwrap();
    sqlx::query("SET LOCAL deadlock_timeout = '60s'")
        .execute(&mut *batch)
        .await
        .unwrap();
    let pid: i32 = sqlx::query_scalar("SELECT pg_backend_pid()")
        .fetch_one(&mut *batch)
        .await
        .unwrap();
    sqlx::query(sqlx::AssertSqlSafe(first.to_string()))
        .execute(&mut *batch)
        .await
        .unwrap();
    let cancelling = tokio::spawn(cancel);
    let waiting = wait_until(Duration::from_secs(30), || async {
        sqlx::query_scalar::<_, bool>(
            "SELECT EXISTS (SELECT 1 FROM pg_stat_activity
                            WHERE datname = current_database() AND pid <> $1
                              AND wait_event_type = 'Lock')",
        )
        .bind(pid)
        .fetch_one(pool)
        .await
        .unwrap()
    })
    .await;
    assert!(
        waiting,
        "the cancellation never waited for the batch's lock"
    );
    sqlx::query(sqlx::AssertSqlSafe(then.to_string()))
        .execute(&mut *batch)
        .await
        .unwrap();
    batch.commit().await.unwrap();
    tokio::time::timeout(Duration::from_secs(60), cancelling)
        .await
        .expect("the cancellation finishes once the batch committed")
        .unwrap()
}

fn lock_delivery(id: Uuid) -> String {
    format!("SELECT 1 FROM hookd.deliveries WHERE id = '{id}' FOR UPDATE")
}

async fn statuses(pool: &PgPool, endpoint: Uuid) -> Vec<String> {
    sqlx::query_scalar("SELECT status FROM hookd.deliveries WHERE endpoint_id = $1 ORDER BY id")
        .bind(endpoint)
        .fetch_all(pool)
        .await
        .unwrap()
}

async fn api_endpoint(api: &TestApi, consumer: Option<&str>) -> Uuid {
    let mut body = json!({"url": "http://127.0.0.1:9/hook"});
    if let Some(c) = consumer {
        body["consumer"] = json!(c);
    }
    let (s, v) = send(
        api.request_as(TENANT, Method::POST, "/v1/endpoints")
            .await
            .json(&body),
    )
    .await;
    assert_eq!(s, StatusCode::CREATED, "{v}");
    v["id"].as_str().unwrap().parse().unwrap()
}

/// DELETE `path`, ready to send.
async fn delete(api: &TestApi, path: &str) -> reqwest::RequestBuilder {
    api.request_as(TENANT, Method::DELETE, path).await
}

/// The batch locks the rows in the order opposite to the deletion's: a deadlock whatever
/// order the deletion takes them in. DELETE /v1/endpoints/{id} answered 503 ("nothing was
/// written, retry"); it now runs again once it was rolled back and answers 204, every
/// open delivery cancelled.
#[sqlx::test]
async fn endpoint_delete_survives_a_deadlock_with_an_outcome_batch(pool: PgPool) {
    let api = TestApi::start(&pool).await;
    let ep = api_endpoint(&api, None).await;
    let (low, high) = two_in_flight(&pool, ep).await;
    let deleting = send(delete(&api, &format!("/v1/endpoints/{ep}")).await);
    let (status, body) = around(&pool, &lock_delivery(high), &lock_delivery(low), deleting).await;
    assert_eq!(status, StatusCode::NO_CONTENT, "{body}");
    assert_eq!(statuses(&pool, ep).await, ["cancelled", "cancelled"]);
}

/// What an outcome batch takes, in its order: its delivery rows (by id), then a share lock
/// on the endpoint row (the foreign-key check of its dead-letter insert). The deletion
/// locked the endpoint row first and its deliveries after, so the two closed a cycle on
/// the first delivery; it now takes the deliveries first, in id order, and simply waits
/// for the batch.
#[sqlx::test]
async fn endpoint_delete_takes_rows_in_the_batch_order(pool: PgPool) {
    let api = TestApi::start(&pool).await;
    let ep = api_endpoint(&api, None).await;
    let (low, _) = two_in_flight(&pool, ep).await;
    let deleting = send(delete(&api, &format!("/v1/endpoints/{ep}")).await);
    let (status, body) = around(
        &pool,
        &lock_delivery(low),
        &format!("SELECT 1 FROM hookd.endpoints WHERE id = '{ep}' FOR KEY SHARE"),
        deleting,
    )
    .await;
    assert_eq!(status, StatusCode::NO_CONTENT, "{body}");
    assert_eq!(statuses(&pool, ep).await, ["cancelled", "cancelled"]);
}

/// A consumer's deletion while an outcome batch holds one of its deliveries: the deletion
/// cancels without waiting for locks (`SKIP LOCKED`), so it cannot deadlock, but the
/// delivery it skipped must be cancelled once free. Before, the deletion moved past the
/// endpoint and finished with that delivery open for good under a disabled endpoint.
#[sqlx::test]
async fn consumer_delete_cancels_what_an_outcome_batch_held(pool: PgPool) {
    let api = TestApi::start(&pool).await;
    let ep = api_endpoint(&api, Some("cust_9")).await;
    let (_low, high) = two_in_flight(&pool, ep).await;
    let mut batch = pool.begin().await.unwrap();
    sqlx::query(sqlx::AssertSqlSafe(lock_delivery(high)))
        .execute(&mut *batch)
        .await
        .unwrap();
    let (status, body) = send(delete(&api, "/v1/consumers/cust_9").await).await;
    assert!(status.is_success(), "{status} {body}");
    tokio::time::sleep(Duration::from_secs(1)).await;
    batch.commit().await.unwrap();
    let all_cancelled = wait_until(Duration::from_secs(30), || async {
        statuses(&pool, ep).await == ["cancelled", "cancelled"]
    })
    .await;
    assert!(all_cancelled, "{:?}", statuses(&pool, ep).await);
}

/// The controller's removal of a WebhookEndpoint (the finalizer's database step) under the
/// same deadlock.
#[sqlx::test]
async fn declared_endpoint_removal_survives_a_deadlock_with_an_outcome_batch(pool: PgPool) {
    let opts = EndpointOpts {
        tenant: Some(TENANT.into()),
        ..Default::default()
    };
    let (ns, name) = (opts.namespace.clone(), opts.name.clone());
    let ep = endpoint(&pool, opts).await;
    let (low, high) = two_in_flight(&pool, ep).await;
    let removing = {
        let pool = pool.clone();
        async move {
            let mut conn = pool.acquire().await.unwrap();
            hookd::k8s::sync::remove_endpoint(&mut conn, &ns, &name).await
        }
    };
    let removed = around(&pool, &lock_delivery(high), &lock_delivery(low), removing)
        .await
        .expect("removal succeeds");
    assert_eq!(removed, Some((ep, 2)));
    assert_eq!(statuses(&pool, ep).await, ["cancelled", "cancelled"]);
}
