//! Issue 17 ("the first hour") and the issue 19 items that meet a new user first: API
//! answers of the documented shape for surprising bodies and methods, database mistakes
//! answered once with what to do, `--help` that shows no credentials, and `hookd dev`
//! that leaves no Postgres behind however it dies and runs from any directory.

use crate::common;

use std::time::Duration;

use common::*;
use reqwest::StatusCode;
use sqlx::PgPool;

/// A JSON array is not a message: serde's derive would read it as the fields in order.
#[sqlx::test]
async fn array_bodies_are_refused_with_the_error_shape(pool: PgPool) {
    endpoint(&pool, EndpointOpts::default()).await;
    let api = TestApi::start(&pool).await;
    let (status, v) = api
        .post(
            "/v1/messages",
            r#"[null,"invoice.paid",{"invoice":"in_1"},null]"#,
        )
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{v}");
    assert_eq!(v["error"]["code"], "malformed_json", "{v}");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("must be a JSON object"),
        "{v}"
    );
    let (status, v) = api
        .post(
            "/v1/messages/batch",
            r#"[[{"eventType":"a.b","payload":1}]]"#,
        )
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{v}");
    assert_eq!(v["error"]["code"], "malformed_json", "{v}");
    // a message of a batch given as an array
    let (status, v) = api
        .post(
            "/v1/messages/batch",
            r#"{"messages":[[null,"invoice.paid",{"a":1},null]]}"#,
        )
        .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{v}");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("a JSON object"),
        "{v}"
    );
    // nothing was written by any of them
    let events: i64 = sqlx::query_scalar("SELECT count(*) FROM hookd.events")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(events, 0);
    // the object forms still work
    let (status, v) = api
        .post(
            "/v1/messages/batch",
            r#"{"messages":[{"eventType":"a.b","payload":1}]}"#,
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{v}");
}

/// 405 answers carry the documented `{"error": {...}}` body and the Allow header.
#[sqlx::test]
async fn method_not_allowed_has_a_json_body(pool: PgPool) {
    let api = TestApi::start(&pool).await;
    let r = api
        .request_as(DEFAULT_TENANT, reqwest::Method::DELETE, "/v1/messages")
        .await
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::METHOD_NOT_ALLOWED);
    assert_eq!(
        r.headers()["content-type"].to_str().unwrap(),
        "application/json"
    );
    assert!(r.headers().contains_key("allow"), "{:?}", r.headers());
    let v: serde_json::Value = r.json().await.unwrap();
    assert_eq!(v["error"]["code"], "method_not_allowed", "{v}");
    assert!(
        v["error"]["message"].as_str().unwrap().contains("DELETE"),
        "{v}"
    );
}

/// `attempts` is a number in a message's delivery summaries and the attempt log in
/// `GET /v1/deliveries/{id}`; both also carry the number as `attemptCount`. The delivery
/// shows its endpoint's state, so a held delivery says why.
#[sqlx::test]
async fn attempt_count_and_endpoint_state_are_shown(pool: PgPool) {
    let ep = endpoint(&pool, EndpointOpts::default()).await;
    let api = TestApi::start(&pool).await;
    let (event, deliveries) = api.enqueue(DEFAULT_TENANT, "a.b", "1").await;
    let (status, m) = api.get(&format!("/v1/messages/{event}")).await;
    assert_eq!(status, StatusCode::OK, "{m}");
    assert_eq!(m["deliveries"][0]["attempts"], 0);
    assert_eq!(m["deliveries"][0]["attemptCount"], 0);

    sqlx::query("UPDATE hookd.endpoints SET state = 'disabled', state_reason = 'receiver answered 410 Gone' WHERE id = $1")
        .bind(ep)
        .execute(&pool)
        .await
        .unwrap();
    let (status, d) = api.get(&format!("/v1/deliveries/{}", deliveries[0])).await;
    assert_eq!(status, StatusCode::OK, "{d}");
    assert_eq!(d["attemptCount"], 0);
    assert!(d["attempts"].is_array());
    assert_eq!(d["endpoint"]["state"], "disabled", "{d}");
    assert_eq!(
        d["endpoint"]["stateReason"], "receiver answered 410 Gone",
        "{d}"
    );
    assert_eq!(d["endpoint"]["circuitState"], "closed", "{d}");
}

