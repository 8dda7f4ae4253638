//! Signing secrets encrypted at rest (issue 8, part 3): no plaintext secret anywhere in
//! the database, in logs, errors, metrics or API answers; `hookd rekey` while deliveries
//! flow loses none; a ciphertext moved to another endpoint does not open; a wrong or
//! missing key is a clear error, never a panic; the local key-file fallback; upgrades
//! from plaintext rows. Real Postgres, real processes where the environment matters.

use crate::common;

use std::collections::HashSet;
use std::path::PathBuf;
use std::time::Duration;

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use common::*;
use hookd::db::secrets;
use sqlx::PgPool;
use uuid::Uuid;

const K1: &str = "k1:AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8=";
const K2: &str = "k2:Hx4dHBsaGRgXFhUUExIREA8ODQwLCgkIBwYFBAMCAQA=";

// ---- helpers local to this binary ----

fn tempdir() -> PathBuf {
    let d = std::env::temp_dir().join(format!("hookd-crypto-{}", Uuid::now_v7().simple()));
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// Every form in which a secret could leak: the `whsec_` text, its base64 part, and the
/// hex of its raw bytes (how a `bytea` is dumped).
fn secret_needles(secret: &str) -> Vec<String> {
    let b64 = secret.trim_start_matches("whsec_");
    let raw = STANDARD.decode(b64).unwrap();
    vec![secret.to_string(), b64.to_string(), hex(&raw)]
}

/// The same for an encryption key `<id>:<base64>`.
fn key_needles(key: &str) -> Vec<String> {
    let b64 = key.split_once(':').unwrap().1;
    vec![b64.to_string(), hex(&STANDARD.decode(b64).unwrap())]
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn assert_absent(haystack: &str, needles: &[String], what: &str) {
    for n in needles {
        assert!(
            !haystack.contains(n.as_str()),
            "{what} contains secret material {n:?}"
        );
    }
}

/// `COPY (SELECT * FROM hookd.<t>) TO STDOUT` of every table in schema hookd.
async fn dump_schema(pool: &PgPool) -> String {
    use futures::TryStreamExt;
    let tables: Vec<String> = sqlx::query_scalar(
        "SELECT tablename::text FROM pg_tables WHERE schemaname = 'hookd' ORDER BY 1",
    )
    .fetch_all(pool)
    .await
    .unwrap();
    for t in [
        "endpoint_secrets",
        "endpoints",
        "events",
        "deliveries",
        "delivery_attempts",
        "dead_letters",
    ] {
        assert!(tables.iter().any(|x| x == t), "{t} in {tables:?}");
    }
    let mut conn = pool.acquire().await.unwrap();
    let mut out = String::new();
    for t in tables {
        out.push_str(&format!("-- hookd.{t}\n"));
        let chunks: Vec<bytes::Bytes> = conn
            .copy_out_raw(&format!("COPY (SELECT * FROM hookd.{t}) TO STDOUT"))
            .await
            .unwrap()
            .try_collect()
            .await
            .unwrap();
        for c in chunks {
            out.push_str(&String::from_utf8_lossy(&c));
        }
    }
    out
}

/// (key id, ciphertext, plaintext column) of a stored secret.
type SecretRow = (Option<String>, Option<Vec<u8>>, Option<String>);

/// The secret rows of an endpoint.
async fn secret_rows(pool: &PgPool, endpoint_id: Uuid) -> Vec<SecretRow> {
    sqlx::query_as(
        "SELECT key_id, ciphertext, plaintext_secret FROM hookd.endpoint_secrets
         WHERE endpoint_id = $1 ORDER BY id",
    )
    .bind(endpoint_id)
    .fetch_all(pool)
    .await
    .unwrap()
}

async fn key_counts(pool: &PgPool) -> Vec<(Option<String>, i64)> {
    secrets::count_by_key(pool).await.unwrap()
}

/// `hookd ARGS` with no key from the test's environment: only what a test gives it.
fn without_keys(args: &[&str]) -> HookdCommand {
    HookdCommand::new(args)
        .env_remove("HOOKD_ENCRYPTION_KEY")
        .env_remove("HOOKD_ENCRYPTION_OLD_KEYS")
        .env_remove("HOOKD_ENCRYPTION_KEY_FILE")
}

/// `hookd ARGS` to completion with only the given environment besides PATH/HOME.
async fn run_hookd(args: &[&str], env: &[(&str, &str)]) -> (bool, String, String) {
    let out = without_keys(args)
        .env("HOOKD_LOG", "warn")
        .envs(env.iter().copied())
        .run()
        .await;
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// A long-running `hookd` child with only the given environment besides PATH/HOME.
struct Proc(HookdProcess);

impl Proc {
    fn spawn(args: &[&str], env: &[(&str, &str)]) -> Proc {
        Proc(without_keys(args).envs(env.iter().copied()).spawn())
    }

    /// SIGTERM, then wait; returns everything it printed.
    async fn stop(mut self) -> String {
        if self.0.is_running() {
            self.0.signal("TERM");
        }
        let _ = self.0.wait_timeout(Duration::from_secs(30)).await;
        self.0.kill();
        self.0.output()
    }
}

async fn wait_ready(port: u16) {
    assert!(
        wait_until(Duration::from_secs(30), || async {
            reqwest::get(format!("http://127.0.0.1:{port}/readyz"))
                .await
                .is_ok_and(|r| r.status().is_success())
        })
        .await,
        "component on port {port} became ready"
    );
}

fn endpoint_yaml(name: &str, namespace: &str, url: &str, secret: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Secret\nmetadata:\n  name: {name}-secret\n  namespace: {namespace}\nstringData:\n  secret: \"{secret}\"\n---\napiVersion: hookd.dev/v1alpha1\nkind: WebhookEndpoint\nmetadata:\n  name: {name}\n  namespace: {namespace}\nspec:\n  url: {url}\n  eventTypes: [\"order.*\"]\n  secretRef: {{name: {name}-secret, key: secret}}\n  secretRotationGraceSeconds: 3600\n"
    )
}

async fn wait_received(rx: &Receiver, n: usize) {
    assert!(
        wait_until(Duration::from_secs(30), || async { rx.count() >= n }).await,
        "expected {n} deliveries, got {}",
        rx.count()
    );
}

fn opts(tenant: &str, url: String) -> EndpointOpts {
    EndpointOpts {
        tenant: Some(tenant.into()),
        url,
        ..Default::default()
    }
}

async fn enqueue_sql(pool: &PgPool, tenant: &str, n: i32) -> Vec<Uuid> {
    sqlx::query_scalar(
        "SELECT hookd.enqueue($1, 'order.created', '{\"n\":' || g || '}') FROM generate_series(1, $2) g",
    )
    .bind(tenant)
    .bind(n)
    .fetch_all(pool)
    .await
    .unwrap()
}

async fn delivery_ids(pool: &PgPool, tenant: &str) -> Vec<Uuid> {
    sqlx::query_scalar("SELECT id FROM hookd.deliveries WHERE tenant = $1")
        .bind(tenant)
        .fetch_all(pool)
        .await
        .unwrap()
}

/// (status, error_class, error) of the latest attempt of a delivery.
async fn last_attempt(pool: &PgPool, id: Uuid) -> Option<(Option<String>, Option<String>)> {
    sqlx::query_as(
        "SELECT error_class, error FROM hookd.delivery_attempts WHERE delivery_id = $1
         ORDER BY attempt DESC LIMIT 1",
    )
    .bind(id)
    .fetch_optional(pool)
    .await
    .unwrap()
}

// ---- the database holds no plaintext ----

/// Two endpoints, one rotated (two live secrets), deliveries sent: a dump of every table
/// in schema hookd contains neither secret in any form, nor the encryption key. Each
/// stored secret decrypts to the declared one under the test key, bound to its endpoint.
#[sqlx::test]
async fn no_plaintext_secret_in_the_database(pool: PgPool) {
    init();
    let rx = Receiver::start(&[SECRET_A, SECRET_B]).await;
    let a = endpoint(
        &pool,
        EndpointOpts {
            name: "a".into(),
            grace_seconds: Some(3600),
            ..opts("dump", rx.url("/a"))
        },
    )
    .await;
    let b = endpoint(
        &pool,
        EndpointOpts {
            name: "b".into(),
            secret: SECRET_B.into(),
            ..opts("dump", rx.url("/b"))
        },
    )
    .await;
    // rotate a to B: both stay live
    endpoint(
        &pool,
        EndpointOpts {
            name: "a".into(),
            secret: SECRET_B.into(),
            grace_seconds: Some(3600),
            ..opts("dump", rx.url("/a"))
        },
    )
    .await;
    let d = TestDispatcher::start(&pool, dispatch_settings()).await;
    enqueue_sql(&pool, "dump", 2).await;
    wait_received(&rx, 4).await;
    d.stop().await;

    let keyring = test_keyring();
    let rows_a = secret_rows(&pool, a).await;
    assert_eq!(rows_a.len(), 2);
    for ((key_id, ct, plain), want) in rows_a.iter().zip([SECRET_A, SECRET_B]) {
        assert_eq!(plain, &None);
        let opened = keyring
            .decrypt(a, key_id.as_deref().unwrap(), ct.as_deref().unwrap())
            .unwrap();
        assert_eq!(&*opened, want);
    }
    assert_eq!(secret_rows(&pool, b).await.len(), 1);

    let dump = dump_schema(&pool).await;
    assert!(
        dump.contains("-- hookd.endpoint_secrets") && dump.contains("test-k1"),
        "dump has the rows"
    );
    let mut needles = secret_needles(SECRET_A);
    needles.extend(secret_needles(SECRET_B));
    needles.extend(key_needles(TEST_ENCRYPTION_KEY));
    assert_absent(&dump, &needles, "the database dump");
}

// ---- the full flow: logs, errors, metrics, API ----

/// `hookd apply`, `hookd api`, `hookd dispatch` and `hookd rekey` as real processes with
/// logs at debug: apply, deliveries, a signing-secret rotation, a failed rekey (key
/// missing), a key rotation with dispatchers restarted on the new keyring, the rekey,
/// more deliveries. Every log line, error, /metrics page and API answer, and a dump of
/// every table, is searched for both signing secrets (text, base64, raw hex) and both
/// encryption keys.
#[sqlx::test]
async fn secrets_never_appear_in_logs_errors_metrics_or_the_api(pool: PgPool) {
    init();
    let dir = tempdir();
    let db = database_url(&pool);
    let rx = Receiver::start(&[SECRET_A, SECRET_B]).await;
    let yaml = dir.join("endpoint.yaml");
    let mut haystack = String::new();
    let with = |extra: &[(&'static str, &'static str)]| -> Vec<(&'static str, String)> {
        [
            ("HOOKD_LOG", "debug".to_string()),
            ("DATABASE_URL", db.clone()),
        ]
        .into_iter()
        .chain(extra.iter().map(|(k, v)| (*k, v.to_string())))
        .collect()
    };

    async fn hookd(args: &[&str], env: &[(&str, String)], haystack: &mut String) -> bool {
        let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
        let (ok, out, err) = run_hookd(args, &env).await;
        haystack.push_str(&out);
        haystack.push_str(&err);
        ok
    }

    std::fs::write(
        &yaml,
        endpoint_yaml("logs", "shop", &rx.url("/hook"), SECRET_A),
    )
    .unwrap();
    let k1_env = with(&[("HOOKD_ENCRYPTION_KEY", K1)]);
    assert!(
        hookd(
            &["apply", "-f", yaml.to_str().unwrap()],
            &k1_env,
            &mut haystack
        )
        .await,
        "{haystack}"
    );

    let (api_port, d1_port, d2_port) = (free_port(), free_port(), free_port());
    let api_listen = format!("127.0.0.1:{api_port}");
    let api = Proc::spawn(
        &["api"],
        &[
            ("DATABASE_URL", &db),
            ("HOOKD_LOG", "debug"),
            ("HOOKD_LISTEN", &api_listen),
            ("HOOKD_AUTH", "none"),
        ],
    );
    let spawn_dispatch = |key: &str, old: &str, port: u16| {
        let listen = format!("127.0.0.1:{port}");
        Proc::spawn(
            &["dispatch"],
            &[
                ("DATABASE_URL", db.as_str()),
                ("HOOKD_LOG", "debug"),
                ("HOOKD_LISTEN", listen.as_str()),
                ("HOOKD_ALLOWED_DESTINATIONS", "127.0.0.0/8"),
                ("HOOKD_POLL_MS", "100"),
                ("HOOKD_ENCRYPTION_KEY", key),
                ("HOOKD_ENCRYPTION_OLD_KEYS", old),
            ],
        )
    };
    let d1 = spawn_dispatch(K1, "", d1_port);
    wait_ready(api_port).await;
    wait_ready(d1_port).await;

    let http = reqwest::Client::new();
    let send = |i: usize| {
        let http = http.clone();
        async move {
            let r = http
                .post(format!("http://127.0.0.1:{api_port}/v1/messages"))
                .header("content-type", "application/json")
                .body(format!(
                    r#"{{"tenant":"shop","eventType":"order.created","payload":{{"i":{i}}}}}"#
                ))
                .send()
                .await
                .unwrap();
            assert_eq!(r.status(), 201);
            r.json::<serde_json::Value>().await.unwrap()
        }
    };
    for i in 0..3 {
        send(i).await;
    }
    wait_received(&rx, 3).await;

    // signing-secret rotation through apply: both secrets sign during the grace period
    std::fs::write(
        &yaml,
        endpoint_yaml("logs", "shop", &rx.url("/hook"), SECRET_B),
    )
    .unwrap();
    assert!(
        hookd(
            &["apply", "-f", yaml.to_str().unwrap()],
            &k1_env,
            &mut haystack
        )
        .await
    );
    assert!(haystack.contains("secret rotated"), "{haystack}");
    for i in 3..6 {
        send(i).await;
    }
    wait_received(&rx, 6).await;

    // an error path: rekey to k2 without k1 configured cannot open the rows
    let k2_only = with(&[("HOOKD_ENCRYPTION_KEY", K2)]);
    assert!(!hookd(&["rekey"], &k2_only, &mut haystack).await);
    assert!(haystack.contains("could not be re-encrypted"), "{haystack}");

    // key rotation: dispatchers restart with k2 active and k1 old, then rekey
    let d1_log = d1.stop().await;
    let d2 = spawn_dispatch(K2, K1, d2_port);
    wait_ready(d2_port).await;
    let rotated = with(&[
        ("HOOKD_ENCRYPTION_KEY", K2),
        ("HOOKD_ENCRYPTION_OLD_KEYS", K1),
    ]);
    assert!(
        hookd(&["rekey"], &rotated, &mut haystack).await,
        "{haystack}"
    );
    assert!(
        haystack.contains("re-encrypted 2 secret(s) from key k1 to key k2"),
        "{haystack}"
    );
    assert_eq!(key_counts(&pool).await, vec![(Some("k2".to_string()), 2)]);
    let mut last = serde_json::Value::Null;
    for i in 6..9 {
        last = send(i).await;
    }
    wait_received(&rx, 9).await;
    for r in rx.all() {
        assert!(r.verified_by.iter().any(|v| *v), "every delivery verifies");
    }
    assert!(
        rx.all()[3..]
            .iter()
            .all(|r| r.verified_by == vec![true, true])
    );

    // API answers and metrics pages
    let event_id = last["eventId"].as_str().unwrap();
    let delivery_id = last["deliveryIds"][0].as_str().unwrap();
    for url in [
        format!("http://127.0.0.1:{api_port}/v1/messages/{event_id}"),
        format!("http://127.0.0.1:{api_port}/v1/deliveries/{delivery_id}"),
        format!("http://127.0.0.1:{api_port}/metrics"),
        format!("http://127.0.0.1:{d2_port}/metrics"),
    ] {
        let body = http.get(&url).send().await.unwrap().text().await.unwrap();
        assert!(!body.is_empty(), "{url}");
        haystack.push_str(&body);
    }
    haystack.push_str(&d1_log);
    haystack.push_str(&d2.stop().await);
    haystack.push_str(&api.stop().await);

    // the logs really were at debug level, with the database statements
    assert!(haystack.contains("DEBUG"), "debug logs captured");
    assert!(
        haystack.contains("hookd.endpoint_secrets"),
        "statement logs captured"
    );
    assert!(
        haystack.contains("hookd_secret_decryptions_total"),
        "dispatcher metrics captured"
    );

    let mut needles = secret_needles(SECRET_A);
    needles.extend(secret_needles(SECRET_B));
    needles.extend(key_needles(K1));
    needles.extend(key_needles(K2));
    assert_absent(&haystack, &needles, "logs, errors, metrics or API answers");
    assert_absent(&dump_schema(&pool).await, &needles, "the database dump");
    let _ = std::fs::remove_dir_all(&dir);
}

// ---- rekey while deliveries flow ----

/// 24 endpoints (half of them mid-rotation, so 36 secret rows) under k1; a dispatcher
/// with k2 active and k1 old delivers a steady stream to a receiver that is a little
/// slow, and `rekey` runs in batches of 3 while deliveries are in flight. Afterwards
/// every delivery id arrived and verified with the official verifier, every row
/// succeeded, every secret is under k2, and a second rekey changes nothing.
#[sqlx::test]
async fn rekey_while_deliveries_flow_loses_none_and_all_verify(pool: PgPool) {
    init();
    let rx = Receiver::start(&[SECRET_A, SECRET_B]).await;
    rx.set(Behavior {
        delay: Duration::from_millis(5),
        ..Default::default()
    });
    let old = keyring(K1, "");
    for i in 0..24 {
        let o = EndpointOpts {
            name: format!("r{i}"),
            grace_seconds: Some(3600),
            ..opts("rekey", rx.url("/r"))
        };
        endpoint_with_keyring(&pool, o.clone(), &old).await;
        if i % 2 == 0 {
            endpoint_with_keyring(
                &pool,
                EndpointOpts {
                    secret: SECRET_B.into(),
                    ..o
                },
                &old,
            )
            .await;
        }
    }
    assert_eq!(key_counts(&pool).await, vec![(Some("k1".to_string()), 36)]);

    let rotating = std::sync::Arc::new(keyring(K2, K1));
    let cfg = hookd::dispatch::DispatchConfig::from_settings(&dispatch_settings()).unwrap();
    let d = TestDispatcher::start_with(&pool, cfg, rotating.clone()).await;

    // a steady producer: 5 events (120 deliveries) every 20 ms until told to stop
    let stop = tokio_util::sync::CancellationToken::new();
    let producer = {
        let (pool, stop) = (pool.clone(), stop.clone());
        tokio::spawn(async move {
            let mut n = 0;
            while !stop.is_cancelled() {
                n += enqueue_sql(&pool, "rekey", 5).await.len();
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            n
        })
    };
    wait_received(&rx, 200).await;
    let in_flight: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM hookd.deliveries WHERE status IN ('pending', 'in_progress')",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert!(in_flight > 0, "deliveries are flowing when rekey starts");
    let before = rx.count();
    let started = std::time::Instant::now();
    let report = hookd::rekey::rekey(&pool, &rotating, 3).await.unwrap();
    let took = started.elapsed();
    let during = rx.count() - before;
    // A rekey can finish in a few milliseconds, between two of a loaded machine's arrivals
    // (2 of 8 runs on this 2-core machine under load); one that takes longer must not pause
    // the flow.
    assert!(
        during > 0 || took < Duration::from_millis(250),
        "no delivery arrived while rekey ran for {took:?}"
    );
    assert_eq!(report.reencrypted.get("k1"), Some(&36));
    assert!(report.unreadable.is_empty());
    assert_eq!(key_counts(&pool).await, vec![(Some("k2".to_string()), 36)]);
    // keep producing under the new key for a while
    let after_rekey = rx.count();
    wait_received(&rx, after_rekey + 200).await;
    stop.cancel();
    let events = producer.await.unwrap();

    let ids: Vec<Uuid> = delivery_ids(&pool, "rekey").await;
    assert_eq!(ids.len(), events * 24);
    assert!(
        wait_until(Duration::from_secs(60), || async {
            let open: i64 = sqlx::query_scalar(
                "SELECT count(*) FROM hookd.deliveries WHERE status <> 'succeeded'",
            )
            .fetch_one(&pool)
            .await
            .unwrap();
            open == 0
        })
        .await,
        "every delivery succeeded"
    );
    d.stop().await;
    let received: HashSet<String> = rx.ids().into_iter().collect();
    let missing: Vec<&Uuid> = ids
        .iter()
        .filter(|id| !received.contains(&id.to_string()))
        .collect();
    assert!(missing.is_empty(), "dropped {} deliveries", missing.len());
    for r in rx.all() {
        assert!(
            r.verified_by.iter().any(|v| *v),
            "{} did not verify",
            r.webhook_id
        );
    }
    let unreadable: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM hookd.delivery_attempts WHERE error_class = 'secret_unreadable'",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(unreadable, 0);
    println!("delivered {} ({} while rekey ran)", ids.len(), during);

    let again = hookd::rekey::rekey(&pool, &rotating, 3).await.unwrap();
    assert_eq!(again.changed(), 0, "rekey is idempotent");
}

// ---- ciphertexts are bound to their endpoint ----

/// Endpoint B's secret row is overwritten with endpoint A's ciphertext and key id (a
/// database-level swap). B's delivery is never sent: its attempt is logged as
/// `secret_unreadable` with a reason and no secret, and it waits for a retry. A's keeps
/// working, and opening A's ciphertext for B fails in the keyring too.
#[sqlx::test]
async fn ciphertext_moved_to_another_endpoint_does_not_decrypt(pool: PgPool) {
    init();
    let rx_a = Receiver::start(&[SECRET_A]).await;
    let rx_b = Receiver::start(&[SECRET_A, SECRET_B]).await;
    let a = endpoint(
        &pool,
        EndpointOpts {
            name: "a".into(),
            ..opts("moved-a", rx_a.url("/a"))
        },
    )
    .await;
    let b = endpoint(
        &pool,
        EndpointOpts {
            name: "b".into(),
            secret: SECRET_B.into(),
            ..opts("moved-b", rx_b.url("/b"))
        },
    )
    .await;
    let (key_id, ct, _) = secret_rows(&pool, a).await.remove(0);
    let (key_id, ct) = (key_id.unwrap(), ct.unwrap());
    assert!(test_keyring().decrypt(b, &key_id, &ct).is_err());
    sqlx::query(
        "UPDATE hookd.endpoint_secrets SET key_id = $2, ciphertext = $3 WHERE endpoint_id = $1",
    )
    .bind(b)
    .bind(&key_id)
    .bind(&ct)
    .execute(&pool)
    .await
    .unwrap();

    let d = TestDispatcher::start(&pool, dispatch_settings()).await;
    enqueue_sql(&pool, "moved-a", 1).await;
    enqueue_sql(&pool, "moved-b", 1).await;
    wait_received(&rx_a, 1).await;
    let b_delivery = delivery_ids(&pool, "moved-b").await[0];
    assert!(
        wait_until(Duration::from_secs(10), || async {
            last_attempt(&pool, b_delivery).await.is_some()
        })
        .await
    );
    let (class, error) = last_attempt(&pool, b_delivery).await.unwrap();
    assert_eq!(class.as_deref(), Some("secret_unreadable"));
    let error = error.unwrap();
    assert!(
        error.contains("authentication failed") && error.contains(&b.to_string()),
        "{error}"
    );
    assert_absent(&error, &secret_needles(SECRET_A), "the attempt error");
    assert_eq!(
        delivery_status(&pool, b_delivery).await,
        ("failed".to_string(), 0),
        "held for a retry, not dead, and the attempt not counted (issue 19)"
    );
    assert_eq!(rx_b.count(), 0, "never sent, signed or unsigned");
    assert!(d.metrics.secret_decrypt_failures.get() >= 1);
    d.stop().await;
}

// ---- wrong or missing keys ----

/// Wrong and missing keys end in clear messages and non-zero exits, never a panic, and
/// never echo the key: a malformed HOOKD_ENCRYPTION_KEY, a key of the wrong length, a
/// key file that cannot be created; a dispatcher whose key has the right id but wrong
/// bytes, or lacks the id, holds the deliveries with a reason; `hookd rekey` without the
/// old key leaves the rows alone and says which key to add. `--help` never shows a
/// configured key.
#[sqlx::test]
async fn wrong_or_missing_key_is_a_clear_error_not_a_panic(pool: PgPool) {
    init();
    let db = database_url(&pool);
    let dir = tempdir();
    let cases: [(&str, &str, &str); 3] = [
        ("dispatch", "k1:c2hvcnQ=", "must decode to 32 bytes, got 5"),
        (
            "dispatch",
            "AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8=",
            "is not of the form <key-id>:<base64 of 32 bytes>",
        ),
        ("rekey", "k1:!!!", "is not valid base64"),
    ];
    for (cmd, key, want) in cases {
        let (ok, out, err) = run_hookd(
            &[cmd],
            &[("DATABASE_URL", &db), ("HOOKD_ENCRYPTION_KEY", key)],
        )
        .await;
        assert!(!ok, "{cmd} with a bad key exits non-zero");
        assert!(
            err.contains("HOOKD_ENCRYPTION_KEY") && err.contains(want),
            "{err}"
        );
        assert!(!err.contains("panicked"), "{err}");
        let key_part = key.rsplit(':').next().unwrap();
        assert!(
            !err.contains(key_part) && !out.contains(key_part),
            "echoed the key: {err}"
        );
    }
    // a key file that cannot be created (its parent is a regular file)
    let blocker = dir.join("file");
    std::fs::write(&blocker, "x").unwrap();
    let yaml = dir.join("ep.yaml");
    std::fs::write(
        &yaml,
        endpoint_yaml("k", "keys", "https://receiver.example.com/h", SECRET_A),
    )
    .unwrap();
    let key_file = blocker.join("hookd/encryption-key");
    let (ok, _, err) = run_hookd(
        &["apply", "-f", yaml.to_str().unwrap()],
        &[
            ("DATABASE_URL", &db),
            ("HOOKD_ENCRYPTION_KEY_FILE", key_file.to_str().unwrap()),
        ],
    )
    .await;
    assert!(!ok);
    assert!(
        err.contains("cannot be created") && err.contains("set HOOKD_ENCRYPTION_KEY="),
        "{err}"
    );
    assert!(!err.contains("panicked"), "{err}");
    // --help shows where a key comes from, never the key
    let (ok, out, _) = run_hookd(&["dispatch", "--help"], &[("HOOKD_ENCRYPTION_KEY", K1)]).await;
    assert!(ok && out.contains("HOOKD_ENCRYPTION_KEY"), "{out}");
    assert_absent(&out, &key_needles(K1), "--help");

    // deliveries under a key the dispatcher cannot open are held with a reason
    let rx = Receiver::start(&[SECRET_A]).await;
    endpoint(&pool, opts("keys", rx.url("/k"))).await;
    let wrong_bytes = format!("test-k1:{}", K2.split_once(':').unwrap().1);
    for (ring, want) in [
        (
            keyring(&wrong_bytes, ""),
            "authentication failed under key \"test-k1\"",
        ),
        (
            keyring(K2, ""),
            "key \"test-k1\", which is not configured (add it to HOOKD_ENCRYPTION_OLD_KEYS",
        ),
    ] {
        let cfg = hookd::dispatch::DispatchConfig::from_settings(&dispatch_settings()).unwrap();
        let d = TestDispatcher::start_with(&pool, cfg, std::sync::Arc::new(ring)).await;
        let ev = enqueue_sql(&pool, "keys", 1).await[0];
        let id: Uuid = sqlx::query_scalar("SELECT id FROM hookd.deliveries WHERE event_id = $1")
            .bind(ev)
            .fetch_one(&pool)
            .await
            .unwrap();
        assert!(
            wait_until(Duration::from_secs(10), || async {
                last_attempt(&pool, id).await.is_some()
            })
            .await
        );
        d.stop().await;
        let (class, error) = last_attempt(&pool, id).await.unwrap();
        assert_eq!(class.as_deref(), Some("secret_unreadable"));
        assert!(error.as_deref().unwrap().contains(want), "{error:?}");
        assert_eq!(
            delivery_status(&pool, id).await,
            ("failed".to_string(), 0),
            "held, not counted"
        );
    }
    assert_eq!(rx.count(), 0);
    // ... and the endpoint's status says why (issue 19), until a send goes out again
    let ep_id: Uuid = sqlx::query_scalar("SELECT id FROM hookd.endpoints WHERE tenant = 'keys'")
        .fetch_one(&pool)
        .await
        .unwrap();
    let st = hookd::db::endpoints::stats(&pool, ep_id, 10)
        .await
        .unwrap()
        .unwrap();
    let why = st
        .secret_unreadable
        .expect("the endpoint names the unreadable secret");
    assert!(why.contains("test-k1"), "{why}");
    assert!(st.secret_unreadable_since.is_some());
    sqlx::query("UPDATE hookd.deliveries SET visible_at = now() WHERE status = 'failed'")
        .execute(&pool)
        .await
        .unwrap();
    let cfg = hookd::dispatch::DispatchConfig::from_settings(&dispatch_settings()).unwrap();
    let d = TestDispatcher::start_with(&pool, cfg, test_keyring()).await;
    assert!(wait_until(Duration::from_secs(10), || async { rx.count() >= 2 }).await);
    assert!(
        wait_until(Duration::from_secs(5), || async {
            hookd::db::endpoints::stats(&pool, ep_id, 10)
                .await
                .unwrap()
                .unwrap()
                .secret_unreadable
                .is_none()
        })
        .await,
        "a send clears the reason"
    );
    d.stop().await;

    // rekey without the old key: rows untouched, the missing key named
    let (ok, out, err) = run_hookd(
        &["rekey"],
        &[("DATABASE_URL", &db), ("HOOKD_ENCRYPTION_KEY", K2)],
    )
    .await;
    assert!(!ok);
    assert!(
        err.contains("could not be re-encrypted")
            && err.contains("\"test-k1\"")
            && err.contains("HOOKD_ENCRYPTION_OLD_KEYS"),
        "{err}"
    );
    assert!(out.contains("1 under key test-k1"), "{out}");
    assert_eq!(
        key_counts(&pool).await,
        vec![(Some("test-k1".to_string()), 1)]
    );
    let _ = std::fs::remove_dir_all(&dir);
}

// ---- the local key file ----

/// The earlier acceptance flow, `hookd apply -f` then `hookd dispatch` with only
/// DATABASE_URL set: apply creates the local key file (mode 0600, under XDG_DATA_HOME)
/// with a warning that production must set HOOKD_ENCRYPTION_KEY, the dispatcher finds
/// the same file, and the delivery verifies. Nothing is stored in plaintext.
#[sqlx::test]
async fn without_a_key_apply_and_dispatch_share_the_local_key_file(pool: PgPool) {
    init();
    let db = database_url(&pool);
    let dir = tempdir();
    let rx = Receiver::start(&[SECRET_A]).await;
    let yaml = dir.join("ep.yaml");
    std::fs::write(
        &yaml,
        endpoint_yaml("local", "laptop", &rx.url("/l"), SECRET_A),
    )
    .unwrap();
    let xdg = dir.join("data");
    let home = dir.join("home");
    let env = [
        ("DATABASE_URL", db.as_str()),
        ("XDG_DATA_HOME", xdg.to_str().unwrap()),
        ("HOME", home.to_str().unwrap()),
    ];
    let (ok, out, err) = run_hookd(&["apply", "-f", yaml.to_str().unwrap()], &env).await;
    assert!(ok, "{err}");
    assert!(
        out.contains("webhookendpoint/laptop/local created"),
        "{out}"
    );
    assert!(
        err.contains("production must set HOOKD_ENCRYPTION_KEY"),
        "{err}"
    );
    let key_file = xdg.join("hookd/encryption-key");
    assert!(err.contains(key_file.to_str().unwrap()), "{err}");
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&key_file).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
    }
    let key_text = std::fs::read_to_string(&key_file).unwrap();
    assert!(key_text.starts_with("local-"));

    let port = free_port();
    let listen = format!("127.0.0.1:{port}");
    let mut denv: Vec<(&str, &str)> = env.to_vec();
    denv.extend([
        ("HOOKD_LISTEN", listen.as_str()),
        ("HOOKD_ALLOWED_DESTINATIONS", "127.0.0.0/8"),
        ("HOOKD_POLL_MS", "100"),
        ("HOOKD_LOG", "info"),
    ]);
    let d = Proc::spawn(&["dispatch"], &denv);
    wait_ready(port).await;
    enqueue_sql(&pool, "laptop", 1).await;
    wait_received(&rx, 1).await;
    assert_eq!(rx.all()[0].verified_by, vec![true]);
    let log = d.stop().await;
    assert!(log.contains("using the local encryption key file"), "{log}");
    assert_eq!(
        std::fs::read_to_string(&key_file).unwrap(),
        key_text,
        "the file is reused, not replaced"
    );
    let mut needles = secret_needles(SECRET_A);
    needles.extend(key_needles(key_text.trim()));
    assert_absent(&dump_schema(&pool).await, &needles, "the database dump");
    assert_absent(&log, &needles, "the dispatcher log");
    let _ = std::fs::remove_dir_all(&dir);
}

// ---- upgrades from plaintext rows ----

/// Turns an endpoint's stored secret back into the pre-0004 form (plaintext column, bare
/// SHA-256 fingerprint), as an upgraded database has it.
async fn make_legacy(pool: &PgPool, endpoint_id: Uuid, secret: &str) {
    use sha2::Digest;
    sqlx::query(
        "UPDATE hookd.endpoint_secrets SET plaintext_secret = $2, key_id = NULL, ciphertext = NULL,
                fingerprint = $3 WHERE endpoint_id = $1",
    )
    .bind(endpoint_id)
    .bind(secret)
    .bind(sha2::Sha256::digest(secret.as_bytes()).to_vec())
    .execute(pool)
    .await
    .unwrap();
}

/// An upgraded database still holds plaintext rows. Re-applying the same secret is not
/// taken for a rotation; the claim never hands a plaintext row to a worker; `hookd
/// rekey` encrypts them, clears the column and compacts the table; a dispatcher started
/// on an upgraded database encrypts them by itself; deliveries verify afterwards.
#[sqlx::test]
async fn plaintext_rows_from_an_upgrade_are_encrypted(pool: PgPool) {
    init();
    let db = database_url(&pool);
    let rx = Receiver::start(&[SECRET_A, SECRET_B]).await;
    let o = EndpointOpts {
        name: "legacy".into(),
        ..opts("legacy", rx.url("/l"))
    };
    let a = endpoint(&pool, o.clone()).await;
    make_legacy(&pool, a, SECRET_A).await;
    let again = {
        let desired = hookd::k8s::sync::desired_endpoint(
            &webhook_endpoint(&o),
            hookd::k8s::sync::resolve_secret(
                &o.namespace,
                "legacy-secret",
                "secret",
                Some(&secret(&o.namespace, "legacy-secret", SECRET_A)),
            ),
        );
        let mut conn = pool.acquire().await.unwrap();
        hookd::k8s::sync::apply_endpoint(&mut conn, &desired, &test_keyring())
            .await
            .unwrap()
    };
    assert!(
        !again.secret_rotated && again.active_secrets == 1,
        "{again:?}"
    );
    assert_eq!(key_counts(&pool).await, vec![(None, 1)]);
    // a plaintext row is never used: nothing to sign with, so nothing is sent
    let ev = enqueue_sql(&pool, "legacy", 1).await[0];
    let claimed = hookd::db::deliveries::claim(
        &pool,
        &hookd::db::deliveries::ClaimRequest {
            worker_id: Uuid::now_v7(),
            limit: 10,
            lease_secs: 1.0,
            per_endpoint_cap: 10,
            busy: vec![],
            now: None,
            default_max_attempts: 8,
        },
    )
    .await
    .unwrap();
    assert_eq!(claimed.len(), 1);
    assert!(claimed[0].secret_ids.is_empty() && claimed[0].event_id == ev);

    let (ok, out, err) = run_hookd(
        &["rekey"],
        &[("DATABASE_URL", &db), (TEST_KEY_ENV, TEST_ENCRYPTION_KEY)],
    )
    .await;
    assert!(ok, "{err}");
    assert!(
        out.contains(
            "encrypted 1 secret(s) stored in plaintext before the upgrade; plaintext cleared"
        ),
        "{out}"
    );
    assert!(out.contains("compacted hookd.endpoint_secrets"), "{out}");
    assert!(
        out.contains("signing secrets now: 1 under key test-k1"),
        "{out}"
    );
    let (ok, out, _) = run_hookd(
        &["rekey"],
        &[("DATABASE_URL", &db), (TEST_KEY_ENV, TEST_ENCRYPTION_KEY)],
    )
    .await;
    assert!(ok && out.contains("nothing to do"), "{out}");

    // a second endpoint left in plaintext; a dispatcher process starts and encrypts it
    let b = endpoint(
        &pool,
        EndpointOpts {
            name: "legacy-b".into(),
            secret: SECRET_B.into(),
            ..opts("legacy-b", rx.url("/b"))
        },
    )
    .await;
    make_legacy(&pool, b, SECRET_B).await;
    let port = free_port();
    let listen = format!("127.0.0.1:{port}");
    let d = Proc::spawn(
        &["dispatch"],
        &[
            ("DATABASE_URL", &db),
            (TEST_KEY_ENV, TEST_ENCRYPTION_KEY),
            ("HOOKD_LISTEN", &listen),
            ("HOOKD_ALLOWED_DESTINATIONS", "127.0.0.0/8"),
            ("HOOKD_POLL_MS", "100"),
            ("HOOKD_RETRY_SCHEDULE", "1"),
            ("HOOKD_RETRY_JITTER", "0"),
        ],
    );
    wait_ready(port).await;
    assert_eq!(
        key_counts(&pool).await,
        vec![(Some("test-k1".to_string()), 2)]
    );
    enqueue_sql(&pool, "legacy-b", 1).await;
    // the delivery held earlier (claimed with no secret) and the new one both arrive
    wait_received(&rx, 2).await;
    for r in rx.all() {
        assert!(r.verified_by.iter().any(|v| *v));
    }
    let log = d.stop().await;
    assert!(
        log.contains("encrypted signing secrets left in plaintext by an upgrade"),
        "{log}"
    );
    let mut needles = secret_needles(SECRET_A);
    needles.extend(secret_needles(SECRET_B));
    assert_absent(&dump_schema(&pool).await, &needles, "the database dump");
}

// ---- the hot path ----

/// 150 deliveries to one endpoint with two live secrets run the AEAD twice: once per
/// secret row, not once per delivery.
#[sqlx::test]
async fn decryption_runs_once_per_secret_row_not_per_delivery(pool: PgPool) {
    init();
    let rx = Receiver::start(&[SECRET_A, SECRET_B]).await;
    let o = EndpointOpts {
        grace_seconds: Some(3600),
        ..opts("hot", rx.url("/h"))
    };
    endpoint(&pool, o.clone()).await;
    endpoint(
        &pool,
        EndpointOpts {
            secret: SECRET_B.into(),
            ..o
        },
    )
    .await;
    let d = TestDispatcher::start(&pool, dispatch_settings()).await;
    enqueue_sql(&pool, "hot", 150).await;
    wait_received(&rx, 150).await;
    assert!(rx.all().iter().all(|r| r.verified_by == vec![true, true]));
    assert_eq!(d.metrics.secret_decryptions.get(), 2);
    assert_eq!(d.metrics.secret_decrypt_failures.get(), 0);
    d.stop().await;
}
