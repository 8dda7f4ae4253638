//! Issue 12: no receiver, producer or outage wedges delivery, and every fence is exact.
//! Each test here failed on the code before the fix it pins.

use crate::common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use chrono::Utc;
use common::*;
use hookd::db::deliveries::{
    self, ClaimRequest, ClaimedDelivery, Completion, DeliveryOutcome, ReplayOutcome,
};
use hookd::domain::ErrorClass;
use reqwest::StatusCode;
use sqlx::PgPool;
use sqlx::postgres::PgPoolOptions;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

fn claim_req(limit: i64, now: Option<chrono::DateTime<Utc>>) -> ClaimRequest {
    ClaimRequest {
        worker_id: Uuid::now_v7(),
        limit,
        lease_secs: 30.0,
        per_endpoint_cap: 1000,
        busy: Vec::new(),
        now,
        default_max_attempts: 8,
    }
}

fn outcome(c: &ClaimedDelivery, status: DeliveryOutcome) -> Completion {
    Completion {
        delivery_id: c.id,
        claim_token: c.claim_token,
        attempt: c.attempt_seq,
        status,
        retry_delay_ms: (status == DeliveryOutcome::Retry).then_some(60_000),
        started_at: Utc::now(),
        duration_ms: 1,
        status_code: Some(if status == DeliveryOutcome::Succeeded {
            200
        } else {
            500
        }),
        error_class: (status != DeliveryOutcome::Succeeded).then_some(ErrorClass::HttpStatus),
        error: None,
        response_snippet: None,
        dead_reason: (status == DeliveryOutcome::Dead).then(|| "test".to_string()),
    }
}

async fn complete(pool: &PgPool, batch: &[Completion]) -> Vec<Uuid> {
    let mut conn = pool.acquire().await.unwrap();
    deliveries::complete(&mut conn, batch).await.unwrap()
}

async fn one_delivery(pool: &PgPool) -> Uuid {
    let api = TestApi::start(pool).await;
    endpoint(pool, EndpointOpts::default()).await;
    let (_, d) = api.enqueue("team-a", "t.x", "{}").await;
    d[0]
}

async fn attempt_numbers(pool: &PgPool, id: Uuid) -> Vec<i32> {
    sqlx::query_scalar(
        "SELECT attempt FROM hookd.delivery_attempts WHERE delivery_id = $1 ORDER BY id",
    )
    .bind(id)
    .fetch_all(pool)
    .await
    .unwrap()
}

/// Item 2: a stale outcome and the current one of the same delivery in one batch. Before:
/// the stale `succeeded` overwrote the current `failed`, and two `dead` outcomes failed
/// the whole statement.
#[sqlx::test]
async fn two_outcomes_of_one_delivery_in_one_batch(pool: PgPool) {
    let id = one_delivery(&pool).await;
    let first = deliveries::claim(&pool, &claim_req(10, None))
        .await
        .unwrap();
    assert_eq!(first.len(), 1);
    // the lease lapses and another claim takes the row over
    let later = Utc::now() + chrono::Duration::seconds(120);
    let second = deliveries::claim(&pool, &claim_req(10, Some(later)))
        .await
        .unwrap();
    assert_eq!(second.len(), 1);
    assert_ne!(first[0].claim_token, second[0].claim_token);

    let passed = complete(
        &pool,
        &[
            outcome(&second[0], DeliveryOutcome::Retry),
            outcome(&first[0], DeliveryOutcome::Succeeded),
        ],
    )
    .await;
    assert_eq!(passed, vec![id], "only the current claim's outcome passes");
    let (status, _) = delivery_status(&pool, id).await;
    assert_eq!(status, "failed", "the stale success must not overwrite");
    assert_eq!(attempt_numbers(&pool, id).await, vec![2]);

    // two dead outcomes of one delivery in one batch: no error, one dead letter
    let third = deliveries::claim(
        &pool,
        &claim_req(10, Some(later + chrono::Duration::seconds(120))),
    )
    .await
    .unwrap();
    let fourth = deliveries::claim(
        &pool,
        &claim_req(10, Some(later + chrono::Duration::seconds(240))),
    )
    .await
    .unwrap();
    let passed = complete(
        &pool,
        &[
            outcome(&third[0], DeliveryOutcome::Dead),
            outcome(&fourth[0], DeliveryOutcome::Dead),
            outcome(&fourth[0], DeliveryOutcome::Dead),
        ],
    )
    .await;
    assert_eq!(passed, vec![id]);
    let dead: i64 =
        sqlx::query_scalar("SELECT count(*) FROM hookd.dead_letters WHERE delivery_id = $1")
            .bind(id)
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(dead, 1);
}

