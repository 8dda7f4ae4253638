//! hookd behind a real PgBouncer in transaction mode (invariant 12): `hookd api` and
//! `hookd dispatch` processes run through it and deliver to a real receiver while another
//! client of the same pool keeps checking that none of hookd's session state reaches it.

use crate::common;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::*;
use sqlx::{Connection, PgConnection, PgPool, Row};
use uuid::Uuid;

const PGBOUNCER: &str = "/usr/sbin/pgbouncer";

/// Server connections PgBouncer keeps per (database, user): so few that hookd's
/// processes and the checking client keep taking turns on the same server sessions.
const POOL_SIZE: usize = 2;

/// A PgBouncer 1.18 in transaction mode in front of the test's Postgres, killed when
/// dropped (and by the kernel when the test process dies first: `--pdeathsig`).
struct Bouncer {
    child: Child,
    port: u16,
    dir: PathBuf,
}

impl Drop for Bouncer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

impl Bouncer {
    fn start(pool: &PgPool) -> Bouncer {
        assert!(
            Path::new(PGBOUNCER).is_file(),
            "{PGBOUNCER} is missing: install pgbouncer (apt-get install pgbouncer)"
        );
        let o = pool.connect_options();
        let port = free_port();
        let dir = std::env::temp_dir().join(format!("hookd-pgbouncer-{}", Uuid::now_v7().simple()));
        std::fs::create_dir_all(&dir).unwrap();
        let user = o.get_username().to_string();
        std::fs::write(dir.join("userlist.txt"), format!("\"{user}\" \"\"\n")).unwrap();
        let ini = format!(
            "[databases]\n\
             * = host={host} port={pg_port}\n\
             [pgbouncer]\n\
             listen_addr = 127.0.0.1\n\
             listen_port = {port}\n\
             unix_socket_dir =\n\
             auth_type = trust\n\
             auth_file = {auth}\n\
             pool_mode = transaction\n\
             default_pool_size = {POOL_SIZE}\n\
             min_pool_size = 0\n\
             reserve_pool_size = 0\n\
             max_client_conn = 200\n\
             server_reset_query =\n\
             ignore_startup_parameters = extra_float_digits,options\n\
             pidfile =\n\
             logfile =\n",
            host = o.get_host(),
            pg_port = o.get_port(),
            auth = dir.join("userlist.txt").display(),
        );
        let config = dir.join("pgbouncer.ini");
        std::fs::write(&config, ini).unwrap();
        let log = std::fs::File::create(dir.join("pgbouncer.log")).unwrap();
        // PgBouncer refuses to run as root; `setpriv` drops to nobody when we are root and
        // ties its life to ours either way
        let mut cmd = Command::new("setpriv");
        if is_root() {
            use std::os::unix::fs::PermissionsExt;
            for p in [&dir, &config, &dir.join("userlist.txt")] {
                let mode = if p.is_dir() { 0o755 } else { 0o644 };
                std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).unwrap();
            }
            cmd.args(["--reuid=nobody", "--regid=nogroup", "--clear-groups"]);
        }
        let child = cmd
            .args(["--pdeathsig", "KILL", PGBOUNCER])
            .arg(&config)
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("start pgbouncer");
        Bouncer { child, port, dir }
    }

    /// The test database through PgBouncer.
    fn url(&self, pool: &PgPool) -> String {
        let o = pool.connect_options();
        format!(
            "postgres://{}@127.0.0.1:{}/{}",
            o.get_username(),
            self.port,
            o.get_database().unwrap_or("postgres")
        )
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("pgbouncer.log")).unwrap_or_default()
    }
}

fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
        .unwrap_or(false)
}

/// Settings hookd sets for its own transactions; none may be seen outside them.
const WATCHED: [&str; 8] = [
    "enable_seqscan",
    "enable_bitmapscan",
    "synchronous_commit",
    "plan_cache_mode",
    "jit",
    "lock_timeout",
    "statement_timeout",
    "idle_in_transaction_session_timeout",
];

/// What the checking client saw: its turns, the server sessions it was given, and what
/// it found there that hookd left.
type Seen = (usize, BTreeSet<i32>, Vec<String>);

/// What one server session shows a client that has just been given it: the watched
/// settings, and session objects (prepared statements, LISTENs, advisory locks). Simple
/// protocol only, so the check itself works through the pooler and prepares nothing.
async fn session_state(conn: &mut PgConnection) -> Result<(i32, Vec<String>), sqlx::Error> {
    let settings = WATCHED
        .iter()
        .map(|s| format!("'{s}=' || current_setting('{s}')"))
        .collect::<Vec<_>>()
        .join(", ");
    let sql = format!(
        "SELECT pg_backend_pid(), ARRAY[{settings},
                'prepared statements=' || (SELECT count(*) FROM pg_prepared_statements),
                'listening=' || (SELECT count(*) FROM pg_listening_channels()),
                'advisory locks=' || (SELECT count(*) FROM pg_locks
                                      WHERE locktype = 'advisory' AND pid = pg_backend_pid())]"
    );
    let row = sqlx::raw_sql(sqlx::AssertSqlSafe(sql))
        .fetch_one(conn)
        .await?;
    Ok((row.try_get(0)?, row.try_get(1)?))
}

