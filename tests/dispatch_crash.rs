//! Crash safety of the dispatcher (issue 4, invariant 3): a real `hookd dispatch` process
//! SIGKILLed repeatedly mid-delivery, and a Postgres cluster restarted in immediate mode
//! under load. Nothing acknowledged is lost, nothing is dropped; duplicates are counted.

use crate::common;

use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::http::{HeaderMap, StatusCode};
use common::*;
use hookd::db::PoolSettings;
use hookd::pgtemp::TempPostgres;
use sqlx::PgPool;
use tokio_util::sync::{CancellationToken, DropGuard};
use uuid::Uuid;

/// A slow receiver that counts requests in progress (to prove deliveries are in flight
/// at a kill) and records the webhook-id of every request it answered.
struct SlowReceiver {
    addr: SocketAddr,
    in_flight: Arc<AtomicUsize>,
    /// handlers dropped before answering (the sender's connection died under them)
    cut: Arc<AtomicUsize>,
    answered: Arc<Mutex<Vec<String>>>,
    _stop: DropGuard,
}

struct InFlightGuard {
    in_flight: Arc<AtomicUsize>,
    cut: Arc<AtomicUsize>,
    answered: bool,
}

impl Drop for InFlightGuard {
    fn drop(&mut self) {
        self.in_flight.fetch_sub(1, Ordering::SeqCst);
        if !self.answered {
            self.cut.fetch_add(1, Ordering::SeqCst);
        }
    }
}

impl SlowReceiver {
    async fn start(delay: Duration) -> SlowReceiver {
        let in_flight = Arc::new(AtomicUsize::new(0));
        let cut = Arc::new(AtomicUsize::new(0));
        let answered: Arc<Mutex<Vec<String>>> = Arc::default();
        let (f, c, a) = (in_flight.clone(), cut.clone(), answered.clone());
        let app = axum::Router::new().fallback(axum::routing::post(move |h: HeaderMap| {
            let (f, c, a) = (f.clone(), c.clone(), a.clone());
            async move {
                f.fetch_add(1, Ordering::SeqCst);
                let mut guard = InFlightGuard {
                    in_flight: f,
                    cut: c,
                    answered: false,
                };
                tokio::time::sleep(delay).await;
                let id = h
                    .get("webhook-id")
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or_default()
                    .to_string();
                a.lock().unwrap().push(id);
                guard.answered = true;
                "ok"
            }
        }));
        let (addr, stop) = serve_local(app).await;
        SlowReceiver {
            addr,
            in_flight,
            cut,
            answered,
            _stop: stop.drop_guard(),
        }
    }
    fn answered(&self) -> usize {
        self.answered.lock().unwrap().len()
    }
}

fn spawn_dispatcher(database_url: &str) -> HookdProcess {
    HookdCommand::new(["dispatch"])
        .env("DATABASE_URL", database_url)
        .test_key()
        .env("HOOKD_ALLOWED_DESTINATIONS", "127.0.0.0/8")
        .listen(free_port())
        .env("HOOKD_LEASE_SECS", "6")
        .env("HOOKD_REQUEST_TIMEOUT_SECS", "1")
        .env("HOOKD_CONCURRENCY", "32")
        .env("HOOKD_RETRY_SCHEDULE", "1")
        .env("HOOKD_RETRY_JITTER", "0")
        .env("HOOKD_POLL_MS", "100")
        .env("HOOKD_LOG", "warn")
        .spawn()
}

/// Rows leased by a live worker other than the ones already killed.
async fn leased_by_live_worker(pool: &PgPool, dead: &[Uuid]) -> (i64, Vec<Uuid>) {
    let workers: Vec<(Uuid, i64)> = sqlx::query_as(
        "SELECT locked_by, count(*) FROM hookd.deliveries
         WHERE status = 'in_progress' AND locked_by IS NOT NULL AND visible_at > now()
           AND locked_by <> ALL($1)
         GROUP BY locked_by",
    )
    .bind(dead)
    .fetch_all(pool)
    .await
    .unwrap();
    (
        workers.iter().map(|w| w.1).sum(),
        workers.into_iter().map(|w| w.0).collect(),
    )
}

