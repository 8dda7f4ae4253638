//! Ordered delivery per key (issue 34, item 1): for one (endpoint, orderingKey), deliveries
//! are sent one at a time, in the order their events committed, the next only once the one
//! before succeeded, was cancelled or was dead-lettered (`onDeadLetter` says whether a dead
//! letter stops the key). Across dispatcher processes, SIGKILL, retries and replays; keys
//! do not wait for one another and deliveries without a key are not held.

use crate::common;

use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use common::*;
use serde_json::json;
use sqlx::PgPool;
use tokio_util::sync::DropGuard;
use uuid::Uuid;

const TENANT: &str = "ordered";
const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";

/// One request as the order-checking receiver saw it.
#[derive(Debug, Clone)]
struct Arrival {
    endpoint: String,
    key: String,
    n: u64,
    answered: u16,
}

#[derive(Default)]
struct OrderState {
    arrivals: Vec<Arrival>,
    /// requests open right now per (endpoint, key)
    open: HashMap<(String, String), usize>,
    /// the most requests of one (endpoint, key) ever open at once
    most_open: usize,
    /// (endpoint, key, n) answered 500 on their first arrival only
    fail_once: HashSet<(String, String, u64)>,
    /// keys answered 500 every time
    fail_always: HashSet<String>,
}

#[derive(Clone)]
struct OrderShared {
    state: Arc<Mutex<OrderState>>,
    delay: Duration,
    /// every `fail_every`-th request (by arrival number) is answered 500; 0: never
    fail_every: u64,
    count: Arc<AtomicU64>,
    in_flight: Arc<AtomicU64>,
}

/// A receiver that checks order: payloads are `{"k": key, "n": n}` with n counting up from
/// 1 per key in enqueue order. It records every arrival and how many requests of one
/// (endpoint, key) were ever open at once.
struct OrderReceiver {
    addr: SocketAddr,
    shared: OrderShared,
    _stop: DropGuard,
}

impl OrderReceiver {
    async fn start(delay: Duration, fail_every: u64) -> OrderReceiver {
        let shared = OrderShared {
            state: Arc::default(),
            delay,
            fail_every,
            count: Arc::default(),
            in_flight: Arc::default(),
        };
        let app = axum::Router::new()
            .route("/{endpoint}", axum::routing::post(order_receive))
            .with_state(shared.clone());
        let (addr, stop) = serve_local(app).await;
        OrderReceiver {
            addr,
            shared,
            _stop: stop.drop_guard(),
        }
    }

    fn url(&self, endpoint: &str) -> String {
        format!("http://{}/{endpoint}", self.addr)
    }

    fn arrivals(&self) -> Vec<Arrival> {
        self.shared.state.lock().unwrap().arrivals.clone()
    }

    fn most_open(&self) -> usize {
        self.shared.state.lock().unwrap().most_open
    }

    fn fail_once(&self, endpoint: &str, key: &str, n: u64) {
        self.shared
            .state
            .lock()
            .unwrap()
            .fail_once
            .insert((endpoint.into(), key.into(), n));
    }

    fn fail_always(&self, key: &str, on: bool) {
        let mut st = self.shared.state.lock().unwrap();
        if on {
            st.fail_always.insert(key.into());
        } else {
            st.fail_always.remove(key);
        }
    }

    /// The n of each 2xx-answered arrival of (endpoint, key), in arrival order.
    fn delivered(&self, endpoint: &str, key: &str) -> Vec<u64> {
        self.arrivals()
            .iter()
            .filter(|a| a.endpoint == endpoint && a.key == key && a.answered == 200)
            .map(|a| a.n)
            .collect()
    }

    /// Waits up to 15 s until (endpoint, key) has been delivered exactly `want` (the n of
    /// each 2xx answer, in arrival order); panics with every arrival otherwise.
    async fn await_delivered(&self, endpoint: &str, key: &str, want: &[u64]) {
        let got = wait_until(Duration::from_secs(15), || async {
            self.delivered(endpoint, key) == want
        })
        .await;
        assert!(got, "{endpoint}/{key}: {:?}", self.arrivals());
    }
}

/// A producer's open transaction that enqueued event `n` of `key` through `hookd.enqueue`,
/// and so holds the key's line until it ends.
async fn producer_holding(
    pool: &PgPool,
    key: &str,
    n: u64,
) -> sqlx::Transaction<'static, sqlx::Postgres> {
    let mut tx = pool.begin().await.unwrap();
    sqlx::query(
        "SELECT hookd.enqueue($1, 'order.updated', json_build_object('k', $2::text, 'n', $3::bigint)::text,
                              NULL, NULL, $2)",
    )
    .bind(TENANT)
    .bind(key)
    .bind(n as i64)
    .execute(&mut *tx)
    .await
    .unwrap();
    tx
}

struct OpenGuard {
    state: Arc<Mutex<OrderState>>,
    in_flight: Arc<AtomicU64>,
    slot: (String, String),
}

impl Drop for OpenGuard {
    fn drop(&mut self) {
        self.in_flight.fetch_sub(1, Ordering::SeqCst);
        if let Some(n) = self.state.lock().unwrap().open.get_mut(&self.slot) {
            *n -= 1;
        }
    }
}

