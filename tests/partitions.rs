//! Partition upkeep never stops the hot path (issue 27 items 3, 6 and 8; DESIGN.md
//! invariant 10): creating history days waits for no producer's open transaction and
//! makes no enqueue wait; a lock wait that times out in ingest is retried, never an
//! internal error; a message listing filtered by delivery status reads about what it
//! returns. Lock waits are read from `pg_stat_activity`, never from wall-clock timing.

use crate::common;

use std::collections::HashSet;
use std::time::Duration;

use chrono::{DateTime, Utc};
use common::*;
use hookd::db::{self, Audience, events::EventQuery};
use hookd::domain::DeliveryStatus;
use hookd::metrics::Metrics;
use hookd::notify::Notifier;
use hookd::outbox::{NewMessage, Outbox, OutboxConfig};
use sqlx::PgPool;
use uuid::Uuid;

async fn ep(pool: &PgPool, tenant: &str) -> Uuid {
    endpoint(
        pool,
        EndpointOpts {
            tenant: Some(tenant.into()),
            url: "http://127.0.0.1:9/unused".into(),
            ..Default::default()
        },
    )
    .await
}

/// Backends of this database waiting for a heavyweight lock right now: (pid, start of
/// the statement, its text).
async fn lock_waits(pool: &PgPool) -> Vec<(i32, DateTime<Utc>, String)> {
    sqlx::query_as(
        "SELECT pid, query_start, query FROM pg_stat_activity
         WHERE datname = current_database() AND pid <> pg_backend_pid()
           AND wait_event_type = 'Lock'",
    )
    .fetch_all(pool)
    .await
    .unwrap()
}

async fn relation_exists(pool: &PgPool, name: &str) -> bool {
    sqlx::query_scalar("SELECT to_regclass($1) IS NOT NULL")
        .bind(name)
        .fetch_one(pool)
        .await
        .unwrap()
}

/// A producer's transaction that called `hookd.enqueue` (and repeated a key, which reads
/// the deliveries) stays open while history days are created and another producer
/// enqueues: nobody waits for a lock at any moment, the days are created, and the other
/// enqueue commits. Before migration 0016 the creation waited for the producer's lock on
/// `hookd.events` (the cloned foreign keys) and the other enqueue queued behind it.
#[sqlx::test]
async fn creating_days_waits_for_no_producer_and_stops_no_enqueue(pool: PgPool) {
    ep(&pool, "prod").await;
    let mut producer = pool.begin().await.unwrap();
    for _ in 0..2 {
        sqlx::query("SELECT hookd.enqueue('prod', 'order.paid', '{}', 'held-key')")
            .execute(&mut *producer)
            .await
            .unwrap();
    }

    let ahead = 20;
    let create = tokio::spawn({
        let pool = pool.clone();
        async move {
            let mut conn = pool.acquire().await.unwrap();
            db::retention::ensure_history_days(&mut conn, ahead).await
        }
    });
    let other = tokio::spawn({
        let pool = pool.clone();
        async move {
            sqlx::query_scalar::<_, Uuid>("SELECT hookd.enqueue('prod', 'order.paid', '{}')")
                .fetch_one(&pool)
                .await
        }
    });
    let mut waits = Vec::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while !(create.is_finished() && other.is_finished()) {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the creation and the other enqueue finish"
        );
        waits.extend(lock_waits(&pool).await);
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert!(
        waits.is_empty(),
        "nobody waits for a lock while a day is created next to an open producer: {waits:?}"
    );
    assert_eq!(create.await.unwrap().unwrap(), ahead + 1);
    other.await.unwrap().unwrap();
    let last = (Utc::now() + chrono::TimeDelta::days(i64::from(ahead))).format("%Y%m%d");
    for t in ["delivery_history", "delivery_attempts", "dead_letters"] {
        assert!(relation_exists(&pool, &format!("hookd.{t}_{last}")).await);
    }
    producer.commit().await.unwrap();

    // no default partition: attaching a day would lock it and read it
    let defaults: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM pg_partitioned_table WHERE partdefid <> 0
           AND partrelid::regclass::text LIKE 'hookd.%'",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(defaults, 0);
}