fn hookd(args: &[&str], envs: &[(&str, &str)]) -> (bool, String, String) {
    let out = HookdCommand::new(args)
        .env("HOOKD_LOG", "warn")
        .envs(envs.iter().copied())
        .output();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Database mistakes are answered once, naming the host and database, with what to do.
#[sqlx::test]
async fn database_mistakes_get_one_clear_line(pool: PgPool) {
    // not a URL at all
    let (ok, _, err) = hookd(&["migrate"], &[("DATABASE_URL", "localhost:5432/hookd")]);
    assert!(!ok);
    assert!(err.contains("is not a postgres:// URL"), "{err}");
    assert!(
        err.contains("postgres://USER[:PASSWORD]@HOST[:PORT]/DATABASE"),
        "{err}"
    );
    assert!(!err.contains("anonymous"), "{err}");
    assert_eq!(err.matches("hookd: error").count(), 1, "{err}");

    // a database that does not exist, on a server that does
    let base = database_url(&pool);
    let (prefix, _) = base.rsplit_once('/').unwrap();
    let missing = format!("{prefix}/no_such_db_{}", uuid::Uuid::now_v7().simple());
    for args in [&["migrate"][..], &["token", "list"][..]] {
        let (ok, _, err) = hookd(args, &[("DATABASE_URL", &missing)]);
        assert!(!ok);
        assert!(err.contains("cannot connect to Postgres at"), "{err}");
        assert!(err.contains("does not exist"), "{err}");
        assert!(err.contains("createdb"), "{err}");
        assert_eq!(
            err.lines().filter(|l| l.contains("does not exist")).count(),
            1,
            "printed once: {err}"
        );
    }

    // nothing listening: refused at once, not a pool timeout
    let port = free_port();
    let started = std::time::Instant::now();
    let (ok, _, err) = hookd(
        &["token", "list"],
        &[(
            "DATABASE_URL",
            &format!("postgres://postgres:hunter2@127.0.0.1:{port}/hookd"),
        )],
    );
    assert!(!ok);
    assert!(err.contains(&format!("127.0.0.1:{port}")), "{err}");
    assert!(err.contains("connection refused"), "{err}");
    assert!(err.contains("is Postgres running"), "{err}");
    assert!(!err.contains("hunter2"), "{err}");
    assert!(
        started.elapsed() < Duration::from_secs(4),
        "{:?}",
        started.elapsed()
    );
}

/// `--help` never prints the value of DATABASE_URL (a password) or other secrets.
#[test]
fn help_hides_credentials_from_the_environment() {
    let envs = [
        ("DATABASE_URL", "postgres://hookd:hunter2@db:5432/hookd"),
        (
            "HOOKD_RECEIVER_SECRETS",
            "whsec_3q8JNv6QYhT0mZf1xk2Wc9bLr4sPaGdE",
        ),
        (
            "HOOKD_ENCRYPTION_KEY",
            "k1:c2VjcmV0c2VjcmV0c2VjcmV0c2VjcmV0c2VjcmV0MTI=",
        ),
    ];
    for sub in [
        "migrate",
        "api",
        "dispatch",
        "controller",
        "apply",
        "dev",
        "receiver",
        "rekey",
        "prune",
    ] {
        let (ok, out, _) = hookd(&[sub, "--help"], &envs);
        assert!(ok, "{sub} --help");
        for secret in ["hunter2", "3q8JNv6QYhT0mZf1", "c2VjcmV0c2VjcmV0"] {
            assert!(!out.contains(secret), "{sub} --help shows {secret}: {out}");
        }
    }
    let (ok, out, _) = hookd(&["token", "create", "--help"], &envs);
    assert!(ok);
    assert!(!out.contains("hunter2"), "{out}");
}

/// `hookd bench` (the bench is the hookd-bench crate now) answers old scripts with the
/// command to run and exit status 2, not an unknown-subcommand error; `--help` hides it.
#[test]
fn bench_names_the_command_that_replaced_it() {
    let out = HookdCommand::new(["bench", "--quick", "--only", "claim"]).output();
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.ends_with("cargo run --release -p hookd-bench -- --quick --only claim\n"),
        "{err}"
    );
    let (ok, help, _) = hookd(&["--help"], &[]);
    assert!(ok);
    assert!(
        !help.lines().any(|l| l.trim_start().starts_with("bench")),
        "{help}"
    );
}

/// Postgres processes whose command line names `dir`.
fn postgres_processes_in(dir: &str) -> Vec<u32> {
    let mut pids = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let cmdline = std::fs::read(entry.path().join("cmdline")).unwrap_or_default();
        let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
        if cmdline.contains("postgres") && cmdline.contains(dir) {
            pids.push(pid);
        }
    }
    pids
}