async fn order_receive(
    State(sh): State<OrderShared>,
    Path(endpoint): Path<String>,
    body: Bytes,
) -> StatusCode {
    let v: serde_json::Value = serde_json::from_slice(&body).unwrap_or_default();
    let key = v["k"].as_str().unwrap_or("").to_string();
    let n = v["n"].as_u64().unwrap_or(0);
    let slot = (endpoint.clone(), key.clone());
    sh.in_flight.fetch_add(1, Ordering::SeqCst);
    {
        let mut st = sh.state.lock().unwrap();
        let open = st.open.entry(slot.clone()).or_default();
        *open += 1;
        let open = *open;
        // only the lines of endpoints that order by key ("plain" does not; "" is no key)
        if !key.is_empty() && endpoint != "plain" {
            st.most_open = st.most_open.max(open);
        }
    }
    let _guard = OpenGuard {
        state: sh.state.clone(),
        in_flight: sh.in_flight.clone(),
        slot,
    };
    if !sh.delay.is_zero() {
        tokio::time::sleep(sh.delay).await;
    }
    let nth = sh.count.fetch_add(1, Ordering::SeqCst) + 1;
    let mut st = sh.state.lock().unwrap();
    let failing = st.fail_always.contains(&key)
        || st.fail_once.remove(&(endpoint.clone(), key.clone(), n))
        || (sh.fail_every > 0 && nth.is_multiple_of(sh.fail_every));
    let answered = if failing { 500 } else { 200 };
    st.arrivals.push(Arrival {
        endpoint,
        key,
        n,
        answered,
    });
    StatusCode::from_u16(answered).unwrap()
}

/// The line of one key as the receiver saw it is in order: every arrival (2xx or not) has
/// an n no smaller than the one before (a retry repeats its n, a resend after a kill too),
/// and the 2xx-answered ones, repeats folded, are exactly 1..=last.
fn assert_in_order(arrivals: &[Arrival], endpoint: &str, key: &str, last: u64) {
    let mine: Vec<&Arrival> = arrivals
        .iter()
        .filter(|a| a.endpoint == endpoint && a.key == key)
        .collect();
    for w in mine.windows(2) {
        assert!(
            w[1].n >= w[0].n,
            "{endpoint}/{key}: {} arrived after {}: {:?}",
            w[1].n,
            w[0].n,
            mine.iter().map(|a| (a.n, a.answered)).collect::<Vec<_>>()
        );
    }
    let mut ok: Vec<u64> = mine
        .iter()
        .filter(|a| a.answered == 200)
        .map(|a| a.n)
        .collect();
    ok.dedup();
    assert_eq!(ok, (1..=last).collect::<Vec<_>>(), "{endpoint}/{key}");
}

async fn ordered_endpoint(
    pool: &PgPool,
    url: String,
    on_dead_letter: hookd::endpoints::OnDeadLetter,
    max_attempts: Option<u32>,
) -> Uuid {
    endpoint(
        pool,
        EndpointOpts {
            tenant: Some(TENANT.into()),
            url,
            event_types: vec!["order.*".into()],
            secret: SECRET.into(),
            ordering: Some(hookd::endpoints::DeliveryOrder::PerKey),
            on_dead_letter: Some(on_dead_letter),
            max_attempts,
            ..Default::default()
        },
    )
    .await
}

fn spawn_dispatcher(database_url: &str) -> HookdProcess {
    HookdCommand::new(["dispatch"])
        .env("DATABASE_URL", database_url)
        .test_key()
        .env("HOOKD_ALLOWED_DESTINATIONS", "127.0.0.0/8")
        .listen(free_port())
        .env("HOOKD_LEASE_SECS", "4")
        .env("HOOKD_REQUEST_TIMEOUT_SECS", "2")
        .env("HOOKD_CONCURRENCY", "64")
        // enough retries that every 7th request failing never exhausts one
        .env("HOOKD_RETRY_SCHEDULE", "1,1,1,1,1,1,1,1,1,1")
        .env("HOOKD_RETRY_JITTER", "0")
        .env("HOOKD_POLL_MS", "100")
        .env("HOOKD_LOG", "warn")
        .spawn()
}

/// Enqueues `per_key` events for each key through `hookd.enqueue` with an ordering key,
/// the keys interleaved (key 0 #1, key 1 #1, ..., key 0 #2, ...), one transaction per
/// round of keys, so one statement never holds all of a key.
async fn enqueue_keyed(pool: &PgPool, keys: usize, per_key: u64) {
    for n in 1..=per_key {
        sqlx::query(
            "SELECT hookd.enqueue($1, 'order.updated', json_build_object('k', 'key-' || k, 'n', $2::bigint)::text,
                                  NULL, NULL, 'key-' || k)
             FROM generate_series(0, $3 - 1) k",
        )
        .bind(TENANT)
        .bind(n as i64)
        .bind(keys as i32)
        .execute(pool)
        .await
        .unwrap();
    }
}

async fn count_status(pool: &PgPool, status: &str) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM hookd.deliveries WHERE status = $1")
        .bind(status)
        .fetch_one(pool)
        .await
        .unwrap()
}