/// The API and a dispatcher, both through PgBouncer in transaction mode with two server
/// connections, take 40 messages over HTTP and 10 through `hookd.enqueue` (also through
/// the pooler) and deliver every one to a real receiver, while a third client of the same
/// pool checks after each of its turns that the server session it was given shows the
/// server's own settings and no prepared statement, LISTEN or advisory lock. Before hookd
/// set everything per transaction, the API did not start here (`prepared statement
/// "sqlx_s_1" already exists`), and its session `SET enable_seqscan = off` reached the
/// other client. `hookd migrate` refuses the pooler with a message that says what to do.
#[sqlx::test]
async fn api_and_dispatch_through_pgbouncer_transaction_mode(pool: PgPool) {
    init();
    let rx = Receiver::start(&[SECRET_A]).await;
    endpoint(
        &pool,
        EndpointOpts {
            tenant: Some("pooled".into()),
            url: rx.url("/hook"),
            ..Default::default()
        },
    )
    .await;

    // what a session shows when hookd never touched it
    let mut direct = PgConnection::connect(&database_url(&pool)).await.unwrap();
    let (_, clean) = session_state(&mut direct).await.unwrap();

    let bouncer = Bouncer::start(&pool);
    let url = bouncer.url(&pool);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    let mut checker = loop {
        match PgConnection::connect(&url).await {
            Ok(c) => break c,
            Err(_) if tokio::time::Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(e) => panic!("pgbouncer did not come up ({e}):\n{}", bouncer.log()),
        }
    };

    // the checking client: every turn on the pool, what its session shows
    let stop = tokio_util::sync::CancellationToken::new();
    let seen: Arc<Mutex<Seen>> = Arc::default();
    let watcher = {
        let (stop, seen, clean) = (stop.clone(), seen.clone(), clean.clone());
        tokio::spawn(async move {
            while !stop.is_cancelled() {
                let (pid, state) = session_state(&mut checker)
                    .await
                    .expect("the checking client's query through pgbouncer");
                {
                    let mut seen = seen.lock().unwrap();
                    seen.0 += 1;
                    seen.1.insert(pid);
                    if state != clean {
                        let diff: Vec<&String> =
                            state.iter().filter(|s| !clean.contains(s)).collect();
                        seen.2.push(format!("server session {pid}: {diff:?}"));
                    }
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        })
    };

    let through_pooler = |cmd: HookdCommand| {
        cmd.env("DATABASE_URL", &url)
            .env("HOOKD_DATABASE_POOLER", "transaction")
            .env("HOOKD_DB_MAX_CONNECTIONS", "4")
            .env("HOOKD_LOG", "warn")
    };
    let migrate = through_pooler(HookdCommand::new(["migrate"])).run().await;
    let said = String::from_utf8_lossy(&migrate.stderr).to_string();
    assert!(
        !migrate.status.success() && said.contains("straight at Postgres"),
        "hookd migrate through the pooler: {said}"
    );

    let mut api = through_pooler(HookdCommand::new(["api"]))
        .env("HOOKD_AUTH", "none")
        .listen(free_port())
        .spawn();
    api.wait_ready().await;
    let mut dispatcher = through_pooler(HookdCommand::new(["dispatch"]))
        .test_key()
        .env("HOOKD_ALLOWED_DESTINATIONS", "127.0.0.0/8")
        .env("HOOKD_POLL_MS", "100")
        .listen(free_port())
        .spawn();
    dispatcher.wait_ready().await;

    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(30))
        .build()
        .unwrap();
    let mut expected = BTreeSet::new();
    for n in 0..40 {
        let body = format!(
            r#"{{"tenant":"pooled","eventType":"pool.http","payload":{{"n":{n}}},"idempotencyKey":"k{n}"}}"#
        );
        let (status, v) = send(
            client
                .post(format!("{}/v1/messages", api.base()))
                .header("content-type", "application/json")
                .body(body.clone()),
        )
        .await;
        assert!(status.is_success(), "POST /v1/messages: {status} {v}");
        let (event, deliveries) = ids(&v);
        assert_eq!(deliveries.len(), 1, "{v}");
        expected.extend(deliveries.iter().map(|d| d.to_string()));
        if n % 10 == 0 {
            // a producer's retry: the same ids, nothing new
            let (status, again) = send(
                client
                    .post(format!("{}/v1/messages", api.base()))
                    .header("content-type", "application/json")
                    .body(body),
            )
            .await;
            assert!(status.is_success(), "retry: {status} {again}");
            assert_eq!(ids(&again), (event, deliveries));
            let (status, read) =
                send(client.get(format!("{}/v1/messages/{event}", api.base()))).await;
            assert!(status.is_success(), "GET the message: {status} {read}");
        }
    }
    // the outbox function, in a producer's own transaction through the same pool
    let mut producer = PgConnection::connect(&url).await.unwrap();
    let rows = sqlx::raw_sql(
        "BEGIN;
         SELECT hookd.enqueue('pooled', 'pool.sql', '{\"sql\":' || g || '}') FROM generate_series(1, 10) g;
         COMMIT;",
    )
    .fetch_all(&mut producer)
    .await
    .unwrap();
    assert_eq!(rows.len(), 10);
    let sql_ids: Vec<Uuid> = sqlx::query_scalar(
        "SELECT d.id FROM hookd.deliveries d JOIN hookd.events e ON e.id = d.event_id
         WHERE e.event_type = 'pool.sql'",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    assert_eq!(sql_ids.len(), 10);
    expected.extend(sql_ids.iter().map(|d| d.to_string()));

    let succeeded = || async {
        sqlx::query_scalar::<_, i64>(
            "SELECT count(*) FROM hookd.deliveries WHERE status = 'succeeded'",
        )
        .fetch_one(&pool)
        .await
        .unwrap()
    };
    // received, and the outcomes written back through the pooler
    let delivered = wait_until(Duration::from_secs(60), || {
        let (rx, expected) = (&rx, &expected);
        async move {
            let got: BTreeSet<String> = rx.ids().into_iter().collect();
            expected.is_subset(&got) && succeeded().await == 50
        }
    })
    .await;
    let succeeded = succeeded().await;
    assert!(
        delivered && succeeded == 50,
        "{} of 50 delivered, {succeeded} succeeded\napi: {}\ndispatch: {}\npgbouncer: {}",
        rx.ids().len(),
        api.output(),
        dispatcher.output(),
        bouncer.log()
    );

    // keep checking while both processes idle on the pool (polls, lease renewals, the
    // retention pass and history days of the dispatcher)
    let turns_before = seen.lock().unwrap().0;
    let more = wait_until(Duration::from_secs(30), || async {
        seen.lock().unwrap().0 >= turns_before + 200
    })
    .await;
    stop.cancel();
    watcher.await.unwrap();
    assert!(more, "the checking client stalled");
    let (turns, pids, leaks) = seen.lock().unwrap().clone();
    println!(
        "{turns} turns of the checking client on {} server sessions",
        pids.len()
    );
    assert!(
        leaks.is_empty(),
        "hookd's session state reached another client of the pool (clean: {clean:?}):\n{}",
        leaks.join("\n")
    );
    assert!(
        pids.len() <= POOL_SIZE,
        "the checking client got {} server sessions from a pool of {POOL_SIZE}",
        pids.len()
    );
    assert!(api.is_running() && dispatcher.is_running());
    for (name, p) in [("api", &api), ("dispatch", &dispatcher)] {
        let out = p.output();
        assert!(
            !out.contains("prepared statement"),
            "{name} met a prepared statement error:\n{out}"
        );
    }
}

/// Every statement under `src/` runs through `db::on` (or in a transaction `db::begin`
/// opened), which is what makes it safe behind a transaction-mode pooler: a
/// `.fetch_one(pool)` straight on the pool would prepare a named statement outside any
/// transaction. VACUUM, which cannot run in a transaction, goes by `sqlx::raw_sql`.
#[test]
fn every_statement_goes_through_db_on() {
    let call = regex_lite();
    let mut offenders = Vec::new();
    let mut stack = vec![PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("src")];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                stack.push(path);
                continue;
            }
            if path.extension().is_none_or(|e| e != "rs") {
                continue;
            }
            let text = std::fs::read_to_string(&path).unwrap();
            let lines: Vec<&str> = text.lines().collect();
            for (i, line) in lines.iter().enumerate() {
                let Some(arg) = call(line) else { continue };
                let recent = lines[i.saturating_sub(3)..=i].join("\n");
                if arg.starts_with("on(") || recent.contains("sqlx::raw_sql(") {
                    continue;
                }
                offenders.push(format!("{}:{}: {}", path.display(), i + 1, line.trim()));
            }
        }
    }
    assert!(
        offenders.is_empty(),
        "statements not run through db::on:\n{}",
        offenders.join("\n")
    );
}

/// The argument of `.execute(…)` / `.fetch…(…)` on this line when it is a plain place
/// (a pool, a connection, a transaction), not a query or a closure.
fn regex_lite() -> impl Fn(&str) -> Option<String> {
    |line: &str| {
        for method in [
            ".execute(",
            ".fetch(",
            ".fetch_one(",
            ".fetch_all(",
            ".fetch_optional(",
            ".fetch_many(",
        ] {
            let Some(at) = line.find(method) else {
                continue;
            };
            let rest = &line[at + method.len()..];
            let arg: String = rest.chars().take_while(|c| *c != ')').collect();
            let plain = !arg.is_empty()
                && arg
                    .chars()
                    .all(|c| c.is_alphanumeric() || "_&*. ".contains(c))
                && ["pool", "conn", "tx", "lock"]
                    .iter()
                    .any(|p| arg.contains(p));
            if plain || arg.starts_with("on(") {
                return Some(arg);
            }
        }
        None
    }
}