/// `hookd dev` killed with SIGKILL (no handler runs) or SIGHUP (the terminal closed) leaves
/// no Postgres process and no directory behind; and it runs from a directory without
/// `examples/`, with the built-in example aimed at its receiver.
#[tokio::test]
async fn dev_leaves_no_postgres_behind_when_killed() {
    init();
    for signal in ["KILL", "HUP"] {
        let cwd =
            std::env::temp_dir().join(format!("hookd-dev-cwd-{}", uuid::Uuid::now_v7().simple()));
        std::fs::create_dir_all(&cwd).unwrap();
        let (api, rx, metrics) = (free_port(), free_port(), free_port());
        let mut child = HookdCommand::new(["dev", "--listen", &format!("127.0.0.1:{api}")])
            .current_dir(&cwd)
            .args(["--receiver-listen", &format!("127.0.0.1:{rx}")])
            .args(["--dispatch-listen", &format!("127.0.0.1:{metrics}")])
            .env_remove("DATABASE_URL")
            .env_remove("HOOKD_DEV_EXAMPLES")
            .env_remove("HOOKD_ENCRYPTION_KEY")
            .env("HOOKD_ENCRYPTION_KEY_FILE", cwd.join("key"))
            .env("HOOKD_LOG", "info")
            .env("HOOKD_LOG_FORMAT", "text")
            .spawn();
        let mut dir = None;
        let mut seen = Vec::new();
        loop {
            let line = child
                .lines()
                .recv_timeout(Duration::from_secs(60))
                .unwrap_or_else(|_| panic!("hookd dev printed: {seen:#?}"));
            if let Some(d) = line.split("(throwaway, in ").nth(1) {
                dir = Some(d.split(';').next().unwrap().to_string());
            }
            let ready = line.contains("send a first event");
            seen.push(line);
            if ready {
                break;
            }
        }
        let dir = dir.unwrap_or_else(|| panic!("no dir= in {seen:#?}"));
        assert!(
            seen.iter()
                .any(|l| l.contains("webhookendpoint/default/example created")),
            "the built-in example is applied from {}: {seen:#?}",
            cwd.display()
        );
        assert!(
            !postgres_processes_in(&dir).is_empty(),
            "a postgres runs in {dir}"
        );
        // the dispatcher's metrics are served
        let m = reqwest::get(format!("http://127.0.0.1:{metrics}/metrics"))
            .await
            .unwrap();
        assert_eq!(m.status(), 200);
        assert!(m.text().await.unwrap().contains("hookd_"), "metrics");

        child.signal(signal);
        child.wait();
        let gone =
            wait_until(Duration::from_secs(30), || {
                let dir = dir.clone();
                async move {
                    postgres_processes_in(&dir).is_empty() && !std::path::Path::new(&dir).exists()
                }
            })
            .await;
        assert!(
            gone,
            "after SIG{signal}: postgres {:?}, dir exists {}",
            postgres_processes_in(&dir),
            std::path::Path::new(&dir).exists()
        );
        let _ = std::fs::remove_dir_all(&cwd);
    }
}

/// A port clash names the address, what wanted it and the flag that moves it.
#[tokio::test]
async fn dev_port_clash_names_the_port() {
    init();
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = taken.local_addr().unwrap().port();
    let (ok, _, err) = hookd(
        &[
            "dev",
            "--listen",
            &format!("127.0.0.1:{port}"),
            "--database-url",
            "postgres://postgres@127.0.0.1:1/unused",
        ],
        &[(TEST_KEY_ENV, TEST_ENCRYPTION_KEY)],
    );
    assert!(!ok);
    assert!(
        err.contains(&format!(
            "cannot listen on 127.0.0.1:{port} for the API (--listen, HOOKD_LISTEN)"
        )),
        "{err}"
    );
    drop(taken);
}