/// Three `hookd dispatch` processes, two endpoints that order by key (20 keys x 12 events
/// each) and one that does not, a receiver that answers every 7th request 500 and takes
/// 30 ms per request; one dispatcher is SIGKILLed twice while it holds leases and the
/// receiver has requests open. Every key's line arrives in order at both ordered endpoints
/// (never two requests of one key open at once), the unordered endpoint gets everything,
/// and unkeyed deliveries to the ordered endpoints are not held behind the keys.
#[sqlx::test]
async fn keys_arrive_in_commit_order_across_dispatchers_retries_and_kills(pool: PgPool) {
    init();
    let started = Instant::now();
    let rx = OrderReceiver::start(Duration::from_millis(30), 7).await;
    use hookd::endpoints::OnDeadLetter::Continue;
    ordered_endpoint(&pool, rx.url("a"), Continue, None).await;
    ordered_endpoint(&pool, rx.url("b"), Continue, None).await;
    endpoint(
        &pool,
        EndpointOpts {
            tenant: Some(TENANT.into()),
            url: rx.url("plain"),
            event_types: vec!["order.*".into()],
            secret: SECRET.into(),
            ..Default::default()
        },
    )
    .await;
    let (keys, per_key) = (20usize, 12u64);
    enqueue_keyed(&pool, keys, per_key).await;
    // deliveries without a key, to every endpoint: never held behind a key's line
    sqlx::query(
        "SELECT hookd.enqueue($1, 'order.note', json_build_object('k', '', 'n', g)::text)
         FROM generate_series(1, 30) g",
    )
    .bind(TENANT)
    .execute(&pool)
    .await
    .unwrap();
    let waiting: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM hookd.deliveries WHERE visible_at = hookd.ordering_waiting()",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    // all but the first of each key, at each of the two ordered endpoints
    assert_eq!(waiting, 2 * keys as i64 * (per_key as i64 - 1));

    let url = database_url(&pool);
    let mut procs: Vec<HookdProcess> = (0..3).map(|_| spawn_dispatcher(&url)).collect();
    let mut dead: Vec<Uuid> = Vec::new();
    for kill in 1..=2 {
        let at_kill = Arc::new(Mutex::new((0i64, 0u64, Vec::new())));
        let ready = wait_until(Duration::from_secs(20), || {
            let (pool, dead, at_kill, rx) = (&pool, &dead, at_kill.clone(), &rx);
            async move {
                let open = rx.shared.in_flight.load(Ordering::SeqCst);
                if open == 0 {
                    return false;
                }
                let holders: Vec<(Uuid, i64)> = sqlx::query_as(
                    "SELECT locked_by, count(*) FROM hookd.deliveries
                     WHERE status = 'in_progress' AND visible_at > now() AND locked_by <> ALL($1)
                       AND ordering_key IS NOT NULL
                     GROUP BY locked_by",
                )
                .bind(dead)
                .fetch_all(pool)
                .await
                .unwrap();
                let leased = holders.iter().map(|h| h.1).sum();
                *at_kill.lock().unwrap() =
                    (leased, open, holders.into_iter().map(|h| h.0).collect());
                leased > 0
            }
        })
        .await;
        let (leased, open, holders) = at_kill.lock().unwrap().clone();
        assert!(ready, "kill {kill}: nothing in flight to kill into");
        // every dispatcher at once, mid-line: the keys' heads are leased by dead
        // processes, and nobody may send what waits behind them
        for p in &mut procs {
            p.kill();
        }
        println!("kill {kill}: {leased} keyed rows leased, {open} requests open at the receiver");
        dead.extend(holders);
        procs = (0..3).map(|_| spawn_dispatcher(&url)).collect();
    }

    let total = 3 * keys as i64 * per_key as i64 + 3 * 30;
    let done = wait_until(Duration::from_secs(90), || async {
        count_status(&pool, "succeeded").await == total
    })
    .await;
    let arrivals = rx.arrivals();
    if !done {
        // what is left, one line each
        let left: Vec<String> = sqlx::query_scalar(
            "SELECT concat_ws(' ', e.url, d.status, d.ordering_key, d.visible_at, d.attempts)
             FROM hookd.deliveries d
             JOIN hookd.endpoints e ON e.id = d.endpoint_id WHERE d.status <> 'succeeded'
             ORDER BY e.url, d.ordering_key, d.ordering_seq",
        )
        .fetch_all(&pool)
        .await
        .unwrap();
        let advances: i64 = sqlx::query_scalar("SELECT count(*) FROM hookd.ordering_advances")
            .fetch_one(&pool)
            .await
            .unwrap();
        panic!(
            "{} of {total} succeeded; {} arrivals; {advances} advances left; not done: {left:#?}",
            count_status(&pool, "succeeded").await,
            arrivals.len()
        );
    }
    for endpoint in ["a", "b"] {
        for k in 0..keys {
            assert_in_order(&arrivals, endpoint, &format!("key-{k}"), per_key);
        }
    }
    assert_eq!(
        rx.most_open(),
        1,
        "two requests of one key were open at once"
    );
    let mut plain: Vec<u64> = rx
        .arrivals()
        .iter()
        .filter(|a| a.endpoint == "plain" && a.answered == 200 && !a.key.is_empty())
        .map(|a| a.n)
        .collect();
    plain.sort();
    plain.dedup();
    assert_eq!(plain, (1..=per_key).collect::<Vec<_>>());
    let retried = arrivals.iter().filter(|a| a.answered == 500).count();
    assert!(
        retried > 0,
        "no retry happened: the test proves less than it says"
    );
    println!(
        "{} arrivals ({retried} answered 500) in {:?}",
        arrivals.len(),
        started.elapsed()
    );
}