/// Item 3: replay after a lapsed lease, then the same worker re-claims at attempt 1: the
/// first send's stale outcome must not pass the fence, and the attempt log must not show
/// two "attempt 1" entries.
#[sqlx::test]
async fn replay_cannot_reopen_the_fence(pool: PgPool) {
    let id = one_delivery(&pool).await;
    let worker = Uuid::now_v7();
    let mut req = claim_req(10, None);
    req.worker_id = worker;
    let stale = deliveries::claim(&pool, &req).await.unwrap();
    assert_eq!(stale[0].attempts, 1);
    // the lease lapses (made due by moving it into the past), then an operator replays
    sqlx::query(
        "UPDATE hookd.deliveries SET visible_at = now() - interval '1 second' WHERE id = $1",
    )
    .bind(id)
    .execute(&pool)
    .await
    .unwrap();
    assert_eq!(
        deliveries::replay(&pool, id, hookd::db::Audience::default())
            .await
            .unwrap(),
        ReplayOutcome::Replayed
    );
    let current = deliveries::claim(&pool, &req).await.unwrap();
    assert_eq!(current[0].attempts, 1, "replay reset the attempt count");

    // the first send's outcome arrives late: dead
    let passed = complete(&pool, &[outcome(&stale[0], DeliveryOutcome::Dead)]).await;
    assert!(passed.is_empty(), "a stale outcome passed the fence");
    let (status, _) = delivery_status(&pool, id).await;
    assert_eq!(status, "in_progress");

    let passed = complete(&pool, &[outcome(&current[0], DeliveryOutcome::Succeeded)]).await;
    assert_eq!(passed, vec![id]);
    assert_eq!(attempt_numbers(&pool, id).await, vec![2]);
}