/// The dispatcher logs both circuit transitions; the statement that decides them reports
/// the ones it closed as well as the ones it opened.
#[sqlx::test]
async fn circuit_transitions_report_opened_and_closed(pool: PgPool) {
    use hookd::db::endpoints::{CircuitInput, record_circuit_transitions};
    let ep = endpoint(&pool, EndpointOpts::default()).await;
    let version: i64 =
        sqlx::query_scalar("SELECT config_version FROM hookd.endpoints WHERE id = $1")
            .bind(ep)
            .fetch_one(&pool)
            .await
            .unwrap();
    let input = |any_success, trailing_failures| CircuitInput {
        endpoint_id: ep,
        config_version: version,
        any_success,
        trailing_failures,
    };
    let mut conn = pool.acquire().await.unwrap();
    let t = record_circuit_transitions(&mut conn, &[input(false, 3)], 3, 30.0)
        .await
        .unwrap();
    assert_eq!((t.opened, t.closed), (vec![ep], vec![]));
    let t = record_circuit_transitions(&mut conn, &[input(false, 1)], 3, 30.0)
        .await
        .unwrap();
    assert!(t.opened.is_empty() && t.closed.is_empty(), "{t:?}");
    let t = record_circuit_transitions(&mut conn, &[input(true, 0)], 3, 30.0)
        .await
        .unwrap();
    assert_eq!((t.opened, t.closed), (vec![], vec![ep]));
}

/// sqlx's advisory-lock id for migrations on `database` (sqlx-postgres `generate_lock_id`:
/// CRC-32/ISO-HDLC of the name times a constant), so a test can hold the lock the
/// migrator waits for.
fn migration_lock_id(database: &str) -> i64 {
    let mut crc: u32 = 0xFFFF_FFFF;
    for b in database.bytes() {
        crc ^= u32::from(b);
        for _ in 0..8 {
            crc = if crc & 1 == 1 {
                (crc >> 1) ^ 0xEDB8_8320
            } else {
                crc >> 1
            };
        }
    }
    0x3d32ad9e * i64::from(!crc)
}

/// `hookd migrate` on a fresh database prints no SQL. A migration statement that runs
/// over sqlx's slow-statement threshold (500 ms) used to be logged as a warning with its
/// whole text: 11 KB of migration 0014 before anything else. Held up deterministically
/// here: the test holds the migrator's advisory lock for over a second, so the
/// migrator's first statement is slow on any machine.
#[sqlx::test]
async fn migrate_prints_no_sql_when_a_statement_is_slow(pool: PgPool) {
    use sqlx::Connection;
    let name = format!("fresh_{}", uuid::Uuid::now_v7().simple());
    sqlx::query(sqlx::AssertSqlSafe(format!("CREATE DATABASE {name}")))
        .execute(&pool)
        .await
        .unwrap();
    let base = database_url(&pool);
    let (prefix, _) = base.rsplit_once('/').unwrap();
    let url = format!("{prefix}/{name}");
    let mut holder = sqlx::PgConnection::connect(&url).await.unwrap();
    sqlx::query("SELECT pg_advisory_lock($1)")
        .bind(migration_lock_id(&name))
        .execute(&mut holder)
        .await
        .unwrap();

    let mut migrate = HookdCommand::new(["migrate"])
        .env("DATABASE_URL", &url)
        .env("HOOKD_LOG", "info")
        .spawn();
    // the migrator has waited on the lock for more than the threshold
    let waited = wait_until(Duration::from_secs(60), || async {
        sqlx::query_scalar::<_, bool>(
            "SELECT EXISTS (SELECT 1 FROM pg_stat_activity WHERE datname = $1 AND wait_event_type = 'Lock' AND query LIKE '%pg_advisory_lock%' AND query_start < now() - interval '1 second')",
        )
        .bind(&name)
        .fetch_one(&pool)
        .await
        .unwrap()
    })
    .await;
    assert!(
        waited,
        "hookd migrate never waited for the lock: {}",
        migrate.output()
    );
    sqlx::query("SELECT pg_advisory_unlock($1)")
        .bind(migration_lock_id(&name))
        .execute(&mut holder)
        .await
        .unwrap();
    let status = migrate.wait_timeout(Duration::from_secs(120)).await;
    let out = migrate.output();
    assert!(status.is_some_and(|s| s.success()), "{out}");
    assert!(out.contains("migrations applied"), "{out}");
    for sql in ["slow statement", "pg_advisory_lock", "CREATE ", "SELECT "] {
        assert!(!out.contains(sql), "{sql:?} printed:\n{out}");
    }
    drop(holder);
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "DROP DATABASE {name} WITH (FORCE)"
    )))
    .execute(&pool)
    .await
    .unwrap();
}

