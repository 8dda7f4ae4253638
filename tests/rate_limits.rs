//! Rate limits per endpoint (issue 34): the receiver of a limited endpoint never sees more
//! than its limit, whichever of several dispatcher processes sends; deliveries held back
//! are not attempts; other endpoints are not slowed; every door sets the limit.

use crate::common;

use std::time::{Duration, Instant};

use axum::http::{Method, StatusCode};
use common::*;
use hookd::endpoints::RateLimit;
use serde_json::json;
use sqlx::PgPool;

const TENANT: &str = "limited";
const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";

fn spawn_dispatcher(database_url: &str) -> HookdProcess {
    HookdCommand::new(["dispatch"])
        .env("DATABASE_URL", database_url)
        .test_key()
        .env("HOOKD_ALLOWED_DESTINATIONS", "127.0.0.0/8")
        .listen(free_port())
        .env("HOOKD_CONCURRENCY", "32")
        .env("HOOKD_POLL_MS", "50")
        .env("HOOKD_LOG", "warn")
        .spawn()
}

/// The most arrivals in any window of `width` starting at an arrival.
fn most_in_any_window(at: &[Instant], width: Duration) -> usize {
    let mut at = at.to_vec();
    at.sort();
    (0..at.len())
        .map(|i| at[i..].iter().take_while(|t| **t - at[i] < width).count())
        .max()
        .unwrap_or(0)
}

/// 4 dispatcher processes, one endpoint limited to 20 a second with a burst of 5: over any
/// second the receiver sees at most 25 (the burst, then the rate), and the 120 deliveries
/// take at least (120 - 5) / 20 s. An unlimited endpoint of the same tenant, its 120
/// deliveries enqueued at the same time, is done long before. Each limited delivery was
/// attempted once: those held back were never leased. Fails without the limit (the 4
/// dispatchers send the 120 at once).
#[sqlx::test]
async fn four_dispatchers_keep_one_endpoint_under_its_limit(pool: PgPool) {
    init();
    let limited_rx = Receiver::start(&[SECRET]).await;
    let free_rx = Receiver::start(&[SECRET]).await;
    let (per_second, burst) = (20.0, 5);
    let limited = endpoint(
        &pool,
        EndpointOpts {
            tenant: Some(TENANT.into()),
            url: limited_rx.url("/limited"),
            event_types: vec!["slow.*".into()],
            secret: SECRET.into(),
            rate_limit: Some(RateLimit {
                per_second,
                burst: Some(burst),
            }),
            ..Default::default()
        },
    )
    .await;
    endpoint(
        &pool,
        EndpointOpts {
            tenant: Some(TENANT.into()),
            url: free_rx.url("/free"),
            event_types: vec!["fast.*".into()],
            secret: SECRET.into(),
            ..Default::default()
        },
    )
    .await;
    let n = 120usize;
    sqlx::query(
        "SELECT hookd.enqueue($1, t, '{\"n\":' || g || '}')
         FROM generate_series(1, $2) g, unnest(ARRAY['slow.x', 'fast.x']) t",
    )
    .bind(TENANT)
    .bind(n as i32)
    .execute(&pool)
    .await
    .unwrap();

    let url = database_url(&pool);
    let started = Instant::now();
    let dispatchers: Vec<HookdProcess> = (0..4).map(|_| spawn_dispatcher(&url)).collect();
    assert!(
        wait_until(Duration::from_secs(10), || async { free_rx.count() >= n }).await,
        "the unlimited endpoint is not held back: {} of {n}",
        free_rx.count()
    );
    let free_done = started.elapsed();
    assert!(
        wait_until(Duration::from_secs(40), || async {
            limited_rx.count() >= n
        })
        .await,
        "the limited endpoint is served: {} of {n}",
        limited_rx.count()
    );
    let arrivals: Vec<Instant> = limited_rx.all().iter().map(|r| r.at).collect();
    let first = *arrivals.iter().min().unwrap();
    let last = *arrivals.iter().max().unwrap();
    let span = last - first;
    let most = most_in_any_window(&arrivals, Duration::from_secs(1));
    println!(
        "limited: {n} in {span:?}, at most {most} in any second; unlimited: {n} in {free_done:?}"
    );
    // The burst, then the rate: at most 25 leases in any second. The receiver counts
    // arrivals, which a loaded 2-core machine can delay after their lease and so bunch:
    // 250 ms of such delay (5 more) is allowed. 100 ms was not enough for a CI run with
    // the suite beside it (29 arrivals in one second, stop 50); alone, 25-27. The 4
    // dispatchers unlimited send 120 in well under a second, and the span below still
    // holds the average to the rate.
    assert!(
        most <= (per_second as usize) + burst as usize + (per_second / 4.0) as usize,
        "{most} deliveries within one second (limit {per_second}/s, burst {burst})"
    );
    let least = Duration::from_secs_f64((n - burst as usize) as f64 / per_second);
    assert!(
        span >= least.mul_f64(0.95),
        "{n} deliveries in {span:?}, faster than the limit allows ({least:?})"
    );
    assert!(
        free_done < span,
        "the unlimited endpoint ({free_done:?}) waited on the limited one ({span:?})"
    );
    let attempts: Vec<i32> =
        sqlx::query_scalar("SELECT DISTINCT attempts FROM hookd.deliveries WHERE endpoint_id = $1")
            .bind(limited)
            .fetch_all(&pool)
            .await
            .unwrap();
    assert_eq!(attempts, vec![1], "held-back deliveries are not attempts");
    for mut d in dispatchers {
        d.kill();
    }
}

