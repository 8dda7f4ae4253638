//! The chaos run (issue 12): steady load from several tenants through a real `hookd api`
//! process and two real `hookd dispatch` processes, while the test, at random points,
//! SIGKILLs the API, SIGKILLs a dispatcher, restarts Postgres in immediate mode, and cuts
//! every database connection (which lands mid-commit for whatever was committing). After
//! it settles: acknowledged-but-lost = 0, dropped = 0, every delivery terminal or
//! retrying, none in flight on a lapsed lease, attempts never above the maximum.
//!
//! Bounded: `HOOKD_CHAOS_SECS` (default 40) of injections, then at most 90 s to settle.

use crate::common;

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::*;
use hookd::db::PoolSettings;
use hookd::pgtemp::TempPostgres;
use rand::Rng;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

const MAX_ATTEMPTS: i32 = 20;

/// An acknowledged event: its id and its delivery ids.
type Acked = (Uuid, Vec<Uuid>);

fn spawn_api(url: &str, port: u16) -> HookdProcess {
    HookdCommand::new(["api"])
        .env("DATABASE_URL", url)
        .listen(port)
        .env("HOOKD_AUTH", "none")
        .env("HOOKD_DB_ACQUIRE_TIMEOUT_MS", "1000")
        .env("HOOKD_LOG", "error")
        .spawn()
}