/// An endpoint made through the API that orders by key, and its id.
async fn api_endpoint(
    api: &TestApi,
    name: &str,
    rx: &OrderReceiver,
    extra: serde_json::Value,
) -> Uuid {
    let mut body = json!({
        "tenant": TENANT,
        "url": rx.url(name),
        "eventTypes": ["order.*"],
        "ordering": "perKey",
    });
    for (k, v) in extra.as_object().unwrap() {
        body[k] = v.clone();
    }
    let (status, v) = api.post("/v1/endpoints", &body.to_string()).await;
    assert_eq!(status, StatusCode::CREATED, "{v}");
    assert_eq!(v["ordering"], body["ordering"], "{v}");
    v["id"].as_str().unwrap().parse().unwrap()
}

/// PATCH /v1/endpoints/{id} as the tenant: (status, body).
async fn patch_endpoint(
    api: &TestApi,
    id: Uuid,
    body: serde_json::Value,
) -> (StatusCode, serde_json::Value) {
    let path = format!("/v1/endpoints/{id}");
    send(
        api.request_as(TENANT, reqwest::Method::PATCH, &path)
            .await
            .json(&body),
    )
    .await
}

/// Enqueues one message through the API; returns its (eventId, deliveryIds).
async fn post_keyed(api: &TestApi, key: Option<&str>, n: u64) -> (Uuid, Vec<Uuid>) {
    let mut body = json!({
        "tenant": TENANT,
        "eventType": "order.updated",
        "payload": {"k": key.unwrap_or(""), "n": n},
    });
    if let Some(k) = key {
        body["orderingKey"] = json!(k);
    }
    let (status, v) = api.post("/v1/messages", &body.to_string()).await;
    assert_eq!(status, StatusCode::CREATED, "{v}");
    ids(&v)
}

/// A key whose head keeps failing holds that key only: the other key's line and the
/// unkeyed deliveries of the same endpoint are sent meanwhile. The held deliveries are
/// pending with no next attempt time (the API shows they wait in line) and were never
/// attempted; once the head succeeds, the rest follow in order.
#[sqlx::test]
async fn a_failing_head_holds_only_its_own_key(pool: PgPool) {
    let rx = OrderReceiver::start(Duration::ZERO, 0).await;
    let api = TestApi::start(&pool).await;
    api_endpoint(&api, "e", &rx, json!({})).await;
    rx.fail_always("stuck", true);
    let mut stuck = Vec::new();
    for n in 1..=3 {
        stuck.push(post_keyed(&api, Some("stuck"), n).await);
        post_keyed(&api, Some("free"), n).await;
        post_keyed(&api, None, n).await;
    }
    let d = TestDispatcher::start(&pool, dispatch_settings()).await;
    assert!(
        wait_until(Duration::from_secs(15), || async {
            rx.delivered("e", "free") == vec![1, 2, 3] && rx.delivered("e", "").len() == 3
        })
        .await,
        "{:?}",
        rx.arrivals()
    );
    // the head has been tried (and failed) at least once meanwhile
    assert!(
        wait_until(Duration::from_secs(10), || async {
            rx.arrivals().iter().filter(|a| a.key == "stuck").count() >= 2
        })
        .await
    );
    assert!(
        rx.arrivals()
            .iter()
            .filter(|a| a.key == "stuck")
            .all(|a| a.n == 1)
    );
    for (event, _) in &stuck[1..] {
        let (status, m) = api.get_as(TENANT, &format!("/v1/messages/{event}")).await;
        assert_eq!(status, StatusCode::OK);
        assert_eq!(m["orderingKey"], "stuck", "{m}");
        let dl = &m["deliveries"][0];
        assert_eq!(dl["status"], "pending", "{m}");
        assert_eq!(dl["attempts"], 0, "{m}");
        assert!(
            dl["nextAttemptAt"].is_null(),
            "waiting in line has no time: {m}"
        );
    }
    rx.fail_always("stuck", false);
    rx.await_delivered("e", "stuck", &[1, 2, 3]).await;
    assert_in_order(&rx.arrivals(), "e", "stuck", 3);
    d.stop().await;
}