/// `hookd api`, `dispatch`, `controller` and `receiver` on a port already taken name the
/// address, what wanted it and the flag and variable that move it, as `hookd dev` does,
/// instead of only "Address already in use (os error 98)"; and nothing else is tried first
/// (the database here does not exist).
#[test]
fn listener_clash_names_the_address_and_the_flag() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap().to_string();
    let addr = addr.as_str();
    let unused_db = "postgres://postgres@127.0.0.1:1/unused";
    for (args, what) in [
        (vec!["api", "--listen", addr], "API"),
        (
            vec!["dispatch", "--listen", addr],
            "dispatcher health and metrics",
        ),
        (
            vec!["controller", "--listen", addr],
            "controller health and metrics",
        ),
        (
            vec!["receiver", "--listen", addr, "--secret", SECRET_A],
            "receiver",
        ),
    ] {
        let (ok, _, err) = hookd(
            &args,
            &[
                ("DATABASE_URL", unused_db),
                (TEST_KEY_ENV, TEST_ENCRYPTION_KEY),
            ],
        );
        assert!(!ok, "{args:?}: {err}");
        assert!(
            err.contains(&format!(
                "cannot listen on {addr} for the {what} (--listen, HOOKD_LISTEN)"
            )),
            "{args:?}: {err}"
        );
        assert!(
            err.contains("stop what is using it or choose another address"),
            "{err}"
        );
        assert_eq!(err.matches("hookd: error").count(), 1, "{err}");
    }
    drop(taken);
}

/// Issue 31 item 3, the customers guide on your own Postgres: `hookd api` and `hookd
/// dispatch` of one user on one machine, neither given HOOKD_ENCRYPTION_KEY, share the
/// local key file (as `hookd apply` and `dispatch` always did), so the endpoints API
/// creates a customer's endpoint (201, not 503 encryption_unavailable) and the dispatcher
/// signs with its secret. HOOKD_ALLOWED_DESTINATIONS on `hookd api` admits the loopback
/// receiver (without it: 422).
#[sqlx::test]
async fn customers_guide_works_on_your_own_postgres(pool: PgPool) {
    init();
    let home = std::env::temp_dir().join(format!("hookd-home-{}", uuid::Uuid::now_v7().simple()));
    std::fs::create_dir(&home).unwrap();
    // not a published test vector: the endpoints API refuses those (issue 29)
    const SECRET: &str = "whsec_RzJH00HTPAJeFtgT0NteobsaX6JniEw0YX6Ro3Uz0HA=";
    let receiver = Receiver::start(&[SECRET]).await;
    let token = mint_token(&pool, "default", &hookd::auth::Scope::ALL).await;
    let local = |cmd: HookdCommand| {
        cmd.database(&pool)
            .env_remove(TEST_KEY_ENV)
            .env_remove("HOOKD_ENCRYPTION_KEY_FILE")
            .env_remove("KUBERNETES_SERVICE_HOST")
            .env("HOME", &home)
            .env("XDG_DATA_HOME", home.join("data"))
            .env("HOOKD_ALLOWED_DESTINATIONS", "127.0.0.0/8")
    };
    let api = local(HookdCommand::new(["api"]))
        .listen(free_port())
        .start()
        .await;
    let client = reqwest::Client::new();
    let r = client
        .post(format!("{}/v1/endpoints", api.base()))
        .bearer_auth(&token)
        .json(&serde_json::json!({
            "url": receiver.url("/cust_42"),
            "consumer": "cust_42",
            "eventTypes": ["order.*"],
            "secret": SECRET,
        }))
        .send()
        .await
        .unwrap();
    let status = r.status();
    let body: serde_json::Value = r.json().await.unwrap();
    assert_eq!(status, StatusCode::CREATED, "{body}\n{}", api.output());
    assert!(
        home.join("data/hookd/encryption-key").exists(),
        "the local key file"
    );

    let _dispatch = local(HookdCommand::new(["dispatch"]))
        .listen(free_port())
        .start()
        .await;
    let r = client
        .post(format!("{}/v1/messages", api.base()))
        .bearer_auth(&token)
        .json(&serde_json::json!({
            "eventType": "order.paid", "consumer": "cust_42", "payload": {"order": "o_1"},
        }))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::CREATED);
    assert!(
        wait_until(Duration::from_secs(60), || async { receiver.count() == 1 }).await,
        "no delivery"
    );
    assert_eq!(receiver.all()[0].verified_by, [true]);
    let _ = std::fs::remove_dir_all(&home);
}