fn spawn_dispatcher(url: &str) -> HookdProcess {
    HookdCommand::new(["dispatch"])
        .env("DATABASE_URL", url)
        .test_key()
        .env("HOOKD_ALLOWED_DESTINATIONS", "127.0.0.0/8")
        .listen(free_port())
        .env("HOOKD_LEASE_SECS", "6")
        .env("HOOKD_REQUEST_TIMEOUT_SECS", "1")
        .env("HOOKD_RETRY_SCHEDULE", "1")
        .env("HOOKD_RETRY_JITTER", "0")
        .env("HOOKD_MAX_ATTEMPTS", MAX_ATTEMPTS.to_string())
        .env("HOOKD_CIRCUIT_FAILURES", "1000")
        .env("HOOKD_POLL_MS", "100")
        .env("HOOKD_LOG", "error")
        .spawn()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn chaos_loses_nothing() {
    init();
    let secs: u64 = std::env::var("HOOKD_CHAOS_SECS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(40);
    let pg = TempPostgres::start().await.expect("throwaway Postgres");
    let url = pg.url();
    let pool = hookd::db::connect_lazy(&PoolSettings {
        url: url.clone(),
        max_connections: 5,
        acquire_timeout: Duration::from_secs(2),
    })
    .unwrap();
    hookd::db::migrate(&pool).await.unwrap();
    let tenants = ["chaos-a", "chaos-b", "chaos-c"];
    let rx = Receiver::start(&[SECRET_A]).await;
    for t in tenants {
        endpoint(
            &pool,
            EndpointOpts {
                namespace: t.into(),
                url: rx.url(&format!("/{t}")),
                ..Default::default()
            },
        )
        .await;
    }

    let api_port = free_port();
    let base = format!("http://127.0.0.1:{api_port}");
    let api: Arc<Mutex<HookdProcess>> = Arc::new(Mutex::new(spawn_api(&url, api_port)));
    let mut dispatchers = vec![spawn_dispatcher(&url), spawn_dispatcher(&url)];
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap();
    assert!(
        wait_until(Duration::from_secs(30), || async {
            client
                .get(format!("{base}/readyz"))
                .send()
                .await
                .is_ok_and(|r| r.status().is_success())
        })
        .await,
        "api did not become ready"
    );

    // load: one client per tenant, keyless (the hardest case: a lost ack cannot be
    // repaired by a retry), recording every acknowledged delivery id
    let acked: Arc<Mutex<Vec<Acked>>> = Arc::default();
    let statuses: Arc<Mutex<std::collections::BTreeMap<u16, usize>>> = Arc::default();
    let stop = CancellationToken::new();
    let mut load = tokio::task::JoinSet::new();
    for t in tenants {
        let (client, base, acked, statuses, stop) = (
            client.clone(),
            base.clone(),
            acked.clone(),
            statuses.clone(),
            stop.clone(),
        );
        load.spawn(async move {
            let mut i = 0u64;
            while !stop.is_cancelled() {
                i += 1;
                let body =
                    format!(r#"{{"tenant":"{t}","eventType":"chaos.tick","payload":{{"i":{i}}}}}"#);
                let r = client
                    .post(format!("{base}/v1/messages"))
                    .header("content-type", "application/json")
                    .body(body)
                    .send()
                    .await;
                let status = match r {
                    Ok(r) => {
                        let s = r.status().as_u16();
                        if r.status().is_success()
                            && let Ok(v) = r.json::<serde_json::Value>().await
                        {
                            acked.lock().unwrap().push(ids(&v));
                        }
                        s
                    }
                    Err(_) => 0,
                };
                *statuses.lock().unwrap().entry(status).or_default() += 1;
                if status != 201 {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                } else {
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
            }
        });
    }

    let mut injected: Vec<String> = Vec::new();
    let t0 = Instant::now();
    let mut rng = rand::rng();
    while t0.elapsed() < Duration::from_secs(secs) {
        tokio::time::sleep(Duration::from_millis(rng.random_range(1500..4000))).await;
        let in_flight: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM hookd.deliveries WHERE status = 'in_progress'",
        )
        .fetch_one(&pool)
        .await
        .unwrap_or(-1);
        let at = format!("{:>5.1}s", t0.elapsed().as_secs_f64());
        match rng.random_range(0..4) {
            0 => {
                let mut a = api.lock().unwrap();
                a.start_kill();
                *a = spawn_api(&url, api_port);
                injected.push(format!("{at} SIGKILL api (restarted)"));
            }
            1 => {
                let k = rng.random_range(0..dispatchers.len());
                dispatchers[k].start_kill();
                dispatchers[k] = spawn_dispatcher(&url);
                injected.push(format!(
                    "{at} SIGKILL dispatcher {k} ({in_flight} in flight; restarted)"
                ));
            }
            2 => {
                pg.stop_immediate().await.unwrap();
                tokio::time::sleep(Duration::from_millis(rng.random_range(200..1500))).await;
                pg.restart().await.unwrap();
                injected.push(format!("{at} Postgres immediate restart"));
            }
            _ => {
                let n: i64 = sqlx::query_scalar(
                    "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
                     WHERE datname = current_database() AND pid <> pg_backend_pid()
                       AND backend_type = 'client backend'",
                )
                .fetch_one(&pool)
                .await
                .unwrap_or(-1);
                injected.push(format!("{at} cut {n} database connections"));
            }
        }
    }
    stop.cancel();
    while load.join_next().await.is_some() {}
    println!(
        "injected ({}):\n  {}",
        injected.len(),
        injected.join("\n  ")
    );
    println!(
        "request statuses (0 = no answer): {:?}",
        statuses.lock().unwrap()
    );

    // settle
    let acked = std::mem::take(&mut *acked.lock().unwrap());
    assert!(
        acked.len() > 100,
        "too little load got through: {}",
        acked.len()
    );
    let expected: HashSet<String> = acked
        .iter()
        .flat_map(|a| a.1.iter().map(|d| d.to_string()))
        .collect();
    let delivered = wait_until(Duration::from_secs(90), || async {
        let got: HashSet<String> = rx.ids().into_iter().collect();
        expected.is_subset(&got)
    })
    .await;

    // acknowledged-but-lost: every acked event exists with exactly its deliveries
    let event_ids: Vec<Uuid> = acked.iter().map(|a| a.0).collect();
    let stored: Vec<(Uuid, Vec<Uuid>)> = sqlx::query_as(
        "SELECT e.id, coalesce(array_agg(d.id ORDER BY d.id) FILTER (WHERE d.id IS NOT NULL), '{}')
         FROM hookd.events e LEFT JOIN hookd.deliveries d ON d.event_id = e.id
         WHERE e.id = ANY($1) GROUP BY e.id",
    )
    .bind(&event_ids)
    .fetch_all(&pool)
    .await
    .unwrap();
    let stored: std::collections::HashMap<Uuid, Vec<Uuid>> = stored.into_iter().collect();
    let lost = acked
        .iter()
        .filter(|(e, d)| {
            let mut d = d.clone();
            d.sort();
            stored.get(e) != Some(&d)
        })
        .count();
    let received = rx.ids();
    let unique: HashSet<&String> = received.iter().collect();
    let dropped = expected.iter().filter(|id| !unique.contains(id)).count();
    let (lapsed, over_max, open): (i64, i64, i64) = sqlx::query_as(
        "SELECT count(*) FILTER (WHERE status = 'in_progress' AND visible_at < now() - interval '10 seconds'),
                count(*) FILTER (WHERE attempts > $1),
                count(*) FILTER (WHERE status NOT IN ('succeeded', 'dead', 'failed', 'pending', 'in_progress'))
         FROM hookd.deliveries",
    )
    .bind(MAX_ATTEMPTS)
    .fetch_one(&pool)
    .await
    .unwrap();
    println!(
        "acknowledged events {}, deliveries expected {}, received {}, unique {}, duplicates {}, acknowledged-but-lost {lost}, dropped {dropped}, in flight on a lapsed lease {lapsed}, attempts above max {over_max}",
        acked.len(),
        expected.len(),
        received.len(),
        unique.len(),
        received.len() - unique.len(),
    );
    assert_eq!(lost, 0, "acknowledged but lost");
    assert!(delivered && dropped == 0, "{dropped} deliveries dropped");
    assert_eq!(lapsed, 0);
    assert_eq!(over_max, 0);
    assert_eq!(open, 0);
    assert!(rx.all().iter().all(|r| r.verified_by == vec![true]));

    for mut d in dispatchers {
        d.kill();
    }
    api.lock().unwrap().start_kill();
    pool.close().await;
    pg.shutdown().await.unwrap();
}