/// After a dead letter, `continue` sends the key's next delivery and `hold` stops the key
/// until the dead one is replayed; the replay is sent first, then the rest in order.
/// Switching a held endpoint to `continue` lets a held key move on.
#[sqlx::test]
async fn dead_letters_continue_or_hold_the_key_and_a_replay_releases_it(pool: PgPool) {
    let rx = OrderReceiver::start(Duration::ZERO, 0).await;
    let api = TestApi::start(&pool).await;
    let cont = api_endpoint(&api, "cont", &rx, json!({})).await;
    let hold = api_endpoint(&api, "hold", &rx, json!({"onDeadLetter": "hold"})).await;
    // one attempt each, so the first failure is a dead letter
    sqlx::query("UPDATE hookd.endpoints SET max_attempts = 1 WHERE id = ANY($1)")
        .bind(vec![cont, hold])
        .execute(&pool)
        .await
        .unwrap();
    rx.fail_once("cont", "k", 1);
    rx.fail_once("hold", "k", 1);
    let mut events = Vec::new();
    for n in 1..=3 {
        events.push(post_keyed(&api, Some("k"), n).await);
    }
    let d = TestDispatcher::start(&pool, dispatch_settings()).await;
    rx.await_delivered("cont", "k", &[2, 3]).await;
    // the held line: its head died, and nothing behind it moves (give it the time the
    // continuing endpoint needed, twice over)
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let hold_seen: Vec<u64> = rx
        .arrivals()
        .iter()
        .filter(|a| a.endpoint == "hold")
        .map(|a| a.n)
        .collect();
    assert_eq!(hold_seen, vec![1], "{:?}", rx.arrivals());
    let held: i64 =
        sqlx::query_scalar("SELECT count(*) FROM hookd.ordering_holds WHERE endpoint_id = $1")
            .bind(hold)
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(held, 1);
    // replay the dead one: it goes first, then the two behind it
    let dead: Uuid = sqlx::query_scalar(
        "SELECT id FROM hookd.deliveries WHERE endpoint_id = $1 AND status = 'dead'",
    )
    .bind(hold)
    .fetch_one(&pool)
    .await
    .unwrap();
    let (status, v) = api
        .post_as(TENANT, &format!("/v1/deliveries/{dead}/replay"), "")
        .await;
    assert!(status.is_success(), "{status} {v}");
    rx.await_delivered("hold", "k", &[1, 2, 3]).await;
    assert_in_order(&rx.arrivals(), "hold", "k", 3);

    // held again by a new dead letter; the endpoint switched to `continue` lets it go
    rx.fail_once("hold", "k2", 1);
    post_keyed(&api, Some("k2"), 1).await;
    post_keyed(&api, Some("k2"), 2).await;
    assert!(
        wait_until(Duration::from_secs(15), || async {
            sqlx::query_scalar::<_, i64>(
                "SELECT count(*) FROM hookd.ordering_holds WHERE ordering_key = 'k2'",
            )
            .fetch_one(&pool)
            .await
            .unwrap()
                == 1
        })
        .await
    );
    let (status, v) = patch_endpoint(&api, hold, json!({"onDeadLetter": "continue"})).await;
    assert_eq!(status, StatusCode::OK, "{v}");
    assert_eq!(v["onDeadLetter"], "continue");
    rx.await_delivered("hold", "k2", &[2]).await;
    d.stop().await;
}

/// A producer's own transaction that enqueued with a key (hookd.enqueue) holds that key's
/// line until it commits: an API message with the same key waits for it and is sent after
/// it, whatever order they arrived in; a message with another key is taken at once; and one
/// that waits longer than the bound is answered 409 `ordering_key_in_use`, nothing written.
#[sqlx::test]
async fn a_producer_transaction_holds_its_key_and_nothing_else(pool: PgPool) {
    let rx = OrderReceiver::start(Duration::ZERO, 0).await;
    let api = TestApi::start(&pool).await;
    api_endpoint(&api, "e", &rx, json!({})).await;
    let producer = producer_holding(&pool, "k", 1).await;
    let api = Arc::new(api);
    let same = {
        let api = api.clone();
        tokio::spawn(async move { post_keyed(&api, Some("k"), 2).await })
    };
    // another key goes through at once, while the producer holds "k"
    let t = Instant::now();
    post_keyed(&api, Some("other"), 1).await;
    assert!(t.elapsed() < Duration::from_secs(2), "{:?}", t.elapsed());
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        !same.is_finished(),
        "the same key did not wait for the producer"
    );
    producer.commit().await.unwrap();
    same.await.unwrap();
    let d = TestDispatcher::start(&pool, dispatch_settings()).await;
    rx.await_delivered("e", "k", &[1, 2]).await;
    d.stop().await;

    // held past the bound: 409, and nothing of that message written
    let producer = producer_holding(&pool, "k", 3).await;
    let before: i64 = sqlx::query_scalar("SELECT count(*) FROM hookd.events")
        .fetch_one(&pool)
        .await
        .unwrap();
    let (status, v) = api
        .post(
            "/v1/messages",
            &json!({"tenant": TENANT, "eventType": "order.updated", "payload": {"k": "k", "n": 4}, "orderingKey": "k"})
                .to_string(),
        )
        .await;
    assert_eq!(status, StatusCode::CONFLICT, "{v}");
    assert_eq!(v["error"]["code"], "ordering_key_in_use", "{v}");
    let after: i64 = sqlx::query_scalar("SELECT count(*) FROM hookd.events")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(before, after);
    producer.rollback().await.unwrap();
}