/// The endpoints API (and so the portal, which is a consumer token on it) sets, shows,
/// changes and removes a rate limit; every bad value is a 422 naming the field.
#[sqlx::test]
async fn the_api_sets_shows_changes_and_removes_a_rate_limit(pool: PgPool) {
    let api = TestApi::start(&pool).await;
    let token = api.token_for(TENANT).await;
    let (s, ep) = call(
        &api,
        &token,
        Method::POST,
        "/v1/endpoints",
        Some(
            json!({"url": "https://example.com/hook", "consumer": "cust_1",
                    "rateLimit": {"perSecond": 2.5}}),
        ),
    )
    .await;
    assert_eq!(s, StatusCode::CREATED, "{ep}");
    assert_eq!(
        ep["rateLimit"],
        json!({"perSecond": 2.5, "burst": 3}),
        "the burst defaults to perSecond rounded up"
    );
    let (s, t) = call(
        &api,
        &token,
        Method::POST,
        "/v1/consumers/cust_1/tokens",
        Some(json!({"ttlSeconds": 600})),
    )
    .await;
    assert_eq!(s, StatusCode::CREATED, "{t}");
    let consumer_token = t["token"].as_str().unwrap().to_string();
    let path = format!("/v1/endpoints/{}", ep["id"].as_str().unwrap());
    let (s, v) = call(&api, &consumer_token, Method::GET, &path, None).await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(v["rateLimit"], json!({"perSecond": 2.5, "burst": 3}));

    let (s, v) = call(
        &api,
        &consumer_token,
        Method::PATCH,
        &path,
        Some(json!({"rateLimit": {"perSecond": 100, "burst": 10}})),
    )
    .await;
    assert_eq!(s, StatusCode::OK, "{v}");
    assert_eq!(v["rateLimit"], json!({"perSecond": 100.0, "burst": 10}));
    // a PATCH of another field keeps it
    let (s, v) = call(
        &api,
        &token,
        Method::PATCH,
        &path,
        Some(json!({"description": "x"})),
    )
    .await;
    assert_eq!(s, StatusCode::OK, "{v}");
    assert_eq!(v["rateLimit"]["burst"], 10);

    for (bad, field) in [
        (json!({"perSecond": 0}), "rateLimit.perSecond"),
        (json!({"perSecond": 0.001}), "rateLimit.perSecond"),
        (json!({"perSecond": 1e6}), "rateLimit.perSecond"),
        (json!({"perSecond": 10, "burst": 0}), "rateLimit.burst"),
        (json!({"perSecond": 10, "burst": 100001}), "rateLimit.burst"),
        (
            json!({"perSecond": 1000, "burst": 1}),
            "at least perSecond / 20",
        ),
        (json!({"perSecond": 10, "brust": 3}), "brust"),
        (json!({"burst": 3}), "perSecond"),
        (json!("10/s"), "RateLimit"),
    ] {
        for (method, p, body) in [
            (Method::PATCH, path.as_str(), json!({ "rateLimit": bad })),
            (
                Method::POST,
                "/v1/endpoints",
                json!({"url": "https://example.com/h", "consumer": "cust_1", "rateLimit": bad}),
            ),
        ] {
            let (s, v) = call(&api, &token, method.clone(), p, Some(body)).await;
            assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY, "{method} {bad}: {v}");
            assert!(
                v["error"]["message"]
                    .as_str()
                    .unwrap_or_default()
                    .contains(field),
                "{method} {bad}: {v}"
            );
        }
    }
    let (_, v) = call(&api, &token, Method::GET, &path, None).await;
    assert_eq!(
        v["rateLimit"]["burst"], 10,
        "a refused change wrote nothing"
    );

    let (s, v) = call(
        &api,
        &consumer_token,
        Method::PATCH,
        &path,
        Some(json!({"rateLimit": null})),
    )
    .await;
    assert_eq!(s, StatusCode::OK, "{v}");
    assert_eq!(v["rateLimit"], serde_json::Value::Null);
}

