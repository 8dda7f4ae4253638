//! Crash safety of the ingest API (issue 3, DESIGN.md §1.1 and §6) and of inbound sources
//! (issue 33): a real `hookd api` process under concurrent load is SIGKILLed; every event
//! it acknowledged with a 2xx must exist afterwards with all of its deliveries.

use crate::common;

use std::collections::{BTreeSet, HashMap};
use std::os::unix::process::ExitStatusExt;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use common::*;
use sqlx::PgPool;
use tokio::sync::Mutex;
use uuid::Uuid;

const CLIENTS: usize = 32;
const MAX_REQUESTS: u64 = 20_000;
const LOAD_BEFORE_KILL: Duration = Duration::from_secs(3);

/// (eventId, deliveryIds) of every 2xx answer
type Acked = Arc<Mutex<Vec<(Uuid, Vec<Uuid>)>>>;

/// Acknowledged-but-lost == 0: with 32 concurrent producers looping against a real
/// `hookd api` (fan-out 2), SIGKILL lands while requests are in flight (asserted), and
/// afterwards every eventId that got a 2xx exists in hookd.events with exactly the
/// deliveries its response listed.
#[sqlx::test]
async fn sigkill_under_load_loses_no_acknowledged_event(pool: PgPool) {
    init();
    let a = endpoint(&pool, EndpointOpts::default()).await;
    let b = endpoint(&pool, EndpointOpts::default()).await;

    // a real producer's credential, made the way an operator makes one
    let out = HookdCommand::new([
        "token", "create", "--tenant", "team-a", "--scope", "produce",
    ])
    .database(&pool)
    .env("HOOKD_LOG", "warn")
    .output();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let token = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .last()
        .unwrap()
        .to_string();
    assert!(token.starts_with("hookd_"), "{token}");

    let request: Request = Arc::new(move |client, base, c, n| {
        client
            .post(format!("{base}/v1/messages"))
            .bearer_auth(&token)
            .header("content-type", "application/json")
            .body(format!(
                r#"{{"tenant":"team-a","eventType":"load.tick","payload":{{"client":{c},"n":{n}}}}}"#
            ))
    });
    load_kill_and_check(&pool, request, &[a, b]).await;
}