/// An outcome batch locks its rows only by updating them (no lock of its own first, which
/// wrote a lock record per delivery to the log), so the fence is checked again on the row
/// as the update finds it once locked: a row re-claimed by another worker while the batch
/// waited for its lock is left alone, and no attempt of the stale claim is logged.
#[sqlx::test]
async fn an_outcome_that_waited_for_its_row_checks_the_fence_on_the_row_it_locked(pool: PgPool) {
    let id = one_delivery(&pool).await;
    let first = deliveries::claim(&pool, &claim_req(10, None))
        .await
        .unwrap();
    assert_eq!(first.len(), 1);
    // another worker's claim of the same row, in a transaction that holds the row while
    // the first worker's outcome arrives (as a re-claim after a lapsed lease does)
    let mut other = pool.begin().await.unwrap();
    let token: Uuid = sqlx::query_scalar(
        "UPDATE hookd.deliveries SET claim_token = gen_random_uuid(), attempt_seq = attempt_seq + 1
         WHERE id = $1 AND status = 'in_progress' RETURNING claim_token",
    )
    .bind(id)
    .fetch_one(&mut *other)
    .await
    .unwrap();
    let stale = tokio::spawn({
        let pool = pool.clone();
        let c = outcome(&first[0], DeliveryOutcome::Dead);
        async move { complete(&pool, &[c]).await }
    });
    // the batch is waiting for the row
    let waiting = async {
        loop {
            let n: i64 = sqlx::query_scalar(
                // (the statement's text is past what pg_stat_activity keeps of it)
                "SELECT count(*) FROM pg_stat_activity
                 WHERE datname = current_database() AND wait_event_type = 'Lock'",
            )
            .fetch_one(&pool)
            .await
            .unwrap();
            if n > 0 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    };
    tokio::time::timeout(Duration::from_secs(10), waiting)
        .await
        .expect("the outcome batch waits for the row lock");
    other.commit().await.unwrap();
    let passed = stale.await.unwrap();
    assert!(passed.is_empty(), "a stale outcome passed the fence");
    let (status, _) = delivery_status(&pool, id).await;
    assert_eq!(status, "in_progress");
    assert!(attempt_numbers(&pool, id).await.is_empty());
    assert!(
        !sqlx::query_scalar::<_, bool>(
            "SELECT EXISTS (SELECT 1 FROM hookd.dead_letters WHERE delivery_id = $1)"
        )
        .bind(id)
        .fetch_one(&pool)
        .await
        .unwrap()
    );
    let token_now: Uuid =
        sqlx::query_scalar("SELECT claim_token FROM hookd.deliveries WHERE id = $1")
            .bind(id)
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(token_now, token);
}

/// Item 4: a claim half-opens only the circuits it picked a row for.
#[sqlx::test]
async fn probe_slots_are_spent_only_on_probes(pool: PgPool) {
    let api = TestApi::start(&pool).await;
    for i in 0..20 {
        endpoint(
            &pool,
            EndpointOpts {
                name: format!("open-{i}"),
                ..Default::default()
            },
        )
        .await;
    }
    api.enqueue("team-a", "t.x", "{}").await;
    sqlx::query(
        "UPDATE hookd.endpoints SET circuit_state = 'open', circuit_open_until = now() - interval '1 second'",
    )
    .execute(&pool)
    .await
    .unwrap();
    let got = deliveries::claim(&pool, &claim_req(7, None)).await.unwrap();
    assert_eq!(got.len(), 7);
    let half: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM hookd.endpoints WHERE circuit_state = 'half_open'",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(half, 7, "only circuits that got a probe are half-open");
    // the others are still ready for their probe
    let more = deliveries::claim(&pool, &claim_req(100, None))
        .await
        .unwrap();
    assert_eq!(more.len(), 13);
}

/// Retry times come from the database's clock, not the dispatcher's.
#[sqlx::test]
async fn retry_time_is_the_databases_now_plus_the_delay(pool: PgPool) {
    let id = one_delivery(&pool).await;
    let c = deliveries::claim(&pool, &claim_req(1, None)).await.unwrap();
    complete(&pool, &[outcome(&c[0], DeliveryOutcome::Retry)]).await;
    let secs: f64 = sqlx::query_scalar(
        "SELECT extract(epoch FROM visible_at - now())::float8 FROM hookd.deliveries WHERE id = $1",
    )
    .bind(id)
    .fetch_one(&pool)
    .await
    .unwrap();
    assert!((55.0..=60.5).contains(&secs), "{secs}");
}

/// A lapsed lease re-claimed at the maximum is sent again without counting past it.
#[sqlx::test]
async fn attempts_never_exceed_the_maximum(pool: PgPool) {
    let id = one_delivery(&pool).await;
    let mut req = claim_req(1, None);
    req.default_max_attempts = 2;
    let mut at = Utc::now();
    for _ in 0..4 {
        let got = deliveries::claim(
            &pool,
            &ClaimRequest {
                now: Some(at),
                ..req.clone()
            },
        )
        .await
        .unwrap();
        assert_eq!(got.len(), 1);
        at += chrono::Duration::seconds(60);
    }
    let (_, attempts) = delivery_status(&pool, id).await;
    assert_eq!(attempts, 2);
}

/// Item 8: an enqueue that read the endpoint as live commits after the endpoint's
/// removal cancelled its deliveries; the sweep cancels the straggler.
#[sqlx::test]
async fn removal_racing_an_enqueue_leaves_nothing_pending(pool: PgPool) {
    let o = EndpointOpts::default();
    let ns = o.namespace.clone();
    let name = o.name.clone();
    endpoint(&pool, o).await;
    let mut producer = pool.begin().await.unwrap();
    let event: Uuid = sqlx::query_scalar("SELECT hookd.enqueue('team-a', 't.x', '{}')")
        .fetch_one(&mut *producer)
        .await
        .unwrap();
    let mut conn = pool.acquire().await.unwrap();
    hookd::db::endpoints::remove_declared(&mut conn, &ns, &name, "deleted")
        .await
        .unwrap()
        .unwrap();
    drop(conn);
    producer.commit().await.unwrap();
    let status: String =
        sqlx::query_scalar("SELECT status FROM hookd.deliveries WHERE event_id = $1")
            .bind(event)
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(status, "pending", "the race happened");
    assert_eq!(deliveries::cancel_stragglers(&pool).await.unwrap(), 1);
    let status: String =
        sqlx::query_scalar("SELECT status FROM hookd.deliveries WHERE event_id = $1")
            .bind(event)
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(status, "cancelled");
}

/// Item 6: a producer's open transaction holding an idempotency key stalls only the
/// request that reuses the key (answered 409 idempotency_key_in_use after the bounded
/// wait), never other tenants.
#[sqlx::test]
async fn a_held_idempotency_key_stalls_nobody_else(pool: PgPool) {
    let mut settings = api_settings();
    settings.idempotency_wait_ms = 1500;
    let api = Arc::new(TestApi::start_with(&pool, settings).await);
    endpoint(&pool, EndpointOpts::default()).await;
    let mut producer = pool.begin().await.unwrap();
    let held: Uuid = sqlx::query_scalar("SELECT hookd.enqueue('team-a', 't.x', '{}', 'k-held')")
        .fetch_one(&mut *producer)
        .await
        .unwrap();

    let blocked = {
        let api = api.clone();
        tokio::spawn(async move {
            let t = Instant::now();
            let r = send(
                api.request_as("team-a", reqwest::Method::POST, "/v1/messages")
                    .await
                    .header("idempotency-key", "k-held")
                    .header("content-type", "application/json")
                    .body(r#"{"tenant":"team-a","eventType":"t.x","payload":{}}"#),
            )
            .await;
            (r, t.elapsed())
        })
    };
    tokio::time::sleep(Duration::from_millis(200)).await;
    // meanwhile other requests go through at once
    for i in 0..5 {
        let t = Instant::now();
        let (s, v) = api
            .post_as(
                "team-b",
                "/v1/messages",
                &format!(r#"{{"tenant":"team-b","eventType":"t.x","payload":{{"i":{i}}}}}"#),
            )
            .await;
        assert_eq!(s, StatusCode::CREATED, "{v}");
        assert!(t.elapsed() < Duration::from_secs(1), "{:?}", t.elapsed());
    }
    let ((status, body), waited) = blocked.await.unwrap();
    assert_eq!(status, StatusCode::CONFLICT, "{body}");
    assert_eq!(body["error"]["code"], "idempotency_key_in_use");
    assert!(waited >= Duration::from_millis(1400), "{waited:?}");

    producer.commit().await.unwrap();
    let (status, body) = send(
        api.request_as("team-a", reqwest::Method::POST, "/v1/messages")
            .await
            .header("idempotency-key", "k-held")
            .header("content-type", "application/json")
            .body(r#"{"tenant":"team-a","eventType":"t.x","payload":{}}"#),
    )
    .await;
    assert!(status.is_success(), "{body}");
    assert_eq!(body["eventId"], held.to_string());
}

// ---- a TCP proxy that loses COMMIT's answer ----

struct Proxy {
    port: u16,
    /// cut the connection right after forwarding the next COMMIT
    arm: Arc<AtomicBool>,
    /// at the cut, every connection is cut too and new ones refused: the database is
    /// unreachable from the moment COMMIT left
    down_at_cut: Arc<AtomicBool>,
}

async fn proxy(upstream: u16) -> Proxy {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let arm = Arc::new(AtomicBool::new(false));
    let down = CancellationToken::new();
    let down_at_cut = Arc::new(AtomicBool::new(false));
    let (a, r, dac) = (arm.clone(), down.clone(), down_at_cut.clone());
    tokio::spawn(async move {
        loop {
            let Ok((client, _)) = listener.accept().await else {
                return;
            };
            if r.is_cancelled() {
                drop(client);
                continue;
            }
            let Ok(server) = TcpStream::connect(("127.0.0.1", upstream)).await else {
                continue;
            };
            let a = a.clone();
            let r = r.clone();
            let dac = dac.clone();
            let r_at_cut = r.clone();
            tokio::spawn(async move {
                let pump = async move {
                    let (mut cr, mut cw) = client.into_split();
                    let (mut sr, mut sw) = server.into_split();
                    let down = tokio::spawn(async move {
                        let _ = tokio::io::copy(&mut sr, &mut cw).await;
                    });
                    let mut buf = vec![0u8; 64 * 1024];
                    while let Ok(n) = cr.read(&mut buf).await {
                        if n == 0 {
                            break;
                        }
                        let is_commit = buf[..n].windows(7).any(|w| w == b"COMMIT\0");
                        if is_commit && a.load(Ordering::SeqCst) {
                            // COMMIT reaches the server; its answer never reaches the
                            // client: the way back is cut first
                            down.abort();
                            let _ = sw.write_all(&buf[..n]).await;
                            let _ = sw.flush().await;
                            // cut as soon as COMMIT is on its way: the client sees the
                            // connection end at once and may settle (rows found) before
                            // the server side closes
                            a.store(false, Ordering::SeqCst);
                            if dac.load(Ordering::SeqCst) {
                                r_at_cut.cancel();
                            }
                            tokio::time::sleep(Duration::from_millis(50)).await;
                            return;
                        }
                        if sw.write_all(&buf[..n]).await.is_err() {
                            break;
                        }
                    }
                    down.abort();
                };
                tokio::select! {
                    _ = pump => {}
                    _ = r.cancelled() => {}
                }
            });
        }
    });
    Proxy {
        port,
        arm,
        down_at_cut,
    }
}

async fn proxied_pool(pool: &PgPool, port: u16) -> PgPool {
    let opts = (*pool.connect_options()).clone().port(port);
    PgPoolOptions::new()
        .max_connections(8)
        .acquire_timeout(Duration::from_secs(1))
        .connect_with(opts)
        .await
        .unwrap()
}

/// Item 5: COMMIT's answer is lost but the rows committed: 201 with the ids (before: 503
/// "nothing was written", and a keyless retry made a second event).
#[sqlx::test]
async fn lost_commit_answer_with_rows_written_is_201(pool: PgPool) {
    let upstream = pool.connect_options().get_port();
    let p = proxy(upstream).await;
    let ppool = proxied_pool(&pool, p.port).await;
    endpoint(&pool, EndpointOpts::default()).await;
    let api = TestApi::start(&ppool).await;
    api.token_for("team-a").await;
    p.arm.store(true, Ordering::SeqCst);
    let (status, body) = api
        .post(
            "/v1/messages",
            r#"{"tenant":"team-a","eventType":"t.x","payload":{"n":1}}"#,
        )
        .await;
    assert!(!p.arm.load(Ordering::SeqCst), "the COMMIT was cut");
    assert_eq!(status, StatusCode::CREATED, "{body}");
    let (event, deliveries) = ids(&body);
    let n: i64 = sqlx::query_scalar("SELECT count(*) FROM hookd.events WHERE id = $1")
        .bind(event)
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(n, 1);
    assert_eq!(deliveries.len(), 1);
    let total: i64 = sqlx::query_scalar("SELECT count(*) FROM hookd.events")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(total, 1, "exactly one event");
}

/// Item 5: COMMIT's answer is lost and the database stays unreachable: 503
/// commit_outcome_unknown, never "nothing was written".
#[sqlx::test]
async fn lost_commit_answer_unknown_outcome_is_503_commit_outcome_unknown(pool: PgPool) {
    let upstream = pool.connect_options().get_port();
    let p = proxy(upstream).await;
    let ppool = proxied_pool(&pool, p.port).await;
    endpoint(&pool, EndpointOpts::default()).await;
    let api = TestApi::start(&ppool).await;
    api.token_for("team-a").await;
    // the database becomes unreachable right at the cut, before the client can look
    p.down_at_cut.store(true, Ordering::SeqCst);
    p.arm.store(true, Ordering::SeqCst);
    let (status, body) = api
        .post(
            "/v1/messages",
            r#"{"tenant":"team-a","eventType":"t.x","payload":{"n":1}}"#,
        )
        .await;
    assert!(!p.arm.load(Ordering::SeqCst), "the COMMIT was cut");
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    assert_eq!(body["error"]["code"], "commit_outcome_unknown", "{body}");
    let msg = body["error"]["message"].as_str().unwrap();
    assert!(!msg.contains("nothing was written"), "{msg}");
}

// ---- hostile receivers through the real dispatcher ----

/// Serves one hostile behaviour per path, over raw TCP so that it can break HTTP.
async fn hostile_receiver() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        loop {
            let Ok((mut sock, _)) = listener.accept().await else {
                return;
            };
            tokio::spawn(async move {
                let mut head = Vec::new();
                let mut buf = [0u8; 8192];
                while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                    match sock.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => head.extend_from_slice(&buf[..n]),
                    }
                }
                let text = String::from_utf8_lossy(&head).to_string();
                let path = text.split_whitespace().nth(1).unwrap_or("/").to_string();
                // drain the body (Content-Length) so the client is not blocked writing
                let len: usize = text
                    .lines()
                    .find_map(|l| {
                        let (k, v) = l.split_once(':')?;
                        k.eq_ignore_ascii_case("content-length")
                            .then(|| v.trim().parse().ok())?
                    })
                    .unwrap_or(0);
                let body_start = head.windows(4).position(|w| w == b"\r\n\r\n").unwrap() + 4;
                let mut have = head.len() - body_start;
                while have < len {
                    match sock.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => have += n,
                    }
                }
                let w = |b: &[u8]| b.to_vec();
                match path.as_str() {
                    "/nul" => {
                        let _ = sock
                            .write_all(&w(b"HTTP/1.1 200 OK\r\ncontent-length: 3\r\n\r\nok\0"))
                            .await;
                    }
                    "/nul-error" => {
                        let _ = sock
                            .write_all(&w(
                                b"HTTP/1.1 500 Oops\r\ncontent-length: 5\r\n\r\n\0\0\0\0\0",
                            ))
                            .await;
                    }
                    "/invalid-utf8" => {
                        let _ = sock
                            .write_all(&w(
                                b"HTTP/1.1 200 OK\r\ncontent-length: 6\r\n\r\n\xff\xfe\x00\xc3(a",
                            ))
                            .await;
                    }
                    "/huge" => {
                        let n = 4 * 1024 * 1024;
                        let _ = sock
                            .write_all(
                                format!("HTTP/1.1 200 OK\r\ncontent-length: {n}\r\n\r\n")
                                    .as_bytes(),
                            )
                            .await;
                        let chunk = vec![b'x'; 64 * 1024];
                        for _ in 0..64 {
                            if sock.write_all(&chunk).await.is_err() {
                                break;
                            }
                        }
                    }
                    "/big-header" => {
                        let v = "h".repeat(60 * 1024);
                        let _ = sock
                            .write_all(
                                format!(
                                    "HTTP/1.1 200 OK\r\nx-big: {v}\r\ncontent-length: 2\r\n\r\nok"
                                )
                                .as_bytes(),
                            )
                            .await;
                    }
                    "/endless" => {
                        let _ = sock
                            .write_all(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n")
                            .await;
                        for _ in 0..600 {
                            if sock.write_all(b"1\r\n\0\r\n").await.is_err() {
                                break;
                            }
                            tokio::time::sleep(Duration::from_millis(10)).await;
                        }
                    }
                    "/reset" => {
                        let _ = sock
                            .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 1000\r\n\r\npartial")
                            .await;
                        // an RST instead of a FIN: linger 0, then close
                        #[allow(deprecated)]
                        let _ = sock.set_linger(Some(Duration::ZERO));
                        drop(sock);
                    }
                    "/late" => {
                        tokio::time::sleep(Duration::from_millis(2500)).await;
                        let _ = sock
                            .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
                            .await;
                    }
                    _ => {
                        let _ = sock
                            .write_all(b"HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\n\r\n")
                            .await;
                    }
                }
            });
        }
    });
    port
}