/// A limit set while the bucket was empty (its entry held) takes effect at once: a
/// removed limit releases the hold, so the backlog is sent without waiting out the old
/// limit's pace.
#[sqlx::test]
async fn removing_a_limit_releases_what_it_held(pool: PgPool) {
    init();
    let rx = Receiver::start(&[SECRET]).await;
    let id = endpoint(
        &pool,
        EndpointOpts {
            tenant: Some(TENANT.into()),
            url: rx.url("/slow"),
            secret: SECRET.into(),
            rate_limit: Some(RateLimit {
                per_second: 0.2,
                burst: Some(1),
            }),
            ..Default::default()
        },
    )
    .await;
    sqlx::query("SELECT hookd.enqueue($1, 'a.b', '{}') FROM generate_series(1, 10)")
        .bind(TENANT)
        .execute(&pool)
        .await
        .unwrap();
    let d = TestDispatcher::start(&pool, dispatch_settings()).await;
    assert!(wait_until(Duration::from_secs(5), || async { rx.count() >= 1 }).await);
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(rx.count(), 1, "one every five seconds");
    // the declaration drops the limit (the controller's and `hookd apply`'s path)
    endpoint(
        &pool,
        EndpointOpts {
            tenant: Some(TENANT.into()),
            url: rx.url("/slow"),
            secret: SECRET.into(),
            ..endpoint_opts_named(&pool, id).await
        },
    )
    .await;
    assert!(
        wait_until(Duration::from_secs(3), || async { rx.count() >= 10 }).await,
        "the backlog is sent once the limit is gone: {}",
        rx.count()
    );
    d.stop().await;
}

/// The options that name the declaration of endpoint `id` (its namespace and name).
async fn endpoint_opts_named(pool: &PgPool, id: uuid::Uuid) -> EndpointOpts {
    let (namespace, name): (String, String) =
        sqlx::query_as("SELECT k8s_namespace, k8s_name FROM hookd.endpoints WHERE id = $1")
            .bind(id)
            .fetch_one(pool)
            .await
            .unwrap();
    EndpointOpts {
        namespace,
        name,
        ..Default::default()
    }
}