/// A real `hookd dispatch` process delivering 400 deliveries to a slow receiver (200 ms)
/// is SIGKILLed five times while deliveries are in flight (rows leased by that process
/// and requests open at the receiver, both > 0 at each kill) and restarted each time.
/// At the end every delivery id was received at least once (dropped == 0) and every row
/// is succeeded; duplicates are counted and printed.
#[sqlx::test]
async fn sigkill_mid_delivery_drops_nothing(pool: PgPool) {
    init();
    let started = Instant::now();
    let rx = SlowReceiver::start(Duration::from_millis(200)).await;
    endpoint(
        &pool,
        EndpointOpts {
            tenant: Some("crash".into()),
            url: format!("http://{}/hook", rx.addr),
            ..Default::default()
        },
    )
    .await;
    sqlx::query(
        "SELECT hookd.enqueue('crash', 'crash.test', '{\"n\":' || g || '}') FROM generate_series(1, 400) g",
    )
    .execute(&pool)
    .await
    .unwrap();
    let ids: Vec<Uuid> = sqlx::query_scalar("SELECT id FROM hookd.deliveries")
        .fetch_all(&pool)
        .await
        .unwrap();
    assert_eq!(ids.len(), 400);

    let url = database_url(&pool);
    let mut child = spawn_dispatcher(&url);
    let mut dead_workers: Vec<Uuid> = Vec::new();
    for kill in 1..=5 {
        let answered_before = rx.answered();
        let at_kill = Arc::new(Mutex::new((0i64, 0usize, Vec::new())));
        let ready = wait_until(Duration::from_secs(15), || {
            let (pool, dead, at_kill, rx) = (&pool, &dead_workers, at_kill.clone(), &rx);
            async move {
                // some progress by this process, then requests open right now (not
                // just between two waves)
                if rx.answered() < answered_before + 16 || rx.in_flight.load(Ordering::SeqCst) < 8 {
                    return false;
                }
                let (leased, workers) = leased_by_live_worker(pool, dead).await;
                let open = rx.in_flight.load(Ordering::SeqCst);
                *at_kill.lock().unwrap() = (leased, open, workers);
                leased > 0 && open > 0
            }
        })
        .await;
        let (leased, open, workers) = at_kill.lock().unwrap().clone();
        assert!(
            ready,
            "kill {kill}: no deliveries in flight to kill into (leased {leased}, open {open})"
        );
        child.kill(); // SIGKILL
        println!(
            "kill {kill}: {leased} rows leased by the killed process, {open} requests open at the receiver, {} answered so far",
            rx.answered()
        );
        assert!(leased > 0 && open > 0);
        assert!(!workers.is_empty());
        dead_workers.extend(workers);
        child = spawn_dispatcher(&url);
    }

    let all_done = wait_until(
        Duration::from_secs(60).saturating_sub(started.elapsed()),
        || async {
            let n: i64 = sqlx::query_scalar(
                "SELECT count(*) FROM hookd.deliveries WHERE status = 'succeeded'",
            )
            .fetch_one(&pool)
            .await
            .unwrap();
            n == 400
        },
    )
    .await;
    child.kill();
    let answered = rx.answered.lock().unwrap().clone();
    let mut times: HashMap<&str, usize> = HashMap::new();
    for id in &answered {
        *times.entry(id.as_str()).or_default() += 1;
    }
    let dropped: Vec<&Uuid> = ids
        .iter()
        .filter(|id| !times.contains_key(id.to_string().as_str()))
        .collect();
    let duplicates = answered.len() - times.len();
    println!(
        "deliveries {}, received {}, unique {}, duplicates {duplicates}, dropped {}, requests cut by kills {}, took {:?}",
        ids.len(),
        answered.len(),
        times.len(),
        dropped.len(),
        rx.cut.load(Ordering::SeqCst),
        started.elapsed()
    );
    assert!(dropped.is_empty(), "dropped deliveries: {dropped:?}");
    assert!(all_done, "not every delivery reached succeeded within 60 s");
    let unknown: Vec<&&str> = times
        .keys()
        .filter(|k| !ids.iter().any(|id| id.to_string() == **k))
        .collect();
    assert!(unknown.is_empty(), "received unknown ids {unknown:?}");
}