/// A lock wait in ingest that outlasts the transaction's lock timeout (here a table lock
/// held by someone else for longer than a group's 2 s bound) is retried: the message is
/// committed once the lock is gone, not answered as an internal error.
#[sqlx::test]
async fn a_lock_timeout_in_ingest_is_retried(pool: PgPool) {
    ep(&pool, "busy").await;
    let outbox = Outbox::start(
        pool.clone(),
        OutboxConfig::defaults(),
        Notifier::disabled(),
        Metrics::new(),
    );
    let mut holder = pool.begin().await.unwrap();
    sqlx::query("LOCK TABLE hookd.events IN SHARE MODE")
        .execute(&mut *holder)
        .await
        .unwrap();
    let enqueue = tokio::spawn(async move {
        outbox
            .enqueue(vec![NewMessage {
                tenant: "busy".into(),
                event_type: "order.paid".into(),
                payload: "{}".into(),
                idempotency_key: None,
                consumer: None,
                origin: None,
                trace: None,
                ordering_key: None,
            }])
            .await
    });
    // Two distinct waits for the lock: the first timed out and was tried again (or the
    // enqueue finished, which it may only do once the lock is released).
    let mut seen = HashSet::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while seen.len() < 2 && !enqueue.is_finished() {
        assert!(tokio::time::Instant::now() < deadline, "{seen:?}");
        for (pid, start, query) in lock_waits(&pool).await {
            if query.contains("hookd.events") {
                seen.insert((pid, start));
            }
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    holder.commit().await.unwrap();
    let result = enqueue.await.unwrap();
    let done = result.expect("a lock timeout is retried, not an error");
    assert!(done[0].created);
    assert!(seen.len() >= 2, "the first attempt timed out: {seen:?}");
}

/// A tenant with 30,000 messages, 5 of them with a dead delivery: listing by status
/// `dead` reads the deliveries' status index, not every event (before: 30,000 events
/// walked and filtered for 5 rows).
#[sqlx::test]
async fn listing_by_status_reads_what_it_returns(pool: PgPool) {
    let e = ep(&pool, "list").await;
    bulk_events(&pool, "list", 30_000).await;
    sqlx::query(
        "INSERT INTO hookd.deliveries (id, event_id, endpoint_id, tenant, status, attempts, completed_at)
         SELECT hookd.uuid_v7(), e.id, $1, 'list',
                CASE WHEN e.rn % 6000 = 0 THEN 'dead' ELSE 'succeeded' END, 1, now()
         FROM (SELECT id, row_number() OVER () AS rn FROM hookd.events) e",
    )
    .bind(e)
    .execute(&pool)
    .await
    .unwrap();
    sqlx::query("ANALYZE hookd.deliveries, hookd.events")
        .execute(&pool)
        .await
        .unwrap();
    let q = EventQuery {
        audience: Audience::tenant(Some("list")),
        status: Some(DeliveryStatus::Dead),
        limit: 10,
        ..Default::default()
    };
    let page = db::events::list(&pool, &q).await.unwrap();
    assert_eq!(page.len(), 5);
    assert!(page.windows(2).all(|w| w[0].id > w[1].id), "newest first");
    assert!(page.iter().all(|m| m.dead == 1 && m.total == 1));

    let plan = db::events::explain_list(&pool, &q).await.unwrap();
    let text = plan.join("\n");
    assert!(
        !text.contains("Seq Scan on events") && !text.contains("Backward using events_"),
        "no walk of the events: {text}"
    );
    // the statement's own buffers (the first `Buffers:` line is the top node's)
    let buffers: i64 = plan
        .iter()
        .find_map(|l| l.trim().strip_prefix("Buffers: shared "))
        .map(|b| {
            b.split(' ')
                .filter_map(|kv| kv.split_once('='))
                .map(|(_, n)| n.parse::<i64>().unwrap())
                .sum()
        })
        .unwrap();
    assert!(buffers <= 1_000, "{buffers} buffers for 5 rows:\n{text}");
    let removed: i64 = plan
        .iter()
        .filter_map(|l| l.split("Rows Removed by Filter: ").nth(1))
        .map(|n| n.trim().parse::<i64>().unwrap())
        .sum();
    assert!(
        removed <= 50,
        "a listing of 5 rows filters {removed} rows:\n{text}"
    );
    // and a page further on (the cursor) starts where the last one ended
    let rest = db::events::list(
        &pool,
        &EventQuery {
            before: Some(page[1].id),
            ..q.clone()
        },
    )
    .await
    .unwrap();
    assert_eq!(
        rest.iter().map(|m| m.id).collect::<Vec<_>>(),
        page[2..].iter().map(|m| m.id).collect::<Vec<_>>()
    );
}

/// A tenant with 30,000 produced messages and 5 an inbound source took: listing the
/// source's events walks `events_source_page` for what it returns (issue 33's console
/// page), and the filters it cannot serve with it are refused.
#[sqlx::test]
async fn listing_by_source_reads_what_it_returns(pool: PgPool) {
    bulk_events(&pool, "list", 30_000).await;
    sqlx::query(
        "INSERT INTO hookd.events (id, tenant, event_type, payload, request_hash, source, source_event_id)
         SELECT hookd.uuid_v7(), 'list', 'stripe.invoice.paid', '{}', '\\x00'::bytea, 'stripe', 'evt_' || n
         FROM generate_series(1, 5) n",
    )
    .execute(&pool)
    .await
    .unwrap();
    bulk_events(&pool, "list", 30_000).await;
    sqlx::query("ANALYZE hookd.events")
        .execute(&pool)
        .await
        .unwrap();
    let q = EventQuery {
        audience: Audience::tenant(Some("list")),
        source: Some("stripe"),
        limit: 10,
        ..Default::default()
    };
    let page = db::events::list(&pool, &q).await.unwrap();
    assert_eq!(page.len(), 5);
    assert!(page.iter().all(|m| {
        m.source.as_deref() == Some("stripe")
            && m.source_event_id
                .as_deref()
                .is_some_and(|id| id.starts_with("evt_"))
    }));
    let text = db::events::explain_list(&pool, &q)
        .await
        .unwrap()
        .join("\n");
    assert!(text.contains("events_source_page"), "{text}");
    assert!(!text.contains("Seq Scan on events"), "{text}");
    let removed: i64 = text
        .lines()
        .filter_map(|l| l.split("Rows Removed by Filter: ").nth(1))
        .map(|n| n.trim().parse::<i64>().unwrap())
        .sum();
    assert!(
        removed <= 10,
        "a listing of 5 rows filters {removed}:\n{text}"
    );
    for refused in [
        EventQuery {
            event_type: Some("stripe.invoice.paid"),
            ..q.clone()
        },
        EventQuery {
            status: Some(DeliveryStatus::Dead),
            ..q.clone()
        },
        EventQuery {
            consumer: Some("cust_1"),
            ..q.clone()
        },
        EventQuery {
            audience: Audience::tenant(None),
            ..q.clone()
        },
    ] {
        assert!(!db::events::source_served(&refused), "{refused:?}");
    }
    assert!(db::events::source_served(&q));
}

/// The history has no foreign keys (migration 0016); deleting an endpoint by hand still
/// takes its history with it, as the cascade did, and its open deliveries too.
#[sqlx::test]
async fn deleting_an_endpoint_takes_its_history_along(pool: PgPool) {
    let e = ep(&pool, "gone").await;
    let done = delivery(
        &pool,
        DeliveryOpts {
            endpoint: Some(e),
            tenant: "gone".into(),
            status: DeliveryStatus::Succeeded,
            attempts: 1,
            ..Default::default()
        },
    )
    .await;
    let open = delivery(
        &pool,
        DeliveryOpts {
            endpoint: Some(e),
            tenant: "gone".into(),
            ..Default::default()
        },
    )
    .await;
    sqlx::query("DELETE FROM hookd.endpoints WHERE id = $1")
        .bind(e)
        .execute(&pool)
        .await
        .unwrap();
    let left: i64 = sqlx::query_scalar("SELECT count(*) FROM hookd.deliveries WHERE id = ANY($1)")
        .bind(vec![done.id, open.id])
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(left, 0);
}