/// The hostile-receiver matrix: every hostile delivery ends in a correct terminal state,
/// nothing stays in flight, and another tenant's deliveries arrive exactly once meanwhile.
/// Before: the NUL byte made Postgres refuse the outcome batch and the completer retried
/// it forever, so no outcome of any tenant was written again.
#[sqlx::test]
async fn hostile_receivers_wedge_nothing(pool: PgPool) {
    let api = TestApi::start(&pool).await;
    let port = hostile_receiver().await;
    let paths = [
        "/nul",
        "/nul-error",
        "/invalid-utf8",
        "/huge",
        "/big-header",
        "/endless",
        "/reset",
        "/late",
    ];
    for p in paths {
        endpoint(
            &pool,
            EndpointOpts {
                namespace: "hostile".into(),
                name: format!("h{}", p.replace('/', "-")),
                url: format!("http://127.0.0.1:{port}{p}"),
                max_attempts: Some(1),
                timeout_seconds: Some(1),
                ..Default::default()
            },
        )
        .await;
    }
    let good = Receiver::start(&[SECRET_A]).await;
    endpoint(
        &pool,
        EndpointOpts {
            namespace: "healthy".into(),
            url: good.url("/ok"),
            ..Default::default()
        },
    )
    .await;
    let mut settings = dispatch_settings();
    settings.response_snippet_bytes = 1024;
    // every hostile delivery gets its one attempt (no circuit holds them back)
    settings.circuit_failures = 10_000;
    let dispatcher = TestDispatcher::start(&pool, settings).await;

    let mut hostile_ids = Vec::new();
    let mut healthy_ids = Vec::new();
    for i in 0..20 {
        let (_, d) = api
            .enqueue("hostile", "t.x", &format!(r#"{{"i":{i}}}"#))
            .await;
        hostile_ids.extend(d);
        let (_, d) = api
            .enqueue("healthy", "t.x", &format!(r#"{{"i":{i}}}"#))
            .await;
        healthy_ids.extend(d);
    }
    assert_eq!(hostile_ids.len(), 20 * paths.len());
    let all: Vec<Uuid> = hostile_ids.iter().chain(&healthy_ids).copied().collect();
    let settled = wait_until(Duration::from_secs(60), || {
        let pool = pool.clone();
        let all = all.clone();
        async move {
            let open: i64 = sqlx::query_scalar(
                "SELECT count(*) FROM hookd.deliveries WHERE id = ANY($1) AND status NOT IN ('succeeded', 'dead')",
            )
            .bind(&all)
            .fetch_one(&pool)
            .await
            .unwrap();
            open == 0
        }
    })
    .await;
    let states: Vec<(String, String, i64)> = sqlx::query_as(
        "SELECT e.url, d.status, count(*) FROM hookd.deliveries d JOIN hookd.endpoints e ON e.id = d.endpoint_id
         GROUP BY 1, 2 ORDER BY 1, 2",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    assert!(settled, "deliveries left unfinished: {states:?}");
    dispatcher.stop().await;

    // exactly once for the healthy tenant
    let got = good.ids();
    let distinct: std::collections::HashSet<&String> = got.iter().collect();
    assert_eq!(got.len(), 20, "healthy tenant received {} sends", got.len());
    assert_eq!(distinct.len(), 20);
    // every hostile delivery has exactly one attempt logged, within the maximum
    let over: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM hookd.deliveries WHERE id = ANY($1) AND (attempts > 1 OR attempt_seq > 1)",
    )
    .bind(&hostile_ids)
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(over, 0, "{states:?}");
    let expect = |path: &str, status: &str| {
        let url = format!("http://127.0.0.1:{port}{path}");
        let n = states
            .iter()
            .filter(|(u, s, _)| *u == url && s == status)
            .map(|r| r.2)
            .sum::<i64>();
        assert_eq!(n, 20, "{path}: {states:?}");
    };
    expect("/nul", "succeeded");
    expect("/invalid-utf8", "succeeded");
    expect("/huge", "succeeded");
    expect("/nul-error", "dead");
    expect("/late", "dead");
    // the NUL bytes were stored as replacement characters
    let snippet: Option<String> = sqlx::query_scalar(
        "SELECT a.response_snippet FROM hookd.delivery_attempts a JOIN hookd.deliveries d ON d.id = a.delivery_id
         JOIN hookd.endpoints e ON e.id = d.endpoint_id WHERE e.url LIKE '%/nul' LIMIT 1",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(snippet.as_deref(), Some("ok\u{FFFD}"));
}

/// `HOOKD_RETRY_SCHEDULE` is validated at start: out-of-range delays used to overflow the
/// jitter (a panic that leaked the task's in-flight bookkeeping) or become immediate.
#[test]
fn retry_schedules_out_of_range_are_refused_at_start() {
    for bad in ["18446744073709551615", "5,0", "2592001", "", "5,x"] {
        let s = hookd::config::DispatchSettings {
            retry_schedule: bad.into(),
            ..dispatch_settings()
        };
        let err = hookd::dispatch::DispatchConfig::from_settings(&s).unwrap_err();
        assert!(
            err.to_string().contains("HOOKD_RETRY_SCHEDULE"),
            "{bad}: {err}"
        );
    }
    let ok = hookd::config::DispatchSettings {
        retry_schedule: "1,2592000".into(),
        retry_jitter: 1.0,
        ..dispatch_settings()
    };
    assert!(hookd::dispatch::DispatchConfig::from_settings(&ok).is_ok());
}

/// Outcomes of sends to an endpoint's old URL neither open the circuit of nor disable
/// (410) its new configuration.
#[sqlx::test]
async fn outcomes_for_an_old_url_do_not_touch_the_new_configuration(pool: PgPool) {
    let o = EndpointOpts::default();
    let id = endpoint(&pool, o.clone()).await;
    endpoint(
        &pool,
        EndpointOpts {
            url: "http://127.0.0.1:10/moved".into(),
            ..o
        },
    )
    .await;
    let mut conn = pool.acquire().await.unwrap();
    let old = hookd::db::endpoints::CircuitInput {
        endpoint_id: id,
        config_version: 1,
        any_success: false,
        trailing_failures: 50,
    };
    let opened = hookd::db::endpoints::record_circuit(&mut conn, &[old], 5, 30.0)
        .await
        .unwrap();
    assert!(
        opened.is_empty(),
        "the old URL's failures opened the circuit"
    );
    let disabled = hookd::db::endpoints::disable(&mut conn, &[(id, 1)], "410")
        .await
        .unwrap();
    assert!(
        disabled.is_empty(),
        "the old URL's 410 disabled the endpoint"
    );
    let current = hookd::db::endpoints::CircuitInput {
        config_version: 2,
        ..old
    };
    let opened = hookd::db::endpoints::record_circuit(&mut conn, &[current], 5, 30.0)
        .await
        .unwrap();
    assert_eq!(
        opened,
        vec![id],
        "the current configuration's failures count"
    );
}

/// A lease handed back at shutdown keeps the attempt counted when the send had begun
/// (it may have reached the receiver) and uncounts it only when it never began.
#[sqlx::test]
async fn release_counts_begun_sends(pool: PgPool) {
    let api = TestApi::start(&pool).await;
    endpoint(&pool, EndpointOpts::default()).await;
    let (_, a) = api.enqueue("team-a", "t.x", "{}").await;
    let (_, b) = api.enqueue("team-a", "t.x", "{}").await;
    let got = deliveries::claim(&pool, &claim_req(10, None))
        .await
        .unwrap();
    assert_eq!(got.len(), 2);
    let releases: Vec<deliveries::Release> = got
        .iter()
        .map(|c| deliveries::Release {
            delivery_id: c.id,
            claim_token: c.claim_token,
            started: c.id == a[0],
        })
        .collect();
    assert_eq!(deliveries::release(&pool, &releases).await.unwrap(), 2);
    assert_eq!(delivery_status(&pool, a[0]).await, ("failed".into(), 1));
    assert_eq!(delivery_status(&pool, b[0]).await, ("pending".into(), 0));
}