#[derive(Debug)]
struct Request {
    start: Instant,
    end: Instant,
    status: StatusCode,
    ack: Option<(Uuid, Vec<Uuid>)>,
}

/// A throwaway Postgres is restarted in immediate mode (no checkpoint) while four
/// clients enqueue through the in-process API and a dispatcher delivers. Requests made
/// entirely during the outage get 5xx (never 2xx); afterwards both recover without
/// intervention, every 2xx'd event exists with exactly its deliveries, and every one of
/// those deliveries reaches the receiver and is succeeded (dropped == 0).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn postgres_restart_under_load_loses_nothing() {
    init();
    let pg = TempPostgres::start().await.expect("throwaway Postgres");
    let settings = PoolSettings {
        url: pg.url(),
        max_connections: 10,
        acquire_timeout: Duration::from_secs(1),
    };
    let api_pool = hookd::db::connect_lazy(&settings).unwrap();
    hookd::db::migrate(&api_pool).await.unwrap();
    let rx = Receiver::start(&[SECRET_A]).await;
    endpoint(
        &api_pool,
        EndpointOpts {
            tenant: Some("restart".into()),
            url: rx.url("/hook"),
            ..Default::default()
        },
    )
    .await;
    let api = Arc::new(TestApi::start(&api_pool).await);
    let dispatch_pool = hookd::db::connect_lazy(&settings).unwrap();
    let d = TestDispatcher::start(
        &dispatch_pool,
        hookd::config::DispatchSettings {
            lease_secs: 8,
            request_timeout_secs: 2,
            ..dispatch_settings()
        },
    )
    .await;

    let log: Arc<Mutex<Vec<Request>>> = Arc::default();
    let stop = CancellationToken::new();
    let mut clients = tokio::task::JoinSet::new();
    for c in 0..4 {
        let (api, log, stop) = (api.clone(), log.clone(), stop.clone());
        clients.spawn(async move {
            let mut i = 0u64;
            while !stop.is_cancelled() {
                i += 1;
                let body = format!(
                    r#"{{"tenant":"restart","eventType":"load.test","payload":{{"client":{c},"i":{i}}}}}"#
                );
                let start = Instant::now();
                let (status, v) = api.post("/v1/messages", &body).await;
                let ack = status.is_success().then(|| ids(&v));
                log.lock().unwrap().push(Request {
                    start,
                    end: Instant::now(),
                    status,
                    ack,
                });
                if !status.is_success() {
                    // a client backs off a little on 5xx, as Retry-After asks
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
        });
    }
    let acks_since = |t: Instant| {
        log.lock()
            .unwrap()
            .iter()
            .filter(|r| r.start >= t && r.ack.is_some())
            .count()
    };
    let t0 = Instant::now();
    assert!(wait_until(Duration::from_secs(10), || async { acks_since(t0) >= 100 }).await);

    pg.stop_immediate().await.unwrap();
    let down = Instant::now();
    let answered_in_outage = || {
        log.lock()
            .unwrap()
            .iter()
            .filter(|r| r.start >= down)
            .count()
    };
    assert!(
        wait_until(Duration::from_secs(15), || async {
            answered_in_outage() >= 12
        })
        .await,
        "requests during the outage must be answered (with an error), not hang"
    );
    let up = Instant::now();
    pg.restart().await.unwrap();
    let restarted = Instant::now();
    assert!(
        wait_until(Duration::from_secs(30), || async {
            acks_since(restarted) >= 100
        })
        .await,
        "the API did not recover after the restart"
    );
    stop.cancel();
    while let Some(r) = clients.join_next().await {
        r.unwrap();
    }

    let log = std::mem::take(&mut *log.lock().unwrap());
    let outage: Vec<&Request> = log
        .iter()
        .filter(|r| r.start >= down && r.end <= up)
        .collect();
    let mut by_status: HashMap<u16, usize> = HashMap::new();
    for r in &log {
        *by_status.entry(r.status.as_u16()).or_default() += 1;
    }
    let acked: Vec<&(Uuid, Vec<Uuid>)> = log.iter().filter_map(|r| r.ack.as_ref()).collect();
    println!(
        "requests {}, acknowledged {}, during the outage {} (statuses overall {by_status:?}), outage {:?}, recovery {:?}",
        log.len(),
        acked.len(),
        outage.len(),
        up - down,
        restarted - up
    );
    assert!(!outage.is_empty());
    assert!(
        outage.iter().all(|r| r.status.is_server_error()),
        "a request during the outage was answered {:?}",
        outage.iter().map(|r| r.status).collect::<Vec<_>>()
    );

    // Every acknowledged event exists with exactly the deliveries it was acknowledged with.
    let event_ids: Vec<Uuid> = acked.iter().map(|a| a.0).collect();
    let stored: Vec<(Uuid, Vec<Uuid>)> = sqlx::query_as(
        "SELECT e.id, coalesce(array_agg(d.id ORDER BY d.id) FILTER (WHERE d.id IS NOT NULL), '{}')
         FROM hookd.events e LEFT JOIN hookd.deliveries d ON d.event_id = e.id
         WHERE e.id = ANY($1) GROUP BY e.id",
    )
    .bind(&event_ids)
    .fetch_all(&api_pool)
    .await
    .unwrap();
    let stored: HashMap<Uuid, Vec<Uuid>> = stored.into_iter().collect();
    let mut lost = Vec::new();
    for (event, deliveries) in &acked {
        let mut expected = deliveries.clone();
        expected.sort();
        assert_eq!(expected.len(), 1, "one endpoint, one delivery");
        match stored.get(event) {
            Some(got) if *got == expected => {}
            other => lost.push((event, other.cloned())),
        }
    }
    assert!(
        lost.is_empty(),
        "acknowledged but lost or changed: {lost:?}"
    );

    // Every acknowledged delivery reaches the receiver and is succeeded.
    let expected: HashSet<String> = acked.iter().map(|a| a.1[0].to_string()).collect();
    let delivered = wait_until(Duration::from_secs(60), || async {
        let got: HashSet<String> = rx.ids().into_iter().collect();
        expected.is_subset(&got)
    })
    .await;
    let received = rx.ids();
    let unique: HashSet<&String> = received.iter().collect();
    let dropped = expected.iter().filter(|id| !unique.contains(id)).count();
    println!(
        "deliveries expected {}, received {}, unique {}, duplicates {}, dropped {dropped}",
        expected.len(),
        received.len(),
        unique.len(),
        received.len() - unique.len()
    );
    assert!(delivered && dropped == 0, "{dropped} deliveries dropped");
    let acked_ids: Vec<Uuid> = acked.iter().map(|a| a.1[0]).collect();
    assert!(
        wait_until(Duration::from_secs(30), || async {
            let n: i64 = sqlx::query_scalar(
                "SELECT count(*) FROM hookd.deliveries WHERE id = ANY($1) AND status = 'succeeded'",
            )
            .bind(&acked_ids)
            .fetch_one(&api_pool)
            .await
            .unwrap();
            n == acked_ids.len() as i64
        })
        .await
    );
    assert!(rx.all().iter().all(|r| r.verified_by == vec![true]));
    d.stop().await;
    drop(api);
    api_pool.close().await;
    dispatch_pool.close().await;
    pg.shutdown().await.unwrap();
}