/// The README's rate-limit block, run as written with `API`, `TOKEN` and `ENDPOINT` set as
/// the guide sets them.
#[sqlx::test]
async fn the_readmes_rate_limit_block_works_as_written(pool: PgPool) {
    let api = TestApi::start(&pool).await;
    let token = api.token_for(TENANT).await;
    let (s, ep) = call(
        &api,
        &token,
        Method::POST,
        "/v1/endpoints",
        Some(json!({"url": "https://example.com/cust_42", "consumer": "cust_42"})),
    )
    .await;
    assert_eq!(s, StatusCode::CREATED, "{ep}");
    let id = ep["id"].as_str().unwrap();
    let stdout = run_readme_block("tests/rate_limits.rs", &api, &token, Some(id)).await;
    let answer: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(answer["rateLimit"], json!({"perSecond": 5.0, "burst": 10}));
}

/// A claim whose clock is behind the bucket's (it waited for the endpoint's row behind a
/// later claim) takes what is left without moving the bucket's time back: were it moved
/// back, the next claim would refill the time between twice. Claims with fixed clocks
/// stand in for the two replicas' order.
#[sqlx::test]
async fn a_claim_behind_the_buckets_clock_does_not_refill_it_twice(pool: PgPool) {
    use hookd::db::deliveries::claim;
    init();
    let id = endpoint(
        &pool,
        EndpointOpts {
            tenant: Some(TENANT.into()),
            rate_limit: Some(RateLimit {
                per_second: 10.0,
                burst: Some(10),
            }),
            ..Default::default()
        },
    )
    .await;
    sqlx::query("SELECT hookd.enqueue($1, 'a.b', '{}') FROM generate_series(1, 50)")
        .bind(TENANT)
        .execute(&pool)
        .await
        .unwrap();
    let base = chrono::Utc::now() + chrono::Duration::seconds(10);
    let at = |ms: i64, limit: i64| {
        claim_req(
            uuid::Uuid::now_v7(),
            limit,
            Some(base + chrono::Duration::milliseconds(ms)),
        )
    };
    assert_eq!(claim(&pool, &at(1000, 3)).await.unwrap().len(), 3);
    // behind by a second: 7 tokens left, takes 3 (4 left), the bucket's time stays
    assert_eq!(claim(&pool, &at(0, 3)).await.unwrap().len(), 3);
    // 100 ms after the first: 4 + 1 token, not 4 + 11 (capped at 10)
    let third = claim(&pool, &at(1100, 100)).await.unwrap();
    assert_eq!(third.len(), 5, "refilled once");
    assert!(third.iter().all(|c| c.endpoint_id == id));
}