/// Every door refuses what it cannot order by, with a 422 naming the field, and writes
/// nothing; what it takes it shows back.
#[sqlx::test]
async fn bad_ordering_values_are_refused_at_every_door(pool: PgPool) {
    let rx = OrderReceiver::start(Duration::ZERO, 0).await;
    let api = TestApi::start(&pool).await;
    let id = api_endpoint(&api, "e", &rx, json!({"onDeadLetter": "hold"})).await;
    let (_, v) = api.get_as(TENANT, &format!("/v1/endpoints/{id}")).await;
    assert_eq!(
        (v["ordering"].as_str(), v["onDeadLetter"].as_str()),
        (Some("perKey"), Some("hold")),
        "{v}"
    );
    for bad in [
        json!(""),
        json!("x".repeat(257)),
        json!("a\u{1}b"),
        json!(7),
    ] {
        let body = json!({"tenant": TENANT, "eventType": "order.updated", "payload": {}, "orderingKey": bad});
        let (status, v) = api.post("/v1/messages", &body.to_string()).await;
        assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{bad}: {v}");
        if bad.is_string() {
            assert_eq!(v["error"]["code"], "invalid_ordering_key", "{v}");
            assert!(
                v["error"]["message"]
                    .as_str()
                    .unwrap()
                    .contains("orderingKey"),
                "{v}"
            );
        }
    }
    // 256 characters of two bytes each is a key
    let (event, deliveries) = {
        let body = json!({"tenant": TENANT, "eventType": "order.updated", "payload": {}, "orderingKey": "é".repeat(256)});
        let (status, v) = api.post("/v1/messages", &body.to_string()).await;
        assert_eq!(status, StatusCode::CREATED, "{v}");
        ids(&v)
    };
    assert_eq!(deliveries.len(), 1);
    let (_, m) = api.get_as(TENANT, &format!("/v1/messages/{event}")).await;
    assert_eq!(m["orderingKey"], "é".repeat(256));
    for (field, bad) in [
        ("ordering", json!("sorted")),
        ("onDeadLetter", json!("retry")),
        ("ordering", json!(null)),
    ] {
        let (status, v) = patch_endpoint(&api, id, json!({ field: bad })).await;
        assert_eq!(
            status,
            StatusCode::UNPROCESSABLE_ENTITY,
            "{field}={bad}: {v}"
        );
        // names the field, or the value it refused and the ones it takes
        let msg = v["error"]["message"].as_str().unwrap();
        assert!(
            msg.contains(field) || bad.as_str().is_some_and(|b| msg.contains(b)),
            "{v}"
        );
    }
    let body = json!({"tenant": TENANT, "url": rx.url("x"), "eventTypes": ["order.*"], "ordering": "PerKey"});
    let (status, v) = api.post("/v1/endpoints", &body.to_string()).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{v}");
    // the same idempotency key with another ordering key is other content
    let with = |key: &str| {
        json!({"tenant": TENANT, "eventType": "order.updated", "payload": {}, "orderingKey": key, "idempotencyKey": "idem-1"}).to_string()
    };
    assert_eq!(
        api.post("/v1/messages", &with("a")).await.0,
        StatusCode::CREATED
    );
    assert_eq!(api.post("/v1/messages", &with("a")).await.0, StatusCode::OK);
    let (status, v) = api.post("/v1/messages", &with("b")).await;
    assert_eq!(
        v["error"]["code"], "idempotency_key_conflict",
        "{status} {v}"
    );
    // hookd.enqueue refuses the same values
    for bad in ["", &"x".repeat(257), "a\u{1}b"] {
        let e = sqlx::query("SELECT hookd.enqueue($1, 'order.updated', '{}', NULL, NULL, $2)")
            .bind(TENANT)
            .bind(bad)
            .execute(&pool)
            .await
            .unwrap_err();
        assert_eq!(
            e.as_database_error().and_then(|d| d.code()).as_deref(),
            Some("22023"),
            "{e}"
        );
    }
}

/// Replaying a key's delivered messages sends them again in their order, one at a time,
/// whatever order the replay took them in; an endpoint switched to `ordering: none` lets
/// everything waiting in its lines go at once.
#[sqlx::test]
async fn replays_keep_the_order_and_turning_ordering_off_releases_the_lines(pool: PgPool) {
    let rx = OrderReceiver::start(Duration::from_millis(20), 0).await;
    let api = TestApi::start(&pool).await;
    let id = api_endpoint(&api, "e", &rx, json!({})).await;
    for n in 1..=4 {
        post_keyed(&api, Some("k"), n).await;
    }
    let d = TestDispatcher::start(&pool, dispatch_settings()).await;
    rx.await_delivered("e", "k", &[1, 2, 3, 4]).await;
    d.stop().await;
    let (status, v) = api
        .post_as(
            TENANT,
            &format!("/v1/endpoints/{id}/replay"),
            "{\"statuses\":[\"succeeded\"]}",
        )
        .await;
    assert!(status.is_success(), "{status} {v}");
    let waiting: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM hookd.deliveries WHERE visible_at = hookd.ordering_waiting()",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(
        waiting, 4,
        "a replayed line waits for the line mover to let its first go"
    );
    let d = TestDispatcher::start(&pool, dispatch_settings()).await;
    assert!(
        wait_until(Duration::from_secs(15), || async {
            rx.delivered("e", "k") == vec![1, 2, 3, 4, 1, 2, 3, 4]
        })
        .await,
        "{:?}",
        rx.delivered("e", "k")
    );
    assert_eq!(rx.most_open(), 1);
    d.stop().await;

    // a line of 3 waiting behind a stuck head; ordering off releases all of them
    rx.fail_always("j", true);
    for n in 1..=4 {
        post_keyed(&api, Some("j"), n).await;
    }
    let (status, v) = patch_endpoint(&api, id, json!({"ordering": "none"})).await;
    assert_eq!(status, StatusCode::OK, "{v}");
    assert_eq!(v["ordering"], "none");
    let waiting: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM hookd.deliveries WHERE visible_at = hookd.ordering_waiting()",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(waiting, 0);
    rx.fail_always("j", false);
    let d = TestDispatcher::start(&pool, dispatch_settings()).await;
    assert!(
        wait_until(Duration::from_secs(15), || async {
            let mut got = rx.delivered("e", "j");
            got.sort();
            got == vec![1, 2, 3, 4]
        })
        .await
    );
    d.stop().await;
}