/// Issue 31 item 7: an event nobody receives is still 201 with `deliveryIds: []` (the
/// contract), and now says why in `hint`; an event that is delivered carries no hint.
#[sqlx::test]
async fn an_event_nobody_receives_says_so(pool: PgPool) {
    endpoint(
        &pool,
        EndpointOpts {
            event_types: vec!["invoice.*".into()],
            ..Default::default()
        },
    )
    .await;
    let api = TestApi::start(&pool).await;
    let (status, v) = api
        .post(
            "/v1/messages",
            r#"{"eventType":"invoce.paid","payload":{}}"#,
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{v}");
    assert_eq!(v["deliveryIds"], serde_json::json!([]), "{v}");
    let hint = v["hint"].as_str().expect("a hint");
    assert!(hint.contains("\"invoce.paid\""), "{hint}");
    assert!(hint.contains("nothing will be delivered"), "{hint}");
    let (_, v) = api
        .post(
            "/v1/messages",
            r#"{"eventType":"order.paid","consumer":"cust_404","payload":{}}"#,
        )
        .await;
    assert!(
        v["hint"]
            .as_str()
            .unwrap()
            .contains("consumer \"cust_404\""),
        "{v}"
    );
    let (status, v) = api
        .post(
            "/v1/messages",
            r#"{"eventType":"invoice.paid","payload":{}}"#,
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{v}");
    assert_eq!(v["deliveryIds"].as_array().unwrap().len(), 1, "{v}");
    assert!(v.get("hint").is_none(), "{v}");
    let (_, v) = api
        .post(
            "/v1/messages/batch",
            r#"{"messages":[{"eventType":"invoice.paid","payload":1},{"eventType":"nobody.cares","payload":2}]}"#,
        )
        .await;
    assert!(v["results"][0].get("hint").is_none(), "{v}");
    assert!(v["results"][1]["hint"].is_string(), "{v}");
}

/// Issue 31 item 8: `since` and `until` take a date (its midnight UTC) as well as an RFC
/// 3339 time, and anything else is refused naming both forms, not with a parser's
/// "premature end of input".
#[sqlx::test]
async fn time_bounds_take_dates_and_say_what_they_take(pool: PgPool) {
    let ep = endpoint(&pool, EndpointOpts::default()).await;
    let api = TestApi::start(&pool).await;
    api.enqueue(DEFAULT_TENANT, "invoice.paid", "{}").await;
    let (status, v) = api.get("/v1/messages?since=2000-01-01").await;
    assert_eq!(status, StatusCode::OK, "{v}");
    assert_eq!(v["items"].as_array().unwrap().len(), 1, "{v}");
    let (status, v) = api.get("/v1/messages?until=2000-01-01").await;
    assert_eq!(status, StatusCode::OK, "{v}");
    assert_eq!(v["items"].as_array().unwrap().len(), 0, "{v}");
    let (status, v) = api
        .post(
            &format!("/v1/endpoints/{ep}/replay"),
            r#"{"since":"2000-01-01"}"#,
        )
        .await;
    assert_eq!(status, StatusCode::ACCEPTED, "{v}");
    let (status, v) = api
        .post(
            &format!("/v1/endpoints/{ep}/replay"),
            r#"{"since":"yesterday"}"#,
        )
        .await;
    assert!(status.is_client_error(), "{v}");
    let message = v["error"]["message"].as_str().unwrap();
    assert!(message.contains("RFC 3339"), "{message}");
    let (status, v) = api.get("/v1/messages?since=yesterday").await;
    assert!(status.is_client_error(), "{v}");
    assert!(
        v["error"]["message"].as_str().unwrap().contains("RFC 3339"),
        "{v}"
    );
}

/// Issue 31 item 9: `GET /` of the API points at the console and the API description
/// instead of answering a JSON 404.
#[sqlx::test]
async fn the_root_points_at_the_console(pool: PgPool) {
    let api = TestApi::start(&pool).await;
    let r = reqwest::get(format!("{}/", api.base)).await.unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    let v: serde_json::Value = r.json().await.unwrap();
    assert_eq!(v["console"], "/ui", "{v}");
    assert_eq!(v["openapi"], "/openapi.json", "{v}");
}

/// Issue 31 item 8: a missing database names DATABASE_URL, not only `--database-url`;
/// `--expires-at` says it wants RFC 3339 (and takes a date).
#[test]
fn missing_settings_name_the_variable_and_the_format() {
    let out = HookdCommand::new(["migrate"])
        .env_remove("DATABASE_URL")
        .output();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("--database-url"), "{err}");
    assert!(err.contains("set DATABASE_URL"), "{err}");
    let out = HookdCommand::new([
        "token",
        "create",
        "--tenant",
        "t",
        "--scope",
        "read",
        "--expires-at",
        "next week",
    ])
    .env("DATABASE_URL", "postgres://postgres@127.0.0.1:1/unused")
    .output();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(err.contains("RFC 3339"), "{err}");
}