/// A claim never waits for a rate-limited endpoint's row or queue entry that someone else
/// holds (an outcome batch, another claim, an operator's transaction): it passes that
/// endpoint over and serves the others. Found by the hostile review: one transaction
/// holding a limited endpoint's entry for 5 s stalled every dispatcher for every tenant.
#[sqlx::test]
async fn a_claim_passes_over_a_limited_endpoint_someone_holds(pool: PgPool) {
    use hookd::db::deliveries::claim;
    init();
    let limited = endpoint(
        &pool,
        EndpointOpts {
            tenant: Some(TENANT.into()),
            event_types: vec!["slow.*".into()],
            rate_limit: Some(RateLimit {
                per_second: 1.0,
                burst: Some(1),
            }),
            ..Default::default()
        },
    )
    .await;
    let other = endpoint(
        &pool,
        EndpointOpts {
            tenant: Some("other".into()),
            ..Default::default()
        },
    )
    .await;
    sqlx::query(
        "SELECT hookd.enqueue($1, 'slow.x', '{}'), hookd.enqueue('other', 'a.b', '{}')
         FROM generate_series(1, 3)",
    )
    .bind(TENANT)
    .execute(&pool)
    .await
    .unwrap();
    let req = || claim_req(uuid::Uuid::now_v7(), 100, None);
    // the first claim takes the limited endpoint's one token: its bucket is empty, so the
    // claim also moves its queue entry's hold
    for (what, lock) in [
        (
            "its endpoint row",
            "SELECT 1 FROM hookd.endpoints WHERE id = $1 FOR NO KEY UPDATE",
        ),
        (
            "its queue entry",
            "SELECT 1 FROM hookd.endpoint_queue WHERE endpoint_id = $1 FOR UPDATE",
        ),
    ] {
        // a full bucket again, and the entry due
        sqlx::query(
            "UPDATE hookd.endpoints SET rate_tokens = NULL, rate_at = NULL, rate_wait_until = NULL
             WHERE id = $1",
        )
        .bind(limited)
        .execute(&pool)
        .await
        .unwrap();
        sqlx::query("UPDATE hookd.deliveries SET status = 'pending', visible_at = now() WHERE status = 'in_progress'")
            .execute(&pool)
            .await
            .unwrap();
        // the wake-ups those writes left are folded first: the fold waits for a locked
        // endpoint row by design (it must read a state change that has not committed)
        hookd::db::deliveries::fold_wakeups(&pool).await.unwrap();
        let mut holder = pool.begin().await.unwrap();
        sqlx::query(lock)
            .bind(limited)
            .fetch_optional(&mut *holder)
            .await
            .unwrap();
        let got = tokio::time::timeout(Duration::from_secs(3), claim(&pool, &req()))
            .await
            .unwrap_or_else(|_| panic!("a claim waited for {what}"))
            .unwrap();
        assert!(
            got.iter().any(|c| c.endpoint_id == other),
            "{what}: the other tenant is served"
        );
        holder.rollback().await.unwrap();
    }
}

/// The same limit sent again (the portal's Save with nothing changed) keeps the bucket: a
/// customer cannot refill it at will. A changed limit starts full.
#[sqlx::test]
async fn the_same_limit_sent_again_keeps_the_bucket(pool: PgPool) {
    use hookd::db::deliveries::claim;
    init();
    let api = TestApi::start(&pool).await;
    let token = api.token_for(TENANT).await;
    let (s, ep) = call(
        &api,
        &token,
        Method::POST,
        "/v1/endpoints",
        Some(json!({"url": "https://example.com/h", "rateLimit": {"perSecond": 0.01}})),
    )
    .await;
    assert_eq!(s, StatusCode::CREATED, "{ep}");
    let path = format!("/v1/endpoints/{}", ep["id"].as_str().unwrap());
    sqlx::query("SELECT hookd.enqueue($1, 'a.b', '{}') FROM generate_series(1, 5)")
        .bind(TENANT)
        .execute(&pool)
        .await
        .unwrap();
    let req = || claim_req(uuid::Uuid::now_v7(), 100, None);
    let claimed = |pool: PgPool| async move {
        hookd::db::deliveries::fold_wakeups(&pool).await.unwrap();
        // the hold aside: only the bucket decides
        sqlx::query("UPDATE hookd.endpoint_queue SET hold_until = NULL")
            .execute(&pool)
            .await
            .unwrap();
        claim(&pool, &req()).await.unwrap().len()
    };
    assert_eq!(claimed(pool.clone()).await, 1, "a full bucket of one");
    for _ in 0..3 {
        let (s, v) = call(
            &api,
            &token,
            Method::PATCH,
            &path,
            Some(json!({"rateLimit": {"perSecond": 0.01}})),
        )
        .await;
        assert_eq!(s, StatusCode::OK, "{v}");
        assert_eq!(
            claimed(pool.clone()).await,
            0,
            "the same limit refilled nothing"
        );
    }
    let (s, v) = call(
        &api,
        &token,
        Method::PATCH,
        &path,
        Some(json!({"rateLimit": {"perSecond": 0.02}})),
    )
    .await;
    assert_eq!(s, StatusCode::OK, "{v}");
    assert_eq!(
        claimed(pool.clone()).await,
        1,
        "a changed limit starts full"
    );
}