/// The README's ordering block, run as written with `API`, `TOKEN` and `ENDPOINT` set as the
/// guide sets them: the three messages reach the endpoint in order.
#[sqlx::test]
async fn the_readmes_ordering_block_works_as_written(pool: PgPool) {
    let rx = Receiver::start(&[]).await;
    let api = TestApi::start(&pool).await;
    let tenant = "default";
    let token = api.token_for(tenant).await;
    let (s, ep) = call(
        &api,
        &token,
        reqwest::Method::POST,
        "/v1/endpoints",
        Some(json!({"url": rx.url("/cust_42"), "consumer": "cust_42"})),
    )
    .await;
    assert_eq!(s, StatusCode::CREATED, "{ep}");
    let id = ep["id"].as_str().unwrap();
    let stdout = run_readme_block("tests/ordering.rs", &api, &token, Some(id)).await;
    assert!(stdout.contains(r#""ordering":"perKey""#), "{stdout}");
    assert_eq!(stdout.matches(r#""eventId""#).count(), 3, "{stdout}");
    let waiting: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM hookd.deliveries WHERE visible_at = hookd.ordering_waiting()",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(waiting, 2, "the second and third wait behind the first");
    let d = TestDispatcher::start(&pool, dispatch_settings()).await;
    assert!(wait_until(Duration::from_secs(15), || async { rx.count() == 3 }).await);
    let types: Vec<String> = rx.all().into_iter().filter_map(|r| r.event_type).collect();
    assert_eq!(types, ["order.created", "order.paid", "order.shipped"]);
    d.stop().await;
}

/// Two line movers never move one line at once. A mover that promoted a key's next
/// delivery and has not committed yet holds the line; a second one, run meanwhile for the same key
/// (here after a replay put an earlier delivery of the key back in line), must not promote
/// that earlier one too: it would be a second delivery of the key on its way. Failed
/// before the line lock: the second mover saw the line free in its snapshot and promoted
/// the replayed delivery beside the first one's.
#[sqlx::test]
async fn two_movers_never_move_one_line_at_once(pool: PgPool) {
    init();
    let rx = OrderReceiver::start(Duration::ZERO, 0).await;
    let ep = ordered_endpoint(
        &pool,
        rx.url("e"),
        hookd::endpoints::OnDeadLetter::Continue,
        None,
    )
    .await;
    enqueue_keyed(&pool, 1, 3).await;
    let line = |n: i64| {
        let pool = pool.clone();
        async move {
            sqlx::query_scalar::<_, Uuid>(
                "SELECT d.id FROM hookd.deliveries d JOIN hookd.events e ON e.id = d.event_id
                 WHERE d.endpoint_id = $1 AND (e.payload::json->>'n')::int = $2",
            )
            .bind(ep)
            .bind(n)
            .fetch_one(&pool)
            .await
            .unwrap()
        }
    };
    let (first, _second) = (line(1).await, line(2).await);
    // the first is sent and succeeds (as a dispatcher's claim and outcome would leave it)
    sqlx::query(
        "UPDATE hookd.deliveries SET status = 'succeeded', completed_at = now(), attempts = 1
         WHERE id = $1",
    )
    .bind(first)
    .execute(&pool)
    .await
    .unwrap();
    // mover 1 moves the line (the second delivery) and has not committed
    let mut mover1 = pool.begin().await.unwrap();
    sqlx::query("SELECT hookd.ordering_advance(10000)")
        .execute(&mut *mover1)
        .await
        .unwrap();
    // meanwhile the first is replayed: back in line, before the others
    let replayed = hookd::db::deliveries::replay(&pool, first, hookd::db::Audience::tenant(None))
        .await
        .unwrap();
    assert_eq!(replayed, hookd::db::deliveries::ReplayOutcome::Replayed);
    // mover 2, for the replay's advance, while mover 1 holds the line
    sqlx::query("SELECT hookd.ordering_advance(10000)")
        .execute(&pool)
        .await
        .unwrap();
    mover1.commit().await.unwrap();
    // and any number of calls after
    for _ in 0..3 {
        sqlx::query("SELECT hookd.ordering_advance(10000)")
            .execute(&pool)
            .await
            .unwrap();
    }
    let on_their_way: Vec<Uuid> = sqlx::query_scalar(
        "SELECT id FROM hookd.deliveries
         WHERE endpoint_id = $1 AND status IN ('pending', 'in_progress', 'failed')
           AND visible_at < hookd.ordering_waiting()",
    )
    .bind(ep)
    .fetch_all(&pool)
    .await
    .unwrap();
    assert_eq!(
        on_their_way.len(),
        1,
        "two of one key on their way: {on_their_way:?}"
    );
}

/// A replay never waits for a key's line: while a producer's open transaction holds the
/// key, replaying one of its deliveries is 409 `ordering_key_in_use` at once (nothing
/// changed), and an endpoint replay leaves that key's deliveries alone, counts them, and
/// replays the rest. Before, the replay waited on the producer with the rows it had
/// selected locked, so nothing of the endpoint (unkeyed deliveries included) was sent
/// until the producer committed.
#[sqlx::test]
async fn a_replay_never_waits_for_a_producer_holding_the_key(pool: PgPool) {
    let rx = OrderReceiver::start(Duration::ZERO, 0).await;
    let api = TestApi::start(&pool).await;
    let id = api_endpoint(&api, "e", &rx, json!({})).await;
    let (_, keyed) = post_keyed(&api, Some("r"), 1).await;
    for n in 1..=3 {
        post_keyed(&api, None, n).await;
    }
    let d = TestDispatcher::start(&pool, dispatch_settings()).await;
    assert!(
        wait_until(Duration::from_secs(15), || async {
            count_status(&pool, "succeeded").await == 4
        })
        .await
    );
    d.stop().await;
    let producer = producer_holding(&pool, "r", 2).await;
    let t = Instant::now();
    let (status, v) = api
        .post_as(TENANT, &format!("/v1/deliveries/{}/replay", keyed[0]), "")
        .await;
    assert_eq!(status, StatusCode::CONFLICT, "{v}");
    assert_eq!(v["error"]["code"], "ordering_key_in_use", "{v}");
    let (status, v) = api
        .post_as(
            TENANT,
            &format!("/v1/endpoints/{id}/replay"),
            "{\"statuses\":[\"succeeded\"]}",
        )
        .await;
    assert_eq!(status, StatusCode::ACCEPTED, "{v}");
    assert_eq!(
        (
            v["replayed"].as_i64(),
            v["skippedOrderingKeyInUse"].as_i64()
        ),
        (Some(3), Some(1)),
        "{v}"
    );
    assert!(
        t.elapsed() < Duration::from_secs(3),
        "a replay waited: {:?}",
        t.elapsed()
    );
    assert_eq!(delivery_status(&pool, keyed[0]).await.0, "succeeded");
    producer.commit().await.unwrap();
    let (status, v) = api
        .post_as(TENANT, &format!("/v1/deliveries/{}/replay", keyed[0]), "")
        .await;
    assert_eq!(status, StatusCode::ACCEPTED, "{v}");
}

/// A dead letter that holds its key and is then deleted (as retention deletes it) releases
/// the key at the next pruning pass, so the line behind it is not stranded; a keyed
/// delivery that dies while its endpoint no longer orders by key holds nothing.
#[sqlx::test]
async fn a_hold_whose_dead_letter_is_gone_releases_the_key(pool: PgPool) {
    let rx = OrderReceiver::start(Duration::ZERO, 0).await;
    let api = TestApi::start(&pool).await;
    let id = api_endpoint(&api, "e", &rx, json!({"onDeadLetter": "hold"})).await;
    sqlx::query("UPDATE hookd.endpoints SET max_attempts = 1 WHERE id = $1")
        .bind(id)
        .execute(&pool)
        .await
        .unwrap();
    rx.fail_once("e", "k", 1);
    let (_, first) = post_keyed(&api, Some("k"), 1).await;
    post_keyed(&api, Some("k"), 2).await;
    let d = TestDispatcher::start(&pool, dispatch_settings()).await;
    assert!(
        wait_until(Duration::from_secs(15), || async {
            delivery_status(&pool, first[0]).await.0 == "dead"
        })
        .await
    );
    let holds = || async {
        sqlx::query_scalar::<_, i64>("SELECT count(*) FROM hookd.ordering_holds")
            .fetch_one(&pool)
            .await
            .unwrap()
    };
    assert_eq!(holds().await, 1);
    // retention deletes the dead letter's rows
    sqlx::query("DELETE FROM hookd.dead_letters WHERE delivery_id = $1")
        .bind(first[0])
        .execute(&pool)
        .await
        .unwrap();
    sqlx::query("DELETE FROM hookd.deliveries WHERE id = $1")
        .bind(first[0])
        .execute(&pool)
        .await
        .unwrap();
    let mut conn = pool.acquire().await.unwrap();
    assert_eq!(
        hookd::db::deliveries::release_orphaned_holds(&mut conn)
            .await
            .unwrap(),
        1
    );
    rx.await_delivered("e", "k", &[2]).await;
    d.stop().await;

    // no order, no hold: a keyed delivery that dies after ordering was turned off
    rx.fail_once("e", "j", 1);
    let (_, j) = post_keyed(&api, Some("j"), 1).await;
    let (status, v) = patch_endpoint(&api, id, json!({"ordering": "none"})).await;
    assert_eq!(status, StatusCode::OK, "{v}");
    let d = TestDispatcher::start(&pool, dispatch_settings()).await;
    assert!(
        wait_until(Duration::from_secs(15), || async {
            delivery_status(&pool, j[0]).await.0 == "dead"
        })
        .await
    );
    d.stop().await;
    assert_eq!(holds().await, 0);
}

/// A burst of advances (a replay of thousands of keys, say) is taken a few hundred per
/// call: each is a lock on its line for the call's transaction, and Postgres's lock table
/// is shared by every session (10,000 in one transaction can run out of it on a default
/// server, and a call that failed so would fail again every time). The rest wait for the
/// next calls.
#[sqlx::test]
async fn one_call_moves_a_bounded_number_of_lines(pool: PgPool) {
    init();
    let rx = OrderReceiver::start(Duration::ZERO, 0).await;
    let ep = ordered_endpoint(
        &pool,
        rx.url("e"),
        hookd::endpoints::OnDeadLetter::Continue,
        None,
    )
    .await;
    sqlx::query(
        "INSERT INTO hookd.ordering_advances (endpoint_id, ordering_key)
         SELECT $1, 'k' || g FROM generate_series(1, 1200) g",
    )
    .bind(ep)
    .execute(&pool)
    .await
    .unwrap();
    let took = hookd::db::deliveries::advance_lines(&pool).await.unwrap();
    assert_eq!(took, u64::from(hookd::db::deliveries::ADVANCES_PER_CALL));
    let left: i64 = sqlx::query_scalar("SELECT count(*) FROM hookd.ordering_advances")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(
        left,
        1200 - i64::from(hookd::db::deliveries::ADVANCES_PER_CALL)
    );
}