/// The same for inbound webhooks (issue 33): providers (GitHub's scheme, signed here)
/// posting to a source of a real `hookd api` that is SIGKILLed; every request answered
/// 202 exists with its deliveries, none twice.
#[sqlx::test]
async fn sigkill_under_inbound_load_loses_no_accepted_request(pool: PgPool) {
    init();
    let a = endpoint(&pool, EndpointOpts::default()).await;
    let b = endpoint(&pool, EndpointOpts::default()).await;
    let (_, secret) = hookd::inbound::sources::create(
        &pool,
        &test_keyring(),
        hookd::inbound::sources::NewSource {
            name: "gh".into(),
            tenant: "team-a".into(),
            consumer: None,
            provider: "github".into(),
            hmac: None,
            secret: None,
            event_type_prefix: Some("load".into()),
            max_body_bytes: None,
            description: None,
            max_body_allowed: 256 * 1024,
        },
    )
    .await
    .unwrap();
    let request: Request = Arc::new(move |client, base, c, n| {
        use hmac::Mac;
        let body = format!(r#"{{"client":{c},"n":{n}}}"#);
        let mut mac = hmac::Hmac::<sha2::Sha256>::new_from_slice(secret.as_bytes()).unwrap();
        mac.update(body.as_bytes());
        let sig: String = mac
            .finalize()
            .into_bytes()
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        client
            .post(format!("{base}/in/gh"))
            .header("content-type", "application/json")
            .header("x-hub-signature-256", format!("sha256={sig}"))
            .header("x-github-event", "tick")
            .header("x-github-delivery", format!("{c}-{n}"))
            .body(body)
    });
    load_kill_and_check(&pool, request, &[a, b]).await;
}

/// How a load client makes its `n`th request: (client, API base, client number, n).
type Request =
    Arc<dyn Fn(&reqwest::Client, &str, usize, u64) -> reqwest::RequestBuilder + Send + Sync>;

/// Starts a real `hookd api`, runs 32 clients of `request` against it, SIGKILLs it with
/// requests in flight, and checks that every 2xx answer's event exists with exactly the
/// deliveries it listed (one to each of `endpoints`), and that no event was committed
/// with a partial fan-out.
async fn load_kill_and_check(pool: &PgPool, request: Request, endpoints: &[Uuid]) {
    let mut child = HookdCommand::new(["api"])
        .database(pool)
        .test_key()
        .listen(free_port())
        .env("HOOKD_LOG", "warn")
        .start()
        .await;
    let base = child.base().to_string();

    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap();

    let stop = Arc::new(AtomicBool::new(false));
    let killed = Arc::new(AtomicBool::new(false));
    let unanswered = Arc::new(AtomicU64::new(0));
    let started = Arc::new(AtomicU64::new(0));
    let in_flight = Arc::new(AtomicI64::new(0));
    let errors = Arc::new(AtomicU64::new(0));
    let non_2xx = Arc::new(AtomicU64::new(0));
    let acked: Acked = Arc::default();
    let first_refusal: Arc<Mutex<Option<String>>> = Arc::default();
    let mut clients = Vec::new();
    for c in 0..CLIENTS {
        let first_refusal = first_refusal.clone();
        let (client, base, request, stop, killed, unanswered) = (
            client.clone(),
            base.clone(),
            request.clone(),
            stop.clone(),
            killed.clone(),
            unanswered.clone(),
        );
        let (started, in_flight, errors, non_2xx, acked) = (
            started.clone(),
            in_flight.clone(),
            errors.clone(),
            non_2xx.clone(),
            acked.clone(),
        );
        clients.push(tokio::spawn(async move {
            let mut n = 0u64;
            while !stop.load(Ordering::SeqCst) {
                if started.fetch_add(1, Ordering::SeqCst) >= MAX_REQUESTS {
                    break;
                }
                n += 1;
                in_flight.fetch_add(1, Ordering::SeqCst);
                let before_kill = !killed.load(Ordering::SeqCst);
                let result = async {
                    let r = request(&client, &base, c, n).send().await?;
                    let status = r.status();
                    let text = r.text().await?;
                    Ok::<_, reqwest::Error>((status, text))
                }
                .await;
                in_flight.fetch_sub(1, Ordering::SeqCst);
                match result {
                    Ok((status, text)) if status.is_success() => {
                        let v: serde_json::Value = serde_json::from_str(&text).unwrap();
                        acked.lock().await.push(ids(&v));
                    }
                    Ok((status, text)) => {
                        non_2xx.fetch_add(1, Ordering::SeqCst);
                        first_refusal
                            .lock()
                            .await
                            .get_or_insert_with(|| format!("{status}: {text}"));
                    }
                    Err(_) => {
                        errors.fetch_add(1, Ordering::SeqCst);
                        if before_kill {
                            unanswered.fetch_add(1, Ordering::SeqCst);
                        }
                    }
                }
            }
        }));
    }

    // Load until a few seconds have passed or most of the request budget is spent, so
    // the kill always lands with the clients still busy.
    let load_started = Instant::now();
    while load_started.elapsed() < LOAD_BEFORE_KILL
        && started.load(Ordering::SeqCst) < MAX_REQUESTS * 3 / 4
    {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    killed.store(true, Ordering::SeqCst);
    child.start_kill(); // SIGKILL
    let in_flight_at_kill = in_flight.load(Ordering::SeqCst);
    let status = child.wait();
    assert_eq!(status.signal(), Some(9), "hookd api died of SIGKILL");
    stop.store(true, Ordering::SeqCst);
    for c in clients {
        c.await.unwrap();
    }

    let acked = std::mem::take(&mut *acked.lock().await);
    let errors = errors.load(Ordering::SeqCst);
    let non_2xx = non_2xx.load(Ordering::SeqCst);
    let unanswered = unanswered.load(Ordering::SeqCst);
    println!(
        "requests started {}, acknowledged {}, in flight at kill {in_flight_at_kill} \
         (of which never answered {unanswered}), transport errors {errors}, non-2xx {non_2xx}",
        started.load(Ordering::SeqCst).min(MAX_REQUESTS),
        acked.len()
    );
    assert!(
        in_flight_at_kill > 0,
        "the kill must land with requests in flight, or this test proves nothing"
    );
    assert!(
        unanswered > 0,
        "some request sent before the kill must have died without an answer"
    );
    assert!(
        !acked.is_empty(),
        "some requests were acknowledged before the kill; first refusal: {:?}",
        first_refusal.lock().await
    );
    assert_eq!(
        non_2xx,
        0,
        "the API answered only 2xx before it died; first refusal: {:?}",
        first_refusal.lock().await
    );

    // every acknowledged event exists with exactly the deliveries it was answered with
    let event_ids: Vec<Uuid> = acked.iter().map(|(e, _)| *e).collect();
    let rows: Vec<(Uuid, Uuid, Uuid)> = sqlx::query_as(
        "SELECT e.id, d.id, d.endpoint_id FROM hookd.events e
         JOIN hookd.deliveries d ON d.event_id = e.id
         WHERE e.id = ANY($1)",
    )
    .bind(&event_ids)
    .fetch_all(pool)
    .await
    .unwrap();
    let mut stored: HashMap<Uuid, BTreeSet<Uuid>> = HashMap::new();
    for (e, d, endpoint) in &rows {
        assert!(endpoints.contains(endpoint));
        stored.entry(*e).or_default().insert(*d);
    }
    let mut lost = 0;
    let mut incomplete = 0;
    for (event, deliveries) in &acked {
        assert_eq!(
            deliveries.len(),
            endpoints.len(),
            "fan-out to every endpoint"
        );
        match stored.get(event) {
            None => lost += 1,
            Some(s) if *s != deliveries.iter().copied().collect::<BTreeSet<_>>() => incomplete += 1,
            Some(_) => {}
        }
    }
    let total: i64 = sqlx::query_scalar("SELECT count(*) FROM hookd.events")
        .fetch_one(pool)
        .await
        .unwrap();
    println!(
        "events stored {total} (acknowledged {}, committed but unacknowledged {})",
        acked.len(),
        total - acked.len() as i64 + lost
    );
    assert_eq!(lost, 0, "acknowledged-but-lost events");
    assert_eq!(incomplete, 0, "acknowledged events missing deliveries");
    // no event was committed with a partial fan-out either
    let partial: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM hookd.events e
         WHERE (SELECT count(*) FROM hookd.deliveries d WHERE d.event_id = e.id) <> $1",
    )
    .bind(endpoints.len() as i64)
    .fetch_one(pool)
    .await
    .unwrap();
    assert_eq!(partial, 0);
}
